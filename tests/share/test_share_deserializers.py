"""The share consumer's deserializers with context and its poison-pill policy, on Apache Kafka
(Tansu has no share groups): "skip" and a handler that returns REJECT the record (it never comes
back), a handler that raises is "raise" (the record is released and comes back), and a
``close()`` while a deserializer awaits releases what was not handed out.  Records produced by
confluent-kafka; asyncio and trio."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support.share import apache_kafka_bootstrap  # noqa: F401 (a fixture: bootstrap)

from asyncconsumer import (
    AcknowledgeType,
    DeserializationContext,
    RecordDeserializationError,
    ShareConsumer,
    ShareConsumerRecord,
)
from share.test_share import group_for, nothing_more

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.broker_feature("share_groups")]

BAD = b"\xffnot json"
JOBS = [b'{"n": 0}', BAD, b'{"n": 2}', b'{"n": 3}', BAD, b'{"n": 5}']
GOOD = [0, 2, 3, 5]


class Jobs:
    """A value deserializer object: the value at once for even offsets, an awaitable for odd ones."""

    def deserialize(self, data: bytes, context: DeserializationContext) -> Any:
        assert context.field == "value" and context.headers == ()
        if context.offset % 2 == 0:
            return json.loads(data)["n"]
        return self.later(data)

    async def later(self, data: bytes) -> int:
        await anyio.sleep(0.001)
        return int(json.loads(data)["n"])


async def job(data: bytes, context: DeserializationContext) -> int:
    await anyio.lowlevel.checkpoint()
    return int(json.loads(data)["n"])


async def read_all(consumer: ShareConsumer[Any, Any], want: int,
                   on_error: Callable[[RecordDeserializationError], None] | None = None) -> list[Any]:
    got: list[Any] = []
    with anyio.fail_after(30):
        while len(got) < want:
            try:
                polled = await consumer.getmany(timeout=0.5)
            except RecordDeserializationError as exc:
                assert on_error is not None, exc
                on_error(exc)
                continue
            for records in polled.values():
                for r in records:
                    got.append(r)
                    if consumer.acknowledgement_mode == "explicit":
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT)
    return got


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_skip_rejects_the_record_logs_and_counts_it(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, JOBS))
    caplog.set_level(logging.WARNING, "asyncconsumer.share")
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, value_deserializer=Jobs(),
                             on_deserialization_error="skip") as consumer:
        consumer.subscribe([topic])
        got = await read_all(consumer, len(GOOD))
        assert all(e is None for e in (await consumer.commit()).values())
        assert consumer.metrics().records_skipped == 2
        assert consumer.metrics().records_delivered == len(GOOD)
    assert [r.value for r in got] == GOOD
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for offset in (1, 4):
        assert any(f"{topic}-0 offset {offset} skipped (rejected)" in line for line in warned), warned
    # Rejected, not released: after the locks would have run out, nothing comes back.
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as again:
        again.subscribe([topic])
        assert await nothing_more(again, 3.0) == []


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_handler_gets_the_raw_record_then_it_is_rejected_and_a_handler_that_raises_releases_it(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, JOBS))
    handled: list[ShareConsumerRecord[bytes, bytes]] = []
    raised: list[RecordDeserializationError] = []

    async def dead_letter(record: ShareConsumerRecord[bytes, bytes], error: RecordDeserializationError) -> None:
        if record.offset == 4 and record.delivery_count == 1:
            raise ConnectionError("the dead-letter topic is down")
        assert isinstance(error.__cause__, ValueError)
        handled.append(record)

    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             value_deserializer=job, on_deserialization_error=dead_letter) as consumer:
        consumer.subscribe([topic])
        got = await read_all(consumer, len(GOOD), raised.append)
        with anyio.fail_after(30):
            while len(handled) < 2:  # the released record comes back, and is handled this time
                assert await consumer.getmany(timeout=0.5) == {}
        assert consumer.metrics().records_skipped == 2
        assert all(e is None for e in (await consumer.commit()).values())
    assert sorted(r.value for r in got) == GOOD
    assert [(r.offset, r.value, r.delivery_count) for r in handled] == [(1, BAD, 1), (4, BAD, 2)]
    assert [(e.offset, type(e.__cause__)) for e in raised] == [(4, ConnectionError)]
    assert "on_deserialization_error raised ConnectionError" in str(raised[0])
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as again:
        again.subscribe([topic])
        assert await nothing_more(again, 3.0) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_close_while_a_deserializer_awaits_releases_what_was_not_handed_out(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=30000)  # a lock that would outlast the test
    await anyio.to_thread.run_sync(lambda: produce(topic, [b"%d" % i for i in range(4)]))
    entered, opened = anyio.Event(), anyio.Event()

    async def held(data: bytes, context: DeserializationContext) -> bytes:
        if context.offset == 2:
            entered.set()
            await opened.wait()
        return data

    got: list[ShareConsumerRecord[bytes, bytes]] = []
    with anyio.fail_after(60):
        async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, value_deserializer=held) as consumer:
            consumer.subscribe([topic])

            async def iterate() -> None:
                async for record in consumer:
                    got.append(record)

            async with anyio.create_task_group() as tg:
                tg.start_soon(iterate)
                await entered.wait()
                async with anyio.create_task_group() as closing:
                    closing.start_soon(consumer.close)
                    await anyio.sleep(0.2)
                    opened.set()
        assert got == []  # the poll that awaited handed out nothing
        # Released on close, not left locked: another member gets every record at once.
        async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as again:
            again.subscribe([topic])
            records = await read_all(again, 4)
    assert sorted(r.value for r in records) == [b"0", b"1", b"2", b"3"]

