"""The example pipeline (``python -m asyncconsumer.spark`` / ``run_pipeline``)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from asyncconsumer.spark import run_pipeline

pytestmark = pytest.mark.spark

BASE_MS = 1_700_000_040_000  # a minute boundary


def test_run_pipeline_aggregates_per_key_per_minute(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], tmp_path: Path
) -> None:
    topic = new_topic(3)
    records = []
    expected_events: Counter[tuple[int, str]] = Counter()
    expected_amount: defaultdict[tuple[int, str], float] = defaultdict(float)
    for i in range(3000):
        user = f"u{i % 5}"
        ts = BASE_MS + i * 100  # 5 minutes of events
        amount = (i % 10) / 2
        records.append((i % 3, user.encode(), json.dumps({"user": user, "amount": amount, "ts": ts}).encode()))
        minute = (ts // 60_000) * 60_000
        expected_events[(minute, user)] += 1
        expected_amount[(minute, user)] += amount
    records.append((0, b"oops", b"not json"))
    produce(topic, records, "gzip")

    lines: list[str] = []
    summary = run_pipeline(bootstrap, topic, str(tmp_path / "out"), progress=lines.append, spark=spark)

    assert summary["records"] == 3001 and summary["bad_records"] == 1 and summary["events"] == 3000
    assert summary["keys"] == 5 and summary["windows"] == 5
    assert summary["rows_written"] == len(expected_events) == 25
    assert summary["total_amount"] == pytest.approx(sum(expected_amount.values()))
    assert summary["per_partition"] == {0: 1001, 1: 1000, 2: 1000}
    assert any("wrote Parquet" in line for line in lines) and "pipeline done" in lines[-1]

    rows = spark.read.parquet(summary["output"]).collect()
    got_events = {}
    got_amount = {}
    for r in rows:
        minute = int(r["window_start"].replace(tzinfo=UTC).timestamp() * 1000)
        assert (r["window_end"] - r["window_start"]).total_seconds() == 60
        got_events[(minute, r["key"])] = r["events"]
        got_amount[(minute, r["key"])] = r["amount"]
    assert got_events == dict(expected_events)
    assert got_amount == pytest.approx(dict(expected_amount))
    assert datetime.fromisoformat(summary["first_window"]).replace(tzinfo=UTC).timestamp() * 1000 == BASE_MS
