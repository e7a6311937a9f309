"""Share consumer throughput: asyncconsumer's ShareConsumer (implicit acknowledgement) next to
Apache Kafka's own ``org.apache.kafka.tools.ShareConsumerPerformance``, same broker and data.

    python -m benchmarks.share [--bootstrap HOST:PORT] [--records 200000] [--partitions 4] [--size 100]
                               [--acknowledgement-mode implicit|explicit]

Without ``--bootstrap`` a one-node Apache Kafka 4.4.0 (``asyncconsumer.testing.KafkaBroker``) is
started.  One topic is produced once (confluent-kafka); each client reads it in a share group of
its own that starts at the earliest offset (``share.auto.offset.reset``, set with
IncrementalAlterConfigs), one member per client.  records/s is measured from ``subscribe()`` to the
last record for both clients (the Java tool's ``fetch.time.ms`` starts after building the
consumer, before it joins: the JVM start is left out, the group join and first fetch are in);
ours is also given from the first record to the last.  Prints one JSON line per client, then one
with both and the ratio (``benchmarks.run`` reads that last line for its share-consumer row).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio

from asyncconsumer import ShareConsumer

JAVA_CLASS = "org.apache.kafka.tools.ShareConsumerPerformance"


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def create_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    name = f"share-bench-{uuid.uuid4().hex[:8]}"
    admin = _admin(bootstrap)  # kept alive until the answer is in (a dropped client cancels it)
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)
    return name


def share_group_from_earliest(bootstrap: str) -> str:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource  # type: ignore[attr-defined]

    group = f"share-bench-{uuid.uuid4().hex[:8]}"
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("GROUP", group, incremental_configs=[entry])
    admin = _admin(bootstrap)
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    return group


def produce(bootstrap: str, topic: str, count: int, size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": "none", "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)


async def run_ours(bootstrap: str, topic: str, count: int, mode: str = "implicit") -> dict[str, Any]:
    group = await anyio.to_thread.run_sync(share_group_from_earliest, bootstrap)
    got = 0
    first = last = 0.0
    explicit = mode == "explicit"
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit" if explicit else "implicit") as consumer:
        consumer.subscribe([topic])
        subscribed = time.perf_counter()
        with anyio.fail_after(300):
            while got < count:
                batch = await consumer.getmany(timeout=1.0)
                n = 0
                for records in batch.values():
                    n += len(records)
                    if explicit:  # each record accepted by itself, as an application would
                        for record in records:
                            consumer.acknowledge(record)
                if n and not got:
                    first = time.perf_counter()
                got += n
            last = time.perf_counter()
        await consumer.commit()
    seconds = last - subscribed
    return {"client": f"asyncconsumer ShareConsumer ({mode})", "records": got, "seconds": round(seconds, 3),
            "records_per_s": round(got / seconds) if seconds > 0 else None,
            "records_per_s_from_first_record": round(got / (last - first)) if last > first else None}


def java_command(main_class: str, *args: str) -> list[str]:
    from asyncconsumer.testing.kafka import find_java, kafka_libs

    java, _ = find_java()
    return [java, "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
            "-cp", str(kafka_libs() / "*"), main_class, *args]


def run_java(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    group = share_group_from_earliest(bootstrap)
    out = subprocess.run(
        java_command(JAVA_CLASS, "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
                     "--num-records", str(count), "--timeout", "60000"),
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    lines = [line for line in out.splitlines() if "," in line]
    header = [h.strip() for h in lines[0].split(",")]
    row = dict(zip(header, (v.strip() for v in lines[1].split(",")), strict=False))
    fetch_ms = float(row["fetch.time.ms"]) if "fetch.time.ms" in row else None
    records = int(float(row["data.consumed.in.nMsg"]))
    per_s = float(row.get("fetch.nMsg.sec") or row["nMsg.sec"])
    return {"client": "Java KafkaShareConsumer (ShareConsumerPerformance)", "records": records,
            "seconds": round(fetch_ms / 1000, 3) if fetch_ms else None, "records_per_s": round(per_s),
            "tool_row": row}


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from asyncconsumer.testing import KafkaBroker

    with KafkaBroker() as kafka:
        yield kafka.bootstrap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--acknowledgement-mode", choices=["implicit", "explicit"], default="implicit",
                        help="ours only; explicit: every record acknowledged by its own call (Java's tool "
                             "reads in implicit mode either way)")
    args = parser.parse_args(argv)
    with broker(args.bootstrap) as bootstrap:
        topic = create_topic(bootstrap, args.partitions)
        produce(bootstrap, topic, args.records, args.size)
        java = run_java(bootstrap, topic, args.records)
        ours = anyio.run(run_ours, bootstrap, topic, args.records, args.acknowledgement_mode)
    print(json.dumps({"java_tool_row": java["tool_row"]}), file=sys.stderr)
    java = {k: v for k, v in java.items() if k != "tool_row"}
    for row in (ours, java):
        print(json.dumps(row))
    rates = ours["records_per_s"], java["records_per_s"]
    ratio = round(rates[0] / rates[1], 2) if all(rates) else None
    print(json.dumps({"records": args.records, "partitions": args.partitions, "size": args.size,
                      "ours": ours, "java": java, "ratio_ours_to_java": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
