"""One reader per client and API, each run in a fresh subprocess by the driver.

    python -m benchmarks.clients CLIENT --bootstrap HOST:PORT --topic T --partitions 4 --count N

prints one JSON object: records and payload bytes read, wall seconds (consumer creation to last
record), time to first record, CPU seconds of the read (all threads), peak RSS.  Every reader
assigns all partitions from the beginning (no consumer group) and touches every record: it sums
``len(key) + len(value)``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: How many records a batch call asks for, where the API takes a number (confluent-kafka's
#: ``consume(num_messages)``); asyncconsumer's and aiokafka's getmany use their defaults.
CONSUME_BATCH = 10_000


@dataclass
class Tally:
    """What a reader fills in; the harness adds timing and resources."""

    records: int = 0
    payload: int = 0
    first: float = 0.0  # perf_counter of the first record
    last: float = 0.0  # perf_counter when the last record was read
    #: What ``payload`` counts: "kv", the bytes of keys and values; "batches", the record batches'
    #: bytes on the wire (a reader that decodes no record cannot know its keys and values).
    payload_kind: str = "kv"
    #: perf_counter and CPU seconds where the measured stretch starts, when a reader's setup is
    #: not part of it (``_decode_only``'s fetch); else the harness's own start.
    started: float = 0.0
    cpu_started: float = 0.0


Reader = Callable[[argparse.Namespace, Tally], None]


def peak_rss_mb() -> float:
    """This process's peak RSS.  VmHWM, not ru_maxrss: Linux carries ru_maxrss over ``exec`` from the
    forked parent, so a child would report at least the driver's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------ the read loops


async def read_each(records: AsyncIterator[Any], want: int, tally: Tally) -> None:
    """``async for record in ...`` until ``want`` records, touching every key and value."""
    n = payload = 0
    async for record in records:
        if n == 0:
            tally.first = time.perf_counter()
        n += 1
        payload += len(record.key or b"") + len(record.value or b"")
        if n >= want:
            break
    tally.last = time.perf_counter()
    tally.records, tally.payload = n, payload


async def read_polls(poll: Callable[[], Awaitable[dict[Any, list[Any]]]], want: int, tally: Tally) -> None:
    """``getmany()`` in a loop until ``want`` records (or a poll that returns nothing)."""
    n = payload = 0
    while n < want:
        got = await poll()
        if not got:
            break
        if n == 0:
            tally.first = time.perf_counter()
        for records in got.values():
            for record in records:
                payload += len(record.key or b"") + len(record.value or b"")
            n += len(records)
    tally.last = time.perf_counter()
    tally.records, tally.payload = n, payload


# ------------------------------------------------------------------ asyncconsumer


class _Same:
    """A deserializer with context that returns the bytes at once (``RecordDeserializer``)."""

    def deserialize(self, data: bytes, context: Any) -> bytes:
        return data


async def _same(data: bytes, context: Any) -> bytes:
    """An ``async def`` deserializer that returns the bytes (no suspension)."""
    return data


def _asyncconsumer(mode: str, deserializers: str = "") -> Reader:
    """``deserializers``: key and value deserializers that return the bytes they are given, so the
    reader measures what a deserializer costs the consumer apart from its own work: "plain"
    (``bytes``, an ``f(data)``), "object" (a ``RecordDeserializer`` returning the value at once) or
    "async" (an ``async def f(data, context)``)."""

    def read(args: argparse.Namespace, tally: Tally) -> None:
        import anyio

        from asyncconsumer import Consumer, TopicPartition

        async def main() -> None:
            want = args.count
            function = {"": None, "plain": bytes, "object": _Same(), "async": _same}[deserializers]
            options: dict[str, Any] = {"key_deserializer": function, "value_deserializer": function}
            consumer: Consumer[bytes, bytes] = Consumer(
                bootstrap_servers=args.bootstrap, auto_offset_reset="earliest", **options)
            async with consumer:
                consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
                if mode == "iter":
                    await read_each(consumer, want, tally)
                elif mode == "batches":
                    n = payload = 0
                    async for batch in consumer.batches():
                        if n == 0:
                            tally.first = time.perf_counter()
                        for record in batch:
                            payload += len(record.key or b"") + len(record.value or b"")
                        n += len(batch)
                        if n >= want:
                            break
                    tally.last = time.perf_counter()
                    tally.records, tally.payload = n, payload
                else:
                    await read_polls(lambda: consumer.getmany(timeout=30), want, tally)

        anyio.run(main)

    return read


def _asyncconsumer_arrow() -> Reader:
    """``arrow_batches(include_headers=False)``, otherwise the defaults (10,000 records a batch at
    most, ``ARROW_BATCH_RECORDS``; the default fetch settings).  A batch's
    keys and values are touched through their Arrow offsets: the bytes a binary column holds are
    its last offset less its first, the columnar counterpart of adding up ``len()``.  pyarrow is
    imported here, before the clock starts, as every client's imports are."""
    import anyio
    import pyarrow  # noqa: F401  (imported before the clock, as every client's imports are)

    from asyncconsumer import Consumer, TopicPartition

    async def main(args: argparse.Namespace, tally: Tally) -> None:
        want = args.count
        consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers=args.bootstrap, auto_offset_reset="earliest")
        async with consumer:
            consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
            n = payload = 0
            async for batch in consumer.arrow_batches(include_headers=False):
                if n == 0:
                    tally.first = time.perf_counter()
                for column in (batch.column("key"), batch.column("value")):
                    offsets = memoryview(column.buffers()[1]).cast("i")  # binary: int32 offsets
                    payload += offsets[column.offset + len(column)] - offsets[column.offset]
                n += batch.num_rows
                if n >= want:
                    break
            tally.last = time.perf_counter()
            tally.records, tally.payload = n, payload

    def read(args: argparse.Namespace, tally: Tally) -> None:
        anyio.run(main, args, tally)

    return read


async def _fetch_loop(args: argparse.Namespace, on_records: Callable[[int, memoryview, int, int], bool]) -> None:
    """Fetch requests in a loop on one ``BrokerConnection`` (the consumer's connection code, frame
    buffers and codec), one in flight, every partition from offset 0 with the consumer's default
    fetch sizes, until every partition reached its high watermark or ``on_records(partition,
    record_set, offsets, complete)`` returns False: how many offsets the record set advanced the
    partition and the bytes of its complete batches (``scan_batches``, the batch headers).  The
    record set is a view into a pooled frame, valid during the call.  One broker (the benchmark's),
    which leads every partition; Fetch v12, which names topics (v13+ wants topic ids from Metadata,
    the same bytes give or take 16)."""
    import anyio

    from asyncconsumer.config import build_config
    from asyncconsumer.engine.buffers import BufferPool
    from asyncconsumer.engine.connection import BrokerConnection, frame_limit
    from asyncconsumer.protocol.records import scan_batches

    config = build_config({"bootstrap_servers": args.bootstrap})
    host, _, port = args.bootstrap.rpartition(":")
    offsets = dict.fromkeys(range(args.partitions), 0)
    ends: dict[int, int] = {}
    async with anyio.create_task_group() as tg:

        def spawn(fn: Callable[..., Any], *fn_args: Any) -> None:  # a Spawn returns None; start_soon, a TaskHandle
            tg.start_soon(fn, *fn_args)

        conn = BrokerConnection(
            -1, host, int(port), client_id="bench-fetch-only",
            request_timeout=config.request_timeout_ms / 1000,
            setup_timeout=config.socket_connection_setup_timeout_ms / 1000, ssl_context=None,
            max_frame_bytes=frame_limit(config.fetch_max_bytes), frames=BufferPool(config.fetch_buffer_bytes),
        )
        await conn.open(spawn)
        version = conn.choose_version("Fetch", max_version=12)
        more = True
        while more and any(ends.get(p, 1) > offset for p, offset in offsets.items()):
            body = {
                "replica_id": -1, "max_wait_ms": config.fetch_max_wait_ms, "min_bytes": config.fetch_min_bytes,
                "max_bytes": config.fetch_max_bytes, "isolation_level": 0, "session_id": 0,
                "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
                "topics": [{"topic": args.topic, "partitions": [
                    {"partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": config.max_partition_fetch_bytes}
                    for p, offset in offsets.items() if ends.get(p, 1) > offset
                ]}],
            }
            response = await conn.request_version("Fetch", version, body, config.fetch_max_wait_ms / 1000)
            if response["error_code"]:
                raise RuntimeError(f"Fetch failed: error code {response['error_code']}")
            for topic in response["responses"]:
                for p in topic["partitions"]:
                    if p["error_code"]:
                        raise RuntimeError(f"Fetch of partition {p['partition_index']}: code {p['error_code']}")
                    ends[p["partition_index"]] = p["high_watermark"]
                    records = p["records"]
                    if not records:
                        continue
                    view = memoryview(records)
                    next_offset, complete, _ = scan_batches(view)
                    if next_offset < 0:
                        continue
                    partition = p["partition_index"]
                    advanced, offsets[partition] = next_offset - offsets[partition], next_offset
                    more = on_records(partition, view, advanced, complete) and more
        await conn.aclose()
        tg.cancel_scope.cancel()


def _fetch_only(args: argparse.Namespace, tally: Tally) -> None:
    """The floor of our own stack: ``_fetch_loop`` until ``count`` records.  No record is decoded:
    each partition's record set is only scanned for its next offset (``scan_batches``, the batch
    headers) and its bytes counted."""
    import anyio

    n = payload = 0

    def count(partition: int, records: memoryview, offsets: int, complete: int) -> bool:
        nonlocal n, payload
        if n == 0:
            tally.first = time.perf_counter()
        n += offsets
        payload += complete
        tally.last = time.perf_counter()
        return bool(n < args.count)

    anyio.run(_fetch_loop, args, count)
    tally.records, tally.payload, tally.payload_kind = n, payload, "batches"


#: How many bytes of the topic's record sets ``_decode_only`` holds in memory (the first ones).
DECODE_ONLY_BYTES = 32 * 2**20


def _decode_only(args: argparse.Namespace, tally: Tally) -> None:
    """A row reader's Python work without any I/O: the topic's first ``DECODE_ONLY_BYTES`` of
    record sets are fetched (``_fetch_loop``, not timed) and copied, then decoded again and again
    until ``count`` records, each record touched as every reader does.  The clock and the CPU count
    start after the fetch (``Tally.started``).  The batches are the topic's own, as its producer
    wrote them; the CRC is checked as the consumer does."""
    import anyio

    from asyncconsumer.protocol.records import decode_batch, iter_batches

    sets: list[tuple[int, bytes]] = []
    held = 0

    def keep(partition: int, records: memoryview, offsets: int, complete: int) -> bool:
        nonlocal held
        sets.append((partition, bytes(records)))
        held += len(records)
        return held < DECODE_ONLY_BYTES

    anyio.run(_fetch_loop, args, keep)
    if not sets:
        raise RuntimeError(f"{args.topic} has no records to decode")
    tally.started, tally.cpu_started = time.perf_counter(), _cpu()
    topic, want = args.topic, args.count

    def decoded() -> Iterator[list[Any]]:  # the held record sets' records, a batch at a time, round and round
        while True:
            for partition, data in sets:
                for batch in iter_batches(memoryview(data), topic=topic, partition=partition, check_crcs=True):
                    yield decode_batch(batch, topic, partition)

    n = payload = 0
    for records in decoded():
        if n + len(records) > want:
            records = records[: want - n]
        for record in records:
            payload += len(record.key or b"") + len(record.value or b"")
        n += len(records)
        if n >= want:
            break
    tally.first = tally.started
    tally.last = time.perf_counter()
    tally.records, tally.payload = n, payload


# ------------------------------------------------------------------ aiokafka


def _aiokafka(mode: str) -> Reader:
    def read(args: argparse.Namespace, tally: Tally) -> None:
        import asyncio

        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def main() -> None:
            want = args.count
            consumer = AIOKafkaConsumer(
                bootstrap_servers=args.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
            )
            await consumer.start()
            try:
                consumer.assign([TopicPartition(args.topic, p) for p in range(args.partitions)])
                if mode == "iter":
                    await read_each(consumer, want, tally)
                else:
                    await read_polls(lambda: consumer.getmany(timeout_ms=30_000), want, tally)
            finally:
                await consumer.stop()

        asyncio.run(main())

    return read


# ------------------------------------------------------------------ confluent-kafka


def _confluent(tuned: bool) -> Reader:
    def read(args: argparse.Namespace, tally: Tally) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

        config: dict[str, Any] = {
            "bootstrap.servers": args.bootstrap,
            "group.id": "asyncconsumer-bench",  # required by the client; assign() does not join a group
            "enable.auto.commit": False,
            "log_level": 3,
        }
        if tuned:
            # librdkafka's default of 1000 ms idles on a backlog between fetch-queue refills.
            config["fetch.queue.backoff.ms"] = 10
        consumer = Consumer(config)
        try:
            consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
            n = payload = 0
            want = args.count
            deadline = time.monotonic() + 300
            while n < want and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=min(CONSUME_BATCH, want - n), timeout=1.0):
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    if n == 0:
                        tally.first = time.perf_counter()
                    n += 1
                    payload += len(msg.key() or b"") + len(msg.value() or b"")
            tally.last = time.perf_counter()
            tally.records, tally.payload = n, payload
        finally:
            consumer.close()

    return read


# ------------------------------------------------------------------ group join

#: Every client joins with the same session timeout: brokers may hold a JoinGroup for part of it
#: (Tansu holds it for half), so the clients' different defaults would decide the result.
JOIN_SESSION_TIMEOUT_MS = 6_000  # Kafka's default group.min.session.timeout.ms


def _group(client: str) -> str:
    return f"bench-join-{client}-{os.getpid()}-{time.time_ns()}"


def _join_asyncconsumer(args: argparse.Namespace, tally: Tally) -> None:
    """Subscribe with a fresh consumer group and read one record (the result: time to first record)."""
    import anyio

    from asyncconsumer import Consumer

    async def main() -> None:
        consumer: Consumer[bytes, bytes] = Consumer(
            bootstrap_servers=args.bootstrap,
            group_id=_group("asyncconsumer"),
            auto_offset_reset="earliest",
            session_timeout_ms=JOIN_SESSION_TIMEOUT_MS,
        )
        async with consumer:
            consumer.subscribe([args.topic])
            record = await consumer.getone()
            tally.first = tally.last = time.perf_counter()
            tally.records, tally.payload = 1, len(record.key or b"") + len(record.value or b"")

    anyio.run(main)


def _join_aiokafka(args: argparse.Namespace, tally: Tally) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            args.topic,
            bootstrap_servers=args.bootstrap,
            group_id=_group("aiokafka"),
            auto_offset_reset="earliest",
            session_timeout_ms=JOIN_SESSION_TIMEOUT_MS,
        )
        await consumer.start()
        try:
            record = await consumer.getone()
            tally.first = tally.last = time.perf_counter()
            tally.records, tally.payload = 1, len(record.key or b"") + len(record.value or b"")
        finally:
            await consumer.stop()

    asyncio.run(main())


def confluent_first_record(bootstrap: str, topic: str, group: str, timeout: float, **config: Any) -> Any:
    """Subscribe with confluent-kafka in consumer group ``group`` and return the first record."""
    from confluent_kafka import Consumer as ConfluentConsumer
    from confluent_kafka import KafkaException

    consumer = ConfluentConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "log_level": 3, **config}
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                raise KafkaException(msg.error())
            return msg
        raise TimeoutError(f"group {group}: no record from {topic} within {timeout:.0f} s")
    finally:
        consumer.close()


def _join_confluent(args: argparse.Namespace, tally: Tally) -> None:
    msg = confluent_first_record(
        args.bootstrap, args.topic, _group("confluent"), 120, **{"session.timeout.ms": JOIN_SESSION_TIMEOUT_MS}
    )
    tally.first = tally.last = time.perf_counter()
    tally.records, tally.payload = 1, len(msg.key() or b"") + len(msg.value() or b"")


#: name -> (label, needed module, reader factory)
CLIENTS: dict[str, tuple[str, str, Callable[[], Reader]]] = {
    "asyncconsumer-iter": ("asyncconsumer `async for`", "asyncconsumer", lambda: _asyncconsumer("iter")),
    "asyncconsumer-getmany": ("asyncconsumer `getmany()`", "asyncconsumer", lambda: _asyncconsumer("getmany")),
    "asyncconsumer-batches": ("asyncconsumer `batches()`", "asyncconsumer", lambda: _asyncconsumer("batches")),
    "asyncconsumer-arrow": ("asyncconsumer `arrow_batches()`", "pyarrow", _asyncconsumer_arrow),
    **{
        f"asyncconsumer-{name}": (f"asyncconsumer {label}", "asyncconsumer", functools.partial(_asyncconsumer, *how))
        for name, (label, *how) in {
            "iter-deser": ("`async for`, `bytes` deserializers", "iter", "plain"),
            "getmany-deser": ("`getmany()`, `bytes` deserializers", "getmany", "plain"),
            "batches-deser": ("`batches()`, `bytes` deserializers", "batches", "plain"),
            "batches-object": ("`batches()`, deserializers with context returning at once", "batches", "object"),
            "batches-async": ("`batches()`, `async def` deserializers", "batches", "async"),
        }.items()
    },
    "asyncconsumer-fetch-only": (
        "asyncconsumer Fetch loop, no decoding (ceiling)",
        "asyncconsumer",
        lambda: _fetch_only,
    ),
    "asyncconsumer-decode-only": (
        "asyncconsumer decode + touch, no I/O (Python floor)",
        "asyncconsumer",
        lambda: _decode_only,
    ),
    "asyncconsumer-getmany-py": (
        "asyncconsumer `getmany()`, pure-Python decoder",
        "asyncconsumer",
        lambda: _asyncconsumer("getmany"),
    ),
    "aiokafka-iter": ("aiokafka `async for`", "aiokafka", lambda: _aiokafka("iter")),
    "aiokafka-getmany": ("aiokafka `getmany()`", "aiokafka", lambda: _aiokafka("getmany")),
    "confluent-default": ("confluent-kafka `consume()`, defaults", "confluent_kafka", lambda: _confluent(False)),
    "confluent-tuned": (
        "confluent-kafka `consume()`, fetch.queue.backoff.ms=10",
        "confluent_kafka",
        lambda: _confluent(True),
    ),
    "asyncconsumer-join": ("asyncconsumer `subscribe()`", "asyncconsumer", lambda: _join_asyncconsumer),
    "aiokafka-join": ("aiokafka, topics in the constructor", "aiokafka", lambda: _join_aiokafka),
    "confluent-join": ("confluent-kafka `subscribe()`", "confluent_kafka", lambda: _join_confluent),
}

#: Clients that need an environment of their own.
CLIENT_ENV: dict[str, dict[str, str]] = {"asyncconsumer-getmany-py": {"ASYNCCONSUMER_NO_EXTENSION": "1"}}


def _versions(client: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if client.startswith("asyncconsumer"):
        from asyncconsumer import __version__
        from asyncconsumer.protocol import records

        out = {"version": __version__, "decoder": records.DECODER}
    elif client.startswith("aiokafka"):
        import aiokafka

        out = {"version": aiokafka.__version__}
    elif client.startswith("confluent"):
        import confluent_kafka

        out = {"version": confluent_kafka.version()[0], "librdkafka": confluent_kafka.libversion()[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)

    reader = CLIENTS[args.client][2]()
    versions = _versions(args.client)  # imports the client before the clock starts
    tally = Tally()
    cpu0 = _cpu()
    start = time.perf_counter()
    error = None
    try:
        reader(args, tally)
    except Exception as exc:  # reported, not raised: the driver shows it in the table
        error = f"{type(exc).__name__}: {exc}"
    end = tally.last or time.perf_counter()
    cpu = _cpu() - (tally.cpu_started or cpu0)
    start = tally.started or start
    wall = end - start
    result = {
        "client": args.client,
        "topic": args.topic,
        "expected": args.count,
        "records": tally.records,
        "payload_bytes": tally.payload,
        "payload_kind": tally.payload_kind,
        "wall_s": wall,
        "first_record_s": (tally.first - start) if tally.first else None,
        "records_per_s": tally.records / wall if wall > 0 else 0.0,
        "mb_per_s": tally.payload / wall / 1e6 if wall > 0 else 0.0,
        "cpu_s": cpu,
        "peak_rss_mb": peak_rss_mb(),
        "pid": os.getpid(),
        "error": error,
        **versions,
    }
    print(json.dumps(result), flush=True)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
