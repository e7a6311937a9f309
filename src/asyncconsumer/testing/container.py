"""Apache Kafka in a container, through testcontainers: where Docker runs (CI runners, laptops).

    from asyncconsumer.testing import ContainerBroker

    with ContainerBroker() as kafka:                        # apache/kafka:4.4.0, one KRaft node
        Consumer(bootstrap_servers=kafka.bootstrap, ...)

    async with ContainerBroker("apache/kafka:3.9.1") as kafka:   # any image of the official kind
        ...

It has :class:`~asyncconsumer.testing.KafkaBroker`'s surface (``bootstrap``, ``create_topic``,
``stop``, ``with``) and needs ``pip install 'asyncconsumer[testcontainers]'`` and a Docker daemon
instead of Java.  The story of one start:

1. **Ports.** Two free loopback ports, one for clients (PLAINTEXT) and one for the KRaft controller.
   The container runs with **host networking**, so the broker listens on ``127.0.0.1`` of this
   machine itself and advertises ``127.0.0.1:PORT``: the address clients get back in Metadata is
   the one they bootstrapped from, with no port mapping and no guess at a gateway address
   (testcontainers' ``get_container_host_ip()`` is never asked).  Host networking is Linux's
   (GitHub Actions' runners, a Linux CI machine; Docker Desktop only with its host networking on).
2. **Configuration.** The official image's convention: every ``KAFKA_*`` variable is a
   ``server.properties`` entry (``KAFKA_LOG_DIRS`` is ``log.dirs``; :func:`kafka_env` makes them).
   The container gets a single KRaft node (``process.roles=broker,controller``, a static voter set
   of itself), a random cluster id (``CLUSTER_ID``), the settings ``KafkaBroker`` gives its nodes
   (short group timers, internal topics of one replica: ``kafka.broker_settings``) and then
   ``config``.  ``heap_mb`` is the broker's heap (``KAFKA_HEAP_OPTS``).
3. **Start.** testcontainers creates and starts the container (pulling the image only when it is
   not there); the start waits until the broker answers Metadata on its port, through the
   package's own codec, and fails at once when the container exits.
4. **Stop.** :meth:`stop` removes the container and its volumes (testcontainers' ``stop()``).  Ryuk,
   testcontainers' reaper, removes a container left behind by a process that died, unless
   ``TESTCONTAINERS_RYUK_DISABLED=true``; then nothing but :meth:`stop` does.

Errors are :class:`ContainerBrokerError` (a ``KafkaBrokerError``): testcontainers not installed, no
Docker daemon, an image that is neither there nor pullable, a container that exits or does not
answer (with the broker's own error lines).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Self

from ._probe import wait_for_metadata
from ._process import Service
from .kafka import KAFKA_VERSION, KafkaBrokerError, broker_settings, error_lines, new_cluster_id
from .ports import PortLease, lease_ports

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

__all__ = ["KAFKA_IMAGE", "ContainerBroker", "ContainerBrokerError", "kafka_env"]

LOOPBACK = "127.0.0.1"
#: The image :class:`ContainerBroker` runs unless told otherwise: Apache Kafka's own, the reference release.
KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
#: Where the container keeps its log (inside the container, removed with it), as the official image's defaults.
LOG_DIRS = "/tmp/kraft-combined-logs"
#: ``KAFKA_*`` names the official image takes as JVM or logging settings, never as ``server.properties`` entries.
NOT_PROPERTIES = frozenset({
    "KAFKA_VERSION", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME",
})
_INSTALL = "pip install 'asyncconsumer[testcontainers]'"


class ContainerBrokerError(KafkaBrokerError):
    """The container broker could not be provided: testcontainers missing, no Docker daemon, an
    image that cannot be had, or a broker that exited or did not answer (the message says which)."""


def _property_name(variable: str) -> str:
    """The ``server.properties`` name the official image reads from ``KAFKA_*`` ``variable``."""
    name = variable.removeprefix("KAFKA_").lower().replace("_", ".")
    return name.replace("...", "-").replace("..", "_")


def kafka_env(properties: Mapping[str, object]) -> dict[str, str]:
    """``server.properties`` entries as the official image's ``KAFKA_*`` variables:
    ``{"log.dirs": "/x"}`` is ``{"KAFKA_LOG_DIRS": "/x"}`` (``.`` is ``_``, ``_`` is ``__``,
    ``-`` is ``___``, upper case).  A name those rules cannot carry (upper case, ``._``, or one the
    image takes as a JVM setting, such as ``heap.opts``) is a ``ValueError`` naming it."""
    env = {}
    for name, value in properties.items():
        variable = "KAFKA_" + name.replace("_", "__").replace("-", "___").replace(".", "_").upper()
        if _property_name(variable) != name or variable in NOT_PROPERTIES:
            raise ValueError(
                f"server.properties entry {name!r} cannot be passed as a KAFKA_* variable (it would read back "
                f"as {_property_name(variable)!r}{' or as a JVM setting' if variable in NOT_PROPERTIES else ''}); "
                "mount a server.properties at /mnt/shared/config instead"
            )
        env[variable] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def image_version(image: str) -> str | None:
    """The Apache Kafka release an image's tag names (``apache/kafka:3.9.1`` -> ``"3.9.1"``), if it names one."""
    name = image.partition("@")[0].rpartition("/")[2]
    tag = name.rpartition(":")[2] if ":" in name else ""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(?:[-.].*)?", tag)
    return match.group(1) if match else None


class ContainerBroker(Service):
    """One Apache Kafka node (KRaft, combined broker and controller) in a container, on free
    loopback ports of this machine (host networking).

    ``image``: any image that follows the official image's conventions (``KAFKA_*`` variables,
    ``/etc/kafka/docker/run``); default :data:`KAFKA_IMAGE`, ``apache/kafka:4.4.0``.  ``config``:
    extra or overriding ``server.properties`` entries (``{"num.partitions": 3}``).  ``heap_mb``: the
    broker's Java heap.  ``startup_timeout``: seconds from the container's start until the broker
    answers (a pull excepted).  ``env``: more environment variables for the container, as they are
    (``KAFKA_LOG4J_ROOT_LOGLEVEL``, say).

    :attr:`startup_seconds` is how long :meth:`start` took; :attr:`container` is the testcontainers
    ``DockerContainer`` (for ``exec`` or ``get_logs()``).
    """

    def __init__(
        self,
        image: str = KAFKA_IMAGE,
        *,
        config: Mapping[str, object] | None = None,
        heap_mb: int = 512,
        startup_timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not image or image != image.strip():
            raise ValueError(f"image={image!r}: give an image name such as {KAFKA_IMAGE!r}")
        self.image = image
        self.config = dict(config or {})
        kafka_env(self.config)  # a name that cannot be carried fails here, not in the container
        self.heap_mb = heap_mb
        self.startup_timeout = startup_timeout
        self.env = dict(env or {})
        self.startup_seconds: float | None = None
        self.port: int | None = None
        self.controller_port: int | None = None
        self._lease = PortLease([], [])
        self._container: DockerContainer | None = None

    def __repr__(self) -> str:
        where = self.bootstrap if self._container is not None else "(not started)"
        return f"<ContainerBroker {self.image} {where}>"

    @property
    def version(self) -> str | None:
        """The Apache Kafka release the image's tag names (None when the tag names none, e.g. ``latest``)."""
        return image_version(self.image)

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, the broker's PLAINTEXT listener (what it advertises too)."""
        if self.port is None or self._container is None:
            raise ContainerBrokerError("the container broker is not started")
        return f"{LOOPBACK}:{self.port}"

    @property
    def container(self) -> DockerContainer:
        """The testcontainers ``DockerContainer`` running the broker."""
        if self._container is None:
            raise ContainerBrokerError("the container broker is not started")
        return self._container

    @property
    def container_id(self) -> str:
        return self.container.get_container_id()

    def environment(self, port: int, controller_port: int) -> dict[str, str]:
        """The container's environment for a broker on ``port`` with its controller on ``controller_port``."""
        properties: dict[str, object] = {
            "node.id": 1,
            "process.roles": "broker,controller",
            "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": LOG_DIRS,
            **broker_settings(1, self.version or KAFKA_VERSION),
            **self.config,
        }
        return {
            "CLUSTER_ID": new_cluster_id(),
            "KAFKA_HEAP_OPTS": f"-Xmx{self.heap_mb}m -Xms{self.heap_mb}m",
            **kafka_env(properties),
            **self.env,
        }

    # -- start / stop -----------------------------------------------------------------------------

    def start(self) -> Self:
        if self._container is not None:
            raise ContainerBrokerError("already started")
        try:
            import docker.errors
            from testcontainers.core.container import DockerContainer
        except ImportError as exc:
            raise ContainerBrokerError(f"the container broker needs testcontainers: {_INSTALL} ({exc})") from None
        began = time.monotonic()
        self._lease = lease_ports(2)  # held until stop(): no other broker is drawn onto them
        port, controller_port = self._lease.ports
        try:
            container = DockerContainer(self.image, env=self.environment(port, controller_port))
        except docker.errors.DockerException as exc:
            self.stop()
            raise ContainerBrokerError(
                f"no Docker daemon answers ({exc}); start one, or point DOCKER_HOST at it"
            ) from None
        # Host networking: the broker binds 127.0.0.1 of this machine.  ``network`` (not only
        # ``network_mode``) also keeps testcontainers from looking for a network of its own.
        container.with_kwargs(network_mode="host", network="host")
        self._container, self.port, self.controller_port = container, port, controller_port
        try:
            container.start()
            wait_for_metadata(LOOPBACK, port, timeout=self.startup_timeout, alive=self._exited_check())
        except BaseException as exc:
            message = self._failure(exc)
            self.stop()
            if isinstance(exc, Exception) and message is not None:
                raise ContainerBrokerError(message) from None
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _exited_check(self) -> Callable[[], str | None]:
        """``wait_for_metadata``'s ``alive``: a message once the container has stopped (asked of
        Docker at most twice a second)."""
        asked = [0.0]

        def exited() -> str | None:
            now = time.monotonic()
            if now - asked[0] < 0.5:
                return None
            asked[0] = now
            wrapped = self.container.get_wrapped_container()
            wrapped.reload()
            if wrapped.status in ("created", "running", "restarting"):
                return None
            code = wrapped.attrs.get("State", {}).get("ExitCode")
            return f"the container of {self.image} exited (status {wrapped.status}, exit code {code})"

        return exited

    def _failure(self, exc: BaseException) -> str | None:
        """What to say about a failed start (None: let ``exc`` through as it is)."""
        import docker.errors

        if isinstance(exc, docker.errors.ImageNotFound):
            return f"image {self.image!r} is not here and could not be pulled ({exc})"
        if isinstance(exc, docker.errors.DockerException):
            return f"Docker refused to run {self.image!r}: {exc}"
        if isinstance(exc, (RuntimeError, TimeoutError)):
            return f"{exc}; the broker's log says:\n{error_lines(self.logs(lines=5000))}"
        return None

    def logs(self, lines: int = 40) -> str:
        """The last ``lines`` lines the container wrote (stdout and stderr)."""
        if self._container is None:
            return "(not started)"
        try:
            out, err = self._container.get_logs()
        except Exception as exc:  # the container may be gone already
            return f"(no log: {exc})"
        text = (out + err).decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Remove the container and its volumes (it is killed; its data goes with it)."""
        self._lease.release()
        container, self._container = self._container, None
        if container is None:
            return
        try:
            container.stop()
        except Exception as exc:
            import docker.errors

            if not isinstance(exc, docker.errors.NotFound):
                raise ContainerBrokerError(f"could not remove the container of {self.image}: {exc}") from None

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        """Create topic ``name`` (with confluent-kafka's admin client) and wait until every partition
        has a leader; returns the name (:func:`asyncconsumer.testing.producer.create_topic`)."""
        from .producer import create_topic

        return create_topic(self.bootstrap, name, partitions, dict(config) if config else None)
