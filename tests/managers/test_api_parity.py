"""The Java client's API the managers carry out, scripted (fake clock, real codec): what close's
membership choice sends (KIP-1092) on both group protocols, ``enforce_rebalance``, the
``by_duration`` offset reset (KIP-1106), a seek with a leader epoch (KIP-320), and the share
consumer's ``unsubscribe`` and acknowledgement by coordinates."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from asyncconsumer.app.collector import RecordDeserializationError
from asyncconsumer.app.share_collector import ShareCollector
from asyncconsumer.config import build_config
from asyncconsumer.engine.share_loop import ShareEngine
from asyncconsumer.errors import IllegalStateError
from asyncconsumer.managers.list_offsets import LATEST, ListOffsetsManager, reset_duration_ms
from asyncconsumer.managers.member_base import MembershipOperation
from asyncconsumer.managers.membership import CallbackKind, MemberState
from asyncconsumer.managers.subscription import PartitionPhase, SubscriptionState
from asyncconsumer.structs import AcknowledgeType, TopicPartition

from .scripted import FakeClock, Scripted, new_metadata, topic_id
from .test_consumer_membership import Setup as Kip848
from .test_consumer_membership import T
from .test_list_offsets import answer as offsets_answer
from .test_list_offsets import marks, partitions
from .test_membership import T0, T1, Group, tps
from .test_share_engine import engine_with, join
from .test_share_fetch import fetch_answer, partition, records
from .test_share_membership import answer as share_answer
from .test_share_membership import make as share_member
from .test_validation import after_epoch_bump, asked, validation
from .test_validation import answer as validation_answer
from .test_validation import state as validated_state

S = MemberState

# -- close(membership=...), KIP-1092 -----------------------------------------------------------------

#: (group_instance_id, operation, whether LeaveGroup goes out): Java's shouldSendLeaveGroupRequest.
CLASSIC_CLOSE = [
    (None, "default", True), (None, "leave_group", True), (None, "remain_in_group", False),
    ("i-1", "default", False), ("i-1", "leave_group", True), ("i-1", "remain_in_group", False),
]


@pytest.mark.parametrize(("instance_id", "operation", "leaves"), CLASSIC_CLOSE)
def test_classic_close_leaves_or_stays_as_asked(
    instance_id: str | None, operation: MembershipOperation, leaves: bool
) -> None:
    g = Group(instance_id=instance_id)
    g.stable([T0, T1])
    g.m.leave("the consumer is closing", operation)
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()  # the revoke callback runs either way
    sent = [s for s in g.h.poll() if s.api == "LeaveGroup"]
    if leaves:
        (leave,) = sent
        # A static member names its instance id: the coordinator removes it and its partitions move.
        assert leave.at(5).body()["members"] == [
            {"member_id": "m-1", "group_instance_id": instance_id, "reason": "the consumer is closing"}]
        leave.respond({"error_code": 0, "members": []})
    else:
        assert sent == []
    assert g.m.state is S.UNSUBSCRIBED and g.subs.partitions == {}
    g.clock.advance(60)
    g.h.assert_idle()


#: (group_instance_id, operation, the leave heartbeat's member epoch or None for no heartbeat).
KIP848_CLOSE = [
    (None, "default", -1), (None, "leave_group", -1), (None, "remain_in_group", None),
    ("i-1", "default", -2), ("i-1", "leave_group", -1), ("i-1", "remain_in_group", -2),
]


@pytest.mark.parametrize(("instance_id", "operation", "epoch"), KIP848_CLOSE)
def test_kip848_close_leaves_or_stays_as_asked(
    instance_id: str | None, operation: MembershipOperation, epoch: int | None
) -> None:
    s = Kip848(instance_id=instance_id)
    s.answer(s.join({T: [0, 1]}, epoch=6), 6)
    s.m.leave("the consumer is closing", operation)
    s.no_hb()
    revoked = s.callbacks[-1]
    assert revoked.kind is CallbackKind.REVOKED and revoked.partitions == {T0, T1}
    revoked.ack()
    if epoch is None:
        s.no_hb()  # a dynamic member staying: nothing at all; its session times out on the broker
    else:
        leave = s.hb()
        assert leave.body()["member_epoch"] == epoch
        assert leave.body()["instance_id"] == instance_id and leave.body()["member_id"] == "m-1"
        s.answer(leave, epoch)
    assert s.state() is S.UNSUBSCRIBED and s.subs.partitions == {}
    s.h.advance(60)
    s.no_hb()


# -- enforce_rebalance ---------------------------------------------------------------------------------


def test_classic_enforce_rebalance_rejoins_with_the_reason() -> None:
    g = Group()
    g.stable([T0, T1])
    g.m.enforce_rebalance("the application asked")
    assert g.m.state is S.PREPARE_REVOCATION
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()  # eager (range): everything first
    join = g.h.take("JoinGroup").at(9)
    assert join.body()["reason"] == "the application asked"
    join.respond({"error_code": 0, "generation_id": 2, "protocol_type": "consumer", "protocol_name": "range",
                  "leader": "leader-0", "member_id": "m-1", "members": []})
    g.sync([T1])
    g.last_callback(CallbackKind.ASSIGNED, tps(T1)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE and g.m.owned == tps(T1) and g.m.generation == 2
    g.m.request_rejoin("partition count changed")
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T1)).ack()
    assert g.h.take("JoinGroup").at(9).body()["reason"] == "partition count changed"  # each rejoin its own


def test_kip848_enforce_rebalance_only_warns_as_java_does(caplog: pytest.LogCaptureFixture) -> None:
    s = Kip848()
    s.answer(s.join({T: [0, 1]}, epoch=3), 3)
    with caplog.at_level(logging.WARNING, "asyncconsumer.membership"):
        s.m.enforce_rebalance("the application asked")
    assert "does nothing with group_protocol='consumer'" in caplog.text
    assert s.state() is S.STABLE and s.m.owned == {T0, T1}
    s.no_hb()  # nothing sent before the next heartbeat is due


# -- auto_offset_reset="by_duration:..." (KIP-1106) ------------------------------------------------------

NOW = 1_700_000_000.0  # the wall clock, seconds
U0, U1 = TopicPartition("t", 0), TopicPartition("t", 1)


def duration_reset(strategy: str) -> tuple[SubscriptionState, Scripted]:
    clock = FakeClock()
    subs = SubscriptionState(strategy, has_group=False)
    metadata = new_metadata(clock, {U0: (1, 5), U1: (1, 5)}, topics=lambda: {"t"})
    offsets = ListOffsetsManager(subs, metadata, read_committed=False, retry_backoff=0.125,
                                 report_error=pytest.fail, wall_clock=lambda: NOW)
    subs.assign([U0, U1])
    return subs, Scripted(metadata, offsets, clock=clock)


def test_by_duration_asks_for_the_offset_of_now_minus_the_duration_then_latest_where_none() -> None:
    subs, h = duration_reset("by_duration:PT1H")
    request = h.take("ListOffsets")
    since = int(NOW * 1000) - 3_600_000
    assert {tp: ts for tp, (ts, _) in partitions(request).items()} == {("t", 0): since, ("t", 1): since}
    request.respond(offsets_answer({U0: (42, since + 5, 5), U1: (-1, -1, -1)}))  # t-1: nothing that recent
    assert subs.partitions[U0].phase is PartitionPhase.FETCHING and subs.partitions[U0].position == 42
    assert subs.partitions[U1].phase is PartitionPhase.AWAIT_RESET
    latest = h.take("ListOffsets")
    assert partitions(latest) == {("t", 1): (LATEST, 5)}
    latest.respond(offsets_answer({U1: (77, -1, 5)}))
    sent = h.take("Fetch")  # the end confirmed by a Fetch, as every latest answer
    sent.respond(marks(sent.version, {U1: 77}))
    assert subs.partitions[U1].phase is PartitionPhase.FETCHING and subs.partitions[U1].position == 77


@pytest.mark.parametrize(("text", "ms"), [("PT1H", 3_600_000), ("P1D", 86_400_000), ("pt1m30.5s", 90_500),
                                          ("P2DT3H4M", 183_840_000), ("+PT0S", 0), ("PT-1H+2H", None)])
def test_durations_are_read_as_javas_duration_parse_reads_them(text: str, ms: int | None) -> None:
    if ms is None:
        with pytest.raises(ValueError):
            reset_duration_ms("by_duration:" + text)
    else:
        assert reset_duration_ms("by_duration:" + text) == ms


# -- seek(tp, OffsetAndMetadata) with a leader epoch (KIP-320) --------------------------------------------


def test_a_seek_with_an_epoch_is_validated_even_within_what_the_leader_served() -> None:
    s = after_epoch_bump()  # fetched 10..19 in epoch 5, the leader now at epoch 6
    validation_answer(validation(s), {T0: (5, 20)})
    st = validated_state(s)
    assert st.phase is PartitionPhase.FETCHING
    s.validator.seek(st, 15, 4)  # the application's seek(tp, OffsetAndMetadata(15, leader_epoch=4))
    request = validation(s)
    assert asked(request) == {T0: (6, 4)}
    validation_answer(request, {T0: (4, 12)})  # epoch 4 ended at 12: the log was truncated under 15
    assert (st.phase, st.position) == (PartitionPhase.FETCHING, 12)


def test_a_seek_without_an_epoch_is_not_validated() -> None:
    s = after_epoch_bump()
    validation_answer(validation(s), {T0: (5, 20)})
    s.validator.seek(validated_state(s), 15, None)
    s.h.assert_idle("OffsetForLeaderEpoch")


# -- the share consumer: unsubscribe, acknowledge(topic, partition, offset, type) ---------------------------

JOBS0 = TopicPartition("jobs", 0)


def test_share_unsubscribe_leaves_and_a_later_subscribe_joins_again() -> None:
    manager, h, _ = share_member()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(share_answer(1, [0]))
    member_id = manager.member_id
    manager.unsubscribe()
    leave = h.take("ShareGroupHeartbeat")
    assert leave.body()["member_epoch"] == -1
    leave.respond(share_answer(-1))
    assert manager.left and not manager.leaving and manager.assignment() == frozenset()
    h.advance(5)
    h.assert_idle()
    manager.subscribe(frozenset({"jobs"}))
    join = h.take("ShareGroupHeartbeat")
    assert join.body()["member_epoch"] == 0 and join.body()["subscribed_topic_names"] == ["jobs"]
    assert join.body()["member_id"] == member_id
    join.respond(share_answer(3, [0]))
    assert manager.is_member and manager.assignment() == {JOBS0}


def test_share_subscribe_while_the_leave_is_out_joins_once_it_is_answered() -> None:
    manager, h, _ = share_member()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(share_answer(1, [0]))
    manager.unsubscribe()
    leave = h.take("ShareGroupHeartbeat")
    manager.subscribe(frozenset({"jobs"}))
    h.assert_idle()
    leave.respond(share_answer(-1))
    assert h.take("ShareGroupHeartbeat").body()["member_epoch"] == 0


def _bad_v2(value: bytes) -> str:
    if value == b"v2":
        raise ValueError("not a job")
    return value.decode()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_share_a_record_that_cannot_be_deserialized_is_rejected_by_its_coordinates(anyio_backend: str) -> None:
    """Released by default at the next poll (Java's default); acknowledged by coordinates first, as
    Java's ``acknowledge(topic, partition, offset, type)``, it goes with the type given."""
    config = build_config({"group_id": "workers", "bootstrap_servers": "b:1"})
    clock = FakeClock(time.monotonic())  # lock deadlines are on the monotonic clock
    engine = ShareEngine(config, max_records=50, clock=clock)
    h = Scripted(*engine.managers, clock=clock)
    collector: ShareCollector[Any, Any] = ShareCollector(build_config({"value_deserializer": _bad_v2}), "explicit")
    join(engine, h)
    h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 4), acquired=[(0, 3, 1)])))
    first = collector.hand_out_all(await collector.poll(engine, 10, 0))
    assert [r.value for r in first[JOBS0]] == ["v0", "v1"]
    for r in first[JOBS0]:
        collector.acknowledge(engine, r, AcknowledgeType.ACCEPT)
    with pytest.raises(RecordDeserializationError) as raised:
        await collector.poll(engine, 10, 0)
    assert (raised.value.topic, raised.value.partition, raised.value.offset) == ("jobs", 0, 2)
    collector.acknowledge_at(engine, "jobs", 0, 2, AcknowledgeType.REJECT)
    with pytest.raises(IllegalStateError):
        collector.acknowledge_at(engine, "jobs", 0, 7, AcknowledgeType.REJECT)  # never handed out
    rest = collector.hand_out_all(await collector.poll(engine, 10, 0))
    assert [r.value for r in rest[JOBS0]] == ["v3"]
    engine._run_events(h.now)
    assert engine.fetcher.queued(JOBS0) == [(0, 1, AcknowledgeType.ACCEPT), (2, 2, AcknowledgeType.REJECT)]


def test_share_unsubscribe_frees_the_fetch_buffer_so_a_new_subscription_fetches() -> None:
    engine, h = engine_with()
    collector: ShareCollector[Any, Any] = ShareCollector(build_config({}), "implicit")
    join(engine, h)
    h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(0, 2, 1)])))
    assert engine.batches
    collector.close_out(engine, close_sessions=False)(h.now)  # what unsubscribe() sends the loop first
    assert not engine.batches and not engine.fetcher.closing
    engine.membership.unsubscribe()
    leave = h.take("ShareGroupHeartbeat")
    leave.respond(share_answer(-1))
    (forget,) = h.sent("ShareFetch")  # takes the partition out of the session, carrying the releases
    assert [p["acknowledgement_batches"] for t in forget.body()["topics"] for p in t["partitions"]] == [
        [{"first_offset": 0, "last_offset": 2, "acknowledge_types": [AcknowledgeType.RELEASE]}]]
    assert forget.body()["forgotten_topics_data"] == [{"topic_id": topic_id("jobs"), "partitions": [0]}]
    forget.respond(fetch_answer())
    engine.membership.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(share_answer(2, [0]))
    # The buffer the released batch held is free again: the new subscription fetches at once.
    fetch = h.take("ShareFetch")
    assert [(t["topic_id"], [p["partition_index"] for p in t["partitions"]]) for t in fetch.body()["topics"]] == [
        (topic_id("jobs"), [0])]
