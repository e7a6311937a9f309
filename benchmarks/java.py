"""The Java consumer row: Apache Kafka's own ``org.apache.kafka.tools.ConsumerPerformance``.

It runs from the broker's jars (the same Kafka release, so the same ``KafkaConsumer``) as a JVM of
its own, started by the driver like any other client, on the same topics and data.  The tool
builds a ``KafkaConsumer``, subscribes with a consumer group (it cannot assign), polls until it has
the requested number of records and prints one summary line: its start (after the consumer was
built), its end (the poll that returned the last record), the group-join time and the bytes and
records read.  Settings are the tool's: ``max.partition.fetch.bytes`` 1 MiB (the client default),
``receive.buffer.bytes`` 2 MiB, and ``check.crcs=false``, which the tool sets after reading
``--command-property`` (a ``check.crcs=true`` there is overwritten), so the Java row does not
verify CRC-32C; everything else is the client's default (classic group protocol, ``fetch.max.bytes``
50 MiB, ``max.poll.records`` 500).

What each number covers (docs/performance.md has the table):

- records/s and MB/s: from the partitions being assigned to the last record (the tool's
  ``fetch.time.ms``): the group join is left out because no other client joins a group; JVM start,
  class loading and building the consumer are before the tool's clock starts.
- JVM start: from spawning the process to the tool's start (JVM boot, class loading, option parsing,
  building the ``KafkaConsumer``), measured from outside.
- CPU s: the JVM's CPU time (all threads: JIT compiler and GC included) from the tool's start to
  the process's exit, i.e. the JVM's total (``wait4``) minus its CPU at the tool's start (sampled
  from ``/proc/<pid>/stat`` every 10 ms and interpolated).
- peak RSS: the JVM's VmHWM, sampled from ``/proc/<pid>/status`` every 10 ms (``ru_maxrss`` from
  ``wait4`` could carry the driver's size over ``exec``).
- time to first record: the tool does not report it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .datasets import Dataset

if TYPE_CHECKING:
    from asyncconsumer.testing import KafkaBroker

CLIENT = "java-consumer"
LABEL = "Java `KafkaConsumer` (ConsumerPerformance)"
MAIN_CLASS = "org.apache.kafka.tools.ConsumerPerformance"
#: kafka-consumer-perf-test.sh's heap (-Xmx512M).
HEAP_MB = 512
#: kafka-run-class.sh's JVM options that ``java_command()`` does not already give (it has G1 with
#: MaxGCPauseMillis=20 and headless; -server and MaxInlineLevel=15 are JDK 17's defaults).
SCRIPT_OPTIONS = ("-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent")
#: Longest gap between two polls that return records before the tool gives up (its --timeout).
RECORD_TIMEOUT_MS = 30_000
_DATE_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"  # ISO 8601 with milliseconds and the zone
SAMPLE_S = 0.01
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def command(kafka: KafkaBroker, topic: str, count: int, group: str, *extra: str) -> list[str]:
    """The JVM's command line (``kafka`` is the started ``KafkaBroker``; ``extra``: more tool options),
    with the JVM options ``kafka-consumer-perf-test.sh`` would give it."""
    java, *rest = kafka.java_command(
        MAIN_CLASS,
        "--bootstrap-server", kafka.bootstrap,
        "--topic", topic,
        "--num-records", str(count),
        "--group", group,
        "--timeout", str(RECORD_TIMEOUT_MS),
        "--date-format", _DATE_FORMAT,
        *extra,
        heap_mb=HEAP_MB,
    )
    return [java, *SCRIPT_OPTIONS, *rest]


def jvm_options(kafka: KafkaBroker) -> str:
    """The JVM options of the row, as the report states them (class path and logging left out)."""
    options = command(kafka, "t", 1, "g")[1:]
    options = options[: options.index("-cp")]
    return " ".join(o for o in options if not o.startswith(("-Dlog4j2.", "-Dkafka.logs.dir")))


def parse_table(stdout: str, first_column: str) -> list[dict[str, str]]:
    """The tool's CSV lines under the header starting with ``first_column``, as ``{column: value}``
    (log lines in between are skipped)."""
    lines = [line.strip() for line in stdout.splitlines()]
    for index, line in enumerate(lines):
        if line.startswith(first_column + ","):
            header = [name.strip() for name in line.split(",")]
            rows = [[value.strip() for value in values.split(",")] for values in lines[index + 1 :]]
            return [dict(zip(header, row, strict=True)) for row in rows if len(row) == len(header)]
    return []


def parse_summary(stdout: str) -> dict[str, str]:
    """The tool's summary line (header ``start.time, end.time, ...``)."""
    rows = parse_table(stdout, "start.time")
    if not rows:
        raise ValueError("no summary line in ConsumerPerformance's output")
    return rows[0]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


class ProcessSampler:
    """CPU seconds and VmHWM of a running process, read from /proc at a fixed interval."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []  # (time.time(), CPU seconds)
        self.peak_rss_mb = 0.0

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            now = time.time()
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            self.samples.append((now, (int(fields[11]) + int(fields[12])) / _TICKS))
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.peak_rss_mb = max(self.peak_rss_mb, int(line.split()[1]) / 1024)
                        break

    def cpu_at(self, when: float) -> float | None:
        """CPU seconds used by ``when`` (linear between the samples around it)."""
        before = [s for s in self.samples if s[0] <= when]
        after = [s for s in self.samples if s[0] > when]
        if not before:
            return None
        t0, c0 = before[-1]
        if not after:
            return c0
        t1, c1 = after[0]
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0)


def run(kafka: KafkaBroker, dataset: Dataset, count: int, timeout: float) -> dict[str, Any]:
    """Run ConsumerPerformance on ``dataset`` for ``count`` records; a result like the Python readers'."""
    group = f"bench-java-{dataset.name}-{os.getpid()}-{time.time_ns()}"
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        spawned = time.time()
        proc = subprocess.Popen(
            command(kafka, dataset.topic, count, group), stdout=out, stderr=err, stdin=subprocess.DEVNULL
        )
        sampler = ProcessSampler(proc.pid)
        deadline = time.monotonic() + timeout
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and not timed_out:
                timed_out = True
                proc.kill()  # this JVM only, by its own pid
            sampler.sample()
            time.sleep(SAMPLE_S)
        exited = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so that wait4 gives its rusage
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result: dict[str, Any] = {
        "client": CLIENT,
        "topic": dataset.topic,
        "expected": count,
        "pid": proc.pid,
        "first_record_s": None,
        "error": None,
    }
    process_cpu = usage.ru_utime + usage.ru_stime
    if timed_out:
        result["error"] = f"timed out after {timeout:.0f}s"
        return result
    try:
        summary = parse_summary(stdout)
    except ValueError:
        tail = "\n".join((stderr.strip() or stdout.strip()).splitlines()[-6:])
        result["error"] = f"exit {proc.returncode}, no summary; output: {tail[-400:]}"
        return result
    started, ended = _epoch(summary["start.time"]), _epoch(summary["end.time"])
    join_s = int(summary["rebalance.time.ms"]) / 1000
    fetch_s = int(summary["fetch.time.ms"]) / 1000
    records = int(summary["data.consumed.in.nMsg"])
    payload = round(float(summary["data.consumed.in.MB"]) * 2**20)  # the tool's "MB" is MiB, 4 decimals
    cpu_before = sampler.cpu_at(started)
    result.update(
        records=records,
        payload_bytes=payload,
        # The tool rounds to 1/10,000 MiB: a payload within that of the data set's is all of it.
        payload_tolerance=round(2**20 / 10_000 / 2) + 1,
        wall_s=fetch_s,
        records_per_s=records / fetch_s if fetch_s > 0 else 0.0,
        mb_per_s=payload / fetch_s / 1e6 if fetch_s > 0 else 0.0,
        cpu_s=process_cpu - cpu_before if cpu_before is not None else process_cpu,
        peak_rss_mb=sampler.peak_rss_mb,
        java={
            "jvm_start_s": started - spawned,
            "join_s": join_s,
            "elapsed_s": ended - started,
            "records_per_s_with_join": records / (ended - started) if ended > started else 0.0,
            "process_wall_s": exited - spawned,
            "process_cpu_s": process_cpu,
            "startup_cpu_s": cpu_before,
            "exit_code": proc.returncode,
            "group": group,
        },
    )
    if proc.returncode != 0:
        result["error"] = f"exit {proc.returncode}: {stderr.strip()[-300:]}"
    elif "WARNING: Exiting before consuming" in stdout:
        result["error"] = f"the tool gave up: no record for {RECORD_TIMEOUT_MS} ms"
    return result

