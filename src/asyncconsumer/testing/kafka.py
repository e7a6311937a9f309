"""Real Apache Kafka for tests, from Maven Central: no Docker, no tarball, no Maven.

    from asyncconsumer.testing import KafkaBroker

    with KafkaBroker() as kafka:                       # Apache Kafka 4.4.0, KRaft, one node
        Consumer(bootstrap_servers=kafka.bootstrap, ...)

    with KafkaBroker(version="3.9.2") as kafka:        # an older release (KAFKA_VERSIONS lists them)
        ...

    with KafkaCluster(brokers=3) as cluster:           # three nodes, replication factor 3
        cluster.nodes[0].kill()                        # SIGKILL; .stop() is a controlled shutdown
        cluster.nodes[0].restart()

The story of one start:

1. **Java.** ``JAVA_HOME/bin/java`` or ``java`` on ``PATH``, version 17 or newer; otherwise
   :class:`JavaNotFoundError` says what to install.
2. **Jars.** The runtime jars of the release asked for (``version``, one of
   :data:`KAFKA_VERSIONS`: the reference :data:`KAFKA_VERSION` unless named) are downloaded once
   from Maven Central into the user cache directory and checked against their pinned SHA-256;
   later starts use the cache and need no network (``ASYNCCONSUMER_KAFKA_LIBS``,
   ``ASYNCCONSUMER_CACHE_DIR`` and ``ASYNCCONSUMER_MAVEN_REPOSITORY`` change where they come
   from).  A failed download is a :class:`KafkaDownloadError` naming the jar, the address and the
   reason.  Both steps, and the command lines that run a class of those jars, are ``_java.py``'s
   (:func:`find_java`, :func:`kafka_libs`, re-exported here).
3. **Format.** Every node gets a temporary directory, loopback ports leased for the cluster's
   life (``ports.py``: no other cluster, in any process, is drawn onto them) and a
   ``server.properties``: combined broker+controller nodes (KRaft) with a static voter set,
   internal topics sized for the cluster, short group timers (classic, KIP-848 and share groups)
   and, per node, PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL listeners.  With
   ``advertise_plaintext`` (a proxy in front of each node), the function is asked for each node's
   advertised PLAINTEXT address once its ports are known, and the nodes replicate over an
   ``INTERNAL`` listener of their own.  ``kafka.tools.StorageTool format`` writes the storage,
   with the SCRAM credentials of :attr:`KafkaBroker.users`.  Releases differ only where they must:
   3.x logs through reload4j (a Log4j 1 ``log4j.properties``) instead of Log4j 2, and settings a
   release does not know (share groups before 4.0, say) are left out of its ``server.properties``
   (:data:`SETTINGS_SINCE`).
4. **Start.** ``kafka.Kafka`` runs as a child process (its log in the node's directory) and the
   start waits until the PLAINTEXT listener answers Metadata listing every node, through the
   package's own protocol codec.  A node that exits or does not answer in time is a
   :class:`KafkaStartError` with the broker's own ERROR lines (no Java stack trace).
5. **Stop.** Each node is stopped by its own pid (SIGTERM, which is a controlled shutdown, then
   SIGKILL after a grace period), and its directory is removed.

SASL: PLAIN and SCRAM-SHA-256/512 accept :attr:`KafkaBroker.users`; OAUTHBEARER uses Kafka's
unsecured-JWS validator (a token with ``"alg": "none"`` and the claims ``sub``, ``iat`` and
``exp``).  TLS: a throw-away CA and a server certificate for ``127.0.0.1``/``localhost`` (needs the
``cryptography`` package); :meth:`KafkaBroker.ssl_context` trusts it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ..config import SASL_MECHANISMS, SECURITY_PROTOCOLS, SecurityProtocol
from ._java import (
    KAFKA_VERSION,
    KAFKA_VERSIONS,
    MIN_JAVA,
    JavaNotFoundError,
    KafkaBrokerError,
    KafkaDownloadError,
    UnknownKafkaVersionError,
    cache_dir,
    check_version,
    find_java,
    java_command,
    kafka_libs,
)
from ._probe import wait_for_metadata, wait_for_port
from ._process import Service, parent_death_signal, stop_process
from .ports import PortLease, lease_ports

if TYPE_CHECKING:
    from .certs import TLSMaterial

__all__ = [
    "DEFAULT_USERS",
    "INTERNAL_LISTENER",
    "KAFKA_VERSION",
    "KAFKA_VERSIONS",
    "LISTENERS",
    "MIN_JAVA",
    "JavaNotFoundError",
    "KafkaBroker",
    "KafkaBrokerError",
    "KafkaCluster",
    "KafkaDownloadError",
    "KafkaNode",
    "KafkaStartError",
    "PlaintextAddress",
    "UnknownKafkaVersionError",
    "cache_dir",
    "check_version",
    "find_java",
    "kafka_libs",
]

LOOPBACK = "127.0.0.1"
Listener = SecurityProtocol
#: Every client listener a node can have; PLAINTEXT is always on (the brokers talk over it).
LISTENERS: tuple[Listener, ...] = SECURITY_PROTOCOLS
#: The listener the nodes replicate over when :class:`KafkaCluster`'s ``advertise_plaintext`` sends
#: clients elsewhere (a PLAINTEXT listener of its own, advertised as its real port).
INTERNAL_LISTENER = "INTERNAL"
#: Users of the SASL listeners (PLAIN and SCRAM) when none are given.
DEFAULT_USERS: Mapping[str, str] = {"alice": "alice-secret", "admin": "admin-secret"}
#: The audience (``aud`` claim) a broker with ``oauth_jwks_url`` expects in a token.
OAUTH_AUDIENCE = "kafka"
#: The issuer (``iss`` claim) it expects.
OAUTH_ISSUER = "asyncconsumer-tests"

#: ``server.properties`` entries the test broker sets that older releases do not know, with the
#: first release that does (older ones get none of them: a 3.x broker would only warn, but its
#: log should show what matters).
SETTINGS_SINCE: Mapping[str, tuple[int, int]] = {
    "share.coordinator.state.topic.replication.factor": (4, 0),
    "share.coordinator.state.topic.min.isr": (4, 0),
    "share.coordinator.state.topic.num.partitions": (4, 0),
    "group.share.session.timeout.ms": (4, 0),
    "group.share.min.session.timeout.ms": (4, 0),
    "group.share.heartbeat.interval.ms": (4, 0),
    "group.share.min.heartbeat.interval.ms": (4, 0),
    "group.share.record.lock.duration.ms": (4, 0),
    "group.share.min.record.lock.duration.ms": (4, 0),
    "group.share.assignment.interval.ms": (4, 3),
    "group.consumer.assignment.interval.ms": (4, 3),
}

_LOG4J2 = """\
status = error
name = asyncconsumer-test-broker
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
"""
#: The same for Kafka 3.x, which logs through reload4j (Log4j 1 syntax).
_LOG4J1 = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


class KafkaStartError(KafkaBrokerError):
    """The broker process failed to format, start or answer in time."""


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def broker_settings(nodes: int = 1, version: str = KAFKA_VERSION) -> dict[str, str]:
    """The ``server.properties`` entries of every test broker, beside its listeners and storage, in a
    cluster of ``nodes`` brokers running release ``version``: internal topics sized for the cluster,
    short group timers and quick failover (the settings ``version`` does not know, in
    :data:`SETTINGS_SINCE`, left out).  The container broker's container gets the same."""
    replication = str(min(3, nodes))
    in_sync = str(2 if nodes >= 3 else 1)
    settings = {
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.partitions": "1",
        "default.replication.factor": replication,
        "min.insync.replicas": in_sync,
        "offsets.topic.replication.factor": replication,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": in_sync,
        "share.coordinator.state.topic.num.partitions": "4",
        # Classic groups: no wait for more members before the first assignment.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "2000",
        # KIP-848 groups: short broker-side timers, assignments at once (4.3's batching off).
        "group.consumer.min.session.timeout.ms": "2000",
        "group.consumer.session.timeout.ms": "10000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.assignment.interval.ms": "0",
        # Share groups (KIP-932, on by default in clusters formatted by 4.2+; 4.0 and 4.1 have
        # them only when enabled: not here, so that those releases are tested without them).
        "group.share.session.timeout.ms": "10000",
        "group.share.min.session.timeout.ms": "2000",
        "group.share.heartbeat.interval.ms": "1000",
        "group.share.min.heartbeat.interval.ms": "500",
        "group.share.assignment.interval.ms": "0",
        "group.share.record.lock.duration.ms": "15000",
        "group.share.min.record.lock.duration.ms": "1000",
        # Quick failover and short-lived tests.
        "controller.quorum.election.timeout.ms": "1000",
        "controller.quorum.fetch.timeout.ms": "2000",
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
        "replica.lag.time.max.ms": "5000",
        "controlled.shutdown.enable": "true",
        "leader.imbalance.check.interval.seconds": "5",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "5000",
    }
    release = _release(version)
    for key, since in SETTINGS_SINCE.items():
        if release < since:
            settings.pop(key, None)
    return settings


# -------------------------------------------------------------------------------------- nodes


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes in URL-safe base64, as Kafka's own ``Uuid``.

    Like Kafka's ``Uuid.randomUuid()``, an id starting with ``-`` is drawn again: a command line
    would read it as an option (``kafka-storage format --cluster-id -Hx5...`` fails).
    """
    while True:
        text = urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def error_lines(log: str, limit: int = 8) -> str:
    """A broker log's own ERROR/FATAL lines (and 'Caused by' summaries), without stack frames; the
    last lines when there are none."""
    lines = log.splitlines()
    keep = [
        line.strip()
        for line in lines
        if (" ERROR " in line or " FATAL " in line or line.startswith(("Caused by:", "Exception in thread")))
        or re.match(r"^[\w.$]+(Exception|Error): ", line)
    ]
    if not keep:
        keep = [line.strip() for line in lines if line.strip() and not line.startswith(("\tat ", "\t..."))][-limit:]
    return "\n".join(keep[-limit:]) or "(empty log)"


def _error_lines(log: Path, limit: int = 8) -> str:
    """:func:`error_lines` of a log file."""
    try:
        return error_lines(log.read_text(errors="replace"), limit)
    except OSError:
        return "(no log)"


def _check_address(address: object, node: KafkaNode) -> str:
    """``advertise_plaintext``'s answer for ``node``, checked: a ``host:port`` string."""
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        if host and port.isdigit() and 0 < int(port) < 65536:
            return address
    raise ValueError(
        f"advertise_plaintext returned {address!r} for node {node.node_id}; expected 'host:port' (a proxy's "
        "address, say '127.0.0.1:40123')"
    )


@dataclasses.dataclass(frozen=True)
class _Ports:
    plaintext: int
    ssl: int
    sasl_plaintext: int
    sasl_ssl: int
    controller: int
    internal: int

    def for_listener(self, listener: str) -> int:
        return int(getattr(self, listener.lower()))


#: ``advertise_plaintext``: given a node (its ports allocated, nothing started yet), the
#: ``host:port`` its PLAINTEXT listener is to advertise to clients.
PlaintextAddress = Callable[["KafkaNode"], str]


class KafkaNode:
    """One combined broker+controller process of a :class:`KafkaBroker` or :class:`KafkaCluster`.

    Its ports and directory stay the same across :meth:`stop`/:meth:`kill` and :meth:`restart`.
    """

    def __init__(self, owner: _KafkaProcesses, node_id: int, ports: _Ports, directory: Path) -> None:
        self._owner = owner
        self.node_id = node_id
        self.ports = ports
        self.directory = directory
        self.log_file = directory / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.rack: str | None = None
        #: The ``host:port`` the PLAINTEXT listener advertises (``advertise_plaintext``'s answer),
        #: or None when it advertises its own port.
        self.advertised_plaintext: str | None = None
        #: KRaft ``process.roles``: ``"broker,controller"`` (a combined node), or ``"broker"`` and
        #: ``"controller"`` in a :class:`KafkaCluster` with isolated ``controllers``.
        self.roles = "broker,controller"

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "stopped"
        return f"<KafkaNode {self.node_id} at {self.bootstrap} ({state})>"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def bootstrap(self) -> str:
        """This node's PLAINTEXT listener, ``127.0.0.1:port``."""
        return f"{LOOPBACK}:{self.ports.plaintext}"

    def address(self, listener: Listener = "PLAINTEXT") -> str:
        """Where this node listens on ``listener`` (its own port, whatever it advertises)."""
        return f"{LOOPBACK}:{self.ports.for_listener(listener)}"

    @property
    def direct_address(self) -> str:
        """A PLAINTEXT address whose Metadata answers name the nodes' own ports: the node's
        :data:`INTERNAL_LISTENER` when its PLAINTEXT listener advertises another address, else
        the PLAINTEXT listener itself."""
        port = self.ports.plaintext if self.advertised_plaintext is None else self.ports.internal
        return f"{LOOPBACK}:{port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- process control ------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the process (storage already formatted); does not wait for it."""
        if self.alive:
            raise KafkaBrokerError(f"node {self.node_id} is already running (pid {self.pid})")
        owner = self._owner
        log = open(self.log_file, "ab")
        try:
            self.process = subprocess.Popen(
                [*owner.java_command("kafka.Kafka", heap_mb=owner.heap_mb), str(self.directory / "server.properties")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                preexec_fn=parent_death_signal(),
            )
        finally:
            log.close()

    def exited(self) -> str | None:
        """None while running; else a message with the broker's own error lines."""
        if self.process is None:
            return f"node {self.node_id} is not started"
        code = self.process.poll()
        if code is None:
            return None
        return f"node {self.node_id} exited with code {code}:\n{_error_lines(self.log_file)}"

    def kill(self) -> None:
        """SIGKILL: the node dies at once, as in a crash (no controlled shutdown)."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: a controlled shutdown (leadership moves away first); SIGKILL after ``timeout`` s."""
        stop_process(self.process, timeout)

    def restart(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start the node again (after :meth:`stop` or :meth:`kill`), same ports and data; with
        ``wait``, until it answers Metadata again."""
        self.stop()
        self.launch()
        if wait:
            self.wait_ready(timeout if timeout is not None else self._owner.startup_timeout, expect_nodes=1)

    def move(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop the node and start it on new ports, same node id and data: as if it were replaced by
        a machine at another address.  Its client listeners (and the one it replicates over) move;
        the quorum's CONTROLLER port stays.  Clients that knew the old address find the node only
        through fresh metadata, or a bootstrap address that follows it.  With ``advertise_plaintext``
        the function is asked again for the address to advertise (the node's new ports known)."""
        if self.roles == "controller":
            raise KafkaBrokerError(f"node {self.node_id} is a controller: its port is in every node's voter set")
        self.stop()
        # The ports left stay leased until the cluster stops: nobody (this node included) is drawn
        # onto them, so a client that knew the old address finds nobody there.
        fresh = iter(self._owner.lease_ports(len(dataclasses.fields(_Ports)) - 1))
        self.ports = _Ports(**{f.name: getattr(self.ports, f.name) if f.name == "controller" else next(fresh)
                               for f in dataclasses.fields(_Ports)})
        self._owner.configure(self)
        self.launch()
        if wait:
            self.wait_ready(timeout if timeout is not None else self._owner.startup_timeout, expect_nodes=1)

    def wait_ready(self, timeout: float, *, expect_nodes: int) -> float:
        """Until the node answers Metadata listing ``expect_nodes`` brokers (a controller-only
        node: until its CONTROLLER listener accepts connections)."""
        try:
            if self.roles == "controller":
                return wait_for_port(LOOPBACK, self.ports.controller, timeout=timeout, alive=self.exited)
            return wait_for_metadata(
                LOOPBACK, self.ports.plaintext, timeout=timeout, alive=self.exited, expect_nodes=expect_nodes
            )
        except RuntimeError as exc:
            raise KafkaStartError(str(exc)) from None
        except TimeoutError as exc:
            raise KafkaStartError(
                f"{exc}; the broker's log says:\n{_error_lines(self.log_file)}\n(log: {self.log_file})"
            ) from None


class _KafkaProcesses(Service):
    """What :class:`KafkaBroker` and :class:`KafkaCluster` share: jars, Java, format, start, stop."""

    def __init__(
        self,
        *,
        nodes: int,
        listeners: Iterable[Listener],
        users: Mapping[str, str] | None,
        config: Mapping[str, object] | None,
        racks: Sequence[str] | None,
        startup_timeout: float,
        heap_mb: int,
        advertise_plaintext: PlaintextAddress | None = None,
        version: str = KAFKA_VERSION,
        controllers: int = 0,
        port: int | None = None,
        classpath: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        self._version = check_version(version)
        if port is not None and (nodes != 1 or not 0 < port < 65536):
            raise ValueError(f"port={port!r}: a port (1-65535) can be given to one node only")
        self._port = port
        #: Jars or class directories put on the JVMs' class path after Kafka's own (a plugin).
        self.classpath: tuple[Path, ...] = tuple(Path(entry) for entry in classpath)
        listeners = tuple(dict.fromkeys(("PLAINTEXT", *listeners)))
        unknown = [name for name in listeners if name not in LISTENERS]
        if unknown:
            raise ValueError(f"unknown listener(s) {unknown}; choose from {list(LISTENERS)}")
        if racks is not None and len(racks) != nodes:
            raise ValueError(f"racks: {len(racks)} given for {nodes} nodes")
        self.listeners: tuple[Listener, ...] = listeners
        self.users: dict[str, str] = dict(DEFAULT_USERS if users is None else users)
        self.config = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in (config or {}).items()}
        self.startup_timeout = startup_timeout
        self.heap_mb = heap_mb
        self.startup_seconds: float | None = None
        self._racks = list(racks) if racks is not None else None
        if advertise_plaintext is not None and "advertised.listeners" in self.config:
            raise ValueError("advertise_plaintext and config['advertised.listeners'] both set: give one of them")
        self._advertise_plaintext = advertise_plaintext
        self._count = nodes
        self._controller_count = controllers
        self._java: str | None = None
        self._libs: Path | None = None
        self._directory: Path | None = None
        self._tls: TLSMaterial | None = None
        self._leases: list[PortLease] = []
        self.nodes: list[KafkaNode] = []
        #: KafkaBroker's ``oauth_jwks_url`` (None: the unsecured OAUTHBEARER validator).
        self.oauth_jwks_url: str | None = None
        #: The controller-only nodes (:class:`KafkaCluster`'s ``controllers``); empty when every
        #: node in :attr:`nodes` is a combined broker and controller.
        self.controllers: list[KafkaNode] = []

    # -- public surface shared by both ----------------------------------------------------------

    @property
    def version(self) -> str:
        """The Apache Kafka release these nodes run (``version=``, by default :data:`KAFKA_VERSION`)."""
        return self._version

    @property
    def release(self) -> tuple[int, int]:
        """``(major, minor)`` of :attr:`version`, for comparisons: ``broker.release >= (4, 0)``."""
        return _release(self._version)

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT listener, comma-separated."""
        return self.bootstrap_for("PLAINTEXT")

    @property
    def direct_bootstrap(self) -> str:
        """Every node's :attr:`KafkaNode.direct_address`: a bootstrap whose clients talk to the
        nodes' own ports, never through what ``advertise_plaintext`` put in front of them (the same
        as :attr:`bootstrap` without it)."""
        return ",".join(node.direct_address for node in self.nodes)

    def bootstrap_for(self, listener: Listener) -> str:
        """Every node's address on ``listener`` ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")."""
        if listener not in self.listeners:
            raise ValueError(f"listener {listener!r} is not enabled (enabled: {list(self.listeners)})")
        return ",".join(node.address(listener) for node in self.nodes)

    @property
    def ca_file(self) -> Path:
        """The PEM file of the throw-away CA that signed the brokers' certificate."""
        return self._tls_material().ca_file

    def ssl_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        """A fresh client ``SSLContext`` that trusts the brokers' CA (hostname checking on)."""
        return self._tls_material().client_context(with_client_cert=with_client_cert)

    def consumer_options(
        self, listener: Listener = "PLAINTEXT", *, mechanism: str = "PLAIN", user: str | None = None
    ) -> dict[str, Any]:
        """Options for ``Consumer(**options)`` to connect through ``listener`` (SASL as ``user``)."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_for(listener), "security_protocol": listener}
        if listener in ("SSL", "SASL_SSL"):
            options["ssl_context"] = self.ssl_context()
        if listener in ("SASL_PLAINTEXT", "SASL_SSL"):
            name = user or next(iter(self.users))
            options.update(sasl_mechanism=mechanism, sasl_plain_username=name, sasl_plain_password=self.users[name])
        return options

    def java_command(self, main_class: str, *args: str, heap_mb: int = 256) -> list[str]:
        """A command line running ``main_class`` of Kafka's jars (``org.apache.kafka.tools.
        ConsumerPerformance``, ``org.apache.kafka.tools.FeatureCommand``, ...) with this broker's logging."""
        if self._java is None or self._libs is None or self._directory is None:
            raise KafkaBrokerError("the broker is not started")
        properties = [self._logging_property(), f"kafka.logs.dir={self._directory}"]
        if self.oauth_jwks_url:
            properties.append(f"org.apache.kafka.sasl.oauthbearer.allowed.urls={self.oauth_jwks_url}")
        return java_command(self._java, self._libs, main_class, *args, heap_mb=heap_mb, system_properties=properties,
                            classpath=self.classpath)

    def _logging_property(self) -> str:
        """Where the release's logging reads its configuration: Log4j 2 from 4.0, reload4j before."""
        assert self._directory is not None
        if self.release >= (4, 0):
            return f"log4j2.configurationFile={self._directory / 'log4j2.properties'}"
        return f"log4j.configuration=file:{self._directory / 'log4j.properties'}"

    def run_tool(
        self, main_class: str, *args: str, timeout: float = 120.0, check: bool = True, heap_mb: int = 256
    ) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's command-line tools to completion and return its output."""
        result = subprocess.run(
            self.java_command(main_class, *args, heap_mb=heap_mb),
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
        )
        if check and result.returncode != 0:
            text = (result.stderr or result.stdout).strip().splitlines()
            summary = "\n".join([line for line in text if not line.startswith(("\tat ", "\t..."))][-8:])
            command = " ".join((main_class, *args))
            raise KafkaBrokerError(f"{command} failed with exit code {result.returncode}:\n{summary}")
        return result

    # -- start / stop -----------------------------------------------------------------------------

    def start(self) -> Self:
        if self.nodes:
            raise KafkaBrokerError("already started")
        began = time.monotonic()
        self._java, _ = find_java()
        self._libs = kafka_libs(self._version)
        self._directory = Path(tempfile.mkdtemp(prefix="asyncconsumer-kafka-"))
        try:
            (self._directory / "log4j2.properties").write_text(_LOG4J2)
            (self._directory / "log4j.properties").write_text(_LOG4J1)
            if any(name in ("SSL", "SASL_SSL") for name in self.listeners):
                self._tls_material()
            width = len(dataclasses.fields(_Ports))
            total = self._count + self._controller_count
            ports = self.lease_ports(width * total)
            for index in range(total):
                directory = self._directory / f"node-{index + 1}"
                directory.mkdir()
                node_ports = _Ports(*ports[width * index: width * (index + 1)])
                if self._port is not None and index == 0:
                    node_ports = dataclasses.replace(node_ports, plaintext=self._port)
                node = KafkaNode(self, index + 1, node_ports, directory)
                if index >= self._count:  # brokers are 1..n, isolated controllers n+1..
                    node.roles = "controller"
                    self.controllers.append(node)
                    continue
                if self._controller_count:
                    node.roles = "broker"
                node.rack = self._racks[index] if self._racks is not None else None
                self.nodes.append(node)
            cluster_id = new_cluster_id()
            # Every port is known now and nothing listens yet: with ``advertise_plaintext`` the
            # caller can point a proxy at each node before the node tells anyone to go through it.
            for node in (*self.controllers, *self.nodes):
                self.configure(node)
                self._format(node, cluster_id)
            for node in (*self.controllers, *self.nodes):
                node.launch()
            deadline = began + self.startup_timeout
            for node in self.nodes:
                node.wait_ready(max(1.0, deadline - time.monotonic()), expect_nodes=self._count)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def configure(self, node: KafkaNode) -> None:
        """Write ``node``'s ``server.properties`` from its ports, first asking ``advertise_plaintext``
        (if given) for the address its PLAINTEXT listener advertises."""
        if self._advertise_plaintext is not None and node.roles != "controller":
            node.advertised_plaintext = _check_address(self._advertise_plaintext(node), node)
        (node.directory / "server.properties").write_text(self._properties(node))

    def _format(self, node: KafkaNode, cluster_id: str) -> None:
        args = ["format", "--config", str(node.directory / "server.properties"), f"--cluster-id={cluster_id}",
                "--ignore-formatted"]
        for name, password in self.users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        result = subprocess.run(
            self.java_command("kafka.tools.StorageTool", *args), capture_output=True, text=True, timeout=120,
            stdin=subprocess.DEVNULL, check=False,
        )
        if result.returncode != 0:
            text = "\n".join(
                line for line in (result.stderr + result.stdout).splitlines() if not line.startswith("\tat ")
            )
            raise KafkaStartError(f"formatting node {node.node_id}'s storage failed:\n{text.strip()[-2000:]}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout`` s) and remove their files.
        Isolated controllers stop after the brokers, whose controlled shutdown needs them."""
        nodes, self.nodes = self.nodes, []
        controllers, self.controllers = self.controllers, []
        for group in (nodes, controllers):
            for node in group:
                if node.process is not None and node.process.poll() is None:
                    node.process.terminate()
            for node in group:
                node.stop(timeout)
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        leases, self._leases = self._leases, []
        for lease in leases:
            lease.release()

    def lease_ports(self, count: int) -> list[int]:
        """``count`` loopback ports held for this cluster (no other lease, in any process, gets
        them) until :meth:`stop`: a node restarting, or moved away, leaves nobody a port to take."""
        lease = lease_ports(count)
        self._leases.append(lease)
        return lease.ports

    # -- configuration ----------------------------------------------------------------------------

    def _tls_material(self) -> TLSMaterial:
        if self._tls is None:
            if self._directory is None:
                raise KafkaBrokerError("the broker is not started")
            try:
                from .certs import generate_certs
            except ImportError as exc:
                raise KafkaBrokerError(
                    "the SSL and SASL_SSL listeners need throw-away certificates, made with the 'cryptography' "
                    "package: pip install cryptography (or leave SSL out: listeners=('PLAINTEXT', 'SASL_PLAINTEXT'))"
                ) from exc
            self._tls = generate_certs(self._directory / "tls")
        return self._tls

    def _properties(self, node: KafkaNode) -> str:
        count = self._count
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.ports.controller}" for n in self.controllers or self.nodes)
        if node.roles == "controller":
            return self._controller_properties(node, voters)
        listeners = [f"{name}://{node.address(name)}" for name in self.listeners]
        advertised = list(listeners)
        protocol_map = ["CONTROLLER:PLAINTEXT", *(f"{name}:{name}" for name in self.listeners)]
        inter_broker = "PLAINTEXT"
        if node.advertised_plaintext is not None:
            # Clients are sent to another address (a proxy); replication gets a listener of its own
            # on the node's real port, so only client traffic takes the detour.  Kafka requires the
            # inter-broker listener among the advertised ones: the brokers find each other there.
            internal = f"{INTERNAL_LISTENER}://{LOOPBACK}:{node.ports.internal}"
            advertised = [f"PLAINTEXT://{node.advertised_plaintext}" if name == "PLAINTEXT" else entry
                          for name, entry in zip(self.listeners, listeners, strict=True)]
            listeners.append(internal)
            advertised.append(internal)
            protocol_map.append(f"{INTERNAL_LISTENER}:PLAINTEXT")
            inter_broker = INTERNAL_LISTENER
        if node.roles != "broker":  # a combined node listens for the quorum too
            listeners.append(f"CONTROLLER://{LOOPBACK}:{node.ports.controller}")
        props: dict[str, str] = {
            "process.roles": node.roles,
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": inter_broker,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(protocol_map),
            "log.dirs": str(node.directory / "data"),
            **broker_settings(count, self.version),
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        }
        if node.rack is not None:
            props["broker.rack"] = node.rack
            props["replica.selector.class"] = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
        plain_users = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        for listener in ("SASL_PLAINTEXT", "SASL_SSL"):
            if listener not in self.listeners:
                continue
            prefix = f"listener.name.{listener.lower()}"
            props[f"{prefix}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            )
            for mechanism in ("scram-sha-256", "scram-sha-512"):
                props[f"{prefix}.{mechanism}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                )
            # No server callback handler: Kafka validates OAUTHBEARER tokens with its unsecured-JWS
            # validator (OAuthBearerUnsecuredValidatorCallbackHandler).
            props[f"{prefix}.oauthbearer.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                'unsecuredLoginStringClaim_sub="broker";'
            )
            if self.oauth_jwks_url:  # signed JWTs checked against a JWKS endpoint (KIP-768)
                props[f"{prefix}.oauthbearer.sasl.server.callback.handler.class"] = (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
                )
                props[f"{prefix}.oauthbearer.sasl.oauthbearer.jwks.endpoint.url"] = self.oauth_jwks_url
                props["sasl.oauthbearer.jwks.endpoint.url"] = self.oauth_jwks_url
                # Kafka 4.4's validator refuses to start without an expected audience and issuer.
                for name, value in (("expected.audience", OAUTH_AUDIENCE), ("expected.issuer", OAUTH_ISSUER)):
                    props[f"{prefix}.oauthbearer.sasl.oauthbearer.{name}"] = value
                    props[f"sasl.oauthbearer.{name}"] = value
        if any(name in ("SSL", "SASL_SSL") for name in self.listeners):
            tls = self._tls_material()
            chain = node.directory / "server-chain.pem"
            chain.write_text(tls.server_key_file.read_text() + tls.server_cert_file.read_text())
            props.update({
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(chain),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(tls.ca_file),
                "ssl.client.auth": "none",
            })
        props.update(self.config)
        return "".join(f"{key}={value}\n" for key, value in props.items())

    #: ``config`` keys that describe a broker's listeners: not given to a controller-only node.
    _BROKER_LISTENER_KEYS = frozenset(
        {"listeners", "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name"}
    )

    def _controller_properties(self, node: KafkaNode, voters: str) -> str:
        """``server.properties`` of an isolated controller: the quorum's listener and timers only."""
        props: dict[str, str] = {
            "process.roles": "controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": f"CONTROLLER://{LOOPBACK}:{node.ports.controller}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "controller.quorum.election.timeout.ms": "1000",
            "controller.quorum.fetch.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
        }
        props.update((k, v) for k, v in self.config.items() if k not in self._BROKER_LISTENER_KEYS)
        return "".join(f"{key}={value}\n" for key, value in props.items())


class KafkaBroker(_KafkaProcesses):
    """One Apache Kafka node (KRaft, combined broker and controller) on free loopback ports.

    ``listeners``: which client listeners to open besides PLAINTEXT (default: all four).
    ``users``: SASL users (PLAIN and SCRAM-SHA-256/512), name → password; default
    :data:`DEFAULT_USERS`.  ``config``: extra or overriding ``server.properties`` entries, e.g.
    ``{"connections.max.reauth.ms": 5000}``.  ``startup_timeout``: seconds for the whole start,
    a first download excepted.  ``heap_mb``: the broker's Java heap.  ``advertise_plaintext``:
    the address clients are sent to for the PLAINTEXT listener (a proxy in front of it), as for
    :class:`KafkaCluster`.  ``version``: the Apache Kafka release to run, one of
    :data:`KAFKA_VERSIONS` (default :data:`KAFKA_VERSION`, the reference); another is an
    :class:`UnknownKafkaVersionError` listing them.  ``oauth_jwks_url``: validate OAUTHBEARER
    tokens as signed JWTs against the keys at this JWKS URL (Kafka's
    ``OAuthBearerValidatorCallbackHandler``, KIP-768; the URL is also allowed by the JVM property
    ``org.apache.kafka.sasl.oauthbearer.allowed.urls``) instead of with the unsecured validator;
    tokens must name the audience :data:`OAUTH_AUDIENCE` (``"kafka"``) and the issuer
    :data:`OAUTH_ISSUER` (``"asyncconsumer-tests"``).  ``port``: the PLAINTEXT listener's port
    (default: a free one; a port in use makes :meth:`start` fail with :class:`KafkaStartError`).
    ``classpath``: jars or class directories put on the broker's class path after Kafka's own, for
    a plugin that ``config`` names (a ``metric.reporters`` class, an authorizer); the plugin reads
    its own settings from ``config``.

    :attr:`startup_seconds` is how long :meth:`start` took.  The broker is a real process: stop
    it (``with`` does) or it is stopped when the Python process exits.
    """

    def __init__(
        self,
        *,
        listeners: Iterable[Listener] = LISTENERS,
        users: Mapping[str, str] | None = None,
        config: Mapping[str, object] | None = None,
        rack: str | None = None,
        advertise_plaintext: PlaintextAddress | None = None,
        startup_timeout: float = 90.0,
        heap_mb: int = 768,
        version: str = KAFKA_VERSION,
        oauth_jwks_url: str | None = None,
        port: int | None = None,
        classpath: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        super().__init__(
            nodes=1, listeners=listeners, users=users, config=config, racks=None if rack is None else [rack],
            startup_timeout=startup_timeout, heap_mb=heap_mb, advertise_plaintext=advertise_plaintext,
            version=version, port=port, classpath=classpath,
        )
        self.oauth_jwks_url = oauth_jwks_url

    def __repr__(self) -> str:
        return f"<KafkaBroker {self.version} {self.bootstrap if self.nodes else '(not started)'}>"

    @property
    def node(self) -> KafkaNode:
        if not self.nodes:
            raise KafkaBrokerError("the broker is not started")
        return self.nodes[0]

    @property
    def pid(self) -> int | None:
        return self.node.pid if self.nodes else None

    @property
    def log_file(self) -> Path:
        return self.node.log_file


class KafkaCluster(_KafkaProcesses):
    """Several Apache Kafka nodes on loopback, each a combined broker and controller.

    The nodes form one KRaft controller quorum (a static voter set of all of them), so the
    cluster survives the loss of a minority.  ``controllers=N`` instead starts N controller-only
    nodes beside the ``brokers`` broker-only ones (Kafka's isolated KRaft mode, as Kafka's own
    system tests run): the quorum is theirs alone (:attr:`controllers`, node ids after the
    brokers'), so any number of brokers can be down while it stays whole.  Topics default to replication factor
    ``min(3, brokers)`` and ``min.insync.replicas=2`` from three brokers on.  ``racks`` gives
    each node a ``broker.rack`` and turns on the rack-aware replica selector (fetching from
    followers, KIP-392).  Each of :attr:`nodes` can be killed, stopped and restarted.

    ``advertise_plaintext`` puts something between the clients and each node (a chaos proxy, in
    the project's own tests): it is called once per node during :meth:`start`, after the node's
    ports are allocated (``node.ports.plaintext`` is where to forward to) and before any node
    starts, and returns the ``host:port`` that node's PLAINTEXT listener advertises.  Clients
    then reach the node only there, after their bootstrap.  The nodes replicate over a listener
    of their own, :data:`INTERNAL_LISTENER` (PLAINTEXT, ``inter.broker.listener.name``, advertised
    as its real port ``node.ports.internal``), and the controllers keep their CONTROLLER
    listener, so broker-to-broker and controller traffic never takes the detour.
    :attr:`direct_bootstrap` reaches the nodes without it too (for admin tools and producers
    that are not under test).  It cannot be combined with ``config["advertised.listeners"]``.
    ``version`` picks the Apache Kafka release, as for :class:`KafkaBroker`.
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        listeners: Iterable[Listener] = ("PLAINTEXT",),
        users: Mapping[str, str] | None = None,
        config: Mapping[str, object] | None = None,
        racks: Sequence[str] | None = None,
        advertise_plaintext: PlaintextAddress | None = None,
        startup_timeout: float = 120.0,
        heap_mb: int = 512,
        version: str = KAFKA_VERSION,
        controllers: int = 0,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        if controllers < 0:
            raise ValueError(f"controllers={controllers}: give 0 (combined nodes) or the number of isolated ones")
        super().__init__(
            nodes=brokers, listeners=listeners, users=users, config=config, racks=racks,
            startup_timeout=startup_timeout, heap_mb=heap_mb, advertise_plaintext=advertise_plaintext,
            version=version,
            controllers=controllers,
        )

    def __repr__(self) -> str:
        quorum = f" + {len(self.controllers)} controllers" if self.controllers else ""
        return f"<KafkaCluster {self.version} {len(self.nodes)} nodes{quorum} {self.bootstrap if self.nodes else ''}>"

    def node(self, node_id: int) -> KafkaNode:
        """The node with this broker id (ids are 1, 2, 3, ...)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} (nodes: {[n.node_id for n in self.nodes]})")

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every running node answers Metadata listing every node."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.startup_timeout)
        for node in self.nodes:
            if node.alive:
                node.wait_ready(max(1.0, deadline - time.monotonic()), expect_nodes=len(self.nodes))
