"""The fetch buffer: raw record sets waiting for the application, bounded in bytes.

The background loop adds one ``CompletedFetch`` per partition per fetch
response and stops fetching while ``used_bytes`` is at ``max_bytes`` (and a
partition while it has its share of it, see managers/fetch.py); the
application side decodes them lazily, batch by batch, and frees the bytes
when a completed fetch is used up.  No record bytes are copied before a
key/value is handed out: completed fetches hold ``memoryview`` slices of the
response frame.

What the buffer holds in memory is whole frames: a frame stays alive while any partition read
from it is still here.  So ``used_bytes`` counts each frame once, from the first completed fetch
added from it to the last one gone, and not the partitions' record bytes: a response of four
partitions of which three are read still holds all of its frame.  (Counted by record bytes, an
application reading a few hundred records a poll let the loop fetch on while such frames piled up
past ``fetch_buffer_bytes`` and past the frame pool's bound, and the pool then made a new frame
for most responses: docs/performance.md.)  The partitions' read-ahead shares
(``buffered_bytes``) are their record bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from ..errors import RecordError
from ..protocol.columnar import ColumnReader, Columns
from ..protocol.compression import DEFAULT_MAX_SIZE
from ..protocol.records import (
    AbortedTransactionFilter,
    RecordBatch,
    decode_batch,
    decode_next,
    iter_batches,
    next_batch_to_read,
    next_records,
    offset_after_batch,
)
from ..structs import ConsumerRecord, TopicPartition

Record = ConsumerRecord[bytes, bytes]


class CompletedFetch:
    """One partition's data from one fetch response.

    A row read (:meth:`take`) walks its batches one at a time.  With the compiled decoder and
    read_uncommitted the walk is ``decode_next``'s (protocol/records.py): the byte where it got to
    (``_walk``), each plain batch decoded straight from the record set; a batch it leaves to Python
    (compressed, legacy, not valid) is read by ``iter_batches`` from that byte, and the walk goes on
    after it.  Otherwise (read_committed, whose aborted transactions need the batches' producer ids;
    the Python decoder) the walk is ``iter_batches``'s throughout.
    """

    __slots__ = (
        "_aborted",
        "_aborted_list",
        "_batches",
        "_check_crcs",
        "_columns",
        "_data",
        "_index",
        "_max_decompressed",
        "_on_unlisted_abort",
        "_pending",
        "_walk",
        "epoch",
        "error",
        "exhausted",
        "fetch_offset",
        "frame_bytes",
        "frame_id",
        "next_offset",
        "size",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        epoch: int,
        fetch_offset: int,
        records: memoryview,
        next_offset: int,
        *,
        check_crcs: bool,
        aborted: list[tuple[int, int]] | None,
        max_decompressed: int = DEFAULT_MAX_SIZE,
        on_unlisted_abort: Callable[[int, int], None] | None = None,
    ) -> None:
        self.tp = tp
        self.epoch = epoch
        self.fetch_offset = fetch_offset
        self.next_offset = next_offset
        self.size = len(records)
        self._data = records
        # The buffer ``records`` is a slice of (the response's frame), by identity and size; it
        # stays alive as long as ``records`` does.
        frame = records.obj if isinstance(records, memoryview) else records
        self.frame_id = id(frame)
        with memoryview(frame) as whole:
            self.frame_bytes = whole.nbytes
        self.exhausted = False
        self.error: RecordError | None = None
        self._check_crcs = check_crcs
        #: The compiled walk's next byte (None: the walk is ``_batches``'s).
        self._walk: int | None = 0 if decode_next is not None and aborted is None else None
        self._batches: Iterator[RecordBatch] = iter(()) if self._walk is not None else iter_batches(
            records,
            topic=tp.topic,
            partition=tp.partition,
            check_crcs=check_crcs,
            max_decompressed=max_decompressed,
        )
        #: Called when the broker let an aborted transaction's records through (read_committed).
        self._on_unlisted_abort = on_unlisted_abort
        self._aborted = AbortedTransactionFilter(aborted, on_unlisted_abort) if aborted is not None else None
        self._aborted_list = aborted
        self._max_decompressed = max_decompressed
        self._pending: list[Record] = []
        self._index = 0
        #: The columnar walk (``take_columns``), made on first use.
        self._columns: ColumnReader | None = None

    def take(self, max_records: int, position: int) -> list[Record]:
        """Up to ``max_records`` records at or after ``position``, decoding batches as needed.

        A corrupt batch raises ``RecordError`` — after the records before it were handed out, on
        the following call — and the fetch is then done with (the caller refetches from the bad
        batch, so the error repeats until the application seeks past it, as in the Java client).
        """
        if self._columns is not None:  # switching from the columnar walk: restart at the position
            self._columns = None
            self._restart_rows()
        out: list[Record] = []
        while len(out) < max_records:
            pending = self._pending
            if self._index >= len(pending):
                if self.error is not None:
                    if out:
                        return out
                    self.exhausted = True
                    raise self.error
                try:
                    more = self._next_batch(position, max_records - len(out))
                except RecordError as exc:
                    self.error = exc
                    continue
                if not more:
                    self.exhausted = True
                    break
                pending = self._pending
            want = max_records - len(out)
            chunk = pending[self._index : self._index + want]
            self._index += len(chunk)
            out.extend(chunk)
        return out

    def take_columns(
        self,
        max_records: int,
        position: int,
        *,
        include_headers: bool = True,
        allocate: Callable[[int], Any] | Literal["arrow"] | None = "arrow",
        min_allocate: int = 0,
    ) -> Columns:
        """``take`` as Arrow-ready column buffers (``protocol.columnar``): up to ``max_records``
        records at or after ``position``, the same walk (aborted transactions, control batches,
        records before the position dropped, a corrupt batch raising after the records before it).

        The columns may hold fewer than ``max_records`` records while the fetch has more: a
        call hands out the rest of one decoded block before decoding the next.  A fetch may be
        read by ``take`` and ``take_columns`` in turn; each switch restarts the walk from the
        position (which the caller moves past whatever it was handed).  ``allocate`` is the column
        buffers' allocator, asked for buffers of ``min_allocate`` bytes or more (``ColumnReader``'s;
        the consumer passes its buffer pool's ``take`` and the pool's ``min_bytes``).
        """
        reader = self._columns
        if reader is None:
            if self.error is not None:  # the row walk met a corrupt batch
                self.exhausted = True
                raise self.error
            tp = self.tp
            self._pending = []
            self._index = 0
            reader = self._columns = ColumnReader(
                self._data,
                topic=tp.topic,
                partition=tp.partition,
                check_crcs=self._check_crcs,
                aborted=self._aborted_list,
                on_unlisted_abort=self._on_unlisted_abort,
                include_headers=include_headers,
                max_decompressed=self._max_decompressed,
                allocate=allocate,
                min_allocate=min_allocate,
            )
        try:
            return reader.take(max_records, position)
        finally:
            self.exhausted = reader.exhausted

    def _restart_rows(self) -> None:
        tp = self.tp
        if self._walk is not None:
            self._walk = 0
        else:
            self._batches = iter_batches(
                self._data,
                topic=tp.topic,
                partition=tp.partition,
                check_crcs=self._check_crcs,
                max_decompressed=self._max_decompressed,
            )
        aborted = self._aborted_list
        self._aborted = AbortedTransactionFilter(aborted, self._on_unlisted_abort) if aborted is not None else None
        self._pending = []
        self._index = 0

    def offset_after_batch(self, base_offset: int) -> int:
        """The offset after the batch starting at ``base_offset`` (headers only), -1 if not found."""
        return offset_after_batch(self._data, base_offset)

    def _next_batch(self, position: int, want: int) -> bool:
        while (records := self._next_records(position, want)) is not None:
            if records and records[0].offset < position:
                records = [r for r in records if r.offset >= position]
            if records:
                self._pending = records
                self._index = 0
                return True
        self._pending = []
        self._index = 0
        return False

    def _next_records(self, position: int, want: int) -> list[Record] | None:
        """The records of the walk's next batch with any at or after ``position`` (all of them:
        the caller drops those before it), ``[]`` for a batch the Python step passes over; None at
        the end.  The compiled walk goes on over the plain batches after it until it has ``want``
        records (whole batches: the caller keeps what it does not take)."""
        tp = self.tp
        walk = self._walk
        if walk is None:
            batch = next_batch_to_read(self._batches, position, self._aborted)
            return None if batch is None else decode_batch(batch, tp.topic, tp.partition)
        records, self._walk = next_records(
            self._data, walk, position, tp.topic, tp.partition, self._check_crcs, self._max_decompressed, want
        )
        return records


class FetchBuffer:
    """The completed fetches the application side reads, in arrival order, and their bytes.

    ``on_data()`` is called when a fetch is added; ``on_space(tp, was_full)`` when one leaves
    (read to its end, dropped), with its partition and whether the buffer was full before: the
    background loop may then fetch again (``Engine`` wakes it only when a fetch could follow).
    """

    def __init__(
        self, max_bytes: int, on_space: Callable[[TopicPartition, bool], None], on_data: Callable[[], None]
    ) -> None:
        self.max_bytes = max_bytes
        #: The bytes of the frames the completed fetches here point into, each frame once.
        self.used_bytes = 0
        self._fetches: deque[CompletedFetch] = deque()
        self._bytes_by_tp: dict[TopicPartition, int] = {}
        # frame_id -> how many completed fetches here point into the frame
        self._frames: dict[int, int] = {}
        self._on_space = on_space
        self._on_data = on_data

    def __len__(self) -> int:
        return len(self._fetches)

    @property
    def full(self) -> bool:
        return self.used_bytes >= self.max_bytes

    def buffered_bytes(self, tp: TopicPartition) -> int:
        return self._bytes_by_tp.get(tp, 0)

    @property
    def bytes_by_partition(self) -> Mapping[TopicPartition, int]:
        """:meth:`buffered_bytes` of every partition with some (the others are absent), for a walk
        over many partitions; a view, not a copy: read it, do not keep it."""
        return self._bytes_by_tp

    def add(self, fetch: CompletedFetch) -> None:
        self._fetches.append(fetch)
        fetches = self._frames.get(fetch.frame_id, 0)
        if not fetches:  # the first partition read from this frame: the frame counts from now
            self.used_bytes += fetch.frame_bytes
        self._frames[fetch.frame_id] = fetches + 1
        self._bytes_by_tp[fetch.tp] = self._bytes_by_tp.get(fetch.tp, 0) + fetch.size
        self._on_data()

    def fetches(self) -> list[CompletedFetch]:
        return list(self._fetches)

    def remove(self, fetch: CompletedFetch) -> None:
        try:
            self._fetches.remove(fetch)
        except ValueError:
            return
        self._release(fetch)

    def drop(self, keep: Callable[[CompletedFetch], Any]) -> None:
        """Remove every completed fetch for which ``keep`` is false."""
        for fetch in [f for f in self._fetches if not keep(f)]:
            self.remove(fetch)

    def _release(self, fetch: CompletedFetch) -> None:
        was_full = self.full
        fetches = self._frames.pop(fetch.frame_id) - 1
        if fetches:
            self._frames[fetch.frame_id] = fetches
        else:  # the last partition read from this frame: the frame may go
            self.used_bytes -= fetch.frame_bytes
        left = self._bytes_by_tp.get(fetch.tp, 0) - fetch.size
        if left > 0:
            self._bytes_by_tp[fetch.tp] = left
        else:
            self._bytes_by_tp.pop(fetch.tp, None)
        self._on_space(fetch.tp, was_full)  # the partition may be under its read-ahead share now
