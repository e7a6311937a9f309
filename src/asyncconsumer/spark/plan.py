"""Offset ranges and the Spark tasks they become (the driver plans, the executors read them).

An :class:`OffsetRange` is ``[start, end)`` of one partition; :func:`plan_tasks` turns a read's
ranges into :class:`KafkaInputPartition` tasks by Spark's own rules (``minPartitions``,
``maxRecordsPerPartition``), packing small ranges together; :func:`rate_limit` is Spark's
``maxOffsetsPerTrigger`` arithmetic.  A streaming query's offsets travel as Spark's Kafka JSON layout
(:func:`offsets_json`).  Offsets that are gone from Kafka are data loss
(:func:`report_data_loss`, :class:`DataLossError`), reported by the driver's planning and the
executors' reads alike.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from ..structs import TopicPartition
from .options import SourceOptions

log = logging.getLogger("asyncconsumer.spark")

DATA_LOSS_HINT = (
    "Some data may have been lost because it is not available in Kafka any more: it was aged out by "
    "retention, or the topic was deleted or re-created before all of it was processed. To keep the "
    "query going and skip what is missing, set the source option failOnDataLoss to 'false'."
)


class DataLossError(RuntimeError):
    """Offsets the query should read are gone from Kafka (raised when ``failOnDataLoss`` is true)."""


def report_data_loss(options: SourceOptions, message: str) -> None:
    """Raise :class:`DataLossError` (``failOnDataLoss=true``, the default) or log a warning."""
    if options.fail_on_data_loss:
        raise DataLossError(f"asyncconsumer source: {message}. {DATA_LOSS_HINT}")
    log.warning("asyncconsumer source: %s. Some data may have been lost (failOnDataLoss=false).", message)


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


def offsets_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's Kafka offset layout, ``{"topic": {"0": 42}}``, in a canonical order."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(obj: Mapping[str, Any]) -> dict[TopicPartition, int]:
    result: dict[TopicPartition, int] = {}
    for topic, per in obj.items():
        for partition, offset in per.items():
            result[TopicPartition(topic, int(partition))] = int(offset)
    return result
