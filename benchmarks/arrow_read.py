"""Kafka to Arrow: ``arrow_batches()`` against ``batches()`` and aiokafka ``getmany()`` + Arrow.

    python -m benchmarks.arrow_read [--quick] [--broker kafka|tansu] [--rounds 3] [--warmup 1]
                                    [--readers arrow,batches] [--baseline SRC] [--uvloop]
                                    [--records-100b N] [--max-records N]
                                    [--max-partition-fetch-bytes N]

Starts the broker (as ``benchmarks.run`` does), produces the 100 B and 1 KiB data sets once
(confluent-kafka, 4 partitions), then reads each topic from the beginning with every reader in a
fresh subprocess, interleaved for ``--rounds`` rounds (the order rotates each round), after
``--warmup`` rounds that are not counted (a broker just started serves its first reads slower,
its JIT compiler still at work: the first round of a run read at a third to half the rate of the
others, and moved its ratios).  Readers:

- ``arrow``: asyncconsumer ``arrow_batches()``, pyarrow record batches (Spark's Kafka schema);
- ``batches``: asyncconsumer ``batches()``, one ``ConsumerRecord`` per record (no Arrow);
- ``batches+arrow``: ``batches()`` then ``spark.arrow.records_to_batch`` per batch (the Spark
  source's old route);
- ``aiokafka+arrow``: aiokafka ``getmany()`` then the same conversion to Arrow per partition.

Each reader assigns all partitions (no group) and stops at the topic's record count.  Prints
records/s per round, the median and spread, and the ratios to ``batches()``; and the same per CPU
second of the reader's process (``time.process_time``: steadier than wall time on a shared
machine, and blind to waiting for the broker), with the median of the ratios taken round by round
("paired": a slow phase of the machine moves both readers of a round).  ``--readers`` picks
some of them; ``--baseline SRC`` (another checkout's ``src`` directory, its extension built) adds
each picked reader again, run from that code (``PYTHONPATH=SRC``), marked ``@base``: a
before/after comparison in the same interleaved rounds.  ``--uvloop`` adds each picked asyncconsumer
reader again on uvloop's event loop (anyio's ``use_uvloop``; uvicorn runs FastAPI apps on it when it
is installed), marked ``@uvloop``; its ratios are to ``batches@uvloop``.

Every reader gets the same settings: ``--max-records`` per batch (default 10,000) and the consumer's
``max_partition_fetch_bytes`` (``--max-partition-fetch-bytes``; default the consumer's own, 1 MiB,
as Java's).  ``arrow_batches()`` does its Python work per fetch and per batch, ``batches()`` per
record, so larger fetches and batches move the first and not the second: the throughput settings
of docs/performance.md are ``--max-partition-fetch-bytes 4194304 --max-records 20000``.  With
them a read's first fetches fault in more fresh memory before the buffer pool has buffers to hand
out again; ``--records-100b 5000000`` reads long enough for that to stop counting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, TypedDict

READERS = ["arrow", "batches", "batches+arrow", "aiokafka+arrow"]


class FetchOptions(TypedDict, total=False):
    """The fetch size a reader's consumer is given, when one is (asyncconsumer and aiokafka name it alike)."""

    max_partition_fetch_bytes: int


def log(message: str) -> None:
    print(f"[arrow-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the readers (one per subprocess)


def _read(
    reader: str,
    bootstrap: str,
    topic: str,
    partitions: int,
    count: int,
    loop: str = "asyncio",
    max_records: int = 10_000,
    partition_fetch_bytes: int | None = None,
) -> dict[str, Any]:
    import asyncio

    import anyio
    import pyarrow.compute  # noqa: F401  (imported up front by every reader: a one-off second, not reading)

    from asyncconsumer import Consumer, TopicPartition
    from asyncconsumer.spark.arrow import records_to_batch

    out: dict[str, Any] = {}
    fetch: FetchOptions = {} if partition_fetch_bytes is None else {"max_partition_fetch_bytes": partition_fetch_bytes}

    async def ours() -> None:
        consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **fetch)
        async with consumer:
            consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
            n = 0
            started, cpu = time.perf_counter(), time.process_time()
            if reader == "arrow":
                async for batch in consumer.arrow_batches(max_records=max_records):
                    n += batch.num_rows
                    if n >= count:
                        break
            else:
                async for records in consumer.batches(max_records=max_records):
                    if reader == "batches+arrow":
                        records_to_batch(records, True)
                    n += len(records)
                    if n >= count:
                        break
            out.update(records=n, seconds=time.perf_counter() - started, cpu=time.process_time() - cpu)
        out["loop"] = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"

    async def theirs() -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka import TopicPartition as AioTP

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, **fetch
        )
        await consumer.start()
        try:
            consumer.assign([AioTP(topic, p) for p in range(partitions)])
            n = 0
            started, cpu = time.perf_counter(), time.process_time()
            while n < count:
                got = await consumer.getmany(timeout_ms=30_000, max_records=max_records)
                for records in got.values():
                    records_to_batch(records, True)
                    n += len(records)
            out.update(records=n, seconds=time.perf_counter() - started, cpu=time.process_time() - cpu)
        finally:
            await consumer.stop()

    if reader == "aiokafka+arrow":
        asyncio.run(theirs())
        out["loop"] = "asyncio"
    else:
        anyio.run(ours, backend_options={"use_uvloop": loop == "uvloop"})
    return out


# ------------------------------------------------------------------ the driver


def _paired(rates: list[float], against: list[float]) -> str:
    """The median and range of ``rates[r] / against[r]``, round by round: each pair ran minutes
    apart at most, so a slow phase of the machine (a neighbour, the broker's garbage collector)
    that spans several rounds moves both sides of a pair, where it moves the medians apart."""
    ratios = sorted(a / b for a, b in zip(rates, against, strict=False))
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def _consumer_default(name: str) -> Any:
    """The consumer's default for setting ``name`` (``ConsumerConfig``'s field default)."""
    import dataclasses

    from asyncconsumer.config import ConsumerConfig

    return next(f.default for f in dataclasses.fields(ConsumerConfig) if f.name == name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small topics (development)")
    parser.add_argument("--broker", choices=["kafka", "tansu"], default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds read first and not counted (the broker's JIT and caches)"
    )
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated, of " + ", ".join(READERS))
    parser.add_argument("--baseline", metavar="SRC", help="also run each reader from this src directory")
    parser.add_argument("--uvloop", action="store_true", help="also run asyncconsumer's readers on uvloop")
    parser.add_argument("--records-100b", type=int, default=None, help="records of the 100 B data set (1,000,000)")
    parser.add_argument("--max-records", type=int, default=10_000, help="records per batch, every reader")
    parser.add_argument(
        "--max-partition-fetch-bytes", type=int, default=None, help="the consumers' setting (default theirs, 1 MiB)"
    )
    parser.add_argument("--read", nargs=5, metavar=("READER", "BOOTSTRAP", "TOPIC", "PARTITIONS", "COUNT"))
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="with --read: the event loop")
    args = parser.parse_args()
    if args.read:
        reader, bootstrap, topic, partitions, count = args.read
        got = _read(
            reader,
            bootstrap,
            topic,
            int(partitions),
            int(count),
            args.loop,
            args.max_records,
            args.max_partition_fetch_bytes,
        )
        print(json.dumps(got))
        return

    from . import brokers
    from . import datasets as ds

    sets = [
        ds.Dataset("100B", "arrow-100b", args.records_100b or (40_000 if args.quick else 1_000_000), 100),
        ds.Dataset("1KiB", "arrow-1kib", 8_000 if args.quick else 200_000, 1024),
    ]
    broker = brokers.start(args.broker, log)
    try:
        log(broker.description)
        ds.create_topics(broker.bootstrap, sets)
        for d in sets:
            log(f"producing {d.describe()}: {ds.produce(broker.bootstrap, d):.1f}s")
        picked = [r for r in args.readers.split(",") if r]
        unknown = sorted(set(picked) - set(READERS))
        if unknown:
            parser.error(f"unknown readers {unknown}; choose from {READERS}")
        readers = picked + ([f"{r}@base" for r in picked] if args.baseline else [])
        readers += [f"{r}@uvloop" for r in picked if r != "aiokafka+arrow"] if args.uvloop else []
        base_env = {**os.environ, "PYTHONPATH": args.baseline} if args.baseline else None
        results: dict[tuple[str, str], list[float]] = {}
        per_cpu: dict[tuple[str, str], list[float]] = {}

        def read(d: Any, reader: str) -> dict[str, Any]:
            """One read of data set ``d`` by ``reader`` (``name@base``, ``name@uvloop``) in a subprocess."""
            name, _, at = reader.partition("@")
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.arrow_read",
                "--read",
                name,
                broker.bootstrap,
                d.topic,
                str(d.partitions),
                str(d.records),
                "--loop",
                "uvloop" if at == "uvloop" else "asyncio",
                "--max-records",
                str(args.max_records),
            ]
            if args.max_partition_fetch_bytes is not None:
                cmd += ["--max-partition-fetch-bytes", str(args.max_partition_fetch_bytes)]
            env = base_env if at == "base" else None
            got: dict[str, Any] = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            )
            return got

        for w in range(args.warmup):
            for d in sets:
                for reader in readers:
                    got = read(d, reader)
                    rate = got["records"] / got["seconds"]
                    log(f"warm-up {w + 1} {d.name} {reader}: {rate:,.0f} records/s (not counted)")
        for r in range(args.rounds):
            order = readers[r % len(readers) :] + readers[: r % len(readers)]
            for d in sets:
                for reader in order:
                    got = read(d, reader)
                    rate = got["records"] / got["seconds"]
                    results.setdefault((d.name, reader), []).append(rate)
                    per_cpu.setdefault((d.name, reader), []).append(cpu_rate := got["records"] / got["cpu"])
                    log(f"round {r + 1} {d.name} {reader}: {rate:,.0f} records/s, {cpu_rate:,.0f} per CPU s")
        fetch_bytes = args.max_partition_fetch_bytes or _consumer_default("max_partition_fetch_bytes")
        print(
            f"\n{broker.description}; {args.rounds} interleaved rounds after {args.warmup} not counted, "
            "records/s (median, min-max); "
            f"max_records {args.max_records:,}, max_partition_fetch_bytes {fetch_bytes:,}\n"
        )
        print(
            "| data set | reader | records/s | spread | vs batches() | records per CPU s | vs batches() "
            "| paired, per CPU s |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for d in sets:
            for reader in readers:
                # uvloop's readers against batches() on uvloop; the others against batches() on asyncio
                against = "batches@uvloop" if reader.endswith("@uvloop") else "batches"
                base = statistics.median(results.get((d.name, against), [float("nan")]))
                base_cpu = statistics.median(per_cpu.get((d.name, against), [float("nan")]))
                rates = results[(d.name, reader)]
                med = statistics.median(rates)
                cpu = statistics.median(per_cpu[(d.name, reader)])
                paired = _paired(per_cpu[(d.name, reader)], per_cpu.get((d.name, against), []))
                print(
                    f"| {d.describe()} | {reader} | {med:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | "
                    f"{med / base:.2f}x | {cpu:,.0f} | {cpu / base_cpu:.2f}x | {paired} |"
                )
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
