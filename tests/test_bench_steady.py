"""``python -m benchmarks.steady``: its report's arithmetic, kcat missing, and a small real run.

Not a performance test: no threshold on speed.  The report is checked on made-up runs (the ceiling
is the faster reference, the warm JVM the median of the last three intervals); without kcat the
run says so instead of failing; and a small run on Apache Kafka reads every record with the
references and the read APIs it adds (the Fetch loop, ``async for``, ``arrow_batches()``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.broker import backend_names_from_env, in_ci

from benchmarks import ceiling, java, steady
from benchmarks import datasets as ds

ROOT = Path(__file__).resolve().parent.parent


def _run(client: str, rate: float, cpu: float = 1.0, ok: bool = True) -> dict[str, Any]:
    return {"client": client, "records_per_s": rate, "cpu_s": cpu, "peak_rss_mb": 50.0, "ok": ok,
            "error": None if ok else "boom"}


def test_report_ratios_use_the_faster_reference_and_the_last_three_intervals() -> None:
    dataset = ds.Dataset("t", "t", 1_000_000, 100)
    runs = {
        ceiling.CLIENT: [_run(ceiling.CLIENT, 1e6), _run(ceiling.CLIENT, 3e6)],  # median 2 M
        steady.FETCH_ONLY: [_run(steady.FETCH_ONLY, 4e6)],  # the ceiling
        java.CLIENT: [_run(java.CLIENT, 1e6)],
        "asyncconsumer-batches": [_run("asyncconsumer-batches", 2e6, cpu=0.5)],
        "asyncconsumer-iter": [_run("asyncconsumer-iter", 0, ok=False)],
    }
    intervals = [[0.1e6, 9e6, 1e6, 2e6, 3e6], [5e6, 1e6, 1e6, 1e6]]  # warm: median(2, 1) = 1.5 M
    report = steady.table(dataset, "a broker", runs, intervals, ["a note"], 1)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert "4.00 M rec/s" in report and "1.50 M rec/s" in report
    assert lines["asyncconsumer `batches()`"].split(" | ")[1:5] == ["2.00 M", "0.50", "1.33", "500"]
    assert lines[ceiling.LABEL].split(" | ")[2:4] == ["0.50", "1.33"]
    assert "| asyncconsumer `async for` | boom |" in report
    warm = next(line for label, line in lines.items() if label.startswith("Java, warm"))
    assert "best 7.00 M" in warm and "| 1.50 M | 0.38 | 1.00 |" in warm  # best: median of each round's best
    assert "- a note" in report


def test_without_kcat_the_row_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "apt-get install kcat" in (ceiling.missing() or "")
    result = ceiling.run("127.0.0.1:9", ds.Dataset("t", "t", 10, 100), 5)
    assert result["error"] == ceiling.missing() and not result.get("records")


@pytest.mark.skipif("kafka" not in backend_names_from_env(), reason="benchmarks.steady runs on Apache Kafka only")
@pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None, reason="it produces with confluent-kafka")
def test_a_small_steady_run_reads_every_record(tmp_path: Path) -> None:
    from asyncconsumer.testing.kafka import find_java, kafka_libs

    try:
        find_java()
        kafka_libs()
    except Exception as exc:
        if in_ci():
            raise
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
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
