"""The application side of fetching: lazy decoding, corrupt batches, the byte bound."""

from __future__ import annotations

import pytest

from asyncconsumer.errors import CorruptRecordError
from asyncconsumer.managers.fetch_buffer import CompletedFetch, FetchBuffer
from asyncconsumer.protocol.record_writer import build_batch, build_control_batch
from asyncconsumer.structs import TopicPartition

TP = TopicPartition("orders", 3)


def batch(base: int, n: int) -> bytes:
    return build_batch([(None, b"v%d" % (base + i), ()) for i in range(n)], base_offset=base)


def corrupt(data: bytes) -> bytes:
    broken = bytearray(data)
    broken[-1] ^= 0xFF  # inside the CRC-covered records
    return bytes(broken)


def completed(*batches: bytes, position: int = 0) -> CompletedFetch:
    data = b"".join(batches)
    return CompletedFetch(TP, 0, position, memoryview(data), next_offset=-1, check_crcs=True, aborted=None)


def test_records_before_a_corrupt_batch_come_first_then_the_error_naming_the_offset() -> None:
    fetch = completed(batch(0, 3), corrupt(batch(3, 2)), batch(5, 2))
    assert [r.offset for r in fetch.take(100, 0)] == [0, 1, 2]
    assert not fetch.exhausted
    with pytest.raises(CorruptRecordError, match=r"orders-3 at offset 3"):
        fetch.take(100, 3)
    assert fetch.exhausted  # the caller refetches from offset 3; the good batch after it is not skipped silently


def test_take_honours_the_limit_and_the_position() -> None:
    fetch = completed(batch(0, 5), batch(5, 5))
    assert [r.offset for r in fetch.take(3, 2)] == [2, 3, 4]
    assert [r.offset for r in fetch.take(4, 5)] == [5, 6, 7, 8]
    assert [r.offset for r in fetch.take(4, 9)] == [9]
    assert fetch.exhausted


def test_buffer_accounts_bytes_and_signals_space() -> None:
    events: list[str] = []
    buffer = FetchBuffer(
        50, on_space=lambda tp, was_full: events.append(f"space {tp} {was_full}"), on_data=lambda: events.append("data")
    )
    first = completed(batch(0, 3))
    buffer.add(first)
    assert buffer.used_bytes == first.size and buffer.buffered_bytes(TP) == first.size and buffer.full
    assert events == ["data"]
    buffer.remove(first)
    assert buffer.used_bytes == 0 and not buffer.full and events == ["data", f"space {TP} True"]
    buffer.max_bytes = 10**6
    buffer.add(first)
    buffer.remove(first)
    assert events[-1] == f"space {TP} False"


def test_the_buffer_counts_each_response_frame_once_until_its_last_partition_goes() -> None:
    # Two partitions read from one response frame: the frame's bytes count from the first added to
    # the last gone, whichever goes first; the read-ahead shares are each partition's records.
    other = TopicPartition("orders", 4)
    one, two = batch(0, 3), batch(0, 5)
    frame = memoryview(b"header" + one + two + b"trailer")
    first = CompletedFetch(TP, 0, 0, frame[6 : 6 + len(one)], next_offset=-1, check_crcs=True, aborted=None)
    second = CompletedFetch(other, 0, 0, frame[6 + len(one) : -7], next_offset=-1, check_crcs=True, aborted=None)
    assert first.frame_id == second.frame_id and first.frame_bytes == len(frame)
    released: list[tuple[TopicPartition, bool]] = []
    buffer = FetchBuffer(len(frame), on_space=lambda tp, full: released.append((tp, full)), on_data=lambda: None)
    buffer.add(first)
    buffer.add(second)
    assert buffer.used_bytes == len(frame) and buffer.full
    assert (buffer.buffered_bytes(TP), buffer.buffered_bytes(other)) == (len(one), len(two))
    buffer.remove(first)  # the frame is still held by the second partition
    assert buffer.used_bytes == len(frame) and buffer.full and buffer.buffered_bytes(TP) == 0
    buffer.remove(second)
    assert buffer.used_bytes == 0 and not buffer.full
    assert released == [(TP, True), (other, True)]
    # Another frame (a copy) counts on its own.
    buffer.add(first)
    buffer.add(completed(two))
    assert buffer.used_bytes == len(frame) + len(two)


def test_a_corrupt_batch_says_where_to_seek_to_skip_it() -> None:
    fetch = completed(batch(0, 3), corrupt(batch(3, 4)), batch(7, 2))
    fetch.take(100, 0)
    with pytest.raises(CorruptRecordError) as info:
        fetch.take(100, 3)
    assert fetch.offset_after_batch(info.value.offset) == 7


def test_both_walks_report_an_aborted_transaction_the_broker_let_through() -> None:
    """read_committed with an answer that names no aborted transaction: the rows and the columns
    hand out the aborted records (as such a broker gives them) and the ABORT marker reports them."""
    data = b"".join([
        build_batch([(None, b"a0"), (None, b"a1")], is_transactional=True, producer_id=7, producer_epoch=0),
        build_control_batch("abort", 7, base_offset=2),
        batch(3, 1),
    ])
    for walk in ("rows", "columns"):
        unlisted: list[tuple[int, int]] = []
        fetch = CompletedFetch(TP, 0, 0, memoryview(data), next_offset=-1, check_crcs=True, aborted=[],
                               on_unlisted_abort=lambda pid, offset, seen=unlisted: seen.append((pid, offset)))
        if walk == "rows":
            assert [r.offset for r in fetch.take(100, 0)] == [0, 1, 3]
        else:
            assert fetch.take_columns(100, 0, allocate=None).count == 3
        assert unlisted == [(7, 2)], walk
