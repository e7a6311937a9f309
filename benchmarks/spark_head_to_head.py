"""The PySpark source against Spark's own Kafka source: same broker, same topics, same session.

    python -m benchmarks.spark_head_to_head [--quick] [--records-100b N] [--records-1kib N] [--rounds 3] [--warmup 1]
        [--steps batch,aggregate,stream,arriving] [--kept] [--timings] [--no-executor-read] [--master standalone]
        [--precompile-pyspark] [--kafka-option NAME=VALUE ...]

One Apache Kafka broker (``asyncconsumer.testing.KafkaBroker``), two topics of 4 partitions
(1,000,000 x 100 B and 200,000 x 1 KiB values; ``--quick``: 50,000 and 10,000), produced once with
confluent-kafka.  One SparkSession (``local[2]`` unless ``--master``; ``--master standalone`` starts
a standalone cluster of a master and two 1-core workers for the run, benchmarks/spark_cluster.py) with Spark's Kafka
source on the classpath (``org.apache.spark:spark-sql-kafka-0-10_2.13`` of the *installed*
PySpark's version and the jars it adds, resolved from Maven Central by Spark's Ivy and given as
``spark.jars``: see ``kafka_jars``) and the asyncconsumer
source registered.  After ``--warmup`` untimed rounds (each step and source once on the 1 KiB
topic, and with ``--latency`` an 8 s latency query per source: the JVM's first query of a kind is
slower for whichever source runs it), for each topic,
interleaved rounds (each source goes first in turn) of:

- **batch**: ``spark.read...load()`` written to the ``noop`` sink;
- **aggregate**: ``groupBy("partition").count()`` collected;
- **stream**: ``readStream`` with ``trigger(availableNow=True)`` to Parquet (a fresh directory and
  checkpoint each time): a backlog, the query's start-up included;
- **arriving**: the topic's records produced again, into a fresh topic, while a query (default
  trigger, Parquet sink) already runs on it; from the first ``produce_batch`` call until the last
  record's micro-batch ended (records that arrive continuously, the start-up left out);
- **latency** (``--latency SECONDS``, default 30; 0 skips), in rounds of its own after those: a
  continuously running query per source (default trigger, ``foreachBatch`` sink) on a fresh topic
  fed 1,000 records/s; the percentiles of each record's produce-to-sink time.

asyncconsumer is byte-compiled first, as ``pip install`` does (from a checkout with
``PYTHONDONTWRITEBYTECODE`` set, each new Python process Spark starts would compile it again);
``--precompile-pyspark`` also gives the installed PySpark's own zips bytecode (docs/spark.md).

Before timing, both sources' rows are checked to be identical: the SHA-256 of the sorted per-row
``xxhash64`` of every column (headers included), and the row count.  Prints rows/s (median and
spread over the rounds) per source and step, and the ratio asyncconsumer / Spark.

``--kafka-option NAME=VALUE`` gives both sources the consumer property ``kafka.NAME`` (repeatable),
to compare them at the same settings.  ``--kept`` runs the source a second time with
``consumerCacheTimeout=5m`` (executors keep their consumers between tasks); ``--timings`` logs
where each stream's time goes (the source's DEBUG ``timing:`` lines from every Python process
Spark starts, and Spark's per-batch durations).

Spark's Kafka source must match the PySpark version.  When the installed PySpark's
spark-sql-kafka is not on Maven Central (PySpark 4.3.0, November 2026), the command stops and
says so; run it from a virtualenv with a PySpark whose Kafka source is published, e.g.
``pip install 'pyspark[sql]==4.2.0' -e '.[arrow]'`` - both sources then run in that one Spark.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from . import datasets as ds
from .datasets import Dataset

MAVEN = "https://repo1.maven.org/maven2/org/apache/spark/spark-sql-kafka-0-10_2.13"
SOURCES = ["asyncconsumer", "kafka"]
#: ``--kept``: the source again with consumerCacheTimeout=5m (executors keep their consumers between tasks).
KEPT = "asyncconsumer-kept"
STEPS = ["batch", "aggregate", "stream", "arriving"]
#: Records/s fed to the latency query.
LATENCY_RATE = 1000
#: Seconds of the untimed latency query per source in each warm-up round.  Without it, whichever
#: source ran the session's first ``foreachBatch`` query paid its start-up: a median of 1.0-5.5 s
#: in round 1 against 0.43-0.46 s in the next rounds.
WARMUP_LATENCY_SECONDS = 8.0


def log(message: str) -> None:
    print(f"[spark-h2h {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def kafka_package(version: str) -> str:
    """The Maven coordinate of Spark's Kafka source for PySpark ``version``; exits if not published."""
    url = f"{MAVEN}/{version}/spark-sql-kafka-0-10_2.13-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30):
            pass
    except OSError as exc:
        sys.exit(
            f"spark-sql-kafka-0-10_2.13 {version} (the installed PySpark's version) is not on Maven Central "
            f"({url}: {exc}). Run this from a virtualenv with a PySpark whose Kafka source is published, "
            "e.g. pip install 'pyspark[sql]==4.2.0'."
        )
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def kafka_jars(package: str, ivy: str) -> list[str]:
    """The jars Spark's Kafka source adds to PySpark's own, resolved by Spark's Ivy from Maven Central.

    The session gets them as ``spark.jars``, not ``spark.jars.packages``: for a Python application
    ``spark.jars.packages`` also puts every resolved jar on the Python path of each Python process
    Spark starts (so Python code could ship in them), and a new process then reads each jar's
    directory the first time it imports a module that none of them has (hadoop-client-runtime alone
    has about 19,000 entries).  Outside Spark, in a process that imports what PySpark's streaming
    source runner imports, importing asyncconsumer took 0.37-0.60 s with those 11 jars ahead of it
    on the path against 0.14-0.22 s without.  A job that reads Kafka with this source has no such
    jars: with them, each of its streaming queries would pay for Spark's source being in the session.
    """
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    pyspark_jars = os.listdir(jars)
    ivy_jars = [os.path.join(jars, n) for n in pyspark_jars if re.fullmatch(r"ivy-[\d.]+\.jar", n)]
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if len(ivy_jars) != 1 or not java:
        sys.exit(f"resolving {package} needs java (JAVA_HOME or PATH) and one ivy-*.jar in {jars}: {ivy_jars}")
    org, name, version = package.split(":")
    out = os.path.join(ivy, "h2h-jars", version)
    # artifact__revision[__classifier].jar, so the artifact's name is unambiguous; -sync drops what an
    # earlier resolution left there.
    pattern = os.path.join(out, "[artifact]__[revision](__[classifier]).[ext]")
    command = [java, "-jar", ivy_jars[0], "-cache", os.path.join(ivy, "cache"), "-dependency", org, name, version]
    command += ["-confs", "default", "-types", "jar", "-sync", "-retrieve", pattern]
    retrieved = subprocess.run(command, capture_output=True, text=True)
    if retrieved.returncode != 0:
        sys.exit(f"resolving {package} with Ivy failed:\n{retrieved.stdout[-3000:]}{retrieved.stderr[-3000:]}")

    def has(artifact: str) -> bool:
        """Whether PySpark's jars directory has ``artifact`` (any version): not added twice."""
        return any(re.fullmatch(re.escape(artifact) + r"-\d[^/]*\.jar", n) for n in pyspark_jars)

    return sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".jar") and not has(n.split("__")[0]))


#: ``--timings``: Spark's Python processes (driver planners, executor workers) load this
#: ``sitecustomize`` and log ``asyncconsumer.spark`` at DEBUG (its ``timing:`` lines) to one file.
SITECUSTOMIZE = """
import logging, os
_handler = logging.FileHandler(os.environ["H2H_TIMINGS_LOG"])
_handler.setFormatter(logging.Formatter("%(created).3f %(process)d %(message)s"))
_logger = logging.getLogger("asyncconsumer.spark")
_logger.addHandler(_handler)
_logger.setLevel(logging.DEBUG)
_logger.debug("timing: python process started: %s", " ".join(getattr(__import__("sys"), "argv", [])))
"""


#: The environment with which ``enable_timings`` makes a Python process log the timings.
TIMINGS_ENV = ("H2H_TIMINGS_LOG", "PYTHONPATH")


def enable_timings(work: str) -> str:
    """Before the JVM starts: every Python process Spark starts logs the source's timings to a file."""
    site = os.path.join(work, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    path = os.path.join(work, "timings.log")
    open(path, "w").close()
    os.environ["H2H_TIMINGS_LOG"] = path
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    return path


def logged_since(path: str, offset: int) -> tuple[list[str], int]:
    """The timing log's lines after ``offset``, and the offset after them."""
    with open(path) as f:
        f.seek(offset)
        return f.read().splitlines(), f.tell()


def show_timings(path: str, offset: int, began: float, query: Any) -> int:
    """Print the source's timing lines logged since ``offset`` (seconds since the query started) and
    Spark's own per-batch durations; returns the new offset."""
    lines, offset = logged_since(path, offset)
    for line in lines:
        stamp, _, rest = line.partition(" ")
        log(f"  +{float(stamp) - began:6.2f}s pid {rest}")
    for p in query.recentProgress:
        log(f"  batch {p['batchId']}: {p['numInputRows']} rows, durationMs {p['durationMs']}")
    return offset


#: The executors' ``timing:`` lines of one task (asyncconsumer.spark.source.read_range).
TASK_TIMING = re.compile(
    r"timing: task (?P<task>.+?) (?:pid \d+, worker up [\d.]+ s: (?P<kind>cached|new) consumer"
    r" (?P<start>[\d.]+) s|first batch (?P<first>[\d.]+) s|read (?P<read>[\d.]+) s)$"
)


def summarize_tasks(path: str, offset: int, source: str) -> int:
    """Log a summary of the executor tasks' timing lines logged since ``offset``: how many tasks took
    a kept consumer, and the medians of their consumer start, first batch and whole read; returns
    the new offset."""
    lines, offset = logged_since(path, offset)
    kinds: dict[str, int] = {}
    seconds: dict[str, list[float]] = {"start": [], "first": [], "read": []}
    for line in lines:
        if (m := TASK_TIMING.search(line)) is None:
            continue
        if m["kind"]:
            kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
        for key, values in seconds.items():
            if m[key]:
                values.append(float(m[key]))
    medians = ", ".join(f"{k} {statistics.median(v) * 1000:.0f} ms" for k, v in seconds.items() if v)
    log(
        f"{source}: tasks with a kept consumer {kinds.get('cached', 0)}, with a new one {kinds.get('new', 0)}; "
        f"medians: {medians or 'no task timings'}"
    )
    return offset


def byte_compile() -> None:
    """Byte-compile asyncconsumer where it is imported from, as ``pip install`` does for a wheel.

    Every query starts fresh Python processes (PySpark's planners and its streaming source
    runner) that import the source; from a source checkout with ``PYTHONDONTWRITEBYTECODE`` set
    (or a read-only one) each of them would compile every module again, about 0.35 s of CPU per
    process that an installed package never pays.
    """
    import compileall

    import asyncconsumer

    compileall.compile_dir(os.path.dirname(asyncconsumer.__file__), quiet=1)


def session(master: str, jars: list[str], work: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from asyncconsumer.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName("asyncconsumer-head-to-head")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.executor.memory", "1g")  # standalone: one 1-core executor per worker
        .config("spark.executor.cores", "1")
        .config("spark.local.dir", os.path.join(work, "local"))
        .config("spark.sql.warehouse.dir", os.path.join(work, "warehouse"))
        .config("spark.python.worker.reuse", "true")
        # A loaded machine starts Python workers slowly: give them time to connect back.
        .config("spark.python.authenticate.socketTimeout", "300s")
    )
    for name in TIMINGS_ENV if "H2H_TIMINGS_LOG" in os.environ else ():
        # A standalone cluster's executors were started before --timings set these: give them to
        # their Python workers too (local mode's have them already).
        builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


#: ``--kafka-option`` properties as both sources' ``kafka.<name>`` options.
KAFKA_OPTIONS: dict[str, str] = {}


def reader(
    spark: Any, source: str, bootstrap: str, topic: str, *, stream: bool = False, starting: str = "earliest"
) -> Any:
    builder = spark.readStream if stream else spark.read
    if source == KEPT:
        builder = builder.option("consumerCacheTimeout", "5m")
    builder = builder.options(**KAFKA_OPTIONS)
    return (
        builder.format("asyncconsumer" if source == KEPT else source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .option("includeHeaders", "true")
        .load()
    )


def rows_hash(df: Any) -> tuple[int, str]:
    """(row count, SHA-256 of the sorted per-row xxhash64 of every column)."""
    from pyspark.sql import functions as F

    h = F.xxhash64(*[F.col(c) for c in df.columns]).alias("h")
    row = (
        df.select(h)
        .agg(F.count("*").alias("n"), F.sha2(F.concat_ws(",", F.sort_array(F.collect_list("h"))), 256).alias("d"))
        .first()
    )
    return int(row["n"]), str(row["d"])


def executor_read(bootstrap: str, topic: str, partitions: int, records: int, columnar: bool) -> float:
    """Rows/s of the source's executor read (``read_range`` over every partition, one after the
    other, in this process: no Spark), through the columnar path or the old row path."""
    from asyncconsumer.spark import executor as src
    from asyncconsumer.spark.arrow import records_to_batch
    from asyncconsumer.spark.options import parse_options
    from asyncconsumer.spark.plan import OffsetRange
    from asyncconsumer.structs import TopicPartition

    given = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true"}
    options = parse_options({**given, **KAFKA_OPTIONS}, streaming=False)
    n = 0
    started = time.perf_counter()
    for p in range(partitions):
        offset_range = OffsetRange(TopicPartition(topic, p), 0, len(range(p, records, partitions)))
        if columnar:
            n += sum(b.num_rows for b in src.read_range(options, offset_range))
            continue
        import anyio

        async def rows(offset_range: Any = offset_range) -> int:
            async with src.executor_consumer(options) as consumer:
                reader = src.RangeReader(consumer, offset_range, fail_on_data_loss=True, poll_timeout=60)
                got = 0
                while chunk := await reader.next_chunk():
                    got += records_to_batch(chunk, True).num_rows
                return got

        n += anyio.run(rows)
    return n / (time.perf_counter() - started)


def run_step(
    spark: Any, step: str, source: str, bootstrap: str, dataset: Dataset, work: str, timings: list[Any] | None = None
) -> float:
    """Seconds for one step, tried again (twice at most) when PySpark's streaming source runner, a
    new Python process per query, does not connect back to the JVM in time (on an overloaded
    machine); ``timings``: [log path, offset] to print the stream's timings."""
    for attempt in range(3):
        try:
            return _run_step(spark, step, source, bootstrap, dataset, work, timings)
        except Exception as exc:
            if "failed to connect back" not in str(exc) or attempt == 2:
                raise
            log(f"{source} {step} {dataset.topic}: the Python worker did not connect back in time; again")
    raise AssertionError("unreachable")


def _run_step(
    spark: Any, step: str, source: str, bootstrap: str, dataset: Dataset, work: str, timings: list[Any] | None
) -> float:
    topic = dataset.topic
    started = time.perf_counter()
    began = time.time()
    if step == "arriving":
        return arriving(spark, source, bootstrap, dataset, work)
    if step == "batch":
        reader(spark, source, bootstrap, topic).write.format("noop").mode("overwrite").save()
    elif step == "aggregate":
        reader(spark, source, bootstrap, topic).groupBy("partition").count().collect()
    else:
        out = tempfile.mkdtemp(dir=work, prefix=f"{source}-out-")
        query = (
            reader(spark, source, bootstrap, topic, stream=True)
            .writeStream.format("parquet")
            .option("path", os.path.join(out, "data"))
            .option("checkpointLocation", os.path.join(out, "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        if timings is not None:
            log(f"{source} stream {topic}: {elapsed:.2f}s; the source's timings and Spark's per batch:")
            timings[1] = show_timings(timings[0], timings[1], began, query)
        shutil.rmtree(out, ignore_errors=True)
        return elapsed
    return time.perf_counter() - started


def arriving(spark: Any, source: str, bootstrap: str, dataset: Dataset, work: str) -> float:
    """Seconds for a running query to take in ``dataset``'s records as they are produced: a fresh
    topic, the query started on it from ``latest`` (default trigger, Parquet sink), and once its
    first (empty) micro-batch has run, ``dataset.records`` records produced with
    ``produce_batched``; from the first ``produce_batch`` call to the end of the micro-batch that
    brought the total to ``dataset.records`` (Spark's progress: its start plus
    ``triggerExecution``).  The query's start-up is not in it, as for a query that runs for days."""
    fresh = dataclasses.replace(dataset, topic=f"h2h-arriving-{source}-{time.time_ns()}")
    ds.create_topics(bootstrap, [fresh])
    out = tempfile.mkdtemp(dir=work, prefix=f"{source}-arriving-")
    query = (
        reader(spark, source, bootstrap, fresh.topic, stream=True, starting="latest")
        .writeStream.format("parquet")
        .option("path", os.path.join(out, "data"))
        .option("checkpointLocation", os.path.join(out, "checkpoint"))
        .start()
    )
    try:
        first_batch(query)
        first: list[float] = []  # when the first record was produced
        with ThreadPoolExecutor(1) as pool:
            producer = pool.submit(ds.produce_batched, bootstrap, fresh, started=lambda: first.append(time.time()))
            batches: dict[int, tuple[int, float]] = {}  # batchId: (rows, when it ended, epoch seconds)
            deadline = time.monotonic() + 300
            while (taken := sum(rows for rows, _ in batches.values())) < fresh.records:
                if producer.done():
                    producer.result()  # raises the producer's error, if it failed
                if time.monotonic() > deadline or query.exception() is not None:
                    raise RuntimeError(
                        f"{source}: {taken} of {fresh.records} arriving records in the sink within 300 s "
                        f"({query.exception()})"
                    )
                for p in query.recentProgress:
                    if p["numInputRows"]:
                        start = datetime.fromisoformat(p["timestamp"]).timestamp()
                        batches[p["batchId"]] = (p["numInputRows"], start + p["durationMs"]["triggerExecution"] / 1000)
                time.sleep(0.05)
            produced = producer.result()
        if taken != fresh.records:
            raise RuntimeError(f"{source}: {taken} rows for {fresh.records} records")
        seconds = max(end for _, end in batches.values()) - first[0]
        log(
            f"{source} arriving {fresh.name}: produced in {produced:.2f} s, in the sink after "
            f"{seconds:.2f} s, {len(batches)} micro-batches with rows"
        )
        return seconds
    finally:
        query.stop()
        shutil.rmtree(out, ignore_errors=True)


def first_batch(query: Any, timeout: float = 120) -> None:
    """Wait until a query just started on an empty topic has run its first (empty) micro-batch."""
    deadline = time.monotonic() + timeout
    while query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)


def latency(
    spark: Any, source: str, bootstrap: str, work: str, rate: int, seconds: float, timings: list[Any] | None = None
) -> list[float]:
    """Produce-to-sink latencies (seconds) of a continuously running query: a fresh topic, the
    query started on it from ``latest`` with the default trigger (each micro-batch as soon as the
    last one ends) and a ``foreachBatch`` sink that takes each row's Kafka timestamp (librdkafka's
    CreateTime, set at ``produce()``) from the wall clock when its batch reaches the sink; then
    ``rate`` records/s of 100 B for ``seconds``.  Records produced in the first 3 s are left out
    (the query's first batches)."""
    from confluent_kafka import Producer
    from pyspark.sql import functions as F

    topic = f"h2h-latency-{source}-{time.time_ns()}"
    ds.create_topics(bootstrap, [ds.Dataset(topic, topic, 0, 100)])
    seen: list[tuple[int, float]] = []

    def sink(df: Any, _batch: int) -> None:
        rows = df.select(F.unix_micros("timestamp").alias("t")).collect()
        now = time.time()
        seen.extend((row["t"], now) for row in rows)

    out = tempfile.mkdtemp(dir=work, prefix=f"{source}-latency-")
    query = (
        reader(spark, source, bootstrap, topic, stream=True, starting="latest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", os.path.join(out, "checkpoint"))
        .start()
    )
    try:
        first_batch(query)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log_level": 0})
        value = b"x" * 100
        started = time.monotonic()
        warm_until = time.time() + 3
        sent = 0
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                producer.produce(topic, value, partition=sent % 4)
                sent += 1
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)
        deadline = time.monotonic() + 60
        while len(seen) < sent and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(seen) < sent:
            raise RuntimeError(f"{source}: {len(seen)} of {sent} records reached the sink within 60 s")
        phases: dict[str, list[int]] = {}
        for progress in query.recentProgress:
            if progress["numInputRows"]:
                for phase, ms in (progress["durationMs"] or {}).items():
                    phases.setdefault(phase, []).append(ms)
        log(
            f"{source}: micro-batches with rows, median ms per phase: "
            + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in sorted(phases.items()))
        )
        if timings is not None:
            timings[1] = summarize_tasks(timings[0], timings[1], source)
    finally:
        query.stop()
        shutil.rmtree(out, ignore_errors=True)
    return [now - t / 1e6 for t, now in seen if t / 1e6 >= warm_until]


def in_turn(sources: list[str], round_index: int) -> list[str]:
    """The sources in the order of round ``round_index``: each goes first in turn."""
    first = round_index % len(sources)
    return sources[first:] + sources[:first]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50,000 x 100 B and 10,000 x 1 KiB")
    parser.add_argument("--records-100b", type=int, default=None)
    parser.add_argument("--records-1kib", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed rounds of every step and source on the 1 KiB topic first (default %(default)s)",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="a Spark master URL, or 'standalone': a master and two 1-core workers started from "
        "the installed PySpark for this run and stopped by pid (benchmarks/spark_cluster.py)",
    )
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset of " + ",".join(STEPS))
    parser.add_argument("--timings", action="store_true", help="log where each stream's time goes (DEBUG timings)")
    parser.add_argument("--kept", action="store_true", help="also run the source with consumerCacheTimeout=5m")
    parser.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a consumer property given to both sources as kafka.NAME (repeatable), to compare them at the "
        "same settings, e.g. max.partition.fetch.bytes=8388608",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="each round, a continuously running query per source fed 1,000 records/s for this "
        "long: produce-to-sink latency percentiles (0: skip; default %(default)s)",
    )
    parser.add_argument(
        "--precompile-pyspark",
        action="store_true",
        help="first add bytecode to the installed PySpark's own zips (changes that installation; "
        "python -m asyncconsumer.spark.precompile, docs/spark.md)",
    )
    parser.add_argument("--no-executor-read", action="store_true", help="skip the executor read outside Spark")
    args = parser.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    for given in args.kafka_option:
        name, sep, value = given.partition("=")
        if not sep or not name:
            parser.error(f"--kafka-option wants NAME=VALUE, got {given!r}")
        KAFKA_OPTIONS["kafka." + name.removeprefix("kafka.")] = value

    import pyspark

    package = kafka_package(pyspark.__version__)
    jars = kafka_jars(package, os.path.join(os.path.expanduser("~"), ".ivy2.5.2"))
    from .brokers import KAFKA_HEAP_MB

    sets = [
        ds.Dataset("100B", "h2h-100b", args.records_100b or (50_000 if args.quick else 1_000_000), 100),
        ds.Dataset("1KiB", "h2h-1kib", args.records_1kib or (10_000 if args.quick else 200_000), 1024),
    ]
    from asyncconsumer.testing import KafkaBroker

    work = tempfile.mkdtemp(prefix="spark-h2h-")
    broker = KafkaBroker(listeners=("PLAINTEXT",), heap_mb=KAFKA_HEAP_MB).start()
    spark = cluster = None
    try:
        master = args.master
        if master == "standalone":
            from .spark_cluster import StandaloneCluster

            cluster = StandaloneCluster(os.path.join(work, "cluster"), workers=2, cores=1).start()
            master = cluster.url
            log(f"Spark standalone cluster at {master}: master and 2 workers, pids {cluster.pids}")
        bootstrap = broker.bootstrap
        log(f"Apache Kafka {broker.version} at {bootstrap}; PySpark {pyspark.__version__}; {package}")
        log(f"spark.jars: {', '.join(os.path.basename(j) for j in jars)}")
        ds.create_topics(bootstrap, sets)
        for d in sets:
            log(f"producing {d.describe()}: {ds.produce(bootstrap, d):.1f}s")
        timings = [enable_timings(work), 0] if args.timings else None
        byte_compile()
        # Whether the installed PySpark's zip has this Python's bytecode: --precompile-pyspark adds it
        # and it stays until PySpark is reinstalled, so the table says what the run really had.
        from asyncconsumer.spark.precompile import is_precompiled, precompile_pyspark

        if not args.precompile_pyspark and is_precompiled():
            log("PySpark's zips hold bytecode from an earlier --precompile-pyspark: the results are not 'as installed'")
        if args.precompile_pyspark:
            for z in precompile_pyspark():
                log(f"precompiled {z.path}: {z.compiled} modules compiled, {z.current} already current")
        spark = session(master, jars, work)
        for d in sets:
            hashes = {source: rows_hash(reader(spark, source, bootstrap, d.topic)) for source in SOURCES}
            log(f"{d.name}: rows and hash {hashes}")
            if len(set(hashes.values())) != 1 or hashes["kafka"][0] != d.records:
                sys.exit(f"the sources disagree on {d.topic}: {hashes}")
        results: dict[tuple[str, str, str], list[float]] = {}
        latencies: dict[str, list[float]] = {}
        sources = [*SOURCES, KEPT] if args.kept else SOURCES
        for _ in range(args.warmup):  # the JVM's first query of each kind (JIT, Parquet writer) is not timed
            for step in steps:
                for source in sources:
                    seconds = run_step(spark, step, source, bootstrap, sets[-1], work, None)
                    log(f"warm-up {sets[-1].name} {step} {source}: {seconds:.2f}s (not counted)")
            for source in sources if args.latency > 0 else []:  # the first foreachBatch query is slow too
                lat = latency(spark, source, bootstrap, work, LATENCY_RATE, WARMUP_LATENCY_SECONDS)
                log(f"warm-up latency {source}: median {statistics.median(lat) * 1000:.0f} ms (not counted)")
        for r in range(args.rounds):
            for d in sets if not args.no_executor_read else []:  # the executor read alone, columnar and rows
                for label, columnar in (("executor read, columnar", True), ("executor read, rows", False)):
                    rate = executor_read(bootstrap, d.topic, d.partitions, d.records, columnar)
                    results.setdefault((d.name, label, "asyncconsumer"), []).append(rate)
                    log(f"round {r + 1} {d.name} {label} (no Spark): {rate:,.0f} rows/s")
            for d in sets:
                for step in steps:
                    for source in in_turn(sources, r):
                        seconds = run_step(spark, step, source, bootstrap, d, work, timings)
                        results.setdefault((d.name, step, source), []).append(d.records / seconds)
                        rate = d.records / seconds
                        log(f"round {r + 1} {d.name} {step} {source}: {rate:,.0f} rows/s ({seconds:.2f}s)")
        # The latency rounds come after every other: PySpark stops the idle workers of a worker pool
        # that had no task for a minute (its planners' too), and a query after a latency round
        # started new ones (importing PySpark, pyarrow and asyncconsumer again: 2.5 s more, measured).
        for r in range(args.rounds if args.latency > 0 else 0):
            for source in in_turn(sources, r):
                lat = latency(
                    spark, source, bootstrap, work, LATENCY_RATE, args.latency, timings if source != "kafka" else None
                )
                latencies.setdefault(source, []).extend(lat)
                log(f"round {r + 1} latency {source}: median {statistics.median(lat) * 1000:.0f} ms of {len(lat)}")
        where = args.master + (f" = {master}" if master != args.master else "")
        zips = "its zips precompiled" if is_precompiled() else "as installed"
        print(
            f"\nApache Kafka {broker.version}, PySpark {pyspark.__version__} ({where}; {zips}), {package}; "
            f"{args.rounds} interleaved rounds after {args.warmup} warm-up; rows/s median (min-max); "
            "identical rows checked by hash"
            + "".join(f"; both sources with {k}={v}" for k, v in KAFKA_OPTIONS.items())
            + "\n"
        )
        print("| topic | step | source | rows/s | Spark Kafka source rows/s | ratio |")
        print("|---|---|---|---:|---:|---:|")
        for d in sets:
            for step in steps:
                theirs = results[(d.name, step, "kafka")]
                for variant in ("asyncconsumer", KEPT) if args.kept else ("asyncconsumer",):
                    ours = results[(d.name, step, variant)]
                    print(
                        f"| {d.describe()} | {step} | {variant} | {statistics.median(ours):,.0f} "
                        f"({min(ours):,.0f}-{max(ours):,.0f}) | "
                        f"{statistics.median(theirs):,.0f} ({min(theirs):,.0f}-{max(theirs):,.0f}) | "
                        f"{statistics.median(ours) / statistics.median(theirs):.2f}x |"
                    )
        if latencies:
            print(
                f"\nProduce-to-sink latency of a continuously running query (default trigger, foreachBatch sink), "
                f"{LATENCY_RATE:,} records/s of 100 B, {args.latency:.0f} s a round, all rounds together:\n"
            )
            print("| source | records | p50 ms | p90 ms | p99 ms | max ms |")
            print("|---|---:|---:|---:|---:|---:|")
            for source, lat in latencies.items():
                q = statistics.quantiles(lat, n=100)
                print(
                    f"| {source} | {len(lat):,} | {q[49] * 1000:.0f} | {q[89] * 1000:.0f} | {q[98] * 1000:.0f} | "
                    f"{max(lat) * 1000:.0f} |"
                )
        if args.no_executor_read:
            return
        print("\nThe source's executor read alone (read_range in one process, partition after partition, no Spark):\n")
        print("| topic | path | rows/s |")
        print("|---|---|---:|")
        for d in sets:
            for label in ("executor read, columnar", "executor read, rows"):
                rates = results[(d.name, label, "asyncconsumer")]
                spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
                print(f"| {d.describe()} | {label} | {statistics.median(rates):,.0f} ({spread}) |")
    finally:
        if spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
