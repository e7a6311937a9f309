"""Topic creation and test-data production with confluent-kafka (an independent, trusted client).

Topic creation and ``produce`` live in the package (``asyncconsumer.testing.producer``, also
behind the pytest plugin's fixtures); ``consume`` and ``Transactions`` are the suite's own.

These helpers are synchronous (librdkafka does its own I/O in background threads).  They block for
milliseconds on a local broker; call them through ``anyio.to_thread.run_sync`` if that matters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from asyncconsumer.testing.producer import (
    COMPRESSION_TYPES,
    ProduceError,
    admin_client,
    client_quiet,
    create_topic,
    produce,
    wait_for_topic,
)

__all__ = [
    "COMPRESSION_TYPES",
    "ProduceError",
    "Transactions",
    "admin_client",
    "consume",
    "create_topic",
    "produce",
    "wait_for_topic",
]


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    partitions: Iterable[int] | None = None,
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Read *count* records from the beginning of *topic* with confluent-kafka (a reference reader).

    Uses manual assignment (no consumer group).  Returns ``confluent_kafka.Message`` objects in
    arrival order (per-partition order is preserved).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "asyncconsumer-tests-reference-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **client_quiet(client_config),
        }
    )
    try:
        if partitions is None:
            md = consumer.list_topics(topic, timeout=timeout)
            partitions = sorted(md.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count - len(out), timeout=0.2):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                out.append(msg)
        if len(out) < count:
            raise TimeoutError(f"read {len(out)}/{count} records from {topic!r} in {timeout}s")
        return out
    finally:
        consumer.close()


class Transactions:
    """A confluent-kafka transactional producer (``transactional.id``) for one topic.

    ``begin()`` / ``send(...)`` / ``flush()`` / ``commit()`` / ``abort()``, in the order a test needs;
    ``send`` records ``(partition, offset)`` of each record once delivered (after a ``flush``, or the
    commit, which flushes).  ``with Transactions(...) as tx:`` closes the producer at the end.
    """

    def __init__(self, bootstrap: str, topic: str, *, transactional_id: str | None = None,
                 timeout: float = 30.0, client_config: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self.timeout = timeout
        self.delivered: list[tuple[int, int, bytes | None]] = []  # (partition, offset, value)
        self._failures: list[str] = []
        self._producer = Producer({
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"tx-{topic}-{time.monotonic_ns()}",
            "linger.ms": 5,
            "transaction.timeout.ms": 60000,
            **client_quiet(client_config),
        })
        self._producer.init_transactions(timeout)

    def __enter__(self) -> Transactions:
        return self

    def __exit__(self, *exc: object) -> None:
        self._producer.flush(self.timeout)
        del self._producer  # librdkafka's threads go now, not when the broker is long gone

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._failures.append(str(err))
        else:
            self.delivered.append((msg.partition(), msg.offset(), msg.value()))

    def begin(self) -> None:
        self._producer.begin_transaction()

    def send(self, partition: int, value: bytes, key: bytes | None = None) -> None:
        self._producer.produce(self.topic, value=value, key=key, partition=partition, on_delivery=self._on_delivery)
        self._producer.poll(0)

    def flush(self) -> None:
        """Send what is queued: it is in the log (and a batch of its own) when this returns."""
        if self._producer.flush(self.timeout):
            raise TimeoutError(f"transactional records to {self.topic!r} still undelivered after {self.timeout}s")
        self._check()

    def commit(self) -> None:
        self._producer.commit_transaction(self.timeout)
        self._producer.poll(0)
        self._check()

    def abort(self) -> None:
        self.flush()  # the records reach the log first: an abort of nothing written tests nothing
        self._producer.abort_transaction(self.timeout)

    def _check(self) -> None:
        if self._failures:
            raise ProduceError(f"{len(self._failures)} transactional record(s) failed: {self._failures[:3]}")
