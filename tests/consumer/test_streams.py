"""``PartitionStream`` on its own (no broker): what counts as processed, and how a stream ends."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from asyncconsumer import PartitionStream
from asyncconsumer.app.streams import PartitionStreams
from asyncconsumer.managers.subscription import PartitionPhase, PartitionState
from asyncconsumer.structs import ConsumerRecord, TopicPartition

pytestmark = pytest.mark.anyio

TP = TopicPartition("t", 0)


def record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(TP.topic, TP.partition, offset, 0, 0, None, b"v", 0, 1, ())


def new_stream(offsets: range, capacity: int = 10) -> tuple[PartitionStream[bytes, bytes], PartitionState]:
    # The records in a stream were taken from the buffer: the position is past them.
    state = PartitionState(TP, PartitionPhase.FETCHING, position=offsets.stop, fetch_offset=offsets.stop,
                           consumed=offsets.start, processed=offsets.start)
    stream: PartitionStream[bytes, bytes] = PartitionStream(TP, state, capacity)
    stream.pending.extend(record(o) for o in offsets)
    stream.push()
    return stream, state


async def test_a_record_is_processed_when_the_next_one_is_asked_for() -> None:
    stream, state = new_stream(range(5, 8))
    first = await stream.__anext__()
    assert first.offset == 5
    assert state.consumed == 5  # received, still being worked on: not covered by a commit
    assert not stream.drained
    await stream.__anext__()
    assert state.consumed == 6  # asking for offset 6 means done with 5
    await stream.__anext__()
    assert state.consumed == 7 and not stream.drained  # 7 is in hand
    stream.end()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert state.consumed == 8  # done with the last one
    assert stream.drained


async def test_a_record_taken_before_a_seek_moves_nothing_when_it_is_processed_after_it() -> None:
    """A seek back while a reader works on a record: finishing that record must not move what
    commit() commits past the new position (it used to: records from there on were skipped)."""
    stream, state = new_stream(range(10, 13))
    await stream.__anext__()  # 10 in hand
    state.set_position(5)  # consumer.seek(tp, 5): position and consumed are 5
    await stream.__anext__()  # done with 10, taken before the seek
    assert state.consumed == 5 and state.position == 5


async def test_drained_once_the_reader_waits_for_more() -> None:
    stream, state = new_stream(range(0, 2))
    async with anyio.create_task_group() as tg:
        got: list[int] = []

        async def reader() -> None:
            async for r in stream:
                got.append(r.offset)

        tg.start_soon(reader)
        with anyio.fail_after(5):
            while not stream.drained:  # noqa: ASYNC110 (the reader task drains it)
                await anyio.sleep(0.001)
        assert got == [0, 1] and state.consumed == 2
        stream.end()
    assert got == [0, 1]


async def test_end_drops_what_the_reader_has_not_received() -> None:
    stream, state = new_stream(range(0, 6), capacity=3)
    assert len(stream.pending) == 3  # back-pressure: only 3 fit
    assert (await stream.__anext__()).offset == 0
    stream.end()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()  # 1 and 2 were sent but never received: dropped, not committed
    assert state.consumed == 1 and stream.pending == []


class ScriptedSource:
    """A ``StreamSource`` whose ``take()`` hands out ``records`` once, then returns only when
    notified: a stream that needs refilling must say so, not wait for a poll to time out."""

    def __init__(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        self.closing = False
        self.revoke_wait = 1.0
        self.revoke_hooks: list[Any] = []
        self.state = PartitionState(TP, PartitionPhase.FETCHING, position=0, consumed=0)
        self._records = records
        self._notified = anyio.Event()
        self.takes = 0
        self.notifications = 0
        #: Whether the partition was paused at each wake of the loop.
        self.wakes: list[bool] = []

    def partitions(self) -> dict[TopicPartition, PartitionState]:
        return {TP: self.state}

    def took(self, records: list[ConsumerRecord[bytes, bytes]]) -> list[ConsumerRecord[bytes, bytes]]:
        """What a real ``take()`` does to the partition: fetched, and taken, up to past ``records``."""
        if records:
            self.state.fetched(records[-1].offset + 1)
            self.state.taken(records[-1].offset + 1)
        return records

    def wake(self) -> None:
        self.wakes.append(self.state.paused)

    def notify(self) -> None:
        self.notifications += 1
        self._notified.set()

    async def take(self) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        self.takes += 1
        if self._records:
            records, self._records = self._records, []
            return {TP: self.took(records)}
        await self._notified.wait()  # no timeout: only a notification ends this poll
        self._notified = anyio.Event()
        return {}


async def test_a_small_stream_is_refilled_as_soon_as_its_reader_makes_room() -> None:
    """Issue 14, item 8: with ``buffer_records=10`` the polling task waited for its short poll to
    time out before each refill (60,000 records took 18 s instead of 1 s)."""
    source = ScriptedSource([record(o) for o in range(200)])
    streams: PartitionStreams[bytes, bytes] = PartitionStreams(source, 10)
    got: list[int] = []
    paused_while_full: list[bool] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def read(stream: PartitionStream[bytes, bytes]) -> None:
                async for r in stream:
                    got.append(r.offset)
                    paused_while_full.append(source.state.paused)
                    if len(got) == 200:
                        tg.cancel_scope.cancel()

            async def drive() -> None:
                async for _, stream in streams:
                    tg.start_soon(read, stream)

            tg.start_soon(drive)
    assert got == list(range(200))
    assert source.notifications <= 200 // 5 + 1  # once per half a buffer, not once per record
    assert paused_while_full[0] and not source.state.paused  # back-pressure still pauses, until all is in
    # Each pause and resume woke the loop: a pause may end a hold on the partitions' other fetches.
    assert True in source.wakes and False in source.wakes


async def test_finish_waits_for_the_record_in_hand_and_drops_the_rest() -> None:
    """Issue 14, item 1: ``close()`` ends the streams first and commits only once each reader has
    finished the record in its hand."""
    source = ScriptedSource([])
    streams: PartitionStreams[bytes, bytes] = PartitionStreams(source, 10)
    stream = streams._open(TP)
    assert stream is not None
    stream.pending.extend(source.took([record(o) for o in range(20)]))
    stream.push()
    processed: list[int] = []
    async with anyio.create_task_group() as tg:

        async def reader() -> None:
            async for r in stream:
                await anyio.sleep(0.3)  # working on offset 0 when the consumer closes
                processed.append(r.offset)

        tg.start_soon(reader)
        await anyio.sleep(0.05)
        with anyio.fail_after(3):
            await streams.finish(5.0)
        assert processed == [0] and source.state.consumed == 1  # done with 0; 1..19 dropped
    with pytest.raises(StopAsyncIteration):
        await streams.__anext__()  # no more streams after finish()


@pytest.mark.parametrize("how", ["cancelled", "closing itself"])
async def test_finish_does_not_wait_for_a_reader_that_cannot_finish(how: str) -> None:
    source = ScriptedSource([])
    streams: PartitionStreams[bytes, bytes] = PartitionStreams(source, 10)
    stream = streams._open(TP)
    assert stream is not None
    stream.pending.extend(source.took([record(o) for o in range(5)]))
    stream.push()
    with anyio.fail_after(1):  # not the 5 s wait
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                async for _ in stream:
                    if how == "closing itself":
                        await streams.finish(5.0)
                        return
                    await anyio.sleep(10)

            tg.start_soon(reader)
            await anyio.sleep(0.05)
            if how == "cancelled":
                tg.cancel_scope.cancel()
        await streams.finish(5.0)
    assert source.state.consumed == 0  # offset 0 was in hand, never processed: not committed


async def test_the_old_module_still_gives_the_class_and_says_where_it_is_now() -> None:
    """``asyncconsumer.streams`` is deprecated (docs/api-stability.md): it still works and warns."""
    with pytest.warns(DeprecationWarning, match=r"use asyncconsumer\.PartitionStream"):
        from asyncconsumer.streams import PartitionStream as old
    assert old is PartitionStream
    with pytest.raises(ImportError):
        from asyncconsumer.streams import PartitionStreams  # noqa: F401 (never there)
