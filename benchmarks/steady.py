"""The Java consumer once its JIT has warmed up: ``python -m benchmarks.steady [--records N] [--rounds N]``.

In the main benchmark every client is a fresh process reading at most 1,000,000 records, so the
Java row includes the JVM's warm-up (its JIT compiles the fetch and decode paths during the read).
This run gives the other half of the picture on Apache Kafka: a larger topic (5,000,000 x 100 B by
default, produced with confluent-kafka), read by

- ConsumerPerformance as in the main benchmark (records/s from the partitions being assigned to the
  last record), and again with ``--show-detailed-stats --reporting-interval 500``, whose per-interval
  rates show the JIT-warm speed;
- asyncconsumer ``getmany()`` and ``batches()`` (start to last record; CPython has no warm-up).

Interleaved, ``--rounds`` times; prints a Markdown table (``--json`` keeps the numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import brokers, java
from . import datasets as ds
from .clients import CLIENTS
from .run import log, run_client

PYTHON_CLIENTS = ("asyncconsumer-getmany", "asyncconsumer-batches")
INTERVAL_MS = 500


def java_intervals(broker: brokers.Broker, dataset: ds.Dataset, timeout: float) -> list[float]:
    """ConsumerPerformance with per-interval stats: records/s of each interval (join time left out)."""
    group = f"bench-steady-{time.time_ns()}"
    extra = ("--show-detailed-stats", "--reporting-interval", str(INTERVAL_MS))
    command = java.command(broker.handle, dataset.topic, dataset.records, group, *extra)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    rows = java.parse_table(proc.stdout, "time")
    if proc.returncode != 0 or not rows:
        raise RuntimeError(f"ConsumerPerformance failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return [float(row["fetch.nMsg.sec"]) for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000_000, help="records of 100 B (default 5,000,000)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args(argv)

    dataset = ds.Dataset(f"100B x {args.records:,}", "bench-steady-100b", args.records, 100)
    timeout = 600.0
    rates: dict[str, list[float]] = {name: [] for name in (java.CLIENT, *PYTHON_CLIENTS)}
    intervals: list[list[float]] = []
    broker = brokers.start("kafka", log)
    try:
        ds.create_topics(broker.bootstrap, [dataset])
        log(f"produced {dataset.describe()} in {ds.produce(broker.bootstrap, dataset):.1f}s")
        brokers.warm_up_groups(broker.bootstrap, dataset.topic)
        for round_no in range(args.rounds):
            for client in rates:
                result = run_client(client, dataset, broker, timeout)
                if not result["ok"]:
                    raise RuntimeError(f"{client}: {result['error']}")
                rates[client].append(result["records_per_s"])
                log(f"round {round_no + 1} {client}: {result['records_per_s'] / 1e6:.2f} M rec/s")
            intervals.append(java_intervals(broker, dataset, timeout))
            log(f"round {round_no + 1} Java intervals: {[round(r / 1e6, 2) for r in intervals[-1]]} M rec/s")
    finally:
        broker.stop()

    labels = {java.CLIENT: java.LABEL} | {name: CLIENTS[name][0] for name in PYTHON_CLIENTS}
    lines = [
        f"## Steady state: {dataset.describe()} on {broker.description}",
        "",
        f"Medians of {args.rounds} rounds.  Intervals: ConsumerPerformance's {INTERVAL_MS} ms reports "
        "(a separate run of the tool, same settings).",
        "",
        "| client | records/s, whole read | Java: last interval | Java: best interval |",
        "|---|---:|---:|---:|",
    ]
    for client, values in rates.items():
        cells = [f"{statistics.median(values) / 1e6:.2f} M", "", ""]
        if client == java.CLIENT:
            cells[1] = f"{statistics.median(i[-1] for i in intervals) / 1e6:.2f} M"
            cells[2] = f"{statistics.median(max(i) for i in intervals) / 1e6:.2f} M"
        lines.append(f"| {labels[client]} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.json:
        numbers = {"dataset": dataset.as_dict(), "broker": broker.description, "records_per_s": rates,
                   "java_intervals": intervals}
        args.json.write_text(json.dumps(numbers, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
