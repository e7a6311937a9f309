"""A dead-letter topic for records that cannot be deserialized, written with confluent-kafka.

    python examples/dead_letter.py --bootstrap 127.0.0.1:9092 --topic orders --group billing \\
        [--dead-letter orders.dead-letter] [--max-records N] [--session-timeout-ms MS]

The consumer reads JSON orders.  A record that is not JSON does not stop it: its
``on_deserialization_error`` handler gets the record as it was fetched (key and value as bytes)
and the error, and writes the record to the dead-letter topic with confluent-kafka's
``Producer``, with headers saying where it came from and why, waiting for the broker's
acknowledgement.  Then the consumer goes on past it, and its commits include it.  If the handler
raises (the dead-letter topic cannot be written), the consumer raises
``RecordDeserializationError`` and stays at that record: nothing is skipped without being written.

Needs confluent-kafka (``pip install confluent-kafka``).  The dead-letter topic must exist, or the
brokers must create topics on first use.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
from confluent_kafka import KafkaError, Producer

from asyncconsumer import Consumer, ConsumerRecord, RecordDeserializationError


class DeadLetterError(Exception):
    """The dead-letter topic did not take the record."""


class DeadLetters:
    """``on_deserialization_error=DeadLetters(producer, topic)``: each record that cannot be
    deserialized goes to ``topic``, unchanged, with ``dead-letter.*`` headers added."""

    def __init__(self, producer: Producer, topic: str, timeout: float = 30.0) -> None:
        self.producer = producer
        self.topic = topic
        self.timeout = timeout
        self.written = 0

    async def __call__(self, record: ConsumerRecord[bytes, bytes], error: RecordDeserializationError) -> None:
        headers = [
            *record.headers,
            ("dead-letter.topic", record.topic.encode()),
            ("dead-letter.partition", str(record.partition).encode()),
            ("dead-letter.offset", str(record.offset).encode()),
            ("dead-letter.error", f"{error.field}: {error.__cause__!r}".encode()),
        ]
        # confluent-kafka's calls block: they run in a thread, so the event loop (heartbeats,
        # fetches) goes on meanwhile.
        await anyio.to_thread.run_sync(self._write, record.key, record.value, headers)
        self.written += 1

    def _write(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> None:
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(err)

        self.producer.produce(self.topic, key=key, value=value, headers=headers, on_delivery=delivered)
        if self.producer.flush(self.timeout) or failures:
            raise DeadLetterError(f"the dead-letter topic {self.topic!r} did not take the record: {failures}")


async def consume(bootstrap: str, topic: str, group: str, dead_letter: str, max_records: int | None,
                  session_timeout_ms: int = 45000) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    dead_letters = DeadLetters(producer, dead_letter)
    consumer: Consumer[bytes, dict[str, Any]] = Consumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        value_deserializer=json.loads,
        on_deserialization_error=dead_letters,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=min(3000, session_timeout_ms // 10),
    )
    done = 0
    async with consumer:
        consumer.subscribe([topic])
        async for batch in consumer.batches():
            for record in batch:
                print(f"{record.topic}-{record.partition}@{record.offset}: {json.dumps(record.value)}", flush=True)
            done += len(batch)
            await consumer.commit()  # what was processed, and the dead letters before it
            if max_records is not None and done >= max_records:
                break
    print(f"{done} records processed, {dead_letters.written} sent to {dead_letter!r}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Read JSON records; send those that are not JSON to a dead-letter topic.")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--dead-letter", help="the dead-letter topic (default: TOPIC.dead-letter)")
    parser.add_argument("--max-records", type=int, help="stop after this many records (default: run until stopped)")
    parser.add_argument("--session-timeout-ms", type=int, default=45000,
                        help="how soon the group gives this member's partitions to others if it stops (default 45000)")
    args = parser.parse_args(argv)
    anyio.run(consume, args.bootstrap, args.topic, args.group, args.dead_letter or f"{args.topic}.dead-letter",
              args.max_records, args.session_timeout_ms)


if __name__ == "__main__":
    main()
