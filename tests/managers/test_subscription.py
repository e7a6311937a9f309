"""SubscriptionState: assignment changes, seeks and resets, and who is fetchable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncconsumer.managers.subscription import PartitionPhase, PartitionState, SubscriptionState
from asyncconsumer.structs import TopicPartition

T0, T1, T2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)


@pytest.mark.parametrize(("has_group", "phase"), [(True, PartitionPhase.AWAIT_COMMITTED),
                                                   (False, PartitionPhase.AWAIT_RESET)])
def test_initial_phase(has_group: bool, phase: PartitionPhase) -> None:
    subs = SubscriptionState("latest", has_group=has_group)
    subs.assign([T0])
    state = subs.partitions[T0]
    assert state.phase is phase
    assert state.reset_to == "latest"
    assert not state.has_position
    assert state.lag() is None


def test_assign_keeps_state_of_kept_partitions_and_bumps_assignment_id() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    assert subs.assign([T0, T1]) == set()
    assert subs.assignment_id == 1
    subs.seek(T0, 42)
    kept = subs.partitions[T0]
    removed = subs.assign([T2, T0])
    assert removed == {T1}
    assert subs.assignment_id == 2
    assert subs.partitions[T0] is kept
    assert (kept.phase, kept.position) == (PartitionPhase.FETCHING, 42)
    assert subs.partitions[T2].phase is PartitionPhase.AWAIT_RESET
    assert list(subs.partitions) == [T2, T0]
    assert subs.topics() == {"t"}


def test_topics_follow_every_assignment_change() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    assert subs.topics() == set()
    u0 = TopicPartition("u", 0)
    subs.assign([T0, u0])
    assert subs.topics() == {"t", "u"}
    subs.remove([T0])
    assert subs.topics() == {"u"}
    subs.add([T1])
    assert subs.topics() == {"t", "u"}
    assert isinstance(subs.topics(), frozenset)  # read each turn without a copy: no caller can change it
    subs.assign([])
    assert subs.topics() == set()


def test_same_assignment_does_not_bump() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1])
    subs.assign([T1, T0, T1])
    assert subs.assignment_id == 1
    assert list(subs.partitions) == [T1, T0]


def test_removing_only_bumps() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1])
    assert subs.assign([T0]) == {T1}
    assert subs.assignment_id == 2
    assert subs.assign([]) == {T0}
    assert subs.assignment_id == 3
    assert subs.partitions == {}


def test_add_is_incremental() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.seek(T0, 5)
    subs.add([T1, T0])
    assert list(subs.partitions) == [T0, T1]
    assert subs.partitions[T0].position == 5
    assert subs.assignment_id == 2


def test_seek_sets_every_offset_and_bumps_epoch() -> None:
    subs = SubscriptionState("earliest", has_group=True)
    subs.assign([T0])
    state = subs.partitions[T0]
    epoch = state.epoch
    subs.seek(T0, 17)
    assert state.phase is PartitionPhase.FETCHING
    assert (state.position, state.fetch_offset, state.consumed, state.processed) == (17, 17, 17, 17)
    assert state.reset_to is None
    assert state.epoch == epoch + 1
    subs.seek(T0, 17)
    assert state.epoch == epoch + 2  # even to the same offset: in-flight data is stale


def test_set_position_records_leader_epoch() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.partitions[T0].set_position(9, leader_epoch=4)
    assert subs.partitions[T0].leader_epoch == 4
    subs.seek(T0, 3)
    assert subs.partitions[T0].leader_epoch is None


def test_request_reset_bumps_epoch_and_clears_backoff() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.seek(T0, 5)
    state = subs.partitions[T0]
    state.retry_at = 1e9
    epoch = state.epoch
    subs.request_reset(T0)
    assert (state.phase, state.reset_to, state.retry_at) == (PartitionPhase.AWAIT_RESET, "earliest", 0.0)
    assert state.epoch == epoch + 1
    subs.request_reset(T0, "latest")
    assert state.reset_to == "latest"
    assert state.epoch == epoch + 2


def test_in_phase_and_fetchable_respect_backoff_and_pause() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1, T2])
    subs.seek(T0, 1)
    subs.seek(T1, 1)
    subs.partitions[T1].retry_at = 10.0
    assert [s.tp for s in subs.fetchable(5.0)] == [T0]
    assert [s.tp for s in subs.fetchable(10.0)] == [T0, T1]
    subs.partitions[T0].pause()
    assert [s.tp for s in subs.fetchable(10.0)] == [T1]
    assert [s.tp for s in subs.in_phase(PartitionPhase.AWAIT_RESET, 0.0)] == [T2]
    subs.partitions[T2].retry_at = float("inf")
    assert subs.in_phase(PartitionPhase.AWAIT_RESET, 1e12) == []


def test_partitions_being_revoked_are_not_fetched_until_they_leave() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1])
    subs.seek(T0, 1)
    subs.seek(T1, 1)
    subs.begin_revocation([T1, T2])  # T2 is not assigned: nothing to mark
    assert [s.tp for s in subs.fetchable(0.0)] == [T0]
    assert subs.partitions[T1].revoking and not subs.partitions[T0].revoking
    subs.remove([T1])
    subs.assign([T0, T1])  # assigned again: a new state, fetched once it has a position
    assert not subs.partitions[T1].revoking


def test_lag() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.seek(T0, 10)
    state = subs.partitions[T0]
    assert state.lag() is None  # no high watermark yet
    state.high_watermark = 25
    assert state.lag() == 15
    state.consumed = 30
    assert state.lag() == 0


def test_seek_unparks_a_partition() -> None:
    subs = SubscriptionState("none", has_group=False)
    subs.assign([T0])
    subs.partitions[T0].retry_at = float("inf")  # what list_offsets does for auto_offset_reset="none"
    subs.seek(T0, 0)
    assert [s.tp for s in subs.fetchable(0.0)] == [T0]


def fetching(offset: int = 10, epoch: int | None = 3) -> PartitionState:
    state = PartitionState(T0, PartitionPhase.AWAIT_RESET)
    state.set_position(offset, epoch)
    return state


def test_rewind_puts_taken_records_back_without_moving_what_was_handed_out_forward() -> None:
    state = fetching(10)
    state.position, state.fetch_offset, state.consumed, state.processed = 30, 40, 25, 20
    state.validated_for = 6
    epoch = state.epoch
    state.rewind(25)  # records 25..29 were taken for the application, not handed out
    assert (state.position, state.fetch_offset, state.consumed, state.processed) == (25, 25, 25, 20)
    assert state.epoch == epoch + 1  # what was taken is stale
    assert state.validated_for == 6  # the leader already served these offsets: no new check
    state.rewind(18)  # a record before what was processed (a deserializer error in a stream batch)
    assert (state.consumed, state.processed) == (18, 18)


def test_commits_carry_the_epoch_of_the_offset_they_name() -> None:
    state = fetching(10, epoch=3)
    state.note_fetched_epochs([(10, 3), (15, 4)])  # the leader changed at offset 15
    state.position, state.consumed, state.processed = 20, 16, 12
    assert state.epoch_before(12) == 3 and state.epoch_before(16) == 4
    assert state.leader_epoch == 4 and state.fetched_epoch == 4
    state.note_fetched_epochs([(20, 4), (25, 5)])
    assert state.epoch_before(12) == 3  # still known: a commit of 12 may be made yet


# -- the offsets' vocabulary: processed <= consumed <= position <= fetch_offset ------------------------


def offsets(state: PartitionState) -> tuple[int, int, int, int]:
    return state.processed, state.consumed, state.position, state.fetch_offset


def test_the_vocabulary_moves_each_offset_forward_in_order() -> None:
    state = fetching(10)
    state.fetched(40)
    state.taken(25)  # records 10..24 taken from the buffer
    state.handed_out(20)  # 10..19 handed to the application
    assert offsets(state) == (10, 20, 25, 40)
    state.finished()  # the next poll: done with 10..19
    assert offsets(state) == (20, 20, 25, 40)
    state.handed_out(25)
    state.committed_through(23)  # a commit of 23: 20..22 count as finished
    assert offsets(state) == (23, 25, 25, 40)
    state.fetched(30)  # an older fetch's answer does not move the fetch offset back
    state.taken(22)
    state.handed_out(24)
    state.committed_through(21)
    assert offsets(state) == (23, 25, 25, 40)


def test_no_word_of_the_vocabulary_moves_an_offset_past_the_next_one() -> None:
    state = fetching(10)
    state.fetched(30)
    state.taken(35)  # past what was fetched: only up to it
    assert state.position == 30
    state.rewind(20)  # a seek back within what was fetched
    state.handed_out(26)  # a record taken before the rewind, handed out after it (a partition stream)
    assert state.consumed == 10
    state.committed_through(15)  # beyond what was handed out: not finished
    assert offsets(state) == (10, 10, 20, 20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["fetched", "taken", "handed_out", "finished", "committed_through",
                                           "rewind", "set_position", "await_validation"]),
                          st.integers(0, 60)), max_size=40))
def test_the_invariant_holds_whatever_the_order_of_the_words(steps: list[tuple[str, int]]) -> None:
    state = fetching(10)
    for word, offset in steps:
        if word in ("finished", "await_validation"):
            getattr(state, word)()
        elif word == "rewind":
            state.rewind(min(offset, state.fetch_offset))  # its precondition: at or before the fetch offset
        else:
            getattr(state, word)(offset)
        assert state.processed <= state.consumed <= state.position <= state.fetch_offset, (word, offset)


def _one_history(seed: int) -> None:
    """Two subscriptions through the same random words: one finishes a poll with
    ``SubscriptionState.finished()``, its twin with the walk over every partition."""
    rng = random.Random(seed)
    twins = [SubscriptionState("earliest", has_group=False) for _ in range(2)]
    for subs in twins:
        subs.assign([T0, T1])
        for tp in (T0, T1):
            subs.seek(tp, 10)
    words = [*["fetched", "taken", "handed_out", "step", "finished"] * 4, "committed_through", "rewind", "seek",
             "assign"]
    for _ in range(80):
        word, tp, step = rng.choice(words), rng.choice([T0, T0, T1, T2]), rng.randrange(20)
        for i, subs in enumerate(twins):
            state = subs.partitions.get(tp)
            if word == "assign":  # a partition unassigned, or assigned again (a new state)
                subs.assign([t for t in (T0, T1, T2) if t != tp] if state else [*subs.partitions, tp])
            elif word == "finished":
                if i == 0:
                    subs.finished()
                else:
                    for each in subs.partitions.values():
                        each.finished()
            elif state is None:
                continue
            elif word == "seek":
                subs.seek(tp, 5 + step)
            elif word == "rewind":  # anywhere up to the fetch offset (a bad batch's, a chunk's first record)
                state.rewind(max(0, state.fetch_offset - step))
            elif word == "step":  # async for's step (Python or C) writes ``consumed`` for a record taken
                if state.consumed < state.position:
                    state.consumed = min(state.position, state.consumed + 1 + step)
            elif word == "fetched":
                state.fetched(state.fetch_offset + step)
            elif word == "taken":
                state.taken(state.position + step)
            elif word == "handed_out":
                state.handed_out(state.consumed + step)
            else:
                state.committed_through(state.processed + step)
        mine, walked = ({tp: offsets(s) for tp, s in subs.partitions.items()} for subs in twins)
        assert mine == walked, (seed, word, tp, step)
        if word == "finished":  # nothing kept that is unassigned or has nothing left to hand out
            kept = twins[0]._census.unfinished
            assert all(twins[0].partitions.get(s.tp) is s and s.consumed < s.position for s in kept), seed


def test_a_poll_finishes_the_partitions_as_the_walk_over_all_of_them_would() -> None:
    """A poll costs what moved: ``SubscriptionState.finished()`` looks only at the partitions with
    records taken since they were all handed out, and leaves every partition as the walk did."""
    for seed in range(400):
        _one_history(seed)

# -- what the managers' walks are spared: the census of changes ------------------------------------


def test_in_phase_sees_every_way_a_phase_changes() -> None:
    subs = SubscriptionState("earliest", has_group=True)
    subs.assign([T0, T1])
    now = 0.0
    assert subs.in_phase(PartitionPhase.AWAIT_COMMITTED, now) == [subs.partitions[T0], subs.partitions[T1]]
    subs.seek(T0, 5)  # set_position
    assert subs.in_phase(PartitionPhase.AWAIT_COMMITTED, now) == [subs.partitions[T1]]
    subs.partitions[T1].phase = PartitionPhase.AWAIT_RESET  # a direct write, as a missing committed offset does
    assert subs.in_phase(PartitionPhase.AWAIT_COMMITTED, now) == []
    assert subs.in_phase(PartitionPhase.AWAIT_RESET, now) == [subs.partitions[T1]]
    subs.request_reset(T0)
    assert subs.in_phase(PartitionPhase.AWAIT_RESET, now) == [subs.partitions[T0], subs.partitions[T1]]
    subs.seek(T0, 7)
    subs.partitions[T0].await_validation()
    assert subs.in_phase(PartitionPhase.AWAIT_VALIDATION, now) == [subs.partitions[T0]]
    subs.add([T2])  # a new partition starts settling
    assert subs.in_phase(PartitionPhase.AWAIT_COMMITTED, now) == [subs.partitions[T2]]
    subs.remove([T1])
    assert subs.in_phase(PartitionPhase.AWAIT_RESET, now) == []


def test_settling_is_true_while_any_position_is_awaited() -> None:
    """The position managers skip their turn while ``settling()`` is false: it must turn true with
    every way a partition leaves ``FETCHING`` (and false once the last one is back)."""
    subs = SubscriptionState("earliest", has_group=True)
    assert not subs.settling()
    subs.assign([T0, T1])
    assert subs.settling()  # both await their committed offsets
    subs.seek(T0, 5)
    assert subs.settling()
    subs.seek(T1, 5)
    assert not subs.settling()
    subs.request_reset(T1)
    assert subs.settling()
    subs.seek(T1, 6)
    assert not subs.settling()
    subs.partitions[T0].await_validation()
    assert subs.settling()
    subs.partitions[T0].phase = PartitionPhase.FETCHING
    assert not subs.settling()
    subs.partitions[T1].phase = PartitionPhase.AWAIT_RESET  # a direct write, as a missing committed offset does
    assert subs.settling()
    subs.remove([T1])
    assert not subs.settling()
    subs.add([T2])
    assert subs.settling()


def test_changes_count_what_decides_validation_and_not_a_repeated_epoch() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.seek(T0, 10)
    state = subs.partitions[T0]
    before = subs.changes
    state.validated_for = 5
    assert subs.changes == before + 1 and state.validated_for == 5
    state.validated_for = 5  # each answered fetch says it again: no change
    assert subs.changes == before + 1
    state.note_fetched_epochs([(10, 5)])  # the first fetched epoch: a position that may need checking
    assert state.fetched_epoch == 5 and subs.changes == before + 2
    state.note_fetched_epochs([(20, 5)])  # more of the same epoch
    assert subs.changes == before + 2
    state.rewind(10)  # back before the batch: the epoch the position was set with (none)
    assert state.fetched_epoch is None and subs.changes == before + 3


def test_moves_count_every_other_write_that_decides_what_is_fetched() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1])
    subs.seek(T0, 10)
    state = subs.partitions[T0]

    def moved(step: str) -> bool:
        before = subs.moves
        {
            "pause": state.pause,
            "resume": state.resume,
            "limit": lambda: state.fetch_until(14),
            "fetched below the limit": lambda: state.fetched(12),
            "fetched to the limit": lambda: state.fetched(14),
            "fetched past it again": lambda: state.fetched(16),
            "no limit": lambda: state.fetch_until(None),
            "fetched without a limit": lambda: state.fetched(20),
            "backoff": lambda: setattr(state, "retry_at", 50.0),
            "the same backoff": lambda: setattr(state, "retry_at", 50.0),
            "backoff over": lambda: setattr(state, "retry_at", 0.0),
            "rewind": lambda: state.rewind(12),
            "revocation": lambda: subs.begin_revocation([T0]),
            "taken": lambda: state.taken(12),
        }[step]()
        return subs.moves != before

    assert [step for step in (
        "pause", "resume", "limit", "fetched below the limit", "fetched to the limit", "fetched past it again",
        "no limit", "fetched without a limit", "backoff", "the same backoff", "backoff over", "rewind",
        "revocation", "taken",
    ) if moved(step)] == [
        "pause", "resume", "limit", "fetched to the limit", "fetched past it again", "no limit", "backoff",
        "backoff over", "rewind", "revocation",
    ]


class _CountedWalks(dict[TopicPartition, PartitionState]):
    """The partitions' dict, counting the walks over it."""

    walks = 0

    def values(self):  # type: ignore[override]
        self.walks += 1
        return super().values()


def test_next_retry_is_the_earliest_backoff_and_walks_only_while_one_may_be_ahead() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0, T1, T2])
    for tp in (T0, T1, T2):
        subs.seek(tp, 0)
    subs.partitions = counted = _CountedWalks(subs.partitions)
    assert subs.next_retry(1.0) == float("inf") and counted.walks == 0  # nobody ever backed off
    subs.partitions[T0].retry_at = 5.0  # a fetch error
    subs.partitions[T1].retry_at = 3.0
    subs.partitions[T2].retry_at = float("inf")  # until the application seeks: not a deadline
    assert subs.next_retry(1.0) == 3.0
    assert subs.next_retry(4.0) == 5.0
    walks = counted.walks
    assert subs.next_retry(5.0) == float("inf") and subs.next_retry(9.0) == float("inf")
    assert counted.walks == walks  # the latest backoff written has passed: no walk
    subs.partitions[T1].retry_at = 12.0  # another error, later
    assert subs.next_retry(10.0) == 12.0
    subs.seek(T1, 3)  # a seek ends the backoff: the next walk finds none ahead
    assert subs.next_retry(10.0) == float("inf")
    walks = counted.walks
    assert subs.next_retry(10.5) == float("inf") and counted.walks == walks
    subs.request_reset(T2)
    subs.partitions[T2].retry_at = 11.0  # a failed lookup's backoff counts too
    assert subs.next_retry(10.5) == 11.0


def test_a_partition_assigned_again_brings_no_stale_backoff() -> None:
    subs = SubscriptionState("earliest", has_group=False)
    subs.assign([T0])
    subs.seek(T0, 0)
    subs.partitions[T0].retry_at = 5.0
    subs.remove([T0])
    assert subs.next_retry(1.0) == float("inf")  # the walk finds no partition backing off
    subs.add([T0])
    assert subs.partitions[T0].retry_at == 0.0 and subs.next_retry(1.0) == float("inf")
