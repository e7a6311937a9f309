"""Compressed payloads that declare, or expand to, more than a batch may hold.

Two kinds, for every codec a record batch can use:

* *declaring* payloads are tiny but say (in the codec's own header) that they
  decompress to ``size`` bytes: snappy's varint length, a xerial chunk, an LZ4
  frame content size, a zstd frame content size.  A decoder that trusts the
  header allocates ``size`` bytes up front;
* *lying* payloads declare a small size and hold ``size`` bytes (zeros): a decoder that sizes
  its buffer by the header and then grows it as the data keeps coming ends up as large as a
  bomb;
* *bombs* really expand to ``size`` bytes (zeros) and declare nothing, built
  by repeating one compressed unit of ``unit`` bytes (concatenated gzip
  members, LZ4 frames, zstd frames, xerial chunks) so making a gigabyte bomb
  takes milliseconds.

All are raw payloads for ``build_batch(..., compression=codec, raw_records=payload)``.
"""

from __future__ import annotations

import struct
import zlib

import lz4.frame
import snappy
import zstandard

from asyncconsumer.protocol.compression import XERIAL_MAGIC, xxh32

__all__ = ["bomb", "declaring", "lying", "raw_snappy_declaring"]

_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def raw_snappy_declaring(size: int) -> bytes:
    """A raw snappy block whose length header says ``size``, holding a 4-byte literal."""
    return _uvarint(size) + bytes([3 << 2]) + b"abcd"


def _lz4_declaring(size: int) -> bytes:
    flg = 0x40 | 0x20 | 0x08  # version 01, independent blocks, content size present
    bd = 0x70  # 4 MiB blocks
    descriptor = bytes([flg, bd]) + struct.pack("<Q", size)
    hc = (xxh32(descriptor) >> 8) & 0xFF
    block = b"abcd"
    return (
        b"\x04\x22\x4d\x18"
        + descriptor
        + bytes([hc])
        + struct.pack("<I", len(block) | 0x80000000)  # an uncompressed block
        + block
        + struct.pack("<I", 0)  # end mark
    )


def _zstd_declaring(size: int) -> bytes:
    fhd = 0xC0  # 8-byte frame content size, not single-segment (so a window descriptor follows)
    window = 0x00  # 1 KiB window
    block = b"abcd"
    block_header = (len(block) << 3) | 1  # last block, raw
    return (
        b"\x28\xb5\x2f\xfd"
        + bytes([fhd, window])
        + struct.pack("<Q", size)
        + block_header.to_bytes(3, "little")
        + block
    )


def declaring(codec: str, size: int) -> bytes:
    """A small payload of ``codec`` ("snappy", "xerial", "lz4", "zstd") declaring ``size`` bytes."""
    if codec == "snappy":
        return raw_snappy_declaring(size)
    if codec == "xerial":
        block = raw_snappy_declaring(size)
        return _XERIAL_HEADER + struct.pack(">i", len(block)) + block
    if codec == "lz4":
        return _lz4_declaring(size)
    if codec == "zstd":
        return _zstd_declaring(size)
    raise ValueError(codec)


def bomb(codec: str, size: int, unit: int = 64 << 20) -> bytes:
    """A payload of ``codec`` ("gzip", "xerial", "lz4", "zstd") that expands to ``size`` zero bytes.

    Nothing in it declares the total; ``size`` is rounded up to whole units.
    """
    if codec == "xerial":
        unit = 32 * 1024
    count = -(-size // unit)
    zeros = bytes(unit)
    if codec == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        member = c.compress(zeros) + c.flush()
        return member * count
    if codec == "lz4":
        frame = lz4.frame.compress(zeros, store_size=False)
        return bytes(frame) * count
    if codec == "zstd":
        frame = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(zeros)
        return frame * count
    if codec == "xerial":
        block = bytes(snappy.compress(zeros))
        return _XERIAL_HEADER + (struct.pack(">i", len(block)) + block) * count
    raise ValueError(codec)


def lying(codec: str, declared: int, size: int) -> bytes:
    """An LZ4 or zstd frame that declares ``declared`` bytes and holds ``size`` zeros."""
    if codec == "lz4":
        unit = 4 << 20
        frame = lz4.frame.compress(bytes(unit), block_size=lz4.frame.BLOCKSIZE_MAX4MB, store_size=False)
        (raw,) = struct.unpack_from("<I", frame, 7)  # first block after the 7-byte header
        block = frame[7 : 11 + (raw & 0x7FFFFFFF)]
        descriptor = bytes([0x40 | 0x20 | 0x08, 0x70]) + struct.pack("<Q", declared)
        head = b"\x04\x22\x4d\x18" + descriptor + bytes([(xxh32(descriptor) >> 8) & 0xFF])
        return head + block * -(-size // unit) + struct.pack("<I", 0)
    if codec == "zstd":
        unit = 128 << 10
        count = -(-size // unit)
        rle = ((unit << 3) | (1 << 1)).to_bytes(3, "little") + b"\x00"  # an RLE block of 128 KiB zeros
        last = ((unit << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
        head = b"\x28\xb5\x2f\xfd" + bytes([0xC0, 7 << 3]) + struct.pack("<Q", declared)  # 128 KiB window
        return head + rle * (count - 1) + last
    raise ValueError(codec)
