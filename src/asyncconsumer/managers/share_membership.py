"""Share-group membership (KIP-932): the ShareGroupHeartbeat loop, sans-I/O.

A share group has no client-side assignor and no revocation protocol: the member
(id generated here, KIP-1082 style) heartbeats with epoch 0 to join, the broker
answers with its epoch and the partitions it may fetch from, and every later
heartbeat carries the current epoch.  Records are locked per record by the share
partition, not per member, so a changed assignment takes effect at once.  Leaving
is a heartbeat with epoch -1.

Errors: UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH rejoin with epoch 0 (same member
id); coordinator errors look the coordinator up again; anything else is reported
(typed, from ``error_for_code``) and retried after the back-off.  A coordinator
without a ShareGroupHeartbeat version in common (Kafka before 4.1, or share groups
not enabled) ends the membership: :attr:`unsupported` holds the typed error, which
names the broker's release and the missing API, and the application gets it at
every poll from then on (never a silent stall).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import (
    COORDINATOR_CODES,
    FencedMemberEpochError,
    KafkaError,
    UnknownMemberIdError,
    UnsupportedVersionError,
    error_for_code,
)
from ..structs import TopicPartition
from .consumer_membership import new_member_id
from .coordinator import CoordinatorManager
from .requests import Body, UnsentRequest

LEAVE_EPOCH = -1


class ShareMembershipManager:
    def __init__(
        self,
        group_id: str,
        coordinator: CoordinatorManager,
        *,
        topic_name: Callable[[bytes], str | None],
        report_error: Callable[[KafkaError], None],
        retry_backoff: float = 0.1,
        rack_id: str | None = None,
    ) -> None:
        self.group_id = group_id
        self.member_id = new_member_id()
        self.epoch = 0
        self._coordinator = coordinator
        self._topic_name = topic_name
        self._report_error = report_error
        self._retry_backoff = retry_backoff
        self._rack_id = rack_id
        self.subscription: frozenset[str] = frozenset()
        self._sent_subscription: frozenset[str] | None = None
        #: The broker's assignment by topic id (names resolved through metadata when needed).
        self._assigned_ids: dict[bytes, frozenset[int]] = {}
        self.heartbeat_interval = 1.0
        self._next_heartbeat = 0.0
        self._in_flight = False
        self._leaving = False
        self._unsubscribing = False
        self.left = False
        self.last_error: KafkaError | None = None
        #: The coordinator has no ShareGroupHeartbeat in common with this client: no more heartbeats.
        self.unsupported: UnsupportedVersionError | None = None
        #: Bumped whenever the assignment changes (the fetch manager re-reads it).
        self.assignment_version = 0

    # -- application side -------------------------------------------------------------------------

    def subscribe(self, topics: frozenset[str]) -> None:
        if topics and self.left and self.unsupported is None:
            # Subscribed again after unsubscribe(): join anew (epoch 0, the same member id).
            self.left = False
            self._sent_subscription = None
            self._next_heartbeat = 0.0
        if topics != self.subscription:
            self.subscription = topics
            self._next_heartbeat = 0.0  # tell the broker now

    def unsubscribe(self) -> None:
        """Leave the group (epoch -1) and forget the subscription; a later ``subscribe`` joins again
        (at once if it comes while the leave heartbeat is out)."""
        self.subscription = frozenset()
        if not self.left:
            self.leave()
            self._unsubscribing = not self.left  # (never joined: out at once)

    @property
    def leaving(self) -> bool:
        """The leave heartbeat is still to be sent or answered."""
        return self._leaving

    def leave(self) -> None:
        """Send epoch -1 next (after any heartbeat in flight); ``left`` turns true when it is answered."""
        if self.epoch == 0 and not self._in_flight and self._sent_subscription is None:
            self.left = True  # never joined
            return
        self._leaving = True
        self._next_heartbeat = 0.0

    @property
    def unresolved_topic_ids(self) -> set[bytes]:
        return {tid for tid in self._assigned_ids if self._topic_name(tid) is None}

    def assignment(self) -> frozenset[TopicPartition]:
        out: set[TopicPartition] = set()
        for tid, partitions in self._assigned_ids.items():
            name = self._topic_name(tid)
            if name is not None:
                out.update(TopicPartition(name, p) for p in partitions)
        return frozenset(out)

    @property
    def is_member(self) -> bool:
        return self.epoch > 0 and not self._leaving and not self.left

    @property
    def state(self) -> str:
        """``"joining"`` (no member epoch yet), ``"stable"``, ``"leaving"`` or ``"left"`` (metrics)."""
        if self.left:
            return "left"
        if self._leaving:
            return "leaving"
        return "stable" if self.epoch > 0 else "joining"

    # -- RequestManager -----------------------------------------------------------------------------

    def next_deadline(self, now: float) -> float:
        if self._in_flight or self.left or self.unsupported or (not self.subscription and not self._leaving):
            return float("inf")
        return self._next_heartbeat

    def poll(self, now: float) -> list[UnsentRequest]:
        if self.unsupported is not None:
            self.left = self.left or self._leaving  # nothing to leave: never a member
            return []
        if self._in_flight or self.left or now < self._next_heartbeat:
            return []
        if not self.subscription and not self._leaving:
            return []
        node = self._coordinator.node_id
        if node is None:
            return []
        leaving = self._leaving
        epoch = LEAVE_EPOCH if leaving else self.epoch
        full = self.epoch == 0 or self._sent_subscription != self.subscription
        topics = sorted(self.subscription) if full and not leaving else None
        self._in_flight = True

        def build(version: int) -> Body:
            return {
                "group_id": self.group_id,
                "member_id": self.member_id,
                "member_epoch": epoch,
                "rack_id": self._rack_id,
                "subscribed_topic_names": topics,
            }

        def on_response(now: float, version: int, body: Body) -> None:
            self._in_flight = False
            self._handle(now, body, leaving, topics)

        def on_error(now: float, error: BaseException) -> None:
            self._in_flight = False
            if leaving:
                self._left_group()  # best effort: the session timeout removes us otherwise
                return
            if isinstance(error, UnsupportedVersionError):
                self._unsupported(error)
                return
            self._coordinator.mark_unknown(now, error)
            self._next_heartbeat = now + self._retry_backoff

        return [UnsentRequest("ShareGroupHeartbeat", build, on_response, on_error, node_id=node)]

    def _left_group(self) -> None:
        self.left = True
        self._leaving = False
        self.epoch = 0
        if self._assigned_ids:
            self._assigned_ids = {}
            self.assignment_version += 1
        if self._unsubscribing:
            self._unsubscribing = False
            if self.subscription:  # subscribed again while leaving: join anew
                self.subscribe(self.subscription)

    def _unsupported(self, error: UnsupportedVersionError) -> None:
        self.unsupported = UnsupportedVersionError(
            f"share group {self.group_id!r} cannot be joined: {error.detail or error}. Share groups (KIP-932) need "
            "Apache Kafka 4.1 or newer with share groups enabled (on by default from 4.2; 4.1: the share.version "
            "feature)"
        )
        self.last_error = self.unsupported
        self._report_error(self.unsupported)

    def _handle(self, now: float, body: Body, leaving: bool, topics: list[str] | None) -> None:
        code = body["error_code"]
        if leaving:
            self._left_group()
            return
        if code in COORDINATOR_CODES:
            self._coordinator.mark_unknown(now, error_for_code(code, body.get("error_message")))
            self._next_heartbeat = now + self._retry_backoff
            return
        if code in (UnknownMemberIdError.code, FencedMemberEpochError.code):
            self.epoch = 0  # rejoin with the same id; the broker hands the partitions out again
            self._sent_subscription = None
            self._next_heartbeat = now
            if self._assigned_ids:
                self._assigned_ids = {}
                self.assignment_version += 1
            return
        if code != 0:
            error = error_for_code(code, body.get("error_message"))
            self.last_error = error
            self._report_error(error)
            self._next_heartbeat = now + max(self._retry_backoff, self.heartbeat_interval)
            return
        self.last_error = None
        if topics is not None:
            self._sent_subscription = frozenset(topics)
        if body.get("member_id"):
            self.member_id = body["member_id"]
        self.epoch = body["member_epoch"]
        if body["heartbeat_interval_ms"] > 0:
            self.heartbeat_interval = body["heartbeat_interval_ms"] / 1000
        self._next_heartbeat = now + self.heartbeat_interval
        assignment = body.get("assignment")
        if assignment is not None:
            new = {tp["topic_id"]: frozenset(tp["partitions"]) for tp in assignment["topic_partitions"]}
            if new != self._assigned_ids:
                self._assigned_ids = new
                self.assignment_version += 1
