"""Record-set reader, codecs and fixture writer (example-based tests)."""

from __future__ import annotations

import struct
import sys
import zlib

import pytest
from crc32c import crc32c

from asyncconsumer.errors import (
    CorruptRecordError,
    RecordError,
    UnsupportedCodecError,
    UnsupportedMagicError,
)
from asyncconsumer.protocol import compression
from asyncconsumer.protocol.compression import XERIAL_MAGIC, compress, decompress
from asyncconsumer.protocol.record_writer import (
    DEFAULT_TIMESTAMP,
    Record,
    build_batch,
    build_control_batch,
    build_legacy_message_set,
    encode_varint,
)
from asyncconsumer.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NO_TIMESTAMP,
    NO_TIMESTAMP_TYPE,
    AbortedTransactionFilter,
    RecordBatch,
    control_record_type,
    decode_batch,
    iter_batches,
    next_offset_after,
)
from asyncconsumer.structs import ConsumerRecord

TOPIC, PART = "orders", 3
WHERE = "(orders-3 at offset {})"
CODECS = [0, 1, 2, 3, 4]


def batches(data: bytes | bytearray | memoryview, **kw: object) -> list[RecordBatch]:
    return list(iter_batches(data, topic=TOPIC, partition=PART, **kw))  # type: ignore[arg-type]


def decode_all(data: bytes | bytearray | memoryview, **kw: object) -> list[ConsumerRecord[bytes, bytes]]:
    return [r for b in batches(data, **kw) for r in decode_batch(b, TOPIC, PART)]


RECORDS = [
    Record(b"k0", b"v0", [("h1", b"x"), ("h2", None)], 0),
    Record(None, b"no key", (), 5),
    Record(b"tombstone", None, [("\u00e9t\u00e9", b"")], 7),
    Record(None, None),
    Record(b"", b""),
    Record(b"big" * 5000, b"v" * 70000, [("k" * 200, b"h" * 10000)], -3),
]


def expected(
    recs: list[Record], base_offset: int, ts_type: int = 0, epoch: int | None = 0
) -> list[tuple[object, ...]]:
    return [
        (
            TOPIC,
            PART,
            base_offset + i,
            DEFAULT_TIMESTAMP + r.timestamp_delta,
            ts_type,
            r.key,
            r.value,
            -1 if r.key is None else len(r.key),
            -1 if r.value is None else len(r.value),
            tuple(r.headers),
            epoch,
        )
        for i, r in enumerate(recs)
    ]


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize(("codec", "xerial"), [(c, True) for c in CODECS] + [(2, False)])
def test_round_trip_every_codec(codec: int, xerial: bool) -> None:
    data = build_batch(RECORDS, base_offset=1000, compression=codec, snappy_xerial=xerial)
    [b] = batches(data)
    assert (b.base_offset, b.last_offset, b.record_count, b.compression) == (1000, 1005, 6, codec)
    assert b.size_in_bytes == len(data)
    assert bytes(b.data) == data
    out = decode_batch(b, TOPIC, PART)
    assert all(type(r) is ConsumerRecord for r in out)
    assert [tuple(r) for r in out] == expected(RECORDS, 1000)
    assert all(type(r.key) in (bytes, type(None)) and type(r.value) in (bytes, type(None)) for r in out)
    assert next_offset_after(b) == 1006


@pytest.mark.parametrize("wrap", ["bytes", "view", "slice", "bytearray", "bounds"])
def test_input_buffer_kinds(wrap: str) -> None:
    data = build_batch(RECORDS[:3], base_offset=7) + build_batch(RECORDS[3:], base_offset=10)
    padded = b"JUNK" + data + b"TAIL"
    if wrap == "bytes":
        got = decode_all(data)
    elif wrap == "view":
        got = decode_all(memoryview(data))
    elif wrap == "slice":
        got = decode_all(memoryview(padded)[4:-4])
    elif wrap == "bytearray":
        got = decode_all(bytearray(data))
    else:
        got = decode_all(padded, start=4, end=len(padded) - 4)
    assert [r.offset for r in got] == [7, 8, 9, 10, 11, 12]
    assert [r.value for r in got] == [r.value for r in RECORDS]
    assert all(type(r.value) in (bytes, type(None)) for r in got)


def test_batch_header_fields() -> None:
    data = build_batch(
        [(b"k", b"v")],
        base_offset=42,
        base_timestamp=123,
        is_transactional=True,
        producer_id=99,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=8,
    )
    [b] = batches(data)
    assert (b.magic, b.leader_epoch, b.is_transactional, b.is_control) == (2, 8, True, False)
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (99, 3, 17)
    assert (b.base_timestamp, b.max_timestamp, b.timestamp_type) == (123, 123, 0)
    assert "base_offset=42" in repr(b)
    [r] = decode_batch(b, TOPIC, PART)
    assert r.leader_epoch == 8


def test_leader_epoch_minus_one_is_none() -> None:
    [b] = batches(build_batch([(b"k", b"v")], partition_leader_epoch=-1))
    assert b.leader_epoch is None
    assert decode_batch(b, TOPIC, PART)[0].leader_epoch is None


def test_log_append_time_uses_max_timestamp() -> None:
    recs = [Record(b"a", b"1", (), 0), Record(b"b", b"2", (), 50)]
    data = build_batch(recs, timestamp_type=1, max_timestamp=999_999)
    out = decode_all(data)
    assert [(r.timestamp, r.timestamp_type) for r in out] == [(999_999, 1), (999_999, 1)]


def test_create_time_deltas_and_multibyte_varints() -> None:
    # Offset deltas / lengths / timestamps that need 3+ varint bytes take the slow path.
    recs = [
        Record(b"k" * 9000, b"v" * 200_000, [(f"h{i}", bytes([i])) for i in range(70)], -(10**9)),
        Record(None, b"x", (), 2**40),
    ]
    data = build_batch(recs, base_offset=2**50, offset_deltas=[0, 1_000_000])
    out = decode_all(data)
    assert [r.offset for r in out] == [2**50, 2**50 + 1_000_000]
    assert out[0].timestamp == DEFAULT_TIMESTAMP - 10**9
    assert out[1].timestamp == DEFAULT_TIMESTAMP + 2**40
    assert out[0].key == b"k" * 9000 and len(out[0].value or b"") == 200_000
    assert out[0].headers == tuple((f"h{i}", bytes([i])) for i in range(70))


def test_empty_batch_and_compaction_gaps() -> None:
    # A batch emptied by compaction keeps its lastOffsetDelta.
    [b] = batches(build_batch([], base_offset=500, last_offset_delta=9))
    assert decode_batch(b, TOPIC, PART) == []
    assert next_offset_after(b) == 510
    # Offsets with gaps; the last records were compacted away.
    data = build_batch(RECORDS[:3], base_offset=100, offset_deltas=[0, 4, 6], last_offset_delta=20)
    [b] = batches(data)
    assert [r.offset for r in decode_batch(b, TOPIC, PART)] == [100, 104, 106]
    assert next_offset_after(b) == 121


def test_empty_record_set() -> None:
    assert batches(b"") == []
    assert batches(memoryview(b"")) == []


def test_many_batches_each_codec() -> None:
    data = b"".join(build_batch([(b"k", b"v%d" % i)], base_offset=i, compression=i % 5) for i in range(20))
    assert [r.value for r in decode_all(data)] == [b"v%d" % i for i in range(20)]


# ---------------------------------------------------------------- truncation


def test_truncated_trailing_batch_is_ignored() -> None:
    first = build_batch(RECORDS[:2], base_offset=0)
    second = build_batch(RECORDS[2:4], base_offset=2, compression=1)
    data = first + second
    for cut in range(len(first), len(data)):
        got = batches(data[:cut])
        assert [b.base_offset for b in got] == [0], cut
    assert [b.base_offset for b in batches(data)] == [0, 2]


def test_truncated_first_batch_yields_nothing() -> None:
    data = build_batch(RECORDS[:2])
    for cut in range(len(data)):
        assert batches(data[:cut]) == []
        assert batches(memoryview(data)[:cut]) == []


# ---------------------------------------------------------------- corruption


def with_byte(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1 :]


def test_crc_mismatch() -> None:
    data = build_batch([(b"key", b"value")], base_offset=77)
    bad = with_byte(data, len(data) - 2, data[-2] ^ 0xFF)  # last byte of the value
    with pytest.raises(CorruptRecordError) as ei:
        batches(bad)
    msg = str(ei.value)
    assert "CRC-32C" in msg and WHERE.format(77) in msg
    assert (ei.value.topic, ei.value.partition, ei.value.offset) == (TOPIC, PART, 77)
    # The CRC does not cover the leader epoch, and check_crcs=False skips the check.
    assert batches(with_byte(data, 12, 0x7F))
    [b] = batches(bad, check_crcs=False)
    assert decode_batch(b, TOPIC, PART)[0].value == b"valu" + bytes([ord("e") ^ 0xFF])


def test_crc_covers_header_attributes() -> None:
    data = build_batch([(b"k", b"v")], base_offset=5)
    with pytest.raises(CorruptRecordError, match="CRC"):
        batches(with_byte(data, 22, data[22] | 0x10))


def test_unknown_magic() -> None:
    data = build_batch([(b"k", b"v")], base_offset=31, magic=3)
    with pytest.raises(UnsupportedMagicError) as ei:
        batches(build_batch([(b"k", b"v")]) + data)
    assert "magic" in str(ei.value) and WHERE.format(31) in str(ei.value)


def test_impossible_length_field() -> None:
    data = build_batch([(b"k", b"v")], base_offset=9)
    for length in (-1, 0, 13):
        bad = data[:8] + struct.pack(">i", length) + data[12:]
        with pytest.raises(CorruptRecordError, match=r"length .*orders-3 at offset 9"):
            batches(bad)
    # Long enough for a legacy message but not for a v2 header.
    bad = data[:8] + struct.pack(">i", 30) + data[12:]
    with pytest.raises(CorruptRecordError, match="v2 batch header"):
        batches(bad)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec: int) -> None:
    data = build_batch([(b"k", b"v")], base_offset=12, attributes=codec)
    [b] = batches(data)
    assert b.compression == codec
    with pytest.raises(UnsupportedCodecError) as ei:
        decode_batch(b, TOPIC, PART)
    assert f"codec id {codec}" in str(ei.value) and WHERE.format(12) in str(ei.value)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_corrupt_compressed_payload(codec: int) -> None:
    good = compress(codec, b"\x00" * 100)
    for raw in (b"garbage-garbage-garbage", good[: len(good) // 2]):
        [b] = batches(build_batch([(b"k", b"v")], base_offset=4, compression=codec, raw_records=raw))
        with pytest.raises(CorruptRecordError) as ei:
            decode_batch(b, TOPIC, PART)
        assert WHERE.format(4) in str(ei.value)


def _corrupt(raw: bytes, count: int = 1) -> CorruptRecordError:
    [b] = batches(build_batch([(b"k", b"v")], base_offset=60, raw_records=raw, record_count=count))
    with pytest.raises(CorruptRecordError) as ei:
        decode_batch(b, TOPIC, PART)
    assert WHERE.format(60) in str(ei.value)
    return ei.value


def _rec(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


def test_inconsistent_record_bytes() -> None:
    v = encode_varint
    good = _rec(b"\x00" + v(0) + v(0) + v(1) + b"k" + v(1) + b"v" + v(0))
    # Record count says more / fewer records than the bytes hold.
    assert "record count" in str(_corrupt(good, count=2)) or "past the end" in str(_corrupt(good, 2))
    assert "record count" in str(_corrupt(good + good, count=1))
    # Key length runs past the end of the batch.
    _corrupt(_rec(b"\x00" + v(0) + v(0) + v(50) + b"k" + v(1) + b"v" + v(0)))
    # Record length disagrees with its fields.
    _corrupt(v(20) + b"\x00" + v(0) + v(0) + v(1) + b"k" + v(1) + b"v" + v(0) + b"\x00" * 12)
    # Negative lengths other than -1.
    assert "key length" in str(_corrupt(_rec(b"\x00" + v(0) + v(0) + v(-2) + v(1) + b"v" + v(0))))
    assert "value length" in str(_corrupt(_rec(b"\x00" + v(0) + v(0) + v(-1) + v(-5) + v(0))))
    assert "header count" in str(_corrupt(_rec(b"\x00" + v(0) + v(0) + v(-1) + v(-1) + v(-3))))
    bad_hdr = _rec(b"\x00" + v(0) + v(0) + v(-1) + v(-1) + v(1) + v(-1) + v(0))
    assert "header key length" in str(_corrupt(bad_hdr))
    bad_hval = _rec(b"\x00" + v(0) + v(0) + v(-1) + v(-1) + v(1) + v(1) + b"h" + v(-4))
    assert "header value length" in str(_corrupt(bad_hval))
    # A varint longer than 10 bytes.
    assert "varint" in str(_corrupt(b"\x80" * 12 + b"\x01"))
    # Empty records section with a count of 1.
    _corrupt(b"")


def test_header_key_invalid_utf8_is_replaced() -> None:
    v = encode_varint
    raw = _rec(b"\x00" + v(0) + v(0) + v(-1) + v(-1) + v(1) + v(2) + b"\xff\xfe" + v(-1))
    [b] = batches(build_batch([(b"k", b"v")], raw_records=raw))
    [r] = decode_batch(b, TOPIC, PART)
    assert r.headers == (("\ufffd\ufffd", None),)


# ---------------------------------------------------------------- codecs


def test_xerial_snappy_framed_by_the_spec() -> None:
    """A records section framed by hand as snappy-java's SnappyOutputStream writes it (what Java
    producers send), independent of this project's writer: the magic, version 1, compatible
    version 1, then blocks of [int32 length][raw snappy].  Blocks of any size are legal."""
    import snappy

    plain = build_batch(RECORDS, base_offset=500)
    section = plain[61:]  # the uncompressed records after the 61-byte batch header
    cut = len(section) // 3
    framed = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"
    for block in (section[:cut], section[cut:]):
        raw = snappy.compress(block)
        framed += len(raw).to_bytes(4, "big") + raw
    data = build_batch(RECORDS, base_offset=500, attributes=2, raw_records=framed)  # codec bits: snappy
    [b] = batches(data)
    assert b.compression == 2
    assert [tuple(r) for r in decode_batch(b, TOPIC, PART)] == expected(RECORDS, 500)


def test_snappy_xerial_and_raw() -> None:
    payload = bytes(range(256)) * 600  # > one 32 KiB xerial block
    xerial = compress(2, payload, snappy_xerial=True)
    raw = compress(2, payload, snappy_xerial=False)
    assert xerial.startswith(XERIAL_MAGIC) and not raw.startswith(XERIAL_MAGIC)
    assert decompress(2, xerial) == payload
    assert decompress(2, memoryview(raw)) == payload
    # A xerial stream whose block length runs past the end.
    with pytest.raises(CorruptRecordError, match="xerial"):
        decompress(2, xerial[:-10])
    with pytest.raises(CorruptRecordError, match="xerial"):
        decompress(2, xerial[:18])


def test_gzip_multi_member_and_zlib_module_output() -> None:
    a, b = compress(1, b"hello "), compress(1, b"world")
    assert decompress(1, a + b) == b"hello world"
    import gzip

    assert decompress(1, gzip.compress(b"abc")) == b"abc"


def test_zstd_with_and_without_content_size() -> None:
    import zstandard

    data = b"zstd payload " * 1000
    with_size = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    streamed = zstandard.ZstdCompressor().compressobj()
    no_size = streamed.compress(data) + streamed.flush()
    assert decompress(4, with_size) == data
    assert decompress(4, no_size) == data
    assert decompress(4, with_size + no_size) == data * 2
    assert decompress(4, compress(4, data)) == data


def test_lz4_frame_variants() -> None:
    import lz4.frame

    data = b"lz4 payload " * 10000
    for kw in ({}, {"content_checksum": True}, {"block_linked": False}, {"store_size": False}):
        assert decompress(3, lz4.frame.compress(data, **kw)) == data


def test_legacy_lz4_broken_header_checksum() -> None:
    import lz4.frame

    data = b"old kafka " * 100
    broken = compress(3, data, legacy_lz4=True)
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(broken)
    assert decompress(3, broken, legacy_lz4=True) == data


def test_xxh32_vectors() -> None:
    assert compression.xxh32(b"") == 0x02CC5D05
    assert compression.xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


@pytest.mark.parametrize(("codec", "module", "extra"), [(3, "lz4.frame", "lz4"), (4, "zstandard", "zstd")])
def test_missing_optional_library(
    monkeypatch: pytest.MonkeyPatch, codec: int, module: str, extra: str
) -> None:
    monkeypatch.setattr(compression, "_lz4_frame", None)
    monkeypatch.setattr(compression, "_zstd", None)
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    assert not compression.has_codec(codec)
    data = build_batch([(b"k", b"v")], base_offset=3, attributes=codec, raw_records=b"x")
    [b] = batches(data)
    with pytest.raises(UnsupportedCodecError) as ei:
        decode_batch(b, TOPIC, PART)
    msg = str(ei.value)
    assert f"pip install asyncconsumer[{extra}]" in msg and WHERE.format(3) in msg


def test_compress_unknown_codec() -> None:
    with pytest.raises(UnsupportedCodecError):
        compress(9, b"x")
    with pytest.raises(UnsupportedCodecError):
        decompress(9, b"x")
    assert decompress(0, memoryview(b"abc")) == b"abc"
    assert all(compression.has_codec(c) for c in CODECS)
    assert not compression.has_codec(5)


# ---------------------------------------------------------------- legacy message sets

MESSAGES = [(b"k0", b"v0"), (None, b"v1"), (b"k2", None), (None, None), (b"k4" * 100, b"v4" * 1000)]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1, 2, 3])
def test_legacy_round_trip(magic: int, codec: int) -> None:
    ts = [1000 + i for i in range(len(MESSAGES))]
    data = build_legacy_message_set(MESSAGES, magic=magic, base_offset=50, compression=codec, timestamps=ts)
    got = batches(data)
    assert len(got) == (len(MESSAGES) if codec == 0 else 1)
    assert all(b.magic == magic and b.leader_epoch is None for b in got)
    assert next_offset_after(got[-1]) == 55
    out = [r for b in got for r in decode_batch(b, TOPIC, PART)]
    assert [(r.key, r.value) for r in out] == MESSAGES
    assert [r.offset for r in out] == [50, 51, 52, 53, 54]
    assert [(r.serialized_key_size, r.serialized_value_size) for r in out][:4] == [
        (2, 2),
        (-1, 2),
        (2, -1),
        (-1, -1),
    ]
    if magic == 1:
        assert [(r.timestamp, r.timestamp_type) for r in out] == [(t, 0) for t in ts]
    else:
        assert {(r.timestamp, r.timestamp_type) for r in out} == {(NO_TIMESTAMP, NO_TIMESTAMP_TYPE)}
    assert all(r.headers == () and r.leader_epoch is None for r in out)


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_compressed_offsets_with_gaps(magic: int) -> None:
    # A compacted wrapper: the wrapper offset is the last inner offset.
    data = build_legacy_message_set(
        MESSAGES[:3], magic=magic, base_offset=1000, compression=1, offset_deltas=[0, 3, 7]
    )
    [b] = batches(data)
    assert (b.base_offset, b.last_offset, b.record_count) == (1007, 1007, -1)
    assert [r.offset for r in decode_batch(b, TOPIC, PART)] == [1000, 1003, 1007]
    assert next_offset_after(b) == 1008


def test_legacy_magic1_log_append_time_wrapper() -> None:
    data = build_legacy_message_set(
        MESSAGES[:2], magic=1, compression=2, timestamp_type=1, log_append_time=4242
    )
    out = decode_all(data)
    assert [(r.timestamp, r.timestamp_type) for r in out] == [(4242, 1), (4242, 1)]
    plain = build_legacy_message_set(MESSAGES[:1], magic=1, timestamp_type=1, timestamps=[77])
    assert [(r.timestamp, r.timestamp_type) for r in decode_all(plain)] == [(77, 1)]


def test_legacy_then_v2_in_one_record_set() -> None:
    # A partition upgraded mid-log serves both formats in one response.
    data = build_legacy_message_set(MESSAGES[:2], magic=1, base_offset=0, compression=1) + build_batch(
        [(b"new", b"format")], base_offset=2
    )
    assert [r.offset for r in decode_all(data)] == [0, 1, 2]


def test_legacy_crc_mismatch_and_truncation() -> None:
    data = build_legacy_message_set(MESSAGES[:2], magic=1, base_offset=20)
    bad = with_byte(data, 30, data[30] ^ 1)
    with pytest.raises(CorruptRecordError) as ei:
        batches(bad)
    assert "CRC-32" in str(ei.value) and WHERE.format(20) in str(ei.value)
    first_len = len(build_legacy_message_set(MESSAGES[:1], magic=1))
    for cut in range(first_len, len(data)):
        assert [b.base_offset for b in batches(data[:cut])] == [20]


def test_legacy_corrupt_wrapper_contents() -> None:
    inner = build_legacy_message_set(MESSAGES[:2], magic=1)

    def wrapper(payload: bytes, codec: int = 1, value_null: bool = False) -> bytes:
        body = struct.pack(">bbq", 1, codec, 0) + struct.pack(">i", -1)
        body += struct.pack(">i", -1) if value_null else struct.pack(">i", len(payload)) + payload
        return struct.pack(">qiI", 9, len(body) + 4, zlib.crc32(body)) + body

    for bad in (
        wrapper(compress(1, inner[:-3])),  # truncated inner message
        wrapper(compress(1, inner + b"\x00" * 5)),  # trailing garbage
        wrapper(b"", value_null=True),  # null wrapper value
        wrapper(compress(1, build_legacy_message_set(MESSAGES[:1], magic=1, compression=1))),  # nested
    ):
        [b] = batches(bad)
        with pytest.raises(CorruptRecordError, match=r"orders-3 at offset 9"):
            decode_batch(b, TOPIC, PART)
    [b] = batches(wrapper(b"not gzip"))
    with pytest.raises(CorruptRecordError, match="gzip"):
        decode_batch(b, TOPIC, PART)
    [b] = batches(wrapper(compress(1, b""), codec=1))
    assert decode_batch(b, TOPIC, PART) == []
    [b] = batches(wrapper(b"x", codec=6))
    with pytest.raises(UnsupportedCodecError, match=r"codec id 6.*offset 9"):
        decode_batch(b, TOPIC, PART)


def test_legacy_message_too_short_for_magic() -> None:
    body = struct.pack(">bb", 1, 0) + struct.pack(">ii", -1, -1)  # magic 1 without a timestamp
    data = struct.pack(">qiI", 4, len(body) + 4, zlib.crc32(body)) + body
    with pytest.raises(CorruptRecordError, match="too small for magic 1"):
        batches(data)


# ---------------------------------------------------------------- control batches & transactions


def test_control_batches() -> None:
    data = build_control_batch("commit", producer_id=7, base_offset=30) + build_control_batch(
        "abort", producer_id=8, base_offset=31
    )
    commit, abort = batches(data)
    assert commit.is_control and commit.is_transactional
    assert decode_batch(commit, TOPIC, PART) == []
    assert next_offset_after(commit) == 31 and next_offset_after(abort) == 32
    assert control_record_type(commit) == CONTROL_COMMIT
    assert control_record_type(abort) == CONTROL_ABORT
    [unknown] = batches(build_control_batch(5, producer_id=7))
    assert control_record_type(unknown) == 5
    with pytest.raises(ValueError):
        control_record_type(batches(build_batch([(b"k", b"v")]))[0])


def test_control_batch_compressed_and_corrupt() -> None:
    key = struct.pack(">hh", 0, 0)
    [b] = batches(build_batch([(key, b"\x00" * 6)], control=True, compression=1, producer_id=1))
    assert control_record_type(b) == CONTROL_ABORT
    [b] = batches(build_batch([(b"\x00", b"")], control=True, producer_id=1, base_offset=66))
    with pytest.raises(CorruptRecordError, match=r"control .*orders-3 at offset 66"):
        control_record_type(b)


def _txn_log() -> tuple[bytes, list[tuple[int, int]]]:
    # pid 1: committed txn; pid 2: aborted txn; pid 3: aborted, then a new
    # committed txn; plain non-transactional data interleaved.
    def data(pid: int, off: int, n: int = 2) -> bytes:
        recs = [(b"p%d" % pid, b"%d" % (off + i)) for i in range(n)]
        return build_batch(recs, base_offset=off, is_transactional=True, producer_id=pid, producer_epoch=0)

    log = b"".join(
        [
            data(1, 0),  # 0-1
            data(2, 2),  # 2-3 aborted
            build_batch([(None, b"plain4")], base_offset=4),
            data(3, 5),  # 5-6 aborted
            build_control_batch("commit", 1, base_offset=7),
            data(2, 8),  # 8-9 aborted (same txn)
            build_control_batch("abort", 2, base_offset=10),
            build_control_batch("abort", 3, base_offset=11),
            data(3, 12),  # 12-13 new txn, committed
            data(2, 14),  # 14-15 new txn of pid 2, committed
            build_control_batch("commit", 3, base_offset=16),
            build_control_batch("commit", 2, base_offset=17),
        ]
    )
    return log, [(2, 2), (3, 5)]


def test_aborted_transaction_filter() -> None:
    log, aborted = _txn_log()
    flt = AbortedTransactionFilter(aborted)
    kept: list[int] = []
    position = 0
    for b in batches(log):
        if not flt.should_skip(b):
            kept.extend(r.offset for r in decode_batch(b, TOPIC, PART))
        position = next_offset_after(b)
    assert kept == [0, 1, 4, 12, 13, 14, 15]
    assert position == 18


def test_aborted_filter_read_uncommitted_and_order() -> None:
    log, _ = _txn_log()
    # No aborted list: everything but the markers is kept.
    flt = AbortedTransactionFilter(None)
    kept = [r.offset for b in batches(log) if not flt.should_skip(b) for r in decode_batch(b, TOPIC, PART)]
    assert kept == [0, 1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 14, 15]
    # The aborted list may arrive unordered.
    flt = AbortedTransactionFilter([(3, 5), (2, 2)])
    kept = [r.offset for b in batches(log) if not flt.should_skip(b) for r in decode_batch(b, TOPIC, PART)]
    assert kept == [0, 1, 4, 12, 13, 14, 15]


def test_aborted_filter_names_aborted_records_it_let_through() -> None:
    """A broker that names no aborted transaction (Tansu) lets their records through; each ABORT
    marker after records the filter kept says so.  A broker that names them never causes a call."""
    log, aborted = _txn_log()
    unlisted: list[tuple[int, int]] = []
    flt = AbortedTransactionFilter([], lambda pid, offset: unlisted.append((pid, offset)))
    kept = [r.offset for b in batches(log) if not flt.should_skip(b) for r in decode_batch(b, TOPIC, PART)]
    assert kept == [0, 1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 14, 15]
    assert unlisted == [(2, 10), (3, 11)]  # pid 1's and the later transactions committed
    flt = AbortedTransactionFilter(aborted, lambda pid, offset: unlisted.append((pid, offset)))
    unlisted.clear()
    assert [r.offset for b in batches(log) if not flt.should_skip(b) for r in decode_batch(b, TOPIC, PART)] == [
        0, 1, 4, 12, 13, 14, 15]
    assert unlisted == []
    # An ABORT marker with no records of its transaction before it (they came in an earlier fetch,
    # or there were none) says nothing.
    flt = AbortedTransactionFilter([], lambda pid, offset: unlisted.append((pid, offset)))
    assert [flt.should_skip(b) for b in batches(build_control_batch("abort", 2, base_offset=10))] == [True]
    assert unlisted == []


def test_aborted_filter_batch_spanning_first_offset() -> None:
    # The entry's first offset lies inside the batch: the batch's *last* offset counts.
    batch = build_batch([(b"k", b"a"), (b"k", b"b")], base_offset=10, is_transactional=True, producer_id=5)
    flt = AbortedTransactionFilter([(5, 11)])
    [b] = batches(batch)
    assert flt.should_skip(b)
    # Non-transactional batches of the same producer id are never skipped.
    plain = build_batch([(b"k", b"c")], base_offset=12, producer_id=5)
    [p] = batches(plain)
    assert not flt.should_skip(p)


def test_record_error_hierarchy() -> None:
    assert issubclass(CorruptRecordError, RecordError)
    assert issubclass(UnsupportedCodecError, RecordError)


def test_writer_validates_arguments() -> None:
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v")], offset_deltas=[0, 1])
    with pytest.raises(ValueError):
        build_legacy_message_set([(b"k", b"v")], offset_deltas=[])
    # Records may be given as (key, value, headers) tuples too.
    out = decode_all(build_batch([(b"k", b"v", [("h", b"1")])]))
    assert out[0].headers == (("h", b"1"),)


def test_crc32c_is_over_attributes_to_end() -> None:
    data = build_batch([(b"k", b"v")])
    (stored,) = struct.unpack_from(">I", data, 17)
    assert stored == crc32c(data[21:])


def test_typical_sizes_use_two_byte_varints() -> None:
    # 300 records of 100-8000 bytes: offset deltas, lengths and timestamp deltas
    # of 64..8191 take the inline two-byte varint path.
    recs = [Record(b"k" * (100 + i), b"v" * (200 + 25 * i), (), 100 * i) for i in range(300)]
    for codec in (0, 3):
        out = decode_all(build_batch(recs, base_offset=10, compression=codec))
        assert [tuple(r) for r in out] == expected(recs, 10)


def test_odd_memoryview_formats() -> None:
    data = build_batch(RECORDS[:2], base_offset=3)
    assert [r.offset for r in decode_all(memoryview(data).cast("c"))] == [3, 4]


def test_short_complete_batches() -> None:
    # A legacy-sized length field (< 14) and a complete batch too short for a v2 header.
    with pytest.raises(CorruptRecordError, match=r"smaller than any valid batch \(orders-3 at offset 8\)"):
        batches(struct.pack(">qi", 8, 5) + b"\x00" * 4 + b"\x00" + b"\x00" * 40)
    short_v2 = struct.pack(">qiib", 8, 20, 0, 2) + b"\x00" * 15
    with pytest.raises(CorruptRecordError, match=r"v2 batch header \(orders-3 at offset 8\)"):
        batches(short_v2)
    # The same, but truncated: ignored.
    assert batches(struct.pack(">qiib", 8, 60, 0, 2) + b"\x00" * 15) == []


def test_legacy_field_lengths() -> None:
    def message(body: bytes) -> bytes:
        return struct.pack(">qiI", 2, len(body) + 4, zlib.crc32(body)) + body

    header = struct.pack(">bb", 0, 0)
    for body, match in [
        (header + struct.pack(">i", 50) + struct.pack(">i", -1), "invalid field length 50"),
        (header + struct.pack(">i", -7) + struct.pack(">i", -1), "invalid field length -7"),
        (header + struct.pack(">ii", -1, -1) + b"xx", "trailing bytes"),
        (header + struct.pack(">i", 6) + b"abcdef" + b"\x00\x00", "shorter than its fields"),
    ]:
        [b] = batches(message(body))
        with pytest.raises(CorruptRecordError, match=match):
            decode_batch(b, TOPIC, PART)


def test_lz4_legacy_header_errors() -> None:
    with pytest.raises(CorruptRecordError, match="LZ4 frame header"):
        decompress(3, b"not an lz4 frame", legacy_lz4=True)
    with pytest.raises(CorruptRecordError, match="truncated"):
        decompress(3, b"\x04\x22\x4d\x18\x48\x40\x00", legacy_lz4=True)  # content size flag, no size
    with pytest.raises(ValueError):
        build_legacy_message_set([(b"k", b"v")], magic=2)
