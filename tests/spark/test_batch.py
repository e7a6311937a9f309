"""Batch reads (``spark.read.format("asyncconsumer")``) against the test broker."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from asyncconsumer.spark import KafkaBatchReader, parse_options
from asyncconsumer.spark.arrow import spark_schema

pytestmark = pytest.mark.spark

N = 100_000
PARTITIONS = 4


def kafka_read(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format("asyncconsumer").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.fixture(scope="module")
def big_topic(bootstrap: str) -> tuple[str, list[tuple[int, int, bytes]]]:
    """100k records over 4 partitions; returns the topic and every (partition, offset, value)."""
    from support.producer import create_topic, produce

    topic = create_topic(bootstrap, f"spark-batch-100k-{uuid.uuid4().hex[:8]}", PARTITIONS)
    values = [b"value-%06d" % i for i in range(N)]
    placed = produce(bootstrap, topic, ((i % PARTITIONS, b"k%d" % (i % 13), v) for i, v in enumerate(values)), "lz4")
    return topic, [(p, o, v) for (p, o), v in zip(placed, values, strict=True)]


def test_batch_reads_every_record_exactly_once(
    spark: Any, bootstrap: str, big_topic: tuple[str, list[tuple[int, int, bytes]]]
) -> None:
    topic, produced = big_topic
    # Four ranges of 25,000 records: packed into tasks of 60,000 or more (3 ranges, then the last
    # one), and one task per range as Spark plans them: the same records either way.
    for per_task, tasks in (("60000", 2), ("0", PARTITIONS)):
        df = kafka_read(spark, bootstrap, subscribe=topic, minRecordsPerTask=per_task)
        assert df.schema == spark_schema(False)
        assert df.rdd.getNumPartitions() == tasks
        table = df.select("partition", "offset", "value").toArrow()
        assert table.num_rows == N
        got = Counter(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
        assert got == Counter(produced)


def test_batch_honours_per_partition_offsets_exactly(
    spark: Any, bootstrap: str, big_topic: tuple[str, list[tuple[int, int, bytes]]]
) -> None:
    from pyspark.sql import functions as F

    topic, produced = big_topic
    per_partition = Counter(p for p, _, _ in produced)
    starting = {"0": 100, "1": -2, "2": 5_000, "3": 24_000}
    ending = {"0": 200, "1": 1, "2": -1, "3": 24_999}
    expected = {0: (100, 200), 1: (0, 1), 2: (5_000, per_partition[2]), 3: (24_000, 24_999)}
    df = kafka_read(
        spark,
        bootstrap,
        assign=json.dumps({topic: [0, 1, 2, 3]}),
        startingOffsets=json.dumps({topic: starting}),
        endingOffsets=json.dumps({topic: ending}),
        minPartitions="9",
    )
    rows = df.groupBy("partition").agg(F.min("offset"), F.max("offset"), F.count("*"), F.countDistinct("offset"))
    got = {r[0]: (r[1], r[2] + 1, r[3]) for r in rows.collect() if r[3] == r[4]}  # no offset twice
    assert got == {p: (lo, hi, hi - lo) for p, (lo, hi) in expected.items()}

    # minPartitions splits the ranges into about that many Spark tasks (Spark's rules; here at least
    # that many), covering each exactly
    options = parse_options(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            "startingOffsets": json.dumps({topic: starting}),
            "endingOffsets": json.dumps({topic: ending}),
            "minPartitions": "9",
        },
        streaming=False,
    )
    parts = KafkaBatchReader(options).partitions()
    assert len(parts) >= 9
    spans: dict[int, list[tuple[int, int]]] = {}
    for part in parts:
        spans.setdefault(part.partition, []).append((part.start, part.end))  # type: ignore[attr-defined]
    for p, (lo, hi) in expected.items():
        pieces = sorted(spans[p])
        assert pieces[0][0] == lo and pieces[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))


def test_headers_null_keys_and_compressed_topics(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    codecs = ["gzip", "snappy", "lz4", "zstd", "none"]
    expected = set()
    topics = []
    for codec in codecs:
        topic = new_topic(2)
        topics.append(topic)
        records = []
        for i in range(300):
            key = None if i % 3 == 0 else f"key-{i}".encode()
            value = None if i % 50 == 49 else f"{codec}-{i}".encode() * (1 + i % 7)
            headers = [("codec", codec.encode()), ("n", str(i).encode())] if i % 4 else []
            if i % 10 == 5:
                headers.append(("empty", None))
            records.append((i % 2, key, value, headers, 1_700_000_000_000 + i))
        placed = produce(topic, records, codec)
        for (partition, offset), (_, key, value, headers, ts) in zip(placed, records, strict=True):
            expected.add((topic, partition, offset, key, value, tuple(headers), ts * 1000))

    df = kafka_read(spark, bootstrap, subscribe=",".join(topics), includeHeaders="true")
    assert df.schema == spark_schema(True)
    rows = df.selectExpr(
        "topic", "partition", "offset", "key", "value", "headers", "unix_micros(timestamp) AS ts", "timestampType"
    ).collect()
    got = {
        (
            r["topic"],
            r["partition"],
            r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            None if r["value"] is None else bytes(r["value"]),
            tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"]),
            r["ts"],
        )
        for r in rows
    }
    assert len(rows) == len(expected) == 1500
    assert got == expected
    assert {r["timestampType"] for r in rows} == {0}


def consumer_groups(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer is in
    listing = admin.list_consumer_groups(request_timeout=10).result()
    assert not listing.errors
    return {g.group_id for g in listing.valid}


def test_batch_read_joins_no_consumer_group(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Offsets live in Spark (as with Spark's Kafka source): the read creates no group on the broker."""
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(2)
    produce(topic, ((i % 2, None, b"x") for i in range(200)))
    before = consumer_groups(bootstrap)
    assert kafka_read(spark, bootstrap, subscribe=topic).count() == 200
    assert consumer_groups(bootstrap) - before == set()
    # control: the listing does show a group as soon as anything commits for it
    control = f"control-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": control})
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
    finally:
        committer.close()
    assert consumer_groups(bootstrap) - before == {control}


def test_conflicting_options_fail_before_any_task(spark: Any, bootstrap: str) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as info:
        kafka_read(spark, bootstrap, subscribe="a", assign='{"a":[0]}')
    assert "exactly one of 'assign', 'subscribe' or 'subscribePattern' must be set" in str(info.value)

    with pytest.raises(PySparkException) as info:
        kafka_read(spark, bootstrap, subscribe="a", startingOffset="earliest")
    assert "unknown option 'startingoffset'; did you mean 'startingOffsets'?" in str(info.value)

    # batch-only checks run when the query is planned, still before any task (no Spark job starts)
    group = f"bad-options-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "a query with a bad option")
    try:
        df = kafka_read(spark, bootstrap, subscribe="a", startingOffsets="latest")
        with pytest.raises(PySparkException) as info:
            df.count()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert "startingOffsets='latest' is not valid for batch queries" in str(info.value)
    assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []
    spark.sparkContext.setJobGroup(f"{group}-control", "a query that runs")  # the tracker does see jobs
    try:
        spark.range(3).count()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(f"{group}-control")) != []

    with pytest.raises(PySparkException) as info:
        spark.read.format("asyncconsumer").schema("value STRING").option("kafka.bootstrap.servers", bootstrap).option(
            "subscribe", "a"
        ).load().count()
    assert "the source has a fixed schema" in str(info.value)


def test_ending_offsets_beyond_the_log_are_an_error(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    from pyspark.errors import PySparkException

    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 10)
    df = kafka_read(spark, bootstrap, subscribe=topic, endingOffsets=json.dumps({topic: {"0": 11}}))
    with pytest.raises(PySparkException) as info:
        df.count()
    assert f"endingOffsets are beyond the end of the log for {topic}-0 (11 > latest 10)" in str(info.value)
    assert kafka_read(spark, bootstrap, subscribe=topic, endingOffsets=json.dumps({topic: {"0": 10}})).count() == 10


def test_batch_read_over_tls(spark: Any, tls_broker: Any) -> None:
    """kafka.* options pass TLS settings through to the consumers on the driver and the executors."""
    from support.producer import create_topic, produce

    client = {"security.protocol": "SSL", "ssl.ca.location": str(tls_broker.ca_file)}
    topic = create_topic(tls_broker.bootstrap, f"spark-tls-{uuid.uuid4().hex[:8]}", 2, None, client_config=client)
    values = [b"secret-%d" % i for i in range(200)]
    produce(tls_broker.bootstrap, topic, [(i % 2, None, v) for i, v in enumerate(values)], client_config=client)
    df = kafka_read(
        spark,
        tls_broker.bootstrap,
        subscribe=topic,
        **{"kafka.security.protocol": "SSL", "kafka.ssl.ca.location": str(tls_broker.ca_file)},
    )
    assert sorted(row.value for row in df.select("value").collect()) == sorted(values)
