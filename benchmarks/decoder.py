"""Record decoder speed: the compiled ``asyncconsumer._speedups`` against the pure-Python decoder.

In process, no broker: record batches shaped like the benchmark data sets are written with
``asyncconsumer.protocol.record_writer``, split once, then decoded repeatedly (best of N).
``python -m benchmarks.decoder`` prints a table.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from asyncconsumer.protocol import records as records_module
from asyncconsumer.protocol.compression import CODEC_LZ4, CODEC_NONE
from asyncconsumer.protocol.record_writer import Record, build_batch

from .datasets import sample_values

CASES: list[tuple[str, int, int, bool]] = [
    # name, value size, codec, headers
    ("100 B values", 100, CODEC_NONE, False),
    ("1 KiB values", 1024, CODEC_NONE, False),
    ("100 B values, lz4", 100, CODEC_LZ4, False),
    ("100 B values, 2 headers", 100, CODEC_NONE, True),
]


def _batches(value_size: int, codec: int, headers: bool, total: int, per_batch: int) -> list[Any]:
    values = sample_values(value_size, 256)
    hdrs = (("trace-id", b"0af7651916cd43dd"), ("content-type", b"application/json")) if headers else ()
    data = bytearray()
    for base in range(0, total, per_batch):
        recs = [Record(b"%010d" % i, values[i % len(values)], hdrs, i - base) for i in range(base, base + per_batch)]
        data += build_batch(recs, base_offset=base, compression=codec)
    # As the consumer sees them: views into a received frame (a bytearray).
    return list(records_module.iter_batches(memoryview(data), topic="bench", partition=0))


def _rate(decode: Callable[..., Any], batches: list[Any], repeat: int) -> float:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        count = 0
        for batch in batches:
            count += len(decode(batch, "bench", 0))
        best = min(best, time.perf_counter() - started)
    return count / best


def measure(quick: bool = False) -> dict[str, Any]:
    """Records/s of each decoder on each case; ``compiled`` is None when the extension is not built."""
    python = records_module.decode_batch_py
    compiled = records_module.decode_batch if records_module.DECODER == "c" else None
    total = 20_000 if quick else 200_000
    repeat = 3 if quick else 5
    rows = []
    for name, size, codec, headers in CASES:
        batches = _batches(size, codec, headers, total, 1000)
        py_rate = _rate(python, batches, repeat)
        c_rate = _rate(compiled, batches, repeat) if compiled is not None else None
        rows.append(
            {
                "case": name,
                "python_records_per_s": py_rate,
                "c_records_per_s": c_rate,
                "speedup": (c_rate / py_rate) if c_rate else None,
            }
        )
    return {"decoder_in_use": records_module.DECODER, "records_per_case": total, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| batch contents | pure Python | compiled (C) | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        c = row["c_records_per_s"]
        lines.append(
            f"| {row['case']} | {row['python_records_per_s'] / 1e6:.2f} M rec/s | "
            + (f"{c / 1e6:.2f} M rec/s | {row['speedup']:.1f}x |" if c else "not built | - |")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(markdown(measure(args.quick)))


if __name__ == "__main__":
    main()
