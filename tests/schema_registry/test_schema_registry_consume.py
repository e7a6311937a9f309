"""Topics written by confluent-kafka's Avro, Protobuf and JSON Schema serializers through a real
registry (Apicurio), read by asyncconsumer and decoded by asyncconsumer.schema_registry into the
values confluent-kafka's own deserializers return, record for record: on each broker (Tansu,
Apache Kafka) and each runtime (asyncio, trio).

Each deserializer is called directly with the record's context built here, and
``test_consumer_decodes_with_registry_deserializers`` hands one to the consumer itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from google.protobuf import json_format
from support.consumers import FAST, tps
from support.registry_data import (
    Context,
    Serdes,
    customer,
    theirs,
)

from asyncconsumer import Consumer, ConsumerRecord
from asyncconsumer.schema_registry import (
    AvroDeserializer,
    JSONSchemaDeserializer,
    ProtobufDeserializer,
    SchemaRegistryClient,
)

pytestmark = pytest.mark.anyio
#: The fixtures ``registry`` (the session's Apicurio) and ``serdes`` (confluent-kafka's serdes on it).
pytest_plugins = ["support.registry_fixtures"]

COUNT = 12  # records of each format


@pytest.fixture(scope="session")
def written(serdes: Serdes) -> dict[str, list[bytes]]:
    """Each format's record bytes, as confluent-kafka's serializers wrote them (once a session)."""
    return {
        "avro": serdes.avro("sr-consume-avro", COUNT),
        "protobuf": serdes.protobuf("sr-consume-protobuf", COUNT),
        "json": serdes.json("sr-consume-json", COUNT),
    }


async def read_bytes(bootstrap: str, topic: str, n: int) -> list[ConsumerRecord[Any, Any]]:
    records: list[ConsumerRecord[Any, Any]] = []
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign(tps(topic, 1))
        with anyio.fail_after(60):
            async for record in consumer:
                records.append(record)
                if len(records) == n:
                    break
    return records


async def test_topics_of_each_format_decode_as_confluent_decodes_them(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], serdes: Serdes,
    written: dict[str, list[bytes]],
) -> None:
    pb = serdes.order_pb2
    async with SchemaRegistryClient(serdes.url) as client:
        ours = {
            "avro": AvroDeserializer(client),
            "protobuf": ProtobufDeserializer(client),
            "json": JSONSchemaDeserializer(client),
        }
        confluent: dict[str, Callable[[int], Any]] = {
            "avro": lambda i: serdes.avro_deserializer(),
            "protobuf": lambda i: serdes.protobuf_deserializer(pb.Order.Line.Note if i % 4 == 3 else pb.Order),
            "json": lambda i: serdes.json_deserializer(),
        }
        for kind, payloads in written.items():
            topic = new_topic(1)
            produce(topic, [(0, b"k%d" % i, data, [("format", kind.encode())]) for i, data in enumerate(payloads)])
            records = await read_bytes(bootstrap, topic, len(payloads))
            assert [r.offset for r in records] == list(range(len(payloads)))
            for i, record in enumerate(records):
                context = Context(record.topic, record.partition, record.offset, "value", record.headers)
                value = ours[kind].deserialize(record.value, context)
                if inspect.isawaitable(value):
                    value = await value
                expected = theirs(confluent[kind](i), record.value, topic)
                if kind == "protobuf":
                    assert value.DESCRIPTOR.full_name == expected.DESCRIPTOR.full_name
                    assert json_format.MessageToDict(value) == json_format.MessageToDict(expected), (kind, i)
                else:
                    assert value == expected, (kind, i)
        assert ours["avro"].deserialize(written["avro"][0], context) == customer(0)  # cached: no awaitable


async def test_consumer_decodes_with_registry_deserializers(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], serdes: Serdes,
    written: dict[str, list[bytes]],
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, data) for data in written["avro"]])
    async with SchemaRegistryClient(serdes.url) as client:
        options: dict[str, Any] = {"value_deserializer": AvroDeserializer(client)}
        async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST, **options) as consumer:
            consumer.assign(tps(topic, 1))
            values = []
            with anyio.fail_after(60):
                async for record in consumer:
                    values.append(record.value)
                    if len(values) == COUNT:
                        break
    assert values == [customer(i) for i in range(COUNT)]
