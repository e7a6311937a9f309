"""``python -m benchmarks.latency``: its report's arithmetic and small real runs.

Not a performance test: no threshold on latency.  The report is checked on made-up latencies
(nearest-rank percentiles, each the median over the rounds, p99 against the best peer's, the
producer's row, the producer's p99 in each reader's own rounds, a failed reader named); on the
session's Apache Kafka, asyncconsumer's ``getmany()`` and confluent-kafka hand out every measured
record of a second at 1,000 a second; the whole command, every reader (the Java and Go ones built
first) in both settings, in a ``long`` test.
"""

from __future__ import annotations

import array
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.broker import backend_names_from_env, in_ci, kafka_or_skip
from support.paths import ROOT

from benchmarks import brokers, franz, latency

MS = 1_000_000

on_kafka = pytest.mark.skipif("kafka" not in backend_names_from_env(), reason="benchmarks.latency runs on Apache Kafka")
with_confluent = pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None,
                                    reason="it produces with confluent-kafka")


def _result(reader: str, values_ms: list[float], round_no: int = 0, error: str | None = None,
            setting: str = "defaults", acked_ms: float = 1.0) -> dict[str, Any]:
    return {"reader": reader, "rate": 1000, "setting": setting, "round": round_no, "error": error,
            "latencies": array.array("q", [int(v * MS) for v in values_ms]), "cpu_share": 0.25,
            "acked": array.array("q", [int(acked_ms * MS)] * 10), "producer_behind_s": 0.002}


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 1001))  # 1..1000
    assert latency.percentile(values, 50) == 500
    assert latency.percentile(values, 99) == 990
    assert latency.percentile(values, 99.9) == 999
    assert latency.percentile([7], 99.9) == 7
    assert latency.summarize([3, 1, 2])["max"] == 3


def test_report_takes_medians_over_rounds_and_the_best_peer() -> None:
    slow = [10.0] * 98 + [50.0, 60.0]  # p50 10, p99 50
    fast = [1.0] * 98 + [4.0, 5.0]  # p50 1, p99 4
    results = [
        # the producer's p99 in its rounds 2, 5 and 3 ms: the median beside it is 3
        _result("asyncconsumer-getmany", [2.0] * 98 + [6.0, 7.0], 0, acked_ms=2.0),  # p99 6
        _result("asyncconsumer-getmany", [3.0] * 98 + [8.0, 9.0], 1, acked_ms=5.0),  # p99 8
        _result("asyncconsumer-getmany", [4.0] * 98 + [30.0, 40.0], 2, acked_ms=3.0),  # p99 30: median 8
        _result("java-consumer", slow, 0),
        _result("confluent-kafka", fast, 0),
        _result("asyncconsumer-iter", [], 0, error="it broke"),
        _result("asyncconsumer-share", [5.0] * 98 + [12.0, 13.0], 0),  # p99 12
        _result("java-share", [5.0] * 98 + [16.0, 17.0], 0),  # p99 16
    ]
    meta = {"date": "d", "broker": "b", "machine": "m", "python": "3", "warm_up": 1.0, "seconds": 1.0,
            "rounds": 3, "load": (1.0, 2.0)}
    text, numbers = latency.report(results, meta)
    tables, _, side_by_side = text.partition("| reader, `defaults` |")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in tables.splitlines()
            if line.startswith("| ")}
    ours = rows[latency.READERS["asyncconsumer-getmany"]]
    assert ours[:2] == ["3.00", "8.00"] and ours[4] == "2.00"  # p99 8 against confluent-kafka's 4
    assert ours[6] == "3.00 |"  # the producer's p99 in getmany's own rounds, not over every run
    assert rows[latency.READERS["java-consumer"]][4] == "12.50"
    assert rows[latency.READERS["java-consumer"]][6] == "1.00 |"
    assert rows[latency.READERS["confluent-kafka"]][4] == "1.00"
    assert rows[latency.READERS["asyncconsumer-iter"]][0].startswith("it broke")
    assert rows["producer: produce() to acknowledged"][:2] == ["1.00", "1.00"]  # the median over every run
    # the share consumer against the best peer, and against Java's share consumer (12 / 16)
    assert rows[latency.READERS["asyncconsumer-share"]][4] == "3.00 (0.75x Java share)"
    assert rows[latency.READERS["java-share"]][4] == "4.00"
    assert numbers["defaults/1000"]["asyncconsumer-getmany"]["runs"] == 3
    assert "1,000 records/s, defaults" in text and "records/s, low" not in text
    summary = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in side_by_side.splitlines()
               if line.startswith("| ")}  # the same, every rate side by side (docs/performance.md's form)
    assert summary[latency.READERS["asyncconsumer-getmany"]] == ["3.00", "8.00", "9.00", "2.00", "3.00 |"]
    assert summary[latency.READERS["asyncconsumer-iter"]] == ["-", "-", "-", "-", "- |"]
    assert summary[latency.READERS["asyncconsumer-share"]][3] == "3.00 (0.75x Java share)"
    assert summary["producer: `produce()` to acknowledged"] == ["1.00", "1.00", "1.00", "", " |"]
    assert "| reader, `low` |" not in text


def _run(tmp_path: Path, *args: str, timeout: float) -> dict[str, Any]:
    out = tmp_path / "latency.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.latency", *args, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "## Latency: produce to hand-out" in proc.stdout
    numbers: dict[str, Any] = json.loads(out.read_text())
    return numbers


def _check(run: dict[str, Any], count: int) -> None:
    assert run["error"] is None, run
    summary = run["summary"]
    assert summary["count"] == count, run
    assert 0 < summary["p50"] <= summary["p99"] <= summary["p99.9"] <= summary["max"] < 120e9, run
    assert run["acked"]["count"] == count and run["produced_rate"] > 0, run


@with_confluent
@pytest.mark.parametrize(("reader", "partitions"),
                         [("asyncconsumer-getmany", 4), ("confluent-kafka", 4), ("asyncconsumer-getmany", 16)])
def test_a_reader_hands_out_every_measured_record(apache_kafka: Any, reader: str, partitions: int) -> None:
    """One reader, one second at 1,000 records/s on the session's broker: every measured record's
    latency comes back from the reader's process, none negative or absurd, with the producer's.
    With more partitions (``--partitions``) the records go to every one and the reader reads them all."""
    broker = brokers.Broker("kafka", apache_kafka.bootstrap, None, "the session's broker", apache_kafka.broker)
    run = latency.measure_one(reader, broker, 1000, False, 0.2, 1.0, None, partitions)
    assert run["error"] is None, run
    values = sorted(run["latencies"])
    assert len(values) == 1000 and 0 < values[0] and values[-1] < 120e9, values[:3] + values[-3:]
    assert len(run["acked"]) == 1000 and run["produced_rate"] > 0 and run["cpu_share"] is not None


@pytest.mark.long
@pytest.mark.timeout(1500)
@on_kafka
@with_confluent
def test_every_reader_in_both_settings(tmp_path: Path) -> None:
    kafka_or_skip()
    if (why := franz.missing()) is not None:
        if in_ci():
            raise AssertionError(why)
        pytest.skip(why)
    numbers = _run(tmp_path, "--rates", "1000", "--seconds", "1", "--warm-up", "0.5", "--broker-warm-up", "1",
                   timeout=1200)
    readers = {r["reader"] for r in numbers["runs"]}
    assert readers == set(latency.READERS), readers  # Java and franz-go built, or the run would name why
    assert len(numbers["runs"]) == 2 * len(latency.READERS)
    for run in numbers["runs"]:
        _check(run, 1000)
