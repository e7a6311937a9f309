"""Child processes of the test brokers and registry: dying with the process that started them,
stopped by their own pid, and the ``with`` / ``async with`` shape every one of these services has."""

from __future__ import annotations

import abc
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from .ports import PortLease, lease_ports


def stop_process(process: subprocess.Popen[Any] | None, timeout: float) -> None:
    """Stop ``process`` by its pid: SIGTERM, and SIGKILL when it has not ended after ``timeout`` s."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


class Service(abc.ABC):
    """Something a test runs beside it (a broker, a registry): :meth:`start` returns it once it
    answers, :meth:`stop` ends it; ``with`` runs both, and ``async with`` runs them in a worker
    thread so that the event loop goes on."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start and wait until it answers; returns ``self``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it and remove what it wrote; safe to call twice."""

    _port_lease: PortLease | None = None

    def _own_port(self, port: int | None) -> int:
        """``port`` if given; else one leased for this service (``asyncconsumer.testing.ports``:
        below the ephemeral range, no other lease gets it) until :meth:`_release_port`."""
        if port:
            return port
        self._port_lease = lease_ports(1)
        return self._port_lease.ports[0]

    def _release_port(self) -> None:
        """Give back the port :meth:`_own_port` leased (a :meth:`stop`'s last step; safe twice)."""
        lease, self._port_lease = self._port_lease, None
        if lease is not None:
            lease.release()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)


def parent_death_signal() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` making the kernel SIGTERM a broker if the process that started it dies.

    libc is loaded here, in the parent, so the forked child makes one plain call.  The signal fires
    when the *thread* that forked exits, so it is armed only from the main thread (a broker started
    from a worker thread, for example through ``anyio.to_thread``, must not die with that worker).
    ``None`` elsewhere: the caller then relies on stopping the broker by its pid.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return arm
