"""Summaries, ratios and the Markdown report of a benchmark run."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from . import java
from .clients import CLIENTS

#: (numerator, denominator): asyncconsumer against each peer.
RATIOS: list[tuple[str, str]] = [
    ("asyncconsumer-iter", "aiokafka-iter"),
    ("asyncconsumer-getmany", "aiokafka-getmany"),
    ("asyncconsumer-getmany", "confluent-tuned"),
    ("asyncconsumer-getmany", "confluent-default"),
    ("asyncconsumer-batches", "aiokafka-getmany"),
    ("asyncconsumer-batches", "confluent-tuned"),
    ("asyncconsumer-iter", "confluent-tuned"),
    ("asyncconsumer-getmany", java.CLIENT),
    ("asyncconsumer-batches", java.CLIENT),
    ("asyncconsumer-iter", java.CLIENT),
]

#: The Java consumer's own breakdown (benchmarks/java.py): field, column heading, format.
_JAVA_FIELDS = [
    ("jvm_start_s", "JVM start to consumer built, s", ".2f"),
    ("join_s", "group join, s", ".2f"),
    ("wall_s", "assigned to last record, s", ".2f"),
    ("records_per_s_with_join", "records/s with the join", "rate"),
    ("process_wall_s", "whole process, s", ".2f"),
    ("startup_cpu_s", "CPU s before the consumer", ".2f"),
    ("process_cpu_s", "CPU s, whole process", ".2f"),
]

_FIELDS = ("records_per_s", "mb_per_s", "cpu_s", "peak_rss_mb", "first_record_s")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """dataset -> client -> medians over the rounds (runs that failed or read short are left out)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        grouped[run["dataset"]][run["client"]].append(run)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for dataset, by_client in grouped.items():
        out[dataset] = {}
        for client, client_runs in by_client.items():
            good = [r for r in client_runs if r.get("ok")]
            row: dict[str, Any] = {"runs": len(client_runs), "ok_runs": len(good)}
            for field in _FIELDS:
                row[field] = _median([r[field] for r in good if r.get(field) is not None])
            rates = [r["records_per_s"] for r in good]
            row["records_per_s_min"] = min(rates) if rates else None
            row["records_per_s_max"] = max(rates) if rates else None
            row["errors"] = sorted({r["error"] for r in client_runs if r.get("error")})
            out[dataset][client] = row
    return out


def ratios(runs: list[dict[str, Any]], summary: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """asyncconsumer / peer records/s: of the medians, and the range of the per-round ratios."""
    by_round: dict[tuple[str, str, int], float] = {
        (r["dataset"], r["client"], r["round"]): r["records_per_s"] for r in runs if r.get("ok")
    }
    out = []
    for dataset, clients in summary.items():
        for num, den in RATIOS:
            a, b = clients.get(num), clients.get(den)
            if not a or not b or not a["records_per_s"] or not b["records_per_s"]:
                continue
            rounds = sorted({k[2] for k in by_round if k[0] == dataset})
            per_round = [
                by_round[(dataset, num, i)] / by_round[(dataset, den, i)]
                for i in rounds
                if (dataset, num, i) in by_round and (dataset, den, i) in by_round
            ]
            out.append(
                {
                    "dataset": dataset,
                    "client": num,
                    "peer": den,
                    "ratio": a["records_per_s"] / b["records_per_s"],
                    "per_round_min": min(per_round) if per_round else None,
                    "per_round_max": max(per_round) if per_round else None,
                }
            )
    return out


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f} M" if value >= 100_000 else f"{value / 1e3:.0f} k"


def _client_table(
    columns: list[str],
    clients: dict[str, dict[str, Any]],
    labels: dict[str, str],
    cells: Callable[[dict[str, Any]], list[str]],
) -> list[str]:
    """A table with a row per client; a client whose every run failed shows its first errors instead."""
    lines = ["| client | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for client, row in clients.items():
        label = labels.get(client, client)
        if row["ok_runs"] == 0:
            lines.append(f"| {label} | failed: {'; '.join(row['errors'])[:120]} " + "|" * len(columns))
        else:
            lines.append(f"| {label} | " + " | ".join(cells(row)) + " |")
    return lines


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _section(title: str, data: dict[str, Any] | None, body: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """A report section for one extra benchmark: nothing if it did not run, its error if it failed."""
    if not data:
        return []
    if data.get("error"):
        return [f"## {title}", "", f"failed: {data['error']}"]
    return [f"## {title}", "", *body(data)]


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    return [
        f"Backlog {memory['backlog']}; the application sleeps {memory['pause_ms']:.0f} ms per "
        f"{memory['batch']} records, so the fetch buffer stays full.",
        "",
        "| fetch_buffer_bytes | fetch_max_bytes | records read | RSS at start | peak RSS during the read | growth |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {memory['fetch_buffer_mb']:.0f} MiB | {memory['fetch_max_mb']:.0f} MiB | {memory['records']:,} | "
        f"{memory['baseline_rss_mb']:.0f} MB | {memory['peak_rss_mb']:.0f} MB | "
        f"**{memory['growth_mb']:.0f} MB** |",
        "",
        "Growth is bounded by fetch_buffer_bytes plus the response being read (a broker may exceed "
        "fetch_max_bytes by whole record batches) plus the records the application holds: "
        + (f"within {memory['bound_mb']:.0f} MiB + {memory['slack_mb']:.0f} MiB here."
           if memory.get("within_bound") else f"**past {memory['bound_mb']:.0f} MiB + {memory['slack_mb']:.0f} MiB "
           "here**." if "within_bound" in memory else ""),
        "",
    ]


def _share_lines(share: dict[str, Any]) -> list[str]:
    ours, theirs = share["ours"], share["java"]
    return [
        f"{share['records']:,} records of {share['size']} B on {share['partitions']} partitions; each client "
        "reads them in a share group of its own (one member), from subscribe() to the last record.",
        "",
        "| client | records/s | seconds | ratio to Java |",
        "|---|---:|---:|---:|",
        f"| {ours['client']} | {ours['records_per_s']:,} | {ours['seconds']} | "
        f"**{_fmt(share.get('ratio_ours_to_java'), '.2f')}** |",
        f"| {theirs['client']} | {theirs['records_per_s']:,} | {theirs['seconds']} | 1.00 |",
        "",
        "The machine is shared and noisy: one run, compare the ratio only.",
        "",
    ]


def _java_section(runs: list[dict[str, Any]], datasets: dict[str, Any]) -> list[str]:
    """Where the Java consumer's time went, per data set (medians over its good runs)."""
    by_set: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if run["client"] == java.CLIENT and run.get("ok"):
            by_set[run["dataset"]].append({**run["java"], "wall_s": run["wall_s"]})
    if not by_set:
        return []
    lines = [
        f"## {java.LABEL}: where its time went",
        "",
        "The row above counts from the partitions being assigned; ConsumerPerformance always joins a consumer "
        "group first (classic protocol), and the JVM starts before that.  CPU before the consumer: JVM start, "
        "class loading, building the consumer (sampled from /proc every 10 ms).",
        "",
        "| data set | " + " | ".join(heading for _, heading, _ in _JAVA_FIELDS) + " |",
        "|---|" + "---:|" * len(_JAVA_FIELDS),
    ]
    for name in datasets:
        rows = by_set.get(name)
        if not rows:
            continue
        cells = []
        for field, _, spec in _JAVA_FIELDS:
            value = _median([r[field] for r in rows if r.get(field) is not None])
            cells.append(_fmt_rate(value) if spec == "rate" else _fmt(value, spec))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# asyncconsumer benchmark ({'quick' if meta['quick'] else 'full'} run)",
        "",
        f"- date: {meta['date']}; machine: {meta['machine']}; Python {meta['python']}",
        f"- broker: {meta['broker']}; rounds: {meta['rounds']} (clients interleaved, order rotated per round)",
        f"- versions: {meta['versions']}",
        f"- asyncconsumer record decoder: **{meta['decoder']}**",
        "- records/s and MB/s (keys + values) over consumer creation to last record; CPU seconds of the "
        "whole read (all threads); peak RSS of the reader process; medians over the rounds",
    ]
    if meta.get("java"):
        lines.append(
            f"- {java.LABEL}: `{meta['java']['main_class']}` from the broker's jars, JVM options "
            f"`{meta['java']['jvm_options']}`; records/s and MB/s from its partitions being assigned to the last "
            "record (no group join, no JVM start); CPU s from the consumer built to the JVM's exit; peak RSS of "
            "the JVM; it reports no time to first record (see the Java section)"
        )
    lines.append("")
    labels = {name: spec[0] for name, spec in CLIENTS.items()} | {java.CLIENT: java.LABEL}
    datasets = {d["name"]: d for d in result["datasets"]}
    for name, clients in result["summary"].items():
        d = datasets.get(name)
        lines += [f"## {name}: {d['description'] if d else ''}", ""]
        lines += _client_table(
            ["records/s", "(min-max)", "MB/s", "CPU s", "peak RSS MB", "first record ms"],
            clients,
            labels,
            lambda row: [
                _fmt_rate(row["records_per_s"]),
                f"{_fmt_rate(row['records_per_s_min'])}-{_fmt_rate(row['records_per_s_max'])}",
                _fmt(row["mb_per_s"], ".0f"),
                _fmt(row["cpu_s"], ".2f"),
                _fmt(row["peak_rss_mb"], ".0f"),
                _fmt(None if row["first_record_s"] is None else row["first_record_s"] * 1000, ".0f"),
            ],
        )
        lines.append("")
    if result["ratios"]:
        lines += [
            "## asyncconsumer against its peers (records/s, same run)",
            "",
            "| data set | asyncconsumer | peer | ratio | per-round range |",
            "|---|---|---|---:|---:|",
        ]
        for r in result["ratios"]:
            spread = f"{r['per_round_min']:.2f}-{r['per_round_max']:.2f}" if r["per_round_min"] is not None else "-"
            lines.append(
                f"| {r['dataset']} | {labels.get(r['client'], r['client'])} | {labels.get(r['peer'], r['peer'])} | "
                f"**{r['ratio']:.2f}x** | {spread} |"
            )
        lines.append("")
    lines += _java_section(result["runs"], datasets)
    join = (result.get("group_join") or {}).get("summary")
    if join:
        from .clients import JOIN_SESSION_TIMEOUT_MS

        lines += [
            "## Group join: subscribe() with a new group to the first record",
            "",
            f"Every client with session.timeout.ms = {JOIN_SESSION_TIMEOUT_MS}. "
            + (
                "Tansu holds a JoinGroup for half of it, which then dominates."
                if meta.get("broker_name") == "tansu"
                else "The broker has group.initial.rebalance.delay.ms = 0 (KafkaBroker's setting; Kafka's default "
                "3 s would dominate), so this is the join itself."
            ),
            "",
        ]
        lines += _client_table(
            ["first record s", "CPU s", "peak RSS MB"],
            join,
            labels,
            lambda row: [
                _fmt(row["first_record_s"], ".2f"),
                _fmt(row["cpu_s"], ".2f"),
                _fmt(row["peak_rss_mb"], ".0f"),
            ],
        )
        lines.append("")
    lines += _section("Memory: slow consumer on a backlog", result.get("memory"), _memory_lines)
    lines += _section("Share consumer (KIP-932), implicit acknowledgement", result.get("share"), _share_lines)
    decoder = result.get("decoder")
    if decoder:
        from .decoder import markdown as decoder_markdown

        lines += ["## Record decoder alone (in process, no broker)", "", decoder_markdown(decoder), ""]
    notes = result.get("notes") or []
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
