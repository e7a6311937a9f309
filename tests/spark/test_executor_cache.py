"""The executors' consumer cache: a Python worker's next task reuses the consumer of the last one.

The tasks are run here as Spark's Python worker runs them (``read_range`` one after another in one
process) against the test broker; the Spark test at the end checks that the workers of a real
streaming query did reuse their consumers and still wrote every record exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncconsumer import TopicPartition
from asyncconsumer.errors import ConfigError
from asyncconsumer.spark import executor as src
from asyncconsumer.spark import parse_options
from asyncconsumer.spark.driver import driver_consumer
from asyncconsumer.spark.options import SourceOptions
from asyncconsumer.spark.plan import OffsetRange

pytestmark = pytest.mark.spark


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[src.ExecutorConsumers]:
    """A fresh process cache for the test (read_range uses the module's), closed after it."""
    fresh = src.ExecutorConsumers()
    monkeypatch.setattr(src, "EXECUTOR_CONSUMERS", fresh)
    yield fresh
    fresh.close()


def options(bootstrap: str, topic: str, **extra: str) -> SourceOptions:
    """The source's options, with consumers kept 5 minutes unless ``extra`` says otherwise."""
    given = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "consumerCacheTimeout": "5m", **extra}
    return parse_options(given, streaming=True)


def task(opts: SourceOptions, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
    """One Spark task: (partition, offset, value) of every row ``read_range`` returns."""
    rows: list[tuple[int, int, bytes]] = []
    for batch in src.read_range(opts, OffsetRange(TopicPartition(topic, partition), start, end)):
        columns = batch.to_pydict()
        rows.extend(zip(columns["partition"], columns["offset"], columns["value"], strict=True))
    return rows


def expected(partition: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
    return [(partition, o, b"p%d-%d" % (partition, o)) for o in range(start, end)]


@pytest.fixture
def topic(new_topic: Callable[..., str], produce: Callable[..., Any]) -> str:
    name = new_topic(2)
    produce(name, [(p, None, b"p%d-%d" % (p, o)) for o in range(300) for p in (0, 1)])
    return name


def test_next_task_with_the_same_options_reuses_the_consumer(
    cache: src.ExecutorConsumers, bootstrap: str, topic: str
) -> None:
    opts = options(bootstrap, topic)
    assert task(opts, topic, 0, 0, 100) == expected(0, 0, 100)
    assert (cache.created, cache.reused, cache.idle) == (1, 0, 1)  # kept, idle, after the task
    # the next micro-batch of the same partition, another partition, going back, a gap: exact each time
    assert task(opts, topic, 0, 100, 250) == expected(0, 100, 250)
    assert task(opts, topic, 1, 0, 300) == expected(1, 0, 300)
    assert task(opts, topic, 0, 50, 60) == expected(0, 50, 60)
    assert task(opts, topic, 1, 299, 300) == expected(1, 299, 300)
    # options that are not the consumer's (headers, failOnDataLoss) share it too
    assert task(options(bootstrap, topic, includeHeaders="true", failOnDataLoss="false"), topic, 0, 0, 5) == expected(
        0, 0, 5
    )
    assert (cache.created, cache.reused, cache.idle) == (1, 5, 1)


def test_changed_kafka_option_gets_its_own_consumer(cache: src.ExecutorConsumers, bootstrap: str, topic: str) -> None:
    plain = options(bootstrap, topic)
    other = options(bootstrap, topic, **{"kafka.client.id": "another-client"})
    assert task(plain, topic, 0, 0, 10) == expected(0, 0, 10)
    assert task(other, topic, 0, 0, 10) == expected(0, 0, 10)
    assert (cache.created, cache.reused, cache.idle) == (2, 0, 2)
    assert task(other, topic, 1, 0, 10) == expected(1, 0, 10)
    assert task(plain, topic, 1, 10, 20) == expected(1, 10, 20)
    assert (cache.created, cache.reused, cache.idle) == (2, 2, 2)


def test_cache_timeout_zero_closes_each_tasks_consumer(
    cache: src.ExecutorConsumers, bootstrap: str, topic: str
) -> None:
    opts = options(bootstrap, topic, consumerCacheTimeout="0")
    assert task(opts, topic, 0, 0, 10) == expected(0, 0, 10)
    assert task(opts, topic, 0, 10, 20) == expected(0, 10, 20)
    assert (cache.created, cache.reused, cache.idle) == (2, 0, 0)
    # without the option a consumer is kept (5 minutes, as Spark), and a task with a timeout of 0
    # does not take one another query's tasks left
    default = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    assert default.consumer_cache_timeout_ms == 300_000
    assert task(default, topic, 0, 20, 30) == expected(0, 20, 30)
    assert (cache.created, cache.reused, cache.idle) == (3, 0, 1)
    assert task(options(bootstrap, topic), topic, 1, 0, 10) == expected(1, 0, 10)
    assert (cache.created, cache.reused, cache.idle) == (3, 1, 1)
    assert task(opts, topic, 1, 10, 20) == expected(1, 10, 20)
    assert (cache.created, cache.reused, cache.idle) == (4, 1, 1)


def test_a_task_stopped_early_or_failing_closes_its_consumer(
    cache: src.ExecutorConsumers, bootstrap: str, topic: str
) -> None:
    opts = options(bootstrap, topic)
    assert task(opts, topic, 0, 0, 10) == expected(0, 0, 10)
    session = cache.acquire(opts)
    assert session.started and cache.reused == 1
    cache.release(opts, session)
    # Spark stops reading (a limit): the generator is closed half-way; the consumer is not kept
    small = src.read_range(opts, OffsetRange(TopicPartition(topic, 0), 0, 300))
    assert next(small).num_rows > 0
    small.close()
    assert cache.idle == 0 and not session.started
    # a range past the end of the log fails (no records within pollTimeoutMs): not kept either
    strict = options(bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "200"})
    with pytest.raises(TimeoutError, match="no records from"):
        task(strict, topic, 1, 300, 310)
    assert cache.idle == 0
    assert task(opts, topic, 1, 0, 10) == expected(1, 0, 10)  # a new one, exact
    assert (cache.created, cache.idle) == (3, 1)


def test_idle_consumers_expire_and_close() -> None:
    now = [0.0]
    cache = src.ExecutorConsumers(clock=lambda: now[0], capacity=2)
    opts = parse_options({"kafka.bootstrap.servers": "localhost:9", "subscribe": "t", "consumerCacheTimeout": "30s"})
    sessions = [_FakeSession() for _ in range(3)]
    for s in sessions[:2]:
        cache.release(opts, s)  # type: ignore[arg-type]
    assert cache.idle == 2 and not any(s.closed for s in sessions)
    now[0] = 10.0
    cache.release(opts, sessions[2])  # type: ignore[arg-type]
    assert sessions[0].closed and cache.idle == 2  # over capacity: the least recently returned goes
    now[0] = 29.9
    assert cache.expire() == 0
    now[0] = 30.0
    assert cache.expire() == 1 and sessions[1].closed and not sessions[2].closed
    assert cache.acquire(opts) is sessions[2]  # still fresh (returned at 10 s)
    cache.release(opts, sessions[2])  # type: ignore[arg-type]
    cache.close()
    assert sessions[2].closed and cache.idle == 0


class _FakeSession:
    """Stands in for a started ConsumerSession in the bookkeeping test (no broker)."""

    def __init__(self) -> None:
        self.closed = False

    @property
    def started(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def test_the_evictor_thread_closes_an_idle_consumer(cache: src.ExecutorConsumers, bootstrap: str, topic: str) -> None:
    opts = options(bootstrap, topic, consumerCacheTimeout="300ms")
    assert task(opts, topic, 0, 0, 10) == expected(0, 0, 10)
    session = cache.acquire(opts)
    assert session.started
    cache.release(opts, session)
    deadline = time.monotonic() + 10
    while cache.idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.idle == 0 and not session.started  # closed by the evictor, nobody asking


def test_streaming_query_with_kept_consumers_writes_every_record_once(
    spark: Any, bootstrap: str, produce: Callable[..., Any], tmp_path: Path
) -> None:
    """A real query with the cache on: micro-batches of 4 partitions on 2 Python workers (whose
    tasks take the consumers the earlier tasks left), every record written exactly once."""
    from support.producer import create_topic

    from .test_streaming import run_available_now, written

    name = create_topic(bootstrap, f"cache-{uuid.uuid4().hex[:8]}", 4)
    values = [b"v%d" % i for i in range(4000)]
    placed = produce(name, [(i % 4, None, v) for i, v in enumerate(values)])
    out = tmp_path / "out"
    options = {
        "subscribe": name,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "1000",
        "consumerCacheTimeout": "5m",
    }
    assert len(run_available_now(spark, bootstrap, out, tmp_path / "checkpoint", **options)) >= 4
    assert written(spark, out) == Counter((name, p, o, v) for (p, o), v in zip(placed, values, strict=True))
    # Which Python worker ran which task is Spark's business (its RDD workers are another pool, so
    # the cache counts cannot be read back from a worker here): the reuse itself is proven by the
    # tests above, which run read_range as a worker does.


def test_fetch_waits_of_the_driver_and_executor_consumers() -> None:
    """The driver's watermark probe and an executor wait at most 5 ms (only past the log's or the
    range's end), so a latest() is quick and a kept consumer's next task never queues behind a
    long poll."""
    opts = parse_options({"kafka.bootstrap.servers": "localhost:9", "subscribe": "t"})
    assert driver_consumer(opts).config.fetch_max_wait_ms == 5
    assert src.executor_consumer(opts).config.fetch_max_wait_ms == 5
    quick = parse_options({"kafka.bootstrap.servers": "localhost:9", "subscribe": "t", "kafka.fetch.max.wait.ms": "2"})
    assert src.executor_consumer(quick).config.fetch_max_wait_ms == 2
    assert driver_consumer(quick).config.fetch_max_wait_ms == 2


def _fetched(cache: src.ExecutorConsumers, opts: SourceOptions) -> tuple[int, int]:
    """(records bytes of all fetch responses, of the largest) of the consumer ``opts``'s last task kept."""
    session = cache.acquire(opts)
    try:

        async def sizes(consumer: Any) -> tuple[int, int]:
            fetch = consumer.metrics().fetch
            return int(fetch.response_bytes), int(fetch.response_bytes_max)

        return session.run(sizes)
    finally:
        cache.release(opts, session)


@pytest.mark.broker_feature("partition_max_bytes")
def test_an_executor_fetches_its_range_in_large_pieces_unless_told_otherwise(
    cache: src.ExecutorConsumers, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """A task reads one partition's range at a time: with the Java default of 1 MiB per partition a
    fetch, 3 MiB took at least three round trips; the executors ask for up to 8 MiB unless
    ``kafka.max.partition.fetch.bytes`` says otherwise."""
    name = new_topic(1)
    value = b"v" * 1024
    produce(name, [(0, None, value)] * 3000)
    rows = task(options(bootstrap, name), name, 0, 0, 3000)
    assert [offset for _, offset, _ in rows] == list(range(3000))
    assert _fetched(cache, options(bootstrap, name))[1] > 2 * 1024 * 1024
    told = options(bootstrap, name, **{"kafka.max.partition.fetch.bytes": str(1024 * 1024)})
    assert len(task(told, name, 0, 0, 3000)) == 3000
    assert _fetched(cache, told)[1] <= 1024 * 1024


@pytest.mark.broker_feature("partition_max_bytes")
def test_a_slow_task_fetches_at_most_one_fetch_past_its_range(
    cache: src.ExecutorConsumers, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """A consumer reads ahead while Spark is busy with what it got.  Past the range's end that is
    waste (dropped when the task ends), so the range's end is the consumer's ``fetch_until()``: only
    the fetch that reached it goes past.  Without it, this task fetched the whole 80 MiB partition
    with the consumer's default 64 MiB buffer, and 32 MiB with the executors' 16 MiB."""
    name = new_topic(1)
    value = b"v" * (16 * 1024)
    produce(name, [(0, None, value)] * 5000)  # 80 MiB
    opts = options(bootstrap, name)
    got = 0
    for batch in src.read_range(opts, OffsetRange(TopicPartition(name, 0), 0, 500)):  # 8 MiB
        got += batch.num_rows
        time.sleep(0.5)  # Spark writing what it got
    assert got == 500
    total, _ = _fetched(cache, opts)
    assert total <= (8 + 8 + 1) * 1024 * 1024  # the range, and the 8 MiB fetch that reached its end


@pytest.mark.parametrize(
    ("given", "sizes"),
    [
        ({}, (8 << 20, 16 << 20)),
        # the user's buffer is kept, and a partition fetch fits in it
        ({"kafka.fetch.buffer.bytes": str(4 << 20)}, (4 << 20, 4 << 20)),
        ({"kafka.fetch.buffer.bytes": str(100 << 20)}, (8 << 20, 100 << 20)),
        # the user's partition fetch is kept, and the buffer stays two fetches (not the 64 MiB default)
        ({"kafka.max.partition.fetch.bytes": str(1 << 20)}, (1 << 20, 16 << 20)),
        ({"kafka.max.partition.fetch.bytes": str(32 << 20)}, (32 << 20, 64 << 20)),
        # snake_case spellings, as from_properties takes them, are the user's too
        (
            {"kafka.max_partition_fetch_bytes": str(2 << 20), "kafka.fetch_buffer_bytes": str(3 << 20)},
            (2 << 20, 3 << 20),
        ),
    ],
)
def test_an_executors_fetch_sizes_keep_what_the_user_gave(given: dict[str, str], sizes: tuple[int, int]) -> None:
    """What the user gives of ``max.partition.fetch.bytes`` and ``fetch.buffer.bytes`` is kept; what
    they leave open is 8 MiB a fetch and a buffer of two fetches (16 MiB at least)."""
    opts = parse_options({"kafka.bootstrap.servers": "localhost:9", "subscribe": "t", **given})
    config = src.executor_consumer(opts).config
    assert (config.max_partition_fetch_bytes, config.fetch_buffer_bytes) == sizes


def test_an_executors_fetch_size_that_is_not_a_number_is_named() -> None:
    opts = parse_options({"kafka.bootstrap.servers": "localhost:9", "subscribe": "t"})
    # parse_options checks the kafka.* options already; the executor's sizes must not hide a bad one
    bad = dataclasses.replace(opts, kafka_params=(*opts.kafka_params, ("max.partition.fetch.bytes", "8M")))
    with pytest.raises(ConfigError, match="max_partition_fetch_bytes"):
        src.executor_consumer(bad)


#: A Python process that imports the source as a worker's first task does: as one forked by PySpark's
#: daemon (its ``__main__``) when ``AS_DAEMON`` is set.  Prints the objects frozen and still tracked.
WORKER = """
import gc, importlib.machinery, json, os, sys
if os.environ.get("AS_DAEMON"):
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("pyspark.daemon", None)
import asyncconsumer.spark.source
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def _worker_heap(**env: str) -> dict[str, int]:
    environ = {k: v for k, v in os.environ.items() if k not in ("AS_DAEMON", "SPARK_REUSE_WORKER")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER], env={**environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    heap: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return heap


def test_a_reused_worker_leaves_its_imports_out_of_the_collection_after_each_task() -> None:
    """PySpark's daemon runs a full gc.collect() in a reused worker after every task; the source's
    import freezes what the worker has imported, so that collection scans only what was made since
    (a twentieth of it or less), and nothing is frozen anywhere else: not in a worker used once, not
    in the driver's or any other Python process."""
    reused = _worker_heap(AS_DAEMON="1", SPARK_REUSE_WORKER="1")
    assert reused["frozen"] > 20_000  # PySpark's, pyarrow's and asyncconsumer's objects
    assert reused["tracked"] * 20 < reused["frozen"]
    used_once = _worker_heap(AS_DAEMON="1")
    assert used_once["frozen"] == 0 and used_once["tracked"] > 20_000
    assert _worker_heap(SPARK_REUSE_WORKER="1")["frozen"] == 0
