"""Group membership for the consumer group protocol (KIP-848, ``group_protocol="consumer"``).

One RPC, ``ConsumerGroupHeartbeat``, does joining, heartbeating and leaving;
the coordinator computes the assignment and hands each member its *target*
(topic ids and partitions).  The member reconciles towards it one step at a
time and tells the coordinator what it owns in its next heartbeat:

    UNSUBSCRIBED ──subscribe──► JOINING (epoch 0) ──response──► STABLE
                                    ▲                              │ new target assignment
                                    │                              ▼
        LOST ◄── FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID     PREPARE_REVOCATION ─► REVOKING_PARTITIONS
                                                                    │ (owned - target; callback, deadline)
                                                                    ▼
        STABLE ◄── ASSIGNING_PARTITIONS (target - owned; callback) ◄── PARTITIONS_REVOKED

    leave(): revoke everything ─► LEAVING (epoch -1, or -2 for a static member) ─► UNSUBSCRIBED
             (close(membership=...), KIP-1092: "leave_group" sends -1 for a static member too;
              "remain_in_group" sends -2, or for a dynamic member nothing at all)

A sans-I/O state machine with the same public surface as the classic
:class:`~asyncconsumer.managers.membership.MembershipManager`, so the engine
can drive either.  ``generation`` is the member epoch (-1 outside the group,
0 while joining).  Heartbeats carry only the fields that changed since the
coordinator last accepted one; after any error the next one is complete again.
Assigned topic ids missing from our metadata stay pending (a metadata refresh
is asked for) while the rest of the assignment is reconciled.  Every state
transition is checked against ``membership_types.CONSUMER_TRANSITIONS``, logged at
debug level and kept in ``transitions``; the callback steps, ``subscribe``/``leave``
and liveness are the core shared with the classic manager (``member_base``).
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any

from ..errors import (
    COORDINATOR_CODES,
    MEMBER_FATAL_CODES,
    FencedMemberEpochError,
    InvalidRegularExpressionError,
    KafkaError,
    UnknownMemberIdError,
    UnsupportedVersionError,
    error_for_code,
)
from ..structs import TopicPartition
from .coordinator import CoordinatorManager
from .member_base import GroupMemberBase
from .membership_types import (
    CONSUMER_TRANSITIONS,
    GroupSettings,
    MemberHooks,
    MemberState,
    RebalancePlan,
)
from .metadata import MetadataManager
from .requests import Body, UnsentRequest
from .subscription import SubscriptionState

log = logging.getLogger("asyncconsumer.membership")

# Member epochs with a meaning of their own.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

#: A partition of the target assignment, as the coordinator names it.
IdPartition = tuple[bytes, int]

#: ConsumerGroupHeartbeat v1: the member names itself (KIP-1082) and may send a regex (KIP-848).
_CLIENT_MEMBER_ID_VERSION = 1


def new_member_id() -> str:
    """A member id of the client's own (KIP-1082), kept for the consumer's lifetime: 16 random
    bytes in URL-safe base64 without padding, the form Kafka's own clients use."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class ConsumerMembershipManager(GroupMemberBase):
    """KIP-848 membership: the coordinator assigns, the member reconciles and acknowledges."""

    group_protocol = "consumer"
    allowed_transitions = CONSUMER_TRANSITIONS

    def __init__(
        self,
        settings: GroupSettings,
        coordinator: CoordinatorManager,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        hooks: MemberHooks,
        *,
        rack_id: str | None = None,
        server_assignor: str | None = None,
    ) -> None:
        super().__init__(settings, coordinator, subscriptions, metadata, hooks)
        self.rack_id = rack_id or None
        #: Name of a broker-side assignor ("uniform", "range"); ``None`` lets the coordinator choose.
        self.server_assignor = server_assignor
        #: The broker has no ConsumerGroupHeartbeat (Kafka < 4.0 or KIP-848 disabled): use the classic protocol.
        self.unsupported = False
        #: Why (the broker's error, naming ConsumerGroupHeartbeat and the broker's release).
        self.unsupported_detail = ""
        self.heartbeat_interval = settings.heartbeat_interval
        # Target assignment from the coordinator (None: nothing received since joining).
        self._target: frozenset[IdPartition] | None = None
        #: A target was reconciled since the last join (the first one is reported even when empty).
        self._reconciled = False
        self._needs_reconcile = False
        self._unresolved: frozenset[IdPartition] = frozenset()
        self._resolved_at_version = -1
        self._metadata_retry_at = 0.0
        # Topic ids of the topics we own partitions of (heartbeats name partitions by id).
        self._topic_ids: dict[str, bytes] = {}
        # Heartbeat fields the coordinator accepted last (None: send every field).
        self._acked: dict[str, Any] | None = None
        self._session = 0
        #: Our own member id, sent from the first heartbeat on v1+ (v0: the coordinator names us).
        self.client_member_id = new_member_id()
        #: The ConsumerGroupHeartbeat version of the last request built (-1: none yet).
        self.version = -1
        #: The broker rejected the pattern as a regex (RE2/J syntax): it is matched here instead.
        self._regex_rejected: str | None = None
        #: The coordinator accepted a heartbeat carrying our regex (it resolves the topics itself).
        self.broker_regex = False

    # -- state ------------------------------------------------------------------------------------

    #: Member epochs start at 1 (0 only asks to join).
    _first_generation = 1
    _group_size_setting = "group.consumer.max.size"

    def topics_of_interest(self) -> frozenset[str]:
        return self.topics

    @property
    def pending_topic_ids(self) -> frozenset[IdPartition]:
        """Assigned partitions whose topic ids our metadata does not know yet."""
        return self._unresolved

    # -- application requests ---------------------------------------------------------------------

    #: A member that is leaving joins again once it has left.
    _subscribe_waits_for_leave = True

    def _subscription_changed(self) -> None:
        # No rejoin in this protocol: the next heartbeat carries the new subscription.
        self._next_heartbeat = 0.0

    def _pattern_topics_changed(self) -> None:
        # On v1+ the coordinator resolves the regex itself (SubscribedTopicRegex) and these names
        # are not sent; on v0, or for a pattern the broker rejected, they are the subscription.
        if not self._regex_on_broker(self.version):
            self._next_heartbeat = 0.0

    def _regex_on_broker(self, version: int) -> bool:
        """The subscription is a regex the coordinator resolves (v1+, and it accepted the regex)."""
        pattern = self.pattern
        return (pattern is not None and version >= _CLIENT_MEMBER_ID_VERSION
                and pattern.pattern != self._regex_rejected)

    def on_metadata(self) -> None:
        """New metadata may name topic ids of the target assignment we could not resolve before."""
        if self._unresolved:
            self._needs_reconcile = True

    def enforce_rebalance(self, reason: str) -> None:
        """Nothing, as in the Java client: with KIP-848 the coordinator alone decides when
        partitions move, and a member has no way to ask for a rebalance."""
        log.warning("group %r: enforce_rebalance(%r) does nothing with group_protocol='consumer' (KIP-848: the "
                    "coordinator decides when partitions move); the Java client ignores it too",
                    self.settings.group_id, reason)

    def request_rejoin(self, reason: str) -> None:
        """The coordinator drives rebalances here; all a member can do is resend its full state."""
        log.info("group %r: resending the full member state (%s)", self.settings.group_id, reason)
        self._acked = None
        self._next_heartbeat = 0.0

    def _drop_rebalance_for_leave(self) -> bool:
        self._target, self._unresolved, self._needs_reconcile = None, frozenset(), False
        if self.state is MemberState.LEAVING or self._plan.lost:
            return False  # already on the way out (fenced: partitions are being lost, then nothing to leave)
        self._callback = None  # one revoke callback for everything, instead of the one pending
        return True

    # -- membership changes -----------------------------------------------------------------------

    def _join(self) -> None:
        self._reconciled = False
        self.generation = JOIN_EPOCH
        self._acked = None
        self._target, self._unresolved, self._needs_reconcile = None, frozenset(), False
        self._to(MemberState.JOINING)

    def _drop_all(self, now: float) -> None:
        """Give up every partition at once (nobody waits for the LOST callback) and forget the plan."""
        self._lost_membership()
        self._session += 1
        if self._plan.lost and self._callback is not None:
            # The application was told already (a LOST callback is pending): drop without telling again.
            self._subscriptions.remove(self.owned)
            self._hooks.drop_buffered(self.owned)
            self.owned = frozenset()
            self._callback = None
        else:
            super()._drop_all(now)
        self._topic_ids.clear()
        self._plan = RebalancePlan()
        self._target, self._unresolved, self._needs_reconcile = None, frozenset(), False

    def _lose_partitions(self, now: float, error: KafkaError, *, forget_member_id: bool) -> None:
        """Fenced by the coordinator: partitions are lost (no commit), then rejoin with epoch 0."""
        log.warning("group %r member %s: %s; partitions lost, rejoining", self.settings.group_id,
                    self.member_id or "-", error)
        self._lost_membership()
        self._session += 1
        if forget_member_id:
            self.member_id = ""
        self.generation = JOIN_EPOCH
        self._acked = None
        self._callback = None
        self._target, self._unresolved, self._needs_reconcile = None, frozenset(), False
        self._plan = RebalancePlan(revoke=self.owned, lost=True)
        self._to(MemberState.LOST)
        self._advance(now)

    # -- reconciliation ---------------------------------------------------------------------------

    def _resolve(self) -> tuple[frozenset[TopicPartition], frozenset[IdPartition]]:
        """The target as partitions we can name, and the rest (topic ids unknown to our metadata)."""
        assert self._target is not None
        cluster = self._metadata.cluster
        owned_names = {topic_id: name for name, topic_id in self._topic_ids.items()}
        names: dict[bytes, str | None] = {}
        wanted: set[TopicPartition] = set()
        unresolved: set[IdPartition] = set()
        for topic_id, partition in self._target:
            if topic_id not in names:
                names[topic_id] = cluster.topic_name(topic_id) or owned_names.get(topic_id)
            name = names[topic_id]
            if name is None:
                unresolved.add((topic_id, partition))
            else:
                wanted.add(TopicPartition(name, partition))
        for topic_id, name in names.items():
            if name is not None:
                self._topic_ids[name] = topic_id
        return frozenset(wanted), frozenset(unresolved)

    def _reconcile(self, now: float) -> bool:
        """In STABLE: start moving towards the target; False when there is nothing to do."""
        metadata_moved = bool(self._unresolved) and self._metadata.version != self._resolved_at_version
        if self._target is None or not (self._needs_reconcile or metadata_moved):
            self._maybe_refresh_metadata(now)
            return False
        self._needs_reconcile = False
        wanted, unresolved = self._resolve()
        self._unresolved = unresolved
        self._resolved_at_version = self._metadata.version
        if unresolved:
            log.info("group %r: assigned topic ids %s are not in our metadata yet; waiting for a refresh",
                     self.settings.group_id, sorted({tid.hex() for tid, _ in unresolved}))
            self._maybe_refresh_metadata(now)
        revoke = self.owned - wanted
        assign = wanted - self.owned
        if not revoke and not assign and self._reconciled:
            return False
        self._reconciled = True  # the first target after a join is news, even an empty one
        log.info("group %r epoch %d: assigned %s, revoked %s", self.settings.group_id, self.generation,
                 sorted(map(str, assign)), sorted(map(str, revoke)))
        self._plan = RebalancePlan(revoke=revoke, assign=assign, completes=True)
        self._to(MemberState.PREPARE_REVOCATION)
        return True

    def _maybe_refresh_metadata(self, now: float) -> None:
        if self._unresolved and now >= self._metadata_retry_at:
            self._metadata.request_update()
            self._metadata_retry_at = now + max(self.settings.retry_backoff, 1.0)

    def _after_revocation(self, now: float, revoked: frozenset[TopicPartition]) -> None:
        if revoked:
            for topic in {tp.topic for tp in revoked} - {tp.topic for tp in self.owned}:
                self._topic_ids.pop(topic, None)
            self._next_heartbeat = now  # acknowledge the revocation at once

    def _rejoin_after_revocation(self) -> bool:
        if not self._plan.lost:
            return False
        self._plan = RebalancePlan()
        self._join()  # the lost partitions are gone: join again with epoch 0
        return True

    # -- the manager protocol ---------------------------------------------------------------------

    def _protocol_deadlines(self, now: float) -> list[float]:
        times = []
        if self._unresolved and self.state is MemberState.STABLE:
            times.append(self._metadata_retry_at)
        if self._coordinator.node_id is not None and not self._in_flight:
            if self.state in (MemberState.JOINING, MemberState.LEAVING):
                times.append(self._retry_at)
            elif self._heartbeating():
                times.append(max(self._retry_at, self._next_heartbeat))
        return times

    def poll(self, now: float) -> list[UnsentRequest]:
        self._advance(now)
        node = self._coordinator.node_id
        if self.state is MemberState.LEAVING and not self._in_flight and self.generation <= 0:
            self._left()  # never became a member (or fenced meanwhile): nothing to tell the coordinator
            return []
        static = self.settings.group_instance_id is not None
        if self.state is MemberState.LEAVING and not self._in_flight and self._remains and not static:
            # A dynamic member staying (close(membership="remain_in_group"), KIP-1092): no leave
            # heartbeat; the coordinator keeps it, and its partitions, until its session times out.
            self._left()
            return []
        if node is None or self._in_flight or now < self._retry_at:
            return []
        if self.state is MemberState.JOINING:
            return [self._heartbeat_request(node, JOIN_EPOCH)]
        if self.state is MemberState.LEAVING:
            # -2: a static member stays (KIP-345), its partitions kept for its session; -1: it leaves.
            return [self._heartbeat_request(node, STATIC_LEAVE_EPOCH if self._remains else LEAVE_EPOCH)]
        if self._heartbeating() and now >= self._next_heartbeat:
            return [self._heartbeat_request(node, self.generation)]
        return []

    # -- ConsumerGroupHeartbeat -------------------------------------------------------------------

    def _owned_by_id(self) -> list[Body]:
        # Partitions whose assigned callback is still running are not acknowledged yet.
        owned = self.owned
        if self.state is MemberState.ASSIGNING_PARTITIONS:
            owned -= self._plan.assign
        by_id: dict[bytes, list[int]] = {}
        for tp in owned:
            by_id.setdefault(self._topic_ids[tp.topic], []).append(tp.partition)
        return [{"topic_id": tid, "partitions": sorted(parts)} for tid, parts in sorted(by_id.items())]

    def _fields(self, version: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "instance_id": self.settings.group_instance_id,
            "rack_id": self.rack_id,
            "rebalance_timeout_ms": self.settings.rebalance_timeout_ms,
            "subscribed_topic_names": sorted(self.topics),
            "server_assignor": self.server_assignor,
            "topic_partitions": self._owned_by_id(),
        }
        if version >= _CLIENT_MEMBER_ID_VERSION:
            # A regex goes to the coordinator as it is, which resolves it (RE2/J, whole-name match,
            # new topics included); "" clears one sent before.
            if self._regex_on_broker(version):
                assert self.pattern is not None
                fields["subscribed_topic_names"] = []
                fields["subscribed_topic_regex"] = self.pattern.pattern
            else:
                fields["subscribed_topic_regex"] = ""
        return fields

    def _heartbeat_request(self, node: int, epoch: int) -> UnsentRequest:
        self._in_flight = True
        settings, session = self.settings, self._session
        leaving = epoch < 0
        sent: dict[str, Any] = {}

        def build(version: int) -> Body:
            self.version = version
            # v1+: our own id from the first heartbeat on, for good (KIP-1082); v0: the coordinator's.
            member_id = self.member_id or (self.client_member_id if version >= _CLIENT_MEMBER_ID_VERSION else "")
            body: Body = {"group_id": settings.group_id, "member_id": member_id, "member_epoch": epoch}
            if leaving:
                # The coordinator needs the instance id to keep a static member's assignment (-2).
                body["instance_id"] = settings.group_instance_id
                return body
            fields = self._fields(version)
            acked = None if epoch == JOIN_EPOCH else self._acked
            sent.clear()
            sent.update(fields)
            for name, value in fields.items():
                if name == "subscribed_topic_regex" and value == "" and not (acked or {}).get(name):
                    body[name] = None  # never subscribed by regex (as far as the coordinator knows)
                elif acked is None or acked.get(name) != value:
                    body[name] = value
                elif name == "rebalance_timeout_ms":
                    body[name] = -1  # unchanged
                else:
                    body[name] = None  # unchanged
            return body

        def on_response(now: float, version: int, body: Body) -> None:
            self._in_flight = False
            if self.state is MemberState.FENCED:
                return
            if leaving:
                self._left()
                return
            code = body["error_code"]
            if code == 0:
                self._on_success(now, body, sent, stale=session != self._session)
            elif session == self._session or code in MEMBER_FATAL_CODES or code == UnsupportedVersionError.code:
                self._on_error_code(now, code, body.get("error_message"))

        def on_error(now: float, error: BaseException) -> None:
            self._in_flight = False
            if self.state is MemberState.FENCED:
                return
            if leaving:
                log.info("leaving group %r failed (%s); the session times out instead", settings.group_id, error)
                self._left()
                return
            if isinstance(error, UnsupportedVersionError):
                self._unsupported(now, str(error))
                return
            log.debug("ConsumerGroupHeartbeat for group %r failed: %s", settings.group_id, error)
            self._acked = None
            self._retry_at = now + settings.retry_backoff
            if isinstance(error, KafkaError) and error.retriable:
                self._coordinator.mark_unknown(now, error)

        return UnsentRequest("ConsumerGroupHeartbeat", build, on_response, on_error, node_id=node)

    def _on_success(self, now: float, body: Body, sent: dict[str, Any], *, stale: bool) -> None:
        self._error_count = 0
        if body["member_id"]:
            self.member_id = body["member_id"]
        if self.state is MemberState.FENCED or (stale and not self._leaving):
            return
        self.generation = body["member_epoch"]
        self._joined()
        if body["heartbeat_interval_ms"] > 0:
            self.heartbeat_interval = body["heartbeat_interval_ms"] / 1000
        self._acked = dict(sent)
        self.broker_regex = bool(sent.get("subscribed_topic_regex"))
        # Something changed while this heartbeat was out (owned partitions, subscription): say so at once.
        self._next_heartbeat = now if self._fields(self.version) != sent else now + self.heartbeat_interval
        if self._leaving:
            return  # going anyway: the leave heartbeat goes out next
        if self.state is MemberState.JOINING:
            log.info("group %r joined: member %s, epoch %d", self.settings.group_id, self.member_id, self.generation)
            self._to(MemberState.STABLE)
            self._target = frozenset()  # a join starts from nothing; the response normally says what to own
            self._needs_reconcile = True
        assignment = body["assignment"]
        if assignment is not None:
            self._target = frozenset(
                (t["topic_id"], p) for t in assignment["topic_partitions"] for p in t["partitions"]
            )
            self._needs_reconcile = True
        self._advance(now)

    def _on_error_code(self, now: float, code: int, message: str | None) -> None:
        settings = self.settings
        error = error_for_code(code, message or f"ConsumerGroupHeartbeat for group {settings.group_id!r}")
        self._acked = None  # the next heartbeat carries every field
        if code == UnsupportedVersionError.code:
            self._unsupported(now, str(error))
        elif code in (FencedMemberEpochError.code, UnknownMemberIdError.code):
            if self._leaving:
                self.generation = JOIN_EPOCH  # no longer a member: nothing to leave
            else:
                # KIP-848: a fenced epoch rejoins with the same member id; an unknown one gets a new id (v0).
                self._lose_partitions(now, error, forget_member_id=code == UnknownMemberIdError.code)
        elif code in MEMBER_FATAL_CODES:
            self._fatal_code(now, code)
        elif code == InvalidRegularExpressionError.code and self.pattern is not None:
            # The coordinator's RE2/J does not take this Python regex (lookarounds, backreferences,
            # ...): match it against our metadata instead and send the topic names, as v0 does.
            log.warning("group %r: the broker rejected the pattern %r as a regular expression (%s); matching it "
                        "in the client instead (topics are sent by name)", settings.group_id, self.pattern.pattern,
                        message)
            self._regex_rejected = self.pattern.pattern
            self._retry_at = now
        elif code in COORDINATOR_CODES:
            self._coordinator.mark_unknown(now, error)
            self._retry_at = now + settings.retry_backoff
        else:
            # UNRELEASED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, INVALID_REQUEST, GROUP_AUTHORIZATION_FAILED, ...:
            # tell the application, and try again later (with a growing pause so errors do not flood it).
            self._retry_at = self._error_backoff(now)
            self._hooks.report_error(error)

    def _unsupported(self, now: float, detail: str) -> None:
        self.unsupported = True
        self.unsupported_detail = detail
        self._fatal(now, UnsupportedVersionError(
            f'group_protocol="consumer" needs a broker with the KIP-848 consumer group protocol (Apache Kafka 4.0 '
            f"or newer, ConsumerGroupHeartbeat enabled); group {self.settings.group_id!r} cannot use it ({detail}). "
            f'Set group_protocol="classic" for this cluster'
        ))

    def _forget_session(self) -> None:
        self._session += 1
        self._acked = None
