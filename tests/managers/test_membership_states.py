"""The member state machine as data: the transition tables of ``membership_types`` and ``_to()``.

Sans-I/O.  The first part drives ``_to()`` directly on real managers: every transition a table lists
is accepted, every other one raises ``IllegalStateTransition`` and leaves the state as it was.  The
second part checks the tables' shape (``FENCED`` final, no other dead end).  The third drives the
managers with scripted responses through the transitions that only races take (a response that
arrives while the member moved on), so that each such row of the tables is shown to be needed.
The scripted tests in ``test_membership.py`` and ``test_consumer_membership.py`` run every common
transition through the same check.
"""

from __future__ import annotations

import itertools

import pytest

from asyncconsumer.errors import FencedInstanceIdError, IllegalStateError, KafkaError
from asyncconsumer.managers.consumer_membership import ConsumerMembershipManager
from asyncconsumer.managers.member_base import GroupMemberBase
from asyncconsumer.managers.membership import MembershipManager
from asyncconsumer.managers.membership_types import (
    CLASSIC_TRANSITIONS,
    CONSUMER_TRANSITIONS,
    JOINED_STATES,
    CallbackKind,
    IllegalStateTransition,
    MemberState,
    Transitions,
)
from asyncconsumer.structs import TopicPartition

from .scripted import Sent, topic_id
from .test_consumer_membership import Setup
from .test_membership import Group, tps

S = MemberState
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
T = topic_id("t")
TABLES: dict[str, Transitions] = {"classic": CLASSIC_TRANSITIONS, "consumer": CONSUMER_TRANSITIONS}

ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110


def manager(protocol: str) -> GroupMemberBase:
    return Group().m if protocol == "classic" else Setup().m


def edges(protocol: str) -> list[tuple[str, MemberState, MemberState]]:
    table = TABLES[protocol]
    return [(protocol, a, b) for a in MemberState for b in MemberState if b in table[a]]


def non_edges(protocol: str) -> list[tuple[str, MemberState, MemberState]]:
    table = TABLES[protocol]
    return [(protocol, a, b) for a in MemberState for b in MemberState if a is not b and b not in table[a]]


def edge_id(edge: tuple[str, MemberState, MemberState]) -> str:
    return f"{edge[0]}-{edge[1].name}-{edge[2].name}"


# -- _to() checks the table ----------------------------------------------------------------------------


def test_managers_use_their_protocols_table() -> None:
    assert MembershipManager.allowed_transitions is CLASSIC_TRANSITIONS
    assert ConsumerMembershipManager.allowed_transitions is CONSUMER_TRANSITIONS
    assert (MembershipManager.group_protocol, ConsumerMembershipManager.group_protocol) == ("classic", "consumer")


@pytest.mark.parametrize("edge", edges("classic") + edges("consumer"), ids=edge_id)
def test_every_allowed_transition_is_accepted(edge: tuple[str, MemberState, MemberState]) -> None:
    protocol, source, target = edge
    m = manager(protocol)
    m.state = source  # put the machine in ``source`` without a transition, as the test's starting point
    m._to(target)
    assert m.state is target
    assert m.transitions == [(source, target)]


@pytest.mark.parametrize("edge", non_edges("classic") + non_edges("consumer"), ids=edge_id)
def test_every_other_transition_is_rejected(edge: tuple[str, MemberState, MemberState]) -> None:
    protocol, source, target = edge
    m = manager(protocol)
    m.state = source
    with pytest.raises(IllegalStateTransition) as caught:
        m._to(target)
    assert (caught.value.protocol, caught.value.source, caught.value.target) == (protocol, source, target)
    assert m.state is source
    assert m.transitions == []


@pytest.mark.parametrize(("protocol", "source", "target"), [
    ("classic", S.UNSUBSCRIBED, S.JOINING),  # a classic join always starts as a rebalance
    ("classic", S.UNSUBSCRIBED, S.STABLE),
    ("classic", S.JOINING, S.STABLE),  # classic needs SyncGroup
    ("classic", S.STABLE, S.JOINING),  # a classic rejoin goes through PREPARE_REVOCATION
    ("classic", S.REVOKING_PARTITIONS, S.ASSIGNING_PARTITIONS),  # never assign before revoking
    ("classic", S.FENCED, S.UNSUBSCRIBED),  # FENCED is final
    ("classic", S.FENCED, S.JOINING),
    ("consumer", S.UNSUBSCRIBED, S.PREPARE_REVOCATION),
    ("consumer", S.JOINING, S.SYNCING),  # no SyncGroup in KIP-848
    ("consumer", S.STABLE, S.SYNCING),
    ("consumer", S.LEAVING, S.PREPARE_REVOCATION),  # a KIP-848 member leaves first, then joins
    ("consumer", S.LEAVING, S.STABLE),
    ("consumer", S.FENCED, S.UNSUBSCRIBED),
])
def test_forbidden_transitions_name_the_protocol_and_both_states(
    protocol: str, source: MemberState, target: MemberState
) -> None:
    m = manager(protocol)
    m.state = source
    with pytest.raises(IllegalStateTransition, match=f"^{protocol} group membership: no transition from "
                                                     f"{source.name} to {target.name}$") as caught:
        m._to(target)
    assert isinstance(caught.value, IllegalStateError) and isinstance(caught.value, KafkaError)
    assert m.state is source


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("state", list(MemberState), ids=lambda s: s.name)
def test_staying_in_a_state_is_not_a_transition(protocol: str, state: MemberState) -> None:
    m = manager(protocol)
    m.state = state
    m._to(state)  # FENCED -> FENCED included: no move, nothing to check
    assert m.state is state
    assert m.transitions == []


# -- the tables' shape ----------------------------------------------------------------------------------


def reachable(table: Transitions, start: MemberState) -> set[MemberState]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_fenced_is_the_only_dead_end(protocol: str) -> None:
    table = TABLES[protocol]
    assert set(table) == set(MemberState)
    assert table[S.FENCED] == frozenset()
    used = {S.UNSUBSCRIBED, *itertools.chain.from_iterable(table.values())}
    for state in used - {S.FENCED}:
        assert S.UNSUBSCRIBED in reachable(table, state), f"{state.name} cannot get back out of the group"
    assert reachable(table, S.UNSUBSCRIBED) == used


def test_syncing_is_classic_only_and_both_share_the_exits() -> None:
    assert S.SYNCING in CLASSIC_TRANSITIONS[S.JOINING]
    assert all(S.SYNCING not in targets for targets in CONSUMER_TRANSITIONS.values())
    for table in TABLES.values():
        for state in JOINED_STATES:
            if state is not S.SYNCING or table is CLASSIC_TRANSITIONS:
                # check_poll_interval leaves from any joined state; _fatal fences from it or LEAVING.
                assert {S.LEAVING, S.FENCED} <= table[state]
        assert table[S.LEAVING] >= {S.UNSUBSCRIBED, S.FENCED}


# -- the rows races need, driven with scripted responses ---------------------------------------------------


def classic_stable_with_a_heartbeat_out(instance_id: str | None = None) -> tuple[Group, Sent]:
    g = Group(instance_id=instance_id)
    g.stable([T0])
    g.clock.advance(g.m.next_deadline(g.now) - g.now)
    return g, g.h.take("Heartbeat")


@pytest.mark.parametrize("leave_answered_first", [False, True])
def test_classic_heartbeat_answered_illegal_generation_while_leaving(leave_answered_first: bool) -> None:
    """LEAVING -> LOST, then LOST -> PARTITIONS_REVOKED -> LEAVING (or LOST -> UNSUBSCRIBED when the
    LeaveGroup answer comes before the loop's next poll)."""
    g, beat = classic_stable_with_a_heartbeat_out()
    g.m.leave("closing")
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0)).ack()
    leave = g.h.take("LeaveGroup")
    assert g.m.state is S.LEAVING
    beat.respond({"error_code": ILLEGAL_GENERATION})
    assert g.m.state is S.LOST
    if leave_answered_first:
        leave.respond({"error_code": 0})
        assert g.m.transitions[-2:] == [(S.LEAVING, S.LOST), (S.LOST, S.UNSUBSCRIBED)]
    else:
        g.h.poll()
        assert g.m.transitions[-3:] == [(S.LEAVING, S.LOST), (S.LOST, S.PARTITIONS_REVOKED),
                                        (S.PARTITIONS_REVOKED, S.LEAVING)]
        leave.respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    assert [c.kind for c in g.callbacks].count(CallbackKind.LOST) == 0  # nothing was left to lose
    g.clock.advance(60)
    g.h.assert_idle()


def test_classic_heartbeat_answered_illegal_generation_after_leave_before_the_next_poll() -> None:
    """PREPARE_REVOCATION -> LOST: leave() ran (no poll since), then the Heartbeat's answer came."""
    g, beat = classic_stable_with_a_heartbeat_out()
    g.m.leave("closing")
    assert g.m.state is S.PREPARE_REVOCATION
    beat.respond({"error_code": ILLEGAL_GENERATION})
    assert g.m.transitions[-1] == (S.PREPARE_REVOCATION, S.LOST)
    g.h.poll()
    g.last_callback(CallbackKind.LOST, tps(T0)).ack()  # lost, not revoked: no commit for them
    leave = g.h.take("LeaveGroup")  # the member id is still known to the coordinator
    assert g.m.state is S.LEAVING
    assert g.subs.partitions == {}
    leave.respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED


@pytest.mark.parametrize("code", [ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID])
def test_classic_heartbeat_generation_error_during_the_assigned_callback(code: int) -> None:
    """ASSIGNING_PARTITIONS -> LOST: a Heartbeat answered while the assigned callback runs."""
    g = Group()
    g.subscribe()
    g.find_coordinator()
    g.join()
    g.sync([T0, T1])
    g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1))  # the application has not acknowledged it yet
    g.clock.advance(g.m.next_deadline(g.now) - g.now)
    g.h.take("Heartbeat").respond({"error_code": code})
    assert g.m.transitions[-1] == (S.ASSIGNING_PARTITIONS, S.LOST)
    g.h.poll()
    g.last_callback(CallbackKind.LOST, tps(T0, T1)).ack()
    g.h.poll()
    assert g.m.state is S.JOINING
    assert g.subs.partitions == {}


def test_classic_heartbeat_generation_error_during_the_revoke_callback() -> None:
    """REVOKING_PARTITIONS -> LOST: the partitions being revoked are lost instead."""
    g = Group()
    g.stable([T0, T1])
    g.heartbeat(REBALANCE_IN_PROGRESS)  # eager: everything is revoked before the rejoin
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1))
    assert g.m.state is S.REVOKING_PARTITIONS
    g.clock.advance(g.m.next_deadline(g.now) - g.now)
    g.h.take("Heartbeat").respond({"error_code": ILLEGAL_GENERATION})
    assert g.m.transitions[-1] == (S.REVOKING_PARTITIONS, S.LOST)
    g.h.poll()
    g.last_callback(CallbackKind.LOST, tps(T0, T1)).ack()
    g.h.poll()
    assert g.m.state is S.JOINING


def test_classic_leave_after_a_partial_cooperative_revocation_revokes_the_rest() -> None:
    """PARTITIONS_REVOKED -> PREPARE_REVOCATION: leave() came while a cooperative revocation ran;
    what it kept is revoked next, then the member leaves."""
    g = Group(assignors=("cooperative-sticky",))
    g.stable([T0, T1], protocol="cooperative-sticky")
    g.heartbeat(REBALANCE_IN_PROGRESS)  # cooperative: keep everything, rejoin
    g.h.take("JoinGroup").respond({
        "error_code": 0, "generation_id": 2, "protocol_type": "consumer", "protocol_name": "cooperative-sticky",
        "leader": "leader-0", "member_id": "m-1", "members": []})
    g.sync([T0], protocol="cooperative-sticky")  # T1 moves away
    revoke_t1 = g.last_callback(CallbackKind.REVOKED, tps(T1))
    g.m.leave("closing")
    revoke_t1.ack()
    g.h.poll()
    assert (S.PARTITIONS_REVOKED, S.PREPARE_REVOCATION) in g.m.transitions
    g.last_callback(CallbackKind.REVOKED, tps(T0)).ack()
    g.h.take("LeaveGroup").respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    assert [c.partitions for c in g.callbacks if c.kind is CallbackKind.REVOKED][-2:] == [tps(T1), tps(T0)]


def test_classic_fenced_while_leave_group_is_in_flight_stays_fenced() -> None:
    """FENCED is final: the LeaveGroup answer that comes after it does not make the member
    UNSUBSCRIBED (it used to, and the next poll then joined again with the fenced instance id)."""
    g, beat = classic_stable_with_a_heartbeat_out(instance_id="inst-1")
    assert g.m.check_poll_interval(g.now, g.now - 10, 5.0) is not None
    leave = g.h.take("LeaveGroup")  # a static member leaves after missing the poll interval
    beat.respond({"error_code": FENCED_INSTANCE_ID})
    assert g.m.state is S.FENCED
    leave.respond({"error_code": 0})
    assert g.m.state is S.FENCED
    assert g.m.transitions[-2:] == [(S.STABLE, S.LEAVING), (S.LEAVING, S.FENCED)]
    g.m.on_poll()
    g.m.subscribe(frozenset({"t"}), None)
    g.clock.advance(60)
    g.h.assert_idle()  # no JoinGroup, no Heartbeat
    assert [type(e) for e in g.errors] == [FencedInstanceIdError]


def test_consumer_leave_during_a_revocation_starts_over_with_everything() -> None:
    """KIP-848 REVOKING_PARTITIONS -> PREPARE_REVOCATION: leave() replaces the pending revoke
    callback with one for every owned partition."""
    s = Setup()
    s.answer(s.join({T: [0, 1]}), 1, {T: [0]})  # T1 moves away
    s.m.poll(s.clock.now)
    assert s.state() is S.REVOKING_PARTITIONS
    s.m.leave("closing")
    assert s.m.transitions[-1] == (S.REVOKING_PARTITIONS, S.PREPARE_REVOCATION)
    s.m.poll(s.clock.now)
    revoked = [c.partitions for c in s.callbacks if c.kind is CallbackKind.REVOKED]
    assert revoked == [tps(T1), tps(T0, T1)]
    s.ack()
    leave = s.hb()
    assert leave.body()["member_epoch"] == -1
    s.answer(leave, -1)
    assert s.state() is S.UNSUBSCRIBED


def test_consumer_join_answered_fenced_member_epoch_rejoins() -> None:
    """KIP-848 JOINING -> LOST -> PARTITIONS_REVOKED -> JOINING (nothing owned, nothing to tell)."""
    s = Setup()
    s.m.subscribe(frozenset({"t"}), None)
    s.answer(s.hb(), 0, error=FENCED_MEMBER_EPOCH)
    assert s.m.transitions[-3:] == [(S.JOINING, S.LOST), (S.LOST, S.PARTITIONS_REVOKED),
                                    (S.PARTITIONS_REVOKED, S.JOINING)]
    assert s.callbacks == []
    s.answer(s.hb(), 1, {T: [0]})
    s.ack()
    s.hb()
    assert s.state() is S.STABLE

