"""Record-set reader: the consumer's hot path.

A Fetch response carries, per partition, a record set: record batches placed
back to back, possibly ending in a truncated batch.  ``iter_batches`` splits
it and checks each batch's CRC, parsing only the fixed-size header;
``decode_batch`` turns one batch into ``ConsumerRecord`` tuples.  The
second is the boundary a compiled accelerator may replace, so it keeps a
plain signature and does all per-record work in one tight loop.

Message formats: v2 record batches (magic 2, Kafka >= 0.11) and the legacy
message sets (magic 0 and 1).  A legacy record set becomes one
``RecordBatch`` per outer message; a compressed wrapper message decodes to
its inner messages.

Zero copy: a ``RecordBatch`` refers into the caller's buffer; the only
bytes copied out of an uncompressed batch are the keys, values and header
values handed to the application.
"""

from __future__ import annotations

import heapq
import importlib
import logging
import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from operator import add
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from ..errors import CorruptRecordError, RecordError, UnsupportedMagicError
from ..structs import ConsumerRecord, ShareConsumerRecord, TopicPartition
from .compression import CODEC_NONE, DEFAULT_MAX_SIZE, decompress

T = TypeVar("T")

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "NO_TIMESTAMP",
    "NO_TIMESTAMP_TYPE",
    "AbortedTransactionFilter",
    "RecordBatch",
    "RecordSetRead",
    "control_record_type",
    "DECODER",
    "DECODER_DETAIL",
    "HW_CRC32C",
    "decode_batch",
    "decode_batch_py",
    "decode_record_set",
    "extend_records",
    "extend_records_py",
    "iter_batches",
    "next_batch_to_read",
    "next_offset_after",
    "next_records",
    "next_records_py",
    "offset_after_batch",
    "scan_batches",
    "scan_batches_py",
    "scan_record_set",
]

#: Control record types (key bytes 2-3 of a control record).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

#: Timestamp and timestamp type of magic-0 messages, which have neither (Java's
#: ``RecordBatch.NO_TIMESTAMP`` / ``TimestampType.NO_TIMESTAMP_TYPE``).
NO_TIMESTAMP = -1
NO_TIMESTAMP_TYPE = -1

# v2 batch header, 61 bytes: baseOffset, batchLength, partitionLeaderEpoch,
# magic, crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp,
# producerId, producerEpoch, baseSequence, recordsCount.
_V2_HEADER = struct.Struct(">qiibIHiqqqhii")
V2_HEADER_SIZE = 61
_V2_CRC_START = 21  # the CRC covers attributes .. end of batch

# Legacy message: offset, messageSize, crc, magic, attributes [, timestamp (v1)].
_LEGACY_HEADER = struct.Struct(">qiIbB")
_I32 = struct.Struct(">i")
_OFFSET_LENGTH = struct.Struct(">qi")
_I64 = struct.Struct(">q")
_CONTROL_KEY = struct.Struct(">hh")

LOG_OVERHEAD = 12  # offset + length prefix of every batch / message
_MAGIC_AT = 16  # magic byte position, the same in all three formats
_MIN_LENGTH = {0: 14, 1: 22, 2: V2_HEADER_SIZE - LOG_OVERHEAD}  # smallest legal length field

_ATTR_CODEC = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20

_EMPTY: tuple[tuple[str, bytes | None], ...] = ()
# tuple.__new__ skips NamedTuple.__new__'s argument handling (measurably faster).
_new_tuple: Callable[..., Any] = tuple.__new__


class _Corrupt(Exception):
    """Internal: record bytes are inconsistent; turned into CorruptRecordError."""


class RecordBatch:
    """One batch of a record set: header parsed, records not yet decoded.

    ``data`` is a zero-copy view of the batch's bytes.  For a legacy (magic
    0/1) message ``base_offset == last_offset`` is the message's offset (for a
    compressed wrapper the offset of its last inner message; the inner
    offsets come out of ``decode_batch``) and ``record_count`` is -1 for a
    compressed wrapper, whose count is unknown until decompressed.
    """

    __slots__ = (
        "_buf",
        "_start",
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "compression",
        "data",
        "is_control",
        "is_transactional",
        "last_offset",
        "leader_epoch",
        "magic",
        "max_decompressed",
        "max_timestamp",
        "partition",
        "producer_epoch",
        "producer_id",
        "record_count",
        "size_in_bytes",
        "timestamp_type",
        "topic",
    )

    base_offset: int
    last_offset: int
    magic: int
    leader_epoch: int | None
    attributes: int
    compression: int
    timestamp_type: int
    is_transactional: bool
    is_control: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_timestamp: int
    max_timestamp: int
    record_count: int
    size_in_bytes: int
    data: memoryview
    topic: str
    partition: int
    #: The most this batch may decompress to (``iter_batches``' ``max_decompressed``).
    max_decompressed: int
    # The buffer the batch lives in and where: indexing a ``bytes`` is faster
    # than a memoryview, so the decoder reads through this when it can.
    _buf: bytes | memoryview
    _start: int

    def __repr__(self) -> str:
        return (
            f"RecordBatch(magic={self.magic}, base_offset={self.base_offset}, "
            f"last_offset={self.last_offset}, record_count={self.record_count}, "
            f"compression={self.compression}, transactional={self.is_transactional}, "
            f"control={self.is_control}, producer_id={self.producer_id}, size={self.size_in_bytes})"
        )


def next_offset_after(batch: RecordBatch) -> int:
    """The fetch position after ``batch``: ``base_offset + lastOffsetDelta + 1``.

    Uses the header, not the last record, so batches emptied or shortened by
    compaction still move the position forward.
    """
    return batch.last_offset + 1


def _location(topic: str, partition: int, offset: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "offset": offset}


# ------------------------------------------------------------ header scanning (no decoding)


def scan_record_set(data: memoryview) -> tuple[int, int]:
    """(offset after the last complete batch or -1, bytes of complete batches).

    Reads only batch headers, so the background side learns the next fetch
    offset without decoding (managers/fetch.py); a truncated trailing batch is left out.
    """
    next_offset, complete, _ = scan_batches(data)
    return next_offset, complete


def scan_batches_py(data: memoryview) -> tuple[int, int, list[tuple[int, int]]]:
    """``scan_record_set`` plus (base offset, leader epoch) where the batches' epoch changes; the
    Python twin of the compiled ``scan_batches`` (``scan_batches`` is the one selected below)."""
    pos, end, next_offset = 0, len(data), -1
    epochs: list[tuple[int, int]] = []
    last_epoch = -1
    while pos + 17 <= end:
        size = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        stop = pos + 12 + size
        if size < 0 or stop > end:
            break
        first = base = int.from_bytes(data[pos : pos + 8], "big", signed=True)
        if data[pos + 16] >= 2 and pos + 27 <= end:
            base += int.from_bytes(data[pos + 23 : pos + 27], "big", signed=True)
            epoch = int.from_bytes(data[pos + 12 : pos + 16], "big", signed=True)  # partitionLeaderEpoch
            if epoch != last_epoch:
                epochs.append((first, epoch))
                last_epoch = epoch
        next_offset = base + 1  # legacy messages: a compressed wrapper carries the last inner offset
        pos = stop
    return next_offset, pos, epochs


def offset_after_batch(data: memoryview, base_offset: int) -> int:
    """The offset after the batch starting at ``base_offset`` (headers only), -1 if not found:
    where to seek to skip a corrupt batch."""
    pos = 0
    while pos + 17 <= len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        if size < 0:
            break
        if int.from_bytes(data[pos : pos + 8], "big", signed=True) == base_offset:
            return scan_record_set(data[pos : pos + LOG_OVERHEAD + size])[0]
        pos += LOG_OVERHEAD + size
    return -1


# ------------------------------------------------------------ batch splitting


def iter_batches(
    records: memoryview | bytes | bytearray,
    *,
    topic: str,
    partition: int,
    check_crcs: bool = True,
    start: int = 0,
    end: int | None = None,
    max_decompressed: int = DEFAULT_MAX_SIZE,
) -> Iterator[RecordBatch]:
    """Split a record set into batches, checking CRCs, without copying.

    The record set is ``records[start:end]``.  Passing a whole response
    ``bytes`` with bounds (instead of a memoryview slice of it) lets the
    decoder index ``bytes`` directly, which is ~20% faster for uncompressed
    batches; a memoryview of a *whole* bytes object gets the same benefit.

    Stops silently at a truncated trailing batch (a Fetch response may end in
    one).  Raises ``CorruptRecordError`` (bad CRC, impossible length) or
    ``UnsupportedMagicError``; the message names topic-partition and offset.
    A compressed batch that would decompress to more than ``max_decompressed``
    bytes is corrupt: decoding it raises ``CorruptRecordError``.
    """
    buf: bytes | memoryview
    if isinstance(records, bytes):
        buf = records
    else:
        mv = memoryview(records)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        # A view of a whole bytes object: read the bytes directly (same memory).
        obj = mv.obj
        buf = obj if type(obj) is bytes and mv.nbytes == len(obj) else mv
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    n = len(buf) if end is None else min(end, len(buf))
    pos = start
    v2_unpack = _V2_HEADER.unpack_from
    while n - pos > _MAGIC_AT:
        magic = buf[pos + _MAGIC_AT]
        if magic == 2 and n - pos >= V2_HEADER_SIZE:
            # Common case: one unpack for the whole v2 header.
            (
                base_offset,
                length,
                epoch,
                _,
                crc,
                attrs,
                last_delta,
                base_ts,
                max_ts,
                producer_id,
                producer_epoch,
                base_sequence,
                count,
            ) = v2_unpack(buf, pos)
            if length < _MIN_LENGTH[2]:
                raise CorruptRecordError(
                    f"record batch length {length} is smaller than the v2 batch header",
                    **_location(topic, partition, base_offset),
                )
            batch_end = pos + LOG_OVERHEAD + length
            if batch_end > n:
                break  # truncated trailing batch: the next fetch starts here
            if check_crcs:
                actual = _crc32c(view[pos + _V2_CRC_START : batch_end])
                if actual != crc:
                    raise CorruptRecordError(
                        f"record batch CRC-32C mismatch (stored {crc:#010x}, computed {actual:#010x})",
                        **_location(topic, partition, base_offset),
                    )
            b = RecordBatch()
            b.base_offset = base_offset
            b.last_offset = base_offset + last_delta
            b.magic = 2
            b.leader_epoch = epoch if epoch >= 0 else None
            b.attributes = attrs
            b.compression = attrs & _ATTR_CODEC
            b.timestamp_type = (attrs & _ATTR_TIMESTAMP_TYPE) >> 3
            b.is_transactional = bool(attrs & _ATTR_TRANSACTIONAL)
            b.is_control = bool(attrs & _ATTR_CONTROL)
            b.producer_id = producer_id
            b.producer_epoch = producer_epoch
            b.base_sequence = base_sequence
            b.base_timestamp = base_ts
            b.max_timestamp = max_ts
            b.record_count = count
        else:
            offset, length = _OFFSET_LENGTH.unpack_from(buf, pos)
            if length < _MIN_LENGTH[0]:
                raise CorruptRecordError(
                    f"record batch length {length} is smaller than any valid batch",
                    **_location(topic, partition, offset),
                )
            batch_end = pos + LOG_OVERHEAD + length
            if batch_end > n:
                break  # truncated trailing batch
            if magic == 0 or magic == 1:
                b = _legacy_batch(
                    buf, view, pos, batch_end, offset, length, magic, topic, partition, check_crcs
                )
            elif magic == 2:  # complete, yet shorter than a v2 header
                raise CorruptRecordError(
                    f"record batch length {length} is smaller than the v2 batch header",
                    **_location(topic, partition, offset),
                )
            else:
                raise UnsupportedMagicError(
                    f"record batch has unsupported magic (message format version) {magic}",
                    **_location(topic, partition, offset),
                )
        b.size_in_bytes = batch_end - pos
        b.data = view[pos:batch_end]
        b.topic = topic
        b.partition = partition
        b.max_decompressed = max_decompressed
        b._buf = buf
        b._start = pos
        yield b
        pos = batch_end


def _legacy_batch(
    buf: bytes | memoryview,
    view: memoryview,
    pos: int,
    end: int,
    offset: int,
    length: int,
    magic: int,
    topic: str,
    partition: int,
    check_crcs: bool,
) -> RecordBatch:
    if length < _MIN_LENGTH[magic]:
        raise CorruptRecordError(
            f"legacy message length {length} is too small for magic {magic}",
            **_location(topic, partition, offset),
        )
    _, _, crc, _, attrs = _LEGACY_HEADER.unpack_from(buf, pos)
    if check_crcs:
        actual = zlib.crc32(view[pos + _MAGIC_AT : end])
        if actual != crc:
            raise CorruptRecordError(
                f"legacy message CRC-32 mismatch (stored {crc:#010x}, computed {actual:#010x})",
                **_location(topic, partition, offset),
            )
    b = RecordBatch()
    b.base_offset = b.last_offset = offset
    b.magic = magic
    b.leader_epoch = None
    b.attributes = attrs
    b.compression = codec = attrs & _ATTR_CODEC
    if magic == 1:
        b.timestamp_type = (attrs & _ATTR_TIMESTAMP_TYPE) >> 3
        (b.base_timestamp,) = _I64.unpack_from(buf, pos + 18)
    else:
        b.timestamp_type = NO_TIMESTAMP_TYPE
        b.base_timestamp = NO_TIMESTAMP
    b.max_timestamp = b.base_timestamp
    b.is_transactional = b.is_control = False
    b.producer_id = -1
    b.producer_epoch = -1
    b.base_sequence = -1
    b.record_count = 1 if codec == CODEC_NONE else -1
    return b


# ------------------------------------------------------------ record decoding


def decode_batch_py(batch: RecordBatch, topic: str, partition: int) -> list[ConsumerRecord[bytes, bytes]]:
    """Decode every record of ``batch`` (decompressing it if needed); the pure-Python decoder.

    ``decode_batch`` (bottom of this module) is this function or its compiled twin.

    Control batches give ``[]``.  Records before the fetch position (a batch
    may start before it) are *not* filtered here.  Raises
    ``UnsupportedCodecError`` or ``CorruptRecordError``.
    """
    if batch.magic != 2:
        return _decode_legacy(batch, topic, partition)
    if batch.is_control:
        return []
    codec = batch.compression
    buf: Any
    if codec == CODEC_NONE:
        buf = batch._buf
        pos = batch._start + V2_HEADER_SIZE
        end = batch._start + batch.size_in_bytes
    else:
        buf = _decompress(batch, codec, topic, partition)
        pos = 0
        end = len(buf)
    count = batch.record_count
    base_offset = batch.base_offset
    base_ts = batch.base_timestamp
    ts_type = batch.timestamp_type
    log_append_ts = batch.max_timestamp if ts_type else None
    leader_epoch = batch.leader_epoch
    # Varints are zigzag; 1- and 2-byte ones (nearly all of them: lengths
    # < 8 KiB, offset deltas < 8192) are decoded inline, longer ones by
    # _varint_slow.  Every record must end exactly where its length says.
    view = type(buf) is not bytes
    slow = _varint_slow
    new = _new_tuple
    cls = ConsumerRecord
    empty = _EMPTY
    out: list[ConsumerRecord[bytes, bytes]] = []
    append = out.append
    try:
        for _ in range(count):
            # length
            b = buf[pos]
            if b < 0x80:
                pos += 1
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    pos += 2
                else:
                    b, pos = slow(buf, pos)
            rec_end = pos + ((b >> 1) ^ -(b & 1))
            pos += 1  # attributes: unused
            # timestampDelta
            b = buf[pos]
            if b < 0x80:
                pos += 1
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    pos += 2
                else:
                    b, pos = slow(buf, pos)
            ts = (base_ts + ((b >> 1) ^ -(b & 1))) if log_append_ts is None else log_append_ts
            # offsetDelta
            b = buf[pos]
            if b < 0x80:
                pos += 1
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    pos += 2
                else:
                    b, pos = slow(buf, pos)
            offset = base_offset + ((b >> 1) ^ -(b & 1))
            # key
            b = buf[pos]
            if b < 0x80:
                pos += 1
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    pos += 2
                else:
                    b, pos = slow(buf, pos)
            klen = (b >> 1) ^ -(b & 1)
            if klen >= 0:
                key = buf[pos : pos + klen]
                if view:
                    key = bytes(key)
                pos += klen
            elif klen == -1:
                key = None
            else:
                raise _Corrupt(f"invalid key length {klen} at offset {offset}")
            # value
            b = buf[pos]
            if b < 0x80:
                pos += 1
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    b = (b & 0x7F) | (c << 7)
                    pos += 2
                else:
                    b, pos = slow(buf, pos)
            vlen = (b >> 1) ^ -(b & 1)
            if vlen >= 0:
                value = buf[pos : pos + vlen]
                if view:
                    value = bytes(value)
                pos += vlen
            elif vlen == -1:
                value = None
            else:
                raise _Corrupt(f"invalid value length {vlen} at offset {offset}")
            # headers
            b = buf[pos]
            if b == 0:
                pos += 1
                headers = empty
            else:
                b, pos = slow(buf, pos)
                headers, pos = _read_headers(buf, pos, (b >> 1) ^ -(b & 1), view)
            if pos != rec_end:
                raise _Corrupt(f"record at offset {offset} does not match its length field")
            append(
                new(
                    cls,
                    (
                        topic,
                        partition,
                        offset,
                        ts,
                        ts_type,
                        key,
                        value,
                        klen,
                        vlen,
                        headers,
                        leader_epoch,
                    ),
                )
            )
        if pos != end:
            raise _Corrupt(
                f"declared record count {count} does not match the batch bytes "
                f"({abs(end - pos)} bytes {'left over' if pos < end else 'missing'})"
            )
    except (_Corrupt, IndexError) as exc:
        detail = str(exc) if isinstance(exc, _Corrupt) else "record runs past the end of the batch"
        raise CorruptRecordError(
            f"record batch is corrupt: {detail}", **_location(topic, partition, base_offset)
        ) from exc
    return out


def _decompress(batch: RecordBatch, codec: int, topic: str, partition: int) -> bytes:
    start = V2_HEADER_SIZE if batch.magic == 2 else 0
    try:
        return decompress(codec, batch.data[start:], legacy_lz4=batch.magic == 0, max_size=batch.max_decompressed)
    except RecordError as exc:
        raise type(exc)(str(exc), **_location(topic, partition, batch.base_offset)) from exc


def _varint_slow(buf: Any, pos: int) -> tuple[int, int]:
    """Unsigned (still zigzagged) varint at ``pos`` of any length; returns (value, new pos)."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Corrupt(f"varint longer than 10 bytes at byte {pos}")


def _read_varint(buf: Any, pos: int) -> tuple[int, int]:
    """Signed zigzag varint at ``pos``; returns (value, new pos)."""
    u, pos = _varint_slow(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


# Header keys repeat across records (trace ids, content types): decoding each
# distinct key once halves the cost of a header.  Bounded, as keys can be arbitrary.
_HEADER_KEY_CACHE_SIZE = 1024
_header_keys: dict[bytes, str] = {}


def _read_headers(
    buf: Any, pos: int, count: int, view: bool
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    if count < 0:
        raise _Corrupt(f"negative header count {count}")
    headers: list[tuple[str, bytes | None]] = []
    append = headers.append
    slow = _varint_slow
    keys = _header_keys
    for _ in range(count):
        b = buf[pos]
        if b < 0x80:
            pos += 1
        else:
            b, pos = slow(buf, pos)
        klen = (b >> 1) ^ -(b & 1)
        if klen < 0:
            raise _Corrupt(f"invalid header key length {klen}")
        raw = buf[pos : pos + klen]
        if view:
            raw = bytes(raw)  # a view of a bytearray is not hashable
        key = keys.get(raw)
        if key is None:
            # Java decodes header keys leniently (malformed UTF-8 becomes U+FFFD).
            key = str(raw, "utf-8", "replace")
            if len(keys) < _HEADER_KEY_CACHE_SIZE:
                keys[raw] = key
        pos += klen
        b = buf[pos]
        if b < 0x80:
            pos += 1
        else:
            b, pos = slow(buf, pos)
        vlen = (b >> 1) ^ -(b & 1)
        if vlen >= 0:
            value = buf[pos : pos + vlen]
            if view:
                value = bytes(value)
            pos += vlen
            append((key, value))
        elif vlen == -1:
            append((key, None))
        else:
            raise _Corrupt(f"invalid header value length {vlen}")
    return tuple(headers), pos


# ------------------------------------------------------------ legacy (magic 0/1)


def _parse_legacy_message(
    buf: Any, pos: int, end: int
) -> tuple[int, int, int, int, bytes | None, bytes | None, int]:
    """One legacy message at ``pos``: (offset, magic, attrs, timestamp, key, value, next pos)."""
    if end - pos < LOG_OVERHEAD + _MIN_LENGTH[0]:
        raise _Corrupt("truncated message inside a compressed wrapper")
    offset, size, _, magic, attrs = _LEGACY_HEADER.unpack_from(buf, pos)
    msg_end = pos + LOG_OVERHEAD + size
    if magic not in (0, 1) or size < _MIN_LENGTH[magic] or msg_end > end:
        raise _Corrupt(f"invalid message (magic {magic}, size {size}) at offset {offset}")
    p = pos + 18
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _I64.unpack_from(buf, p)
        p += 8
    fields: list[bytes | None] = []
    for _ in range(2):
        if p + 4 > msg_end:
            raise _Corrupt(f"message at offset {offset} is shorter than its fields")
        (n,) = _I32.unpack_from(buf, p)
        p += 4
        if n == -1:
            fields.append(None)
            continue
        if n < 0 or p + n > msg_end:
            raise _Corrupt(f"invalid field length {n} in message at offset {offset}")
        fields.append(bytes(buf[p : p + n]))
        p += n
    if p != msg_end:
        raise _Corrupt(f"message at offset {offset} has {msg_end - p} trailing bytes")
    return offset, magic, attrs, timestamp, fields[0], fields[1], msg_end


def _legacy_record(
    topic: str, partition: int, offset: int, ts: int, ts_type: int, key: bytes | None, value: bytes | None
) -> ConsumerRecord[bytes, bytes]:
    return _new_tuple(  # type: ignore[no-any-return]
        ConsumerRecord,
        (
            topic,
            partition,
            offset,
            ts,
            ts_type,
            key,
            value,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            _EMPTY,
            None,
        ),
    )


def _decode_legacy(batch: RecordBatch, topic: str, partition: int) -> list[ConsumerRecord[bytes, bytes]]:
    buf = batch._buf
    start = batch._start
    try:
        offset, magic, attrs, ts, key, value, _ = _parse_legacy_message(
            buf, start, start + batch.size_in_bytes
        )
        ts_type = batch.timestamp_type
        codec = attrs & _ATTR_CODEC
        if codec == CODEC_NONE:
            return [_legacy_record(topic, partition, offset, ts, ts_type, key, value)]
        if value is None:
            raise _Corrupt("compressed wrapper message has a null value")
        inner = decompress(codec, value, legacy_lz4=magic == 0, max_size=batch.max_decompressed)
        entries = []
        pos = 0
        while pos < len(inner):
            entry = _parse_legacy_message(inner, pos, len(inner))
            if entry[2] & _ATTR_CODEC:
                raise _Corrupt("nested compression inside a compressed wrapper message")
            entries.append(entry)
            pos = entry[6]
    except _Corrupt as exc:
        raise CorruptRecordError(
            f"legacy message is corrupt: {exc}", **_location(topic, partition, batch.base_offset)
        ) from exc
    except RecordError as exc:  # from decompress
        raise type(exc)(str(exc), **_location(topic, partition, batch.base_offset)) from exc
    if not entries:
        return []
    # Magic 1 wrappers hold relative inner offsets; the wrapper carries the
    # absolute offset of the last one.  Magic 0 inner offsets are absolute.
    shift = offset - entries[-1][0] if magic >= 1 else 0
    wrapper_log_append = magic == 1 and ts_type == 1
    out = []
    for inner_offset, inner_magic, inner_attrs, inner_ts, k, v, _ in entries:
        if wrapper_log_append:
            rts, rtype = ts, 1
        elif inner_magic == 1:
            rts, rtype = inner_ts, (inner_attrs & _ATTR_TIMESTAMP_TYPE) >> 3
        else:
            rts, rtype = NO_TIMESTAMP, NO_TIMESTAMP_TYPE
        out.append(_legacy_record(topic, partition, inner_offset + shift, rts, rtype, k, v))
    return out


# ------------------------------------------------------------ control records & transactions


def control_record_type(batch: RecordBatch) -> int:
    """Type of the (single) control record in a control batch: CONTROL_ABORT, CONTROL_COMMIT, ...

    Unknown types (KRaft-internal ones) are returned as read; callers ignore them.
    """
    topic, partition = batch.topic, batch.partition
    if not batch.is_control:
        raise ValueError("not a control batch")
    if batch.compression == CODEC_NONE:
        buf: Any = batch._buf
        pos = batch._start + V2_HEADER_SIZE
        end = batch._start + batch.size_in_bytes
    else:
        buf = _decompress(batch, batch.compression, topic, partition)
        pos, end = 0, len(buf)
    try:
        _, pos = _read_varint(buf, pos)  # length
        pos += 1  # attributes
        _, pos = _read_varint(buf, pos)  # timestampDelta
        _, pos = _read_varint(buf, pos)  # offsetDelta
        klen, pos = _read_varint(buf, pos)
        if klen < 4 or pos + klen > end:
            raise _Corrupt(f"control record key length {klen}")
        _version, kind = _CONTROL_KEY.unpack_from(buf, pos)
    except (_Corrupt, IndexError, struct.error) as exc:
        raise CorruptRecordError(
            f"control batch is corrupt: {exc}", **_location(topic, partition, batch.base_offset)
        ) from exc
    return int(kind)


class AbortedTransactionFilter:
    """read_committed filtering, as the Java consumer does it.

    Feed it every batch of a partition's fetched data in order.  Once a
    batch's last offset reaches an aborted transaction's first offset, that
    producer's transactional batches are skipped until its ABORT marker.
    Control batches are always skipped; the caller still advances its
    position past every batch (``next_offset_after``), skipped or not.

    A broker names every aborted transaction whose records a fetch answer
    holds, so a producer's ABORT marker never follows records of that
    transaction that were kept.  A broker that does not filter (one that names
    none) lets them through: the marker then calls
    ``on_unlisted_abort(producer_id, marker_offset)``.
    """

    __slots__ = ("_aborted", "_kept", "_on_unlisted_abort", "_pending")

    def __init__(
        self,
        aborted: Iterable[tuple[int, int]] | None,
        on_unlisted_abort: Callable[[int, int], None] | None = None,
    ) -> None:
        # (first_offset, producer_id) min-heap: entries become active in offset order.
        self._pending = [(first, pid) for pid, first in aborted or ()]
        heapq.heapify(self._pending)
        self._aborted: set[int] = set()
        #: Producers whose transactional records were kept since their last marker.
        self._kept: set[int] = set()
        self._on_unlisted_abort = on_unlisted_abort

    def should_skip(self, batch: RecordBatch) -> bool:
        pid = batch.producer_id
        if pid >= 0:
            pending = self._pending
            last = batch.last_offset
            while pending and pending[0][0] <= last:
                self._aborted.add(heapq.heappop(pending)[1])
            if batch.is_control:
                if control_record_type(batch) == CONTROL_ABORT:
                    self._aborted.discard(pid)
                    if pid in self._kept and self._on_unlisted_abort is not None:
                        self._on_unlisted_abort(pid, batch.base_offset)
                self._kept.discard(pid)
                return True
            if not batch.is_transactional:
                return False
            if pid in self._aborted:
                return True
            self._kept.add(pid)
            return False
        return batch.is_control


def next_batch_to_read(
    batches: Iterator[RecordBatch], position: int, aborted: AbortedTransactionFilter | None
) -> RecordBatch | None:
    """The next batch of ``batches`` with records to hand out from ``position``, None at the end.

    Skips batches that end before the position, aborted transactions (``aborted`` is None for
    read_uncommitted) and control batches; the records before the position inside the batch
    returned are the caller's to drop.
    """
    for batch in batches:
        if batch.last_offset < position:
            continue
        if aborted is not None and aborted.should_skip(batch):
            continue
        if batch.is_control:
            continue
        return batch
    return None


# ------------------------------------------------------------ decoder selection (the one place)

_Decoder = Callable[[RecordBatch, str, int], list[ConsumerRecord[bytes, bytes]]]


def _select_decoder() -> tuple[_Decoder, str, str]:
    """The compiled decoder (``asyncconsumer._speedups``) when built and not disabled, else Python;
    and why, in words (``asyncconsumer --version`` prints it; logged at DEBUG on import).

    ``ASYNCCONSUMER_NO_EXTENSION=1`` forces the Python decoder.  The extension calls back into
    ``decode_batch_py`` for legacy message sets and into ``_decompress`` for compressed batches.
    An install built without a C compiler (from the sdist) has no extension and runs the Python
    decoder: the same records, more CPU per record.
    """
    if os.environ.get("ASYNCCONSUMER_NO_EXTENSION", "").strip().lower() not in ("", "0", "false", "no"):
        return decode_batch_py, "python", "pure Python (ASYNCCONSUMER_NO_EXTENSION is set)"
    try:
        speedups: Any = importlib.import_module("asyncconsumer._speedups")
        speedups.bind(ConsumerRecord, CorruptRecordError, decode_batch_py, _decompress)
        # The records' field getters as member descriptors: ``record.value`` costs what
        # ``record[6]`` does (speedups/fields.c).  And a TopicPartition's: the fetch path reads
        # ``tp.topic`` of every partition a fetch names (a third of the time of the generic getter).
        speedups.slot_fields(ConsumerRecord)
        speedups.slot_fields(ShareConsumerRecord)
        speedups.slot_fields(TopicPartition)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "asyncconsumer._speedups":
            why = "this install has no compiled decoder: it was built without a C compiler"
        else:
            why = f"the compiled decoder does not load: {exc}"
        return decode_batch_py, "python", f"pure Python ({why})"
    except TypeError as exc:
        return decode_batch_py, "python", f"pure Python (asyncconsumer._speedups does not match this version: {exc})"
    return speedups.decode_batch, "c", f"compiled (C extension {os.path.basename(speedups.__file__ or '_speedups')})"


#: ``decode_batch(batch, topic, partition) -> list[ConsumerRecord]``: decode every record of ``batch``.
#: ``DECODER`` says which implementation it is: ``"c"`` or ``"python"``; ``DECODER_DETAIL`` says it in
#: words, with the reason when it is the Python one.
decode_batch: _Decoder
decode_batch, DECODER, DECODER_DETAIL = _select_decoder()
logging.getLogger("asyncconsumer.decoder").debug("record decoder: %s", DECODER_DETAIL)


def _select_crc32c() -> tuple[Callable[[Any], int], bool]:
    """The CRC-32C of the batch checks: the compiled decoder's where it runs on the CPU's CRC-32C
    instruction (folded with carry-less multiplies where the core has VPCLMULQDQ, 100 GB/s on 16 KiB
    on a Sapphire Rapids core; else six interleaved streams of the CRC32 instruction, about 50 GB/s
    on a Zen 5 core and 24 on that Xeon, against the ``crc32c`` package's 30), else the ``crc32c``
    package; and whether it is the compiled one."""
    if DECODER == "c":
        speedups: Any = importlib.import_module("asyncconsumer._speedups")
        if getattr(speedups, "HW_CRC32C", False):
            return cast("Callable[[Any], int]", speedups.crc32c), True
    import crc32c  # here, not at the top: the package's import costs tens of ms (importlib.metadata)

    return cast("Callable[[Any], int]", crc32c.crc32c), False


_Scanner = Callable[[Any], tuple[int, int, list[tuple[int, int]]]]
#: ``scan_batches(data) -> (next_offset, complete, epochs)``: ``scan_record_set`` plus (base offset,
#: leader epoch) where the batches' epoch changes; the compiled one with the compiled decoder (the
#: thousand batch headers of a million 100 B records took about 1.4 ms in Python, 0.2 ms compiled),
#: unless the extension was built before it had one.
scan_batches: _Scanner = cast(
    "_Scanner",
    getattr(importlib.import_module("asyncconsumer._speedups"), "scan_batches", scan_batches_py)
    if DECODER == "c"
    else scan_batches_py,
)

class _NextDecoder(Protocol):
    def __call__(
        self, data: Any, pos: int, position: int, check_crcs: bool, topic: str, partition: int, max_records: int = 0, /
    ) -> tuple[list[ConsumerRecord[bytes, bytes]] | None, int] | None: ...


#: ``decode_next(data, pos, position, check_crcs, topic, partition[, max_records]) -> (records,
#: next_pos) | None``: a row read's walk over a record set without a :class:`RecordBatch`
#: (speedups/records.c): the records of the next plain v2 batch from byte ``pos`` that is not a
#: control batch and does not end before ``position`` (all of its records), and the byte after it;
#: ``(None, pos)`` at the end of the data; None when the batch at ``pos`` is one for
#: :func:`iter_batches` (compressed, legacy, or not valid: it reports what is wrong).  With
#: ``max_records`` > 0, the whole plain batches after it too until it has that many records (it
#: stops before a batch for :func:`iter_batches`).  None itself with the Python decoder (and with an
#: extension built before it had one): the walk is then :func:`iter_batches`'s alone.  A batch of
#: one record costs about a twentieth of what the Python walk's :class:`RecordBatch` and generator
#: step do.
decode_next: _NextDecoder | None = cast(
    "_NextDecoder | None",
    getattr(importlib.import_module("asyncconsumer._speedups"), "decode_next", None) if DECODER == "c" else None,
)


def next_records_py(
    data: Any, pos: int, position: int, topic: str, partition: int, check_crcs: bool, max_decompressed: int
) -> tuple[list[ConsumerRecord[bytes, bytes]] | None, int]:
    """One step of the walk in Python, for a batch :data:`decode_next` leaves to it: the records of
    the batch at byte ``pos`` (``[]`` for a control batch or one that ends before ``position``) and
    the byte after it; ``(None, pos)`` at the end of the data.  Raises what :func:`iter_batches` and
    :data:`decode_batch` raise for a batch that is not valid."""
    batch = next(
        iter_batches(
            data, topic=topic, partition=partition, check_crcs=check_crcs, start=pos, max_decompressed=max_decompressed
        ),
        None,
    )
    if batch is None:
        return None, pos
    after = pos + batch.size_in_bytes
    if batch.is_control or batch.last_offset < position:
        return [], after
    return decode_batch(batch, topic, partition), after


def next_records(
    data: Any, pos: int, position: int, topic: str, partition: int, check_crcs: bool, max_decompressed: int,
    max_records: int,
) -> tuple[list[ConsumerRecord[bytes, bytes]] | None, int]:
    """The walk's next step from byte ``pos``: :data:`decode_next`'s (whole plain batches up to
    ``max_records`` records) where the compiled decoder runs, else, or for a batch it leaves to
    Python, :func:`next_records_py`'s (that batch alone).  ``(None, pos)`` at the end of the data."""
    return (decode_next and decode_next(data, pos, position, check_crcs, topic, partition, max_records)) or (
        next_records_py(data, pos, position, topic, partition, check_crcs, max_decompressed)
    )


_ALL = sys.maxsize  # decode_next's max_records for a whole record set


class RecordSetRead(NamedTuple):
    """What :func:`decode_record_set` read of a record set."""

    #: The records, control batches left out, in the order of the bytes.
    records: list[ConsumerRecord[bytes, bytes]]
    #: The batches that could not be read, in the order of the bytes: each one's error and how
    #: many of ``records`` come before it.  The read goes on after a batch whose length lies within
    #: the data; after any other it stops (``stopped``).
    failed: tuple[tuple[RecordError, int], ...] = ()
    #: Whether the read stopped at the last of ``failed``: nothing after it was read.
    stopped: bool = False


def decode_record_set(
    data: Any, *, topic: str, partition: int, check_crcs: bool = True, max_decompressed: int = DEFAULT_MAX_SIZE
) -> RecordSetRead:
    """Every record of a record set but those of batches that cannot be read (a truncated
    trailing batch ends it): the share consumer's read of a ShareFetch answer.  The walk is
    :data:`decode_next`'s with the compiled decoder (the whole answer in one call, no
    :class:`RecordBatch`), handing a batch to :func:`next_records_py` where it must."""
    out: list[ConsumerRecord[bytes, bytes]] = []
    failed: list[tuple[RecordError, int]] = []
    pos = 0
    lowest = -(1 << 63)  # the position: no batch is passed over for its offsets
    while True:
        try:
            records, after = next_records(data, pos, lowest, topic, partition, check_crcs, max_decompressed, _ALL)
        except RecordError as exc:
            failed.append((exc, len(out)))
            end = _batch_end(data, pos)
            if end is None:
                return RecordSetRead(out, tuple(failed), stopped=True)
            records, after = [], end
        if records is None:
            break
        out += records
        pos = after
    return RecordSetRead(out, tuple(failed))


def _batch_end(data: Any, pos: int) -> int | None:
    """The byte after the batch at ``pos`` by its length, if that lies within ``data`` and is no
    shorter than its format's header (else None: where the next batch starts is not known)."""
    view = memoryview(data)[pos:]
    if len(view) <= _MAGIC_AT:
        return None
    least = _MIN_LENGTH.get(view[_MAGIC_AT])
    length: int = _OFFSET_LENGTH.unpack_from(view)[1]
    if least is None or length < least or LOG_OVERHEAD + length > len(view):
        return None
    return pos + LOG_OVERHEAD + length


_tuple_new: Any = tuple.__new__


def extend_records_py(cls: type[T], records: list[Any], start: int, stop: int, extra: tuple[Any, ...]) -> list[T]:
    """For each tuple of ``records[start:stop]``, a ``cls`` (a tuple subclass) holding its items and
    then ``extra``'s: the pure-Python twin of the compiled ``extend_records``."""
    return list(map(_tuple_new, repeat(cls), map(add, records[start:stop], repeat(extra))))

#: ``extend_records(cls, records, start, stop, extra) -> list[cls]``: the share consumer's records
#: (``cls`` is :class:`ShareConsumerRecord`) from the decoder's with a delivery count and a lock
#: deadline (``extra``); compiled, one allocation a record instead of two (with the acquired ranges
#: matched, about 200 ns a record against 360).
extend_records: Callable[..., list[Any]] = cast(
    "Callable[..., list[Any]]",
    getattr(importlib.import_module("asyncconsumer._speedups"), "extend_records", extend_records_py)
    if DECODER == "c"
    else extend_records_py,
)

#: ``HW_CRC32C``: whether the compiled decoder checks CRCs with the CPU's CRC-32C instruction (then
#: the batch checks here use it, and the column walk checks CRCs itself: protocol/columnar.py).
_crc32c, HW_CRC32C = _select_crc32c()
