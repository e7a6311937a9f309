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
batch being decoded points into it (decoded keys, values and Arrow columns are copies).  That is
read from the buffer's reference count (CPython's ``sys.getrefcount``; the pool's own reference
is the only one left).  The count an idle buffer has is measured at import, the same way the
pool reads it, and checked against a buffer with a live view; where that check fails (another
interpreter), the pool keeps nothing and every frame gets a buffer of its own, as before.

The rules, all in :meth:`FramePool.take`:

* Frames under ``min_bytes`` (256 KiB) get a plain ``bytearray``: the allocator keeps small
  blocks itself.
* A frame gets the smallest idle buffer that holds it with at most 1/4 to spare, handed out as a
  ``memoryview`` of exactly the frame's size.  New buffers are the frame's size rounded up to a
  size class (at most 1/8 more), so frames of about the same size share buffers.
* The pool keeps at most ``max_bytes`` of buffers, in use or idle: the consumer's
  ``fetch_buffer_bytes`` (what the fetch buffer may hold anyway), and at most four responses of
  ``fetch_max_bytes``.  A new buffer that does not fit makes room by letting go of idle buffers, least
  recently used first; if it still does not fit, it is not kept (a buffer of its own, freed as
  before).  An idle buffer that was not used for the last :data:`STALE_AFTER` large frames is let
  go too: buffers of sizes that stopped coming do not stay.
"""

from __future__ import annotations

import sys

__all__ = ["MIN_POOLED_BYTES", "STALE_AFTER", "FramePool", "size_class"]

#: Frames smaller than this get a plain ``bytearray``: malloc serves them from memory it keeps.
MIN_POOLED_BYTES = 256 << 10
#: An idle buffer not used for this many large frames is let go.
STALE_AFTER = 16


def _references(kept: list[bytearray], i: int) -> int:
    return sys.getrefcount(kept[i])


def _idle_count() -> int | None:
    """What :func:`_references` says of a buffer only its list refers to; None if a live view does
    not add exactly one (then the count cannot tell an idle buffer, and nothing is pooled)."""
    if not hasattr(sys, "getrefcount"):
        return None
    probe = [bytearray(1)]
    idle = _references(probe, 0)
    view = memoryview(probe[0])
    busy = _references(probe, 0)
    view.release()
    return idle if busy == idle + 1 and _references(probe, 0) == idle else None


_IDLE = _idle_count()


def size_class(size: int) -> int:
    """``size`` rounded up to a multiple of 1/8 of its highest power of two (at most 12.5% more)."""
    step = max(1, (1 << (size.bit_length() - 1)) >> 3)
    return -(-size // step) * step


class FramePool:
    """Buffers for frames of ``min_bytes`` or more, kept up to ``max_bytes`` and used again."""

    __slots__ = ("_buffers", "_held", "_tick", "_used", "allocated", "max_bytes", "min_bytes", "reused")

    def __init__(self, max_bytes: int, min_bytes: int = MIN_POOLED_BYTES) -> None:
        if max_bytes < 0 or min_bytes < 1:
            raise ValueError("FramePool(max_bytes >= 0, min_bytes >= 1)")
        self.max_bytes = max_bytes if _IDLE is not None else 0
        self.min_bytes = min_bytes
        self._buffers: list[bytearray] = []  # in use or idle
        self._used: list[int] = []  # when each was last handed out, in large frames (``_tick``)
        self._held = 0  # the capacity of the kept buffers
        self._tick = 0
        #: Frames of ``min_bytes`` or more served by a kept buffer / by a new one.
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

    def take(self, size: int) -> memoryview | bytearray:
        """A writable buffer of exactly ``size`` bytes, its contents undefined."""
        if size < self.min_bytes:
            return bytearray(size)
        self._tick += 1
        idle = self._idle()
        fits = [i for i in idle if size <= len(self._buffers[i]) <= size + size // 4]
        if fits:
            best = min(fits, key=lambda i: len(self._buffers[i]))
            self._used[best] = self._tick
            self.reused += 1
            view = memoryview(self._buffers[best])[:size]
            self._let_go(self._stale(idle))
            return view
        self.allocated += 1
        capacity = size_class(size)
        stale = self._stale(idle)
        room = self._held + capacity - self.max_bytes  # to be made by letting idle buffers go
        if room > 0:
            rest = sorted((i for i in idle if i not in stale), key=lambda i: self._used[i])  # LRU first
            freed = sum(len(self._buffers[i]) for i in stale)
            if freed + sum(len(self._buffers[i]) for i in rest) >= room:
                while freed < room:
                    stale.append(rest.pop(0))
                    freed += len(self._buffers[stale[-1]])
        self._let_go(stale)
        if self._held + capacity > self.max_bytes:
            return bytearray(size)  # not kept: no room beside the buffers in use
        buffer = bytearray(capacity)
        self._buffers.append(buffer)
        self._used.append(self._tick)
        self._held += capacity
        return memoryview(buffer)[:size]

    def _idle(self) -> list[int]:
        """The indices of the kept buffers nothing else refers to."""
        kept = self._buffers
        return [i for i in range(len(kept)) if _references(kept, i) == _IDLE]

    def _stale(self, idle: list[int]) -> list[int]:
        """Those of the ``idle`` buffers not handed out for the last :data:`STALE_AFTER` large frames."""
        return [i for i in idle if self._tick - self._used[i] > STALE_AFTER]

    def _let_go(self, indices: list[int]) -> None:
        for i in sorted(set(indices), reverse=True):  # from the back: the indices before stay valid
            self._held -= len(self._buffers[i])
            del self._buffers[i], self._used[i]
