"""A user's module, checked with mypy --strict by tests/consumer/test_deserializers.py (never run).

The three forms of deserializer and the ``on_deserialization_error`` policies are accepted,
``Consumer[K, V]`` and ``ShareConsumer[K, V]`` type what every read API returns, and what is
refused is refused: each ``# type: ignore[...]`` below must be needed (``warn_unused_ignores``,
on with ``strict``), so mypy fails if that line stops being an error.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, assert_type

from asyncconsumer import (
    Consumer,
    ConsumerRecord,
    DeserializationContext,
    RecordDeserializationError,
    RecordDeserializer,
    ShareConsumer,
    ShareConsumerRecord,
    TopicPartition,
)


@dataclass
class Order:
    id: int


class OrderDeserializer:
    """A ``RecordDeserializer[Order]``: the value at once, or an awaitable."""

    def deserialize(self, data: bytes, context: DeserializationContext) -> Order | Awaitable[Order]:
        return Order(int(data))


async def order_key(data: bytes, context: DeserializationContext) -> str:
    return f"{context.topic}/{data.decode()}"


async def dead_letter(record: ConsumerRecord[bytes, bytes], error: RecordDeserializationError) -> None:
    assert_type(record.value, bytes | None)
    assert_type(error.skip_to, int)


async def share_dead_letter(record: ShareConsumerRecord[bytes, bytes], error: RecordDeserializationError) -> None:
    assert_type(record.delivery_count, int)


def takes_protocol(deserializer: RecordDeserializer[Order]) -> None: ...


takes_protocol(OrderDeserializer())


async def reads() -> None:
    consumer: Consumer[str, Order] = Consumer(
        key_deserializer=order_key, value_deserializer=OrderDeserializer(), on_deserialization_error=dead_letter
    )
    record = await consumer.getone()
    assert_type(record.key, str | None)
    assert_type(record.value, Order | None)
    polled = await consumer.getmany(timeout=1.0)
    assert_type(polled, dict[TopicPartition, list[ConsumerRecord[str, Order]]])
    async for one in consumer:
        assert_type(one, ConsumerRecord[str, Order])
    async for batch in consumer.batches():
        assert_type(batch, list[ConsumerRecord[str, Order]])
    async for _, stream in consumer.partitions():
        async for streamed in stream:
            assert_type(streamed, ConsumerRecord[str, Order])

    plain = Consumer(value_deserializer=json.loads, on_deserialization_error="skip")
    assert_type(plain, Consumer[bytes, bytes])  # without an annotation: bytes, as documented

    share: ShareConsumer[bytes, dict[str, Any]] = ShareConsumer(
        group_id="g", value_deserializer=json.loads, on_deserialization_error=share_dead_letter
    )
    async for job in share:
        assert_type(job.value, dict[str, Any] | None)


def refused() -> None:
    Consumer(value_deserializer=3)  # type: ignore[arg-type]
    Consumer(on_deserialization_error="ignore")  # type: ignore[arg-type]
    takes_protocol(order_key)  # type: ignore[arg-type]
