"""The fetch collector: records from the fetch buffer to the application.

A poll (``take``) runs queued rebalance callbacks, raises background errors
and takes up to a limit of buffered records, decoding completed fetches batch
by batch and moving each partition's position past what it took.  Records
taken for ``async for``/``batches()`` wait as chunks until handed out; records
taken and not handed out (a seek, a pause, a deserializer error, a corrupt
batch) go back: their partitions rewind and refetch.  Deserializers run here
too (``Deserializers``, app/deserializers.py), in one of three modes: none;
"lazy", today's ``f(data)`` callables with the "raise" or "skip" policy, each
record as it is handed out, never awaiting; "eager", deserializers with context
or a handler policy, the records of a poll as they are taken, awaiting on the
polling task, after which only the partitions whose state did not change
meanwhile (no seek, pause, revocation or close) are handed out and the others
go back by the same rules.  It talks to the engine only (``Engine``:
subscriptions, the buffer, the wake-ups), which every call that needs it is handed, never to
``Consumer`` internals; and to a partition's offsets through ``PartitionState``'s vocabulary
(``taken``, ``handed_out``, ``finished``, ``rewind``).  What ``async for`` reads for each record it
hands out without a poll, the C extension's ``RecordStream`` included, is one object the collector
owns (``FastPath``: the chunks, the consumer's polling task, the engine).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, cast

import anyio
from typing_extensions import TypeVar

from ..config import ConsumerConfig
from ..engine.buffers import column_pool
from ..engine.loop import Engine
from ..errors import ConsumerClosedError, KafkaError, RecordDeserializationError, RecordError
from ..managers.fetch_buffer import CompletedFetch, Record
from ..managers.subscription import PartitionState
from ..structs import ConsumerRecord, TopicPartition
from .client import PollOwner
from .deserializers import Deserializers, Pending, Undeserialized, replaced
from .iterators import ChunkBase
from .rebalance import RebalanceRunner

KT = TypeVar("KT", default=bytes)
VT = TypeVar("VT", default=bytes)
T = TypeVar("T")

log = logging.getLogger("asyncconsumer.consumer")
#: What skipping an undeserializable record does to it (the log line says so).
SKIPPED = "the position moves past it"
#: How records are deserialized: not at all, "lazy" (as they are handed out) or "eager" (as a
#: poll takes them, awaiting as needed); see the module's docstring.
DeserializeMode = Literal["plain", "lazy", "eager"]


#: A chunk's fields: the compiled ``ChunkBase``'s members (speedups/ready.c), else ``Chunk``'s slots.
CHUNK_FIELDS = ("end", "epoch", "index", "records", "state")


class Chunk(ChunkBase if not TYPE_CHECKING else object):  # type: ignore[misc]
    """One partition's records taken from the buffer for ``async for`` or ``batches()``.

    With the C extension its fields (``CHUNK_FIELDS``) live in the compiled ``ChunkBase``
    (``async for``'s ``RecordStream`` reads them directly), else in slots of its own."""

    __slots__ = () if ChunkBase is not object else CHUNK_FIELDS

    state: PartitionState
    epoch: int
    records: list[Record]
    index: int
    end: int

    def __init__(self, state: PartitionState, records: list[Record]) -> None:
        self.state = state
        self.epoch = state.epoch  # a seek, reset or revocation since makes the chunk stale
        self.records = records
        self.index = 0  # the next record to hand out
        #: The position once the last record is handed out: past any transaction markers, aborted
        #: batches or compaction gaps the fetch ended with (nothing in between to hand out).
        self.end = state.position

    @property
    def live(self) -> bool:
        state = self.state
        return state.epoch == self.epoch and not state.paused and not state.revoking


class FastPath:
    """What ``async for``'s per-record step reads before it hands out a record it already holds,
    without a poll (``Consumer.__anext__``, and the compiled ``RecordStream``, from the slots):

    - ``chunks``: the collector's records taken and not handed out yet;
    - ``owner``: the consumer's ``PollOwner`` (no other poll may be in progress: ``owner.task``
      is None);
    - ``engine``: the consumer's engine, which must be running (not ``engine.closed``); None
      until the consumer builds it.

    The collector owns it; ``chunks`` and ``owner`` are the same objects for its life and
    ``engine`` is set once.  speedups/module.c lists every name the extension reads
    (tests/protocol/test_speedups.py checks them against the classes)."""

    __slots__ = ("chunks", "engine", "owner")

    def __init__(self, chunks: deque[Chunk], owner: PollOwner) -> None:
        self.chunks = chunks
        self.owner = owner
        self.engine: Engine | None = None


class Collector(Generic[KT, VT]):
    """Takes records from the engine's fetch buffer for one consumer (``owner``: the consumer's
    polling task, which ``async for`` checks per record)."""

    def __init__(self, config: ConsumerConfig, rebalance: RebalanceRunner, owner: PollOwner) -> None:
        self._config = config
        self._rebalance = rebalance
        #: Records taken from the buffer for ``async for``/``batches()`` and not handed out yet.
        #: The deque is the same object for the collector's life (``fast_path`` holds it).
        self.chunks: deque[Chunk] = deque()
        #: What ``async for`` reads per record (``FastPath``).
        self.fast_path = FastPath(self.chunks, owner)
        #: A deserializer error held back for the next poll (the records before it were handed out).
        self.deferred_error: KafkaError | None = None
        #: Records handed out per partition (chunks count when used up or dropped; see ``handed_out``),
        #: and bytes of the completed fetches used up (metrics).
        self.consumed: dict[TopicPartition, int] = {}
        self.bytes_consumed = 0
        #: Polls waiting for records now.
        self.waiting = 0
        #: The buffers ``arrow_batches()`` decodes column blocks into, used again once no Arrow
        #: array wraps them (engine/buffers.py), up to ``fetch_buffer_bytes``.
        self.column_buffers = column_pool(config.fetch_buffer_bytes)
        self.deserializers = des = Deserializers(config, log, _seek_hint)
        self.mode: DeserializeMode = "plain" if des.plain else "lazy" if des.sync else "eager"
        #: Set by ``Consumer.close()``: records deserialized while it closed are not handed out.
        self.closing = False

    def handed(self, tp: TopicPartition, count: int) -> None:
        """``count`` records of ``tp`` were handed to the application (called per chunk or poll)."""
        consumed = self.consumed
        consumed[tp] = consumed.get(tp, 0) + count

    def handed_out(self) -> dict[TopicPartition, int]:
        """Records handed out per partition, the chunks being handed out by ``async for`` included."""
        result = dict(self.consumed)
        for chunk in self.chunks:
            if chunk.index:
                tp = chunk.state.tp
                result[tp] = result.get(tp, 0) + chunk.index
        return result

    # -- one poll -----------------------------------------------------------------------------------

    async def poll(self, engine: Engine, only: set[TopicPartition] | None, limit: int, timeout: float | None, *,
                   mark_consumed: bool, return_on_wake: bool = False
                   ) -> dict[TopicPartition, list[ConsumerRecord[KT, VT]]]:
        deadline = None if timeout is None else engine.app_time() + timeout
        while True:
            records = await self.take(engine, only, limit, timeout, hand_out=mark_consumed,
                                      return_on_wake=return_on_wake)
            if self.mode == "eager":
                result = await self.decode(engine, records, mark_consumed=mark_consumed, mark_skipped=False)
            elif mark_consumed:
                for tp in records:
                    # Everything taken is handed out: the position is past it, and past the transaction
                    # markers, aborted batches or compaction gaps the fetch ended with (Java does the same).
                    state = engine.subscriptions.partitions[tp]
                    state.handed_out(state.position)
                result = self.deserialize_many(engine, records)
                for tp, recs in result.items():
                    self.handed(tp, len(recs))
            else:
                result = self.deserialize_many(engine, records)
            if result or not records or return_on_wake:
                return result
            # Every record taken was skipped (or went back): poll again in the time left.
            if deadline is not None:
                timeout = deadline - engine.app_time()
                if timeout <= 0:
                    return result

    async def take(self, engine: Engine, only: set[TopicPartition] | None, limit: int,
                   timeout: float | None, *, hand_out: bool = True,
                   return_on_wake: bool = False) -> dict[TopicPartition, list[Record]]:
        """One poll: run rebalance callbacks, raise background errors, and take up to ``limit``
        buffered records, waiting up to ``timeout`` seconds for some (None: until there are).
        ``return_on_wake``: return (perhaps with nothing) as soon as the application is notified
        (``Engine.notify_app``), e.g. because a partition stream has room again."""
        records = await self.poll_for(
            engine, timeout, lambda: self._collect(engine, only, limit, hand_out=hand_out),
            return_on_wake=return_on_wake)
        return records or {}

    async def poll_for(self, engine: Engine, timeout: float | None, collect: Callable[[], T | None], *,
                       return_on_wake: bool = False) -> T | None:
        """The poll every read API shares: mark what was handed out before as processed, then run
        rebalance callbacks, raise background errors and call ``collect()`` until it returns
        something (falsy: nothing yet), waiting up to ``timeout`` seconds (None: no limit) for the
        background loop's news; None when the time is up (or, with ``return_on_wake``, on news)."""
        engine.subscriptions.finished()  # a new poll: done with what it was handed before (auto-commit)
        # Let the background loop run before the application works through what this poll takes:
        # it sends the next fetch (read-ahead) and reads the sockets meanwhile.  Right after a
        # hand-over, or a Fetch answer taken at once (engine/core.py), the loop runs as soon as
        # this task waits or yields, so a poll that finds nothing and waits needs no turn of its
        # own first (at low rates, one turn of the event loop a fetch); one that takes records
        # yields once it has them, shielded (cancelled there, records taken would be lost).
        yield_after = engine.loop_runs_next()
        if yield_after:
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:
            await anyio.lowlevel.checkpoint()
        # The timeout bounds the wait for records only: a rebalance callback that runs inside this
        # call has its own deadline (rebalance_timeout_ms) and is not cut short by a short poll.
        deadline = math.inf if timeout is None else engine.app_time() + timeout
        woken = False
        while True:
            engine.app_polled()  # waiting inside a poll is polling (max_poll_interval_ms)
            event = engine.app_event()
            if engine.callbacks:
                await self._rebalance.run_callbacks(engine)
            self.raise_background_error(engine)
            got = collect()
            if got or woken:
                if got and yield_after:
                    await anyio.lowlevel.cancel_shielded_checkpoint()
                return got
            if deadline <= engine.app_time():
                return None
            self.waiting += 1  # a poll waiting for records is polling now (metrics: last poll age 0)
            try:
                if deadline == math.inf:  # no timeout (async for, batches()): no timer to set up
                    await event.wait()
                else:
                    await engine.wait_app(event, deadline)
            finally:
                self.waiting -= 1
            yield_after = False  # the wait let the loop run
            woken = return_on_wake and event.is_set()

    def raise_background_error(self, engine: Engine) -> None:
        deferred, self.deferred_error = self.deferred_error, None
        if deferred is not None:
            raise deferred
        error = engine.pop_error()
        if error is not None:
            raise error
        engine.check_running()

    def fetch_walk(
        self, engine: Engine, only: set[TopicPartition] | None, *, hand_out: bool = True
    ) -> Iterator[tuple[CompletedFetch, PartitionState]]:
        """The walk over the fetch buffer every read API shares: ``(fetch, state)`` for each
        completed fetch that may be read now, in buffer order, one per partition at a time (which
        keeps offsets in order), ``only`` these partitions (None: all); stale fetches (a seek,
        reset or revocation since) are dropped, paused and revoking partitions skipped.

        The caller reads the fetch at ``state.position`` and moves the position past what it
        took.  When the caller comes back for the next fetch and this one is used up, the walk
        counts its bytes (metrics), moves the position past the transaction markers, aborted
        batches or compaction gaps it ended with and drops it, so the partition's next fetch may
        follow in the same walk; a used-up fetch that gave nothing to hand out this walk
        (``hand_out``) lets commits move past it too.  Leaving the walk early (break, return,
        an exception) leaves the last fetch as it is.
        """
        subscriptions = engine.subscriptions
        buffer = engine.buffer
        seen: set[TopicPartition] = set()
        took: set[TopicPartition] = set()
        for fetch in buffer.fetches():
            tp = fetch.tp
            state = subscriptions.partitions.get(tp)
            if state is None or state.epoch != fetch.epoch:
                buffer.remove(fetch)
                continue
            if tp in seen or state.paused or state.revoking or (only is not None and tp not in only):
                continue
            seen.add(tp)
            before = state.position
            yield fetch, state
            if state.position != before:
                took.add(tp)
            if fetch.exhausted:
                self.bytes_consumed += fetch.size
                state.taken(fetch.next_offset)
                # Only control records or compaction gaps: nothing to hand out, but commits may move
                # past them (not while records taken for partition streams still wait there).
                if hand_out and tp not in took:
                    state.handed_out(state.position)
                buffer.remove(fetch)
                seen.discard(tp)

    def _collect(
        self, engine: Engine, only: set[TopicPartition] | None, limit: int, *, hand_out: bool = True
    ) -> dict[TopicPartition, list[Record]]:
        result: dict[TopicPartition, list[Record]] = {}
        count = 0
        for fetch, state in self.fetch_walk(engine, only, hand_out=hand_out):
            if count >= limit:
                break
            try:
                records = fetch.take(limit - count, state.position)
            except RecordError as exc:
                refetch_bad_batch(engine, fetch, state, exc)
                self.rewind(engine, result)
                engine.wake()
                raise
            if records:
                state.taken(records[-1].offset + 1)
                result.setdefault(fetch.tp, []).extend(records)
                count += len(records)
        return result

    # -- chunks (async for, batches()) ----------------------------------------------------------------

    def live_chunk(self) -> Chunk | None:
        """The first chunk whose partition may still be handed out (stale ones are dropped)."""
        chunks = self.chunks
        while chunks:
            chunk = chunks[0]
            if chunk.live:
                return chunk
            chunks.popleft()
            if chunk.index:
                self.handed(chunk.state.tp, chunk.index)
        return None

    async def refill(self, engine: Engine, limit: int) -> None:
        """A poll for ``async for``/``batches()``: the records taken become chunks (in "eager" mode
        deserialized, so they are handed out as they are)."""
        records: Mapping[TopicPartition, list[Any]] = await self.take(engine, None, limit, None)
        if self.mode == "eager":
            records = await self.decode(engine, records, mark_consumed=False, mark_skipped=True)
        for tp, recs in records.items():
            self.chunks.append(Chunk(engine.subscriptions.partitions[tp], recs))

    def drop_chunks(self, engine: Engine, only: set[TopicPartition] | None = None) -> None:
        """Records taken for ``async for``/``batches()`` but not handed out go back (positions too),
        for ``only`` these partitions or all of them."""
        kept: list[Chunk] = []
        gone: set[TopicPartition] = set()
        for chunk in self.chunks:
            state = chunk.state
            if only is not None and state.tp not in only:
                kept.append(chunk)
                continue
            if chunk.index:
                self.handed(state.tp, chunk.index)
            if state.epoch == chunk.epoch and chunk.index < len(chunk.records):
                state.rewind(chunk.records[chunk.index].offset)
            gone.add(state.tp)
        self.chunks.clear()
        self.chunks.extend(kept)
        if gone:
            engine.buffer.drop(lambda f: f.tp not in gone)

    # -- putting records back -------------------------------------------------------------------------

    def rewind(self, engine: Engine, records: Mapping[TopicPartition, list[Record]]) -> None:
        """Put records taken from the buffer back: their partitions refetch from the first one."""
        for tp, recs in records.items():
            state = engine.subscriptions.partitions.get(tp)
            if state is not None and recs:
                state.rewind(recs[0].offset)
        if records:
            self.forget_buffered(engine, records)

    def forget_buffered(self, engine: Engine, tps: Iterable[TopicPartition]) -> None:
        gone = set(tps)
        engine.buffer.drop(lambda f: f.tp not in gone)
        self.drop_chunks(engine, gone)
        engine.wake()

    # -- deserializers --------------------------------------------------------------------------------

    def deserialize(self, engine: Engine, record: Record) -> ConsumerRecord[KT, VT] | None:
        """"lazy" mode: ``record``, just handed out, deserialized; None when the policy skipped it
        (its offset is handed out already, so commits move past it).  With "raise" the position
        goes back to it and its partition refetches from there.  (``Deserializers.record``, inlined:
        ``async for``'s per-record path.)"""
        des = self.deserializers
        key, value = record.key, record.value
        field = "key"
        try:
            if key is not None and des.key is not None:
                key = des.key(key)
            field = "value"
            if value is not None and des.value is not None:
                value = des.value(value)
        except Exception as exc:
            error = des.failure(record, field, exc)
            if des.skip(record, error, SKIPPED):
                return None
            engine.subscriptions.partitions[record.topic_partition].rewind(record.offset)
            self.forget_buffered(engine, [record.topic_partition])
            raise error from exc
        return replaced(record, key, value)  # type: ignore[no-any-return]

    def deserialize_many(
        self, engine: Engine, records: Mapping[TopicPartition, list[Record]]
    ) -> dict[TopicPartition, list[ConsumerRecord[KT, VT]]]:
        """Records taken and handed out, deserialized ("plain" or "lazy" mode): skipped records
        are left out; at a record to raise for, the records before it are returned and the error
        comes with the next poll (``deferred_error``), or now when there are none."""
        if self.mode == "plain":
            return cast("dict[TopicPartition, list[ConsumerRecord[KT, VT]]]", records)
        decode = self.deserializers.record
        out: dict[TopicPartition, list[ConsumerRecord[KT, VT]]] = {}
        for tp, recs in records.items():
            done: list[ConsumerRecord[KT, VT]] = []
            for record in recs:
                try:
                    done.append(decode(record))
                except RecordDeserializationError as exc:
                    if self.deserializers.skip(record, exc, SKIPPED):
                        continue
                    # The records before the bad one are handed out now and the error comes with the
                    # next poll (the position stays at the bad record); partitions not reached yet go
                    # back to their first record.
                    engine.subscriptions.partitions[tp].rewind(record.offset)
                    self.forget_buffered(engine, [tp])
                    return self._stop(engine, records, out, tp, done, exc)
            if done:
                out[tp] = done
        return out

    def _stop(
        self, engine: Engine, records: Mapping[TopicPartition, list[Any]], out: dict[TopicPartition, list[Any]],
        tp: TopicPartition, done: list[Any], error: KafkaError,
    ) -> dict[TopicPartition, list[Any]]:
        """A record of ``tp`` is to raise for (its partition is back at it): the partitions not
        reached go back; ``out`` and ``done`` (``tp``'s records before it) are returned and the
        error deferred to the next poll, or raised now when they are empty."""
        self.rewind(engine, {t: rs for t, rs in records.items() if t not in out and t != tp})
        if done:
            out[tp] = done
        if not out:
            raise error
        self.deferred_error = error
        return out

    async def decode(
        self, engine: Engine, records: Mapping[TopicPartition, list[Record]], *, mark_consumed: bool,
        mark_skipped: bool,
    ) -> dict[TopicPartition, list[Any]]:
        """"eager" mode: records just taken from the buffer (not handed out), deserialized on this
        task, awaiting as needed, under the ``on_deserialization_error`` policy.

        Only afterwards is anything handed out, and only for the partitions whose state did not
        change meanwhile: a partition seeked, reset or revoked since (its epoch moved) drops its
        records, a paused or revoking one puts them back (rewinds), as for a chunk (``drop_chunks``).
        ``mark_consumed`` (``getmany()``): the records returned are handed out; else they wait in
        chunks or partition streams.  ``mark_skipped`` (chunks): a partition whose records were all
        skipped is handed out past them now (a partition stream does so once it is idle).  A
        cancelled call puts everything back."""
        des = self.deserializers
        begin = des.begin
        partitions = engine.subscriptions.partitions
        epochs = {tp: partitions[tp].epoch for tp in records}
        out: dict[TopicPartition, list[Any]] = {}
        failed: tuple[TopicPartition, Record, RecordDeserializationError] | None = None
        try:
            for tp, recs in records.items():
                done: list[Any] = []
                for record in recs:
                    try:
                        decoded = begin(record)
                        done.append(await des.finish(decoded) if type(decoded) is Pending else decoded)
                    except RecordDeserializationError as exc:
                        error = await des.settle(record, exc, SKIPPED)
                        if error is not None:
                            failed = (tp, record, error)
                            break
                out[tp] = done
                if failed is not None:
                    break
        except BaseException:
            self._put_back(engine, records, epochs)
            raise
        if self.closing:
            raise ConsumerClosedError("the consumer closed while records were being deserialized")
        # Nothing awaits from here on: what is handed out is decided against the states as they are.
        back: dict[TopicPartition, list[Record]] = {}
        for tp, recs in records.items():
            state = partitions.get(tp)
            if state is None or state.epoch != epochs[tp]:
                out.pop(tp, None)  # seeked, reset or revoked meanwhile: stale, nothing to put back
            elif tp not in out or state.paused or state.revoking:
                out.pop(tp, None)  # not reached (after a record to raise for), paused or revoking
                back[tp] = recs
        raising = failed is not None and failed[0] in out
        if failed is not None and raising:
            tp, record, _ = failed
            partitions[tp].rewind(record.offset)  # the position stays at the bad record
            self.forget_buffered(engine, [tp])
        self.rewind(engine, back)
        for tp, done in out.items():
            state = partitions[tp]
            if mark_consumed:
                state.handed_out(state.position)
                self.handed(tp, len(done))
            elif mark_skipped and not done:
                state.handed_out(state.position)  # all skipped: commits move past them
        result = {tp: done for tp, done in out.items() if done}
        if failed is not None and raising:
            if not result:
                raise failed[2]
            self.deferred_error = failed[2]
        return result

    def _put_back(self, engine: Engine, records: Mapping[TopicPartition, list[Record]],
                  epochs: Mapping[TopicPartition, int]) -> None:
        """Records taken and not handed out go back, for the partitions whose epoch is unchanged."""
        partitions = engine.subscriptions.partitions
        self.rewind(engine, {tp: recs for tp, recs in records.items()
                             if (state := partitions.get(tp)) is not None and state.epoch == epochs[tp]})


__all__ = ["Chunk", "Collector", "FastPath", "RecordDeserializationError"]


def _seek_hint(record: Undeserialized) -> str:
    return f"seek({record.topic!r}, {record.partition}) to {record.offset + 1} to skip the record"


def refetch_bad_batch(engine: Engine, fetch: CompletedFetch, state: PartitionState, exc: RecordError) -> None:
    """A batch of ``fetch`` could not be read: name the offset to seek to in the error, drop the
    fetch, and refetch from the bad batch, so the error repeats until the application seeks past it."""
    tp = fetch.tp
    exc.skip_to = fetch.offset_after_batch(exc.offset)
    if exc.skip_to > exc.offset:
        exc.args = (f"{exc.args[0]}; seek({tp.topic!r}, {tp.partition}) to {exc.skip_to} to skip it",)
    engine.buffer.remove(fetch)
    state.rewind(max(state.position, exc.offset))
