"""MembershipManager (classic group protocol): every state transition and error path, scripted.

JoinGroup / SyncGroup / Heartbeat / LeaveGroup requests go through the real
codec (``tests/managers/scripted.py``), responses are scripted, time is a
:class:`FakeClock`, and the application side is played by the test: it
records every ``drop_buffered`` / ``run_callback`` call (with the partitions'
``revoking`` flags at that moment) and acknowledges callbacks by hand.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from asyncconsumer.assignors import (
    MemberAssignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    get_assignor,
)
from asyncconsumer.errors import (
    FencedInstanceIdError,
    GroupAuthorizationFailedError,
    GroupMaxSizeReachedError,
    InvalidSessionTimeoutError,
    KafkaConnectionError,
    KafkaError,
    PollIntervalExceededError,
)
from asyncconsumer.managers.commit import GroupIdentity
from asyncconsumer.managers.coordinator import COORDINATOR_NODE_BASE, CoordinatorManager
from asyncconsumer.managers.membership import (
    CallbackKind,
    CallbackRequest,
    GroupSettings,
    MemberHooks,
    MembershipManager,
    MemberState,
)
from asyncconsumer.managers.metadata import MetadataManager
from asyncconsumer.managers.subscription import SubscriptionState
from asyncconsumer.structs import TopicPartition

from .scripted import FakeClock, Scripted, Sent, load_metadata, metadata_body

S = MemberState
BACKOFF = 0.1
HEARTBEAT = 3.0
SESSION_MS = 10_000
REBALANCE_MS = 30_000
NODE = COORDINATOR_NODE_BASE - 1

T0, T1, T2, T3 = (TopicPartition("t", p) for p in range(4))
U0, U1 = TopicPartition("u", 0), TopicPartition("u", 1)
LEADERS = {T0: (1, 0), T1: (1, 0), T2: (2, 0), T3: (2, 0), U0: (1, 0), U1: (2, 0)}

REBALANCE_IN_PROGRESS = 27
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
GROUP_AUTHORIZATION_FAILED = 30
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
GROUP_MAX_SIZE_REACHED = 81
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15


def tps(*parts: TopicPartition) -> frozenset[TopicPartition]:
    return frozenset(parts)


class Group:
    """One member, its coordinator and metadata managers, and a recording application side."""

    def __init__(self, *, assignors: Sequence[str] = ("range",), instance_id: str | None = None,
                 leaders: Mapping[TopicPartition, tuple[int, int]] = LEADERS) -> None:
        self.clock = FakeClock()
        self.subs = SubscriptionState("earliest", has_group=True)
        self.errors: list[KafkaError] = []
        self.callbacks: list[CallbackRequest] = []
        self.dropped: list[frozenset[TopicPartition]] = []
        #: ("drop" | kind, partitions, {tp: revoking}) in call order.
        self.events: list[tuple[object, frozenset[TopicPartition], dict[TopicPartition, bool]]] = []
        self.coordinator = CoordinatorManager("g", retry_backoff=BACKOFF, register_node=lambda *a: None)
        self.member: MembershipManager | None = None
        self.metadata = MetadataManager(max_age=300.0, retry_backoff=BACKOFF, topics_of_interest=self._interest,
                                        on_update=lambda cluster: None)
        settings = GroupSettings(
            group_id="g", group_instance_id=instance_id, session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS, heartbeat_interval=HEARTBEAT, retry_backoff=BACKOFF,
            assignors=[get_assignor(name) for name in assignors],
        )
        self.member = MembershipManager(settings, self.coordinator, self.subs, self.metadata,
                                        MemberHooks(self._run_callback, self._drop, self.errors.append))
        load_metadata(self.metadata, self.clock, leaders)
        self.h = Scripted(self.coordinator, self.member, clock=self.clock)

    @property
    def m(self) -> MembershipManager:
        assert self.member is not None
        return self.member

    @property
    def now(self) -> float:
        return self.clock.now

    # -- the application side --------------------------------------------------------------------

    def _interest(self) -> set[str]:
        return self.member.topics_of_interest() if self.member is not None else {"t", "u"}

    def _flags(self, parts: Iterable[TopicPartition]) -> dict[TopicPartition, bool]:
        return {tp: state.revoking for tp in parts if (state := self.subs.get(tp)) is not None}

    def _run_callback(self, request: CallbackRequest) -> None:
        self.callbacks.append(request)
        self.events.append((request.kind, request.partitions, self._flags(request.partitions)))

    def _drop(self, parts: frozenset[TopicPartition]) -> None:
        self.dropped.append(parts)
        self.events.append(("drop", parts, self._flags(parts)))

    def last_callback(self, kind: CallbackKind, partitions: frozenset[TopicPartition]) -> CallbackRequest:
        assert self.callbacks, "no callback was queued"
        callback = self.callbacks[-1]
        assert (callback.kind, callback.partitions) == (kind, partitions)
        return callback

    # -- the cluster -----------------------------------------------------------------------------

    def find_coordinator(self, node: int = 1) -> None:
        self.h.take("FindCoordinator").at(4).respond({"coordinators": [
            {"key": "g", "node_id": node, "host": f"c{node}", "port": 9000, "error_code": 0, "error_message": None}]})
        assert self.coordinator.node_id == COORDINATOR_NODE_BASE - node

    def serve_metadata(self, leaders: Mapping[TopicPartition, tuple[int, int]] = LEADERS, **kwargs: Any) -> list[str]:
        """Answer the metadata manager's pending request; returns the topics it asked for.  A refresh
        asked for right after another one waits the backoff: the clock runs to it."""
        due = self.metadata.next_deadline(self.now)
        if self.now < due < float("inf"):
            self.h.advance(due - self.now)
        requests = self.metadata.poll(self.now)
        assert len(requests) == 1, f"expected one Metadata request, got {requests}"
        request = requests[0]
        asked = request.build(12)["topics"]
        Sent(request, self.clock, 12).respond(metadata_body(leaders, **kwargs))
        return sorted(t["name"] for t in asked)

    # -- scripted flows --------------------------------------------------------------------------

    def subscribe(self, *topics: str) -> None:
        self.m.subscribe(frozenset(topics or ("t",)), None)

    def join(self, *, member_id: str = "m-1", generation: int = 1, protocol: str = "range",
             leader: str = "leader-0") -> Sent:
        """Answer the next JoinGroup as a follower; returns the JoinGroup request."""
        request = self.h.take("JoinGroup")
        request.respond(join_response(member_id=member_id, generation=generation, protocol=protocol, leader=leader))
        assert self.m.state is S.SYNCING
        return request

    def sync(self, partitions: Iterable[TopicPartition], *, protocol: str = "range") -> Sent:
        request = self.h.take("SyncGroup")
        request.respond(sync_response(partitions, protocol=protocol))
        return request

    def stable(self, partitions: Iterable[TopicPartition] = (T0, T1), *, protocol: str = "range") -> None:
        """From UNSUBSCRIBED to STABLE as a follower (generation 1, member ``m-1``) owning ``partitions``."""
        self.subscribe()
        self.find_coordinator()
        self.join(protocol=protocol)
        parts = frozenset(partitions)
        self.sync(parts, protocol=protocol)
        self.last_callback(CallbackKind.ASSIGNED, parts).ack()  # also an empty one, as in Java
        self.h.poll()
        self.h.take("Heartbeat", poll=False).respond({"error_code": 0})
        assert self.m.state is S.STABLE
        assert self.m.owned == parts

    def heartbeat(self, code: int = 0) -> Sent:
        """Advance to the next heartbeat and answer it with ``code``."""
        self.clock.advance(max(0.0, self.m.next_deadline(self.now) - self.now))
        request = self.h.take("Heartbeat")
        request.respond({"error_code": code})
        return request


def join_response(*, member_id: str = "m-1", generation: int = 1, protocol: str = "range", leader: str = "leader-0",
                  members: Sequence[tuple[str, str | None, bytes]] = (), code: int = 0) -> dict[str, Any]:
    if code:
        return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None,
                "leader": "", "member_id": member_id if code == MEMBER_ID_REQUIRED else "", "members": []}
    return {
        "error_code": 0, "generation_id": generation, "protocol_type": "consumer", "protocol_name": protocol,
        "leader": leader, "member_id": member_id,
        "members": [{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in members],
    }


def sync_response(partitions: Iterable[TopicPartition] | None = None, *, code: int = 0,
                  protocol: str = "range") -> dict[str, Any]:
    assignment = b"" if partitions is None else encode_assignment(MemberAssignment(tuple(sorted(partitions))))
    return {"error_code": code, "protocol_type": "consumer", "protocol_name": protocol, "assignment": assignment}


def join_subscription(request: Sent, protocol: str | None = None) -> Subscription:
    protocols = request.body()["protocols"]
    chosen = protocols[0] if protocol is None else next(p for p in protocols if p["name"] == protocol)
    return decode_subscription(chosen["metadata"])


# -- the happy path ----------------------------------------------------------------------------------


def test_follower_happy_path() -> None:
    g = Group(assignors=("range", "roundrobin"), instance_id="inst-1")
    assert g.m.identity() == GroupIdentity(-1, "", "inst-1")
    g.subscribe("t")
    assert g.m.state is S.PREPARE_REVOCATION
    assert g.m.transitions == [(S.UNSUBSCRIBED, S.PREPARE_REVOCATION)]
    g.h.assert_idle("JoinGroup")  # no coordinator yet
    assert g.m.state is S.JOINING
    assert g.m.transitions[1:] == [(S.PREPARE_REVOCATION, S.PARTITIONS_REVOKED), (S.PARTITIONS_REVOKED, S.JOINING)]
    g.find_coordinator()

    join = g.h.take("JoinGroup")
    assert join.node_id == NODE
    assert join.request.extra_timeout_ms == REBALANCE_MS
    body = join.body()
    assert body["group_id"] == "g"
    assert body["protocol_type"] == "consumer"
    assert body["session_timeout_ms"] == SESSION_MS
    assert body["rebalance_timeout_ms"] == REBALANCE_MS
    assert body["member_id"] == ""
    assert body["group_instance_id"] == "inst-1"
    assert [p["name"] for p in body["protocols"]] == ["range", "roundrobin"]
    for name in ("range", "roundrobin"):
        sub = join_subscription(join, name)
        assert sub.topics == ("t",)
        assert sub.owned_partitions == ()
        assert sub.generation_id == -1
    g.h.assert_idle()  # one JoinGroup at a time, no heartbeat without a generation

    join.respond(join_response(member_id="m-1", generation=5, leader="m-0"))
    assert g.m.state is S.SYNCING
    assert (g.m.member_id, g.m.generation, g.m.leader_id, g.m.protocol_name) == ("m-1", 5, "m-0", "range")

    sync = g.h.take("SyncGroup")
    sbody = sync.body()
    assert sbody["assignments"] == []  # a follower assigns nothing
    assert (sbody["generation_id"], sbody["member_id"], sbody["group_instance_id"]) == (5, "m-1", "inst-1")
    assert (sbody["protocol_type"], sbody["protocol_name"]) == ("consumer", "range")
    g.h.assert_idle("SyncGroup")

    sync.respond(sync_response([T0, T1]))
    assert g.m.state is S.ASSIGNING_PARTITIONS
    assert set(g.subs.partitions) == {T0, T1}
    callback = g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1))
    assert callback.generation == 5
    assert callback.deadline == g.now + REBALANCE_MS / 1000
    assert len(g.callbacks) == 1
    assert g.dropped == []

    g.clock.advance(1.0)
    g.h.assert_idle()
    assert g.m.state is S.ASSIGNING_PARTITIONS  # waits for the application
    callback.ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    assert g.m.owned == tps(T0, T1)
    assert g.m.identity() == GroupIdentity(5, "m-1", "inst-1")

    # The first heartbeat goes out at once, then one every heartbeat_interval.
    beat = g.h.take("Heartbeat", poll=False)
    assert beat.node_id == NODE
    assert beat.body() == {"group_id": "g", "generation_id": 5, "member_id": "m-1", "group_instance_id": "inst-1"}
    g.h.assert_idle()
    beat.respond({"error_code": 0})
    assert g.m.next_deadline(g.now) == g.now + HEARTBEAT
    g.clock.advance(HEARTBEAT - 0.01)
    g.h.assert_idle()
    g.clock.advance(0.01)
    beat = g.h.take("Heartbeat")
    assert beat.body()["generation_id"] == 5
    assert beat.body()["member_id"] == "m-1"
    beat.respond({"error_code": 0})
    assert g.m.state is S.STABLE
    assert g.errors == []

    assert g.m.transitions == [
        (S.UNSUBSCRIBED, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.PARTITIONS_REVOKED),
        (S.PARTITIONS_REVOKED, S.JOINING),
        (S.JOINING, S.SYNCING),
        (S.SYNCING, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.PARTITIONS_REVOKED),
        (S.PARTITIONS_REVOKED, S.ASSIGNING_PARTITIONS),
        (S.ASSIGNING_PARTITIONS, S.STABLE),
    ]


@pytest.mark.parametrize("version", [2, 4, 5, 9])
def test_join_group_body_encodes_at_every_version(version: int) -> None:
    g = Group()
    g.subscribe("t", "u")
    g.find_coordinator()
    body = g.h.take("JoinGroup").at(version).body()  # the codec rejects a field the version cannot carry
    assert body["protocols"][0]["name"] == "range"
    assert decode_subscription(body["protocols"][0]["metadata"]).topics == ("t", "u")
    assert body["rebalance_timeout_ms"] == REBALANCE_MS


def test_pattern_subscription_follows_a_deleted_topic() -> None:
    g = Group()
    g.m.subscribe(frozenset(), re.compile("t|u"))
    g.m.update_pattern_topics({"t", "u", "other"})
    g.find_coordinator()
    assert join_subscription(g.join()).topics == ("t", "u")
    g.sync([T0, U0])
    g.last_callback(CallbackKind.ASSIGNED, tps(T0, U0)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    g.m.update_pattern_topics({"t", "other"})  # "u" was deleted
    assert g.m.topics == {"t"}
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, U0)).ack()  # eager (range): everything goes first
    assert join_subscription(g.join(generation=2)).topics == ("t",)
    g.sync([T0])
    g.last_callback(CallbackKind.ASSIGNED, tps(T0)).ack()
    g.h.poll()
    assert g.m.owned == tps(T0) and set(g.subs.partitions) == {T0}


def test_empty_assignment_is_still_reported_to_the_listener() -> None:
    """As the Java client does, every completed rebalance ends with the assigned callback, with an
    empty set when nothing was added: the application learns that the rebalance is over."""
    g = Group()
    g.subscribe()
    g.find_coordinator()
    g.join()
    g.h.take("SyncGroup").respond(sync_response(None))  # zero bytes: nothing for us
    assert g.m.state is S.ASSIGNING_PARTITIONS
    g.last_callback(CallbackKind.ASSIGNED, frozenset()).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    assert [(c.kind, c.partitions) for c in g.callbacks] == [(CallbackKind.ASSIGNED, frozenset())]
    assert g.subs.partitions == {}


# -- the leader --------------------------------------------------------------------------------------


def member_metadata(*topics: str) -> bytes:
    return encode_subscription(Subscription(topics=topics))


@pytest.mark.parametrize(("protocol", "expected"), [
    # Static member m-b sorts first in both assignors (Java member order).
    ("range", {"m-a": (T2, T3), "m-b": (T0, T1, U0, U1)}),
    ("roundrobin", {"m-a": (T1, T3), "m-b": (T0, T2, U0, U1)}),
])
def test_leader_waits_for_metadata_and_assigns_every_member(
        protocol: str, expected: dict[str, tuple[TopicPartition, ...]]) -> None:
    g = Group(assignors=("range", "roundrobin"))
    g.subscribe("t")
    g.find_coordinator()
    members = [("m-a", None, member_metadata("t")), ("m-b", "inst-b", member_metadata("t", "u"))]
    g.h.take("JoinGroup").respond(join_response(member_id="m-a", leader="m-a", generation=3, protocol=protocol,
                                                members=members))
    assert g.m.state is S.SYNCING
    assert g.m.topics_of_interest() == {"t", "u"}  # every member's topics, for the assignment

    # No SyncGroup until a metadata response newer than the JoinGroup response arrived.
    g.h.assert_idle()
    g.clock.advance(5.0)
    g.h.assert_idle()
    assert g.serve_metadata() == ["t", "u"]

    sync = g.h.take("SyncGroup")
    body = sync.body()
    assert (body["generation_id"], body["member_id"], body["protocol_name"]) == (3, "m-a", protocol)
    assignments = {a["member_id"]: decode_assignment(a["assignment"]).partitions for a in body["assignments"]}
    assert assignments == expected
    g.h.assert_idle("SyncGroup")

    sync.respond(sync_response(expected["m-a"], protocol=protocol))
    g.last_callback(CallbackKind.ASSIGNED, frozenset(expected["m-a"])).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    assert set(g.subs.partitions) == set(expected["m-a"])


def test_leader_skip_assignment_behaves_as_follower() -> None:
    g = Group()
    g.subscribe()
    g.find_coordinator()
    body = join_response(member_id="m-a", leader="m-a", members=[("m-a", None, member_metadata("t"))])
    body["skip_assignment"] = True
    g.h.take("JoinGroup").respond(body)
    assert g.h.take("SyncGroup").body()["assignments"] == []


def test_static_leader_back_with_skip_assignment_keeps_its_partitions_and_watches_the_topics() -> None:
    """KIP-814: a static leader rejoining gets SkipAssignment: no assignor run, an empty SyncGroup,
    its old assignment back, and no rejoin at the next metadata (the counts there are the
    baseline); a later partition count change still makes it rejoin, as a leader does."""
    g = Group(instance_id="i-a")
    g.subscribe()
    g.find_coordinator()
    body = join_response(member_id="m-a", leader="m-a", members=[("m-a", "i-a", member_metadata("t"))])
    body["skip_assignment"] = True
    g.h.take("JoinGroup").respond(body)
    assert g.m.topics_of_interest() == {"t"}
    g.serve_metadata()
    sync = g.h.take("SyncGroup")
    assert sync.body()["assignments"] == []
    sync.respond(sync_response([T0, T1, T2, T3]))
    g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1, T2, T3)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    for _ in range(2):  # metadata with the same counts: nothing to do
        g.metadata.request_update()
        g.serve_metadata()
        g.m.on_metadata()
        g.h.poll()
        assert g.m.state is S.STABLE and "JoinGroup" not in [r.api for r in g.h.pending]
    g.metadata.request_update()
    g.serve_metadata({**LEADERS, TopicPartition("t", 4): (1, 0)})
    g.m.on_metadata()
    assert g.m.state is S.PREPARE_REVOCATION  # eager (range): revoke, then rejoin
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1, T2, T3)).ack()
    assert g.h.take("JoinGroup").body()["group_instance_id"] == "i-a"


def leader_stable(g: Group) -> None:
    g.subscribe("t")
    g.find_coordinator()
    g.h.take("JoinGroup").respond(join_response(member_id="m-a", leader="m-a",
                                                members=[("m-a", None, member_metadata("t"))]))
    g.serve_metadata()
    g.h.take("SyncGroup").respond(sync_response([T0, T1, T2, T3]))
    g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1, T2, T3)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    g.h.take("Heartbeat", poll=False).respond({"error_code": 0})


def test_leader_rejoins_when_partition_count_changes() -> None:
    g = Group()
    leader_stable(g)
    g.metadata.request_update()
    g.serve_metadata()  # same partition counts
    g.m.on_metadata()
    assert g.m.state is S.STABLE

    grown = {**LEADERS, TopicPartition("t", 4): (1, 0)}
    g.metadata.request_update()
    g.serve_metadata(grown)
    g.m.on_metadata()
    assert g.m.state is S.PREPARE_REVOCATION
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1, T2, T3)).ack()
    join = g.h.take("JoinGroup")
    assert join.body()["member_id"] == "m-a"


def test_follower_ignores_partition_count_change() -> None:
    g = Group()
    g.stable()
    grown = {**LEADERS, TopicPartition("t", 4): (1, 0)}
    g.metadata.request_update()
    g.serve_metadata(grown)
    g.m.on_metadata()
    assert g.m.state is S.STABLE
    g.h.assert_idle("JoinGroup")


WITHOUT_T = {U0: (1, 0), U1: (2, 0)}  # topic "t" deleted: the broker answers UNKNOWN_TOPIC_OR_PARTITION


def test_member_owning_partitions_of_a_deleted_topic_rejoins_once_per_deletion() -> None:
    g = Group()
    g.stable((T0, T1))  # a follower: only the leader watches partition counts
    g.metadata.request_update()
    g.serve_metadata(WITHOUT_T, topic_errors={"t": 3})
    g.m.on_metadata()
    assert g.m.state is S.PREPARE_REVOCATION  # rejoin (eager: everything is revoked first)
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()
    g.join(generation=2)
    g.sync([U0])
    g.last_callback(CallbackKind.ASSIGNED, tps(U0)).ack()
    g.h.poll()
    g.metadata.request_update()
    g.serve_metadata(WITHOUT_T, topic_errors={"t": 3})
    g.m.on_metadata()
    assert g.m.state is S.STABLE
    # A leader whose metadata lags may hand the deleted partition out again, in a later rebalance:
    # no second rejoin for the same deletion.
    g.heartbeat(REBALANCE_IN_PROGRESS)
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(U0)).ack()
    g.join(generation=3)
    g.sync([T0])
    g.last_callback(CallbackKind.ASSIGNED, tps(T0)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    g.metadata.request_update()
    g.serve_metadata(WITHOUT_T, topic_errors={"t": 3})
    g.m.on_metadata()
    assert g.m.state is S.STABLE
    g.h.assert_idle("JoinGroup")
    # Once the topic exists again, a later deletion is rejoined for again.
    g.metadata.request_update()
    g.serve_metadata()
    g.m.on_metadata()
    g.metadata.request_update()
    g.serve_metadata(WITHOUT_T, topic_errors={"t": 3})
    g.m.on_metadata()
    assert g.m.state is S.PREPARE_REVOCATION


def test_leader_rejoins_when_a_topic_of_another_member_is_deleted() -> None:
    g = Group()
    g.subscribe("t")
    g.find_coordinator()
    members = [("m-a", None, member_metadata("t")), ("m-b", None, member_metadata("u"))]
    g.h.take("JoinGroup").respond(join_response(member_id="m-a", leader="m-a", members=members))
    g.serve_metadata()
    g.h.take("SyncGroup").respond(sync_response([T0, T1, T2, T3]))
    g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1, T2, T3)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    # "u" missing from an answer that did not ask for it says nothing ...
    g.metadata.request_update()
    g.serve_metadata({T0: (1, 0), T1: (1, 0), T2: (2, 0), T3: (2, 0)})
    g.m.on_metadata()
    assert g.m.state is S.STABLE
    # ... the broker saying it does not exist is a change of the group's topics.
    g.metadata.request_update()
    g.serve_metadata({T0: (1, 0), T1: (1, 0), T2: (2, 0), T3: (2, 0)}, topic_errors={"u": 3})
    g.m.on_metadata()
    assert g.m.state is S.PREPARE_REVOCATION


def test_leader_waiting_for_metadata_has_no_deadline() -> None:
    g = Group()
    g.subscribe()
    g.find_coordinator()
    g.h.take("JoinGroup").respond(join_response(member_id="m-a", leader="m-a",
                                                members=[("m-a", None, member_metadata("t"))]))
    g.h.assert_idle()
    # Nothing to do until the metadata response (which wakes the loop by itself).
    assert g.m.next_deadline(g.now) > g.now
    g.serve_metadata()
    assert g.m.next_deadline(g.now) == g.now
    g.h.take("SyncGroup")


# -- JoinGroup errors --------------------------------------------------------------------------------


def joining(**kwargs: Any) -> Group:
    g = Group(**kwargs)
    g.subscribe()
    g.find_coordinator()
    return g


def test_member_id_required_rejoins_with_the_given_id() -> None:
    g = joining()
    first = g.h.take("JoinGroup")
    assert first.body()["member_id"] == ""
    first.respond(join_response(code=MEMBER_ID_REQUIRED, member_id="m-given"))
    assert g.m.state is S.JOINING
    assert g.m.member_id == "m-given"
    second = g.h.take("JoinGroup")  # at once, no backoff
    assert second.body()["member_id"] == "m-given"
    assert g.errors == []


def test_join_unknown_member_id_resets_the_member_id() -> None:
    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=MEMBER_ID_REQUIRED, member_id="m-given"))
    g.h.take("JoinGroup").respond(join_response(code=UNKNOWN_MEMBER_ID))
    assert g.m.member_id == ""
    assert g.m.state is S.JOINING
    assert g.h.take("JoinGroup").body()["member_id"] == ""
    assert g.errors == []


def test_join_rebalance_in_progress_retries_after_backoff() -> None:
    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=REBALANCE_IN_PROGRESS))
    assert g.m.state is S.JOINING
    due = g.m.next_deadline(g.now)
    assert due == g.now + BACKOFF
    g.clock.now = due - 0.001
    g.h.assert_idle()
    g.clock.now = due
    g.h.take("JoinGroup")
    assert g.errors == []


@pytest.mark.parametrize("code", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE])
def test_join_coordinator_error_marks_coordinator_unknown(code: int) -> None:
    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=code))
    assert g.coordinator.node_id is None
    assert g.m.state is S.JOINING
    g.h.assert_idle("JoinGroup")
    g.find_coordinator(node=2)
    g.clock.advance(BACKOFF)
    join = g.h.take("JoinGroup")
    assert join.node_id == COORDINATOR_NODE_BASE - 2
    assert g.errors == []


def test_join_fatal_error_is_reported() -> None:
    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=INVALID_SESSION_TIMEOUT))
    assert len(g.errors) == 1
    assert isinstance(g.errors[0], InvalidSessionTimeoutError)
    assert g.m.state is S.JOINING
    g.h.assert_idle("JoinGroup")
    g.clock.advance(BACKOFF)
    g.h.take("JoinGroup")


def test_persistent_join_error_is_retried_less_and_less_often() -> None:
    g = joining()
    for delay in (BACKOFF, 2 * BACKOFF, 4 * BACKOFF, 8 * BACKOFF):
        g.h.take("JoinGroup").respond(join_response(code=GROUP_AUTHORIZATION_FAILED))
        g.clock.advance(delay - 0.01)
        g.h.assert_idle("JoinGroup")  # not before the (growing) pause
        g.clock.advance(0.01 + 1e-9)
    assert [type(e) for e in g.errors] == [GroupAuthorizationFailedError] * 4
    g.join()  # success starts the count again
    g.h.take("SyncGroup").respond(sync_response(code=REBALANCE_IN_PROGRESS))
    g.h.take("JoinGroup").respond(join_response(code=GROUP_AUTHORIZATION_FAILED))
    g.clock.advance(BACKOFF)
    g.h.take("JoinGroup")


def test_join_group_max_size_reached_is_final() -> None:
    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=GROUP_MAX_SIZE_REACHED))
    assert g.m.state is S.FENCED
    assert [type(e) for e in g.errors] == [GroupMaxSizeReachedError]
    assert "group.max.size" in str(g.errors[0])
    g.clock.advance(60)
    g.h.assert_idle()


def test_join_transport_error_backs_off() -> None:
    g = joining()
    g.h.take("JoinGroup").fail(KafkaConnectionError("reset"))
    assert g.coordinator.node_id is None  # retriable: find the coordinator again
    assert g.m.state is S.JOINING
    g.find_coordinator()
    g.h.assert_idle("JoinGroup")
    g.clock.advance(BACKOFF)
    g.h.take("JoinGroup")


def test_join_fenced_instance_id_is_final() -> None:
    g = joining(instance_id="inst-1")
    g.h.take("JoinGroup").respond(join_response(code=FENCED_INSTANCE_ID))
    assert g.m.state is S.FENCED
    assert len(g.errors) == 1
    assert isinstance(g.errors[0], FencedInstanceIdError)
    assert g.m.identity() == GroupIdentity(-1, "", "inst-1")
    g.clock.advance(60)
    g.h.assert_idle()
    g.m.subscribe(frozenset({"other"}), None)
    g.m.leave("close")
    g.h.assert_idle()
    assert g.m.state is S.FENCED


# -- SyncGroup errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "delay", "member_id"), [
    (REBALANCE_IN_PROGRESS, 0.0, "m-1"),
    (ILLEGAL_GENERATION, BACKOFF, "m-1"),
    (UNKNOWN_MEMBER_ID, BACKOFF, ""),
    (NOT_COORDINATOR, BACKOFF, "m-1"),
])
def test_sync_errors_rejoin(code: int, delay: float, member_id: str) -> None:
    g = joining()
    g.join()
    g.h.take("SyncGroup").respond(sync_response(code=code))
    assert g.m.state is S.JOINING
    assert g.m.member_id == member_id
    assert g.callbacks == []
    assert (g.coordinator.node_id is None) == (code == NOT_COORDINATOR)
    if code == NOT_COORDINATOR:
        g.find_coordinator()
    if delay:
        g.h.assert_idle("JoinGroup")
        g.clock.advance(delay)
    assert g.h.take("JoinGroup").body()["member_id"] == member_id
    assert g.errors == []


def test_sync_fatal_error_is_reported_and_rejoins() -> None:
    g = joining()
    g.join()
    g.h.take("SyncGroup").respond(sync_response(code=GROUP_AUTHORIZATION_FAILED))
    assert [type(e) for e in g.errors] == [GroupAuthorizationFailedError]
    assert g.m.state is S.JOINING


def test_sync_fenced_instance_id() -> None:
    g = joining(instance_id="inst-1")
    g.join()
    g.h.take("SyncGroup").respond(sync_response(code=FENCED_INSTANCE_ID))
    assert g.m.state is S.FENCED
    assert [type(e) for e in g.errors] == [FencedInstanceIdError]
    g.h.assert_idle()


def test_sync_transport_error_rejoins() -> None:
    g = joining()
    g.join()
    g.h.take("SyncGroup").fail(KafkaConnectionError("reset"))
    assert g.m.state is S.JOINING
    g.find_coordinator()
    g.clock.advance(BACKOFF)
    g.h.take("JoinGroup")


# -- Heartbeat errors --------------------------------------------------------------------------------


def test_heartbeat_rebalance_in_progress_eager_revokes_everything_first() -> None:
    g = Group()
    g.stable([T0, T1])
    g.dropped.clear()
    g.events.clear()
    g.heartbeat(REBALANCE_IN_PROGRESS)
    assert g.m.state is S.PREPARE_REVOCATION
    g.h.poll()
    assert g.m.state is S.REVOKING_PARTITIONS
    # Revoking flags set and buffered records dropped before the application is asked.
    assert g.events == [
        ("drop", tps(T0, T1), {T0: True, T1: True}),
        (CallbackKind.REVOKED, tps(T0, T1), {T0: True, T1: True}),
    ]
    assert g.subs.fetchable(g.now) == []
    callback = g.last_callback(CallbackKind.REVOKED, tps(T0, T1))
    assert callback.generation == 1
    g.h.assert_idle("JoinGroup")  # not before the callback is acknowledged

    callback.ack()
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    assert g.subs.partitions == {}
    assert g.m.owned == frozenset()
    sub = join_subscription(join)
    assert sub.owned_partitions == ()
    assert join.body()["member_id"] == "m-1"


def test_heartbeat_rebalance_in_progress_cooperative_keeps_partitions() -> None:
    g = Group(assignors=("cooperative-sticky",))
    g.stable([T0, T1], protocol="cooperative-sticky")
    g.dropped.clear()
    g.callbacks.clear()
    g.heartbeat(REBALANCE_IN_PROGRESS)
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    assert g.callbacks == []
    assert g.dropped == []
    assert set(g.subs.partitions) == {T0, T1}
    assert not any(p.revoking for p in g.subs.partitions.values())
    sub = join_subscription(join)
    assert sub.topics == ("t",)
    assert sub.owned_partitions == (T0, T1)
    assert sub.generation_id == 1


def test_mixed_assignors_use_eager() -> None:
    g = Group(assignors=("cooperative-sticky", "range"))
    g.stable([T0], protocol="range")
    g.heartbeat(REBALANCE_IN_PROGRESS)
    g.h.poll()
    assert g.m.state is S.REVOKING_PARTITIONS
    g.last_callback(CallbackKind.REVOKED, tps(T0))


@pytest.mark.parametrize(("code", "member_id"), [(ILLEGAL_GENERATION, "m-1"), (UNKNOWN_MEMBER_ID, "")])
def test_heartbeat_generation_errors_lose_partitions(code: int, member_id: str) -> None:
    g = Group()
    g.stable([T0, T1])
    g.events.clear()
    g.heartbeat(code)
    assert g.m.state is S.LOST
    assert g.m.generation == -1
    assert g.m.member_id == member_id
    assert g.m.identity() == GroupIdentity(-1, "", None)
    g.h.assert_idle("Heartbeat")
    assert g.m.state is S.REVOKING_PARTITIONS
    assert g.events == [
        ("drop", tps(T0, T1), {T0: True, T1: True}),
        (CallbackKind.LOST, tps(T0, T1), {T0: True, T1: True}),
    ]
    callback = g.last_callback(CallbackKind.LOST, tps(T0, T1))
    g.clock.advance(HEARTBEAT * 2)
    g.h.assert_idle()  # no heartbeat without a generation, no join before the callback

    callback.ack()
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    assert g.subs.partitions == {}
    assert join.body()["member_id"] == member_id
    sub = join_subscription(join)
    assert (sub.owned_partitions, sub.generation_id) == ((), -1)
    assert g.errors == []


def test_heartbeat_fenced_instance_id() -> None:
    g = Group(instance_id="inst-1")
    g.stable()
    g.heartbeat(FENCED_INSTANCE_ID)
    assert g.m.state is S.FENCED
    assert [type(e) for e in g.errors] == [FencedInstanceIdError]
    # The application hears that its partitions are gone (LOST: streams end, nothing is committed).
    lost = g.last_callback(CallbackKind.LOST, tps(T0, T1))
    assert lost.acked  # nobody waits for it
    assert g.subs.partitions == {} and g.m.owned == frozenset()
    assert g.m.identity() == GroupIdentity(-1, "", "inst-1")
    g.clock.advance(HEARTBEAT * 3)
    g.h.assert_idle()


def test_heartbeat_not_coordinator_rediscovers() -> None:
    g = Group()
    g.stable()
    g.heartbeat(NOT_COORDINATOR)
    assert g.coordinator.node_id is None
    assert g.m.state is S.STABLE
    assert g.errors == []
    g.clock.advance(HEARTBEAT)
    g.h.assert_idle("Heartbeat")
    g.find_coordinator(node=2)
    beat = g.h.take("Heartbeat")
    assert beat.node_id == COORDINATOR_NODE_BASE - 2
    assert beat.body()["generation_id"] == 1


def test_heartbeat_other_error_is_reported() -> None:
    g = Group()
    g.stable()
    g.heartbeat(GROUP_AUTHORIZATION_FAILED)
    assert [type(e) for e in g.errors] == [GroupAuthorizationFailedError]
    assert g.m.state is S.STABLE


def test_heartbeat_transport_error_backs_off() -> None:
    g = Group()
    g.stable()
    g.clock.advance(HEARTBEAT)
    g.h.take("Heartbeat").fail(KafkaConnectionError("reset"))
    assert g.coordinator.node_id is None
    g.find_coordinator()
    g.h.assert_idle("Heartbeat")
    g.clock.advance(BACKOFF)
    g.h.take("Heartbeat")


def test_stale_heartbeat_response_is_ignored() -> None:
    g = Group(assignors=("cooperative-sticky",))
    g.stable([T0], protocol="cooperative-sticky")
    g.clock.advance(HEARTBEAT)
    old = g.h.take("Heartbeat")  # generation 1, still in flight
    g.m.request_rejoin("test")
    g.h.take("JoinGroup").respond(join_response(generation=2, protocol="cooperative-sticky"))
    old.respond({"error_code": ILLEGAL_GENERATION})
    assert g.m.state is S.SYNCING
    assert g.m.generation == 2


def test_heartbeat_rebalance_during_assignment_rejoins_after_ack_cooperative() -> None:
    g = Group(assignors=("cooperative-sticky",))
    g.subscribe()
    g.find_coordinator()
    g.join(protocol="cooperative-sticky")
    g.sync([T0, T1], protocol="cooperative-sticky")
    callback = g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1))
    g.heartbeat(REBALANCE_IN_PROGRESS)  # heartbeats go on while the callback runs
    assert g.m.state is S.ASSIGNING_PARTITIONS
    callback.ack()
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    assert join_subscription(join).owned_partitions == (T0, T1)


@pytest.mark.parametrize("trigger", ["heartbeat", "subscribe"])
def test_eager_rejoin_requested_during_assignment_revokes_first(trigger: str) -> None:
    g = Group()
    g.subscribe("t")
    g.find_coordinator()
    g.join()
    g.sync([T0, T1])
    callback = g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1))
    if trigger == "heartbeat":
        g.heartbeat(REBALANCE_IN_PROGRESS)
    else:
        g.m.subscribe(frozenset({"t", "u"}), None)
    callback.ack()
    sent = g.h.poll()
    # Eager: every owned partition is revoked (callback acknowledged) before JoinGroup.
    assert [s.api for s in sent if s.api == "JoinGroup"] == []
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()
    join = g.h.take("JoinGroup")
    assert join_subscription(join).owned_partitions == ()
    assert g.subs.partitions == {}


# -- cooperative incremental rebalance (KIP-429) -------------------------------------------------------


def test_cooperative_two_round_rebalance() -> None:
    g = Group(assignors=("cooperative-sticky",))
    g.stable([T0, T1], protocol="cooperative-sticky")
    g.subs.seek(T1, 42)
    kept = g.subs.get(T1)
    g.callbacks.clear()
    g.events.clear()
    before = len(g.m.transitions)
    g.heartbeat(REBALANCE_IN_PROGRESS)
    g.join(protocol="cooperative-sticky", generation=2)
    g.sync([T1, T2], protocol="cooperative-sticky")

    # Round one: only what moves away is revoked, and first.
    assert g.m.state is S.REVOKING_PARTITIONS
    assert g.events == [
        ("drop", tps(T0), {T0: True}),
        (CallbackKind.REVOKED, tps(T0), {T0: True}),
    ]
    assert g.subs.get(T1) is kept and not kept.revoking
    revoked = g.last_callback(CallbackKind.REVOKED, tps(T0))
    assert revoked.generation == 2
    g.h.assert_idle("JoinGroup")
    revoked.ack()
    g.h.poll()
    assert g.m.state is S.ASSIGNING_PARTITIONS
    assigned = g.last_callback(CallbackKind.ASSIGNED, tps(T2))
    assert set(g.subs.partitions) == {T1, T2}
    assert g.subs.get(T1) is kept and kept.position == 42  # kept partitions keep their position
    g.h.assert_idle("JoinGroup")

    # Round two: something was revoked, so rejoin right away.
    assigned.ack()
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    sub = join_subscription(join)
    assert sub.owned_partitions == (T1, T2)
    assert sub.generation_id == 2
    assert [c.kind for c in g.callbacks] == [CallbackKind.REVOKED, CallbackKind.ASSIGNED]
    assert g.m.transitions[before:] == [
        (S.STABLE, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.PARTITIONS_REVOKED),
        (S.PARTITIONS_REVOKED, S.JOINING),
        (S.JOINING, S.SYNCING),
        (S.SYNCING, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.REVOKING_PARTITIONS),
        (S.REVOKING_PARTITIONS, S.PARTITIONS_REVOKED),
        (S.PARTITIONS_REVOKED, S.ASSIGNING_PARTITIONS),
        (S.ASSIGNING_PARTITIONS, S.JOINING),
    ]

    # The follow-up rebalance with nothing moving ends STABLE without a third round, after an
    # assigned callback with nothing new (as in Java: every completed rebalance reports).
    join.respond(join_response(generation=3, protocol="cooperative-sticky"))
    g.sync([T1, T2], protocol="cooperative-sticky")
    g.last_callback(CallbackKind.ASSIGNED, frozenset()).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    assert len(g.callbacks) == 3


@pytest.mark.parametrize(("api", "code"), [("SyncGroup", ILLEGAL_GENERATION), ("SyncGroup", UNKNOWN_MEMBER_ID),
                                           ("JoinGroup", UNKNOWN_MEMBER_ID)])
def test_cooperative_generation_error_during_rebalance_loses_partitions(api: str, code: int) -> None:
    g = Group(assignors=("cooperative-sticky",))
    g.stable([T0, T1], protocol="cooperative-sticky")
    g.heartbeat(REBALANCE_IN_PROGRESS)
    if api == "SyncGroup":
        g.join(protocol="cooperative-sticky", generation=2)
        g.h.take("SyncGroup").respond(sync_response(code=code))
    else:
        g.h.take("JoinGroup").respond(join_response(code=code))
    g.h.poll()
    # Our membership is gone: the group may already have given T0/T1 to others.
    g.last_callback(CallbackKind.LOST, tps(T0, T1)).ack()
    g.clock.advance(BACKOFF)
    join = g.h.take("JoinGroup")
    assert g.subs.partitions == {}
    sub = join_subscription(join)
    assert (sub.owned_partitions, sub.generation_id) == ((), -1)


# -- callback deadline -------------------------------------------------------------------------------


def test_unacknowledged_callback_times_out(caplog: pytest.LogCaptureFixture) -> None:
    g = Group()
    g.subscribe()
    g.find_coordinator()
    g.join()
    g.sync([T0])
    callback = g.last_callback(CallbackKind.ASSIGNED, tps(T0))
    deadline = g.now + REBALANCE_MS / 1000
    assert callback.deadline == deadline
    with caplog.at_level(logging.WARNING, logger="asyncconsumer.membership"):
        # Heartbeats go on while the callback runs.
        while g.now + 2 * HEARTBEAT < deadline:
            g.heartbeat()
            assert g.m.state is S.ASSIGNING_PARTITIONS
        g.clock.advance(HEARTBEAT)
        g.h.take("Heartbeat")  # left in flight: the callback deadline is now the next thing to wait for
        assert g.m.next_deadline(g.now) == deadline
        g.clock.now = deadline - 0.001
        g.h.assert_idle()
        assert g.m.state is S.ASSIGNING_PARTITIONS
        assert not caplog.records
        g.clock.now = deadline
        g.h.poll()
    assert g.m.state is S.STABLE
    assert not callback.acked
    assert g.m.owned == tps(T0)
    assert any("did not finish within rebalance_timeout_ms" in r.getMessage() for r in caplog.records)


# -- leaving -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3, 5])
def test_leave_dynamic_member_revokes_then_leaves(version: int) -> None:
    g = Group()
    g.stable([T0, T1])
    g.events.clear()
    g.m.leave("closing")
    assert g.m.leaving
    assert g.m.state is S.PREPARE_REVOCATION
    g.h.assert_idle("LeaveGroup")
    assert g.events == [
        ("drop", tps(T0, T1), {T0: True, T1: True}),
        (CallbackKind.REVOKED, tps(T0, T1), {T0: True, T1: True}),
    ]
    g.h.assert_idle("LeaveGroup")  # not before the callback is acknowledged
    g.last_callback(CallbackKind.REVOKED, tps(T0, T1)).ack()

    leave = g.h.take("LeaveGroup").at(version)
    assert g.m.state is S.LEAVING
    assert g.subs.partitions == {}
    assert leave.node_id == NODE
    body = leave.body()
    assert body["group_id"] == "g"
    if version >= 3:
        assert body["members"] == [{"member_id": "m-1", "group_instance_id": None,
                                    "reason": "closing" if version >= 5 else None}]
    else:
        assert body["member_id"] == "m-1"
    g.h.assert_idle("LeaveGroup")
    leave.respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    assert not g.m.leaving
    assert g.m.identity() == GroupIdentity(-1, "", None)
    assert (g.m.member_id, g.m.generation, g.m.owned) == ("", -1, frozenset())
    g.clock.advance(60)
    g.h.assert_idle()
    assert g.m.transitions[-5:] == [
        (S.STABLE, S.PREPARE_REVOCATION),
        (S.PREPARE_REVOCATION, S.REVOKING_PARTITIONS),
        (S.REVOKING_PARTITIONS, S.PARTITIONS_REVOKED),
        (S.PARTITIONS_REVOKED, S.LEAVING),
        (S.LEAVING, S.UNSUBSCRIBED),
    ]


def test_leave_static_member_sends_no_leave_group() -> None:
    g = Group(instance_id="inst-1")
    g.stable([T0])
    g.m.leave("closing")
    g.h.poll()
    g.last_callback(CallbackKind.REVOKED, tps(T0)).ack()
    sent = g.h.poll()
    assert [s.api for s in sent if s.api != "Heartbeat"] == []
    assert g.m.state is S.UNSUBSCRIBED
    assert g.subs.partitions == {}
    g.clock.advance(60)
    g.h.assert_idle()


def test_leave_group_failure_still_unsubscribes() -> None:
    g = Group()
    g.stable([])
    g.m.leave("closing")
    g.h.take("LeaveGroup").fail(KafkaConnectionError("reset"))
    assert g.m.state is S.UNSUBSCRIBED


def test_leave_before_joined_sends_nothing() -> None:
    g = joining()
    g.m.leave("closing")
    g.h.poll()
    assert g.m.state is S.UNSUBSCRIBED
    g.h.assert_idle()


@pytest.mark.parametrize("leave_first", [True, False])
def test_join_response_after_leave_is_ignored(leave_first: bool) -> None:
    g = joining()
    join = g.h.take("JoinGroup")
    g.m.leave("closing")
    if not leave_first:
        g.h.assert_idle("LeaveGroup")  # the JoinGroup is still in flight
        assert g.m.state is S.LEAVING
    join.respond(join_response(member_id="m-7", generation=4, leader="m-0"))
    assert g.m.state is not S.SYNCING
    leave = g.h.take("LeaveGroup")
    assert leave.body()["members"][0]["member_id"] == "m-7"  # the coordinator knows us by that id
    g.h.assert_idle("SyncGroup")
    leave.respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    assert S.SYNCING not in {to for _, to in g.m.transitions}
    assert g.callbacks == []


def test_subscribe_after_leave_rejoins() -> None:
    g = Group()
    g.stable([])
    g.m.leave("unsubscribe")
    leave = g.h.take("LeaveGroup")
    g.subscribe("u")
    leave.respond({"error_code": 0})
    join = g.h.take("JoinGroup")
    assert join.body()["member_id"] == ""
    assert join_subscription(join).topics == ("u",)


# -- max_poll_interval -------------------------------------------------------------------------------


@pytest.mark.parametrize("instance_id", [None, "inst-1"])
def test_poll_interval_expiry_leaves_and_rejoins_on_poll(instance_id: str | None) -> None:
    g = Group(instance_id=instance_id)
    g.stable([T0, T1])
    g.callbacks.clear()
    g.dropped.clear()
    now = g.now
    assert g.m.check_poll_interval(now, now - 4.9, 5.0) is None
    assert g.m.check_poll_interval(now, now - 5.0, 5.0) is None
    assert g.m.state is S.STABLE

    error = g.m.check_poll_interval(now, now - 5.1, 5.0)
    assert isinstance(error, PollIntervalExceededError)
    assert g.subs.partitions == {}
    assert g.dropped == [tps(T0, T1)]
    lost = g.last_callback(CallbackKind.LOST, tps(T0, T1))
    assert lost.acked  # nobody waits for an application that is not polling
    assert g.m.state is S.LEAVING
    assert g.m.identity() == GroupIdentity(-1, "", instance_id)
    assert g.m.check_poll_interval(now, now - 100, 5.0) is None  # reported once

    leave = g.h.take("LeaveGroup")  # even a static member leaves: its partitions must move
    assert leave.body()["members"] == [{"member_id": "m-1", "group_instance_id": instance_id,
                                        "reason": "the application did not poll within max_poll_interval_ms=5000"}]
    g.h.assert_idle()  # no heartbeat while leaving
    leave.respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    g.clock.advance(30)
    g.h.assert_idle()  # no rejoin until the application polls
    assert g.m.check_poll_interval(g.now, now - 100, 5.0) is None

    g.m.on_poll()
    join = g.h.take("JoinGroup")
    assert g.m.state is S.JOINING
    assert join.body()["member_id"] == ""
    assert join.body()["group_instance_id"] == instance_id
    assert join_subscription(join).topics == ("t",)
    assert len(g.callbacks) == 1


def test_poll_interval_expiry_abandons_a_pending_callback() -> None:
    g = Group()
    g.subscribe()
    g.find_coordinator()
    g.join()
    g.sync([T0, T1])
    pending = g.last_callback(CallbackKind.ASSIGNED, tps(T0, T1))  # the application never acknowledges it
    assert g.m.check_poll_interval(g.now, g.now - 10, 5.0) is not None
    assert not pending.acked
    g.last_callback(CallbackKind.LOST, tps(T0, T1))
    g.h.take("LeaveGroup").respond({"error_code": 0})
    assert g.m.state is S.UNSUBSCRIBED
    assert g.m.next_deadline(g.now) == float("inf")  # nothing to wait for until the application polls
    g.m.on_poll()
    g.h.take("JoinGroup").respond(join_response(generation=2))
    g.sync([T2])
    g.last_callback(CallbackKind.ASSIGNED, tps(T2)).ack()
    g.h.poll()
    assert g.m.state is S.STABLE
    assert set(g.subs.partitions) == {T2}


def test_poll_during_leave_rejoins_after_leave_group() -> None:
    g = Group()
    g.stable([T0])
    assert g.m.check_poll_interval(g.now, g.now - 10, 5.0) is not None
    leave = g.h.take("LeaveGroup")
    g.m.on_poll()
    assert g.m.state is S.LEAVING
    g.h.assert_idle("JoinGroup")
    leave.respond({"error_code": 0})
    join = g.h.take("JoinGroup")
    assert join.body()["member_id"] == ""


def test_poll_interval_not_checked_when_not_joined() -> None:
    g = Group()
    assert g.m.check_poll_interval(g.now, g.now - 100, 5.0) is None
    assert g.m.state is S.UNSUBSCRIBED


def test_leave_during_a_pending_revocation_runs_one_callback_per_partition() -> None:
    g = Group()
    g.stable((T0, T1))
    g.heartbeat(27)  # eager: a rebalance revokes everything; the revoke callback is pending
    g.h.poll()
    revoke = g.last_callback(CallbackKind.REVOKED, frozenset({T0, T1}))
    g.m.leave("close")
    revoke.ack()
    g.h.poll()
    assert [c.kind for c in g.callbacks].count(CallbackKind.REVOKED) == 1
    g.h.take("LeaveGroup", poll=False).respond({"error_code": 0, "members": []})
    assert g.m.state is S.UNSUBSCRIBED and not g.m.owned


def test_leaving_before_any_coordinator_answered_needs_none() -> None:
    """A member that never joined (the coordinator lookup keeps failing: GROUP_AUTHORIZATION_FAILED,
    say) has nothing to tell a coordinator: leave() ends at the next poll, so close() does not wait
    out its timeout for a coordinator it never had."""
    g = Group()
    g.subscribe()
    g.h.take("FindCoordinator").at(4).respond({"coordinators": [
        {"key": "g", "node_id": -1, "host": "", "port": -1, "error_code": 30, "error_message": None}]})
    assert g.m.state is S.JOINING and g.coordinator.node_id is None
    g.m.leave("closing")
    g.m.poll(g.now)
    assert g.m.state is S.UNSUBSCRIBED
    g.h.assert_idle("LeaveGroup")


def test_a_join_held_by_the_coordinator_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A coordinator may hold JoinGroup for long (Tansu: session_timeout_ms / 2, 22.5 s by default):
    one INFO line says so, so that a member joining for long is not taken for a stuck one."""
    from asyncconsumer.managers.membership import JOIN_HELD_NOTICE

    g = joining()
    g.h.take("JoinGroup").respond(join_response(code=MEMBER_ID_REQUIRED, member_id="m-given"))
    held = g.h.take("JoinGroup")
    with caplog.at_level(logging.INFO, logger="asyncconsumer.membership"):
        g.h.advance(JOIN_HELD_NOTICE - 0.5)
        g.h.assert_idle("JoinGroup")
        assert not [r for r in caplog.records if "held" in r.getMessage()]
        assert g.m.next_deadline(g.h.now) == pytest.approx(g.h.now + 0.5)  # the loop wakes for it
        for _ in range(3):
            g.h.advance(1.0)
            g.h.assert_idle("JoinGroup")
        held.respond(join_response(member_id="m-given"))
    said = [r.getMessage() for r in caplog.records if "held" in r.getMessage()]
    assert len(said) == 1, said
    assert "has held this member's JoinGroup for 6 s" in said[0], said  # noticed at the first poll past 5 s
    assert f"session_timeout_ms / 2, {g.m.settings.session_timeout_ms / 2000:.1f} s" in said[0], said
    assert g.m.state is S.SYNCING
