"""Streaming reads (``spark.readStream.format("asyncconsumer")``) against the test broker."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.spark import DataLossError, KafkaStreamReader, SourceOptionError, parse_options

pytestmark = pytest.mark.spark


def run_available_now(spark: Any, bootstrap: str, out: Path, checkpoint: Path, **options: str) -> list[int]:
    """One ``trigger(availableNow=True)`` run into Parquet; returns the rows of each micro-batch."""
    reader = spark.readStream.format("asyncconsumer").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .selectExpr("topic", "partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(90), "the availableNow query did not finish in 90 s"
    finally:
        query.stop()
    assert query.exception() is None
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


def written(spark: Any, out: Path) -> Counter[tuple[str, int, int, bytes]]:
    if not any(out.glob("*.parquet")):
        return Counter()
    table = spark.read.parquet(str(out)).toArrow()
    columns = [table.column(c).to_pylist() for c in ("topic", "partition", "offset", "value")]
    return Counter(zip(*columns, strict=True))


def test_available_now_with_checkpoint_reads_exactly_the_new_records(
    spark: Any, bootstrap: str, produce: Callable[..., Any], tmp_path: Path
) -> None:
    from support.producer import create_topic

    prefix = f"stream-{uuid.uuid4().hex[:8]}"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "1000",
        "groupIdPrefix": "lag",
        "commitOffsetsToGroup": "true",
    }
    produced: Counter[tuple[str, int, int, bytes]] = Counter()

    def add(topic: str, values: list[bytes], partitions: int) -> None:
        placed = produce(topic, [(i % partitions, None, v) for i, v in enumerate(values)], "zstd")
        produced.update((topic, p, o, v) for (p, o), v in zip(placed, values, strict=True))

    topic_a = create_topic(bootstrap, f"{prefix}-a", 2)
    add(topic_a, [b"first-%d" % i for i in range(3000)], 2)

    # 1st run: everything, in micro-batches of at most ~1000 records (maxOffsetsPerTrigger)
    batches = run_available_now(spark, bootstrap, out, checkpoint, **options)
    assert sum(batches) == 3000 and len(batches) >= 3 and max(batches) <= 1001
    assert written(spark, out) == produced

    # 2nd run: only the new records, including a topic created since (picked up via the pattern)
    add(topic_a, [b"second-%d" % i for i in range(500)], 2)
    topic_b = create_topic(bootstrap, f"{prefix}-b", 1)
    add(topic_b, [b"b-%d" % i for i in range(200)], 1)
    batches = run_available_now(spark, bootstrap, out, checkpoint, **options)
    assert sum(batches) == 700
    assert written(spark, out) == produced  # no duplicates, nothing missing

    # 3rd run: nothing new, nothing read
    assert run_available_now(spark, bootstrap, out, checkpoint, **options) == []
    assert written(spark, out) == produced

    # groupIdPrefix: the processed offsets were committed for lag monitoring (no group was joined)
    group = parse_options({"kafka.bootstrap.servers": bootstrap, **options}).group_id
    ends = Counter[TopicPartition]()
    for topic, partition, _, _ in produced:
        ends[TopicPartition(topic, partition)] += 1

    async def committed() -> dict[TopicPartition, int | None]:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False) as c:
            found = await c.committed(list(ends))
            return {tp: om.offset if om else None for tp, om in found.items()}

    assert anyio.run(committed) == dict(ends)


_readers: list[KafkaStreamReader] = []


@pytest.fixture(autouse=True)
def _stop_readers() -> Iterator[None]:
    """Spark stops a stream reader when its query ends; a test's readers are stopped after it."""
    yield
    while _readers:
        _readers.pop().stop()


def stream_reader(bootstrap: str, **options: str) -> KafkaStreamReader:
    reader = KafkaStreamReader(parse_options({"kafka.bootstrap.servers": bootstrap, **options}, streaming=True))
    _readers.append(reader)
    return reader


def test_latest_offset_rate_limit_and_available_now_target(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"x") for i in range(400)])
    reader = stream_reader(bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    start = reader.initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}
    assert reader.getDefaultReadLimit() == ReadMaxRows(100)
    assert reader.latestOffset(start, ReadMaxRows(100)) == {topic: {"0": 50, "1": 50}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 200, "1": 200}}

    reader.prepareForTriggerAvailableNow()
    produce(topic, [(0, None, b"late")] * 10)  # after the availableNow target: not read by this query
    end = reader.latestOffset({topic: {"0": 150, "1": 200}}, ReadAllAvailable())
    assert end == {topic: {"0": 200, "1": 200}}
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # "no new data": the query ends
    parts = reader.partitions({topic: {"0": 150, "1": 200}}, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 150, 200)]  # type: ignore[attr-defined]


def test_driver_consumer_kept_across_micro_batches_and_closed_on_stop(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"x") for i in range(40)])
    reader = stream_reader(bootstrap, subscribe=topic, startingOffsets="earliest")
    planner = reader._planner
    assert not planner.started  # nothing before Spark asks
    start = reader.initialOffset()
    planned = []
    for _ in range(3):  # micro-batches: the offsets, the plan, and new records before the next
        began = time.monotonic()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert time.monotonic() - began < 5  # under the high-watermark probe's 10 s: it got its answer
        tasks = reader.partitions(start, end)
        planned.append([(r.tp.partition, r.start, r.end) for p in tasks for r in p.offset_ranges])  # type: ignore[attr-defined]
        produce(topic, [(0, None, b"y")] * 5)  # seen by the next call: each lookup asks Kafka afresh
        start = end
    assert planned == [[(0, 0, 20), (1, 0, 20)], [(0, 20, 25)], [(0, 25, 30)]]
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 35, "1": 20}}
    assert planner.started and planner.starts == 1  # one consumer for every call
    reader.stop()
    assert not planner.started
    reader.stop()  # twice is harmless
    assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 35, "1": 20}}
    assert planner.starts == 2  # used after stop(): a new consumer
    reader.stop()


def test_failed_driver_call_starts_a_fresh_consumer(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    reader = stream_reader(bootstrap, assign=f'{{"{topic}":[0,3]}}', startingOffsets="earliest")
    with pytest.raises(SourceOptionError, match=f"names partitions that do not exist: {topic}-3"):
        reader.initialOffset()
    assert not reader._planner.started  # closed with the failure: nothing half-done is kept
    fine = stream_reader(bootstrap, assign=f'{{"{topic}":[0]}}', startingOffsets="earliest")
    assert fine.initialOffset() == {topic: {"0": 0}}
    fine.stop()


def test_data_loss_on_the_driver(bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 10)
    strict = stream_reader(bootstrap, subscribe=topic)
    # the checkpointed offset is past the end of the log (topic re-created, log truncated)
    with pytest.raises(DataLossError, match=rf"offset of {topic}-0 went back from 500 to 10.*failOnDataLoss"):
        strict.partitions({topic: {"0": 500}}, {topic: {"0": 10}})
    # a partition of the checkpoint is gone
    with pytest.raises(DataLossError, match="partitions gone-0 are gone"):
        strict.partitions({topic: {"0": 0}, "gone": {"0": 5}}, {topic: {"0": 10}})
    lenient = stream_reader(bootstrap, subscribe=topic, failOnDataLoss="false")
    assert lenient.partitions({topic: {"0": 500}}, {topic: {"0": 10}}) == []
    parts = lenient.partitions({topic: {"0": 0}, "gone": {"0": 5}}, {topic: {"0": 10}})
    assert [(p.topic, p.start, p.end) for p in parts] == [(topic, 0, 10)]  # type: ignore[attr-defined]


def test_streaming_rejects_batch_only_options_before_reading(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    from pyspark.errors import PySparkException

    df = (
        spark.readStream.format("asyncconsumer")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "anything")
        .option("endingOffsets", "latest")
        .load()
    )
    with pytest.raises(PySparkException) as info:
        query = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    assert "option 'endingOffsets' is for batch queries (spark.read) only" in str(info.value)
