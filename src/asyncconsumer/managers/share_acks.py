"""One partition's acknowledgements not sent yet, as runs of offsets (KIP-932), sans-I/O.

A share consumer acknowledges every record it is handed: in implicit mode a poll's records all at
once (ACCEPT), in explicit mode one by one, and offsets acquired with no record behind them (a
control batch's, compacted away) as GAP when they arrive.  The wire carries them as
``AcknowledgementBatches``: runs of consecutive offsets with one type each.  So the ledger keeps
runs, not offsets: a poll's 500 records of a partition are one run, added in one step and sent as
one batch.

The runs are sorted, never overlap, and are kept whole (two runs that touch differ in type).  An
offset acknowledged again takes its new type (the last word wins, as with a map of offset to
type); adding after the last run, the common case, appends or extends it, and anything else (a GAP
found behind records already acknowledged, explicit acknowledgements out of order) replaces the
runs it overlaps, found by bisection, and joins the runs of its type it touches.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

#: The acknowledgement type of an acquired offset with no record (a control batch, compacted away):
#: the protocol's, never one the application sends (those are ``AcknowledgeType``'s).
GAP = 0


class AckLedger:
    """Offsets of one partition, each with its acknowledgement type (an ``AcknowledgeType``, or the
    protocol's GAP, 0), kept as sorted runs of consecutive offsets."""

    __slots__ = ("_firsts", "_kinds", "_lasts", "count")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        self._kinds: list[int] = []
        #: How many offsets the ledger holds.
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __repr__(self) -> str:
        return f"AckLedger({self.runs()!r})"

    def add(self, offset: int, kind: int) -> None:
        """``offset`` acknowledged as ``kind``."""
        self.add_range(offset, offset, kind)

    def add_all(self, offsets: Sequence[int], kind: int) -> None:
        """Each of ``offsets`` acknowledged as ``kind``; consecutive ascending offsets (a poll's
        records of one partition) are one run."""
        n = len(offsets)
        if not n:
            return
        first, last = offsets[0], offsets[-1]
        if last - first + 1 == n and (
            n < 3 or (offsets if type(offsets) is list else list(offsets)) == list(range(first, last + 1))
        ):  # consecutive and ascending (compared in C)
            self.add_range(first, last, kind)
            return
        start = prev = first
        for offset in offsets[1:]:
            if offset != prev + 1:
                self.add_range(start, prev, kind)
                start = offset
            prev = offset
        self.add_range(start, prev, kind)

    def add_range(self, first: int, last: int, kind: int) -> None:
        """Offsets ``first`` to ``last`` (both included) acknowledged as ``kind``."""
        firsts, lasts, kinds = self._firsts, self._lasts, self._kinds
        if not lasts or first > lasts[-1]:
            if lasts and first == lasts[-1] + 1 and kinds[-1] == kind:
                lasts[-1] = last
            else:
                firsts.append(first)
                lasts.append(last)
                kinds.append(kind)
            self.count += last - first + 1
            return
        i = bisect_left(lasts, first)  # the first run that ends at or after ``first``
        j = bisect_right(firsts, last)  # the first run that starts after ``last``: runs i..j-1 overlap
        removed = 0
        for k in range(i, j):
            removed += min(lasts[k], last) - max(firsts[k], first) + 1
        low, high = first, last
        head: tuple[int, int, int] | None = None
        tail: tuple[int, int, int] | None = None
        if i < j and firsts[i] < first:  # a run cut at ``first``: its head stays, or joins the new run
            if kinds[i] == kind:
                low = firsts[i]
            else:
                head = (firsts[i], first - 1, kinds[i])
        if i < j and lasts[j - 1] > last:  # and one cut at ``last``: its tail
            if kinds[j - 1] == kind:
                high = lasts[j - 1]
            else:
                tail = (last + 1, lasts[j - 1], kinds[j - 1])
        if i > 0 and lasts[i - 1] + 1 == low and kinds[i - 1] == kind:  # touching runs of the type join
            i -= 1
            low = firsts[i]
        if j < len(firsts) and firsts[j] == high + 1 and kinds[j] == kind:
            high = lasts[j]
            j += 1
        pieces = [run for run in (head, (low, high, kind), tail) if run is not None]
        firsts[i:j] = [run[0] for run in pieces]
        lasts[i:j] = [run[1] for run in pieces]
        kinds[i:j] = [run[2] for run in pieces]
        self.count += last - first + 1 - removed

    def runs(self) -> list[tuple[int, int, int]]:
        """``(first, last, kind)`` for each run of consecutive offsets of one type, ascending (the
        runs are kept whole: two that touch differ in type)."""
        return list(zip(self._firsts, self._lasts, self._kinds, strict=True))

    def batches(self) -> list[dict[str, Any]]:
        """The runs as the protocol's ``AcknowledgementBatches`` (one type a batch)."""
        return [{"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}
                for first, last, kind in self.runs()]

    def has(self, kind: int) -> bool:
        """Whether any offset is acknowledged as ``kind``."""
        return kind in self._kinds

    def acknowledged(self) -> tuple[int, ...]:
        """The offsets the application acknowledged (every type but GAP), ascending."""
        ranges: Iterator[range] = (
            range(first, last + 1)
            for first, last, kind in zip(self._firsts, self._lasts, self._kinds, strict=True) if kind != GAP
        )
        return tuple(chain.from_iterable(ranges))

    def acknowledged_count(self) -> int:
        """How many offsets the application acknowledged (every type but GAP)."""
        if GAP not in self._kinds:
            return self.count
        return self.count - sum(
            last - first + 1 for first, last, k in zip(self._firsts, self._lasts, self._kinds, strict=True) if k == GAP
        )
