"""The pool of large response frames' buffers (engine/frames.py), driven directly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncconsumer.engine.frames import MIN_POOLED_BYTES, FramePool, size_class

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
    pool = FramePool(64 * MiB)
    first = pool.take(4 * MiB + 10)
    assert isinstance(first, memoryview) and len(first) == 4 * MiB + 10 and not first.readonly
    first[:5] = b"stale"
    backing = id(first.obj)  # not the object: a reference would keep the buffer busy
    records = first[100:200]  # what a decoded fetch keeps of its response
    del first
    second = pool.take(4 * MiB + 20)
    assert id(second.obj) != backing  # ``records`` still points into the first buffer
    assert (pool.allocated, pool.reused) == (2, 0)
    backings = {backing, id(second.obj)}
    del records, second
    third = pool.take(4 * MiB + 30)
    assert isinstance(third, memoryview) and len(third) == 4 * MiB + 30
    assert id(third.obj) in backings
    assert (pool.allocated, pool.reused) == (2, 1)
    assert pool.held_bytes == 2 * size_class(4 * MiB + 10)


def test_small_frames_get_plain_bytearrays_that_the_pool_does_not_keep() -> None:
    pool = FramePool(64 * MiB)
    small = pool.take(MIN_POOLED_BYTES - 1)
    assert isinstance(small, bytearray) and len(small) == MIN_POOLED_BYTES - 1
    assert pool.held_bytes == 0 and (pool.allocated, pool.reused) == (0, 0)


def test_the_pool_keeps_at_most_max_bytes_and_lets_idle_buffers_go_for_new_sizes() -> None:
    pool = FramePool(10 * MiB)
    busy = [pool.take(4 * MiB) for _ in range(3)]  # the third does not fit beside two in use
    assert pool.held_bytes == 8 * MiB
    assert all(len(b) == 4 * MiB for b in busy)
    del busy
    other = pool.take(6 * MiB)  # a new size: idle 4 MiB buffers make room for it
    assert pool.held_bytes <= 10 * MiB
    assert pool.held_bytes == 4 * MiB + 6 * MiB
    again = pool.take(6 * MiB)  # ``other`` is in use: a buffer of its own, not kept
    assert again.obj is not other.obj and pool.held_bytes == 10 * MiB


def test_a_pool_of_no_bytes_keeps_nothing_and_still_hands_out_buffers() -> None:
    pool = FramePool(0)
    assert len(pool.take(MiB)) == MiB
    assert pool.held_bytes == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        FramePool(-1)


def test_the_frames_benchmark_reads_every_frame_and_uses_pooled_buffers_again() -> None:
    """``python -m benchmarks.frames`` end to end, small: a connection reading over loopback."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.frames", "--rounds", "1", "--frames", "12", "--frame-mib", "0.5"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reuse = re.search(r"pooled buffers: (\d+) allocated, (\d+) used again", proc.stdout)
    assert reuse is not None, proc.stdout
    allocated, reused = map(int, reuse.groups())
    assert allocated + reused == 12 and reused >= 12 - 5  # at most hold + 1 buffers in use at once
    assert "| pooled |" in proc.stdout and "| new buffer per frame |" in proc.stdout
