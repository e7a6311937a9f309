"""ConsumerMembershipManager (KIP-848): scripted ConsumerGroupHeartbeat exchanges, fake clock, real codec.

The local test broker has no KIP-848, so the whole reconciliation is driven here: join, assignment,
revocation before assignment, acknowledgements, unknown topic ids, fencing, coordinator moves,
callback deadlines, leaving (dynamic and static) and the poll interval.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from asyncconsumer.errors import (
    GroupMaxSizeReachedError,
    KafkaConnectionError,
    KafkaError,
    PollIntervalExceededError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
    UnsupportedVersionError,
)
from asyncconsumer.managers.commit import GroupIdentity
from asyncconsumer.managers.consumer_membership import ConsumerMembershipManager
from asyncconsumer.managers.coordinator import COORDINATOR_NODE_BASE, CoordinatorManager
from asyncconsumer.managers.membership import CallbackKind, CallbackRequest, GroupSettings, MemberHooks, MemberState
from asyncconsumer.managers.metadata import MetadataManager
from asyncconsumer.managers.subscription import SubscriptionState
from asyncconsumer.protocol.api import SUPPORTED_VERSIONS
from asyncconsumer.structs import TopicPartition

from .scripted import FakeClock, Scripted, Sent, load_metadata, metadata_body, topic_id

API = "ConsumerGroupHeartbeat"
METADATA_V = SUPPORTED_VERSIONS["Metadata"][1]
BACKOFF = 0.1
REBALANCE_TIMEOUT_MS = 5000
INTERVAL_MS = 2000
T = topic_id("t")
NEW = topic_id("new")
T0, T1, T2, T3 = (TopicPartition("t", p) for p in range(4))
NEW0 = TopicPartition("new", 0)
S = MemberState

LEADERS = {TopicPartition("t", p): (1, 0) for p in range(4)}


class Setup:
    def __init__(self, *, instance_id: str | None = None, leaders: Mapping[TopicPartition, tuple[int, int]] = LEADERS,
                 **kwargs: Any) -> None:
        self.clock = FakeClock()
        self.subs = SubscriptionState("earliest", has_group=True)
        self.callbacks: list[CallbackRequest] = []
        self.dropped: list[frozenset[TopicPartition]] = []
        self.errors: list[KafkaError] = []
        self.metadata = MetadataManager(max_age=300.0, retry_backoff=BACKOFF, topics_of_interest=lambda: {"t"},
                                        on_update=lambda cluster: None)
        load_metadata(self.metadata, self.clock, leaders)
        self.coordinator = CoordinatorManager("g", retry_backoff=BACKOFF, register_node=lambda *a: None)
        settings = GroupSettings(group_id="g", group_instance_id=instance_id, session_timeout_ms=45000,
                                 rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, heartbeat_interval=3.0,
                                 retry_backoff=BACKOFF)
        hooks = MemberHooks(self.callbacks.append, self.dropped.append, self.errors.append)
        self.m = ConsumerMembershipManager(settings, self.coordinator, self.subs, self.metadata, hooks, **kwargs)
        self._ctor_args = (settings, self.coordinator, self.subs, self.metadata, hooks)
        self.m.client_member_id = "m-1"  # v1 (KIP-1082): the member names itself; the coordinator echoes it
        self.h = Scripted(self.coordinator, self.m, clock=self.clock)
        self.find_coordinator()

    def fresh_manager(self) -> ConsumerMembershipManager:
        """Another manager like ``m``, its member id left as it made it."""
        return ConsumerMembershipManager(*self._ctor_args)

    def find_coordinator(self, node: int = 3) -> None:
        self.h.take("FindCoordinator").at(4).respond({"coordinators": [
            {"key": "g", "node_id": node, "host": "c", "port": 1, "error_code": 0, "error_message": None}]})
        assert self.coordinator.node_id == COORDINATOR_NODE_BASE - node

    def hb(self) -> Sent:
        sent = self.h.take(API)
        assert sent.node_id == self.coordinator.node_id
        return sent

    def no_hb(self) -> None:
        self.h.assert_idle(API)

    def answer(self, sent: Sent, epoch: int, assignment: Mapping[bytes, Sequence[int]] | None = None, *,
               member_id: str | None = "m-1", error: int = 0) -> None:
        body: dict[str, Any] = {
            "error_code": error, "error_message": None, "member_id": member_id if not error else None,
            "member_epoch": epoch if not error else -1, "heartbeat_interval_ms": INTERVAL_MS if not error else 0,
            "assignment": None if assignment is None else {"topic_partitions": [
                {"topic_id": tid, "partitions": list(parts)} for tid, parts in assignment.items()]},
        }
        sent.respond(body)

    def join(self, assignment: Mapping[bytes, Sequence[int]], *, epoch: int = 1,
             topics: frozenset[str] = frozenset({"t"})) -> Sent:
        """Subscribe, join, take the assignment (callback acked); returns the acknowledging heartbeat."""
        self.m.subscribe(topics, None)
        self.answer(self.hb(), epoch, assignment)
        self.ack()
        ack = self.hb()
        assert self.state() is S.STABLE
        return ack

    def state(self) -> MemberState:
        return self.m.state  # a call, so that type checkers do not narrow it between steps

    def ack(self) -> None:
        for callback in self.callbacks:
            if not callback.acked:
                callback.ack()

    def pending(self) -> list[CallbackRequest]:
        return [c for c in self.callbacks if not c.acked]

    def owned_ids(self, sent: Sent) -> dict[bytes, list[int]] | None:
        parts = sent.body()["topic_partitions"]
        return None if parts is None else {t["topic_id"]: t["partitions"] for t in parts}

    def fetchable(self) -> set[TopicPartition]:
        return {p.tp for p in self.subs.fetchable(self.clock.now)}


def test_join_assigns_three_partitions_and_the_heartbeat_acknowledges_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncconsumer.membership")
    s = Setup(rack_id="rack-a")
    assert s.m.identity() == GroupIdentity(-1, "", None)
    s.no_hb()  # not subscribed: no heartbeats
    s.m.subscribe(frozenset({"t"}), None)
    assert s.state() is S.JOINING

    join = s.hb()
    body = join.body()
    assert join.version == 1
    # KIP-1082: the member's own id from the very first heartbeat.
    assert body["group_id"] == "g" and body["member_id"] == "m-1" and body["member_epoch"] == 0
    assert body["subscribed_topic_names"] == ["t"] and body["subscribed_topic_regex"] is None
    assert body["rebalance_timeout_ms"] == REBALANCE_TIMEOUT_MS
    assert body["rack_id"] == "rack-a" and body["instance_id"] is None and body["server_assignor"] is None
    assert body["topic_partitions"] == []
    s.no_hb()  # one heartbeat at a time

    s.answer(join, 5, {T: [0, 1, 2]})
    assert s.m.member_id == "m-1" and s.m.generation == 5 and s.m.heartbeat_interval == INTERVAL_MS / 1000
    assert s.state() is S.ASSIGNING_PARTITIONS
    [assigned] = s.callbacks
    assert assigned.kind is CallbackKind.ASSIGNED and assigned.partitions == {T0, T1, T2}
    assert assigned.generation == 5
    assert assigned.deadline == pytest.approx(s.clock.now + REBALANCE_TIMEOUT_MS / 1000)
    assert set(s.subs.partitions) == {T0, T1, T2} and s.m.owned == {T0, T1, T2}

    # A heartbeat due while the callback runs does not claim the partitions yet.
    s.no_hb()
    s.h.advance(INTERVAL_MS / 1000)
    early = s.hb()
    assert early.body()["member_epoch"] == 5 and early.body()["member_id"] == "m-1"
    assert early.body()["topic_partitions"] is None
    s.answer(early, 5)

    assigned.ack()
    ack = s.hb()  # at once, not after the interval
    assert s.state() is S.STABLE
    body = ack.body()
    assert s.owned_ids(ack) == {T: [0, 1, 2]}
    assert body["member_epoch"] == 5
    # Only what changed: the subscription and the rest were accepted already.
    assert body["subscribed_topic_names"] is None and body["rebalance_timeout_ms"] == -1 and body["rack_id"] is None
    assert s.m.identity() == GroupIdentity(5, "m-1", None)
    s.answer(ack, 5)

    s.h.advance(INTERVAL_MS / 1000 - 0.01)
    s.no_hb()
    s.h.advance(0.02)
    steady = s.hb()
    assert steady.body()["topic_partitions"] is None  # unchanged since acknowledged
    assert s.m.next_deadline(s.clock.now) == float("inf")  # nothing to do until the answer
    s.answer(steady, 5)
    assert s.m.next_deadline(s.clock.now) == pytest.approx(s.clock.now + INTERVAL_MS / 1000)

    assert s.m.transitions == [
        (S.UNSUBSCRIBED, S.JOINING), (S.JOINING, S.STABLE), (S.STABLE, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.PARTITIONS_REVOKED), (S.PARTITIONS_REVOKED, S.ASSIGNING_PARTITIONS),
        (S.ASSIGNING_PARTITIONS, S.STABLE),
    ]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and " -> " in r.getMessage()]
    assert len(logged) == len(s.m.transitions)
    for message, (old, new) in zip(logged, s.m.transitions, strict=True):
        assert f"{old.name} -> {new.name}" in message


def test_new_assignment_revokes_before_assigning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncconsumer.membership")
    s = Setup()
    s.answer(s.join({T: [0, 1, 2]}), 1)
    for tp in (T0, T1, T2):
        s.subs.seek(tp, 10)
    assert s.fetchable() == {T0, T1, T2}
    s.dropped.clear()
    first = len(s.m.transitions)

    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 2, {T: [0, 1, 3]})  # T2 moves away, T3 comes
    assert s.state() is S.REVOKING_PARTITIONS
    assert s.m.generation == 2 and s.m.identity().generation == 2
    revoked = s.callbacks[-1]
    assert revoked.kind is CallbackKind.REVOKED and revoked.partitions == {T2} and revoked.generation == 2
    # Revoking: no longer fetched, buffered records dropped, but still owned until the callback is done.
    assert s.fetchable() == {T0, T1}
    assert s.dropped == [frozenset({T2})]
    assert T2 in s.subs.partitions and T3 not in s.subs.partitions
    assert s.m.owned == {T0, T1, T2}
    s.no_hb()

    revoked.ack()
    s.h.poll()
    assert s.state() is S.ASSIGNING_PARTITIONS
    assigned = s.callbacks[-1]
    assert assigned.kind is CallbackKind.ASSIGNED and assigned.partitions == {T3}
    assert [c.kind for c in s.callbacks] == [CallbackKind.ASSIGNED, CallbackKind.REVOKED, CallbackKind.ASSIGNED]
    assert set(s.subs.partitions) == {T0, T1, T3}
    assert s.m.owned == {T0, T1, T3}
    assert s.subs.partitions[T0].position == 10  # kept partitions keep their position

    assigned.ack()
    ack = s.hb()
    assert s.owned_ids(ack) == {T: [0, 1, 3]} and ack.body()["member_epoch"] == 2
    s.answer(ack, 2)
    assert s.state() is S.STABLE
    assert s.m.transitions[first:] == [
        (S.STABLE, S.PREPARE_REVOCATION), (S.PREPARE_REVOCATION, S.REVOKING_PARTITIONS),
        (S.REVOKING_PARTITIONS, S.PARTITIONS_REVOKED), (S.PARTITIONS_REVOKED, S.ASSIGNING_PARTITIONS),
        (S.ASSIGNING_PARTITIONS, S.STABLE),
    ]
    logged = [r.getMessage() for r in caplog.records if " -> " in r.getMessage()]
    assert len(logged) == len(s.m.transitions)
    assert "REVOKING_PARTITIONS -> PARTITIONS_REVOKED" in logged[-3]


def test_revocation_only_is_acknowledged_at_once() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 1, {T: [0]})
    s.ack()
    ack = s.hb()
    assert s.owned_ids(ack) == {T: [0]}
    # Then, as in Java, the assigned callback with nothing new ends the reconciliation.
    assert s.state() is S.ASSIGNING_PARTITIONS and set(s.subs.partitions) == {T0}
    assert [(c.kind, c.partitions) for c in s.pending()] == [(CallbackKind.ASSIGNED, frozenset())]
    s.ack()
    s.h.poll()
    assert s.state() is S.STABLE


def test_an_empty_first_target_is_reported_once() -> None:
    """As in Java: the first target after joining is reported to the listener even when it is
    empty; the same target again is nothing new."""
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 1, {})
    assert [(c.kind, c.partitions) for c in s.pending()] == [(CallbackKind.ASSIGNED, frozenset())]
    s.ack()
    s.h.poll()
    assert s.state() is S.STABLE
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 1, {})
    assert s.state() is S.STABLE and len(s.callbacks) == 1


def test_assignment_that_arrives_during_a_reconciliation_waits_for_it() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 2, {T: [0]})  # revoke T1
    assert s.state() is S.REVOKING_PARTITIONS
    s.h.advance(INTERVAL_MS / 1000)
    during = s.hb()  # heartbeats go on while the callback runs
    assert during.body()["member_epoch"] == 2 and during.body()["topic_partitions"] is None
    s.answer(during, 3, {T: [0, 2]})
    assert s.state() is S.REVOKING_PARTITIONS and len(s.pending()) == 1  # the first plan finishes first

    s.ack()
    s.h.poll()
    assert s.m.owned == {T0} and s.state() is S.ASSIGNING_PARTITIONS  # the first plan's (empty) end
    s.ack()
    s.h.poll()
    assert s.m.owned == {T0, T2} and s.state() is S.ASSIGNING_PARTITIONS
    assert [(c.kind, c.partitions) for c in s.callbacks[1:]] == [
        (CallbackKind.REVOKED, frozenset({T1})), (CallbackKind.ASSIGNED, frozenset()),
        (CallbackKind.ASSIGNED, frozenset({T2}))]
    s.ack()
    assert s.owned_ids(s.hb()) == {T: [0, 2]}


def test_completion_while_a_heartbeat_is_out_is_acknowledged_when_it_returns() -> None:
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 1, {T: [0]})
    s.h.advance(INTERVAL_MS / 1000)
    out = s.hb()
    assert out.body()["topic_partitions"] is None  # built (sent) before the callback is done
    s.ack()
    s.no_hb()  # one at a time
    s.answer(out, 1)
    ack = s.hb()  # not after another interval
    assert s.owned_ids(ack) == {T: [0]}


def test_unknown_topic_id_waits_for_metadata() -> None:
    s = Setup()
    assert s.metadata.poll(s.clock.now) == []  # fresh metadata: nothing to ask
    s.m.subscribe(frozenset({"t", "new"}), None)
    s.answer(s.hb(), 1, {T: [0], NEW: [0]})
    # The known topic goes ahead; the unknown id stays pending and metadata is asked for.
    assert s.m.pending_topic_ids == {(NEW, 0)}
    assert [(c.kind, c.partitions) for c in s.callbacks] == [(CallbackKind.ASSIGNED, frozenset({T0}))]
    refresh = s.metadata.poll(s.clock.now)
    assert len(refresh) == 1
    s.ack()
    ack = s.hb()
    assert s.owned_ids(ack) == {T: [0]}  # only what we really own
    s.answer(ack, 1)
    assert NEW0 not in s.subs.partitions and s.state() is S.STABLE

    # Metadata that still lacks the topic changes nothing.
    Sent(refresh[0], s.clock, METADATA_V).respond(metadata_body(LEADERS))
    s.m.on_metadata()
    s.h.poll()
    assert len(s.callbacks) == 1 and s.m.pending_topic_ids == {(NEW, 0)}
    # ... and a refresh is asked for again after a pause, not in a tight loop.
    assert s.metadata.poll(s.clock.now) == []
    s.h.advance(1.0)
    s.h.poll()
    refresh = s.metadata.poll(s.clock.now)
    assert len(refresh) == 1

    Sent(refresh[0], s.clock, METADATA_V).respond(metadata_body({**LEADERS, NEW0: (1, 0)}))
    s.m.on_metadata()
    s.h.poll()
    assert s.m.pending_topic_ids == frozenset()
    assert (s.callbacks[-1].kind, s.callbacks[-1].partitions) == (CallbackKind.ASSIGNED, frozenset({NEW0}))
    assert set(s.subs.partitions) == {T0, NEW0}
    s.ack()
    assert s.owned_ids(s.hb()) == {T: [0], NEW: [0]}


@pytest.mark.parametrize(("code", "keeps_id"), [(110, True), (25, True)], ids=["fenced_epoch", "unknown_member"])
def test_fenced_member_loses_partitions_and_rejoins_with_epoch_0(code: int, keeps_id: bool) -> None:
    """v1: fenced or unknown, the member rejoins under the id it made for itself (KIP-1082)."""
    s = Setup()
    s.answer(s.join({T: [0, 1]}, epoch=3), 3)
    for tp in (T0, T1):
        s.subs.seek(tp, 5)
    before = s.m.identity()
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 3, error=code)

    assert s.state() is S.REVOKING_PARTITIONS and (S.STABLE, S.LOST) in s.m.transitions
    lost = s.callbacks[-1]
    assert lost.kind is CallbackKind.LOST and lost.partitions == {T0, T1}
    assert CallbackKind.REVOKED not in [c.kind for c in s.callbacks]  # lost: no commit-before-revoke
    assert s.fetchable() == set()
    assert s.m.identity() == GroupIdentity(-1, "", None)  # no commits with the fenced epoch
    assert s.errors == []  # handled, not the application's problem
    s.h.advance(INTERVAL_MS / 1000 * 2)
    s.no_hb()  # no heartbeat until the lost callback is done

    lost.ack()
    rejoin = s.hb()
    body = rejoin.body()
    assert s.state() is S.JOINING and s.subs.partitions == {} and s.m.owned == frozenset()
    assert body["member_epoch"] == 0
    assert body["member_id"] == ("m-1" if keeps_id else "")
    # A full request after the error.
    assert body["subscribed_topic_names"] == ["t"] and body["topic_partitions"] == []
    assert body["rebalance_timeout_ms"] == REBALANCE_TIMEOUT_MS

    s.answer(rejoin, 7, {T: [1]}, member_id="m-1" if keeps_id else "m-2")
    assert s.callbacks[-1].kind is CallbackKind.ASSIGNED and s.callbacks[-1].partitions == {T1}
    s.ack()
    assert s.owned_ids(s.hb()) == {T: [1]}
    assert s.m.identity() == GroupIdentity(7, "m-1" if keeps_id else "m-2", None)
    # A commit built before the loss never goes again under the new epoch (managers/commit.py).
    assert s.m.identity().losses > before.losses


def test_fenced_while_a_revocation_callback_runs() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 2, {T: [0]})
    revoking = s.callbacks[-1]
    assert revoking.kind is CallbackKind.REVOKED
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 2, error=110)
    lost = s.callbacks[-1]
    assert lost.kind is CallbackKind.LOST and lost.partitions == {T0, T1}
    lost.ack()  # the revocation callback is abandoned: nobody waits for it
    assert s.hb().body()["member_epoch"] == 0
    assert s.subs.partitions == {}


def test_leave_while_partitions_are_being_lost() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 1, error=110)
    lost = s.callbacks[-1]
    assert lost.kind is CallbackKind.LOST
    s.m.leave("closing")
    s.no_hb()
    assert s.callbacks[-1] is lost  # no revoke callback (and no commit) for partitions already lost
    lost.ack()
    s.no_hb()  # fenced: no longer a member, nothing to leave
    assert s.state() is S.UNSUBSCRIBED and s.subs.partitions == {}
    assert [c.kind for c in s.callbacks] == [CallbackKind.ASSIGNED, CallbackKind.LOST]


def test_coordinator_moves() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 4)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 4, error=16)  # NOT_COORDINATOR
    assert s.coordinator.node_id is None
    assert s.state() is S.STABLE and s.m.owned == {T0, T1} and len(s.callbacks) == 1
    assert s.errors == []
    s.no_hb()
    s.find_coordinator(node=5)
    s.no_hb()  # backoff first
    s.h.advance(BACKOFF)
    again = s.hb()
    assert again.node_id == COORDINATOR_NODE_BASE - 5
    body = again.body()
    assert body["member_epoch"] == 4 and body["member_id"] == "m-1"
    # The full state again after an error.
    assert body["subscribed_topic_names"] == ["t"] and s.owned_ids(again) == {T: [0, 1]}
    s.answer(again, 4)
    assert s.state() is S.STABLE and s.m.identity() == GroupIdentity(4, "m-1", None)

    # A broken connection: backoff, rediscover, no partitions lost.
    s.h.advance(INTERVAL_MS / 1000)
    s.hb().fail(KafkaConnectionError("reset"))
    assert s.coordinator.node_id is None and s.m.owned == {T0, T1}
    s.find_coordinator(node=3)
    s.h.advance(BACKOFF)
    assert s.hb().body()["subscribed_topic_names"] == ["t"]


def test_callback_that_never_acks_goes_on_after_the_deadline() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 2, {T: [0]})
    stuck = s.callbacks[-1]
    assert stuck.kind is CallbackKind.REVOKED
    deadline = stuck.deadline
    assert s.m.next_deadline(s.clock.now) <= deadline

    # The member stays alive meanwhile: heartbeats keep going with the current epoch.
    while s.clock.now + INTERVAL_MS / 1000 < deadline:
        s.h.advance(INTERVAL_MS / 1000)
        beat = s.hb()
        assert beat.body()["member_epoch"] == 2 and beat.body()["topic_partitions"] is None
        s.answer(beat, 2)
        assert s.state() is S.REVOKING_PARTITIONS and T1 in s.subs.partitions

    s.clock.now = deadline - 0.001
    s.h.poll()
    assert s.state() is S.REVOKING_PARTITIONS
    s.clock.now = deadline
    ack = s.hb()
    assert not stuck.acked
    assert s.state() is S.ASSIGNING_PARTITIONS and set(s.subs.partitions) == {T0}
    assert s.owned_ids(ack) == {T: [0]}


def test_leave_dynamic_member_revokes_then_sends_epoch_minus_1() -> None:
    s = Setup()
    s.answer(s.join({T: [0, 1]}, epoch=6), 6)
    s.m.leave("unsubscribe")
    assert s.m.leaving and s.m.topics == frozenset()
    s.no_hb()  # the revoke callback first
    revoked = s.callbacks[-1]
    assert revoked.kind is CallbackKind.REVOKED and revoked.partitions == {T0, T1}
    assert s.m.identity() == GroupIdentity(6, "m-1", None)  # the revoke callback may still commit
    revoked.ack()
    leave = s.hb()
    assert s.state() is S.LEAVING
    assert leave.body()["member_epoch"] == -1 and leave.body()["member_id"] == "m-1"
    assert s.subs.partitions == {}
    s.answer(leave, -1)
    assert s.state() is S.UNSUBSCRIBED and s.m.identity() == GroupIdentity(-1, "", None)
    s.h.advance(60)
    s.no_hb()
    assert s.m.transitions[-5:] == [
        (S.STABLE, S.PREPARE_REVOCATION), (S.PREPARE_REVOCATION, S.REVOKING_PARTITIONS),
        (S.REVOKING_PARTITIONS, S.PARTITIONS_REVOKED), (S.PARTITIONS_REVOKED, S.LEAVING),
        (S.LEAVING, S.UNSUBSCRIBED),
    ]


def test_leave_static_member_sends_epoch_minus_2() -> None:
    s = Setup(instance_id="i-1")
    s.m.subscribe(frozenset({"t"}), None)
    join = s.hb()
    assert join.body()["instance_id"] == "i-1"
    s.answer(join, 2, {T: [0]})
    s.ack()
    s.answer(s.hb(), 2)
    s.m.leave("the consumer is closing")
    s.no_hb()
    assert [c.kind for c in s.callbacks] == [CallbackKind.ASSIGNED, CallbackKind.REVOKED]
    s.ack()
    leave = s.hb()
    assert leave.body()["member_epoch"] == -2
    assert leave.body()["instance_id"] == "i-1" and leave.body()["member_id"] == "m-1"
    leave.fail(KafkaConnectionError("gone"))  # best effort: the session times out instead
    assert s.state() is S.UNSUBSCRIBED


def test_leave_before_the_join_answer_waits_for_the_member_id() -> None:
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    join = s.hb()
    s.m.leave("closing")
    s.no_hb()
    s.answer(join, 1, {T: [0]})  # the assignment is ignored: we are leaving
    assert s.callbacks == []
    leave = s.hb()
    assert leave.body()["member_epoch"] == -1 and leave.body()["member_id"] == "m-1"
    s.answer(leave, -1)
    assert s.state() is S.UNSUBSCRIBED


def test_leave_without_a_join_sends_nothing() -> None:
    s = Setup()
    s.coordinator.mark_unknown(s.clock.now)
    s.m.subscribe(frozenset({"t"}), None)
    s.m.leave("closing")
    s.h.take_all("FindCoordinator")
    s.no_hb()
    assert s.state() is S.UNSUBSCRIBED


@pytest.mark.parametrize("instance_id", [None, "i-1"])
def test_poll_interval_expiry(instance_id: str | None) -> None:
    s = Setup(instance_id=instance_id)
    s.answer(s.join({T: [0, 1]}), 3)
    now = s.clock.now
    assert s.m.check_poll_interval(now, now - 4.0, 5.0) is None
    error = s.m.check_poll_interval(now, now - 6.0, 5.0)
    assert isinstance(error, PollIntervalExceededError)
    lost = s.callbacks[-1]
    assert lost.kind is CallbackKind.LOST and lost.partitions == {T0, T1} and lost.acked  # nobody waits
    assert s.subs.partitions == {} and s.m.owned == frozenset()
    assert s.state() is S.LEAVING
    assert s.m.check_poll_interval(now, now - 6.0, 5.0) is None  # once

    leave = s.hb()
    assert leave.body()["member_epoch"] == -1  # even a static member really leaves: it is stuck
    s.answer(leave, -1)
    assert s.state() is S.UNSUBSCRIBED
    s.h.advance(10)
    s.no_hb()  # rejoins only once the application polls again

    s.m.on_poll()
    rejoin = s.hb()
    assert rejoin.body()["member_epoch"] == 0 and rejoin.body()["member_id"] == "m-1"  # the same id for good
    s.answer(rejoin, 9, {T: [1]})
    s.ack()
    assert s.owned_ids(s.hb()) == {T: [1]}
    assert s.m.identity() == GroupIdentity(9, "m-1", instance_id)


def test_identity_follows_the_member_epoch() -> None:
    s = Setup(instance_id="i-1")
    s.m.subscribe(frozenset({"t"}), None)
    assert s.m.identity() == GroupIdentity(-1, "", "i-1")  # joining: not a member yet
    s.answer(s.hb(), 1, {T: [0]})
    assert s.m.identity() == GroupIdentity(1, "m-1", "i-1")
    s.ack()
    s.answer(s.hb(), 4)  # the coordinator bumps the epoch without a new assignment
    assert s.m.identity() == GroupIdentity(4, "m-1", "i-1") and s.m.generation == 4
    assert s.state() is S.STABLE and s.m.owned == {T0}


def test_subscription_change_is_sent_at_once_and_only_it() -> None:
    s = Setup()
    s.answer(s.join({T: [0]}), 1)
    s.m.subscribe(frozenset({"t", "u"}), None)
    assert s.state() is S.STABLE  # no rejoin in this protocol
    change = s.hb()
    assert change.body()["subscribed_topic_names"] == ["t", "u"]
    assert change.body()["topic_partitions"] is None and change.body()["member_epoch"] == 1


def test_pattern_subscription_on_v0_sends_the_matched_names() -> None:
    s = Setup()
    s.m.subscribe(frozenset(), re.compile(r"t.*"))
    assert s.m.wants_all_topics
    s.m.update_pattern_topics({"t", "tx", "other"})
    assert s.m.topics_of_interest() == {"t", "tx"}
    assert s.hb().at(0).body()["subscribed_topic_names"] == ["t", "tx"]


def test_pattern_subscription_goes_to_the_coordinator_as_a_regex() -> None:
    """v1: the coordinator resolves the regex (new topics included); the names matched in our
    metadata are only what subscription() shows, and are not sent."""
    s = Setup()
    s.m.subscribe(frozenset(), re.compile(r"t.*"))
    s.m.update_pattern_topics({"t", "other"})
    join = s.hb()
    body = join.body()
    assert body["subscribed_topic_regex"] == "t.*" and body["subscribed_topic_names"] == []
    s.answer(join, 1, {T: [0]})
    assert s.m.broker_regex
    s.ack()
    ack = s.hb()
    assert ack.body()["subscribed_topic_regex"] is None and ack.body()["subscribed_topic_names"] is None
    s.answer(ack, 1)
    s.m.update_pattern_topics({"t", "tx", "other"})  # a topic created later: the coordinator's business
    assert s.m.topics == {"t", "tx"}
    s.h.advance(INTERVAL_MS / 1000 - 0.01)
    s.no_hb()
    s.h.advance(0.01)
    body = s.hb().body()
    assert body["subscribed_topic_regex"] is None and body["subscribed_topic_names"] is None


def test_switching_from_a_regex_to_topic_names_clears_the_regex() -> None:
    s = Setup()
    s.m.subscribe(frozenset(), re.compile(r"t.*"))
    s.answer(s.hb(), 1, {T: [0]})
    s.ack()
    s.answer(s.hb(), 1)
    s.m.subscribe(frozenset({"t"}), None)
    body = s.hb().body()  # at once, not after the interval
    assert body["subscribed_topic_regex"] == "" and body["subscribed_topic_names"] == ["t"]
    assert not s.m.wants_all_topics


def test_regex_the_broker_rejects_is_matched_in_the_client(caplog: pytest.LogCaptureFixture) -> None:
    """INVALID_REGULAR_EXPRESSION (the broker's RE2/J lacks lookarounds, backreferences, ...): the
    pattern is matched against our metadata and the names are sent, with a warning."""
    s = Setup()
    s.m.subscribe(frozenset(), re.compile(r"t(?!x).*"))
    s.m.update_pattern_topics({"t", "tx", "ty"})
    first = s.hb()
    assert first.body()["subscribed_topic_regex"] == "t(?!x).*"
    s.answer(first, 0, error=128)
    assert s.state() is S.JOINING and s.errors == []
    assert "matching it in the client" in caplog.text
    again = s.hb()
    body = again.body()
    assert body["subscribed_topic_regex"] is None and body["subscribed_topic_names"] == ["t", "ty"]
    s.answer(again, 1, {T: [0]})
    assert not s.m.broker_regex and s.state() is S.ASSIGNING_PARTITIONS


def test_v0_the_coordinator_names_the_member() -> None:
    """A broker with only v0 (Kafka 3.7/3.8 preview): the join carries no id; the coordinator's is
    used, and forgotten when the coordinator no longer knows it (UNKNOWN_MEMBER_ID)."""
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    join = s.hb().at(0)
    assert join.body()["member_id"] == ""
    s.answer(join, 1, {T: [0]}, member_id="broker-1")
    s.ack()
    ack = s.hb().at(0)
    assert ack.body()["member_id"] == "broker-1"
    s.answer(ack, 0, error=25)
    s.ack()  # the lost callback
    assert s.hb().at(0).body()["member_id"] == ""


def test_the_member_id_is_the_same_for_the_consumers_lifetime() -> None:
    """KIP-1082: a member that leaves and subscribes again uses the id it made at the start; two
    managers never share one."""
    s = Setup()
    s.answer(s.join({T: [0]}), 1)
    s.m.leave("unsubscribe")
    s.no_hb()  # the revoke callback first
    s.ack()
    leave = s.hb()
    assert leave.body()["member_epoch"] == -1 and leave.body()["member_id"] == "m-1"
    s.answer(leave, -1)
    s.m.subscribe(frozenset({"t"}), None)
    assert s.hb().body()["member_id"] == "m-1"
    assert Setup().m.client_member_id == "m-1"  # (the harness pins it)
    ids = {s.fresh_manager().client_member_id for _ in range(3)}
    assert len(ids) == 3 and all(len(i) == 22 for i in ids)


def test_unsupported_broker_sets_the_flag() -> None:
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.hb().fail(UnsupportedVersionError("broker c:1 does not support ConsumerGroupHeartbeat"))
    assert s.m.unsupported
    assert s.state() is S.FENCED
    [error] = s.errors
    assert 'group_protocol="consumer"' in str(error) and "KIP-848" in str(error)
    s.h.advance(60)
    s.no_hb()


def test_unsupported_version_error_code_sets_the_flag() -> None:
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 0, error=35)
    assert s.m.unsupported and s.state() is S.FENCED and len(s.errors) == 1


def test_fenced_instance_id_is_final() -> None:
    s = Setup(instance_id="i-1")
    s.answer(s.join({T: [0]}), 1)
    s.h.advance(INTERVAL_MS / 1000)
    s.answer(s.hb(), 1, error=82)
    assert s.state() is S.FENCED and not s.m.unsupported
    assert "i-1" in str(s.errors[0])
    assert s.callbacks[-1].kind is CallbackKind.LOST and s.subs.partitions == {}
    s.m.subscribe(frozenset({"t"}), None)
    s.h.advance(60)
    s.no_hb()


def test_group_max_size_reached_is_fatal() -> None:
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 0, error=81)
    assert s.state() is S.FENCED
    assert isinstance(s.errors[0], GroupMaxSizeReachedError)
    s.h.advance(60)
    s.no_hb()


def test_unreleased_instance_id_is_reported_and_retried() -> None:
    s = Setup(instance_id="i-1")
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 0, error=111)
    assert isinstance(s.errors[0], UnreleasedInstanceIdError)
    assert s.state() is S.JOINING
    s.no_hb()
    s.h.advance(BACKOFF)
    join = s.hb()
    assert join.body()["member_epoch"] == 0 and join.body()["instance_id"] == "i-1"
    s.answer(join, 1, {T: [0]})
    assert s.state() is S.ASSIGNING_PARTITIONS


def test_unsupported_assignor_is_reported_with_a_growing_pause() -> None:
    s = Setup(server_assignor="nope")
    s.m.subscribe(frozenset({"t"}), None)
    join = s.hb()
    assert join.body()["server_assignor"] == "nope"
    s.answer(join, 0, error=112)
    s.h.advance(BACKOFF)
    s.answer(s.hb(), 0, error=112)
    s.h.advance(BACKOFF)
    s.no_hb()  # the second pause is longer
    s.h.advance(BACKOFF)
    assert s.hb().body()["member_epoch"] == 0
    assert len(s.errors) == 2 and all(isinstance(e, UnsupportedAssignorError) for e in s.errors)
