"""pytest fixtures for applications' tests, registered by the ``pytest11`` entry point: installing
``asyncconsumer[testing]`` is enough, no ``conftest.py`` needed (docs/pytest-plugin.md).

Fixtures:
    kafka_broker   (session) the broker: an embedded Tansu by default, Apache Kafka with
                   ``--kafka-broker=kafka`` (its jars) or ``--kafka-broker=testcontainers[:IMAGE]`` (its
                   image, in a container), an existing cluster with ``--kafka-bootstrap=HOST:PORT``;
                   ``.bootstrap`` is the address to give ``Consumer(bootstrap_servers=...)``
    kafka_topic    a fresh topic for each test (one partition; ``@pytest.mark.kafka_topic(partitions=3,
                   config={...})`` changes that)
    kafka_produce  ``kafka_produce(topic, records) -> [(partition, offset)]``, and
                   ``await kafka_produce.aio(topic, records)`` from async tests (asyncio or trio)

Records are ``bytes``/``str`` values or ``(partition, key, value[, headers[, timestamp_ms]])`` tuples
(``partition=None``: the partitioner chooses); see :func:`asyncconsumer.testing.producer.produce`.

No broker, no session: when ``--kafka-bootstrap`` names no server that accepts a connection, or the
broker to start does not start, the first test that needs ``kafka_broker`` ends the whole session
with one line naming the address or the cause (``pytest.exit``), instead of every test waiting out
its own timeout while librdkafka logs each failed connection.
"""

from __future__ import annotations

import argparse
import functools
import socket
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import pytest

if TYPE_CHECKING:
    from .container import ContainerBroker

__all__ = ["ExistingCluster", "KafkaProduce", "RunningBroker"]

BROKER_KINDS = ("tansu", "kafka")


class RunningBroker(Protocol):
    """What ``kafka_broker`` is: something with a bootstrap address."""

    @property
    def bootstrap(self) -> str: ...


@dataclass(frozen=True)
class ExistingCluster:
    """``--kafka-bootstrap``: a cluster the plugin neither starts nor stops."""

    bootstrap: str


def broker_kind(value: str) -> str:
    """``--kafka-broker``'s value, checked: one of :data:`BROKER_KINDS`, ``testcontainers`` or
    ``testcontainers:IMAGE``."""
    kind, colon, image = value.partition(":")
    if value in BROKER_KINDS or (kind == "testcontainers" and (image.strip() or not colon)):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r}: choose tansu, kafka, testcontainers or testcontainers:IMAGE (an image name after the colon)"
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("asyncconsumer", "asyncconsumer Kafka fixtures")
    group.addoption(
        "--kafka-broker",
        type=broker_kind,
        default="tansu",
        metavar="{tansu,kafka,testcontainers[:IMAGE]}",
        help="broker behind the kafka_broker fixture: tansu (embedded, default), kafka (Apache Kafka; Java 17+) "
        "or testcontainers (Apache Kafka's official image in a container, or IMAGE; needs Docker)",
    )
    group.addoption(
        "--kafka-bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="use this running cluster for kafka_broker instead of starting one",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kafka_topic(partitions=1, config=None): partitions and topic config of the kafka_topic fixture"
    )


#: How long the look at each ``--kafka-bootstrap`` server may take.
PROBE_TIMEOUT = 5.0


def _no_session(reason: str) -> NoReturn:
    """End the test session with one line (exit status 3: pytest's "internal error", as for any
    session that cannot run; not 1, which says tests ran and failed)."""
    pytest.exit(f"asyncconsumer pytest plugin: {reason}", returncode=pytest.ExitCode.INTERNAL_ERROR)


def _check_reachable(bootstrap: str) -> None:
    """Return when a server of ``bootstrap`` accepts a TCP connection; else end the session."""
    from ..config import parse_host_port
    from ..errors import ConfigError

    problems = []
    for server in (s.strip() for s in bootstrap.split(",") if s.strip()):
        try:
            host, port = parse_host_port(server)
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
            return
        except ConfigError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{server}: {exc.strerror or exc or type(exc).__name__}")
    _no_session(f"no Kafka broker reachable at --kafka-bootstrap={bootstrap} ({'; '.join(problems) or 'empty'})")


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    """The session's Kafka-compatible broker (``.bootstrap``)."""
    existing = request.config.getoption("--kafka-bootstrap")
    if existing:
        _check_reachable(existing)
        yield ExistingCluster(existing)
        return
    kind = request.config.getoption("--kafka-broker")
    from . import EmbeddedBroker, EmbeddedBrokerError, KafkaBroker, KafkaBrokerError

    broker: KafkaBroker | EmbeddedBroker | ContainerBroker
    if kind.startswith("testcontainers"):
        from .container import KAFKA_IMAGE, ContainerBroker

        broker = ContainerBroker(kind.partition(":")[2] or KAFKA_IMAGE)
    else:
        broker = KafkaBroker() if kind == "kafka" else EmbeddedBroker()
    try:
        broker.start()
    except (KafkaBrokerError, EmbeddedBrokerError, ImportError, OSError, TimeoutError) as exc:
        broker.stop()
        _no_session(f"the {type(broker).__name__} for kafka_broker did not start: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


def _topic_name(request: pytest.FixtureRequest) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in request.node.name)[:60].strip("-.")
    return f"{stem or 'topic'}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_topic(kafka_broker: RunningBroker, request: pytest.FixtureRequest) -> str:
    """A topic made for this test, named after it (waits until every partition has a leader)."""
    from .producer import create_topic

    marker = request.node.get_closest_marker("kafka_topic")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"partitions", "config"}
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.kafka_topic: unknown argument(s) {sorted(unknown)}")
    return create_topic(
        kafka_broker.bootstrap, _topic_name(request), int(options.get("partitions", 1)), options.get("config")
    )


class KafkaProduce:
    """Produces records to the session's broker with confluent-kafka (an independent client)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def __call__(self, topic: str, records: Iterable[Any], **options: Any) -> list[tuple[int, int]]:
        """Produce and wait for delivery; ``(partition, offset)`` per record, in order.  ``options``:
        ``compression``, ``linger_ms``, ``acks``, ``client_config`` ... of
        :func:`asyncconsumer.testing.producer.produce`."""
        from .producer import produce

        return produce(self.bootstrap, topic, list(records), **options)

    async def aio(self, topic: str, records: Iterable[Any], **options: Any) -> list[tuple[int, int]]:
        """The same from async code: runs in a worker thread, the event loop goes on."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(functools.partial(self, topic, list(records), **options))


@pytest.fixture
def kafka_produce(kafka_broker: RunningBroker) -> KafkaProduce:
    """``kafka_produce(topic, records)`` / ``await kafka_produce.aio(topic, records)``."""
    return KafkaProduce(kafka_broker.bootstrap)


from .pytest_schema_registry import schema_registry  # noqa: E402,F401  (the fixture, registered with the plugin)
