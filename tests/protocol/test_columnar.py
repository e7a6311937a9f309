"""Columnar decoding (protocol/columnar.py): the compiled and the pure-Python column builders against
each other and against the row path.

The oracle is the row path itself: ``CompletedFetch.take`` (managers/fetch_buffer.py) with
``decode_batch``, driven the way the collector drives it (each call from the offset after the last
record handed out).  ``ColumnReader.take`` must hand out the same records and raise the same error
after them; its chunks follow the block rule (see protocol/columnar.py); its Arrow batches must hold
exactly those records in Spark's schema; and the compiled builder's buffers must equal the Python
builder's byte for byte.  The parts that need the compiled builder are skipped, with the reason,
when it is not in use.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import subprocess
import sys
from array import array
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import nullable_bytes, records_with_deltas

from asyncconsumer.engine.buffers import BufferPool
from asyncconsumer.errors import CorruptRecordError, RecordError
from asyncconsumer.managers.fetch_buffer import CompletedFetch
from asyncconsumer.protocol import columnar
from asyncconsumer.protocol.columnar import (
    TIMESTAMP_BEYOND,
    ColumnBuffers,
    ColumnReader,
    Columns,
    PyColumnBuilder,
    arrow_schema,
    finish_columns,
    to_arrow,
)
from asyncconsumer.protocol.compression import compress
from asyncconsumer.protocol.record_writer import (
    DEFAULT_TIMESTAMP,
    Record,
    build_batch,
    build_control_batch,
    build_legacy_message_set,
)
from asyncconsumer.protocol.records import decode_batch_py, iter_batches
from asyncconsumer.structs import ConsumerRecord, TopicPartition
from protocol.test_speedups import CORRUPT, FIXTURES, FUZZ, V, _rec, damaged
from protocol.test_speedups import batches as single_batches

pa = pytest.importorskip("pyarrow")

TOPIC, PART = "orders", 3
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

C_BUILDER: Any = columnar.ColumnBuilder if columnar.COLUMN_DECODER == "c" else None
NO_C = f"the compiled column builder is not in use (COLUMN_DECODER={columnar.COLUMN_DECODER!r})"
needs_c = pytest.mark.skipif(C_BUILDER is None, reason=NO_C)


def c_bytearrays(topic: str, partition: int, headers: bool = True, max_offset: int = columnar.MAX_OFFSET,
                 allocate: Any = None, min_allocate: int = 0) -> Any:
    """The compiled builder writing into bytearrays."""
    return C_BUILDER(topic, partition, headers, max_offset)


def c_arrow_pool(topic: str, partition: int, headers: bool = True, max_offset: int = columnar.MAX_OFFSET,
                 allocate: Any = None, min_allocate: int = 0) -> Any:
    """The compiled builder writing into buffers from Arrow's memory pool."""
    return C_BUILDER(topic, partition, headers, max_offset, columnar.default_allocator())


#: What the consumer decodes column blocks into (``Collector.column_buffers``), here keeping
#: buffers from 64 bytes up, so that every test's blocks share and reuse its buffers.
SMALL_POOL = BufferPool(64 << 20, 64)


def c_buffer_pool(topic: str, partition: int, headers: bool = True, max_offset: int = columnar.MAX_OFFSET,
                  allocate: Any = None, min_allocate: int = 0) -> Any:
    """The compiled builder writing into a buffer pool's buffers (memoryviews, used again)."""
    return C_BUILDER(topic, partition, headers, max_offset, SMALL_POOL.take)


#: The Python builder first (the reference), then the compiled one with each kind of buffer.
BUILDERS: list[Any] = [PyColumnBuilder] + (
    [c_bytearrays, c_arrow_pool, c_buffer_pool] if C_BUILDER is not None else []
)

Rows = list[ConsumerRecord[bytes, bytes]]
Error = tuple[type, str, int, int, str]

LIMIT_MS = (2**63 - 1) // 1000  # the largest millisecond count whose microseconds fit in int64


def one_block(data: bytes, builder: Any) -> Columns:
    """All the records of ``data`` in one block, by ``builder``."""
    return ColumnReader(data, topic=TOPIC, partition=PART, builder=builder).take(1 << 30, 0)


# ---------------------------------------------------------------- the two walks


def _error(exc: RecordError) -> Error:
    return type(exc), exc.topic, exc.partition, exc.offset, str(exc)


def walk(take: Callable[[int, int], Any], size: Callable[[Any], int], last: Callable[[Any], int],
         max_records: int, start: int) -> tuple[list[Any], Error | None]:
    """Call ``take`` as the collector does until it hands out nothing; the chunks and the error."""
    chunks: list[Any] = []
    position = start
    for _ in range(10_000):
        try:
            chunk = take(max_records, position)
        except RecordError as exc:
            return chunks, _error(exc)
        if not size(chunk):
            return chunks, None
        chunks.append(chunk)
        position = last(chunk) + 1
    raise AssertionError("the walk did not end")


def walk_rows(data: bytes | bytearray | memoryview, max_records: int, start: int, check_crcs: bool = True,
              aborted: list[tuple[int, int]] | None = None) -> tuple[list[Rows], Error | None]:
    fetch = CompletedFetch(TopicPartition(TOPIC, PART), 0, start, memoryview(data), -1, check_crcs=check_crcs,
                           aborted=aborted)
    return walk(fetch.take, len, lambda rows: rows[-1].offset, max_records, start)


def walk_columns(builder: Any, data: bytes | bytearray | memoryview, max_records: int, start: int,
                 headers: bool = True, max_offset: int = columnar.MAX_OFFSET,
                 **kw: Any) -> tuple[list[Columns], Error | None]:
    reader = ColumnReader(data, topic=TOPIC, partition=PART, include_headers=headers, max_offset=max_offset,
                          builder=builder, **kw)
    chunks, error = walk(reader.take, lambda c: c.count, lambda c: c.last_offset, max_records, start)
    assert reader.exhausted
    return chunks, error


def raw(columns: Columns) -> list[Any]:
    """The window and every buffer as bytes: equal lists mean byte-identical buffers."""
    out: list[Any] = [columns.first, columns.count]
    for f in fields(ColumnBuffers):
        v = getattr(columns.buffers, f.name)
        out.append(v if v is None or isinstance(v, int) else bytes(v))
    return out


def ints(buf: Any, fmt: str) -> list[int]:
    return memoryview(buf).cast("B").cast(fmt).tolist()


def assert_match(columns: Columns, rows: Rows, headers: bool = True) -> None:
    """The columns, and their Arrow batch, hold exactly ``rows``."""
    assert columns.count == len(rows)
    b, window = columns.buffers, slice(columns.first, columns.first + columns.count)
    assert ints(b.offsets, "q")[window] == [r.offset for r in rows]
    # Arrow's microseconds; TIMESTAMP_BEYOND where there are none in int64.
    micros = [r.timestamp * 1000 if -LIMIT_MS <= r.timestamp <= LIMIT_MS else TIMESTAMP_BEYOND for r in rows]
    assert ints(b.timestamps, "q")[window] == micros
    assert ints(b.timestamp_types, "i")[window] == [r.timestamp_type for r in rows]
    if window == slice(0, b.count):
        assert b.key_nulls == sum(r.key is None for r in rows)
        assert b.value_nulls == sum(r.value is None for r in rows)
    if any(not -(2**63) <= r.timestamp * 1000 < 2**63 for r in rows):  # beyond Arrow's microseconds
        with pytest.raises(RecordError, match="beyond the range of Arrow's microsecond timestamps"):
            to_arrow(columns, TOPIC, PART)
        return
    batch = to_arrow(columns, TOPIC, PART)
    batch.validate(full=True)
    assert batch.schema == arrow_schema(headers)
    assert batch.num_rows == len(rows)
    col = batch.column
    assert col("key").to_pylist() == [r.key for r in rows]
    assert col("value").to_pylist() == [r.value for r in rows]
    assert col("topic").to_pylist() == [TOPIC] * len(rows)
    assert col("partition").to_pylist() == [PART] * len(rows)
    assert col("offset").to_pylist() == [r.offset for r in rows]
    assert col("timestamp").cast(pa.int64()).to_pylist() == [r.timestamp * 1000 for r in rows]
    assert col("timestampType").to_pylist() == [r.timestamp_type for r in rows]
    if headers:
        assert col("headers").to_pylist() == [[{"key": k, "value": v} for k, v in r.headers] for r in rows]
    else:
        assert b.header_offsets is None and "headers" not in batch.schema.names


def assert_chunks_match(chunks: list[Columns], rows: Rows, max_records: int, headers: bool = True) -> None:
    """The chunks hold ``rows`` in order, and follow the block rule: a take returns the rest of the
    current block (at most ``max_records``) or starts a new one."""
    at = 0
    for i, columns in enumerate(chunks):
        assert 0 < columns.count <= max_records
        if columns.first == 0:  # a new block: whole batches until it held max_records (or no more)
            assert i == 0 or chunks[i - 1].first + chunks[i - 1].count == chunks[i - 1].buffers.count
            assert columns.count == min(max_records, columns.buffers.count)
        else:  # the rest of the block
            assert columns.buffers is chunks[i - 1].buffers
            assert columns.first == chunks[i - 1].first + chunks[i - 1].count
        assert_match(columns, rows[at : at + columns.count], headers)
        at += columns.count
    assert at == len(rows)


def assert_same_walk(data: bytes | bytearray | memoryview, max_records: int = 1 << 30, start: int = 0,
                     headers: bool = True, **kw: Any) -> tuple[Rows, Error | None]:
    """Rows, Python columns and compiled columns: the same records, then the same error."""
    rows, rows_error = walk_rows(data, max_records, start, **kw)
    flat = [r for chunk in rows for r in chunk]
    outcomes = []
    for builder in BUILDERS:
        chunks, error = walk_columns(builder, data, max_records, start, headers, **kw)
        assert error == rows_error, builder
        assert_chunks_match(chunks, flat, max_records, headers)
        outcomes.append([raw(c) for c in chunks])
    assert all(o == outcomes[0] for o in outcomes)  # byte for byte
    return flat, rows_error


# ---------------------------------------------------------------- fixtures


BAD_UTF8 = b"\xff\xfe", b"caf\xc3\xa9", b"\xed\xa0\x80", b"ok", b"\xc3"


def _raw_headers_batch(base_offset: int) -> bytes:
    """Header keys that are not valid UTF-8 (the row decoders replace bad bytes with U+FFFD)."""
    body = b""
    for i, key in enumerate(BAD_UTF8):
        headers = V(2) + V(len(key)) + key + V(1) + b"v" + V(0) + V(-1)
        body += _rec(b"\x00" + V(i) + V(i) + V(1) + b"k" + V(-1) + headers)
    return build_batch([(b"k", b"v")] * len(BAD_UTF8), base_offset=base_offset, raw_records=body)


def walk_fixtures() -> dict[str, bytes]:
    out = dict(FIXTURES)
    out["bad-utf8-header-keys"] = _raw_headers_batch(5)
    out["transactions"] = b"".join([
        build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0, is_transactional=True, producer_id=7),
        build_batch([(b"c", b"3")], base_offset=2, is_transactional=True, producer_id=8, compression=4),
        build_control_batch("abort", 7, base_offset=3),
        build_batch([(b"d", b"4")], base_offset=4),
        build_control_batch("commit", 8, base_offset=5),
        build_batch([(b"e", b"5"), (None, None)], base_offset=6, is_transactional=True, producer_id=7),
        build_control_batch("abort", 7, base_offset=8),
    ])
    out["good-then-corrupt"] = FIXTURES["codec-1"] + build_batch(
        [(b"k", b"v")], base_offset=2000, raw_records=CORRUPT["length-mismatch"][0]
    )
    out["corrupt-crc-after-good"] = FIXTURES["codec-0"] + bytes(
        bytearray(FIXTURES["codec-3"][:-1]) + bytes([FIXTURES["codec-3"][-1] ^ 1])
    )
    # Uncompressed after uncompressed: the compiled walk meets the bad CRC itself.
    out["corrupt-crc-plain-after-good"] = FIXTURES["codec-0"] + bad_crc(
        build_batch([(b"k", b"v%d" % i) for i in range(3)], base_offset=1008)
    )
    # Producer 7's aborted transaction spans two batches with a plain one between them: once its
    # first batch reached the aborted list, the second is skipped for what the filter knows.
    out["aborted-around-plain"] = b"".join([
        build_batch([(b"a", b"0")], base_offset=0),
        build_batch([(b"t", b"1"), (b"t", b"2")], base_offset=1, is_transactional=True, producer_id=7),
        build_batch([(b"p", b"3")], base_offset=3, producer_id=9),  # idempotent, not transactional
        build_batch([(b"t", b"4")], base_offset=4, is_transactional=True, producer_id=7),
        build_batch([(b"p", b"5")], base_offset=5),
        build_control_batch("abort", 7, base_offset=6),
        build_batch([(b"p", b"7")], base_offset=7),
    ])
    return out


def bad_crc(batch: bytes) -> bytes:
    """The v2 batch with its stored CRC changed (its records intact)."""
    return batch[:20] + bytes([batch[20] ^ 1]) + batch[21:]


WALKS = walk_fixtures()


@pytest.mark.parametrize("name", sorted(WALKS))
@pytest.mark.parametrize("max_records", [1, 3, 1000])
def test_fixture_walks(name: str, max_records: int) -> None:
    rows, _ = assert_same_walk(WALKS[name], max_records)
    if name == "transactions":
        assert [r.value for r in rows] == [b"1", b"2", b"3", b"4", b"5", None]


def test_read_committed_skips_aborted() -> None:
    # Producer 7 aborts offsets 0-1 and 6-7; producer 8 commits 2.
    rows, error = assert_same_walk(WALKS["transactions"], 2, aborted=[(7, 0), (7, 6)])
    assert error is None
    assert [r.offset for r in rows] == [2, 4]


@pytest.mark.parametrize("max_records", [1, 2, 1000])
def test_read_committed_skips_an_aborted_transaction_across_batches(max_records: int) -> None:
    rows, error = assert_same_walk(WALKS["aborted-around-plain"], max_records, aborted=[(7, 1)])
    assert error is None
    assert [r.offset for r in rows] == [0, 3, 5, 7]
    rows, error = assert_same_walk(WALKS["aborted-around-plain"], max_records)  # read_uncommitted
    assert [r.offset for r in rows] == [0, 1, 2, 3, 4, 5, 7]


def test_a_bad_crc_after_plain_batches_is_named_after_their_records() -> None:
    rows, error = assert_same_walk(WALKS["corrupt-crc-plain-after-good"], 1000)
    assert [r.offset for r in rows] == list(range(1000, 1008))
    assert error is not None and error[0] is CorruptRecordError and "CRC-32C mismatch" in error[4]
    assert error[3] == 1008


def test_headers_with_bad_utf8_keys() -> None:
    [batch] = iter_batches(WALKS["bad-utf8-header-keys"], topic=TOPIC, partition=PART)
    expected = [key.decode("utf-8", "replace") for key in BAD_UTF8]
    assert [r.headers[0][0] for r in decode_batch_py(batch, TOPIC, PART)] == expected
    for builder in BUILDERS:
        b = builder(TOPIC, PART)
        assert b.append(batch, 0) == len(BAD_UTF8)
        headers = to_arrow(finish_columns(b), TOPIC, PART).column("headers").to_pylist()
        assert [h[0]["key"] for h in headers] == expected
        assert [h[1] for h in headers] == [{"key": "", "value": None}] * len(BAD_UTF8)


@pytest.mark.parametrize("start", [995, 1000, 1003, 1008, 2000])
@pytest.mark.parametrize("codec", [0, 3])
def test_start_inside_a_batch(start: int, codec: int) -> None:
    data = FIXTURES[f"codec-{codec}"]  # offsets 1000..1007
    rows, _ = assert_same_walk(data, 1000, start)
    assert [r.offset for r in rows] == list(range(max(start, 1000), 1008))


def test_without_headers() -> None:
    data = FIXTURES["many-batches"] + FIXTURES["codec-0"]
    assert_same_walk(data, 7, headers=False)


@pytest.mark.parametrize("wrap", ["bytes", "bytearray", "view-of-bytearray", "slice"])
def test_buffer_kinds(wrap: str) -> None:
    data = FIXTURES["many-batches"] + FIXTURES["codec-0"]
    wrapped: Any = {
        "bytes": data,
        "bytearray": bytearray(data),
        "view-of-bytearray": memoryview(bytearray(data)),
        "slice": memoryview(b"JUNK" + data + b"TAIL")[4:-4],
    }[wrap]
    assert_same_walk(wrapped, 5)


# ---------------------------------------------------------------- hypothesis: whole record sets


@st.composite
def record_sets(draw: st.DrawFn, bad_crcs: bool = False) -> tuple[bytes, list[tuple[int, int]], int, int]:
    """A partition's record set: v2 batches (every codec, gaps, LogAppendTime), transactional ones
    with their markers, legacy message sets, with ``bad_crcs`` uncompressed batches whose CRC is
    wrong; with the aborted list a broker could send."""
    parts: list[bytes] = []
    aborted: list[tuple[int, int]] = []
    first = offset = draw(st.integers(0, 2**40))
    kinds = ["data", "data", "txn", "control", "legacy"] + (["bad-crc"] if bad_crcs else [])
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(kinds))
        if kind == "bad-crc":  # an uncompressed batch whose CRC does not match: the walk stops there
            parts.append(bad_crc(build_batch([(b"k", b"v")], base_offset=offset)))
            offset += 1
        elif kind in ("data", "txn"):
            recs, deltas = draw(records_with_deltas())
            last_delta = (deltas[-1] if deltas else 0) + draw(st.integers(0, 3))
            pid = draw(st.integers(1, 3)) if kind == "txn" else -1
            parts.append(
                build_batch(
                    recs,
                    base_offset=offset,
                    base_timestamp=draw(st.integers(-(2**41), 2**50)),
                    offset_deltas=deltas,
                    last_offset_delta=last_delta,
                    compression=draw(st.integers(0, 4)),
                    snappy_xerial=draw(st.booleans()),
                    timestamp_type=draw(st.integers(0, 1)),
                    max_timestamp=DEFAULT_TIMESTAMP + 2**41,
                    is_transactional=kind == "txn",
                    producer_id=pid,
                )
            )
            if kind == "txn" and draw(st.booleans()):
                aborted.append((pid, offset))
            offset += last_delta + 1
        elif kind == "control":
            parts.append(
                build_control_batch(draw(st.sampled_from(["commit", "abort"])), draw(st.integers(1, 3)),
                                    base_offset=offset)
            )
            offset += 1
        else:
            msgs = draw(st.lists(st.tuples(nullable_bytes, nullable_bytes), min_size=1, max_size=5))
            gaps = draw(st.lists(st.integers(1, 4), min_size=len(msgs), max_size=len(msgs)))
            deltas = [sum(gaps[: i + 1]) - gaps[0] for i in range(len(msgs))]
            parts.append(
                build_legacy_message_set(
                    msgs,
                    magic=draw(st.sampled_from([0, 1])),
                    base_offset=offset,
                    compression=draw(st.integers(0, 3)),
                    offset_deltas=deltas,
                )
            )
            offset += deltas[-1] + 1
        offset += draw(st.integers(0, 3))
    return b"".join(parts), aborted, first, offset


@SETTINGS
@given(
    case=record_sets(bad_crcs=True),
    max_records=st.integers(1, 30) | st.just(1 << 30),
    start_at=st.floats(0, 1),
    read_committed=st.booleans(),
    view=st.booleans(),
    headers=st.booleans(),
)
def test_generated_record_sets(
    case: tuple[bytes, list[tuple[int, int]], int, int],
    max_records: int,
    start_at: float,
    read_committed: bool,
    view: bool,
    headers: bool,
) -> None:
    data, aborted, first, end = case
    start = first - 1 + int(start_at * (end - first + 2))
    assert_same_walk(
        memoryview(bytearray(data)) if view else data,
        max_records,
        start,
        headers,
        aborted=aborted if read_committed else None,
    )


def _largest_batch(data: bytes, start: int) -> int:
    """The most bytes (or headers) one batch's records at or after ``start`` put into one column."""
    most = 0
    for batch in iter_batches(data, topic=TOPIC, partition=PART):
        rows = [r for r in decode_batch_py(batch, TOPIC, PART) if r.offset >= start]
        most = max(
            most,
            sum(len(r.key or b"") for r in rows),
            sum(len(r.value or b"") for r in rows),
            sum(len(r.headers) for r in rows),
            sum(len(k.encode()) for r in rows for k, _ in r.headers),
            sum(len(v or b"") for r in rows for _, v in r.headers),
        )
    return most


@SETTINGS
@given(case=record_sets(), extra=st.integers(0, 3000), max_records=st.integers(1, 1 << 30))
def test_offset_limit_starts_new_blocks(case: tuple[bytes, list[tuple[int, int]], int, int], extra: int,
                                        max_records: int) -> None:
    # With a small max_offset a batch that would take an int32 offset column past it starts the
    # next block: the blocks differ from the unlimited ones, the records do not, and the two
    # builders agree byte for byte.
    data, _, first, _ = case
    max_offset = _largest_batch(data, first) + extra
    rows, rows_error = walk_rows(data, 1 << 30, first)
    flat = [r for chunk in rows for r in chunk]
    outcomes = []
    for builder in BUILDERS:
        chunks, error = walk_columns(builder, data, max_records, first, max_offset=max_offset)
        assert error == rows_error
        for columns in chunks:
            b = columns.buffers
            for name in ("key_data", "value_data", "header_key_data", "header_value_data"):
                assert len(getattr(b, name)) <= max_offset
            assert b.header_count <= max_offset
        at = 0
        for columns in chunks:
            assert_match(columns, flat[at : at + columns.count])
            at += columns.count
        assert at == len(flat)
        outcomes.append([raw(c) for c in chunks])
    assert all(o == outcomes[0] for o in outcomes)


# ---------------------------------------------------------------- the builders directly


@needs_c
@SETTINGS
@given(
    batches=st.lists(single_batches(), min_size=1, max_size=4),
    skips=st.lists(st.integers(-2, 20), min_size=4, max_size=4),
    headers=st.booleans(),
    max_offset=st.integers(0, 6000) | st.just(columnar.MAX_OFFSET),
    reserves=st.lists(st.none() | st.tuples(st.integers(0, 50), st.integers(0, 9000)), min_size=4, max_size=4),
)
def test_append_identical(
    batches: list[bytes], skips: list[int], headers: bool, max_offset: int, reserves: list[tuple[int, int] | None]
) -> None:
    # append(batch, start) stores and reports the same (a count, or None when the batch does not
    # fit under max_offset), and leaves the same buffers; with or without reserve(records, data)
    # (a size hint, too small, too big or past max_offset) before the appends.
    results = []
    for builder in BUILDERS:
        for hints in (reserves, [None] * len(reserves)):
            b = builder(TOPIC, PART, headers, max_offset)
            said = []
            for data, skip, hint in zip(batches, skips, hints, strict=False):
                [batch] = iter_batches(data, topic=TOPIC, partition=PART)
                if hint is not None:
                    b.reserve(*hint)
                said.append(b.append(batch, batch.base_offset + skip))
                assert b.count == sum(s or 0 for s in said)
            results.append((said, raw(finish_columns(b))))
    assert all(r == results[0] for r in results)
    for stored, data, skip in zip(results[0][0], batches, skips, strict=False):
        [batch] = iter_batches(data, topic=TOPIC, partition=PART)
        wanted = [r for r in decode_batch_py(batch, TOPIC, PART) if r.offset >= batch.base_offset + skip]
        assert stored is None or stored == len(wanted)
        if max_offset == columnar.MAX_OFFSET:
            assert stored == len(wanted)


@pytest.mark.parametrize("builder", BUILDERS)
def test_reserve_checks_its_arguments(builder: Any) -> None:
    b = builder(TOPIC, PART)
    with pytest.raises(ValueError, match=">= 0"):
        b.reserve(-1, 0)
    with pytest.raises(ValueError, match=">= 0"):
        b.reserve(0, -1)
    b.reserve(10, 10)
    finish_columns(b)
    with pytest.raises(RuntimeError, match="finish"):
        b.reserve(1, 1)


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("name", sorted(CORRUPT))
@pytest.mark.parametrize("then_more", [False, True])
def test_corrupt_batch_changes_nothing(builder: Any, name: str, then_more: bool) -> None:
    # A corrupt batch raises the row decoder's error and leaves the builder as it was, whether
    # more batches follow or not (3 records: the validity bitmaps end inside a byte).
    raw_records, count = CORRUPT[name]
    good = list(iter_batches(FIXTURES["compaction-gaps"] + FIXTURES["codec-2"], topic=TOPIC, partition=PART))
    bad_data = build_batch([(b"k", b"v")], base_offset=60, raw_records=compress(1, raw_records), record_count=count,
                           compression=1)
    [bad] = iter_batches(bad_data, topic=TOPIC, partition=PART)
    try:
        decode_batch_py(bad, TOPIC, PART)
        expected = None
    except RecordError as exc:
        expected = _error(exc)
    reference = builder(TOPIC, PART)
    b = builder(TOPIC, PART)
    reference.append(good[0], 0)
    b.append(good[0], 0)
    if expected is None:
        b.append(bad, 0)
        reference.append(bad, 0)
    else:
        with pytest.raises(RecordError) as info:
            b.append(bad, 0)
        assert _error(info.value) == expected
    if then_more:
        b.append(good[1], 0)
        reference.append(good[1], 0)
    assert raw(finish_columns(b)) == raw(finish_columns(reference))


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(61, len(FUZZ) - 1), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 40),
    count=st.none() | st.integers(-2, 12),
    limit=st.integers(0, 10),
)
def test_damaged_records_same_outcome(flips: list[tuple[int, int]], cut: int, count: int | None, limit: int) -> None:
    # Damaged records (CRC checks off): every builder decodes the same records or raises the same
    # error class for the same batch as the row path.  Where a damaged length makes the Python
    # decoder read on past the batch the wording may differ (see test_speedups), so only class
    # and location are compared.
    # FUZZ again after the damaged batch, moved past its offsets: two batches holding the same
    # offsets (no log has them) make the walks differ, the row walk topping a chunk up from the
    # second where the column walk's block ends (the block rule).
    data = damaged(flips, cut, count) + (100).to_bytes(8, "big") + FUZZ[8:]
    assert_damaged_walks_agree(data, limit or 1 << 30)


def assert_damaged_walks_agree(data: bytes, max_records: int, *, rows_before_position: bool = False) -> None:
    """Every builder walks damaged ``data`` (CRC checks off) to the same buffers, and to the rows'
    records and error class and location.  ``rows_before_position``: leave out the rows' records
    before the position (0).  A damaged offset delta can put such a record after records at or
    past it; the row walk filters a batch only when its first record is before the position, the
    columns take records at or past it, always."""
    rows, rows_error = walk_rows(data, max_records, 0, check_crcs=False)
    flat = [r for chunk in rows for r in chunk if r.offset >= 0 or not rows_before_position]
    outcomes = []
    for builder in BUILDERS:
        chunks, error = walk_columns(builder, data, max_records, 0, check_crcs=False)
        assert (error is None) == (rows_error is None)
        if error is not None and rows_error is not None:
            assert error[:4] == rows_error[:4]
        assert_chunks_match(chunks, flat, max_records)
        outcomes.append([raw(c) for c in chunks])
    assert all(o == outcomes[0] for o in outcomes)


# ---------------------------------------------------------------- the compiled builder's unchecked loop
#
# The compiled builder reads a batch's common records (no headers, 9-byte varints at most, room in
# its buffers, a timestamp Arrow's microseconds hold) without a check per byte while they end 64
# bytes or more before the batch does (columns_fast in speedups/columns.c); any other record, and the last
# 64 bytes, go to the checked loop.  These batches put plain records far from their end, with odd
# ones among them, so both loops and the hand-over between them run.


def _padded(n: int, width: int) -> bytes:
    """``n`` as a zigzag varint of ``width`` bytes (zero groups carried on): still valid."""
    u = (n << 1) ^ (n >> 63)
    return bytes(((u >> 7 * i) & 0x7F) | (0x80 if i < width - 1 else 0) for i in range(width))


def _raw_record(kind: str, i: int, key: bytes | None, value: bytes | None, ts_delta: int) -> bytes:
    """One record body of ``kind``: plain, or one the unchecked loop leaves to the checked one."""
    def length(b: bytes | None, width: int = 0) -> bytes:
        n = -1 if b is None else len(b)
        return (_padded(n, width) if width else V(n)) + (b or b"")

    width = 10 if kind == "ten-byte-varints" else 0
    headers = V(1) + V(1) + b"h" + V(2) + b"hv" if kind == "header" else V(0)
    if kind == "header-count-padded":
        headers = _padded(0, 2)
    return _rec(b"\x00" + V(ts_delta) + V(i) + length(key, width) + length(value, width) + headers)


ODD_RECORDS = ["header", "ten-byte-varints", "header-count-padded"]


@st.composite
def plain_batches(draw: st.DrawFn) -> tuple[bytes, int]:
    """A batch of mostly plain records, some of them odd; and its base offset."""
    base_offset = draw(st.integers(0, 2**40))
    kinds = st.sampled_from(["plain"] * 6 + ODD_RECORDS)
    values = st.none() | st.binary(max_size=200) | st.sampled_from([b"", b"v" * 16, b"w" * 100])
    keys = st.none() | st.binary(max_size=20) | st.sampled_from([b"", b"k" * 15, b"k" * 16, b"k" * 17, b"k" * 90])
    recs = draw(st.lists(st.tuples(kinds, keys, values, st.integers(-5, 5)), min_size=1, max_size=40))
    body = b"".join(_raw_record(k, i, key, value, ts) for i, (k, key, value, ts) in enumerate(recs))
    base_ts = draw(st.sampled_from([DEFAULT_TIMESTAMP, LIMIT_MS - 2, -LIMIT_MS + 2]))
    codec = draw(st.sampled_from([0, 0, 1, 4]))  # compressed: decompressed, then read alike
    data = build_batch([(b"k", b"v")] * len(recs), base_offset=base_offset, base_timestamp=base_ts,
                       raw_records=compress(codec, body) if codec else body, compression=codec,
                       timestamp_type=draw(st.integers(0, 1)), max_timestamp=DEFAULT_TIMESTAMP)
    return data, base_offset


@SETTINGS
@given(case=plain_batches(), start_at=st.integers(-1, 45), max_records=st.integers(1, 50) | st.just(1 << 30),
       headers=st.booleans(), twice=st.booleans())
def test_plain_records_with_odd_ones_among_them(case: tuple[bytes, int], start_at: int, max_records: int,
                                                headers: bool, twice: bool) -> None:
    data, base_offset = case
    if twice:  # the second batch's offsets after the first's
        data += (base_offset + 100).to_bytes(8, "big") + data[8:]
    assert_same_walk(data, max_records, base_offset + start_at, headers)


def test_every_kind_of_odd_record_decodes_as_the_rows_do() -> None:
    # Each odd record between plain ones, far from the batch's end: the unchecked loop hands it
    # to the checked one and takes the records after it again.
    for kind in [*ODD_RECORDS, "null-key", "null-value", "empty"]:
        recs = [("plain", b"k%d" % i, b"v" * (i * 7 % 120)) for i in range(30)]
        recs[10] = (kind if kind in ODD_RECORDS else "plain", None if kind == "null-key" else b"odd",
                    None if kind == "null-value" else (b"" if kind == "empty" else b"odd value"))
        body = b"".join(_raw_record(k, i, key, value, i) for i, (k, key, value) in enumerate(recs))
        data = build_batch([(b"k", b"v")] * len(recs), base_offset=7, raw_records=body)
        rows, error = assert_same_walk(data)
        assert error is None and len(rows) == 30, kind
        assert (rows[10].key, rows[10].value) == (recs[10][1], recs[10][2]), kind


@settings(max_examples=400, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 40),
    count=st.none() | st.integers(-2, 45),
    limit=st.integers(0, 10),
)
def test_damaged_plain_records_same_outcome(flips: list[tuple[int, int]], cut: int, count: int | None,
                                            limit: int) -> None:
    # test_damaged_records_same_outcome for records without headers (FUZZ's all have some): a
    # damaged length or varint far from the batch's end meets the unchecked loop first.
    recs = [Record(None if i % 7 == 3 else b"k%d" % i, None if i % 11 == 5 else b"v" * (i * 9 % 130))
            for i in range(40)]
    plain = build_batch(recs, base_offset=40)
    body = bytearray(plain[61:])
    for index, xor in flips:
        body[index % len(body)] ^= xor
    if cut:
        del body[-cut:]
    declared = 40 if count is None else count
    data = build_batch([(b"k", b"v")], base_offset=40, raw_records=bytes(body), record_count=declared)
    data += (200).to_bytes(8, "big") + plain[8:]
    assert_damaged_walks_agree(data, limit or 1 << 30, rows_before_position=True)


@pytest.mark.parametrize("length", [2**40, 2**62, 200, 61])
@pytest.mark.parametrize("field", ["key", "value"])
def test_a_length_past_the_record_far_from_the_batch_end(field: str, length: int) -> None:
    # A key or value length running past its record (and the batch), among plain records: the
    # same error as the rows give, not a read past the record.
    recs = [_rec(b"\x00" + V(0) + V(i) + V(2) + b"k%d" % (i % 10) + V(3) + b"val" + V(0)) for i in range(30)]
    bad = V(length) + b"k" if field == "key" else V(1) + b"k" + V(length) + b"v"
    recs[5] = _rec(b"\x00" + V(0) + V(5) + bad + V(0))
    data = build_batch([(b"k", b"v")] * 30, base_offset=0, raw_records=b"".join(recs))
    rows, error = assert_same_walk(data)
    assert not rows and error is not None and error[0] is CorruptRecordError  # a batch is all or nothing


#: Records damaged where the unchecked loop reads them (each among plain records, far from the
#: batch's end): ``(name, body)``, every one corrupt for the rows too.
DAMAGED_PLAIN = {
    "length-one-too-long": V(12) + b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(0) + b"\x00",
    "length-one-too-short": V(10) + b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(0),
    "header-count-without-headers": _rec(b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(1)),
    "negative-header-count": _rec(b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(-1)),
    "key-length-minus-2": _rec(b"\x00" + V(0) + V(5) + V(-2) + V(3) + b"vvv" + V(0)),
    "value-length-minus-3": _rec(b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(-3) + V(0)),
    "eleven-byte-varint": _rec(b"\x00" + b"\x80" * 10 + b"\x00" + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(0)),
    "length-past-the-batch": V(10_000) + b"\x00" + V(0) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(0),
}


@pytest.mark.parametrize("name", sorted(DAMAGED_PLAIN))
def test_a_damaged_record_far_from_the_batch_end(name: str) -> None:
    recs = [_rec(b"\x00" + V(0) + V(i) + V(2) + b"k%d" % (i % 10) + V(3) + b"val" + V(0)) for i in range(30)]
    recs[5] = DAMAGED_PLAIN[name]
    data = build_batch([(b"k", b"v")] * 30, base_offset=2**62, raw_records=b"".join(recs))
    rows, error = assert_same_walk(data)
    assert not rows and error is not None and error[0] is CorruptRecordError  # a batch is all or nothing


@pytest.mark.parametrize("builder", BUILDERS)
def test_an_offset_beyond_64_bits_far_from_the_batch_end(builder: Any) -> None:
    recs = [_rec(b"\x00" + V(0) + V(i) + V(2) + b"k%d" % (i % 10) + V(3) + b"val" + V(0)) for i in range(30)]
    # a delta of 9 varint bytes (what the unchecked loop reads) past the end of int64
    recs[5] = _rec(b"\x00" + V(0) + V(2**61) + V(2) + b"kk" + V(3) + b"vvv" + V(0))
    base = 2**63 - 100
    data = build_batch([(b"k", b"v")] * 30, base_offset=base, raw_records=b"".join(recs))
    [batch] = iter_batches(data, topic=TOPIC, partition=PART)
    b = builder(TOPIC, PART)
    with pytest.raises(CorruptRecordError, match=f"offset {base + 2**61} does not fit in 64 bits"):
        b.append(batch, 0)
    assert b.count == 0


@pytest.mark.parametrize("start", [0, 10])
def test_a_timestamp_beyond_64_bits_far_from_the_batch_end(start: int) -> None:
    # A timestamp delta of 9 varint bytes taking the timestamp past int64, stored (start 0: the
    # columns cannot hold it) or skipped (start 10: nothing to hold): the compiled builder answers
    # as the Python one does.
    recs = [_rec(b"\x00" + V(0) + V(i) + V(2) + b"k%d" % (i % 10) + V(3) + b"val" + V(0)) for i in range(30)]
    recs[5] = _rec(b"\x00" + V(2**61) + V(5) + V(2) + b"kk" + V(3) + b"vvv" + V(0))
    data = build_batch([(b"k", b"v")] * 30, base_offset=0, base_timestamp=2**63 - 1000, raw_records=b"".join(recs))
    outcomes = []
    for builder in BUILDERS:
        [batch] = iter_batches(data, topic=TOPIC, partition=PART)
        b = builder(TOPIC, PART)
        try:
            outcomes.append(b.append(batch, start))
        except CorruptRecordError as exc:
            outcomes.append(str(exc))
    assert len(set(outcomes)) == 1, outcomes
    if start:  # not stored: the batch's other 20 records at or after 10
        assert outcomes[0] == 20
    else:
        assert "timestamp" in str(outcomes[0]) and "does not fit in 64 bits" in str(outcomes[0])


class Guarded:
    """An allocator whose buffers have 64 guard bytes after them, checked by ``check()``: a write
    past a buffer's end (the unchecked loop copies in 32-byte chunks) changes them."""

    def __init__(self) -> None:
        self.given: list[tuple[bytearray, int]] = []

    def __call__(self, size: int) -> memoryview:
        block = bytearray(b"\xa5" * (size + 64))
        self.given.append((block, size))
        return memoryview(block)[:size]

    def check(self) -> None:
        for block, size in self.given:
            assert block[size:] == b"\xa5" * 64, f"a write past the end of a {size}-byte buffer"


@needs_c
@SETTINGS
@given(case=plain_batches(), more=st.integers(0, 300))
def test_no_write_past_a_buffers_end(case: tuple[bytes, int], more: int) -> None:
    data, base_offset = case
    # a second batch of many plain records, past what the first sized the buffers for
    data += build_batch([(b"key-%d" % i, b"v" * (i % 97)) for i in range(more)], base_offset=base_offset + 100)
    guarded = Guarded()
    rows, _ = walk_rows(data, 1 << 30, 0)

    def builder(*args: Any) -> Any:
        return C_BUILDER(*args[:4], guarded, 0)

    chunks, _ = walk_columns(builder, data, 1 << 30, 0)
    assert_chunks_match(chunks, [r for chunk in rows for r in chunk], 1 << 30)
    guarded.check()


@pytest.mark.parametrize("builder", BUILDERS)
def test_plain_records_past_the_buffers_room(builder: Any) -> None:
    # A block whose buffers fill up halfway through a batch (a second batch far larger than the
    # first, which sized them): the records that need more room go through the checked loop,
    # which grows the buffers, and the rest are read unchecked again.
    first = build_batch([(b"k", b"v")] * 3, base_offset=0)
    second = build_batch([(b"key-%d" % i, b"value" * (i % 40)) for i in range(300)], base_offset=3)
    assert_same_walk(first + second)
    columns = one_block(first + second, builder)
    assert columns.count == 303


def _ending_at_a_fence(data: bytes) -> tuple[Any, memoryview]:
    """``data`` in memory that ends where a page the process may not read begins (Linux): a read
    past its end stops the process.  The map (keep it alive) and the view of ``data``."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    size = -(-len(data) // page) * page
    region = mmap.mmap(-1, size + page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.mprotect(address + size, page, 0) == 0, ctypes.get_errno()  # PROT_NONE
    region[size - len(data) : size] = data
    return region, memoryview(region)[size - len(data) : size]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes: Linux")
@pytest.mark.parametrize("tail", [0, 1, 15, 16, 63, 64, 65, 200])
def test_no_read_past_the_record_set(tail: int) -> None:
    # Plain records up to the end of the record set, whose last one's value is ``tail`` bytes long,
    # followed by memory the process may not read: no builder reads past the batch.
    data = build_batch([(b"k%d" % i, b"v" * (i % 90)) for i in range(50)] + [(b"last", b"t" * tail)], base_offset=3)
    region, view = _ending_at_a_fence(data)
    try:
        rows, error = assert_same_walk(view)
        assert error is None and rows[-1].value == b"t" * tail
        rows, error = assert_same_walk(view, check_crcs=False)
        assert error is None and len(rows) == 51
    finally:
        view.release()
        region.close()


def test_keys_and_values_of_every_length_around_the_copy_chunks() -> None:
    # The unchecked loop copies keys and values in 32-byte chunks: every length from 0 to 70 on
    # both, and long ones, byte for byte as the rows have them.
    recs = [(b"%02d" % n * 40)[:n] for n in range(71)] + [b"x" * 1000, b"y" * 4097]
    data = build_batch([(k, k[::-1]) for k in recs] + [(b"k", b"v")] * 10, base_offset=5)
    rows, error = assert_same_walk(data)
    assert error is None and [(r.key, r.value) for r in rows[: len(recs)]] == [(k, k[::-1]) for k in recs]


# ---------------------------------------------------------------- values the columns cannot hold


@pytest.mark.parametrize("builder", BUILDERS)
def test_offset_beyond_64_bits_is_corrupt(builder: Any) -> None:
    # The row decoders hand out a Python int past 2**63 - 1; an int64 column cannot hold it.
    body = _rec(b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0))
    body += _rec(b"\x00" + V(0) + V(2**62) + V(1) + b"k" + V(1) + b"v" + V(0))
    data = build_batch([(b"k", b"v")] * 2, base_offset=2**62, raw_records=body)
    [batch] = iter_batches(data, topic=TOPIC, partition=PART)
    assert [r.offset for r in decode_batch_py(batch, TOPIC, PART)] == [2**62, 2**63]
    b = builder(TOPIC, PART)
    with pytest.raises(CorruptRecordError, match=f"offset {2**63} does not fit in 64 bits") as info:
        b.append(batch, 0)
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PART, 2**62)
    assert b.count == 0
    [good] = iter_batches(FIXTURES["codec-0"], topic=TOPIC, partition=PART)
    assert b.append(good, 0) == 8


@pytest.mark.parametrize("builder", BUILDERS)
def test_timestamp_beyond_64_bits(builder: Any) -> None:
    # A 10-byte timestamp delta above 2**63: the compiled builder hands the batch to the Python row
    # decoder; with CreateTime the timestamp does not fit, with LogAppendTime it is not used.
    big = b"\xfe" + b"\xff" * 8 + b"\x01"
    body = _rec(b"\x00" + big + V(0) + V(1) + b"k" + V(1) + b"v" + V(0))
    for ts_type in (0, 1):
        data = build_batch([(b"k", b"v")], base_offset=9, raw_records=body, timestamp_type=ts_type,
                           max_timestamp=123)
        [batch] = iter_batches(data, topic=TOPIC, partition=PART)
        b = builder(TOPIC, PART)
        if ts_type == 0:
            with pytest.raises(CorruptRecordError, match=r"timestamp \d+ does not fit in 64 bits"):
                b.append(batch, 0)
        else:
            assert b.append(batch, 0) == 1
            assert_match(finish_columns(b), decode_batch_py(batch, TOPIC, PART))


@pytest.mark.parametrize("builder", BUILDERS)
def test_timestamp_beyond_arrow_microseconds(builder: Any) -> None:
    data = build_batch([(b"k", b"v")] * 2, base_offset=70, base_timestamp=2**62)
    columns = one_block(data, builder)
    assert ints(columns.buffers.timestamps, "q") == [TIMESTAMP_BEYOND] * 2
    assert (columns.buffers.timestamp_beyond, columns.buffers.timestamp_beyond_ms) == (0, 2**62)
    with pytest.raises(RecordError, match=f"timestamp {2**62} ms is beyond") as info:
        to_arrow(columns, TOPIC, PART)
    assert info.value.offset == 70


@pytest.mark.parametrize("export", [True, False])
@pytest.mark.parametrize("builder", BUILDERS)
def test_timestamps_beyond_microseconds_are_named_in_every_window(builder: Any, export: bool) -> None:
    # Both builders end the range where Arrow's cast does, and a window names its own first
    # record beyond it (with its milliseconds when it is the block's first), whichever route.
    stamps = [0, -1, LIMIT_MS, -LIMIT_MS, LIMIT_MS + 1, 5, -LIMIT_MS - 1, 6]
    data = b"".join(build_batch([(b"k", b"v")], base_offset=i, base_timestamp=t) for i, t in enumerate(stamps))
    columns = one_block(data, builder)
    with contextlib.ExitStack() as stack:
        if not export:
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(columnar, "_export_arrow", None)
        cast = pa.array(stamps[:4], pa.timestamp("ms")).cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()
        good = to_arrow(Columns(columns.buffers, 0, 4), TOPIC, PART)
        assert good.column("timestamp").cast(pa.int64()).to_pylist() == cast == [t * 1000 for t in stamps[:4]]
        assert to_arrow(Columns(columns.buffers, 5, 1), TOPIC, PART).column("offset").to_pylist() == [5]
        assert to_arrow(Columns(columns.buffers, 7, 1), TOPIC, PART).column("offset").to_pylist() == [7]
        for first, count, offset, named in [(0, 8, 4, True), (3, 2, 4, True), (5, 2, 6, False), (6, 2, 6, False)]:
            value = f" {stamps[offset]} ms" if named else ""
            with pytest.raises(RecordError, match=f"record timestamp{value} is beyond") as info:
                to_arrow(Columns(columns.buffers, first, count), TOPIC, PART)
            assert info.value.offset == offset


@SETTINGS
@given(st.lists(st.integers(-LIMIT_MS - 2, LIMIT_MS + 2), min_size=1, max_size=30))
def test_the_builders_store_arrows_microseconds(stamps: list[int]) -> None:
    # One record a batch at each timestamp: the same buffers from both builders, and Arrow's own
    # cast of the milliseconds wherever it has an answer.
    data = b"".join(build_batch([(b"k", b"v")], base_offset=i, base_timestamp=t) for i, t in enumerate(stamps))
    blocks = [raw(one_block(data, b)) for b in BUILDERS]
    assert all(block == blocks[0] for block in blocks)
    got = ints(columnar.decode_columns(data, topic=TOPIC, partition=PART).buffers.timestamps, "q")
    for t, us in zip(stamps, got, strict=True):
        try:
            expected = pa.array([t], pa.timestamp("ms")).cast(pa.timestamp("us")).cast(pa.int64())[0].as_py()
        except pa.ArrowInvalid:
            expected = TIMESTAMP_BEYOND
        assert us == expected


@pytest.mark.parametrize("builder", BUILDERS)
def test_batch_larger_than_a_column(builder: Any) -> None:
    data = b"".join(build_batch([(b"k", b"v" * n)], base_offset=i) for i, n in enumerate([10, 30, 20, 100]))
    reader = ColumnReader(data, topic=TOPIC, partition=PART, max_offset=50, builder=builder)
    assert reader.take(10, 0).count == 2  # 10 + 30 bytes fit; 20 more would not: the next block
    assert reader.take(10, 2).count == 1  # the batch of 100 cannot fit in any block
    for _ in range(2):  # raised, then raised again: the reader is done with
        with pytest.raises(RecordError, match="need more than 50 bytes in one Arrow column") as info:
            reader.take(10, 3)
        assert info.value.offset == 3
    assert reader.exhausted


# ---------------------------------------------------------------- Arrow and the builders' plumbing


def test_schema_is_the_spark_sources() -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from asyncconsumer.spark.arrow import arrow_schema as spark_arrow_schema
    from asyncconsumer.spark.arrow import records_to_batch

    assert arrow_schema(True) == spark_arrow_schema(True)
    assert arrow_schema(False) == spark_arrow_schema(False)
    for name in ("codec-0", "codec-4", "legacy-1-gzip", "log-append-time", "bad-utf8-header-keys"):
        rows, _ = walk_rows(WALKS[name], 1 << 30, 0)
        for builder in BUILDERS:
            [columns], _ = walk_columns(builder, WALKS[name], 1 << 30, 0)
            for headers in (True, False):
                expected = records_to_batch(rows[0], include_headers=headers)
                if not headers:
                    columns_without, _ = walk_columns(builder, WALKS[name], 1 << 30, 0, headers=False)
                    assert to_arrow(columns_without[0], TOPIC, PART).equals(expected)
                else:
                    assert to_arrow(columns, TOPIC, PART).equals(expected)


def test_arrow_wraps_the_buffers_without_copying() -> None:
    columns = columnar.decode_columns(FIXTURES["codec-0"], topic=TOPIC, partition=PART)
    batch = to_arrow(columns, TOPIC, PART)
    address = {n: pa.py_buffer(getattr(columns.buffers, n)).address for n in ("key_data", "value_data", "offsets")}
    assert batch.column("key").buffers()[2].address == address["key_data"]
    assert batch.column("value").buffers()[2].address == address["value_data"]
    assert batch.column("offset").buffers()[1].address == address["offsets"]



def test_topic_and_partition_columns_are_kept_shared_and_grown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The constant columns: right for every topic, partition and row count; the offsets shared by
    names of one length; a longer block grows what is kept; the caches stay bounded."""
    caches = (columnar._topic_offsets, columnar._topic_data, columnar._partition_ids)
    for cache in caches:
        cache.clear()
    monkeypatch.setattr(columnar, "_CONSTANT_ROWS", 4)
    monkeypatch.setattr(columnar, "_CONSTANTS_KEPT", 3)
    columns = columnar.decode_columns(FIXTURES["codec-0"], topic="abc", partition=1)
    n = columns.count
    for topic, partition in (("abc", 1), ("xyz", 7), ("abc", 2), ("ünï", 0), ("", 3)):
        batch = to_arrow(columns, topic, partition)
        assert batch.column("topic").to_pylist() == [topic] * n
        assert batch.column("partition").to_pylist() == [partition] * n
        batch.validate(full=True)
    abc, xyz = columnar._constant_buffers("abc", 1, 1), columnar._constant_buffers("xyz", 7, 1)
    assert abc[0] is xyz[0] and abc[1] != xyz[1]  # one offsets buffer for names of 3 bytes
    assert len(columnar._partition_ids) <= 3 and len(columnar._topic_data) <= 3
    offsets, data, ids = columnar._constant_buffers("abc", 1, 40)  # more rows than kept: grown
    assert len(offsets) >= 41 and list(offsets[:41]) == list(range(0, 123, 3))
    assert data[: 40 * 3] == b"abc" * 40 and list(ids[:40]) == [1] * 40
    assert columnar._constant_buffers("abc", 1, 40)[0] is offsets  # and kept
    # Doubling stops where the int32 offsets end (a long name, many rows).
    monkeypatch.setattr(columnar, "_TOPIC_OFFSET_MAX", 1000)
    offsets = columnar._constant_buffers("0123456789", 0, 60)[0]
    offsets = columnar._constant_buffers("0123456789", 0, 61)[0]  # would double to 122 rows: 1,220 bytes
    assert len(offsets) == 101 and offsets[-1] == 1000
    for cache in caches:
        cache.clear()


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(("count", "step"), [(0, 3), (1, 3), (5, 0), (16_385, 10), (2, 2**31 - 1)])
def test_int32_range_compiled_or_not(monkeypatch: pytest.MonkeyPatch, compiled: bool, count: int, step: int) -> None:
    """The topic column's offsets, from ``int32_steps`` or from a ``range``: the same values."""
    if compiled and columnar._int32_steps is None:
        pytest.skip("no compiled decoder in this build (ASYNCCONSUMER_NO_EXTENSION)")
    if not compiled:
        monkeypatch.setattr(columnar, "_int32_steps", None)
    values = columnar._int32_range(count, step)
    assert values.typecode == columnar._INT32 and values.tolist() == [i * step for i in range(count)]


@needs_c
@pytest.mark.parametrize(("count", "step"), [(-1, 1), (3, 2**30 + 1), (2, -1)])
def test_int32_steps_refuses_what_int32_cannot_hold(count: int, step: int) -> None:
    with pytest.raises(ValueError, match=rf"int32_steps\({count}, {step}\): the values must be int32"):
        _SPEEDUPS.int32_steps(count, step)


def test_empty() -> None:
    for data in (b"", FIXTURES["control"], FIXTURES["emptied-by-compaction"]):
        for builder in BUILDERS:
            [], error = walk_columns(builder, data, 10, 0)
            assert error is None
            b = builder(TOPIC, PART)
            columns = finish_columns(b)
            assert columns.count == 0 and columns.last_offset is None
            assert to_arrow(columns, TOPIC, PART).num_rows == 0


@pytest.mark.parametrize("builder", BUILDERS)
def test_finish_spends_the_builder(builder: Any) -> None:
    [batch] = iter_batches(FIXTURES["codec-0"], topic=TOPIC, partition=PART)
    b = builder(TOPIC, PART)
    b.append(batch, 0)
    finish_columns(b)
    with pytest.raises(RuntimeError):
        b.finish()
    with pytest.raises(RuntimeError):
        b.append(batch, 0)
    with pytest.raises(ValueError):
        builder(TOPIC, PART, True, 2**31)


@needs_c
def test_allocators_that_misbehave_get_clear_errors() -> None:
    with pytest.raises(TypeError, match="allocate must be callable"):
        C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, b"not callable")
    # The first buffers are the builder's own; ``allocate`` serves the buffers that grow.
    for allocate, error, match in [
        (lambda size: bytearray(size - 1), ValueError, "smaller than asked for"),
        (lambda size: "x" * size, TypeError, "bytes-like object is required"),  # not a buffer
        (bytes, BufferError, "writable"),  # not writable
    ]:
        b = C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, allocate)
        with pytest.raises(error, match=match):
            b.reserve(10_000, 100_000)
        assert b.count == 0
    # An allocator that fails while the buffers grow: the append raises, storing nothing.
    sizes: list[int] = []

    def refuse_large(size: int) -> bytearray:
        sizes.append(size)
        if size > 1024:
            raise MemoryError(f"no {size} bytes today")
        return bytearray(size)

    b = C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, refuse_large)
    with pytest.raises(MemoryError, match="today"):
        b.reserve(10_000, 0)
    assert b.count == 0 and max(sizes) > 1024


@needs_c
def test_allocate_cannot_call_back_into_its_builder() -> None:
    # allocate() is Python code run while the builder stores: calling the builder again from
    # there (or from another thread meanwhile) raises instead of writing through stale pointers.
    batches = list(iter_batches(FIXTURES["many-batches"], topic=TOPIC, partition=PART))

    class CallingBack:
        def __init__(self, method: str) -> None:
            self.method, self.builder, self.seen = method, None, []  # type: tuple[str, Any, list[Exception]]

        def __call__(self, size: int) -> bytearray:
            args = {"finish": (), "append": (batches[0], 0), "reserve": (1, 1)}[self.method]
            try:
                getattr(self.builder, self.method)(*args)
            except RuntimeError as exc:
                self.seen.append(exc)
            return bytearray(size)

    for method in ("finish", "append", "reserve"):
        allocate = CallingBack(method)
        b = allocate.builder = C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, allocate)
        for batch in batches:
            b.append(batch, 0)
        assert allocate.seen and all("busy" in str(e) for e in allocate.seen)
        allocate.builder = None
        columns = finish_columns(b)
        reference = PyColumnBuilder(TOPIC, PART)
        for batch in batches:
            reference.append(batch, 0)
        assert raw(columns) == raw(finish_columns(reference))


@needs_c
def test_an_allocator_giving_more_than_asked_for_gets_exact_columns() -> None:
    batches = list(iter_batches(FIXTURES["many-batches"], topic=TOPIC, partition=PART))
    generous = C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, lambda size: bytearray(size + 1000))
    reference = PyColumnBuilder(TOPIC, PART)
    for batch in batches:
        generous.append(batch, 0)
        reference.append(batch, 0)
    assert raw(finish_columns(generous)) == raw(finish_columns(reference))


@needs_c
def test_a_short_column_does_not_keep_a_large_pooled_buffer() -> None:
    # Keys get as much room reserved as values, but it is taken only at the first key, and then
    # for the block's records at twice that key's length: a key column of a few bytes per record
    # stays a bytearray of about its size, and never holds a pooled buffer.
    pool = BufferPool(64 << 20, 64 << 10)
    batch_bytes = build_batch([Record(b"k%d" % i, b"v" * 1024) for i in range(500)], base_offset=0)
    [batch] = iter_batches(batch_bytes, topic=TOPIC, partition=PART)
    b = C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, pool.take)
    b.reserve(500, len(batch_bytes))
    b.append(batch, 0)
    columns = finish_columns(b)
    assert isinstance(columns.buffers.key_data, bytearray) and len(columns.buffers.key_data) < 2000
    assert isinstance(columns.buffers.value_data, memoryview) and len(columns.buffers.value_data) == 500 * 1024
    assert pool.kept == 1 and pool.in_use == 1  # the values' buffer only


@needs_c
def test_keys_that_outgrow_the_first_keys_room_are_all_kept() -> None:
    # The room taken at the first key (twice its length a record) is a guess: longer keys after
    # it grow the column, and shorter and null ones leave it as the Python builder has it.
    pool = BufferPool(64 << 20, 64 << 10)
    keys = [b"k", None, *(b"K" * (i * 37 % 3000) for i in range(400)), b""]
    data = build_batch([Record(k, b"v%d" % i) for i, k in enumerate(keys)], base_offset=0)
    ours = columnar.ColumnReader(data, topic=TOPIC, partition=PART, allocate=pool.take).take(1 << 30, 0)
    reference = columnar.ColumnReader(data, topic=TOPIC, partition=PART, builder=columnar.PyColumnBuilder)
    assert raw(ours) == raw(reference.take(1 << 30, 0))
    assert to_arrow(ours, TOPIC, PART).column("key").to_pylist() == keys


@needs_c
def test_pooled_blocks_stay_intact_while_arrow_holds_them() -> None:
    # Blocks decoded into a pool's buffers, every Arrow batch kept while more blocks are decoded:
    # no kept batch changes.  Dropped, their buffers are used again.
    pool = BufferPool(64 << 20, 64)
    data = FIXTURES["many-batches"] + FIXTURES["codec-0"]
    kept = []
    for _ in range(6):
        reader = columnar.ColumnReader(data, topic=TOPIC, partition=PART, allocate=pool.take)
        columns = reader.take(1 << 30, 0)
        kept.append((to_arrow(columns, TOPIC, PART), raw(columns)))
    allocated, reused = pool.allocated, pool.reused
    assert pool.in_use > 0
    first = kept[0][0].to_pylist()
    assert all(batch.to_pylist() == first for batch, _ in kept)
    assert all(r == kept[0][1] for _, r in kept)
    del kept, columns, reader
    gc.collect()
    assert pool.in_use == 0
    reader = columnar.ColumnReader(data, topic=TOPIC, partition=PART, allocate=pool.take)
    assert to_arrow(reader.take(1 << 30, 0), TOPIC, PART).to_pylist() == first
    # Mostly the kept buffers again (the idle ones a block outgrew long ago were let go as stale).
    assert pool.reused - reused > 2 * (pool.allocated - allocated)


@needs_c
def test_no_reference_leaks() -> None:
    topic, partition = "leak-" + "check", 10**6  # objects only this test holds
    batches = list(iter_batches(FIXTURES["many-batches"] + FIXTURES["legacy-1-gzip"] + FIXTURES["codec-0"],
                                topic=topic, partition=partition))
    bad = list(iter_batches(build_batch([(b"k", b"v")], raw_records=V(50) + b"\x00" * 10), topic=topic,
                            partition=partition))
    pool = BufferPool(64 << 20, 64)
    allocators: list[Any] = [functools.partial(pa.allocate_buffer), pool.take]
    before = [sys.getrefcount(x) for x in (topic, partition, *allocators)]
    for i in range(100):
        if i % 2:
            allocate = allocators[i // 2 % 2]
            pooled = C_BUILDER(topic, partition, True, columnar.MAX_OFFSET, allocate)
            for batch in batches:
                pooled.append(batch, 0)
            kinds = {pa.Buffer if allocate is allocators[0] else memoryview, bytearray}  # (small: the builder's)
            assert {type(x) for x in pooled.finish() if not isinstance(x, int)} <= kinds
            del pooled, allocate
        b = C_BUILDER(topic, partition)
        for batch in batches:
            b.append(batch, 0)
        for batch in bad:
            with pytest.raises(CorruptRecordError):
                b.append(batch, 0)
        columns = b.finish()
        # the tuple, x and the argument: the spent builder holds none of them
        assert [sys.getrefcount(x) for x in columns if isinstance(x, bytearray)] == [3] * 15
        del b, columns
    gc.collect()
    assert [sys.getrefcount(x) for x in (topic, partition, *allocators)] == before
    assert pool.reused > 0 and pool.kept > 0 and pool.in_use == 0  # used again, and all idle now


def test_environment_switch_forces_python_builder() -> None:
    env = {**os.environ, "ASYNCCONSUMER_NO_EXTENSION": "1"}
    code = "from asyncconsumer.protocol import columnar as c; print(c.COLUMN_DECODER, c.ColumnBuilder.__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["python", "PyColumnBuilder"]


def test_columns_without_pyarrow() -> None:
    # Decoding needs no pyarrow; to_arrow says what to install.
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from asyncconsumer.protocol import columnar as c\n"
        "from asyncconsumer.protocol.record_writer import build_batch\n"
        "cols = c.decode_columns(build_batch([(b'k', b'v')] * 3), topic='t', partition=0)\n"
        "print(cols.count, bytes(cols.buffers.value_data))\n"
        "try:\n    c.to_arrow(cols, 't', 0)\nexcept ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "3 b'vvv'"
    assert "pip install 'asyncconsumer[arrow]'" in lines[1]


class CountingBuilder:
    """The builder in use, recording which batches it is given."""

    appended: list[int] = []

    def __init__(self, *args: Any) -> None:
        self._inner = BUILDERS[-1](*args)

    @property
    def count(self) -> int:
        return int(self._inner.count)

    def append(self, batch: Any, start: int) -> int | None:
        self.appended.append(batch.base_offset)
        return self._inner.append(batch, start)  # type: ignore[no-any-return]

    def finish(self) -> tuple[Any, ...]:
        return self._inner.finish()  # type: ignore[no-any-return]


@pytest.mark.parametrize("max_records", [1, 7, 100, 150, 1000])
def test_blocks_decode_each_batch_once(max_records: int) -> None:
    # Two compressed batches of 150: each is parsed (and decompressed) once whatever max_records;
    # a take hands out the rest of its block before decoding more.
    data = b"".join(
        build_batch([Record(b"k", b"v%d" % i) for i in range(150)], base_offset=base, compression=3)
        for base in (0, 150)
    )
    CountingBuilder.appended = []
    chunks, error = walk_columns(CountingBuilder, data, max_records, 0)
    assert error is None
    assert CountingBuilder.appended == [0, 150]
    sizes = [c.count for c in chunks]
    per_block = {1: [1] * 150, 7: [7] * 21 + [3], 100: [100, 50], 150: [150], 1000: []}[max_records]
    assert sizes == (per_block * 2 if max_records != 1000 else [300])


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("compression", [0, 3])
@pytest.mark.parametrize(("max_records", "sizes"), [(5, [3] * 4), (6, [6, 6]), (7, [6, 6]), (2, [2, 1] * 4)])
def test_a_block_ends_before_a_batch_that_would_take_it_past_max_records(
    builder: Any, compression: int, max_records: int, sizes: list[int]
) -> None:
    # Four batches of 3: a block takes whole batches while they fit within max_records (a batch
    # larger than max_records alone, handed out in windows), so no call hands out a batch's short
    # rest; plain batches go through the compiled walk, compressed ones through append().
    data = b"".join(
        build_batch([Record(b"k", b"v%d" % i) for i in range(3)], base_offset=3 * i, compression=compression)
        for i in range(4)
    )
    chunks, error = walk_columns(builder, data, max_records, 0)
    assert error is None
    assert [c.count for c in chunks] == sizes
    assert [o for c in chunks for o in ints(c.buffers.offsets, "q")[c.first : c.first + c.count]] == list(range(12))


# ---------------------------------------------------------------- the compiled walk (ColumnBuilder.walk)

_SPEEDUPS: Any = sys.modules.get("asyncconsumer._speedups")


_CRC_SIZES = [0, 1, 7, 8, 15, 16, 17, 127, 128, 129, 255, 256, 257, 383, 384, 511, 512, 513, 1023, 1024, 1025, 3071,
              3072, 3073, 3 * 1024 * 5 + 13, 6143, 6144, 6145, 6144 + 3072, 6144 + 3072 + 9, 2 * 6144 - 1,
              3 * 6144 + 3071, 16 << 10, (16 << 10) + 100, 1 << 20]


@needs_c
@pytest.mark.parametrize("size", _CRC_SIZES)
def test_compiled_crc32c_across_its_block_sizes(size: int) -> None:
    """Every path of every CRC kernel this machine has: folding 256 (or 128) bytes a step and the
    three ways a fold ends, six streams of 1 KiB blocks, then three, then 8 bytes at a time, then
    bytes; and the byte-at-a-time table.  ``crc32c`` uses the first kernel."""
    import crc32c

    data = bytes((i * 131 + (i >> 8)) & 0xFF for i in range(size))
    want = crc32c.crc32c(data)
    assert _SPEEDUPS.crc32c(data) == want
    kernels = _SPEEDUPS.CRC32C_KERNELS
    assert kernels[-1] == "table" and ("streams" in kernels) == bool(_SPEEDUPS.HW_CRC32C)
    assert {kernel: _SPEEDUPS.crc32c_kernel(kernel, data) for kernel in kernels} == dict.fromkeys(kernels, want)


@needs_c
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=20_000), skip=st.integers(0, 63), split=st.integers(0, 20_000))
def test_every_crc32c_kernel_is_the_crc32c_packages(data: bytes, skip: int, split: int) -> None:
    """``crc32c`` and every kernel: any length, alignment and contents, in one piece or continued
    from the CRC of the bytes before (the column walk takes a batch's CRC a chunk at a time; a
    fold XORs the state it starts from into its first four bytes)."""
    import crc32c

    view = memoryview(data)[skip:]  # any alignment
    want = crc32c.crc32c(view)
    assert _SPEEDUPS.crc32c(view) == want
    head, tail = view[:split], view[split:]
    for kernel in _SPEEDUPS.CRC32C_KERNELS:
        assert _SPEEDUPS.crc32c_kernel(kernel, view) == want, kernel
        assert _SPEEDUPS.crc32c_kernel(kernel, tail, _SPEEDUPS.crc32c_kernel(kernel, head)) == want, kernel


@needs_c
def test_crc32c_kernel_names_the_kernels_it_has() -> None:
    with pytest.raises(ValueError, match="no CRC-32C kernel 'sse9' on this machine"):
        _SPEEDUPS.crc32c_kernel("sse9", b"")


PLAIN = build_batch([(b"k", b"v0"), (None, b"v1")], base_offset=100)

#: What follows PLAIN, whether the walk takes it (True) or leaves it to the Python walk (False),
#: and whether it does so with read_committed.
WALK_CASES: dict[str, tuple[bytes, bool, bool]] = {
    "plain": (build_batch([(b"k", b"v2")], base_offset=102), True, True),
    "idempotent": (build_batch([(b"k", b"v2")], base_offset=102, producer_id=5, producer_epoch=0), True, True),
    "log-append-time": (build_batch([(b"k", b"v2")], base_offset=102, timestamp_type=1), True, True),
    "before-start": (build_batch([(b"k", b"v0")], base_offset=10), True, True),
    "control": (build_control_batch("commit", 5, base_offset=102), True, False),
    "transactional": (build_batch([(b"k", b"v2")], base_offset=102, is_transactional=True, producer_id=5), True,
                      False),
    "compressed": (build_batch([(b"k", b"v2")], base_offset=102, compression=1), False, False),
    "bad-crc": (bad_crc(build_batch([(b"k", b"v2")], base_offset=102)), False, False),
    "truncated": (build_batch([(b"k", b"v2")], base_offset=102)[:-1], False, False),
    "legacy": (build_legacy_message_set([(b"k", b"v2")], magic=1, base_offset=102), False, False),
    "corrupt-records": (build_batch([(b"k", b"v")], base_offset=102, raw_records=CORRUPT["key-past-end"][0]), False,
                        False),
    "header-only": (PLAIN[:61], False, False),
}


@needs_c
@pytest.mark.parametrize("read_committed", [False, True])
@pytest.mark.parametrize("name", sorted(WALK_CASES))
def test_walk_takes_plain_batches_and_leaves_the_rest(name: str, read_committed: bool) -> None:
    after, taken, taken_committed = WALK_CASES[name]
    data = PLAIN + after
    builder = C_BUILDER(TOPIC, PART)
    assert builder.walk(data, 0, 50, 1000, True, read_committed) == (
        len(data) if (taken_committed if read_committed else taken) else len(PLAIN)
    )
    expected = [100, 101]  # PLAIN's
    if name in ("plain", "idempotent", "log-append-time") or (name == "transactional" and not read_committed):
        expected.append(102)
    columns = finish_columns(builder)
    assert ints(columns.buffers.offsets, "q") == expected


@needs_c
def test_walk_stops_at_the_limit_and_resumes() -> None:
    data = b"".join(build_batch([(b"k", b"v%d" % i)] * 3, base_offset=3 * i) for i in range(4))
    builder = C_BUILDER(TOPIC, PART)
    size = len(data) // 4
    # Into an empty builder the first batch goes whole; the next would take it past the limit.
    assert builder.walk(data, 0, 0, 2, True, False) == size
    assert builder.count == 3
    assert builder.walk(data, size, 0, 5, True, False) == size  # 3 + 3 records would pass 5
    assert builder.walk(data, size, 0, 6, True, False) == 2 * size  # 3 + 3 fit in 6; 9 would not
    assert builder.count == 6
    assert builder.walk(data, 2 * size, 0, 6, True, False) == 2 * size  # holds the limit already
    assert builder.walk(data, 2 * size, 4, 1000, True, False) == len(data)
    assert builder.walk(data, len(data), 0, 1000, True, False) == len(data)
    assert ints(finish_columns(builder).buffers.offsets, "q") == list(range(12))


@needs_c
def test_walk_checks_crcs_only_when_asked() -> None:
    data = PLAIN + bad_crc(build_batch([(b"k", b"v2")], base_offset=102))
    assert C_BUILDER(TOPIC, PART).walk(data, 0, 0, 1000, False, False) == len(data)


@needs_c
def test_walk_leaves_a_batch_that_does_not_fit_and_changes_nothing() -> None:
    big = build_batch([(b"k", b"x" * 100)], base_offset=102)
    builder = C_BUILDER(TOPIC, PART, True, 50)
    assert builder.walk(PLAIN + big + PLAIN, 0, 0, 1000, True, False) == len(PLAIN)
    assert builder.count == 2
    buffers = finish_columns(builder).buffers
    assert bytes(buffers.value_data) == b"v0v1"


@needs_c
def test_walk_checks_its_arguments() -> None:
    builder = C_BUILDER(TOPIC, PART)
    with pytest.raises(ValueError, match="pos lies outside"):
        builder.walk(PLAIN, len(PLAIN) + 1, 0, 10, True, False)
    with pytest.raises(ValueError, match="pos lies outside"):
        builder.walk(PLAIN, -1, 0, 10, True, False)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        builder.walk(PLAIN, 0, 0, 10, True)
    with pytest.raises(TypeError):
        builder.walk("not a buffer", 0, 0, 10, True, False)
    finish_columns(builder)
    with pytest.raises(RuntimeError, match="finish"):
        builder.walk(PLAIN, 0, 0, 10, True, False)


# ---------------------------------------------------------------- the Arrow C data interface

export_arrow: Any = getattr(columnar, "_export_arrow", None)
_INT32_CODE = "i" if array("i").itemsize == 4 else "l"
needs_export = pytest.mark.skipif(export_arrow is None, reason=NO_C)


def _from_buffers(columns: Columns, **kw: Any) -> Any:
    """to_arrow by ``pa.Array.from_buffers``, column by column (the route without the export)."""
    saved = columnar._export_arrow
    columnar._export_arrow = None
    try:
        return to_arrow(columns, TOPIC, PART, **kw)
    finally:
        columnar._export_arrow = saved


@needs_export
@pytest.mark.parametrize("name", ["many-batches", "codec-0", "log-append-time", "compaction-gaps", "3000-records"])
@pytest.mark.parametrize("headers", [True, False])
def test_the_exported_batch_is_the_from_buffers_batch(name: str, headers: bool) -> None:
    # Whole blocks and windows of them (Arrow's offsets, null counts left to Arrow), with and
    # without headers: the same batch, valid by Arrow's full check, by either route.
    for step in (1 << 30, 7, 1):
        reader = columnar.ColumnReader(FIXTURES[name], topic=TOPIC, partition=PART, include_headers=headers)
        position, windows = 0, 0
        while not reader.exhausted and windows < 60:
            columns = reader.take(step, position)
            if not columns.count:
                break
            exported = to_arrow(columns, TOPIC, PART)
            exported.validate(full=True)
            assert exported.schema == arrow_schema(headers)
            assert exported.equals(_from_buffers(columns))
            assert exported.to_pylist() == _from_buffers(columns).to_pylist()
            last = columns.last_offset
            assert last is not None
            position, windows = last + 1, windows + 1
        assert windows > 0


@needs_export
def test_an_exported_batch_outlives_everything_that_made_it() -> None:
    pool = BufferPool(64 << 20, 64)
    reader = columnar.ColumnReader(FIXTURES["many-batches"], topic=TOPIC, partition=PART, allocate=pool.take)
    columns = reader.take(25, 0)
    expected = _from_buffers(columns).to_pylist()
    batch = to_arrow(columns, TOPIC, PART)
    del columns, reader
    gc.collect()
    assert pool.in_use > 0  # Arrow holds the pooled buffers through the export
    table = pa.Table.from_batches([batch]).combine_chunks()  # arrays shared further
    del batch
    gc.collect()
    assert pool.in_use > 0
    table.validate(full=True)
    assert table.to_pylist() == expected
    del table
    gc.collect()
    assert pool.in_use == 0  # released: every buffer idle again


@needs_export
def test_an_exported_batch_released_in_another_thread_lets_go_of_its_buffers() -> None:
    import threading

    pool = BufferPool(64 << 20, 64)
    reader = columnar.ColumnReader(FIXTURES["3000-records"], topic=TOPIC, partition=PART, allocate=pool.take)
    batches = [to_arrow(reader.take(1000, 77 + 1000 * i), TOPIC, PART) for i in range(3)]
    del reader
    gc.collect()
    assert pool.in_use > 0
    seen: list[int] = []

    def drop() -> None:
        seen.append(sum(b.num_rows for b in batches))
        batches.clear()  # the last references: Arrow releases the arrays in this thread

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    gc.collect()
    assert seen == [3000] and pool.in_use == 0


@needs_export
def test_export_arrow_refuses_bad_nodes_and_holds_nothing_then() -> None:
    data = bytearray(64)
    good = ("l", 8, 0, 0, (None, data), ())
    offsets = array(_INT32_CODE, [0, 3, 5, 9]).tobytes()
    cases: list[tuple[Any, type[Exception], str | None]] = [
        (["l", 8, 0, 0, (None, data), ()], TypeError, "a node is a tuple"),
        (("l", 8, 0, 0, (None, data)), TypeError, "a node is a tuple"),
        ((b"l", 8, 0, 0, (None, data), ()), TypeError, "format a str"),
        (("l", 8, 0, 0, [None, data], ()), TypeError, "buffers and children tuples"),
        (("l", -1, 0, 0, (None, data), ()), ValueError, "length -1 is below 0"),
        (("l", 8, -2, 0, (None, data), ()), ValueError, "null_count -2 is below -1"),
        (("l", 8, 0, -1, (None, data), ()), ValueError, "offset -1 is below 0"),
        (("l", "8", 0, 0, (None, data), ()), TypeError, None),
        (("l", 8, 0, 0, (data, "not a buffer"), ()), TypeError, None),
        (("+s", 8, 0, 0, (None,), (good, good, "not a node")), TypeError, "a node is a tuple"),
        (("+s", 8, 0, 0, (None,), (good, ("l", 8, 0, 0, (data, 1.5), ()))), TypeError, None),
        (("+l", 8, 0, 0, ("not a buffer", data), (good,)), TypeError, None),  # a node with children: none built yet
        (("l", 8, 0, 0, (None,) * 5000, ()), ValueError, "too many buffers"),
        # The layout of each format, held to its buffers (importing checks none of it):
        (("x", 8, 0, 0, (None, data), ()), ValueError, "unknown format 'x'"),
        (("l", 8, 0, 0, (None, data, data), ()), ValueError, "a l node has 3 buffers and 0 children"),
        (("+l", 3, 0, 0, (None, offsets), ()), ValueError, "a \\+l node has 2 buffers and 0 children"),
        (("l", 9, 0, 0, (None, data), ()), ValueError, "values buffer of a l node of 9 values from 0 is too short"),
        (("l", 7, 0, 2, (None, data), ()), ValueError, "values buffer .* of 7 values from 2 is too short"),
        (("i", 17, 0, 0, (None, data), ()), ValueError, "values buffer"),
        (("l", 8, 1, 0, (None, data), ()), ValueError, "null_count 1 with length 8 and no validity bitmap"),
        (("l", 8, 9, 0, (data, data), ()), ValueError, "null_count 9 with length 8"),
        (("l", 8, 0, 0, (bytes(0), data), ()), ValueError, "validity bitmap buffer .* too short"),
        (("z", 3, 0, 0, (None, offsets, None), ()), ValueError, "buffer 2 of a z node is None"),
        (("z", 4, 0, 0, (None, offsets, bytes(9)), ()), ValueError, "offsets buffer of a z node"),
        (("z", 3, 0, 0, (None, offsets, bytes(8)), ()), ValueError, "data buffer of a z node"),
        (("z", 2, 0, 0, (None, array(_INT32_CODE, [4, 5, 3]).tobytes(), bytes(9)), ()), ValueError, "run from 4 to 3"),
        (("+l", 3, 0, 0, (None, offsets), (("l", 8, 0, 0, (None, data), ()),)), ValueError,
         "child 0 of a \\+l node has 8 values, it needs 9"),
        (("+s", 8, 0, 0, (None,), (good, ("l", 4, 0, 0, (None, data), ()))), ValueError,
         "child 1 of a \\+s node has 4 values, it needs 8"),
    ]
    deep: Any = good
    for _ in range(20):
        deep = ("+s", 8, 0, 0, (None,), (deep,))
    cases.append((deep, ValueError, "nested too deeply"))
    for node, error, message in cases:
        with pytest.raises(error, match=message):
            export_arrow(node)
        data.append(0)  # resizing fails with BufferError while any view of it is held
        del data[-1]
    export_arrow(("+l", 3, 0, 0, (None, offsets), (("l", 9, 0, 0, (None, bytes(72)), ()),)))  # the same, whole


@needs_export
def test_an_export_arrow_capsule_not_imported_lets_go_when_dropped() -> None:
    data = bytearray(b"\x01\x00\x00\x00" * 4)
    root = ("+s", 4, 0, 0, (None,), (("i", 4, 0, 0, (None, data), ()),))
    capsule = export_arrow(root)
    with pytest.raises(BufferError):
        data.append(0)  # held by the capsule
    del capsule
    data.append(0)
    # Imported, the capsule is Arrow's: Arrow lets go when its array goes.
    schema = pa.schema([pa.field("x", pa.int32())])
    batch = pa.record_batch(columnar._ArrowExport(schema, export_arrow(root)))
    assert batch.column(0).to_pylist() == [1, 1, 1, 1]
    with pytest.raises(BufferError):
        data.append(0)
    del batch
    data.append(0)


@needs_export
def test_both_imports_of_the_export_give_the_same_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # RecordBatch._import_from_c against the schema object (the route where pyarrow has it) and
    # pyarrow.record_batch through the PyCapsule protocol: one batch.
    assert columnar._arrow_types()["import_from_c"] is not None  # this pyarrow has it: the route is tested
    reader = columnar.ColumnReader(FIXTURES["many-batches"], topic=TOPIC, partition=PART)
    columns = reader.take(1 << 30, 0)
    by_address = to_arrow(columns, TOPIC, PART)
    monkeypatch.setitem(columnar._arrow_types(), "import_from_c", None)
    by_protocol = to_arrow(columns, TOPIC, PART)
    by_address.validate(full=True)
    assert by_address.equals(by_protocol) and by_address.schema == by_protocol.schema
    assert by_address.to_pylist() == _from_buffers(columns).to_pylist()


@needs_export
def test_arrow_address_takes_only_a_capsule_not_imported_yet() -> None:
    arrow_address = columnar._arrow_address
    data = bytearray(b"\x02\x00\x00\x00" * 4)
    root = ("+s", 4, 0, 0, (None,), (("i", 4, 0, 0, (None, data), ()),))
    schema = pa.schema([pa.field("x", pa.int32())])
    capsule = export_arrow(root)
    batch = pa.RecordBatch._import_from_c(arrow_address(capsule), schema)
    assert batch.column(0).to_pylist() == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="imported already"):
        arrow_address(capsule)
    del capsule  # moved out: Arrow's now, held until the batch goes
    with pytest.raises(BufferError):
        data.append(0)
    del batch
    data.append(0)
    with pytest.raises(TypeError, match="not an export_arrow capsule"):
        arrow_address(schema.__arrow_c_schema__())
    with pytest.raises(TypeError, match="not an export_arrow capsule"):
        arrow_address(b"no capsule")


@needs_export
def test_export_arrow_children_moved_out_and_released_without_the_gil() -> None:
    # What the C data interface allows an importer: move the root out of the capsule, move a child
    # out of the root, release each on its own, from a thread that does not hold the GIL (a ctypes
    # call lets go of it), as an Arrow thread would.
    import ctypes
    import threading

    class Array(ctypes.Structure):
        pass

    Array._fields_ = [
        ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
        ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64), ("buffers", ctypes.c_void_p),
        ("children", ctypes.POINTER(ctypes.POINTER(Array))), ("dictionary", ctypes.c_void_p),
        ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p),
    ]
    release_type = ctypes.CFUNCTYPE(None, ctypes.POINTER(Array))
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

    def move(source: Any) -> Array:
        moved = Array()
        ctypes.memmove(ctypes.byref(moved), source, ctypes.sizeof(Array))
        source.contents.release = None
        return moved

    def release(array: Array) -> None:
        thread = threading.Thread(target=lambda: release_type(array.release)(ctypes.byref(array)))
        thread.start()
        thread.join()

    first, second = bytearray(32), bytearray(32)
    columns = (("l", 4, 0, 0, (None, first), ()), ("l", 4, 0, 0, (None, second), ()))
    capsule = export_arrow(("+s", 4, 0, 0, (None,), columns))
    root = move(ctypes.cast(get_pointer(capsule, b"arrow_array"), ctypes.POINTER(Array)))
    del capsule  # moved out: the capsule lets go of nothing
    with pytest.raises(BufferError):
        first.append(0)
    child = move(root.children[1])
    release(root)
    assert root.release is None
    first.append(0)  # the root let go of its first child's buffer
    with pytest.raises(BufferError):
        second.append(0)  # the moved child still holds its own
    release(child)
    assert child.release is None
    second.append(0)


@needs_export
def test_the_exported_batch_is_checked_like_from_buffers() -> None:
    # Importing through the C data interface checks nothing; export_arrow checks the buffers'
    # sizes, as from_buffers did: columns shorter than their count are an error, not a read past
    # their end.
    import dataclasses

    columns = columnar.decode_columns(FIXTURES["codec-0"], topic=TOPIC, partition=PART)
    short = dataclasses.replace(columns.buffers, offsets=bytes(memoryview(columns.buffers.offsets)[:8]))
    with pytest.raises(ValueError, match="values buffer of a l node of 8 values from 0 is too short"):
        to_arrow(Columns(short, 0, columns.count), TOPIC, PART)
    with pytest.raises(pa.ArrowInvalid):
        _from_buffers(Columns(short, 0, columns.count))


@needs_c
def test_columns_under_min_allocate_stay_the_builders_own() -> None:
    # The consumer's pool hands out a new bytearray for a column under its threshold anyway: the
    # builder grows its own instead of calling allocate for it.  Same columns, fewer calls.
    pool = BufferPool(64 << 20, 64 << 10)
    asked: list[int] = []

    def allocate(size: int) -> Any:
        asked.append(size)
        return pool.take(size)

    data = FIXTURES["3000-records"] + FIXTURES["many-batches"]
    everything = columnar.ColumnReader(data, topic=TOPIC, partition=PART, allocate=allocate).take(1 << 30, 0)
    small_asks = sum(size < 64 << 10 for size in asked)
    asked.clear()
    reader = columnar.ColumnReader(data, topic=TOPIC, partition=PART, allocate=allocate, min_allocate=64 << 10)
    columns = reader.take(1 << 30, 0)
    assert raw(columns) == raw(everything)
    assert small_asks > 0 and asked and min(asked) >= 64 << 10  # the large columns still come from the pool
    assert isinstance(columns.buffers.value_data, memoryview)  # a pool's buffer
    assert isinstance(columns.buffers.timestamp_types, bytearray)  # 3,040 x 4 bytes: the builder's own
    with pytest.raises(ValueError, match="min_allocate must be >= 0"):
        C_BUILDER(TOPIC, PART, True, columnar.MAX_OFFSET, allocate, -1)
