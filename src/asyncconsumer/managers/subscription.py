"""What this consumer reads: the assignment and each partition's position.

One ``SubscriptionState`` per consumer, shared by the managers and the
application side on the same event loop (mutations never span an ``await``).
``epoch`` changes on every seek/reset so that in-flight fetches for the old
position are dropped.

Each partition's offsets, once its position is known, keep

    processed <= consumed <= position <= fetch_offset

- ``fetch_offset``: the next offset to fetch; runs ahead while fetched data waits in the buffer.
- ``position``: the next offset to take from the buffer (records before it are taken: handed
  out, or waiting in a chunk or a partition stream to be).
- ``consumed``: the offset after the last record handed to the application (what ``commit()``
  commits).
- ``processed``: ``consumed`` as of the application's previous poll (what auto-commit commits).

Only this module writes them: the fetch manager says what it fetched (``fetched``), the
application side speaks a small vocabulary (``taken``, ``handed_out``, ``finished``,
``committed_through``, and ``rewind`` to put records back), and seeks, resets and validation set
the position (``set_position``, ``await_validation``).  Each keeps the order above.  The
exceptions are the two per-record ``async for`` steps, which inline ``handed_out`` for a record
of a live chunk: ``Consumer.__anext__``, and the C extension's ``RecordStream``
(speedups/ready.c), which writes ``consumed`` straight into its slot.

What the application asks of a partition has its words too: ``pause``/``resume`` (``paused``:
neither fetched nor handed out) and ``fetch_until`` (``fetch_end``).

Leader epochs (KIP-320): ``leader_epoch`` is the epoch of the record before
``position`` (what a commit carries), ``fetched_epoch`` the one before
``fetch_offset`` (what validation and Fetch's ``last_fetched_epoch`` send).
Both come from the batch headers the fetch manager saw, else from the epoch
the position was set with.  ``validated_for`` is the metadata leader epoch the
fetch position is known to be consistent with.

What a walk over every partition would look for is counted instead: each write of a ``phase``,
and each change of ``validated_for`` or ``fetched_epoch`` (what decides whether a position needs
validating) moves ``SubscriptionState.changes``.  The partitions still settling (not yet
``FETCHING``) are kept from one change to the next, so asking for them (``in_phase``, each loop
turn of several managers) costs nothing while no partition changed, and the position validator
walks the partitions only when something it looks at changed (managers/validation.py).  A
consumer with a thousand partitions caught up then pays for them once a fetch, not once a manager.
The latest backoff written (``retry_at``) is kept too, so that ``next_retry`` walks the partitions
only while one of them may still be backing off.  And every other write that decides whether a
partition is fetched, or from where (a pause, a limit, a revocation, a rewind, a backoff) moves
``SubscriptionState.moves``, so that the fetch manager walks the partitions again only when one of
the two counts, the assignment or the cluster moved (managers/fetch.py).  A poll finishes only the
partitions with records taken since they were last all handed out (``SubscriptionState.finished``):
``taken`` and ``rewind`` note them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..structs import TopicPartition


class _Census:
    """How many times a phase, a vouched-for leader epoch or a fetched epoch changed, how many
    times anything else that decides whether a partition is fetched did (``moves``), no
    partition's finite ``retry_at`` is later than ``retry_until``, and which partitions had records
    taken since the application last finished with all it was handed (``unfinished``): one per
    ``SubscriptionState``, shared by its partition states (see the module's docstring)."""

    __slots__ = ("changes", "moves", "retry_until", "unfinished")

    def __init__(self) -> None:
        self.changes = 0
        self.moves = 0
        self.retry_until = 0.0
        #: Every partition whose ``processed`` may be behind ``consumed``, or whose ``consumed``
        #: may still move (records taken, not all handed out): ``taken()`` and ``rewind()`` add it,
        #: ``SubscriptionState.finished()`` drops it once nothing taken is left to hand out.
        self.unfinished: set[PartitionState] = set()


class PartitionPhase(enum.Enum):
    AWAIT_COMMITTED = "await_committed"  # ask the group coordinator for a committed offset
    AWAIT_RESET = "await_reset"  # look up earliest/latest with ListOffsets
    AWAIT_VALIDATION = "await_validation"  # KIP-320: check the position against the leader's log
    FETCHING = "fetching"  # position known


@dataclass(slots=True, eq=False)
class PartitionState:
    """One assigned partition: its phase, offsets and flags (see the module's docstring).

    Who writes what: the offsets (``position``, ``fetch_offset``, ``consumed``, ``processed``,
    ``set_at``) only through the methods below, but for ``consumed``, which the per-record
    ``async for`` steps also write for a record of a live chunk, as ``handed_out`` would:
    ``Consumer.__anext__`` in Python and ``RecordStream`` in C (speedups/ready.c, at the field's
    slot; tests/protocol/test_speedups_names.py keeps the names it reads and writes in step).  ``paused``
    and ``fetch_end`` through ``pause``/``resume`` and ``fetch_until``; ``revoking`` through
    ``SubscriptionState.begin_revocation``."""

    tp: TopicPartition
    _phase: PartitionPhase
    position: int = -1
    fetch_offset: int = -1
    reset_to: str | None = None
    paused: bool = False
    #: Being revoked by the group: no longer fetched nor handed out (PREPARE_REVOCATION).
    revoking: bool = False
    #: ``Consumer.fetch_until()``: not fetched while ``fetch_offset`` is at or past it (None: no
    #: limit).  Seeks keep it, and so does an ``assign()`` that keeps the partition; a partition
    #: unassigned and assigned again starts without one.
    fetch_end: int | None = None
    epoch: int = 0
    #: Offset after the last record handed to the application (what ``commit()`` commits).
    consumed: int = -1
    #: ``consumed`` as of the application's previous poll: what it has finished with (auto-commit).
    processed: int = -1
    #: The offset the position was last set to (a committed offset, a reset, a seek): while
    #: ``consumed`` is still there, nothing was handed out since.
    set_at: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: Not before then (a backoff after an error; ``inf``: until the application seeks).  Read and
    #: written as ``retry_at``, which keeps the census's latest backoff.
    _retry_at: float = 0.0
    #: Metadata leader epoch the fetch position was validated against (or fetched under); None:
    #: never.  Read and written as ``validated_for``, which counts its changes.
    _validated_for: int | None = None
    #: Leader epoch of the record before ``fetch_offset``: what validation checks and Fetch's
    #: ``last_fetched_epoch`` sends (None: unknown).  Kept by the methods that move the epochs
    #: (read on every fetch of every partition, so a field, not a property); they count its changes.
    fetched_epoch: int | None = None
    #: The fetch manager's: the fetch session (one per broker) this state was last fetched in.  A
    #: partition unassigned and assigned again has a new state, which the broker's session may still
    #: remember under the old one's offsets (managers/fetch.py starts that session again).
    fetch_session: object = None
    #: The epoch given when the position was set: it covers offsets before any fetched batch.
    _set_epoch: int | None = None
    #: (first offset, leader epoch) where the epoch of fetched batches changes, in offset order.
    _epoch_starts: list[tuple[int, int]] = field(default_factory=list)
    #: Where the changes to the phase and the epochs are counted (the owner's, or one of its own).
    _census: _Census = field(default_factory=_Census, repr=False)

    @property
    def phase(self) -> PartitionPhase:
        return self._phase

    @phase.setter
    def phase(self, phase: PartitionPhase) -> None:
        self._phase = phase
        self._census.changes += 1

    @property
    def retry_at(self) -> float:
        return self._retry_at

    @retry_at.setter
    def retry_at(self, at: float) -> None:
        census = self._census
        if at != self._retry_at:
            census.moves += 1
        self._retry_at = at
        if census.retry_until < at < math.inf:
            census.retry_until = at

    @property
    def validated_for(self) -> int | None:
        return self._validated_for

    @validated_for.setter
    def validated_for(self, leader_epoch: int | None) -> None:
        if leader_epoch != self._validated_for:  # a fetch sets it to the same epoch each time
            self._validated_for = leader_epoch
            self._census.changes += 1

    def _fetched_epoch_is(self, epoch: int | None) -> None:
        if epoch != self.fetched_epoch:
            self.fetched_epoch = epoch
            self._census.changes += 1

    @property
    def has_position(self) -> bool:
        """The position is known (while it is being validated too: commits keep covering it)."""
        return self._phase is PartitionPhase.FETCHING or self._phase is PartitionPhase.AWAIT_VALIDATION

    @property
    def fetch_limited(self) -> bool:
        """Fetching has reached the ``fetch_until()`` limit: not fetched until it is raised, or a
        seek or rewind takes the fetch offset back below it."""
        return self.fetch_end is not None and self.fetch_offset >= self.fetch_end

    @property
    def leader_epoch(self) -> int | None:
        """Leader epoch of the record before ``position`` (None when unknown)."""
        return self.epoch_before(self.position)

    def epoch_before(self, offset: int) -> int | None:
        """Leader epoch of the record before ``offset`` (what a commit of ``offset`` carries)."""
        for start, epoch in reversed(self._epoch_starts):
            if start < offset:
                return epoch
        return self._set_epoch

    # -- what the application asks of the partition ------------------------------------------------

    def pause(self) -> None:
        """Neither fetched nor handed out until ``resume()`` (``Consumer.pause()``, or a partition
        stream that is full)."""
        self.paused = True
        self._census.moves += 1

    def resume(self) -> None:
        """Fetched and handed out again after ``pause()``."""
        self.paused = False
        self._census.moves += 1

    def fetch_until(self, offset: int | None) -> None:
        """Fetch only while ``fetch_offset`` is below ``offset`` (None: no limit; see ``fetch_end``)."""
        self.fetch_end = offset
        self._census.moves += 1

    def set_position(self, offset: int, leader_epoch: int | None = None) -> None:
        # Going back within what the leader already served (the application putting records
        # back) needs no new validation; anywhere else, the new epoch is checked first.
        if self.phase is not PartitionPhase.FETCHING or offset > self.fetch_offset:
            self.validated_for = None
        self.phase = PartitionPhase.FETCHING
        self.position = self.fetch_offset = self.consumed = self.processed = self.set_at = offset
        self._set_epoch = leader_epoch
        self._fetched_epoch_is(leader_epoch)
        self._epoch_starts = []
        self.reset_to = None
        self.retry_at = 0.0
        self.epoch += 1

    # -- the offsets' vocabulary (processed <= consumed <= position <= fetch_offset) ----------------

    def fetched(self, offset: int) -> None:
        """Records before ``offset`` were fetched (the next fetch starts there).  Reaching the
        ``fetch_until()`` limit counts as a move (the partition is no longer fetched)."""
        if offset > self.fetch_offset:
            self.fetch_offset = offset
            if self.fetch_end is not None and offset >= self.fetch_end:
                self._census.moves += 1

    def taken(self, offset: int) -> None:
        """Records before ``offset`` were taken from the buffer, or skipped with the transaction
        markers, aborted batches or compaction gaps a fetch ended with."""
        if offset > self.position:
            self.position = min(offset, self.fetch_offset)
            self._census.unfinished.add(self)

    def handed_out(self, offset: int) -> None:
        """Records before ``offset`` were handed to the application: ``commit()`` covers them.
        Never past ``position`` (a record taken before a seek and handed out after it moves nothing)."""
        if self.consumed < offset <= self.position:
            self.consumed = offset

    @property
    def handed_out_since_set(self) -> bool:
        """Records were handed to the application since the position was last set."""
        return self.consumed > self.set_at

    def finished(self) -> None:
        """A new poll: the application is done with what it was handed (auto-commit covers it)."""
        if self.consumed >= 0:
            self.processed = self.consumed

    def committed_through(self, offset: int) -> None:
        """``offset`` is being committed: what is before it counts as finished, so the background
        auto-commit (which commits what was finished) does not take the commit back."""
        if self.processed < offset <= self.consumed:
            self.processed = offset

    def note_fetched_epochs(self, starts: list[tuple[int, int]]) -> None:
        """Record where the leader epochs of newly fetched batches begin (unknown epochs are -1)."""
        known = self.fetched_epoch
        for start, epoch in starts:
            if epoch >= 0 and epoch != known:
                self._epoch_starts.append((start, epoch))
                known = epoch
                self._fetched_epoch_is(epoch)
        # Only the entry covering ``processed`` (the oldest offset a commit may still name) and later
        # ones can still be asked for.
        oldest = self.processed if self.processed >= 0 else self.position
        while len(self._epoch_starts) > 1 and self._epoch_starts[1][0] < oldest:
            self._epoch_starts.pop(0)

    def rewind(self, offset: int) -> None:
        """Fetch again from ``offset``, at or before ``fetch_offset``: records fetched or taken for
        the application from there on go back (``epoch`` moves, so they are stale).  What was
        handed out and processed before ``offset`` stays so; validation is not needed again."""
        self.position = self.fetch_offset = offset
        self.consumed = min(self.consumed, offset)
        self.processed = min(self.processed, offset)
        self._census.unfinished.add(self)  # the position may have moved forward
        starts = self._epoch_starts = [e for e in self._epoch_starts if e[0] < offset]
        self._fetched_epoch_is(starts[-1][1] if starts else self._set_epoch)
        self.retry_at = 0.0
        self.epoch += 1
        self._census.moves += 1

    def await_validation(self) -> None:
        """KIP-320: stop at what the application was handed and have the leader confirm it.  The
        read-ahead goes (the new leader may not have it) and is fetched again once confirmed."""
        self.rewind(self.consumed if self.consumed >= 0 else self.position)
        self.phase = PartitionPhase.AWAIT_VALIDATION

    def needs_validation(self, leader_epoch: int) -> bool:
        """KIP-320: the fetch position carries an epoch the current leader has not vouched for."""
        return (
            self.phase is PartitionPhase.FETCHING
            and self.fetched_epoch is not None
            and leader_epoch >= 0
            and self.validated_for != leader_epoch
        )

    def lag(self) -> int | None:
        if self.high_watermark < 0 or not self.has_position:
            return None
        return max(0, self.high_watermark - self.consumed)


class SubscriptionState:
    def __init__(self, default_reset: str, has_group: bool) -> None:
        self.default_reset = default_reset
        self.has_group = has_group
        #: The assignment: changed only by :meth:`assign` (and :meth:`add`/:meth:`remove` through it).
        self.partitions: dict[TopicPartition, PartitionState] = {}
        #: Bumped on every assignment change; fetches started before are stale.
        self.assignment_id = 0
        self._topics: frozenset[str] = frozenset()  # the assignment's topics (asked for each turn)
        self._census = _Census()
        #: The partitions not in ``FETCHING``, as of ``changes`` = ``_settling_at`` (see the docstring).
        self._settling: list[PartitionState] = []
        self._settling_at = -1

    def _initial_phase(self) -> PartitionPhase:
        return PartitionPhase.AWAIT_COMMITTED if self.has_group else PartitionPhase.AWAIT_RESET

    def assign(self, tps: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Replace the assignment; returns the partitions that were dropped."""
        wanted = list(dict.fromkeys(tps))
        census = self._census
        removed = set(self.partitions) - set(wanted)
        kept = {tp: self.partitions[tp] for tp in wanted if tp in self.partitions}
        for tp in removed:
            self.partitions[tp].epoch += 1  # records taken for the application but not handed out are stale
        self.partitions = {
            tp: kept.get(tp) or PartitionState(tp, self._initial_phase(), reset_to=self.default_reset, _census=census)
            for tp in wanted
        }
        census.changes += 1
        if removed or len(kept) != len(wanted):
            self.assignment_id += 1
        self._topics = frozenset(tp.topic for tp in wanted)
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

    def begin_revocation(self, tps: Iterable[TopicPartition]) -> None:
        """The group is taking ``tps`` away (PREPARE_REVOCATION): from now on they are neither
        fetched nor handed out, until ``remove`` (or a new assignment) drops their states."""
        for tp in tps:
            state = self.partitions.get(tp)
            if state is not None:
                state.revoking = True
                self._census.moves += 1

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.partitions[tp].set_position(offset)

    def request_reset(self, tp: TopicPartition, strategy: str | None = None) -> None:
        state = self.partitions[tp]
        state.phase = PartitionPhase.AWAIT_RESET
        state.validated_for = None
        state.reset_to = strategy or self.default_reset
        state.retry_at = 0.0
        state.epoch += 1

    @property
    def changes(self) -> int:
        """Moves on each change of a partition's phase, vouched-for leader epoch or fetched epoch,
        and of the assignment: equal values mean nothing of that changed in between."""
        return self._census.changes

    @property
    def moves(self) -> int:
        """Moves on each write of anything else that decides whether a partition is fetched, or
        from where: ``pause``/``resume``, ``fetch_until`` (and a fetch reaching its limit), a
        revocation, a ``rewind``, and a change of ``retry_at``.  With ``changes``, the assignment
        and the cluster's leaders unchanged, the partitions fetched are those of the last walk,
        until its earliest backoff ends, and only ``fetched()`` moved their fetch offsets."""
        return self._census.moves

    def finished(self) -> None:
        """A new poll: the application is done with what it was handed (``PartitionState.finished``
        for every assigned partition).  Only the partitions with records taken since they were
        last all handed out are looked at: ``consumed`` never passes ``position``, which moves
        forward only through ``taken()`` and ``rewind()`` (both add the partition;
        ``set_position`` sets the offsets equal), so the others' ``processed`` is already
        ``consumed``."""
        unfinished = self._census.unfinished
        if not unfinished:
            return
        partitions = self.partitions
        for state in list(unfinished):
            if partitions.get(state.tp) is not state:  # no longer assigned
                unfinished.discard(state)
                continue
            state.finished()
            if state.consumed >= state.position:  # all it took was handed out
                unfinished.discard(state)

    def in_phase(self, phase: PartitionPhase, now: float) -> list[PartitionState]:
        """The partitions in ``phase`` whose ``retry_at`` has come (in assignment order)."""
        if phase is PartitionPhase.FETCHING:
            return [s for s in self.partitions.values() if s._phase is phase and s._retry_at <= now]
        return [s for s in self._not_fetching() if s._phase is phase and s._retry_at <= now]

    def settling(self) -> bool:
        """Some assigned partition waits for its position (its committed offset, a reset or a
        validation): the position managers have nothing to do each turn while none does."""
        return bool(self._not_fetching())

    def _not_fetching(self) -> list[PartitionState]:
        """The assigned partitions not in ``FETCHING``, walked again only after ``changes`` moved."""
        if self._settling_at != self._census.changes:
            self._settling_at = self._census.changes
            fetching = PartitionPhase.FETCHING
            self._settling = [s for s in self.partitions.values() if s._phase is not fetching]
        return self._settling

    def next_retry(self, now: float) -> float:
        """The earliest finite ``retry_at`` after ``now`` of any partition (``inf``: none).  Walks
        the partitions only while the latest backoff written is still ahead."""
        census = self._census
        if census.retry_until <= now:  # every finite retry_at is at or before it
            return math.inf
        ahead = [s._retry_at for s in self.partitions.values() if now < s._retry_at < math.inf]
        census.retry_until = max(ahead, default=0.0)
        return min(ahead, default=math.inf)

    def fetchable(self, now: float) -> list[PartitionState]:
        fetching = PartitionPhase.FETCHING
        return [  # each turn, every partition: PartitionState.fetch_limited written out (its call costs ~250 ns here)
            s
            for s in self.partitions.values()
            if s._phase is fetching
            and not s.paused
            and not s.revoking
            and s._retry_at <= now
            and (s.fetch_end is None or s.fetch_offset < s.fetch_end)
        ]

    def topics(self) -> frozenset[str]:
        """The assignment's topics."""
        return self._topics
