"""What one fetch round trip costs the consumer: ``python -m benchmarks.fetch_cost``.

    python -m benchmarks.fetch_cost [REV ...] [--fetches 200,1000] [--partitions 4] [--profile N] [--carry]

With its partitions caught up and ``fetch_max_wait_ms=0`` the consumer does nothing but fetch: the
broker answers each Fetch at once with no records, the background loop sends the next, and the
application's ``getmany()`` wakes for each response and finds nothing.  That is the fixed cost of a
round trip, paid by every fetch at any rate (at low rates it is most of the consumer's CPU time).

``--carry``: each round trip carries one record, as at 1,000 records/s, where nearly every fetch
brings one or two.  The first partition holds a backlog of records each in a batch of its own and
the others none; with ``max_partition_fetch_bytes=1`` the broker answers each Fetch with one whole
batch (a response's first batch comes whatever the limits, KIP-74), and ``getmany()`` hands out
that one record.  The round trip then also files a partition's records, decodes a batch and hands
a record out.

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
#: ``--carry``: the first partition's backlog, each record a batch of its own (more than any
#: reader fetches: callgrind's larger count, or ``--profile``'s, plus the catch-up).
CARRIED_RECORDS = 3000


# ------------------------------------------------------------------ the reader (a process of its own)


async def _read(args: argparse.Namespace) -> dict[str, Any]:
    from asyncconsumer import Consumer, TopicPartition

    carry = args.carry
    consumer: Consumer[bytes, bytes] = Consumer(
        bootstrap_servers=args.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0,
        max_partition_fetch_bytes=1 if carry else 1_048_576)
    async with consumer:
        consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
        got = 0
        while got < args.records:  # --carry: the first few of the backlog
            batch = await consumer.getmany(timeout=30)
            if not batch:
                return {"error": f"read {got} of {args.records} records"}
            got += sum(len(records) for records in batch.values())
        start = consumer.metrics().fetch.requests
        profiler = cProfile.Profile() if args.count_calls else None
        if profiler is not None:
            profiler.enable()
        sent = carried = 0
        while sent < args.fetches:
            batch = await consumer.getmany(timeout=POLL_TIMEOUT)
            if batch and not carry:
                return {"error": "records after the catch-up"}
            for records in batch.values():
                for record in records:  # touched, as an application would
                    carried += len(record.value or b"")
                    got += 1
            # ``metrics()`` costs about what a round trip does: asked after every poll only when
            # a poll spans many fetches (caught up); with --carry the records count the fetches.
            sent = got - args.records if carry else consumer.metrics().fetch.requests - start
        if profiler is not None:
            profiler.disable()
        sent = consumer.metrics().fetch.requests - start
        if carry and not sent * 0.9 <= got - args.records <= sent * 1.1:
            return {"error": f"{got - args.records} records in {sent} fetches: not one a fetch"}
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
             top: int = 0, carry: bool = False) -> list[str]:
    records = RECORDS_PER_PARTITION if carry else partitions * RECORDS_PER_PARTITION
    options: dict[str, object] = {"bootstrap": bootstrap, "topic": topic, "partitions": partitions,
                                  "records": records, "fetches": fetches}
    if profile:
        options["top"] = top
    flags = [*(["--count-calls"] if profile else []), *(["--carry"] if carry else [])]
    return runner.module_command("benchmarks.fetch_cost", "--reader", *flags, **options)


def _produce_carried(bootstrap: str, topic: str) -> None:
    """``--carry``'s backlog: :data:`CARRIED_RECORDS` records of 100 B to partition 0, each in a
    batch of its own (confluent-kafka, one record a batch)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "batch.num.messages": 1, "log_level": 3})
    values = ds.sample_values(100)
    for i in range(CARRIED_RECORDS):
        producer.produce(topic, key=b"%010d" % i, value=values[i % len(values)], partition=0)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("--carry: the backlog was not all delivered")


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
    parser.add_argument("--carry", action="store_true",
                        help="each round trip carries one record (the first partition's backlog, a batch a record)")
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
    if args.carry and max(large, args.profile) + RECORDS_PER_PARTITION > CARRIED_RECORDS * 0.9:
        parser.error(f"--carry reads at most {int(CARRIED_RECORDS * 0.9) - RECORDS_PER_PARTITION} fetches")
    dataset = ds.Dataset("fetch cost", f"bench-fetch-cost-{args.partitions}p", args.partitions * RECORDS_PER_PARTITION,
                         100, partitions=args.partitions)
    rows: list[dict[str, Any]] = []
    with on_kafka(args.revisions, dataset, "asyncconsumer-fetch-cost-") as (exported, bootstrap):
        topic = dataset.topic
        if args.carry:
            topic = f"bench-fetch-carry-{args.partitions}p"
            ds.create_topics(bootstrap, [ds.Dataset("carried", topic, CARRIED_RECORDS, 100,
                                                    partitions=args.partitions)])
            _produce_carried(bootstrap, topic)
        for rev, src in exported.items():
            row: dict[str, Any] = {"revision": rev}
            if not args.no_callgrind:
                ir_small, got_small = callgrind(
                    _command(bootstrap, topic, args.partitions, small, carry=args.carry), src)
                ir_large, got_large = callgrind(
                    _command(bootstrap, topic, args.partitions, large, carry=args.carry), src)
                fetches = got_large["fetches"] - got_small["fetches"]
                row.update(instructions=(ir_large - ir_small) / fetches, ir_small=ir_small, ir_large=ir_large,
                           fetches_small=got_small["fetches"], fetches_large=got_large["fetches"])
                runner.log(f"{rev}: {row['instructions']:,.0f} instructions a fetch")
            if args.profile:
                got = _calls(_command(bootstrap, topic, args.partitions, args.profile, True, args.top, args.carry),
                             src)
                row.update(calls=got["calls"] / got["fetches"], profiled_fetches=got["fetches"])
                runner.log(f"{rev}: {row['calls']:,.0f} calls a fetch")
                if got.get("top"):
                    print(got["top"])
            rows.append(row)
    carried = ", each carrying one record of 100 B" if args.carry else ", partitions caught up"
    print(f"one fetch round trip, {args.partitions} partitions{carried}, fetch_max_wait_ms=0")
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
