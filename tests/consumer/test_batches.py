"""``batches()`` and the ``async for`` fast path against the real broker, on asyncio and trio.

Both hand out records taken from the buffer in chunks; these tests check that a chunk goes stale
on seek, pause and reassignment, that records taken but not handed out go back, and that commits
cover exactly what was handed out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.consumers import FAST, tps

from asyncconsumer import ConfigError, Consumer, ConsumerClosedError, ConsumerRecord, TopicPartition
from asyncconsumer.consumer import RecordDeserializationError
from asyncconsumer.errors import IllegalStateError

pytestmark = pytest.mark.anyio


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **{**FAST, **options})


def a_and_b(new_topic: Callable[..., str], produce: Callable[..., Any], each: int) -> list[TopicPartition]:
    """A two-partition topic: ``each`` records ``b"a"`` on partition 0 and ``b"b"`` on partition 1."""
    topic = new_topic(2)
    produce(topic, ((0, None, b"a") for _ in range(each)))
    produce(topic, ((1, None, b"b") for _ in range(each)))
    return tps(topic, 2)


async def read_batches(c: Consumer[Any, Any], n: int, **kwargs: Any) -> list[list[ConsumerRecord[Any, Any]]]:
    batches: list[list[ConsumerRecord[Any, Any]]] = []
    with anyio.fail_after(60):
        async for batch in c.batches(**kwargs):
            batches.append(batch)
            if sum(map(len, batches)) >= n:
                break
    return batches


async def test_batches_read_every_record_once_one_partition_per_batch(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(4)
    total = 20_000
    produce(topic, ((i % 4, b"k", b"%d" % i) for i in range(total)), compression="zstd")
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 4))
        batches = await read_batches(c, total)
        assert await c.getmany(timeout=0.3) == {}  # nothing left over
    assert all(batch for batch in batches)
    for batch in batches:
        assert len({r.partition for r in batch}) == 1
        offsets = [r.offset for r in batch]
        assert offsets == list(range(offsets[0], offsets[0] + len(batch)))
    values = Counter(int(r.value) for batch in batches for r in batch)
    assert set(values) == set(range(total)) and max(values.values()) == 1


async def test_batches_honour_max_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(300)))
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        batches = await read_batches(c, 300, max_records=64)
        assert max(map(len, batches)) == 64
        assert [r.offset for batch in batches for r in batch] == list(range(300))
        with pytest.raises(ConfigError, match="max_records"):
            c.batches(max_records=0)


async def test_commit_covers_batches_handed_out(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, ((i % 2, None, b"%d" % i) for i in range(2_000)))
    group = f"g-{topic}"
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign(tps(topic, 2))
        first = await read_batches(c, 1)
        await c.commit()
        committed = await c.committed(tps(topic, 2))
    handed_out = {TopicPartition(topic, p): 0 for p in range(2)}
    for batch in first:
        handed_out[batch[-1].topic_partition] = batch[-1].offset + 1
    assert {tp: om.offset if om else 0 for tp, om in committed.items()} == handed_out
    async with consumer(bootstrap, group_id=group) as c:
        c.assign(tps(topic, 2))
        rest = await read_batches(c, 2_000 - sum(map(len, first)))
    seen = Counter((r.partition, r.offset) for batch in first + rest for r in batch)
    assert len(seen) == 2_000 and max(seen.values()) == 1


async def test_leaving_batches_then_getmany_loses_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(3)
    total = 3_000
    produce(topic, ((i % 3, None, b"%d" % i) for i in range(total)))
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 3))
        records: list[ConsumerRecord[Any, Any]] = []
        for _ in range(3):  # each time, records of other partitions are taken but not handed out
            async for batch in c.batches(max_records=200):
                records.extend(batch)
                break
        with anyio.fail_after(30):
            while len(records) < total:
                for recs in (await c.getmany(timeout=5)).values():
                    records.extend(recs)
    values = Counter(int(r.value) for r in records)
    assert set(values) == set(range(total)) and max(values.values()) == 1


async def test_async_for_then_batches_continue_where_it_stopped(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"%d" % i) for i in range(500)))
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        first: list[int] = []
        async for record in c:
            first.append(record.offset)
            if len(first) == 7:
                break
        rest = [r.offset for batch in await read_batches(c, 493) for r in batch]
    assert first + rest == list(range(500))


async def test_seek_during_async_for_drops_the_taken_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"%d" % i) for i in range(400)))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap) as c:
        c.assign([tp])
        offsets: list[int] = []
        with anyio.fail_after(30):
            async for record in c:
                offsets.append(record.offset)
                if record.offset == 3:
                    await c.seek(tp, 300)
                if len(offsets) == 10:
                    break
    assert offsets == [0, 1, 2, 3, 300, 301, 302, 303, 304, 305]


async def test_pause_during_async_for_stops_that_partition_at_once(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    tp0, tp1 = a_and_b(new_topic, produce, 500)
    async with consumer(bootstrap) as c:
        c.assign([tp0, tp1])
        seen: list[int] = []
        paused_at = None
        with anyio.fail_after(30):
            async for record in c:
                seen.append(record.partition)
                if paused_at is None:
                    c.pause(TopicPartition(tp0.topic, record.partition))
                    paused_at = len(seen), record.partition
                if seen.count(1 - paused_at[1]) == 500:
                    break
            assert paused_at is not None
            # Nothing more from the paused partition after pause(); all of the other one.
            assert seen[paused_at[0]:].count(paused_at[1]) == 0
            c.resume(TopicPartition(tp0.topic, paused_at[1]))
            async for record in c:
                assert record.partition == paused_at[1]
                assert record.offset == 1  # resumes right after the one record it handed out
                break


async def test_reassignment_during_async_for_drops_the_old_partition(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    tp0, tp1 = a_and_b(new_topic, produce, 300)
    async with consumer(bootstrap) as c:
        c.assign([tp0])
        with anyio.fail_after(30):
            async for record in c:
                assert record.partition == 0
                break
            c.assign([tp1])
            async for record in c:
                assert record.partition == 1
                break


async def test_deserializer_error_in_batches_hands_out_the_good_records_first(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"%d" % i if i != 5 else b"bad") for i in range(10)))
    async with consumer(bootstrap, value_deserializer=lambda v: int(v)) as c:
        c.assign(tps(topic, 1))
        with anyio.fail_after(30):
            iterator = c.batches()
            first = await iterator.__anext__()
            assert [r.value for r in first] == [0, 1, 2, 3, 4]
            with pytest.raises(RecordDeserializationError) as info:
                await iterator.__anext__()
            assert info.value.offset == 5
            assert await c.position(TopicPartition(topic, 0)) == 5
            await c.seek(TopicPartition(topic, 0), 6)
            rest = await iterator.__anext__()
            assert [r.value for r in rest] == [6, 7, 8, 9]


class CountingConsumer(Consumer[bytes, bytes]):
    """Overrides the hooks, so every step of ``async for`` must go through them."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.steps = 0

    def acquire(self, operation: str) -> None:
        if operation == "__anext__":
            self.steps += 1
        super().acquire(operation)


async def test_overridden_acquire_sees_every_step_of_async_for(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(200)))
    c = CountingConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST)
    async with c:
        c.assign(tps(topic, 1))
        n = 0
        with anyio.fail_after(30):
            async for _ in c:
                n += 1
                if n == 200:
                    break
    assert c.steps == 200


@pytest.mark.parametrize("how", ["revoking", "lost"])
async def test_partition_leaving_the_group_hands_out_nothing_more(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], how: str
) -> None:
    """What the membership code does to a partition: PREPARE_REVOCATION marks it revoking; a lost
    partition is removed from the assignment at once.  Records already taken from the buffer for
    ``async for`` must not be handed out after either."""
    tp0, tp1 = a_and_b(new_topic, produce, 300)
    async with consumer(bootstrap) as c:
        c.assign([tp0, tp1])
        engine = c._engine
        assert engine is not None
        after: list[int] = []
        with anyio.fail_after(30):
            async for record in c:
                if not after:
                    gone = TopicPartition(tp0.topic, record.partition)
                    if how == "revoking":
                        engine.subscriptions.partitions[gone].revoking = True
                    else:
                        engine.subscriptions.remove([gone])
                after.append(record.partition)
                if after.count(1 - gone.partition) == 300:
                    break
        assert after.count(gone.partition) == 1  # only the record before the partition went


@pytest.mark.parametrize("api", ["async for", "batches", "getmany"])
async def test_a_crashed_background_loop_is_an_error_not_the_end_of_the_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], api: str
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(10)))
    async with consumer(bootstrap) as c:
        engine = c._engine
        assert engine is not None

        def bug(now: float) -> list[Any]:
            raise RuntimeError("a bug in a request manager")

        engine.fetcher.poll = bug  # type: ignore[method-assign]
        c.assign(tps(topic, 1))
        with anyio.fail_after(10), pytest.raises(ConsumerClosedError, match="a bug in a request manager"):
            if api == "async for":
                async for _ in c:
                    pass
            elif api == "batches":
                async for _ in c.batches():
                    pass
            else:
                await c.getmany(timeout=5)


async def test_highwater_and_last_stable_offset_follow_fetch_responses(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(25)))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap) as c:
        c.assign([tp])
        assert c.highwater(tp) is None  # no fetch response yet
        records = await read_batches(c, 10, max_records=10)
        assert c.highwater(tp) == 25 and c.last_stable_offset(tp) == 25
        assert c.highwater(tp) - await c.position(tp) == 25 - sum(map(len, records))  # lag
        produce(topic, [(0, None, b"late")])
        with anyio.fail_after(10):
            while c.highwater(tp) != 26:
                await c.getmany(timeout=0.2)
        with pytest.raises(IllegalStateError, match="not assigned"):
            c.highwater(TopicPartition(topic, 5))


async def test_highwater_known_again_after_the_partition_is_assigned_again(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    # Caught up, unassigned, assigned again: the broker's fetch session (KIP-227) still held the
    # partition, unchanged, and its incremental responses left it out, so highwater() stayed None.
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(5)))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap) as c:
        for _ in range(3):
            c.assign([tp])
            await c.seek(tp, 5)
            with anyio.fail_after(5):
                while c.highwater(tp) is None:
                    await c.getmany(timeout=0.05)
            assert c.highwater(tp) == 5
            c.assign([])


async def test_pausing_one_partition_keeps_what_was_taken_for_the_others(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    tp0, tp1 = a_and_b(new_topic, produce, 300)
    async with consumer(bootstrap) as c:
        c.assign([tp0, tp1])
        engine = c._engine
        assert engine is not None
        with anyio.fail_after(30):
            while {tp for ch in c._chunks for tp in [ch.state.tp]} != {tp0, tp1}:
                async for _ in c:  # take chunks of both partitions (hand out one record)
                    break
        first = c._chunks[0].state.tp
        other = tp1 if first == tp0 else tp0
        kept = c._chunks[0]
        c.pause(other)
        assert [ch.state.tp for ch in c._chunks] == [first] and c._chunks[0] is kept  # not thrown away
        assert engine.subscriptions.partitions[other].consumed == engine.subscriptions.partitions[other].position
        async for record in c:
            assert record.topic_partition == first  # goes on with what was taken
            break


async def test_a_paused_partition_filling_the_buffer_does_not_stop_the_others(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    # The fetch buffer at its smallest, one partition's fetch.  The application pauses tp1 once
    # its records are in the buffer, and reads tp0 to its end.  tp1's records (one batch of about
    # 200 KB, which a fetch returns whole) keep the buffer full until it is resumed; tp0, with
    # nothing left in the buffer, must still be fetched (it is all the application can read).
    topic = new_topic(2)
    each = 2_000
    small = 16 << 10  # tp0 in batches of 8 KiB: it takes many fetches
    produce(topic, ((0, None, b"a%099d" % i) for i in range(each)), batch_size=small // 2)
    produce(topic, ((1, None, b"b%099d" % i) for i in range(each)))
    tp0, tp1 = tps(topic, 2)
    async with consumer(bootstrap, max_partition_fetch_bytes=small, fetch_buffer_bytes=small) as c:
        c.assign([tp0, tp1])
        engine = c._engine
        assert engine is not None
        taken = 0
        with anyio.fail_after(30):
            while not engine.buffer.buffered_bytes(tp1):
                got = await c.getmany(tp0, timeout=0.1, max_records=1)
                taken += sum(map(len, got.values()))
        c.pause(tp1)
        assert engine.buffer.full and taken < each // 2
        offsets = [r.offset for batch in await read_batches(c, each - taken) for r in batch]
        assert offsets == list(range(taken, each))  # all of tp0 after what getmany took
        assert engine.buffer.buffered_bytes(tp1)  # still there, for when it is resumed
        c.resume(tp1)
        rest = await read_batches(c, each)
        assert {r.partition for batch in rest for r in batch} == {1}
        assert [r.offset for batch in rest for r in batch] == list(range(each))
