"""No silent stalls: a partition the consumer should be reading, and is not, is named in a WARNING.

A partition is *expected to progress* while it is assigned, not paused, not being revoked, not
held at its ``Consumer.fetch_until()`` limit, and has less than its share of the fetch buffer
buffered (with the buffer full: nothing buffered): the fetch manager would fetch it, or first look
up its position.  Each check, a partition that was not
expected is quiet from now on; one that was is quiet since the later of that moment and its last
fetch answered without an error (``FetchManager.answered``).  A partition quiet for longer than
``ConsumerConfig.quiet_partition_warning_s`` is *stuck*: one WARNING per broker names the stuck
partitions, the broker (address and connection state) and the reason, as far as the consumer knows
it, in the order it would look:

- its position is being looked up: the committed offset from the group coordinator, an offset
  reset (ListOffsets) or a validation (OffsetForLeaderEpoch);
- no leader is known for it (metadata);
- it is backing off after an error (named);
- a fetch to its broker has been in flight for so long;
- its broker's connection: being opened, or failing (attempts, last error, next attempt).

A partition is warned about once per quiet spell; when it is answered again an INFO line says after
how long.  The checks run at most every half second, so their cost does not grow with the fetch
rate.  Sans-I/O: the loop calls :meth:`StallWatch.check` with the time; what it knows of brokers
and the coordinator comes from the two ``describe`` callables the engine passes in.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from ..structs import TopicPartition
from .fetch import FetchManager
from .fetch_buffer import FetchBuffer
from .subscription import PartitionPhase, PartitionState, SubscriptionState

log = logging.getLogger("asyncconsumer.fetch")

#: The longest time between two checks, in seconds.
CHECK_INTERVAL = 0.5


def check_interval(quiet_after: float) -> float:
    """The time between two checks of a watch whose bound is ``quiet_after``: a partition quiet for
    just over the bound is named at most this much later."""
    return min(CHECK_INTERVAL, quiet_after / 4)


#: Position lookups, by phase: what the partition is waiting for.
_WAITING_FOR = {
    PartitionPhase.AWAIT_COMMITTED: "waiting for its committed offset from the group coordinator",
    PartitionPhase.AWAIT_RESET: "waiting for an offset reset (ListOffsets)",
    PartitionPhase.AWAIT_VALIDATION: "waiting for its position to be validated (OffsetForLeaderEpoch)",
}


class StallWatch:
    def __init__(
        self,
        subscriptions: SubscriptionState,
        fetcher: FetchManager,
        buffer: FetchBuffer,
        *,
        quiet_after: float,
        describe_node: Callable[[int], str],
        describe_coordinator: Callable[[], str],
        leader_of: Callable[[TopicPartition], int | None],
    ) -> None:
        self._subscriptions = subscriptions
        self._fetcher = fetcher
        self._buffer = buffer
        self.quiet_after = quiet_after
        self._describe_node = describe_node
        self._describe_coordinator = describe_coordinator
        self._leader_of = leader_of
        #: Partition -> since when it has been expected to progress (reset when it was not).
        self._expected_since: dict[TopicPartition, float] = {}
        #: Partition -> the start of the quiet spell a WARNING named.
        self.warned: dict[TopicPartition, float] = {}
        self._next_check = 0.0
        #: ``SubscriptionState.assignment_id`` when unassigned partitions were last forgotten.
        self._assignment_seen = -1

    def check(self, now: float) -> None:
        if now < self._next_check:
            return
        self._next_check = now + check_interval(self.quiet_after)
        partitions = self._subscriptions.partitions
        answered = self._fetcher.answered
        self._forget_unassigned(partitions, answered)
        share = self._fetcher.read_ahead_bytes()
        full = self._buffer.full
        buffered_by_tp = self._buffer.bytes_by_partition
        expected_since = self._expected_since
        warned = self.warned
        quiet_after = self.quiet_after
        stuck: dict[int | None, list[tuple[TopicPartition, float, str]]] = defaultdict(list)
        # Every assigned partition, twice a second, so ``PartitionState.fetch_limited`` and
        # ``FetchBuffer.buffered_bytes`` are written out: about 0.3 us a partition.
        for tp, state in partitions.items():
            buffered = buffered_by_tp.get(tp, 0) if buffered_by_tp else 0
            if (
                state.paused
                or state.revoking
                or (state.fetch_end is not None and state.fetch_offset >= state.fetch_end)
                or (buffered and (full or buffered >= share))
            ):
                expected_since[tp] = now  # the application holds it, not the consumer
                if warned and warned.pop(tp, None) is not None and buffered:
                    log.info("%s fetched again", tp)
                continue
            since = expected_since.get(tp)
            if since is None:
                since = expected_since[tp] = now
            last = answered.get(tp)
            if last is not None and last > since:
                since = last
            if warned and tp in warned:
                if since > warned[tp]:
                    log.info("%s fetched again after %.1fs", tp, since - warned.pop(tp))
                else:
                    continue
            if now - since <= quiet_after:
                continue
            warned[tp] = since
            node = self._fetcher.node_for(tp, now) if state.phase is PartitionPhase.FETCHING else None
            stuck[node].append((tp, now - since, self._reason(tp, state, node, now)))
        for node, entries in stuck.items():
            names = ", ".join(str(tp) for tp, _, _ in entries)
            longest = max(quiet for _, quiet, _ in entries)
            reasons = "; ".join(dict.fromkeys(reason for _, _, reason in entries))
            where = self._describe_node(node) if node is not None else "no broker yet"
            log.warning("no records fetched for %s for %.1fs (%s): %s", names, longest, where, reasons)

    def _forget_unassigned(self, partitions: Mapping[TopicPartition, PartitionState],
                           answered: dict[TopicPartition, float]) -> None:
        """Drop what the watch and the fetch manager keep for partitions no longer assigned: when the
        assignment moved since the last look, and the fetch manager's last errors whenever there
        are some.  A partition in a fetch answered after its revocation stays in ``answered`` until
        the assignment moves again: the walk looks only at assigned partitions."""
        assignment = self._subscriptions.assignment_id
        errors = self._fetcher.last_errors
        tables: tuple[dict[TopicPartition, Any], ...] = (errors,)
        if assignment != self._assignment_seen:
            self._assignment_seen = assignment
            tables = (self._expected_since, self.warned, answered, errors)
        for table in tables:
            if table:
                for gone in [tp for tp in table if tp not in partitions]:
                    del table[gone]

    def _reason(self, tp: TopicPartition, state: PartitionState, node: int | None, now: float) -> str:
        waiting = _WAITING_FOR.get(state.phase)
        if waiting is not None:
            coordinator = f" ({self._describe_coordinator()})" if state.phase is PartitionPhase.AWAIT_COMMITTED else ""
            return waiting + coordinator
        if node is None or self._leader_of(tp) is None:
            return "no leader is known for it (waiting for metadata)"
        error = self._fetcher.last_errors.get(tp)
        if state.retry_at > now:
            return f"backing off for {state.retry_at - now:.1f}s after an error: {error}"
        sent = self._fetcher.in_flight_since.get(node)
        if sent is not None:
            return f"a fetch has been in flight for {now - sent:.1f}s"
        return f"no fetch answered (last error: {error})" if error is not None else "no fetch answered"

