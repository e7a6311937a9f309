"""The long-running worker: minutes of rebalances and cut connections, and nothing leaks or is lost.

On a private Apache Kafka whose every connection goes through a chaos proxy (the broker advertises
the proxy, as in test_storm_chaos.py), confluent-kafka produces 2,000 records a second (a process of
its own) to 6 partitions while one member, the worker measured here, reads them all along.  Around
it, for :data:`CHURN` seconds (``ASYNCCONSUMER_SOAK_SECONDS``, 180 by default): every 3-6 s the proxy
cuts every connection, and every few seconds a member joins and goes: in this process, one that
reads a while and closes; in another process (``support/storm_member.py``), one that is SIGKILLed
or leaves.  Then :data:`CALM` seconds with the producer alone, longer than the buffer pools' idle
age (``engine.buffers.IDLE_AFTER``).

The worker's process is sampled every second: open fds, asyncio tasks, OS threads, RSS, and the
worker's frame pool (``metrics().buffers.frames.held_bytes``).  The *steady level* is the median of
the last 10 s of a warm-up before the churn; the *end level*, of the last 10 s of the calm.  It must
hold that fds, tasks and threads end where they started (every member in this process closed), the
pool and the RSS come back near their steady level (what the catch-ups after each rebalance took is
given back), and no record is lost: every record delivered to the producer was read by some member.
``@pytest.mark.long``: ``./dev nox -s long`` (or ``-m long``) runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from groups.test_storm_chaos import kafka_behind_proxy
from support.broker import backend_names_from_env
from support.paths import SUPPORT
from support.producer import create_topic

from asyncconsumer import Consumer

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.long]

CHURN = float(os.environ.get("ASYNCCONSUMER_SOAK_SECONDS", "180"))
WARM_UP = 40.0
CALM = 60.0
RATE, VALUE_SIZE, PARTITIONS = 2000, 200, 6
MiB = 1 << 20
MEMBER = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100,
          "retry_backoff_ms": 50, "request_timeout_ms": 10000, "reconnect_backoff_ms": 20,
          "auto_offset_reset": "earliest", "auto_commit_interval_ms": 1000}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sample:
    def __init__(self, at: float, pool: int) -> None:
        self.at = at
        self.fds = len(os.listdir("/proc/self/fd"))
        self.tasks = len(asyncio.all_tasks())
        self.threads = len(os.listdir("/proc/self/task"))
        self.rss = rss()
        self.pool = pool


class Seen:
    """The offsets read, a byte per offset and partition: the record of half a million reads must not
    be what the RSS measures (a set of tuples would be 50 MiB and seconds of garbage collection)."""

    def __init__(self) -> None:
        self.partitions: dict[int, bytearray] = {}

    def add(self, partition: int, offset: int) -> None:
        seen = self.partitions.setdefault(partition, bytearray())
        if offset >= len(seen):
            seen.extend(bytes(max(offset + 1 - len(seen), 1 << 16)))
        seen[offset] = 1

    def update(self, reads: Any) -> None:
        for partition, offset in reads:
            self.add(partition, offset)

    def missing(self, records: Any) -> list[tuple[int, int]]:
        empty = bytearray()
        return [(p, o) for p, o in records if not (o < len(seen := self.partitions.get(p, empty)) and seen[o])]


def level(samples: list[Sample], since: float, until: float, name: str) -> float:
    return statistics.median(getattr(s, name) for s in samples if since <= s.at <= until)


class Killable:
    """A member in a process of its own (``support/storm_member.py``), reading with ``getmany``."""

    def __init__(self, index: int, tmp: Path, base: dict[str, Any]) -> None:
        self.out = tmp / f"p{index}.out"
        self.stop = tmp / f"p{index}.stop"
        cfg = {**base, "api": "getmany", "backend": "asyncio", "out": str(self.out), "stop": str(self.stop),
               "leader": str(tmp / f"p{index}.leader"), "delay": 0.0005}
        self.proc = subprocess.Popen([sys.executable, str(SUPPORT / "storm_member.py"), json.dumps(cfg)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def reads(self) -> list[tuple[int, int]]:
        if not self.out.exists():
            return []
        rows = (line.split() for line in self.out.read_text().splitlines())
        return [(int(row[0]), int(row[1])) for row in rows if len(row) == 3]  # a SIGKILL may cut the last line


@pytest.mark.timeout(CHURN + 600)
async def test_minutes_of_rebalances_and_cuts_leak_nothing_and_give_memory_back(tmp_path: Path) -> None:
    if "kafka" not in backend_names_from_env():
        pytest.skip("ASYNCCONSUMER_TEST_BROKER leaves Apache Kafka out")
    rng = random.Random(int(os.environ.get("ASYNCCONSUMER_CHAOS_SEED", "51")))
    async with kafka_behind_proxy() as pb:
        topic = await anyio.to_thread.run_sync(create_topic, pb.bootstrap, f"soak-{rng.getrandbits(32):08x}",
                                               PARTITIONS)
        group = f"g-{topic}"
        delivered_file, stop_file = tmp_path / "delivered", tmp_path / "producer.stop"
        producer = subprocess.Popen([sys.executable, str(SUPPORT / "soak_producer.py"), pb.bootstrap, topic,  # noqa: ASYNC220
                                     str(PARTITIONS), str(RATE), str(VALUE_SIZE), str(delivered_file),
                                     str(stop_file)])
        read = Seen()
        samples: list[Sample] = []
        killables: list[Killable] = []
        figures = {"cuts": 0, "joined": 0, "killed": 0, "left": 0}
        start = time.monotonic()
        try:
            async with Consumer(bootstrap_servers=pb.bootstrap, group_id=group, **MEMBER) as worker:
                worker.subscribe([topic])
                done = anyio.Event()

                async def work() -> None:
                    async for record in worker:
                        read.add(record.partition, record.offset)
                        if done.is_set():
                            return

                async def sample() -> None:
                    while True:
                        samples.append(Sample(time.monotonic() - start, worker.metrics().buffers.frames.held_bytes))
                        await anyio.sleep(1.0)

                async def visitor(seconds: float) -> None:
                    """A member in this process: joins, reads a while, closes."""
                    async with Consumer(bootstrap_servers=pb.bootstrap, group_id=group, **MEMBER) as c:
                        c.subscribe([topic])
                        with anyio.move_on_after(seconds):
                            while True:
                                for records in (await c.getmany(timeout=0.5)).values():
                                    read.update((r.partition, r.offset) for r in records)

                async def churn() -> None:
                    async with anyio.create_task_group() as visitors:
                        end = time.monotonic() + CHURN
                        next_cut = time.monotonic() + rng.uniform(3, 6)
                        event = 0
                        while time.monotonic() < end:
                            await anyio.sleep(min(1.0, max(0.0, next_cut - time.monotonic())))
                            if time.monotonic() >= next_cut:
                                await pb.proxy.drop_all(reset=rng.random() < 0.5)
                                figures["cuts"] += 1
                                next_cut = time.monotonic() + rng.uniform(3, 6)
                            if time.monotonic() - start < WARM_UP + event * 8:
                                continue
                            kind = event % 3
                            event += 1
                            if kind == 0:
                                visitors.start_soon(visitor, rng.uniform(5, 15))
                                figures["joined"] += 1
                            else:
                                killables.append(Killable(len(killables), tmp_path, {
                                    "bootstrap": pb.bootstrap, "topic": topic, "group": group}))
                            # The process members of earlier events go: SIGKILL or a graceful leave.
                            for member in killables[:-1]:
                                if member.proc.poll() is None and not member.stop.exists():
                                    if kind == 1:
                                        member.proc.send_signal(signal.SIGKILL)
                                        figures["killed"] += 1
                                    else:
                                        member.stop.touch()
                                        figures["left"] += 1
                        for member in killables:
                            member.stop.touch()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(work)
                    tg.start_soon(sample)
                    await anyio.sleep(WARM_UP)
                    await churn()
                    churn_end = time.monotonic() - start
                    await anyio.sleep(CALM)
                    stop_file.touch()
                    await anyio.to_thread.run_sync(producer.wait, 90)
                    delivered = [(int(p), int(o)) for p, o in (
                        line.split() for line in delivered_file.read_text().splitlines())]
                    for member in killables:
                        read.update(member.reads())
                    with anyio.move_on_after(60):
                        while read.missing(delivered):  # noqa: ASYNC110
                            await anyio.sleep(0.5)
                    metrics = worker.metrics()
                    done.set()
                    tg.cancel_scope.cancel()
        finally:
            stop_file.touch()
            for member in killables:
                member.stop.touch()
            for proc in [producer, *(m.proc for m in killables)]:
                try:
                    await anyio.to_thread.run_sync(proc.wait, 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    for member in killables:
        read.update(member.reads())
    lost = read.missing(delivered)
    steady = (WARM_UP - 10, WARM_UP)
    end = (churn_end + CALM - 10, churn_end + CALM)
    levels = {name: (level(samples, *steady, name), max(getattr(s, name) for s in samples),
                     level(samples, *end, name)) for name in ("fds", "tasks", "threads", "rss", "pool")}
    report = (f"{len(set(delivered))} records in {time.monotonic() - start:.0f} s, {figures}, {len(lost)} lost; "
              f"loop lag max {metrics.loop.lag_max:.2f} s, pool released {metrics.buffers.frames.released_bytes} B; "
              + "; ".join(f"{n} steady {a:.0f} max {b:.0f} end {c:.0f}" for n, (a, b, c) in levels.items()))
    print(report)
    (tmp_path / "figures.txt").write_text(report)
    assert figures["cuts"] >= CHURN / 6 and figures["killed"] and figures["left"] and figures["joined"], report
    assert not lost, report
    fds, tasks, threads, memory, pool = (levels[n] for n in ("fds", "tasks", "threads", "rss", "pool"))
    assert fds[2] <= fds[0] + 2 and tasks[2] <= tasks[0] + 1 and threads[2] <= threads[0] + 1, report
    # What the catch-ups took is given back: the pool and the RSS end near their steady level.
    assert pool[2] <= pool[0] + 4 * MiB and pool[1] > pool[2], report
    assert memory[2] <= memory[0] + 12 * MiB, report
