"""Record-batch writer for tests, fixtures and benchmarks.

The consumer never produces; this module writes the bytes a broker would
return in a Fetch response: v2 record batches (CRC-32C), transaction control
batches, and legacy magic 0/1 message sets (CRC-32), with any codec.  Knobs
that a real producer would not turn (offset gaps, a lastOffsetDelta beyond
the last record, a forged record count or attributes) exist to build the
edge cases the reader must handle.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from crc32c import crc32c

from .compression import CODEC_NONE, compress

__all__ = [
    "DEFAULT_TIMESTAMP",
    "Header",
    "Record",
    "RecordLike",
    "build_batch",
    "build_control_batch",
    "build_legacy_message_set",
    "encode_varint",
]

#: Fixed default so fixtures are deterministic (2023-11-14T22:13:20Z).
DEFAULT_TIMESTAMP = 1_700_000_000_000

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """A record to write; ``timestamp_delta`` is added to the batch's base timestamp."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = field(default_factory=tuple)
    timestamp_delta: int = 0


#: ``Record`` or a plain ``(key, value)`` / ``(key, value, headers)`` tuple.
RecordLike = Record | tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[Header]]

_V2_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (the CRC'd header part)
_V2_PREFIX = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc


def encode_varint(n: int) -> bytes:
    """Zigzag varint (varlong) as used inside v2 records."""
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _as_record(r: RecordLike) -> Record:
    if isinstance(r, Record):
        return r
    if len(r) == 2:
        return Record(r[0], r[1])
    return Record(r[0], r[1], tuple(r[2]))


def _nullable(data: bytes | None) -> bytes:
    return encode_varint(-1) if data is None else encode_varint(len(data)) + data


def _encode_record(rec: Record, offset_delta: int) -> bytes:
    parts = [
        b"\x00",  # attributes
        encode_varint(rec.timestamp_delta),
        encode_varint(offset_delta),
        _nullable(rec.key),
        _nullable(rec.value),
        encode_varint(len(rec.headers)),
    ]
    for hkey, hvalue in rec.headers:
        hk = hkey.encode()
        parts.append(encode_varint(len(hk)) + hk)
        parts.append(_nullable(hvalue))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def build_batch(
    records: Sequence[RecordLike],
    *,
    base_offset: int = 0,
    base_timestamp: int = DEFAULT_TIMESTAMP,
    max_timestamp: int | None = None,
    compression: int = CODEC_NONE,
    timestamp_type: int = 0,
    is_transactional: bool = False,
    control: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
    magic: int = 2,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    record_count: int | None = None,
    attributes: int | None = None,
    snappy_xerial: bool = True,
    raw_records: bytes | None = None,
) -> bytes:
    """Encode one v2 record batch with a valid CRC-32C.

    ``offset_deltas`` defaults to 0..n-1 (set gaps to mimic compaction);
    ``last_offset_delta`` defaults to the largest delta (0 for no records).
    ``max_timestamp`` defaults to the largest record timestamp (for
    LogAppendTime pass the broker's append time).  ``record_count`` and
    ``attributes`` override the header fields as written (e.g. codec bits
    5-7, which the records are then written uncompressed under).  ``magic``
    is written as given, to build unsupported-magic fixtures.  ``raw_records``
    replaces the encoded (and compressed) records section verbatim, to build
    corrupt batches that still pass the CRC check.
    """
    recs = [_as_record(r) for r in records]
    deltas = list(range(len(recs))) if offset_deltas is None else list(offset_deltas)
    if len(deltas) != len(recs):
        raise ValueError("offset_deltas must have one entry per record")
    body = b"".join(_encode_record(r, d) for r, d in zip(recs, deltas, strict=True))
    codec = compression if attributes is None else attributes & 0x07
    if codec != CODEC_NONE and attributes is None:
        body = compress(codec, body, snappy_xerial=snappy_xerial)
    if raw_records is not None:
        body = raw_records
    if last_offset_delta is None:
        last_offset_delta = max(deltas) if deltas else 0
    if max_timestamp is None:
        max_timestamp = base_timestamp + max((r.timestamp_delta for r in recs), default=0)
    if attributes is None:
        attributes = (
            (compression & 0x07)
            | (timestamp_type & 1) << 3
            | (0x10 if is_transactional else 0)
            | (0x20 if control else 0)
        )
    tail = (
        _V2_TAIL.pack(
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            len(recs) if record_count is None else record_count,
        )
        + body
    )
    batch_length = len(tail) + 9  # + partitionLeaderEpoch, magic, crc
    return _V2_PREFIX.pack(base_offset, batch_length, partition_leader_epoch, magic, crc32c(tail)) + tail


def build_control_batch(
    kind: Literal["commit", "abort"] | int,
    producer_id: int,
    *,
    base_offset: int = 0,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    base_timestamp: int = DEFAULT_TIMESTAMP,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A transaction marker batch (COMMIT or ABORT) for ``producer_id``.

    ``kind`` may also be a raw control type number (e.g. 2, LeaderChange).
    """
    ctype = {"abort": 0, "commit": 1}[kind] if isinstance(kind, str) else kind
    key = struct.pack(">hh", 0, ctype)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch(
        [(key, value)],
        base_offset=base_offset,
        base_timestamp=base_timestamp,
        is_transactional=True,
        control=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )


def _legacy_message(
    offset: int, magic: int, attributes: int, timestamp: int, key: bytes | None, value: bytes | None
) -> bytes:
    parts = [struct.pack(">bb", magic, attributes)]
    if magic == 1:
        parts.append(struct.pack(">q", timestamp))
    for data in (key, value):
        parts.append(struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data)
    body = b"".join(parts)
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + body


def build_legacy_message_set(
    messages: Sequence[tuple[bytes | None, bytes | None]],
    *,
    magic: int = 1,
    base_offset: int = 0,
    timestamps: Sequence[int] | None = None,
    compression: int = CODEC_NONE,
    timestamp_type: int = 0,
    log_append_time: int | None = None,
    snappy_xerial: bool = True,
    offset_deltas: Sequence[int] | None = None,
) -> bytes:
    """A magic 0 or 1 message set (CRC-32) at offsets base_offset + offset_deltas[i].

    With a codec, the messages go into one compressed wrapper message, the
    way brokers stored them: inner offsets relative (magic 1) or absolute
    (magic 0), the wrapper at the last inner offset.  ``timestamp_type`` 1
    (magic 1 only) marks the wrapper LogAppendTime with ``log_append_time``.
    lz4 with magic 0 gets the broken header checksum Kafka < 0.10 wrote.
    ``offset_deltas`` defaults to 0..n-1; gaps mimic compaction.
    """
    if magic not in (0, 1):
        raise ValueError("legacy message sets have magic 0 or 1")
    deltas = list(range(len(messages))) if offset_deltas is None else list(offset_deltas)
    if len(deltas) != len(messages):
        raise ValueError("offset_deltas must have one entry per message")
    if timestamps is None:
        timestamps = [DEFAULT_TIMESTAMP + i for i in range(len(messages))]
    ts_bit = (timestamp_type & 1) << 3 if magic == 1 else 0
    if compression == CODEC_NONE:
        return b"".join(
            _legacy_message(base_offset + d, magic, ts_bit, ts, k, v)
            for d, (k, v), ts in zip(deltas, messages, timestamps, strict=True)
        )
    first = 0 if magic == 1 else base_offset
    inner = b"".join(
        _legacy_message(first + d, magic, 0, ts, k, v)
        for d, (k, v), ts in zip(deltas, messages, timestamps, strict=True)
    )
    wrapped = compress(compression, inner, snappy_xerial=snappy_xerial, legacy_lz4=magic == 0)
    if ts_bit:
        wrapper_ts = DEFAULT_TIMESTAMP if log_append_time is None else log_append_time
    else:
        wrapper_ts = max(timestamps, default=DEFAULT_TIMESTAMP)
    last = base_offset + (deltas[-1] if deltas else -1)
    return _legacy_message(last, magic, compression | ts_bit, wrapper_ts, None, wrapped)
