"""Client metrics push (KIP-714) to Apache Kafka: what a broker's telemetry plugin receives.

The broker (one for the module) runs ``tests/support/java/TelemetryReceiver.java``, compiled here
with javac against the broker's own jars and named in ``metric.reporters``: it writes each push it
gets to a file, with the client instance id, the ``terminating`` flag, the client id, the payload
and the metric names and kinds Kafka's own (shaded) OTLP classes decode from it.  A client metrics
subscription set with Kafka's ``kafka-configs`` tool asks every client for
``org.apache.kafka.consumer.`` every half second.  The payload is decoded again here with
``opentelemetry-proto``.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.broker import in_ci, private_kafka
from support.paths import SUPPORT
from support.producer import create_topic, produce
from support.share import share_group

from asyncconsumer import Consumer
from asyncconsumer.errors import IllegalStateError
from asyncconsumer.protocol import compression
from asyncconsumer.share import ShareConsumer
from asyncconsumer.testing import KafkaBroker
from asyncconsumer.testing.kafka import find_java, kafka_libs

metrics_pb2 = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm]

RECEIVER = SUPPORT / "java" / "TelemetryReceiver.java"
INTERVAL_MS = 500
RECORDS = 25
RECORDS_CONSUMED = "org.apache.kafka.consumer.fetch.manager.records.consumed.total"
SHARE_RECORDS_CONSUMED = "org.apache.kafka.consumer.share.fetch.manager.records.consumed.total"
#: What a consumer with a group pushes (docs/metrics.md lists them).
CONSUMER_METRICS = {
    "org.apache.kafka.consumer.connection.count": "gauge",
    "org.apache.kafka.consumer.connection.creation.total": "sum",
    "org.apache.kafka.consumer.connection.creation.rate": "gauge",
    "org.apache.kafka.consumer.last.poll.seconds.ago": "gauge",
    "org.apache.kafka.consumer.fetch.manager.fetch.total": "sum",
    "org.apache.kafka.consumer.fetch.manager.fetch.rate": "gauge",
    "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg": "gauge",
    "org.apache.kafka.consumer.fetch.manager.fetch.size.avg": "gauge",
    "org.apache.kafka.consumer.fetch.manager.bytes.consumed.total": "sum",
    "org.apache.kafka.consumer.fetch.manager.bytes.consumed.rate": "gauge",
    "org.apache.kafka.consumer.fetch.manager.records.consumed.total": "sum",
    "org.apache.kafka.consumer.fetch.manager.records.consumed.rate": "gauge",
    "org.apache.kafka.consumer.fetch.manager.records.lag.max": "gauge",
    "org.apache.kafka.consumer.fetch.manager.records.lag": "gauge",
    "org.apache.kafka.consumer.coordinator.assigned.partitions": "gauge",
    "org.apache.kafka.consumer.coordinator.commit.total": "sum",
    "org.apache.kafka.consumer.coordinator.commit.rate": "gauge",
    "org.apache.kafka.consumer.coordinator.commit.latency.avg": "gauge",
    "org.apache.kafka.consumer.coordinator.rebalance.total": "sum",
}


@dataclass(frozen=True)
class Push:
    instance_id: str
    terminating: bool
    client_id: str
    data: Any  # MetricsData
    #: ``{name: "GAUGE" | "SUM"}`` as Kafka's own classes decoded the payload.
    java: dict[str, str]

    @property
    def resource(self) -> dict[str, str]:
        (resource_metrics,) = self.data.resource_metrics
        return {kv.key: kv.value.string_value for kv in resource_metrics.resource.attributes}

    @property
    def metrics(self) -> list[Any]:
        return [m for rm in self.data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


@dataclass(frozen=True)
class Receiver:
    broker: KafkaBroker
    file: Path

    def pushes(self, client_id: str) -> list[Push]:
        if not self.file.exists():
            return []
        found = []
        for line in self.file.read_text().splitlines():
            instance, terminating, client, data, java = line.split("\t")
            if client == client_id:
                decoded = metrics_pb2.MetricsData.FromString(base64.b64decode(data))
                names = dict(entry.split(":") for entry in java.split(",") if entry)
                found.append(Push(instance, terminating == "true", client, decoded, names))
        return found


def javac() -> str:
    java, _ = find_java()
    beside = Path(java).resolve().with_name("javac")
    found = str(beside) if beside.exists() else shutil.which("javac")
    if found is None:
        if in_ci():
            raise RuntimeError("javac not found: tests/observability/test_metrics_push.py compiles a broker plugin")
        pytest.skip("javac (a JDK) is needed to compile the broker's telemetry plugin")
    return found


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the first test runs on trio too; one backend for the rest keeps the module cheap


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    classes = tmp_path_factory.mktemp("telemetry-receiver")
    subprocess.run([javac(), "-nowarn", "-d", str(classes), "-cp", str(kafka_libs() / "*"), str(RECEIVER)],
                   check=True, capture_output=True, timeout=300)
    received = classes / "received.tsv"
    with private_kafka(listeners=("PLAINTEXT",), classpath=[classes],
                       config={"metric.reporters": "TelemetryReceiver", "telemetry.receiver.file": received}) as broker:
        broker.run_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", broker.bootstrap, "--alter",
                        "--entity-type", "client-metrics", "--entity-name", "consumers",
                        "--add-config", f"metrics=org.apache.kafka.consumer.,interval.ms={INTERVAL_MS}")
        yield Receiver(broker, received)


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's text form of a UUID (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


async def wait_for(condition: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 - a file another process writes: nothing to wait on
            await anyio.sleep(0.1)


def points(push: Push, name: str) -> list[Any]:
    for metric in push.metrics:
        if metric.name == name:
            return list(getattr(metric, metric.WhichOneof("data")).data_points)
    return []


def total(pushes: list[Push], name: str) -> float:
    """A delta sum added up over the pushes."""
    return sum(p.as_double for push in pushes for p in points(push, name))


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_receiver_gets_the_consumers_metrics(receiver: Receiver, anyio_backend: str) -> None:
    bootstrap = receiver.broker.bootstrap
    topic = create_topic(bootstrap, f"push-{uuid.uuid4().hex[:8]}", 2)
    produce(bootstrap, topic, [b"x" * 10 for _ in range(RECORDS)])
    client_id = f"pusher-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumed = 0
    async with Consumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=group,
                        auto_offset_reset="earliest") as consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            while consumed < RECORDS:
                batch = await consumer.getmany(timeout=1)
                consumed += sum(map(len, batch.values()))
        await consumer.commit()
        instance_id = await consumer.client_instance_id(timeout=10)
        assert isinstance(instance_id, uuid.UUID)
        assert await consumer.client_instance_id(0) == instance_id  # known now: no wait, same id
        # A push after the records were handed out (each push comes an interval after the last).
        await wait_for(lambda: total(receiver.pushes(client_id), RECORDS_CONSUMED) == RECORDS)
        member_id = consumer.metrics().rebalances.member_id
    pushes = receiver.pushes(client_id)
    assert {p.instance_id for p in pushes} == {kafka_uuid(instance_id)}
    assert [p.terminating for p in pushes] == [False] * (len(pushes) - 1) + [True], "close() sends a last push"
    # A push before the member joined has no member id yet; from the join on (the last push too,
    # after the member left) it has this one.
    joined = [p.resource for p in pushes if "group_member_id" in p.resource]
    assert joined and joined == [{"group_id": group, "group_member_id": member_id}] * len(joined)
    assert pushes[-1].resource == joined[0] and all(p.resource["group_id"] == group for p in pushes)
    seen: dict[str, str] = {}
    for push in pushes:
        kinds = {m.name: m.WhichOneof("data") for m in push.metrics}
        assert {name: kind.upper() for name, kind in kinds.items()} == push.java  # Kafka's decoder agrees
        seen.update(kinds)
        for metric in push.metrics:
            data = getattr(metric, metric.WhichOneof("data"))
            assert {p.WhichOneof("value") for p in data.data_points} == {"as_double"}  # as Java's
            if metric.WhichOneof("data") == "sum":
                assert metric.sum.is_monotonic
                assert metric.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    assert seen == CONSUMER_METRICS
    # Deltas (the broker asks for them): the pushes add up to what the consumer counted.
    assert total(pushes, RECORDS_CONSUMED) == RECORDS
    assert total(pushes, "org.apache.kafka.consumer.coordinator.commit.total") >= 1
    lags = [p for push in pushes for p in points(push, "org.apache.kafka.consumer.fetch.manager.records.lag")]
    assert {tuple((a.key, a.value.string_value) for a in p.attributes) for p in lags} == {
        (("topic", topic), ("partition", "0")), (("topic", topic), ("partition", "1"))}


async def test_the_share_consumer_pushes_too(receiver: Receiver, anyio_backend: str) -> None:
    bootstrap = receiver.broker.bootstrap
    topic = create_topic(bootstrap, f"push-share-{uuid.uuid4().hex[:8]}", 1)
    produce(bootstrap, topic, [b"s" for _ in range(5)])
    client_id = f"share-pusher-{uuid.uuid4().hex[:6]}"
    group = share_group(bootstrap)
    async with ShareConsumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=group) as consumer:
        consumer.subscribe([topic])
        got = 0
        with anyio.fail_after(30):
            while got < 5:
                got += sum(map(len, (await consumer.getmany(timeout=1)).values()))
        instance_id = await consumer.client_instance_id(10)
        await wait_for(lambda: total(receiver.pushes(client_id), SHARE_RECORDS_CONSUMED) == 5)
        member_id = consumer.member_id
    pushes = receiver.pushes(client_id)
    assert instance_id is not None and {p.instance_id for p in pushes} == {kafka_uuid(instance_id)}
    assert pushes[-1].terminating
    assert pushes[-1].resource == {"group_id": group, "group_member_id": member_id}
    names = {m.name for p in pushes for m in p.metrics}
    assert "org.apache.kafka.consumer.share.fetch.manager.records.consumed.total" in names
    assert "org.apache.kafka.consumer.connection.creation.total" in names
    assert total(pushes, SHARE_RECORDS_CONSUMED) == 5


async def test_nothing_arrives_with_push_off(receiver: Receiver, anyio_backend: str) -> None:
    client_id = f"quiet-{uuid.uuid4().hex[:6]}"
    async with Consumer(bootstrap_servers=receiver.broker.bootstrap, client_id=client_id,
                        enable_metrics_push=False) as consumer:
        with pytest.raises(IllegalStateError, match="enable_metrics_push=False"):
            await consumer.client_instance_id(1)
        await consumer.topics()
        await anyio.sleep(4 * INTERVAL_MS / 1000)
    assert receiver.pushes(client_id) == []
    # The same wait with push on does bring a push (so the wait above was long enough to see one).
    loud = f"loud-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    async with Consumer(bootstrap_servers=receiver.broker.bootstrap, client_id=loud) as consumer:
        await wait_for(lambda: len(receiver.pushes(loud)) >= 1, timeout=4 * INTERVAL_MS / 1000 + 10)
    assert time.monotonic() - began < 4 * INTERVAL_MS / 1000 + 10



@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_each_compression_the_broker_accepts(
    receiver: Receiver, codec: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """The broker accepts zstd, lz4, gzip and snappy, in that order; the first this client has a
    codec for is used.  Each one, alone, through Kafka's own decompression."""
    wanted = next(number for number, name in compression.CODEC_NAMES.items() if name == codec)
    monkeypatch.setattr(compression, "has_codec", lambda number: number == wanted)
    client_id = f"{codec}-pusher-{uuid.uuid4().hex[:6]}"
    async with Consumer(bootstrap_servers=receiver.broker.bootstrap, client_id=client_id) as consumer:
        await wait_for(lambda: len(receiver.pushes(client_id)) >= 1)
        telemetry = consumer._engine.telemetry if consumer._engine is not None else None
        assert telemetry is not None and telemetry.subscription is not None
        assert telemetry.subscription.codec == wanted
    assert "org.apache.kafka.consumer.connection.count" in {m.name for m in receiver.pushes(client_id)[0].metrics}
