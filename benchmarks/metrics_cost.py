"""What metrics cost: ``batches()`` throughput with OpenTelemetry metrics on and off.

``python -m benchmarks.metrics_cost [--quick] [--broker kafka|tansu] [--rounds N]``

Starts a broker (as ``benchmarks.run``), produces one data set (100 B values, 4 partitions), then
reads the whole topic with ``batches()`` again and again in this process, alternating:

- **off**: no OpenTelemetry (as without ``opentelemetry-api`` installed and no ``meter_provider``);
  ``Consumer.metrics()``'s own counters, which cannot be turned off, count as always;
- **on**: ``meter_provider=`` an OpenTelemetry SDK ``MeterProvider`` with an in-memory reader,
  collected after every read (``messaging.client.consumed.messages`` per chunk, fetch and commit
  durations per request, the lag gauge), and ``Consumer.metrics()`` called once per 100 batches.

Rounds interleave (off, on, on, off, ...) so drift on the shared machine hits both alike; the
report is the median records/s of each and their ratio, by wall clock and by this process's CPU
time (records per CPU second: far less disturbed by other processes on a shared machine, and what
the metrics cost is made of).  The issue's bar: on costs under 3 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio

from asyncconsumer import Consumer, TopicPartition, otel

from . import brokers
from . import datasets as ds


def log(message: str) -> None:
    print(f"[metrics-cost {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def read_all(bootstrap: str, dataset: ds.Dataset, meter_provider: Any) -> tuple[float, float]:
    """Wall and CPU seconds (this process's) to read the whole data set with ``batches()`` from the
    beginning, start-up excluded."""
    options: dict[str, Any] = {"meter_provider": meter_provider} if meter_provider is not None else {}
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **options) as c:
        c.assign([TopicPartition(dataset.topic, p) for p in range(dataset.partitions)])
        got = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        batches = 0
        async for batch in c.batches():
            got += len(batch)
            batches += 1
            if meter_provider is not None and batches % 100 == 0:
                c.metrics()
            if got >= dataset.records:
                break
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert got == dataset.records, got
    return elapsed, cpu


def measure(bootstrap: str, dataset: ds.Dataset, rounds: int) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    real_telemetry_for = otel.telemetry_for
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_rates: dict[str, list[float]] = {"off": [], "on": []}
    order = ["off", "on", "on", "off"]
    for i in range(rounds * 2):
        variant = order[i % len(order)]
        if variant == "off":
            otel.telemetry_for = lambda *args: None
            provider = None
        else:
            otel.telemetry_for = real_telemetry_for
            reader = InMemoryMetricReader()
            provider = MeterProvider(metric_readers=[reader])
        try:
            seconds, cpu = anyio.run(read_all, bootstrap, dataset, provider)
        finally:
            otel.telemetry_for = real_telemetry_for
        if provider is not None:
            data = reader.get_metrics_data()
            assert data is not None and data.resource_metrics, "the SDK saw nothing"
            provider.shutdown()
        rate = dataset.records / seconds
        rates[variant].append(rate)
        cpu_rates[variant].append(dataset.records / cpu)
        log(f"round {i // 2 + 1} {variant}: {rate:,.0f} records/s, {dataset.records / cpu:,.0f} per CPU second")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    cpu_off, cpu_on = statistics.median(cpu_rates["off"]), statistics.median(cpu_rates["on"])
    return {"off": off, "on": on, "ratio": on / off, "cpu_off": cpu_off, "cpu_on": cpu_on,
            "cpu_ratio": cpu_on / cpu_off, "rates": rates, "cpu_rates": cpu_rates}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200k records, 3 rounds")
    parser.add_argument("--broker", choices=brokers.BROKERS, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each variant (default 10, quick 3)")
    args = parser.parse_args(argv)
    records = 200_000 if args.quick else 1_000_000
    rounds = args.rounds or (3 if args.quick else 10)
    dataset = ds.Dataset("metrics-100B", "bench-metrics-100b", records, 100)
    broker = brokers.start(args.broker, log)
    try:
        log(f"broker: {broker.description}")
        ds.create_topics(broker.bootstrap, [dataset])
        log(f"produced {dataset.describe()} in {ds.produce(broker.bootstrap, dataset):.1f}s")
        anyio.run(read_all, broker.bootstrap, dataset, None)  # warm-up: page cache, imports
        result = measure(broker.bootstrap, dataset, rounds)
    finally:
        broker.stop()
    print(f"| batches(), {dataset.describe()} | records/s (median of {rounds}) | records per CPU second |")
    print("| --- | --- | --- |")
    print(f"| metrics off (no OpenTelemetry) | {result['off']:,.0f} | {result['cpu_off']:,.0f} |")
    print(f"| metrics on (OpenTelemetry SDK MeterProvider) | {result['on']:,.0f} | {result['cpu_on']:,.0f} |")
    print(f"| on / off | {result['ratio']:.3f} | {result['cpu_ratio']:.3f} |")


if __name__ == "__main__":
    main()
