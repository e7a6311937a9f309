"""What this consumer reads: the assignment and each partition's position.

One ``SubscriptionState`` per consumer, shared by the managers and the
application side on the same event loop (mutations never span an ``await``).
``position`` is the next offset handed to the application; ``fetch_offset``
runs ahead of it while fetched data waits in the buffer.  ``epoch`` changes on
every seek/reset so that in-flight fetches for the old position are dropped.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from ..structs import TopicPartition


class PartitionPhase(enum.Enum):
    AWAIT_COMMITTED = "await_committed"  # ask the group coordinator for a committed offset
    AWAIT_RESET = "await_reset"  # look up earliest/latest with ListOffsets
    FETCHING = "fetching"  # position known


@dataclass(slots=True, eq=False)
class PartitionState:
    tp: TopicPartition
    phase: PartitionPhase
    position: int = -1
    fetch_offset: int = -1
    leader_epoch: int | None = None
    reset_to: str | None = None
    paused: bool = False
    #: Being revoked by the group: no longer fetched nor handed out (PREPARE_REVOCATION).
    revoking: bool = False
    epoch: int = 0
    #: Offset after the last record handed to the application (what ``commit()`` commits).
    consumed: int = -1
    #: ``consumed`` as of the application's previous poll: what it has finished with (auto-commit).
    processed: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    retry_at: float = 0.0

    @property
    def has_position(self) -> bool:
        return self.phase is PartitionPhase.FETCHING

    def set_position(self, offset: int, leader_epoch: int | None = None) -> None:
        self.phase = PartitionPhase.FETCHING
        self.position = self.fetch_offset = self.consumed = self.processed = offset
        self.leader_epoch = leader_epoch
        self.reset_to = None
        self.retry_at = 0.0
        self.epoch += 1

    def lag(self) -> int | None:
        if self.high_watermark < 0 or not self.has_position:
            return None
        return max(0, self.high_watermark - self.consumed)


class SubscriptionState:
    def __init__(self, default_reset: str, has_group: bool) -> None:
        self.default_reset = default_reset
        self.has_group = has_group
        self.partitions: dict[TopicPartition, PartitionState] = {}
        #: Bumped on every assignment change; fetches started before are stale.
        self.assignment_id = 0

    def _initial_phase(self) -> PartitionPhase:
        return PartitionPhase.AWAIT_COMMITTED if self.has_group else PartitionPhase.AWAIT_RESET

    def assign(self, tps: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Replace the assignment; returns the partitions that were dropped."""
        wanted = list(dict.fromkeys(tps))
        removed = set(self.partitions) - set(wanted)
        kept = {tp: self.partitions[tp] for tp in wanted if tp in self.partitions}
        for tp in removed:
            self.partitions[tp].epoch += 1  # records taken for the application but not handed out are stale
        self.partitions = {
            tp: kept.get(tp) or PartitionState(tp, self._initial_phase(), reset_to=self.default_reset) for tp in wanted
        }
        if removed or len(kept) != len(wanted):
            self.assignment_id += 1
        return removed

    def add(self, tps: Iterable[TopicPartition]) -> None:
        """Incremental assignment (cooperative rebalances)."""
        self.assign([*self.partitions, *tps])

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        """Incremental revocation (cooperative rebalances, and every revocation before a join)."""
        gone = set(tps)
        self.assign([tp for tp in self.partitions if tp not in gone])

    def get(self, tp: TopicPartition) -> PartitionState | None:
        return self.partitions.get(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.partitions[tp].set_position(offset)

    def request_reset(self, tp: TopicPartition, strategy: str | None = None) -> None:
        state = self.partitions[tp]
        state.phase = PartitionPhase.AWAIT_RESET
        state.reset_to = strategy or self.default_reset
        state.retry_at = 0.0
        state.epoch += 1

    def in_phase(self, phase: PartitionPhase, now: float) -> list[PartitionState]:
        return [s for s in self.partitions.values() if s.phase is phase and s.retry_at <= now]

    def fetchable(self, now: float) -> list[PartitionState]:
        return [
            s
            for s in self.partitions.values()
            if s.phase is PartitionPhase.FETCHING and not s.paused and not s.revoking and s.retry_at <= now
        ]

    def topics(self) -> set[str]:
        return {tp.topic for tp in self.partitions}
