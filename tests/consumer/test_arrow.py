"""``Consumer.arrow_batches()`` against real brokers: the same rows as ``batches()``, every codec.

Each test reads a topic twice, once with ``batches()`` (rows, turned into Arrow by the Spark
source's row converter) and once with ``arrow_batches()`` (the columnar decoder), and compares
the tables; then positions and commits.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pyarrow as pa
import pytest
from support.consumers import FAST, tps
from support.producer import create_topic

from asyncconsumer import ConfigError, Consumer, ConsumerRecord, TopicPartition
from asyncconsumer.app.arrow import ARROW_BATCH_RECORDS, PyArrowMissingError
from asyncconsumer.errors import RecordError
from asyncconsumer.metrics import PoolMetrics
from asyncconsumer.protocol.columnar import COLUMN_DECODER, arrow_schema
from asyncconsumer.spark.arrow import records_to_batch

pytestmark = pytest.mark.anyio

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **{**FAST, **options})


def mixed_records(n: int, partitions: int) -> list[tuple[Any, ...]]:
    """Null keys and values, empty ones, headers (with null values) on some records."""
    out: list[tuple[Any, ...]] = []
    for i in range(n):
        key = None if i % 7 == 0 else b"" if i % 11 == 0 else b"k%d" % i
        value = None if i % 5 == 0 else b"v" * (i % 300)
        headers = [("h", b"x"), (f"é-{i}", None)] if i % 3 == 0 else None
        out.append((i % partitions, key, value, headers))
    return out


async def rows(c: Consumer[Any, Any], n: int) -> list[ConsumerRecord[Any, Any]]:
    got: list[ConsumerRecord[Any, Any]] = []
    with anyio.fail_after(60):
        async for batch in c.batches():
            got += batch
            if len(got) >= n:
                break
    return got


async def arrow(c: Consumer[Any, Any], n: int, **kwargs: Any) -> list[pa.RecordBatch]:
    got: list[pa.RecordBatch] = []
    with anyio.fail_after(60):
        async for batch in c.arrow_batches(**kwargs):
            got.append(batch)
            if sum(b.num_rows for b in got) >= n:
                break
    return got


def table_of_rows(records: list[ConsumerRecord[Any, Any]], include_headers: bool = True) -> pa.Table:
    return pa.Table.from_batches([records_to_batch(records, include_headers)]).sort_by(
        [("partition", "ascending"), ("offset", "ascending")]
    )


def table_of_batches(batches: list[pa.RecordBatch], include_headers: bool = True) -> pa.Table:
    return pa.Table.from_batches(batches, schema=arrow_schema(include_headers)).sort_by(
        [("partition", "ascending"), ("offset", "ascending")]
    )


@pytest.mark.parametrize("codec", CODECS)
async def test_arrow_batches_give_the_rows_of_batches(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], codec: str
) -> None:
    topic = new_topic(3)
    total = 3000
    produce(topic, mixed_records(total, 3), compression=codec)
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 3))
        expected = await rows(c, total)
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 3))
        batches = await arrow(c, total)
        assert await c.getmany(timeout=0.3) == {}  # nothing left over
    assert len(expected) == total
    for batch in batches:
        assert batch.schema == arrow_schema(True)
        assert batch.num_rows > 0
        assert len(set(batch.column("partition").to_pylist())) == 1  # one partition per batch
        offsets = batch.column("offset").to_pylist()
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    got = table_of_batches(batches)
    want = table_of_rows(expected)
    assert got.num_rows == total
    assert got.equals(want), (got.slice(0, 3).to_pylist(), want.slice(0, 3).to_pylist())
    assert got.column("key").null_count == sum(1 for i in range(total) if i % 7 == 0)
    assert got.column("value").null_count == sum(1 for i in range(total) if i % 5 == 0)


async def test_arrow_batches_without_headers_honour_max_records_and_commit(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"x%d" % i, [("h", b"1")]) for i in range(500)])
    tp = TopicPartition(topic, 0)
    group = f"arrow-{topic}"
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign([tp])
        got = await arrow(c, 300, max_records=64, include_headers=False)
        assert max(b.num_rows for b in got) <= 64
        assert all(b.schema == arrow_schema(False) for b in got)
        handed = sum(b.num_rows for b in got)
        assert await c.position(tp) == handed
        await c.commit()
        assert await c.committed(tp) == handed
        with pytest.raises(ConfigError, match="max_records"):
            c.arrow_batches(max_records=0)
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign([tp])
        rest = await arrow(c, 500 - handed)
        assert rest[0].column("offset")[0].as_py() == handed
        assert [v.as_py() for b in rest for v in b.column("value")] == [b"x%d" % i for i in range(handed, 500)]


async def test_arrow_batches_default_to_columnar_batches_not_max_poll_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Without ``max_records`` a batch holds up to ARROW_BATCH_RECORDS, whatever the row APIs'
    ``max_poll_records``: Arrow's cost is per batch."""
    topic = new_topic(1)
    total = 3000
    produce(topic, [(0, None, b"v" * 100, None) for _ in range(total)])
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap, max_poll_records=100) as c:
        c.assign([tp])
        got = await arrow(c, total)
        assert sum(b.num_rows for b in got) == total
        assert max(b.num_rows for b in got) > 100
        assert all(b.num_rows <= ARROW_BATCH_RECORDS for b in got)
        await c.seek(tp, 0)
        with anyio.fail_after(60):
            one = await c.arrow_batch(tp)
        assert one is not None and one.num_rows > 100


async def test_arrow_batches_and_batches_take_turns_without_loss(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"%d" % i) for i in range(2000)], compression="lz4")
    seen: list[int] = []
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        with anyio.fail_after(60):
            while len(seen) < 2000:
                async for batch in c.batches(max_records=100):
                    seen += [int(r.value) for r in batch]
                    break
                if len(seen) == 2000:  # a step may bring fewer than its max: the rows may have taken the last
                    break
                async for abatch in c.arrow_batches(max_records=150):
                    seen += [int(v) for v in abatch.column("value").to_pylist()]
                    break
    assert seen[:2000] == list(range(2000))


#: The consumer's pool of column buffers serves the compiled builder; the Python builder (the
#: reference, ASYNCCONSUMER_NO_EXTENSION=1) makes its own bytearrays.
POOLED = COLUMN_DECODER == "c"


@pytest.mark.skipif(not POOLED, reason="column buffers are pooled for the compiled builder only")
async def test_column_buffers_are_used_again_only_once_no_batch_holds_them(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    # Blocks of 250 records of 1 KiB: the value columns (250 KiB) come from the consumer's pool
    # of column buffers.  Every fourth batch is kept; the others are dropped after their check, so
    # their buffers are used again.  A buffer handed out again while a kept batch still wrapped it
    # would overwrite that batch's values, which are checked again at the end.
    topic = new_topic(1)
    total = 4000

    def value(i: int) -> bytes:
        return b"%08d" % i * 128

    # Producer batches of about 48 records: a block is 250 records and at most one batch more.
    produce(topic, [(0, b"%d" % i, value(i)) for i in range(total)], batch_size=50_000)
    kept: list[pa.RecordBatch] = []
    seen = 0
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        assert c.metrics().buffers.columns == PoolMetrics()
        with anyio.fail_after(60):
            async for batch in c.arrow_batches(max_records=250):
                offsets = batch.column("offset").to_pylist()
                assert batch.column("value").to_pylist() == [value(i) for i in offsets]
                if len(kept) * 4 <= seen // 250:
                    kept.append(batch)
                seen += batch.num_rows
                del batch
                if seen >= total:
                    break
        columns = c.metrics().buffers.columns
        assert columns.reused > 0 and columns.in_use >= len(kept)
        assert 0 < columns.held_bytes <= 64 << 20
        for batch in kept:
            offsets = batch.column("offset").to_pylist()
            assert batch.column("value").to_pylist() == [value(i) for i in offsets]
        held = len(kept)
        del kept[:], batch
        # Each kept batch held a buffer of its own (its values): those are idle now.
        assert c.metrics().buffers.columns.in_use <= columns.in_use - held
        assert c.metrics().buffers.frames.allocated >= 1  # a response of 256 KiB or more


@pytest.mark.parametrize("batch_size", [None, 60_000], ids=["one-batch", "two-batches"])
async def test_a_timestamp_arrow_cannot_hold_raises_named_and_keeps_no_block_alive(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], batch_size: int | None
) -> None:
    # A record's CreateTime beyond Arrow's microsecond range: the batch cannot be made.  The error
    # names the record; the position stays before the block, so nothing is lost; and the error the
    # application keeps does not keep the block's pooled buffers (100 values of 1 KiB) in use.
    # The producer may split the records into two batches (its linger can pass under load; a
    # batch.size of 60,000 splits them 57 + 44), and Apache Kafka answers the first fetch with the
    # first batch only: then a block before the failing one was handed out, and the position is
    # after it.
    topic = new_topic(1, config={"message.timestamp.after.max.ms": str(2**63 - 1)})
    huge = 2**63 // 1000 + 1  # ms: times 1000 is past int64
    produce(topic, [(0, None, b"x" * 1024, None, 1_700_000_000_000 + i) for i in range(100)] +
            [(0, None, b"late", None, huge)], batch_size=batch_size)
    tp = TopicPartition(topic, 0)
    handed: list[int] = []
    async with consumer(bootstrap) as c:
        c.assign([tp])
        with anyio.fail_after(30), pytest.raises(RecordError, match="beyond the range") as caught:
            async for batch in c.arrow_batches(max_records=1000):
                handed += batch.column("offset").to_pylist()
                del batch
        assert caught.value.offset == 100 and caught.value.topic == topic
        assert handed == list(range(len(handed))) and len(handed) < 100
        assert await c.position(tp) == len(handed)
        columns = c.metrics().buffers.columns
        if POOLED:  # the failing block's 100 KiB of values were pooled (57 records' were not: under 64 KiB)
            assert (columns.kept >= 1 or handed) and columns.in_use == 0
        else:
            assert columns == PoolMetrics()
        got = await rows(c, 101 - len(handed))
        assert [r.offset for r in got] == list(range(len(handed), 101)) and got[-1].timestamp == huge


async def test_arrow_batches_name_the_missing_pyarrow(bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    c = consumer(bootstrap)
    with pytest.raises(PyArrowMissingError, match=r"asyncconsumer\[arrow\]"):
        c.arrow_batches()


@pytest.mark.broker
async def test_arrow_batches_read_committed_skip_aborted_transactions(apache_kafka: Any) -> None:
    from consumer.test_transactions import write_transactions

    bootstrap = str(apache_kafka.bootstrap)

    def new_topic(partitions: int = 1) -> str:
        return create_topic(bootstrap, f"arrow-tx-{uuid.uuid4().hex[:12]}", partitions, None)

    log = write_transactions(bootstrap, new_topic)
    async with consumer(bootstrap, isolation_level="read_committed") as c:
        c.assign(log.tps)
        batches = await arrow(c, len(log.committed))
        table = table_of_batches(batches)
        seen = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                          table.column("value").to_pylist(), strict=True))
        assert seen == log.committed
        ends = await c.end_offsets(log.tps)
        with anyio.fail_after(10):
            while {tp: await c.position(tp) for tp in log.tps} != ends:
                assert await c._next_arrow_batch(100, 0.1) is None  # markers only: positions move past them
