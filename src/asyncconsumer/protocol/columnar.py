"""Columnar decoding: a partition's record batches straight to Arrow-ready buffers.

The row decoder (``records.decode_batch``) makes a ``ConsumerRecord`` with a ``bytes`` key and
value per record; turning those into Arrow columns afterwards walks every record again in
Python.  This module goes from the fetched bytes to column buffers in one pass, with no Python
object per record, and lets pyarrow wrap the buffers without copying them.

Design
------
* **Buffers** (:class:`ColumnBuffers`, one block of decoded records) are plain buffers
  (``bytearray``, or pyarrow ``Buffer`` from Arrow's memory pool, see below), native-endian, laid
  out as Arrow wants them: ``offsets`` int64, ``timestamps`` int64 microseconds (Arrow's unit:
  Kafka's milliseconds times 1000, stored as each record is; a timestamp beyond the microseconds
  int64 holds, about 292,000 years from 1970, is stored as :data:`TIMESTAMP_BEYOND` and the block
  notes the first, see :class:`ColumnBuffers`), ``timestamp_types`` int32 (-1 none, 0 CreateTime,
  1 LogAppendTime); key and value as binary columns (int32 offsets, one data buffer, a validity
  bitmap, LSB first, and the null count); headers as list<struct<key: string, value: binary>>:
  int32 list offsets per record, then for all the headers key offsets + UTF-8 data and value
  offsets + data + validity. Header keys are decoded as the row decoders decode them (malformed
  UTF-8 becomes U+FFFD). :class:`Columns` is a window ``[first, first + count)`` of a block: what
  Arrow calls an array offset, so handing out part of a block copies nothing.
* **The builder** does the per-record work.  ``ColumnBuilder(topic, partition, headers,
  max_offset, allocate)`` is the compiled one (``asyncconsumer._speedups``; it needs no pyarrow headers)
  when the row decoder is compiled too (:data:`COLUMN_DECODER` says ``"c"``), else
  :class:`PyColumnBuilder`, the reference: it decodes rows with ``decode_batch_py`` and packs
  them into the same buffers, byte for byte.  ``reserve(records, data)`` sizes the buffers up
  front (a hint: it stores nothing).  ``append(batch, start)`` stores a batch's records
  at offset >= ``start``, all or none: on error the builder is unchanged.  The compiled builder
  reads compressed batches through the row decoder's ``_decompress`` and hands legacy message
  sets (magic 0/1) and values beyond 64 bits to the Python row decoder, as ``decode_batch``
  does.  Arrow's binary columns have int32 offsets: ``append`` returns None, storing nothing,
  when a batch's records would take an offset column past ``max_offset`` (2**31 - 1).  Offsets
  or timestamps that do not fit in 64 bits (only corrupt batches have them; the row decoders
  hand out Python ints) raise ``CorruptRecordError``.
* **Memory**: the compiled builder writes into bytearrays, or into the buffers ``allocate(size)``
  returns (writable, at least ``size`` bytes; growing one asks for a new one and copies, and a
  block's column is handed out as ``buffer[:length]``, or copied when it fills at most a quarter
  of the buffer: a column whose records outgrew a first guess).  Keys are given room at the first
  key, for the block's records at twice its length (within the room the values get).
  :func:`default_allocator` is pyarrow's ``allocate_buffer`` when pyarrow is installed; the
  consumer passes its pool's ``take`` (engine/buffers.py ``BufferPool``), which hands out memory
  it keeps, once no Arrow array wraps it any more.  That matters: fresh memory for every block,
  from glibc or from Arrow's mimalloc, is faulted in page by page (huge pages with THP) and the
  kernel clears each page first, which cost more than copying the records (25-30% of a profiled
  read).  Columns under ``min_allocate`` bytes (the consumer gives its pool's threshold, 64 KiB)
  stay the builder's own bytearrays, grown in place: the pool would hand out a new, cleared
  bytearray for them anyway, and a call into Python per small column cost 3% of a read.  The
  Python builder always uses bytearrays.
* **The walk** (:class:`ColumnReader`) is the row path's, ``CompletedFetch.take`` in
  managers/fetch_buffer.py: batches split and CRC-checked by ``iter_batches``; batches ending
  before the position skipped; read_committed filtering by ``AbortedTransactionFilter``; control
  batches skipped; records before the position dropped; a corrupt batch raises after the records
  before it were handed out, on the following call.  A block starts with the compiled builder's
  ``walk``, and each batch the Python side stores is followed by it: it takes the run of plain
  batches from there in one call (split, skipped or stored as above, an empty block's buffers
  sized from its first batch as ``_reserve`` does, the CRC-32C taken with the CPU's instruction
  16 KiB behind the parser, while those bytes are in the L1 cache, and a batch whose CRC then
  fails rolled back) and stops at the first batch that needs the Python side: compressed,
  legacy, transactional or control under read_committed, truncated, corrupt, or too big for the
  block.  That batch is read as before, so errors and fallbacks come from one place.  Without
  the CRC instruction (and ``check_crcs``) the walk is not used: the ``crc32c`` package is
  faster than a table.  Each batch is parsed (and decompressed)
  once: ``take(max_records, position)`` decodes whole batches into a new block while the next
  batch's records (its header's count) fit beside the ones it holds within ``max_records``, and
  hands all of it out; only a block of one batch larger than ``max_records`` is handed out in
  windows, the following calls taking the rest of it before decoding more.  So a call never
  spans two blocks, and a batch is never split between blocks: where the row path would top a
  chunk up from the next batch, the columnar one ends the block before that batch (before, a
  block took the batch that crossed ``max_records`` and its short rest was a call of its own:
  a third of the calls of a 20,000-record read).  A block's key and value buffers are sized
  before its first batch is stored, from the bytes of the uncompressed batches left (which
  bound the key and value bytes) and ``max_records``: copying a record then does not reallocate
  (a reallocation copies the whole buffer; a 10,000-record block of 1 KiB values took 5.2 ms
  with it, 2.8 ms without).
* **Arrow** (:func:`to_arrow`, needs ``pyarrow``): the buffers handed to Arrow without a copy,
  with the compiled decoder in one call through the Arrow C data interface (``export_arrow``
  makes the ``ArrowArray`` tree; pyarrow's ``RecordBatch._import_from_c`` imports it against the
  schema object, or where that is missing ``pyarrow.record_batch`` by the PyCapsule protocol;
  Arrow holds each buffer until it releases the array, from any thread), else column by column
  with ``pa.Array.from_buffers``.  The schema is Spark's Kafka source's (:func:`arrow_schema`,
  the one spark/arrow.py emits): key and value binary, topic string and partition int32
  (repeated constants), offset int64, timestamp ``timestamp[us, tz=UTC]`` (the builders store
  microseconds: no copy here; a window with a timestamp beyond them raises ``RecordError``),
  timestampType int32, headers list<element: struct<key: string, value: binary>>.
"""

from __future__ import annotations

import functools
import importlib
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from typing_extensions import Buffer

from ..errors import CorruptRecordError, RecordError
from ..structs import ConsumerRecord
from . import records as _records
from .compression import DEFAULT_MAX_SIZE
from .records import AbortedTransactionFilter, RecordBatch, decode_batch_py, iter_batches, next_batch_to_read

__all__ = [
    "COLUMN_DECODER",
    "MAX_OFFSET",
    "TIMESTAMP_BEYOND",
    "ColumnBuffers",
    "ColumnBuilder",
    "ColumnReader",
    "Columns",
    "PyColumnBuilder",
    "arrow_schema",
    "decode_columns",
    "default_allocator",
    "finish_columns",
    "to_arrow",
]

#: The largest value an int32 offset column may hold (Arrow's ``binary``/``string``/``list``).
MAX_OFFSET = 2**31 - 1

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
#: The largest millisecond count whose microseconds fit in int64 (and its negative, the smallest).
_TS_MS_LIMIT = _INT64_MAX // 1000
#: What a block's ``timestamps`` hold for a record whose timestamp has no int64 microseconds: no
#: millisecond count times 1000 gives it.
TIMESTAMP_BEYOND = _INT64_MIN
_INT32 = "i" if array("i").itemsize == 4 else "l"


@dataclass(frozen=True, slots=True)
class ColumnBuffers:
    """A block of decoded records as Arrow-ready buffers (native-endian); see the module docstring.

    ``header_*`` are ``None`` when the builder was made with ``headers=False``; the null counts
    are the whole block's.  ``timestamp_beyond`` is the index of the first record whose timestamp
    has no int64 microseconds, or -1 (the slot in ``timestamps`` of every such record holds
    :data:`TIMESTAMP_BEYOND`); ``timestamp_beyond_ms`` is that first record's timestamp.
    """

    count: int
    offsets: Buffer  # int64 x count
    timestamps: Buffer  # int64 x count, microseconds (TIMESTAMP_BEYOND: none in int64)
    timestamp_types: Buffer  # int32 x count
    key_offsets: Buffer  # int32 x (count + 1)
    key_data: Buffer
    key_validity: Buffer  # (count + 7) // 8 bytes
    key_nulls: int
    value_offsets: Buffer
    value_data: Buffer
    value_validity: Buffer
    value_nulls: int
    header_offsets: Buffer | None  # int32 x (count + 1), into the header_count headers
    header_key_offsets: Buffer | None  # int32 x (header_count + 1)
    header_key_data: Buffer | None  # UTF-8
    header_value_offsets: Buffer | None
    header_value_data: Buffer | None
    header_value_validity: Buffer | None
    header_count: int
    header_value_nulls: int
    timestamp_beyond: int
    timestamp_beyond_ms: int


@dataclass(frozen=True, slots=True)
class Columns:
    """Records ``first .. first + count - 1`` of a block of decoded records (Arrow's array offset)."""

    buffers: ColumnBuffers
    first: int
    count: int

    @property
    def last_offset(self) -> int | None:
        """The offset of the last record (the position after these columns is this + 1)."""
        if not self.count:
            return None
        at = (self.first + self.count - 1) * 8
        return int.from_bytes(memoryview(self.buffers.offsets).cast("B")[at : at + 8], sys.byteorder, signed=True)


class _Builder(Protocol):
    @property
    def count(self) -> int: ...

    def append(self, batch: RecordBatch, start: int) -> int | None: ...

    def reserve(self, records: int, data: int) -> None: ...

    def finish(self) -> tuple[Any, ...]: ...


def finish_columns(builder: _Builder) -> Columns:
    """All the records of the builder as :class:`Columns`; the builder is spent."""
    buffers = ColumnBuffers(*builder.finish())
    return Columns(buffers, 0, buffers.count)


# ------------------------------------------------------------ the reference builder


def _bitmap(valid: list[bool]) -> bytearray:
    out = bytearray((len(valid) + 7) // 8)
    for i, v in enumerate(valid):
        if v:
            out[i >> 3] |= 1 << (i & 7)
    return out


class PyColumnBuilder:
    """The pure-Python column builder: rows from ``decode_batch_py``, packed into the buffers.

    The reference for the compiled ``ColumnBuilder`` (the same buffers, byte for byte) and
    the fallback when the extension is not built.
    """

    __slots__ = (
        "_finished",
        "_header_offsets",
        "_headers",
        "_hkey_data",
        "_hkey_offsets",
        "_hvalue_data",
        "_hvalue_offsets",
        "_hvalue_valid",
        "_key_data",
        "_key_len",
        "_key_offsets",
        "_key_valid",
        "_max_offset",
        "_offsets",
        "_partition",
        "_timestamp_types",
        "_timestamps",
        "_topic",
        "_ts_beyond",
        "_value_data",
        "_value_len",
        "_value_offsets",
        "_value_valid",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        headers: bool = True,
        max_offset: int = MAX_OFFSET,
        allocate: Callable[[int], Any] | None = None,  # accepted for the compiled builder's signature; unused
        min_allocate: int = 0,  # the same
    ) -> None:
        if not 0 <= max_offset <= MAX_OFFSET:
            raise ValueError("max_offset must lie in 0 .. 2**31 - 1 (Arrow's int32 offsets)")
        self._topic = topic
        self._partition = partition
        self._headers = headers
        self._max_offset = max_offset
        self._finished = False
        self._offsets = array("q")
        self._timestamps = array("q")
        self._ts_beyond = (-1, 0)  # timestamp_beyond, timestamp_beyond_ms
        self._timestamp_types = array(_INT32)
        self._key_offsets = array(_INT32, [0])
        self._key_data = bytearray()  # sized by reserve(): the first _key_len bytes are the data
        self._key_len = 0
        self._key_valid: list[bool] = []
        self._value_offsets = array(_INT32, [0])
        self._value_data = bytearray()
        self._value_len = 0
        self._value_valid: list[bool] = []
        self._header_offsets = array(_INT32, [0])
        self._hkey_offsets = array(_INT32, [0])
        self._hkey_data = bytearray()
        self._hvalue_offsets = array(_INT32, [0])
        self._hvalue_data = bytearray()
        self._hvalue_valid: list[bool] = []

    @property
    def count(self) -> int:
        return len(self._offsets)

    def append(self, batch: RecordBatch, start: int) -> int | None:
        """Store the batch's records at offset >= ``start``: how many, or None (nothing stored) if
        they do not fit under ``max_offset``.  On error nothing is stored."""
        if self._finished:
            raise RuntimeError("ColumnBuilder.finish() was called already")
        rows = decode_batch_py(batch, self._topic, self._partition)
        keep = self._keep(rows, start, batch.base_offset)
        headers = [[(k.encode(), v) for k, v in r.headers] if self._headers else [] for r in keep]
        room = self._max_offset
        if (
            sum(len(r.key or b"") for r in keep) > room - self._key_len
            or sum(len(r.value or b"") for r in keep) > room - self._value_len
            or sum(map(len, headers)) > room - len(self._hvalue_valid)
            or sum(len(k) for h in headers for k, _ in h) > room - len(self._hkey_data)
            or sum(len(v or b"") for h in headers for _, v in h) > room - len(self._hvalue_data)
        ):
            return None
        for r, h in zip(keep, headers, strict=True):
            self._put(r, h)
        return len(keep)

    def reserve(self, records: int, data: int) -> None:
        """Room for ``data`` more bytes of keys and of values (each capped at ``max_offset``),
        allocated now; a size hint that stores nothing (``records`` is for the compiled builder:
        the per-record arrays here grow as they must)."""
        if self._finished:
            raise RuntimeError("ColumnBuilder.finish() was called already")
        if records < 0 or data < 0:
            raise ValueError("reserve(records, data): both must be >= 0")
        for buf, used in ((self._key_data, self._key_len), (self._value_data, self._value_len)):
            need = min(used + data, self._max_offset)
            if need > len(buf):
                buf.extend(bytes(need - len(buf)))

    def finish(self) -> tuple[Any, ...]:
        """The buffers, in :class:`Columns` field order."""
        if self._finished:
            raise RuntimeError("ColumnBuilder.finish() was called already")
        self._finished = True
        del self._key_data[self._key_len :], self._value_data[self._value_len :]
        n = self.count
        head = (
            n,
            self._offsets.tobytes(),
            self._timestamps.tobytes(),
            self._timestamp_types.tobytes(),
            self._key_offsets.tobytes(),
            self._key_data,
            _bitmap(self._key_valid),
            self._key_valid.count(False),
            self._value_offsets.tobytes(),
            self._value_data,
            _bitmap(self._value_valid),
            self._value_valid.count(False),
        )
        nh = len(self._hvalue_valid)
        if not self._headers:
            return (*head, None, None, None, None, None, None, nh, 0, *self._ts_beyond)
        return (
            *head,
            self._header_offsets.tobytes(),
            self._hkey_offsets.tobytes(),
            self._hkey_data,
            self._hvalue_offsets.tobytes(),
            self._hvalue_data,
            _bitmap(self._hvalue_valid),
            nh,
            self._hvalue_valid.count(False),
            *self._ts_beyond,
        )

    def _keep(self, rows: list[ConsumerRecord[bytes, bytes]], start: int, base_offset: int) -> list[Any]:
        """The rows at offset >= ``start``; offsets and timestamps beyond 64 bits are corrupt."""
        keep = []
        for r in rows:
            if r.offset < _INT64_MIN:
                continue  # before any start offset
            if r.offset > _INT64_MAX:
                raise self._corrupt(f"offset {r.offset} does not fit in 64 bits", base_offset)
            if r.offset < start:
                continue
            if not _INT64_MIN <= r.timestamp <= _INT64_MAX:
                raise self._corrupt(f"timestamp {r.timestamp} does not fit in 64 bits", base_offset)
            keep.append(r)
        return keep

    def _put(self, r: ConsumerRecord[bytes, bytes], headers: list[tuple[bytes, bytes | None]]) -> None:
        for hkey, hvalue in headers:
            self._hkey_data += hkey
            self._hkey_offsets.append(len(self._hkey_data))
            if hvalue is not None:
                self._hvalue_data += hvalue
            self._hvalue_offsets.append(len(self._hvalue_data))
            self._hvalue_valid.append(hvalue is not None)
        if -_TS_MS_LIMIT <= r.timestamp <= _TS_MS_LIMIT:
            self._timestamps.append(r.timestamp * 1000)
        else:
            if self._ts_beyond[0] < 0:
                self._ts_beyond = (len(self._offsets), r.timestamp)
            self._timestamps.append(TIMESTAMP_BEYOND)
        self._offsets.append(r.offset)
        self._timestamp_types.append(r.timestamp_type)
        if r.key is not None:
            end = self._key_len + len(r.key)
            self._key_data[self._key_len : end] = r.key  # within the reserved room, or past the end
            self._key_len = end
        self._key_offsets.append(self._key_len)
        self._key_valid.append(r.key is not None)
        if r.value is not None:
            end = self._value_len + len(r.value)
            self._value_data[self._value_len : end] = r.value
            self._value_len = end
        self._value_offsets.append(self._value_len)
        self._value_valid.append(r.value is not None)
        self._header_offsets.append(len(self._hvalue_valid))

    def _corrupt(self, detail: str, base_offset: int) -> CorruptRecordError:
        return CorruptRecordError(
            f"record batch is corrupt: {detail}", topic=self._topic, partition=self._partition, offset=base_offset
        )


# ------------------------------------------------------------ builder selection (follows the row decoder)


def _select_builder() -> tuple[Any, str]:
    """The compiled builder when the compiled row decoder is in use (built, bound, not disabled)."""
    if _records.DECODER != "c":
        return PyColumnBuilder, "python"
    speedups: Any = importlib.import_module("asyncconsumer._speedups")
    compiled = getattr(speedups, "ColumnBuilder", None)
    if compiled is None:  # an extension built before the columnar decoder existed
        return PyColumnBuilder, "python"
    return compiled, "c"


#: ``ColumnBuilder(topic, partition, headers=True, max_offset=MAX_OFFSET, allocate=None, min_allocate=0)``: the
#: column builder in use; :data:`COLUMN_DECODER` says which (``"c"`` or ``"python"``).
ColumnBuilder: Any
ColumnBuilder, COLUMN_DECODER = _select_builder()
_speedups: Any = importlib.import_module("asyncconsumer._speedups") if COLUMN_DECODER == "c" else None
#: The compiled ``export_arrow(node)`` (the Arrow C data interface) beside the compiled builder, else None.
_export_arrow: Any = getattr(_speedups, "export_arrow", None)
#: The compiled ``arrow_address(capsule)``: where the ArrowArray of an ``export_arrow`` capsule is.
_arrow_address: Any = getattr(_speedups, "arrow_address", None)
#: The compiled ``int32_steps(count, step)``: int32 values 0, step, 2 * step, ... (else None).
_int32_steps: Any = getattr(_speedups, "int32_steps", None)


@functools.cache
def default_allocator() -> Callable[[int], Any] | None:
    """pyarrow's ``allocate_buffer(size)`` (Arrow's memory pool), None without pyarrow."""
    try:
        pa = importlib.import_module("pyarrow")
    except ImportError:
        return None
    allocate: Callable[[int], Any] = pa.allocate_buffer
    return allocate


# ------------------------------------------------------------ the walk over a partition's record set


class ColumnReader:
    """One partition's fetched record set, handed out as :class:`Columns` (``CompletedFetch.take``'s walk).

    ``aborted`` is the fetch response's aborted transactions, ``(producer_id, first_offset)``
    pairs, for read_committed; ``None`` for read_uncommitted.  ``on_unlisted_abort`` is the
    filter's (:class:`~asyncconsumer.protocol.records.AbortedTransactionFilter`).  ``max_offset`` caps the int32
    offset columns (tests make it small); ``builder`` is the builder class (default
    :data:`ColumnBuilder`) and ``allocate`` its buffer allocator (``"arrow"``:
    :func:`default_allocator`, Arrow's pool when pyarrow is installed; ``None``: bytearrays), asked
    for buffers of ``min_allocate`` bytes or more.
    """

    __slots__ = (
        "_aborted",
        "_allocate",
        "_block",
        "_builder",
        "_check_crcs",
        "_error",
        "_headers",
        "_max_decompressed",
        "_max_offset",
        "_may_walk",
        "_min_allocate",
        "_next",
        "_pos",
        "_records",
        "_size",
        "_unfit",
        "exhausted",
        "partition",
        "topic",
    )

    def __init__(
        self,
        records: memoryview | bytes | bytearray,
        *,
        topic: str,
        partition: int,
        check_crcs: bool = True,
        aborted: list[tuple[int, int]] | None = None,
        on_unlisted_abort: Callable[[int, int], None] | None = None,
        include_headers: bool = True,
        max_offset: int = MAX_OFFSET,
        builder: Any = None,
        allocate: Callable[[int], Any] | Literal["arrow"] | None = "arrow",
        max_decompressed: int = DEFAULT_MAX_SIZE,
        min_allocate: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.exhausted = False
        self._records = records
        self._size = memoryview(records).nbytes
        self._pos = 0  # where the batches not read yet start
        self._check_crcs = check_crcs
        self._max_decompressed = max_decompressed
        self._aborted = AbortedTransactionFilter(aborted, on_unlisted_abort) if aborted is not None else None
        self._headers = include_headers
        self._max_offset = max_offset
        self._builder = ColumnBuilder if builder is None else builder
        # Whether to let the compiled builder's walk take the plain batches: it checks CRCs itself
        # only where the CPU has a CRC-32C instruction (elsewhere the crc32c package is faster).
        self._may_walk = not check_crcs or _records.HW_CRC32C
        self._allocate = default_allocator() if allocate == "arrow" else allocate
        self._min_allocate = min_allocate
        self._block: ColumnBuffers | None = None  # the block being handed out
        self._next = 0  # its first record not handed out yet
        self._unfit: RecordBatch | None = None  # a batch that did not fit in the last block
        self._error: RecordError | None = None

    def take(self, max_records: int, position: int) -> Columns:
        """Up to ``max_records`` records at or after ``position``, decoding batches as needed.

        The rest of the current block if any is left (up to ``max_records`` of it), else a new
        block.  A corrupt batch raises ``RecordError`` — after the records before it were handed
        out, on the following call — and the reader is then done with (as ``CompletedFetch.take``).
        """
        block = self._block
        if block is not None and self._next < block.count:
            first = self._next
            count = min(max_records, block.count - first)
            self._next = first + count
            self._let_go_if_done(block)
            return Columns(block, first, count)
        builder: _Builder = self._builder(
            self.topic, self.partition, self._headers, self._max_offset, self._allocate, self._min_allocate
        )
        walk = getattr(builder, "walk", None) if self._may_walk else None
        if walk is not None and self._unfit is None and self._error is None:
            # The plain batches from here in one call (it sizes the block's buffers itself); the
            # loop takes the batch it stops at, if any.
            self._pos = walk(
                self._records, self._pos, position, max_records, self._check_crcs, self._aborted is not None
            )
        while builder.count < max_records:
            batch = self._unfit
            self._unfit = None
            if batch is None:
                if self._error is not None:
                    if builder.count:
                        break
                    self.exhausted = True
                    raise self._error
                try:
                    batch = next_batch_to_read(self._batches_from(self._pos), position, self._aborted)
                except RecordError as exc:
                    self._error = exc
                    continue
                if batch is None:
                    self._pos = self._size  # read to the end (the filter has seen the batches)
                    self.exhausted = True
                    break
                self._pos = batch._start + batch.size_in_bytes
            if builder.count and builder.count + batch.record_count > max_records:
                self._unfit = batch  # it would take the block past max_records: the next block's first
                break
            if not builder.count:
                self._reserve(builder, batch, max_records)
            try:
                stored = builder.append(batch, position)
            except RecordError as exc:
                self._error = exc
                continue
            if stored is not None:
                if walk is not None and builder.count < max_records:
                    self._pos = walk(
                        self._records, self._pos, position, max_records, self._check_crcs, self._aborted is not None
                    )
            else:  # too big for the columns beside what they hold: the next block
                if builder.count:
                    self._unfit = batch
                    break
                self._error = RecordError(
                    f"the records of the batch at offset {batch.base_offset} need more than "
                    f"{self._max_offset} bytes in one Arrow column (binary columns have 32-bit offsets)",
                    topic=self.topic,
                    partition=self.partition,
                    offset=batch.base_offset,
                )
        self._block = block = ColumnBuffers(*builder.finish())
        self._next = min(max_records, block.count)
        self._let_go_if_done(block)
        return Columns(block, 0, self._next)

    def _let_go_if_done(self, block: ColumnBuffers) -> None:
        """Hold a block no longer once all of it is handed out: its buffers are then the
        application's alone, and a buffer pool (``allocate``) may use them again once it drops them."""
        if self._next >= block.count:
            self._block = None

    def _batches_from(self, pos: int) -> Iterator[RecordBatch]:
        return iter_batches(
            self._records,
            topic=self.topic,
            partition=self.partition,
            check_crcs=self._check_crcs,
            start=pos,
            max_decompressed=self._max_decompressed,
        )

    def _reserve(self, builder: _Builder, batch: RecordBatch, max_records: int) -> None:
        """Size a new block's buffers up front from its first batch.  The uncompressed batches
        left in the record set bound the key and value bytes the block can take; ``max_records``
        records at this batch's bytes per record (header included) bound them more tightly when
        the records are alike, with a batch's bytes to spare (batches differ in bytes a record).
        Compressed batches give no bound: their buffers grow as needed.

        The header's record count is only a claim (a corrupt batch may say 2**31); a v2 record
        takes at least ``_MIN_RECORD_BYTES``, so the batch's real size bounds the count reserved
        for, and a lie costs no more memory than the bytes fetched (its error comes from append)."""
        size = batch.size_in_bytes
        count = min(batch.record_count, size // _MIN_RECORD_BYTES)
        if batch.compression or batch.magic != 2 or count <= 0:
            return
        left = self._size - batch._start  # this batch and those after it
        # A block holds up to max_records, or this batch's records when they are more (take()).
        builder.reserve(
            min(max(max_records, count), -(-left * count // size)),
            min(left, -(-max_records * size // count) + size),
        )


#: The fewest bytes a v2 record takes: its length, attributes, timestamp delta, offset delta, key
#: length, value length and header count, one byte each.
_MIN_RECORD_BYTES = 7


def decode_columns(
    records: memoryview | bytes | bytearray,
    *,
    topic: str,
    partition: int,
    start: int = 0,
    max_records: int = sys.maxsize,
    check_crcs: bool = True,
    aborted: list[tuple[int, int]] | None = None,
    include_headers: bool = True,
) -> Columns:
    """Up to ``max_records`` records of a partition's record set at or after ``start``, as columns.

    One :meth:`ColumnReader.take`: a corrupt batch raises unless records before it were found
    (then those are returned).
    """
    reader = ColumnReader(
        records,
        topic=topic,
        partition=partition,
        check_crcs=check_crcs,
        aborted=aborted,
        include_headers=include_headers,
    )
    return reader.take(max_records, start)


# ------------------------------------------------------------ Arrow (pyarrow, optional)


def _pyarrow() -> Any:
    try:
        return importlib.import_module("pyarrow")
    except ImportError as exc:
        raise ImportError("Arrow output needs pyarrow (pip install 'asyncconsumer[arrow]'): " + str(exc)) from exc


@functools.cache
def _arrow_types() -> dict[str, Any]:
    pa = _pyarrow()
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    headers = pa.list_(pa.field("element", header))
    timestamp = pa.timestamp("us", tz="UTC")
    base = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", timestamp),
        pa.field("timestampType", pa.int32()),
    ]
    return {
        "pa": pa,
        "timestamp": timestamp,
        "schema": pa.schema(base),
        # pyarrow's import of an ArrowArray address against a Schema object (no schema capsule
        # made and imported for every batch, as the PyCapsule protocol does); None: not there.
        "import_from_c": getattr(pa.RecordBatch, "_import_from_c", None),
        "schema_with_headers": pa.schema([*base, pa.field("headers", headers)]),
    }


def arrow_schema(include_headers: bool = True) -> Any:
    """Spark's Kafka source schema in Arrow form, as spark/arrow.py emits it (a ``pyarrow.Schema``).

    key binary, value binary, topic string, partition int32, offset int64, timestamp
    timestamp[us, tz=UTC], timestampType int32 and, with headers,
    headers list<element: struct<key: string, value: binary>>; every field nullable.
    """
    return _arrow_types()["schema_with_headers" if include_headers else "schema"]


def to_arrow(columns: Columns, topic: str, partition: int) -> Any:
    """A ``pyarrow.RecordBatch`` over the buffers of ``columns``, without a copy.

    The schema is :func:`arrow_schema`, with headers when the columns have them.  Raises
    ``RecordError`` for a timestamp beyond Arrow's microsecond range (about ±292,000 years), naming
    the first such record of the window.

    The columns are described once, as nodes (:func:`_column_nodes`).  With the compiled decoder
    they are handed to Arrow in one call through the Arrow C data interface (``export_arrow``,
    imported by ``RecordBatch._import_from_c`` against the schema object, or by
    ``pyarrow.record_batch``); without it, by ``pa.Array.from_buffers`` node by node.
    The two give the same batch.
    """
    types = _arrow_types()  # pyarrow and its types, made once: a type made per call costs
    beyond = columns.buffers.timestamp_beyond
    if 0 <= beyond < columns.first + columns.count:
        _check_timestamps(columns, topic, partition)
    nodes = _column_nodes(columns, topic, partition)
    schema = types["schema" if columns.buffers.header_offsets is None else "schema_with_headers"]
    if _export_arrow is not None:
        array = _export_arrow(("+s", columns.count, 0, 0, (None,), nodes))
        import_from_c = types["import_from_c"]
        if import_from_c is not None and _arrow_address is not None:
            return import_from_c(_arrow_address(array), schema)  # moves the array out of the capsule
        return types["pa"].record_batch(_ArrowExport(schema, array))
    return _from_buffers(types, nodes, schema)


class _ArrowExport:
    """What ``pyarrow.record_batch`` imports through the PyCapsule protocol: a schema and the
    ``export_arrow`` capsule of a struct array whose children are the columns.  For one import:
    importing moves the array out of the capsule (a second import finds it released)."""

    __slots__ = ("array", "schema")

    def __init__(self, schema: Any, array: Any) -> None:
        self.schema, self.array = schema, array

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        return self.schema.__arrow_c_schema__(), self.array


def _column_nodes(columns: Columns, topic: str, partition: int) -> tuple[tuple[Any, ...], ...]:
    """The columns of :func:`arrow_schema` as nodes ``(format, length, null_count, offset, buffers,
    children)``: each node's Arrow format string (its layout, which ``export_arrow`` holds its
    buffers to), its window (Arrow's array offset; null_count -1: Arrow counts the nulls of a
    window) and its buffers as Arrow lays them out."""
    b = columns.buffers
    n, first = columns.count, columns.first
    window = (first, n) != (0, b.count)  # then the block's null counts are not this window's

    def binary(offsets: Buffer, data: Buffer, validity: Buffer, nulls: int) -> tuple[Any, ...]:
        return ("z", n, -1 if nulls and window else nulls, first, (validity if nulls else None, offsets, data), ())

    topic_offsets, topic_data, partitions = _constant_buffers(topic, partition, n)
    nodes: list[tuple[Any, ...]] = [
        binary(b.key_offsets, b.key_data, b.key_validity, b.key_nulls),
        binary(b.value_offsets, b.value_data, b.value_validity, b.value_nulls),
        ("u", n, 0, 0, (None, topic_offsets, topic_data), ()),
        ("i", n, 0, 0, (None, partitions), ()),
        ("l", n, 0, first, (None, b.offsets), ()),
        ("l", n, 0, first, (None, b.timestamps), ()),
        ("i", n, 0, first, (None, b.timestamp_types), ()),
    ]
    header_offsets = b.header_offsets
    if header_offsets is not None:
        nh, nulls = b.header_count, b.header_value_nulls
        keys = ("u", nh, 0, 0, (None, b.header_key_offsets, b.header_key_data), ())
        values = ("z", nh, nulls, 0, (b.header_value_validity if nulls else None, b.header_value_offsets,
                                      b.header_value_data), ())
        # The header arrays are the block's, whole; the window's list offsets point into them.
        items = ("+s", nh, 0, 0, (None,), (keys, values))
        nodes.append(("+l", n, 0, first, (None, header_offsets), (items,)))
    return tuple(nodes)


def _from_buffers(types: dict[str, Any], nodes: tuple[tuple[Any, ...], ...], schema: Any) -> Any:
    """:func:`to_arrow` without the compiled decoder: ``pa.Array.from_buffers`` for each node
    (Arrow checks the buffers)."""
    pa = types["pa"]
    arrow_buffer, py_buffer, from_buffers = pa.Buffer, pa.py_buffer, pa.Array.from_buffers

    def array(node: tuple[Any, ...], type_: Any) -> Any:
        _, length, nulls, offset, buffers, children = node
        kids = [array(child, type_.field(i).type) for i, child in enumerate(children)]
        wrapped = [x if x is None or isinstance(x, arrow_buffer) else py_buffer(x) for x in buffers]
        return from_buffers(type_, length, wrapped, null_count=nulls, offset=offset, children=kids or None)

    arrays = [array(node, field.type) for node, field in zip(nodes, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_K = TypeVar("_K")
_V = TypeVar("_V")
_CONSTANTS_KEPT = 256  # entries per cache below, then it starts again
_TOPIC_OFFSET_MAX = 2**31 - 1  # the topic column's offsets are int32
_CONSTANT_ROWS = 16_384  # rows the first buffers of each cache cover (more on demand, doubling)
_topic_offsets: dict[int, array[int]] = {}  # the offsets of a topic name this many bytes long
_topic_data: dict[str, bytes] = {}  # the name, repeated
_partition_ids: dict[int, array[int]] = {}  # the partition number, repeated


def _constant_buffers(topic: str, partition: int, n: int) -> tuple[Buffer, Buffer, Buffer]:
    """The buffers of the topic column (int32 offsets, UTF-8 data) and of the partition column
    (int32) for at least ``n`` rows, kept for the next blocks: the same topic and partition in
    every row (``pa.repeat`` would import pandas, a second or more on the first call).  The
    offsets depend only on the name's length, so the partitions and topics of one length share
    them (they are the costly ones to make: ``array`` from a ``range``, 30 ns a row)."""
    name = topic.encode()
    width = len(name)
    offsets = _topic_offsets.get(width)
    if offsets is None or len(offsets) <= n:
        size = _grown(0 if offsets is None else len(offsets) - 1, n)
        if width:  # no more rows than int32 offsets reach (more than n only when they do)
            size = max(n, min(size, _TOPIC_OFFSET_MAX // width))
        offsets = _int32_range(size + 1, width)
        _kept(_topic_offsets)[width] = offsets
    data = _topic_data.get(topic)
    if data is None or len(data) < n * width:
        data = name * _grown(len(data) // width if data is not None and width else 0, n)
        _kept(_topic_data)[topic] = data
    ids = _partition_ids.get(partition)
    if ids is None or len(ids) < n:
        ids = array(_INT32, [partition]) * _grown(0 if ids is None else len(ids), n)
        _kept(_partition_ids)[partition] = ids
    return offsets, data, ids


def _int32_range(count: int, step: int) -> array[int]:
    """``count`` int32 values 0, ``step``, 2 * ``step``, ...: compiled where it can be (the first
    block of a consumer made its topic offsets, 16,384 rows or more, in 0.6 ms from a ``range``)."""
    if _int32_steps is not None:
        values = array(_INT32)
        values.frombytes(_int32_steps(count, step))
        return values
    return array(_INT32, range(0, count * step, step)) if step else array(_INT32, [0]) * count


def _grown(rows: int, n: int) -> int:
    """Rows for a constant buffer that holds ``rows`` and must hold ``n``: at least
    ``_CONSTANT_ROWS``, doubling, so that a growing block size remakes it only a few times."""
    return max(n, 2 * rows, _CONSTANT_ROWS)


def _kept(cache: dict[_K, _V]) -> dict[_K, _V]:
    """``cache``, emptied first when it holds ``_CONSTANTS_KEPT`` entries (the memory it keeps is
    bounded: a consumer of many topics or partitions makes some buffers again)."""
    if len(cache) >= _CONSTANTS_KEPT:
        cache.clear()
    return cache


def _check_timestamps(columns: Columns, topic: str, partition: int) -> None:
    """``RecordError`` naming the window's first record whose timestamp has no int64
    microseconds, if it has one (its block has: ``timestamp_beyond``)."""
    b = columns.buffers
    micros = memoryview(b.timestamps).cast("B").cast("q")
    i = next((i for i in range(columns.first, columns.first + columns.count) if micros[i] == TIMESTAMP_BEYOND), -1)
    if i < 0:
        return
    # The block notes the first such record's milliseconds: a later one is named by its offset only.
    value = f" {b.timestamp_beyond_ms} ms" if i == b.timestamp_beyond else ""
    raise RecordError(
        f"record timestamp{value} is beyond the range of Arrow's microsecond timestamps (about 292,000 years "
        "from 1970)",
        topic=topic,
        partition=partition,
        offset=memoryview(b.offsets).cast("B").cast("q")[i],
    )
