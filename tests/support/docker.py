"""Docker for the container broker's tests: a daemon, the local Kafka image, and the suite's broker in it.

A test session that needs Docker takes the daemon that runs (``docker info`` answers), or else, as
root with Debian's ``docker.io`` installed, starts one of its own: ``dockerd`` with no bridge and no
iptables rules (``--bridge=none --iptables=false --ip-masq=false``: no container gets an address of
its own, they all run with host networking and are reached on 127.0.0.1), with its socket, data and
state in a temporary directory, so nothing of it outlives the session.  :meth:`Daemon.stop` checks
that no container of the session is left, stops the daemon by its pid, waits until it and every
process it started are gone, and removes a ``docker0`` link if one appeared.  Where no daemon can
be had (not root, no ``dockerd``), :class:`DockerUnavailable` says why: the tests skip with it.

The image is ``tools/kafka_image``'s, built from the jars ``KafkaBroker`` downloaded (nothing is
pulled), once per daemon (``ensure_image`` builds only when its recipe changed).

``ASYNCCONSUMER_KAFKA_IMAGE=IMAGE`` (with ``ASYNCCONSUMER_TEST_BROKER=kafka``) makes the suite's
Apache Kafka a ``ContainerBroker`` of that image (``start_kafka`` in ``support.broker``); the local
tag (``local/kafka:4.4.0``) is built first.  testcontainers' reaper is off in these tests
(``TESTCONTAINERS_RYUK_DISABLED=true``): its image cannot be pulled here; the fixtures remove
their containers themselves.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from asyncconsumer.testing._process import parent_death_signal

from .broker import BrokerStartError, BrokerUnavailable, KafkaBackend

__all__ = [
    "ENV_KAFKA_IMAGE",
    "ContainerKafkaBackend",
    "Daemon",
    "DockerUnavailable",
    "LOCAL_IMAGE",
    "local_image",
    "start_daemon",
    "start_kafka_container",
]

ENV_KAFKA_IMAGE = "ASYNCCONSUMER_KAFKA_IMAGE"
#: Environment of every container test: testcontainers' reaper off (its image cannot be pulled here).
TESTCONTAINERS_ENV = {"TESTCONTAINERS_RYUK_DISABLED": "true"}


def _local_tag() -> str:
    from tools.kafka_image import DEFAULT_TAG

    return DEFAULT_TAG


LOCAL_IMAGE = _local_tag()


class DockerUnavailable(RuntimeError):
    """No Docker daemon runs and none can be started here (the message says why)."""


def _docker(args: list[str], env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL, check=False)


def _answers(env: dict[str, str], timeout: float = 15.0) -> bool:
    try:
        return _docker(["info", "--format", "{{.ServerVersion}}"], env, timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, waiting to be reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _unmount_below(directory: Path) -> None:
    """Unmount what the daemon left mounted in its directory (the ``netns/default`` of its exec root)."""
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    for point in sorted((m for m in mounts if m.startswith(f"{directory}/")), key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True, check=False)


def _docker0() -> bool:
    return Path("/sys/class/net/docker0").exists()


@dataclass
class Daemon:
    """The session's Docker daemon: ours (``process`` set) or one that already ran."""

    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    directory: Path | None = None
    #: The testcontainers session whose containers must all be gone at the end (this process's).
    session_id: str = ""
    _saved: dict[str, str | None] = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return self.process is not None

    def log_tail(self, lines: int = 20) -> str:
        if self.directory is None:
            return ""
        try:
            return "\n".join((self.directory / "dockerd.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def containers(self) -> list[str]:
        """The containers left of this session (every container, on a daemon of ours)."""
        filters = [] if self.ours else ["--filter", f"label=org.testcontainers.session-id={self.session_id}"]
        result = _docker(["ps", "-a", "-q", *filters], self.env)
        return result.stdout.split()

    def stop(self) -> list[str]:
        """Check that no container is left (removing any), stop a daemon of ours and wait until it
        and every process it started are gone; returns what was wrong (empty: nothing)."""
        problems: list[str] = []
        left = self.containers()
        if left:
            problems.append(f"containers left running at the end of the session: {left}")
            _docker(["rm", "-f", "-v", *left], self.env, timeout=60)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
        process, self.process = self.process, None
        if process is None:
            return problems
        family = _descendants(process.pid) | {process.pid}
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                problems.append(f"dockerd (pid {process.pid}) did not stop within 30 s of SIGTERM: killed")
                process.kill()
                process.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(_running(pid) for pid in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        stragglers = sorted(pid for pid in family if _running(pid))
        for pid in stragglers:  # the daemon's own children (containerd, shims): ours to end
            os.kill(pid, signal.SIGKILL)
        if stragglers:
            problems.append(f"processes of the daemon outlived it: {stragglers}")
        if _docker0():  # never made with --bridge=none; removed if something made it anyway
            subprocess.run(["ip", "link", "delete", "docker0"], capture_output=True, check=False)
            problems.append("a docker0 link appeared (removed)")
        if self.directory is not None:
            _unmount_below(self.directory)
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.directory.exists():
                problems.append(f"{self.directory} could not be removed")
        return problems


def _why_not() -> str | None:
    """Why no Docker daemon can be started here (None: one can)."""
    if shutil.which("docker") is None:
        return "no docker command (Debian: apt-get install docker.io)"
    if shutil.which("dockerd") is None:
        return "no Docker daemon answers and no dockerd to start one (Debian: apt-get install docker.io)"
    if os.geteuid() != 0:
        return "no Docker daemon answers, and starting dockerd needs root"
    return None


def start_daemon() -> Daemon:
    """The running daemon, or one started here (see the module's docstring); sets ``DOCKER_HOST`` and
    the testcontainers variables in ``os.environ`` until :meth:`Daemon.stop`."""
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.labels import SESSION_ID

    # The variable is read once, at a container's first start: set it here for this process too.
    testcontainers_config.ryuk_disabled = True
    env = {**os.environ, **TESTCONTAINERS_ENV}
    daemon = Daemon(env=env, session_id=SESSION_ID)
    if shutil.which("docker") is not None and _answers(env):
        daemon._saved = {key: os.environ.get(key) for key in TESTCONTAINERS_ENV}
        os.environ.update(TESTCONTAINERS_ENV)
        return daemon
    reason = _why_not()
    if reason is not None:
        raise DockerUnavailable(reason)
    directory = Path(tempfile.mkdtemp(prefix="ac-dockerd-"))
    socket = directory / "docker.sock"
    log = open(directory / "dockerd.log", "wb")
    try:
        process = subprocess.Popen(
            ["dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false",
             f"--host=unix://{socket}", f"--data-root={directory / 'data'}", f"--exec-root={directory / 'exec'}",
             f"--pidfile={directory / 'docker.pid'}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=parent_death_signal(),
        )
    finally:
        log.close()
    daemon.env = {**env, "DOCKER_HOST": f"unix://{socket}"}
    daemon.process, daemon.directory = process, directory
    deadline = time.monotonic() + 60
    while not _answers(daemon.env, timeout=5):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = daemon.log_tail()
            daemon.stop()
            raise DockerUnavailable(f"dockerd did not start (exit code {process.poll()}):\n{tail}")
        time.sleep(0.2)
    changes = {"DOCKER_HOST": daemon.env["DOCKER_HOST"], **TESTCONTAINERS_ENV}
    daemon._saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    return daemon


def local_image(daemon: Daemon) -> tuple[str, Any]:
    """Build :data:`LOCAL_IMAGE` on ``daemon`` unless it is there with the same recipe; returns the
    tag and what ``ensure_image`` did."""
    from tools.kafka_image import ensure_image

    built = ensure_image(tag=LOCAL_IMAGE)
    return built.tag, built


# ------------------------------------------------------------------- the suite's broker in a container


@dataclass
class ContainerKafkaBackend(KafkaBackend):
    """The suite's Apache Kafka as a ``ContainerBroker`` (``ASYNCCONSUMER_KAFKA_IMAGE``): ``.broker`` is
    the ``ContainerBroker``, a PLAINTEXT listener only (no TLS, no SASL, no Kafka tools)."""

    LACKS: ClassVar[frozenset[str]] = frozenset({"tls", "sasl"})

    daemon: Daemon | None = None

    @property
    def version(self) -> str:
        from asyncconsumer.testing import KAFKA_VERSION

        return str(self.broker.version or KAFKA_VERSION)

    def supports(self, feature: str) -> bool:
        return feature not in self.LACKS and super().supports(feature)

    def stop(self) -> None:
        self.broker.stop()
        problems = self.daemon.stop() if self.daemon is not None else []
        if problems:
            raise AssertionError("; ".join(problems))


def start_kafka_container(image: str) -> ContainerKafkaBackend:
    """A ``ContainerBroker`` of ``image`` on the session's daemon (started here if none runs; the local
    image built first), stopped with the daemon by the backend's ``stop()``."""
    from asyncconsumer.testing import ContainerBroker

    try:
        daemon = start_daemon()
    except DockerUnavailable as exc:
        raise BrokerUnavailable(f"{ENV_KAFKA_IMAGE}={image}, but {exc}") from exc
    try:
        if image == LOCAL_IMAGE:
            local_image(daemon)
        broker = ContainerBroker(image).start()
    except BaseException as exc:
        daemon.stop()
        if isinstance(exc, Exception):
            raise BrokerStartError(f"{ENV_KAFKA_IMAGE}={image}: {exc}") from exc
        raise
    return ContainerKafkaBackend(broker, daemon)
