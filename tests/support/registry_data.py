"""Schemas and values for the schema registry tests, written with confluent-kafka's own serializers.

``Serdes`` registers the schemas in a real registry (the ``schema_registry`` fixture's Apicurio) and
gives the bytes confluent-kafka 2.16's ``AvroSerializer``, ``ProtobufSerializer`` and
``JSONSerializer`` produce, with confluent's deserializers for the expected values.  The Protobuf
classes are generated at test time from the ``.proto`` text here, by protoc (grpcio-tools).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import importlib
import inspect
import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


@dataclasses.dataclass(frozen=True)
class Context:
    """The deserialization context of a record (what ``asyncconsumer.DeserializationContext``
    carries), for calling the deserializers directly until the consumer passes its own."""

    topic: str
    partition: int
    offset: int
    field: str = "value"
    headers: Sequence[tuple[str, bytes | None]] = ()


# -- Avro: a named type registered on its own subject and referenced, nested records, a union of
# -- records, the logical types ------------------------------------------------------------------

ADDRESS = {
    "type": "record", "name": "Address", "namespace": "sr.avro",
    "fields": [{"name": "street", "type": "string"}, {"name": "zip", "type": ["null", "int"], "default": None}],
}
CUSTOMER_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "home", "type": "sr.avro.Address"},  # the reference
    {"name": "balance", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "token", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "born", "type": {"type": "int", "logicalType": "date"}},
    {"name": "contact", "type": [
        "null",
        {"type": "record", "name": "Email", "fields": [{"name": "address", "type": "string"}]},
        {"type": "record", "name": "Phone", "fields": [{"name": "number", "type": "string"}]},
    ], "default": None},
    {"name": "tags", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["PERSON", "COMPANY"]}},
]
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "sr.avro", "fields": CUSTOMER_FIELDS}
#: Version 2 as a reader sees it: a field added with a default, one removed, int promoted to long.
CUSTOMER_READER = {
    "type": "record", "name": "Customer", "namespace": "sr.avro",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "home", "type": {
            "type": "record", "name": "Address",
            "fields": [{"name": "street", "type": "string"}, {"name": "zip", "type": ["null", "long"], "default": None},
                       {"name": "country", "type": "string", "default": "NL"}],
        }},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "vip", "type": "boolean", "default": False},
    ],
}


def customer(i: int) -> dict[str, Any]:
    contact: Any = None if i % 3 == 0 else {"address": f"c{i}@example.com"} if i % 3 == 1 else {"number": f"+31{i}"}
    return {
        "id": i,
        "name": f"customer {i} \u00e9",
        "home": {"street": f"street {i}", "zip": None if i % 2 else 1000 + i},
        "balance": decimal.Decimal(f"{i}.{i % 100:02d}"),
        "created": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=i * 1001),
        "token": uuid.UUID(int=i * 7919),
        "born": datetime.date(1990, 1, 1) + datetime.timedelta(days=i),
        "contact": contact,
        "tags": {"a": ["x", str(i)], "b": []},
        "kind": "PERSON" if i % 2 else "COMPANY",
    }


# -- Protobuf: an import (a reference), a well-known type, nested messages, oneof, map --------------

COMMON_PROTO = """\
syntax = "proto3";
package sr.common;
message Money { string currency = 1; int64 units = 2; int32 nanos = 3; }
"""
ORDER_PROTO = """\
syntax = "proto3";
package sr.orders;
import "sr_common.proto";
import "google/protobuf/timestamp.proto";
message Order {
  message Line {
    message Note { string text = 1; }
    string sku = 1;
    int32 quantity = 2;
    sr.common.Money price = 3;
    repeated Note notes = 4;
  }
  string id = 1;
  repeated Line lines = 2;
  google.protobuf.Timestamp placed = 3;
  oneof customer { string user = 4; int64 account = 5; }
  map<string, string> labels = 6;
  Status status = 7;
}
enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
message Audit { string who = 1; bytes digest = 2; }
"""
#: The same two files as ``.proto`` text in the registry (as a Java or Go serializer registers
#: them), under names no generated module has, so only the registry's reference can supply them.
TEXT_COMMON_PROTO = COMMON_PROTO.replace("package sr.common;", "package srtext.common;")
TEXT_ORDER_PROTO = (
    ORDER_PROTO.replace('import "sr_common.proto";', 'import "srtext/common.proto";')
    .replace("package sr.orders;", "package srtext.orders;")
    .replace("sr.common.Money", "srtext.common.Money")
)


def generate_protobuf(directory: Path) -> tuple[ModuleType, ModuleType]:
    """``sr_common_pb2`` and ``sr_order_pb2``, generated by protoc into ``directory`` and imported."""
    from grpc_tools import protoc

    if "sr_order_pb2" in sys.modules:
        return sys.modules["sr_common_pb2"], sys.modules["sr_order_pb2"]
    (directory / "sr_common.proto").write_text(COMMON_PROTO)
    (directory / "sr_order.proto").write_text(ORDER_PROTO)
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{directory}", f"-I{include}", f"--python_out={directory}",
                        str(directory / "sr_common.proto"), str(directory / "sr_order.proto")])
    assert code == 0, "protoc failed"
    sys.path.insert(0, str(directory))
    return importlib.import_module("sr_common_pb2"), importlib.import_module("sr_order_pb2")


def order(pb: ModuleType, common: ModuleType, i: int) -> Any:
    message = pb.Order(id=f"order-{i}", status=i % 3)
    for n in range(i % 3 + 1):
        line = message.lines.add(sku=f"sku-{n}", quantity=n + 1)
        line.price.CopyFrom(common.Money(currency="EUR", units=i * 10 + n, nanos=500_000_000))
        line.notes.add(text=f"note {n}")
    message.placed.FromDatetime(datetime.datetime(2024, 5, 1, 12, 0, i % 60))
    if i % 2:
        message.user = f"user-{i}"
    else:
        message.account = i
    message.labels["n"] = str(i)
    return message


# -- JSON Schema: a $ref to another registered subject ---------------------------------------------

JSON_ITEM = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
    "required": ["sku", "quantity"],
}
JSON_CART = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Cart",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "items": {"type": "array", "items": {"$ref": "sr-item.json"}},
        "total": {"type": "number"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id", "items"],
}


def cart(i: int) -> dict[str, Any]:
    return {
        "id": f"cart-{i}",
        "items": [{"sku": f"s{n}", "quantity": n + 1} for n in range(i % 4)],
        "total": i * 1.25,
        "note": None if i % 2 else f"note {i}",
    }


class Serdes:
    """confluent-kafka's serializers and deserializers on the registry at ``url``."""

    def __init__(self, url: str, proto_dir: Path) -> None:
        self.url = url
        self.client = SchemaRegistryClient({"url": url})
        self.common_pb2, self.order_pb2 = generate_protobuf(proto_dir)
        self._subjects: set[str] = set()

    def ctx(self, topic: str) -> SerializationContext:
        return SerializationContext(topic, MessageField.VALUE)

    def register(self, subject: str, schema: Any, schema_type: str, references: Sequence[SchemaReference] = ()) -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return int(self.client.register_schema(subject, Schema(text, schema_type, list(references))))

    # Avro
    def avro_serializer(self) -> AvroSerializer:
        self.register("sr.avro.Address", ADDRESS, "AVRO")
        schema = Schema(json.dumps(CUSTOMER), "AVRO", [SchemaReference("sr.avro.Address", "sr.avro.Address", 1)])
        return AvroSerializer(self.client, schema, conf={"auto.register.schemas": True})

    def avro_deserializer(self, reader: Any = None, return_record_name: bool = False) -> AvroDeserializer:
        return AvroDeserializer(
            self.client, json.dumps(reader) if reader is not None else None, return_record_name=return_record_name
        )

    def avro(self, topic: str, count: int) -> list[bytes]:
        serializer = self.avro_serializer()
        return [serializer(customer(i), self.ctx(topic)) for i in range(count)]

    # Protobuf
    def protobuf(self, topic: str, count: int) -> list[bytes]:
        orders = ProtobufSerializer(self.order_pb2.Order, self.client, {"use.deprecated.format": False})
        lines = ProtobufSerializer(self.order_pb2.Order.Line.Note, self.client, {"use.deprecated.format": False})
        out = []
        for i in range(count):
            if i % 4 == 3:  # a nested message: index [0, 0, 0]
                out.append(lines(self.order_pb2.Order.Line.Note(text=f"n{i}"), self.ctx(topic + "-note")))
            else:
                out.append(orders(order(self.order_pb2, self.common_pb2, i), self.ctx(topic)))
        return out

    def protobuf_deserializer(self, message_type: Any) -> ProtobufDeserializer:
        return ProtobufDeserializer(message_type, {"use.deprecated.format": False})

    # JSON Schema
    def json(self, topic: str, count: int) -> list[bytes]:
        self.register("sr-item.json", JSON_ITEM, "JSON")
        schema = Schema(json.dumps(JSON_CART), "JSON", [SchemaReference("sr-item.json", "sr-item.json", 1)])
        serializer = JSONSerializer(schema, self.client)
        return [serializer(cart(i), self.ctx(topic)) for i in range(count)]

    def json_deserializer(self) -> JSONDeserializer:
        return JSONDeserializer(None, schema_registry_client=self.client)


# -- fixtures and helpers of the schema registry tests --------------------------------------------------

#: The context ``decode`` passes when none is given.
CTX = Context("orders", 3, 42)


async def decode(deserializer: Any, data: bytes, context: Any = CTX) -> Any:
    """``deserializer.deserialize(data, context)``, awaited when it returns an awaitable."""
    result = deserializer.deserialize(data, context)
    return await result if inspect.isawaitable(result) else result


def theirs(deserializer: Any, data: bytes, topic: str) -> Any:
    """What confluent-kafka's ``deserializer`` makes of a record's value."""
    return deserializer(data, SerializationContext(topic, MessageField.VALUE))
