"""The example pipeline: Kafka JSON events -> Spark aggregation -> Parquet.

It reads every record of a topic with the ``asyncconsumer`` source (``spark.read``), parses the
values as JSON events, and computes per key per 1-minute window the number of events and the sum of
their ``amount`` field, then writes the result as Parquet and returns a summary.

An event is a JSON object such as ``{"user": "user-3", "amount": 12.5, "ts": 1700000000000}``:

- the key is the ``user`` field, or else the Kafka record key (UTF-8);
- ``amount`` is a number (missing: 0);
- the event time is ``ts`` (epoch milliseconds) when present, else the Kafka record timestamp.

Values that are not a JSON object are counted as ``bad_records`` and left out of the aggregation.
:func:`run_pipeline` is the entry point for other programs (the project demo calls it);
``python -m asyncconsumer.spark`` runs it from the command line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["produce_sample_events", "run_pipeline"]

WINDOW = "1 minute"


def _session(master: str, progress: Callable[[str], None]) -> tuple[SparkSession, bool]:
    """The active SparkSession, or a new local one (and whether it was created here)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to loopback" warning
    # PySpark warns about pandas 3 on import; this pipeline does not use pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    progress(f"starting Spark ({master}) ...")
    started = time.perf_counter()
    spark = (
        SparkSession.builder.master(master)
        .appName("asyncconsumer-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    progress(f"Spark {spark.version} ready in {time.perf_counter() - started:.1f}s")
    return spark, True


def run_pipeline(
    bootstrap: str,
    topic: str,
    output_dir: str,
    *,
    progress: Callable[[str], None] = print,
    spark: SparkSession | None = None,
    master: str = "local[*]",
    kafka_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Read ``topic`` from ``bootstrap``, aggregate per key per minute, write Parquet to ``output_dir``.

    ``spark``: an existing session to use (default: the active one, or a new ``master`` session that
    is stopped at the end).  ``kafka_options``: extra ``kafka.*`` source options (TLS, SASL, ...).
    ``progress`` receives one line per step.  Returns the summary (also what the CLI prints):
    ``records``, ``bad_records``, ``keys``, ``windows``, ``rows_written``, ``total_amount``,
    ``per_partition``, ``top_keys``, ``first_window``, ``last_window``, ``output``, ``seconds``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from .source import register

    started = time.perf_counter()
    created = False
    if spark is None:
        spark, created = _session(master, progress)
    try:
        register(spark)
        progress(f"reading {topic!r} from {bootstrap} with the asyncconsumer source ...")
        reader = (
            spark.read.format("asyncconsumer")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
        )
        for name, value in (kafka_options or {}).items():
            reader = reader.option(name if name.startswith("kafka.") else f"kafka.{name}", value)
        raw = reader.load()

        event_schema = StructType(
            [
                StructField("user", StringType()),
                StructField("amount", DoubleType()),
                StructField("ts", LongType()),
                StructField("_corrupt", StringType()),
            ]
        )
        parsed = raw.select(
            F.col("partition"),
            F.col("key").cast("string").alias("record_key"),
            F.from_json(F.col("value").cast("string"), event_schema, {"columnNameOfCorruptRecord": "_corrupt"}).alias(
                "event"
            ),
            F.col("timestamp").alias("record_time"),
        ).select(
            "partition",
            (F.col("event").isNotNull() & F.col("event._corrupt").isNull()).alias("ok"),
            F.coalesce(F.col("event.user"), F.col("record_key"), F.lit("<none>")).alias("key"),
            F.coalesce(F.col("event.amount"), F.lit(0.0)).alias("amount"),
            F.coalesce(F.timestamp_millis(F.col("event.ts")), F.col("record_time")).alias("event_time"),
        )
        parsed = parsed.persist()
        per_partition_rows = parsed.groupBy("partition", "ok").count().collect()
        per_partition: dict[int, int] = {}
        bad = 0
        for row in per_partition_rows:
            per_partition[int(row["partition"])] = per_partition.get(int(row["partition"]), 0) + int(row["count"])
            if not row["ok"]:
                bad += int(row["count"])
        total = sum(per_partition.values())
        progress(f"read {total} records from {len(per_partition)} partitions ({bad} not JSON events)")

        progress(f"aggregating: events and sum(amount) per key per {WINDOW} window ...")
        aggregated = (
            parsed.where("ok")
            .groupBy(F.window("event_time", WINDOW).alias("window"), F.col("key"))
            .agg(F.count(F.lit(1)).alias("events"), F.sum("amount").alias("amount"))
            .select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "key",
                "events",
                "amount",
            )
        )
        output = str(Path(output_dir).resolve())
        aggregated.orderBy("window_start", "key").write.mode("overwrite").parquet(output)
        progress(f"wrote Parquet to {output}")

        written = spark.read.parquet(output)
        stats = written.agg(
            F.count(F.lit(1)).alias("rows"),
            F.countDistinct("key").alias("keys"),
            F.countDistinct("window_start").alias("windows"),
            F.sum("events").alias("events"),
            F.sum("amount").alias("amount"),
            F.min("window_start").alias("first"),
            F.max("window_start").alias("last"),
        ).collect()[0]
        top = (
            written.groupBy("key")
            .agg(F.sum("events").alias("events"), F.sum("amount").alias("amount"))
            .orderBy(F.desc("events"), "key")
            .limit(5)
            .collect()
        )
        parsed.unpersist()
        summary: dict[str, Any] = {
            "topic": topic,
            "records": total,
            "bad_records": bad,
            "events": int(stats["events"] or 0),
            "keys": int(stats["keys"]),
            "windows": int(stats["windows"]),
            "rows_written": int(stats["rows"]),
            "total_amount": float(stats["amount"] or 0.0),
            "per_partition": dict(sorted(per_partition.items())),
            "top_keys": [(r["key"], int(r["events"]), float(r["amount"])) for r in top],
            "first_window": stats["first"].isoformat() if stats["first"] is not None else None,
            "last_window": stats["last"].isoformat() if stats["last"] is not None else None,
            "output": output,
            "seconds": round(time.perf_counter() - started, 2),
        }
        progress(
            f"pipeline done in {summary['seconds']:.1f}s: {summary['events']} events, {summary['keys']} keys, "
            f"{summary['windows']} one-minute windows, {summary['rows_written']} Parquet rows"
        )
        return summary
    finally:
        if created:
            spark.stop()


def produce_sample_events(
    bootstrap: str, topic: str, *, count: int = 20_000, partitions: int = 4, minutes: int = 10
) -> None:
    """Create ``topic`` and fill it with JSON events spread over ``minutes`` minutes (needs confluent-kafka)."""
    try:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
    except ImportError:
        raise SystemExit("the sample data is produced with confluent-kafka: pip install confluent-kafka") from None

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 20})
    base = (int(time.time()) // 60 - minutes) * 60_000
    step = minutes * 60_000 // max(1, count)
    for i in range(count):
        user = f"user-{i % 7}"
        event = {"user": user, "amount": i % 100, "seq": i, "ts": base + i * step}
        while True:
            try:
                producer.produce(topic, key=user.encode(), value=json.dumps(event).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.produce(topic, key=b"broken", value=b"this is not JSON", partition=0)
    remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} sample events were not delivered")
