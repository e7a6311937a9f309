"""Columnar decoding speed: record batches to Arrow, against rows and rows-then-Arrow.

In process, no broker, beside ``benchmarks.decoder`` (and with its batches: 10-byte keys, values
from the benchmark data sets, written with ``asyncconsumer.protocol.record_writer`` into a
bytearray as a fetch response would hold them).  Records/s, best of N, for:

- **rows**: ``decode_batch`` per batch, what ``batches()`` hands out today;
- **rows + Arrow**: the same rows, then ``spark.arrow.records_to_batch`` per Arrow batch, what the
  Spark source does today (skipped when pyspark is not installed);
- **columns + Arrow**: ``ColumnBuilder.append`` per batch, ``finish`` and ``to_arrow`` per Arrow
  batch (protocol/columnar.py), the route ``arrow_batches()`` is to take;
- **columns**: the same without ``to_arrow`` (the buffers only).

Then the same from the raw record set, split and CRC-checked as the consumer does it:
``CompletedFetch.take`` (rows) against ``ColumnReader.take`` + ``to_arrow``.

``python -m benchmarks.columnar [--quick]`` prints a table.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from asyncconsumer.managers.fetch_buffer import CompletedFetch
from asyncconsumer.protocol import columnar
from asyncconsumer.protocol import records as records_module
from asyncconsumer.protocol.compression import CODEC_LZ4, CODEC_NONE
from asyncconsumer.structs import TopicPartition

from .decoder import _batches

CASES: list[tuple[str, int, int, bool]] = [
    # name, value size, codec, headers
    ("100 B values", 100, CODEC_NONE, False),
    ("1 KiB values", 1024, CODEC_NONE, False),
    ("100 B values, lz4", 100, CODEC_LZ4, False),
    ("100 B values, 2 headers", 100, CODEC_NONE, True),
]
ARROW_BATCH = 10_000  # records per Arrow batch (and per take)
PER_BATCH = 1_000  # records per record batch


def _records_to_batch() -> Callable[..., Any] | None:
    try:
        from asyncconsumer.spark.arrow import records_to_batch
    except ImportError:
        return None
    return records_to_batch


def _best(run: Callable[[], int], repeat: int) -> float:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        count = run()
        best = min(best, time.perf_counter() - started)
    return count / best


def _chunks(batches: list[Any]) -> list[list[Any]]:
    step = ARROW_BATCH // PER_BATCH
    return [batches[i : i + step] for i in range(0, len(batches), step)]


def _rows(batches: list[Any]) -> Callable[[], int]:
    decode = records_module.decode_batch

    def run() -> int:
        return sum(len(decode(b, "bench", 0)) for b in batches)

    return run


def _rows_arrow(batches: list[Any], headers: bool, to_batch: Callable[..., Any]) -> Callable[[], int]:
    decode = records_module.decode_batch
    chunks = _chunks(batches)

    def run() -> int:
        n = 0
        for chunk in chunks:
            rows = [r for b in chunk for r in decode(b, "bench", 0)]
            n += to_batch(rows, include_headers=headers).num_rows
        return n

    return run


def _columns(batches: list[Any], headers: bool, arrow: bool, builder: Any) -> Callable[[], int]:
    chunks = _chunks(batches)
    finish, to_arrow = columnar.finish_columns, columnar.to_arrow
    allocate = columnar.default_allocator()

    def run() -> int:
        n = 0
        for chunk in chunks:
            b = builder("bench", 0, headers, columnar.MAX_OFFSET, allocate)
            for batch in chunk:
                b.append(batch, 0)
            columns = finish(b)
            n += to_arrow(columns, "bench", 0).num_rows if arrow else columns.count
        return n

    return run


def _record_set(batches: list[Any]) -> memoryview:
    data = bytearray()
    for b in batches:
        data += b.data
    return memoryview(data)


def _fetch_rows(data: memoryview) -> Callable[[], int]:
    def run() -> int:
        fetch = CompletedFetch(TopicPartition("bench", 0), 0, 0, data, -1, check_crcs=True, aborted=None)
        n, position = 0, 0
        while rows := fetch.take(ARROW_BATCH, position):
            n += len(rows)
            position = rows[-1].offset + 1
        return n

    return run


def _fetch_columns(data: memoryview, headers: bool) -> Callable[[], int]:
    def run() -> int:
        reader = columnar.ColumnReader(data, topic="bench", partition=0, include_headers=headers)
        n, position = 0, 0
        while (columns := reader.take(ARROW_BATCH, position)).count:
            n += columnar.to_arrow(columns, "bench", 0).num_rows
            position = columns.last_offset + 1  # type: ignore[operator]
        return n

    return run


def measure(quick: bool = False, python_columns: bool = False) -> dict[str, Any]:
    """Records/s of each route on each case (None where a route is unavailable)."""
    total = 20_000 if quick else 200_000
    repeat = 3 if quick else 5
    to_batch = _records_to_batch()
    rows_out = []
    for name, size, codec, headers in CASES:
        batches = _batches(size, codec, headers, total, PER_BATCH)
        data = _record_set(batches)
        row: dict[str, Any] = {"case": name}
        row["rows"] = _best(_rows(batches), repeat)
        row["rows_arrow"] = _best(_rows_arrow(batches, headers, to_batch), repeat) if to_batch else None
        row["columns_arrow"] = _best(_columns(batches, headers, True, columnar.ColumnBuilder), repeat)
        row["columns"] = _best(_columns(batches, headers, False, columnar.ColumnBuilder), repeat)
        row["python_columns_arrow"] = (
            _best(_columns(batches, headers, True, columnar.PyColumnBuilder), repeat) if python_columns else None
        )
        row["fetch_rows"] = _best(_fetch_rows(data), repeat)
        row["fetch_columns_arrow"] = _best(_fetch_columns(data, headers), repeat)
        rows_out.append(row)
    return {
        "row_decoder": records_module.DECODER,
        "column_decoder": columnar.COLUMN_DECODER,
        "records_per_case": total,
        "records_per_batch": PER_BATCH,
        "records_per_arrow_batch": ARROW_BATCH,
        "rows": rows_out,
    }


def _m(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1e6:.2f} M"


def _x(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.1f}x"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Row decoder: {result['row_decoder']}; column decoder: {result['column_decoder']}; "
        f"{result['records_per_case']:,} records per case in batches of {result['records_per_batch']:,}, "
        f"{result['records_per_arrow_batch']:,} per Arrow batch; records/s, best of N.",
        "",
        "| batch contents | rows | rows + Arrow | columns | columns + Arrow | vs rows | vs rows + Arrow |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['case']} | {_m(r['rows'])} | {_m(r['rows_arrow'])} | {_m(r['columns'])} | "
            f"{_m(r['columns_arrow'])} | {_x(r['columns_arrow'], r['rows'])} | "
            f"{_x(r['columns_arrow'], r['rows_arrow'])} |"
        )
    lines += [
        "",
        "From the record set (split, CRC-checked, walked as the consumer does):",
        "",
        "| batch contents | CompletedFetch.take (rows) | ColumnReader.take + to_arrow | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['case']} | {_m(r['fetch_rows'])} | {_m(r['fetch_columns_arrow'])} | "
            f"{_x(r['fetch_columns_arrow'], r['fetch_rows'])} |"
        )
    if any(r["python_columns_arrow"] for r in result["rows"]):
        lines += ["", "Pure-Python column builder + Arrow (the reference):", ""]
        lines += [f"- {r['case']}: {_m(r['python_columns_arrow'])} rec/s" for r in result["rows"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--python", action="store_true", help="also time the pure-Python column builder")
    args = parser.parse_args()
    print(markdown(measure(args.quick, args.python)))


if __name__ == "__main__":
    main()
