"""Schema registry deserializers: Avro, Protobuf and JSON Schema records in the Confluent wire format.

    from asyncconsumer import Consumer
    from asyncconsumer.schema_registry import AvroDeserializer, SchemaRegistryClient

    async with SchemaRegistryClient("http://registry:8081") as registry:
        async with Consumer(bootstrap_servers=..., group_id="billing",
                            value_deserializer=AvroDeserializer(registry)) as consumer:
            consumer.subscribe(["orders"])
            async for record in consumer:
                record.value  # a dict, as confluent-kafka's AvroDeserializer returns it

The pieces (docs/typed-records.md):

- :class:`SchemaRegistryClient` (``client.py``): async reads of a Confluent-compatible registry,
  cached by id and by subject and version, one request per schema id however many records need it
  at once, bounded in time.
- :class:`AvroDeserializer` (fastavro), :class:`ProtobufDeserializer` (protobuf) and
  :class:`JSONSchemaDeserializer` (jsonschema): each a ``deserialize(data, context)`` that returns
  the value directly when the record's schema is cached, and an awaitable only when it must be
  fetched (``_base.py``: the wire format and the compiled-schema cache).
- :class:`AvroColumns` (``arrow.py``; fastavro and pyarrow): a column of Avro records, as
  ``Consumer.arrow_batches()`` reads it, decoded into one typed Arrow column (a struct for
  records), as Spark's ``from_avro`` types it; the PySpark source's ``valueFormat=avro``.
- The errors (``errors.py``): :class:`SchemaRegistryError` when the registry cannot answer,
  :class:`SerializationError` (and :class:`WireFormatError`, :class:`UnknownSchemaError`) when a
  record cannot be decoded, naming its topic, partition and offset.

Each deserializer needs its extra: ``pip install 'asyncconsumer[avro]'``, ``[protobuf]`` or
``[jsonschema]`` (each brings httpx for the client); importing one without it raises an
``ImportError`` that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import DEFAULT_TIMEOUT, RegisteredSchema, SchemaReference, SchemaRegistryClient
from .errors import (
    SchemaNotFoundError,
    SchemaRegistryError,
    SchemaRegistryUnavailableError,
    SerializationError,
    UnknownSchemaError,
    UnsupportedSchemaError,
    WireFormatError,
)

if TYPE_CHECKING:
    from .arrow import AvroColumns
    from .avro import AvroDeserializer
    from .json_schema import JSONSchemaDeserializer
    from .protobuf import ProtobufDeserializer

__all__ = [
    "DEFAULT_TIMEOUT",
    "AvroColumns",
    "AvroDeserializer",
    "JSONSchemaDeserializer",
    "ProtobufDeserializer",
    "RegisteredSchema",
    "SchemaNotFoundError",
    "SchemaReference",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "SchemaRegistryUnavailableError",
    "SerializationError",
    "UnknownSchemaError",
    "UnsupportedSchemaError",
    "WireFormatError",
]

#: The deserializers, imported on first use: each needs only its own extra.
_LAZY = {
    "AvroColumns": ".arrow",
    "AvroDeserializer": ".avro",
    "ProtobufDeserializer": ".protobuf",
    "JSONSchemaDeserializer": ".json_schema",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
