"""PositionValidator (KIP-320): when positions are checked, what is asked, and what truncation does."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.errors import (
    KafkaConnectionError,
    LogTruncationError,
    TopicAuthorizationFailedError,
    UnsupportedVersionError,
)
from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
from asyncconsumer.protocol.api import SUPPORTED_VERSIONS
from asyncconsumer.structs import TopicPartition

from .scripted import Sent, load_metadata
from .test_fetch import BACKOFF, T0, T2, Setup, buffered, data, fetched, records, respond

MAX_VERSION = SUPPORTED_VERSIONS["OffsetForLeaderEpoch"][1]


def state(s: Setup, tp: TopicPartition = T0) -> PartitionState:
    return s.subs.partitions[tp]


def consumed_from(s: Setup, offset: int, count: int, *, epoch: int, tp: TopicPartition = T0) -> None:
    """Fetch ``count`` records of leader epoch ``epoch`` from ``offset``."""
    respond(s.fetch(), {tp: data(tp, records(offset, count, partition_leader_epoch=epoch),
                                 high_watermark=offset + count)})


def move_leader(s: Setup, tp: TopicPartition, leader: int, epoch: int) -> None:
    s.leaders[tp] = (leader, epoch)
    s.metadata.request_update()
    load_metadata(s.metadata, s.clock, s.leaders)


def asked(sent: Sent) -> dict[TopicPartition, tuple[int, int]]:
    """{partition: (current_leader_epoch, leader_epoch)} of an OffsetForLeaderEpoch request."""
    return {TopicPartition(t["topic"], p["partition"]): (p["current_leader_epoch"], p["leader_epoch"])
            for t in sent.body()["topics"] for p in t["partitions"]}


def answer(sent: Sent, parts: dict[TopicPartition, Any]) -> None:
    """Respond with tp -> (leader epoch, end offset), or tp -> error code."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp, value in parts.items():
        epoch, end, code = (*value, 0) if isinstance(value, tuple) else (-1, -1, value)
        topics.setdefault(tp.topic, []).append(
            {"error_code": code, "partition": tp.partition, "leader_epoch": epoch, "end_offset": end})
    sent.respond({"topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})


def validation(s: Setup) -> Sent:
    return s.h.take("OffsetForLeaderEpoch")


def after_epoch_bump(default_reset: str = "earliest", *, position: int = 20) -> Setup:
    """T0 fetched 10..19 in epoch 5, the application took records up to ``position``, leader epoch 5 -> 6."""
    s = Setup(default_reset=default_reset)
    s.start({T0: 10})
    consumed_from(s, 10, 10, epoch=5)
    state(s).position = state(s).consumed = position  # handed out up to here
    move_leader(s, T0, 1, 6)
    return s


# -- when a position is validated -------------------------------------------------------------------


def test_epoch_bump_validates_then_fetching_resumes_at_the_same_offset() -> None:
    s = after_epoch_bump()
    request = validation(s)
    assert request.node_id == 1
    assert request.body()["replica_id"] == -1
    assert asked(request) == {T0: (6, 5)}
    assert state(s).phase is PartitionPhase.AWAIT_VALIDATION
    assert state(s).has_position  # commits keep covering it meanwhile
    assert s.fetches() == []  # not fetched while awaiting validation
    answer(request, {T0: (5, 20)})
    assert state(s).phase is PartitionPhase.FETCHING
    assert (state(s).position, state(s).fetch_offset) == (20, 20)
    fetch = s.fetch()
    assert fetched(fetch) == {T0: 20}
    assert fetch.body()["topics"][0]["partitions"][0]["current_leader_epoch"] == 6
    s.h.assert_idle("OffsetForLeaderEpoch")  # validated for epoch 6: not asked again


def test_position_without_epoch_is_not_validated() -> None:
    s = Setup()
    s.start({T0: 10})
    move_leader(s, T0, 1, 6)
    assert fetched(s.fetch()) == {T0: 10}
    s.h.assert_idle("OffsetForLeaderEpoch")


def test_position_set_with_an_epoch_is_validated_before_the_first_fetch() -> None:
    s = Setup()
    s.subs.assign([T0])
    state(s).set_position(100, leader_epoch=3)  # a committed offset with its epoch
    request = validation(s)
    assert asked(request) == {T0: (5, 3)}
    assert s.fetches() == []
    answer(request, {T0: (3, 150)})
    assert fetched(s.fetch()) == {T0: 100}


def test_new_leader_is_asked() -> None:
    s = Setup()
    s.start({T0: 10})
    consumed_from(s, 10, 2, epoch=5)
    state(s).position = state(s).consumed = 12  # both handed out
    move_leader(s, T0, 2, 9)
    request = validation(s)
    assert request.node_id == 2
    assert asked(request) == {T0: (9, 5)}


def test_partitions_of_one_leader_share_a_request() -> None:
    s = Setup()
    s.subs.assign([T0, T2])
    state(s, T0).set_position(10, leader_epoch=1)
    state(s, T2).set_position(30, leader_epoch=2)
    [request] = s.h.sent("OffsetForLeaderEpoch")
    assert asked(request) == {T0: (5, 1), T2: (7, 2)}
    s.h.assert_idle("OffsetForLeaderEpoch")  # one request in flight per partition


@pytest.mark.parametrize("version", range(3, MAX_VERSION + 1))
def test_request_and_response_at_every_version(version: int) -> None:
    s = after_epoch_bump()
    request = validation(s).at(version)
    assert asked(request) == {T0: (6, 5)}
    answer(request, {T0: (5, 25)})
    assert state(s).phase is PartitionPhase.FETCHING


def test_revoking_partition_is_not_validated() -> None:
    s = Setup()
    s.subs.assign([T0])
    state(s).set_position(100, leader_epoch=3)
    state(s).revoking = True
    s.h.assert_idle("OffsetForLeaderEpoch")
    assert state(s).has_position  # its commit before revocation still covers it


# -- what the answer does ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_truncation_moves_the_position_to_the_divergent_offset(policy: str) -> None:
    s = after_epoch_bump(policy)
    answer(validation(s), {T0: (5, 15)})  # epoch 5 ends at 15 on the new leader: 15..19 are gone
    st = state(s)
    assert st.phase is PartitionPhase.FETCHING
    assert (st.position, st.fetch_offset, st.consumed, st.leader_epoch) == (15, 15, 15, 5)
    assert buffered(s) == []
    assert s.errors == []
    assert fetched(s.fetch()) == {T0: 15}
    s.h.assert_idle("OffsetForLeaderEpoch")


def test_truncation_with_reset_none_is_a_log_truncation_error() -> None:
    s = after_epoch_bump("none")
    answer(validation(s), {T0: (5, 15)})
    [error] = s.errors
    assert isinstance(error, LogTruncationError)
    assert (error.partition, error.position, error.divergent_offset, error.divergent_epoch) == (T0, 20, 15, 5)
    assert "t-0" in str(error) and "20" in str(error) and "15" in str(error)
    assert state(s).position == 20  # left for the application to decide
    s.h.advance(3600)
    assert s.fetches() == []
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.subs.seek(T0, 15)  # the application seeks: fetching goes on
    assert fetched(s.fetch()) == {T0: 15}


def test_diverged_read_ahead_is_fetched_again_without_moving_the_position() -> None:
    s = after_epoch_bump(position=12)  # records 12..19 are buffered, not taken
    answer(validation(s), {T0: (5, 16)})
    st = state(s)
    assert (st.position, st.fetch_offset) == (12, 12)
    assert buffered(s) == []
    assert s.errors == []
    assert fetched(s.fetch()) == {T0: 12}


@pytest.mark.parametrize("epoch_and_offset", [(-1, -1), (-1, 40), (5, -1)])
def test_undefined_answer_resets_the_position_as_java_does(epoch_and_offset: tuple[int, int]) -> None:
    s = after_epoch_bump("latest")
    answer(validation(s), {T0: epoch_and_offset})
    assert state(s).phase is PartitionPhase.AWAIT_RESET
    assert state(s).reset_to == "latest"
    assert s.errors == []


def test_undefined_answer_with_reset_none_is_an_error_without_offset() -> None:
    s = after_epoch_bump("none")
    answer(validation(s), {T0: (-1, -1)})
    [error] = s.errors
    assert isinstance(error, LogTruncationError)
    assert error.divergent_offset is None


def test_seek_during_validation_drops_the_answer() -> None:
    s = after_epoch_bump()
    request = validation(s)
    s.subs.seek(T0, 500)
    answer(request, {T0: (5, 15)})  # about the old position
    st = state(s)
    assert (st.phase, st.position, st.fetch_offset) == (PartitionPhase.FETCHING, 500, 500)
    assert s.errors == []
    assert fetched(s.fetch()) == {T0: 500}


def test_seek_with_an_epoch_during_validation_validates_the_new_position() -> None:
    s = after_epoch_bump()
    old = validation(s)
    state(s).set_position(200, leader_epoch=6)
    answer(old, {T0: (5, 15)})
    assert state(s).position == 200
    assert asked(validation(s)) == {T0: (6, 6)}


# -- brokers that cannot answer, and errors ----------------------------------------------------------


def test_broker_without_the_api_skips_validation() -> None:
    s = after_epoch_bump()
    validation(s).fail(UnsupportedVersionError("broker broker1:9093 does not support OffsetForLeaderEpoch"))
    assert s.errors == []
    assert state(s).phase is PartitionPhase.FETCHING
    assert fetched(s.fetch()) == {T0: 20}
    assert s.validator.unsupported_nodes == {1}
    # Later epoch changes on that broker go straight to fetching.
    move_leader(s, T0, 1, 7)
    s.h.assert_idle("OffsetForLeaderEpoch")
    assert state(s).phase is PartitionPhase.FETCHING


def test_unsupported_version_for_a_partition_skips_its_validation() -> None:
    s = after_epoch_bump()
    answer(validation(s), {T0: 35})
    assert state(s).phase is PartitionPhase.FETCHING
    assert s.errors == []


@pytest.mark.parametrize("code", [6, 74, 75])  # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH
def test_leadership_errors_refresh_metadata_and_retry_after_backoff(code: int) -> None:
    s = after_epoch_bump()
    answer(validation(s), {T0: code})
    assert s.errors == []
    # Metadata is asked for (after the backoff: the last refresh was asked for too).
    assert s.metadata.next_deadline(s.h.now) == pytest.approx(s.h.now + BACKOFF)
    assert s.validator.next_deadline(s.h.now) == pytest.approx(s.h.now + BACKOFF)
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.h.advance(BACKOFF / 2)
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.h.advance(BACKOFF / 2)
    assert asked(validation(s)) == {T0: (6, 5)}
    assert len(s.h.take_all("Metadata")) == 1
    assert s.fetches() == []


def test_transport_error_retries_after_backoff() -> None:
    s = after_epoch_bump()
    validation(s).fail(KafkaConnectionError("connection to broker1 was lost"))
    assert s.errors == []
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.h.advance(BACKOFF)
    assert asked(validation(s)) == {T0: (6, 5)}


def test_other_error_is_reported_and_retried() -> None:
    s = after_epoch_bump()
    answer(validation(s), {T0: 29})
    assert [type(e) for e in s.errors] == [TopicAuthorizationFailedError]
    s.h.advance(BACKOFF)
    assert asked(validation(s)) == {T0: (6, 5)}


def test_partition_missing_from_the_answer_is_asked_again() -> None:
    s = after_epoch_bump()
    answer(validation(s), {})
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.h.advance(BACKOFF)
    assert asked(validation(s)) == {T0: (6, 5)}


# -- the epochs a position carries -------------------------------------------------------------------


def test_position_epoch_follows_the_fetched_batches() -> None:
    s = Setup()
    s.start({T0: 10})
    payload = records(10, 3, partition_leader_epoch=5) + records(13, 3, partition_leader_epoch=6)
    respond(s.fetch(), {T0: data(T0, payload, high_watermark=16)})
    st = state(s)
    assert st.fetched_epoch == 6
    assert st.leader_epoch is None  # nothing taken yet: no epoch was given with the seek
    st.position = 13
    assert st.leader_epoch == 5  # the record before the position (12) is of epoch 5
    st.position = 14
    assert st.leader_epoch == 6


def test_putting_records_back_needs_no_new_validation() -> None:
    s = after_epoch_bump()
    answer(validation(s), {T0: (5, 20)})
    st = state(s)
    st.set_position(15, st.leader_epoch)  # what the consumer does with records it did not hand out
    assert st.leader_epoch == 5
    assert fetched(s.fetch()) == {T0: 15}
    s.h.assert_idle("OffsetForLeaderEpoch")


def test_records_taken_but_not_handed_out_wait_for_the_validation() -> None:
    """Validation stops at what the application was handed (``consumed``): read-ahead, and records
    taken for it but not handed out yet, go (the new leader may not have them) and come again."""
    s = after_epoch_bump(position=12)
    st = state(s)
    st.position = 20  # records 12..19 taken (an async-for chunk), 10..11 handed out
    epoch_before = st.epoch
    move_leader(s, T0, 1, 7)
    request = validation(s)
    assert (st.position, st.fetch_offset, st.consumed) == (12, 12, 12)
    assert st.epoch != epoch_before  # what was taken is stale: not handed out meanwhile
    assert buffered(s) == []
    answer(request, {T0: (5, 16)})  # epoch 5 ends at 16: 12..15 were fine, 16.. diverged
    assert (st.phase, st.position, st.fetch_offset) == (PartitionPhase.FETCHING, 12, 12)
    assert fetched(s.fetch()) == {T0: 12}


def test_nothing_handed_out_with_an_epoch_needs_no_check() -> None:
    s = Setup()
    s.start({T0: 10})
    consumed_from(s, 10, 2, epoch=5)  # fetched, nothing handed out; the seek carried no epoch
    move_leader(s, T0, 2, 9)
    s.h.assert_idle("OffsetForLeaderEpoch")
    assert fetched(s.fetch()) == {T0: 10}  # read-ahead dropped, fetched again from the new leader


# -- the walk over the partitions happens when something it looks at changed -----------------------


def test_an_epoch_fetched_under_the_old_leader_is_checked_once_the_metadata_moved_on() -> None:
    # The validator walks the partitions only when the metadata, a phase or an epoch changed: here
    # the leader epoch moves while a fetch is out, when the position has no epoch yet (nothing to
    # check); the answer, from the old leader's epoch, brings the first epoch, and that is a change.
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, high_watermark=10)})  # served by the leader of epoch 5
    assert state(s).validated_for == 5 and state(s).fetched_epoch is None
    out = s.fetch()  # asked under epoch 5
    move_leader(s, T0, 1, 6)
    s.h.poll()
    assert s.h.take_all("OffsetForLeaderEpoch") == []  # no epoch to check yet
    respond(out, {T0: data(T0, records(10, 2, partition_leader_epoch=5), high_watermark=12)})
    assert state(s).validated_for == 5 and state(s).fetched_epoch == 5
    state(s).position = state(s).consumed = 12  # handed out: the position now carries epoch 5
    assert asked(validation(s)) == {T0: (6, 5)}
    assert state(s).phase is PartitionPhase.AWAIT_VALIDATION


def test_a_seek_with_an_epoch_after_quiet_turns_is_checked() -> None:
    # Quiet turns leave the validator nothing to walk for; the seek is a change it sees.
    s = Setup()
    s.start({T0: 10, T2: 0})
    consumed_from(s, 10, 2, epoch=5)
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.h.assert_idle("OffsetForLeaderEpoch")
    s.validator.seek(state(s), 11, 4)  # an epoch the leader must vouch for
    assert asked(validation(s)) == {T0: (5, 4)}


def test_quiet_turns_do_not_look_for_partitions_awaiting_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every position fetching and nothing changed: the validator's turn is over at once, without
    # looking through the partitions for one awaiting its answer (each turn is each fetch's).
    s = after_epoch_bump()
    answer(validation(s), {T0: (5, 20)})
    looked: list[PartitionPhase] = []
    in_phase = s.subs.in_phase

    def counted(phase: PartitionPhase, now: float) -> list[PartitionState]:
        looked.append(phase)
        return in_phase(phase, now)

    monkeypatch.setattr(s.subs, "in_phase", counted)
    for _ in range(3):
        assert s.validator.poll(s.clock.now) == []
        assert s.validator.next_deadline(s.clock.now) == float("inf")
    assert PartitionPhase.AWAIT_VALIDATION not in looked
    move_leader(s, T0, 1, 7)  # and a change is still seen
    assert asked(validation(s)) == {T0: (7, 5)}
