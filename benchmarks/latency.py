"""Produce-to-hand-out latency: ``python -m benchmarks.latency``.

    python -m benchmarks.latency [--rates 1000,50000] [--seconds 10] [--warm-up 3] [--rounds 1]
                                 [--settings defaults,low] [--readers a,b] [--partitions 4]
                                 [--json F] [--markdown F]

How long a record takes from the producer's ``produce()`` call to the moment a reader's API hands
it to the application, at a steady rate, on one Apache Kafka broker on this machine.  Every reader
runs in a process of its own, one at a time, each on a fresh topic (``--partitions``, 4 by default,
every one of them assigned to the reader), interleaved (the order rotates each round):

- asyncconsumer ``async for`` and ``getmany()`` (``Consumer``, every partition assigned from the
  beginning), and ``ShareConsumer.getmany()`` (a share group of its own reading from the earliest
  offset, implicit acknowledgement);
- Java's ``KafkaConsumer`` (benchmarks/jvm/LatencyReader.java, compiled with javac against the
  broker's own jars into the cache directory), franz-go (benchmarks/go/franz, see benchmarks/franz.py)
  and confluent-kafka's ``poll()``: the peers;
- Java's ``KafkaShareConsumer`` (the same LatencyReader, in a share group of its own set up as
  ours is): what the share consumer's row is measured against (its "p99 / Java share" column),
  since a share fetch's acquisition and acknowledgements are the broker's work too.

The producer is confluent-kafka (independent of the readers) in this driver process, paced by
rate: every millisecond or so it sends the records due by then, each stamped just before its
``produce()`` call with the wall clock (``time.time_ns()``; the readers read the same clock, the
machine's CLOCK_REALTIME) in the first 8 bytes of its 100-byte value, and a flag byte that tells
the ``--warm-up`` seconds' records (not counted: connections, JIT, buffers) from the measured
``--seconds``.  ``linger.ms=1``; records go to the partitions in turn.  A reader takes the clock
once per hand-out (each record for ``async for``, each ``getmany()``/``poll()`` for the batch
APIs) and writes the latencies of the measured records to a file, which this driver reads.

Two settings per reader: ``defaults`` (every client's own) and ``low``, the documented low-latency
setting: ``fetch_max_wait_ms`` (Java ``fetch.max.wait.ms``, librdkafka ``fetch.wait.max.ms``,
kgo ``FetchMaxWait``) at ``LOW_WAIT_MS``.  The report gives p50, p99, p99.9 and the maximum of
every reader (each the median of the rounds'), each reader's p99 as a ratio of the best peer's, its
CPU use over the measured seconds, and the producer's own produce-to-acknowledged latency (the
part no reader can avoid): over every run, and beside each reader the producer's p99 during that
reader's own runs (the median over its rounds).  On a machine the broker, the producer and the
reader share, the broker's and the producer's stalls reach every reader's tail: a reader's p99 is
best read next to the producer's in the same rounds.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import math
import os
import platform
import queue
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from . import brokers, franz
from .processes import client_env, log, module_command

ROOT = Path(__file__).resolve().parent.parent
VALUE_SIZE = 100
KEY = b"latency-k0"
PARTITIONS = 4
#: The documented low-latency setting: the longest a broker may hold a fetch with nothing new.
LOW_WAIT_MS = 10
#: reader -> label; in the report's order.
READERS = {
    "asyncconsumer-iter": "asyncconsumer `async for`",
    "asyncconsumer-getmany": "asyncconsumer `getmany()`",
    "asyncconsumer-share": "asyncconsumer `ShareConsumer.getmany()`",
    "java-consumer": "Java `KafkaConsumer.poll()`",
    "java-share": "Java `KafkaShareConsumer.poll()`",
    franz.CLIENT: "franz-go `PollFetches()`",
    "confluent-kafka": "confluent-kafka `poll()`",
}
PEERS = ("java-consumer", franz.CLIENT, "confluent-kafka")
#: The share-group readers (each in a share group of its own); and the readers LatencyReader.java runs.
SHARE_READERS = ("asyncconsumer-share", "java-share")
JAVA_READERS = ("java-consumer", "java-share")
SETTINGS = ("defaults", "low")
JAVA_SOURCE = Path(__file__).resolve().parent / "jvm" / "LatencyReader.java"
_STAMP = struct.Struct(">qB")
#: How long a reader may take to get its first record (a JVM, a share group's join: seconds).
START_TIMEOUT_S = 120


# ------------------------------------------------------------------ the readers (subprocesses)


class Latencies:
    """What a Python reader keeps: the measured records' latencies (ns), until ``count``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.values = array.array("q")
        self.records = 0

    def add(self, now: int, value: bytes | None) -> None:
        self.records += 1
        if value is not None and value[8] == 1 and len(self.values) < self.count:
            self.values.append(now - int.from_bytes(value[:8], "big"))

    @property
    def done(self) -> bool:
        return len(self.values) >= self.count

    def write(self, path: str) -> None:
        values = array.array("q", self.values)
        if sys.byteorder == "little":
            values.byteswap()
        with open(path, "wb") as f:
            values.tofile(f)


def _our_options(low: bool) -> dict[str, Any]:
    return {"fetch_max_wait_ms": LOW_WAIT_MS} if low else {}


async def _read_ours(args: argparse.Namespace, got: Latencies) -> None:
    from asyncconsumer import Consumer, TopicPartition

    consumer: Consumer[bytes, bytes] = Consumer(
        bootstrap_servers=args.bootstrap, auto_offset_reset="earliest", **_our_options(args.low)
    )
    async with consumer:
        consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
        got.add(time.time_ns(), (await consumer.getone()).value)
        print("READY", flush=True)
        if args.reader == "asyncconsumer-iter":
            async for record in consumer:
                got.add(time.time_ns(), record.value)
                if got.done:
                    break
        else:
            await _getmany_until_done(consumer, got)


async def _getmany_until_done(consumer: Any, got: Latencies) -> None:
    """``getmany()`` until ``got`` has every record; a batch's records are all handed out at once."""
    while not got.done:
        batch = await consumer.getmany(timeout=1.0)
        now = time.time_ns()
        for records in batch.values():
            for record in records:
                got.add(now, record.value)


async def _read_share(args: argparse.Namespace, got: Latencies) -> None:
    from asyncconsumer import ShareConsumer

    consumer: ShareConsumer[bytes, bytes] = ShareConsumer(
        bootstrap_servers=args.bootstrap, group_id=args.group, **_our_options(args.low)
    )
    async with consumer:
        consumer.subscribe([args.topic])
        while not got.records:
            for records in (await consumer.getmany(timeout=1.0)).values():
                for record in records:
                    got.add(time.time_ns(), record.value)
        print("READY", flush=True)
        await _getmany_until_done(consumer, got)


def _read_confluent(args: argparse.Namespace, got: Latencies) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap, "group.id": "latency-bench",
                              "enable.auto.commit": False, "log_level": 3}
    if args.low:
        config["fetch.wait.max.ms"] = LOW_WAIT_MS
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
        while not got.done:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            now = time.time_ns()
            if msg.error() is not None:
                raise KafkaException(msg.error())
            got.add(now, msg.value())
            if got.records == 1:
                print("READY", flush=True)
    finally:
        consumer.close()


def read_main(argv: list[str]) -> int:
    """``python -m benchmarks.latency read READER ...``: one Python reader (a subprocess of the driver)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency read")
    parser.add_argument("reader", choices=("asyncconsumer-iter", "asyncconsumer-getmany", "asyncconsumer-share",
                                           "confluent-kafka"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--group", help="the share group (asyncconsumer-share)")
    parser.add_argument("--low", action="store_true", help="the low-latency setting")
    args = parser.parse_args(argv)
    got = Latencies(args.count)
    error = None
    try:
        if args.reader == "confluent-kafka":
            _read_confluent(args, got)
        else:
            import anyio

            with_deadline = _read_share if args.reader == "asyncconsumer-share" else _read_ours

            async def main() -> None:
                with anyio.fail_after(300):
                    await with_deadline(args, got)

            anyio.run(main)
        got.write(args.out)
    except Exception as exc:  # reported, not raised: the driver shows it in the table
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"client": args.reader, "records": got.records, "measured": len(got.values), "error": error}),
          flush=True)
    return 0 if error is None else 1


# ------------------------------------------------------------------ building the Java and Go readers


def java_classes(kafka: Any) -> tuple[Path | None, str | None]:
    """LatencyReader compiled against ``kafka``'s jars into the cache: (class directory, None) or (None, why)."""
    from asyncconsumer.testing.kafka import cache_dir, find_java

    java, _ = find_java()
    javac = shutil.which("javac", path=str(Path(java).parent)) or shutil.which("javac")
    if javac is None:
        return None, "Java's consumer skipped: no javac to compile benchmarks/jvm/LatencyReader.java"
    digest = hashlib.sha256(JAVA_SOURCE.read_bytes() + kafka.version.encode()).hexdigest()[:12]
    target = cache_dir() / f"bench-java-latency-{digest}"
    if not (target / "LatencyReader.class").exists():
        libs = _java_classpath(kafka.java_command("X"))
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            proc = subprocess.run([javac, "-cp", libs, "-d", tmp, str(JAVA_SOURCE)], capture_output=True, text=True,
                                  timeout=300, check=False)
            if proc.returncode != 0:
                return None, f"Java's consumer skipped: javac failed: {proc.stderr.strip()[-300:]}"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(tmp, target)
    return target, None


def _java_classpath(command: list[str]) -> str:
    return command[command.index("-cp") + 1]


def java_command(kafka: Any, classes: Path, *args: str) -> list[str]:
    """LatencyReader's command line: the broker's ``java_command`` with ``classes`` on the class path."""
    command: list[str] = kafka.java_command("LatencyReader", *args, heap_mb=512)
    at = command.index("-cp") + 1
    command[at] = f"{command[at]}{os.pathsep}{classes}"
    return command


# ------------------------------------------------------------------ the driver


def producer(bootstrap: str) -> Any:
    """The benchmark's producer (confluent-kafka): ``linger.ms=1``, acks from all replicas (one here)."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all", "enable.idempotence": False,
                     "queue.buffering.max.messages": 1_000_000, "log_level": 3})


def record(flag: int) -> bytes:
    """A value stamped now: the clock (ns, big-endian int64), ``flag`` (1: measured), padding."""
    return _STAMP.pack(time.time_ns(), flag) + b"x" * (VALUE_SIZE - _STAMP.size)


def produce(producer: Any, topic: str, rate: int, warm_up: float, seconds: float,
            partitions: int = PARTITIONS) -> dict[str, Any]:
    """``warm_up`` then ``seconds`` of records at ``rate`` a second to ``topic``'s partitions in turn,
    stamped with the clock; the measured ones' produce-to-acknowledged latencies (ns)."""
    acked = array.array("q")

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None and msg.value()[8] == 1:
            acked.append(int(msg.latency() * 1e9))

    warm = int(rate * warm_up)
    total = warm + int(rate * seconds)
    pad = b"x" * (VALUE_SIZE - _STAMP.size)
    pack = _STAMP.pack
    now_ns = time.time_ns
    clock = time.perf_counter
    send = producer.produce
    started = clock()
    lag = 0.0
    sent = 0
    while sent < total:
        due = min(total, int((clock() - started) * rate) + 1)
        while sent < due:
            send(topic, pack(now_ns(), sent >= warm) + pad, KEY, partition=sent % partitions, on_delivery=on_delivery)
            sent += 1
        producer.poll(0)
        ahead = sent / rate - (clock() - started)
        if ahead > 0:
            time.sleep(ahead)
        else:
            lag = max(lag, -ahead)
    elapsed = clock() - started
    producer.flush(60)
    return {"acked": acked, "sent": total, "measured": total - warm, "seconds": elapsed,
            "rate": total / elapsed if elapsed > 0 else 0.0, "max_behind_s": lag}


def prime(producer: Any, topic: str, lines: queue.Queue[str | None], timeout: float,
          partitions: int = PARTITIONS) -> None:
    """Warm-up records (20 a second) until the reader says READY: it has its first record."""
    deadline = time.monotonic() + timeout
    sent = 0
    seen: list[str] = []
    while time.monotonic() < deadline:
        producer.produce(topic, record(0), KEY, partition=sent % partitions)
        producer.poll(0)
        sent += 1
        try:
            line = lines.get(timeout=0.05)
        except queue.Empty:
            continue
        if line is None:
            raise RuntimeError(f"the reader exited before its first record: {' | '.join(seen)[-300:]}")
        if line.strip() == "READY":
            return
        seen.append(line.strip())
    raise RuntimeError(f"no first record within {timeout:.0f} s")


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def create_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    name = f"latency-{uuid.uuid4().hex[:10]}"
    admin = _admin(bootstrap)  # kept alive until the answer is in (a dropped client cancels it)
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=60)
    # Created is not yet served: the broker's metadata may list part of a large topic's partitions
    # for a moment (a reader assigned all of them would be told the topic has fewer).
    deadline = time.monotonic() + 60
    while len(admin.list_topics(name, timeout=10).topics[name].partitions) < partitions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {name}: not all {partitions} partitions in the metadata after 60 s")
        time.sleep(0.1)
    return name


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = _admin(bootstrap)
    admin.delete_topics([topic])[topic].result(timeout=60)


def _cpu_of(pid: int) -> float | None:
    """CPU seconds of process ``pid`` so far (all threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def reader_command(reader: str, broker: brokers.Broker, topic: str, count: int, out: str, low: bool,
                   java: Path | None, group: str | None, partitions: int = PARTITIONS) -> list[str]:
    base = ("--bootstrap", broker.bootstrap, "--topic", topic, "--partitions", str(partitions), "--count", str(count))
    if reader in JAVA_READERS:
        assert java is not None
        extra = [f"fetch.max.wait.ms={LOW_WAIT_MS}"] if low else []
        if group is not None:
            extra.append(f"share={group}")
        return java_command(broker.handle, java, broker.bootstrap, topic, str(partitions), str(count), out, *extra)
    if reader == franz.CLIENT:
        wait = ("--fetch-max-wait-ms", str(LOW_WAIT_MS)) if low else ()
        return franz.command("latency", *base, "--out", out, *wait)
    command = module_command("benchmarks.latency", "read", reader, *base, "--out", out,
                             *(("--group", group) if group else ()))
    return command + (["--low"] if low else [])


def measure_one(reader: str, broker: brokers.Broker, rate: int, low: bool, warm_up: float, seconds: float,
                java: Path | None, partitions: int = PARTITIONS) -> dict[str, Any]:
    """One reader at one rate and setting on a fresh topic: its latencies (ns, measured records),
    the producer's, the reader's CPU share over the measured seconds, and what went wrong."""
    from .share import share_group_from_earliest

    topic = create_topic(broker.bootstrap, partitions)
    count = int(rate * seconds)
    group = share_group_from_earliest(broker.bootstrap) if reader in SHARE_READERS else None
    result: dict[str, Any] = {"reader": reader, "rate": rate, "setting": "low" if low else "defaults",
                              "error": None, "latencies": array.array("q"), "acked": array.array("q")}
    send = producer(broker.bootstrap)
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-latency-") as tmp:
        out = str(Path(tmp, "latencies"))
        command = reader_command(reader, broker, topic, count, out, low, java, group, partitions)
        with open(Path(tmp, "stderr"), "w+") as err:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                    stdin=subprocess.DEVNULL, cwd=ROOT, env=client_env({}))
            lines: queue.Queue[str | None] = queue.Queue()

            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.put(line)
                lines.put(None)

            threading.Thread(target=pump, daemon=True).start()
            try:
                prime(send, topic, lines, START_TIMEOUT_S, partitions)
                cpu0 = _cpu_of(proc.pid)
                produced = produce(send, topic, rate, warm_up, seconds, partitions)
                cpu1 = _cpu_of(proc.pid)
                proc.wait(timeout=120)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                proc.kill()  # this reader only, by its own process
                proc.wait()
                err.seek(0)
                result["error"] = f"{exc}; stderr: {err.read().strip()[-300:]}"
                delete_topic(broker.bootstrap, topic)
                return result
            err.seek(0)
            stderr = err.read()
        outputs = []
        while (line := lines.get(timeout=10)) is not None:
            outputs.append(line)
        found = [line for line in outputs if line.startswith("{")]
        outcome = json.loads(found[-1]) if found else {"error": f"exit {proc.returncode}: {stderr.strip()[-300:]}"}
        result["error"] = outcome.get("error")
        if not result["error"]:
            values = array.array("q")
            with open(out, "rb") as f:
                values.frombytes(f.read())
            if sys.byteorder == "little":
                values.byteswap()
            result["latencies"] = values
            if len(values) != count:
                result["error"] = f"{len(values)} of {count} measured records"
    delete_topic(broker.bootstrap, topic)
    measured_s = produced["seconds"]
    cpu = (cpu1 - cpu0) / measured_s if cpu0 is not None and cpu1 is not None and measured_s else None
    result.update(acked=produced["acked"], produced_rate=produced["rate"], producer_behind_s=produced["max_behind_s"],
                  cpu_share=cpu)
    return result


def percentile(sorted_values: list[int], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``sorted_values``."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(round(q / 100 * len(sorted_values), 6)))  # 99.9 % of 1000 is 999, not 999.0000001
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": percentile(ordered, 50), "p99": percentile(ordered, 99), "p99.9": percentile(ordered, 99.9),
            "max": float(ordered[-1]) if ordered else math.nan, "count": len(ordered)}


def _row(runs: list[array.array[int]], errors: list[str], cpu: list[float]) -> dict[str, Any]:
    """One table row: each percentile the median over the runs (rounds) of that run's percentile."""
    each = [summarize(list(values)) for values in runs if values]
    row: dict[str, Any] = {key: statistics.median(s[key] for s in each) if each else math.nan
                           for key in ("p50", "p99", "p99.9", "max")}
    row.update(count=sum(s["count"] for s in each), runs=len(each), errors=errors,
               cpu_share=statistics.median(cpu) if cpu else None)
    return row


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The Markdown tables (one per setting and rate) and their numbers."""
    lines = [
        "## Latency: produce to hand-out",
        "",
        f"{meta['date']}; {meta['broker']}; {meta['machine']}; Python {meta['python']}.  "
        f"{meta.get('partitions', PARTITIONS)} partitions, {VALUE_SIZE} B values, "
        f"{meta['warm_up']:g} s warm-up then {meta['seconds']:g} s "
        f"measured per reader, medians of {meta['rounds']} round(s); load average {meta['load'][0]:.1f} at the start, "
        f"{meta['load'][1]:.1f} at the end.  `low`: fetch max wait {LOW_WAIT_MS} ms on every reader.",
    ]
    numbers: dict[str, Any] = {}
    for setting in SETTINGS:
        for rate in sorted({r["rate"] for r in results}):
            cell = [r for r in results if r["setting"] == setting and r["rate"] == rate]
            if not cell:
                continue
            rows: dict[str, dict[str, Any]] = {}
            for reader in READERS:
                runs = [r for r in cell if r["reader"] == reader]
                if not runs:
                    continue
                ok = [r for r in runs if not r["error"]]
                rows[reader] = _row([r["latencies"] for r in ok], sorted({r["error"] for r in runs if r["error"]}),
                                    [r["cpu_share"] for r in ok if r.get("cpu_share") is not None])
                rows[reader]["acked_p99"] = _row([r["acked"] for r in ok if r.get("acked")], [], [])["p99"]
            acked = _row([r["acked"] for r in cell if r.get("acked")], [], [])
            peers = [rows[p]["p99"] for p in PEERS if p in rows and rows[p]["count"]]
            best = min(peers) if peers else None
            behind = max((r.get("producer_behind_s") or 0.0 for r in cell), default=0.0)
            lines += [
                "",
                f"**{rate:,} records/s, {setting}** (milliseconds; the producer fell behind its pace by at most "
                f"{behind * 1000:.1f} ms)",
                "",
                "| reader | p50 | p99 | p99.9 | max | p99 / best peer's | CPU | producer's p99, same rounds |",
                "|---|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for reader, row in rows.items():
                if not row["count"]:
                    lines.append(f"| {READERS[reader]} | {'; '.join(row['errors'])[:200] or 'no run'} | | | | | | |")
                    continue
                ratio = f"{row['p99'] / best:.2f}" if best else "-"
                ratio += _against_java_share(reader, row, rows)
                cpu = f"{row['cpu_share'] * 100:.0f}%" if row["cpu_share"] is not None else "-"
                note = " (some runs failed)" if row["errors"] else ""
                lines.append(f"| {READERS[reader]}{note} | {row['p50'] / 1e6:.2f} | {row['p99'] / 1e6:.2f} | "
                             f"{row['p99.9'] / 1e6:.2f} | {row['max'] / 1e6:.2f} | {ratio} | {cpu} | "
                             f"{row['acked_p99'] / 1e6:.2f} |")
            if acked["count"]:
                cells = " | ".join(f"{acked[key] / 1e6:.2f}" for key in ("p50", "p99", "p99.9", "max"))
                lines.append(f"| producer: produce() to acknowledged | {cells} | | | |")
            numbers[f"{setting}/{rate}"] = {**rows, "producer_acked": acked}
    return "\n".join(lines + summary(numbers)), numbers


def _against_java_share(reader: str, row: dict[str, Any], rows: dict[str, Any]) -> str:
    """For our share consumer's row: its p99 as a ratio of Java's share consumer's, as " (0.95x Java
    share)"; else ""."""
    java = rows.get("java-share")
    if reader != "asyncconsumer-share" or not java or not java["count"]:
        return ""
    return f" ({row['p99'] / java['p99']:.2f}x Java share)"


def summary(numbers: dict[str, Any]) -> list[str]:
    """The tables again, one per setting with every rate side by side (docs/performance.md's form)."""
    rates = sorted({int(key.split("/")[1]) for key in numbers})
    out: list[str] = []

    def ms(value: float) -> str:
        return f"{value / 1e6:,.0f}" if value >= 1e9 else f"{value / 1e6:.1f}" if value >= 1e7 else f"{value / 1e6:.2f}"

    for setting in SETTINGS:
        tables = {rate: numbers.get(f"{setting}/{rate}") for rate in rates}
        if not any(tables.values()):
            continue
        head = " | ".join(f"{rate:,}/s: p50 | p99 | p99.9 | p99 / best peer | producer's p99" for rate in rates)
        out += ["", f"| reader, `{setting}` | {head} |", "|---|" + "---:|" * 5 * len(rates)]
        for reader, label in [*READERS.items(), ("producer_acked", "producer: `produce()` to acknowledged")]:
            cells = []
            for table in tables.values():
                table = table or {}
                row = table.get(reader)
                if not row or not row["count"]:
                    cells += ["-"] * 5
                    continue
                peers = [table[p]["p99"] for p in PEERS if p in table and table[p]["count"]]
                best = f"{row['p99'] / min(peers):.2f}" if peers and reader != "producer_acked" else ""
                best += _against_java_share(reader, row, table)
                acked = "" if reader == "producer_acked" else ms(row["acked_p99"])  # in this reader's rounds
                cells += [ms(row["p50"]), ms(row["p99"]), ms(row["p99.9"]), best, acked]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["read"]:
        return read_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1000,50000", help="records/s, comma-separated (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per reader (default 10)")
    parser.add_argument("--warm-up", type=float, default=3.0, help="seconds produced first, not counted (default 3)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--broker-warm-up", type=float, default=15.0,
                        help="seconds of an unrecorded read at each rate first, for the broker (default 15)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="defaults,low (default: both)")
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS,
                        help="the topic's partitions, every one assigned to the reader (default %(default)s)")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--markdown", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    readers = args.readers.split(",")
    settings = args.settings.split(",")
    if unknown := [r for r in readers if r not in READERS] + [s for s in settings if s not in SETTINGS]:
        parser.error(f"unknown readers or settings: {unknown}")
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    rates = [int(r) for r in args.rates.split(",")]
    broker = brokers.start("kafka", log)
    try:
        text, numbers = measure(broker, readers, rates, settings, seconds=args.seconds, warm_up=args.warm_up,
                                rounds=args.rounds, broker_warm_up=args.broker_warm_up, partitions=args.partitions)
    finally:
        broker.stop()
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 1 if numbers["errors"] else 0


def measure(broker: brokers.Broker, readers: list[str], rates: list[int], settings: list[str], *, seconds: float,
            warm_up: float, rounds: int, broker_warm_up: float,
            partitions: int = PARTITIONS) -> tuple[str, dict[str, Any]]:
    """Every reader at every rate in every setting for ``rounds`` rounds on ``broker`` (Apache Kafka):
    the Markdown report and its numbers (every run's summary; ``errors``: the runs that failed)."""
    readers = list(readers)
    notes: list[str] = []
    java = None
    if java_readers := [r for r in readers if r in JAVA_READERS]:
        java, why = java_classes(broker.handle)
        if why:
            notes.append(why)
            readers = [r for r in readers if r not in java_readers]
    if franz.CLIENT in readers and (why := franz.missing()):
        notes.append(why)
        readers.remove(franz.CLIENT)
    for rate in rates if broker_warm_up > 0 else ():  # a broker just started is slow at first (its JIT)
        log(f"warming the broker up: confluent-kafka at {rate}/s for {broker_warm_up:g} s")
        measure_one("confluent-kafka", broker, rate, False, 0.0, broker_warm_up, java, partitions)
    load0 = os.getloadavg()[0]
    results = []
    for round_no in range(rounds):
        order = readers[round_no % len(readers):] + readers[: round_no % len(readers)]
        for setting in settings:
            for rate in rates:
                for reader in order:
                    result = measure_one(reader, broker, rate, setting == "low", warm_up, seconds, java, partitions)
                    result["round"] = round_no
                    results.append(result)
                    got = summarize(list(result["latencies"])) if result["latencies"] else None
                    ack = summarize(list(result["acked"])) if result["acked"] else None
                    log(f"round {round_no + 1} {setting} {rate}/s {reader}: "
                        + (f"p50 {got['p50'] / 1e6:.2f} ms p99 {got['p99'] / 1e6:.2f} ms" if got else "")
                        + (f" (producer acks: p50 {ack['p50'] / 1e6:.2f} ms p99 {ack['p99'] / 1e6:.2f} ms)"
                           if ack else "")
                        + (f" ERROR {result['error']}" if result["error"] else ""))
    meta = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "broker": broker.description,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
            "rounds": rounds, "seconds": seconds, "warm_up": warm_up, "load": (load0, os.getloadavg()[0]),
            "partitions": partitions,
            "versions": _versions()}
    text, tables = report(results, meta)
    text += "\n" + "".join(f"\n- {note}" for note in notes) if notes else ""
    runs = [{**{k: v for k, v in r.items() if k not in ("latencies", "acked")},
             "summary": summarize(list(r["latencies"])), "acked": summarize(list(r["acked"]))} for r in results]
    errors = [f"{r['reader']} {r['setting']} {r['rate']}/s: {r['error']}" for r in results if r["error"]]
    return text, {"meta": meta, "tables": tables, "runs": runs, "errors": errors, "notes": notes}


def _versions() -> dict[str, str]:
    import confluent_kafka

    from asyncconsumer import __version__

    return {"asyncconsumer": __version__, "confluent_kafka": confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0], "franz-go": franz.version()}


if __name__ == "__main__":
    sys.exit(main())
