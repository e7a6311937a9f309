"""The ``asyncconsumer`` PySpark data source: what Spark calls, and :func:`register`.

Where things run:

- **Driver** (Spark's planner Python workers): option checks, listing the partitions of the
  subscription and resolving offsets (``earliest``/``latest``/JSON/timestamps; :mod:`.driver`),
  planning one input partition per Kafka offset range (split per ``minPartitions``/
  ``maxRecordsPerPartition``; :mod:`.plan`), the streaming offsets (``initialOffset``/
  ``latestOffset``/``prepareForTriggerAvailableNow``) and the optional commit of processed offsets
  to a consumer group.  The batch reader's planning opens a short-lived
  :class:`~asyncconsumer.Consumer` inside ``anyio.run``; a streaming query keeps its driver
  consumers across micro-batches (:class:`~.session.ConsumerSession`, closed when the query stops).
  Every lookup fetches fresh metadata, so new topics and partitions are seen.
- **Executors**: ``read`` reads exactly one offset range ``[start, end)`` (:mod:`.executor`) with a
  Consumer using manual ``assign`` + ``seek`` on its own event loop, and hands Arrow record batches
  to Spark.  A Python worker keeps that consumer for its next task, for ``consumerCacheTimeout``,
  and leaves the objects of its imports out of the garbage collection PySpark runs after every
  task (:mod:`.worker`).

No consumer group is joined: offsets live in Spark's checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import pyarrow as pa
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

from ..consumer import Consumer
from ..structs import TopicPartition
from .arrow import column_types, spark_schema
from .driver import OffsetLookup, driver_consumer, group_consumer, lookup_with, resolve_offsets, run_on_driver
from .executor import read_ranges
from .options import OffsetSpec, SourceOptionError, SourceOptions, parse_options
from .plan import (
    DataLossError,
    KafkaInputPartition,
    OffsetRange,
    offsets_from_json,
    offsets_json,
    plan_tasks,
    rate_limit,
    report_data_loss,
)
from .session import ConsumerSession, timed
from .worker import freeze_worker_imports, startup_pythonpath

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


class AsyncConsumerDataSource(DataSource):
    """``spark.read.format("asyncconsumer")`` and ``spark.readStream.format("asyncconsumer")``."""

    @classmethod
    def name(cls) -> str:
        return "asyncconsumer"

    @timed("planner schema")
    def schema(self) -> StructType:
        parsed = parse_options(self.options)  # fails early (at load()) on bad options
        _, key_type, value_type = _column_types(parsed)  # keyFormat/valueFormat: from the registry
        return spark_schema(parsed.include_headers, key_type, value_type)

    @timed("planner reader")
    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(_checked_schema(parse_options(self.options, streaming=False), schema))

    @timed("planner streamReader")
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(_checked_schema(parse_options(self.options, streaming=True), schema))


def _column_types(options: SourceOptions) -> tuple[SourceOptions, Any, Any]:
    """``keyFormat``/``valueFormat``: the columns' Arrow types, and the options with each
    subject's version pinned (a registry lookup on the driver; nothing without a format)."""
    if not options.formats:
        return options, None, None
    return anyio.run(column_types, options)


def _checked_schema(options: SourceOptions, schema: StructType) -> SourceOptions:
    """``options`` (subjects pinned to the versions ``schema`` has) if ``schema`` is the source's."""
    options, key_type, value_type = _column_types(options)
    expected = spark_schema(options.include_headers, key_type, value_type)
    if schema != expected:
        if options.formats:
            raise SourceOptionError(
                "asyncconsumer source: the schema differs from the one the registry gives now ("
                + ", ".join(f.describe() for f in options.formats)
                + "): a new schema version since load()? Define the DataFrame again; a .schema(...) cannot be "
                f"given. Expected {expected.simpleString()}, got {schema.simpleString()}"
            )
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
        self._planner = ConsumerSession(lambda: driver_consumer(options))
        self._committer = ConsumerSession(lambda: group_consumer(options))

    def _plan(self, work: Callable[[OffsetLookup], Awaitable[T]]) -> T:
        return self._planner.run(lookup_with(self.options, work))

    # -- offsets (driver) -------------------------------------------------------------------------

    @timed("driver initialOffset")
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

        return offsets_json(self._plan(work))

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

    @timed("driver prepareForTriggerAvailableNow")
    def prepareForTriggerAvailableNow(self) -> None:
        async def work(lookup: OffsetLookup) -> dict[TopicPartition, int]:
            return await lookup.latest(await lookup.partitions(self.options.subscription))

        self._available_now_target = self._plan(work)
        log.info("asyncconsumer source: availableNow reads up to %s", self._available_now_target)

    @timed("driver latestOffset")
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start)
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
            return offsets_json(begin)
        known = {**begin, **new_earliest}
        end = dict(latest)
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(known, latest, limit.max_rows)
        # A partition whose end went backwards is reported (data loss) when the batch is planned;
        # partitions that disappeared are kept out of the offset and reported there too.
        return offsets_json(end)

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
        return offsets_json(self._last_latest) if self._last_latest is not None else None

    @timed("driver partitions")
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        until = offsets_from_json(end)
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

    @timed("driver commit")
    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished the batch ending at ``end``: record it in the lag-monitoring group, if any."""
        self._commit_processed(offsets_from_json(end))

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

    @timed("driver stop")
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
        self._planner = ConsumerSession(lambda: driver_consumer(options))
        self._committer = ConsumerSession(lambda: group_consumer(options))
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
        return offsets_from_json(value) if isinstance(value, Mapping) else {}

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
    startup = startup_pythonpath(spark) if prefer_installed_pyspark else contextlib.nullcontext(False)
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


freeze_worker_imports()
log.debug("timing: asyncconsumer.spark.source imported")
