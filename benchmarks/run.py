"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--broker kafka|tansu] [--json F] [--markdown F]``.

One command: starts the broker (Apache Kafka where Java 17+ is present, else the embedded Tansu;
``--broker`` chooses), creates the topics and produces the data sets once (with confluent-kafka),
then runs every client in a process of its own (Python readers, and on Apache Kafka the Java
consumer), interleaved, for several rounds (the order rotates each round), then the group-join and
memory benchmarks, the share-consumer row (Apache Kafka), the steady-state tables (benchmarks/steady.py:
long reads against the machine's ceiling, the warmed-up Java consumer and franz-go, 100 B and 1 KiB
values; Apache Kafka, not with ``--quick``), with ``--latency`` the latency tables
(benchmarks/latency.py, Apache Kafka) and the in-process decoder comparison.
Prints the Markdown report; ``--json``/``--markdown`` also write it to files.

The machine is shared and noisy: compare clients by the ratios from one run, not across runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from . import brokers
from . import datasets as ds
from . import java as java_client
from .clients import CLIENTS
from .processes import client_env, log, module_command, run_client, run_json
from .report import markdown, ratios, summarize

CLIENT_ORDER = [
    "asyncconsumer-iter",
    "asyncconsumer-getmany",
    "asyncconsumer-batches",
    "aiokafka-iter",
    "aiokafka-getmany",
    "confluent-default",
    "confluent-tuned",
    java_client.CLIENT,
    "asyncconsumer-getmany-py",
]
JOIN_CLIENTS = ["asyncconsumer-join", "aiokafka-join", "confluent-join"]


def available_clients(broker: str) -> tuple[list[str], list[str]]:
    """Clients this environment can run against ``broker`` ("kafka", "tansu"), and notes on the others."""
    notes = []
    out = []
    from asyncconsumer.protocol import records

    for name in CLIENT_ORDER + JOIN_CLIENTS:
        if name == java_client.CLIENT:
            if broker == "kafka":
                out.append(name)
            else:
                notes.append(f"{name} skipped: it runs from Apache Kafka's jars, against Apache Kafka only")
            continue
        module = CLIENTS[name][1]
        if importlib.util.find_spec(module) is None:
            notes.append(f"{name} skipped: {module} is not installed (pip install -e '.[bench]')")
            continue
        if name == "asyncconsumer-getmany-py" and records.DECODER != "c":
            notes.append("pure-Python decoder run skipped: the compiled decoder is not in use anyway")
            continue
        out.append(name)
    return out, notes


def run_memory(bootstrap: str, dataset: ds.Dataset, quick: bool, timeout: float) -> dict[str, Any]:
    buffer = 4 * 2**20 if quick else 32 * 2**20
    fetch_max = 2**20 if quick else 4 * 2**20
    to_read = dataset.records if quick else dataset.records // 4
    pause, batch = 0.005, 200
    command = module_command("benchmarks.memory", bootstrap=bootstrap, topic=dataset.topic,
                             partitions=dataset.partitions, count=to_read, buffer=buffer, fetch_max=fetch_max,
                             pause=pause, batch=batch)
    result = run_json(command, timeout, client_env({}))
    result.update(backlog=dataset.describe(), pause_ms=pause * 1000, batch=batch)
    if not result.get("error") and not result.get("within_bound"):
        result["error"] = (f"memory grew {result.get('growth_mb', 0):.1f} MiB, past fetch_buffer_bytes + "
                           f"fetch_max_bytes ({result.get('bound_mb', 0):.0f} MiB) + {result.get('slack_mb', 0):.0f}")
    return result


def run_share(bootstrap: str, quick: bool, timeout: float) -> dict[str, Any]:
    """benchmarks/share.py: ShareConsumer (implicit acknowledgement) and Java's
    ShareConsumerPerformance on one topic, each in a share group of its own."""
    records = 20_000 if quick else 200_000
    command = module_command("benchmarks.share", bootstrap=bootstrap, records=records, partitions=4, size=100)
    result = run_json(command, timeout, client_env({}))
    ours = result.get("ours") or {}
    if not result.get("error") and ours.get("records") != records:
        result["error"] = f"the share consumer read {ours.get('records')} of {records} records"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small data sets, one round (development, CI)")
    parser.add_argument("--broker", choices=brokers.BROKERS,
                        help="Apache Kafka (needs Java 17+) or the embedded Tansu; default: kafka if it can start")
    parser.add_argument("--rounds", type=int, help="rounds of every client on every data set (default 3; quick 1)")
    parser.add_argument("--json", type=Path, help="write the full result as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here")
    parser.add_argument("--clients", help="comma-separated subset of: " + ", ".join(CLIENT_ORDER + JOIN_CLIENTS))
    parser.add_argument("--datasets", help="comma-separated subset of the data set names")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory benchmark")
    parser.add_argument("--no-join", action="store_true", help="skip the group-join benchmark")
    parser.add_argument("--no-decoder", action="store_true", help="skip the in-process decoder comparison")
    parser.add_argument("--steady", default="100,1024", metavar="SIZES",
                        help="value sizes for the steady-state table (benchmarks/steady.py: every read API against "
                             "the ceiling and the warm JVM, Apache Kafka only, not with --quick); '' for none "
                             "(default: %(default)s)")
    parser.add_argument("--latency", action="store_true",
                        help="also the latency tables (benchmarks/latency.py with its defaults: every reader at "
                             "1,000 and 50,000 records/s, default and low-latency settings; Apache Kafka only, "
                             "about 10 minutes)")
    parser.add_argument("--no-share", action="store_true",
                        help="skip the share-consumer row (Apache Kafka only: ShareConsumer next to Java's)")
    args = parser.parse_args(argv)
    wanted = args.clients.split(",") if args.clients else None
    unknown = set(wanted or ()) - set(CLIENT_ORDER + JOIN_CLIENTS)
    if unknown:
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")

    from asyncconsumer.protocol import records

    rounds = args.rounds or (1 if args.quick else 3)
    timeout = 90.0 if args.quick else 600.0
    sets = ds.standard(args.quick)
    if args.datasets:
        sets = [d for d in sets if d.name in args.datasets.split(",")]
    memory_set = None if args.no_memory else ds.memory_dataset(args.quick)

    runs: list[dict[str, Any]] = []
    joins: list[dict[str, Any]] = []
    memory: dict[str, Any] | None = None
    share: dict[str, Any] | None = None
    steady_runs: list[dict[str, Any]] = []
    latency_run: dict[str, Any] | None = None
    produced: dict[str, float] = {}
    java_meta: dict[str, Any] | None = None
    started = time.perf_counter()
    from asyncconsumer.testing import KafkaBrokerError

    try:
        broker = brokers.start(args.broker, log)
    except KafkaBrokerError as exc:  # --broker kafka where it cannot start: say why, no traceback
        log(f"--broker kafka: {type(exc).__name__}: {exc}")
        return 2
    try:
        log(f"broker: {broker.description} at {broker.bootstrap} (pid {broker.pid}); decoder: {records.DECODER}")
        clients, notes = available_clients(broker.name)
        notes = broker.notes + notes
        if wanted is not None:
            clients = [c for c in clients if c in wanted]
        joiners = [c for c in clients if c in JOIN_CLIENTS] if not args.no_join else []
        clients = [c for c in clients if c not in JOIN_CLIENTS]
        if java_client.CLIENT in clients:
            java_meta = {"jvm_options": java_client.jvm_options(broker.handle), "main_class": java_client.MAIN_CLASS}
        all_sets = sets + ([memory_set] if memory_set else [])
        ds.create_topics(broker.bootstrap, all_sets)
        for d in all_sets:
            produced[d.name] = ds.produce(broker.bootstrap, d)
            log(f"produced {d.name}: {d.describe()} in {produced[d.name]:.1f}s")
        if broker.name == "kafka" and all_sets:
            brokers.warm_up_groups(broker.bootstrap, all_sets[0].topic)
        for round_no in range(rounds):
            shift = round_no % max(1, len(clients))
            order = clients[shift:] + clients[:shift]
            for d in sets:
                for client in order:
                    result = run_client(client, d, broker, timeout)
                    result["round"] = round_no
                    runs.append(result)
                    rate = result.get("records_per_s") or 0
                    status = "ok" if result["ok"] else f"FAILED: {result.get('error')}"
                    log(f"round {round_no + 1}/{rounds} {d.name:9s} {client:26s} {rate / 1e6:6.3f} M rec/s  {status}")
        for round_no in range(rounds if joiners and sets else 0):
            shift = round_no % len(joiners)
            for client in joiners[shift:] + joiners[:shift]:
                result = run_client(client, sets[0], broker, timeout, count=1)
                result["round"] = round_no
                joins.append(result)
                first = result.get("first_record_s") or 0
                status = "ok" if result["ok"] else f"FAILED: {result.get('error')}"
                log(f"round {round_no + 1}/{rounds} group join {client:22s} first record after {first:.2f}s  {status}")
        if memory_set is not None:
            memory = run_memory(broker.bootstrap, memory_set, args.quick, timeout)
            log(f"memory: {memory}")
        if broker.name == "kafka" and not args.no_share:
            share = run_share(broker.bootstrap, args.quick, timeout)
            log(f"share consumer: {share}")
        if broker.name == "kafka" and not args.quick and args.steady:
            from . import steady

            for size in (int(s) for s in args.steady.split(",")):
                text, numbers = steady.measure(broker, steady.dataset_for(size), rounds=2)
                steady_runs.append({**numbers, "markdown": text})
        if broker.name == "kafka" and args.latency:
            from . import latency

            text, numbers = latency.measure(broker, list(latency.READERS), [1000, 50_000], list(latency.SETTINGS),
                                            seconds=10.0, warm_up=3.0, rounds=1, broker_warm_up=15.0)
            latency_run = {**numbers, "markdown": text}
    finally:
        broker.stop()
    decoder = None
    if not args.no_decoder:
        from .decoder import measure

        decoder = measure(args.quick)
        log("decoder comparison done")

    summary = summarize(runs)
    versions = {"asyncconsumer": _version("asyncconsumer"), "anyio": _version("anyio")}
    for name in ("aiokafka", "confluent_kafka"):
        if importlib.util.find_spec(name) is not None:
            versions[name] = _version(name)
    result = {
        "meta": {
            "quick": args.quick,
            "rounds": rounds,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
            "python": platform.python_version(),
            "broker": broker.description,
            "broker_name": broker.name,
            "decoder": records.DECODER,
            "versions": versions,
            "java": java_meta,
            "seconds": time.perf_counter() - started,
            "produce_seconds": produced,
        },
        "datasets": [{**d.as_dict(), "description": d.describe()} for d in sets],
        "runs": runs,
        "summary": summary,
        "ratios": ratios(runs, summary),
        "group_join": {"runs": joins, "summary": summarize(joins).get(sets[0].name, {}) if joins else {}},
        "memory": memory,
        "share": share,
        "decoder": decoder,
        "notes": notes,
        "steady": steady_runs,
        "latency": latency_run,
    }
    text = "\n\n".join([markdown(result), *(steady["markdown"] for steady in steady_runs),
                         *([latency_run["markdown"]] if latency_run else [])])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)
    steady_reads = [r for steady in steady_runs for client_runs in steady["runs"].values() for r in client_runs]
    failed = [r for r in runs + joins + steady_reads if not r.get("ok")]
    latency_failed = bool(latency_run and latency_run["errors"])
    return 1 if failed or latency_failed or (memory and memory.get("error")) or (share and share.get("error")) else 0


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
