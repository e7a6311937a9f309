"""A classic group of asyncconsumer members and a Java member (Kafka's VerifiableConsumer), each with
a ``client_rack``, on a cluster whose brokers have ``broker.rack``: is the assignment rack-aligned,
whoever leads, and do both sides agree on it?

The topic has one replica per partition, partition ``p`` on the cluster's node ``p % 3``: each
partition is in exactly one rack, so a rack-aware assignor can give every member exactly the
partitions of its own rack, and one that ignores racks (range: contiguous ranges by member id)
cannot.  Records come from confluent-kafka.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from asyncconsumer import Consumer
from asyncconsumer.testing import KafkaCluster

from .verifiable import Tool

JAVA_ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
}
PARTITIONS = 6
RECORDS = 60


def rack_topic(cluster: KafkaCluster) -> tuple[str, dict[int, str]]:
    """A new topic with one replica per partition, spread over the nodes in turn; returns its name
    and each partition's rack."""
    nodes = cluster.nodes
    assert all(n.rack for n in nodes), "the cluster's nodes need racks (KafkaCluster(racks=...))"
    name = f"racks-{uuid.uuid4().hex[:8]}"
    placement = [[nodes[p % len(nodes)].node_id] for p in range(PARTITIONS)]
    admin = AdminClient({"bootstrap.servers": cluster.direct_bootstrap, "log_level": 3})
    topic = NewTopic(name, num_partitions=PARTITIONS, replica_assignment=placement)
    admin.create_topics([topic], operation_timeout=30)[name].result(30)
    return name, {p: str(nodes[p % len(nodes)].rack) for p in range(PARTITIONS)}


def produce(cluster: KafkaCluster, topic: str) -> None:
    """``RECORDS`` records, as many on each partition, with confluent-kafka."""
    producer = Producer({"bootstrap.servers": cluster.direct_bootstrap, "log_level": 3})
    for i in range(RECORDS):
        producer.produce(topic, value=f"{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(60) == 0


def java_member(cluster: KafkaCluster, topic: str, group: str, rack: str, assignor: str, workdir: Path) -> Tool:
    config = workdir / f"java-{uuid.uuid4().hex[:6]}.properties"
    config.write_text(f"client.rack={rack}\nheartbeat.interval.ms=500\n")
    return Tool(cluster.java_command(
        "org.apache.kafka.tools.VerifiableConsumer", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
        "--group-id", group, "--group-protocol", "classic", "--assignment-strategy", JAVA_ASSIGNORS[assignor],
        "--command-config", str(config), "--session-timeout", "10000", "--reset-policy", "earliest",
    ))


def java_read(tool: Tool) -> dict[int, set[int]]:
    """The offsets the Java member read, per partition (its ``records_consumed`` events)."""
    read: dict[int, set[int]] = {}
    for event in list(tool.events):
        if event["name"] == "records_consumed":
            for p in event["partitions"]:
                read.setdefault(p["partition"], set()).update(range(p["minOffset"], p["maxOffset"] + 1))
    return read


def java_assignment(tool: Tool) -> set[int]:
    """The Java member's partitions, from its partitions_assigned / partitions_revoked events."""
    owned: set[int] = set()
    for event in list(tool.events):
        parts = {p["partition"] for p in event.get("partitions", [])}
        if event["name"] == "partitions_assigned":
            owned |= parts
        elif event["name"] == "partitions_revoked":
            owned -= parts
    return owned


@contextlib.asynccontextmanager
async def our_member(cluster: KafkaCluster, topic: str, group: str, rack: str, assignor: str,
                     read: dict[int, set[int]]) -> AsyncIterator[Consumer]:
    """An asyncconsumer member reading in the background; what it reads goes to ``read``."""
    consumer = Consumer(bootstrap_servers=cluster.bootstrap, group_id=group, client_rack=rack,
                        partition_assignment_strategy=[assignor], auto_offset_reset="earliest",
                        heartbeat_interval_ms=500, session_timeout_ms=10000)
    async with consumer, anyio.create_task_group() as tg:
        consumer.subscribe([topic])

        async def reader() -> None:
            while True:
                for tp, records in (await consumer.getmany(timeout=0.5)).items():
                    read.setdefault(tp.partition, set()).update(r.offset for r in records)

        tg.start_soon(reader)
        yield consumer
        tg.cancel_scope.cancel()


async def check_rack_aligned_group(cluster: KafkaCluster, workdir: Path, *, assignor: str,
                                   java_leads: bool, settle: float = 6.0) -> None:
    """Two of our members (the first two racks) and a Java member (the third rack): every member
    ends with exactly the partitions of its rack, the two sides agree (each partition owned once),
    the group then stays put for ``settle`` s (no rebalance storm), and records written then are
    read by the member of their partition's rack, and only by it."""
    topic, rack_of = await anyio.to_thread.run_sync(rack_topic, cluster)
    racks = sorted(set(rack_of.values()))
    group = f"g-{topic}"
    mine = {rack: {p for p, r in rack_of.items() if r == rack} for rack in racks}
    read: dict[int, set[int]] = {}
    java: Tool | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            if java_leads:  # the first member to join leads the group's rebalances
                java = java_member(cluster, topic, group, racks[2], assignor, workdir)
                await anyio.to_thread.run_sync(lambda: java.wait_for_name("partitions_assigned", 60))
            ours = [await stack.enter_async_context(our_member(cluster, topic, group, rack, assignor, read))
                    for rack in racks[:2]]
            if java is None:
                await wait_until(lambda: len(ours[0].assignment()) + len(ours[1].assignment()) == PARTITIONS, 60,
                                 "our two members to share the partitions")
                java = java_member(cluster, topic, group, racks[2], assignor, workdir)
            tool = java

            def state() -> tuple[set[int], set[int], set[int]]:
                return ({tp.partition for tp in ours[0].assignment()}, {tp.partition for tp in ours[1].assignment()},
                        java_assignment(tool))

            expected = (mine[racks[0]], mine[racks[1]], mine[racks[2]])
            await wait_until(lambda: state() == expected, 90, f"the rack-aligned assignment {expected}",
                             lambda: f"now {state()}; Java events {tool.names()[-8:]}")
            events = len(tool.events)
            await anyio.sleep(settle)
            assert state() == expected
            # Every rebalance shows in the Java member's events (an empty partitions_assigned at least).
            rebalances = [e["name"] for e in tool.events[events:] if e["name"].startswith("partitions_")]
            assert rebalances == [], f"the group rebalanced again: {rebalances}"
            await anyio.to_thread.run_sync(produce, cluster, topic)
            every = set(range(RECORDS // PARTITIONS))

            def readers() -> dict[int, list[str]]:
                by_java = java_read(tool)
                return {p: [who for who, offsets in (("ours", read.get(p, set())), ("java", by_java.get(p, set())))
                            if offsets] for p in range(PARTITIONS)}

            await wait_until(lambda: all(read.get(p) == every for p in mine[racks[0]] | mine[racks[1]])
                             and all(java_read(tool).get(p) == every for p in mine[racks[2]]), 60,
                             "every record read", lambda: f"read by {readers()}")
            assert readers() == {p: ["java" if rack_of[p] == racks[2] else "ours"] for p in range(PARTITIONS)}
    finally:
        if java is not None:
            java.stop()


async def wait_until(predicate: Any, timeout: float, what: str, detail: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s" + (f": {detail()}" if detail else ""))
        await anyio.sleep(0.2)


__all__ = ["check_rack_aligned_group", "rack_topic"]
