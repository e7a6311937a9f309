"""``python -m benchmarks.steady``: its report's arithmetic, kcat or Go missing, and small real runs.

Not a performance test: no threshold on speed.  The report is checked on made-up runs (the ceiling
is the faster reference, the warm JVM and franz-go's warm rate the median of the last three
intervals of their warm reads, which read a longer topic of their own); without kcat or Go the run
says so instead of failing; and a small run on Apache Kafka reads every record with the references
and the read APIs it adds (the Fetch loop, ``async for``, ``arrow_batches()``).  franz-go's reader,
built with Go (a minute of CPU the first time), reads in a ``long`` test.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.broker import backend_names_from_env, in_ci, kafka_or_skip
from support.paths import ROOT

from benchmarks import ceiling, franz, java, steady
from benchmarks import datasets as ds


def _run(client: str, rate: float, cpu: float = 1.0, ok: bool = True) -> dict[str, Any]:
    return {"client": client, "records_per_s": rate, "cpu_s": cpu, "peak_rss_mb": 50.0, "ok": ok,
            "error": None if ok else "boom"}


def test_report_ratios_use_the_faster_reference_and_the_last_three_intervals() -> None:
    dataset = ds.Dataset("t", "t", 1_000_000, 100)
    go_runs = [  # whole reads: their own intervals do not make the warm rate
        {**_run(franz.CLIENT, 1e6), "intervals": [90e6, 90e6, 90e6]},
        {**_run(franz.CLIENT, 0.8e6), "intervals": [90e6, 90e6, 90e6]},
    ]
    go_warm_runs = [  # warm reads: the median over the rounds of median(last three) = median(3, 1) = 2 M
        {**_run(franz.CLIENT, 1e6), "intervals": [0.5e6, 1e6, 2e6, 4e6, 3e6]},
        {**_run(franz.CLIENT, 0.8e6), "intervals": [6e6, 1e6, 1e6, 1e6]},
        {**_run(franz.CLIENT, 0, ok=False), "intervals": [50e6, 50e6, 50e6]},  # a failed run does not count
    ]
    runs = {
        ceiling.CLIENT: [_run(ceiling.CLIENT, 1e6), _run(ceiling.CLIENT, 3e6)],  # median 2 M
        steady.FETCH_ONLY: [_run(steady.FETCH_ONLY, 4e6)],  # the ceiling
        java.CLIENT: [_run(java.CLIENT, 1e6)],
        franz.CLIENT: go_runs,
        "asyncconsumer-batches": [_run("asyncconsumer-batches", 2e6, cpu=0.5)],
        "asyncconsumer-iter": [_run("asyncconsumer-iter", 0, ok=False)],
    }
    intervals = [[0.1e6, 9e6, 1e6, 2e6, 3e6], [5e6, 1e6, 1e6, 1e6]]  # warm: median(2, 1) = 1.5 M
    report = steady.table(dataset, "a broker", runs, intervals, ["a note"], 1, go_warm_runs)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert "4.00 M rec/s" in report and "1.50 M rec/s" in report and "franz-go warm" in report
    assert lines["asyncconsumer `batches()`"].split(" | ")[1:6] == ["2.00 M", "0.50", "1.33", "1.00", "500"]
    assert lines[ceiling.LABEL].split(" | ")[2:5] == ["0.50", "1.33", "1.00"]
    assert lines[franz.LABEL].split(" | ")[1:5] == ["0.90 M", "0.23", "0.60", "0.45"]  # whole reads: median 0.9 M
    assert "| asyncconsumer `async for` | boom |" in report
    warm = next(line for label, line in lines.items() if label.startswith("Java, warm"))
    assert "best 7.00 M" in warm and "| 1.50 M | 0.38 | 1.00 | 0.75 |" in warm  # best: median of each round's best
    go_warm = next(line for label, line in lines.items() if label.startswith("franz-go, warm"))
    assert "best 5.00 M" in go_warm and "| 2.00 M | 0.50 | 1.33 | 1.00 |" in go_warm
    assert "- a note" in report


def test_the_warm_reads_read_a_longer_topic_and_say_when_they_were_short() -> None:
    dataset = ds.Dataset("100 B", "bench-steady", 5_000_000, 100)
    warm = steady.warm_dataset(dataset)
    assert warm.topic != dataset.topic and warm.records == steady.WARM_FACTOR * dataset.records
    assert (warm.value_size, warm.partitions, warm.compression) == (100, dataset.partitions, "none")
    enough = [1e6] * steady.MIN_WARM_INTERVALS
    assert steady.short_warm_reads("the JVM", [enough, enough]) is None
    note = steady.short_warm_reads("the JVM", [enough, [1e6, 2e6, 3e6], [1e6] * 4])
    assert note is not None and "the JVM's warm reads had 3 intervals" in note


def test_without_go_the_franz_row_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(franz, "_built", {})
    assert "no Go toolchain" in (franz.missing() or "")
    result = franz.run("127.0.0.1:9", ds.Dataset("t", "t", 10, 100), 5)
    assert result["error"] == franz.missing() and not result.get("records")


def test_without_kcat_the_row_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "apt-get install kcat" in (ceiling.missing() or "")
    result = ceiling.run("127.0.0.1:9", ds.Dataset("t", "t", 10, 100), 5)
    assert result["error"] == ceiling.missing() and not result.get("records")


@pytest.mark.skipif("kafka" not in backend_names_from_env(), reason="benchmarks.steady runs on Apache Kafka only")
@pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None, reason="it produces with confluent-kafka")
def test_a_small_steady_run_reads_every_record(tmp_path: Path) -> None:
    kafka_or_skip()
    clients = [steady.FETCH_ONLY, steady.FLOOR, "asyncconsumer-iter", "asyncconsumer-arrow"]
    if ceiling.missing() is None:
        clients.append(ceiling.CLIENT)
    out = tmp_path / "steady.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.steady", "--records", "20000", "--rounds", "1", "--clients",
         ",".join(clients), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    numbers = json.loads(out.read_text())
    for client in clients:
        (run,) = numbers["runs"][client]
        assert run["ok"] and run["records"] == 20_000, run
        assert run["records_per_s"] > 0 and run["cpu_s"] > 0
    assert "| client | records/s | / ceiling | / warm JVM |" in proc.stdout
    assert (ceiling.LABEL in proc.stdout) == (ceiling.CLIENT in clients)


@pytest.mark.long
@pytest.mark.timeout(1200)
@pytest.mark.skipif("kafka" not in backend_names_from_env(), reason="benchmarks.steady runs on Apache Kafka only")
@pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None, reason="it produces with confluent-kafka")
def test_franz_go_reads_every_record_and_reports_its_intervals(tmp_path: Path) -> None:
    """franz-go's reader is built (Go and the module proxy) and reads like the others; a read of
    over a second gives intervals, whose last three make its warm row."""
    if (why := franz.missing()) is not None:
        if in_ci():
            raise AssertionError(why)
        pytest.skip(why)
    out = tmp_path / "steady.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.steady", "--records", "2000000", "--rounds", "1", "--clients",
         f"{franz.CLIENT},{steady.FETCH_ONLY}", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"][franz.CLIENT]
    assert run["ok"] and run["records"] == 2_000_000 and run["payload_bytes"] == 2_000_000 * 110, run
    assert run["records_per_s"] > 0 and run["cpu_s"] > 0 and run["peak_rss_mb"] > 0
    assert run["intervals"] and all(rate > 0 for rate in run["intervals"]), run
    assert run["warm_records_per_s"] == steady.warm_rate(run["intervals"])
    numbers = json.loads(out.read_text())
    (warm_run,) = numbers["franz_warm_runs"]  # the warm read: the longer topic, its own intervals
    assert warm_run["ok"] and warm_run["records"] == steady.WARM_FACTOR * 2_000_000, warm_run
    assert len(warm_run["intervals"]) > len(run["intervals"])
    assert "franz-go, warm (last 3 intervals" in proc.stdout
