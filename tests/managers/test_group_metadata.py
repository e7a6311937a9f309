"""``group_metadata()`` (KIP-447) as the membership managers feed it, scripted on a fake clock.

What a transactional producer commits offsets with is the generation (KIP-848: the member epoch)
and member id of the member's latest membership.  The one pair it must never get for records from
a membership the member lost is generation -1 with an empty member id: the broker takes a
transactional offset commit carrying that pair without any generation check.  So a member that
lost its partitions keeps reporting the membership it lost (which the broker refuses) until the
application has polled again, and after that, until a new membership begins.

Also here: ``ConsumerGroupMetadata.for_confluent_kafka()``'s bytes, and ``Consumer.group_metadata()``
without a group (no broker needed).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from asyncconsumer import Consumer, ConsumerGroupMetadata
from asyncconsumer.errors import InvalidGroupIdError
from asyncconsumer.managers.commit import GroupIdentity
from asyncconsumer.managers.membership import CallbackKind, MemberState

from .test_consumer_membership import Setup, T
from .test_membership import (
    FENCED_INSTANCE_ID,
    HEARTBEAT,
    ILLEGAL_GENERATION,
    REBALANCE_IN_PROGRESS,
    REBALANCE_MS,
    T0,
    T1,
    UNKNOWN_MEMBER_ID,
    Group,
    join_response,
    tps,
)

S = MemberState
FENCED_MEMBER_EPOCH = 110


def meta(generation: int, member_id: str, instance_id: str | None = None) -> ConsumerGroupMetadata:
    return ConsumerGroupMetadata("g", generation, member_id, instance_id)


def rejoin(g: Group, *, generation: int, member_id: str) -> None:
    """Answer the JoinGroup the member sends now with a new generation (follower)."""
    g.h.take("JoinGroup").respond(join_response(member_id=member_id, generation=generation))
    assert g.m.state is S.SYNCING


# -- the classic protocol ----------------------------------------------------------------------------


def test_classic_metadata_follows_each_generation() -> None:
    g = Group(instance_id="inst-1")
    assert g.m.group_metadata() == meta(-1, "", "inst-1")  # not joined yet (as with assign())
    g.stable([T0, T1])
    assert g.m.group_metadata() == meta(1, "m-1", "inst-1")
    # A rebalance the application takes part in (its revoke callback ran): the next generation.
    g.heartbeat(REBALANCE_IN_PROGRESS)
    g.h.poll()
    g.m.on_poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()
    rejoin(g, generation=2, member_id="m-1")
    assert g.m.group_metadata() == meta(2, "m-1", "inst-1")


@pytest.mark.parametrize(("code", "member_id"), [(ILLEGAL_GENERATION, "m-1"), (UNKNOWN_MEMBER_ID, "")])
def test_classic_member_that_lost_its_partitions_keeps_the_lost_generation(code: int, member_id: str) -> None:
    g = Group()
    g.stable([T0, T1])
    g.heartbeat(code)
    assert g.m.state is S.LOST
    # Its own commits carry "no generation" now; a transactional commit with that pair would pass
    # unchecked, so the producer gets the generation the partitions were lost from.
    assert g.m.identity() == GroupIdentity(-1, "", None)
    assert (g.m.generation, g.m.member_id) == (-1, member_id)
    assert g.m.group_metadata() == meta(1, "m-1")
    g.h.poll()
    lost = g.last_callback(CallbackKind.LOST, tps(T0, T1))
    g.clock.advance(HEARTBEAT * 3)
    g.h.poll()
    assert g.m.group_metadata() == meta(1, "m-1")
    # The application polls and hears of the loss; the member rejoins with a new generation.
    g.m.on_poll()
    lost.ack()
    assert g.m.group_metadata() == meta(1, "m-1")  # nothing new to report while it joins
    rejoin(g, generation=4, member_id="m-2")
    assert g.m.group_metadata() == meta(4, "m-2")


def test_classic_revocation_past_its_deadline_keeps_the_old_generation_until_the_application_polls() -> None:
    g = Group()
    g.stable([T0, T1])
    g.heartbeat(REBALANCE_IN_PROGRESS)
    g.h.poll()
    revoked = g.last_callback(CallbackKind.REVOKED, tps(T0, T1))
    # The application is busy with records of generation 1 and never acknowledges: at the deadline
    # the member gives the partitions up without it and joins the next generation.
    g.clock.now = revoked.deadline
    rejoin(g, generation=2, member_id="m-1")
    assert not revoked.acked
    assert g.m.generation == 2
    assert g.m.group_metadata() == meta(1, "m-1")  # its records came from generation 1
    g.m.on_poll()  # the next poll: what it is handed now is of generation 2
    assert g.m.group_metadata() == meta(2, "m-1")


def test_classic_poll_interval_expiry_keeps_the_generation_the_records_came_from() -> None:
    g = Group()
    g.stable([T0, T1])
    now = g.now
    assert g.m.check_poll_interval(now, now - REBALANCE_MS, 5.0) is not None
    assert g.m.state is S.LEAVING and g.m.identity() == GroupIdentity(-1, "", None)
    assert g.m.group_metadata() == meta(1, "m-1")
    g.h.take("LeaveGroup").respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED and g.m.member_id == ""
    assert g.m.group_metadata() == meta(1, "m-1")
    g.m.on_poll()  # rejoins
    assert g.m.group_metadata() == meta(1, "m-1")
    rejoin(g, generation=3, member_id="m-3")
    assert g.m.group_metadata() == meta(3, "m-3")


def test_classic_fenced_static_member_keeps_its_membership() -> None:
    g = Group(instance_id="inst-1")
    g.stable([T0])
    g.heartbeat(FENCED_INSTANCE_ID)
    assert g.m.state is S.FENCED
    assert g.m.group_metadata() == meta(1, "m-1", "inst-1")
    g.m.on_poll()
    assert g.m.group_metadata() == meta(1, "m-1", "inst-1")


def test_classic_member_that_left_keeps_its_last_membership() -> None:
    g = Group()
    g.stable([T0])
    g.m.leave("unsubscribe")
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0)).ack()
    g.h.take("LeaveGroup").respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED and g.m.identity() == GroupIdentity(-1, "", None)
    assert g.m.group_metadata() == meta(1, "m-1")


# -- the consumer protocol (KIP-848) -----------------------------------------------------------------


def test_kip848_metadata_follows_the_member_epoch() -> None:
    s = Setup()
    assert s.m.group_metadata() == meta(-1, "")
    s.m.subscribe(frozenset({"t"}), None)
    assert s.m.group_metadata() == meta(-1, "")  # joining (epoch 0) is no membership yet
    s.answer(s.hb(), 5, {T: [0, 1]})
    assert s.m.group_metadata() == meta(5, "m-1")
    s.ack()
    s.answer(s.hb(), 6)  # the coordinator bumped the epoch
    assert s.m.group_metadata() == meta(6, "m-1")


@pytest.mark.parametrize("code", [FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID])
def test_kip848_fenced_member_keeps_the_lost_epoch(code: int) -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}, epoch=5), 5)
    s.h.advance(3.0)
    s.answer(s.hb(), -1, error=code)
    assert s.state() in (S.LOST, S.REVOKING_PARTITIONS)
    assert s.m.identity() == GroupIdentity(-1, "", None)
    assert s.m.group_metadata() == meta(5, "m-1")
    # The application polls, hears of the loss (its callback), and the member joins again.
    s.m.on_poll()
    s.ack()
    join = s.hb()
    assert join.body()["member_epoch"] == 0
    assert s.m.group_metadata() == meta(5, "m-1")
    s.answer(join, 8, {T: [1]})
    assert s.m.group_metadata() == meta(8, "m-1")


def test_kip848_epoch_taken_after_a_loss_waits_for_the_application_to_poll() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}, epoch=5), 5)
    s.h.advance(3.0)
    s.answer(s.hb(), -1, error=FENCED_MEMBER_EPOCH)
    [lost] = s.pending()
    assert lost.kind is CallbackKind.LOST
    s.clock.now = lost.deadline  # the application never acknowledged the loss: the member goes on
    join = s.hb()
    s.answer(join, 9, {T: [0]})
    assert s.m.generation == 9
    assert s.m.group_metadata() == meta(5, "m-1")
    s.m.on_poll()
    assert s.m.group_metadata() == meta(9, "m-1")


# -- the value and its librdkafka form ----------------------------------------------------------------


def native(value: int) -> bytes:
    return value.to_bytes(4, sys.byteorder, signed=True)


def test_for_confluent_kafka_is_librdkafkas_format() -> None:
    # "CGMDv2:", int32 generation in host byte order, group id NUL, member id NUL, then 1 (no
    # instance id) or 0, the instance id, NUL (librdkafka's rd_kafka_consumer_group_metadata_write).
    assert meta(5, "m-1").for_confluent_kafka() == b"CGMDv2:" + native(5) + b"g\0m-1\0\x01"
    assert meta(-1, "").for_confluent_kafka() == b"CGMDv2:" + native(-1) + b"g\0\0\x01"
    assert (ConsumerGroupMetadata("orders", 2**31 - 1, "c-1f", "i-7").for_confluent_kafka()
            == b"CGMDv2:" + native(2**31 - 1) + b"orders\0c-1f\0\x00i-7\0")
    assert ConsumerGroupMetadata("g", 3, "m", "").for_confluent_kafka() == b"CGMDv2:" + native(3) + b"g\0m\0\x00\0"


@pytest.mark.parametrize(("fields", "named"), [
    (("grüppe", 1, "m", None), "group_id"),
    (("g", 1, "m\0x", None), "member_id"),
    (("g", 1, "m", "tab\there"), "group_instance_id"),
    (("g", 2**31, "m", None), "generation_id"),
])
def test_for_confluent_kafka_refuses_what_librdkafka_cannot_read(fields: tuple[str, int, str, str | None],
                                                                 named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ConsumerGroupMetadata(*fields).for_confluent_kafka()


def test_group_metadata_is_a_frozen_value() -> None:
    value = meta(1, "m-1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.generation_id = 2  # type: ignore[misc]
    assert value == meta(1, "m-1") and hash(value) == hash(meta(1, "m-1"))


def test_consumer_group_metadata_needs_a_group_id() -> None:
    with pytest.raises(InvalidGroupIdError, match="group_id"):
        Consumer(bootstrap_servers="127.0.0.1:9").group_metadata()
    # Not started yet: the member has not joined.
    consumer = Consumer(bootstrap_servers="127.0.0.1:9", group_id="g", group_instance_id="i-1")
    assert consumer.group_metadata() == meta(-1, "", "i-1")
