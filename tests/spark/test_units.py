"""The source's plain-Python parts, without Spark or a broker: options, planning, offsets, Arrow."""

from __future__ import annotations

import itertools
import math
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncconsumer import ConsumerRecord, TopicPartition
from asyncconsumer.config import from_properties
from asyncconsumer.errors import OffsetOutOfRangeError
from asyncconsumer.spark.arrow import arrow_schema, records_to_batch, spark_schema
from asyncconsumer.spark.driver import resolve_offsets
from asyncconsumer.spark.executor import RangeReader
from asyncconsumer.spark.options import EARLIEST, LATEST, SourceOptionError, Subscription, parse_options
from asyncconsumer.spark.plan import (
    DataLossError,
    KafkaInputPartition,
    OffsetRange,
    pack_ranges,
    plan_tasks,
    rate_limit,
    split_ranges,
)
from asyncconsumer.spark.source import KafkaStreamReader

pytestmark = pytest.mark.spark

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def opts(**extra: str) -> dict[str, str]:
    return {**BOOT, **extra}


def ranges_of(tasks: Sequence[Any]) -> set[tuple[int, int, int]]:
    """(partition, start, end) of every range the tasks read."""
    return {(r.tp.partition, r.start, r.end) for task in tasks for r in task.offset_ranges}


# ----------------------------------------------------------------------------------- options


def test_defaults_follow_spark() -> None:
    batch = parse_options(opts(subscribe="a, b ,a"), streaming=False)
    assert batch.subscription == Subscription("subscribe", topics=("a", "b"))
    assert batch.starting.kind == "earliest" and batch.ending is None
    assert batch.fail_on_data_loss and not batch.include_headers
    assert parse_options(opts(subscribe="a"), streaming=True).starting.kind == "latest"


def test_option_names_are_case_insensitive_and_kafka_params_pass_through() -> None:
    o = parse_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "SubscribePattern": "ev-.*",
            "INCLUDEHEADERS": "TRUE",
            "kafka.isolation.level": "read_committed",
            "kafka.fetch.max.wait.ms": "20",
            "maxOffsetsPerTrigger": "10",
            "minpartitions": "3",
        },
        streaming=True,
    )
    assert o.include_headers and o.read_committed
    assert o.consumer_properties == {
        "bootstrap.servers": "h:1",
        "isolation.level": "read_committed",
        "fetch.max.wait.ms": "20",
    }
    assert (o.max_offsets_per_trigger, o.min_partitions) == (10, 3)
    assert o.subscription.matches("ev-1") and not o.subscription.matches("xev-1")


def test_per_partition_offsets_json() -> None:
    o = parse_options(
        opts(
            assign='{"t":[0,1]}',
            startingOffsets='{"t":{"0":5,"1":-2}}',
            endingOffsets='{"t":{"0":-1,"1":9}}',
        ),
        streaming=False,
    )
    assert o.subscription.partitions == (TP0, TP1)
    assert o.starting.offsets_map == {TP0: 5, TP1: EARLIEST}
    assert o.ending is not None and o.ending.offsets_map == {TP0: LATEST, TP1: 9}


def test_timestamp_options_take_precedence_like_spark() -> None:
    """Spark: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets (the same
    for the ending options): KafkaSourceProvider.getKafkaOffsetRangeLimit."""
    o = parse_options(opts(subscribe="t", startingOffsets="earliest", startingTimestamp="1000"), streaming=True)
    assert (o.starting.kind, o.starting.timestamp) == ("timestamp", 1000)
    o = parse_options(
        opts(
            subscribe="t",
            startingTimestamp="1000",
            startingOffsetsByTimestamp='{"t":{"0":7}}',
            startingOffsetsByTimestampStrategy="latest",
        ),
        streaming=True,
    )
    assert (o.starting.kind, o.starting.timestamp, o.starting.strategy) == ("timestamp", 1000, "latest")
    o = parse_options(opts(subscribe="t", startingOffsets="earliest", startingOffsetsByTimestamp='{"t":{"0":7}}'))
    assert o.starting.kind == "timestamps" and o.starting.timestamps_map == {TP0: 7}
    o = parse_options(
        opts(subscribe="t", endingTimestamp="5", endingOffsetsByTimestamp='{"t":{"0":7}}', endingOffsets="latest"),
        streaming=False,
    )
    assert o.ending is not None and (o.ending.kind, o.ending.timestamp) == ("timestamp", 5)


def test_no_group_commits_unless_asked() -> None:
    """Spark's source never commits to a group; committing is our option, off by default."""
    assert parse_options(opts(subscribe="t")).group_id is None
    assert parse_options(opts(subscribe="t", **{"kafka.group.id": "g"})).group_id is None
    assert parse_options(opts(subscribe="t", groupIdPrefix="lag")).group_id is None
    a = parse_options(opts(subscribe="t", groupIdPrefix="lag", commitOffsetsToGroup="true")).group_id
    again = parse_options(opts(subscribe="t", groupIdPrefix="lag", commitOffsetsToGroup="true")).group_id
    assert a is not None and a.startswith("lag-") and a == again
    both = opts(subscribe="t", groupIdPrefix="lag", commitOffsetsToGroup="true", **{"kafka.group.id": "g"})
    assert parse_options(both).group_id == "g"
    # the group settings never reach the reading consumers (they join no group)
    grouped = opts(subscribe="t", **{"kafka.group.id": "g", "kafka.group.instance.id": "i"})
    assert not {"group.id", "group.instance.id"} & set(parse_options(grouped).consumer_properties)


def test_trigger_options() -> None:
    o = parse_options(opts(subscribe="t", minOffsetsPerTrigger="100", maxTriggerDelay="30s"), streaming=True)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 30_000)
    o = parse_options(opts(subscribe="t", minOffsetsPerTrigger="100"), streaming=True)
    assert o.max_trigger_delay_ms == 15 * 60 * 1000  # Spark's default, 15m
    for raw, ms in [
        ("500", 500),
        ("500ms", 500),
        ("2m", 120_000),
        ("1min", 60_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
    ]:
        assert parse_options(opts(subscribe="t", maxTriggerDelay=raw)).max_trigger_delay_ms == ms


def test_consumer_cache_timeout_option() -> None:
    assert parse_options(opts(subscribe="t")).consumer_cache_timeout_ms == 300_000  # Spark's 5 minutes
    assert parse_options(opts(subscribe="t", consumerCacheTimeout="30s")).consumer_cache_timeout_ms == 30_000
    assert parse_options(opts(subscribe="t", consumercachetimeout="0")).consumer_cache_timeout_ms == 0
    with pytest.raises(SourceOptionError, match="'consumerCacheTimeout' must be a time such as"):
        parse_options(opts(subscribe="t", consumerCacheTimeout="forever"))


def test_java_client_sasl_jaas_config_is_translated() -> None:
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s\\"cret";'
    o = parse_options(
        opts(
            subscribe="t",
            **{
                "kafka.sasl.jaas.config": jaas,
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "SCRAM-SHA-512",
            },
        )
    )
    config = from_properties(o.consumer_properties)
    assert (config.sasl_plain_username, config.sasl_plain_password) == ("alice", 's"cret')
    assert 's"cret' not in repr(o)  # kafka.* values (passwords) stay out of reprs and logs


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        (opts(subscribe="t", assign='{"t":[0]}'), None, "exactly one of 'assign', 'subscribe' or 'subscribePattern'"),
        (opts(), None, "exactly one of"),
        ({"subscribe": "t"}, None, "'kafka.bootstrap.servers' is required"),
        (opts(subscribe="t", startingOffset="earliest"), None, "did you mean 'startingOffsets'"),
        (opts(subscribe="t", colour="red"), None, "unknown option 'colour'"),
        (opts(subscribe="t", **{"kafka.auto.offset.reset": "earliest"}), None, "startingOffsets"),
        (opts(subscribe="t", **{"kafka.value.deserializer": "x"}), None, "kafka.value.deserializer"),
        (opts(subscribe="t", **{"kafka.no.such.setting": "1"}), None, "no.such.setting"),
        (opts(subscribe="t", **{"kafka.fetch.max.wait.ms": "soon"}), None, "fetch_max_wait_ms"),
        (opts(subscribe="t", minOffsetsPerTrigger="5", maxOffsetsPerTrigger="4"), None, "higher than maxOffsets"),
        (opts(subscribe="t", maxTriggerDelay="soon"), None, "'maxTriggerDelay' must be a time"),
        (opts(subscribe="t", commitOffsetsToGroup="true"), None, "set kafka.group.id or groupIdPrefix"),
        (opts(subscribe="t", failOnDataLoss="maybe"), None, "'failOnDataLoss' must be 'true' or 'false'"),
        (opts(subscribe="t", maxOffsetsPerTrigger="0"), None, "'maxOffsetsPerTrigger' must be a positive integer"),
        (opts(subscribe="t", startingOffsets="first"), None, "must be 'earliest', 'latest' or per-partition JSON"),
        (opts(subscribe="t", startingOffsets='{"t":{"0":'), None, "not valid JSON"),
        (opts(subscribe="t", startingOffsets='{"t":{"x":1}}'), None, "'x' is not a partition number"),
        (opts(subscribe="t", startingOffsets='{"u":{"0":1}}'), None, "u-0, which is not part of subscribe=t"),
        (opts(assign='{"t":[0,1]}', startingOffsets='{"t":{"0":1}}'), None, "missing: t-1"),
        (opts(assign='{"t":"0"}'), None, "option 'assign' must look like"),
        (opts(subscribePattern="(unclosed"), None, "unclosed group"),
        (opts(subscribe="t", startingOffsets="latest"), False, "not valid for batch queries"),
        (opts(subscribe="t", endingOffsets="earliest"), False, "not valid for batch queries"),
        (opts(subscribe="t", startingOffsets='{"t":{"0":-1}}'), False, "-1 (latest) is not valid"),
        (opts(subscribe="t", endingOffsets="latest"), True, "is for batch queries (spark.read) only"),
        (opts(subscribe="t", startingTimestamp="yesterday"), None, "timestamp in milliseconds"),
        (opts(subscribe="t", startingOffsetsByTimestampStrategy="skip"), None, "'error' or 'latest'"),
        (opts(subscribe="t", **{"kafka.ssl.truststore.location": "/no/such.jks"}), None, "cannot read the JKS store"),
        (opts(subscribe="t", **{"kafka.sasl.jaas.config": "com.example.Custom required;"}), None, "PlainLoginModule"),
        (opts(subscribe="t", **{"kafka.sasl.mechanism": "GSSAPI"}), None, "Kerberos (GSSAPI) is not supported"),
    ],
)
def test_bad_options_fail_with_a_clear_message(options: dict[str, str], streaming: bool | None, message: str) -> None:
    with pytest.raises(SourceOptionError, match="asyncconsumer source") as info:
        parse_options(options, streaming=streaming)
    assert message in str(info.value)


def test_parsed_options_and_partitions_pickle() -> None:
    o = parse_options(opts(subscribe="t", includeHeaders="true"), streaming=True)
    assert pickle.loads(pickle.dumps(o)) == o
    reader = KafkaStreamReader(o)
    reader._available_now_target = {TP0: 1}
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.options == o and clone._available_now_target is None
    part = pickle.loads(pickle.dumps(KafkaInputPartition("t", 1, 5, 9)))
    assert part.offset_range == OffsetRange(TP1, 5, 9) and part.offset_ranges == [OffsetRange(TP1, 5, 9)]
    packed = pickle.loads(pickle.dumps(KafkaInputPartition.of([OffsetRange(TP1, 5, 9), OffsetRange(TP0, 0, 3)])))
    assert packed.offset_ranges == [OffsetRange(TP1, 5, 9), OffsetRange(TP0, 0, 3)]


def test_min_records_per_task_option() -> None:
    assert parse_options(opts(subscribe="t")).min_records_per_task == 10_000
    assert parse_options(opts(subscribe="t", minRecordsPerTask="0")).min_records_per_task == 0
    assert parse_options(opts(subscribe="t", minrecordspertask="500")).min_records_per_task == 500
    with pytest.raises(SourceOptionError, match="'minRecordsPerTask' must be an integer of 0 or more, got '-1'"):
        parse_options(opts(subscribe="t", minRecordsPerTask="-1"))


# ---------------------------------------------------------------------------------- planning


def covered(pieces: Sequence[OffsetRange]) -> dict[TopicPartition, list[int]]:
    out: dict[TopicPartition, list[int]] = {}
    for p in pieces:
        out.setdefault(p.tp, []).extend(range(p.start, p.end))
    return out


def test_split_ranges_cover_each_range_exactly() -> None:
    ranges = [OffsetRange(TP0, 10, 1010), OffsetRange(TP1, 0, 10), OffsetRange(TopicPartition("t", 2), 5, 5)]
    assert split_ranges(ranges) == ranges[:2]  # empty ranges dropped
    pieces = split_ranges(ranges, min_partitions=10)
    assert covered(pieces) == {TP0: list(range(10, 1010)), TP1: list(range(10))}
    assert sum(p.tp == TP0 for p in pieces) > sum(p.tp == TP1 for p in pieces)  # shares follow sizes
    capped = split_ranges(ranges, max_records_per_partition=300)
    assert max(p.size for p in capped) <= 300
    assert covered(capped) == covered(pieces)


def test_small_ranges_are_packed_into_tasks_of_min_records() -> None:
    """A continuously running query's micro-batches are small; each Python task costs PySpark tens
    of milliseconds, so small ranges are read together.  Large ranges keep a task each."""
    tp2, tp3 = TopicPartition("t", 2), TopicPartition("t", 3)
    small = [OffsetRange(tp, 0, 100) for tp in (TP0, TP1, tp2, tp3)]
    assert pack_ranges(small, 10_000) == [small]
    assert pack_ranges(small, 200) == [small[:2], small[2:]]
    assert pack_ranges(small, 0) == [[r] for r in small]  # 0: one range a task, as Spark
    mixed = [OffsetRange(TP0, 0, 6000), OffsetRange(TP1, 0, 50_000), OffsetRange(tp2, 0, 5000),
             OffsetRange(tp3, 0, 10)]
    assert pack_ranges(mixed, 10_000) == [[mixed[1]], [mixed[0], mixed[2]], [mixed[3]]]
    tasks = plan_tasks(small, parse_options(opts(subscribe="t")))
    assert len(tasks) == 1 and tasks[0].offset_ranges == small
    # Asked-for task sizes are Spark's rules alone: one range a task.
    for option in ({"minPartitions": "2"}, {"maxRecordsPerPartition": "1000"}, {"minRecordsPerTask": "0"}):
        tasks = plan_tasks(small, parse_options(opts(subscribe="t", **option)))
        assert [t.offset_ranges for t in tasks] == [[r] for r in small], option


def test_min_partitions_splits_as_spark_does() -> None:
    """The issue's case: 6 asked on 120k/90k/60k/30k records gives 6 tasks in Spark (this source
    gave 8 when it rounded each share up)."""
    sizes = [120_000, 90_000, 60_000, 30_000]
    ranges = [OffsetRange(TopicPartition("t", p), 0, size) for p, size in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions=6)
    assert [p.size for p in pieces] == [60_000, 60_000, 45_000, 45_000, 60_000, 30_000]
    assert pieces == spark_offset_ranges(ranges, 6, None)


def spark_offset_ranges(
    ranges: Sequence[OffsetRange], min_partitions: int | None, max_records: int | None
) -> list[OffsetRange]:
    """A line-by-line transcription of Spark 4.2's KafkaOffsetRangeCalculator.getRanges (Scala
    Longs and Doubles; Math.round is floor(x + 0.5) but exact at the halves)."""

    def java_round(x: float) -> int:
        f = math.floor(x)
        return f + 1 if x - f >= 0.5 else f

    def get_part_count(size: int, total_size: int, min_parts: int) -> int:
        return max(java_round(float(size) / total_size * min_parts), 1)

    def get_divided_partition(parts: int, r: OffsetRange) -> list[OffsetRange]:
        remaining, start_offset, out = r.size, r.start, []
        for part in range(parts):
            this_partition = remaining // (parts - part)
            remaining -= this_partition
            end_offset = min(start_offset + this_partition, r.end)
            out.append(OffsetRange(r.tp, start_offset, end_offset))
            start_offset = end_offset
        return out

    offset_ranges = [r for r in ranges if r.size > 0]
    if (min_partitions is None or len(offset_ranges) >= min_partitions) and max_records is None:
        return offset_ranges
    if max_records is not None:
        divided = [
            d
            for r in offset_ranges
            for d in get_divided_partition(math.ceil(float(r.size) / max_records), r)
            if d.size > 0
        ]
    else:
        divided = offset_ranges
    if min_partitions is not None and min_partitions > len(divided):
        total_size = sum(r.size for r in divided)
        unsplit = [r for r in divided if get_part_count(r.size, total_size, min_partitions) == 1]
        split_total = total_size - sum(r.size for r in unsplit)
        unsplit_tps = {r.tp for r in unsplit}
        split_min = max(min_partitions - len(unsplit), 1)
        return [
            d
            for r in divided
            for d in get_divided_partition(
                1 if r.tp in unsplit_tps else get_part_count(r.size, split_total, split_min), r
            )
            if d.size > 0
        ]
    return divided


def spark_rate_limit(
    limit: int, start: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """A transcription of KafkaMicroBatchStream.rateLimit (Spark 4.2)."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    out = {}
    for tp, end in until.items():
        if tp not in sizes:
            out[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        prorate_long = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, start[tp] + prorate_long)
    return out


_sizes = st.lists(st.integers(min_value=0, max_value=2_000_000), min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    sizes=_sizes,
    starts=st.lists(st.integers(min_value=0, max_value=10**12), min_size=12, max_size=12),
    min_partitions=st.one_of(st.none(), st.integers(min_value=1, max_value=64)),
    max_records=st.one_of(st.none(), st.integers(min_value=10_000, max_value=3_000_000)),
)
def test_split_ranges_is_sparks_calculator(
    sizes: list[int], starts: list[int], min_partitions: int | None, max_records: int | None
) -> None:
    ranges = [OffsetRange(TopicPartition("t", p), starts[p], starts[p] + size) for p, size in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions, max_records)
    assert pieces == spark_offset_ranges(ranges, min_partitions, max_records)
    for r in ranges:  # the pieces of each range are contiguous and cover it exactly
        own = [(p.start, p.end) for p in pieces if p.tp == r.tp]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(own))
        assert (own[0][0], own[-1][1]) == (r.start, r.end) if r.size else not own


@settings(max_examples=1500, deadline=None)
@given(sizes=_sizes, limit=st.integers(min_value=1, max_value=5_000_000))
def test_rate_limit_is_sparks_arithmetic(sizes: list[int], limit: int) -> None:
    start = {TopicPartition("t", p): 1000 * p for p in range(len(sizes))}
    until = {tp: start[tp] + size for tp, size in zip(start, sizes, strict=True)}
    assert rate_limit(start, until, limit) == spark_rate_limit(limit, start, until)


def test_rate_limit_shares_the_limit_by_backlog() -> None:
    start = {TP0: 0, TP1: 100}
    latest = {TP0: 900, TP1: 200}
    assert rate_limit(start, latest, 10_000) == latest
    limited = rate_limit(start, latest, 100)
    assert limited == {TP0: 90, TP1: 110}
    # a tiny backlog is not starved
    assert rate_limit({TP0: 0, TP1: 0}, {TP0: 100_000, TP1: 1}, 10)[TP1] == 1
    # Spark divides first, then multiplies: 90 * (7 / 10) is 62.99999999999999 in doubles, so
    # Spark admits 62 records where 90 * 7 / 10 = 63 would admit one more.
    assert rate_limit({TP0: 0, TP1: 0}, {TP0: 7, TP1: 3}, 90) == {TP0: 7, TP1: 3}
    assert rate_limit({TP0: 0, TP1: 0}, {TP0: 700, TP1: 300}, 90) == {TP0: 62, TP1: 27}


# --------------------------------------------------------------------------- offset lookups


class FakeLookup:
    def __init__(
        self,
        earliest: Mapping[TopicPartition, int],
        latest: Mapping[TopicPartition, int],
        times: Mapping[TopicPartition, int | None] | None = None,
    ) -> None:
        self._earliest, self._latest, self._times = dict(earliest), dict(latest), dict(times or {})

    async def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        return sorted(self._latest)

    async def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._earliest[tp] for tp in tps}

    async def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._latest[tp] for tp in tps}

    async def for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        return {tp: self._times.get(tp) for tp in timestamps}


def resolve(options: dict[str, str], lookup: FakeLookup, *, starting: bool = True) -> dict[TopicPartition, int]:
    o = parse_options(options)
    spec = o.starting if starting else o.ending
    assert spec is not None

    async def main() -> dict[TopicPartition, int]:
        return await resolve_offsets(lookup, spec, [TP0, TP1], starting=starting)

    return anyio.run(main)


def test_resolve_offsets() -> None:
    lookup = FakeLookup({TP0: 3, TP1: 0}, {TP0: 50, TP1: 60}, {TP0: 20, TP1: None})
    assert resolve(opts(subscribe="t", startingOffsets="earliest"), lookup) == {TP0: 3, TP1: 0}
    assert resolve(opts(subscribe="t", startingOffsets="latest"), lookup) == {TP0: 50, TP1: 60}
    assert resolve(opts(subscribe="t", startingOffsets='{"t":{"0":-2,"1":-1}}'), lookup) == {TP0: 3, TP1: 60}
    assert resolve(opts(subscribe="t", startingOffsets='{"t":{"0":7,"1":8}}'), lookup) == {TP0: 7, TP1: 8}
    # no record after the timestamp: the strategy decides for starting offsets; ending ones use latest
    with pytest.raises(SourceOptionError, match=r"no record at or after the timestamp in t-1"):
        resolve(opts(subscribe="t", startingTimestamp="99"), lookup)
    latest_strategy = opts(subscribe="t", startingTimestamp="99", startingOffsetsByTimestampStrategy="latest")
    assert resolve(latest_strategy, lookup) == {TP0: 20, TP1: 60}
    assert resolve(opts(subscribe="t", endingTimestamp="99"), lookup, starting=False) == {TP0: 20, TP1: 60}
    with pytest.raises(SourceOptionError, match="must give every partition to read; missing: t-1"):
        resolve(opts(subscribe="t", startingOffsets='{"t":{"0":1}}'), lookup)
    with pytest.raises(SourceOptionError, match="names partitions that do not exist: t-5"):
        resolve(opts(subscribe="t", startingOffsets='{"t":{"0":1,"1":1,"5":1}}'), lookup)


class GrowingLookup(FakeLookup):
    """The topic as Spark's successive calls see it: ``grow()`` adds a partition and records."""

    def grow(self) -> None:
        self._latest = {tp: offset + 5 for tp, offset in self._latest.items()}
        self._latest[TopicPartition("t", 2)] = 3
        self._earliest[TopicPartition("t", 2)] = 0


@pytest.mark.parametrize("starting", ["earliest", "latest"])
def test_available_now_start_ignores_what_came_after_the_target(monkeypatch: pytest.MonkeyPatch, starting: str) -> None:
    """Spark calls prepareForTriggerAvailableNow, then initialOffset, then latestOffset and
    partitions.  Partitions and records that appear in between belong to a later query; they must
    not look like data loss (a partition gone, or an offset gone back)."""
    lookup = GrowingLookup({TP0: 0, TP1: 0}, {TP0: 10, TP1: 20})
    monkeypatch.setattr(KafkaStreamReader, "_plan", lambda self, work: anyio.run(work, lookup))
    reader = KafkaStreamReader(parse_options(opts(subscribePattern="t", startingOffsets=starting), streaming=True))
    reader.prepareForTriggerAvailableNow()
    lookup.grow()  # a partition added and records produced before Spark asks for the start
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 10, "1": 20}}
    pieces = reader.partitions(start, end)  # raised DataLossError before the fix
    expected = {(0, 0, 10), (1, 0, 20)} if starting == "earliest" else {(0, 10, 10), (1, 20, 20)}
    assert {(r.tp.partition, r.start, r.end) for p in pieces for r in p.offset_ranges} <= expected  # type: ignore[attr-defined]
    assert start == ({"t": {"0": 0, "1": 0}} if starting == "earliest" else {"t": {"0": 10, "1": 20}})


@pytest.mark.parametrize("new_partition_starts_at", [0, 2])
def test_streaming_picks_up_partitions_added_to_a_topic(
    monkeypatch: pytest.MonkeyPatch, new_partition_starts_at: int
) -> None:
    """Tansu cannot add partitions (no CreatePartitions), so this path is shown here."""
    lookup = GrowingLookup({TP0: 0, TP1: 0}, {TP0: 10, TP1: 20})
    monkeypatch.setattr(KafkaStreamReader, "_plan", lambda self, work: anyio.run(work, lookup))
    reader = KafkaStreamReader(parse_options(opts(subscribe="t", startingOffsets="earliest"), streaming=True))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert ranges_of(reader.partitions(start, end)) == {(0, 0, 10), (1, 0, 20)}
    lookup.grow()  # partition t-2 added, with three records
    lookup._earliest[TopicPartition("t", 2)] = new_partition_starts_at
    start, end = end, reader.latestOffset(end, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 15, "1": 25, "2": 3}}
    if new_partition_starts_at == 0:
        pieces = ranges_of(reader.partitions(start, end))
        assert pieces == {(0, 10, 15), (1, 20, 25), (2, 0, 3)}  # the new partition from its beginning
    else:  # its first records are gone already: data loss, as in Spark
        with pytest.raises(DataLossError, match="added partition t-2 starts at offset 2 instead of 0"):
            reader.partitions(start, end)


# -------------------------------------------------------------------------- executor reads


def rec(offset: int, tp: TopicPartition = TP0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 1_000, 0, None, b"v%d" % offset, 0, 2, ())


class FakeConsumer:
    """Serves records of one partition; offsets below ``log_start`` are out of range."""

    def __init__(self, offsets: Sequence[int], log_start: int = 0, chunk: int = 4) -> None:
        self.offsets, self.log_start, self.chunk = list(offsets), log_start, chunk
        self.pos = 0
        self.seeks: list[int] = []
        self.fetch_end: int | None = None

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        pass

    def fetch_until(self, tp: TopicPartition, offset: int | None) -> None:
        self.fetch_end = offset

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset
        self.seeks.append(offset)

    async def getmany(self, *tps: TopicPartition, timeout: float, max_records: int) -> dict[Any, Any]:
        if self.pos < self.log_start:
            raise OffsetOutOfRangeError("out of range")
        batch = [o for o in self.offsets if o >= self.pos][: self.chunk]
        if not batch:
            return {}
        self.pos = batch[-1] + 1
        return {TP0: [rec(o) for o in batch]}

    async def arrow_batch(
        self, *tps: TopicPartition, timeout: float, max_records: int, include_headers: bool
    ) -> Any:
        got = await self.getmany(*tps, timeout=timeout, max_records=max_records)
        return records_to_batch(got[TP0], include_headers) if got else None

    async def position(self, tp: TopicPartition) -> int:
        return self.pos

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.log_start for tp in tps}


def read_all(consumer: FakeConsumer, start: int, end: int, *, fail_on_data_loss: bool = True) -> list[int]:
    reader = RangeReader(
        consumer,
        OffsetRange(TP0, start, end),  # type: ignore[arg-type]
        fail_on_data_loss=fail_on_data_loss,
        poll_timeout=1.0,
    )

    async def main() -> list[int]:
        got: list[int] = []
        while chunk := await reader.next_chunk():
            got.extend(r.offset for r in chunk)
        return got

    rows = anyio.run(main)
    consumer.pos = -1  # the columnar path (next_batch) reads the same range alike
    consumer.seeks.clear()
    reader = RangeReader(
        consumer,
        OffsetRange(TP0, start, end),  # type: ignore[arg-type]
        fail_on_data_loss=fail_on_data_loss,
        poll_timeout=1.0,
    )

    async def columnar() -> list[int]:
        got: list[int] = []
        while (batch := await reader.next_batch()) is not None:
            assert batch.num_rows > 0
            got.extend(batch.column("offset").to_pylist())
        return got

    assert anyio.run(columnar) == rows
    return rows


def test_range_reader_reads_exactly_the_range() -> None:
    consumer = FakeConsumer(range(100))
    assert read_all(consumer, 10, 23) == list(range(10, 23))
    assert consumer.fetch_end == 23  # no read-ahead past the range
    # gaps (compaction, transaction markers) are not data loss
    assert read_all(FakeConsumer([0, 2, 3, 9, 10, 15]), 1, 10) == [2, 3, 9]
    assert read_all(FakeConsumer(range(100)), 5, 5) == []


def test_range_reader_data_loss() -> None:
    with pytest.raises(DataLossError, match=r"offsets 2 to 9 of t-0 are gone .*failOnDataLoss"):
        read_all(FakeConsumer(range(10, 30), log_start=10), 2, 20)
    consumer = FakeConsumer(range(10, 30), log_start=10)
    assert read_all(consumer, 2, 20, fail_on_data_loss=False) == list(range(10, 20))
    assert consumer.seeks == [2, 10]


# ------------------------------------------------------------------------------------- Arrow


def test_schema_is_spark_kafka_sources() -> None:
    """The columns and types of Spark's own Kafka source, so jobs switch by the format name."""
    assert spark_schema(False).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,timestampType:int>"
    )
    assert spark_schema(True).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )


def test_arrow_schema_is_what_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    for headers in (False, True):
        assert to_arrow_schema(spark_schema(headers), timezone="UTC").equals(arrow_schema(headers))


def test_records_to_batch() -> None:
    records = [
        ConsumerRecord("t", 1, 7, 1_700_000_000_123, 1, b"k", b"v", 1, 1, (("a", b"1"), ("b", None))),
        ConsumerRecord("t", 1, 8, 1_700_000_000_124, 0, None, None, -1, -1, ()),
    ]
    batch = records_to_batch(records, include_headers=True)
    assert batch.schema.equals(arrow_schema(True))
    rows = batch.to_pylist()
    assert rows[0]["key"] == b"k" and rows[1]["key"] is None and rows[1]["value"] is None
    assert rows[0]["headers"] == [{"key": "a", "value": b"1"}, {"key": "b", "value": None}]
    assert rows[1]["headers"] == []
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, 1_700_000_000_124_000]
    assert batch.column("timestampType").to_pylist() == [1, 0]
    assert records_to_batch(records, include_headers=False).schema.equals(arrow_schema(False))
