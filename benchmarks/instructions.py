"""Instructions per record of a read, between git revisions: ``python -m benchmarks.instructions``.

    python -m benchmarks.instructions REV [REV...] [--clients asyncconsumer-getmany,...]
                                      [--value-size 100] [--records 1000000] [--base 100000]
                                      [--partitions 4] [--cpu N] [--json F]

Wall-clock A/Bs on this shared 2-core machine move by 10-30% from round to round; instruction
counts do not.  Each reader (benchmarks/clients.py) of each revision reads the same topic on one
Apache Kafka broker under ``valgrind --tool=callgrind`` twice, ``--base`` records and ``--records``
records, and the difference divided by the difference in records is its instructions per record:
start-up, imports, connecting and the first fetches cancel out.  The reader's process is the only
one counted (the broker runs outside valgrind), so the count is the same whatever else the
machine does, up to what depends on timing: how many records a fetch response carries and how
often the event loop wakes (a few percent; run twice to see it).

Valgrind runs the reader some 50 times slower, so what the consumer does by the clock (the stall
watch's look at every partition twice a second, the fetch round trips between two polls) falls on
fewer records than at full speed: with few partitions that is noise, with 1,000 it is part of the
count a record.  ``--cpu N`` also reads both counts ``N`` times without valgrind, interleaved, and
prints the median CPU time a record of the difference and the base read's CPU (noisier, but at
full speed).

The revisions are exported as benchmarks/ab.py does (``git archive``, the compiled decoder built
for each when its C sources differ from the working tree's); ``WORKTREE`` names the working tree
as it is, uncommitted changes included.  Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import ab, brokers
from . import datasets as ds
from . import processes as runner

ROOT = Path(__file__).resolve().parent.parent
WORKTREE = "WORKTREE"
CLIENTS = ("asyncconsumer-getmany", "asyncconsumer-iter")
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def callgrind(command: list[str], src: Path | None, timeout: float = 3600) -> tuple[int, dict[str, Any]]:
    """The instructions (callgrind's Ir) of ``command`` (a benchmark subprocess that prints one JSON
    object as its last stdout line), run under ``valgrind --tool=callgrind`` with ``src`` (an
    exported revision's, None: the working tree's) first on ``PYTHONPATH``; and that JSON object."""
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-callgrind-") as tmp:
        out = Path(tmp, "callgrind.out")
        full = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no", *command]
        proc = subprocess.run(full, capture_output=True, text=True, cwd=ROOT, env=_env(src), timeout=timeout,
                              check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}
        if result.get("error"):
            raise RuntimeError(f"{command[2:4]}: {result['error']}")
        match = _TOTAL.search(out.read_text(errors="replace")) if out.exists() else None
        if match is None:
            raise RuntimeError(f"no instruction total in callgrind's output: {proc.stderr[-500:]}")
        return int(match.group(1)), result


#: Readers that stop only at the end of a fetch response or a batch (the Fetch loop that decodes
#: nothing, `arrow_batches()`).
WHOLE_RESPONSES = frozenset({"asyncconsumer-fetch-only", "asyncconsumer-arrow"})


def _env(src: Path | None) -> dict[str, str]:
    """A reader's environment, with ``src`` (None: the working tree's) first on ``PYTHONPATH``."""
    env = runner.client_env({})
    if src is not None:
        env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}"
    return env


def _read(client: str, dataset: ds.Dataset, count: int, bootstrap: str) -> list[str]:
    """The command of one read of ``count`` records of ``dataset`` by ``client``."""
    return runner.module_command("benchmarks.clients", client, bootstrap=bootstrap, topic=dataset.topic,
                                 partitions=dataset.partitions, count=count)


def instructions(client: str, dataset: ds.Dataset, count: int, bootstrap: str, src: Path | None) -> int:
    """The instructions (callgrind's Ir) of one read of ``count`` records by ``client``."""
    total, result = callgrind(_read(client, dataset, count, bootstrap), src)
    if result.get("records") != count:
        raise RuntimeError(f"{client} read {result.get('records')} of {count}")
    return total


def cpu_seconds(client: str, dataset: ds.Dataset, count: int, bootstrap: str, src: Path | None) -> tuple[float, int]:
    """The CPU seconds (user and system) of one read of ``count`` records by ``client`` at full
    speed, and the records it read (a poll may take a few more than asked)."""
    result = runner.run_json(_read(client, dataset, count, bootstrap), 600, _env(src))
    records = int(result.get("records") or 0)
    if result.get("error") or records < count:
        raise RuntimeError(f"{client} read {records} of {count}: {result.get('error')}")
    return float(result["cpu_s"]), records


def trees(revisions: list[str], into: Path) -> dict[str, Path | None]:
    """Each revision's exported ``src`` (benchmarks/ab.py), None for ``WORKTREE`` (the tree as it is)."""
    return {rev: None if rev == WORKTREE else ab.export(rev, into / f"rev{i}") for i, rev in enumerate(revisions)}


@contextlib.contextmanager
def on_kafka(revisions: list[str], dataset: ds.Dataset, prefix: str) -> Iterator[tuple[dict[str, Path | None], str]]:
    """``revisions`` exported (:func:`trees`) and one Apache Kafka broker holding ``dataset``:
    ``(exported, bootstrap)``; the broker stops and the trees go afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        exported = trees(revisions, Path(tmp))
        broker = brokers.start("kafka", runner.log)
        try:
            ds.create_topics(broker.bootstrap, [dataset])
            ds.produce(broker.bootstrap, dataset)
            yield exported, broker.bootstrap
        finally:
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help=f"git revisions, or {WORKTREE} for the working tree as it is")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--base", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=ds.PARTITIONS,
                        help=f"the topic's partitions, all read (default {ds.PARTITIONS})")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every measurement (default 1)")
    parser.add_argument("--cpu", type=int, default=0, metavar="N",
                        help="also N interleaved reads without valgrind: CPU time a record (default 0: none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    clients = args.clients.split(",")
    whole = [client for client in clients if client in WHOLE_RESPONSES]
    if whole:
        parser.error(f"{', '.join(whole)} read whole fetch responses, not a count of records: "
                     "instructions per record need reads that stop at the count")
    dataset = ds.Dataset(f"{args.value_size} B x {args.records:,}",
                         f"bench-instr-{args.value_size}b-{args.records}-{args.partitions}p",
                         args.records, args.value_size, partitions=args.partitions)
    rows: list[dict[str, Any]] = []
    with on_kafka(args.revisions, dataset, "asyncconsumer-instr-") as (exported, bootstrap):
        for round_no in range(args.rounds):
            for client in clients:
                for rev, src in exported.items():
                    small = instructions(client, dataset, args.base, bootstrap, src)
                    large = instructions(client, dataset, args.records, bootstrap, src)
                    per = (large - small) / (args.records - args.base)
                    rows.append({"revision": rev, "client": client, "round": round_no, "base": small,
                                 "whole": large, "per_record": per})
                    runner.log(f"{client} {rev}: {per:,.1f} instructions a record ({small:,} / {large:,})")
        cpu: dict[tuple[str, str], list[float]] = {}
        cpu_base: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.cpu):
            for client in clients:
                for rev, src in exported.items():
                    base_s, base_n = cpu_seconds(client, dataset, args.base, bootstrap, src)
                    whole_s, whole_n = cpu_seconds(client, dataset, args.records, bootstrap, src)
                    cpu.setdefault((client, rev), []).append((whole_s - base_s) / (whole_n - base_n) * 1e6)
                    cpu_base.setdefault((client, rev), []).append(base_s)
    print(f"instructions a record, {dataset.describe()} (reads of {args.records:,} less reads of {args.base:,})")
    first = args.revisions[0]
    for client in clients:
        base = [r["per_record"] for r in rows if r["client"] == client and r["revision"] == first]
        for rev in args.revisions:
            per = [r["per_record"] for r in rows if r["client"] == client and r["revision"] == rev]
            ratio = f"  {sum(per) / len(per) / (sum(base) / len(base)):.3f}x {first}" if rev != first else ""
            print(f"{client:24s} {rev:12s} " + ", ".join(f"{p:,.1f}" for p in per) + ratio)
    if cpu:
        print(f"CPU time a record (us) of the difference, medians of {args.cpu} reads without valgrind;"
              f" the whole read of {args.base:,} (s)")
        for (client, rev), values in cpu.items():
            base = cpu_base[client, rev]
            print(f"{client:24s} {rev:12s} {statistics.median(values):.3f}  ("
                  + ", ".join(f"{v:.3f}" for v in sorted(values)) + f");  {statistics.median(base):.3f} s")
            rows.append({"revision": rev, "client": client, "cpu_us_per_record": values, "cpu_base_s": base})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
