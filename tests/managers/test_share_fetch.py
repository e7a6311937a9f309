"""ShareFetchManager: share sessions, acquired records, acknowledgements riding on ShareFetch or sent
in ShareAcknowledge, commit outcomes per partition, closing (scripted, fake clock)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncconsumer.errors import (
    REFRESH_METADATA_CODES,
    CorruptRecordError,
    DecompressionLimitError,
    InvalidRecordStateError,
    KafkaError,
    ShareSessionNotFoundError,
    UnsupportedVersionError,
)
from asyncconsumer.managers.share_fetch import GAP, ShareBatch, ShareFetchManager, acquired
from asyncconsumer.protocol.compression import CODEC_GZIP
from asyncconsumer.protocol.record_writer import build_batch
from asyncconsumer.structs import AcknowledgeType, ConsumerRecord, ShareConsumerRecord, TopicPartition

from .scripted import FakeClock, Scripted, load_metadata, new_metadata, topic_id, version_range

ACCEPT, RELEASE, REJECT, RENEW = (
    AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT, AcknowledgeType.RENEW)
#: ShareFetch v2's ShareAcquireMode values on the wire (KIP-1206).
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1

P0 = TopicPartition("jobs", 0)
P1 = TopicPartition("jobs", 1)


class Setup:
    def __init__(
        self, assigned: set[TopicPartition] | None = None, *, one_leader: bool = False, **options: Any
    ) -> None:
        self.clock = FakeClock()
        self.metadata = new_metadata(self.clock, {P0: (1, 0), P1: (1 if one_leader else 2, 0)})
        self.assigned = {P0, P1} if assigned is None else assigned
        self.batches: list[ShareBatch] = []
        self.errors: list[KafkaError] = []
        self.fetcher = ShareFetchManager(
            "workers", self.metadata, member_id=lambda: "m1", assignment=lambda: frozenset(self.assigned),
            can_fetch=lambda: True, on_batch=self.batches.append, report_error=self.errors.append,
            max_wait_ms=500, max_records=100, **options,
        )
        self.h = Scripted(self.fetcher, clock=self.clock)


def records(base: int, count: int) -> bytes:
    return build_batch([(None, f"v{base + i}".encode()) for i in range(count)], base_offset=base)


def partition(index: int, *, data: bytes = b"", acquired: list[Any] | tuple[Any, ...] = (),
              code: int = 0, ack_code: int = 0) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code, "error_message": None,
            "acknowledge_error_code": ack_code, "acknowledge_error_message": None,
            "current_leader": {"leader_id": -1, "leader_epoch": -1}, "records": data,
            "acquired_records": [{"first_offset": f, "last_offset": lst, "delivery_count": d}
                                 for f, lst, d in acquired]}


def fetch_answer(*parts: dict[str, Any], code: int = 0, lock_ms: int = 5000) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": code, "error_message": None, "acquisition_lock_timeout_ms": lock_ms,
            "responses": [{"topic_id": topic_id("jobs"), "partitions": list(parts)}] if parts else [],
            "node_endpoints": []}


def ack_answer(*parts: tuple[int, int], code: int = 0) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": code, "error_message": None, "acquisition_lock_timeout_ms": 5000,
            "responses": [{"topic_id": topic_id("jobs"), "partitions": [
                {"partition_index": p, "error_code": c, "error_message": None,
                 "current_leader": {"leader_id": -1, "leader_epoch": -1}} for p, c in parts]}] if parts else [],
            "node_endpoints": []}


def by_node(sent: list[Any]) -> dict[int | None, Any]:
    return {s.node_id: s for s in sent}


def test_one_session_per_leader_opened_with_epoch_0_and_every_partition() -> None:
    s = Setup()
    sent = by_node(s.h.sent("ShareFetch"))
    assert set(sent) == {1, 2}
    body = sent[1].body()
    assert body["share_session_epoch"] == 0 and body["group_id"] == "workers" and body["member_id"] == "m1"
    assert body["max_records"] == 100
    assert [(t["topic_id"], [p["partition_index"] for p in t["partitions"]]) for t in body["topics"]] == [
        (topic_id("jobs"), [0])]
    assert body["forgotten_topics_data"] == []


def test_acquired_records_are_handed_over_with_delivery_count_and_lock_deadline() -> None:
    s = Setup({P0})
    sent = s.h.take("ShareFetch")
    sent.respond(fetch_answer(partition(0, data=records(0, 4), acquired=[(0, 1, 1), (2, 3, 2)]), lock_ms=7000))
    assert len(s.batches) == 1
    got = [(a.offset, a.value, a.delivery_count) for a in s.batches[0].records]
    assert got == [(0, b"v0", 1), (1, b"v1", 1), (2, b"v2", 2), (3, b"v3", 2)]
    assert s.batches[0].records[0].lock_deadline == s.clock.now + 7.0
    assert s.fetcher.lock_timeout == 7.0


def test_records_outside_the_acquired_ranges_are_dropped_and_missing_offsets_acknowledged_as_gaps() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(1, 4, 1)])))
    assert [a.offset for a in s.batches[0].records] == [1, 2]
    assert s.fetcher.queued(P0) == [(3, 4, GAP)]


def test_no_new_fetch_while_the_last_records_are_not_handed_out() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 2), acquired=[(0, 1, 1)])))
    s.h.assert_idle("ShareFetch")
    s.fetcher.records_handed_out(1, 2)
    body = s.h.take("ShareFetch").body()
    assert body["share_session_epoch"] == 1
    assert body["topics"] == []  # nothing new in the session, no acknowledgements


def test_acknowledgements_ride_on_the_next_share_fetch() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(0, 2, 1)])))
    s.fetcher.records_handed_out(1, 3)
    for offset, kind in [(0, ACCEPT), (1, ACCEPT), (2, REJECT)]:
        s.fetcher.acknowledge(P0, offset, kind)
    sent = s.h.take("ShareFetch")
    s.h.assert_idle("ShareAcknowledge")
    (topic,) = sent.body()["topics"]
    (entry,) = topic["partitions"]
    assert entry["acknowledgement_batches"] == [
        {"first_offset": 0, "last_offset": 1, "acknowledge_types": [ACCEPT]},
        {"first_offset": 2, "last_offset": 2, "acknowledge_types": [REJECT]},
    ]
    assert s.fetcher.pending_acknowledgements() == 0


def test_acknowledge_each_queues_what_acknowledge_would_one_at_a_time() -> None:
    """The application's queue of explicit acknowledgements, in runs of a partition and back again:
    what rides on the next ShareFetch is what ``acknowledge`` one by one would have sent (the last
    kind of an offset wins), and a RENEW among them goes at once in a ShareAcknowledge."""
    queue = [(("jobs", 0, 0), ACCEPT), (("jobs", 0, 1), REJECT), (("jobs", 1, 5), RELEASE),
             (("jobs", 0, 2), ACCEPT), (("jobs", 0, 1), ACCEPT), (("jobs", 1, 6), RELEASE)]
    sent: list[Any] = []
    for each in (True, False):
        s = Setup()  # jobs-0 led by node 1, jobs-1 by node 2: a ShareFetch each
        s.h.poll()
        first = {r.node_id: r for r in s.h.take_all("ShareFetch")}
        first[1].respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(0, 2, 1)])))
        first[2].respond(fetch_answer(partition(1, data=records(5, 2), acquired=[(5, 6, 1)])))
        s.fetcher.records_handed_out(1, 3)
        s.fetcher.records_handed_out(2, 2)
        if each:
            s.fetcher.acknowledge_each(queue)
        else:
            for (topic, index, offset), kind in queue:
                s.fetcher.acknowledge(TopicPartition(topic, index), offset, kind)
        s.h.poll()
        sent.append([p for r in s.h.take_all("ShareFetch") for t in r.body()["topics"] for p in t["partitions"]])
        assert s.fetcher.pending_acknowledgements() == 0
    assert sent[0] == sent[1]
    batches = {p["partition_index"]: p["acknowledgement_batches"] for p in sent[0]}
    assert batches == {
        0: [{"first_offset": 0, "last_offset": 2, "acknowledge_types": [ACCEPT]}],
        1: [{"first_offset": 5, "last_offset": 6, "acknowledge_types": [RELEASE]}],
    }
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)
    s.fetcher.acknowledge_each([(("jobs", 0, 0), RENEW)])
    assert s.h.take("ShareAcknowledge").at(2).body()["is_renew_ack"] is True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 12),
                          st.sampled_from([ACCEPT, RELEASE, REJECT, RENEW])), max_size=40))
def test_acknowledge_each_files_the_runs_acknowledge_would(queue: list[tuple[int, int, AcknowledgeType]]) -> None:
    each, one = Setup(), Setup()
    each.fetcher.acknowledge_each([(("jobs", p, offset), kind) for p, offset, kind in queue])
    for p, offset, kind in queue:
        one.fetcher.acknowledge(TopicPartition("jobs", p), offset, kind)
    assert [each.fetcher.queued(tp) for tp in (P0, P1)] == [one.fetcher.queued(tp) for tp in (P0, P1)]
    assert each.fetcher.pending_acknowledgements() == len({(p, offset) for p, offset, _ in queue})


def test_commit_sends_a_share_acknowledge_when_not_fetching_and_reports_per_partition() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 2), acquired=[(0, 1, 1)])))
    # records still buffered: no fetch, so the commit goes as ShareAcknowledge
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    s.fetcher.acknowledge(P0, 1, RELEASE)
    waiter = s.fetcher.commit()
    sent = s.h.take("ShareAcknowledge")
    body = sent.body()
    assert body["share_session_epoch"] == 1
    assert body["topics"][0]["partitions"][0]["acknowledgement_batches"] == [
        {"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]},
        {"first_offset": 1, "last_offset": 1, "acknowledge_types": [RELEASE]},
    ]
    assert not waiter.done()
    sent.respond(ack_answer((0, 0)))
    assert waiter.result() == {P0: None}
    s.fetcher.records_handed_out(1, 2)
    assert s.h.take("ShareFetch").body()["share_session_epoch"] == 2


def test_commit_with_nothing_pending_completes_at_once() -> None:
    s = Setup({P0})
    assert s.fetcher.commit().result() == {}


def test_a_failed_acknowledgement_is_a_typed_error_for_its_partition() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    waiter = s.fetcher.commit()
    s.h.take("ShareAcknowledge").respond(ack_answer((0, 121)))  # INVALID_RECORD_STATE
    assert isinstance(waiter.result()[P0], InvalidRecordStateError)


def test_acknowledgement_errors_on_a_share_fetch_reach_the_commit() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    sent = s.h.take("ShareFetch")  # the acks ride here (the node was free to fetch)
    waiter = s.fetcher.commit()  # waits for the acks already on their way
    sent.respond(fetch_answer(partition(0, ack_code=121)))
    assert isinstance(waiter.result()[P0], InvalidRecordStateError)


@pytest.mark.parametrize("code", sorted(REFRESH_METADATA_CODES))
def test_a_partition_error_that_new_metadata_fixes_refreshes_metadata_and_is_not_the_applications(code: int) -> None:
    """Every code of the generated refresh set (NOT_LEADER_OR_FOLLOWER while a broker restarts, ...):
    metadata is refreshed, the node waits the backoff, and nothing reaches the application, as with
    Java's share consumer.  Reporting them made every poll during kafkatest's broker rolling bounce
    raise NotLeaderOrFollowerError, and the verifiable share consumers exit."""
    s = Setup({P0})
    metadata = Scripted(s.metadata, clock=s.clock)
    s.h.advance(1.0)
    metadata.assert_idle()
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, code=code)))
    assert s.errors == []
    metadata.take("Metadata")
    s.h.assert_idle("ShareFetch")
    s.h.advance(0.1)
    assert s.h.take("ShareFetch").node_id == 1


def test_after_not_leader_the_partition_is_fetched_from_its_new_leader_and_forgotten_by_the_old() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, code=6)))  # NOT_LEADER_OR_FOLLOWER
    load_metadata(s.metadata, s.clock, {P0: (2, 1), P1: (2, 0)})
    s.h.advance(0.1)
    sent = by_node(s.h.sent("ShareFetch"))
    assert set(sent) == {1, 2}
    assert sent[1].body()["forgotten_topics_data"] == [{"topic_id": topic_id("jobs"), "partitions": [0]}]
    new = sent[2].body()
    assert new["share_session_epoch"] == 0
    assert [p["partition_index"] for p in new["topics"][0]["partitions"]] == [0]
    assert s.errors == []


def test_acknowledgements_of_a_partition_whose_leader_is_unknown_fail_with_a_typed_error() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    waiter = s.fetcher.commit()
    load_metadata(s.metadata, s.clock, {P0: (-1, 1), P1: (2, 0)})  # P0's leader is gone
    s.h.assert_idle("ShareAcknowledge")
    error = waiter.result()[P0]
    assert isinstance(error, KafkaError) and "no leader known for jobs-0" in str(error), error
    assert s.fetcher.pending_acknowledgements() == 0


def test_a_partition_error_new_metadata_cannot_fix_is_reported() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, code=29)))  # TOPIC_AUTHORIZATION_FAILED
    assert [type(e).code for e in s.errors] == [29]


def test_renew_goes_at_once_in_a_share_acknowledge_flagged_as_renew() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)
    s.fetcher.acknowledge(P0, 0, RENEW)
    sent = s.h.take("ShareAcknowledge").at(2)
    s.h.assert_idle("ShareFetch")  # one request per session at a time
    body = sent.body()
    assert body["is_renew_ack"] is True
    assert body["topics"][0]["partitions"][0]["acknowledgement_batches"][0]["acknowledge_types"] == [RENEW]


def test_a_lost_session_starts_over_with_epoch_0_after_the_backoff() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    sent = s.h.take("ShareFetch")
    waiter = s.fetcher.commit()
    sent.respond(fetch_answer(code=122))  # SHARE_SESSION_NOT_FOUND
    assert isinstance(waiter.result()[P0], ShareSessionNotFoundError)
    s.h.assert_idle("ShareFetch")
    s.h.advance(0.2)
    assert s.h.take("ShareFetch").body()["share_session_epoch"] == 0


def test_a_revoked_partition_is_forgotten_in_the_session() -> None:
    s = Setup({P0, TopicPartition("jobs", 2)})
    s.metadata = s.metadata  # jobs-2 has no leader known: it is skipped and metadata asked for
    s.h.take("ShareFetch").respond(fetch_answer())
    s.assigned.clear()
    body = s.h.take("ShareFetch").body()
    assert body["forgotten_topics_data"] == [{"topic_id": topic_id("jobs"), "partitions": [0]}]


def test_closing_sends_the_last_acknowledgements_with_epoch_minus_1() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 2), acquired=[(0, 1, 1)])))
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    s.fetcher.acknowledge(P0, 1, RELEASE)
    s.fetcher.start_closing()
    assert not s.fetcher.done_closing
    sent = s.h.take("ShareAcknowledge")
    assert sent.body()["share_session_epoch"] == -1
    sent.respond(ack_answer((0, 0)))
    assert s.fetcher.done_closing
    s.h.assert_idle()


def test_records_arriving_while_closing_are_released() -> None:
    s = Setup({P0})
    sent = s.h.take("ShareFetch")
    s.fetcher.start_closing()
    sent.respond(fetch_answer(partition(0, data=records(0, 2), acquired=[(0, 1, 1)])))
    assert s.batches == []
    final = s.h.take("ShareAcknowledge")
    assert final.body()["topics"][0]["partitions"][0]["acknowledgement_batches"] == [
        {"first_offset": 0, "last_offset": 1, "acknowledge_types": [RELEASE]}]


def acks_sent(s: Setup) -> dict[int, list[Any]]:
    """The acknowledgement batches the next ShareFetch carries, by partition."""
    (topic,) = s.h.take("ShareFetch").body()["topics"]
    return {p["partition_index"]: p["acknowledgement_batches"] for p in topic["partitions"]}


def corrupt(batch: bytes) -> bytes:
    spoilt = bytearray(batch)
    spoilt[-1] ^= 0xFF  # inside the CRC-covered records
    return bytes(spoilt)


def test_a_corrupt_batch_is_rejected_and_reported_and_the_records_around_it_are_handed_out() -> None:
    """As Java's share consumer: the records before and after the bad batch are handed out, its
    acquired records rejected (they would fail again), the typed error goes to the application;
    the other partitions of the answer are unaffected."""
    s = Setup({P0, P1}, one_leader=True)
    data = records(0, 2) + corrupt(records(2, 3)) + records(5, 2)
    s.h.take("ShareFetch").respond(fetch_answer(
        partition(0, data=data, acquired=[(1, 6, 1)]), partition(1, data=records(0, 2), acquired=[(0, 1, 1)])))
    assert [(b.tp, [r.offset for r in b.records]) for b in s.batches] == [(P0, [1, 5, 6]), (P1, [0, 1])]
    (error,) = s.errors
    assert isinstance(error, CorruptRecordError)
    assert (error.topic, error.partition, error.offset) == ("jobs", 0, 2) and "CRC" in str(error)
    assert "its 3 acquired record(s) rejected" in error.__notes__[0]
    s.fetcher.records_handed_out(1, 5)
    assert acks_sent(s)[0] == [{"first_offset": 2, "last_offset": 4, "acknowledge_types": [REJECT]}]


def test_a_batch_whose_length_cannot_be_trusted_releases_everything_from_it_on() -> None:
    s = Setup({P0})
    bad = bytearray(records(2, 3))
    bad[8:12] = (10).to_bytes(4, "big")  # shorter than a v2 header: nothing after it can be read
    data = records(0, 2) + bytes(bad) + records(5, 2)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=data, acquired=[(0, 6, 1)])))
    assert [r.offset for r in s.batches[0].records] == [0, 1]
    assert isinstance(s.errors[0], CorruptRecordError)
    assert "5 acquired record(s) from it on released" in s.errors[0].__notes__[0]
    s.fetcher.records_handed_out(1, 2)
    assert acks_sent(s)[0] == [{"first_offset": 2, "last_offset": 6, "acknowledge_types": [RELEASE]}]


def test_a_batch_past_the_decompression_bound_is_released_for_a_member_with_more_room() -> None:
    s = Setup({P0}, max_decompressed=100)
    data = build_batch([(None, b"x" * 1000)], base_offset=0, compression=CODEC_GZIP) + records(1, 1)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=data, acquired=[(0, 1, 1)])))
    assert [r.offset for r in s.batches[0].records] == [1]
    (error,) = s.errors
    assert isinstance(error, DecompressionLimitError) and "max_batch_decompressed_bytes" in str(error)
    s.fetcher.records_handed_out(1, 1)
    assert acks_sent(s)[0] == [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [RELEASE]}]


def test_a_bad_batch_with_no_acquired_record_is_not_the_applications_error() -> None:
    s = Setup({P0})
    data = corrupt(records(0, 2)) + records(2, 2)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=data, acquired=[(2, 3, 1)])))
    assert [r.offset for r in s.batches[0].records] == [2, 3]
    assert s.errors == [] and s.fetcher._acks.get(P0, {}) == {}


def test_no_share_fetch_while_the_buffer_is_at_fetch_buffer_bytes_and_again_once_records_are_taken() -> None:
    """The consumer's fetch_buffer_bytes bound: node 1's records fill it, so node 2 (whose last
    fetch brought nothing) is not fetched from until the application takes node 1's batch; the
    acknowledgements still go out (ShareAcknowledge) while it is full."""
    data = records(0, 3)
    s = Setup(buffer_bytes=len(data))
    sent = by_node(s.h.sent("ShareFetch"))
    sent[1].respond(fetch_answer(partition(0, data=data, acquired=[(0, 2, 1)])))
    assert s.batches[0].size == len(data) and s.fetcher.buffered_bytes == len(data) and s.fetcher.buffer_full
    sent[2].respond(fetch_answer())  # nothing for node 2: it would fetch again at once
    s.h.assert_idle("ShareFetch")
    s.fetcher.records_handed_out(1, 2)  # part of the batch taken: still buffered
    s.h.assert_idle("ShareFetch")
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    waiter = s.fetcher.commit()
    s.h.take("ShareAcknowledge").respond(ack_answer((0, 0)))
    assert waiter.result() == {P0: None}
    s.fetcher.records_handed_out(1, 1, freed_bytes=len(data))  # the batch is used up
    assert s.fetcher.buffered_bytes == 0 and not s.fetcher.buffer_full
    assert set(by_node(s.h.sent("ShareFetch"))) == {1, 2}


def test_the_bound_is_checked_before_each_fetch_so_it_is_passed_by_one_response_at_most() -> None:
    small = records(0, 1)
    s = Setup({P0}, buffer_bytes=len(small) + 1)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=small, acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)  # taken, batch kept (bytes not freed): under the bound still
    assert not s.fetcher.buffer_full
    big = records(1, 50)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=big, acquired=[(1, 50, 1)])))
    assert s.fetcher.buffered_bytes == len(small) + len(big) <= s.fetcher.max_buffer_bytes + len(big)
    s.fetcher.records_handed_out(1, 50)
    s.h.assert_idle("ShareFetch")  # all handed out, but the bytes are not freed: full


def test_outcomes_of_every_acknowledgement_are_kept_for_the_callback_without_gaps() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(0, 4, 1)])))
    s.fetcher.records_handed_out(1, 3)
    for offset, kind in [(0, ACCEPT), (1, RELEASE), (2, REJECT)]:
        s.fetcher.acknowledge(P0, offset, kind)
    s.h.take("ShareFetch").respond(fetch_answer(partition(0)))  # rode on the fetch, with GAPs 3 and 4
    assert [(tp, ledger.acknowledged(), error) for tp, ledger, error in s.fetcher.outcomes] == [(P0, (0, 1, 2), None)]
    s.fetcher.outcomes.clear()
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(5, 1), acquired=[(5, 5, 1)])))
    s.fetcher.acknowledge(P0, 5, ACCEPT)
    s.fetcher.commit()
    s.h.take("ShareAcknowledge").respond(ack_answer((0, 121)))  # INVALID_RECORD_STATE
    ((tp, ledger, error),) = s.fetcher.outcomes
    assert (tp, ledger.acknowledged()) == (P0, (5,)) and isinstance(error, InvalidRecordStateError)


def test_outcomes_of_acknowledgements_lost_with_the_session_carry_its_error() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 1), acquired=[(0, 0, 1)])))
    s.fetcher.records_handed_out(1, 1)
    s.fetcher.acknowledge(P0, 0, ACCEPT)
    s.h.take("ShareFetch").respond(fetch_answer(code=122))  # SHARE_SESSION_NOT_FOUND
    ((tp, ledger, error),) = s.fetcher.outcomes
    assert (tp, ledger.acknowledged()) == (P0, (0,)) and isinstance(error, ShareSessionNotFoundError)


def test_the_counters_for_metrics_count_requests_records_and_acknowledgements_by_outcome() -> None:
    s = Setup({P0})
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 3), acquired=[(0, 4, 1)])))
    assert (s.fetcher.requests, s.fetcher.responses, s.fetcher.errors) == (1, 1, 0)
    assert s.fetcher.records_acquired == 3  # offsets 3 and 4 hold no record: gaps, not records
    assert s.fetcher.response_bytes == len(records(0, 3))
    s.fetcher.records_handed_out(1, 3)
    for offset, kind in [(0, ACCEPT), (1, RELEASE), (2, REJECT)]:
        s.fetcher.acknowledge(P0, offset, kind)
    assert s.fetcher.pending_acknowledgements() == 3 + 2  # and the two gaps
    s.h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(5, 2), acquired=[(5, 6, 1)])))
    assert (s.fetcher.acknowledged, s.fetcher.acknowledgement_failures) == (3, 0)  # gaps are not counted
    assert s.fetcher.pending_acknowledgements() == 0
    s.fetcher.acknowledge(P0, 5, ACCEPT)
    s.fetcher.acknowledge(P0, 6, ACCEPT)
    s.fetcher.commit()
    s.h.take("ShareAcknowledge").respond(ack_answer((0, 121)))  # INVALID_RECORD_STATE
    assert (s.fetcher.acknowledged, s.fetcher.acknowledgement_failures) == (3, 2)
    assert s.fetcher.records_acquired == 5
    s.fetcher.records_handed_out(1, 2)
    s.h.take("ShareFetch").respond(fetch_answer(code=122))  # SHARE_SESSION_NOT_FOUND
    assert (s.fetcher.requests, s.fetcher.responses, s.fetcher.errors) == (3, 3, 1)


def test_batch_optimized_is_the_default_and_fits_share_fetch_v1() -> None:
    s = Setup({P0})
    sent = s.h.take("ShareFetch")
    assert sent.request.min_version == 0
    assert "share_acquire_mode" not in sent.request.build(1)  # (the codec would drop it at v1 anyway)
    s2 = Setup({P0})
    assert s2.h.take("ShareFetch").at(2).body()["share_acquire_mode"] == BATCH_OPTIMIZED


def test_record_limit_is_sent_in_share_fetch_v2_only() -> None:
    s = Setup({P0}, acquire_mode="record_limit")
    sent = s.h.take("ShareFetch")
    assert version_range(sent.request)[0] == 2  # a broker without v2 fails the request, see below
    body = sent.body()
    assert body["share_acquire_mode"] == RECORD_LIMIT and body["max_records"] == 100


def test_record_limit_on_a_broker_without_share_fetch_v2_is_a_typed_error_naming_the_option() -> None:
    s = Setup({P0}, acquire_mode="record_limit")
    s.h.take("ShareFetch").fail(UnsupportedVersionError("no common ShareFetch version: broker b:1 supports 1-1"))
    (error,) = s.errors
    assert isinstance(error, UnsupportedVersionError)
    assert "share_acquire_mode='record_limit'" in str(error) and "batch_optimized" in str(error)
    s.h.advance(0.2)
    s.h.take("ShareFetch").fail(UnsupportedVersionError("again"))
    assert len(s.errors) == 2  # every attempt says so: each poll raises it until the option changes


def _acquired_by_offset(
    offsets: list[int], ranges: list[tuple[int, int, int]]
) -> tuple[list[tuple[int, int]], list[int]]:
    """What ``acquired`` must find, offset by offset: (offset, delivery count) of each record a
    range covers, and the covered offsets with no record."""
    count = {o: c for first, last, c in ranges for o in range(first, last + 1)}
    got = [(o, count[o]) for o in offsets if o in count]
    return got, sorted(set(count) - set(offsets))


@given(
    offsets=st.lists(st.integers(0, 60), unique=True).map(sorted),
    cuts=st.lists(st.integers(0, 62), unique=True, max_size=12).map(sorted),
    counts=st.lists(st.integers(1, 5), min_size=6, max_size=6),
)
@settings(max_examples=300, deadline=None)
def test_acquired_takes_the_records_the_ranges_cover_and_names_the_gaps(
    offsets: list[int], cuts: list[int], counts: list[int]
) -> None:
    # Ranges from pairs of cut points (disjoint, given in any order), records anywhere around them.
    ranges = [(cuts[i], cuts[i + 1], counts[i // 2 % 6]) for i in range(0, len(cuts) - 1, 2)][::-1]
    if not ranges:
        return
    raw = [ConsumerRecord("t", 0, o, 0, 0, None, b"v%d" % o, -1, 2, (), None) for o in offsets]
    body = [{"first_offset": f, "last_offset": last, "delivery_count": c} for f, last, c in ranges]
    out, gaps = acquired(raw, body, 9.5)
    assert ([(r.offset, r.delivery_count) for r in out], sorted(gaps)) == _acquired_by_offset(offsets, ranges)
    assert all(type(r) is ShareConsumerRecord and r.lock_deadline == 9.5 and r.value == b"v%d" % r.offset
               for r in out)


def test_share_records_are_made_alike_compiled_and_in_python() -> None:
    from asyncconsumer.protocol import records as records_module

    decoded = records_module.decode_record_set(records(0, 5), topic="jobs", partition=0).records
    made = records_module.extend_records(ShareConsumerRecord, decoded, 1, 4, (3, 12.5))
    assert made == records_module.extend_records_py(ShareConsumerRecord, decoded, 1, 4, (3, 12.5))
    assert [type(r) for r in made] == [ShareConsumerRecord] * 3
    assert [(r.offset, r.value, r.delivery_count, r.lock_deadline) for r in made] == [
        (1, b"v1", 3, 12.5), (2, b"v2", 3, 12.5), (3, b"v3", 3, 12.5)]
    assert records_module.extend_records(ShareConsumerRecord, decoded, 4, 2, ()) == []
    if records_module.extend_records is not records_module.extend_records_py:
        with pytest.raises(TypeError, match="tuple subclass"):
            records_module.extend_records(dict, decoded, 0, 1, ())
        with pytest.raises(TypeError, match="must be a tuple"):
            records_module.extend_records(ShareConsumerRecord, [object()], 0, 1, ())
