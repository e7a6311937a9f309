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
"""

from __future__ import annotations

import argparse
import functools
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

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


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    """The session's Kafka-compatible broker (``.bootstrap``)."""
    existing = request.config.getoption("--kafka-bootstrap")
    if existing:
        yield ExistingCluster(existing)
        return
    kind = request.config.getoption("--kafka-broker")
    if kind.startswith("testcontainers"):
        from .container import KAFKA_IMAGE, ContainerBroker

        with ContainerBroker(kind.partition(":")[2] or KAFKA_IMAGE) as container:
            yield container
        return
    if kind == "kafka":
        from . import KafkaBroker

        with KafkaBroker() as kafka:
            yield kafka
        return
    from . import EmbeddedBroker

    with EmbeddedBroker() as tansu:
        yield tansu


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
