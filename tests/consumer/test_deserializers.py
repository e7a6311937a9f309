"""Deserializers with context (sync or awaiting) and the poison-pill policy, on both brokers.

The records are produced by confluent-kafka, poison pills among them: values that are not JSON and
a key that is not UTF-8.  Each read API reads them under each ``on_deserialization_error`` policy
("raise", "skip", a handler), with each form of deserializer (``f(data)``, ``async def f(data,
context)``, an object whose ``deserialize`` returns a value or an awaitable), on asyncio and trio;
the matrix is a Latin square, not the full product.  Every run checks that nothing is lost,
nothing skipped silently (the errors raised, the WARNINGs or the handler's calls), and the
committed offsets (at the bad record after a raise, past the skipped records after a skip).
Then what happens when the consumer's state changes while a deserializer awaits (a seek, a pause,
a revocation, close, a cancelled poll), and the options' checks.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support.consumers import FAST, tps
from support.paths import ROOT

from asyncconsumer import (
    Consumer,
    ConsumerRecord,
    DeserializationContext,
    RecordDeserializationError,
    TopicPartition,
)
from asyncconsumer.config import build_config, deserializer_kind, from_properties
from asyncconsumer.errors import ConfigTypeError

BAD = b"\xffnot json"

#: (partition, key, value) as produced; a None value is a tombstone.
RECORDS: list[tuple[int, bytes | None, bytes | None]] = [
    (0, b"k0", b'{"n": 0}'),
    (0, b"k1", b'{"n": 1}'),
    (0, b"k2", BAD),
    (0, None, b'{"n": 3}'),
    (0, b"k4", b'{"n": 4}'),
    (0, b"\xff", b'{"n": 5}'),  # the key is the poison pill
    (0, b"k6", None),
    (0, b"k7", b'{"n": 7}'),
    (1, b"k100", b'{"n": 100}'),
    (1, b"k101", b'{"n": 101}'),
    (1, b"k102", BAD),
    (1, b"k103", b'{"n": 103}'),
    (1, b"k104", BAD),  # the last record of its partition
]
#: (partition, offset, field) of the poison pills.
POISON = [(0, 2, "value"), (0, 5, "key"), (1, 2, "value"), (1, 4, "value")]
GOOD = {0: [0, 1, 3, 4, None, 7], 1: [100, 101, 103]}
ENDS = {0: 8, 1: 5}


def produce_records(produce: Callable[..., Any], topic: str) -> None:
    offsets = [sum(1 for q, _, _ in RECORDS[:i] if q == p) for i, (p, _, _) in enumerate(RECORDS)]
    produce(topic, [(p, k, v, [("where", f"{p}/{o}".encode())]) for o, (p, k, v) in zip(offsets, RECORDS, strict=True)])


# -- the deserializers, in the three forms ---------------------------------------------------------------


def number(data: bytes) -> int:
    return int(json.loads(data)["n"])


class Forms:
    """A key and a value deserializer of one form, which note the contexts they are given."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.contexts: list[DeserializationContext] = []

    def deserializers(self) -> dict[str, Any]:
        if self.kind == "plain":
            return {"key_deserializer": bytes.decode, "value_deserializer": number}
        if self.kind == "async":
            return {"key_deserializer": self.key_async, "value_deserializer": self.value_async}
        return {"key_deserializer": KeyObject(self), "value_deserializer": ValueObject(self)}

    async def key_async(self, data: bytes, context: DeserializationContext) -> str:
        self.contexts.append(context)
        await anyio.lowlevel.checkpoint()  # a real suspension
        return data.decode()

    async def value_async(self, data: bytes, context: DeserializationContext) -> int:
        self.contexts.append(context)
        await anyio.lowlevel.checkpoint()
        return number(data)


class KeyObject:
    def __init__(self, forms: Forms) -> None:
        self.forms = forms

    def deserialize(self, data: bytes, context: DeserializationContext) -> str:
        self.forms.contexts.append(context)
        return data.decode()


class ValueObject:
    """Returns the value at once for even offsets, an awaitable for odd ones (as a registry
    deserializer does for a schema it has and one it must fetch)."""

    def __init__(self, forms: Forms) -> None:
        self.forms = forms

    def deserialize(self, data: bytes, context: DeserializationContext) -> int | Awaitable[int]:
        self.forms.contexts.append(context)
        if context.offset % 2 == 0:
            return number(data)
        return self.later(data)

    async def later(self, data: bytes) -> int:
        await anyio.sleep(0.001)
        return number(data)


# -- the read APIs ------------------------------------------------------------------------------------------

OnError = Callable[[RecordDeserializationError], Awaitable[None]]


async def unexpected(exc: RecordDeserializationError) -> None:
    raise AssertionError(f"raised with a policy that skips: {exc!r}")


async def read(c: Consumer[Any, Any], api: str, want: int, on_error: OnError) -> list[ConsumerRecord[Any, Any]]:
    """Records read with ``api`` until ``want`` arrived and every partition's position is at its
    end, with ``on_error`` for each ``RecordDeserializationError`` raised."""
    got: list[ConsumerRecord[Any, Any]] = []
    topic = next(iter(c.assignment())).topic

    async def at_end() -> bool:
        return len(got) >= want and all([await c.position(TopicPartition(topic, p)) == e for p, e in ENDS.items()])

    if api == "partitions":
        return await read_streams(c, want, on_error, got, at_end)
    batches = c.batches()
    while not await at_end():
        try:
            if api == "getmany" or len(got) >= want:  # past the last good record: what is left is skipped
                got += [r for rs in (await c.getmany(timeout=0.2)).values() for r in rs]
            elif api == "getone":
                got.append(await c.getone())
            elif api == "iter":
                async for record in c:
                    got.append(record)
                    if len(got) >= want:
                        break
            else:
                got += await batches.__anext__()
        except RecordDeserializationError as exc:
            await on_error(exc)
    return got


async def read_streams(c: Consumer[Any, Any], want: int, on_error: OnError, got: list[ConsumerRecord[Any, Any]],
                       at_end: Callable[[], Awaitable[bool]]) -> list[ConsumerRecord[Any, Any]]:
    streams = c.partitions()

    async def reader(stream: Any) -> None:
        async for record in stream:
            got.append(record)

    async def iterate() -> None:
        while True:
            try:
                async for _, stream in streams:
                    tg.start_soon(reader, stream)
                return
            except RecordDeserializationError as exc:
                await on_error(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(iterate)
        while not await at_end():  # noqa: ASYNC110 (the streams' tasks read on)
            await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    return got


# -- the matrix ---------------------------------------------------------------------------------------------

APIS = ("getmany", "getone", "iter", "batches", "partitions")
POLICIES = ("raise", "skip", "handler")
KINDS = ("plain", "async", "object")
#: Each API under each policy; the forms and the runtimes go round (each policy meets each form,
#: each API two forms or more and both runtimes).
MATRIX = [
    pytest.param(api, policy, KINDS[(a + p) % 3], ("asyncio", "trio")[(a + p) % 2], id=f"{api}-{policy}-"
                 f"{KINDS[(a + p) % 3]}-{('asyncio', 'trio')[(a + p) % 2]}")
    for a, api in enumerate(APIS)
    for p, policy in enumerate(POLICIES)
]


@pytest.mark.anyio
@pytest.mark.parametrize(("api", "policy", "kind", "anyio_backend"), MATRIX)
async def test_poison_pills(
    api: str, policy: str, kind: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(2)
    produce_records(produce, topic)
    forms = Forms(kind)
    handled: list[tuple[ConsumerRecord[bytes, bytes], RecordDeserializationError]] = []
    raised: list[RecordDeserializationError] = []

    async def dead_letter(record: ConsumerRecord[bytes, bytes], error: RecordDeserializationError) -> None:
        await anyio.lowlevel.checkpoint()
        handled.append((record, error))

    async def on_error(exc: RecordDeserializationError) -> None:
        raised.append(exc)
        tp = TopicPartition(exc.topic, exc.partition)
        # "raise": the position stays at the bad record, and so do the commits.
        if api != "partitions":
            assert await c.position(tp) == exc.offset
        await c.commit()
        committed = await c.committed(tp)
        assert committed is not None and committed <= exc.offset
        if api != "partitions":
            assert committed == exc.offset
        await c.seek(tp, exc.skip_to)

    options = {**FAST, **forms.deserializers(),
               "on_deserialization_error": dead_letter if policy == "handler" else policy}
    caplog.set_level(logging.INFO, "asyncconsumer.consumer")
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", enable_auto_commit=False,
                        auto_offset_reset="earliest", max_poll_records=3, **options) as c:
        c.assign(tps(topic, 2))
        with anyio.fail_after(60):
            got = await read(c, api, sum(map(len, GOOD.values())), on_error)
            await c.commit()
            committed = await c.committed(tps(topic, 2))
            skipped = c.metrics().records_skipped

    # Nothing lost, nothing twice, every record in order, decoded.
    assert {p: [r.value for r in got if r.partition == p] for p in GOOD} == GOOD
    assert all(r.key is None or r.key.startswith("k") for r in got)
    assert [r.offset for r in got if r.partition == 0] == [0, 1, 3, 4, 6, 7]
    # Commits cover every record read or skipped.
    assert {tp.partition: om.offset if om else None for tp, om in committed.items()} == ENDS
    # Nothing skipped silently.
    poison = [(e.partition, e.offset, e.field) for e in raised]
    if policy == "raise":
        assert sorted(poison) == POISON
        assert all(isinstance(e.__cause__, ValueError) for e in raised)  # JSON's or UTF-8's
        assert skipped == 0
    elif policy == "skip":
        assert not raised and skipped == len(POISON)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        for p, offset, _ in POISON:
            assert any(f"{topic}-{p} offset {offset} skipped" in line for line in warned), warned
    else:
        assert not raised and skipped == len(POISON)
        assert sorted((r.partition, r.offset, e.field) for r, e in handled) == POISON
        for record, error in handled:  # the handler gets the record as it was fetched
            assert (record.key, record.value) == RECORDS[record.offset + (8 if record.partition else 0)][1:]
            assert record.headers == (("where", f"{record.partition}/{record.offset}".encode()),)
            assert (error.topic, error.partition, error.offset) == (topic, record.partition, record.offset)
    if kind != "plain":
        for ctx in forms.contexts:
            assert ctx.topic == topic and ctx.field in ("key", "value")
            assert list(ctx.headers) == [("where", f"{ctx.partition}/{ctx.offset}".encode())]
        assert {(ctx.partition, ctx.offset, ctx.field) for ctx in forms.contexts} >= {
            (p, o, f) for p, o, f in POISON}


@pytest.mark.anyio
@pytest.mark.parametrize(("api", "kind", "anyio_backend"), [
    ("iter", "async", "asyncio"), ("batches", "object", "trio"), ("partitions", "async", "trio"),
    ("getmany", "plain", "asyncio"),
])
async def test_skipped_records_last_in_the_partition_move_the_position_and_the_commits_past_them(
    api: str, kind: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any],
) -> None:
    """The skipped records come alone, in a poll of their own (produced after the first record was
    read): nothing is handed out after them, and no fetch response comes after them either
    (``fetch_until``), which would move the position too."""
    topic = new_topic(1)
    produce(topic, [(0, b"k", b'{"n": 0}')])
    tp = TopicPartition(topic, 0)
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", enable_auto_commit=False,
                        auto_offset_reset="earliest", on_deserialization_error="skip",
                        **Forms(kind).deserializers(), **FAST) as c:
        c.assign([tp])
        c.fetch_until(tp, 3)
        got: list[ConsumerRecord[Any, Any]] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def reader() -> None:
                    if api == "iter":
                        async for record in c:
                            got.append(record)
                    elif api == "batches":
                        async for batch in c.batches():
                            got.extend(batch)
                    elif api == "partitions":
                        async for _, stream in c.partitions():
                            tg.start_soon(read_stream, stream)
                    else:
                        while True:
                            got.extend(r for rs in (await c.getmany(timeout=0.1)).values() for r in rs)

                async def read_stream(stream: Any) -> None:
                    async for record in stream:
                        got.append(record)

                tg.start_soon(reader)
                while not got:  # noqa: ASYNC110 (the reader reads on)
                    await anyio.sleep(0.02)
                await anyio.to_thread.run_sync(lambda: produce(topic, [(0, b"k", BAD), (0, b"k", BAD)]))
                while await c.position(tp) != 3:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
            await c.commit()
            assert await c.committed(tp) == 3
            assert c.metrics().records_skipped == 2
    assert [r.offset for r in got] == [0]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_skipped_records_are_counted_in_metrics_opentelemetry_and_prometheus(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    from observability.test_otel import points
    from observability.test_prometheus import labels, scrape
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    from asyncconsumer.prometheus import ConsumerCollector

    topic = new_topic(2)
    produce_records(produce, topic)
    reader = InMemoryMetricReader()
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", value_deserializer=number,
                        key_deserializer=bytes.decode, on_deserialization_error="skip",
                        meter_provider=MeterProvider(metric_readers=[reader]), client_id="skipper", **FAST) as c:
        c.assign(tps(topic, 2))
        with anyio.fail_after(30):
            await read(c, "getmany", sum(map(len, GOOD.values())), unexpected)
        ours = c.metrics()
        skipped = {int(p.attributes["messaging.destination.partition.id"]): p.value
                   for p in points(reader, "kafka.consumer.records_skipped")}
        registry = CollectorRegistry()
        registry.register(ConsumerCollector(c))
        exported = scrape(registry)
    assert ours.records_skipped == 4 and ours.records_consumed == 9
    assert skipped == {0: 2, 1: 2}
    assert exported[("asyncconsumer_records_skipped_total", labels(client_id="skipper"))] == 4


# -- the consumer's state changes while a deserializer awaits ----------------------------------------------


class Gate:
    """An async value deserializer that waits at ``offset`` (the first time) until opened."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.entered = anyio.Event()
        self.opened = anyio.Event()
        self.passed = False
        self.partition = -1

    async def __call__(self, data: bytes, context: DeserializationContext) -> bytes:
        if context.offset == self.offset and not self.passed:
            self.partition = context.partition
            self.entered.set()
            await self.opened.wait()
            self.passed = True
        return data


def values(n: int) -> list[bytes]:
    return [b"%d" % i for i in range(n)]



@pytest.mark.anyio
async def test_a_seek_while_a_deserializer_awaits_hands_out_nothing_from_before_it(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, v) for v in values(10)])
    gate = Gate(offset=0)
    tp = TopicPartition(topic, 0)
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", value_deserializer=gate,
                        **FAST) as c:
        c.assign([tp])
        got: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}

        async def poll() -> None:
            got.update(await c.getmany(timeout=10))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                await gate.entered.wait()
                await c.seek(tp, 6)  # from another task, while the poll awaits the deserializer
                gate.opened.set()
        assert [r.offset for r in got[tp]] == [6, 7, 8, 9]
        assert await c.position(tp) == 10


@pytest.mark.anyio
async def test_a_pause_while_a_deserializer_awaits_puts_the_records_back(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, v) for p in (0, 1) for v in values(5)])
    gate = Gate(offset=0)
    tp0, tp1 = tps(topic, 2)
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", value_deserializer=gate,
                        **FAST) as c:
        c.assign([tp0, tp1])
        with anyio.fail_after(30):
            got: list[ConsumerRecord[bytes, bytes]] = []

            async def poll() -> None:
                while not gate.passed or len(got) < 5:
                    for records in (await c.getmany(timeout=1)).values():
                        got.extend(records)

            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                await gate.entered.wait()
                paused = TopicPartition(topic, gate.partition)
                c.pause(paused)
                gate.opened.set()
            assert {r.partition for r in got} == {1 - paused.partition}
            c.resume(paused)
            while len(got) < 10:
                for records in (await c.getmany(timeout=1)).values():
                    got.extend(records)
    for p in (0, 1):
        assert [r.offset for r in got if r.partition == p] == [0, 1, 2, 3, 4]


@pytest.mark.anyio
async def test_close_while_a_deserializer_awaits_hands_out_nothing_and_commits_nothing_unread(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, v) for v in values(6)])
    gate = Gate(offset=3)
    tp = TopicPartition(topic, 0)
    group = f"g-{topic}"
    got: list[ConsumerRecord[bytes, bytes]] = []
    with anyio.fail_after(30):
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                            value_deserializer=gate, max_poll_records=3, **FAST) as c:
            c.assign([tp])

            async def iterate() -> None:
                async for record in c:  # ends when the consumer closes
                    got.append(record)

            async with anyio.create_task_group() as tg:
                tg.start_soon(iterate)
                await gate.entered.wait()
                async with anyio.create_task_group() as closing:
                    closing.start_soon(c.close)
                    await anyio.sleep(0.2)
                    gate.opened.set()
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, **FAST) as reader:
            committed = await reader.committed(tp)
    assert [r.offset for r in got] == [0, 1, 2]
    assert committed == 3  # auto-commit on close: what was handed out, not the record being deserialized


@pytest.mark.anyio
async def test_a_poll_cancelled_while_a_deserializer_awaits_loses_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, v) for v in values(5)])
    gate = Gate(offset=2)
    tp = TopicPartition(topic, 0)
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", value_deserializer=gate,
                        **FAST) as c:
        c.assign([tp])
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def poll() -> None:
                    await c.getmany(timeout=10)

                tg.start_soon(poll)
                await gate.entered.wait()
                tg.cancel_scope.cancel()
            assert await c.position(tp) == 0
            gate.opened.set()
            got = (await c.getmany(timeout=10))[tp]
    assert [r.value for r in got] == values(5)


@pytest.mark.anyio
@pytest.mark.broker_feature("fast_join")  # Tansu holds each JoinGroup for seconds: Apache Kafka's run only
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one runtime is enough: a rebalance takes seconds
async def test_a_revocation_while_a_deserializer_awaits_hands_out_nothing_of_the_revoked_partition(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, v) for p in (0, 1) for v in values(5)])
    gate = Gate(offset=0)
    group = f"g-{topic}"
    options = {**FAST, "group_id": group, "auto_offset_reset": "earliest", "heartbeat_interval_ms": 200,
               "session_timeout_ms": 6000, "partition_assignment_strategy": "range"}
    gated: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] | None = None
    got: list[ConsumerRecord[bytes, bytes]] = []
    with anyio.fail_after(60):
        async with Consumer(value_deserializer=gate, bootstrap_servers=bootstrap, **options) as a:
            a.subscribe([topic])
            engine = a._engine
            assert engine is not None

            async def poll(consumer: Consumer[bytes, bytes]) -> None:
                nonlocal gated
                while len(got) < 10:
                    before = gate.passed
                    polled = await consumer.getmany(timeout=0.2)
                    if consumer is a and gate.passed and not before:
                        gated = polled  # the poll the deserializer held while the partitions were revoked
                    got.extend(r for records in polled.values() for r in records)

            async with anyio.create_task_group() as tg:
                tg.start_soon(poll, a)
                await gate.entered.wait()
                async with Consumer(bootstrap_servers=bootstrap, **options) as b:
                    b.subscribe([topic])
                    # The rebalance has begun: the partitions are being revoked from ``a``.
                    while not all(s.revoking for s in engine.subscriptions.partitions.values()):  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                    gate.opened.set()
                    await poll(b)  # both members read on: the rebalance completes
    # Nothing taken before the revocation was handed out; the members read everything once after it.
    assert gated == {}
    assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 1) for o in range(5)]


# -- the options -------------------------------------------------------------------------------------------


class WithMethod:
    def deserialize(self, data: bytes, context: DeserializationContext) -> bytes:
        return data


class AsyncCall:
    async def __call__(self, data: bytes, context: DeserializationContext) -> bytes:
        return data


async def two(data: bytes, context: DeserializationContext) -> bytes:
    return data


async def one(data: bytes) -> bytes:
    return data


def plain_two(data: bytes, context: DeserializationContext) -> bytes:
    return data


def test_the_three_forms_are_told_apart() -> None:
    assert deserializer_kind("value_deserializer", WithMethod()) == "object"
    assert deserializer_kind("value_deserializer", two) == "async"
    assert deserializer_kind("value_deserializer", AsyncCall()) == "async"
    assert deserializer_kind("value_deserializer", json.loads) == "plain"
    assert deserializer_kind("value_deserializer", int) == "plain"
    assert deserializer_kind("value_deserializer", bytes.decode) == "plain"


@pytest.mark.parametrize(("options", "match"), [
    ({"value_deserializer": 3}, r"value_deserializer must be callable"),
    ({"key_deserializer": "org.example.AvroDeserializer"}, r"key_deserializer must be callable"),
    ({"value_deserializer": one}, r"value_deserializer: the coroutine function one cannot be called as f\(data, "),
    ({"value_deserializer": plain_two}, r"value_deserializer: plain_two cannot be called as f\(data\)"),
    ({"key_deserializer": WithMethod}, r"key_deserializer: WithMethod.deserialize .*pass an instance"),
    ({"on_deserialization_error": "ignore"}, r"on_deserialization_error must be 'raise', 'skip' or an 'async def"),
    ({"on_deserialization_error": print}, r"on_deserialization_error must be .*make it async"),
    ({"on_deserialization_error": one}, r"on_deserialization_error: one cannot be called as handler\(record, error\)"),
])
def test_anything_else_is_a_config_type_error_naming_the_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigTypeError, match=match):
        build_config(options)
    with pytest.raises(ConfigTypeError, match=match):
        Consumer(**options)


def test_from_properties_takes_the_forms_and_the_policy_as_options() -> None:
    value = WithMethod()
    config = from_properties({"bootstrap.servers": "h:1", "value.deserializer": value},
                             {"key_deserializer": two, "on_deserialization_error": "skip"})
    assert (config.value_deserializer, config.key_deserializer, config.on_deserialization_error) == (
        value, two, "skip")
    assert build_config({}).on_deserialization_error == "raise"


def test_consumer_k_v_carries_the_types_of_the_deserializers() -> None:
    """mypy --strict on a user's module (tests/typing_checks/deserializers_usage.py): the three forms and
    the policies are accepted, ``Consumer[K, V]`` types every read API, and the lines marked
    ``# error`` are refused (each must be reported: mypy fails on an unused ignore)."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         str(ROOT / "tests" / "typing_checks" / "deserializers_usage.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("options", [{"value_deserializer": bytes}, {"key_deserializer": WithMethod()},
                                     {"value_deserializer": two}])
def test_async_for_runs_in_c_only_without_deserializers(options: dict[str, Any]) -> None:
    from asyncconsumer.app.iterators import RecordStream

    with_deserializers = Consumer(**options)
    assert with_deserializers.__aiter__() is with_deserializers  # Consumer.__anext__, the Python method
    if RecordStream is not None:
        assert type(Consumer().__aiter__()) is RecordStream
