"""What one fetch round trip costs the consumer: ``python -m benchmarks.fetch_cost``.

    python -m benchmarks.fetch_cost [REV ...] [--fetches 200,1000] [--partitions 4] [--profile N]

With its partitions caught up and ``fetch_max_wait_ms=0`` the consumer does nothing but fetch: the
broker answers each Fetch at once with no records, the background loop sends the next, and the
application's ``getmany()`` wakes for each response and finds nothing.  That is the fixed cost of a
round trip, paid by every fetch at any rate (at low rates it is most of the consumer's CPU time).

Starts Apache Kafka (``asyncconsumer.testing.KafkaBroker``, benchmarks/brokers.py), creates a topic
of ``--partitions`` partitions and produces a few records to each with confluent-kafka.  Then, for
each revision (a git revision, or ``WORKTREE`` for the working tree as it is, the default; exported
as benchmarks/instructions.py does), a reader process (this module with ``--reader``) assigns
every partition, reads the records (caught up), and polls ``getmany(timeout=...)`` until the
consumer has sent N more fetches:

- **instructions per fetch**: the reader runs under ``valgrind --tool=callgrind`` for two values of
  N (``--fetches``, default 200 and 1000); the difference in instructions over the difference in
  fetches, so start-up and the first read cancel out.  Counts, not time: the same whatever else
  this shared machine does, up to timing (how often ``getmany()`` times out, a few per cent).
- **calls per fetch**: the reader (no valgrind) runs ``--profile`` fetches (default 2000) with
  ``cProfile`` on after the catch-up: its calls (Python functions and builtins) over the fetches
  sent; ``--top K`` prints the K functions with the most own time.

Needs valgrind (``apt-get install valgrind``), Java 17+ and Kafka's jars, confluent-kafka.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
from pathlib import Path
from typing import Any

from . import datasets as ds
from . import processes as runner
from .instructions import WORKTREE, callgrind, on_kafka

#: Records produced to each partition (what the reader reads before it is caught up).
RECORDS_PER_PARTITION = 10
#: How long one ``getmany()`` of the reader waits for records that never come (seconds).
POLL_TIMEOUT = 0.2


# ------------------------------------------------------------------ the reader (a process of its own)


async def _read(args: argparse.Namespace) -> dict[str, Any]:
    from asyncconsumer import Consumer, TopicPartition

    consumer: Consumer[bytes, bytes] = Consumer(
        bootstrap_servers=args.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    async with consumer:
        consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
        got = 0
        while got < args.records:
            batch = await consumer.getmany(timeout=30)
            if not batch:
                return {"error": f"read {got} of {args.records} records"}
            got += sum(len(records) for records in batch.values())
        start = consumer.metrics().fetch.requests
        profiler = cProfile.Profile() if args.count_calls else None
        if profiler is not None:
            profiler.enable()
        sent = 0
        while sent < args.fetches:
            if await consumer.getmany(timeout=POLL_TIMEOUT):
                return {"error": "records after the catch-up"}
            sent = consumer.metrics().fetch.requests - start
        if profiler is not None:
            profiler.disable()
        result: dict[str, Any] = {"records": got, "fetches": sent}
        if profiler is not None:
            stats = pstats.Stats(profiler)
            result["calls"] = stats.total_calls  # type: ignore[attr-defined]
            if args.top:
                out = io.StringIO()
                stats.stream = out  # type: ignore[attr-defined]
                stats.sort_stats("tottime").print_stats(args.top)
                result["top"] = out.getvalue()
        return result


def reader(args: argparse.Namespace) -> int:
    import anyio

    try:
        result = anyio.run(_read, args)
    except Exception as exc:  # the driver reports it
        result = {"error": repr(exc)}
    print(json.dumps(result))
    return 0


# ------------------------------------------------------------------ the driver


def _command(bootstrap: str, topic: str, partitions: int, fetches: int, profile: bool = False,
             top: int = 0) -> list[str]:
    options: dict[str, object] = {"bootstrap": bootstrap, "topic": topic, "partitions": partitions,
                                  "records": partitions * RECORDS_PER_PARTITION, "fetches": fetches}
    if profile:
        options["top"] = top
    return runner.module_command("benchmarks.fetch_cost", "--reader", *(["--count-calls"] if profile else []),
                                 **options)


def _calls(command: list[str], src: Path | None) -> dict[str, Any]:
    env = runner.client_env({})
    if src is not None:
        env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}"
    result = runner.run_json(command, 600, env)
    if result.get("error"):
        raise RuntimeError(f"reader failed: {result['error']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fetch_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*", default=[WORKTREE],
                        help=f"git revisions, or {WORKTREE} for the working tree as it is (the default)")
    parser.add_argument("--fetches", default="200,1000", help="the two fetch counts under callgrind")
    parser.add_argument("--partitions", type=int, default=ds.PARTITIONS)
    parser.add_argument("--profile", type=int, default=2000, help="fetches profiled for calls (0: none)")
    parser.add_argument("--top", type=int, default=0, help="print the K functions with the most own time")
    parser.add_argument("--no-callgrind", action="store_true", help="calls per fetch only")
    parser.add_argument("--json", type=Path)
    # The reader's own options (``--reader``: this process is the reader).
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count-calls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reader:
        args.fetches = int(args.fetches)
        return reader(args)
    small, large = (int(n) for n in args.fetches.split(","))
    if not args.no_callgrind and shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    dataset = ds.Dataset("fetch cost", f"bench-fetch-cost-{args.partitions}p", args.partitions * RECORDS_PER_PARTITION,
                         100, partitions=args.partitions)
    rows: list[dict[str, Any]] = []
    with on_kafka(args.revisions, dataset, "asyncconsumer-fetch-cost-") as (exported, bootstrap):
        for rev, src in exported.items():
            row: dict[str, Any] = {"revision": rev}
            if not args.no_callgrind:
                ir_small, got_small = callgrind(_command(bootstrap, dataset.topic, args.partitions, small),
                                                src)
                ir_large, got_large = callgrind(_command(bootstrap, dataset.topic, args.partitions, large),
                                                src)
                fetches = got_large["fetches"] - got_small["fetches"]
                row.update(instructions=(ir_large - ir_small) / fetches, ir_small=ir_small, ir_large=ir_large,
                           fetches_small=got_small["fetches"], fetches_large=got_large["fetches"])
                runner.log(f"{rev}: {row['instructions']:,.0f} instructions a fetch")
            if args.profile:
                got = _calls(_command(bootstrap, dataset.topic, args.partitions, args.profile, True, args.top), src)
                row.update(calls=got["calls"] / got["fetches"], profiled_fetches=got["fetches"])
                runner.log(f"{rev}: {row['calls']:,.0f} calls a fetch")
                if got.get("top"):
                    print(got["top"])
            rows.append(row)
    print(f"one fetch round trip, {args.partitions} partitions caught up, fetch_max_wait_ms=0")
    print(f"{'revision':12s} {'instructions':>14s} {'calls':>8s}")
    for row in rows:
        ir = f"{row['instructions']:,.0f}" if "instructions" in row else "-"
        calls = f"{row['calls']:,.0f}" if "calls" in row else "-"
        print(f"{row['revision']:12s} {ir:>14s} {calls:>8s}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
