"""Buffers for large response frames, used again once nothing points into them.

A fetch response is read from the socket in chunks and put together in one buffer: the records
are decoded straight from it, without another copy.  With default settings that buffer is a few
MiB, one per fetch response.  A fresh buffer of that size costs more than the data copied into
it: the allocator (glibc's ``malloc`` for a ``bytearray``) takes large blocks from the operating
system and gives them back when they are freed, so every new frame faults in pages the kernel
must first clear.  In a profile of a 1,000,000 x 100 B read from Apache Kafka, clearing those
pages was 14-17% of the samples, for ``batches()`` and ``arrow_batches()`` alike
(docs/performance.md; ``python -m benchmarks.frames`` measures the read path alone).

:class:`FramePool` keeps the buffers of large frames and hands one out again when nothing refers
to it any more: no ``memoryview`` of it is alive, so no fetch in the fetch buffer and no record
batch being decoded points into it.  That is read from the buffer's reference count (CPython's;
the pool's own references are the only ones left).  A buffer is handed out as a ``memoryview``
of exactly the frame's size; its capacity is the size rounded up to a size class (at most 1/8
more), so frames of about the same size share buffers.

The pool keeps at most ``max_bytes`` of buffers; a frame that does not fit beside the buffers in
use gets a buffer of its own, freed as before.  ``max_bytes`` is the consumer's
``fetch_buffer_bytes``: the fetch buffer may hold that much in responses at once anyway, so the
pool adds no memory at the peak; it only keeps it between fetches.  Frames under
``min_bytes`` (256 KiB) are not pooled: the allocator keeps small blocks itself.
"""

from __future__ import annotations

import sys

__all__ = ["FramePool"]

#: Frames smaller than this get a plain ``bytearray``: malloc serves them from memory it keeps.
MIN_POOLED_BYTES = 256 << 10


def _references(kept: list[bytearray], i: int) -> int:
    return sys.getrefcount(kept[i])


# What _references says of a buffer only its list refers to, measured the same way (the count
# getrefcount reports for its own argument differs between Python versions).
_IDLE = _references([bytearray(1)], 0)


def size_class(size: int) -> int:
    """``size`` rounded up to a multiple of 1/8 of its highest power of two (at most 12.5% more)."""
    step = max(1, (1 << (size.bit_length() - 1)) >> 3)
    return -(-size // step) * step


class FramePool:
    """Buffers for frames of ``min_bytes`` or more, kept up to ``max_bytes`` and used again."""

    __slots__ = ("_buffers", "_held", "allocated", "max_bytes", "min_bytes", "reused")

    def __init__(self, max_bytes: int, min_bytes: int = MIN_POOLED_BYTES) -> None:
        if max_bytes < 0 or min_bytes < 1:
            raise ValueError("FramePool(max_bytes >= 0, min_bytes >= 1)")
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._buffers: dict[int, list[bytearray]] = {}  # size class -> buffers of that capacity
        self._held = 0  # the capacity of all the pooled buffers, in use or idle
        #: Frame buffers handed out again / newly allocated for frames of ``min_bytes`` or more.
        self.reused = 0
        self.allocated = 0

    @property
    def held_bytes(self) -> int:
        """The capacity of the buffers the pool keeps, in use or idle."""
        return self._held

    def take(self, size: int) -> memoryview | bytearray:
        """A writable buffer of exactly ``size`` bytes, its contents undefined."""
        if size < self.min_bytes:
            return bytearray(size)
        capacity = size_class(size)
        kept = self._buffers.get(capacity, [])
        for i in range(len(kept)):
            if _references(kept, i) == _IDLE:
                self.reused += 1
                return memoryview(kept[i])[:size]
        self.allocated += 1
        buffer = bytearray(capacity)
        if self._held + capacity > self.max_bytes:
            self._evict_idle(self._held + capacity - self.max_bytes)
        if self._held + capacity <= self.max_bytes:
            self._buffers.setdefault(capacity, []).append(buffer)
            self._held += capacity
        return memoryview(buffer)[:size]

    def _evict_idle(self, need: int) -> None:
        """Let go of idle buffers to free ``need`` bytes; of none if the idle ones are not enough."""
        idle = [
            (capacity, i)
            for capacity, kept in self._buffers.items()
            for i in range(len(kept))
            if _references(kept, i) == _IDLE
        ]
        if sum(capacity for capacity, _ in idle) < need:
            return
        for capacity, i in reversed(idle):  # from the back: the indices before stay valid
            if need <= 0:
                break
            kept = self._buffers[capacity]
            del kept[i]
            if not kept:
                del self._buffers[capacity]
            self._held -= capacity
            need -= capacity
