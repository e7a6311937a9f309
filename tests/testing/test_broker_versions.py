"""Older Apache Kafka releases (4.0.2, 3.9.2, 3.7.2): what they lack ends in a fallback or a typed
error, never a silent stall.

- ``group_protocol="consumer"`` on 3.7 and 3.9 (no KIP-848: they list ConsumerGroupHeartbeat v0
  but refuse it) falls back to the classic protocol, and the group works; on 4.0 it is used.
- A ``ShareConsumer`` on 3.9 and 4.0 (no share groups) fails at its first poll, and at every poll
  after it, with ``UnsupportedVersionError`` naming the missing API and the release the broker's
  ApiVersions answer matches.
- Each connection's ApiVersions answer is recognised as the release it came from (the errors name
  it), and the versions negotiated lie in both sides' ranges.
- Each release's own tools run from its jars (VerifiableProducer, VerifiableConsumer,
  ConsumerPerformance: other tests drive them), and its SCRAM credentials work.

The rest of the suite runs on these releases through ``ASYNCCONSUMER_KAFKA_VERSION`` (``./dev nox -s
versions``); this module starts its own brokers, one release at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from support.producer import create_topic, produce

from asyncconsumer import Consumer, ShareConsumer, TopicPartition
from asyncconsumer.errors import UnsupportedVersionError
from asyncconsumer.managers.consumer_membership import ConsumerMembershipManager
from asyncconsumer.managers.membership import MembershipManager
from asyncconsumer.protocol import api
from asyncconsumer.testing import KafkaBroker

# Its brokers (one JVM at a time, as the Spark tests' one) run on whichever worker is free, not only on
# the Apache Kafka one (kafka_jvm), which has the most to do.
pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.timeout(180)]

#: What each release's ApiVersions answer is recognised as (``protocol.api.broker_release``).
RELEASES = {"4.0.2": "Apache Kafka 4.0", "3.9.2": "Apache Kafka 3.9", "3.7.2": "Apache Kafka 3.7-3.8"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def brokers() -> Iterator[Callable[[str], KafkaBroker]]:
    """``brokers(version)``: a one-node broker of that release; one JVM at a time (the last one
    asked for), as the tests are ordered by release."""
    running: dict[str, KafkaBroker] = {}

    def get(version: str) -> KafkaBroker:
        if version not in running:
            for broker in running.values():
                broker.stop()
            running.clear()
            running[version] = KafkaBroker(version=version, listeners=("PLAINTEXT", "SASL_PLAINTEXT")).start()
        return running[version]

    yield get
    for broker in running.values():
        broker.stop()


def topic_with_records(broker: KafkaBroker, count: int) -> str:
    topic = create_topic(broker.bootstrap, f"versions-{uuid.uuid4().hex[:10]}", 2)
    produce(broker.bootstrap, topic, [(i % 2, None, f"r-{i}".encode()) for i in range(count)])
    return topic


async def read_as_group(consumer: Consumer[bytes, bytes], topic: str, count: int) -> list[bytes]:
    consumer.subscribe([topic])
    values: list[bytes] = []
    with anyio.fail_after(60):
        while len(values) < count:
            batch = await consumer.getmany(timeout=1)
            values += [r.value for records in batch.values() for r in records if r.value is not None]
    await consumer.commit()
    committed = await consumer.committed({TopicPartition(topic, 0), TopicPartition(topic, 1)})
    assert sum(c.offset for c in committed.values() if c is not None) == count
    return values


@pytest.mark.parametrize("version", ["3.7.2", "3.9.2", "4.0.2"])
async def test_negotiated_versions_and_release(brokers: Callable[[str], KafkaBroker], version: str) -> None:
    broker = brokers(version)
    topic = await anyio.to_thread.run_sync(topic_with_records, broker, 10)
    async with Consumer(bootstrap_servers=broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                        auto_offset_reset="earliest") as consumer:
        assert len(await read_as_group(consumer, topic, 10)) == 10
        engine = consumer._engine
        assert engine is not None
        connections = list(engine.network._connections.values())
        assert connections
        for connection in connections:
            assert connection.release == RELEASES[version]
            for name in ("Fetch", "ListOffsets", "OffsetCommit", "OffsetFetch", "Metadata", "JoinGroup"):
                ours = api.SUPPORTED_VERSIONS[name]
                theirs = connection.api_versions[api.API_KEYS[name]]
                chosen = connection.choose_version(name)
                assert max(ours[0], theirs[0]) <= chosen == min(ours[1], theirs[1]), (name, ours, theirs)


@pytest.mark.parametrize("version", ["3.7.2", "3.9.2"])
async def test_consumer_group_protocol_falls_back_to_classic(
    brokers: Callable[[str], KafkaBroker], version: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker = brokers(version)
    topic = await anyio.to_thread.run_sync(topic_with_records, broker, 20)
    caplog.set_level(logging.WARNING, logger="asyncconsumer")
    started = time.monotonic()
    async with Consumer(bootstrap_servers=broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                        group_protocol="consumer", auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        values = await read_as_group(consumer, topic, 20)
        engine = consumer._engine
        assert engine is not None
        assert isinstance(engine.membership, MembershipManager)
        assert not isinstance(engine.membership, ConsumerMembershipManager)
    assert sorted(values) == sorted(f"r-{i}".encode() for i in range(20))
    assert time.monotonic() - started < 30
    notices = [r.getMessage() for r in caplog.records if "falling back to the classic" in r.getMessage()]
    assert len(notices) == 1 and "ConsumerGroupHeartbeat" in notices[0], notices


async def test_consumer_group_protocol_is_used_on_4_0(brokers: Callable[[str], KafkaBroker]) -> None:
    broker = brokers("4.0.2")
    topic = await anyio.to_thread.run_sync(topic_with_records, broker, 20)
    async with Consumer(bootstrap_servers=broker.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                        group_protocol="consumer", auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        assert len(await read_as_group(consumer, topic, 20)) == 20
        engine = consumer._engine
        assert engine is not None
        membership = engine.membership
        assert isinstance(membership, ConsumerMembershipManager)
        assert not membership.unsupported and membership.generation >= 1 and membership.version == 1


@pytest.mark.parametrize("version", ["3.9.2", "4.0.2"])
async def test_share_consumer_without_share_groups_fails_fast_and_typed(
    brokers: Callable[[str], KafkaBroker], version: str
) -> None:
    broker = brokers(version)
    topic = await anyio.to_thread.run_sync(topic_with_records, broker, 5)
    started = time.monotonic()
    async with ShareConsumer(bootstrap_servers=broker.bootstrap, group_id=f"s-{uuid.uuid4().hex[:8]}") as consumer:
        consumer.subscribe([topic])
        errors: list[Any] = []
        for _ in range(2):  # not only once: every poll says it
            with pytest.raises(UnsupportedVersionError) as info, anyio.fail_after(10):
                await consumer.getmany(timeout=5)
            errors.append(info.value)
    assert time.monotonic() - started < 10
    message = str(errors[0])
    assert "ShareGroupHeartbeat (API key 76)" in message and RELEASES[version] in message, message
    assert str(errors[1]) == message


@pytest.mark.parametrize("version", ["3.7.2", "3.9.2", "4.0.2"])
async def test_the_releases_own_tools_and_scram(brokers: Callable[[str], KafkaBroker], version: str) -> None:
    broker = brokers(version)
    topic = await anyio.to_thread.run_sync(lambda: create_topic(broker.bootstrap, f"tools-{uuid.uuid4().hex[:8]}", 1))
    where = ("--bootstrap-server", broker.bootstrap, "--topic", topic)

    def tools() -> tuple[str, str, str]:
        produced = broker.run_tool("org.apache.kafka.tools.VerifiableProducer", *where, "--max-messages", "5")
        consumed = broker.run_tool("org.apache.kafka.tools.VerifiableConsumer", *where, "--group-id",
                                   f"v-{uuid.uuid4().hex[:6]}", "--max-messages", "5", "--reset-policy", "earliest")
        perf = broker.run_tool("org.apache.kafka.tools.ConsumerPerformance", *where, "--messages", "5")
        return produced.stdout, consumed.stdout, perf.stdout

    produced, consumed, perf = await anyio.to_thread.run_sync(tools)
    assert produced.count('"name":"producer_send_success"') == 5, produced
    assert '"name":"records_consumed","count":5' in consumed.replace(" ", ""), consumed
    assert "start.time" in perf and perf.strip().splitlines()[-1].count(",") >= 5, perf
    options = broker.consumer_options("SASL_PLAINTEXT", mechanism="SCRAM-SHA-512")
    async with Consumer(**options, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        with anyio.fail_after(30):
            batch = await consumer.getmany(timeout=20)
    assert [r.value for r in batch[TopicPartition(topic, 0)]] == [str(i).encode() for i in range(5)]
