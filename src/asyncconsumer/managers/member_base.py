"""The core both group protocols share: member state, callback steps, the application's view.

``MembershipManager`` (classic JoinGroup/SyncGroup, ``membership.py``) and
``ConsumerMembershipManager`` (KIP-848, ``consumer_membership.py``) are siblings on this core.
They differ in how an assignment arrives, not in how it is applied: both revoke first, wait for
the application's callbacks (with a deadline), then assign.  So the core holds the state machine
(``_to``, checked against the protocol's table in ``membership_types``), the walk through the
callback steps (``_advance``), the application's requests (``subscribe``, ``leave``, pattern
updates), liveness (poll interval, fencing), leaving, and the manager protocol's
``next_deadline``.  A protocol fills in the hooks: how it joins, what it does after a
revocation or an assignment, when it heartbeats, what it waits for.
"""

from __future__ import annotations

import logging
import re
import time
from abc import ABC, abstractmethod
from typing import ClassVar, Literal, get_args

from ..errors import FencedInstanceIdError, KafkaError, PollIntervalExceededError, error_for_code
from ..structs import ConsumerGroupMetadata, TopicPartition
from .commit import GroupIdentity
from .coordinator import CoordinatorManager
from .membership_types import (
    CallbackKind,
    CallbackRequest,
    GroupSettings,
    IllegalStateTransition,
    MemberHooks,
    MemberState,
    RebalancePlan,
    Transitions,
)
from .metadata import MetadataManager
from .subscription import SubscriptionState

log = logging.getLogger("asyncconsumer.membership")
#: States that are not part of a rebalance: entering any other starts one (metrics).
_OUTSIDE_REBALANCE = frozenset({MemberState.UNSUBSCRIBED, MemberState.LEAVING, MemberState.FENCED})

#: Longest wait between retries after an error that is reported to the application.
MAX_ERROR_BACKOFF = 30.0

#: What leaving on ``close()`` does with the membership (KIP-1092, Java's
#: ``CloseOptions.GroupMembershipOperation`` in lower case): "default" (a dynamic member leaves the
#: group, a static one stays in it), "leave_group" (either leaves: its partitions move at once) or
#: "remain_in_group" (either stays: its partitions wait for it until its session times out).
MembershipOperation = Literal["default", "leave_group", "remain_in_group"]
MEMBERSHIP_OPERATIONS: tuple[MembershipOperation, ...] = get_args(MembershipOperation)


class GroupMemberBase(ABC):
    #: The ``group_protocol`` setting this manager implements, and its allowed transitions (``membership_types``).
    group_protocol: ClassVar[str]
    allowed_transitions: ClassVar[Transitions]

    def __init__(
        self,
        settings: GroupSettings,
        coordinator: CoordinatorManager,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        hooks: MemberHooks,
    ) -> None:
        self.settings = settings
        self._coordinator = coordinator
        self._subscriptions = subscriptions
        self._metadata = metadata
        self._hooks = hooks
        self.state = MemberState.UNSUBSCRIBED
        self.member_id = ""
        #: Classic: the group generation.  KIP-848: the member epoch (0 while joining).
        self.generation = -1
        self.topics: frozenset[str] = frozenset()
        self.pattern: re.Pattern[str] | None = None
        self.owned: frozenset[TopicPartition] = frozenset()
        self.transitions: list[tuple[MemberState, MemberState]] = []
        #: Rebalances completed (the stable state reached), when the current one started, how long
        #: the last one took (metrics).
        self.rebalances = 0
        self.rebalance_started: float | None = None
        self.last_rebalance_seconds: float | None = None
        self._callback: CallbackRequest | None = None
        self._plan = RebalancePlan()
        self._leaving = self._force_leave = self._wait_for_poll = False
        self._leave_reason: str | None = None
        self._leave_operation: MembershipOperation = "default"
        self._error_count = 0  # errors in a row reported to the application (for their backoff)
        # KIP-447: the generation and member id of the membership the application's records come
        # from (``group_metadata``), and whether the member lost partitions since it last polled.
        self._fencing = (-1, "")
        self._loss_unseen = False
        #: How many times the partitions were lost (``GroupIdentity.losses``).
        self._losses = 0
        # The group request in flight (JoinGroup/SyncGroup/LeaveGroup, or the KIP-848 heartbeat),
        # the time before which none is sent, and when the next heartbeat is due.
        self._in_flight = False
        self._retry_at = 0.0
        self._next_heartbeat = 0.0

    def _to(self, state: MemberState) -> None:
        """The one place the state changes: only along the protocol's table (staying put is no move)."""
        if state is not self.state:
            if state not in self.allowed_transitions[self.state]:
                raise IllegalStateTransition(self.group_protocol, self.state, state)
            log.debug("group %r member %r generation %d: %s -> %s", self.settings.group_id,
                      self.member_id or "-", self.generation, self.state.name, state.name)
            self.transitions.append((self.state, state))
            if state is MemberState.STABLE:
                if self.rebalance_started is not None:
                    self.last_rebalance_seconds = time.monotonic() - self.rebalance_started
                    self.rebalance_started = None
                self.rebalances += 1
            elif state in _OUTSIDE_REBALANCE:
                self.rebalance_started = None
            elif self.rebalance_started is None:
                self.rebalance_started = time.monotonic()
            self.state = state

    def identity(self) -> GroupIdentity:
        """What offset commits carry: generation (or member epoch) and member id while a member."""
        outside = self.state in (MemberState.UNSUBSCRIBED, MemberState.LEAVING, MemberState.FENCED)
        if outside or self.generation < self._first_generation:
            return GroupIdentity(-1, "", self.settings.group_instance_id, self._losses)
        return GroupIdentity(self.generation, self.member_id, self.settings.group_instance_id, self._losses)

    # -- exactly-once (KIP-447) --------------------------------------------------------------------

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What a transactional producer commits the application's offsets with (KIP-447).

        The generation (member epoch) and member id of the latest membership, as Java's consumers
        report them: never the "no generation, no member id" pair once the member has joined, since
        the broker takes a transactional commit with that pair without any generation check.  A
        member that lost its partitions (fenced, session or poll interval expired, a revocation
        that ran past its deadline) keeps the membership it lost, which the broker refuses, until
        the application has polled since: what it holds until then came from that membership.
        """
        generation, member_id = self._fencing
        return ConsumerGroupMetadata(self.settings.group_id, generation, member_id, self.settings.group_instance_id)

    def _joined(self) -> None:
        """A protocol took a new generation (member epoch) and member id: the application's from now
        on, unless it has not polled since the member lost its partitions."""
        if not self._loss_unseen and self.generation >= self._first_generation:
            self._fencing = (self.generation, self.member_id)

    def _lost_membership(self) -> None:
        """The partitions went without the application giving them up: until it polls again,
        ``group_metadata`` stays with the membership they were lost from."""
        self._loss_unseen = True
        self._losses += 1

    #: The lowest generation that means "a member": classic starts at 0, KIP-848 epochs at 1.
    _first_generation = 0
    #: The broker setting that limits the group's size (named in GROUP_MAX_SIZE_REACHED errors).
    _group_size_setting = "group.max.size"

    @property
    def subscribed(self) -> bool:
        """The application subscribed (and has not unsubscribed since), member or not right now."""
        return bool(self.topics) or self.pattern is not None

    @property
    def dropped_out(self) -> bool:
        """Out of the group by no choice of the application's (poll interval exceeded, fenced):
        what it was handed can no longer be committed."""
        return self._wait_for_poll or self.state is MemberState.FENCED

    @property
    def is_member(self) -> bool:
        """In the group now: partitions it owns are its own (commits carry its generation)."""
        return self.identity().generation >= self._first_generation

    @property
    def wants_all_topics(self) -> bool:
        return self.pattern is not None

    @property
    def leaving(self) -> bool:
        return self._leaving or self.state is MemberState.LEAVING

    # -- application requests ---------------------------------------------------------------------

    #: KIP-848: a subscription made while leaving waits until the member has left (then it joins);
    #: classic: it starts the rebalance steps at once (LeaveGroup still goes out first).
    _subscribe_waits_for_leave = False

    def subscribe(self, topics: frozenset[str], pattern: re.Pattern[str] | None) -> None:
        changed = topics != self.topics or pattern != self.pattern
        self.topics, self.pattern = topics, pattern
        if self.state is MemberState.FENCED or (self._subscribe_waits_for_leave and self.leaving):
            return
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.LEAVING):
            if self.subscribed:
                self._join()
        elif changed:
            self._subscription_changed()

    def update_pattern_topics(self, all_topics: set[str]) -> None:
        """Regex subscriptions follow topics created and deleted: the topics the pattern matches in
        our metadata (what ``subscription()`` shows)."""
        if self.pattern is None:
            return
        matched = frozenset(t for t in all_topics if self.pattern.fullmatch(t))
        if matched != self.topics:
            log.info("pattern %s now matches %s", self.pattern.pattern, sorted(matched))
            self.topics = matched
            self._pattern_topics_changed()

    def leave(self, reason: str, operation: MembershipOperation = "default") -> None:
        """Unsubscribe or close: give up partitions (callbacks run) and leave the group, or with
        ``operation`` (KIP-1092, on close) stay in it: see :data:`MembershipOperation`."""
        self.topics, self.pattern = frozenset(), None
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.FENCED):
            return
        self._leave_reason = reason
        self._leave_operation = operation
        self._leaving = True
        if self._drop_rebalance_for_leave():
            self._plan = RebalancePlan(revoke=self.owned)
            self._to(MemberState.PREPARE_REVOCATION)

    # -- what a protocol fills in (abstract: a sibling without one cannot be made) -------------

    @abstractmethod
    def enforce_rebalance(self, reason: str) -> None:
        """The application asks for a rebalance (``Consumer.enforce_rebalance``)."""

    @abstractmethod
    def _join(self) -> None:
        """Start joining the group (from UNSUBSCRIBED; classic also from LEAVING)."""

    @abstractmethod
    def _subscription_changed(self) -> None:
        """The application subscribed to other topics while in the group."""

    @abstractmethod
    def _pattern_topics_changed(self) -> None:
        """The topics a regex subscription matches changed."""

    @abstractmethod
    def _drop_rebalance_for_leave(self) -> bool:
        """leave(): forget what the rebalance under way would still do; False when the member is
        already on its way out (what is being revoked goes first, then it leaves)."""

    def _after_revocation(self, now: float, revoked: frozenset[TopicPartition]) -> None:
        """PARTITIONS_REVOKED, the revoked partitions gone: the protocol's bookkeeping (none by default)."""
        return

    @abstractmethod
    def _rejoin_after_revocation(self) -> bool:
        """PARTITIONS_REVOKED, not leaving, nothing to assign: join again now (True) or settle."""

    def _rejoin_after_assignment(self) -> bool:
        """ASSIGNING_PARTITIONS acknowledged: join again now (True) or settle in STABLE."""
        return False

    def _reconcile(self, now: float) -> bool:
        """STABLE: start the callback steps again (True), or nothing to do."""
        return False

    @abstractmethod
    def _protocol_deadlines(self, now: float) -> list[float]:
        """When the protocol next needs a turn: a request to send, a retry, a heartbeat."""

    # -- liveness ---------------------------------------------------------------------------------

    def check_poll_interval(self, now: float, last_poll: float, max_interval: float) -> KafkaError | None:
        """Liveness: an application that stops polling loses its partitions and leaves the group.

        Returns the error its next poll raises; the member rejoins on that poll (``on_poll``).
        """
        joined = self.state not in (MemberState.UNSUBSCRIBED, MemberState.FENCED, MemberState.LEAVING)
        if not joined or self._wait_for_poll or now - last_poll <= max_interval:
            return None
        log.warning(
            "group %r: the application did not poll for %.1fs (max_poll_interval_ms=%d); leaving the group — "
            "process faster, poll more often (pause() partitions while busy) or raise max_poll_interval_ms",
            self.settings.group_id, now - last_poll, int(max_interval * 1000),
        )
        self._drop_all(now)
        self._leaving = self._force_leave = self._wait_for_poll = True
        self._leave_reason = f"the application did not poll within max_poll_interval_ms={int(max_interval * 1000)}"
        self._to(MemberState.LEAVING)
        return PollIntervalExceededError(
            f"the consumer did not poll for more than max_poll_interval_ms={int(max_interval * 1000)}: it left "
            f"group {self.settings.group_id!r} and its partitions were reassigned; it rejoins now"
        )

    def on_poll(self) -> None:
        if self._loss_unseen:
            self._loss_unseen = False  # the application hears of the loss in this poll
            self._joined()
        if self._wait_for_poll:
            self._wait_for_poll = False
            if self.state is MemberState.UNSUBSCRIBED and self.subscribed:
                self._join()

    def _drop_all(self, now: float) -> None:
        """Give up every partition at once; the application hears of it (LOST) on its next poll."""
        self._lost_membership()
        lost = self.owned
        if lost:
            self._subscriptions.remove(lost)
            self._hooks.drop_buffered(lost)
            deadline = now + self.settings.rebalance_timeout_ms / 1000  # nobody waits for this one
            self._hooks.run_callback(CallbackRequest(CallbackKind.LOST, lost, deadline, self.generation, acked=True))
        self.owned = frozenset()
        self._callback = None
        self._plan = RebalancePlan()

    # -- errors -----------------------------------------------------------------------------------

    def _fatal_code(self, now: float, code: int) -> None:
        """FENCED_INSTANCE_ID or GROUP_MAX_SIZE_REACHED: this member cannot go on."""
        group, instance = self.settings.group_id, self.settings.group_instance_id
        if code == FencedInstanceIdError.code:
            detail = f"another consumer joined group {group!r} with group_instance_id {instance!r}; this one is fenced"
        else:
            detail = f"group {group!r} is full ({self._group_size_setting} on the broker)"
        self._fatal(now, error_for_code(code, f"{detail} and stops"))

    def _fatal(self, now: float, error: KafkaError) -> None:
        """The member cannot go on (fenced instance id, group full, ...): final.  Its partitions
        are lost, and the application hears of it (LOST, then the error) on its next poll."""
        self._drop_all(now)
        self.generation = -1
        self._leaving = self._force_leave = False
        self._to(MemberState.FENCED)
        self._hooks.report_error(error)

    def _error_backoff(self, now: float) -> float:
        """When to try again after an error reported to the application: the pause grows, so a
        persistent error (authorization, a bad setting) does not flood it."""
        self._error_count += 1
        delay = self.settings.retry_backoff * 2.0 ** min(self._error_count - 1, 16)
        return now + min(MAX_ERROR_BACKOFF, delay)

    # -- the callback steps of a rebalance ---------------------------------------------------------

    def _prepare_revocation(self, now: float) -> None:
        """PREPARE_REVOCATION (or LOST): stop fetching and handing out, then ask the application."""
        revoke = self._plan.revoke
        if not revoke:
            self._to(MemberState.PARTITIONS_REVOKED)
            return
        self._subscriptions.begin_revocation(revoke)
        self._hooks.drop_buffered(revoke)
        self._ask(now, CallbackKind.LOST if self._plan.lost else CallbackKind.REVOKED, revoke)
        self._to(MemberState.REVOKING_PARTITIONS)

    def _apply_revocation(self) -> frozenset[TopicPartition]:
        """PARTITIONS_REVOKED: the acknowledged partitions leave the subscription state."""
        revoked = self._plan.revoke
        if revoked:
            self._subscriptions.remove(revoked)
            self.owned = self.owned - revoked
            self._plan.revoke = frozenset()
        return revoked

    def _start_assignment(self, now: float) -> None:
        """ASSIGNING_PARTITIONS: new partitions join the subscription state, then the application is told."""
        self._to(MemberState.ASSIGNING_PARTITIONS)
        self._subscriptions.add(self._plan.assign)
        self.owned = self.owned | self._plan.assign
        self._ask(now, CallbackKind.ASSIGNED, self._plan.assign)

    def _ask(self, now: float, kind: CallbackKind, partitions: frozenset[TopicPartition]) -> None:
        deadline = now + self.settings.rebalance_timeout_ms / 1000
        self._callback = CallbackRequest(kind, partitions, deadline, self.generation)
        self._hooks.run_callback(self._callback)

    def _callback_done(self, now: float) -> bool:
        callback = self._callback
        if callback is None:
            return True
        if not callback.acked and now < callback.deadline:
            return False
        if not callback.acked:
            log.warning("group %r: %s did not finish within rebalance_timeout_ms; going on without it",
                        self.settings.group_id, callback.kind.value)
            if callback.kind is not CallbackKind.ASSIGNED:
                self._lost_membership()  # the partitions go while the application may still work on them
        self._callback = None
        return True

    def _advance(self, now: float) -> None:
        """Move through the callback steps; stops where a callback or a request is awaited."""
        while True:
            state = self.state
            if state in (MemberState.PREPARE_REVOCATION, MemberState.LOST):
                self._prepare_revocation(now)
            elif state is MemberState.REVOKING_PARTITIONS:
                if not self._callback_done(now):
                    return
                self._to(MemberState.PARTITIONS_REVOKED)
            elif state is MemberState.PARTITIONS_REVOKED:
                self._after_revocation(now, self._apply_revocation())
                if self._leaving and self.owned:
                    self._plan = RebalancePlan(revoke=self.owned)  # what the interrupted rebalance kept
                    self._to(MemberState.PREPARE_REVOCATION)
                elif self._leaving:
                    self._to(MemberState.LEAVING)
                elif self._plan.assign or self._plan.completes:
                    self._start_assignment(now)
                elif not self._rejoin_after_revocation():
                    self._to(MemberState.STABLE)
            elif state is MemberState.ASSIGNING_PARTITIONS:
                if not self._callback_done(now):
                    return
                self._plan.assign = frozenset()
                if not self._rejoin_after_assignment():
                    self._to(MemberState.STABLE)
                    self._next_heartbeat = now  # acknowledge the assignment at once (classic: resume)
            elif state is MemberState.STABLE:
                if not self._reconcile(now):
                    return
            else:
                return

    # -- the manager protocol ---------------------------------------------------------------------

    def next_deadline(self, now: float) -> float:
        times = [float("inf"), *self._protocol_deadlines(now)]
        if self._callback is not None and not self._callback.acked:
            times.append(self._callback.deadline)
        return max(now, min(times))

    def _heartbeating(self) -> bool:
        """A member (classic: generation 0 on; KIP-848: epoch 1 on) that is not joining or leaving."""
        return self.generation >= self._first_generation and self.state in (
            MemberState.STABLE, MemberState.ASSIGNING_PARTITIONS, MemberState.REVOKING_PARTITIONS,
            MemberState.PREPARE_REVOCATION, MemberState.PARTITIONS_REVOKED,
        )

    # -- leaving ----------------------------------------------------------------------------------

    @property
    def _remains(self) -> bool:
        """The member on its way out stays in the group: the coordinator keeps its partitions for
        its session (KIP-345: a restart with the same group_instance_id gets them back quietly).
        By default a static member stays and a dynamic one leaves; ``close(membership=...)``
        chooses either (KIP-1092); one that missed the poll interval always leaves."""
        if self._force_leave:
            return False
        if self._leave_operation == "default":
            return self.settings.group_instance_id is not None
        return self._leave_operation == "remain_in_group"

    def _left(self) -> None:
        """Out of the group (the coordinator answered the leave, or there was nothing to tell it)."""
        self._in_flight = False
        self._leaving = self._force_leave = False
        self.member_id, self.generation, self.owned = "", -1, frozenset()
        self._forget_session()
        self._to(MemberState.UNSUBSCRIBED)
        if self.subscribed and not self._wait_for_poll:
            self._join()  # subscribed again meanwhile

    def _forget_session(self) -> None:
        """_left(): what the protocol keeps about the membership that ended (nothing by default)."""
        return
