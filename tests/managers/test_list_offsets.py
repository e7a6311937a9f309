"""ListOffsetsManager: timestamp lookups and position resets, with leader moves and seeks."""

from __future__ import annotations

import pytest

from asyncconsumer.errors import (
    REFRESH_METADATA_CODES,
    KafkaConnectionError,
    NoOffsetForPartitionError,
    NotLeaderOrFollowerError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from asyncconsumer.managers.list_offsets import EARLIEST, LATEST, ListOffsetsManager
from asyncconsumer.managers.metadata import MetadataManager
from asyncconsumer.managers.subscription import PartitionPhase, SubscriptionState
from asyncconsumer.protocol.api import SUPPORTED_VERSIONS
from asyncconsumer.structs import TopicPartition

from .scripted import FakeClock, Scripted, Sent, fetch_body, load_metadata, metadata_body, new_metadata

BACKOFF = 0.125  # binary-exact, so clock arithmetic is too
T0, T1, T2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
LEADERS = {T0: (1, 5), T1: (2, 6), T2: (1, 7)}


class Setup:
    def __init__(self, default_reset: str = "earliest", *, read_committed: bool = False,
                 leaders: dict[TopicPartition, tuple[int, int]] | None = None) -> None:
        self.clock = FakeClock()
        self.subs = SubscriptionState(default_reset, has_group=False)
        self.errors: list[Exception] = []
        self.metadata: MetadataManager = new_metadata(self.clock, LEADERS if leaders is None else leaders,
                                                      retry_backoff=BACKOFF, topics=lambda: {"t"})
        self.offsets = ListOffsetsManager(self.subs, self.metadata, read_committed=read_committed,
                                          retry_backoff=BACKOFF, report_error=self.errors.append)
        self.h = Scripted(self.metadata, self.offsets, clock=self.clock)


def partitions(sent: Sent) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (timestamp, current_leader_epoch)} of a ListOffsets request."""
    return {(t["name"], p["partition_index"]): (p["timestamp"], p["current_leader_epoch"])
            for t in sent.body()["topics"] for p in t["partitions"]}


def answer(offsets: dict[TopicPartition, tuple[int, int, int] | int]) -> dict[str, object]:
    """A response: tp -> (offset, timestamp, leader_epoch), or tp -> error code."""
    by_topic: dict[str, list[dict[str, int]]] = {}
    for tp, value in offsets.items():
        if isinstance(value, int):
            entry = {"partition_index": tp.partition, "error_code": value, "offset": -1, "timestamp": -1,
                     "leader_epoch": -1}
        else:
            offset, timestamp, epoch = value
            entry = {"partition_index": tp.partition, "error_code": 0, "offset": offset, "timestamp": timestamp,
                     "leader_epoch": epoch}
        by_topic.setdefault(tp.topic, []).append(entry)
    return {"topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}


def marks(version: int, ends: dict[TopicPartition, int | tuple[int, int]], *, error_code: int = 0) -> dict[str, object]:
    """A Fetch response stating each partition's high watermark (or ``(high watermark, last stable
    offset)``), with no records."""
    parts = {}
    for tp, end in ends.items():
        high, stable = end if isinstance(end, tuple) else (end, end)
        parts[tp] = {"partition_index": tp.partition, "error_code": 0, "high_watermark": high,
                     "last_stable_offset": stable, "log_start_offset": 0, "aborted_transactions": [],
                     "preferred_read_replica": -1, "records": b""}
    return fetch_body(version, parts, error_code=error_code)


def confirm(s: Setup, ends: dict[TopicPartition, int | tuple[int, int]], *, node: int | None = None) -> Sent:
    """Answer the Fetch that confirms ListOffsets(latest) answers with these marks."""
    sent = s.h.take("Fetch")
    if node is not None:
        assert sent.node_id == node
    sent.respond(marks(sent.version, ends))
    return sent


def by_node(sent: list[Sent]) -> dict[int | None, Sent]:
    assert len({s.node_id for s in sent}) == len(sent), "two requests to one node"
    return {s.node_id: s for s in sent}


# -- lookups -----------------------------------------------------------------------------------------


def test_empty_lookup_resolves_at_once() -> None:
    s = Setup()
    assert s.offsets.lookup({}).result() == {}
    s.h.assert_idle()


def test_lookup_grouped_by_leader() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: 1000, T1: 2000, T2: EARLIEST})
    assert s.offsets.topics_of_interest() == {"t"}
    requests = by_node(s.h.sent("ListOffsets"))
    assert set(requests) == {1, 2}
    assert partitions(requests[1]) == {("t", 0): (1000, 5), ("t", 2): (EARLIEST, 7)}
    assert partitions(requests[2]) == {("t", 1): (2000, 6)}
    body = requests[1].body()
    assert body["replica_id"] == -1
    assert body["isolation_level"] == 0
    s.h.assert_idle()  # nothing sent twice while in flight
    requests[1].respond(answer({T0: (10, 1000, 5), T2: (0, -1, 7)}))
    assert not waiter.done()
    requests[2].respond(answer({T1: (20, 2001, -1)}))
    assert waiter.result() == {T0: (10, 1000, 5), T1: (20, 2001, None), T2: (0, -1, 7)}
    s.h.assert_idle()


def test_offsets_for_times_without_offset_gives_none() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: 5_000, T2: 6_000})
    request = s.h.take("ListOffsets")
    request.respond(answer({T0: (-1, -1, -1), T2: (42, 6_001, 7)}))
    assert waiter.result() == {T0: None, T2: (42, 6_001, 7)}


def test_not_leader_requests_metadata_and_retries_after_backoff() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: LATEST, T1: LATEST})
    requests = by_node(s.h.sent("ListOffsets"))
    requests[2].respond(answer({T1: (7, -1, 6)}))
    requests[1].respond(answer({T0: 6}))  # NOT_LEADER_OR_FOLLOWER
    assert not waiter.done()
    metadata = s.h.take("Metadata")  # a metadata update was requested
    confirm(s, {T1: 7}, node=2)
    s.h.advance(BACKOFF / 2)
    s.h.assert_idle("ListOffsets")
    # Meanwhile the leader moved to node 2.
    metadata.respond(metadata_body({**LEADERS, T0: (2, 8)}))
    s.h.advance(BACKOFF / 2)
    retry = s.h.take("ListOffsets")
    assert retry.node_id == 2
    assert partitions(retry) == {("t", 0): (LATEST, 8)}  # only the missing partition, new epoch
    retry.respond(answer({T0: (99, -1, 8)}))
    assert not waiter.done()
    confirm(s, {T0: 99}, node=2)
    assert waiter.result() == {T0: (99, -1, 8), T1: (7, -1, 6)}


@pytest.mark.parametrize("code", sorted(REFRESH_METADATA_CODES))
def test_every_refresh_metadata_code_refreshes_and_retries(code: int) -> None:
    """ListOffsets acts on the one set of refreshable codes the fetcher and the validator use, with
    KAFKA_STORAGE_ERROR (56) as in the Java client (a replica's log dir failed: a new leader can
    answer); FETCH_SESSION_TOPIC_ID_ERROR (106) comes from Fetch only, and would be retried too."""
    s = Setup()
    waiter = s.offsets.lookup({T1: EARLIEST})
    s.h.take("ListOffsets").respond(answer({T1: code}))
    assert not waiter.done()
    s.h.take("Metadata")
    s.h.advance(BACKOFF)
    s.h.take("ListOffsets").respond(answer({T1: (3, -1, 6)}))
    assert waiter.result() == {T1: (3, -1, 6)}


def test_transport_error_retries_after_backoff() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T1: EARLIEST})
    s.h.take("ListOffsets").fail(KafkaConnectionError("reset by peer"))
    s.h.take("Metadata")
    assert not waiter.done()
    assert s.offsets.next_deadline(s.h.now) == s.h.now + BACKOFF
    s.h.assert_idle("ListOffsets")
    s.h.advance(BACKOFF)
    s.h.take("ListOffsets").respond(answer({T1: (3, -1, 6)}))
    assert waiter.result() == {T1: (3, -1, 6)}


def test_fatal_partition_error_fails_the_lookup() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T1: EARLIEST})
    s.h.take("ListOffsets").respond(answer({T1: 29}))
    with pytest.raises(TopicAuthorizationFailedError):
        waiter.result()
    s.h.advance(BACKOFF)
    s.h.assert_idle("ListOffsets")


def test_unknown_topic_fails_the_lookup() -> None:
    s = Setup()
    s.metadata.request_update()
    load_metadata(s.metadata, s.clock, LEADERS, topic_errors={"gone": 3})
    waiter = s.offsets.lookup({TopicPartition("gone", 0): EARLIEST})
    s.h.assert_idle("ListOffsets")
    with pytest.raises(UnknownTopicOrPartitionError, match="gone"):
        waiter.result()


def test_missing_partition_fails_the_lookup() -> None:
    s = Setup()
    waiter = s.offsets.lookup({TopicPartition("t", 9): EARLIEST})
    s.h.assert_idle("ListOffsets")
    with pytest.raises(UnknownTopicOrPartitionError, match="t-9"):
        waiter.result()


def test_unknown_leader_requests_metadata_first() -> None:
    s = Setup(leaders={T0: (-1, 5)})
    waiter = s.offsets.lookup({T0: EARLIEST})
    assert s.h.sent("ListOffsets") == []
    s.h.take("Metadata").respond(metadata_body({T0: (3, 6)}))
    request = s.h.take("ListOffsets")
    assert request.node_id == 3
    request.respond(answer({T0: (1, -1, 6)}))
    assert waiter.result() == {T0: (1, -1, 6)}


def test_cancelled_lookup_is_dropped() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: EARLIEST})
    waiter.set_exception(TimeoutError())  # what a caller's timeout does
    s.h.assert_idle("ListOffsets")
    assert s.offsets.topics_of_interest() == set()


def test_read_committed_isolation_level() -> None:
    s = Setup(read_committed=True)
    s.offsets.lookup({T0: LATEST})
    assert s.h.take("ListOffsets").body()["isolation_level"] == 1


@pytest.mark.parametrize("version", range(2, SUPPORTED_VERSIONS["ListOffsets"][1] + 1))
@pytest.mark.parametrize("read_committed", [False, True])
def test_request_and_response_encode_at_every_version(version: int, read_committed: bool) -> None:
    s = Setup(read_committed=read_committed)
    waiter = s.offsets.lookup({T1: 123})
    request = s.h.take("ListOffsets").at(version)
    assert partitions(request)[("t", 1)][0] == 123
    epoch = 6 if version >= 4 else -1  # LeaderEpoch is v4+
    request.respond(answer({T1: (5, 124, epoch)}))
    assert waiter.result() == {T1: (5, 124, 6 if version >= 4 else None)}


def test_v1_encodes_for_read_uncommitted() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T1: 123})
    s.h.take("ListOffsets").at(1).respond(answer({T1: (5, 124, -1)}))
    assert waiter.result() == {T1: (5, 124, None)}


# -- position resets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "timestamp"), [("earliest", EARLIEST), ("latest", LATEST)])
def test_reset_looks_up_and_sets_position(strategy: str, timestamp: int) -> None:
    s = Setup(strategy)
    s.subs.assign([T0])
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.AWAIT_RESET
    request = s.h.take("ListOffsets")
    assert request.node_id == 1
    assert partitions(request) == {("t", 0): (timestamp, 5)}
    s.h.assert_idle("ListOffsets")  # not twice while in flight
    request.respond(answer({T0: (42, -1, 5)}))
    if strategy == "latest":
        assert state.phase is PartitionPhase.AWAIT_RESET  # until a Fetch confirms the end
        confirm(s, {T0: 42}, node=1)
    assert state.phase is PartitionPhase.FETCHING
    assert (state.position, state.fetch_offset, state.leader_epoch) == (42, 42, 5)
    assert s.errors == []
    s.h.assert_idle("ListOffsets")


def test_a_reset_answered_under_the_named_leader_epoch_needs_no_validation_at_that_epoch() -> None:
    """KIP-320: the leader answers ListOffsets only at the ``current_leader_epoch`` the request
    named, so the position is what that leader has: no OffsetForLeaderEpoch before fetching (Java's
    consumer skips it after a reset too), while a later epoch has it checked as any position."""
    s = Setup("earliest")
    s.subs.assign([T0])
    state = s.subs.partitions[T0]
    request = s.h.take("ListOffsets")
    assert partitions(request) == {("t", 0): (EARLIEST, 5)}
    request.respond(answer({T0: (0, -1, 3)}))  # the first record's epoch, older than the leader's
    assert (state.phase, state.position, state.leader_epoch) == (PartitionPhase.FETCHING, 0, 3)
    assert state.validated_for == 5
    assert not state.needs_validation(5)
    assert state.needs_validation(6)


def test_reset_uses_the_partitions_own_strategy() -> None:
    s = Setup("earliest")
    s.subs.assign([T0, T2])
    s.subs.request_reset(T2, "latest")
    request = s.h.take("ListOffsets")  # both lead by node 1: one request
    assert partitions(request) == {("t", 0): (EARLIEST, 5), ("t", 2): (LATEST, 7)}


def test_resets_grouped_by_leader() -> None:
    s = Setup("latest")
    s.subs.assign([T0, T1, T2])
    requests = by_node(s.h.sent("ListOffsets"))
    assert {n: set(partitions(r)) for n, r in requests.items()} == {
        1: {("t", 0), ("t", 2)}, 2: {("t", 1)}}


def test_reset_none_reports_no_offset_error_once() -> None:
    s = Setup("none")
    s.subs.assign([T0, T1])
    s.h.assert_idle("ListOffsets")
    assert len(s.errors) == 1
    error = s.errors[0]
    assert isinstance(error, NoOffsetForPartitionError)
    assert set(error.partitions) == {T0, T1}
    s.h.advance(60)
    s.h.assert_idle("ListOffsets")
    assert len(s.errors) == 1
    # An explicit reset strategy later works.
    s.subs.request_reset(T0, "earliest")
    request = s.h.take("ListOffsets")
    assert partitions(request) == {("t", 0): (EARLIEST, 5)}


def test_seek_during_reset_wins() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    request = s.h.take("ListOffsets")
    s.subs.seek(T0, 500)
    request.respond(answer({T0: (0, -1, 5)}))
    state = s.subs.partitions[T0]
    assert (state.phase, state.position, state.fetch_offset) == (PartitionPhase.FETCHING, 500, 500)
    s.h.assert_idle("ListOffsets")


def test_new_reset_during_reset_ignores_old_result_and_asks_again() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    first = s.h.take("ListOffsets")
    s.subs.request_reset(T0, "latest")
    s.h.assert_idle("ListOffsets")  # one reset per partition in flight
    first.respond(answer({T0: (0, -1, 5)}))
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.AWAIT_RESET
    second = s.h.take("ListOffsets")
    assert partitions(second) == {("t", 0): (LATEST, 5)}
    second.respond(answer({T0: (77, -1, 5)}))
    confirm(s, {T0: 77})
    assert (state.phase, state.position) == (PartitionPhase.FETCHING, 77)


def test_unassigned_during_reset_is_ignored() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    request = s.h.take("ListOffsets")
    s.subs.assign([T1])
    request.respond(answer({T0: (3, -1, 5)}))
    assert T0 not in s.subs.partitions
    assert s.subs.partitions[T1].phase is PartitionPhase.AWAIT_RESET


def test_reset_not_leader_retries_after_backoff_with_metadata_update() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    s.h.take("ListOffsets").respond(answer({T0: 6}))
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.AWAIT_RESET
    assert state.retry_at == s.h.now + BACKOFF
    s.h.take("Metadata")
    s.h.assert_idle("ListOffsets")
    s.h.advance(BACKOFF)
    s.h.take("ListOffsets").respond(answer({T0: (8, -1, 5)}))
    assert state.position == 8
    assert s.errors == []


def test_reset_fatal_error_is_reported_and_retried() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    s.h.take("ListOffsets").respond(answer({T0: 29}))
    assert [type(e) for e in s.errors] == [TopicAuthorizationFailedError]
    s.h.advance(BACKOFF)
    assert len(s.h.sent("ListOffsets")) == 1


def test_reset_transport_error_retries_quietly() -> None:
    s = Setup("earliest")
    s.subs.assign([T0])
    s.h.take("ListOffsets").fail(NotLeaderOrFollowerError("moved"))
    assert s.errors == []
    s.h.take("Metadata")
    s.h.assert_idle("ListOffsets")
    s.h.advance(BACKOFF)
    assert len(s.h.sent("ListOffsets")) == 1


def test_reset_waits_for_a_leader() -> None:
    s = Setup("earliest", leaders={T0: (-1, 5)})
    s.subs.assign([T0])
    assert s.h.sent("ListOffsets") == []
    s.h.take("Metadata").respond(metadata_body({T0: (2, 6)}))
    request = s.h.take("ListOffsets")
    assert request.node_id == 2
    assert partitions(request) == {("t", 0): (EARLIEST, 6)}


# -- the end of a partition: ListOffsets(latest) confirmed by a Fetch ---------------------------------


def test_latest_is_confirmed_by_a_sessionless_fetch_at_the_answer() -> None:
    """On Apache Kafka the answers agree: the Fetch asks for nothing and the answer stands."""
    s = Setup()
    waiter = s.offsets.lookup({T0: LATEST, T2: LATEST})
    s.h.take("ListOffsets").respond(answer({T0: (42, -1, 5), T2: (7, -1, 7)}))
    assert not waiter.done()
    fetch = s.h.take("Fetch")
    body = fetch.body()
    assert fetch.node_id == 1
    assert (body["max_wait_ms"], body["min_bytes"], body["max_bytes"]) == (1, 0, 1)
    assert (body["session_id"], body["session_epoch"], body["isolation_level"]) == (0, -1, 0)
    asked = {(p["partition"], p["fetch_offset"], p["current_leader_epoch"], p["partition_max_bytes"])
             for t in body["topics"] for p in t["partitions"]}
    assert asked == {(0, 42, 5, 1), (2, 7, 7, 1)}
    fetch.respond(marks(fetch.version, {T0: 42, T2: 7}))
    assert waiter.result() == {T0: (42, -1, 5), T2: (7, -1, 7)}
    assert s.offsets.inexact_nodes == set()
    s.h.assert_idle()


def test_latest_below_the_fetch_high_watermark_takes_the_high_watermark(caplog: pytest.LogCaptureFixture) -> None:
    """A broker answering the start of the last batch + 1 (Tansu: 5 records in one batch, 1)."""
    s = Setup()
    with caplog.at_level("INFO", logger="asyncconsumer.offsets"):
        for _ in range(2):
            waiter = s.offsets.lookup({T0: LATEST})
            s.h.take("ListOffsets").respond(answer({T0: (1, -1, 5)}))
            confirm(s, {T0: 5})
            assert waiter.result() == {T0: (5, -1, 5)}
    assert s.offsets.inexact_nodes == {1}
    named = [r.getMessage() for r in caplog.records if "ListOffsets(latest)" in r.getMessage()]
    assert len(named) == 1 and "high watermark 5" in named[0], named  # once per broker


def test_latest_reset_lands_on_the_confirmed_end() -> None:
    s = Setup("latest")
    s.subs.assign([T0])
    s.h.take("ListOffsets").respond(answer({T0: (1, -1, 5)}))
    confirm(s, {T0: 5})
    state = s.subs.partitions[T0]
    assert (state.phase, state.position) == (PartitionPhase.FETCHING, 5)


def test_read_committed_confirms_with_the_last_stable_offset() -> None:
    s = Setup(read_committed=True)
    waiter = s.offsets.lookup({T0: LATEST})
    s.h.take("ListOffsets").respond(answer({T0: (3, -1, 5)}))
    fetch = s.h.take("Fetch")
    assert fetch.body()["isolation_level"] == 1
    fetch.respond(marks(fetch.version, {T0: (9, 4)}))  # high watermark 9, an open transaction from 4
    assert waiter.result() == {T0: (4, -1, 5)}


def test_a_failed_confirmation_keeps_the_answer_or_what_fetches_saw() -> None:
    s = Setup()
    s.subs.assign([T0])
    s.subs.seek(T0, 0)
    s.subs.partitions[T0].high_watermark = 9  # a fetch of the consumer's own saw 9
    waiter = s.offsets.lookup({T0: LATEST, T2: LATEST})
    s.h.take("ListOffsets").respond(answer({T0: (6, -1, 5), T2: (3, -1, 7)}))
    s.h.take("Fetch").fail(KafkaConnectionError("cut"))
    assert waiter.result() == {T0: (9, -1, 5), T2: (3, -1, 7)}


def test_a_fetch_error_for_a_partition_keeps_its_answer() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: LATEST})
    s.h.take("ListOffsets").respond(answer({T0: (6, -1, 5)}))
    fetch = s.h.take("Fetch")
    body = marks(fetch.version, {T0: 99})
    body["responses"][0]["partitions"][0]["error_code"] = NotLeaderOrFollowerError.code  # type: ignore[index]
    fetch.respond(body)
    assert waiter.result() == {T0: (6, -1, 5)}


def test_earliest_and_timestamps_are_not_confirmed() -> None:
    s = Setup()
    waiter = s.offsets.lookup({T0: EARLIEST, T2: 1000})
    s.h.take("ListOffsets").respond(answer({T0: (0, -1, 5), T2: (4, 1000, 7)}))
    assert waiter.result() == {T0: (0, -1, 5), T2: (4, 1000, 7)}
    s.h.assert_idle("Fetch")
