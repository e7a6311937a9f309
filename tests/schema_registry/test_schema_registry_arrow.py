"""Registry Avro as Arrow columns (``asyncconsumer.schema_registry.AvroColumns``): the Arrow types
are Spark's ``from_avro`` types; what confluent-kafka's ``AvroSerializer`` wrote through a real
registry (Apicurio) decodes into the values confluent's ``AvroDeserializer`` returns, reshaped as
from_avro reshapes them (support/avro_columns.py); every writer version of a batch is resolved to
one reader schema; ``arrow_batches(value_format=..., key_format=...)`` hands out decoded batches,
stops at a record that does not decode (the ones before it handed out, nothing lost) and at a
registry that is down (nothing handed out).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from support.avro_columns import from_avro_customer, from_avro_reader
from support.consumers import FAST
from support.registry_data import ADDRESS, CUSTOMER, CUSTOMER_FIELDS, CUSTOMER_READER, Serdes, customer, theirs

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.app.arrow import ColumnContext
from asyncconsumer.errors import RecordError
from asyncconsumer.schema_registry import (
    AvroColumns,
    SchemaRegistryClient,
    SchemaRegistryUnavailableError,
    SerializationError,
    UnsupportedSchemaError,
    WireFormatError,
)
from asyncconsumer.schema_registry import arrow as avro_arrow
from asyncconsumer.schema_registry.arrow import avro_arrow_type

pytestmark = pytest.mark.anyio
pytest_plugins = ["support.registry_fixtures"]

COUNT = 12
UTC_US = pa.timestamp("us", tz="UTC")


def f(name: str, type_: Any, nullable: bool = False) -> Any:
    return pa.field(name, type_, nullable=nullable)


# -- the types: Spark's from_avro mapping (SchemaConverters.toSqlType), as Arrow types -----------------

TYPES: list[tuple[Any, Any]] = [
    ("boolean", pa.bool_()), ("int", pa.int32()), ("long", pa.int64()), ("float", pa.float32()),
    ("double", pa.float64()), ("bytes", pa.binary()), ("string", pa.string()), ("null", pa.null()),
    ({"type": "int", "logicalType": "date"}, pa.date32()),
    ({"type": "int", "logicalType": "time-millis"}, pa.int32()),
    ({"type": "long", "logicalType": "time-micros"}, pa.int64()),
    ({"type": "long", "logicalType": "timestamp-millis"}, UTC_US),
    ({"type": "long", "logicalType": "timestamp-micros"}, UTC_US),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("us")),
    ({"type": "string", "logicalType": "uuid"}, pa.string()),
    ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 4}, pa.decimal128(38, 4)),
    ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 10, "scale": 2},
     pa.decimal128(10, 2)),
    ({"type": "fixed", "name": "F", "size": 4}, pa.binary()),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, pa.string()),
    ({"type": "array", "items": ["null", "long"]}, pa.list_(f("element", pa.int64(), True))),
    ({"type": "map", "values": "string"}, pa.map_(f("key", pa.string()), f("value", pa.string()))),
    (["int", "long"], pa.int64()),
    (["null", "float", "double"], pa.float64()),
    (["null", "string", "int", "boolean"],
     pa.struct([f("member0", pa.string(), True), f("member1", pa.int32(), True), f("member2", pa.bool_(), True)])),
    ({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": ["null", {"type": "record", "name": "S", "fields": [{"name": "b", "type": "int"}]}]},
        {"name": "c", "type": "S"},
    ]}, pa.struct([f("a", pa.struct([f("b", pa.int32())]), True), f("c", pa.struct([f("b", pa.int32())]))])),
]


@pytest.mark.parametrize("schema,expected", TYPES, ids=[json.dumps(s)[:40] for s, _ in TYPES])
def test_arrow_types_are_spark_from_avro_types(schema: Any, expected: Any) -> None:
    assert avro_arrow_type(json.dumps(schema)) == expected


@pytest.mark.parametrize("schema,field", [
    ({"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]}, "value.next"),
    ({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": {"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 0}}]}, "value.x"),
    ({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "long", "string"]}]}, "value.u"),
], ids=["recursive", "decimal-39", "int-long-string"])
def test_a_type_no_column_holds_names_its_field(schema: Any, field: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match=f"^{field}: "):
        avro_arrow_type(schema)


def test_the_test_customer_has_spark_types() -> None:
    # references, nested records, a union of two records, map of arrays, enum, logical types
    t = avro_arrow_type(CUSTOMER, references=[ADDRESS])
    assert t.field("home").type == pa.struct([f("street", pa.string()), f("zip", pa.int32(), True)])
    assert t.field("contact").nullable and t.field("contact").type == pa.struct([
        f("member0", pa.struct([f("address", pa.string())]), True),
        f("member1", pa.struct([f("number", pa.string())]), True),
    ])
    assert t.field("tags").type == pa.map_(f("key", pa.string()), f("value", pa.list_(f("element", pa.string()))))
    assert (t.field("created").type, t.field("born").type, t.field("token").type, t.field("kind").type) == (
        UTC_US, pa.date32(), pa.string(), pa.string())


# -- decoding, against confluent-kafka ------------------------------------------------------------------

#: A later writer version: one field more (read by version 1 as a reader, it is skipped).
CUSTOMER_V2 = {**CUSTOMER, "fields": [*CUSTOMER_FIELDS, {"name": "vip", "type": "boolean", "default": False}]}


def v2_serializer(serdes: Serdes) -> AvroSerializer:
    schema = Schema(json.dumps(CUSTOMER_V2), "AVRO", [SchemaReference("sr.avro.Address", "sr.avro.Address", 1)])
    return AvroSerializer(serdes.client, schema, conf={"auto.register.schemas": True})


@pytest.fixture(scope="module")
def written(serdes: Serdes) -> dict[str, Any]:
    """Version 1 and version 2 customers of one subject, written by confluent-kafka."""
    topic = "arrow-avro-columns"
    v1 = serdes.avro(topic, COUNT)
    v2_write = v2_serializer(serdes)
    v2 = [v2_write({**customer(i), "vip": i % 2 == 0}, serdes.ctx(topic)) for i in range(COUNT, 2 * COUNT)]
    return {"topic": topic, "v1": v1, "v2": v2}


def context(n: int, topic: str = "t") -> ColumnContext:
    return ColumnContext(topic, 0, "value", pa.array(range(100, 100 + n), pa.int64()))


@pytest.fixture(params=[False, True], ids=["on-loop", "thread"])
def threaded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param:
        monkeypatch.setattr(avro_arrow, "THREAD_ROWS", 1)
    return bool(request.param)


async def test_values_decode_as_confluent_then_from_avro_do(
    serdes: Serdes, written: dict[str, Any], threaded: bool
) -> None:
    column = pa.array([*written["v1"][:6], None, *written["v1"][6:]], pa.binary())
    confluent = serdes.avro_deserializer(return_record_name=True)
    expected = [from_avro_customer(theirs(confluent, d, written["topic"])) if d else None for d in column.to_pylist()]
    async with SchemaRegistryClient(serdes.url) as client:
        columns = AvroColumns(client)
        assert columns.type is None
        decoded = await columns.decode_column(column, context(len(column)))
        assert decoded.type == avro_arrow_type(CUSTOMER, references=[ADDRESS]) == columns.type
        assert decoded.to_pylist() == expected
        assert decoded.null_count == 1


async def test_every_writer_version_is_resolved_to_one_reader_schema(serdes: Serdes, written: dict[str, Any]) -> None:
    mixed = [d for pair in zip(written["v1"], written["v2"], strict=True) for d in pair]
    column = pa.array(mixed, pa.binary())
    async with SchemaRegistryClient(serdes.url) as client:
        # the reader schema given: confluent's deserializer with the same reader schema agrees
        confluent = serdes.avro_deserializer(reader=CUSTOMER_READER)
        by_reader = await AvroColumns(client, reader_schema=json.dumps(CUSTOMER_READER)).decode_column(
            column, context(len(column)))
        assert by_reader.type == avro_arrow_type(CUSTOMER_READER)
        assert by_reader.to_pylist() == [from_avro_reader(theirs(confluent, d, written["topic"])) for d in mixed]
        # the subject's latest version (2) as the reader: version 1 records get vip's default
        latest = await client.get_latest_version(f"{written['topic']}-value")
        by_latest = await AvroColumns(client, reader_schema=latest).decode_column(column, context(len(column)))
        assert by_latest.type == avro_arrow_type(CUSTOMER_V2, references=[ADDRESS])
        vip = [i % 2 == 1 and (i // 2) % 2 == 0 for i in range(len(mixed))]  # version 1: the default
        assert [r["vip"] for r in by_latest.to_pylist()] == vip
        # no reader schema: the first writer's (version 1) for good; version 2's extra field skipped
        first_seen = AvroColumns(client)
        one = await first_seen.decode_column(column, context(len(column)))
        two = await first_seen.decode_column(pa.array(written["v2"], pa.binary()), context(COUNT))
        assert one.type == two.type == avro_arrow_type(CUSTOMER, references=[ADDRESS])
        confluent_v1 = serdes.avro_deserializer(reader=None, return_record_name=True)
        assert one.to_pylist()[0] == from_avro_customer(theirs(confluent_v1, written["v1"][0], written["topic"]))
        assert two.to_pylist()[0]["id"] == COUNT and "vip" not in two.to_pylist()[0]


async def test_a_bad_record_is_named_by_its_offset(serdes: Serdes, written: dict[str, Any]) -> None:
    async with SchemaRegistryClient(serdes.url) as client:
        columns = AvroColumns(client)
        with pytest.raises(WireFormatError) as wire:
            await columns.decode_column(pa.array([written["v1"][0], b"plain text"], pa.binary()), context(2, "orders"))
        where = (wire.value.topic, wire.value.partition, wire.value.offset, wire.value.field)
        assert where == ("orders", 0, 101, "value")
        truncated = written["v1"][1][:12]
        with pytest.raises(SerializationError, match="does not decode with schema id") as bad:
            await columns.decode_column(pa.array([written["v1"][0], written["v1"][2], truncated]), context(3))
        assert bad.value.offset == 102 and bad.value.schema_id == int.from_bytes(truncated[1:5], "big")


# -- arrow_batches() on a broker -------------------------------------------------------------------------


def key_serializer(serdes: Serdes) -> Callable[[str, str], bytes]:
    serializer = AvroSerializer(serdes.client, json.dumps("string"), conf={"auto.register.schemas": True})
    return lambda key, topic: serializer(key, SerializationContext(topic, MessageField.KEY))


async def test_arrow_batches_decode_keys_and_values_and_stop_at_a_bad_record(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], serdes: Serdes,
    written: dict[str, Any],
) -> None:
    topic = new_topic(1)
    keys = key_serializer(serdes)
    values: list[bytes | None] = [*written["v1"][:5], None, b"not avro", *written["v1"][5:]]
    produce(topic, [(0, keys(f"k{i}", topic), v) for i, v in enumerate(values)])
    confluent = serdes.avro_deserializer(return_record_name=True)
    expected = [from_avro_customer(theirs(confluent, v, topic)) if v and v != b"not avro" else None for v in values]
    tp = TopicPartition(topic, 0)
    async with SchemaRegistryClient(serdes.url) as client:
        value_format = AvroColumns(client)
        async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
                            enable_auto_commit=False, **FAST) as consumer:
            consumer.assign([tp])
            got: list[Any] = []
            with anyio.fail_after(60):
                batches = consumer.arrow_batches(key_format=AvroColumns(client), value_format=value_format)
                while len(got) < 6:  # the records before the bad one (offset 6) are handed out
                    batch = await batches.__anext__()
                    assert batch.schema.field("value").type == avro_arrow_type(CUSTOMER, references=[ADDRESS])
                    assert batch.column("key").type == pa.string()
                    assert batch.column("key").to_pylist() == [f"k{o}" for o in batch.column("offset").to_pylist()]
                    got.extend(batch.column("value").to_pylist())
                assert got == expected[:6]
                assert await consumer.position(tp) == 6
                await consumer.commit()
                for _ in range(2):  # the bad record stops the reader every time, and loses nothing
                    with pytest.raises(WireFormatError) as bad:
                        await batches.__anext__()
                    assert (bad.value.offset, bad.value.skip_to) == (6, 7)
                    assert await consumer.position(tp) == 6
                assert await consumer.committed(tp) == 6
                await consumer.seek(tp, bad.value.skip_to)
                while len(got) < len(values) - 1:
                    got.extend((await batches.__anext__()).column("value").to_pylist())
            assert got == expected[:6] + expected[7:]


async def test_a_registry_that_is_down_hands_out_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], serdes: Serdes,
    written: dict[str, Any],
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, v) for v in written["v1"][:3]])
    tp = TopicPartition(topic, 0)
    async with SchemaRegistryClient("http://127.0.0.1:9/", timeout=0.3) as down, \
            SchemaRegistryClient(serdes.url) as up:
        async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
            consumer.assign([tp])
            with anyio.fail_after(60):
                with pytest.raises(SchemaRegistryUnavailableError) as error:
                    await consumer.arrow_batch(tp, timeout=30, value_format=AvroColumns(down))
                assert "at offset 0" in str(error.value) and not isinstance(error.value, RecordError)
                assert await consumer.position(tp) == 0
                # the batch went back: read again once the registry answers
                batch = await consumer.arrow_batch(tp, timeout=30, value_format=AvroColumns(up))
            assert batch is not None and batch.column("offset").to_pylist() == [0, 1, 2]
            assert [v["id"] for v in batch.column("value").to_pylist()] == [0, 1, 2]


def test_a_format_that_is_not_a_column_decoder_is_named() -> None:
    consumer: Consumer[Any, Any] = Consumer(bootstrap_servers="127.0.0.1:9")
    with pytest.raises(TypeError, match="value_format: expected a column decoder"):
        consumer.arrow_batches(value_format=lambda data: data)  # type: ignore[arg-type]
