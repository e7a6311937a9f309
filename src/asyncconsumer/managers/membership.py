"""Group membership for the classic protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup).

A sans-I/O state machine with the rebalance states of the threading-refactor
design (seed 004), on the core it shares with the KIP-848 manager
(:mod:`~asyncconsumer.managers.member_base`).  Every transition is checked against
``membership_types.CLASSIC_TRANSITIONS`` and logged at debug level.

    UNSUBSCRIBED ──subscribe──► PREPARE_REVOCATION ─► REVOKING_PARTITIONS ─► PARTITIONS_REVOKED
         ▲                          (eager: all owned; cooperative: only what moves)      │
         │                                                                                ▼
      LEAVING ◄── unsubscribe/close        STABLE ◄── ASSIGNING_PARTITIONS ◄── SYNCING ◄── JOINING

Partitions being revoked stop being fetched and lose their buffered records in
PREPARE_REVOCATION, before the application's revoke callback runs; the loop
then waits (with a deadline) for the application side to acknowledge each
callback.  ``FENCED`` is final (another member took our ``group_instance_id``, or an error the
member cannot go on from);
``LOST`` hands partitions to ``on_partitions_lost`` and rejoins.

A coordinator holds a JoinGroup until the group's members have joined or its
wait is over (Apache Kafka: ``group.initial.rebalance.delay.ms`` for a new group,
then up to the rebalance timeout; Tansu: half the session timeout, always).  A
join held for :data:`JOIN_HELD_NOTICE` seconds is said in one INFO line, so a
member shown as joining for long is not taken for a stuck one.
"""

from __future__ import annotations

import logging
from typing import Any

from ..assignors import (
    Assignor,
    MemberAssignment,
    RebalanceProtocol,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from ..errors import (
    COORDINATOR_CODES,
    FencedInstanceIdError,
    GroupMaxSizeReachedError,
    IllegalGenerationError,
    KafkaError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    error_for_code,
)
from .coordinator import CoordinatorManager
from .member_base import GroupMemberBase
from .membership_types import (
    CLASSIC_TRANSITIONS,
    CallbackKind,
    CallbackRequest,
    GroupSettings,
    MemberHooks,
    MemberState,
    RebalancePlan,
)
from .metadata import MetadataManager
from .requests import Body, UnsentRequest
from .subscription import SubscriptionState

__all__ = ["CallbackKind", "CallbackRequest", "GroupSettings", "MemberHooks", "MemberState", "MembershipManager"]

log = logging.getLogger("asyncconsumer.membership")

#: Seconds a JoinGroup may be held by the coordinator before an INFO line says so (once per request).
JOIN_HELD_NOTICE = 5.0


class MembershipManager(GroupMemberBase):
    group_protocol = "classic"
    allowed_transitions = CLASSIC_TRANSITIONS

    def __init__(
        self,
        settings: GroupSettings,
        coordinator: CoordinatorManager,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        hooks: MemberHooks,
    ) -> None:
        super().__init__(settings, coordinator, subscriptions, metadata, hooks)
        self.leader_id = ""
        self.protocol_name: str | None = None
        self._heartbeat_in_flight = False
        self._rejoin_requested = False
        self._group_topics: frozenset[str] = frozenset()
        self._leader_pending: tuple[dict[str, Any], int] | None = None
        #: The leader's partition counts of the group's topics (None: to be taken from the next metadata).
        self._partition_counts: dict[str, int] | None = {}
        self._gone_topics: frozenset[str] = frozenset()  # owned topics found deleted (rejoined for)
        self._sync_assignments: dict[str, bytes] | None = None
        #: When the JoinGroup in flight was sent (None: none, or already said to be held).
        self._join_sent_at: float | None = None
        #: Why the member rejoins: the next JoinGroup's reason (v8+; broker logs), then forgotten.
        self._join_reason: str | None = None

    # -- state ------------------------------------------------------------------------------------

    @property
    def protocol(self) -> RebalanceProtocol:
        # The highest protocol every configured assignor supports (as in the Java client).
        common = set(RebalanceProtocol)
        for assignor in self.settings.assignors:
            common &= set(assignor.supported_protocols)
        return RebalanceProtocol.COOPERATIVE if RebalanceProtocol.COOPERATIVE in common else RebalanceProtocol.EAGER

    def topics_of_interest(self) -> frozenset[str]:
        """Our subscribed topics, and as leader every member's (to compute the assignment)."""
        return self.topics | self._group_topics if self._group_topics else self.topics

    # -- application requests ---------------------------------------------------------------------

    def _join(self) -> None:
        self._start_rebalance(join=True)

    def _subscription_changed(self) -> None:
        self.request_rejoin("subscription changed")

    def _pattern_topics_changed(self) -> None:
        if self.state is not MemberState.UNSUBSCRIBED:
            self.request_rejoin("pattern subscription changed")

    def on_metadata(self) -> None:
        """Rejoin when the group's topics changed under the assignment: the leader when a topic's
        partition count changed or a topic was deleted (as the Java client's leader does), and any
        member that owns partitions the metadata says no longer exist, so that they leave it at
        once whoever leads (once per deletion: the leader's metadata may lag a moment)."""
        if self.state is not MemberState.STABLE:
            return
        cluster = self._metadata.cluster
        gone = frozenset(tp.topic for tp in self.owned if cluster.missing(tp))
        new = gone - self._gone_topics
        # Remembered until the topic shows up again (re-created), owned meanwhile or not.
        self._gone_topics = frozenset(t for t in self._gone_topics if t not in cluster.topics) | gone
        if new:
            self.request_rejoin(f"assigned topics no longer exist: {', '.join(sorted(new))}")
            return
        if self.leader_id != self.member_id:
            return
        counts = self._counts(self.topics_of_interest())
        if self._partition_counts is None:  # a static leader back with skip_assignment: the baseline
            if all(t in counts for t in self._group_topics):
                self._partition_counts = counts
            return
        # A topic missing from this answer for no reason the broker gave (not asked for) says nothing.
        if counts != self._partition_counts and all(
            t in counts or cluster.topic_missing(t) for t in self._partition_counts
        ):
            self.request_rejoin("partition count changed")

    def enforce_rebalance(self, reason: str) -> None:
        """The application asks for a rebalance (Java's ``enforceRebalance``): rejoin, saying why."""
        self.request_rejoin(reason)

    def request_rejoin(self, reason: str) -> None:
        log.info("group %r: rejoining (%s)", self.settings.group_id, reason)
        self._join_reason = reason
        if self.state is MemberState.STABLE:
            self._start_rebalance(join=True)
        else:
            self._rejoin_requested = True

    def _drop_rebalance_for_leave(self) -> bool:
        self._rejoin_requested = False
        self._group_topics = frozenset()
        if self.state in (MemberState.PREPARE_REVOCATION, MemberState.REVOKING_PARTITIONS, MemberState.LOST):
            # A revocation is under way: let it finish (one callback per partition), then leave.
            self._plan.assign, self._plan.rejoin_after = frozenset(), False
            return False
        return True

    # -- the rebalance state machine ---------------------------------------------------------------

    def _start_rebalance(self, *, join: bool) -> None:
        revoke = self.owned if self.protocol is RebalanceProtocol.EAGER else frozenset()
        self._plan = RebalancePlan(revoke=revoke, rejoin_after=join)
        self._to(MemberState.PREPARE_REVOCATION)

    def _lose_partitions(self, reason: str) -> None:
        log.warning("group %r: partitions lost (%s)", self.settings.group_id, reason)
        self._plan = RebalancePlan(revoke=self.owned, lost=True, rejoin_after=True)
        self.generation = -1
        self._lost_membership()
        self._to(MemberState.LOST)

    def _rejoin_due(self) -> bool:
        """A rebalance asked for a rejoin, or one was requested meanwhile (taken now)."""
        due = self._plan.rejoin_after or self._rejoin_requested
        self._rejoin_requested = False
        return due

    def _rejoin_after_revocation(self) -> bool:
        if not self._rejoin_due():
            return False
        self._to(MemberState.JOINING)
        return True

    def _rejoin_after_assignment(self) -> bool:
        if not self._rejoin_due():
            return False
        if self.protocol is RebalanceProtocol.EAGER and self.owned:
            self._start_rebalance(join=True)  # eager: revoke everything before joining
        else:
            self._to(MemberState.JOINING)
        return True

    # -- the manager protocol ---------------------------------------------------------------------

    def _protocol_deadlines(self, now: float) -> list[float]:
        times = []
        waiting_for_metadata = (self.state is MemberState.SYNCING and self._leader_pending is not None
                                and self._metadata.version <= self._leader_pending[1])
        if self.state in (MemberState.JOINING, MemberState.SYNCING, MemberState.LEAVING) and not self._in_flight:
            if self._coordinator.node_id is not None and not waiting_for_metadata:
                times.append(max(now, self._retry_at))
        if self._heartbeating() and not self._heartbeat_in_flight and self._coordinator.node_id is not None:
            times.append(self._next_heartbeat)
        if self._join_sent_at is not None:
            times.append(self._join_sent_at + JOIN_HELD_NOTICE)
        return times

    def poll(self, now: float) -> list[UnsentRequest]:
        self._advance(now)
        self._notice_held_join(now)
        node = self._coordinator.node_id
        if self.state is MemberState.LEAVING and not self._in_flight and not self.member_id:
            self._left()  # never joined (no coordinator, say): nothing to tell one, no need to find it
            return []
        if node is None or self._in_flight or now < self._retry_at:
            requests: list[UnsentRequest] = []
        elif self.state is MemberState.JOINING:
            requests = [self._join_request(node)]
            self._join_sent_at = now
        elif self.state is MemberState.SYNCING and self._leader_pending is not None:
            requests = self._maybe_sync_as_leader(node)
        elif self.state is MemberState.SYNCING and self._sync_assignments is not None:
            assignments, self._sync_assignments = self._sync_assignments, None
            self._in_flight = True
            requests = [self._sync_request(node, assignments)]
        elif self.state is MemberState.LEAVING:
            requests = self._leave(now, node)
        else:
            requests = []
        if node is not None and self._heartbeating() and not self._heartbeat_in_flight and now >= self._next_heartbeat:
            requests.append(self._heartbeat_request(node))
        return requests

    def _notice_held_join(self, now: float) -> None:
        sent = self._join_sent_at
        if sent is None or not self._in_flight or self.state is not MemberState.JOINING:
            return
        if now - sent >= JOIN_HELD_NOTICE:
            self._join_sent_at = None
            log.info(
                "group %r: the coordinator has held this member's JoinGroup for %.0f s; it answers once the "
                "group's members have joined or its wait is over (Apache Kafka: group.initial.rebalance.delay.ms, "
                "then up to rebalance_timeout_ms; the embedded Tansu broker: session_timeout_ms / 2, %.1f s)",
                self.settings.group_id, now - sent, self.settings.session_timeout_ms / 2000,
            )

    def _fail(self, now: float, error: BaseException, what: str) -> None:
        self._in_flight = False
        self._retry_at = now + self.settings.retry_backoff
        if isinstance(error, KafkaError) and error.retriable:
            self._coordinator.mark_unknown(now, error)
        log.debug("%s for group %r failed: %s", what, self.settings.group_id, error)

    # -- JoinGroup --------------------------------------------------------------------------------

    def _subscription(self, assignor: Assignor) -> bytes:
        owned = sorted(self.owned)
        topics = sorted(self.topics)
        sub = Subscription(
            topics=tuple(topics),
            user_data=assignor.subscription_user_data(set(topics), list(owned), self.generation),
            owned_partitions=tuple(owned),
            generation_id=self.generation,
            rack_id=self.settings.client_rack,
        )
        return encode_subscription(sub)

    def _join_request(self, node: int) -> UnsentRequest:
        self._in_flight = True
        settings = self.settings
        protocols = [{"name": a.name, "metadata": self._subscription(a)} for a in settings.assignors]
        reason, self._join_reason = self._join_reason, None

        def build(version: int) -> Body:
            return {
                "group_id": settings.group_id,
                "session_timeout_ms": settings.session_timeout_ms,
                "rebalance_timeout_ms": settings.rebalance_timeout_ms,
                "member_id": self.member_id,
                "group_instance_id": settings.group_instance_id,
                "protocol_type": "consumer",
                "protocols": protocols,
                "reason": reason[:255] if reason is not None else None,  # Kafka's limit (maybeTruncateReason)
            }

        def on_response(now: float, version: int, body: Body) -> None:
            self._in_flight = False
            self._join_sent_at = None
            code = body["error_code"]
            if self.state is not MemberState.JOINING:  # left (or fenced) while the join was in flight
                if not code:
                    self.member_id = body["member_id"]  # so that LeaveGroup names us
                return
            if code == MemberIdRequiredError.code:  # KIP-394: join again with the id the coordinator gave us
                self.member_id = body["member_id"]
                return
            if code == UnknownMemberIdError.code:
                self.member_id = ""
                self._retry_at = now
                if self.owned:
                    self._lose_partitions(error_for_code(code).error_name)
                return
            if code == FencedInstanceIdError.code:
                self._fenced(now)
                return
            if code in COORDINATOR_CODES:
                self._coordinator.mark_unknown(now, error_for_code(code))
                self._retry_at = now + settings.retry_backoff
                return
            if code == RebalanceInProgressError.code:
                self._retry_at = now + settings.retry_backoff
                return
            if code == GroupMaxSizeReachedError.code:
                self._fatal_code(now, code)
                return
            if code:
                error = error_for_code(code, f"JoinGroup for group {settings.group_id!r}")
                if error.retriable:
                    self._retry_at = now + settings.retry_backoff
                else:  # authorization, a bad setting, ...: tell the application, retry less and less often
                    self._retry_at = self._error_backoff(now)
                    self._hooks.report_error(error)
                return
            self._error_count = 0
            self.member_id = body["member_id"]
            self.generation = body["generation_id"]
            self.leader_id = body["leader"]
            self.protocol_name = body["protocol_name"]
            self._joined()
            log.info("group %r joined: generation %d, member %s%s", settings.group_id, self.generation,
                     self.member_id, " (leader)" if self.leader_id == self.member_id else f", leader {self.leader_id}")
            self._to(MemberState.SYNCING)
            if self.leader_id == self.member_id:
                members = {m["member_id"]: (m["group_instance_id"], m["metadata"]) for m in body["members"]}
                subs = {}
                for member_id, (instance_id, metadata) in members.items():
                    sub = decode_subscription(metadata)
                    subs[member_id] = Subscription(sub.topics, sub.user_data, sub.owned_partitions,
                                                   sub.generation_id, sub.rack_id, instance_id)
                self._group_topics = frozenset(t for s in subs.values() for t in s.topics)
                if body.get("skip_assignment"):
                    # KIP-814: a static leader rejoining keeps the assignment it had (no assignor run,
                    # an empty SyncGroup) but still watches the group's topics; the partition counts
                    # of the next metadata are what later changes are measured against.
                    self._leader_pending = None
                    self._sync_assignments = {}
                    self._partition_counts = None
                else:
                    self._leader_pending = ({"subs": subs}, self._metadata.version)
                self._metadata.request_update()
            else:
                self._leader_pending = None
                self._sync_assignments = {}

        return UnsentRequest("JoinGroup", build, on_response, lambda now, e: self._fail(now, e, "JoinGroup"),
                             node_id=node, min_version=2,
                             extra_timeout_ms=self.settings.rebalance_timeout_ms)

    # -- SyncGroup --------------------------------------------------------------------------------

    def _maybe_sync_as_leader(self, node: int) -> list[UnsentRequest]:
        assert self._leader_pending is not None
        pending, version_at_join = self._leader_pending
        if self._metadata.version <= version_at_join:
            return []  # wait for metadata covering every member's topics
        subs: dict[str, Subscription] = pending["subs"]
        counts = self._counts(self._group_topics)
        self._partition_counts = counts
        assignor = next(a for a in self.settings.assignors if a.name == self.protocol_name)
        plan = assignor.assign(counts, subs, self._metadata.cluster.replica_racks(counts))
        assignments = {member: encode_assignment(a) for member, a in plan.items()}
        self._leader_pending = None
        self._in_flight = True
        return [self._sync_request(node, assignments)]

    def _counts(self, topics: frozenset[str] | set[str]) -> dict[str, int]:
        cluster = self._metadata.cluster
        return {t: len(cluster.topics[t].partitions) for t in topics if t in cluster.topics}

    def _sync_request(self, node: int, assignments: dict[str, bytes]) -> UnsentRequest:
        settings = self.settings
        generation, member_id = self.generation, self.member_id

        def build(version: int) -> Body:
            return {
                "group_id": settings.group_id,
                "generation_id": generation,
                "member_id": member_id,
                "group_instance_id": settings.group_instance_id,
                "protocol_type": "consumer",
                "protocol_name": self.protocol_name,
                "assignments": [{"member_id": m, "assignment": a} for m, a in assignments.items()],
            }

        def on_response(now: float, version: int, body: Body) -> None:
            self._in_flight = False
            if self.state is not MemberState.SYNCING or self.generation != generation:
                return
            code = body["error_code"]
            if code:
                log.debug("SyncGroup for group %r generation %d answered %s", settings.group_id, generation,
                          error_for_code(code).error_name)
            if code == FencedInstanceIdError.code:
                self._fenced(now)
                return
            if code in (IllegalGenerationError.code, UnknownMemberIdError.code) and self.owned:
                if code == UnknownMemberIdError.code:
                    self.member_id = ""
                self._lose_partitions(error_for_code(code).error_name)
                self._retry_at = now + settings.retry_backoff
                return
            rejoin = (RebalanceInProgressError.code, IllegalGenerationError.code, UnknownMemberIdError.code)
            if code in rejoin or code in COORDINATOR_CODES:
                if code == UnknownMemberIdError.code:
                    self.member_id = ""
                if code in COORDINATOR_CODES:
                    self._coordinator.mark_unknown(now, error_for_code(code))
                self._to(MemberState.JOINING)
                self._retry_at = now + (settings.retry_backoff if code != RebalanceInProgressError.code else 0)
                return
            if code:
                self._hooks.report_error(error_for_code(code, f"SyncGroup for group {settings.group_id!r}"))
                self._to(MemberState.JOINING)
                self._retry_at = now + settings.retry_backoff
                return
            self._apply_assignment(now, decode_assignment(body["assignment"] or b""))

        def on_error(now: float, error: BaseException) -> None:
            self._fail(now, error, "SyncGroup")
            if self.state is MemberState.SYNCING:
                self._to(MemberState.JOINING)

        return UnsentRequest("SyncGroup", build, on_response, on_error, node_id=node, min_version=1)

    def _apply_assignment(self, now: float, assignment: MemberAssignment) -> None:
        new = frozenset(assignment.partitions)
        for assignor in self.settings.assignors:
            if assignor.name == self.protocol_name:
                assignor.on_assignment(assignment, self.generation)
        revoke = self.owned - new
        add = new - self.owned
        # Cooperative (KIP-429): partitions that move are revoked now and assigned to their new
        # owner in a follow-up rebalance, which we ask for right away.
        rejoin = bool(revoke) and self.protocol is RebalanceProtocol.COOPERATIVE
        log.info("group %r generation %d: assigned %s, revoked %s", self.settings.group_id, self.generation,
                 sorted(map(str, add)), sorted(map(str, revoke)))
        self._plan = RebalancePlan(revoke=revoke, assign=add, rejoin_after=rejoin, completes=True)
        self._to(MemberState.PREPARE_REVOCATION)
        self._next_heartbeat = now + self.settings.heartbeat_interval
        self._advance(now)

    # -- Heartbeat --------------------------------------------------------------------------------

    def _heartbeat_request(self, node: int) -> UnsentRequest:
        self._heartbeat_in_flight = True
        settings = self.settings
        generation, member_id = self.generation, self.member_id

        def build(version: int) -> Body:
            return {"group_id": settings.group_id, "generation_id": generation, "member_id": member_id,
                    "group_instance_id": settings.group_instance_id}

        def on_response(now: float, version: int, body: Body) -> None:
            self._heartbeat_in_flight = False
            self._next_heartbeat = now + settings.heartbeat_interval
            code = body["error_code"]
            if code == 0 or generation != self.generation:
                return
            if code == RebalanceInProgressError.code:
                if self.state is MemberState.STABLE:
                    self.request_rejoin("the coordinator started a rebalance")
                else:
                    self._rejoin_requested = True
            elif code in (IllegalGenerationError.code, UnknownMemberIdError.code):
                if code == UnknownMemberIdError.code:
                    self.member_id = ""
                self._lose_partitions(error_for_code(code).error_name)
            elif code == FencedInstanceIdError.code:
                self._fenced(now)
            elif code in COORDINATOR_CODES:
                self._coordinator.mark_unknown(now, error_for_code(code))
            else:
                self._hooks.report_error(error_for_code(code, f"Heartbeat for group {settings.group_id!r}"))

        def on_error(now: float, error: BaseException) -> None:
            self._heartbeat_in_flight = False
            self._next_heartbeat = now + settings.retry_backoff
            self._coordinator.mark_unknown(now, error)

        return UnsentRequest("Heartbeat", build, on_response, on_error, node_id=node)

    # -- LeaveGroup -------------------------------------------------------------------------------

    def _leave(self, now: float, node: int) -> list[UnsentRequest]:
        if not self.member_id or self._remains:
            self._left()  # staying (a static member by default, KIP-1092's remain_in_group): no LeaveGroup
            return []
        self._in_flight = True
        settings, member_id, reason = self.settings, self.member_id, self._leave_reason

        def build(version: int) -> Body:
            if version >= 3:
                return {"group_id": settings.group_id, "members": [
                    {"member_id": member_id, "group_instance_id": settings.group_instance_id, "reason": reason}]}
            return {"group_id": settings.group_id, "member_id": member_id}

        def on_response(now: float, version: int, body: Body) -> None:
            self._leave_answered()

        def on_error(now: float, error: BaseException) -> None:
            log.info("LeaveGroup for %r failed (%s); the session times out instead", settings.group_id, error)
            self._leave_answered()

        return [UnsentRequest("LeaveGroup", build, on_response, on_error, node_id=node)]

    def _leave_answered(self) -> None:
        if self.state is MemberState.FENCED:
            # Fenced while LeaveGroup was in flight (a Heartbeat answered FENCED_INSTANCE_ID): final.
            self._in_flight = False
            return
        self._left()

    def _fenced(self, now: float) -> None:
        self._fatal_code(now, FencedInstanceIdError.code)

