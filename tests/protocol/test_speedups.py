"""The compiled record decoder (``asyncconsumer._speedups``) against the pure-Python one.

Both decode the same fixtures and hypothesis-generated batches; the results must be identical
(values and types), and corrupt input must raise the same error class naming the same
topic-partition and offset.  Skipped, with the reason, when the extension is not built or is
disabled with ``ASYNCCONSUMER_NO_EXTENSION=1``.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import pickle
import runpy
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import ROOT
from support.strategies import nullable_bytes, records_with_deltas

from asyncconsumer.errors import CorruptRecordError, RecordError
from asyncconsumer.protocol import records
from asyncconsumer.protocol.record_writer import (
    DEFAULT_TIMESTAMP,
    Record,
    build_batch,
    build_control_batch,
    build_legacy_message_set,
    encode_varint,
)
from asyncconsumer.protocol.records import RecordBatch, decode_batch_py, iter_batches
from asyncconsumer.structs import ConsumerRecord, ShareConsumerRecord, TopicPartition


def _compiled() -> tuple[Callable[..., Any] | None, str]:
    if records.DECODER == "c":
        return records.decode_batch, ""
    if os.environ.get("ASYNCCONSUMER_NO_EXTENSION", "").strip().lower() not in ("", "0", "false", "no"):
        return None, "the compiled decoder is disabled (ASYNCCONSUMER_NO_EXTENSION is set)"
    try:
        importlib.import_module("asyncconsumer._speedups")
    except ImportError as exc:
        return None, (
            f"asyncconsumer._speedups is not built ({exc}); it is compiled by 'pip install -e .' "
            "when a C compiler and the Python headers are available"
        )
    return None, f"asyncconsumer._speedups is built but records.py selected {records.DECODER!r}"


decode_c, SKIP_REASON = _compiled()
pytestmark = pytest.mark.skipif(decode_c is None, reason=SKIP_REASON)

TOPIC, PART = "orders", 3
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def split(data: bytes | bytearray | memoryview, check_crcs: bool = True, **kw: Any) -> list[RecordBatch]:
    return list(iter_batches(data, topic=TOPIC, partition=PART, check_crcs=check_crcs, **kw))


def outcome(decode: Callable[..., Any], batch: RecordBatch) -> tuple[str, Any]:
    """("ok", records as plain tuples with their types) or ("error", class, location, message)."""
    try:
        out = decode(batch, TOPIC, PART)
    except RecordError as exc:
        return "error", (type(exc), exc.topic, exc.partition, exc.offset, str(exc))
    assert type(out) is list
    assert all(type(r) is ConsumerRecord for r in out)
    return "ok", [(tuple(r), tuple(type(v) for v in r)) for r in out]


def assert_same(data: bytes | bytearray | memoryview, *, same_message: bool = True, **kw: Any) -> int:
    """Both decoders agree on every batch of ``data``; returns the number of records."""
    count = 0
    assert decode_c is not None
    for batch in split(data, **kw):
        py = outcome(decode_batch_py, batch)
        c = outcome(decode_c, batch)
        if py[0] == "error" and not same_message:
            assert c[0] == "error", (py, c)
            assert c[1][:4] == py[1][:4], (py, c)  # class, topic, partition, offset
            assert c[1][4].startswith("record batch is corrupt") == py[1][4].startswith("record batch is corrupt")
        else:
            assert c == py
        if py[0] == "ok":
            count += len(py[1])
    return count


# ---------------------------------------------------------------- fixtures

HEADERS = (("trace-id", b"0af7651916cd43dd"), ("null", None), ("\u00e9t\u00e9", b""), ("trace-id", b"x"))
RECORDS = [
    Record(b"k0", b"v0", HEADERS, 0),
    Record(None, b"no key", (), 5),
    Record(b"tombstone", None, (("h", b"v"),), 7),
    Record(None, None),
    Record(b"", b""),
    Record(b"big" * 5000, b"v" * 70000, (("k" * 200, b"h" * 10000),), -3),
    Record(b"k", b"v", (), -(2**40)),
    Record(b"k", b"v", (), 2**40),
]


def fixtures() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for codec in (0, 1, 2, 3, 4):
        out[f"codec-{codec}"] = build_batch(RECORDS, base_offset=1000, compression=codec)
    out["snappy-raw"] = build_batch(RECORDS, compression=2, snappy_xerial=False)
    out["log-append-time"] = build_batch(RECORDS, timestamp_type=1, max_timestamp=1_800_000_000_000)
    out["leader-epoch-unknown"] = build_batch(RECORDS, partition_leader_epoch=-1)
    out["compaction-gaps"] = build_batch(RECORDS[:3], base_offset=100, offset_deltas=[0, 4, 6], last_offset_delta=9)
    out["emptied-by-compaction"] = build_batch([], base_offset=500, last_offset_delta=4)
    out["control"] = build_control_batch("commit", 7, base_offset=30) + build_control_batch("abort", 8)
    out["transactional"] = build_batch(RECORDS[:2], is_transactional=True, producer_id=9, producer_epoch=1)
    out["many-batches"] = b"".join(build_batch(RECORDS[:4], base_offset=10 * i, compression=i % 5) for i in range(10))
    out["huge-offsets"] = build_batch(RECORDS[:2], base_offset=2**62, base_timestamp=2**62)
    out["negative-timestamps"] = build_batch(RECORDS[:2], base_timestamp=-5)
    out["multibyte-varints"] = build_batch(
        [Record(b"k" * 300, b"v" * 20000, (), 100_000)], offset_deltas=[70_000], base_offset=1
    )
    many = [Record(b"%010d" % i, b"x" * 100, (), i) for i in range(3000)]
    out["3000-records"] = build_batch(many, base_offset=77)
    out["legacy-0"] = build_legacy_message_set([(b"k", b"v"), (None, None)], magic=0, base_offset=5)
    out["legacy-1-gzip"] = build_legacy_message_set(
        [(b"k", b"v"), (None, b"x")], magic=1, compression=1, timestamps=[1, 2]
    )
    out["legacy-then-v2"] = build_legacy_message_set([(b"a", b"b")], magic=1) + build_batch(
        [(b"new", b"format")], base_offset=1
    )
    return out


FIXTURES = fixtures()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_identical(name: str) -> None:
    data = FIXTURES[name]
    n = assert_same(data)
    assert n == sum(len(decode_batch_py(b, TOPIC, PART)) for b in split(data))


@pytest.mark.parametrize("wrap", ["bytes", "bytearray", "view-of-bytearray", "slice", "bounds"])
def test_buffer_kinds(wrap: str) -> None:
    data = FIXTURES["many-batches"] + FIXTURES["codec-0"]
    padded = b"JUNK" + data + b"TAIL"
    if wrap == "bytes":
        assert_same(data)
    elif wrap == "bytearray":
        assert_same(bytearray(data))
    elif wrap == "view-of-bytearray":  # what the consumer passes: views into a received frame
        assert_same(memoryview(bytearray(data)))
    elif wrap == "slice":
        assert_same(memoryview(padded)[4:-4])
    else:
        assert_same(padded, start=4, end=len(padded) - 4)


def test_records_are_real_consumer_records() -> None:
    assert decode_c is not None
    [batch] = split(FIXTURES["codec-0"])
    out = decode_c(batch, TOPIC, PART)
    r = out[0]
    assert type(r) is ConsumerRecord and isinstance(r, tuple)
    assert r.topic == TOPIC and r.partition == PART and r.offset == 1000 and r.leader_epoch == 0
    assert r.headers == HEADERS
    assert r._replace(value=b"new").value == b"new"
    assert r._asdict()["key"] == b"k0"
    assert pickle.loads(pickle.dumps(r)) == r
    assert r == decode_batch_py(batch, TOPIC, PART)[0] and hash(r) == hash(tuple(r))
    assert r.topic_partition == (TOPIC, PART)
    # Only atomic values inside: the records need no cyclic-GC tracking.
    assert not any(gc.is_tracked(x) for x in out)
    assert len(gc.get_referrers(r)) == 1  # the list


def test_no_reference_leaks() -> None:
    assert decode_c is not None
    topic, partition = "leak-" + "check", 10**6  # objects only this test holds
    good = split(FIXTURES["codec-0"] + FIXTURES["codec-3"])
    bad = split(build_batch([(b"k", b"v")], raw_records=encode_varint(50) + b"\x00" * 10))
    # (Not the record type's count: other threads of the test session may be decoding.)
    before = sys.getrefcount(topic), sys.getrefcount(partition)
    for _ in range(200):
        for b in good:
            decode_c(b, topic, partition)
        for b in bad:
            with pytest.raises(CorruptRecordError):
                decode_c(b, topic, partition)
    gc.collect()
    assert (sys.getrefcount(topic), sys.getrefcount(partition)) == before


# ---------------------------------------------------------------- corrupt input


def _rec(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


V = encode_varint
CORRUPT = {
    "count-too-high": (_rec(b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0)), 2),
    "count-too-low": (_rec(b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0)) * 2, 1),
    "key-past-end": (_rec(b"\x00" + V(0) + V(0) + V(50) + b"k" + V(1) + b"v" + V(0)), 1),
    "length-mismatch": (V(20) + b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0) + b"\x00" * 12, 1),
    "negative-length": (V(-3) + b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0), 1),
    "key-length-minus-2": (_rec(b"\x00" + V(0) + V(0) + V(-2) + V(1) + b"v" + V(0)), 1),
    "value-length-minus-5": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-5) + V(0)), 1),
    "negative-header-count": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(-3)), 1),
    "header-key-length": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(1) + V(-1) + V(0)), 1),
    "header-value-length": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(1) + V(1) + b"h" + V(-4)), 1),
    "header-key-past-end": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(1) + V(90)), 1),
    "varint-11-bytes": (b"\x80" * 12 + b"\x01", 1),
    "varint-past-end": (b"\x80\x80", 1),
    "empty-with-count": (b"", 1),
    "attributes-past-end": (V(1), 1),
    "huge-count": (_rec(b"\x00" + V(0) + V(0) + V(1) + b"k" + V(1) + b"v" + V(0)), 2**31 - 1),
    "huge-header-count": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(2**60)), 1),
    "invalid-utf8-header-key": (_rec(b"\x00" + V(0) + V(0) + V(-1) + V(-1) + V(1) + V(2) + b"\xff\xfe" + V(-1)), 1),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
@pytest.mark.parametrize("codec", [0, 1])
def test_corrupt_records_same_error(name: str, codec: int) -> None:
    raw, count = CORRUPT[name]
    if codec:
        from asyncconsumer.protocol.compression import compress

        raw = compress(codec, raw)
    data = build_batch([(b"k", b"v")], base_offset=60, raw_records=raw, record_count=count, compression=codec)
    assert_same(data)
    [batch] = split(data)
    try:
        decode_batch_py(batch, TOPIC, PART)
    except CorruptRecordError as exc:
        assert "(orders-3 at offset 60)" in str(exc)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_corrupt_compressed_payload_same_error(codec: int) -> None:
    data = build_batch([(b"k", b"v")], base_offset=4, compression=codec, raw_records=b"garbage-garbage-garbage")
    assert_same(data)


def test_values_beyond_64_bits_match_python() -> None:
    # A 10-byte varint whose last byte carries more than bit 63, and an offset past 2**63 - 1: the
    # compiled decoder hands these batches to the Python one (its ints do not overflow).
    big_delta = b"\x80" * 9 + b"\x7f"
    raw = _rec(b"\x00" + big_delta + V(0) + V(1) + b"k" + V(1) + b"v" + V(0))
    assert_same(build_batch([(b"k", b"v")], raw_records=raw))
    assert_same(build_batch([(b"k", b"v")], raw_records=raw, timestamp_type=1))
    raw = _rec(b"\x00" + V(0) + V(2**62) + V(1) + b"k" + V(1) + b"v" + V(0))
    assert_same(build_batch([(b"k", b"v")], raw_records=raw, base_offset=2**62))


# ---------------------------------------------------------------- hypothesis


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    recs, deltas = draw(records_with_deltas())
    return build_batch(
        recs,
        base_offset=draw(st.integers(0, 2**62)),
        base_timestamp=draw(st.integers(-(2**41), 2**50)),
        offset_deltas=deltas,
        last_offset_delta=(deltas[-1] if deltas else 0) + draw(st.integers(0, 5)),
        compression=draw(st.integers(0, 4)),
        snappy_xerial=draw(st.booleans()),
        timestamp_type=draw(st.integers(0, 1)),
        max_timestamp=DEFAULT_TIMESTAMP + 2**41,
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        control=draw(st.booleans()) and not recs,
    )


@SETTINGS
@given(data=st.lists(batches(), min_size=1, max_size=4), view=st.booleans())
def test_generated_batches_identical(data: list[bytes], view: bool) -> None:
    joined = b"".join(data)
    assert_same(memoryview(bytearray(joined)) if view else joined)


@SETTINGS
@given(
    msgs=st.lists(st.tuples(nullable_bytes, nullable_bytes), min_size=1, max_size=8),
    magic=st.sampled_from([0, 1]),
    codec=st.integers(0, 3),
)
def test_generated_legacy_identical(msgs: list[tuple[bytes | None, bytes | None]], magic: int, codec: int) -> None:
    assert_same(build_legacy_message_set(msgs, magic=magic, base_offset=3, compression=codec))


FUZZ = build_batch(
    [Record(b"key%d" % i, b"value" * i, (("h", b"v"), ("n", None)), i * 1000) for i in range(8)], base_offset=40
)


def damaged(flips: list[tuple[int, int]], cut: int, count: int | None) -> bytes:
    """FUZZ's records with bytes flipped (``(index, xor)``), ``cut`` bytes cut off, ``count`` declared."""
    body = bytearray(FUZZ[61:])
    for index, xor in flips:
        body[index - 61] ^= xor
    if cut:
        del body[-cut:]
    return build_batch([(b"k", b"v")], base_offset=40, raw_records=bytes(body), record_count=count)


@settings(max_examples=500, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(61, len(FUZZ) - 1), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 40),
    count=st.none() | st.integers(-2, 12),
)
def test_damaged_records_same_outcome(flips: list[tuple[int, int]], cut: int, count: int | None) -> None:
    # Damage the records section (CRC checks off), shorten it, lie about the count: both decoders
    # decode the same records or raise the same error class for the same batch.  When the damage
    # makes a read run past the batch, the Python decoder may read on into the next bytes of its
    # buffer before noticing, so only class and location are compared, not the wording.
    data = damaged(flips, cut, count)
    assert_same(data, check_crcs=False, same_message=False)
    assert_same(data + FUZZ, check_crcs=False, same_message=False)


# ---------------------------------------------------------------- the header scan


def scan_both(data: bytes) -> tuple[int, int, list[tuple[int, int]]]:
    """The compiled ``scan_batches`` (the one records.py selects) and the Python twin agree."""
    assert records.scan_batches is not records.scan_batches_py
    compiled = records.scan_batches(memoryview(bytearray(data)))
    assert compiled == records.scan_batches_py(memoryview(data))
    assert all(type(x) is int for x in compiled[:2]) and all(type(x) is int for e in compiled[2] for x in e)
    return compiled


@SETTINGS
@given(
    data=st.lists(batches(), min_size=0, max_size=4),
    legacy=st.booleans(),
    cut=st.integers(0, 80),
    flips=st.lists(st.tuples(st.integers(0, 80), st.integers(1, 255)), max_size=3),
)
def test_generated_headers_scan_identically(
    data: list[bytes], legacy: bool, cut: int, flips: list[tuple[int, int]]
) -> None:
    # Batches of every kind (legacy message sets among them), a truncated tail, damaged header
    # bytes (lengths, magic, offsets): both scanners stop, or read the same offsets and epochs.
    legacy_set = build_legacy_message_set([(b"k", b"v")], magic=1, base_offset=7) if legacy else b""
    joined = bytearray(b"".join(data) + legacy_set)
    for index, xor in flips:
        if index < len(joined):
            joined[index] ^= xor
    scan_both(bytes(joined[: max(0, len(joined) - cut)]))


def test_scan_reads_offsets_and_epochs_beyond_64_bits_as_python() -> None:
    # A base offset near 2**63 with a last offset delta past it: the next offset does not fit in
    # int64, and the compiled scan gives Python's exact sum instead of wrapping around.
    top = build_batch([(b"k", b"v")], base_offset=2**63 - 2, last_offset_delta=5, partition_leader_epoch=9)
    low = build_batch([(b"k", b"v")], base_offset=3, partition_leader_epoch=9)
    epoch = build_batch([(b"k", b"v")], base_offset=4, partition_leader_epoch=-1)
    assert scan_both(top) == (2**63 + 4, len(top), [(2**63 - 2, 9)])
    assert scan_both(low + epoch + low) == (4, 3 * len(low), [(3, 9), (4, -1), (3, 9)])
    assert scan_both(low + low) == (4, 2 * len(low), [(3, 9)])  # an epoch is noted where it changes
    assert scan_both(low[:-1]) == (-1, 0, [])


# ---------------------------------------------------------------- the switches


def test_environment_switch_forces_python_decoder() -> None:
    env = {**os.environ, "ASYNCCONSUMER_NO_EXTENSION": "1"}
    code = (
        "from asyncconsumer.protocol import records as r; "
        "print(r.DECODER, r.decode_batch is r.decode_batch_py, r.scan_batches is r.scan_batches_py)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["python", "True", "True"]


def test_build_skips_the_extension_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    import setuptools

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.append(kw))
    monkeypatch.setenv("ASYNCCONSUMER_NO_EXTENSION", "1")
    runpy.run_path(str(ROOT / "setup.py"))
    monkeypatch.setenv("ASYNCCONSUMER_NO_EXTENSION", "")
    runpy.run_path(str(ROOT / "setup.py"))
    assert seen[0]["ext_modules"] == []
    [ext] = seen[1]["ext_modules"]
    assert ext.name == "asyncconsumer._speedups" and ext.optional
    # one module from the files of speedups/, the shared header a dependency of each (a change to it
    # rebuilds them all); MANIFEST.in puts the folder in every sdist, also one built without it
    assert sorted(ext.sources) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "speedups").glob("*.c"))
    assert ext.depends == ["speedups/speedups.h"]
    assert "graft speedups" in (ROOT / "MANIFEST.in").read_text().splitlines()


def test_bind_rejects_a_record_type_with_fields() -> None:
    speedups = importlib.import_module("asyncconsumer._speedups")

    class WithDict(tuple):  # type: ignore[type-arg]
        pass

    with pytest.raises(TypeError):
        speedups.bind(WithDict, CorruptRecordError, decode_batch_py, records._decompress)


# ------------------------------------------------------------------ slot_fields(): the records' field getters


@pytest.mark.parametrize("cls", [ConsumerRecord, ShareConsumerRecord, TopicPartition])
def test_record_fields_read_as_member_descriptors_with_the_same_values(cls: type) -> None:
    """``record.value`` reads the tuple's item through a member descriptor (one load once the
    interpreter specializes it) instead of collections' ``_tuplegetter``: same values, same
    read-only fields, same docs, and every NamedTuple behaviour kept."""
    fields = cls._fields  # type: ignore[attr-defined]
    values = tuple(f"v{i}".encode() for i in range(len(fields)))
    record = cls(*values)
    for i, name in enumerate(fields):
        descriptor = cls.__dict__[name]
        assert type(descriptor).__name__ == "member_descriptor", name
        assert descriptor.__doc__ == f"Alias for field number {i}"
        assert getattr(record, name) is values[i] is record[i]
        with pytest.raises(AttributeError):
            setattr(record, name, b"other")
    assert record._replace(**{fields[0]: b"new"})[0] == b"new"  # type: ignore[attr-defined]
    assert record._asdict() == dict(zip(fields, values, strict=True))  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(record)) == record
    match record:
        case cls(first, second):  # type: ignore[misc]
            assert (first, second) == values[:2]


def test_slot_fields_rejects_classes_it_cannot_lay_out() -> None:
    speedups = importlib.import_module("asyncconsumer._speedups")

    class Extra(tuple):  # type: ignore[type-arg]
        _fields = ("a",)

    class NotTuple:
        _fields = ("a",)

    class NoNames(tuple):  # type: ignore[type-arg]
        __slots__ = ()
        _fields = (1,)

    for cls in (Extra, NotTuple, NoNames, 3):
        with pytest.raises(TypeError):
            speedups.slot_fields(cls)


# ------------------------------------------------------------------ ready(): the awaitable async for hands out


def _ready_twins() -> list[Callable[[Any], Any]]:
    from asyncconsumer.app import iterators

    return [importlib.import_module("asyncconsumer._speedups").ready, iterators.ready_py]


@pytest.mark.parametrize("value", [None, 0, "x", (1, 2), ((3,),)])
def test_ready_is_its_value_when_awaited_on_asyncio_and_trio(value: Any) -> None:
    import anyio

    from asyncconsumer.app import iterators

    assert iterators.ready is importlib.import_module("asyncconsumer._speedups").ready  # the compiled one in use

    async def main() -> list[Any]:
        return [await make(value) for make in _ready_twins()]

    for backend in ("asyncio", "trio"):
        got = anyio.run(main, backend=backend)
        assert got == [value, value] and all(g is value for g in got)


def test_ready_steps_as_a_returning_coroutine_does() -> None:
    for make in _ready_twins():
        value = (1, 2)  # a tuple arrives whole in StopIteration.value
        step = make(value).__await__()
        with pytest.raises(StopIteration) as info:
            next(step)
        assert info.value.value is value
        with pytest.raises(RuntimeError, match="await"):
            next(step)  # done after one step
        sent = make(value).__await__()
        with pytest.raises(StopIteration) as info:
            sent.send(None)
        assert info.value.value is value
        thrown = make(value).__await__()
        with pytest.raises(KeyError, match="boom"):
            thrown.throw(KeyError("boom"))
        closed = make(value)
        closed.close()  # nothing to clean up; an unawaited ready() is no error


def test_ready_holds_its_value_until_handed_out_and_no_longer() -> None:
    import anyio

    ready = importlib.import_module("asyncconsumer._speedups").ready
    value = object()
    before = sys.getrefcount(value)

    async def many() -> None:
        for _ in range(1000):
            assert await ready(value) is value
        unawaited = [ready(value) for _ in range(10)]
        assert sys.getrefcount(value) == before + 10
        del unawaited

    anyio.run(many)
    gc.collect()
    assert sys.getrefcount(value) == before


# ------------------------------------------------------------------ RecordStream: async for's common case in C


def _stream_scenarios() -> list[str]:
    return ["plain", "pause", "seek", "revoking", "other poller", "closed", "no chunk"]


def _run_stream_scenario(scenario: str, compiled: bool) -> list[Any]:
    """Hand out records of two chunks through ``aiter(consumer)`` (``compiled``: the RecordStream
    in C) or ``Consumer.__anext__`` (the Python reference), changing the consumer as ``scenario``
    says after the second record; what each step gave and the partition's bookkeeping after it."""
    import anyio

    from asyncconsumer import Consumer
    from asyncconsumer.app.collector import Chunk
    from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
    from asyncconsumer.structs import TopicPartition

    async def main() -> list[Any]:
        consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers="127.0.0.1:9")
        engine = consumer._new_engine()  # built, not running
        tp = TopicPartition("t", 0)
        state = PartitionState(tp, PartitionPhase.FETCHING, position=20)
        offsets = [0, 1, 3, 7, 8]  # gaps, as compaction leaves them
        recs = [ConsumerRecord("t", 0, o, 0, 0, b"k", b"v%d" % o, [], 1, 2, None) for o in offsets]
        consumer._chunks.extend([Chunk(state, recs[:3]), Chunk(state, recs[3:])])
        step = aiter(consumer) if compiled else None
        if compiled:
            assert type(step).__name__ == "RecordStream"
        out: list[Any] = []
        for n in range(6):
            if n == 2:
                if scenario == "pause":
                    state.pause()
                elif scenario == "seek":
                    state.epoch += 1
                elif scenario == "revoking":
                    state.revoking = True
                elif scenario == "other poller":
                    consumer._poll_owner.task = 12345
                elif scenario == "closed":
                    engine.closed = True
                elif scenario == "no chunk":
                    consumer._chunks.clear()
            awaitable = anext(step) if step is not None else Consumer.__anext__(consumer)
            if inspect.iscoroutine(awaitable):  # the slow path: a poll, not run here
                awaitable.close()
                out.append(("poll", state.consumed, [c.index for c in consumer._chunks]))
                break
            record = await awaitable
            out.append((record.offset, state.consumed, [c.index for c in consumer._chunks],
                        dict(consumer._collector.consumed)))
        return out

    return anyio.run(main)


@pytest.mark.parametrize("scenario", _stream_scenarios())
def test_record_stream_hands_out_what_the_python_anext_does(scenario: str) -> None:
    compiled = _run_stream_scenario(scenario, compiled=True)
    python = _run_stream_scenario(scenario, compiled=False)
    assert compiled == python
    if scenario == "plain":  # the fast path ran: every record, chunk ends included
        assert [step[0] for step in compiled] == [0, 1, 3, 7, 8, "poll"]
        assert [step[1] for step in compiled] == [1, 2, 20, 8, 20, 20]  # a chunk's end: its end position
    else:  # each change after the second record sends the third step to the poll
        assert [step[0] for step in compiled] == [0, 1, "poll"]


def _stream_steps(state: Any = None, change: Callable[[], None] = lambda: None) -> list[Any]:
    """Three steps of ``async for`` (the compiled RecordStream) over one chunk of four records of
    ``state`` (None: a fetching PartitionState), ``change()`` run before the second: each step's
    offset, or "poll" where the step fell back to the Python ``__anext__``."""
    import anyio

    from asyncconsumer import Consumer
    from asyncconsumer.app.collector import Chunk
    from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
    from asyncconsumer.structs import TopicPartition

    async def steps() -> list[Any]:
        consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers="127.0.0.1:9")
        consumer._new_engine()
        chunk_state = state or PartitionState(TopicPartition("t", 0), PartitionPhase.FETCHING, position=4)
        recs = [ConsumerRecord("t", 0, o, 0, 0, b"k", b"v", [], 1, 2, None) for o in range(4)]
        consumer._chunks.append(Chunk(chunk_state, recs))
        stream = aiter(consumer)
        assert type(stream).__name__ == "RecordStream"
        out: list[Any] = []
        for n in range(3):
            if n == 1:
                change()
            awaitable = anext(stream)
            if inspect.iscoroutine(awaitable):
                awaitable.close()
                out.append("poll")
                break
            out.append((await awaitable).offset)
        return out

    return anyio.run(steps)


def _steps_with_attribute_made_true(cls: type, name: str) -> list[Any]:
    """:func:`_stream_steps` with ``cls.name`` made a property that is always True after the first
    record (the class changed at run time), put back afterwards."""
    original = cls.__dict__[name]
    try:
        return _stream_steps(change=lambda: setattr(cls, name, property(lambda self: True)))
    finally:
        setattr(cls, name, original)


def test_record_stream_reads_the_partition_state_by_slot_only_for_its_own_unchanged_class() -> None:
    """The C fast path reads PartitionState's fields straight from their slots.  A subclass that
    makes a field a property, and the class itself changed after the first record, must be seen
    as the Python reference sees them: the property's and the new descriptor's values count."""
    from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
    from asyncconsumer.structs import TopicPartition

    class AlwaysPaused(PartitionState):
        __slots__ = ()

        @property  # type: ignore[misc]
        def paused(self) -> bool:
            return True

        @paused.setter
        def paused(self, value: bool) -> None:
            pass

    tp = TopicPartition("t", 0)
    assert _stream_steps(PartitionState(tp, PartitionPhase.FETCHING, position=4)) == [0, 1, 2]
    assert _stream_steps(AlwaysPaused(tp, PartitionPhase.FETCHING, position=4)) == ["poll"]

    assert _steps_with_attribute_made_true(PartitionState, "revoking") == [0, "poll"]
    assert _stream_steps() == [0, 1, 2]


def test_record_stream_reads_the_engine_by_slot_only_while_its_class_is_unchanged() -> None:
    """``engine.closed`` (and ``owner.task``) are read from their slots too (LoopCore keeps
    ``closed`` in one): a class changed after the first record (here ``closed`` made a property
    of the engine's base, as a class patched at run time would be) is seen as Python sees it."""
    from asyncconsumer.engine.core import LoopCore

    assert _steps_with_attribute_made_true(LoopCore, "closed") == [0, "poll"]
    assert _stream_steps() == [0, 1, 2]


def test_record_stream_hands_out_its_awaitable_again_only_once_nobody_else_holds_it() -> None:
    """The C fast path keeps the last awaitable it handed out and fills it again for the next
    record when only the stream still holds it (awaited and dropped): never one that someone holds."""
    import anyio

    from asyncconsumer import Consumer
    from asyncconsumer.app.collector import Chunk
    from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
    from asyncconsumer.structs import TopicPartition

    async def main() -> None:
        consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers="127.0.0.1:9")
        consumer._new_engine()
        state = PartitionState(TopicPartition("t", 0), PartitionPhase.FETCHING, position=8)
        recs = [ConsumerRecord("t", 0, o, 0, 0, b"k", b"v", [], 1, 2, None) for o in range(8)]
        consumer._chunks.append(Chunk(state, recs))
        stream = aiter(consumer)

        held = anext(stream)
        assert (await held).offset == 0
        second = anext(stream)  # the first is still held here: a new one
        assert second is not held
        assert (await second).offset == 1
        with pytest.raises(RuntimeError, match="already awaited"):
            await held  # not filled again behind its holder's back
        ident = id(second)
        del second
        # Had the stream let the second go, this same-sized object would take its memory.
        blocker = importlib.import_module("asyncconsumer._speedups").ready(None)
        third = anext(stream)  # the second was awaited and dropped: the same object again
        assert id(third) == ident and id(blocker) != ident
        assert (await third).offset == 2
        pending = anext(stream)  # handed out, never awaited, still held: its record stays its own
        fourth = anext(stream)
        assert fourth is not pending
        assert (await fourth).offset == 4 and (await pending).offset == 3
        del pending, fourth, third, held, blocker
        assert [(await anext(stream)).offset for _ in range(3)] == [5, 6, 7]
        assert state.consumed == 8  # the last record of the chunk (the Python path) ends it

    anyio.run(main)


def test_record_stream_falls_back_for_objects_it_does_not_know() -> None:
    import anyio

    from asyncconsumer.app.client import PollOwner
    from asyncconsumer.app.collector import FastPath
    from asyncconsumer.app.iterators import RecordStream
    from asyncconsumer.app.iterators import ready as iterators_ready

    class Plain:
        pass

    class Running:
        closed = False

    async def main() -> None:
        from collections import deque

        calls: list[Any] = []

        def fallback() -> Any:
            calls.append("fallback")
            return iterators_ready("fallback")

        fast = FastPath(deque([Plain()]), PollOwner())
        fast.engine = Running()  # type: ignore[assignment]
        stream = RecordStream(fast, fallback)  # not a Chunk: the Python method decides
        assert await anext(stream) == "fallback" and calls == ["fallback"]

    anyio.run(main)
