"""Rebootstrap on Apache Kafka (KIP-899, KIP-1102): every broker the consumer knows is replaced by
one at a new address, and only ``bootstrap_servers`` still leads to the cluster.

The bootstrap address is a :class:`ChaosProxy` on a fixed loopback port that is pointed at
whichever node is current (as a DNS name or a load balancer in front of a cluster would be); the
nodes themselves are "replaced" by :meth:`KafkaNode.move`: stopped and started on new ports with
the same node id and data (a new machine with the old disks), so the group's committed offsets
and the records are still there.  Records come from confluent-kafka, on the nodes' own addresses.

- ``"rebootstrap"`` (the default): the consumer goes back to the bootstrap address, says so once
  in a WARNING naming the brokers it forgets, and reads on: every record once, in order.
- ``"none"``: it keeps trying the old address; it reads nothing more, a WARNING says it will not
  go back, and a call that needs metadata (``topics()``) fails with ``NoBrokersAvailableError``
  naming the known brokers and the strategy (the Java consumer's ``poll()`` likewise returns nothing, for ever).
- A broker that shuts down answers Metadata naming no broker for a moment: that is no news (as in
  the Java client), so a restart never sends a ``"none"`` consumer to ``bootstrap_servers``.

The single-node scenarios run in the suite; the same with a three-node cluster, every node
replaced at once and a group of two members, is ``long``.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from support.producer import create_topic, produce
from support.proxy import ChaosProxy

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.errors import KafkaError, NoBrokersAvailableError
from asyncconsumer.testing import KafkaBroker, KafkaCluster, KafkaNode
from asyncconsumer.testing.kafka import LOOPBACK

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.timeout(300)]

GOING_BACK = "going back to bootstrap_servers"
NOT_GOING_BACK = "metadata_recovery_strategy='none': not going back to bootstrap_servers"
FAST = {"reconnect_backoff_max_ms": 500, "retry_backoff_ms": 100, "heartbeat_interval_ms": 1000,
        "session_timeout_ms": 30000, "auto_offset_reset": "earliest", "enable_auto_commit": False}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # about brokers going away, not the event loop: one backend


class Advertised:
    """What the module's broker advertises: at its start, ``first`` (a forwarder to it, which a test
    may hand to another cluster); after a move, its own address."""

    def __init__(self, first: ChaosProxy) -> None:
        self.first: ChaosProxy | None = first

    def __call__(self, node: KafkaNode) -> str:
        front, self.first = self.first, None
        if front is None:
            return f"{LOOPBACK}:{node.ports.plaintext}"
        front.retarget(LOOPBACK, node.ports.plaintext)
        return front.address


@pytest.fixture(scope="module")
async def advertised_front() -> AsyncIterator[ChaosProxy]:
    async with ChaosProxy(LOOPBACK, 9) as front:
        yield front


@pytest.fixture(scope="module")
def broker(advertised_front: ChaosProxy) -> Iterator[KafkaBroker]:
    with KafkaBroker(listeners=("PLAINTEXT",), advertise_plaintext=Advertised(advertised_front)) as kafka:
        yield kafka


def known_address(node: KafkaNode) -> str:
    """Where clients are told the node is."""
    return node.advertised_plaintext or node.bootstrap


async def on_thread(fn: object, *args: object) -> object:
    return await anyio.to_thread.run_sync(fn, *args)  # type: ignore[arg-type]


def records(start: int, count: int, partitions: int = 1) -> list[tuple[int, None, str]]:
    return [(i % partitions, None, f"{i}") for i in range(start, start + count)]


async def read_until(consumer: Consumer, seen: list[str], count: int, timeout: float) -> None:
    with anyio.move_on_after(timeout):
        while len(seen) < count:
            for batch in (await consumer.getmany(timeout=0.5)).values():
                seen.extend(r.value.decode() for r in batch)
            await consumer.commit()


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """The log messages that start with ``text``, or have it after "; "."""
    return [m for r in caplog.records if (m := r.getMessage()).startswith(text) or f"; {text}" in m]


async def test_a_known_address_handed_to_another_cluster_is_refused_and_reading_goes_on(
    broker: KafkaBroker, advertised_front: ChaosProxy, apache_kafka: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The address the broker advertised (a forwarder) is handed to a broker of another cluster (the
    suite's shared broker, node 1 too) while the consumer reads; then the broker moves to new ports
    and the bootstrap address follows it.  The consumer names the cluster and node it means when it
    connects (ApiVersions v5, KIP-1242): the other cluster answers REBOOTSTRAP_REQUIRED, so the
    consumer never takes that cluster's metadata for its own, and reads on once its broker is back.
    Without the check it joins the other cluster for good (no such topic there) and reads nothing."""
    caplog.set_level(logging.INFO, logger="asyncconsumer")
    node = broker.node
    if known_address(node) != advertised_front.address:
        pytest.fail("this test must run first in the module: the broker no longer advertises the forwarder")
    other = apache_kafka.broker.node
    topic = await on_thread(create_topic, node.bootstrap, f"rb-{uuid.uuid4().hex[:8]}", 1)
    await on_thread(produce, node.bootstrap, topic, records(0, 10))
    async with ChaosProxy(LOOPBACK, node.ports.plaintext) as front, Consumer(
        bootstrap_servers=front.address, group_id=f"g-{topic}", **FAST
    ) as consumer:
        consumer.subscribe([topic])
        seen: list[str] = []
        await read_until(consumer, seen, 10, 60)
        assert seen == [str(i) for i in range(10)]
        advertised_front.retarget(LOOPBACK, other.ports.plaintext)  # the address now leads elsewhere
        await advertised_front.drop_all()
        with anyio.move_on_after(4):
            await read_until(consumer, seen, 11, 4)
        assert len(seen) == 10
        assert messages(caplog, GOING_BACK)
        refused = [r.getMessage() for r in caplog.records if "answered REBOOTSTRAP_REQUIRED" in r.getMessage()]
        assert refused, "no connection was refused by the other cluster"
        await on_thread(node.move)  # now the broker advertises its own (new) address
        front.retarget(LOOPBACK, node.ports.plaintext)
        await on_thread(produce, node.bootstrap, topic, records(10, 10))
        await read_until(consumer, seen, 20, 60)
        assert seen == [str(i) for i in range(20)]  # nothing from the other cluster, nothing twice


async def test_the_broker_replaced_at_a_new_address_the_consumer_goes_back_to_bootstrap(
    broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asyncconsumer")
    node = broker.node
    topic = await on_thread(create_topic, node.bootstrap, f"rb-{uuid.uuid4().hex[:8]}", 2)
    await on_thread(produce, node.bootstrap, topic, records(0, 20, 2))
    async with ChaosProxy(LOOPBACK, node.ports.plaintext) as front, Consumer(
        bootstrap_servers=front.address, group_id=f"g-{topic}", metadata_recovery_strategy="rebootstrap", **FAST
    ) as consumer:
        consumer.subscribe([topic])
        seen: list[str] = []
        await read_until(consumer, seen, 20, 60)
        assert sorted(seen, key=int) == [str(i) for i in range(20)]
        old = known_address(node)
        await on_thread(node.move)
        front.retarget(LOOPBACK, node.ports.plaintext)
        assert known_address(node) != old
        await on_thread(produce, node.bootstrap, topic, records(20, 20, 2))
        await read_until(consumer, seen, 40, 60)
        assert sorted(seen, key=int) == [str(i) for i in range(40)]  # every record once
        said = messages(caplog, GOING_BACK)
        assert len(said) == 1, said
        assert f"broker 1 at {old}" in said[0] and front.address in said[0], said[0]
        # It reads on from the node's new address, not through the bootstrap address.
        assert {(TopicPartition(topic, p)) for p in (0, 1)} == consumer.assignment()


async def test_with_none_the_consumer_keeps_to_the_old_address_and_says_so(
    broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asyncconsumer")
    node = broker.node
    topic = await on_thread(create_topic, node.bootstrap, f"rb-{uuid.uuid4().hex[:8]}", 1)
    await on_thread(produce, node.bootstrap, topic, records(0, 10))
    async with ChaosProxy(LOOPBACK, node.ports.plaintext) as front, Consumer(
        bootstrap_servers=front.address, group_id=f"g-{topic}", metadata_recovery_strategy="none", **FAST
    ) as consumer:
        consumer.subscribe([topic])
        seen: list[str] = []
        await read_until(consumer, seen, 10, 60)
        assert seen == [str(i) for i in range(10)]
        old = known_address(node)
        await on_thread(node.move)
        front.retarget(LOOPBACK, node.ports.plaintext)
        await on_thread(produce, node.bootstrap, topic, records(10, 10))
        with anyio.move_on_after(8):  # more than the stall warning's 6 s
            while True:
                for batch in (await consumer.getmany(timeout=0.5)).values():
                    seen.extend(r.value.decode() for r in batch)
        assert seen == [str(i) for i in range(10)]  # nothing more: the broker it knows is gone
        assert messages(caplog, GOING_BACK) == []
        said = messages(caplog, NOT_GOING_BACK)
        assert len(said) == 1, said
        with pytest.raises(NoBrokersAvailableError, match=f"known brokers 1 at {old}.*'none'"):
            await consumer.topics(timeout=5)
        await consumer.close(timeout=3)  # its group's coordinator is gone too: no need to wait for it


async def test_with_none_a_broker_shutting_down_never_sends_the_consumer_to_bootstrap_servers(
    broker: KafkaBroker, apache_kafka: Any
) -> None:
    """Apache Kafka answers Metadata with no broker at all for a moment while it shuts down.  Such an
    answer is no news of the cluster: taken for one, it left the consumer nothing to ask but
    ``bootstrap_servers``, whatever its strategy.  Here those lead to another cluster while the
    consumer asks for metadata as fast as it can and its one broker restarts (same address): with
    ``"none"`` not one connection goes there, and the topic is still seen after."""
    node = broker.node
    topic = await on_thread(create_topic, node.bootstrap, f"rb-{uuid.uuid4().hex[:8]}", 1)
    other = apache_kafka.broker.node
    async with ChaosProxy(LOOPBACK, node.ports.plaintext) as front, Consumer(
        bootstrap_servers=front.address, metadata_recovery_strategy="none", **FAST
    ) as consumer:
        assert topic in await consumer.topics(timeout=30)
        front.retarget(LOOPBACK, other.ports.plaintext)  # bootstrap_servers now lead elsewhere
        await front.drop_all()
        accepted = front.connections_accepted
        asked = 0

        async def ask_on(until: anyio.Event) -> None:
            nonlocal asked
            while not until.is_set():
                with contextlib.suppress(KafkaError):
                    await consumer.topics(timeout=1)
                    asked += 1

        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask_on, done)
            await on_thread(node.restart)
            with anyio.fail_after(60):  # until the topic is seen again, or the consumer went elsewhere
                while front.connections_accepted == accepted and topic not in await consumer.topics(timeout=5):
                    pass
            done.set()
        assert asked > 1
        assert front.connections_accepted == accepted, "the consumer went back to bootstrap_servers"


@pytest.mark.long  # a three-node cluster of its own, restarted whole: a minute or two
async def test_every_node_of_a_cluster_replaced_at_once_a_group_reads_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncconsumer")
    cluster = await on_thread(lambda: KafkaCluster(3).start())
    assert isinstance(cluster, KafkaCluster)
    try:
        first: KafkaNode = cluster.nodes[0]
        topic = await on_thread(create_topic, cluster.bootstrap, f"rb-{uuid.uuid4().hex[:8]}", 4, None)
        await on_thread(produce, cluster.bootstrap, topic, records(0, 40, 4))
        async with ChaosProxy(LOOPBACK, first.ports.plaintext) as front:
            options = {"bootstrap_servers": front.address, "group_id": f"g-{topic}", **FAST}
            seen: list[str] = []
            async with Consumer(**options) as a, Consumer(**options) as b:
                for member in (a, b):
                    member.subscribe([topic])
                async with anyio.create_task_group() as tg:
                    for member in (a, b):
                        tg.start_soon(read_until, member, seen, 40, 90)
                assert sorted(seen, key=int) == [str(i) for i in range(40)]
                old = {node.node_id: node.bootstrap for node in cluster.nodes}
                for node in cluster.nodes:  # the whole cluster goes away at once ...
                    await on_thread(node.stop)
                for node in cluster.nodes:  # ... and comes back on new machines
                    await on_thread(lambda n=node: n.move(wait=False))
                await on_thread(cluster.wait_ready)
                front.retarget(LOOPBACK, first.ports.plaintext)
                assert all(node.bootstrap != old[node.node_id] for node in cluster.nodes)
                await on_thread(produce, cluster.bootstrap, topic, records(40, 40, 4))
                async with anyio.create_task_group() as tg:
                    for member in (a, b):
                        tg.start_soon(read_until, member, seen, 80, 120)
                assert sorted(seen, key=int) == [str(i) for i in range(80)]
                said = messages(caplog, GOING_BACK)
                assert 1 <= len(said) <= 2, said  # once per member
    finally:
        await on_thread(cluster.stop)
