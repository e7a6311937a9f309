"""Large buffers used again once nothing points into them: response frames and Arrow columns.

Two things a consumer fills are large and short-lived:

* **Response frames.** A fetch response is read from the socket in chunks and put together in
  one buffer; the records are decoded straight from it, without another copy.  With default
  settings that buffer is a few MiB, one per fetch response.
* **Arrow column blocks.** ``arrow_batches()`` decodes up to ``max_records`` records into column
  buffers (protocol/columnar.py) that pyarrow wraps without copying; the values of 10,000
  records of 100 B are 1 MB, of 1 KiB 10 MB.

A fresh buffer of that size costs more than the data copied into it: the allocator (glibc's
``malloc`` for a ``bytearray``, mimalloc in Arrow's memory pool) takes large blocks from the
operating system and gives them back when they are freed, so every new buffer faults in pages the
kernel must first clear (with transparent huge pages, 2 MiB at a time).  In a profile of a
1,000,000 x 100 B read from Apache Kafka, clearing those pages was 14-17% of the samples for the
frames, and another 25-30% of an ``arrow_batches()`` read for the column buffers
(docs/performance.md; ``python -m benchmarks.frames`` measures the frame read path alone).

:class:`BufferPool` keeps large buffers and hands one out again when nothing refers to it any
more: no ``memoryview`` of it is alive.  For a frame, that means no fetch in the fetch buffer and no
record batch being decoded points into it (decoded keys and values are copies).  For a column
block, no ``pyarrow`` array wraps it: Arrow holds the ``memoryview`` it wraps until the last array
over the memory is gone, whoever holds it (a ``RecordBatch``, a table, a pandas or Polars frame
made without a copy).  That is read from the buffer's reference count (CPython's
``sys.getrefcount``; the pool's own reference is the only one left).  The count an idle buffer
has is measured at import, the same way the pool reads it, and checked against a buffer with a
live view; where that check fails (another interpreter), the pool keeps nothing and every request
gets a buffer of its own.  A consumer has one pool for its frames (``NetworkClient.frames``) and
one for its Arrow columns (``Collector.column_buffers``).

The rules, all in :meth:`BufferPool.take`:

* Buffers under ``min_bytes`` (256 KiB for frames, 64 KiB for columns) are plain bytearrays:
  the allocator keeps small blocks itself.
* A request gets the smallest idle buffer that holds it with at most ``max_spare`` to spare (1/4
  for frames; for columns as much again as asked, since a block's columns vary in size from block
  to block), handed out as a ``memoryview`` of exactly the size asked for.  New buffers are the
  size rounded up to a size class (at most 1/8 more), so requests of about the same size share
  buffers.  They are anonymous memory from the operating system (``mmap``; a ``bytearray``
  without it), whose pages are faulted in and cleared when first written, instead of a
  ``bytearray`` cleared whole up front (a second pass over memory its user overwrites anyway):
  8% less CPU time in an ``arrow_batches()`` read.
* The pool keeps at most ``max_bytes`` of buffers, in use or idle.  For frames that is the
  consumer's ``fetch_buffer_bytes`` plus ``fetch_max_bytes`` (the frames the fetch buffer may
  hold, and the response on its way), at most twice ``fetch_buffer_bytes`` and at most four
  responses of ``fetch_max_bytes``; for columns, ``fetch_buffer_bytes``.  A new buffer that
  does not fit makes room by letting go of idle buffers, least recently used first; if it still
  does not fit, it is not kept (a buffer of its own, freed as before).  An idle buffer that was
  idle for the last ``stale_after`` large requests is let go too (:data:`STALE_AFTER` responses
  for frames; :data:`COLUMN_STALE_AFTER` requests for columns, about 16 blocks of several
  columns each): buffers of sizes that stopped coming do not stay.  (A buffer counts as used at
  every request that finds it in use, so an application that holds Arrow batches for a while
  finds their buffers kept.)
* **Idle for long, let go.**  Counting requests does not give back what a burst left behind once
  the requests get small: after a rebalance a member catches up with responses of many MiB, then
  reads its steady trickle in frames under ``min_bytes`` that never reach :meth:`take`'s large
  path.  So a buffer idle for longer than ``idle_after`` seconds (:data:`IDLE_AFTER`) is let go
  too, at the next large request or at :meth:`BufferPool.trim`, which the consumer's background
  loop calls every few seconds (``LoopCore``, engine/core.py) for both pools: a worker that runs for
  weeks keeps what its steady traffic uses, not what its largest catch-up needed.  The clock is
  read once per large request and once per trim; a small request costs what it did.
"""

from __future__ import annotations

import mmap
import sys
import time
from collections.abc import Callable

__all__ = [
    "COLUMN_STALE_AFTER",
    "IDLE_AFTER",
    "MIN_COLUMN_BYTES",
    "MIN_POOLED_BYTES",
    "STALE_AFTER",
    "BufferPool",
    "column_pool",
    "size_class",
]

#: Frames smaller than this get a plain ``bytearray``: malloc serves them from memory it keeps.
MIN_POOLED_BYTES = 256 << 10
#: The same for Arrow column buffers: a block's offsets and timestamps (8 bytes a record) are
#: worth keeping from 10,000 records up.
MIN_COLUMN_BYTES = 64 << 10
#: An idle buffer not used for this many large requests is let go (frames: one request a response).
STALE_AFTER = 16
#: The same for column buffers: a block takes several (keys, values, offsets, timestamps, headers).
COLUMN_STALE_AFTER = 128
#: An idle buffer not used for this many seconds is let go, however few large requests came.
IDLE_AFTER = 30.0


_PRIVATE: int | None = getattr(mmap, "MAP_PRIVATE", None)  # None: Windows (a bytearray instead)


def _fresh(capacity: int) -> bytearray | mmap.mmap:
    """A new buffer for the pool: anonymous memory from the operating system where there is
    ``mmap`` (its pages are faulted in, cleared by the kernel, only when first written: a
    ``bytearray`` is cleared whole up front, a second pass over memory its user overwrites anyway,
    and room reserved for a column but left empty costs nothing)."""
    if _PRIVATE is None:
        return bytearray(capacity)
    return mmap.mmap(-1, capacity, flags=_PRIVATE)


def _references(kept: list[bytearray | mmap.mmap]) -> list[int]:
    """The reference count of each buffer, as this scan sees it (its own references included)."""
    count = sys.getrefcount
    return [count(buffer) for buffer in kept]


def _idle_count() -> int | None:
    """What :func:`_references` says of a buffer only its list refers to; None if a live view does
    not add exactly one (then the count cannot tell an idle buffer, and nothing is pooled)."""
    if not hasattr(sys, "getrefcount"):
        return None
    probe = [_fresh(1)]  # the kind of buffer the pools keep
    [idle] = _references(probe)
    view = memoryview(probe[0])
    [busy] = _references(probe)
    view.release()
    return idle if busy == idle + 1 and _references(probe) == [idle] else None


_IDLE = _idle_count()


def size_class(size: int) -> int:
    """``size`` rounded up to a multiple of 1/8 of its highest power of two (at most 12.5% more)."""
    step = max(1, (1 << (size.bit_length() - 1)) >> 3)
    return -(-size // step) * step


def column_pool(max_bytes: int, clock: Callable[[], float] = time.monotonic) -> BufferPool:
    """The pool for ``arrow_batches()``' column blocks (``Collector.column_buffers``)."""
    return BufferPool(max_bytes, MIN_COLUMN_BYTES, max_spare=1.0, stale_after=COLUMN_STALE_AFTER, clock=clock)


class BufferPool:
    """Buffers of ``min_bytes`` or more, kept up to ``max_bytes`` and used again."""

    __slots__ = (
        "_buffers", "_clock", "_held", "_seen", "_tick", "_used", "allocated", "idle_after", "max_bytes", "max_spare",
        "min_bytes", "released", "reused", "stale_after",
    )

    def __init__(
        self,
        max_bytes: int,
        min_bytes: int = MIN_POOLED_BYTES,
        *,
        max_spare: float = 0.25,
        stale_after: int = STALE_AFTER,
        idle_after: float = IDLE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < 0 or min_bytes < 1 or max_spare < 0 or stale_after < 1 or not idle_after > 0:
            raise ValueError(
                "BufferPool(max_bytes >= 0, min_bytes >= 1, max_spare >= 0, stale_after >= 1, idle_after > 0)"
            )
        self.max_bytes = max_bytes if _IDLE is not None else 0
        self.min_bytes = min_bytes
        #: How much larger than a request a kept buffer handed out for it may be, as a fraction.
        self.max_spare = max_spare
        #: An idle buffer not used for this many requests of ``min_bytes`` or more is let go.
        self.stale_after = stale_after
        #: An idle buffer not used for this many seconds is let go (at a large request or a trim).
        self.idle_after = idle_after
        self._clock = clock
        self._buffers: list[bytearray | mmap.mmap] = []  # in use or idle
        self._used: list[int] = []  # when each was last handed out or seen in use, in large requests (``_tick``)
        self._seen: list[float] = []  # the same, in seconds (``clock``)
        self._held = 0  # the capacity of the kept buffers
        self._tick = 0
        #: Bytes of buffers let go so far (stale, idle for long, or to make room).
        self.released = 0
        #: Requests of ``min_bytes`` or more served by a kept buffer / by a new one.
        self.reused = 0
        self.allocated = 0

    @property
    def held_bytes(self) -> int:
        """The capacity of the buffers the pool keeps, in use or idle."""
        return self._held

    @property
    def kept(self) -> int:
        """How many buffers the pool keeps, in use or idle."""
        return len(self._buffers)

    @property
    def in_use(self) -> int:
        """How many of the kept buffers something else refers to (a view of it is alive)."""
        return sum(count != _IDLE for count in _references(self._buffers))  # (marks nothing used)

    def take(self, size: int) -> memoryview | bytearray:
        """A writable buffer of exactly ``size`` bytes, its contents undefined."""
        if size < self.min_bytes:
            return bytearray(size)
        self._tick = tick = self._tick + 1
        now = self._clock()
        buffers, used, seen, stale_after = self._buffers, self._used, self._seen, self.stale_after
        idle_since = now - self.idle_after
        most = size + int(size * self.max_spare)
        best, best_size = -1, 0
        idle: list[int] = []
        stale: list[int] = []
        # One pass: a buffer in use counts as used now; of the idle ones, the smallest that fits
        # is the pick, and those idle for more than ``stale_after`` large requests or for more than
        # ``idle_after`` seconds go.
        for i, count in enumerate(_references(buffers)):
            if count != _IDLE:
                used[i] = tick
                seen[i] = now
                continue
            capacity = len(buffers[i])
            if size <= capacity <= most and (best < 0 or capacity < best_size):
                best, best_size = i, capacity
            idle.append(i)
            if tick - used[i] > stale_after or seen[i] < idle_since:
                stale.append(i)
        if best >= 0:
            used[best] = tick
            seen[best] = now
            self.reused += 1
            view = memoryview(buffers[best])[:size]
            if stale:
                self._let_go([i for i in stale if i != best])
            return view
        self.allocated += 1
        capacity = size_class(size)
        room = self._held + capacity - self.max_bytes  # to be made by letting idle buffers go
        if room > 0:
            rest = sorted((i for i in idle if i not in stale), key=lambda i: used[i])  # LRU first
            freed = sum(len(buffers[i]) for i in stale)
            if freed + sum(len(buffers[i]) for i in rest) >= room:
                while freed < room:
                    stale.append(rest.pop(0))
                    freed += len(buffers[stale[-1]])
        if stale:
            self._let_go(stale)
        if self._held + capacity > self.max_bytes:
            return bytearray(size)  # not kept: no room beside the buffers in use
        buffer = _fresh(capacity)
        buffers.append(buffer)
        used.append(tick)
        seen.append(now)
        self._held += capacity
        return memoryview(buffer)[:size]

    def trim(self) -> int:
        """Let go of the buffers idle for longer than ``idle_after`` seconds (those in use count as
        used now); returns the bytes let go.  The background loop calls it every few seconds."""
        now = self._clock()
        seen, idle_since = self._seen, now - self.idle_after
        stale = []
        for i, count in enumerate(_references(self._buffers)):
            if count != _IDLE:
                seen[i] = now
            elif seen[i] < idle_since:
                stale.append(i)
        held = self._held
        if stale:
            self._let_go(stale)
        return held - self._held

    def _let_go(self, indices: list[int]) -> None:
        for i in sorted(set(indices), reverse=True):  # from the back: the indices before stay valid
            capacity = len(self._buffers[i])
            self._held -= capacity
            self.released += capacity
            del self._buffers[i], self._used[i], self._seen[i]
