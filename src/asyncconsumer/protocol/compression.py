"""Compression codecs used inside Kafka record batches.

Codec ids are the batch attribute bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4,
4 zstd.  ``decompress`` accepts any buffer (a ``memoryview`` slice of the
fetched bytes is not copied before it reaches the codec).

Errors carry no topic/partition: the record reader re-raises them with the
location filled in.

Every decompressor is bounded by ``max_size``, the most one batch may hold once
decompressed (the consumer derives it from its fetch limits, see
``ConsumerConfig.batch_decompress_limit``).  Sizes a payload declares (snappy's
varint length, xerial chunk lengths, the LZ4 and zstd frame content sizes) are
checked before anything is allocated; where nothing is declared (gzip, frames
without a content size) the output is produced in steps and decoding stops as
soon as it passes the bound.  A payload past the bound is a
``CorruptRecordError``, never a ``MemoryError`` or a process abort.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Any

from ..errors import CorruptRecordError, DecompressionLimitError, UnsupportedCodecError

__all__ = [
    "CODEC_GZIP",
    "CODEC_LZ4",
    "CODEC_NAMES",
    "CODEC_NONE",
    "CODEC_SNAPPY",
    "CODEC_ZSTD",
    "DEFAULT_MAX_SIZE",
    "XERIAL_MAGIC",
    "compress",
    "decompress",
    "has_codec",
]

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

CODEC_NAMES = {
    CODEC_NONE: "none",
    CODEC_GZIP: "gzip",
    CODEC_SNAPPY: "snappy",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
}

Buffer = bytes | bytearray | memoryview

#: ``decompress``'s bound when the caller gives none: what the default consumer
#: settings allow (``ConsumerConfig().batch_decompress_limit``, 200 MiB).
DEFAULT_MAX_SIZE = 200 << 20


def _too_large(name: str, declared: int | None, max_size: int) -> DecompressionLimitError:
    """``declared``: the size the data says it holds, None when decoding ran past ``max_size``."""
    what = f"declares {declared} bytes uncompressed" if declared is not None else "decompresses to"
    return DecompressionLimitError(
        f"{name} data {what} more than the {max_size} bytes one batch may hold (max_batch_decompressed_bytes)"
    )


# lz4 and zstandard are optional extras; import lazily so a missing library
# only matters for the batches that need it.  snappy is lazy too, for import time.
_lz4_frame: Any = None
_zstd: Any = None
_snappy: Any = None


def _load_snappy() -> Any:
    """python-snappy (a dependency), imported on the first snappy batch: it loads cramjam, about
    25 ms that a process reading no snappy data (a Spark planner, a CLI) need not pay."""
    global _snappy
    if _snappy is None:
        import snappy

        _snappy = snappy
    return _snappy


def _load_lz4() -> Any:
    global _lz4_frame
    if _lz4_frame is None:
        try:
            import lz4.frame as lz4_frame
        except ImportError as exc:
            raise UnsupportedCodecError(
                "batch is compressed with lz4 but the 'lz4' library is not installed; "
                "pip install asyncconsumer[lz4]"
            ) from exc
        _lz4_frame = lz4_frame
    return _lz4_frame


def _load_zstd() -> Any:
    global _zstd
    if _zstd is None:
        try:
            import zstandard
        except ImportError as exc:
            raise UnsupportedCodecError(
                "batch is compressed with zstd but the 'zstandard' library is not installed; "
                "pip install asyncconsumer[zstd]"
            ) from exc
        _zstd = zstandard
    return _zstd


def has_codec(codec: int) -> bool:
    """True if ``codec`` is known and its library can be imported."""
    try:
        if codec == CODEC_LZ4:
            _load_lz4()
        elif codec == CODEC_ZSTD:
            _load_zstd()
    except UnsupportedCodecError:
        return False
    return codec in CODEC_NAMES


def _unknown(codec: int) -> UnsupportedCodecError:
    return UnsupportedCodecError(f"unknown compression codec id {codec}")


# ---------------------------------------------------------------- gzip


def _gunzip(data: Buffer, max_size: int) -> bytes:
    # wbits 16+15: gzip container only (what Kafka writes).  A decompressobj loop
    # also accepts several concatenated gzip members.  ``max_length`` caps the
    # output of each call (zlib grows its buffer as it goes: nothing is reserved).
    parts: list[bytes] = []
    rest: Buffer = data
    left = max_size
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = d.decompress(rest, left + 1)
        if len(out) > left:
            raise _too_large("gzip", None, max_size)
        left -= len(out)
        parts.append(out)
        if not d.eof:
            raise CorruptRecordError("gzip data is truncated")
        rest = d.unused_data
        if not rest:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


# ---------------------------------------------------------------- snappy

#: Header the xerial snappy-java ``SnappyOutputStream`` writes (Java producers).
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_I32 = struct.Struct(">i")
#: A raw snappy block can expand at most 64/3 times (a 3-byte copy element gives 64 bytes).
_SNAPPY_MAX_RATIO = 22


def _snappy_length(block: memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint, at most 32 bits)."""
    result = 0
    for i in range(min(5, len(block))):
        b = block[i]
        result |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return result
    raise CorruptRecordError("snappy block length header is truncated or longer than 32 bits")


def _snappy_block(block: memoryview, left: int, max_size: int) -> bytes:
    """One raw snappy block, its declared length checked before the library allocates it."""
    size = _snappy_length(block)
    if size > left:
        raise _too_large("snappy", size, max_size)
    if size > _SNAPPY_MAX_RATIO * len(block):
        raise CorruptRecordError(
            f"snappy block of {len(block)} bytes declares {size} bytes uncompressed, more than snappy can encode in it"
        )
    out = bytes(_load_snappy().decompress(block))
    if len(out) != size:  # the library checks this; never hand out a different size
        raise CorruptRecordError(f"snappy block declares {size} bytes but decodes to {len(out)}")
    return out


def _snappy_decompress(data: Buffer, max_size: int) -> bytes:
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if mv[:8] != XERIAL_MAGIC:
        # librdkafka may write a raw snappy block.
        return _snappy_block(mv, max_size, max_size)
    # Xerial framing: magic, int32 version, int32 min-compatible version, then
    # repeated [int32 length][raw snappy block].
    pos = 16
    end = len(mv)
    parts: list[bytes] = []
    left = max_size
    while pos < end:
        if pos + 4 > end:
            raise CorruptRecordError("xerial snappy block length is truncated")
        (size,) = _I32.unpack_from(mv, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise CorruptRecordError(f"xerial snappy block of {size} bytes runs past the end of the data")
        block = _snappy_block(mv[pos : pos + size], left, max_size)
        left -= len(block)
        parts.append(block)
        pos += size
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_compress(data: Buffer, xerial: bool) -> bytes:
    if not xerial:
        return bytes(_load_snappy().compress(data))
    mv = memoryview(data)
    out = [_XERIAL_HEADER]
    for start in range(0, len(mv), _XERIAL_BLOCK):
        block = bytes(_load_snappy().compress(mv[start : start + _XERIAL_BLOCK]))
        out.append(_I32.pack(len(block)))
        out.append(block)
    return b"".join(out)


# ---------------------------------------------------------------- lz4

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of ``data`` (pure Python; only used on a few header bytes)."""
    n = len(data)
    pos = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while pos + 16 <= n:
            for i in range(4):
                lane = int.from_bytes(data[pos : pos + 4], "little")
                v[i] = (_rotl((v[i] + lane * _P2) & _M32, 13) * _P1) & _M32
                pos += 4
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        acc = (seed + _P5) & _M32
    acc = (acc + n) & _M32
    while pos + 4 <= n:
        lane = int.from_bytes(data[pos : pos + 4], "little")
        acc = (_rotl((acc + lane * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    while pos < n:
        acc = (_rotl((acc + data[pos] * _P5) & _M32, 11) * _P1) & _M32
        pos += 1
    acc ^= acc >> 15
    acc = (acc * _P2) & _M32
    acc ^= acc >> 13
    acc = (acc * _P3) & _M32
    acc ^= acc >> 16
    return acc


def _lz4_descriptor_end(frame: bytes | bytearray) -> int:
    """Index of the header-checksum byte of an LZ4 frame."""
    if len(frame) < 7 or frame[:4] != _LZ4_MAGIC:
        raise CorruptRecordError("lz4 data does not start with an LZ4 frame header")
    flg = frame[4]
    end = 6  # magic + FLG + BD
    if flg & 0x08:  # content size present
        end += 8
    if flg & 0x01:  # dictionary id present
        end += 4
    if len(frame) <= end:
        raise CorruptRecordError("lz4 frame header is truncated")
    return end


def _lz4_fix_legacy_header(data: Buffer) -> bytearray:
    # Kafka < 0.10 (message format v0) hashed the magic number into the frame
    # header checksum (KAFKA-3160), which a conforming reader rejects; recompute it.
    frame = bytearray(data)
    end = _lz4_descriptor_end(frame)
    frame[end] = (xxh32(bytes(frame[4:end])) >> 8) & 0xFF
    return frame


def _lz4_break_legacy_header(frame: bytes) -> bytes:
    """Rewrite a frame's header checksum the way Kafka < 0.10 computed it (for fixtures)."""
    out = bytearray(frame)
    end = _lz4_descriptor_end(out)
    out[end] = (xxh32(bytes(out[:end])) >> 8) & 0xFF
    return bytes(out)


def _lz4_decompress(data: Buffer, legacy_header: bool, max_size: int) -> bytes:
    frame_mod = _load_lz4()
    src: Buffer = _lz4_fix_legacy_header(data) if legacy_header else data
    # Frame by frame.  A declared content size is checked first; ``max_length``
    # then caps the output at it (or, for a frame without one, what Java producers
    # write, at what is left of the bound): the one-shot ``lz4.frame.decompress``
    # would keep growing its buffer past a declared size that lies.
    parts: list[bytes] = []
    rest: Buffer = src
    left = max_size
    try:
        while True:
            declared = frame_mod.get_frame_info(rest).get("content_size", 0)
            if declared > left:
                raise _too_large("lz4", declared, max_size)
            cap = declared if declared > 0 else left
            d = frame_mod.LZ4FrameDecompressor()
            out = d.decompress(rest, max_length=cap + 1)
            if len(out) > cap:
                if declared > 0:
                    raise CorruptRecordError(f"lz4 frame declares {declared} bytes but holds more")
                raise _too_large("lz4", None, max_size)
            if not d.eof:
                raise CorruptRecordError("lz4 data is truncated")
            left -= len(out)
            parts.append(out)
            rest = d.unused_data
            if not rest:
                break
    except RuntimeError as exc:
        raise CorruptRecordError(f"lz4 data is corrupt: {exc}") from exc
    return parts[0] if len(parts) == 1 else b"".join(parts)


# ---------------------------------------------------------------- zstd

_local = threading.local()


#: A zstd block gives at most 128 KiB from 4 bytes (an RLE block): 32768 bytes out per byte in.
_ZSTD_MAX_RATIO_SHIFT = 15
_ZSTD_MIN_STEP = 256


def _zstd_decompress(data: Buffer, max_size: int) -> bytes:
    zstd = _load_zstd()
    # A ZstdDecompressor must not be used by two threads at once; keep one per thread.
    dctx = getattr(_local, "zstd_dctx", None)
    if dctx is None:
        dctx = _local.zstd_dctx = zstd.ZstdDecompressor()
    # decompressobj streams, so frames without a content size (what Java's
    # zstd-jni and librdkafka write) decode; loop for concatenated frames.
    # A frame's declared content size is checked first (the library then refuses
    # to produce more than it declares).  A frame declaring none is fed in steps
    # small enough that one step cannot produce more than what is left of the
    # bound, so the output never passes it by more than a block.
    parts: list[bytes] = []
    rest = memoryview(data)
    if rest.format != "B" or rest.ndim != 1:
        rest = rest.cast("B")
    left = max_size
    while True:
        declared = zstd.frame_content_size(rest)
        if declared > left:
            raise _too_large("zstd", declared, max_size)
        dobj = dctx.decompressobj()
        pos, end = 0, len(rest)
        while pos < end and not dobj.eof:
            step = end if declared >= 0 else max(_ZSTD_MIN_STEP, left >> _ZSTD_MAX_RATIO_SHIFT)
            out = dobj.decompress(rest[pos : pos + step])
            pos += step
            if len(out) > left:
                raise _too_large("zstd", None, max_size)
            left -= len(out)
            parts.append(out)
        if not dobj.eof:
            raise CorruptRecordError("zstd data is truncated")
        unused = dobj.unused_data
        if pos < end:
            unused = unused + bytes(rest[pos:]) if unused else bytes(rest[pos:])
        if not unused:
            break
        rest = memoryview(unused)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# ---------------------------------------------------------------- API


def decompress(codec: int, data: Buffer, *, legacy_lz4: bool = False, max_size: int = DEFAULT_MAX_SIZE) -> bytes:
    """Decompress one record-batch payload to at most ``max_size`` bytes.

    ``legacy_lz4`` tolerates the wrong LZ4 header checksum of message format v0.
    Raises ``UnsupportedCodecError`` (unknown id or missing library) or
    ``CorruptRecordError`` (the codec rejected the data, or it would decompress
    to more than ``max_size`` bytes).
    """
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, max_size)
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(data, max_size)
        if codec == CODEC_LZ4:
            return _lz4_decompress(data, legacy_lz4, max_size)
        if codec == CODEC_ZSTD:
            return _zstd_decompress(data, max_size)
        if codec == CODEC_NONE:
            if len(data) > max_size:
                raise _too_large("uncompressed", len(data), max_size)
            return bytes(data)
    except (CorruptRecordError, UnsupportedCodecError):
        raise
    except MemoryError as exc:
        name = CODEC_NAMES[codec]
        raise DecompressionLimitError(f"{name} data could not be decompressed: out of memory") from exc
    except Exception as exc:  # each library has its own error type
        name = CODEC_NAMES[codec]
        raise CorruptRecordError(f"{name} data is corrupt: {type(exc).__name__}: {exc}") from exc
    raise _unknown(codec)


def compress(
    codec: int,
    data: Buffer,
    *,
    snappy_xerial: bool = True,
    level: int | None = None,
    legacy_lz4: bool = False,
) -> bytes:
    """Compress ``data`` as a producer would (used by the test-fixture writer).

    ``snappy_xerial`` selects the Java-style framing (default) over a raw block;
    ``legacy_lz4`` writes the broken header checksum of message format v0.
    """
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        c = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == CODEC_SNAPPY:
        return _snappy_compress(data, snappy_xerial)
    if codec == CODEC_LZ4:
        frame: bytes = bytes(_load_lz4().compress(data, compression_level=level or 0))
        return _lz4_break_legacy_header(frame) if legacy_lz4 else frame
    if codec == CODEC_ZSTD:
        zstd = _load_zstd()
        # No content size in the header, like Java's zstd-jni stream, so the
        # reader's streaming path is what gets exercised.
        cctx = zstd.ZstdCompressor(level=3 if level is None else level, write_content_size=False)
        return bytes(cctx.compress(data))
    raise _unknown(codec)
