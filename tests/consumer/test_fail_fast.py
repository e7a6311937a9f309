"""Mistakes a newcomer makes get an answer at once, where the Java client gives one (or better):
reading with nothing assigned or subscribed, subscribing to a topic that does not exist, arguments
in aiokafka's style, and a consumer used again after ``close()``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from asyncconsumer import Consumer, ConsumerClosedError, ShareConsumer, TopicPartition
from asyncconsumer.errors import ConfigTypeError, IllegalStateError

OPTIONS: dict[str, Any] = {"request_timeout_ms": 10_000}
NOT_READING = "not subscribed to any topics or assigned any partitions"


async def _each_read(consumer: Consumer[bytes, bytes]) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def first_of(iterator: Any) -> Any:
        return await iterator.__anext__()

    return {
        "getmany()": lambda: consumer.getmany(timeout=None),
        "getone()": lambda: consumer.getone(),
        "async for": lambda: first_of(aiter(consumer)),
        "batches()": lambda: first_of(consumer.batches()),
        "partitions()": lambda: first_of(consumer.partitions()),
    }


async def _all_raise_at_once(consumer: Consumer[bytes, bytes]) -> None:
    for name, read in (await _each_read(consumer)).items():
        with anyio.fail_after(5):  # before the check, every one of them waited forever
            with pytest.raises(IllegalStateError, match=NOT_READING) as caught:
                await read()
        assert not isinstance(caught.value, ConsumerClosedError), name


@pytest.mark.anyio
async def test_reading_with_nothing_assigned_or_subscribed_raises_at_once(bootstrap: str) -> None:
    topic = f"never-created-{uuid.uuid4().hex[:8]}"
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", **OPTIONS) as consumer:
        await _all_raise_at_once(consumer)
        # assign([]) is no assignment, as in Java.
        consumer.assign([TopicPartition(topic, 0)])
        assert await consumer.getmany(timeout=0) == {}
        consumer.assign([])
        await _all_raise_at_once(consumer)
        # Subscribed, with no partitions yet: a poll waits for the group, as it should.
        consumer.subscribe([topic])
        assert await consumer.getmany(timeout=0) == {}
        await consumer.unsubscribe(timeout=5)
        await _all_raise_at_once(consumer)


@pytest.mark.anyio
async def test_share_consumer_polling_without_a_subscription_raises_at_once(bootstrap: str) -> None:
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id="never-joined", **OPTIONS) as consumer:
        for read in (lambda: consumer.getmany(timeout=None), lambda: aiter(consumer).__anext__()):
            with anyio.fail_after(5), pytest.raises(IllegalStateError, match="not subscribed to any topics"):
                await read()


@pytest.mark.anyio
async def test_a_subscribed_topic_that_does_not_exist_is_warned_of_once(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Like Java's UNKNOWN_TOPIC_OR_PARTITION warning, but once per topic, not at every refresh; a
    pattern that matches nothing is no mistake and gets no warning."""
    missing = f"does-not-exist-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="asyncconsumer")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and missing in r.getMessage()]

    options = {**OPTIONS, "metadata_max_age_ms": 150, "session_timeout_ms": 6000, "heartbeat_interval_ms": 300}
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{missing}", **options) as consumer:
        consumer.subscribe(pattern=f"{missing}.*")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            await consumer.getmany(timeout=0.2)
        assert warnings() == []
        consumer.subscribe([missing])
        with anyio.fail_after(10):
            while not warnings():
                await consumer.getmany(timeout=0.2)
        deadline = time.monotonic() + 1.0  # about six metadata refreshes more
        while time.monotonic() < deadline:
            await consumer.getmany(timeout=0.2)
    [warning] = warnings()
    assert f"subscribed topic {missing!r} does not exist (UNKNOWN_TOPIC_OR_PARTITION)" in warning, warning


def test_topics_given_to_the_constructor_get_an_aiokafka_hint() -> None:
    with pytest.raises(ConfigTypeError, match=r"consumer\.subscribe\(\['events'\]\)") as caught:
        Consumer("events", bootstrap_servers="127.0.0.1:9092")  # type: ignore[arg-type]
    assert isinstance(caught.value, TypeError) and "aiokafka" in str(caught.value)
    assert "1 positional argument ('events')" in str(caught.value)
    with pytest.raises(ConfigTypeError, match=r"subscribe\(\['jobs'\]\)"):
        ShareConsumer("jobs", bootstrap_servers="127.0.0.1:9092", group_id="w")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_timeout_ms_says_to_use_seconds() -> None:
    consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers="127.0.0.1:9092")
    with pytest.raises(ConfigTypeError, match=r"getmany\(\) takes timeout= in seconds, not timeout_ms="):
        await consumer.getmany(timeout_ms=500)  # type: ignore[call-arg]
    with pytest.raises(ConfigTypeError, match=r"getone\(\) has no timeout: bound it with anyio.fail_after"):
        await consumer.getone(timeout_ms=500)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="timeout= in seconds"):
        await consumer.commit(timeout_ms=500)  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_a_closed_consumer_says_it_is_closed(bootstrap: str) -> None:
    consumer: Consumer[bytes, bytes] = Consumer(bootstrap_servers=bootstrap, **OPTIONS)
    async with consumer:
        with pytest.raises(IllegalStateError, match="already started"):
            async with consumer:
                pass
    for again in (consumer.__aenter__, consumer.start):
        with pytest.raises(ConsumerClosedError, match="the consumer is closed: a consumer runs once; create a new"):
            await again()
    share: ShareConsumer[bytes, bytes] = ShareConsumer(bootstrap_servers=bootstrap, group_id="g", **OPTIONS)
    async with share:
        pass
    with pytest.raises(ConsumerClosedError, match="share consumer is closed"):
        await share.__aenter__()



@pytest.mark.anyio
async def test_a_read_while_close_leaves_the_group_ends_as_closed(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """``close()`` from another task leaves the group before the consumer is marked closed: a read in
    that window ends with ``ConsumerClosedError`` (``async for`` stops), never the newcomer's
    "not subscribed" error (seen in a storm of members closing while they read)."""
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")])
    consumer: Consumer[bytes, bytes] = Consumer(
        bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest", **OPTIONS)
    ended: list[BaseException] = []

    async def read_through_close() -> None:
        while True:  # every turn of the loop, through close()'s leave, until the read says it is over
            try:
                await consumer.getmany(timeout=0)
            except Exception as exc:  # the test looks at what it was
                ended.append(exc)
                return
            await anyio.lowlevel.checkpoint()

    async with consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            while not await consumer.getmany(timeout=1):
                pass
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_through_close)
            await anyio.sleep(0.05)
            await consumer.close(timeout=10)
    assert len(ended) == 1 and isinstance(ended[0], ConsumerClosedError), ended
