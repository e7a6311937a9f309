"""The driver's side of the source: which partitions a read covers, and their offsets.

:class:`OffsetLookup` is what planning needs from Kafka (a :class:`ConsumerOffsetLookup` over a
started consumer, a fake in unit tests); :func:`resolve_offsets` turns the ``startingOffsets``/
``endingOffsets`` options into offsets.  The batch reader plans with a fresh consumer per query
(:func:`run_on_driver`); a streaming query keeps one in a
:class:`~asyncconsumer.spark.session.ConsumerSession` (:func:`lookup_with`).  Every lookup asks Kafka
afresh, so new topics and partitions are seen.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import anyio

from ..consumer import Consumer
from ..errors import KafkaError
from ..structs import TopicPartition
from .options import EARLIEST, LATEST, OffsetSpec, SourceOptionError, SourceOptions, Subscription
from .session import source_consumer

log = logging.getLogger("asyncconsumer.spark")

T = TypeVar("T")


class OffsetLookup(Protocol):
    """What the driver needs from Kafka (a Consumer in production, a fake in unit tests)."""

    async def partitions(self, subscription: Subscription) -> list[TopicPartition]: ...

    async def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]: ...


class ConsumerOffsetLookup:
    """:class:`OffsetLookup` backed by a started :class:`~asyncconsumer.Consumer` (no group)."""

    def __init__(self, consumer: Consumer[Any, Any]) -> None:
        self._consumer = consumer

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
        """The end of each partition: its high watermark (with ``read_committed``, its last stable
        offset), as ``end_offsets`` gives it (confirmed by a fetch where a broker answers
        ListOffsets(latest) below it)."""
        if not tps:
            return {}
        found = await self._consumer.end_offsets(tps)
        return {tp: _checked(found.get(tp, -1), tp, "latest") for tp in tps}

    async def for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        if not timestamps:
            return {}
        found = await self._consumer.offsets_for_times(dict(timestamps))
        return {tp: (r.offset if r is not None and r.offset >= 0 else None) for tp, r in found.items()}


def _checked(offset: int, tp: TopicPartition, what: str) -> int:
    if offset < 0:
        raise KafkaError(f"could not look up the {what} offset of {tp} (is its leader available?)")
    return offset


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


def driver_consumer(options: SourceOptions, **overrides: Any) -> Consumer[Any, Any]:
    # The driver reads no records: it looks offsets up (end_offsets confirms a ListOffsets(latest)
    # answer with a one-byte fetch of its own).  Small fetch settings keep its buffers small.
    return source_consumer(
        options, "driver", **{"max_partition_fetch_bytes": 1024, "fetch_max_bytes": 1024 * 1024, **overrides}
    )


def group_consumer(options: SourceOptions) -> Consumer[Any, Any]:
    """The consumer that commits processed offsets to the monitoring group (never joins it)."""
    return Consumer.from_properties(
        options.consumer_properties, group_id=options.group_id, enable_auto_commit=False, auto_offset_reset="none"
    )


def run_on_driver(options: SourceOptions, work: Callable[[OffsetLookup], Awaitable[T]]) -> T:
    """Run ``work`` with a fresh consumer on a fresh event loop (Spark calls the readers synchronously)."""

    async def main() -> T:
        async with driver_consumer(options) as consumer:
            return await work(ConsumerOffsetLookup(consumer))

    return anyio.run(main)


def lookup_with(
    options: SourceOptions, work: Callable[[OffsetLookup], Awaitable[T]]
) -> Callable[[Consumer[Any, Any]], Awaitable[T]]:
    """``work`` for :meth:`ConsumerSession.run`: given the session's consumer as an :class:`OffsetLookup`."""

    async def run(consumer: Consumer[Any, Any]) -> T:
        return await work(ConsumerOffsetLookup(consumer))

    return run
