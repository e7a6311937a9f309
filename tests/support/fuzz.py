"""Mutation fuzzing of the record decoders and the decompressors (the decoder part of the fault suite).

A corpus of valid record sets (v2 batches uncompressed and with every codec, control batches,
legacy magic 0/1 message sets plain and compressed) is mutated (bit flips, interesting bytes,
varints written over length fields, batch header fields, truncations, inserted and deleted
bytes, codec headers, mutations of the decompressed records recompressed) and the batch's
length and CRC are recomputed so every mutation gets past the CRC check.  Each case is then
split with ``iter_batches`` and decoded by both record decoders (the compiled one when built,
and the pure-Python one):

* the decoders must agree: the same records (values and types), or both the same typed error
  class naming the same partition and offset;
* only typed errors (``RecordError`` subclasses) may escape.

``run(seed, start, stop, deadline)`` does cases ``start..stop`` of a seed and returns counts per
outcome plus every failure found (with its case number); ``case(seed, index)`` rebuilds one case
so a failure can be replayed.  Everything is deterministic for a given seed and index.

The column part (``run_columns``) walks the same cases through ``ColumnReader`` with the compiled
``ColumnBuilder`` and the reference ``PyColumnBuilder``: byte-identical buffers, or the same error
class and location.

The decompressor part mutates compressed payloads of every codec (and their headers) and calls
``compression.decompress`` directly with a bound: the result must be bytes no longer than the
bound, or ``CorruptRecordError`` / ``UnsupportedCodecError``.
"""

from __future__ import annotations

import random
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from asyncconsumer.errors import RecordError, UnsupportedCodecError
from asyncconsumer.protocol import compression
from asyncconsumer.protocol.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    XERIAL_MAGIC,
    compress,
    decompress,
    xxh32,
)
from asyncconsumer.protocol.record_writer import (
    Record,
    build_batch,
    build_control_batch,
    build_legacy_message_set,
    encode_varint,
)
from asyncconsumer.protocol.records import decode_batch_py, iter_batches

__all__ = [
    "LIMIT",
    "case",
    "column_builders",
    "corpus",
    "decoders",
    "decompressor_case",
    "run",
    "run_columns",
    "run_decompressors",
]

TOPIC = "fuzz"
PARTITION = 7
#: The decompression bound used while fuzzing (small, so runaway output is found fast).
LIMIT = 4 << 20

_INTERESTING_INTS = (
    0, 1, -1, -2, 2, 63, 64, 127, 128, 255, 256, 16383, 16384, 65535, 65536,
    2**31 - 1, -(2**31), 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, -(2**63),
)  # fmt: skip
_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
_CODECS = (CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD)

# v2 batch header offsets (see records._V2_HEADER)
_LENGTH_AT, _MAGIC_AT, _CRC_AT, _ATTRS_AT, _RECORDS_AT = 8, 16, 17, 21, 61
_V2_FIELDS = {  # name: (offset, struct format) of the fields after the CRC
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "base_timestamp": (27, ">q"),
    "max_timestamp": (35, ">q"),
    "producer_id": (43, ">q"),
    "producer_epoch": (51, ">h"),
    "base_sequence": (53, ">i"),
    "records_count": (57, ">i"),
    "base_offset": (0, ">q"),
    "leader_epoch": (12, ">i"),
}


# ------------------------------------------------------------------ corpus


def _records(rng: random.Random, n: int) -> list[Record]:
    out = []
    for i in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice((0, 1, 5, 40)))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice((0, 3, 100, 300)))
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if rng.random() < 0.4:
            headers = tuple((f"h{j}", None if j == 2 else rng.randbytes(j * 3)) for j in range(rng.randint(1, 3)))
        out.append(Record(key, value, headers, timestamp_delta=rng.choice((0, i, -5, 10**6))))
    return out


def corpus() -> list[tuple[str, bytes]]:
    """Valid record sets, each with a name (the seed does not change them)."""
    rng = random.Random("asyncconsumer-fuzz-corpus")
    items: list[tuple[str, bytes]] = []
    for n in (1, 3, 20):
        items.append((f"v2-none-{n}", build_batch(_records(rng, n), base_offset=100)))
        for codec in _CODECS:
            name = compression.CODEC_NAMES[codec]
            items.append((f"v2-{name}-{n}", build_batch(_records(rng, n), base_offset=200, compression=codec)))
        items.append(
            (f"v2-raw-snappy-{n}", build_batch(_records(rng, n), compression=CODEC_SNAPPY, snappy_xerial=False))
        )
    items.append(("v2-log-append", build_batch(_records(rng, 4), timestamp_type=1, max_timestamp=123)))
    items.append(("v2-gaps", build_batch(_records(rng, 3), offset_deltas=[0, 5, 9])))
    items.append(("v2-transactional", build_batch(_records(rng, 2), is_transactional=True, producer_id=9)))
    items.append(("control-commit", build_control_batch("commit", 9, base_offset=300)))
    items.append(("control-abort", build_control_batch("abort", 9, base_offset=301)))
    for magic in (0, 1):
        msgs = [(r.key, r.value) for r in _records(rng, 3)]
        items.append((f"legacy{magic}-none", build_legacy_message_set(msgs, magic=magic, base_offset=50)))
        for codec in _CODECS:
            if magic == 0 and codec == CODEC_ZSTD:
                continue  # zstd needs message format v2
            name = compression.CODEC_NAMES[codec]
            items.append(
                (
                    f"legacy{magic}-{name}",
                    build_legacy_message_set(msgs, magic=magic, base_offset=60, compression=codec),
                )
            )
    # two batches back to back: a mutation of the first must not hide the second
    pair = build_batch(_records(rng, 2), base_offset=0) + build_batch(_records(rng, 2), base_offset=2)
    items.append(("v2-pair", pair))
    return items


# ------------------------------------------------------------------ fixing length and CRC


def _fix_v2(b: bytearray) -> bytes:
    struct.pack_into(">i", b, _LENGTH_AT, len(b) - 12)
    struct.pack_into(">I", b, _CRC_AT, crc32c(bytes(b[_ATTRS_AT:])))
    return bytes(b)


def _fix_legacy(b: bytearray) -> bytes:
    struct.pack_into(">i", b, _LENGTH_AT, len(b) - 12)
    struct.pack_into(">I", b, 12, zlib.crc32(bytes(b[_MAGIC_AT:])))
    return bytes(b)


def _fix(b: bytearray) -> bytes:
    """Length and CRC recomputed for the format the magic byte now says (none for other magics)."""
    if len(b) < _ATTRS_AT + 4:
        return bytes(b)
    magic = b[_MAGIC_AT]
    if magic == 2:
        return _fix_v2(b)
    if magic in (0, 1):
        return _fix_legacy(b)
    return bytes(b)


# ------------------------------------------------------------------ mutations


def _varint_u(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bitflips(rng: random.Random, b: bytearray, lo: int) -> str:
    if len(b) <= lo:
        return "bitflip-none"
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(lo, len(b))
        b[i] ^= 1 << rng.randrange(8)
    return "bitflip"


def _interesting_byte(rng: random.Random, b: bytearray, lo: int) -> str:
    if len(b) <= lo:
        return "byte-none"
    for _ in range(rng.randint(1, 3)):
        b[rng.randrange(lo, len(b))] = rng.choice(_INTERESTING_BYTES)
    return "byte"


def _varint_over(rng: random.Random, b: bytearray, lo: int) -> str:
    if len(b) <= lo:
        return "varint-none"
    at = rng.randrange(lo, len(b))
    value = rng.choice(_INTERESTING_INTS)
    enc = encode_varint(max(min(value, 2**63 - 1), -(2**63))) if rng.random() < 0.8 else _varint_u(value)
    if rng.random() < 0.5:
        b[at : at + len(enc)] = enc  # overwrite
    else:
        b[at : at + 1] = enc  # replace one byte (shifts what follows)
    return "varint"


def _truncate(rng: random.Random, b: bytearray, lo: int) -> str:
    if len(b) <= lo:
        return "truncate-none"
    del b[rng.randrange(lo, len(b)) :]
    return "truncate"


def _splice(rng: random.Random, b: bytearray, lo: int) -> str:
    if len(b) <= lo:
        return "splice-none"
    at = rng.randrange(lo, len(b) + 1)
    if rng.random() < 0.5:
        del b[at : at + rng.randint(1, 16)]
        return "delete"
    b[at:at] = rng.randbytes(rng.randint(1, 16)) if rng.random() < 0.5 else b[lo : lo + rng.randint(1, 32)]
    return "insert"


_BYTE_MUTATIONS: tuple[Callable[[random.Random, bytearray, int], str], ...] = (
    _bitflips,
    _interesting_byte,
    _varint_over,
    _truncate,
    _splice,
)


def _header_field(rng: random.Random, b: bytearray) -> str:
    name = rng.choice(sorted(_V2_FIELDS))
    at, fmt = _V2_FIELDS[name]
    size = struct.calcsize(fmt)
    bits = size * 8
    if name == "attributes" and rng.random() < 0.7:
        (attrs,) = struct.unpack_from(">h", b, at)
        attrs ^= 1 << rng.randrange(7)  # codec, timestamp type, transactional, control bits
        struct.pack_into(">h", b, at, attrs)
        return "header-attributes-bit"
    if name == "records_count" and rng.random() < 0.5:
        (count,) = struct.unpack_from(">i", b, at)
        struct.pack_into(">i", b, at, count + rng.choice((-1, 1, 2, -count)))
        return "header-records_count-off-by"
    value = rng.choice(_INTERESTING_INTS)
    value = (value + (1 << bits)) % (1 << bits)
    b[at : at + size] = value.to_bytes(size, "big")
    return f"header-{name}"


def _codec_of(b: bytearray) -> int:
    return b[_ATTRS_AT + 1] & 0x07


def _codec_header(rng: random.Random, payload: bytearray, codec: int) -> str:
    """Mutate the compressed payload's own header: the sizes a decompressor may trust."""
    size = rng.choice((0, 1, 2**16, 2**24, 2**31 - 1, 2**31, 2**32 - 1, 2**40, len(payload) * 64, LIMIT + 1))
    if codec == CODEC_SNAPPY and payload[:8] == XERIAL_MAGIC:
        if len(payload) >= 20 and rng.random() < 0.5:
            # the chunk's length field, or the raw block's varint inside the chunk
            struct.pack_into(">i", payload, 16, max(-(2**31), min(2**31 - 1, size)))
            return "codec-xerial-chunk-length"
        (n,) = struct.unpack_from(">i", payload, 16) if len(payload) >= 20 else (0,)
        old = payload[20 : 20 + 5]
        end = next((i + 1 for i, x in enumerate(old) if x < 0x80), len(old))
        payload[20 : 20 + end] = _varint_u(size & 0xFFFFFFFF)
        struct.pack_into(">i", payload, 16, max(0, n + len(_varint_u(size & 0xFFFFFFFF)) - end))
        return "codec-xerial-block-length"
    if codec == CODEC_SNAPPY:
        end = next((i + 1 for i, x in enumerate(payload[:5]) if x < 0x80), min(5, len(payload)))
        payload[:end] = _varint_u(size if rng.random() < 0.9 else size << 7)
        return "codec-snappy-length"
    if codec == CODEC_LZ4 and len(payload) >= 7:
        flg = payload[4]
        if rng.random() < 0.6:
            # declare a content size (inserting the field if absent), header checksum recomputed
            if not flg & 0x08:
                payload[4] = flg | 0x08
                payload[6:6] = bytes(8)
            struct.pack_into("<Q", payload, 6, size & (2**64 - 1))
            end = 6 + 8 + (4 if flg & 0x01 else 0)
            if end < len(payload):
                payload[end] = (xxh32(bytes(payload[4:end])) >> 8) & 0xFF
            return "codec-lz4-content-size"
        payload[5] = rng.choice((0x00, 0x40, 0x50, 0x60, 0x70, 0xF0))  # block max size
        end = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
        if end < len(payload):
            payload[end] = (xxh32(bytes(payload[4:end])) >> 8) & 0xFF
        return "codec-lz4-block-size"
    if codec == CODEC_ZSTD and len(payload) >= 6:
        choice = rng.random()
        if choice < 0.5:
            # FHD: 8-byte content size, then the size (window descriptor kept when present)
            fhd = payload[4]
            single = fhd & 0x20
            dict_bytes = (0, 1, 2, 4)[fhd & 0x03]
            fcs_bytes = (0 if not single else 1, 2, 4, 8)[fhd >> 6]
            head = 5 + (0 if single else 1) + dict_bytes
            payload[4] = (fhd & 0x3F) | 0xC0
            payload[head : head + fcs_bytes] = struct.pack("<Q", size & (2**64 - 1))
            return "codec-zstd-content-size"
        if choice < 0.8 and not payload[4] & 0x20:
            payload[5] = rng.randrange(256)  # window descriptor
            return "codec-zstd-window"
        payload[4] = rng.randrange(256)
        return "codec-zstd-fhd"
    if codec == CODEC_GZIP and len(payload) >= 18:
        if rng.random() < 0.5:
            payload[3] = rng.randrange(32)  # FLG: FTEXT/FHCRC/FEXTRA/FNAME/FCOMMENT
            return "codec-gzip-flags"
        struct.pack_into("<I", payload, len(payload) - 4, size & 0xFFFFFFFF)  # ISIZE
        return "codec-gzip-isize"
    payload[: rng.randint(1, 8)] = b""
    return "codec-cut-header"


def _recompress(codec: int, plain: bytes, like: bytes) -> bytes:
    xerial = like[:8] == XERIAL_MAGIC
    return compress(codec, plain, snappy_xerial=xerial)


def _mutate_v2(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    b = bytearray(data)
    codec = _codec_of(b)
    r = rng.random()
    if codec != CODEC_NONE and r < 0.3:
        # mutate the records behind the compression, then compress them again
        plain = bytearray(decompress(codec, bytes(b[_RECORDS_AT:])))
        kind = rng.choice(_BYTE_MUTATIONS)(rng, plain, 0)
        b[_RECORDS_AT:] = _recompress(codec, bytes(plain), bytes(b[_RECORDS_AT:]))
        return f"inner-{kind}", _fix_v2(b)
    if codec != CODEC_NONE and r < 0.5:
        payload = bytearray(b[_RECORDS_AT:])
        kind = _codec_header(rng, payload, codec)
        b[_RECORDS_AT:] = payload
        return kind, _fix_v2(b)
    if r < 0.65:
        return _header_field(rng, b), _fix_v2(b)
    if r < 0.7:
        b[_MAGIC_AT] = rng.choice((0, 1, 3, 0xFF))
        return "magic", bytes(b)
    kind = rng.choice(_BYTE_MUTATIONS)(rng, b, _ATTRS_AT)
    return kind, _fix_v2(b)


def _mutate_legacy(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    b = bytearray(data)
    magic = b[_MAGIC_AT]
    attrs_at = _MAGIC_AT + 1
    codec = b[attrs_at] & 0x07
    key_at = 18 if magic == 0 else 26  # key length field (after offset, size, crc, magic, attrs[, timestamp])
    r = rng.random()
    if codec != CODEC_NONE and r < 0.3:
        # mutate the inner message set, compress it again
        (klen,) = struct.unpack_from(">i", b, key_at)
        vat = key_at + 4 + max(klen, 0)
        (vlen,) = struct.unpack_from(">i", b, vat)
        inner = bytearray(decompress(codec, bytes(b[vat + 4 : vat + 4 + vlen]), legacy_lz4=magic == 0))
        kind = rng.choice(_BYTE_MUTATIONS)(rng, inner, 0)
        packed = compress(codec, bytes(inner), legacy_lz4=magic == 0)
        b[vat:] = struct.pack(">i", len(packed)) + packed
        return f"legacy-inner-{kind}", _fix_legacy(b)
    if r < 0.4:
        b[attrs_at] = (b[attrs_at] & 0xF8) | rng.randrange(8)
        return "legacy-codec", _fix_legacy(b)
    kind = rng.choice(_BYTE_MUTATIONS)(rng, b, attrs_at)
    return f"legacy-{kind}", _fix_legacy(b)


def _split_first(data: bytes) -> tuple[bytes, bytes]:
    first_len = 12 + int.from_bytes(data[8:12], "big", signed=True) if len(data) >= 12 else len(data)
    if not 12 < first_len <= len(data):
        first_len = len(data)
    return data[:first_len], data[first_len:]


def _mutate_one(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """Mutate the first batch/message of ``data`` (what follows it is kept as it is).

    Its length and CRC are recomputed afterwards, for the format its magic byte then says.
    """
    first, rest = _split_first(data)
    magic = first[_MAGIC_AT] if len(first) > _MAGIC_AT else -1
    if magic == 2 and len(first) > _RECORDS_AT:
        kind, first = _mutate_v2(rng, first)
    elif magic in (0, 1) and len(first) >= 12 + 14:
        kind, first = _mutate_legacy(rng, first)
    else:
        b = bytearray(first)
        kind = _bitflips(rng, b, 0)
        first = bytes(b)
    return kind, _fix(bytearray(first)) + rest


def _fallback(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    first, rest = _split_first(data)
    b = bytearray(first)
    kind = "fallback-" + _bitflips(rng, b, _ATTRS_AT if len(b) > _ATTRS_AT else 0)
    return kind, _fix(b) + rest


def case(seed: int, index: int, items: list[tuple[str, bytes]] | None = None) -> tuple[str, str, bytes]:
    """Case ``index`` of ``seed``: (corpus item name, mutation names, bytes)."""
    items = corpus() if items is None else items
    rng = random.Random(f"{seed}:{index}")
    name, data = items[rng.randrange(len(items))]
    rounds = 1 if rng.random() < 0.8 else rng.randint(2, 4)
    kinds = []
    for _ in range(rounds):
        try:
            kind, data = _mutate_one(rng, data)
        except Exception:  # the data lost the structure this mutation needs (an earlier round)
            kind, data = _fallback(rng, data)
        kinds.append(kind)
    return name, "+".join(kinds), data


# ------------------------------------------------------------------ running


def decoders() -> list[tuple[str, Callable[..., Any]]]:
    from asyncconsumer.protocol import records

    out: list[tuple[str, Callable[..., Any]]] = [("python", decode_batch_py)]
    if records.DECODER == "c":
        out.append(("c", records.decode_batch))
    return out


def _decode(decode: Callable[..., Any], data: bytes | memoryview) -> tuple[str, Any]:
    """("records", [...]) / ("error", (class, partition, offset)) / ("untyped", repr)."""
    out: list[Any] = []
    try:
        for batch in iter_batches(data, topic=TOPIC, partition=PARTITION, max_decompressed=LIMIT):
            for r in decode(batch, TOPIC, PARTITION):
                out.append((tuple(r), type(r.key), type(r.value)))
    except RecordError as exc:
        return "error", (type(exc).__name__, exc.partition, exc.offset, len(out))
    except Exception as exc:
        return "untyped", f"{type(exc).__name__}: {exc}"
    return "records", out


def walks() -> list[tuple[str, Callable[[bytes | memoryview], tuple[str, Any]]]]:
    """The readers' own walks over a record set, compared with the decoders': the row reads' (the
    compiled ``decode_next`` walk, where the compiled decoder runs) and the share consumer's
    ``decode_record_set``."""
    from asyncconsumer.protocol import records

    return ([("c-walk", _walk)] if records.decode_next is not None else []) + [("share-read", _share_read)]


def _walk(data: bytes | memoryview) -> tuple[str, Any]:
    """:func:`_decode`'s answer from ``CompletedFetch.take`` (managers/fetch_buffer.py), which walks
    plain batches with ``decode_next`` and leaves the rest to ``iter_batches``: every batch from
    the lowest position, control batches giving nothing, as the decoders do."""
    from asyncconsumer.managers.fetch_buffer import CompletedFetch
    from asyncconsumer.structs import TopicPartition

    out: list[Any] = []
    fetch = CompletedFetch(TopicPartition(TOPIC, PARTITION), 0, 0, memoryview(data), -1, check_crcs=True,
                           aborted=None, max_decompressed=LIMIT)
    try:
        while got := fetch.take(1 << 30, -(1 << 63)):
            out.extend((tuple(r), type(r.key), type(r.value)) for r in got)
    except RecordError as exc:
        return "error", (type(exc).__name__, exc.partition, exc.offset, len(out))
    except Exception as exc:
        return "untyped", f"{type(exc).__name__}: {exc}"
    return "records", out


def _share_read(data: bytes | memoryview) -> tuple[str, Any]:
    """:func:`_decode`'s answer from ``decode_record_set`` (the share consumer's read of a
    ShareFetch answer): the records up to the first batch that cannot be read, and its error (the
    read goes on after such a batch when its length holds; what it reads there is not compared)."""
    from asyncconsumer.protocol.records import decode_record_set

    try:
        read = decode_record_set(data, topic=TOPIC, partition=PARTITION, max_decompressed=LIMIT)
    except Exception as exc:
        return "untyped", f"{type(exc).__name__}: {exc}"
    if read.failed:
        error, before = read.failed[0]
        return "error", (type(error).__name__, error.partition, error.offset, before)
    return "records", [(tuple(r), type(r.key), type(r.value)) for r in read.records]


def run(
    seed: int,
    start: int,
    stop: int,
    deadline: float,
    progress: Callable[[int], object] | None = None,
    decs: list[tuple[str, Callable[..., Any]]] | None = None,
) -> dict[str, Any]:
    """Cases ``start..stop`` (or until ``time.monotonic() >= deadline``); counts and failures.

    ``progress(index)`` is called before each case (to find the case that killed a process).
    ``decs`` replaces the decoders compared (``decoders()``), to test the harness itself.
    Odd cases are decoded from a ``memoryview`` of a ``bytearray`` (the decoders' view path),
    even ones from ``bytes``.
    """
    items = corpus()
    extra = walks() if decs is None else []
    decs = decoders() if decs is None else decs
    outcomes: Counter[str] = Counter()
    mutations: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    done = 0
    t0 = time.monotonic()
    for index in range(start, stop):
        if time.monotonic() >= deadline:
            break
        if progress is not None:
            progress(index)
        name, kind, data = case(seed, index, items)
        mutations[kind.split("+")[0]] += 1
        buf: bytes | memoryview = memoryview(bytearray(data)) if index % 2 else data
        results = [(dname, _decode(fn, buf)) for dname, fn in decs] + [(name, walk(buf)) for name, walk in extra]
        done += 1
        untyped = [(d, r[1]) for d, r in results if r[0] == "untyped"]
        if untyped:
            outcomes["untyped"] += 1
            failures.append({"index": index, "item": name, "mutation": kind, "untyped": untyped})
            continue
        first = results[0][1]
        if any(r != first for _, r in results[1:]):
            outcomes["disagree"] += 1
            failures.append(
                {
                    "index": index,
                    "item": name,
                    "mutation": kind,
                    "results": [(d, repr(r)[:300]) for d, r in results],
                }
            )
            continue
        if first[0] == "records":
            outcomes["decoded" if first[1] else "no-records"] += 1
        else:
            outcomes[first[1][0]] += 1
    return {
        "cases": done,
        "seconds": round(time.monotonic() - t0, 2),
        "decoders": [d for d, _ in decs] + [name for name, _ in extra],
        "outcomes": dict(outcomes),
        "mutations": dict(mutations),
        "failures": failures[:20],
    }


def _payloads() -> list[tuple[int, bytes]]:
    rng = random.Random("asyncconsumer-fuzz-payloads")
    plain = [b"", b"x", rng.randbytes(100), bytes(5000), b"abc" * 20000, rng.randbytes(70000)]
    out: list[tuple[int, bytes]] = []
    for codec in _CODECS:
        for p in plain:
            out.append((codec, compress(codec, p)))
            if codec == CODEC_SNAPPY:
                out.append((codec, compress(codec, p, snappy_xerial=False)))
            if codec == CODEC_LZ4:
                out.append((codec, compress(codec, p, legacy_lz4=True)))
    return out


def run_decompressors(
    seed: int, start: int, stop: int, deadline: float, progress: Callable[[int], object] | None = None
) -> dict[str, Any]:
    """Mutated compressed payloads straight into ``decompress`` (bound ``LIMIT``)."""
    payloads = _payloads()
    outcomes: Counter[str] = Counter()
    mutations: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    done = 0
    t0 = time.monotonic()
    for index in range(start, stop):
        if time.monotonic() >= deadline:
            break
        if progress is not None:
            progress(index)
        codec, kind, data, legacy = decompressor_case(seed, index, payloads)
        mutations[kind] += 1
        done += 1
        try:
            out = decompress(codec, data, legacy_lz4=legacy, max_size=LIMIT)
        except (RecordError, UnsupportedCodecError) as exc:
            outcomes[type(exc).__name__] += 1
            continue
        except Exception as exc:
            outcomes["untyped"] += 1
            failures.append({"index": index, "codec": codec, "mutation": kind, "error": f"{type(exc).__name__}: {exc}"})
            continue
        if len(out) > LIMIT:
            outcomes["past-limit"] += 1
            failures.append({"index": index, "codec": codec, "mutation": kind, "size": len(out)})
            continue
        outcomes["decompressed"] += 1
    return {
        "cases": done,
        "seconds": round(time.monotonic() - t0, 2),
        "outcomes": dict(outcomes),
        "mutations": dict(mutations),
        "failures": failures[:20],
    }


def decompressor_case(
    seed: int, index: int, payloads: list[tuple[int, bytes]] | None = None
) -> tuple[int, str, bytes, bool]:
    """Decompressor case ``index`` of ``seed``: (codec, mutation, payload, legacy_lz4)."""
    payloads = _payloads() if payloads is None else payloads
    rng = random.Random(f"d{seed}:{index}")
    codec, payload = payloads[rng.randrange(len(payloads))]
    b = bytearray(payload)
    try:
        kind = _codec_header(rng, b, codec) if rng.random() < 0.4 else rng.choice(_BYTE_MUTATIONS)(rng, b, 0)
    except Exception:
        b = bytearray(payload)
        kind = "fallback-" + _bitflips(rng, b, 0)
    legacy = codec == CODEC_LZ4 and rng.random() < 0.3
    return codec, kind, bytes(b), legacy


# ------------------------------------------------------------------ column builders


def column_builders() -> list[tuple[str, Any]]:
    from asyncconsumer.protocol import columnar

    out: list[tuple[str, Any]] = [("python", columnar.PyColumnBuilder)]
    if columnar.COLUMN_DECODER == "c":
        out.append(("c", columnar.ColumnBuilder))
    return out


def _columns(builder: Any, data: bytes | memoryview) -> tuple[str, Any]:
    """Walk ``data`` with a ColumnReader as the consumer does; every buffer as bytes, or the error."""
    from dataclasses import fields

    from asyncconsumer.protocol.columnar import ColumnBuffers, ColumnReader

    chunks: list[Any] = []
    try:
        reader = ColumnReader(
            data, topic=TOPIC, partition=PARTITION, builder=builder, allocate=None, max_decompressed=LIMIT
        )
        position = 0
        for _ in range(10_000):
            cols = reader.take(1 << 30, position)
            if not cols.count:
                break
            chunk: list[Any] = [cols.first, cols.count]
            for f in fields(ColumnBuffers):
                v = getattr(cols.buffers, f.name)
                chunk.append(v if v is None or isinstance(v, int) else bytes(v))
            chunks.append(chunk)
            last = cols.last_offset
            assert last is not None
            position = last + 1
    except RecordError as exc:
        return "error", (type(exc).__name__, exc.partition, exc.offset, len(chunks))
    except Exception as exc:
        return "untyped", f"{type(exc).__name__}: {exc}"
    return "columns", chunks


def run_columns(
    seed: int, start: int, stop: int, deadline: float, progress: Callable[[int], object] | None = None
) -> dict[str, Any]:
    """The decoder cases through both column builders (see the module docstring)."""
    items = corpus()
    builders = column_builders()
    outcomes: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    done = 0
    t0 = time.monotonic()
    for index in range(start, stop):
        if time.monotonic() >= deadline:
            break
        if progress is not None:
            progress(index)
        name, kind, data = case(seed, index, items)
        done += 1
        results = [(bname, _columns(b, data)) for bname, b in builders]
        untyped = [(b, r[1]) for b, r in results if r[0] == "untyped"]
        if untyped:
            outcomes["untyped"] += 1
            failures.append({"index": index, "item": name, "mutation": kind, "untyped": untyped})
            continue
        first = results[0][1]
        if any(r != first for _, r in results[1:]):
            outcomes["disagree"] += 1
            failures.append(
                {"index": index, "item": name, "mutation": kind, "results": [(b, repr(r)[:300]) for b, r in results]}
            )
            continue
        if first[0] == "columns":
            outcomes["decoded" if first[1] else "no-records"] += 1
        else:
            outcomes[first[1][0]] += 1
    return {
        "cases": done,
        "seconds": round(time.monotonic() - t0, 2),
        "builders": [b for b, _ in builders],
        "outcomes": dict(outcomes),
        "failures": failures[:20],
    }
