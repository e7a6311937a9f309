"""``benchmarks.memory``'s bound: a slow consumer's growth past ``fetch_buffer_bytes`` plus one
response (and a little slack) fails the run's memory row, and the report says which it was."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import datasets as ds
from benchmarks import memory, report, run


def _measured(growth_mb: float) -> dict[str, Any]:
    bound = 36.0
    return {"records": 10, "expected": 10, "baseline_rss_mb": 30.0, "peak_rss_mb": 30.0 + growth_mb,
            "growth_mb": growth_mb, "fetch_buffer_mb": 32.0, "fetch_max_mb": 4.0, "bound_mb": bound,
            "slack_mb": memory.SLACK_MB, "within_bound": growth_mb <= bound + memory.SLACK_MB}


@pytest.mark.parametrize(("growth", "ok"), [(20.0, True), (36.0 + memory.SLACK_MB, True), (41.0, False)])
def test_growth_past_the_bound_fails_the_memory_row(monkeypatch: pytest.MonkeyPatch, growth: float,
                                                    ok: bool) -> None:
    monkeypatch.setattr(run, "run_json", lambda *args, **kwargs: _measured(growth))
    result = run.run_memory("127.0.0.1:9", ds.Dataset("m", "m", 40, 1024), quick=True, timeout=5)
    assert (result.get("error") is None) == ok, result
    text = "\n".join(report._memory_lines(result))
    assert ("within 36 MiB + 4 MiB here" in text) == ok
    assert ("**past 36 MiB + 4 MiB here**" in text) == (not ok)
