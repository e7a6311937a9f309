"""Per-partition streams: ``async for tp, stream in consumer.partitions():``.

One task (the one iterating ``partitions()``) polls the consumer and hands
each partition's records to that partition's own bounded stream, so partitions
can be processed concurrently.  A slow partition fills its stream and is then
paused — back-pressured — without stalling the others.  When a partition is
revoked its stream stops receiving, the application finishes what it holds, the
offsets are committed (rebalance-safe commits), and only then does the stream
end and is the partition given up.

A record counts as processed (and is covered by ``commit()``) once the reader
asks its stream for the next one, not when it receives it: a record being
worked on when the partition moves goes to the next owner again, never lost.

The streams see the consumer through ``StreamSource`` (records to hand out,
the partitions' states, a wake-up) and take part in revocations as a
``RevokeHook`` of the rebalance runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Generic, Protocol, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._runtime import current_async_library
from ..managers.subscription import PartitionState
from ..structs import ConsumerRecord, TopicPartition
from .rebalance import RevokeHook

KT = TypeVar("KT")
VT = TypeVar("VT")


class StreamSource(Protocol[KT, VT]):
    """What the per-partition streams need from the consumer."""

    @property
    def closing(self) -> bool:
        """The consumer is closing: its readers are gone, so revocations do not wait for them."""
        ...

    @property
    def revoke_wait(self) -> float:
        """How long a revocation waits for the readers to finish (``rebalance_commit_wait_ms``, s)."""
        ...

    @property
    def revoke_hooks(self) -> list[RevokeHook]:
        """The hooks the rebalance runner calls around a revocation."""
        ...

    def partitions(self) -> Mapping[TopicPartition, PartitionState]:
        """The assigned partitions' states (none while the consumer is not running)."""
        ...

    def wake(self) -> None:
        """A partition paused for back-pressure may be fetched again."""
        ...

    def notify(self) -> None:
        """A stream has room again: the task waiting in ``take()`` returns, to refill it."""
        ...

    async def take(self) -> Mapping[TopicPartition, list[ConsumerRecord[KT, VT]]]:
        """A short poll: records taken from the buffer, counted as consumed only once processed."""
        ...


def _current_coroutine() -> object | None:
    """The coroutine of the running task: once it is finished, the task is gone."""
    library = current_async_library()
    if library == "asyncio":
        task = asyncio.current_task()
        return task.get_coro() if task is not None else None
    if library == "trio":
        import trio

        return trio.lowlevel.current_task().coro
    return None


class PartitionStream(Generic[KT, VT]):
    """The records of one partition, in order; ends when the partition is revoked."""

    def __init__(self, tp: TopicPartition, state: PartitionState, capacity: int,
                 on_room: Callable[[], None] | None = None) -> None:
        self.tp = tp
        self._state = state
        #: Called once the reader has taken half of a full stream while records wait to be put in.
        self._on_room = on_room
        self._low_water = capacity // 2
        self._room_asked = False
        send, receive = anyio.create_memory_object_stream[ConsumerRecord[KT, VT]](capacity)
        self._send: MemoryObjectSendStream[ConsumerRecord[KT, VT]] = send
        self._receive: MemoryObjectReceiveStream[ConsumerRecord[KT, VT]] = receive
        self.pending: list[ConsumerRecord[KT, VT]] = []
        self._in_hand: ConsumerRecord[KT, VT] | None = None  # handed out, not known to be processed
        self._reader: object | None = None  # the coroutine of the task that received the last record

    def __aiter__(self) -> AsyncIterator[ConsumerRecord[KT, VT]]:
        return self

    async def __anext__(self) -> ConsumerRecord[KT, VT]:
        if self._in_hand is not None:  # asking for the next one: done with the previous one
            self._state.handed_out(self._in_hand.offset + 1)
            self._in_hand = None
        try:
            record = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None
        self._in_hand = record
        self._reader = _current_coroutine()
        if (self.pending and not self._room_asked and self._on_room is not None
                and self._receive.statistics().current_buffer_used <= self._low_water):
            # Refill now, not when the polling task's short poll times out: with a small buffer
            # that wait, once per refill, was most of the time spent (issue 14, item 8).
            self._room_asked = True
            self._on_room()
        return record

    def push(self) -> bool:
        """Move pending records into the stream; False when it is full (back-pressure)."""
        self._room_asked = False
        while self.pending:
            try:
                self._send.send_nowait(self.pending[0])
            except anyio.WouldBlock:
                return False
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.pending.clear()  # nobody reads this stream any more
                return True
            self.pending.pop(0)
        return True

    def end(self) -> None:
        """No more records: what the reader has not received yet is dropped (not processed, so
        not committed: the next owner reads it)."""
        self.pending.clear()
        self._send.close()
        while True:
            try:
                self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break

    @property
    def idle(self) -> bool:
        """Every record given to this stream was processed: none pending, buffered or in hand."""
        return not self.pending and self._in_hand is None and self._receive.statistics().current_buffer_used == 0

    @property
    def drained(self) -> bool:
        """The reader has processed everything sent and waits for more (or stopped reading)."""
        return self._in_hand is None and self._receive.statistics().current_buffer_used == 0

    @property
    def reader_gone(self) -> bool:
        """The task that received the last record has finished (returned, raised or was cancelled)
        without asking for the next one: the record in its hand will never be processed."""
        return self._in_hand is not None and getattr(self._reader, "cr_frame", True) is None

    @property
    def settled(self) -> bool:
        """Nothing more can be processed: drained, or its reader is gone."""
        return self.drained or self.reader_gone


class PartitionStreams(Generic[KT, VT]):
    def __init__(self, source: StreamSource[KT, VT], capacity: int) -> None:
        self._source = source
        self._capacity = capacity
        self._streams: dict[TopicPartition, PartitionStream[KT, VT]] = {}
        self._new: list[tuple[TopicPartition, PartitionStream[KT, VT]]] = []
        self._held: set[TopicPartition] = set()  # partitions we paused for back-pressure
        self._ending: dict[TopicPartition, PartitionStream[KT, VT]] = {}  # revoked, not committed yet
        self._finished = False  # the consumer is leaving: no stream opens or gets records any more
        source.revoke_hooks.append(self)

    def __aiter__(self) -> AsyncIterator[tuple[TopicPartition, PartitionStream[KT, VT]]]:
        return self

    async def __anext__(self) -> tuple[TopicPartition, PartitionStream[KT, VT]]:
        while not self._new:
            if self._finished:
                raise StopAsyncIteration
            self._open_assigned()
            if self._new:
                break
            self._push_all()
            batch = await self._source.take()
            for tp, records in batch.items():
                stream = self._streams.get(tp) or self._open(tp)
                if stream is not None:
                    stream.pending.extend(records)
            self._push_all()
            self._advance_idle()
        return self._new.pop(0)

    def _advance_idle(self) -> None:
        """A partition whose stream processed everything it was given moves on to its fetch
        position: past the transaction markers, aborted batches or compaction gaps that the
        fetch skipped after those records (nothing there for the stream)."""
        states = self._source.partitions()
        for tp, stream in self._streams.items():
            state = states.get(tp)
            if state is stream._state and state.has_position and stream.idle:
                state.handed_out(state.position)

    def _open_assigned(self) -> None:
        for tp, state in self._source.partitions().items():
            if tp not in self._streams and not state.revoking:
                self._open(tp)

    def _open(self, tp: TopicPartition) -> PartitionStream[KT, VT] | None:
        state = self._source.partitions().get(tp)
        if state is None or self._finished:
            return None
        stream: PartitionStream[KT, VT] = PartitionStream(tp, state, self._capacity, self._source.notify)
        self._streams[tp] = stream
        self._new.append((tp, stream))
        return stream

    def _push_all(self) -> None:
        states = self._source.partitions()
        for tp, stream in self._streams.items():
            state = states.get(tp)
            if state is None:
                continue
            if stream.push():
                if tp in self._held:
                    self._held.discard(tp)
                    state.resume()
                    self._source.wake()
            elif not state.paused:
                self._held.add(tp)
                state.pause()  # back-pressure: stop fetching and returning this partition
                self._source.wake()  # a fetch held back while its records were read may go now

    async def before_revoke(self, partitions: set[TopicPartition], *, lost: bool) -> None:
        """Stop feeding the streams of ``partitions`` and let their readers finish what they hold,
        so that the commit that follows covers exactly what they processed."""
        ending = [self._streams.pop(tp) for tp in partitions if tp in self._streams]
        for stream in ending:
            stream.pending.clear()
            self._held.discard(stream.tp)
            self._ending[stream.tp] = stream
        # Not when closing (finish() waited already) nor for lost partitions (nothing can be committed).
        wait = 0.0 if self._source.closing or lost else self._source.revoke_wait
        with anyio.move_on_after(wait):
            while not all(s.settled for s in ending):  # noqa: ASYNC110 (the application drains them)
                await anyio.sleep(0.01)

    async def finish(self, wait: float) -> None:
        """The consumer is leaving (``close()``): end every stream now — records sent and not
        received yet are dropped (not processed, so not committed: the next owner reads them) — and
        wait up to ``wait`` seconds for each reader to finish the record in its hand, so that the
        final commit covers exactly what the stream tasks processed."""
        self._finished = True
        ending = [*self._streams.values(), *self._ending.values()]
        for stream in self._streams.values():
            self._ending[stream.tp] = stream  # no longer moved past idle gaps (_advance_idle)
        self._streams.clear()
        self._new.clear()  # opened, not handed to the application yet: never will be
        self._held.clear()
        for stream in ending:
            stream.end()
        # A stream task closing the consumer itself does not wait for itself (its record in hand
        # stays unprocessed: the next owner reads it).
        me = _current_coroutine()
        with anyio.move_on_after(wait):
            while not all(s.settled or (s._in_hand is not None and s._reader is me) for s in ending):  # noqa: ASYNC110
                await anyio.sleep(0.01)

    def after_revoke(self, partitions: set[TopicPartition]) -> None:
        """The offsets are committed: the streams end."""
        for tp in partitions:
            stream = self._ending.pop(tp, None)
            if stream is not None:
                stream.end()

    def close(self) -> None:
        for stream in [*self._streams.values(), *self._ending.values()]:
            stream.end()
        self._streams.clear()
        self._ending.clear()
        if self in self._source.revoke_hooks:
            self._source.revoke_hooks.remove(self)
