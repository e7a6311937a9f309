"""The ``asyncconsumer`` PySpark data source: batch and streaming readers.

Where things run:

- **Driver** (Spark's planner Python workers): option checks, listing the partitions of the
  subscription and resolving offsets (``earliest``/``latest``/JSON/timestamps), planning one input
  partition per Kafka offset range (split per ``minPartitions``/``maxRecordsPerPartition``), the
  streaming offsets (``initialOffset``/``latestOffset``/``prepareForTriggerAvailableNow``) and the
  optional commit of processed offsets to a consumer group.  The batch reader's planning opens a
  short-lived :class:`~asyncconsumer.Consumer` inside ``anyio.run``; a streaming query keeps its
  driver consumers across micro-batches (:class:`ConsumerSession`, closed when the query stops).
  Every lookup fetches fresh metadata, so new topics and partitions are seen.
- **Executors**: :meth:`read` reads exactly one offset range ``[start, end)`` with a Consumer using
  manual ``assign`` + ``seek`` on its own event loop (a blocking portal thread, so that record batches
  can be yielded to Spark while the consumer keeps its connections), and hands Arrow record batches
  to Spark.  A Python worker keeps that consumer for its next task, for ``consumerCacheTimeout``
  (5 minutes by default; :class:`ExecutorConsumers`), and leaves the objects of its imports out of
  the garbage collection PySpark runs after every task (:func:`_freeze_worker_imports`).

No consumer group is joined: offsets live in Spark's checkpoint.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import gc
import json
import logging
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import anyio.lowlevel
import pyarrow as pa
from anyio.from_thread import BlockingPortal
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..config import property_option
from ..consumer import Consumer
from ..errors import KafkaError, OffsetOutOfRangeError
from ..structs import ConsumerRecord, TopicPartition
from .arrow import spark_schema
from .options import EARLIEST, LATEST, OffsetSpec, SourceOptionError, SourceOptions, Subscription, parse_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "AsyncConsumerDataSource",
    "DataLossError",
    "KafkaBatchReader",
    "KafkaInputPartition",
    "KafkaStreamReader",
    "OffsetRange",
    "offsets_behind_latest",
    "register",
]

log = logging.getLogger("asyncconsumer.spark")

T = TypeVar("T")
S = TypeVar("S", bound=Sized)

#: The offset column of the Arrow batches (arrow.py's schema).
_OFFSET_COLUMN = 4

#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 8192
#: How long the driver waits for a fetch to report each partition's high watermark.
_PROBE_TIMEOUT = 10.0
#: How often the probe looks for the watermarks while its fetch is out (s): a fetch from the end
#: of the log brings no records, so each look waits this long.
_PROBE_POLL = 0.002
#: The driver's and the executors' ``fetch.max.wait.ms`` at most (ms): neither wants to wait at the
#: end of a log (the driver's probe wants only the watermark, an executor's range ends below it).
_FETCH_WAIT_MS = 5
#: An executor consumer's ``max.partition.fetch.bytes`` unless ``kafka.max.partition.fetch.bytes`` is
#: given (and at most a given ``kafka.fetch.buffer.bytes``).  A task reads one partition's range at
#: a time, so the Java default (1 MiB, a share of ``fetch.max.bytes`` for a consumer of many
#: partitions) would make it one round trip per MiB.
_EXECUTOR_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
#: ... and its ``fetch_buffer_bytes``: one response being read and the next one (the consumer's
#: 64 MiB default would let a slow task hold 64 MiB of its range).  Past the range's end a task
#: fetches nothing more once a fetch has reached it (``Consumer.fetch_until``).
_EXECUTOR_FETCH_BUFFER_BYTES = 2 * _EXECUTOR_PARTITION_FETCH_BYTES

_DATA_LOSS_HINT = (
    "Some data may have been lost because it is not available in Kafka any more: it was aged out by "
    "retention, or the topic was deleted or re-created before all of it was processed. To keep the "
    "query going and skip what is missing, set the source option failOnDataLoss to 'false'."
)


class DataLossError(RuntimeError):
    """Offsets the query should read are gone from Kafka (raised when ``failOnDataLoss`` is true)."""


def report_data_loss(options: SourceOptions, message: str) -> None:
    """Raise :class:`DataLossError` (``failOnDataLoss=true``, the default) or log a warning."""
    if options.fail_on_data_loss:
        raise DataLossError(f"asyncconsumer source: {message}. {_DATA_LOSS_HINT}")
    log.warning("asyncconsumer source: %s. Some data may have been lost (failOnDataLoss=false).", message)


#: When this module was imported: the debug timings say how long a Python worker had been up.
_IMPORTED = time.monotonic()


@contextlib.contextmanager
def _timed(what: str) -> Iterator[None]:
    """Log ``what`` and its duration at DEBUG on ``asyncconsumer.spark`` (``timing: <what> <s>``).

    Where a streaming query's time goes (driver calls, each task's consumer start, first batch and
    read); nothing is measured unless DEBUG is on for the logger.
    """
    if not log.isEnabledFor(logging.DEBUG):
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        log.debug("timing: %s %.3f s", what, time.perf_counter() - began)


# ------------------------------------------------------------------------------ offset ranges


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one Kafka partition."""

    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


class KafkaInputPartition(InputPartition):
    """One Spark task: read ``[start, end)`` of ``topic``/``partition``, then each of ``more`` in
    turn (small ranges packed into one task, ``minRecordsPerTask``)."""

    def __init__(self, topic: str, partition: int, start: int, end: int, more: Sequence[OffsetRange] = ()) -> None:
        rest = tuple((r.tp.topic, r.tp.partition, r.start, r.end) for r in more)
        super().__init__((topic, partition, start, end, *rest))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.more = rest

    @classmethod
    def of(cls, ranges: Sequence[OffsetRange]) -> KafkaInputPartition:
        """The task that reads ``ranges`` (one or more) in order."""
        first = ranges[0]
        return cls(first.tp.topic, first.tp.partition, first.start, first.end, ranges[1:])

    @property
    def offset_range(self) -> OffsetRange:
        return OffsetRange(TopicPartition(self.topic, self.partition), self.start, self.end)

    @property
    def offset_ranges(self) -> list[OffsetRange]:
        """Every range this task reads, in order."""
        return [self.offset_range, *(OffsetRange(TopicPartition(t, p), a, b) for t, p, a, b in self.more)]


def plan_tasks(ranges: Sequence[OffsetRange], options: SourceOptions) -> list[KafkaInputPartition]:
    """The tasks of one read: :func:`split_ranges` (Spark's rules), then, unless ``minPartitions`` or
    ``maxRecordsPerPartition`` asks for task sizes, the ranges smaller than ``minRecordsPerTask``
    packed together (:func:`pack_ranges`)."""
    pieces = split_ranges(ranges, options.min_partitions, options.max_records_per_partition)
    sized = options.min_partitions is not None or options.max_records_per_partition is not None
    per_task = 0 if sized else options.min_records_per_task
    return [KafkaInputPartition.of(group) for group in pack_ranges(pieces, per_task)]


def pack_ranges(ranges: Sequence[OffsetRange], min_records: int) -> list[list[OffsetRange]]:
    """``ranges`` grouped into tasks, in order: a range of ``min_records`` or more is a task of its
    own; smaller ones are gathered until their group holds ``min_records`` (the last group may hold
    fewer).  ``min_records`` 0 keeps one range per task."""
    groups: list[list[OffsetRange]] = []
    small: list[OffsetRange] = []
    held = 0
    for r in ranges:
        if r.size >= min_records:
            groups.append([r])
            continue
        small.append(r)
        held += r.size
        if held >= min_records:
            groups.append(small)
            small, held = [], 0
    if small:
        groups.append(small)
    return groups


def split_ranges(
    ranges: Sequence[OffsetRange], min_partitions: int | None = None, max_records_per_partition: int | None = None
) -> list[OffsetRange]:
    """Spark input partitions for ``ranges``, by the rules of Spark's ``KafkaOffsetRangeCalculator``.

    Empty ranges are dropped.  ``maxRecordsPerPartition`` first cuts each range into
    ``ceil(size / max)`` equal pieces.  Then, if there are fewer pieces than ``minPartitions``,
    each piece gets ``round(size / total * minPartitions)`` parts (at least 1, Java's rounding);
    the pieces that get one part are set aside (with every piece of their Kafka partition), and the
    others share ``minPartitions - (pieces set aside)`` in proportion to their sizes among
    themselves.  A piece
    is cut into parts whose sizes differ by at most one, the remainder going to the last parts.
    The result is about ``minPartitions`` tasks, as in Spark (6 for 120k/90k/60k/30k records).
    """
    pieces = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        pieces = [p for r in pieces for p in _cut(r, -(-r.size // max_records_per_partition))]
    if min_partitions is None or min_partitions <= len(pieces):
        return pieces
    total = sum(r.size for r in pieces)
    whole = [r for r in pieces if _part_count(r.size, total, min_partitions) == 1]
    whole_tps = {r.tp for r in whole}
    rest_total = total - sum(r.size for r in whole)
    rest_parts = max(min_partitions - len(whole), 1)
    return [
        p
        for r in pieces
        for p in _cut(r, 1 if r.tp in whole_tps else _part_count(r.size, rest_total, rest_parts))
        if p.size > 0
    ]


def _part_count(size: int, total: int, parts: int) -> int:
    """``max(Math.round(size / total * parts), 1)`` with Java's double arithmetic and rounding."""
    return max(_java_round(size / total * parts), 1)


def _java_round(value: float) -> int:
    """Java's ``Math.round(double)``: the closest integer, halves rounded up (not to even)."""
    below = math.floor(value)
    return below + 1 if value - below >= 0.5 else below


def _cut(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` contiguous pieces: each takes ``remaining // parts left`` offsets."""
    out: list[OffsetRange] = []
    start, remaining = r.start, r.size
    for part in range(parts):
        size = remaining // (parts - part)
        remaining -= size
        end = min(start + size, r.end)
        out.append(OffsetRange(r.tp, start, end))
        start = end
    return out


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_records: int
) -> dict[TopicPartition, int]:
    """End offsets admitting about ``max_records`` records, shared in proportion to backlog.

    Spark's arithmetic exactly (``KafkaMicroBatchStream.rateLimit``): a partition with a backlog
    of ``size`` out of ``total`` gets ``max_records * (size / total)`` in doubles, rounded down,
    or up when below 1 (a small partition is not starved, so the total may exceed the limit by a
    few records), and never past its latest offset.  ``start`` must hold every partition of
    ``latest`` that is to be limited; a partition missing from it keeps its latest offset.
    """
    backlog = {tp: end - start[tp] for tp, end in latest.items() if tp in start and end - start[tp] > 0}
    total = float(sum(backlog.values()))
    if total < 1:
        return dict(latest)
    result = dict(latest)
    for tp, size in backlog.items():
        share = max_records * (size / total)
        admitted = math.ceil(share) if share < 1 else math.floor(share)
        result[tp] = min(latest[tp], start[tp] + admitted)
    return result


# ------------------------------------------------------------------------ driver: offsets


class OffsetLookup(Protocol):
    """What the driver needs from Kafka (a Consumer in production, a fake in unit tests)."""

    async def partitions(self, subscription: Subscription) -> list[TopicPartition]: ...

    async def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]: ...


class ConsumerOffsetLookup:
    """:class:`OffsetLookup` backed by a started :class:`~asyncconsumer.Consumer` (no group)."""

    def __init__(self, consumer: Consumer[Any, Any], *, read_committed: bool = False) -> None:
        self._consumer = consumer
        self._read_committed = read_committed

    async def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        c = self._consumer
        if subscription.kind == "assign":
            wanted = subscription.partitions
            found: dict[str, set[int] | None] = {}
            for topic in sorted({tp.topic for tp in wanted}):
                found[topic] = await c.partitions_for_topic(topic)
            missing = [tp for tp in wanted if tp.partition not in (found[tp.topic] or set())]
            if missing:
                raise SourceOptionError(
                    "asyncconsumer source: option 'assign' names partitions that do not exist: "
                    + ", ".join(str(tp) for tp in missing)
                )
            return sorted(wanted)
        if subscription.kind == "subscribe":
            topics: list[str] = list(subscription.topics)
        else:
            topics = sorted(t for t in await c.topics() if subscription.matches(t))
        result: list[TopicPartition] = []
        for topic in topics:
            numbers = await c.partitions_for_topic(topic)
            if numbers is None:
                log.warning("asyncconsumer source: topic %r does not exist (yet); it has no partitions to read", topic)
                continue
            result.extend(TopicPartition(topic, p) for p in sorted(numbers))
        return sorted(result)

    async def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        found = await self._consumer.beginning_offsets(tps)
        return {tp: _checked(found.get(tp, -1), tp, "earliest") for tp in tps}

    async def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The end of each partition: the larger of ListOffsets(latest) and a fetch's high watermark.

        ListOffsets can lag the log end on some Kafka-compatible brokers (Tansu answers with the
        start of the last batch); a Fetch response carries the true high watermark (or the last
        stable offset with ``read_committed``), so each partition is fetched once from the listed
        end and the larger value wins.
        """
        if not tps:
            return {}
        c = self._consumer
        listed = await c.end_offsets(tps)
        watermarks = await _probe_high_watermarks(c, tps, listed, read_committed=self._read_committed)
        result = {}
        for tp in tps:
            best = max(listed.get(tp, -1), watermarks.get(tp, -1))
            result[tp] = _checked(best, tp, "latest")
        return result

    async def for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        if not timestamps:
            return {}
        found = await self._consumer.offsets_for_times(dict(timestamps))
        return {tp: (r.offset if r is not None and r.offset >= 0 else None) for tp, r in found.items()}


def _checked(offset: int, tp: TopicPartition, what: str) -> int:
    if offset < 0:
        raise KafkaError(f"could not look up the {what} offset of {tp} (is its leader available?)")
    return offset


async def _probe_high_watermarks(
    consumer: Consumer[Any, Any],
    tps: Sequence[TopicPartition],
    listed: Mapping[TopicPartition, int],
    *,
    read_committed: bool,
) -> dict[TopicPartition, int]:
    # ListOffsets "latest" can lag behind the log end on some brokers (Tansu); the high watermark a
    # fetch response reports does not.  Fetch once from the listed end of each partition.
    consumer.assign(tps)
    for tp in tps:
        await consumer.seek(tp, max(0, listed.get(tp, 0)))
    mark = consumer.last_stable_offset if read_committed else consumer.highwater
    found: dict[TopicPartition, int] = {}
    with anyio.move_on_after(_PROBE_TIMEOUT):
        while len(found) < len(tps):
            try:
                await consumer.getmany(timeout=_PROBE_POLL, max_records=1)
            except OffsetOutOfRangeError:
                break  # the listed end is past the log: the listed values stand
            found.update({tp: m for tp in tps if (m := mark(tp)) is not None})
    consumer.assign([])
    return found


async def resolve_offsets(
    lookup: OffsetLookup, spec: OffsetSpec, tps: Sequence[TopicPartition], *, starting: bool
) -> dict[TopicPartition, int]:
    """Turn ``spec`` into concrete offsets for ``tps``."""
    if not tps:
        return {}
    if spec.kind == "earliest":
        return await lookup.earliest(tps)
    if spec.kind == "latest":
        return await lookup.latest(tps)
    if spec.kind == "offsets":
        given = spec.offsets_map
        _require_all(spec, given, tps)
        earliest = await lookup.earliest([tp for tp in tps if given[tp] == EARLIEST])
        latest = await lookup.latest([tp for tp in tps if given[tp] == LATEST])
        return {
            tp: earliest[tp] if given[tp] == EARLIEST else latest[tp] if given[tp] == LATEST else given[tp]
            for tp in tps
        }
    if spec.kind == "timestamp":
        wanted = {tp: spec.timestamp for tp in tps}
    else:
        wanted = spec.timestamps_map
        _require_all(spec, wanted, tps)
        wanted = {tp: wanted[tp] for tp in tps}
    found = await lookup.for_times(wanted)
    missing = [tp for tp in tps if found.get(tp) is None]
    if missing and starting and spec.strategy == "error":
        raise SourceOptionError(
            f"asyncconsumer source: option {spec.option!r}: no record at or after the timestamp in "
            + ", ".join(f"{tp} (timestamp {wanted[tp]})" for tp in missing)
            + "; set startingOffsetsByTimestampStrategy to 'latest' to start at the end instead"
        )
    latest = await lookup.latest(missing)
    return {tp: latest[tp] if tp in latest else _not_none(found[tp]) for tp in tps}


def _not_none(value: int | None) -> int:
    assert value is not None
    return value


def _require_all(spec: OffsetSpec, given: Mapping[TopicPartition, int], tps: Sequence[TopicPartition]) -> None:
    missing = [tp for tp in tps if tp not in given]
    extra = sorted(set(given) - set(tps))
    if missing:
        raise SourceOptionError(
            f"asyncconsumer source: option {spec.option!r} must give every partition to read; missing: "
            + ", ".join(str(tp) for tp in missing)
            + " (use -2 for earliest, -1 for latest)"
        )
    if extra:
        raise SourceOptionError(
            f"asyncconsumer source: option {spec.option!r} names partitions that do not exist: "
            + ", ".join(str(tp) for tp in extra)
        )


def _driver_consumer(options: SourceOptions, **overrides: Any) -> Consumer[Any, Any]:
    # The high-watermark probe fetches from the end of the log for the watermark alone: answer
    # quickly (_source_consumer's fetch wait), with little data.  With a 50 ms wait a latest() took
    # 128 ms on Apache Kafka (an idle partition's log end parks the fetch), with 5 ms 36 ms, most
    # of it the ListOffsets answer.
    return _source_consumer(
        options, "driver", **{"max_partition_fetch_bytes": 1024, "fetch_max_bytes": 1024 * 1024, **overrides}
    )


def _source_consumer(options: SourceOptions, role: str, **settings: Any) -> Consumer[Any, Any]:
    """A consumer of the driver or an executor (``role``): no group, no offset reset, and fetches
    that wait at most ``_FETCH_WAIT_MS``.  Not 0: Tansu answers a Fetch that may not wait with no
    partition data (no high watermark), and the driver's probe would give up on it."""
    props = options.consumer_properties
    base: dict[str, Any] = {"auto_offset_reset": "none", "enable_auto_commit": False, "group_id": None}
    if "client.id" not in props:
        base["client_id"] = f"asyncconsumer-spark-{role}"
    base["fetch_max_wait_ms"] = min(_FETCH_WAIT_MS, int(props.get("fetch.max.wait.ms", "500")))
    return Consumer.from_properties(props, **{**base, **settings})


def _group_consumer(options: SourceOptions) -> Consumer[Any, Any]:
    """The consumer that commits processed offsets to the monitoring group (never joins it)."""
    return Consumer.from_properties(
        options.consumer_properties, group_id=options.group_id, enable_auto_commit=False, auto_offset_reset="none"
    )


def run_on_driver(options: SourceOptions, work: Callable[[OffsetLookup], Awaitable[T]]) -> T:
    """Run ``work`` with a fresh consumer on a fresh event loop (Spark calls the readers synchronously)."""

    async def main() -> T:
        async with _driver_consumer(options) as consumer:
            return await work(ConsumerOffsetLookup(consumer, read_committed=options.read_committed))

    return anyio.run(main)


class ConsumerSession:
    """A consumer on an event loop of its own, kept across calls: the driver's offset planning for
    a whole streaming query, an executor's reads for the tasks of one Python worker.

    Spark calls a stream reader's driver methods (``initialOffset``, ``latestOffset``,
    ``partitions``, ``commit``) one after another in one long-lived Python worker, each one
    synchronously, and an executor's Python worker runs its tasks one after another.  Rather than
    a consumer per call (connections, ApiVersions and metadata every time), the session starts
    ``make()``'s consumer on an event loop of its own (a blocking portal thread) on first use and
    runs each call's work there.  Each driver lookup still asks Kafka afresh: ``partitions``/``topics``
    fetch new metadata every time, so new topics and partitions are seen.  A call that fails closes
    the session (the next one starts a new consumer: nothing half-done is kept); :meth:`close` ends
    it, and the stream reader's ``stop()`` calls that when the query stops.
    """

    def __init__(self, make: Callable[[], Consumer[Any, Any]]) -> None:
        self._make = make
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._consumer: Consumer[Any, Any] | None = None
        #: Consumers started so far (one for a whole query unless a call failed).
        self.starts = 0

    @property
    def started(self) -> bool:
        """Whether the session's consumer is running now."""
        return self._consumer is not None

    def run(self, work: Callable[[Consumer[Any, Any]], Awaitable[T]]) -> T:
        """``work(consumer)`` on the session's event loop; its result, or its error (the session is closed then)."""
        if self._portal is None or self._consumer is None:
            self._start()
        assert self._portal is not None and self._consumer is not None
        try:
            return self._portal.call(work, self._consumer)
        except BaseException:
            self.close()
            raise

    @_timed("consumer start (event loop, connection, metadata)")
    def _start(self) -> None:
        stack = contextlib.ExitStack()
        try:
            portal = stack.enter_context(_daemon_portal())
            consumer = stack.enter_context(portal.wrap_async_context_manager(self._make()))
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal, self._consumer = stack, portal, consumer
        self.starts += 1

    def close(self) -> None:
        """Close the consumer and stop its event loop; harmless when not started or closed already."""
        stack, self._stack, self._portal, self._consumer = self._stack, None, None, None
        if stack is None:
            return
        try:
            stack.close()
        except Exception as exc:  # closing must not fail the query's shutdown
            log.warning("asyncconsumer source: closing the driver's consumer failed: %s", exc)


@contextlib.contextmanager
def _daemon_portal() -> Iterator[BlockingPortal]:
    """A blocking portal whose event loop runs in a daemon thread: a session the query never stopped
    (Spark's worker exiting, a test dropping a reader) must not keep the interpreter from exiting,
    as ``start_blocking_portal``'s pool thread would."""
    handed: queue.Queue[BlockingPortal | BaseException] = queue.Queue(1)

    async def serve() -> None:
        async with BlockingPortal() as portal:
            handed.put(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:  # handed over when it failed before the portal existed
            if handed.empty():
                handed.put(exc)

    thread = threading.Thread(target=run, name="asyncconsumer-spark-driver", daemon=True)
    thread.start()
    got = handed.get()
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        got.call(got.stop)
        thread.join()


def lookup_with(
    options: SourceOptions, work: Callable[[OffsetLookup], Awaitable[T]]
) -> Callable[[Consumer[Any, Any]], Awaitable[T]]:
    """``work`` for :meth:`ConsumerSession.run`: given the session's consumer as an :class:`OffsetLookup`."""

    async def run(consumer: Consumer[Any, Any]) -> T:
        return await work(ConsumerOffsetLookup(consumer, read_committed=options.read_committed))

    return run


# ----------------------------------------------------------------------- executors: reading


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
    ) -> None:
        self._consumer = consumer
        self._include_headers = include_headers
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
                tp, timeout=timeout, max_records=self._max_records, include_headers=self._include_headers
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
                raise DataLossError(f"asyncconsumer source: {message}. {_DATA_LOSS_HINT}")
            log.warning("asyncconsumer source: %s; skipping them (failOnDataLoss=false)", message)
            self.position = lost_to
        else:
            message = (
                f"offset {self.position} of {tp} is beyond the end of the log (the topic may have "
                f"been re-created); offsets {self.position} to {end - 1} cannot be read"
            )
            if self._fail_on_data_loss:
                raise DataLossError(f"asyncconsumer source: {message}. {_DATA_LOSS_HINT}")
            log.warning("asyncconsumer source: %s; skipping them (failOnDataLoss=false)", message)
            self.position = end
        if not self.done:
            await self._consumer.seek(tp, self.position)


def _executor_consumer(options: SourceOptions) -> Consumer[Any, Any]:
    # A task's range is below the high watermark the driver saw: a fetch waits only past its end,
    # where nothing is wanted.  A kept consumer's next task waits for that fetch (one in flight per
    # broker): at 50 ms a kept consumer read 4 ranges in a row at 0.8x a new one's rate, at 5 ms 1.2x.
    # One range's partition at a time: fetch up to _EXECUTOR_PARTITION_FETCH_BYTES of it per round
    # trip (4 x 50,000 x 1 KiB read in one process: 0.26-0.49 s at 1 MiB, 0.10-0.13 s at 8 MiB).
    return _source_consumer(options, "executor", **_executor_fetch_sizes(options.consumer_properties))


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
        """What makes two tasks' consumers interchangeable: the ``kafka.*`` options they are made from."""
        return tuple(sorted(options.consumer_properties.items()))

    def acquire(self, options: SourceOptions) -> ConsumerSession:
        """An idle session for ``options`` (the most recently returned), or a new one (not started yet;
        always with ``consumerCacheTimeout`` 0, which neither takes nor keeps a consumer)."""
        if options.consumer_cache_timeout_ms <= 0:
            with self._lock:
                self.created += 1
            return ConsumerSession(lambda: _executor_consumer(options))
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
        return ConsumerSession(lambda: _executor_consumer(options))

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
            reader = RangeReader(
                consumer,
                offset_range,
                fail_on_data_loss=options.fail_on_data_loss,
                poll_timeout=options.poll_timeout_ms / 1000,
                include_headers=options.include_headers,
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


# ----------------------------------------------------------------------------- the source


def _offsets_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's Kafka offset layout, ``{"topic": {"0": 42}}``, in a canonical order."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def _offsets_from_json(obj: Mapping[str, Any]) -> dict[TopicPartition, int]:
    result: dict[TopicPartition, int] = {}
    for topic, per in obj.items():
        for partition, offset in per.items():
            result[TopicPartition(topic, int(partition))] = int(offset)
    return result


class AsyncConsumerDataSource(DataSource):
    """``spark.read.format("asyncconsumer")`` and ``spark.readStream.format("asyncconsumer")``."""

    @classmethod
    def name(cls) -> str:
        return "asyncconsumer"

    @_timed("planner schema")
    def schema(self) -> StructType:
        parsed = parse_options(self.options)  # fails early (at load()) on bad options
        return spark_schema(parsed.include_headers)

    @_timed("planner reader")
    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(_checked_schema(parse_options(self.options, streaming=False), schema))

    @_timed("planner streamReader")
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(_checked_schema(parse_options(self.options, streaming=True), schema))


def _checked_schema(options: SourceOptions, schema: StructType) -> SourceOptions:
    expected = spark_schema(options.include_headers)
    if schema != expected:
        raise SourceOptionError(
            "asyncconsumer source: the source has a fixed schema (Spark's Kafka columns) and cannot be read "
            f"with another one; remove .schema(...). Expected {expected.simpleString()}, got {schema.simpleString()}"
        )
    return options


class KafkaBatchReader(DataSourceReader):
    """Batch: the offset ranges are fixed on the driver when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return plan_tasks(run_on_driver(self.options, self._plan), self.options)

    async def _plan(self, lookup: OffsetLookup) -> list[OffsetRange]:
        o = self.options
        tps = await lookup.partitions(o.subscription)
        start = await resolve_offsets(lookup, o.starting, tps, starting=True)
        ending = o.ending or OffsetSpec("latest", option="endingOffsets")
        end = await resolve_offsets(lookup, ending, tps, starting=False)
        if ending.kind == "offsets":
            explicit = [tp for tp, off in ending.offsets if off >= 0]
            latest = await lookup.latest(explicit)
            beyond = [tp for tp in explicit if end[tp] > latest[tp]]
            if beyond:
                raise SourceOptionError(
                    "asyncconsumer source: endingOffsets are beyond the end of the log for "
                    + ", ".join(f"{tp} ({end[tp]} > latest {latest[tp]})" for tp in beyond)
                )
        backwards = [tp for tp in tps if start[tp] > end[tp]]
        if backwards:
            raise SourceOptionError(
                "asyncconsumer source: the starting offset is after the ending offset for "
                + ", ".join(f"{tp} ({start[tp]} > {end[tp]})" for tp in backwards)
            )
        return [OffsetRange(tp, start[tp], end[tp]) for tp in tps]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # nothing to read: Spark reads one partition of its own when partitions() is []
        return read_ranges(self.options, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming: the source offset is ``{"topic": {"partition": next offset}}`` (Spark's layout)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._available_now_target: dict[TopicPartition, int] | None = None
        self._last_latest: dict[TopicPartition, int] | None = None
        self._last_committed: dict[TopicPartition, int] | None = None
        #: When the last micro-batch was admitted (ms, the wall clock), for minOffsetsPerTrigger.
        self._last_trigger_ms = 0
        #: The clock of minOffsetsPerTrigger/maxTriggerDelay (ms); tests give a fake one.
        self.clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
        #: The driver's consumers, kept across micro-batches: offset planning, and the commits to
        #: the monitoring group (started when first used; closed by stop()).
        self._planner = ConsumerSession(lambda: _driver_consumer(options))
        self._committer = ConsumerSession(lambda: _group_consumer(options))

    def _plan(self, work: Callable[[OffsetLookup], Awaitable[T]]) -> T:
        return self._planner.run(lookup_with(self.options, work))

    # -- offsets (driver) -------------------------------------------------------------------------

    @_timed("driver initialOffset")
    def initialOffset(self) -> dict[str, Any]:
        target = self._available_now_target

        async def work(lookup: OffsetLookup) -> dict[TopicPartition, int]:
            if target is None:
                tps = await lookup.partitions(self.options.subscription)
                return await resolve_offsets(lookup, self.options.starting, tps, starting=True)
            # availableNow: Spark asks for the target first.  A partition created since, or a
            # "latest" start past the target (records produced since), belongs to a later query;
            # left in, it would look like a partition gone or an offset gone back (data loss).
            offsets = await resolve_offsets(lookup, self.options.starting, sorted(target), starting=True)
            return {tp: min(offset, target[tp]) for tp, offset in offsets.items()}

        return _offsets_json(self._plan(work))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows`` with ``maxOffsetsPerTrigger``, else ``ReadMinRows`` with
        ``minOffsetsPerTrigger``, else everything.  Python sources have no composite limit, so
        with both options the minimum (and ``maxTriggerDelay``) is applied by :meth:`latestOffset`
        from the options, whatever limit Spark passes, unless it passes ``ReadAllAvailable``."""
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return super().getDefaultReadLimit()

    @_timed("driver prepareForTriggerAvailableNow")
    def prepareForTriggerAvailableNow(self) -> None:
        async def work(lookup: OffsetLookup) -> dict[TopicPartition, int]:
            return await lookup.latest(await lookup.partitions(self.options.subscription))

        self._available_now_target = self._plan(work)
        log.info("asyncconsumer source: availableNow reads up to %s", self._available_now_target)

    @_timed("driver latestOffset")
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _offsets_from_json(start)
        self._commit_processed(begin)

        async def work(lookup: OffsetLookup) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
            target = self._available_now_target
            if target is None:
                latest = await lookup.latest(await lookup.partitions(self.options.subscription))
            else:
                # availableNow: never past the offsets recorded when the query started; partitions
                # created since then are left for a later query.
                latest = dict(target)
            return latest, await lookup.earliest([tp for tp in latest if tp not in begin])

        new_earliest: dict[TopicPartition, int] = {}
        if self._available_now_target is not None and all(tp in begin for tp in self._available_now_target):
            latest = dict(self._available_now_target)  # nothing to ask Kafka
        else:
            latest, new_earliest = self._plan(work)
        self._last_latest = latest
        if not isinstance(limit, ReadAllAvailable) and self._delay_batch(begin, latest):
            return _offsets_json(begin)
        known = {**begin, **new_earliest}
        end = dict(latest)
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(known, latest, limit.max_rows)
        # A partition whose end went backwards is reported (data loss) when the batch is planned;
        # partitions that disappeared are kept out of the offset and reported there too.
        return _offsets_json(end)

    def _delay_batch(self, begin: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> bool:
        """Whether to skip this trigger for ``minOffsetsPerTrigger`` (Spark's ``delayBatch``).

        A batch runs once ``maxTriggerDelay`` has passed since the last one, or once there are at
        least ``minOffsetsPerTrigger`` new offsets (a partition missing from ``begin`` counts from
        offset 0, as in Spark).  An availableNow query never waits: it would wait for records
        that are not coming.
        """
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or self._available_now_target is not None:
            return False
        now = self.clock_ms()
        if now - self._last_trigger_ms >= self.options.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        if sum(offset - begin.get(tp, 0) for tp, offset in latest.items()) < minimum:
            return True
        self._last_trigger_ms = now
        return False

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _offsets_json(self._last_latest) if self._last_latest is not None else None

    @_timed("driver partitions")
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _offsets_from_json(start)
        until = _offsets_from_json(end)
        o = self.options
        gone = sorted(set(begin) - set(until))
        if gone:
            report_data_loss(o, "partitions " + ", ".join(map(str, gone)) + " are gone (topic deleted?)")
        new = [tp for tp in until if tp not in begin]
        if new:
            earliest = self._plan(lambda lookup: lookup.earliest(new))
            for tp in new:
                if earliest[tp] != 0:
                    report_data_loss(o, f"added partition {tp} starts at offset {earliest[tp]} instead of 0")
            begin = {**begin, **earliest}
        ranges = []
        for tp in sorted(until):
            if until[tp] < begin[tp]:
                report_data_loss(
                    o,
                    f"the offset of {tp} went back from {begin[tp]} to {until[tp]} "
                    "(topic re-created or log truncated?)",
                )
                continue
            ranges.append(OffsetRange(tp, begin[tp], until[tp]))
        return plan_tasks(ranges, o)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_ranges(self.options, partition)

    @_timed("driver commit")
    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished the batch ending at ``end``: record it in the lag-monitoring group, if any."""
        self._commit_processed(_offsets_from_json(end))

    def _commit_processed(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` to ``groupIdPrefix``/``kafka.group.id`` (monitoring only; never fails the query).

        Spark calls :meth:`commit` for a batch only when it plans the next one, so the last batch of
        an availableNow run would never be committed; :meth:`latestOffset` therefore commits its
        ``start`` too (the end of the previous batch, which Spark has finished by then).
        """
        group_id = self.options.group_id
        if group_id is None or not offsets or offsets == self._last_committed:
            return

        async def commit(consumer: Consumer[Any, Any]) -> None:
            await consumer.commit(offsets)

        try:
            self._committer.run(commit)
            self._last_committed = dict(offsets)
        except Exception as exc:
            log.warning("asyncconsumer source: committing offsets to group %r failed: %s", group_id, exc)

    @_timed("driver stop")
    def stop(self) -> None:
        """The query stopped: close the driver's consumers (Spark calls this in the reader's worker)."""
        self._planner.close()
        self._committer.close()

    def __getstate__(self) -> dict[str, Any]:
        # Only the options travel to the executors (the driver's consumers stay where they are).
        return {
            "options": self.options,
            "_available_now_target": None,
            "_last_latest": None,
            "_last_committed": None,
            "_last_trigger_ms": 0,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        options = self.options
        self._planner = ConsumerSession(lambda: _driver_consumer(options))
        self._committer = ConsumerSession(lambda: _group_consumer(options))
        self.clock_ms = lambda: time.time_ns() // 1_000_000


def offsets_behind_latest(source_progress: Mapping[str, Any]) -> dict[str, str]:
    """Spark's Kafka lag metrics for one source of a streaming query's progress.

    ``source_progress`` is an entry of ``query.lastProgress["sources"]`` (or of a
    ``StreamingQueryListener`` event's ``progress.sources``, as a dict).  Returns
    ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and ``avgOffsetsBehindLatest``, as
    Spark's own Kafka source reports them in the progress's ``metrics``, computed from the
    progress's ``latestOffset`` (what Kafka had when the batch was planned) and ``endOffset``
    (where the batch ended); empty when the progress has neither.  PySpark's Python data sources
    cannot put custom metrics in the progress themselves (their micro-batch stream does not
    implement ``ReportsSourceMetrics``), so this computes them from what the progress has.
    """

    def parsed(value: Any) -> dict[TopicPartition, int]:
        if isinstance(value, str):
            value = json.loads(value) if value.strip().startswith("{") else None
        return _offsets_from_json(value) if isinstance(value, Mapping) else {}

    latest = parsed(source_progress.get("latestOffset"))
    consumed = parsed(source_progress.get("endOffset"))
    if not latest or not consumed:
        return {}
    behind = [offset - consumed.get(tp, 0) for tp, offset in latest.items()]
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": repr(sum(behind) / len(behind)),
    }


def register(spark: SparkSession, *, prefer_installed_pyspark: bool = True) -> None:
    """Register the ``"asyncconsumer"`` format with ``spark`` (once per session; repeating is harmless).

    ``prefer_installed_pyspark`` (default on): the Python processes Spark starts for this source
    (the driver's planners and each streaming query's source runner, the executors' workers) import
    PySpark and py4j from their installed packages, which have bytecode, instead of Spark's
    ``pyspark.zip`` and py4j zip, which have none, wherever both are the same version: a new
    process then starts about 1 s sooner (docs/spark.md, Faster query start).  It does so by
    putting a directory with a ``sitecustomize`` (``asyncconsumer/spark/_startup``) on those
    processes' ``PYTHONPATH``, before everything but Spark's own zips; the ``sitecustomize`` it
    hides still runs.  Off, the source's processes are started like every other Python process of
    the session.  Needs a classic session (``spark.sparkContext``); with Spark Connect the server
    starts them as usual.

    The first call in a process also logs at INFO when new processes would still compile PySpark
    (its ``pyspark.zip`` has no bytecode for the driver's Python and is not deferred), with the
    command that adds it.
    """
    startup = _startup_pythonpath(spark) if prefer_installed_pyspark else contextlib.nullcontext(False)
    with startup as applied:
        spark.dataSource.register(AsyncConsumerDataSource)
    global _PRECOMPILE_CHECKED
    if not _PRECOMPILE_CHECKED:
        _PRECOMPILE_CHECKED = True
        from .precompile import is_precompiled, zips_deferred

        if is_precompiled() is False and not (applied and zips_deferred()):
            log.info(
                "PySpark's pyspark.zip has no bytecode for this Python: each streaming query's Python "
                "process compiles PySpark again before its first micro-batch (about 1 s). "
                "'python -m asyncconsumer.spark.precompile', run with the Python Spark's workers use, "
                "adds it (docs/spark.md, Faster query start)."
            )


#: Whether :func:`register` has looked at PySpark's zip in this process.
_PRECOMPILE_CHECKED = False

#: The directory :func:`register` puts first on the ``PYTHONPATH`` of the source's Python
#: processes: it holds only ``sitecustomize.py`` (``_startup/sitecustomize.py`` tells why).
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup")


@contextlib.contextmanager
def _startup_pythonpath(spark: SparkSession) -> Iterator[bool]:
    """While registering: :data:`STARTUP_DIR` first on the ``PYTHONPATH`` that PySpark gives the
    data source's Python processes (``SparkContext.environment``, copied into the source's Python
    function when it is registered), restored after; yields whether it could (not with Spark
    Connect, which has no ``SparkContext`` here).  A Python function another thread wraps in that
    moment gets the directory too (harmless: its processes start faster, in a pool of their own)."""
    environment: dict[str, str] | None
    try:
        environment = spark.sparkContext.environment
    except Exception:  # Spark Connect, or a session that is not PySpark's
        environment = None
    if environment is None:
        yield False
        return
    before = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (STARTUP_DIR, before) if p)
    try:
        yield True
    finally:
        if before is None:
            environment.pop("PYTHONPATH", None)
        else:
            environment["PYTHONPATH"] = before


# ------------------------------------------------------------------ the worker's garbage collector


def _in_reused_pyspark_worker() -> bool:
    """Whether this process is a Python worker forked by PySpark's daemon and kept for further tasks
    (``spark.python.worker.reuse``, on by default): the daemon runs a full ``gc.collect()`` in it
    after every task."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "pyspark.daemon" and bool(os.environ.get("SPARK_REUSE_WORKER"))


def _freeze_worker_imports() -> bool:
    """In a reused PySpark worker, leave the objects that exist now out of every later garbage
    collection (``gc.freeze()``); True if it did.

    Called once, when a worker imports this module for its first task of the source: what exists
    then is mostly modules (PySpark's, pyarrow's, asyncconsumer's), alive as long as the worker.
    The full collection PySpark's daemon runs after every task scanned those 55,000-57,000 objects
    each time: 70-170 ms a task on 2 busy cores, measured, before the worker could start its next
    task.  Frozen, it scans what was made since, about 2,000 objects: about 1 ms.  Frozen objects
    are still freed when nothing refers to them; only a reference cycle among them would be kept.
    """
    if not _in_reused_pyspark_worker():
        return False
    gc.freeze()
    return True


_freeze_worker_imports()
log.debug("timing: asyncconsumer.spark.source imported")
