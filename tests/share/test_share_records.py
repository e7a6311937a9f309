"""The share consumer's records: made without the NamedTuple's own ``__new__``, and the same."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from asyncconsumer.app.share_collector import ShareCollector, _with
from asyncconsumer.config import build_config
from asyncconsumer.structs import AcknowledgeType, ConsumerRecord, ShareConsumerRecord, TopicPartition


def test_a_share_record_has_every_field_of_the_class() -> None:
    raw: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        "t", 3, 42, 1_700_000_000_000, 0, b"k", b"v", 1, 1, (("h", b"x"),), 7
    )
    acquired = ShareConsumerRecord(*raw, delivery_count=2, lock_deadline=123.5)
    got = _with(acquired, "key", {"value": 1})
    assert type(got) is ShareConsumerRecord
    assert len(got) == len(ShareConsumerRecord._fields)  # a field added to the class is made here too
    assert got == ShareConsumerRecord(
        "t", 3, 42, 1_700_000_000_000, 0, "key", {"value": 1}, 1, 1, (("h", b"x"),), 7, 2, 123.5
    )
    assert (got.key, got.delivery_count, got.lock_deadline, got.leader_epoch) == ("key", 2, 123.5, 7)
    assert got.topic_partition == ("t", 3)


class _Fetcher:
    lock_timeout = 30.0

    def __init__(self) -> None:
        self.acks: list[tuple[TopicPartition, list[int], AcknowledgeType]] = []

    def acknowledge_all(self, tp: TopicPartition, offsets: list[int], kind: AcknowledgeType) -> None:
        self.acks.append((tp, list(offsets), kind))

    def acknowledge(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> None:
        self.acks.append((tp, [offset], kind))

    def acknowledge_each(self, acks: Iterable[tuple[tuple[str, int, int], AcknowledgeType]]) -> None:
        for (topic, partition, offset), kind in acks:
            self.acknowledge(TopicPartition(topic, partition), offset, kind)


class _Engine:
    """What ``ShareCollector`` asks of the share loop when it hands records out and accepts them."""

    def __init__(self) -> None:
        self.fetcher = _Fetcher()
        self.posted: list[Callable[[float], None]] = []
        self.posts = 0

    def post(self, fn: Callable[[float], None]) -> None:
        self.posted.append(fn)
        self.posts += 1

    def run_posted(self) -> None:
        posted, self.posted = self.posted, []
        for fn in posted:
            fn(0.0)


def _record(topic: str, partition: int, offset: int) -> ShareConsumerRecord[bytes, bytes]:
    return ShareConsumerRecord(topic, partition, offset, 0, 0, None, b"v", -1, 1, (), None, 1, time.monotonic() + 60)


def test_records_are_handed_out_and_accepted_by_partition_in_the_order_they_came() -> None:
    # A poll's records come in runs of one partition; a partition may come back after another's.
    collector: ShareCollector[bytes, bytes] = ShareCollector(build_config({}), "implicit")
    records = [_record("a", 0, 1), _record("a", 0, 2), _record("a", 1, 5), _record("b", 0, 7), _record("a", 0, 3)]
    out = collector.hand_out_all(records)
    assert {tp: [r.offset for r in rs] for tp, rs in out.items()} == {
        TopicPartition("a", 0): [1, 2, 3], TopicPartition("a", 1): [5], TopicPartition("b", 0): [7]}
    assert all(type(tp) is TopicPartition for tp in out)
    assert sorted(collector.unacked) == [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("a", 1, 5), ("b", 0, 7)]
    collector.hand_out(_record("b", 0, 8))  # async for's way
    assert collector.delivered_by_partition() == {
        TopicPartition("a", 0): 3, TopicPartition("a", 1): 1, TopicPartition("b", 0): 2}
    engine = _Engine()
    collector._begin_poll(engine)  # type: ignore[arg-type]  # the next poll accepts them all
    assert collector.unacked == {}
    (accept,) = engine.posted
    accept(0.0)
    accepted = {(tp, o) for tp, offsets, kind in engine.fetcher.acks for o in offsets if kind is AcknowledgeType.ACCEPT}
    assert accepted == {(TopicPartition(t, p), o) for t, p, o in
                        [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("a", 1, 5), ("b", 0, 7), ("b", 0, 8)]}
    assert len(engine.fetcher.acks) == 5  # a call a run of one partition (in the order handed out), not a record


def test_acknowledgements_share_an_event_until_another_event_or_the_loop_comes_between() -> None:
    # One event a record was most of an explicit acknowledgement's cost; the order of what the
    # application asks of the loop must not change for it.
    collector: ShareCollector[bytes, bytes] = ShareCollector(build_config({}), "explicit")
    r1, r2, r5, r3 = _record("a", 0, 1), _record("a", 0, 2), _record("a", 1, 5), _record("a", 0, 3)
    collector.hand_out_all([r1, r2, r5, r3])
    engine = _Engine()
    e: Any = engine
    collector.acknowledge(e, r1, AcknowledgeType.ACCEPT)
    collector.acknowledge(e, r2, AcknowledgeType.REJECT)
    assert len(engine.posted) == 1
    engine.post(lambda now: engine.fetcher.acks.append((TopicPartition("commit", 0), [], AcknowledgeType.ACCEPT)))
    collector.acknowledge(e, r5, AcknowledgeType.RELEASE)  # after the commit: an event of its own
    assert len(engine.posted) == 3
    engine.run_posted()
    collector.acknowledge(e, r3, AcknowledgeType.ACCEPT)  # the last one ran already: a new one
    engine.run_posted()
    a0, a1 = TopicPartition("a", 0), TopicPartition("a", 1)
    assert engine.fetcher.acks == [(a0, [1], AcknowledgeType.ACCEPT), (a0, [2], AcknowledgeType.REJECT),
                                   (TopicPartition("commit", 0), [], AcknowledgeType.ACCEPT),
                                   (a1, [5], AcknowledgeType.RELEASE), (a0, [3], AcknowledgeType.ACCEPT)]
    assert collector.unacked == {}
