"""Long reads against the warmed-up Java consumer and the machine's limit: ``python -m benchmarks.steady``.

    python -m benchmarks.steady [--records N] [--value-size B] [--rounds N] [--clients a,b] [--json F]

In the main benchmark every client is a fresh process reading at most 1,000,000 records, so the
Java row includes the JVM's warm-up.  This run reads one larger topic (default 5,000,000 x 100 B;
``--value-size 1024`` for 1 KiB values, default 1,000,000 records then; 10 B keys, 4 partitions,
produced once with confluent-kafka) on Apache Kafka, every reader in a fresh process, interleaved
for ``--rounds`` rounds (the order rotates each round):

- the **ceiling**: ``kcat`` (librdkafka's C consumer printing nothing, benchmarks/ceiling.py; the
  row says so when kcat is not installed) and ``asyncconsumer-fetch-only``, our own Fetch loop
  decoding nothing (benchmarks/clients.py); the faster of the two is the ceiling;
- ConsumerPerformance as in the main benchmark (from the partitions being assigned to the last
  record), and again with ``--show-detailed-stats --reporting-interval 500`` on the **warm topic**:
  the **warm JVM** rate is the median of that read's last three 500 ms intervals (median over the
  rounds);
- **franz-go** (Go, ``kgo`` defaults; benchmarks/franz.py builds benchmarks/go/franz, or the row
  says why not): its whole read (client creation to last record), and its **warm** rate, the
  median of the last three intervals of at least 500 ms of a second read, of the warm topic,
  counted as ConsumerPerformance counts them;
- confluent-kafka's ``consume()`` (librdkafka, ``fetch.queue.backoff.ms=10``), the Python peer;
- the **Python floor** of a row reader, ``asyncconsumer-decode-only``: the topic's first 32 MiB of
  record batches fetched once, then decoded and every record touched again and again, with no I/O
  and no consumer (the clock starts after the fetch);
- asyncconsumer ``async for``, ``getmany()``, ``batches()``, ``arrow_batches()`` (defaults) and
  ``getmany()`` on the pure-Python decoder (consumer creation to last record; CPython has no
  warm-up).

The warm topic holds ``WARM_FACTOR`` (4) times the table's records, produced once beside it: at
several million records a second the table's own read is over in one or two seconds, so its last
intervals would still hold the JVM's JIT compiling and both readers' start.  A warm read with fewer
than ``MIN_WARM_INTERVALS`` intervals says so under the table.

The table gives each reader's records/s over the whole read, as a fraction of the ceiling, of the
warm JVM and of franz-go's warm rate, CPU time per record (the process's, all threads: the JVM's
JIT and GC, librdkafka's threads, Go's runtime) and peak RSS; medians over the rounds.  ``--json`` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import brokers, ceiling, franz, java
from . import datasets as ds
from .clients import CLIENTS
from .processes import log, run_client

FETCH_ONLY = "asyncconsumer-fetch-only"
CEILINGS = (ceiling.CLIENT, FETCH_ONLY)
PYTHON_CLIENTS = (
    "asyncconsumer-iter", "asyncconsumer-getmany", "asyncconsumer-batches", "asyncconsumer-arrow",
    "asyncconsumer-getmany-py",
)
#: A row reader's Python work alone (decode and touch, no I/O): what no row API can beat.
FLOOR = "asyncconsumer-decode-only"
#: The Python peer: librdkafka through confluent-kafka, ``consume()`` with ``fetch.queue.backoff.ms=10``.
CONFLUENT = "confluent-tuned"
DEFAULT_CLIENTS = (*CEILINGS, java.CLIENT, franz.CLIENT, CONFLUENT, FLOOR, *PYTHON_CLIENTS)
INTERVAL_MS = 500
#: The warm JVM's rate: the median of this many last intervals of the detailed-stats run.
LAST_INTERVALS = 3
#: How many times the table's records the warm reads (the JVM's detailed-stats run, franz-go's
#: second read) read, from a topic of their own: long enough for their last intervals to be warm.
WARM_FACTOR = 4
#: A warm read with fewer intervals than this is noted under the table: its last
#: ``LAST_INTERVALS`` may still include its start.
MIN_WARM_INTERVALS = 2 * LAST_INTERVALS
WARM_JVM = "java-warm"


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


def warm_rate(intervals: list[float]) -> float:
    """The warm rate of one run's intervals (the JVM's detailed run, franz-go's read): the median of
    its last ``LAST_INTERVALS`` intervals."""
    return statistics.median(intervals[-LAST_INTERVALS:])


def franz_warm(runs: list[dict[str, Any]]) -> tuple[float, float] | None:
    """franz-go's warm rate from its warm reads (median over the rounds) and its best interval
    (median of the rounds' best)."""
    ok = [r["intervals"] for r in runs if r.get("ok") and r.get("intervals")]
    if not ok:
        return None
    return statistics.median(warm_rate(i) for i in ok), statistics.median(max(i) for i in ok)


def warm_dataset(dataset: ds.Dataset) -> ds.Dataset:
    """The warm reads' topic: ``dataset``'s records ``WARM_FACTOR`` times over, in a topic of its own."""
    records = dataset.records * WARM_FACTOR
    return ds.Dataset(f"{dataset.name} (warm reads)", f"{dataset.topic}-warm", records, dataset.value_size,
                      dataset.compression, dataset.partitions)


def short_warm_reads(name: str, intervals: list[list[float]]) -> str | None:
    """A note when a warm read had fewer than ``MIN_WARM_INTERVALS`` intervals, else None."""
    short = [len(i) for i in intervals if len(i) < MIN_WARM_INTERVALS]
    if not short:
        return None
    return (f"{name}'s warm reads had {min(short)} intervals of {INTERVAL_MS} ms at the fewest (fewer than "
            f"{MIN_WARM_INTERVALS}): its warm rate may include its start; use more --records")


def read(client: str, dataset: ds.Dataset, broker: brokers.Broker, timeout: float) -> dict[str, Any]:
    if client == ceiling.CLIENT:
        return ceiling.run(broker.bootstrap, dataset, timeout)
    return run_client(client, dataset, broker, timeout)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(dataset: ds.Dataset, broker: str, runs: dict[str, list[dict[str, Any]]],
          intervals: list[list[float]], notes: list[str], rounds: int,
          go_warm_runs: list[dict[str, Any]] | None = None) -> str:
    """The Markdown report of one run: ``intervals`` are the JVM's warm reads' (one list a round),
    ``go_warm_runs`` franz-go's warm reads."""
    labels = {java.CLIENT: java.LABEL, ceiling.CLIENT: ceiling.LABEL, franz.CLIENT: franz.LABEL} | {
        n: CLIENTS[n][0] for n in CLIENTS}
    rates = {c: _median(rs, "records_per_s") for c, rs in runs.items() if rs}
    references = {c: r for c in CEILINGS if (r := rates.get(c))}
    top = max(references, key=lambda c: references[c]) if references else None
    warm = statistics.median(warm_rate(i) for i in intervals) if intervals else None
    go = franz_warm(go_warm_runs or [])
    go_warm = go[0] if go else None
    lines = [
        f"## Steady state: {dataset.describe()} on {broker}",
        "",
        f"Medians of {rounds} rounds, every reader a fresh process.  Ceiling: "
        + (f"{labels[top]}, {references[top] / 1e6:.2f} M rec/s." if top else "none in this run.")
        + (f"  Warm JVM: the median of ConsumerPerformance's last {LAST_INTERVALS} {INTERVAL_MS} ms intervals "
           f"(a separate run of the tool reading {WARM_FACTOR}x the records, same settings), "
           f"{warm / 1e6:.2f} M rec/s." if warm else "")
        + (f"  franz-go warm: the median of the last {LAST_INTERVALS} intervals of {INTERVAL_MS} ms or more of a "
           f"second read of {WARM_FACTOR}x the records, {go_warm / 1e6:.2f} M rec/s." if go_warm else ""),
        "",
        "| client | records/s | / ceiling | / warm JVM | / franz-go warm | CPU ns/record | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, rate: float | None, cpu: float | None, rss: float | None) -> str:
        cells = [
            f"{rate / 1e6:.2f} M" if rate else "-",
            f"{rate / references[top]:.2f}" if rate and top else "-",
            f"{rate / warm:.2f}" if rate and warm else "-",
            f"{rate / go_warm:.2f}" if rate and go_warm else "-",
            f"{cpu / dataset.records * 1e9:.0f}" if cpu else "-",
            f"{rss:.0f} MB" if rss else "-",
        ]
        return f"| {label} | " + " | ".join(cells) + " |"

    for client, client_runs in runs.items():
        ok = [r for r in client_runs if r.get("ok")]
        if not ok:
            error = next((r.get("error") for r in client_runs if r.get("error")), "no run")
            lines.append(f"| {labels[client]} | {error} | | | | | |")
            continue
        rate, cpu, rss = (_median(ok, key) for key in ("records_per_s", "cpu_s", "peak_rss_mb"))
        lines.append(row(labels[client], rate, cpu, rss))
        if client == java.CLIENT and warm:
            best = statistics.median(max(i) for i in intervals)
            lines.append(row(f"Java, warm (last {LAST_INTERVALS} intervals; best {best / 1e6:.2f} M)", warm, None,
                             None))
        if client == franz.CLIENT and go:
            lines.append(row(f"franz-go, warm (last {LAST_INTERVALS} intervals; best {go[1] / 1e6:.2f} M)", go[0],
                             None, None))
    lines += ["", *(f"- {note}" for note in notes)] if notes else []
    return "\n".join(lines)


def dataset_for(value_size: int = 100, records: int | None = None) -> ds.Dataset:
    """The long topic: 5,000,000 records of ``value_size`` bytes (1 KiB and more: 1,000,000)."""
    records = records or (5_000_000 if value_size < 1024 else 1_000_000)
    return ds.Dataset(f"{value_size} B x {records:,}", f"bench-steady-{value_size}b-{records}", records, value_size)


def measure(broker: brokers.Broker, dataset: ds.Dataset, clients: list[str] | None = None,
            rounds: int = 2) -> tuple[str, dict[str, Any]]:
    """Produce ``dataset`` on ``broker`` (Apache Kafka) and run every reader for ``rounds`` rounds:
    the Markdown table and the numbers behind it (what ``--json`` writes)."""
    clients = list(clients or DEFAULT_CLIENTS)
    notes = []
    for name, missing in ((ceiling.CLIENT, ceiling.missing), (franz.CLIENT, franz.missing)):
        if name in clients and (why := missing()):
            log(why)
            notes.append(why)
            clients.remove(name)
    if franz.CLIENT in clients:
        notes.append(f"{franz.version()}, built from benchmarks/go/franz")
    notes.append(f"load average at the start: {os.getloadavg()[0]:.2f} (2 cores shared)")
    timeout = 900.0
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    intervals: list[list[float]] = []
    go_warm: list[dict[str, Any]] = []
    warm = warm_dataset(dataset) if java.CLIENT in clients or franz.CLIENT in clients else None
    for produced in (dataset, warm):
        if produced is not None:
            ds.create_topics(broker.bootstrap, [produced])
            log(f"produced {produced.describe()} in {ds.produce(broker.bootstrap, produced):.1f}s")
    brokers.warm_up_groups(broker.bootstrap, dataset.topic)
    for round_no in range(rounds):
        order = clients[round_no % len(clients):] + clients[:round_no % len(clients)]
        for client in order:
            result = read(client, dataset, broker, timeout)
            result["load"] = os.getloadavg()[0]
            runs[client].append(result)
            rate = (result.get("records_per_s") or 0) / 1e6
            log(f"round {round_no + 1} {client}: {rate:.2f} M rec/s, load {result['load']:.2f}"
                + (f" ERROR {result['error']}" if result.get("error") else ""))
        if java.CLIENT in clients and warm is not None:
            intervals.append(java_intervals(broker, warm, timeout))
            log(f"round {round_no + 1} Java warm read: {[round(r / 1e6, 2) for r in intervals[-1]]} M rec/s")
        if franz.CLIENT in clients and warm is not None:
            go_warm.append(run_client(franz.CLIENT, warm, broker, timeout))
            log(f"round {round_no + 1} franz-go warm read: "
                f"{[round(r / 1e6, 2) for r in go_warm[-1].get('intervals') or []]} M rec/s"
                + (f" ERROR {go_warm[-1]['error']}" if go_warm[-1].get("error") else ""))
    if warm is not None:
        notes.append(f"warm reads: {warm.describe()}")
    go_intervals = [r.get("intervals") or [] for r in go_warm if r.get("ok")]
    for name, lists in (("the JVM", intervals), ("franz-go", go_intervals)):
        if note := short_warm_reads(name, lists):
            notes.append(note)
    notes.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    numbers = {"dataset": dataset.as_dict(), "warm_dataset": warm.as_dict() if warm else None,
               "broker": broker.description, "runs": runs, "java_intervals": intervals, "franz_warm_runs": go_warm}
    return table(dataset, broker.description, runs, intervals, notes, rounds, go_warm), numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, help="records to produce and read (default 5,000,000; 1 KiB: 1,000,000)")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default=",".join(DEFAULT_CLIENTS),
                        help="comma-separated readers (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    clients = args.clients.split(",")
    unknown = [c for c in clients if c not in DEFAULT_CLIENTS and c not in CLIENTS]
    if unknown:
        parser.error(f"unknown clients {unknown}; known: {', '.join(DEFAULT_CLIENTS)}")
    dataset = dataset_for(args.value_size, args.records)
    broker = brokers.start("kafka", log)
    try:
        text, numbers = measure(broker, dataset, clients, args.rounds)
    finally:
        broker.stop()
    print(text)
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
