"""The Java consumer's API beyond Kafka's client scenarios, on Apache Kafka: close's membership
choice (KIP-1092) on both group protocols, ``enforce_rebalance``, ``current_lag``, a seek with a
leader epoch (KIP-320), ``seek_to_committed``, ``auto_offset_reset="by_duration:..."`` (KIP-1106),
the Kafka 5.0 notice for the default ``group_protocol`` (KIP-1274), and the share consumer's
``unsubscribe`` and acknowledgement by coordinates.

Apache Kafka only: Tansu has no KIP-848, no OffsetForLeaderEpoch, no ListOffsets by timestamp and
no share groups.  Session timeouts are short (6 to 8 s), so that a member kept in the group shows.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from support.consumers import FAST, Recorder
from support.producer import admin_client
from support.share import share_group

import asyncconsumer.consumer
from asyncconsumer import (
    AcknowledgeType,
    Consumer,
    OffsetAndMetadata,
    RecordDeserializationError,
    ShareConsumer,
    TopicPartition,
)
from asyncconsumer.errors import ConfigError, LogTruncationError, OffsetOutOfRangeError
from asyncconsumer.managers.member_base import MembershipOperation
from asyncconsumer.managers.membership import MemberState

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too)."""
    return str(apache_kafka.bootstrap)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, **{**FAST, "auto_offset_reset": "earliest", **options})


# -- close(membership=...), KIP-1092 ----------------------------------------------------------------


def set_group_config(bootstrap: str, group: str, **configs: object) -> None:
    """A consumer group's own settings (KIP-848 session timeouts are the broker's, per group)."""
    entries = [ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
               for k, v in configs.items()]
    resource = ConfigResource("GROUP", group, incremental_configs=entries)
    admin = admin_client(bootstrap)  # kept while the future runs (it ends with the client)
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


async def handover_after_close(
    bootstrap: str, topic: str, group_protocol: str, operation: MembershipOperation, *,
    session_s: int, closing: dict[str, Any],
) -> float:
    """Two members share ``topic``'s two partitions; one (with ``closing`` options) closes with
    ``operation``.  Returns the seconds until the other member owns both partitions."""
    group = f"g-{topic}"
    if group_protocol == "consumer":
        await anyio.to_thread.run_sync(lambda: set_group_config(
            bootstrap, group, consumer_session_timeout_ms=session_s * 1000))
    common = {"group_id": group, "group_protocol": group_protocol, "session_timeout_ms": session_s * 1000,
              "heartbeat_interval_ms": 300}
    async with consumer(bootstrap, **common) as other:
        other.subscribe([topic])

        async def keep_polling() -> None:  # as a real member does: its callbacks run
            while True:
                await other.getmany(timeout=0.05)

        async with consumer(bootstrap, **{**common, **closing}) as c:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_polling)
                c.subscribe([topic])
                with anyio.fail_after(30):
                    while not (len(c.assignment()) == 1 and len(other.assignment()) == 1
                               and c._engine.membership.state is MemberState.STABLE):  # type: ignore[union-attr]
                        await c.getmany(timeout=0.05)
                tg.cancel_scope.cancel()
            await c.close(membership=operation)
            closed_at = time.monotonic()
        with anyio.fail_after(session_s + 15):
            while len(other.assignment()) < 2:
                await other.getmany(timeout=0.05)
    return time.monotonic() - closed_at


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
async def test_a_dynamic_member_that_remains_in_the_group_keeps_its_partitions_for_its_session(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    took = await handover_after_close(bootstrap, new_topic(2), group_protocol, "remain_in_group", session_s=6,
                                      closing={})
    # No LeaveGroup / leave heartbeat: the coordinator waits for the session (6 s from the member's
    # last heartbeat, at most 1 s before close) before the other member gets the partition; one that
    # leaves hands it over within a heartbeat or two.
    assert took >= 4.0, f"the partition moved {took:.1f}s after close: the member left the group"


@pytest.mark.parametrize("anyio_backend", ["trio"])  # (the module's other tests: asyncio)
@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
async def test_a_static_member_that_leaves_the_group_hands_its_partitions_over_at_once(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    took = await handover_after_close(bootstrap, new_topic(2), group_protocol, "leave_group", session_s=8,
                                      closing={"group_instance_id": "worker-1"})
    # By default a static member stays for its session (8 s); leaving, it is removed at once.
    assert took < 4.0, f"the partition moved only {took:.1f}s after close: the static member stayed"


# -- enforce_rebalance, current_lag, seeks -----------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_enforce_rebalance_rejoins_the_group(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    listener = Recorder()
    async with consumer(bootstrap, group_id=f"g-{topic}", session_timeout_ms=6000) as c:
        c.subscribe([topic], listener=listener)
        with anyio.fail_after(30):
            while not (c.assignment() and c._engine.membership.state is MemberState.STABLE):  # type: ignore[union-attr]
                await c.getmany(timeout=0.05)
        generation = c.group_metadata().generation_id
        c.enforce_rebalance("the test asked")
        with anyio.fail_after(30):
            while c.group_metadata().generation_id == generation or len(c.assignment()) < 2:
                await c.getmany(timeout=0.05)
        events = list(listener.events)  # (close revokes them once more)
    both = frozenset(TopicPartition(topic, p) for p in range(2))
    # range is eager: everything is revoked before the member joins again, then assigned back.
    assert events == [("assigned", both), ("revoked", both), ("assigned", both)]


async def test_current_lag_is_the_last_fetch_high_watermark_minus_the_position(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    await anyio.to_thread.run_sync(lambda: produce(topic, [b"r%d" % i for i in range(10)]))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap) as c:
        c.assign([tp])
        assert c.current_lag(tp) is None  # nothing fetched yet: unknown, and no request is sent
        with anyio.fail_after(30):
            got = await c.getmany(tp, max_records=4)
        assert [r.offset for r in got[tp]] == [0, 1, 2, 3]
        assert c.current_lag(tp) == 6 == c.highwater(tp) - await c.position(tp)  # type: ignore[operator]


async def test_a_seek_with_a_leader_epoch_is_validated_against_the_log(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Offset 100 of leader epoch 0 is past the end of epoch 0 (10 records): the leader's log does
    not have what the position says was read.  A plain seek there is merely out of range."""
    topic = new_topic(1)
    await anyio.to_thread.run_sync(lambda: produce(topic, [b"r%d" % i for i in range(10)]))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        await c.seek(tp, OffsetAndMetadata(100, "", 0))
        with pytest.raises(LogTruncationError) as truncated, anyio.fail_after(30):
            while True:
                await c.getmany(timeout=0.1)
        assert truncated.value.divergent_offset == 10
        await c.seek(tp, 100)
        with pytest.raises(OffsetOutOfRangeError), anyio.fail_after(30):
            while True:
                await c.getmany(timeout=0.1)
    async with consumer(bootstrap) as c:
        c.assign([tp])
        await c.seek(tp, OffsetAndMetadata(100, "", 0))
        assert await c.position(tp, timeout=30) in (100, 10)
        with anyio.fail_after(30):
            while await c.position(tp) != 10:  # resumes where the log diverged
                await c.getmany(timeout=0.1)


async def test_seek_to_committed_goes_back_to_the_committed_offsets(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    await anyio.to_thread.run_sync(lambda: produce(topic, [(p, None, b"r%d" % i) for p in (0, 1) for i in range(5)]))
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    async with consumer(bootstrap, group_id=f"g-{topic}", enable_auto_commit=False) as c:
        c.assign([t0, t1])
        await c.commit({t0: 3})
        await c.seek(t0, 4)
        await c.seek(t1, 2)
        assert await c.seek_to_committed() == {t0: 3, t1: None}
        assert await c.position(t0) == 3 and await c.position(t1) == 2  # t1: nothing committed, stays
        with anyio.fail_after(30):
            got = await c.getmany(t0)
        assert got[t0][0].offset == 3


async def test_by_duration_starts_at_the_first_record_that_recent_or_at_the_end(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    now_ms = int(time.time() * 1000)
    old, recent = now_ms - 3 * 3600_000, now_ms - 600_000
    # Partition 0: three records of three hours ago, then two of ten minutes ago; partition 1: old only.
    records = [(0, None, b"old-%d" % i, None, old + i) for i in range(3)]
    records += [(0, None, b"new-%d" % i, None, recent + i) for i in range(2)]
    records += [(1, None, b"old-%d" % i, None, old + i) for i in range(3)]
    await anyio.to_thread.run_sync(lambda: produce(topic, records))
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    async with Consumer.from_properties({"bootstrap.servers": bootstrap, "auto.offset.reset": "by_duration:PT1H"},
                                        fetch_max_wait_ms=100) as c:
        c.assign([t0, t1])
        with anyio.fail_after(30):
            got = await c.getmany(t0)
            assert [r.value for r in got[t0]] == [b"new-0", b"new-1"]
            assert await c.position(t1) == 3  # no record of the last hour: the end, as Java does


# -- the Kafka 5.0 notice (KIP-1274) -------------------------------------------------------------------


async def test_the_default_group_protocol_is_said_once_per_process(
    bootstrap: str, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncconsumer.consumer, "_default_protocol_said", False)
    topic = new_topic(1)
    with caplog.at_level(logging.INFO, "asyncconsumer.consumer"):
        async with consumer(bootstrap, group_id=f"g-{topic}", group_protocol="classic") as chosen:
            chosen.subscribe([topic])  # chosen: nothing said
        assert "KIP-1274" not in caplog.text
        for _ in range(2):
            async with consumer(bootstrap, group_id=f"g-{topic}") as c:
                c.subscribe([topic])
    notices = [r for r in caplog.records if "KIP-1274" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO
    assert "the default becomes 'consumer'" in notices[0].getMessage()


# -- the share consumer: unsubscribe(), acknowledge(topic, partition, offset, type) ---------------------


@pytest.mark.broker_feature("share_groups")
async def test_share_unsubscribe_releases_what_is_not_acknowledged_and_subscribe_joins_again(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await anyio.to_thread.run_sync(lambda: share_group(bootstrap, share_record_lock_duration_ms=30_000))
    await anyio.to_thread.run_sync(lambda: produce(topic, [b"job-%d" % i for i in range(4)]))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             fetch_max_wait_ms=100) as c:
        c.subscribe([topic])
        first: list[Any] = []
        with anyio.fail_after(30):
            while len(first) < 4:
                first += [r for rs in (await c.getmany(timeout=0.5)).values() for r in rs]
        c.acknowledge(first[0], AcknowledgeType.ACCEPT)
        c.acknowledge(topic, 0, first[1].offset, AcknowledgeType.ACCEPT)  # by coordinates
        await c.unsubscribe()
        assert c.assignment() == set() and c.subscription() == set()
        c.subscribe([topic])
        again: list[Any] = []
        with anyio.fail_after(30):
            while len(again) < 2:
                for rs in (await c.getmany(timeout=0.5)).values():
                    for r in rs:
                        again.append(r)
                        c.acknowledge(r, AcknowledgeType.ACCEPT)
    # Released at unsubscribe (the lock would hold them 30 s): delivered again at once.
    assert [(r.value, r.delivery_count) for r in again] == [(b"job-2", 2), (b"job-3", 2)]


@pytest.mark.broker_feature("share_groups")
async def test_share_a_record_that_cannot_be_deserialized_is_rejected_by_its_coordinates(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await anyio.to_thread.run_sync(lambda: share_group(bootstrap, share_record_lock_duration_ms=5000))
    await anyio.to_thread.run_sync(lambda: produce(topic, [b'{"n": 0}', b"not json", b'{"n": 2}']))
    seen: list[int] = []
    errors: list[RecordDeserializationError] = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             value_deserializer=json.loads, fetch_max_wait_ms=100) as c:
        c.subscribe([topic])
        with anyio.fail_after(30):
            while len(seen) < 2:
                try:
                    polled = await c.getmany(timeout=0.5)
                except RecordDeserializationError as exc:
                    errors.append(exc)
                    c.acknowledge(exc.topic, exc.partition, exc.offset, AcknowledgeType.REJECT)
                    continue
                for records in polled.values():
                    for r in records:
                        seen.append(r.value["n"])
                        c.acknowledge(r, AcknowledgeType.ACCEPT)
        # Released (the default), it would come back after each poll; rejected, it is gone for good.
        for _ in range(6):
            assert await c.getmany(timeout=0.3) == {}
    assert seen == [0, 2] and [e.offset for e in errors] == [1]


# -- bad arguments (no broker) -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["by_duration", "by_duration:", "by_duration:P1W", "by_duration:-PT1H", "hourly"])
def test_a_by_duration_java_would_refuse_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        Consumer(auto_offset_reset=value)
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        Consumer.from_properties({"auto.offset.reset": value})


async def test_close_names_a_membership_choice_it_does_not_know() -> None:
    with pytest.raises(ConfigError, match="'default', 'leave_group', 'remain_in_group'"):
        await Consumer().close(membership="leave")  # type: ignore[arg-type]
