"""Offset lookups and position resets against Apache Kafka's exact answers.

Tansu answers ListOffsets approximately (``latest`` can lag right after a produce, a timestamp
lookup always answers the earliest offset), so these checks run on Apache Kafka only.  Every
expected offset comes from confluent-kafka's delivery reports or from what the test deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from support.consumers import FAST, tps
from support.producer import admin_client

from asyncconsumer import Consumer, OffsetAndTimestamp, TopicPartition

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

BASE = 1_700_000_000_000  # record timestamps (ms), set explicitly by the producer


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too)."""
    return str(apache_kafka.bootstrap)


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, **{**FAST, **options})


def delete_records(bootstrap: str, tp: TopicPartition, before: int) -> None:
    """DeleteRecords through confluent-kafka's admin client: the log of ``tp`` starts at ``before``."""
    admin = admin_client(bootstrap)
    for future in admin.delete_records([ConfluentTopicPartition(tp.topic, tp.partition, before)]).values():
        assert future.result(timeout=30).low_watermark == before


async def test_end_offsets_are_exact_right_after_each_produce(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(3)
    parts = tps(topic, 3)
    async with consumer(bootstrap) as c:
        assert await c.end_offsets(parts) == dict.fromkeys(parts, 0)
        assert await c.beginning_offsets(parts) == dict.fromkeys(parts, 0)
        expected = dict.fromkeys(parts, 0)
        for round_, sizes in enumerate([(5, 0, 1), (1, 7, 0), (0, 0, 30)]):
            delivered = produce(topic, [(p, None, b"r%d" % round_) for p, n in enumerate(sizes) for _ in range(n)])
            for p, offset in delivered:
                expected[parts[p]] = max(expected[parts[p]], offset + 1)
            # No wait, no retry: the answer right after the produce is the offset after the last record.
            assert await c.end_offsets(parts) == expected
        assert expected == {parts[0]: 6, parts[1]: 7, parts[2]: 31}


async def test_offsets_for_times_before_between_equal_and_after_the_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    tp0, tp1 = tps(topic, 2)
    # Partition 0: offsets 0-4 at BASE + 0, 10, 20, 30, 40 s; partition 1: offsets 0-1 at BASE + 15, 25 s.
    produce(topic, [(0, None, b"a%d" % i, None, BASE + 10_000 * i) for i in range(5)])
    produce(topic, [(1, None, b"b%d" % i, None, BASE + 15_000 + 10_000 * i) for i in range(2)])

    def at(offset: int, seconds: int) -> OffsetAndTimestamp:
        return OffsetAndTimestamp(offset, BASE + seconds * 1000, 0)

    cases: list[tuple[int, OffsetAndTimestamp | None, OffsetAndTimestamp | None]] = [
        (0, at(0, 0), at(0, 15)),  # long before: the first record
        (BASE - 1, at(0, 0), at(0, 15)),  # just before
        (BASE, at(0, 0), at(0, 15)),  # equal to the first
        (BASE + 5_000, at(1, 10), at(0, 15)),  # between: the next one
        (BASE + 20_000, at(2, 20), at(1, 25)),  # equal to one in the middle / between
        (BASE + 25_000, at(3, 30), at(1, 25)),
        (BASE + 25_001, at(3, 30), None),  # after partition 1's last record
        (BASE + 40_000, at(4, 40), None),  # equal to the last
        (BASE + 40_001, None, None),  # after every record
    ]
    async with consumer(bootstrap) as c:
        for timestamp, want0, want1 in cases:
            found = await c.offsets_for_times({tp0: timestamp, tp1: timestamp})
            assert found == {tp0: want0, tp1: want1}, f"timestamp BASE{timestamp - BASE:+d} ms"
        # Each partition its own timestamp in one call.
        assert await c.offsets_for_times({tp0: BASE + 30_000, tp1: BASE}) == {tp0: at(3, 30), tp1: at(0, 15)}


async def test_deleted_records_move_the_beginning_and_every_lookup_with_it(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    tp0, tp1 = tps(topic, 2)
    produce(topic, [(0, None, b"%d" % i, None, BASE + 1000 * i) for i in range(10)])
    produce(topic, [(1, None, b"%d" % i) for i in range(4)])
    async with consumer(bootstrap) as c:
        assert await c.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        delete_records(bootstrap, tp0, 6)
        assert await c.beginning_offsets([tp0, tp1]) == {tp0: 6, tp1: 0}
        assert await c.end_offsets([tp0, tp1]) == {tp0: 10, tp1: 4}
        # A time before the new log start finds the first record that is left.
        assert await c.offsets_for_times({tp0: BASE}) == {tp0: OffsetAndTimestamp(6, BASE + 6000, 0)}
        c.assign([tp0])
        await c.seek_to_beginning(tp0)
        assert await c.position(tp0) == 6
        with anyio.fail_after(10):
            records = (await c.getmany(timeout=5))[tp0]
        assert [r.offset for r in records] == [6, 7, 8, 9]

    # A committed offset that was deleted since is out of range: auto_offset_reset decides.
    group = f"g-{topic}"
    async with consumer(bootstrap, group_id=group) as c:
        await c.commit({tp0: 2})
    for reset, offsets in (("earliest", [6, 7, 8, 9]), ("latest", [])):
        async with consumer(bootstrap, group_id=group, auto_offset_reset=reset, enable_auto_commit=False) as c:
            c.assign([tp0])
            read: list[int] = []  # from the committed offset 2, the fetch is refused: a reset follows
            with anyio.fail_after(10):
                while await c.position(tp0) != 10:
                    read += [r.offset for rs in (await c.getmany(timeout=0.2)).values() for r in rs]
            assert read == offsets


async def test_seek_to_beginning_end_and_auto_offset_reset_land_on_the_exact_offsets(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    tp0, tp1 = tps(topic, 2)
    produce(topic, [(0, None, b"%d" % i) for i in range(8)])
    produce(topic, [(1, None, b"%d" % i) for i in range(3)])
    delete_records(bootstrap, tp1, 1)
    for reset, want in (("earliest", {tp0: 0, tp1: 1}), ("latest", {tp0: 8, tp1: 3})):
        async with consumer(bootstrap, auto_offset_reset=reset) as c:
            c.assign([tp0, tp1])
            assert {tp: await c.position(tp) for tp in (tp0, tp1)} == want
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp0, tp1])
        await c.seek_to_end()
        assert {tp: await c.position(tp) for tp in (tp0, tp1)} == {tp0: 8, tp1: 3}
        produce(topic, [(0, None, b"new")])
        with anyio.fail_after(10):
            records = (await c.getmany(timeout=5))[tp0]
        assert [(r.offset, r.value) for r in records] == [(8, b"new")]  # only what came after the seek
        await c.seek_to_beginning(tp1)
        assert await c.position(tp1) == 1
        await c.seek_to_end(tp0)
        assert await c.position(tp0) == 9
