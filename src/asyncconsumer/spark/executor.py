"""The executors' side of the source: reading one offset range into Arrow record batches.

A task reads exactly ``[start, end)`` of a partition (:class:`RangeReader`, through the columnar
decoder of ``Consumer.arrow_batches()``) with a consumer that assigns and seeks, on an event loop of
its own (:class:`~asyncconsumer.spark.session.ConsumerSession`), so batches can be yielded to Spark
while the consumer keeps its connections.  A Python worker keeps that consumer for its next task
(:class:`ExecutorConsumers`, for ``consumerCacheTimeout``).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from ..app.arrow import ColumnDecoder
from ..config import property_option
from ..consumer import Consumer
from ..errors import OffsetOutOfRangeError
from ..structs import ConsumerRecord
from .arrow import column_decoders, registry_client, require_avro
from .options import SourceOptions
from .plan import DATA_LOSS_HINT, DataLossError, KafkaInputPartition, OffsetRange
from .session import ConsumerSession, source_consumer

log = logging.getLogger("asyncconsumer.spark")

S = TypeVar("S", bound=Sized)

#: The offset column of the Arrow batches (arrow.py's schema).
_OFFSET_COLUMN = 4


#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 8192


#: An executor consumer's ``max.partition.fetch.bytes`` unless ``kafka.max.partition.fetch.bytes`` is
#: given (and at most a given ``kafka.fetch.buffer.bytes``).  A task reads one partition's range at
#: a time, so the Java default (1 MiB, a share of ``fetch.max.bytes`` for a consumer of many
#: partitions) would make it one round trip per MiB.
_EXECUTOR_PARTITION_FETCH_BYTES = 8 * 1024 * 1024


#: ... and its ``fetch_buffer_bytes``: one response being read and the next one (the consumer's
#: 64 MiB default would let a slow task hold 64 MiB of its range).  Past the range's end a task
#: fetches nothing more once a fetch has reached it (``Consumer.fetch_until``).
_EXECUTOR_FETCH_BUFFER_BYTES = 2 * _EXECUTOR_PARTITION_FETCH_BYTES


#: When this module was imported: the debug timings say how long a Python worker had been up.
_IMPORTED = time.monotonic()


class RangeReader:
    """Reads exactly ``[start, end)`` of one partition from a started consumer, chunk by chunk.

    Gaps in the offsets (compaction, transaction markers) are normal.  Offsets that are gone from
    the log (the fetch is out of range) are data loss: an error, or skipped with
    ``failOnDataLoss=false``.  No progress for ``poll_timeout`` seconds is an error.
    """

    def __init__(
        self,
        consumer: Consumer[Any, Any],
        offset_range: OffsetRange,
        *,
        fail_on_data_loss: bool,
        poll_timeout: float,
        max_records: int = ARROW_BATCH_ROWS,
        include_headers: bool = True,
        key_format: ColumnDecoder | None = None,
        value_format: ColumnDecoder | None = None,
    ) -> None:
        self._consumer = consumer
        self._include_headers = include_headers
        #: ``arrow_batch``'s ``key_format``/``value_format``, when set (keyFormat/valueFormat=avro).
        self._formats = {
            name: decoder for name, decoder in (("key_format", key_format), ("value_format", value_format)) if decoder
        }
        self._range = offset_range
        self._fail_on_data_loss = fail_on_data_loss
        self._poll_timeout = poll_timeout
        self._max_records = max_records
        self.position = offset_range.start
        self._started = False

    @property
    def done(self) -> bool:
        return self.position >= self._range.end

    async def next_chunk(self) -> list[ConsumerRecord[Any, Any]]:
        """The next records of the range (an empty list once the range is finished)."""
        tp = self._range.tp

        async def poll(timeout: float) -> list[ConsumerRecord[Any, Any]] | None:
            got = await self._consumer.getmany(tp, timeout=timeout, max_records=self._max_records)
            return got.get(tp) or None

        def cut(records: list[ConsumerRecord[Any, Any]], end: int) -> list[ConsumerRecord[Any, Any]]:
            return [r for r in records if r.offset < end]

        return await self._next(poll, lambda records: records[-1].offset, cut) or []

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next records of the range as one Arrow record batch, through the columnar decoder
        (``Consumer.arrow_batches()``'s path); None once the range is finished."""
        tp = self._range.tp

        async def poll(timeout: float) -> pa.RecordBatch | None:
            batch: pa.RecordBatch | None = await self._consumer.arrow_batch(
                tp, timeout=timeout, max_records=self._max_records, include_headers=self._include_headers,
                **self._formats,
            )
            return batch

        def last(batch: pa.RecordBatch) -> int:
            return int(batch.column(_OFFSET_COLUMN)[-1].as_py())

        def cut(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
            offsets = batch.column(_OFFSET_COLUMN)
            return batch.slice(0, bisect.bisect_left(range(len(offsets)), end, key=lambda i: offsets[i].as_py()))

        return await self._next(poll, last, cut)

    async def _next(
        self,
        poll: Callable[[float], Awaitable[S | None]],
        last: Callable[[S], int],
        cut: Callable[[S, int], S],
    ) -> S | None:
        """The poll loop of :meth:`next_chunk` and :meth:`next_batch`: ``poll`` for records,
        ``last`` their last offset, ``cut`` those before an offset (never none of them)."""
        tp, end = self._range.tp, self._range.end
        if not self._started:
            self._started = True
            if not self.done:
                self._consumer.assign([tp])
                self._consumer.fetch_until(tp, end)  # no read-ahead past the range
                await self._consumer.seek(tp, self.position)
        last_progress = time.monotonic()
        while not self.done:
            try:
                got = await poll(min(0.5, self._poll_timeout))
            except OffsetOutOfRangeError:
                await self._out_of_range()
                last_progress = time.monotonic()
                continue
            if got is not None:
                last_offset = last(got)
                if last_offset >= end:
                    self.position = end
                    got = cut(got, end)
                    if not len(got):
                        continue
                else:
                    self.position = last_offset + 1
                return got
            position = await self._consumer.position(tp)
            if position > self.position:  # only control records or a compaction gap
                self.position = min(position, end)
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self._poll_timeout:
                raise TimeoutError(
                    f"asyncconsumer source: no records from {tp} at offset {self.position} within "
                    f"{self._poll_timeout:.0f}s (kafkaConsumer.pollTimeoutMs) while reading up to offset {end}"
                )
        return None

    async def _out_of_range(self) -> None:
        tp, end = self._range.tp, self._range.end
        earliest = (await self._consumer.beginning_offsets([tp]))[tp]
        if earliest > self.position:
            lost_to = min(earliest, end)
            message = f"offsets {self.position} to {lost_to - 1} of {tp} are gone (the log now starts at {earliest})"
            if self._fail_on_data_loss:
                raise DataLossError(f"asyncconsumer source: {message}. {DATA_LOSS_HINT}")
            log.warning("asyncconsumer source: %s; skipping them (failOnDataLoss=false)", message)
            self.position = lost_to
        else:
            message = (
                f"offset {self.position} of {tp} is beyond the end of the log (the topic may have "
                f"been re-created); offsets {self.position} to {end - 1} cannot be read"
            )
            if self._fail_on_data_loss:
                raise DataLossError(f"asyncconsumer source: {message}. {DATA_LOSS_HINT}")
            log.warning("asyncconsumer source: %s; skipping them (failOnDataLoss=false)", message)
            self.position = end
        if not self.done:
            await self._consumer.seek(tp, self.position)


#: The column decoders of each executor consumer that has ``keyFormat``/``valueFormat`` set
#: (:func:`executor_session`): made on the consumer's event loop with its registry client, kept
#: with the consumer between tasks, so each writer schema is fetched once per consumer.
_DECODERS: weakref.WeakKeyDictionary[Consumer[Any, Any], tuple[ColumnDecoder | None, ColumnDecoder | None]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def executor_session(options: SourceOptions) -> AsyncIterator[Consumer[Any, Any]]:
    """An executor's consumer, with the schema registry client and column decoders of its
    ``keyFormat``/``valueFormat`` (closed with it), for a :class:`ConsumerSession`."""
    async with contextlib.AsyncExitStack() as stack:
        consumer = await stack.enter_async_context(executor_consumer(options))
        if options.formats:
            assert options.registry is not None
            client = await stack.enter_async_context(registry_client(options.registry))
            _DECODERS[consumer] = await column_decoders(options, client)
        yield consumer


def column_formats(consumer: Consumer[Any, Any]) -> tuple[ColumnDecoder | None, ColumnDecoder | None]:
    """The ``(key_format, value_format)`` of an :func:`executor_session`'s consumer."""
    return _DECODERS.get(consumer, (None, None))


def executor_consumer(options: SourceOptions) -> Consumer[Any, Any]:
    # A task's range is below the high watermark the driver saw: a fetch waits only past its end,
    # where nothing is wanted.  A kept consumer's next task waits for that fetch (one in flight per
    # broker): at 50 ms a kept consumer read 4 ranges in a row at 0.8x a new one's rate, at 5 ms 1.2x.
    # One range's partition at a time: fetch up to _EXECUTOR_PARTITION_FETCH_BYTES of it per round
    # trip (4 x 50,000 x 1 KiB read in one process: 0.26-0.49 s at 1 MiB, 0.10-0.13 s at 8 MiB).
    return source_consumer(options, "executor", **_executor_fetch_sizes(options.consumer_properties))


def _executor_fetch_sizes(props: Mapping[str, str]) -> dict[str, int]:
    """The executor's fetch sizes the user left open: ``max_partition_fetch_bytes``
    :data:`_EXECUTOR_PARTITION_FETCH_BYTES` (or the user's buffer, if smaller), and a buffer of two
    such fetches, at least :data:`_EXECUTOR_FETCH_BUFFER_BYTES`.  A size given but not a number is
    left to the config's own check, which names it."""
    given: dict[str, int] = {}
    for key, value in props.items():
        name = property_option(key)
        if name in ("max_partition_fetch_bytes", "fetch_buffer_bytes"):
            try:
                given[name] = int(value)
            except ValueError:
                return {}
    sizes: dict[str, int] = {}
    if "max_partition_fetch_bytes" not in given:
        sizes["max_partition_fetch_bytes"] = min(
            _EXECUTOR_PARTITION_FETCH_BYTES, given.get("fetch_buffer_bytes", _EXECUTOR_PARTITION_FETCH_BYTES)
        )
    if "fetch_buffer_bytes" not in given:
        partition = given.get("max_partition_fetch_bytes", _EXECUTOR_PARTITION_FETCH_BYTES)
        sizes["fetch_buffer_bytes"] = max(2 * partition, _EXECUTOR_FETCH_BUFFER_BYTES)
    return sizes


#: How many idle consumers an executor's Python worker keeps at most (the least recently used go first).
EXECUTOR_CACHE_CAPACITY = 8


@dataclass(slots=True)
class _Idle:
    key: tuple[tuple[str, str], ...]
    session: ConsumerSession
    since: float
    timeout: float


class ExecutorConsumers:
    """The executors' consumers, kept open between the tasks of one Python worker process.

    Spark's own Kafka source caches its consumers per executor; PySpark reuses its Python workers
    (``spark.python.worker.reuse``, on by default), so for ``consumerCacheTimeout`` (5 minutes by
    default, as Spark's cache; 0 turns it off) a worker keeps here, idle, the consumer of a task
    that read its range to the end, and the next task with the same ``kafka.*`` options
    takes it instead of connecting again (event loop, connections, ApiVersions, metadata).  The
    key is the ``kafka.*`` options the consumer is made from; anything else (offsets, headers,
    ``failOnDataLoss``) is per task.  An idle consumer is closed after ``consumerCacheTimeout``
    (a daemon thread watches the clock), when more than :data:`EXECUTOR_CACHE_CAPACITY` are idle,
    and when the process exits normally; with a timeout of 0 every task closes its own.  A task
    that fails or is stopped early closes its consumer instead of returning it, so a cached
    consumer never holds a half-read range; each task assigns and seeks its own partition.
    A forked child starts with an empty cache (the parent's connections stay the parent's).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, capacity: int = EXECUTOR_CACHE_CAPACITY) -> None:
        self._clock = clock
        self._capacity = capacity
        self._idle: list[_Idle] = []  # the least recently returned first
        self._lock = threading.Condition()
        self._evictor: threading.Thread | None = None
        #: Consumers started and consumers handed out again, for tests and the debug timings.
        self.created = 0
        self.reused = 0

    @staticmethod
    def key(options: SourceOptions) -> tuple[tuple[str, str], ...]:
        """What makes two tasks' consumers interchangeable: the ``kafka.*`` options they are made from,
        and the column formats and registry their decoders are made from."""
        key = tuple(sorted(options.consumer_properties.items()))
        if options.formats:
            registry = options.registry
            formats = (options.key_format, options.value_format, registry and (registry.url, registry.properties))
            key += (("formats", repr(formats)),)
        return key

    def acquire(self, options: SourceOptions) -> ConsumerSession:
        """An idle session for ``options`` (the most recently returned), or a new one (not started yet;
        always with ``consumerCacheTimeout`` 0, which neither takes nor keeps a consumer)."""
        if options.consumer_cache_timeout_ms <= 0:
            with self._lock:
                self.created += 1
            return ConsumerSession(lambda: executor_session(options))
        key = self.key(options)
        with self._lock:
            expired = self._take_expired()
            found = next((i for i in range(len(self._idle) - 1, -1, -1) if self._idle[i].key == key), None)
            idle = self._idle.pop(found) if found is not None else None
            if idle is not None:
                self.reused += 1
            else:
                self.created += 1
        _close_all(expired)
        if idle is not None:
            return idle.session
        return ConsumerSession(lambda: executor_session(options))

    def release(self, options: SourceOptions, session: ConsumerSession) -> None:
        """Keep ``session`` (whose task read its range to the end) for the next task, or close it."""
        timeout = options.consumer_cache_timeout_ms / 1000
        if timeout <= 0 or not session.started:
            session.close()
            return
        with self._lock:
            self._idle.append(_Idle(self.key(options), session, self._clock(), timeout))
            victims = self._take_expired()
            while len(self._idle) > self._capacity:
                victims.append(self._idle.pop(0).session)
            if self._idle and self._evictor is None:
                self._evictor = threading.Thread(target=self._evict, name="asyncconsumer-spark-evictor", daemon=True)
                self._evictor.start()
            self._lock.notify_all()
        _close_all(victims)

    @property
    def idle(self) -> int:
        """How many consumers are open and idle now."""
        with self._lock:
            return len(self._idle)

    def expire(self) -> int:
        """Close the consumers idle for longer than their timeout; how many were closed."""
        with self._lock:
            expired = self._take_expired()
        _close_all(expired)
        return len(expired)

    def close(self) -> None:
        """Close every idle consumer (at exit; harmless when there is none)."""
        with self._lock:
            victims = [i.session for i in self._idle]
            self._idle.clear()
            self._lock.notify_all()
        _close_all(victims)

    def forget(self) -> None:
        """After ``fork()``, in the child: the idle consumers belong to the parent (not closed here)."""
        self._idle = []
        self._lock = threading.Condition()
        self._evictor = None

    def _take_expired(self) -> list[ConsumerSession]:
        now = self._clock()
        expired = [i for i in self._idle if now - i.since >= i.timeout]
        self._idle = [i for i in self._idle if now - i.since < i.timeout]
        return [i.session for i in expired]

    def _evict(self) -> None:
        """The evictor thread: closes idle consumers as their time runs out; ends when none is left."""
        while True:
            with self._lock:
                expired = self._take_expired()
                if not self._idle and not expired:
                    self._evictor = None
                    return
                if not expired:
                    now = self._clock()
                    self._lock.wait(min(i.since + i.timeout - now for i in self._idle))
            _close_all(expired)


def _close_all(sessions: list[ConsumerSession]) -> None:
    for session in sessions:
        session.close()


#: This process's executor consumers (Spark runs each task of a Python worker in its main thread).
EXECUTOR_CONSUMERS = ExecutorConsumers()
atexit.register(EXECUTOR_CONSUMERS.close)
os.register_at_fork(after_in_child=EXECUTOR_CONSUMERS.forget)


def read_range(options: SourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow record batches with exactly the records of ``offset_range`` (runs on an executor).

    The consumer comes from :data:`EXECUTOR_CONSUMERS` and goes back there when the range was read
    to the end; on an error, or when Spark stops reading early, it is closed instead.
    """
    if offset_range.size <= 0:
        return
    debug = log.isEnabledFor(logging.DEBUG)
    began = time.perf_counter()
    if options.formats:
        require_avro()  # imported here, not on the consumer's event loop
    session = EXECUTOR_CONSUMERS.acquire(options)
    cached = session.started
    reader: RangeReader | None = None

    async def next_batch(consumer: Consumer[Any, Any]) -> pa.RecordBatch | None:
        nonlocal reader
        if reader is None:
            if debug:
                log.debug(
                    "timing: task %s pid %d, worker up %.3f s: %s consumer %.3f s",
                    offset_range,
                    os.getpid(),
                    time.monotonic() - _IMPORTED,
                    "cached" if cached else "new",
                    time.perf_counter() - began,
                )
            key_format, value_format = column_formats(consumer)
            reader = RangeReader(
                consumer,
                offset_range,
                fail_on_data_loss=options.fail_on_data_loss,
                poll_timeout=options.poll_timeout_ms / 1000,
                include_headers=options.include_headers,
                key_format=key_format,
                value_format=value_format,
            )
        # Columnar all the way (Consumer.arrow_batches()'s path): the fetched batches are decoded
        # straight into Arrow buffers, no Python object per record.
        return await reader.next_batch()

    async def park(consumer: Consumer[Any, Any]) -> None:
        consumer.assign([])  # nothing assigned, nothing fetched, while it waits for the next task

    try:
        first = True
        while (batch := session.run(next_batch)) is not None:
            if first and debug:
                log.debug("timing: task %s first batch %.3f s", offset_range, time.perf_counter() - began)
                first = False
            yield batch
        session.run(park)
    except BaseException:
        session.close()  # an error, or Spark stopped reading (GeneratorExit): never reused half-read
        raise
    if debug:
        log.debug("timing: task %s read %.3f s", offset_range, time.perf_counter() - began)
    EXECUTOR_CONSUMERS.release(options, session)


def read_ranges(options: SourceOptions, task: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """A task's record batches: :func:`read_range` of each of its ranges in turn (one consumer, kept
    between them as between tasks)."""
    for offset_range in task.offset_ranges:
        yield from read_range(options, offset_range)
