"""A user's tests of a consumer, with the plugin's kafka_broker / kafka_topic / kafka_produce."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer import Consumer, TopicPartition

SEEN_TOPICS: list[str] = []


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def read_all(bootstrap: str, topic: str, count: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        partitions = [TopicPartition(topic, p) for p in sorted(await consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        rows: list[tuple[int, int, bytes | None, bytes | None]] = []
        while len(rows) < count:
            for records in (await consumer.getmany(timeout=10)).values():
                rows += [(r.partition, r.offset, r.key, r.value) for r in records]
        return sorted(rows)


@pytest.mark.anyio
async def test_sync_produce_then_consume(kafka_broker: Any, kafka_topic: str, kafka_produce: Any) -> None:
    SEEN_TOPICS.append(kafka_topic)
    print(f"kafka_broker: {type(kafka_broker).__name__}")  # the plugin's tests check which (with -s)
    assert kafka_produce(kafka_topic, [b"a", (0, b"k", b"b")]) == [(0, 0), (0, 1)]
    assert await read_all(kafka_broker.bootstrap, kafka_topic, 2) == [(0, 0, None, b"a"), (0, 1, b"k", b"b")]


@pytest.mark.anyio
async def test_async_produce(kafka_broker: Any, kafka_topic: str, kafka_produce: Any) -> None:
    SEEN_TOPICS.append(kafka_topic)
    assert await kafka_produce.aio(kafka_topic, [b"x", b"y", b"z"]) == [(0, 0), (0, 1), (0, 2)]
    assert [row[3] for row in await read_all(kafka_broker.bootstrap, kafka_topic, 3)] == [b"x", b"y", b"z"]


@pytest.mark.kafka_topic(partitions=3)
@pytest.mark.anyio
async def test_topic_marker(kafka_broker: Any, kafka_topic: str, kafka_produce: Any) -> None:
    SEEN_TOPICS.append(kafka_topic)
    assert kafka_produce(kafka_topic, [(2, None, b"p2"), (0, None, b"p0")]) == [(2, 0), (0, 0)]
    assert await read_all(kafka_broker.bootstrap, kafka_topic, 2) == [(0, 0, None, b"p0"), (2, 0, None, b"p2")]


def test_each_test_had_its_own_topic() -> None:
    assert len(SEEN_TOPICS) == 6  # three async tests, each on asyncio and trio
    assert len(set(SEEN_TOPICS)) == 6
