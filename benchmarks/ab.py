"""A/B of the read paths between two git revisions: ``python -m benchmarks.ab BEFORE AFTER``.

For a refactor that must not change speed (the house step), throughput alone is too noisy on a
shared machine, so each client reads each data set with the two versions back to back, the order
flipped every round, on one broker with the same data; the report gives the ratio after/before of
the median records/s and of the median CPU seconds, and the spread of the per-round paired ratios.

Each revision is exported with ``git archive`` and its ``src/`` put first on ``PYTHONPATH``; the
compiled record decoder of the working tree is copied in when that revision's C sources are the same
(``speedups/``, or ``src/asyncconsumer/_speedups.c`` before they were split), else the revision's
own sources are compiled (a C compiler and the Python headers are needed then). The
benchmark clients and data sets are the working tree's (``benchmarks.clients``, ``benchmarks.datasets``).

    python -m benchmarks.ab ed0b79e HEAD --rounds 8 --broker kafka --json ab.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import brokers
from benchmarks import datasets as ds
from benchmarks import processes as runner

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("asyncconsumer-iter", "asyncconsumer-getmany", "asyncconsumer-batches")
SETS = ("100B", "1KiB", "100B-lz4")


def c_sources(tree: Path) -> list[tuple[str, bytes]]:
    """The C extension's sources in ``tree``: the files of ``speedups/``, or the one file before the split."""
    files = sorted(tree.glob("speedups/*.[ch]")) + sorted(tree.glob("src/asyncconsumer/_speedups.c"))
    return [(str(f.relative_to(tree)), f.read_bytes()) for f in files]


def export(revision: str, into: Path) -> Path:
    """``revision``'s src tree under ``into``, with its compiled decoder: the working tree's if the
    sources are the same, else built from the revision's own."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    package = into / "src" / "asyncconsumer"
    ours = ROOT / "src" / "asyncconsumer"
    if c_sources(into) == c_sources(ROOT):
        for built in ours.glob("_speedups*.so"):
            shutil.copy2(built, package / built.name)
    else:
        build_extension(into, package, revision)
    return into / "src"


def build_extension(tree: Path, package: Path, revision: str) -> None:
    """Compile ``tree``'s C sources into ``package`` (setuptools, outside the revision's own build
    configuration, which an older or newer setuptools may not read)."""
    sources = [str(tree / name) for name, _ in c_sources(tree) if name.endswith(".c")]
    script = (
        "import sys; from setuptools import Extension, setup; "
        "setup(name='speedups', script_args=['-q', 'build_ext', '--inplace'], "
        "ext_modules=[Extension('_speedups', sys.argv[1:])])"
    )
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-ab-build-") as work:
        build = subprocess.run([sys.executable, "-c", script, *sources], cwd=work, capture_output=True, text=True)
        built = list(Path(work).glob("_speedups*.so"))
        if build.returncode != 0 or not built:
            sys.exit(f"benchmarks.ab: building {revision}'s compiled decoder failed:\n{build.stderr[-2000:]}")
        shutil.copy2(built[0], package / built[0].name)


def read_once(client: str, dataset: ds.Dataset, bootstrap: str, src: Path) -> dict[str, Any]:
    command = runner.module_command(
        "benchmarks.clients", client, bootstrap=bootstrap, topic=dataset.topic,
        partitions=dataset.partitions, count=dataset.records,
    )
    env = runner.client_env({})
    env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}"
    result = runner.run_json(command, 300, env)
    result["ok"] = not result.get("error") and result.get("records") == dataset.records
    return result


def _values(cell: list[dict[str, Any]], version: str, key: str) -> list[float]:
    return [float(r[key]) for r in cell if r["version"] == version and r.get(key)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--json", type=Path, help="write every run here")
    args = parser.parse_args(argv)
    clients = args.clients.split(",")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-ab-") as tmp:
        trees = {"before": export(args.before, Path(tmp, "before")), "after": export(args.after, Path(tmp, "after"))}
        broker = brokers.start(args.broker, runner.log)
        try:
            sets = [d for d in ds.standard(False) if d.name in args.sets.split(",")]
            ds.create_topics(broker.bootstrap, sets)
            for dataset in sets:
                ds.produce(broker.bootstrap, dataset)
            brokers.warm_up_groups(broker.bootstrap, sets[0].topic)
            for round_ in range(args.rounds):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for dataset in sets:
                    for client in clients:
                        for version in order:
                            result = read_once(client, dataset, broker.bootstrap, trees[version])
                            result.update(version=version, client=client, dataset=dataset.name, round=round_)
                            runs.append(result)
                            runner.log(f"round {round_ + 1}/{args.rounds} {dataset.name} {client} {version}: "
                                       f"{(result.get('records_per_s') or 0) / 1e6:.3f} M rec/s ok={result['ok']}")
        finally:
            broker.stop()
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    print(f"after/before ({args.after} / {args.before}), medians over {args.rounds} rounds")
    for dataset_name in args.sets.split(","):
        for client in clients:
            cell = [r for r in runs if r["dataset"] == dataset_name and r["client"] == client and r["ok"]]
            before, after = _values(cell, "before", "records_per_s"), _values(cell, "after", "records_per_s")
            if not before or not after:
                print(f"{dataset_name:9s} {client:24s} no successful pair")
                continue
            paired = [b / a for a, b in zip(before, after, strict=False)]
            cpu_b, cpu_a = _values(cell, "before", "cpu_s"), _values(cell, "after", "cpu_s")
            cpu = f" cpu {statistics.median(cpu_a) / statistics.median(cpu_b):.2f}" if cpu_b and cpu_a else ""
            print(f"{dataset_name:9s} {client:24s} rec/s {statistics.median(after) / statistics.median(before):.2f}"
                  f" (paired {min(paired):.2f}..{max(paired):.2f}){cpu}")


if __name__ == "__main__":
    main()
