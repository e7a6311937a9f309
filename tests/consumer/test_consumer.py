"""The consumer against a real broker (Tansu by default), on asyncio and trio.

Data is produced with confluent-kafka, so each test is also an interop test.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support.consumers import FAST, tps

from asyncconsumer import (
    ConcurrentAccessError,
    Consumer,
    ConsumerRecord,
    NoBrokersAvailableError,
    NoOffsetForPartitionError,
    TopicPartition,
)
from asyncconsumer.errors import ConfigError, ConfigTypeError, IllegalStateError, UnknownTopicOrPartitionError

pytestmark = pytest.mark.anyio


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, **{**FAST, **options})


async def read(c: Consumer[Any, Any], n: int, timeout: float = 30.0) -> list[ConsumerRecord[Any, Any]]:
    records: list[ConsumerRecord[Any, Any]] = []
    if n <= 0:
        return records
    with anyio.fail_after(timeout):
        async for record in c:
            records.append(record)
            if len(records) == n:
                break
    return records


async def test_100k_records_across_4_partitions_none_missing_or_repeated(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(4)
    total = 100_000
    produce(topic, ((i % 4, None, b"%d" % i) for i in range(total)), compression="lz4")
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 4))
        records = await read(c, total, timeout=120)
        # Nothing more arrives after the last one.
        assert await c.getmany(timeout=0.5) == {}
    values = Counter(int(r.value) for r in records)
    assert len(values) == total and max(values.values()) == 1
    assert set(values) == set(range(total))
    for p in range(4):
        offsets = [r.offset for r in records if r.partition == p]
        assert offsets == list(range(total // 4))


async def test_commit_then_new_consumer_resumes_after_committed_offsets(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, ((i % 2, b"k", b"v%d" % i) for i in range(100)))
    group = f"g-{topic}"
    async with consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.assign(tps(topic, 2))
        first = await read(c, 30)
        await c.commit()
        committed = await c.committed(tps(topic, 2))
    expected = {
        tp: max((r.offset + 1 for r in first if r.partition == tp.partition), default=0) for tp in tps(topic, 2)
    }
    assert {tp: om.offset if om else None for tp, om in committed.items()} == expected
    async with consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 2))
        rest = await read(c, 70)
        assert await c.committed(TopicPartition(topic, 0)) == expected[TopicPartition(topic, 0)]
    seen = {(r.partition, r.offset) for r in first} | {(r.partition, r.offset) for r in rest}
    assert len(seen) == 100 and len(first) + len(rest) == 100


async def test_auto_commit_on_close_commits_consumed_positions(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(20)))
    group = f"g-{topic}"
    async with consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 1))
        await read(c, 12)
    async with consumer(bootstrap, group_id=group) as c:
        assert await c.committed(TopicPartition(topic, 0)) == 12


def produce_one_per_batch(produce: Callable[..., Any], topic: str, records: list[tuple[Any, ...]]) -> None:
    """Tansu answers ListOffsets "latest" with the last batch's base offset + 1 (a known gap), so
    tests that check "latest" write one record per batch, where that answer is exact."""
    for record in records:
        produce(topic, [record])


async def test_pausing_the_partition_being_read_wakes_the_loop_for_the_held_fetch(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """While tp0's records fill its share of the buffer, the fetch of caught-up tp1 is held back
    (for up to ``fetch_max_wait_ms``).  Pausing tp0 ends the hold, so it wakes the loop to send
    tp1's fetch (as ``resume()`` does), not leaving it to the loop's next reason to turn."""
    topic = new_topic(2)
    produce(topic, ((0, None, b"x" * 1000) for _ in range(20)))
    tp0, tp1 = tps(topic, 2)
    async with consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=20_000,
                        max_partition_fetch_bytes=512, fetch_buffer_bytes=1024) as c:
        c.assign([tp0, tp1])
        first = await c.getmany(tp0, timeout=10, max_records=1)
        assert [r.offset for r in first[tp0]] == [0]  # tp0 has more buffered: busy
        assert await c.position(tp1) == 0
        await anyio.sleep(0.3)  # the loop's turns after the answer: tp1's fetch is held
        engine = c._engine
        assert engine is not None
        wakes = []
        wake = engine.wake

        def counted() -> None:
            wakes.append(True)
            wake()

        engine.wake = counted  # type: ignore[method-assign]
        c.pause(tp0)
        assert wakes
        produce(topic, [(1, None, b"late")])
        got = await c.getmany(tp1, timeout=10)
        assert [r.value for r in got[tp1]] == [b"late"]


async def test_seek_pause_resume_position(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, ((1, None, b"%d" % i) for i in range(20)))
    produce_one_per_batch(produce, topic, [(0, None, b"%d" % i) for i in range(20)])
    tp0, tp1 = tps(topic, 2)
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp0, tp1])
        await c.seek(tp0, 15)
        assert await c.position(tp0) == 15
        c.pause(tp1)
        assert c.paused() == {tp1}
        got = await read(c, 5)
        assert [(r.partition, r.offset) for r in got] == [(0, 15), (0, 16), (0, 17), (0, 18), (0, 19)]
        assert [r.value for r in got] == [b"15", b"16", b"17", b"18", b"19"]
        assert await c.getmany(timeout=0.3) == {}  # tp0 is at its end and tp1 is paused
        c.resume(tp1)
        batch = await c.getmany(tp1, timeout=5)
        assert [r.offset for r in batch[tp1]] == list(range(20))
        await c.seek_to_beginning(tp0)
        again = await c.getmany(tp0, timeout=5, max_records=3)
        assert [r.offset for r in again[tp0]] == [0, 1, 2]
        assert await c.position(tp0) == 3
        await c.seek_to_end(tp0)
        assert await c.position(tp0) == 20


@pytest.mark.broker_feature("partition_max_bytes")
async def test_fetch_until_stops_the_read_ahead_at_the_end_of_a_range(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """A range read with ``fetch_until()`` fetches the range and the one fetch that reached its end,
    not the read-ahead a partition gets otherwise (its share of the 64 MiB buffer: all 6.25 MiB)."""
    topic = new_topic(1)
    size = 16 * 1024
    # batches of 4 records, so that the fetches are max_partition_fetch_bytes, not one larger batch
    produce(topic, [(0, None, b"v" * size)] * 400, batch_size=64 * 1024)
    tp = TopicPartition(topic, 0)
    fetch_bytes = 256 * 1024
    async with consumer(bootstrap, max_partition_fetch_bytes=fetch_bytes) as c:
        c.assign([tp])
        c.fetch_until(tp, 50)
        await c.seek(tp, 0)
        got = await read(c, 50)
        await anyio.sleep(0.5)  # time enough to read ahead, were it allowed
        fetched = c.metrics().fetch.response_bytes
    assert [r.offset for r in got] == list(range(50))
    assert 50 * size <= fetched <= 50 * size + fetch_bytes + 64 * 1024


async def test_fetch_until_names_what_is_wrong(bootstrap: str, new_topic: Callable[..., str]) -> None:
    tp = TopicPartition(new_topic(1), 0)
    async with consumer(bootstrap) as c:
        with pytest.raises(IllegalStateError, match=r"fetch_until: partition .* is not assigned"):
            c.fetch_until(tp, 5)
        c.assign([tp])
        with pytest.raises(ConfigError, match=r"fetch_until\(\): offset must be an int >= 0"):
            c.fetch_until(tp, -1)
        with pytest.raises(ConfigTypeError, match=r"fetch_until\(\): offset must be an int, got '5'"):
            c.fetch_until(tp, "5")  # type: ignore[arg-type]
        c.fetch_until(tp, None)  # no limit


async def test_headers_null_key_and_null_value(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(
        topic,
        [
            (0, None, b"no key", [("a", b"1"), ("b", None), ("a", b"2")]),
            (0, b"tombstone", None),
            (0, None, None),
            (0, b"", b""),
        ],
    )
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 1))
        r = await read(c, 4)
    assert (r[0].key, r[0].value, r[0].headers) == (None, b"no key", (("a", b"1"), ("b", None), ("a", b"2")))
    assert (r[1].key, r[1].value, r[1].serialized_value_size) == (b"tombstone", None, -1)
    assert (r[2].key, r[2].value, r[2].serialized_key_size) == (None, None, -1)
    assert (r[3].key, r[3].value, r[3].serialized_key_size) == (b"", b"", 0)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_every_compression_codec(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], codec: str
) -> None:
    topic = new_topic(1)
    values = [b"value-%d-" % i * (i % 7 + 1) for i in range(500)]
    produce(topic, ((0, b"k%d" % i, v, [("i", b"%d" % i)]) for i, v in enumerate(values)), compression=codec)
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 1))
        records = await read(c, len(values))
    assert [r.value for r in records] == values
    assert [r.key for r in records] == [b"k%d" % i for i in range(500)]
    assert records[-1].headers == (("i", b"499"),)


async def test_auto_offset_reset_earliest_latest_none(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce_one_per_batch(produce, topic, [(0, None, b"old%d" % i) for i in range(5)])
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert [r.value for r in await read(c, 5)] == [b"old%d" % i for i in range(5)]
    async with consumer(bootstrap, auto_offset_reset="latest") as c:
        c.assign([tp])
        assert await c.position(tp) == 5
        produce(topic, [(0, None, b"new")])
        assert [r.value for r in await read(c, 1)] == [b"new"]
    async with consumer(bootstrap, auto_offset_reset="none", group_id=f"none-{topic}") as c:
        c.assign([tp])
        with anyio.fail_after(10), pytest.raises(NoOffsetForPartitionError, match=topic):
            await c.getmany(timeout=5)
        await c.seek(tp, 2)  # an explicit position un-blocks the partition
        assert [r.offset for r in await read(c, 4)] == [2, 3, 4, 5]


async def test_unknown_topic_raises_typed_error_within_timeout(bootstrap: str) -> None:
    async with consumer(bootstrap) as c:
        c.assign([TopicPartition("no-such-topic-xyz", 0)])
        started = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic-xyz"):
            await c.getmany(timeout=5)
        assert time.monotonic() - started < 5
        with pytest.raises(UnknownTopicOrPartitionError):
            await c.end_offsets([TopicPartition("no-such-topic-xyz", 0)], timeout=5)
        assert await c.partitions_for_topic("no-such-topic-xyz") is None


async def test_unreachable_bootstrap_raises_within_timeout() -> None:
    from support.broker import free_port

    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    with pytest.raises(NoBrokersAvailableError, match="no broker reachable"):
        async with Consumer(bootstrap_servers=dead, request_timeout_ms=1500):
            pass
    assert time.monotonic() - started < 5


async def test_async_for_hands_out_buffered_records_without_a_loop_turn_and_checkpoints_per_chunk(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    # The documented cost model of async for: a record already taken is handed out with no turn
    # of the event loop (no other task runs in between); the loop gets its turn once per chunk,
    # when the consumer polls for more (at most max_poll_records records a chunk).
    topic = new_topic(1)
    total, per_chunk = 2000, 100
    produce(topic, ((0, None, b"%d" % i) for i in range(total)))
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            await anyio.lowlevel.checkpoint()
            turns += 1

    async with consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=per_chunk) as c:
        c.assign(tps(topic, 1))
        seen: list[int] = []
        changed = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            with anyio.fail_after(60):
                last = turns
                async for record in c:
                    seen.append(int(record.value))
                    changed += turns != last
                    last = turns
                    if len(seen) == total:
                        break
            tg.cancel_scope.cancel()
    assert seen == list(range(total))
    # Turns between chunks (every chunk is a poll, every poll a checkpoint): on asyncio one at each
    # of the 19 chunk boundaries or more; trio runs a batch of runnable tasks in random order, so
    # the ticker's turn may fall on either side of a boundary and a quarter of them look turnless ...
    assert changed >= total // per_chunk // 4
    # ... and none between two records of one chunk: most records come with no turn at all.
    assert changed <= total // 4


async def test_cancelled_iteration_then_consuming_again_loses_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    total = 3000
    produce(topic, ((i % 2, None, b"%d" % i) for i in range(total)))
    seen: list[int] = []
    async with consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=50) as c:
        c.assign(tps(topic, 2))
        for _ in range(20):
            with anyio.move_on_after(0.01):
                async for record in c:
                    seen.append(int(record.value))
                    await anyio.sleep(0.001)  # cancelled here, mid-iteration, with records buffered
        assert 0 < len(seen) < total
        with anyio.move_on_after(0):
            # Cancelled at its first wait; if records were ready it returns them first.
            for records in (await c.getmany(timeout=None)).values():
                seen += [int(r.value) for r in records]
        seen += [int(r.value) for r in await read(c, total - len(seen))]
    assert sorted(seen) == list(range(total))


async def test_two_tasks_polling_at_once_get_concurrent_access_error(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    async with consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 1))
        errors: list[BaseException] = []

        async def second_poller() -> None:
            try:
                await c.getmany(timeout=0.1)
            except ConcurrentAccessError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                c.getmany,
                *[],
            )  # first poller waits for data
            await anyio.sleep(0.2)
            await second_poller()
            tg.cancel_scope.cancel()
        assert errors and "polling this consumer" in str(errors[0])
        # Non-polling calls from another task are allowed.
        assert topic in await c.topics()


async def test_offsets_lookups_and_metadata(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], kafka_backend: Any
) -> None:
    topic = new_topic(3)
    now = int(time.time() * 1000)
    produce_one_per_batch(
        produce,
        topic,
        [(0, None, b"a", None, now - 60_000), (0, None, b"b", None, now - 30_000), (0, None, b"c", None, now)],
    )
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap) as c:
        assert topic in await c.topics()
        assert await c.partitions_for_topic(topic) == {0, 1, 2}
        assert (await c.beginning_offsets([tp]))[tp] == 0
        found = await c.offsets_for_times({tp: now - 45_000, TopicPartition(topic, 1): now})
        assert found[tp] is not None
        if kafka_backend.name == "kafka":  # Tansu answers a timestamp lookup with the earliest offset
            assert (found[tp].offset, found[tp].timestamp) == (1, now - 30_000)
            assert found[TopicPartition(topic, 1)] is None


async def test_close_is_bounded_and_idempotent(bootstrap: str) -> None:
    c = consumer(bootstrap)
    async with c:
        pass
    await c.close()
    started = time.monotonic()
    await c.close(timeout=0.1)
    assert time.monotonic() - started < 1


async def test_deserializers(bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]) -> None:
    topic = new_topic(1)
    produce(topic, [(0, b"k1", b"41"), (0, b"k2", b"oops")])
    async with consumer(
        bootstrap, auto_offset_reset="earliest", key_deserializer=bytes.decode, value_deserializer=int
    ) as c:
        c.assign(tps(topic, 1))
        first = await c.getone()
        assert (first.key, first.value) == ("k1", 41)
        from asyncconsumer import RecordDeserializationError

        with pytest.raises(RecordDeserializationError, match=r"offset 1"):
            await c.getone()
        assert await c.position(TopicPartition(topic, 0)) == 1


async def test_deserializer_error_in_getmany_loses_no_other_partition(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(0, None, b"%d" % i) for i in range(10)] + [(1, None, b"1"), (1, None, b"bad")])

    def parse(value: bytes) -> int:
        return int(value)

    async with consumer(bootstrap, auto_offset_reset="earliest", value_deserializer=parse) as c:
        c.assign(tps(topic, 2))
        from asyncconsumer import RecordDeserializationError

        got: list[tuple[int, int]] = []
        with anyio.fail_after(20):
            while len([g for g in got if g[0] == 0]) < 10:
                try:
                    batch = await c.getmany(timeout=5)
                except RecordDeserializationError as exc:
                    assert (exc.partition, exc.offset) == (1, 1)
                    await c.seek(TopicPartition(topic, 1), 2)  # skip the bad record
                    continue
                got += [(r.partition, r.value) for recs in batch.values() for r in recs]
    assert sorted(v for p, v in got if p == 0) == list(range(10))
    assert [v for p, v in got if p == 1] == [1]  # the good record before the bad one is not lost


async def test_assign_commits_what_was_processed_on_the_partitions_given_up(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"x") for p in (0, 1) for _ in range(10)])
    group = f"g-{topic}"
    tp0, tp1 = tps(topic, 2)
    async with consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as c:
        c.assign([tp0, tp1])
        await c.getmany(tp0, timeout=5, max_records=4)
        await c.getmany(tp1, timeout=5, max_records=1)  # a new poll: the 4 records of tp0 are processed
        c.assign([tp1])
        with anyio.fail_after(10):
            while await c.committed(tp0) != 4:  # noqa: ASYNC110 (polling the broker, not a local event)
                await anyio.sleep(0.05)


async def test_commit_in_flight_during_close_returns(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    tp = TopicPartition(topic, 0)
    outcome: list[object] = []
    async with consumer(bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest") as c:
        c.assign([tp])

        async def commit() -> None:
            try:
                await c.commit({tp: 0})
                outcome.append("committed")
            except Exception as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit)
            await anyio.lowlevel.checkpoint()
            with anyio.fail_after(10):
                await c.close(timeout=2)
    assert len(outcome) == 1  # the commit finished one way or the other: it did not hang


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
async def test_runs_on_uvloop(
    anyio_backend: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    import asyncio

    import uvloop

    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(1000)], compression="zstd")
    async with consumer(bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest") as c:
        c.assign(tps(topic, 2))
        records = await read(c, 1000)
        await c.commit()
        assert await c.committed(TopicPartition(topic, 0)) == 500
    assert sorted(int(r.value) for r in records) == list(range(1000))
