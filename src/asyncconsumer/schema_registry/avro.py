"""Avro records in the schema registry wire format, decoded with fastavro.

For each writer schema id the registry is asked once for the schema and the schemas it references
(named types registered under their own subjects); fastavro parses them once into one set of named
types, and the parsed schema is kept.  Every later record of that id is a dictionary lookup and one
``fastavro.schemaless_reader`` call.  With ``reader_schema``, each record is resolved from its
writer's schema to the reader's (Avro schema resolution: added fields take their defaults, removed
ones are skipped, promotions such as int to long apply), as confluent-kafka's ``AvroDeserializer``
does with ``schema_str``.

Values are what confluent-kafka's ``AvroDeserializer`` returns for the same bytes: records as dicts,
logical types as Python objects (``decimal`` as ``Decimal``, ``timestamp-millis`` as an aware UTC
``datetime``, ``uuid`` as ``UUID``, ``date`` as ``date``), a top-level ``"bytes"`` schema as the
raw payload (Confluent's serializers write ``bytes`` values unframed).
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from ._base import HEADER_SIZE, RegistryDeserializer, SchemaCompileError
from .client import RegisteredSchema, SchemaRegistryClient
from .errors import ContextLike, SerializationError

try:
    import fastavro
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError("AvroDeserializer needs fastavro: pip install 'asyncconsumer[avro]'") from None

__all__ = ["AvroDeserializer", "AvroSchema", "load_schema"]

#: A schema as JSON text, or already loaded (``json.loads``'s result).
AvroSchema = str | Mapping[str, Any] | Sequence[Any]

_RAW_BYTES = object()


def load_schema(schema: AvroSchema) -> Any:
    """``schema`` as ``json.loads`` gives it (a primitive's bare name, ``"string"``, as it is)."""
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except ValueError:
            return schema  # a primitive's bare name: "string"
    return schema


def _is_bytes(parsed: Any) -> bool:
    return parsed == "bytes" or (isinstance(parsed, dict) and parsed.get("type") == "bytes")


class AvroDeserializer(RegistryDeserializer[Any, Any]):
    """Decodes Avro in the schema registry wire format into Python values.

    ``client``
        The :class:`SchemaRegistryClient` to fetch writer schemas from.
    ``reader_schema``
        The schema your code reads with (JSON text or a dict): each record is resolved from its
        writer's schema to this one, so your code sees one shape whatever version wrote the record.
        A record whose writer schema cannot be resolved to it raises :class:`SerializationError`.
        Default: each record as its writer wrote it.
    ``return_record_name``
        For a union of several record types, return ``(record name, record)`` tuples instead of the
        bare record, so your code can tell the branches apart (fastavro's and confluent-kafka's
        option of the same name).

    Use it as ``value_deserializer=`` (or ``key_deserializer=``) of a ``Consumer``, or call
    :meth:`deserialize` yourself.
    """

    def __init__(
        self,
        client: SchemaRegistryClient,
        *,
        reader_schema: AvroSchema | None = None,
        return_record_name: bool = False,
    ) -> None:
        super().__init__(client)
        if not isinstance(return_record_name, bool):
            raise TypeError(f"return_record_name: expected a bool, got {return_record_name!r}")
        self.return_record_name = return_record_name
        self._reader: Any = None
        if reader_schema is not None:
            try:
                self._reader = fastavro.parse_schema(load_schema(reader_schema))
            except Exception as exc:
                raise ValueError(f"reader_schema is not a valid Avro schema: {exc}") from exc

    def deserialize(self, data: bytes, context: ContextLike | None = None) -> Any | Awaitable[Any]:
        # The base class's path, inlined: this runs once per record.
        if len(data) > HEADER_SIZE and data[0] == 0:
            schema_id = int.from_bytes(data[1:HEADER_SIZE], "big")
            writer = self._compiled.get(schema_id)
            if writer is not None and writer is not _RAW_BYTES:
                stream = io.BytesIO(data)
                stream.seek(HEADER_SIZE)
                try:
                    return fastavro.schemaless_reader(stream, writer, self._reader, self.return_record_name)
                except Exception as exc:
                    raise self._payload_error(exc, context, schema_id) from exc
        return super().deserialize(data, context)

    def _payload_error(self, exc: Exception, context: ContextLike | None, schema_id: int) -> SerializationError:
        return SerializationError(
            f"the payload does not decode with schema id {schema_id}: {type(exc).__name__}: {exc}", context, schema_id
        )

    async def _compile(self, registered: RegisteredSchema, schema_id: int) -> Any:
        if registered.schema_type != "AVRO":
            raise SchemaCompileError(f"is a {registered.schema_type} schema, not Avro")
        named: dict[str, Any] = {}

        def add(name: str, referenced: RegisteredSchema) -> None:
            fastavro.parse_schema(load_schema(referenced.schema), named_schemas=named)

        await self._references(registered, add)
        writer = fastavro.parse_schema(load_schema(registered.schema), named_schemas=named)
        if _is_bytes(writer):
            return _RAW_BYTES
        return writer

    def _decode(self, compiled: Any, data: bytes, context: ContextLike | None, schema_id: int) -> Any:
        if compiled is _RAW_BYTES:
            return bytes(data[HEADER_SIZE:])
        stream = io.BytesIO(data)
        stream.seek(HEADER_SIZE)
        return fastavro.schemaless_reader(stream, compiled, self._reader, self.return_record_name)
