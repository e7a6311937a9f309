"""The memory benchmark: a slow consumer on a large backlog.

    python -m benchmarks.memory --bootstrap HOST:PORT --topic T --partitions 4 --count N --buffer BYTES

The application takes far longer per record than the network, so the fetch buffer fills up and
stays full for the whole read: peak RSS should stay near the baseline (interpreter, libraries,
consumer started) plus the configured ``fetch_buffer_bytes`` plus the fetch response being read
(about ``fetch_max_bytes``; brokers round it up to whole record batches), however large the
backlog.  The peak is the kernel's VmHWM, reset once the consumer is running.  Prints one JSON
object; ``within_bound`` says whether the growth stayed within ``fetch_buffer_bytes`` plus
``fetch_max_bytes`` plus ``SLACK_MB`` (the records the application holds, the allocator's
arenas).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

#: What the growth may exceed the buffer and one response by: the batch of records the application
#: holds (200 x 1 KiB here), the interpreter's and the allocator's arenas.
SLACK_MB = 4.0


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM), so the peak covers the read only (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--count", type=int, required=True, help="records to read (slowly)")
    parser.add_argument("--buffer", type=int, default=16 * 2**20, help="fetch_buffer_bytes")
    parser.add_argument("--fetch-max", type=int, default=4 * 2**20, help="fetch_max_bytes")
    parser.add_argument("--partition-max", type=int, default=2**20, help="max_partition_fetch_bytes")
    parser.add_argument("--pause", type=float, default=0.005, help="seconds the application spends per batch")
    parser.add_argument("--batch", type=int, default=200, help="records per getmany()")
    args = parser.parse_args(argv)

    import anyio

    from asyncconsumer import Consumer, TopicPartition

    result: dict[str, object] = {}

    async def run() -> None:
        consumer: Consumer[bytes, bytes] = Consumer(
            bootstrap_servers=args.bootstrap,
            auto_offset_reset="earliest",
            fetch_buffer_bytes=args.buffer,
            fetch_max_bytes=args.fetch_max,
            max_partition_fetch_bytes=args.partition_max,
        )
        async with consumer:
            # Baseline: interpreter, libraries, consumer connected; nothing fetched yet.
            baseline = _rss_mb()
            peak_reset = _reset_peak()
            samples = [baseline]
            started = time.perf_counter()
            n = payload = 0
            consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
            while n < args.count:
                got = await consumer.getmany(timeout=30, max_records=args.batch)
                if not got:
                    break
                for records in got.values():
                    for record in records:
                        payload += len(record.value or b"")
                    n += len(records)
                await anyio.sleep(args.pause)  # the slow application
                samples.append(_rss_mb())
            elapsed = time.perf_counter() - started
            result.update(
                records=n,
                expected=args.count,
                seconds=elapsed,
                payload_mb=payload / 2**20,
                baseline_rss_mb=baseline,
                # VmHWM since the reset (the read only); it is updated lazily, so the samples count too.
                peak_rss_mb=max(_status_mb("VmHWM") if peak_reset else 0.0, max(samples)),
                peak_is_whole_process=not peak_reset,
                max_sampled_rss_mb=max(samples),
                growth_mb=max(_status_mb("VmHWM") if peak_reset else 0.0, max(samples)) - baseline,
                fetch_buffer_mb=args.buffer / 2**20,
                fetch_max_mb=args.fetch_max / 2**20,
                bound_mb=(args.buffer + args.fetch_max) / 2**20,
                slack_mb=SLACK_MB,
            )
            result["within_bound"] = result["growth_mb"] <= result["bound_mb"] + SLACK_MB  # type: ignore[operator]

    try:
        anyio.run(run)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
