"""Switching from Spark's Kafka source by the format name: its rules, on the test broker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.spark import KafkaStreamReader, offsets_behind_latest, parse_options

pytestmark = pytest.mark.spark


def kafka_read(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format("asyncconsumer").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def produce_at(bootstrap: str, topic: str, timestamps: list[int]) -> None:
    """One record per timestamp (CreateTime, ms) to partition 0, value = its timestamp."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for ts in timestamps:
        producer.produce(topic, value=str(ts).encode(), partition=0, timestamp=ts)
    assert producer.flush(30) == 0


@pytest.mark.broker_feature("list_offsets_timestamp")  # Tansu answers with the earliest offset
def test_timestamp_options_win_in_sparks_order(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets, and the same for the end."""
    topic = new_topic(1)
    base = int(time.time() * 1000) - 60_000  # recent: retention would delete records from 1970
    produce_at(bootstrap, topic, [base + 1000 * i for i in range(1, 11)])
    df = kafka_read(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets="earliest",
        startingOffsetsByTimestamp=json.dumps({topic: {"0": base + 2000}}),
        startingTimestamp=str(base + 5000),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": base + 10000}}),
        endingTimestamp=str(base + 8000),
        endingOffsets="latest",
    )
    values = sorted(int(r.value) - base for r in df.select("value").collect())
    assert values == [5000, 6000, 7000]


def test_nothing_to_read_is_an_empty_frame(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    """No offset range at all (an empty topic): Spark then reads one partition of its own, which
    holds nothing."""
    df = kafka_read(spark, bootstrap, subscribe=new_topic(2))
    assert df.count() == 0
    assert df.select("value").collect() == []


def test_min_partitions_makes_sparks_number_of_tasks(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """The issue's case scaled down: 6 asked on 120/90/60/30 records is 6 tasks, as in Spark."""
    topic = new_topic(4)
    sizes = [120, 90, 60, 30]
    produce(topic, [(p, None, b"x") for p, size in enumerate(sizes) for _ in range(size)])
    df = kafka_read(spark, bootstrap, subscribe=topic, minPartitions="6")
    assert df.rdd.getNumPartitions() == 6
    assert df.count() == sum(sizes)


def test_subscribe_pattern_is_a_java_regex(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    stem = f"jre{uuid.uuid4().hex[:8]}"
    for suffix, count in (("7", 3), ("42", 4), ("x", 5)):
        produce(new_topic(1, name=f"{stem}-{suffix}"), [(0, None, b"v")] * count)
    pattern = stem + r"-\p{Digit}++"  # a POSIX class and a possessive quantifier
    df = kafka_read(spark, bootstrap, subscribePattern=pattern, startingOffsets="earliest")
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {f"{stem}-7": 3, f"{stem}-42": 4}


def run_available_now(spark: Any, bootstrap: str, tmp_path: Path, **options: str) -> Any:
    reader = spark.readStream.format("asyncconsumer").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .selectExpr("partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    finally:
        query.stop()
    assert query.exception() is None
    return query


def committed(bootstrap: str, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    async def main() -> dict[TopicPartition, int | None]:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False) as c:
            found = await c.committed(set(tps))
        return {tp: (m.offset if m is not None else None) for tp, m in found.items()}

    return anyio.run(main)


def test_group_id_gets_no_commits_and_lag_metrics_come_from_the_progress(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], tmp_path: Path
) -> None:
    """kafka.group.id alone: nothing committed (Spark's source commits nothing either).  And the
    lag metrics: Spark's names, from the progress, since a Python source cannot add metrics."""
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"x") for i in range(300)])
    group = f"spark-group-{uuid.uuid4().hex[:8]}"
    query = run_available_now(
        spark,
        bootstrap,
        tmp_path,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        **{"kafka.group.id": group},
    )
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    assert committed(bootstrap, group, tps) == {tp: None for tp in tps}

    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [100, 100, 100]
    first = batches[0]["sources"][0]
    # PySpark's Python micro-batch streams do not implement ReportsSourceMetrics: no custom metrics.
    assert not first.get("metrics")
    jvm = spark.sparkContext._jvm
    reports = jvm.java.lang.Class.forName("org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics")
    python_stream = jvm.java.lang.Class.forName(
        "org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStreamWithAdmissionControl"
    )
    assert not reports.isAssignableFrom(python_stream)
    # ... so offsets_behind_latest computes Spark's three from latestOffset and endOffset.
    assert offsets_behind_latest(first) == {
        "minOffsetsBehindLatest": "100",
        "maxOffsetsBehindLatest": "100",
        "avgOffsetsBehindLatest": "100.0",
    }
    assert offsets_behind_latest(batches[-1]["sources"][0])["maxOffsetsBehindLatest"] == "0"


def test_commit_offsets_to_group_is_explicit(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], tmp_path: Path
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 50)
    group = f"lag-{uuid.uuid4().hex[:8]}"
    options = {"subscribe": topic, "startingOffsets": "earliest", "commitOffsetsToGroup": "true"}
    run_available_now(spark, bootstrap, tmp_path, **options, **{"kafka.group.id": group})
    assert committed(bootstrap, group, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 50}


def test_min_offsets_per_trigger_and_max_trigger_delay(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Spark's delayBatch: a trigger waits for minOffsetsPerTrigger new offsets, or for
    maxTriggerDelay since the last batch.  The driver's calls, as Spark makes them, on a fake clock."""
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"x") for i in range(30)])
    options = {"subscribe": topic, "startingOffsets": "earliest", "minOffsetsPerTrigger": "50", "maxTriggerDelay": "1h"}
    reader = KafkaStreamReader(parse_options({"kafka.bootstrap.servers": bootstrap, **options}, streaming=True))
    now = [10_000_000]
    reader.clock_ms = lambda: now[0]
    try:
        start = reader.initialOffset()
        limit = reader.getDefaultReadLimit()
        assert limit == ReadMinRows(50)
        first = reader.latestOffset(start, limit)  # the first trigger runs (the delay since "never" passed)
        assert first == {topic: {"0": 15, "1": 15}}
        produce(topic, [(0, None, b"y")] * 10)
        now[0] += 1000
        assert reader.latestOffset(first, limit) == first  # 10 new < 50: wait
        produce(topic, [(1, None, b"z")] * 45)
        now[0] += 1000
        second = reader.latestOffset(first, limit)  # 55 new >= 50: run
        assert second == {topic: {"0": 25, "1": 60}}
        produce(topic, [(0, None, b"w")] * 3)
        now[0] += 1000
        assert reader.latestOffset(second, limit) == second
        now[0] += 3_600_000  # maxTriggerDelay passed: run with what there is
        assert reader.latestOffset(second, limit) == {topic: {"0": 28, "1": 60}}
        # with maxOffsetsPerTrigger too, the rate limit applies to a batch that runs
        both = {**options, "maxOffsetsPerTrigger": "60"}
        capped = KafkaStreamReader(parse_options({"kafka.bootstrap.servers": bootstrap, **both}, streaming=True))
        try:
            assert capped.getDefaultReadLimit() == ReadMaxRows(60)
            # 88 waiting (28 + 60): 60 * (28 / 88) = 19.09 and 60 * (60 / 88) = 40.9, rounded down
            assert capped.latestOffset(start, capped.getDefaultReadLimit()) == {topic: {"0": 19, "1": 40}}
        finally:
            capped.stop()
    finally:
        reader.stop()
