"""Property tests: whatever the writer produces, the reader gives back exactly."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import nullable_bytes, records_with_deltas

from asyncconsumer.errors import RecordError
from asyncconsumer.protocol.record_writer import (
    DEFAULT_TIMESTAMP,
    Record,
    build_batch,
    build_control_batch,
    build_legacy_message_set,
)
from asyncconsumer.protocol.records import (
    AbortedTransactionFilter,
    decode_batch,
    iter_batches,
    next_offset_after,
)

TOPIC, PART = "t", 0
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batch_specs(draw: st.DrawFn) -> dict[str, object]:
    recs, deltas = draw(records_with_deltas())
    return {
        "records": recs,
        "offset_deltas": deltas,
        "compression": draw(st.integers(0, 4)),
        "snappy_xerial": draw(st.booleans()),
        "timestamp_type": draw(st.integers(0, 1)),
        "partition_leader_epoch": draw(st.integers(-1, 2**31 - 1)),
        "extra_last_delta": draw(st.integers(0, 5)),
    }


def build(spec: dict[str, object], base_offset: int) -> bytes:
    recs: list[Record] = spec["records"]  # type: ignore[assignment]
    deltas: list[int] = spec["offset_deltas"]  # type: ignore[assignment]
    last = (deltas[-1] if deltas else 0) + spec["extra_last_delta"]  # type: ignore[operator]
    return build_batch(
        recs,
        base_offset=base_offset,
        offset_deltas=deltas,
        last_offset_delta=last,
        compression=spec["compression"],  # type: ignore[arg-type]
        snappy_xerial=spec["snappy_xerial"],  # type: ignore[arg-type]
        timestamp_type=spec["timestamp_type"],  # type: ignore[arg-type]
        max_timestamp=DEFAULT_TIMESTAMP + 2**41,
        partition_leader_epoch=spec["partition_leader_epoch"],  # type: ignore[arg-type]
    )


@SETTINGS
@given(specs=st.lists(batch_specs(), min_size=1, max_size=4), start=st.integers(0, 2**62), view=st.booleans())
def test_round_trip(specs: list[dict[str, object]], start: int, view: bool) -> None:
    parts = []
    want = []
    offset = start
    for spec in specs:
        parts.append(build(spec, offset))
        epoch = spec["partition_leader_epoch"]
        for r, d in zip(spec["records"], spec["offset_deltas"], strict=True):  # type: ignore[call-overload]
            ts = DEFAULT_TIMESTAMP + (2**41 if spec["timestamp_type"] else r.timestamp_delta)
            want.append(
                (
                    TOPIC,
                    PART,
                    offset + d,
                    ts,
                    spec["timestamp_type"],
                    r.key,
                    r.value,
                    -1 if r.key is None else len(r.key),
                    -1 if r.value is None else len(r.value),
                    r.headers,
                    None if epoch == -1 else epoch,
                )
            )
        deltas: list[int] = spec["offset_deltas"]  # type: ignore[assignment]
        offset += (deltas[-1] if deltas else 0) + spec["extra_last_delta"] + 1  # type: ignore[operator]
    data = b"".join(parts)
    got: list[tuple[object, ...]] = []
    position = start
    for b in iter_batches(memoryview(data) if view else data, topic=TOPIC, partition=PART):
        got.extend(tuple(r) for r in decode_batch(b, TOPIC, PART))
        position = next_offset_after(b)
    assert got == want
    assert position == offset


@SETTINGS
@given(specs=st.lists(batch_specs(), min_size=1, max_size=3), cut=st.integers(0, 2**20))
def test_truncation_yields_a_prefix(specs: list[dict[str, object]], cut: int) -> None:
    parts = [build(spec, 0) for spec in specs]
    data = b"".join(parts)
    cut %= len(data) + 1
    whole = 0
    total = 0
    for p in parts:
        total += len(p)
        if total <= cut:
            whole += 1
    got = list(iter_batches(data[:cut], topic=TOPIC, partition=PART))
    assert len(got) == whole
    for b in got:
        decode_batch(b, TOPIC, PART)


@SETTINGS
@given(
    msgs=st.lists(st.tuples(nullable_bytes, nullable_bytes), min_size=1, max_size=8),
    magic=st.sampled_from([0, 1]),
    codec=st.integers(0, 3),
    base=st.integers(0, 2**40),
)
def test_legacy_round_trip(
    msgs: list[tuple[bytes | None, bytes | None]], magic: int, codec: int, base: int
) -> None:
    data = build_legacy_message_set(msgs, magic=magic, base_offset=base, compression=codec)
    batches = list(iter_batches(data, topic=TOPIC, partition=PART))
    out = [r for b in batches for r in decode_batch(b, TOPIC, PART)]
    assert [(r.key, r.value) for r in out] == msgs
    assert [r.offset for r in out] == list(range(base, base + len(msgs)))
    assert next_offset_after(batches[-1]) == base + len(msgs)


def _fuzz_target() -> bytes:
    recs = [Record(b"key%d" % i, b"value" * i, (("h", b"v"), ("n", None)), i) for i in range(6)]
    return b"".join(
        [
            build_batch(recs, base_offset=0),
            build_batch(recs, base_offset=6, compression=1),
            build_batch(recs, base_offset=12, compression=2),
            build_batch(recs, base_offset=18, compression=3),
            build_batch(recs, base_offset=24, compression=4),
            build_control_batch("abort", 5, base_offset=30),
            build_legacy_message_set([(b"k", b"v")] * 3, magic=1, base_offset=31, compression=1),
            build_legacy_message_set([(b"k", b"v")] * 2, magic=0, base_offset=34),
        ]
    )


FUZZ_DATA = _fuzz_target()


@settings(max_examples=400, deadline=None)
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(FUZZ_DATA) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(FUZZ_DATA)),
)
def test_corrupted_input_raises_only_record_errors(flips: list[tuple[int, int]], cut: int) -> None:
    # With CRC checks off, damaged bytes reach the decoder: it must fail with a
    # RecordError (never IndexError, struct.error, ...) or decode something.
    data = bytearray(FUZZ_DATA)
    for index, xor in flips:
        data[index] ^= xor
    flt = AbortedTransactionFilter([(5, 0)])
    try:
        for b in iter_batches(bytes(data[:cut]), topic=TOPIC, partition=PART, check_crcs=False):
            if b.magic == 2:
                flt.should_skip(b)
            decode_batch(b, TOPIC, PART)
    except RecordError:
        pass


@settings(max_examples=200, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, len(FUZZ_DATA) - 1), st.integers(1, 255)), min_size=1))
def test_crc_catches_damage(flips: list[tuple[int, int]]) -> None:
    data = bytearray(FUZZ_DATA)
    for index, xor in flips:
        data[index] ^= xor
    try:
        for b in iter_batches(bytes(data), topic=TOPIC, partition=PART):
            decode_batch(b, TOPIC, PART)
    except RecordError:
        pass
