"""Exactly-once consume-transform-produce: asyncconsumer reads, confluent-kafka writes transactions.

    python exactly_once.py --bootstrap 127.0.0.1:9092 --input orders --output orders-enriched \\
        --group enricher --transactional-id enricher-1

Each batch a poll hands out becomes one transaction of confluent-kafka's producer: the transformed
records and the input offsets after the batch (``send_offsets_to_transaction`` with the consumer's
``group_metadata()``) are committed together, or not at all.  Readers of the output topic with
``isolation_level="read_committed"`` see every input record's output exactly once, however often
instances crash, restart or are fenced (docs/exactly-once.md).

Run as many instances as the input topic has partitions, each with a ``--transactional-id`` of its
own that it keeps across restarts: a restarted instance then aborts what its previous run left
open at once, instead of the broker waiting ``transaction.timeout.ms`` for it.  ``-X name=value``
sets a consumer property and ``-P name=value`` a producer property (Kafka's dotted names).
Ctrl-C or SIGTERM stops it between two transactions.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as OffsetToCommit

from asyncconsumer import Consumer, ConsumerRecord, PollIntervalExceededError, TopicPartition

log = logging.getLogger("exactly_once")
T = TypeVar("T")
Batch = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


def transform(record: ConsumerRecord[bytes, bytes]) -> tuple[bytes | None, bytes]:
    """The work: the output record's key and value for one input record (stand-in for yours)."""
    return record.key, b"processed:" + (record.value or b"")


async def blocking(call: Callable[..., T], *args: Any) -> T:
    """confluent-kafka's transactional calls wait for the broker: run them off the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(call, *args))


class Pipeline:
    def __init__(self, consumer: Consumer[bytes, bytes], producer: Producer, output: str) -> None:
        self.consumer = consumer
        self.producer = producer
        self.output = output
        self.committed = self.aborted = 0

    async def process(self, batch: Batch) -> None:
        """One batch, one transaction; on a refused or failed transaction, read the batch again."""
        producer = self.producer
        producer.begin_transaction()
        try:
            for records in batch.values():
                for record in records:
                    key, value = transform(record)
                    await self.produce(key, value)
            offsets = [OffsetToCommit(tp.topic, tp.partition, recs[-1].offset + 1) for tp, recs in batch.items()]
            # The broker takes these offsets only from the group's current owner of the partitions:
            # a member fenced meanwhile (a zombie) has its commit refused, and aborts below.
            metadata = self.consumer.group_metadata().for_confluent_kafka()
            await self.retrying(producer.send_offsets_to_transaction, offsets, metadata)
            await self.retrying(producer.commit_transaction)
            self.committed += 1
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or not error.txn_requires_abort():
                raise  # fatal: another instance took this transactional.id; restart to go on
            log.warning("transaction aborted (%s); reading the batch again", error)
            await blocking(producer.abort_transaction)
            self.aborted += 1
            await self.rewind(batch)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a bug in transform(), say: leave nothing open
                await blocking(producer.abort_transaction)
            raise

    async def produce(self, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.output, value=value, key=key)
                return
            except BufferError:  # the producer's queue is full: let it deliver some first
                await blocking(self.producer.poll, 0.1)

    async def retrying(self, call: Callable[..., None], *args: Any) -> None:
        """A retriable error (a timeout, the coordinator moving) asks for the same call again."""
        while True:
            try:
                return await blocking(call, *args)
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                log.info("%s: %s; trying again", getattr(call, "__name__", call), exc.args[0])

    async def rewind(self, batch: Batch) -> None:
        """Back to the batch's first records, on the partitions this member still owns (the others'
        new owners start from the offsets last committed)."""
        owned = self.consumer.assignment()
        for tp, records in batch.items():
            if tp in owned:
                await self.consumer.seek(tp, records[0].offset)


def properties(pairs: Sequence[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected name=value, got {pair!r}")
        result[name.strip()] = value.strip()
    return result


async def run(args: argparse.Namespace) -> None:
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "transactional.id": args.transactional_id,
        **properties(args.producer_property),
    })
    # Fences an earlier run with this transactional.id and aborts what it left open.
    await blocking(producer.init_transactions)
    consumer: Consumer[bytes, bytes] = Consumer.from_properties(
        properties(args.consumer_property),
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        isolation_level="read_committed",  # read only committed transactions (and plain records)
        enable_auto_commit=False,  # offsets are committed by the producer, in each transaction
        auto_offset_reset="earliest",
    )
    pipeline = Pipeline(consumer, producer, args.output)
    stop = anyio.Event()

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                stop.set()

    async with consumer, anyio.create_task_group() as tg:
        tg.start_soon(on_signal)
        consumer.subscribe([args.input])
        print(f"reading {args.input!r} as group {args.group!r}, writing {args.output!r}", file=sys.stderr, flush=True)
        while not stop.is_set():
            # Rebalance callbacks run inside this call, between transactions: partitions move only
            # while no transaction holds records of theirs.
            try:
                batch = await consumer.getmany(timeout=0.5, max_records=args.max_records)
            except PollIntervalExceededError as exc:  # a transaction took too long: the member rejoins
                log.warning("%s", exc)
                continue
            if batch:
                await pipeline.process(batch)
        tg.cancel_scope.cancel()
    print(f"stopped: {pipeline.committed} transactions committed, {pipeline.aborted} aborted",
          file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="host:port[,host:port...]")
    parser.add_argument("--input", required=True, help="the topic to read")
    parser.add_argument("--output", required=True, help="the topic to write")
    parser.add_argument("--group", required=True, help="the consumer group")
    parser.add_argument("--transactional-id", required=True, help="this instance's own, kept across restarts")
    parser.add_argument("--max-records", type=int, default=500, help="at most this many records a transaction")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("-X", dest="consumer_property", action="append", default=[], metavar="NAME=VALUE",
                        help="a consumer property, e.g. -X session.timeout.ms=10000")
    parser.add_argument("-P", dest="producer_property", action="append", default=[], metavar="NAME=VALUE",
                        help="a producer property, e.g. -P transaction.timeout.ms=30000")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    anyio.run(run, args, backend=args.backend)


if __name__ == "__main__":
    main()
