"""The results table of docs/kafkatest.md, from the JSON lines ``--kafkatest-results`` writes.

    python tests/kafkatest/report.py build/kafkatest-results.jsonl [more.jsonl ...] > table.md

One row per scenario and parameter set, one column per client.  A cell is ``pass`` or ``FAIL``
with the figures of that run: records consumed (share groups: unique records consumed),
rebalances (the largest number of assignments one member saw), and the seconds the scenario took
on its cluster (cluster start not counted).  The newest line of a test wins.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

CLIENTS = ("java", "asyncconsumer-asyncio", "asyncconsumer-trio")
#: Test module -> the heading of its table, in this order.
MODULES = {
    "test_consumer.py": "OffsetValidationTest (test_consumer.py)",
    "test_assignment.py": "AssignmentValidationTest (test_assignment.py)",
    "test_share_consumer.py": "ShareConsumerTest (test_share_consumer.py)",
}


def outcome(setup: Any, call: Any) -> str:
    """A scenario's outcome from pytest's setup and call reports (either may be None): the call's,
    else a failed or skipped setup's; a scenario whose call never reported (interrupted) is
    ``interrupted``, never ``passed``."""
    if call is not None:
        return str(call.outcome)
    if setup is not None and not setup.passed:
        return str(setup.outcome)
    return "interrupted"


def cell(row: dict[str, Any]) -> str:
    figures = row.get("figures", {})
    parts = ["pass" if row["outcome"] == "passed" else f"**{row['outcome'].upper()}**"]
    if "unique_consumed" in figures:
        parts.append(f"{figures['unique_consumed']:,} unique")
    elif "consumed" in figures:
        parts.append(f"{figures['consumed']:,} rec")
    if "rebalances" in figures:
        parts.append(f"{figures['rebalances']} reb")
    parts.append(f"{row['seconds']:.0f} s")
    return " · ".join(parts)


def variant(nodeid: str, client: str) -> str:
    """The test id's parameters without the client: ``classic-batching``."""
    match = re.search(r"\[(.*)\]$", nodeid)
    ids = match.group(1) if match else ""
    return ids.removeprefix(client).lstrip("-") or "(none)"


def table(rows: list[dict[str, Any]]) -> str:
    """One markdown table per test module, under a heading."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        latest[row["test"]] = row
    grids: dict[str, dict[tuple[str, str], dict[str, str]]] = {}
    for nodeid, row in latest.items():
        client = str(row["params"].get("client", ""))
        module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        key = (row["scenario"].removeprefix("test_"), variant(nodeid, client))
        grids.setdefault(module, {}).setdefault(key, {})[client] = cell(row)
    sections = []
    for module in sorted(grids, key=lambda m: list(MODULES).index(m) if m in MODULES else len(MODULES)):
        lines = [f"### {MODULES.get(module, module)}", "",
                 "| scenario | parameters | " + " | ".join(CLIENTS) + " |", "|---|---|" + "---|" * len(CLIENTS)]
        for (scenario, params), cells in sorted(grids[module].items()):
            lines.append(f"| {scenario} | {params} | " + " | ".join(cells.get(c, "not run") for c in CLIENTS) + " |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def main(paths: list[str]) -> None:
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
