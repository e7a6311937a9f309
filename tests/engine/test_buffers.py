"""The pool of large buffers (engine/buffers.py), driven directly and through a connection's read path
(response frames; the Arrow column blocks it also serves are tested in test_columnar.py and test_arrow.py)."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import traceback
from typing import Any

import anyio
import pytest
from support.paths import ROOT

from asyncconsumer import Consumer
from asyncconsumer.config import build_config
from asyncconsumer.engine.buffers import IDLE_AFTER, MIN_POOLED_BYTES, STALE_AFTER, BufferPool, column_pool, size_class
from asyncconsumer.engine.connection import BrokerConnection
from asyncconsumer.engine.loop import Engine
from asyncconsumer.managers.fetch_buffer import CompletedFetch
from asyncconsumer.managers.waiter import Waiter
from asyncconsumer.protocol import records
from asyncconsumer.protocol.api import decode_response, encode_response
from asyncconsumer.protocol.compression import CODEC_GZIP, CODEC_NONE
from asyncconsumer.protocol.primitives import ProtocolDecodeError
from asyncconsumer.protocol.record_writer import Record, build_batch
from asyncconsumer.structs import TopicPartition

MiB = 1 << 20


def test_size_classes_round_up_by_at_most_an_eighth() -> None:
    for size in (1, 7, 1000, MIN_POOLED_BYTES, 3 * MiB + 1, 4 * MiB, 4 * MiB + 1, 50 * MiB - 3):
        capacity = size_class(size)
        assert size <= capacity <= size + size // 8 + 1
    assert size_class(4 * MiB) == 4 * MiB
    assert size_class(4 * MiB + 1) == 4 * MiB + MiB // 2
    # Frames of about the same size share a class, so their buffers are used again.
    assert size_class(4 * MiB + 1000) == size_class(4 * MiB + 400_000)


def test_a_buffer_is_used_again_once_no_view_of_it_is_alive() -> None:
    pool = BufferPool(64 * MiB)
    first = pool.take(4 * MiB + 10)
    assert isinstance(first, memoryview) and len(first) == 4 * MiB + 10 and not first.readonly
    backing = id(first.obj)  # not the object: a reference would keep the buffer busy
    records_view = first[100:200]  # what a decoded fetch keeps of its response
    del first
    second = pool.take(4 * MiB + 20)
    assert id(second.obj) != backing  # ``records_view`` still points into the first buffer
    assert (pool.allocated, pool.reused) == (2, 0)
    backings = {backing, id(second.obj)}
    del records_view, second
    third = pool.take(4 * MiB + 30)
    assert isinstance(third, memoryview) and len(third) == 4 * MiB + 30
    assert id(third.obj) in backings
    assert (pool.allocated, pool.reused) == (2, 1)
    assert pool.held_bytes == 2 * size_class(4 * MiB + 10) and pool.kept == 2


def test_the_smallest_idle_buffer_that_fits_is_used_and_none_with_more_than_a_quarter_to_spare() -> None:
    pool = BufferPool(64 * MiB)
    sizes = [2 * MiB, 3 * MiB, 5 * MiB]
    ids = {}
    for size in sizes:
        view = pool.take(size)
        ids[size] = id(view.obj)
        del view
    got = pool.take(int(2.9 * MiB))  # fits 3 and 5 MiB; 5 MiB has more than 1/4 to spare
    assert id(got.obj) == ids[3 * MiB] and len(got) == int(2.9 * MiB)
    other = pool.take(int(1.5 * MiB))  # 2 MiB is a third more: a new buffer, not the 2 MiB one
    assert id(other.obj) not in ids.values()
    assert (pool.allocated, pool.reused) == (4, 1)


def test_a_pool_with_more_spare_uses_larger_idle_buffers() -> None:
    # The column pool (max_spare=1.0): blocks' columns vary in size from block to block; an idle
    # buffer up to twice the request serves it instead of a new one.
    pool = BufferPool(64 * MiB, max_spare=1.0)
    view = pool.take(4 * MiB)
    backing = id(view.obj)
    del view
    got = pool.take(int(2.1 * MiB))
    assert id(got.obj) == backing and len(got) == int(2.1 * MiB)
    del got
    smaller = pool.take(int(1.9 * MiB))  # the 4 MiB buffer is more than twice that: a new one
    assert id(smaller.obj) != backing
    assert (pool.allocated, pool.reused) == (2, 1)


def test_a_pool_lets_idle_buffers_go_after_its_own_count_of_requests() -> None:
    # The column pool takes several buffers a block, so it counts more requests before a buffer
    # of a size that stopped coming goes.
    pool = BufferPool(64 * MiB, stale_after=40)
    view = pool.take(8 * MiB)
    del view
    for _ in range(STALE_AFTER + 1):
        frame = pool.take(MiB)
        del frame
    assert pool.kept == 2  # not yet: 17 requests of the 40
    for _ in range(40 - STALE_AFTER):
        frame = pool.take(MiB)
        del frame
    assert pool.kept == 1 and pool.held_bytes == MiB


def test_small_frames_get_plain_bytearrays_that_the_pool_does_not_keep() -> None:
    pool = BufferPool(64 * MiB)
    small = pool.take(MIN_POOLED_BYTES - 1)
    assert isinstance(small, bytearray) and len(small) == MIN_POOLED_BYTES - 1
    assert pool.held_bytes == 0 and (pool.allocated, pool.reused) == (0, 0)


def test_the_pool_keeps_at_most_max_bytes_letting_idle_buffers_go_least_recently_used_first() -> None:
    pool = BufferPool(10 * MiB)
    busy = [pool.take(4 * MiB) for _ in range(3)]  # the third does not fit beside two in use
    assert pool.held_bytes == 8 * MiB and pool.kept == 2
    assert isinstance(busy[2], bytearray) and len(busy[2]) == 4 * MiB  # its own, exactly the size
    first, second = id(busy[0].obj), id(busy[1].obj)
    del busy
    again = pool.take(4 * MiB)  # the least recently used of the two idle ones is the first
    assert id(again.obj) in (first, second) and pool.reused == 1
    # A new size needs 6 MiB: the idle 4 MiB buffer goes, the one in use stays.
    other = pool.take(6 * MiB)
    assert pool.held_bytes == 4 * MiB + 6 * MiB and pool.kept == 2
    assert len(again) == 4 * MiB and again[0:1] is not None  # still valid, still kept
    # Nothing idle: a buffer of its own, nothing let go.
    extra = pool.take(6 * MiB)
    assert isinstance(extra, bytearray) and pool.held_bytes == 10 * MiB and pool.kept == 2
    del other
    # Not enough idle room for 7 MiB (6 idle, 4 in use, bound 10): nothing is let go for nothing.
    seven = pool.take(7 * MiB)
    assert isinstance(seven, bytearray) and pool.held_bytes == 10 * MiB and pool.kept == 2


def test_idle_buffers_of_sizes_that_stopped_coming_are_let_go() -> None:
    pool = BufferPool(64 * MiB)
    view = pool.take(8 * MiB)
    del view
    for _ in range(STALE_AFTER + 1):
        frame = pool.take(MiB)
        del frame
    assert pool.kept == 1 and pool.held_bytes == MiB  # the 8 MiB buffer is gone


def test_a_buffer_held_for_long_is_not_stale_when_it_comes_back() -> None:
    # An application holding an Arrow batch for many blocks: its buffer counts as used while it
    # is seen in use, so it is used again (not let go) once the batch is dropped.
    pool = BufferPool(64 * MiB)
    held = pool.take(8 * MiB)
    for _ in range(3 * STALE_AFTER):
        frame = pool.take(MiB)
        del frame
    assert pool.in_use == 1
    del held
    assert pool.in_use == 0
    again = pool.take(8 * MiB)
    assert pool.reused == 3 * STALE_AFTER and pool.allocated == 2 and len(again) == 8 * MiB
    # Idle from now on, it goes after STALE_AFTER large requests.
    del again
    for _ in range(STALE_AFTER + 1):
        frame = pool.take(MiB)
        del frame
    assert pool.kept == 1 and pool.held_bytes == MiB


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_buffer_idle_for_longer_than_idle_after_is_let_go_at_the_next_trim() -> None:
    clock = Clock()
    pool = BufferPool(64 * MiB, clock=clock)
    view = pool.take(8 * MiB)
    held = pool.held_bytes
    clock.now += 100
    assert pool.trim() == 0 and pool.held_bytes == held  # in use: kept, however long
    del view
    clock.now += IDLE_AFTER - 1
    assert pool.trim() == 0 and pool.kept == 1  # idle since the last trim saw it in use: not long enough
    clock.now += 2
    assert pool.trim() == held and (pool.kept, pool.held_bytes, pool.released) == (0, 0, held)


def test_a_large_request_lets_go_of_buffers_idle_for_long_too() -> None:
    clock = Clock()
    pool = BufferPool(64 * MiB, clock=clock)
    view = pool.take(8 * MiB)
    del view
    clock.now += IDLE_AFTER + 1
    frame = pool.take(MiB)  # one large request, far fewer than STALE_AFTER
    assert pool.kept == 1 and pool.held_bytes == MiB and len(frame) == MiB


def test_after_a_catch_up_a_steady_trickle_keeps_only_what_it_uses() -> None:
    """After a rebalance a member catches up with many large responses at once, then reads a trickle:
    frames under ``min_bytes``, and one of 300 KiB every ten seconds.  The pool must come back to
    what the trickle uses, however long it lasts (too few large requests to count them stale)."""
    clock = Clock()
    pool = BufferPool(114 * MiB, clock=clock)
    for size in (2 * MiB, 3 * MiB, 5 * MiB, 8 * MiB, 12 * MiB):
        in_flight = [pool.take(size + i * 4096) for i in range(3)]  # the fetch buffer holds a few
        del in_flight
    caught_up = pool.held_bytes
    assert caught_up > 60 * MiB
    for second in range(120):
        clock.now += 1
        for _ in range(20):
            small = pool.take(MIN_POOLED_BYTES // 4)
            assert isinstance(small, bytearray)
        if second % 10 == 0:
            steady = pool.take(300 << 10)
            del steady
        if second % 5 == 0:
            pool.trim()  # the background loop, every TRIM_INTERVAL seconds
    assert pool.kept == 1 and pool.held_bytes == size_class(300 << 10)
    assert pool.released == caught_up + size_class(300 << 10) - pool.held_bytes


def test_the_column_pool_gives_back_idle_buffers_too() -> None:
    clock = Clock()
    pool = column_pool(64 * MiB, clock=clock)
    assert pool.idle_after == IDLE_AFTER
    block = [pool.take(4 * MiB) for _ in range(4)]
    del block
    clock.now += IDLE_AFTER + 1
    assert pool.trim() == 4 * MiB * 4 and pool.kept == 0


@pytest.mark.anyio
async def test_the_background_loop_has_the_pools_give_back_idle_buffers() -> None:
    clock = Clock()
    pool = BufferPool(64 * MiB, clock=clock)
    view = pool.take(8 * MiB)
    del view
    clock.now += IDLE_AFTER + 1
    engine = Engine(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    engine.watch_pool(pool)
    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)  # its first turn trims, then every TRIM_INTERVAL seconds
        await anyio.sleep(0.05)
        engine.stop()
    assert pool.kept == 0 and pool.released == size_class(8 * MiB)
    # A consumer's loop looks after its frames and its Arrow columns.
    consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers="127.0.0.1:1")
    engine = consumer._new_engine()
    assert engine._pools == [engine.network.frames, consumer._collector.column_buffers]


def test_a_pool_of_no_bytes_keeps_nothing_and_gives_exact_sizes() -> None:
    pool = BufferPool(0)
    frame = pool.take(MiB + 1)
    assert isinstance(frame, bytearray) and len(frame) == MiB + 1
    assert pool.held_bytes == 0 and pool.kept == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        BufferPool(-1)
    with pytest.raises(ValueError, match="max_spare"):
        BufferPool(MiB, max_spare=-0.5)
    with pytest.raises(ValueError, match="stale_after"):
        BufferPool(MiB, stale_after=0)
    with pytest.raises(ValueError, match="idle_after"):
        BufferPool(MiB, idle_after=0)


# -- through a connection's read path ------------------------------------------------------------


class _Chunks:
    """A byte stream over ``data`` in reads of ``step`` bytes; then it blocks on ``gate`` (if any)
    and raises ``error``."""

    def __init__(self, data: bytes, step: int, gate: anyio.Event | None = None,
                 error: Exception | None = None) -> None:
        self.data, self.pos, self.step, self.gate, self.error = data, 0, step, gate, error

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self.pos >= len(self.data):
            if self.gate is not None:
                await self.gate.wait()
            raise self.error or anyio.EndOfStream()
        out = self.data[self.pos : self.pos + min(self.step, max_bytes)]
        self.pos += len(out)
        return out

    async def aclose(self) -> None:
        self.pos = len(self.data)


def _connection(pool: BufferPool) -> BrokerConnection:
    return BrokerConnection(1, "127.0.0.1", 1, client_id="t", request_timeout=1, setup_timeout=1,
                            ssl_context=None, frames=pool)


def _fetch_response(letter: bytes, codec: int, count: int = 3000) -> bytes:
    # Random values: compressed, the response is still larger than MIN_POOLED_BYTES.
    batch = build_batch([Record(b"k%d" % i, letter * 4 + os.urandom(96), (("h", letter * 5),)) for i in range(count)],
                        base_offset=0, compression=codec)
    partitions = [
        {"partition_index": p, "error_code": 0, "high_watermark": count, "last_stable_offset": count,
         "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": batch}
        for p in range(2)
    ]
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [],
            "responses": [{"topic": "t", "topic_id": bytes(16), "partitions": partitions}]}
    return encode_response("Fetch", 12, body, correlation_id=1)


async def _read_fetch(conn: BrokerConnection, stream: Any) -> list[CompletedFetch]:
    size = int.from_bytes(await conn._read_exactly(stream, 4), "big")
    body = decode_response("Fetch", 12, memoryview(await conn._read_exactly(stream, size)))
    fetches = []
    for p in body["responses"][0]["partitions"]:
        view = p["records"]
        count, complete, _ = records.scan_batches(view)
        fetches.append(CompletedFetch(TopicPartition("t", p["partition_index"]), 0, 0, view[:complete], count,
                                      check_crcs=True, aborted=None))
    return fetches


@pytest.mark.anyio
@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP])
async def test_a_fetch_left_unread_in_the_buffer_keeps_its_frame_from_being_used_again(codec: int) -> None:
    """Fetch responses read into pooled buffers and decoded as the consumer does: while a fetch is
    unread its frame is not handed out again, and every record read from it is its own."""
    pool = BufferPool(64 * MiB)
    conn = _connection(pool)
    stream = _Chunks(b"".join(_fetch_response(c, codec) for c in (b"A", b"B", b"C")), 64 << 10)
    first = await _read_fetch(conn, stream)
    partly = first[0].take(10, 0)
    second = await _read_fetch(conn, stream)  # ``first`` is still in the "fetch buffer"
    assert (pool.allocated, pool.reused) == (2, 0)
    rows = partly + first[0].take(10**6, 10) + first[1].take(10**6, 0)
    assert len(rows) == 6000
    assert all(r.value[:4] == b"AAAA" and len(r.value) == 100 and r.headers[0][1] == b"A" * 5 for r in rows)
    del first, partly
    gc.collect()
    third = await _read_fetch(conn, stream)  # into the first frame's buffer
    assert (pool.allocated, pool.reused) == (2, 1)
    assert all(r.value[:4] == b"BBBB" for f in second for r in f.take(10**6, 0))
    assert all(r.value[:4] == b"CCCC" for f in third for r in f.take(10**6, 0))
    assert all(r.value[:4] == b"AAAA" for r in rows)  # the rows handed out are copies


@pytest.mark.anyio
async def test_a_frame_cut_off_half_read_leaves_its_buffer_idle_and_untouched_by_others() -> None:
    pool = BufferPool(8 * MiB)
    cut, other = _connection(pool), _connection(pool)
    gate = anyio.Event()
    failed: list[BaseException] = []

    async def read_cut() -> None:
        try:
            await cut._read_exactly(_Chunks(b"A" * 300_000, 300_000, gate, anyio.BrokenResourceError()), 600_000)
        except anyio.BrokenResourceError as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_cut)
        await anyio.sleep(0.01)  # ``cut`` holds a half-filled buffer
        b = await other._read_exactly(_Chunks(b"B" * 600_000, 300_000), 600_000)  # type: ignore[arg-type]
        assert bytes(b) == b"B" * 600_000 and (pool.allocated, pool.reused) == (2, 0)
        gate.set()
    assert failed
    failed.clear()  # the exception's traceback holds the reading frame, and so the buffer
    gc.collect()
    c = await other._read_exactly(_Chunks(b"C" * 600_000, 300_000), 600_000)  # type: ignore[arg-type]
    assert (pool.allocated, pool.reused) == (2, 1)  # the cut-off frame's buffer, idle again
    assert bytes(c) == b"C" * 600_000 and bytes(b) == b"B" * 600_000


def test_the_frames_benchmark_reads_every_frame_and_uses_pooled_buffers_again() -> None:
    """``python -m benchmarks.frames`` end to end, small: a connection reading over loopback."""
    root = ROOT
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.frames", "--rounds", "1", "--frames", "12", "--frame-mib", "0.5"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reuse = re.search(r"pooled buffers: (\d+) allocated, (\d+) used again", proc.stdout)
    assert reuse is not None, proc.stdout
    allocated, reused = map(int, reuse.groups())
    assert reused >= 6 and allocated <= 6  # at most hold + 1 buffers in use at once
    assert "| pooled |" in proc.stdout and "| new buffer per frame |" in proc.stdout


@pytest.mark.anyio
async def test_a_response_that_fails_to_decode_leaves_its_frame_buffer_idle() -> None:
    """The decoding error stays on the connection and with the request's waiter; its traceback
    does not keep the frame (a pooled buffer) alive."""
    pool = BufferPool(8 * MiB)
    conn = _connection(pool)
    waiter: Waiter[Any] = Waiter()
    conn._pending[1] = ("Fetch", 12, waiter)
    body = (1).to_bytes(4, "big") + b"\xff" * 400_000  # correlation id 1, then no Fetch response
    conn._stream = _Chunks(len(body).to_bytes(4, "big") + body, 64 << 10)  # type: ignore[assignment]
    await conn._read_loop()
    assert isinstance(conn._closed_error, ProtocolDecodeError)
    with pytest.raises(ProtocolDecodeError):
        waiter.result()
    assert pool.allocated == 1 and pool.kept == 1
    assert pool.in_use == 0  # no reference left in the error's traceback
    assert "_deliver" in "".join(traceback.format_exception(conn._closed_error))  # the lines stay
