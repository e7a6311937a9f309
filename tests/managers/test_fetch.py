"""FetchManager: request shape and grouping, KIP-227 sessions, responses into the buffer, errors."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.errors import (
    KafkaConnectionError,
    KafkaError,
    LogTruncationError,
    OffsetOutOfRangeError,
    TopicAuthorizationFailedError,
)
from asyncconsumer.managers.fetch import FetchManager
from asyncconsumer.managers.fetch_buffer import CompletedFetch, FetchBuffer
from asyncconsumer.managers.subscription import PartitionPhase, SubscriptionState
from asyncconsumer.managers.validation import PositionValidator
from asyncconsumer.protocol.api import SUPPORTED_VERSIONS
from asyncconsumer.protocol.compression import CODEC_GZIP
from asyncconsumer.protocol.record_writer import build_batch, build_control_batch, build_legacy_message_set
from asyncconsumer.protocol.records import scan_record_set
from asyncconsumer.structs import TopicPartition

from .scripted import (
    FakeClock,
    Scripted,
    Sent,
    fetch_body,
    fetch_partition,
    load_metadata,
    metadata_body,
    new_metadata,
    topic_id,
)

BACKOFF = 0.125
MAX_WAIT_MS = 500
PARTITION_MAX = 4096
T0, T1, T2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
U0 = TopicPartition("u", 0)
LEADERS = {T0: (1, 5), T1: (2, 6), T2: (1, 7), U0: (1, 0)}
MAX_FETCH = SUPPORTED_VERSIONS["Fetch"][1]


class Setup:
    def __init__(self, *, default_reset: str = "earliest", buffer_bytes: int = 1 << 20,
                 use_sessions: bool = True, read_committed: bool = False,
                 leaders: dict[TopicPartition, tuple[int, int]] | None = None,
                 topic_ids: dict[str, bytes] | None = None, versions: dict[str, int] | None = None) -> None:
        self.clock = FakeClock()
        self.leaders = dict(LEADERS if leaders is None else leaders)
        self.subs = SubscriptionState(default_reset, has_group=False)
        self.errors: list[KafkaError] = []
        self.data_events = 0
        self.metadata = new_metadata(self.clock, self.leaders, retry_backoff=BACKOFF,
                                     topics=lambda: {tp.topic for tp in self.leaders}, topic_ids=topic_ids)
        #: (partition, the fetch manager's answer to may_fetch_after_release) for each fetch released.
        self.released: list[tuple[TopicPartition, bool]] = []
        self.buffer = FetchBuffer(buffer_bytes, on_space=self._on_space, on_data=self._on_data)
        self.validator = PositionValidator(self.subs, self.metadata, self.buffer, retry_backoff=BACKOFF,
                                           report_error=self.errors.append)
        self.fetcher = FetchManager(
            self.subs, self.metadata, self.buffer,
            fetch_min_bytes=1, fetch_max_bytes=1 << 20, fetch_max_wait_ms=MAX_WAIT_MS,
            max_partition_fetch_bytes=PARTITION_MAX, read_committed=read_committed, check_crcs=True,
            retry_backoff=BACKOFF, client_rack="rack-a", report_error=self.errors.append,
            on_diverging_epoch=self.validator.apply_end_offset, use_sessions=use_sessions,
        )
        self.h = Scripted(self.metadata, self.validator, self.fetcher, clock=self.clock, versions=versions)

    def _on_data(self) -> None:
        self.data_events += 1

    def _on_space(self, tp: TopicPartition, was_full: bool) -> None:
        self.released.append((tp, self.fetcher.may_fetch_after_release(tp, was_full)))

    def start(self, offsets: dict[TopicPartition, int]) -> None:
        self.subs.assign(offsets)
        for tp, offset in offsets.items():
            self.subs.seek(tp, offset)

    def fetches(self) -> list[Sent]:
        return self.h.sent("Fetch")

    def fetch(self, version: int | None = None) -> Sent:
        sent = self.h.take("Fetch")
        return sent if version is None else sent.at(version)


def names(version: int) -> dict[Any, str]:
    return {topic_id(t): t for t in ("t", "u")} if version >= 13 else {}


def fetched(sent: Sent) -> dict[TopicPartition, int]:
    """{partition: fetch offset} named in a Fetch request."""
    by_id = names(sent.version)
    out = {}
    for topic in sent.body()["topics"]:
        name = by_id[topic["topic_id"]] if sent.version >= 13 else topic["topic"]
        for p in topic["partitions"]:
            out[TopicPartition(name, p["partition"])] = p["fetch_offset"]
    return out


def forgotten(sent: Sent) -> set[TopicPartition]:
    by_id = names(sent.version)
    return {TopicPartition(by_id[t["topic_id"]] if sent.version >= 13 else t["topic"], p)
            for t in sent.body()["forgotten_topics_data"] for p in t["partitions"]}


def session(sent: Sent) -> tuple[int, int]:
    body = sent.body()
    return body["session_id"], body["session_epoch"]


def records(base: int, count: int, **kwargs: Any) -> bytes:
    return build_batch([(b"k%d" % i, b"v%d" % i) for i in range(count)], base_offset=base, **kwargs)


def respond(sent: Sent, parts: dict[TopicPartition, dict[str, Any]], **kwargs: Any) -> None:
    sent.respond(fetch_body(sent.version, parts, **kwargs))


def data(tp: TopicPartition, payload: bytes = b"", **kwargs: Any) -> dict[str, Any]:
    return fetch_partition(tp.partition, records=payload, **kwargs)


def buffered(s: Setup) -> list[CompletedFetch]:
    return s.buffer.fetches()


# -- what is fetched, and where ------------------------------------------------------------------------


def test_nothing_fetched_without_a_position() -> None:
    s = Setup()
    s.subs.assign([T0, T1])
    assert s.fetches() == []


def test_partitions_grouped_by_leader_one_fetch_per_node() -> None:
    s = Setup()
    s.start({T0: 10, T1: 20, T2: 30})
    requests = {r.node_id: r for r in s.fetches()}
    assert set(requests) == {1, 2}
    assert fetched(requests[1]) == {T0: 10, T2: 30}
    assert fetched(requests[2]) == {T1: 20}
    assert requests[1].request.extra_timeout_ms == MAX_WAIT_MS
    assert s.fetches() == []  # both nodes busy
    respond(requests[1], {})
    again = s.fetches()
    assert [r.node_id for r in again] == [1]  # node 2 still has its fetch in flight
    assert fetched(again[0]) == {T0: 10, T2: 30}


def test_request_body_fields() -> None:
    s = Setup(read_committed=True)
    s.start({T0: 10})
    request = s.fetch(12)
    body = request.body()
    assert body["replica_id"] == -1
    assert (body["max_wait_ms"], body["min_bytes"], body["max_bytes"]) == (MAX_WAIT_MS, 1, 1 << 20)
    assert body["isolation_level"] == 1
    assert body["rack_id"] == "rack-a"
    [topic] = body["topics"]
    [partition] = topic["partitions"]
    assert partition["current_leader_epoch"] == 5
    assert partition["fetch_offset"] == 10
    assert partition["partition_max_bytes"] == PARTITION_MAX


@pytest.mark.parametrize("version", range(4, MAX_FETCH + 1))
def test_request_and_response_at_every_version(version: int) -> None:
    s = Setup()
    s.start({T0: 10})
    request = s.fetch(version)
    assert fetched(request) == {T0: 10}
    respond(request, {T0: data(T0, records(10, 2), high_watermark=12)})
    [completed] = buffered(s)
    assert (completed.tp, completed.next_offset) == (T0, 12)
    assert s.subs.partitions[T0].fetch_offset == 12


def test_paused_partitions_are_not_fetched() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    s.subs.partitions[T2].pause()
    assert fetched(s.fetch()) == {T0: 10}


def test_a_partition_is_not_fetched_once_it_reaches_its_fetch_limit() -> None:
    """``Consumer.fetch_until()``: the fetch that reaches the limit may carry the partition past it
    (whole batches are served); after it the partition is left out until the limit is raised or
    cleared."""
    s = Setup()
    s.start({T0: 10})
    s.subs.partitions[T0].fetch_until(12)
    request = s.fetch()
    assert fetched(request) == {T0: 10}
    respond(request, {T0: data(T0, records(10, 3), high_watermark=20)})
    assert s.subs.partitions[T0].fetch_offset == 13
    assert s.fetches() == []
    s.subs.partitions[T0].fetch_until(14)
    request = s.fetch()
    assert fetched(request) == {T0: 13}
    respond(request, {T0: data(T0, records(13, 1), high_watermark=20)})
    assert s.fetches() == []  # 14: at the new limit
    s.subs.partitions[T0].fetch_until(None)
    assert fetched(s.fetch()) == {T0: 14}


def test_unknown_leader_requests_metadata() -> None:
    s = Setup(leaders={T0: (-1, 5)})
    s.start({T0: 0})
    assert s.fetches() == []
    s.h.take("Metadata")


# -- buffer limits -------------------------------------------------------------------------------------


def test_a_full_buffer_fetches_only_partitions_with_nothing_buffered() -> None:
    """A full buffer stops the fetches of partitions with records in it.  A partition with
    nothing there is still fetched: the application may be waiting for it alone (``getmany(tp)``,
    or the others paused) while the others' records hold the buffer."""
    s = Setup(buffer_bytes=80)
    s.start({T0: 0, T1: 0, T2: 0})
    first = {r.node_id: r for r in s.fetches()}
    payload = records(0, 3)
    assert len(payload) >= 80
    respond(first[1], {T0: data(T0, payload, high_watermark=100), T2: data(T2, high_watermark=100)})
    assert s.buffer.full
    assert fetched(s.fetch()) == {T2: 0}  # T0 (same broker) has records buffered: not fetched
    respond(first[2], {})
    assert fetched(s.fetch()) == {T1: 0}  # nothing buffered: fetched though the buffer is full
    s.h.assert_idle("Fetch")
    s.buffer.drop(lambda f: False)
    s.h.assert_idle("Fetch")  # T0's broker is busy with T2's fetch


def test_a_release_wakes_the_loop_only_when_a_fetch_may_follow() -> None:
    """The engine wakes its loop for a completed fetch leaving the buffer only when
    ``may_fetch_after_release`` says so: a no must mean the next poll sends nothing new."""
    s = Setup()
    s.start({T0: 0, T2: 0})
    respond(s.fetch(), {T0: data(T0, records(0, 3), high_watermark=100),
                        T2: data(T2, records(0, 3), high_watermark=100)})
    old_t0, old_t2 = buffered(s)
    again = s.fetch()  # read-ahead: both partitions are in flight again
    assert set(fetched(again)) == {T0, T2}
    s.buffer.remove(old_t0)
    assert s.released == [(T0, False)]
    s.h.assert_idle("Fetch")  # the wake it did not get would have sent nothing
    respond(again, {T0: data(T0, records(3, 3), high_watermark=100)})
    s.buffer.remove(old_t2)  # T2 is no longer in flight: it may be fetched again
    assert s.released[-1] == (T2, True)
    assert T2 in fetched(s.fetch())


def test_a_release_while_its_broker_has_a_fetch_out_does_not_wake_the_loop() -> None:
    """T2's records are read out while node 1's fetch (of T0 alone: T2 had its share buffered)
    is out: nothing can go to node 1 before that answer, whose arrival wakes the loop anyway."""
    s = Setup(buffer_bytes=4 * PARTITION_MAX)
    s.start({T0: 0, T2: 0})
    respond(s.fetch(), {T0: data(T0, b"", high_watermark=10_000),
                        T2: data(T2, payload_of(2 * PARTITION_MAX), high_watermark=10_000)})
    out = s.fetch()
    assert fetched(out) == {T0: 0}
    s.buffer.remove(buffered(s)[0])
    assert s.released == [(T2, False)]
    s.h.assert_idle("Fetch")
    respond(out, {})
    assert T2 in fetched(s.fetch())


def test_a_release_wakes_the_loop_for_the_read_replica_while_the_leader_has_a_fetch_out() -> None:
    """T0 is fetched from the replica its leader named (node 2): its records read out while node 1
    (its leader, and T2's) has a fetch out, it may still go to node 2."""
    s = Setup(buffer_bytes=4 * PARTITION_MAX)
    s.start({T0: 0, T2: 0})
    t0 = data(T0, payload_of(2 * PARTITION_MAX), high_watermark=10_000) | {"preferred_read_replica": 2}
    respond(s.fetch(), {T0: t0, T2: data(T2, b"", high_watermark=10_000)})
    out = s.fetch()
    assert (out.node_id, fetched(out)) == (1, {T2: 0})
    s.buffer.remove(buffered(s)[0])
    assert s.released == [(T0, True)]
    replica = s.fetch()
    assert (replica.node_id, set(fetched(replica))) == (2, {T0})


def test_a_release_from_a_full_buffer_wakes_the_loop() -> None:
    """Even for a partition in flight: the room it leaves lets the others be fetched."""
    payload = records(0, 1)
    s = Setup()
    s.start({T0: 0, T1: 0})
    first = {r.node_id: r for r in s.fetches()}
    respond(first[1], {T0: data(T0, payload, high_watermark=100)})
    s.buffer.max_bytes = s.buffer.used_bytes + 1  # room for one response's frame, not two
    assert not s.buffer.full
    assert fetched(s.fetch()) == {T0: 1}  # read-ahead: T0 is in flight again
    respond(first[2], {T1: data(T1, payload, high_watermark=100)})
    assert s.buffer.full
    s.h.assert_idle("Fetch")  # T1 waits for room
    s.buffer.remove(buffered(s)[0])
    assert s.released == [(T0, True)]
    assert fetched(s.fetch()) == {T1: 1}


def payload_of(size: int) -> bytes:
    payload = b""
    while len(payload) < size:
        payload += records(0, 40)  # offsets do not matter here
    return payload


def test_partition_with_its_share_buffered_is_not_fetched() -> None:
    s = Setup(buffer_bytes=4 * PARTITION_MAX)
    s.start({T0: 0, T2: 0})
    assert s.fetcher.read_ahead_bytes() == 2 * PARTITION_MAX  # the buffer split between two partitions
    respond(s.fetch(), {T0: data(T0, payload_of(2 * PARTITION_MAX), high_watermark=10_000)})
    assert fetched(s.fetch()) == {T2: 0}


def test_partition_reads_ahead_up_to_its_share() -> None:
    s = Setup(buffer_bytes=4 * PARTITION_MAX)
    s.start({T0: 0, T2: 0})
    payload = payload_of(PARTITION_MAX)
    assert len(payload) < 2 * PARTITION_MAX
    respond(s.fetch(), {T0: data(T0, payload, high_watermark=10_000)})
    # More than max_partition_fetch_bytes buffered, less than its share: fetched again already.
    assert set(fetched(s.fetch())) == {T0, T2}


def test_share_is_at_least_max_partition_fetch_bytes() -> None:
    s = Setup(buffer_bytes=PARTITION_MAX)
    s.start({T0: 0, T1: 0, T2: 0})
    assert s.fetcher.read_ahead_bytes() == PARTITION_MAX


def test_read_ahead_share_follows_the_assignment() -> None:
    s = Setup(buffer_bytes=12 * PARTITION_MAX)
    s.start({T0: 0})
    assert s.fetcher.read_ahead_bytes() == 12 * PARTITION_MAX
    s.start({T0: 0, T1: 0, T2: 0})
    assert s.fetcher.read_ahead_bytes() == 4 * PARTITION_MAX


# -- fetches of caught-up partitions while others are being read ----------------------------------------


def busy_and_caught_up(*, read_committed: bool = False, hw: int = 50, lso: int = -1) -> Setup:
    """T0 (node 1) has its share buffered and more to read; T2 (node 1) is at the end of its log."""
    s = Setup(buffer_bytes=4 * PARTITION_MAX, read_committed=read_committed)
    s.start({T0: 0, T2: 50})
    respond(s.fetch(), {T0: data(T0, payload_of(2 * PARTITION_MAX), high_watermark=10_000),
                        T2: data(T2, b"", high_watermark=hw, last_stable_offset=lso)})
    return s


def test_fetch_of_only_caught_up_partitions_is_held_while_others_are_read() -> None:
    s = busy_and_caught_up()
    now = s.clock.now
    # The broker would park a fetch of T2 alone for max_wait, and T0 could not be fetched meanwhile.
    assert s.fetches() == []
    assert s.fetcher.next_deadline(now) == pytest.approx(now + MAX_WAIT_MS / 1000)
    s.clock.advance(MAX_WAIT_MS / 1000 - 0.01)
    assert s.fetches() == []
    s.clock.advance(0.01)
    assert fetched(s.fetch()) == {T2: 50}  # held for fetch_max_wait_ms at most


def test_held_fetch_goes_with_the_busy_partition() -> None:
    s = busy_and_caught_up()
    assert s.fetches() == []
    s.clock.advance(0.1)
    s.buffer.drop(lambda f: False)  # the application read T0's records
    assert fetched(s.fetch()) == {T0: s.subs.partitions[T0].fetch_offset, T2: 50}
    assert s.fetcher.next_deadline(s.clock.now) == float("inf")  # nothing held any more


def test_a_release_that_leaves_the_hold_standing_does_not_wake_the_loop() -> None:
    """Two partitions of node 1 are being read (each with its share buffered, every record
    fetched); T2 is caught up, its fetch held.  The first partition read out joins the held ones
    (no wake: the next poll would send nothing); the last one ends the hold."""
    s = Setup(buffer_bytes=6 * PARTITION_MAX)  # a share of 2 * PARTITION_MAX each
    s.start({T0: 0, U0: 0, T2: 50})
    respond(s.fetch(), {T0: data(T0, records(0, 600), high_watermark=600),
                        U0: data(U0, records(0, 600), high_watermark=600),
                        T2: data(T2, b"", high_watermark=50)})
    assert not s.buffer.full
    assert s.fetches() == []
    deadline = s.fetcher.next_deadline(s.clock.now)
    s.clock.advance(0.1)
    t0, u0 = buffered(s)
    s.buffer.remove(t0)
    assert s.released == [(T0, False)]
    assert s.fetches() == []  # the wake it did not get would have sent nothing
    assert s.fetcher.next_deadline(s.clock.now) == deadline  # held since as before
    s.buffer.remove(u0)
    assert s.released[-1] == (U0, True)
    assert fetched(s.fetch()) == {T0: 600, U0: 600, T2: 50}


def test_the_last_busy_partition_of_a_node_read_out_wakes_the_loop_though_the_buffer_stays_full() -> None:
    """Node 1's fetch of caught-up T2 is held while T0's records are read; node 2's records keep
    the buffer full.  T0 read out leaves node 1 nothing busy: its fetch goes (partitions with
    nothing buffered are fetched even while the buffer is full)."""
    s = Setup()
    s.start({T0: 0, T1: 0, T2: 50})
    first = {r.node_id: r for r in s.fetches()}
    respond(first[1], {T0: data(T0, records(0, 3), high_watermark=3), T2: data(T2, b"", high_watermark=50)})
    respond(first[2], {T1: data(T1, records(0, 3), high_watermark=100)})
    t0, t1 = buffered(s)
    s.buffer.max_bytes = t1.frame_bytes  # full, and still full without T0's frame
    assert s.buffer.full
    assert s.fetches() == []  # T2 held for busy T0; T1 (node 2) has records buffered
    s.buffer.remove(t0)
    assert s.buffer.full
    assert s.released == [(T0, True)]
    assert fetched(s.fetch()) == {T0: 3, T2: 50}


def test_partition_with_records_to_read_is_not_held() -> None:
    s = busy_and_caught_up()
    s.subs.partitions[T2].high_watermark = 60  # more records since
    assert fetched(s.fetch()) == {T2: 50}


def test_caught_up_partition_alone_is_fetched_at_once() -> None:
    s = Setup()
    s.start({T2: 50})
    respond(s.fetch(), {T2: data(T2, b"", high_watermark=50)})
    assert fetched(s.fetch()) == {T2: 50}  # nothing else to wait for: the broker waits for new records


def test_caught_up_on_another_node_is_not_held() -> None:
    s = Setup(buffer_bytes=4 * PARTITION_MAX)
    s.start({T0: 0, T1: 50})
    first = {r.node_id: r for r in s.fetches()}
    respond(first[1], {T0: data(T0, payload_of(2 * PARTITION_MAX), high_watermark=10_000)})
    respond(first[2], {T1: data(T1, b"", high_watermark=50)})
    assert fetched(s.fetch()) == {T1: 50}  # node 2 has no partition being read


@pytest.mark.parametrize("read_committed", [True, False])
def test_read_committed_is_caught_up_at_the_last_stable_offset(read_committed: bool) -> None:
    # Records 50-59 are in an open transaction: read_committed cannot read them yet.
    s = busy_and_caught_up(read_committed=read_committed, hw=60, lso=50)
    if read_committed:
        assert s.fetches() == []
    else:
        assert fetched(s.fetch()) == {T2: 50}


# -- responses -----------------------------------------------------------------------------------------


def test_data_goes_to_the_buffer_and_advances_fetch_offset() -> None:
    s = Setup()
    s.start({T0: 10})
    request = s.fetch()
    payload = records(10, 3)
    respond(request, {T0: data(T0, payload, high_watermark=50, last_stable_offset=40, log_start_offset=2)})
    state = s.subs.partitions[T0]
    [completed] = buffered(s)
    assert (completed.tp, completed.fetch_offset, completed.next_offset) == (T0, 10, 13)
    assert completed.epoch == state.epoch
    assert completed.size == len(payload)
    assert s.data_events == 1
    assert (state.position, state.fetch_offset) == (10, 13)  # position moves when the app reads
    assert (state.high_watermark, state.last_stable_offset, state.log_start_offset) == (50, 40, 2)
    assert [(r.offset, r.value) for r in completed.take(10, 10)] == [(10, b"v0"), (11, b"v1"), (12, b"v2")]
    assert s.fetcher.responses == 1
    assert fetched(s.fetch()) == {T0: 13}


def test_compaction_gap_uses_last_offset_delta() -> None:
    s = Setup()
    s.start({T0: 100})
    request = s.fetch()
    payload = build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=100, offset_deltas=[0, 3], last_offset_delta=7)
    respond(request, {T0: data(T0, payload)})
    [completed] = buffered(s)
    assert completed.next_offset == 108
    assert s.subs.partitions[T0].fetch_offset == 108
    assert [r.offset for r in completed.take(10, 100)] == [100, 103]


def test_empty_response_keeps_offset_and_updates_watermarks() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, b"", high_watermark=10)})
    assert buffered(s) == []
    state = s.subs.partitions[T0]
    assert (state.fetch_offset, state.high_watermark) == (10, 10)
    assert state.lag() == 0


def test_truncated_trailing_batch_is_left_for_the_next_fetch() -> None:
    s = Setup()
    s.start({T0: 0})
    first, second = records(0, 2), records(2, 2)
    respond(s.fetch(), {T0: data(T0, first + second[:20])})
    [completed] = buffered(s)
    assert completed.size == len(first)
    assert s.subs.partitions[T0].fetch_offset == 2


def test_only_a_partial_batch_buffers_nothing() -> None:
    s = Setup()
    s.start({T0: 0})
    respond(s.fetch(), {T0: data(T0, records(0, 5)[:-3])})
    assert buffered(s) == []
    assert s.subs.partitions[T0].fetch_offset == 0


def test_batch_starting_before_fetch_offset_does_not_move_it_back() -> None:
    s = Setup()
    s.start({T0: 12})
    respond(s.fetch(), {T0: data(T0, records(10, 5))})  # a compressed batch may start earlier
    [completed] = buffered(s)
    assert completed.next_offset == 15
    assert [r.offset for r in completed.take(10, 12)] == [12, 13, 14]


def test_read_committed_passes_aborted_transactions() -> None:
    s = Setup(read_committed=True)
    s.start({T0: 0})
    payload = (
        build_batch([(b"k", b"aborted")], base_offset=0, is_transactional=True, producer_id=7, producer_epoch=0)
        + build_control_batch("abort", 7, base_offset=1)
        + records(2, 1)
    )
    respond(s.fetch(), {T0: data(T0, payload, aborted=[(7, 0)])})
    [completed] = buffered(s)
    assert [(r.offset, r.value) for r in completed.take(10, 0)] == [(2, b"v0")]
    assert s.subs.partitions[T0].fetch_offset == 3


def test_response_for_a_partition_seeked_meanwhile_is_dropped() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    request = s.fetch()
    s.subs.seek(T0, 500)
    respond(request, {T0: data(T0, records(10, 3)), T2: data(T2, records(30, 1))})
    assert [c.tp for c in buffered(s)] == [T2]
    assert s.subs.partitions[T0].fetch_offset == 500
    assert fetched(s.fetch()) == {T0: 500, T2: 31}


def test_response_for_unassigned_partitions_is_dropped() -> None:
    s = Setup()
    s.start({T0: 10})
    request = s.fetch()
    s.subs.assign([T1])
    respond(request, {T0: data(T0, records(10, 3))})
    assert buffered(s) == []
    assert s.fetcher.responses == 0


def test_offset_out_of_range_requests_a_reset() -> None:
    s = Setup(default_reset="latest")
    s.start({T0: 10})
    state = s.subs.partitions[T0]
    epoch = state.epoch
    respond(s.fetch(), {T0: data(T0, error_code=1)})
    assert state.phase is PartitionPhase.AWAIT_RESET
    assert state.reset_to == "latest"
    assert state.epoch == epoch + 1
    assert s.errors == []
    assert s.fetches() == []


def test_offset_out_of_range_with_reset_none_is_an_error() -> None:
    s = Setup(default_reset="none")
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, error_code=1)})
    [error] = s.errors
    assert isinstance(error, OffsetOutOfRangeError)
    assert "t-0" in str(error) and "10" in str(error)
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.FETCHING
    s.h.advance(3600)
    assert s.fetches() == []


@pytest.mark.parametrize("code", [6, 74])  # NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH
def test_not_leader_refreshes_metadata_and_backs_off(code: int) -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    respond(s.fetch(), {T0: data(T0, error_code=code), T2: data(T2)})
    assert s.errors == []
    metadata = s.h.take("Metadata")
    assert fetched(s.fetch()) == {T2: 30}  # T0 waits out its backoff
    # The new leader is node 2.
    s.leaders[T0] = (2, 9)
    metadata.respond(metadata_body(s.leaders))
    assert s.fetches() == []
    s.h.advance(BACKOFF)
    request = s.fetch()
    assert request.node_id == 2
    assert fetched(request) == {T0: 10}
    assert request.body()["topics"][0]["partitions"][0]["current_leader_epoch"] == 9


def test_other_partition_error_is_reported_and_backs_off() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, error_code=29)})
    assert [type(e) for e in s.errors] == [TopicAuthorizationFailedError]
    assert s.fetches() == []
    s.h.advance(BACKOFF)
    assert len(s.fetches()) == 1


def test_top_level_error_backs_off_every_partition() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    respond(s.fetch(), {}, error_code=29)
    assert [type(e) for e in s.errors] == [TopicAuthorizationFailedError]
    assert s.fetches() == []
    s.h.advance(BACKOFF)
    assert fetched(s.fetch()) == {T0: 10, T2: 30}


def test_transport_error_backs_off_and_resets_the_session() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0)}, session_id=77)
    s.fetch().fail(KafkaConnectionError("reset by peer"))
    assert s.errors == []  # retriable: not the application's problem
    s.h.take("Metadata")
    assert s.fetches() == []
    s.h.advance(BACKOFF)
    request = s.fetch()
    assert session(request) == (0, 0)
    assert fetched(request) == {T0: 10}


def test_non_retriable_transport_error_is_reported() -> None:
    s = Setup()
    s.start({T0: 10})
    s.fetch().fail(RuntimeError("bug in a body builder"))
    [error] = s.errors
    assert "bug in a body builder" in str(error)


# -- fetch sessions (KIP-227) --------------------------------------------------------------------------


def test_first_request_is_full_then_incremental() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    first = s.fetch()
    assert session(first) == (0, 0)  # create a session
    assert fetched(first) == {T0: 10, T2: 30}
    assert forgotten(first) == set()
    respond(first, {T0: data(T0, records(10, 2)), T2: data(T2)}, session_id=123)
    second = s.fetch()
    assert session(second) == (123, 1)
    assert fetched(second) == {T0: 12}  # T2's offset did not move: the broker remembers it
    assert forgotten(second) == set()
    respond(second, {}, session_id=123)
    third = s.fetch()
    assert session(third) == (123, 2)
    assert fetched(third) == {}
    assert forgotten(third) == set()


def test_incremental_request_lists_forgotten_partitions() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    respond(s.fetch(), {}, session_id=5)
    s.subs.assign([T0])
    request = s.fetch()
    assert session(request) == (5, 1)
    assert fetched(request) == {}
    assert forgotten(request) == {T2}
    respond(request, {}, session_id=5)
    s.subs.assign([T0, T2])  # back again: the broker forgot it, so it is sent
    s.subs.seek(T2, 30)
    request = s.fetch()
    assert session(request) == (5, 2)
    assert fetched(request) == {T2: 30}
    assert forgotten(request) == set()


def test_partition_assigned_again_gets_a_full_fetch() -> None:
    # Unassigned and assigned again with no request in between: the broker's session still holds
    # the partition, unchanged, and an incremental response would leave it out (no news), so the new
    # state would never learn its high watermark.  The request is a full one.
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, high_watermark=10)}, session_id=5)
    assert s.subs.partitions[T0].high_watermark == 10
    s.subs.assign([])
    s.start({T0: 10})
    request = s.fetch()
    assert session(request) == (0, 0)  # full: a new session
    assert fetched(request) == {T0: 10}
    respond(request, {T0: data(T0, high_watermark=10)}, session_id=6)
    assert s.subs.partitions[T0].high_watermark == 10
    assert session(s.fetch()) == (6, 1)  # then incremental again


def test_incremental_request_resends_a_seeked_partition() -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    respond(s.fetch(), {}, session_id=5)
    s.subs.seek(T2, 3)
    assert fetched(s.fetch()) == {T2: 3}


def test_buffered_partition_is_forgotten_then_added_back() -> None:
    s = Setup(buffer_bytes=2 * PARTITION_MAX)
    s.start({T0: 0, T2: 30})
    respond(s.fetch(), {T0: data(T0, payload_of(PARTITION_MAX))}, session_id=9)
    request = s.fetch()
    assert fetched(request) == {}
    assert forgotten(request) == {T0}
    respond(request, {}, session_id=9)
    s.buffer.drop(lambda f: False)
    request = s.fetch()
    assert fetched(request) == {T0: s.subs.partitions[T0].fetch_offset}


@pytest.mark.parametrize("code", [70, 71])  # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
def test_session_error_resets_to_a_full_request(code: int) -> None:
    s = Setup()
    s.start({T0: 10, T2: 30})
    respond(s.fetch(), {}, session_id=5)
    incremental = s.fetch()
    assert session(incremental) == (5, 1)
    respond(incremental, {}, error_code=code)
    assert s.errors == []
    full = s.fetch()
    assert session(full) == (0, 0)
    assert fetched(full) == {T0: 10, T2: 30}


def test_broker_without_session_keeps_full_requests() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {}, session_id=0)
    assert session(s.fetch()) == (0, 0)


def test_sessions_disabled() -> None:
    s = Setup(use_sessions=False)
    s.start({T0: 10})
    respond(s.fetch(), {}, session_id=5)
    request = s.fetch()
    assert session(request) == (0, -1)  # no session, and do not create one
    assert fetched(request) == {T0: 10}


def test_versions_before_7_have_no_session() -> None:
    s = Setup(versions={"Fetch": 6})
    s.start({T0: 10})
    request = s.fetch()
    assert request.version == 6
    respond(request, {T0: data(T0, records(10, 1))})
    request = s.fetch()
    assert fetched(request) == {T0: 11}


def test_incremental_request_resends_a_partition_whose_leader_epoch_moved() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(), {}, session_id=5)
    s.metadata.request_update()
    s.leaders[T0] = (1, 6)  # same leader, new epoch
    load_metadata(s.metadata, s.clock, s.leaders)
    request = s.fetch()
    assert fetched(request) == {T0: 10}
    assert request.body()["topics"][0]["partitions"][0]["current_leader_epoch"] == 6


# -- log truncation (KIP-320) -------------------------------------------------------------------------


def partition_sent(request: Sent) -> dict[str, Any]:
    [topic] = request.body()["topics"]
    [partition] = topic["partitions"]
    return dict(partition)


def test_last_fetched_epoch_is_the_epoch_of_the_last_fetched_batch() -> None:
    s = Setup()
    s.start({T0: 10})
    unknown = s.fetch(12)
    assert partition_sent(unknown)["last_fetched_epoch"] == -1  # nothing fetched, no epoch given
    respond(unknown, {})
    s.subs.partitions[T0].set_position(10, leader_epoch=5)
    s.subs.partitions[T0].validated_for = 5
    first = s.fetch(12)
    assert partition_sent(first)["last_fetched_epoch"] == 5  # the epoch the position came with
    payload = records(10, 2, partition_leader_epoch=4) + records(12, 2, partition_leader_epoch=5)
    respond(first, {T0: data(T0, payload)})
    assert partition_sent(s.fetch(12))["last_fetched_epoch"] == 5


def test_last_fetched_epoch_is_not_sent_before_v12() -> None:
    s = Setup()
    s.start({T0: 10})
    respond(s.fetch(11), {T0: data(T0, records(10, 2, partition_leader_epoch=5))})
    assert partition_sent(s.fetch(11))["last_fetched_epoch"] == -1  # the codec accepts only the default


def diverging(tp: TopicPartition, epoch: int, end_offset: int) -> dict[str, Any]:
    return {**data(tp), "diverging_epoch": {"epoch": epoch, "end_offset": end_offset}}


def fetched_20_in_epoch_5(default_reset: str, position: int = 20) -> Setup:
    s = Setup(default_reset=default_reset)
    s.start({T0: 10})
    respond(s.fetch(), {T0: data(T0, records(10, 10, partition_leader_epoch=5), high_watermark=20)})
    s.subs.partitions[T0].position = s.subs.partitions[T0].consumed = position  # handed out up to here
    return s


@pytest.mark.parametrize("version", range(12, MAX_FETCH + 1))
def test_diverging_epoch_moves_the_position_back(version: int) -> None:
    s = fetched_20_in_epoch_5("earliest")
    request = s.fetch(version)
    assert partition_sent(request)["last_fetched_epoch"] == 5
    respond(request, {T0: diverging(T0, 5, 16)})
    state = s.subs.partitions[T0]
    assert (state.phase, state.position, state.fetch_offset, state.leader_epoch) == (
        PartitionPhase.FETCHING, 16, 16, 5)
    assert buffered(s) == []
    assert s.errors == []
    assert fetched(s.fetch()) == {T0: 16}
    s.h.assert_idle("OffsetForLeaderEpoch")  # the fetch answered the question: no extra round trip


def test_diverging_epoch_with_reset_none_is_a_log_truncation_error() -> None:
    s = fetched_20_in_epoch_5("none")
    respond(s.fetch(), {T0: diverging(T0, 5, 16)})
    [error] = s.errors
    assert isinstance(error, LogTruncationError)
    assert (error.position, error.divergent_offset) == (20, 16)
    s.h.advance(3600)
    assert s.fetches() == []


def test_diverging_epoch_within_the_read_ahead_refetches_it() -> None:
    s = fetched_20_in_epoch_5("earliest", position=14)
    respond(s.fetch(), {T0: diverging(T0, 5, 16)})
    state = s.subs.partitions[T0]
    assert (state.position, state.fetch_offset) == (14, 14)
    assert buffered(s) == []
    assert fetched(s.fetch()) == {T0: 14}


def test_partition_awaiting_validation_is_not_fetched_and_its_data_dropped() -> None:
    s = fetched_20_in_epoch_5("earliest")
    request = s.fetch()
    s.leaders[T0] = (1, 6)  # a new leader epoch: the position is checked against it first
    s.metadata.request_update()
    load_metadata(s.metadata, s.clock, s.leaders)
    s.h.poll()
    assert s.subs.partitions[T0].phase is PartitionPhase.AWAIT_VALIDATION
    assert s.h.take_all("Fetch") == []
    assert buffered(s) == []  # read-ahead from the old leader goes while the position is checked
    request.respond(fetch_body(request.version, {T0: data(T0, records(20, 2))}))  # sent before: stale
    assert buffered(s) == []


# -- topic ids (Fetch v13+) ----------------------------------------------------------------------------


def test_v13_names_topics_by_id() -> None:
    s = Setup()
    s.start({T0: 10, U0: 0})
    request = s.fetch(13)
    assert request.request.max_version is None
    topics = request.body()["topics"]
    assert {t["topic_id"] for t in topics} == {topic_id("t"), topic_id("u")}
    assert {t["topic"] for t in topics} == {""}
    respond(request, {T0: data(T0, records(10, 1)), U0: data(U0, records(0, 2))})
    assert {(c.tp, c.next_offset) for c in buffered(s)} == {(T0, 11), (U0, 2)}


def test_response_with_unknown_topic_id_requests_metadata() -> None:
    s = Setup()
    s.start({T0: 10})
    request = s.fetch(13)
    respond(request, {T0: data(T0, records(10, 1))}, topic_ids={"t": b"\x01" * 16})
    assert buffered(s) == []
    s.h.take("Metadata")


def test_unknown_topic_id_caps_fetch_at_v12() -> None:
    s = Setup(topic_ids={"u": bytes(16)})
    s.start({T0: 10, U0: 0})
    request = s.fetch()
    assert request.request.max_version == 12
    assert request.version == 12
    assert fetched(request) == {T0: 10, U0: 0}
    assert {t["topic"] for t in request.body()["topics"]} == {"t", "u"}


def test_forgotten_topics_by_id() -> None:
    s = Setup()
    s.start({T0: 10, U0: 0})
    respond(s.fetch(13), {}, session_id=5)
    s.subs.assign([T0])
    request = s.fetch(13)
    assert forgotten(request) == {U0}


def test_forgotten_topic_gone_from_metadata() -> None:
    s = Setup()
    s.start({T0: 10, U0: 0})
    respond(s.fetch(13), {}, session_id=5)
    s.subs.assign([T0])
    del s.leaders[U0]  # the topics of interest shrink, and so does the next metadata response
    s.metadata.request_update()
    load_metadata(s.metadata, s.clock, s.leaders)
    assert "u" not in s.metadata.cluster.topics
    request = s.fetch(13)
    assert forgotten(request) == {U0}


# -- scan_record_set -----------------------------------------------------------------------------------


def scan(payload: bytes) -> tuple[int, int]:
    return scan_record_set(memoryview(payload))


def test_scan_empty_and_tiny() -> None:
    assert scan(b"") == (-1, 0)
    assert scan(b"\x00" * 16) == (-1, 0)


def test_scan_complete_batches() -> None:
    a, b = records(0, 3), records(3, 2)
    assert scan(a) == (3, len(a))
    assert scan(a + b) == (5, len(a) + len(b))


def test_scan_truncated_data() -> None:
    a, b = records(0, 3), records(3, 2)
    for cut in (1, 12, 17, 30, len(b) - 1):
        assert scan(a + b[:cut]) == (3, len(a)), cut
    assert scan(b[:-1]) == (-1, 0)


def test_scan_negative_size_stops() -> None:
    a = records(0, 1)
    bad = (5).to_bytes(8, "big") + (-1).to_bytes(4, "big", signed=True) + b"\x00" * 20
    assert scan(a + bad) == (1, len(a))


def test_scan_uses_last_offset_delta() -> None:
    batch = build_batch([(b"k", b"v")], base_offset=40, offset_deltas=[0], last_offset_delta=9)
    assert scan(batch) == (50, len(batch))


def test_scan_legacy_message_sets() -> None:
    plain = build_legacy_message_set([(b"a", b"1"), (b"b", b"2")], magic=1, base_offset=7)
    assert scan(plain) == (9, len(plain))
    wrapped = build_legacy_message_set([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], magic=1, base_offset=7,
                                       compression=CODEC_GZIP)
    assert scan(wrapped) == (10, len(wrapped))  # the wrapper carries the last inner offset
    v0 = build_legacy_message_set([(None, b"x")], magic=0, base_offset=3)
    assert scan(v0 + plain[:10]) == (4, len(v0))


# -- fetching from a follower (KIP-392) ----------------------------------------------------------------


def preferred(tp: TopicPartition, replica: int, **kwargs: Any) -> dict[str, Any]:
    return {**data(tp, **kwargs), "preferred_read_replica": replica}


def on_follower(s: Setup) -> Sent:
    """T0 (leader 1) started at 10; the leader names node 2; the next fetch goes there."""
    s.start({T0: 10})
    leader = s.fetch()
    assert leader.node_id == 1 and leader.body()["rack_id"] == "rack-a"
    respond(leader, {T0: preferred(T0, 2, high_watermark=20)})
    follower = s.fetch()
    assert follower.node_id == 2 and fetched(follower) == {T0: 10}
    return follower


def test_a_preferred_read_replica_is_fetched_from_and_counted() -> None:
    s = Setup()
    follower = on_follower(s)
    respond(follower, {T0: data(T0, records(10, 5), high_watermark=20)})
    request = s.fetch()
    assert request.node_id == 2 and fetched(request) == {T0: 15}
    assert s.fetcher.responses_by_node == {1: 1, 2: 1}
    assert [f.fetch_offset for f in buffered(s)] == [10]


def test_the_preferred_read_replica_expires_after_its_time_to_live() -> None:
    s = Setup()
    follower = on_follower(s)
    s.h.advance(300)  # metadata_max_age_ms's default: the leader is asked again
    respond(follower, {T0: data(T0, high_watermark=20)})
    assert s.fetch().node_id == 1


def test_the_choice_of_a_read_replica_ending_wakes_the_loop() -> None:
    """The loop turns when the choice ends, fetch in flight or not: a partition read out of the
    buffer is judged by the fetch manager's plan (``may_fetch_after_release``), which holds till
    then."""
    s = Setup()
    on_follower(s)
    assert s.fetcher.next_deadline(s.clock.now) == pytest.approx(s.clock.now + 300)


@pytest.mark.parametrize("code", [1, 6, 9])  # OFFSET_OUT_OF_RANGE, NOT_LEADER_OR_FOLLOWER, REPLICA_NOT_AVAILABLE
def test_a_partition_error_at_the_follower_goes_back_to_the_leader_without_a_reset(code: int) -> None:
    s = Setup(default_reset="none")
    respond(on_follower(s), {T0: data(T0, error_code=code)})
    assert s.errors == []
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.FETCHING and state.fetch_offset == 10
    s.h.advance(BACKOFF)
    request = s.fetch()
    assert request.node_id == 1 and fetched(request) == {T0: 10}


def test_a_failed_fetch_from_the_follower_goes_back_to_the_leader() -> None:
    s = Setup()
    on_follower(s).fail(KafkaConnectionError("connection to node 2 was lost"))
    s.h.advance(BACKOFF)
    request = s.fetch()
    assert request.node_id == 1 and fetched(request) == {T0: 10}


def test_a_replica_missing_from_the_metadata_refreshes_it_and_the_leader_serves_meanwhile() -> None:
    s = Setup(leaders={T0: (1, 5)})  # the metadata lists broker 1 only
    s.start({T0: 10})
    respond(s.fetch(), {T0: preferred(T0, 3, high_watermark=20)})
    request = s.fetch()
    assert request.node_id == 1
    metadata = s.h.take("Metadata")
    metadata.respond(metadata_body(s.leaders, brokers=[1, 3]))
    respond(request, {T0: data(T0, high_watermark=20)})
    assert s.fetch().node_id == 3
