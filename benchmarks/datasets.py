"""The benchmark data sets and their production (with confluent-kafka, an independent client)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

PARTITIONS = 4
KEY_SIZE = 10


@dataclass(frozen=True)
class Dataset:
    name: str
    topic: str
    records: int
    value_size: int
    compression: str = "none"
    partitions: int = PARTITIONS

    @property
    def payload_bytes(self) -> int:
        """Key and value bytes of the whole data set (what MB/s counts)."""
        return self.records * (KEY_SIZE + self.value_size)

    def describe(self) -> str:
        size = f"{self.value_size} B" if self.value_size < 1024 else f"{self.value_size // 1024} KiB"
        codec = "" if self.compression == "none" else f", {self.compression}"
        return f"{self.records:,} x {size} values, {KEY_SIZE} B keys, {self.partitions} partitions{codec}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def standard(quick: bool) -> list[Dataset]:
    """The issue's data sets; ``quick`` shrinks them for development and CI."""
    if quick:
        return [
            Dataset("100B", "bench-100b", 40_000, 100),
            Dataset("1KiB", "bench-1kib", 8_000, 1024),
            Dataset("100B-lz4", "bench-100b-lz4", 40_000, 100, "lz4"),
        ]
    return [
        Dataset("100B", "bench-100b", 1_000_000, 100),
        Dataset("1KiB", "bench-1kib", 200_000, 1024),
        Dataset("100B-lz4", "bench-100b-lz4", 1_000_000, 100, "lz4"),
    ]


def memory_dataset(quick: bool) -> Dataset:
    """The backlog of the memory benchmark: 1 GiB of 1 KiB records (quick: 16 MiB)."""
    if quick:
        return Dataset("memory-1KiB", "bench-memory", 16_000, 1024)
    return Dataset("memory-1KiB", "bench-memory", 1_000_000, 1024)


def sample_values(size: int, count: int = 1024) -> list[bytes]:
    """Distinct JSON-like values of exactly ``size`` bytes: compressible like real events, not trivially."""
    rng = random.Random(size)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    out = []
    for i in range(count):
        head = (
            f'{{"id":{rng.randrange(10**9)},"user":"user-{rng.randrange(10_000)}",'
            f'"amount":{rng.randrange(100_000) / 100},"ts":{1_700_000_000_000 + i},"tags":"'
        )
        body = head
        while len(body) < size - 2:
            body += rng.choice(words) + " "
        out.append((body[: size - 2] + '"}').encode())
    return out


def create_topics(bootstrap: str, datasets: list[Dataset]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(d.topic, d.partitions, 1) for d in datasets], operation_timeout=30)
    for future in futures.values():
        future.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=5)
        if all(d.topic in md.topics and len(md.topics[d.topic].partitions) == d.partitions for d in datasets):
            return
        time.sleep(0.05)
    raise TimeoutError("benchmark topics did not appear in metadata")


def _producer(bootstrap: str, dataset: Dataset, queued: int = 1_000_000) -> Any:
    """confluent-kafka's producer for ``dataset``: acks=all, librdkafka's default batching, room for
    ``queued`` records (and 1 GiB) in its queue."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": dataset.compression,
            "acks": "all",
            "queue.buffering.max.messages": queued,
            "queue.buffering.max.kbytes": 1_048_576,
            "log_level": 3,
        }
    )


def _message(i: int, values: list[bytes], partitions: int) -> dict[str, Any]:
    """Record ``i`` of a data set: a 10-byte key, the next of ``values`` in turn, round-robin partitions."""
    return {"key": b"%010d" % i, "value": values[i % len(values)], "partition": i % partitions}


class _Deliveries:
    """confluent-kafka's delivery reports of one production (``on_delivery``): the failures, checked
    once everything is flushed."""

    def __init__(self, dataset: Dataset) -> None:
        self._name = dataset.name
        self._failures: list[str] = []

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failures.append(str(err))

    def flush(self, producer: Any) -> None:
        left = producer.flush(300)
        if left or self._failures:
            raise RuntimeError(f"producing {self._name}: {left} undelivered, failures: {self._failures[:3]}")


def produce(bootstrap: str, dataset: Dataset) -> float:
    """Produce ``dataset`` (records spread round-robin over its partitions); returns the seconds taken.

    confluent-kafka with librdkafka's default batching (batch.size 1 MB, linger.ms 5) and acks=all.
    """
    producer = _producer(bootstrap, dataset)
    deliveries = _Deliveries(dataset)
    values = sample_values(dataset.value_size)
    started = time.perf_counter()
    parts = dataset.partitions
    for i in range(dataset.records):
        while True:
            try:
                producer.produce(dataset.topic, **_message(i, values, parts), on_delivery=deliveries)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    deliveries.flush(producer)
    return time.perf_counter() - started


def produce_batched(
    bootstrap: str, dataset: Dataset, chunk: int = 10_000, started: Callable[[], None] = lambda: None
) -> float:
    """:func:`produce`'s records (the same keys, values and partitions) through confluent-kafka's
    ``produce_batch``, ``chunk`` records a call: at 100 B twice the rate of a ``produce()`` call
    per record (1,000,000 in 3.5 s against 7.3 s here; at 1 KiB both are bound by the broker), so
    that a consumer reading while they arrive is held back by the producer as little as can be.  The
    messages are built first; ``started`` is called just before the first is produced.  Returns
    the seconds from then until all were delivered."""
    producer = _producer(bootstrap, dataset, queued=dataset.records + chunk)
    deliveries = _Deliveries(dataset)
    values = sample_values(dataset.value_size)
    parts = dataset.partitions
    chunks = [
        [_message(i, values, parts) for i in range(first, min(first + chunk, dataset.records))]
        for first in range(0, dataset.records, chunk)
    ]
    started()
    began = time.perf_counter()
    for messages in chunks:
        queued = producer.produce_batch(dataset.topic, messages, on_delivery=deliveries)
        if queued != len(messages):
            raise RuntimeError(f"producing {dataset.name}: {queued} of {len(messages)} records queued")
        producer.poll(0)
    deliveries.flush(producer)
    return time.perf_counter() - began
