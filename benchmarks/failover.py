"""Recovery after a leader kill: how long until records flow again (issue 13).

A three-node ``KafkaCluster``; per run a fresh one-partition topic (replication factor 3), a
producer thread (confluent-kafka, ``acks=all``, idempotent) writing ``--rate`` records/s whose
values carry their production time, and the consumers under test reading it at the same time,
each in its own group: asyncconsumer (an anyio task), confluent-kafka (a thread) and the Java
``KafkaConsumer`` (Kafka's own ``ConsoleConsumer`` in a JVM of its own, its output read line by line).  Once both
read, the partition's leader is SIGKILLed.  For each client, the recovery time is from the kill to
the first record *produced after the kill* that the client reads; the producer's own recovery (its
first delivery report after the kill) is printed too, since no consumer can read a record before
it is written.  The killed node is restarted and the cluster made whole before the next run.

    ./dev run python -m benchmarks.failover [--runs 5] [--rate 500]

The consumers' own share is the difference to the producer's time: a few tens of milliseconds
(their next fetch after the record is written) once they know the new leader.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import threading
import time
import uuid
from typing import Any

import anyio
from confluent_kafka import Consumer as LibrdkafkaConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from asyncconsumer import Consumer
from asyncconsumer.testing import KafkaCluster


def _admin(cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})


def _whole(cluster: KafkaCluster, timeout: float = 120.0) -> None:
    client = _admin(cluster)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(timeout=5)
        except Exception:  # a node still starting
            time.sleep(0.2)
            continue
        if len(md.brokers) == 3 and all(
            len(p.isrs) == len(p.replicas) and p.leader >= 0 for t in md.topics.values() for p in t.partitions.values()
        ):
            return
        time.sleep(0.2)
    raise TimeoutError("the cluster did not become whole")


def _leader(cluster: KafkaCluster, topic: str) -> int:
    md = _admin(cluster).list_topics(topic, timeout=10)
    return int(md.topics[topic].partitions[0].leader)


class _Producer(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.stop_event = threading.Event()
        self.delivered_at: list[float] = []

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 1, "message.timeout.ms": 120000, "log_level": 0})

        def report(err: Any, msg: Any) -> None:
            if err is None:
                self.delivered_at.append(time.time())

        begin, sent = time.monotonic(), 0
        while not self.stop_event.is_set():
            while sent < int((time.monotonic() - begin) * self.rate):
                producer.produce(self.topic, value=repr(time.time()).encode(), on_delivery=report)
                sent += 1
            producer.poll(0.002)
        producer.flush(60)


class _Librdkafka(threading.Thread):
    """confluent-kafka's consumer, its defaults but for the group and the offset reset."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop_event = threading.Event()
        self.read: list[tuple[float, float]] = []  # (produced at, read at)

    def run(self) -> None:
        consumer = LibrdkafkaConsumer({"bootstrap.servers": self.bootstrap, "group.id": f"rd-{self.topic}",
                                       "auto.offset.reset": "earliest", "log_level": 0})
        consumer.subscribe([self.topic])
        try:
            while not self.stop_event.is_set():
                for msg in consumer.consume(500, timeout=0.1):
                    if msg.error() is None:
                        self.read.append((float(msg.value() or 0), time.time()))
        finally:
            consumer.close()


class _Java(threading.Thread):
    """Kafka's ``ConsoleConsumer`` (a ``KafkaConsumer`` with its defaults) printing the values."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        super().__init__(daemon=True)
        self.read: list[tuple[float, float]] = []
        self.process = subprocess.Popen(
            cluster.java_command("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                                 cluster.bootstrap, "--topic", topic, "--group", f"java-{topic}", "--from-beginning"),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.read.append((float(line), time.time()))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


async def _asyncconsumer(bootstrap: str, topic: str, read: list[tuple[float, float]], stop: anyio.Event) -> None:
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"ac-{topic}", auto_offset_reset="earliest") as c:
        c.subscribe([topic])
        while not stop.is_set():
            for records in (await c.getmany(timeout=0.1)).values():
                now = time.time()
                read.extend((float(r.value or 0), now) for r in records)


def _recovery(read: list[tuple[float, float]], killed_at: float) -> float | None:
    after = [at for produced, at in read if produced > killed_at]
    return min(after) - killed_at if after else None


async def _run_once(cluster: KafkaCluster, rate: float) -> dict[str, float | None]:
    topic = f"failover-bench-{uuid.uuid4().hex[:8]}"
    client = _admin(cluster)
    client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])[topic].result(30)
    await anyio.to_thread.run_sync(_whole, cluster)
    producer = _Producer(cluster.bootstrap, topic, rate)
    librdkafka = _Librdkafka(cluster.bootstrap, topic)
    java = _Java(cluster, topic)
    ours: list[tuple[float, float]] = []
    stop = anyio.Event()
    producer.start()
    librdkafka.start()
    java.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_asyncconsumer, cluster.bootstrap, topic, ours, stop)
        with anyio.fail_after(60):
            while min(len(ours), len(librdkafka.read), len(java.read)) < rate:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        node = cluster.node(await anyio.to_thread.run_sync(_leader, cluster, topic))
        killed_at = time.time()
        await anyio.to_thread.run_sync(node.kill)
        with anyio.move_on_after(60):
            while any(_recovery(read, killed_at) is None for read in (ours, librdkafka.read, java.read)):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        stop.set()
    producer.stop_event.set()
    librdkafka.stop_event.set()
    await anyio.to_thread.run_sync(java.stop)
    await anyio.to_thread.run_sync(producer.join)
    await anyio.to_thread.run_sync(librdkafka.join)
    delivered = [t - killed_at for t in producer.delivered_at if t > killed_at]
    await anyio.to_thread.run_sync(node.launch)
    await anyio.to_thread.run_sync(cluster.wait_ready)
    await anyio.to_thread.run_sync(_whole, cluster)
    return {
        "producer": min(delivered) if delivered else None,
        "asyncconsumer": _recovery(ours, killed_at),
        "confluent-kafka": _recovery(librdkafka.read, killed_at),
        "java": _recovery(java.read, killed_at),
    }


CLIENTS = ("producer", "asyncconsumer", "confluent-kafka", "java")


def _summary(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    missing = len(values) - len(done)
    text = f"median {statistics.median(done):6.2f} s, worst {max(done):6.2f} s" if done else "no recovery"
    return text + (f" ({missing} runs never recovered within 60 s)" if missing else "")


async def _main(runs: int, rate: float) -> None:
    with KafkaCluster(3) as cluster:
        results: list[dict[str, float | None]] = []
        for index in range(runs):
            result = await _run_once(cluster, rate)
            results.append(result)
            print(f"run {index + 1}: " + ", ".join(
                f"{k} {v:.2f} s" if v is not None else f"{k} -" for k, v in result.items()), flush=True)
    print(f"\nrecovery after a leader kill, {runs} runs, {rate:g} records/s:")
    for client in CLIENTS:
        print(f"  {client:16} {_summary([r[client] for r in results])}")
    ours = [v for r in results if (v := r["asyncconsumer"]) is not None]
    for other in CLIENTS[2:]:
        theirs = [v for r in results if (v := r[other]) is not None]
        if ours and theirs:
            print(f"  asyncconsumer / {other} (medians): {statistics.median(ours) / statistics.median(theirs):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=float, default=500.0, help="records produced per second")
    args = parser.parse_args()
    anyio.run(_main, args.runs, args.rate)


if __name__ == "__main__":
    main()
