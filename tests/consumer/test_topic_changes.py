"""Topics that change while they are consumed, on Apache Kafka: deleted, or given more partitions.

The Java consumer is the reference (docs/groups.md, "Topics that change"):

- a topic deleted under ``assign()``: the next poll raises ``UnknownTopicOrPartitionError`` once,
  naming the partitions, which stay assigned and unfetched; the other partitions go on, metadata is
  refreshed every ``retry_backoff_ms`` (no storm), and nothing is committed for the deleted topic;
- a subscribed topic deleted: its partitions leave the members at the next rebalance (the revoke
  callback runs; nothing is committed for them), and nothing is raised;
- partitions added to a subscribed topic: the leader notices on a metadata refresh
  (``metadata_max_age_ms``), the group rebalances, and the new partitions are read from
  ``auto_offset_reset``, each record once; under ``assign()`` nothing changes.

Topics are deleted and grown with confluent-kafka's admin client.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import pytest
from confluent_kafka.admin import NewPartitions
from support.consumers import FAST, LostRecorder, tps
from support.producer import admin_client, wait_for_topic

from asyncconsumer import Consumer, KafkaError, TopicPartition
from asyncconsumer.errors import UnknownTopicOrPartitionError

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

GROUP = {**FAST, "session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "auto_offset_reset": "earliest"}


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too)."""
    return str(apache_kafka.bootstrap)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = admin_client(bootstrap)
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = admin_client(bootstrap)
    admin.create_partitions([NewPartitions(topic, total)], operation_timeout=30)[topic].result(timeout=30)
    wait_for_topic(bootstrap, topic, total)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Admin calls block: the consumers' loops keep running (heartbeats, fetches) meanwhile."""
    return await anyio.to_thread.run_sync(lambda: fn(*args))


class Member(LostRecorder):
    """A consumer polling in its own task, keeping what it read, what it raised and its callbacks."""

    def __init__(self, consumer: Consumer[Any, Any]) -> None:
        super().__init__()
        self.consumer = consumer
        self.records: list[tuple[str, int, int]] = []
        self.errors: list[KafkaError] = []

    def revoked(self) -> set[TopicPartition]:
        return {tp for kind, tps_ in self.events if kind in ("revoked", "lost") for tp in tps_}

    async def poll_forever(self) -> None:
        while True:
            try:
                batches = await self.consumer.getmany(timeout=0.1)
            except KafkaError as exc:
                self.errors.append(exc)
                continue
            self.records += [(r.topic, r.partition, r.offset) for rs in batches.values() for r in rs]


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    with anyio.move_on_after(timeout):
        while not condition():  # noqa: ASYNC110 (the members' state is polled)
            await anyio.sleep(0.05)
        return
    raise AssertionError(f"not within {timeout}s: {what}")


@contextlib.asynccontextmanager
async def two_members(bootstrap: str, topics: list[str], **options: Any) -> AsyncIterator[list[Member]]:
    """Two consumers of one group subscribed to ``topics``, each polling in its own task."""
    group = f"g-{topics[-1]}"
    async with (
        Consumer(bootstrap_servers=bootstrap, group_id=group, **GROUP, **options) as a,
        Consumer(bootstrap_servers=bootstrap, group_id=group, **GROUP, **options) as b,
    ):
        members = [Member(a), Member(b)]
        for m in members:
            m.consumer.subscribe(topics, listener=m)
        async with anyio.create_task_group() as tg:
            for m in members:
                tg.start_soon(m.poll_forever)
            yield members
            tg.cancel_scope.cancel()


def read_by(members: list[Member]) -> list[tuple[str, int, int]]:
    return [r for m in members for r in m.records]


def read_once(records: list[tuple[str, int, int]]) -> Counter[tuple[str, int, int]]:
    counts = Counter(records)
    repeated = {r: n for r, n in counts.items() if n > 1}
    assert not repeated, f"read more than once: {sorted(repeated)[:10]}"
    return counts


# -- deleted topics ---------------------------------------------------------------------------------


async def test_a_deleted_topic_under_assign_is_raised_once_and_the_other_partitions_go_on(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    doomed, kept = new_topic(2), new_topic(1)
    produce(doomed, [(p, None, b"d") for p in (0, 1) for _ in range(5)])
    produce(kept, [(0, None, b"k%d" % i) for i in range(3)])
    group = f"g-{kept}"
    assigned = [*tps(doomed, 2), TopicPartition(kept, 0)]
    async with Consumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                        auto_commit_interval_ms=200, **FAST) as c:
        member = Member(c)
        c.assign(assigned)
        async with anyio.create_task_group() as tg:
            tg.start_soon(member.poll_forever)
            await until(lambda: len(member.records) == 13, 30, "every record read")
            await in_thread(delete_topic, bootstrap, doomed)
            await until(lambda: bool(member.errors), 10, "the deletion raised")
            (error,) = member.errors
            assert isinstance(error, UnknownTopicOrPartitionError)
            assert f"{doomed}-0, {doomed}-1 stay assigned" in str(error)
            # Once: the partitions stay assigned and unfetched, the others are read on.
            produce(kept, [(0, None, b"after")])
            await until(lambda: len(member.records) == 14, 10, "the kept topic read on")
            await anyio.sleep(1.0)  # auto-commits (every 200 ms) and metadata refreshes meanwhile
            tg.cancel_scope.cancel()
        assert len(member.errors) == 1
        assert c.assignment() == set(assigned)
        assert member.records[-1] == (kept, 0, 3)
        # commit() of everything read leaves the deleted topic out (its offsets went with it).
        await c.commit()
        assert await c.committed(TopicPartition(kept, 0)) == 4
    # Nothing failed on the way: no auto-commit, no final commit was refused for the deleted topic.
    refused = [r.getMessage() for r in caplog.records if "UNKNOWN_TOPIC_OR_PARTITION" in r.getMessage()
               and "commit" in r.getMessage()]
    assert refused == []


@pytest.mark.parametrize("protocol", ["range", "cooperative-sticky", "consumer"])
async def test_a_deleted_subscribed_topic_leaves_the_group_members_with_a_revoke_callback(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], protocol: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    doomed, kept = new_topic(2), new_topic(2)
    produce(doomed, [(p, None, b"d") for p in (0, 1) for _ in range(5)])
    produce(kept, [(p, None, b"k") for p in (0, 1) for _ in range(5)])
    options: dict[str, Any] = {"group_protocol": "consumer"} if protocol == "consumer" else {
        "partition_assignment_strategy": [protocol]}
    async with two_members(bootstrap, [doomed, kept], **options) as members:
        await until(lambda: len(read_by(members)) == 20, 60, "every record read")
        await in_thread(delete_topic, bootstrap, doomed)
        gone = set(tps(doomed, 2))
        await until(lambda: not any(gone & m.consumer.assignment() for m in members), 30,
                    "the deleted partitions left the members")
        # Every deleted partition went through a revoke callback of the member that had it.
        assert gone <= set().union(*(m.revoked() for m in members))
        # The group goes on with the kept topic, each record once.
        produce(kept, [(p, None, b"after") for p in (0, 1) for _ in range(3)])
        await until(lambda: len(read_by(members)) == 26, 30, "the kept topic read on")
        await anyio.sleep(0.5)
        counts = read_once(read_by(members))
        assert sum(n for (t, _, _), n in counts.items() if t == kept) == 16
        # The kept partitions may still move between the members (KIP-848's assignor evens them out
        # after the deletion, a revocation first): the group settles with both assigned.
        await until(lambda: set().union(*(m.consumer.assignment() for m in members)) == set(tps(kept, 2)), 30,
                    "the kept partitions assigned")
        assert [e for m in members for e in m.errors] == []  # nothing raised
    refused = [r.getMessage() for r in caplog.records if "commit" in r.getMessage() and doomed in r.getMessage()
               and r.levelno >= logging.WARNING]
    assert refused == []  # the rebalance-safe and final commits left the deleted topic out


# -- partitions added -------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
async def test_partitions_added_to_a_subscribed_topic_are_assigned_and_read_exactly_once(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], strategy: str
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"before") for p in (0, 1) for _ in range(5)])
    options = {"partition_assignment_strategy": [strategy], "metadata_max_age_ms": 500}
    async with two_members(bootstrap, [topic], **options) as members:
        await until(lambda: len(read_by(members)) == 10, 60, "the first records read")
        # Each member's callbacks from here on: one of them may have had no assignment yet (the
        # other read both partitions), and then its first one is the one with new partitions.
        before = [len(m.events) for m in members]
        await in_thread(add_partitions, bootstrap, topic, 4)
        # Records for the new partitions are written at once, before any member was told:
        # auto_offset_reset="earliest" reads them from the start when the partitions arrive.
        produce(topic, [(p, None, b"after") for p in range(4) for _ in range(5)])
        await until(lambda: len(read_by(members)) == 30, 60, "the records of every partition read")
        await anyio.sleep(0.5)
        counts = read_once(read_by(members))
        assert set(counts) == {(topic, p, o) for p in range(4) for o in range(5 if p > 1 else 10)}
        await until(lambda: set().union(*(m.consumer.assignment() for m in members)) == set(tps(topic, 4)), 30,
                    "every partition assigned")
        new = {TopicPartition(topic, 2), TopicPartition(topic, 3)}
        assigned_later = {
            tp for m, seen in zip(members, before, strict=True) for kind, tps_ in m.events[seen:] if kind == "assigned"
            for tp in tps_
        }
        assert new <= assigned_later
        if strategy == "cooperative-sticky":  # nothing had to move for the new partitions
            assert not any(m.revoked() for m in members)
        assert [e for m in members for e in m.errors] == []


async def test_partitions_added_under_assign_change_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"before") for p in (0, 1) for _ in range(3)])
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", metadata_max_age_ms=300,
                        **FAST) as c:
        member = Member(c)
        c.assign(tps(topic, 2))
        async with anyio.create_task_group() as tg:
            tg.start_soon(member.poll_forever)
            await until(lambda: len(member.records) == 6, 30, "the first records read")
            await in_thread(add_partitions, bootstrap, topic, 4)
            produce(topic, [(p, None, b"after") for p in range(4) for _ in range(2)])
            await until(lambda: len(member.records) == 10, 30, "the assigned partitions read on")
            await anyio.sleep(1.5)  # several metadata refreshes see four partitions
            tg.cancel_scope.cancel()
        assert c.assignment() == set(tps(topic, 2))
        assert {(p, o) for _, p, o in read_once(member.records)} == {(p, o) for p in (0, 1) for o in range(5)}
        assert member.errors == []
        assert await c.partitions_for_topic(topic) == {0, 1, 2, 3}


# -- topics created later ---------------------------------------------------------------------------


async def test_a_topic_created_after_subscribe_is_read_within_seconds(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """As the Java consumer: a subscribed topic the broker says does not exist is asked for again
    within about a second, so once created it is assigned and read without waiting
    ``metadata_max_age_ms`` (left at its default here: 5 minutes)."""
    topic = f"later-{uuid.uuid4().hex[:10]}"
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", **GROUP) as consumer:
        assert consumer.config.metadata_max_age_ms == 300_000
        member = Member(consumer)
        consumer.subscribe([topic], listener=member)
        async with anyio.create_task_group() as tg:
            tg.start_soon(member.poll_forever)
            await anyio.sleep(1.5)  # the group has formed without the topic
            await in_thread(lambda: new_topic(1, name=topic))
            produce(topic, [(0, None, b"hello")])
            await until(lambda: member.records == [(topic, 0, 0)], 20, "the record of the topic created later")
            tg.cancel_scope.cancel()
