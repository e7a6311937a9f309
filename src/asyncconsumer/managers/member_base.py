"""What both group protocols share: member state, callback steps, the application's view.

``MembershipManager`` (classic JoinGroup/SyncGroup) and ``ConsumerMembershipManager``
(KIP-848) differ in how an assignment arrives, not in how it is applied: both
revoke first, wait for the application's callbacks (with a deadline), then
assign — through the helpers here.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from ..errors import KafkaError, PollIntervalExceededError, error_for_code
from ..structs import TopicPartition
from .commit import GroupIdentity
from .coordinator import CoordinatorManager
from .membership_types import CallbackKind, CallbackRequest, GroupSettings, MemberState, RebalancePlan
from .metadata import MetadataManager
from .subscription import SubscriptionState

log = logging.getLogger("asyncconsumer.membership")
#: States that are not part of a rebalance: entering any other starts one (metrics).
_OUTSIDE_REBALANCE = frozenset({MemberState.UNSUBSCRIBED, MemberState.LEAVING, MemberState.FENCED})

GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82

#: Longest wait between retries after an error that is reported to the application.
MAX_ERROR_BACKOFF = 30.0


class GroupMemberBase:
    def __init__(
        self,
        settings: GroupSettings,
        coordinator: CoordinatorManager,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        *,
        run_callback: Callable[[CallbackRequest], None],
        drop_buffered: Callable[[frozenset[TopicPartition]], None],
        report_error: Callable[[KafkaError], None],
    ) -> None:
        self.settings = settings
        self._coordinator = coordinator
        self._subscriptions = subscriptions
        self._metadata = metadata
        self._run_callback = run_callback
        self._drop_buffered = drop_buffered
        self._report_error = report_error
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
        self._error_count = 0  # errors in a row reported to the application (for their backoff)

    def _to(self, state: MemberState) -> None:
        if state is not self.state:
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
            return GroupIdentity(-1, "", self.settings.group_instance_id)
        return GroupIdentity(self.generation, self.member_id, self.settings.group_instance_id)

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
        if self._wait_for_poll:
            self._wait_for_poll = False
            if self.state is MemberState.UNSUBSCRIBED and self.subscribed:
                self._rejoin_after_poll()

    def _drop_all(self, now: float) -> None:
        """Give up every partition at once; the application hears of it (LOST) on its next poll."""
        lost = self.owned
        if lost:
            self._subscriptions.remove(lost)
            self._drop_buffered(lost)
            deadline = now + self.settings.rebalance_timeout_ms / 1000  # nobody waits for this one
            self._run_callback(CallbackRequest(CallbackKind.LOST, lost, deadline, self.generation, acked=True))
        self.owned = frozenset()
        self._callback = None

    def _rejoin_after_poll(self) -> None:
        raise NotImplementedError

    # -- errors -----------------------------------------------------------------------------------

    def _fatal_code(self, now: float, code: int) -> None:
        """FENCED_INSTANCE_ID or GROUP_MAX_SIZE_REACHED: this member cannot go on."""
        group, instance = self.settings.group_id, self.settings.group_instance_id
        if code == FENCED_INSTANCE_ID:
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
        self._report_error(error)

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
        for tp in revoke:
            part = self._subscriptions.get(tp)
            if part is not None:
                part.revoking = True
        self._drop_buffered(revoke)
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
        self._run_callback(self._callback)

    def _callback_done(self, now: float) -> bool:
        callback = self._callback
        if callback is None:
            return True
        if not callback.acked and now < callback.deadline:
            return False
        if not callback.acked:
            log.warning("group %r: %s did not finish within rebalance_timeout_ms; going on without it",
                        self.settings.group_id, callback.kind.value)
        self._callback = None
        return True
