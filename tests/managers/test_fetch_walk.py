"""A row read's walk over a fetched record set: the compiled walk (``decode_next``, a batch at a
time straight from the bytes) hands out what the Python walk (``iter_batches``, a ``RecordBatch``
a batch) does, record for record and error for error, whatever the record set holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncconsumer.errors import CorruptRecordError, RecordError
from asyncconsumer.managers import fetch_buffer
from asyncconsumer.managers.fetch_buffer import CompletedFetch
from asyncconsumer.protocol import records as records_module
from asyncconsumer.protocol.compression import CODEC_GZIP, CODEC_SNAPPY
from asyncconsumer.protocol.record_writer import build_batch, build_control_batch, build_legacy_message_set
from asyncconsumer.structs import TopicPartition

pytestmark = pytest.mark.skipif(records_module.decode_next is None, reason="the compiled decoder is not in use")

TP = TopicPartition("orders", 3)


def plain(base: int, n: int, **kwargs: Any) -> bytes:
    return build_batch([(b"k%d" % (base + i), b"v%d" % (base + i), ()) for i in range(n)], base_offset=base, **kwargs)


def mixed() -> list[bytes]:
    """Every kind of batch a fetch may carry, in offset order: 0-29."""
    return [
        plain(0, 3),
        build_batch([(None, b"v3", (("h", b"x"), ("h", None))), (b"k4", None, ())], base_offset=3,
                    partition_leader_epoch=7),
        plain(5, 2, compression=CODEC_GZIP),
        build_control_batch("commit", 9, base_offset=7),
        plain(8, 2, is_transactional=True, producer_id=9, producer_epoch=0),
        plain(10, 1, timestamp_type=1, max_timestamp=1_800_000_000_000),  # LogAppendTime
        build_legacy_message_set([(b"k11", b"v11"), (None, b"v12")], base_offset=11),
        plain(13, 2, compression=CODEC_SNAPPY),
        plain(15, 1, partition_leader_epoch=-1),
        build_batch([(b"k%d" % i, b"v%d" % i) for i in (16, 18)], base_offset=16, offset_deltas=[0, 2]),  # a gap
        *(plain(offset, 1) for offset in range(19, 30)),  # one record a batch, as at low rates
    ]


def walk(data: bytes, position: int, limit: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Everything one CompletedFetch hands out from ``position`` in takes of ``limit``: each take's
    records, or the error it raised (the walk's end)."""
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(fetch_buffer, "decode_next", None)
        fetch = CompletedFetch(TP, 0, position, memoryview(data), next_offset=-1, check_crcs=True, aborted=None)
        assert (fetch._walk is not None) is compiled
        taken: list[Any] = []
        while not fetch.exhausted:
            try:
                got = fetch.take(limit, position)
            except RecordError as exc:
                taken.append((type(exc), str(exc), exc.offset))
                break
            taken.append(got)
            if got:
                position = got[-1].offset + 1
        return taken


def both(data: bytes, position: int, limit: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    python = walk(data, position, limit, False, monkeypatch)
    compiled = walk(data, position, limit, True, monkeypatch)
    assert compiled == python
    return compiled


@pytest.mark.parametrize("position", [0, 1, 3, 7, 8, 11, 12, 17, 29])
@pytest.mark.parametrize("limit", [1, 2, 500])
def test_every_kind_of_batch_from_any_position(position: int, limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = both(b"".join(mixed()), position, limit, monkeypatch)
    offsets = [r.offset for chunk in taken for r in chunk]
    assert offsets == [o for o in range(30) if o >= position and o not in (7, 17)]  # the marker, the gap


def test_a_truncated_trailing_batch_ends_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"".join(mixed()[:2]) + plain(5, 3)[:-4]
    taken = both(data, 0, 500, monkeypatch)
    assert [r.offset for chunk in taken for r in chunk] == [0, 1, 2, 3, 4]


def corrupt(data: bytes) -> bytes:
    broken = bytearray(data)
    broken[-1] ^= 0xFF  # inside the CRC-covered records
    return bytes(broken)


def bad_length(data: bytes) -> bytes:
    broken = bytearray(data)
    broken[8:12] = (10).to_bytes(4, "big")  # shorter than a v2 header
    return bytes(broken)


@pytest.mark.parametrize("spoil", [corrupt, bad_length])
@pytest.mark.parametrize("limit", [1, 500])
def test_a_bad_batch_raises_the_same_error_after_the_records_before_it(
    spoil: Any, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = mixed()
    batches[8] = spoil(batches[8])  # offset 15
    taken = both(b"".join(batches), 0, limit, monkeypatch)
    assert [r.offset for chunk in taken[:-1] for r in chunk] == [o for o in range(15) if o != 7]
    error, message, offset = taken[-1]
    assert issubclass(error, CorruptRecordError) and offset == 15 and "orders-3" in message


def test_a_record_the_compiled_parser_refuses_is_the_python_decoders_to_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose CRC is right but whose records do not parse (a count one too many): the
    compiled walk leaves it to the Python walk, whose decoder says what is wrong."""
    good = plain(0, 2)
    batch = build_batch([(b"k0", b"v0"), (b"k1", b"v1")], record_count=3)
    taken = both(good + build_batch([], base_offset=2, raw_records=batch[61:], record_count=3,
                                    last_offset_delta=2), 0, 500, monkeypatch)
    assert [r.offset for r in taken[0]] == [0, 1]
    assert issubclass(taken[-1][0], CorruptRecordError)


def test_the_compiled_walk_needs_no_record_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain batches go straight from the bytes: ``iter_batches`` is not called for them (it is
    for a compressed one)."""
    calls: list[int] = []
    real = records_module.iter_batches

    def counting(*args: Any, **kwargs: Any) -> Iterator[Any]:
        calls.append(kwargs.get("start", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(records_module, "iter_batches", counting)
    batches = [plain(0, 2), plain(2, 2, compression=CODEC_GZIP), plain(4, 2)]
    fetch = CompletedFetch(TP, 0, 0, memoryview(b"".join(batches)), next_offset=-1, check_crcs=True, aborted=None)
    assert [r.offset for r in fetch.take(500, 0)] == [0, 1, 2, 3, 4, 5]
    assert calls == [len(batches[0])]


def test_read_committed_walks_in_python() -> None:
    fetch = CompletedFetch(TP, 0, 0, memoryview(plain(0, 2)), next_offset=-1, check_crcs=True, aborted=[])
    assert fetch._walk is None
    assert [r.offset for r in fetch.take(500, 0)] == [0, 1]


def test_switching_to_the_columns_and_back_restarts_the_compiled_walk_at_the_position() -> None:
    data = b"".join(plain(base, 2) for base in range(0, 10, 2))
    fetch = CompletedFetch(TP, 0, 0, memoryview(data), next_offset=-1, check_crcs=True, aborted=None)
    assert [r.offset for r in fetch.take(3, 0)] == [0, 1, 2]
    columns = fetch.take_columns(2, 3, allocate=None)  # the rest of the batch at the position: offset 3
    assert columns.count == 1
    assert [r.offset for r in fetch.take(500, 4)] == [4, 5, 6, 7, 8, 9]


# -- the share consumer's read of a whole record set ------------------------------------------------


def read_set(data: bytes, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], bool]:
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(records_module, "decode_next", None)
        read = records_module.decode_record_set(data, topic=TP.topic, partition=TP.partition)
    failed = [(type(error), str(error), error.offset, before) for error, before in read.failed]
    return read.records, failed, read.stopped


def read_both(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], bool]:
    python = read_set(data, False, monkeypatch)
    compiled = read_set(data, True, monkeypatch)
    assert compiled == python
    return compiled


def test_a_record_set_reads_alike_in_both_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    got, failed, stopped = read_both(b"".join(mixed()), monkeypatch)
    assert [r.offset for r in got] == [o for o in range(30) if o not in (7, 17)]
    assert failed == [] and not stopped
    assert got == [r for chunk in both(b"".join(mixed()), 0, 500, monkeypatch) for r in chunk]


def test_a_record_set_read_goes_past_a_bad_batch_whose_length_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong CRC: the batch is named (with the records before it) and the read goes on after it."""
    batches = mixed()
    batches[8] = corrupt(batches[8])  # offset 15
    got, failed, stopped = read_both(b"".join(batches), monkeypatch)
    assert [r.offset for r in got] == [o for o in range(30) if o not in (7, 15, 17)]
    ((error, _, offset, before),) = failed
    assert issubclass(error, CorruptRecordError) and offset == 15 and before == 14 and not stopped


def test_a_record_set_read_stops_at_a_batch_whose_length_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mixed()
    batches[8] = bad_length(batches[8])
    got, failed, stopped = read_both(b"".join(batches), monkeypatch)
    assert [r.offset for r in got] == [o for o in range(15) if o != 7]
    assert [(f[0], f[2], f[3]) for f in failed] == [(CorruptRecordError, 15, 14)] and stopped


def test_a_record_set_read_ends_at_a_truncated_trailing_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    got, failed, stopped = read_both(b"".join(mixed()[:2]) + plain(5, 3)[:-4], monkeypatch)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4] and failed == [] and not stopped


# -- several batches a call ---------------------------------------------------------------------


def test_decode_next_gathers_whole_plain_batches_up_to_max_records() -> None:
    decode_next = records_module.decode_next
    assert decode_next is not None
    batches = [plain(0, 3), plain(3, 1), build_control_batch("commit", 9, base_offset=4), plain(5, 2),
               plain(7, 2, compression=CODEC_GZIP), plain(9, 1)]
    data = b"".join(batches)
    ends = [sum(map(len, batches[: i + 1])) for i in range(len(batches))]

    def offsets(got: Any) -> Any:
        return None if got is None else ([r.offset for r in got[0]] if got[0] is not None else None, got[1])

    assert offsets(decode_next(data, 0, 0, True, TP.topic, TP.partition)) == ([0, 1, 2], ends[0])  # one batch
    assert offsets(decode_next(data, 0, 0, True, TP.topic, TP.partition, 4)) == ([0, 1, 2, 3], ends[1])
    assert offsets(decode_next(data, 0, 0, True, TP.topic, TP.partition, 5)) == ([0, 1, 2, 3, 5, 6], ends[3])
    # it stops before the compressed batch, which the next call leaves to the Python walk
    assert offsets(decode_next(data, 0, 2, True, TP.topic, TP.partition, 100)) == ([0, 1, 2, 3, 5, 6], ends[3])
    assert decode_next(data, ends[3], 0, True, TP.topic, TP.partition, 100) is None
    assert offsets(decode_next(data, ends[4], 0, True, TP.topic, TP.partition, 100)) == ([9], ends[5])
    assert offsets(decode_next(data, ends[5], 0, True, TP.topic, TP.partition, 100)) == (None, ends[5])
    # before a corrupt batch and a truncated one alike: what it has, then the Python walk's turn or the end
    spoilt = plain(0, 2) + corrupt(plain(2, 2))
    assert offsets(decode_next(spoilt, 0, 0, True, TP.topic, TP.partition, 100)) == ([0, 1], len(plain(0, 2)))
    assert decode_next(spoilt, len(plain(0, 2)), 0, True, TP.topic, TP.partition, 100) is None
    cut = plain(0, 2) + plain(2, 2)[:-3]
    assert offsets(decode_next(cut, 0, 0, True, TP.topic, TP.partition, 100)) == ([0, 1], len(plain(0, 2)))


def test_a_take_of_one_record_batches_is_one_compiled_call(monkeypatch: pytest.MonkeyPatch) -> None:
    real = records_module.decode_next
    assert real is not None
    calls: list[int] = []

    def counting(*args: Any) -> Any:
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(records_module, "decode_next", counting)
    data = b"".join(plain(offset, 1) for offset in range(100))
    fetch = CompletedFetch(TP, 0, 0, memoryview(data), next_offset=-1, check_crcs=True, aborted=None)
    assert [r.offset for r in fetch.take(60, 0)] == list(range(60))
    assert calls == [60]
    assert [r.offset for r in fetch.take(500, 60)] == list(range(60, 100))
    assert calls == [60, 500, 460]  # the last answers the end


@pytest.mark.parametrize("limit", [1, 2, 500])
def test_a_later_batch_starting_before_the_position_is_not_gathered_unfiltered(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offsets that go back between batches (a damaged base offset, outside the CRC): the records
    of a later batch before the position are dropped as the first batch's are."""
    data = plain(10, 1) + plain(4, 3) + plain(20, 2)
    taken = both(data, 5, limit, monkeypatch)
    # a take of one moves the position past 10 first, so the batch at 4-6 is then all behind it
    assert [r.offset for chunk in taken for r in chunk] == ([10, 20, 21] if limit == 1 else [10, 5, 6, 20, 21])


_KINDS = st.sampled_from(["plain", "plain", "plain", "gzip", "control", "legacy", "corrupt"])


@st.composite
def record_sets(draw: st.DrawFn) -> bytes:
    """Batches of every kind with base offsets that mostly rise but may go back (as a damaged
    base offset, outside the CRC, makes them)."""
    out = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 8))):
        kind, n = draw(_KINDS), draw(st.integers(1, 4))
        offset = max(0, offset + draw(st.integers(-6, 3)))
        if kind == "control":
            out.append(build_control_batch("commit", 9, base_offset=offset))
            n = 1
        elif kind == "legacy":
            out.append(build_legacy_message_set([(b"k", b"v%d" % i) for i in range(n)], base_offset=offset))
        else:
            batch = plain(offset, n, compression=CODEC_GZIP) if kind == "gzip" else plain(offset, n)
            out.append(corrupt(batch) if kind == "corrupt" else batch)
        offset += n
    return b"".join(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=record_sets(), position=st.integers(0, 30), limit=st.sampled_from([1, 2, 3, 500]))
def test_both_walks_agree_on_any_record_set_position_and_limit(
    data: bytes, position: int, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = both(data, position, limit, monkeypatch)
    assert all(r.offset >= position for chunk in taken if isinstance(chunk, list) for r in chunk)
