"""What the three registry deserializers share: the Confluent wire format's header, and a cache of
compiled decoders by schema id with one compilation per id however many records wait for it.

The wire format (what Confluent's serializers write, in every language):

    byte 0      magic byte, 0
    bytes 1-4   the schema id, a big-endian unsigned 32-bit int
    Protobuf only: the message-index array, zigzag varints: its length, then the index of the
                message among the file's top-level messages, then among that one's nested
                messages ...; the single byte 0 stands for [0] (the first top-level message)
    the rest    the payload: Avro binary, a Protobuf message, JSON text

``deserialize(data, context)`` is the fast path: header, dictionary lookup of the compiled decoder,
decode, all synchronous.  Only a schema id not yet compiled makes it return an awaitable, which
fetches the schema (and its references) through the client and compiles it once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .client import RegisteredSchema, SchemaRegistryClient, SingleFlight
from .errors import (
    ContextLike,
    SchemaNotFoundError,
    SchemaRegistryError,
    SerializationError,
    UnknownSchemaError,
    WireFormatError,
    with_context,
)

__all__ = [
    "HEADER_SIZE",
    "MAGIC_BYTE",
    "RegistryDeserializer",
    "SchemaCompileError",
    "compile_once",
    "read_message_indexes",
    "schema_id_of",
    "visit_references",
]

MAGIC_BYTE = 0
HEADER_SIZE = 5
#: Longer message-index arrays are refused as corrupt (Confluent's own limit).
MAX_INDEXES = 100_000

T = TypeVar("T")
#: What a compiled schema is, per deserializer (a parsed Avro schema, a message class ...).
C = TypeVar("C")


def schema_id_of(data: bytes, context: ContextLike | None) -> int:
    """The schema id of a record in the wire format, or :class:`WireFormatError`."""
    if len(data) < HEADER_SIZE:
        raise WireFormatError(
            f"{len(data)} byte(s) are too short for the schema registry wire format (a magic byte and a 4-byte "
            "schema id come first): not written by a schema registry serializer?", context,
        )
    if data[0] != MAGIC_BYTE:
        raise WireFormatError(
            f"magic byte is {data[0]}, expected 0: not in the schema registry wire format (written by another "
            "serializer?)", context,
        )
    return int.from_bytes(data[1:HEADER_SIZE], "big")


def _varint(data: bytes, pos: int, context: ContextLike | None, schema_id: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, next position)."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireFormatError("the message-index array ends before its varint does", context, schema_id)
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise WireFormatError("a varint of the message-index array is longer than 10 bytes", context, schema_id)


def read_message_indexes(data: bytes, context: ContextLike | None, schema_id: int) -> tuple[tuple[int, ...], int]:
    """Protobuf's message-index array after the header: (the indexes, where the payload starts)."""
    count, pos = _varint(data, HEADER_SIZE, context, schema_id)
    if count == 0:
        return (0,), pos
    if count < 0 or count > MAX_INDEXES:
        raise WireFormatError(f"message-index array of length {count}: corrupt", context, schema_id)
    indexes = []
    for _ in range(count):
        index, pos = _varint(data, pos, context, schema_id)
        if index < 0:
            raise WireFormatError(f"negative message index {index}: corrupt", context, schema_id)
        indexes.append(index)
    return tuple(indexes), pos


class RegistryDeserializer(Generic[C, T]):
    """Base of :class:`AvroDeserializer`, :class:`ProtobufDeserializer` and
    :class:`JSONSchemaDeserializer`: a subclass says how to compile a registered schema
    (:meth:`_compile`, async: it may fetch references) and how to decode a payload with it
    (:meth:`_decode`)."""

    #: ``format=`` of the id lookups (Protobuf asks for ``"serialized"``).
    _format: str | None = None

    def __init__(self, client: SchemaRegistryClient) -> None:
        if not isinstance(client, SchemaRegistryClient):
            raise TypeError(f"client: expected a SchemaRegistryClient, got {type(client).__name__}")
        self.client = client
        self._compiled: dict[int, C] = {}
        self._compiling: SingleFlight[int, C] = SingleFlight()

    def deserialize(self, data: bytes, context: ContextLike | None = None) -> T | Awaitable[T]:
        """The value of one record's key or value (``data``, in the Confluent wire format): directly
        when its schema is compiled, else an awaitable that fetches and compiles it first (one
        registry request per schema id, shared by every record waiting for it).

        Raises :class:`WireFormatError`, :class:`UnknownSchemaError` or :class:`SerializationError`
        for a bad record, :class:`SchemaRegistryError` when the registry cannot answer.  ``context``
        (an ``asyncconsumer.DeserializationContext``) names the record in errors; it may be None."""
        schema_id = schema_id_of(data, context)
        compiled = self._compiled.get(schema_id)
        if compiled is None:
            return self._fetch_then_decode(data, context, schema_id)
        return self._decode_or_raise(compiled, data, context, schema_id)

    async def _fetch_then_decode(self, data: bytes, context: ContextLike | None, schema_id: int) -> T:
        compiled = self._compiled.get(schema_id)
        if compiled is None:
            compiled = await compile_once(
                self._compiling, schema_id, lambda: self._fetch_and_compile(schema_id), context)
        return self._decode_or_raise(compiled, data, context, schema_id)

    async def _fetch_and_compile(self, schema_id: int) -> C:
        registered = await self.client.get_schema(schema_id, format=self._format)
        try:
            compiled = await self._compile(registered, schema_id)
        except (SchemaRegistryError, SchemaCompileError):
            raise
        except Exception as exc:
            raise SchemaCompileError(f"does not compile: {type(exc).__name__}: {exc}") from exc
        if len(self._compiled) >= self.client.cache_size:
            del self._compiled[next(iter(self._compiled))]  # the oldest
        self._compiled[schema_id] = compiled
        return compiled

    def _decode_or_raise(self, compiled: C, data: bytes, context: ContextLike | None, schema_id: int) -> T:
        try:
            return self._decode(compiled, data, context, schema_id)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(
                f"the payload does not decode with schema id {schema_id}: {type(exc).__name__}: {exc}",
                context, schema_id,
            ) from exc

    async def _compile(self, registered: RegisteredSchema, schema_id: int) -> C:
        raise NotImplementedError

    def _decode(self, compiled: C, data: bytes, context: ContextLike | None, schema_id: int) -> T:
        raise NotImplementedError

    async def _references(self, registered: RegisteredSchema, visit: Callable[[str, RegisteredSchema], None]) -> None:
        """Every schema ``registered`` references, depth first, each once: ``visit(name, schema)``."""
        await visit_references(self.client, registered, visit, format=self._format)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.client!r} ({len(self._compiled)} schema(s) compiled)>"


async def compile_once(
    flights: SingleFlight[int, C], schema_id: int, fetch: Callable[[], Awaitable[C]], context: ContextLike | None
) -> C:
    """``fetch()`` (get ``schema_id`` from the registry and compile it), one call at a time per id
    whoever asks, its failures as the record's errors: an id the registry does not know is
    :class:`UnknownSchemaError`, one it cannot give a :class:`SchemaRegistryError` naming the
    record, and one that does not compile a :class:`SerializationError`."""
    try:
        return await flights.run(schema_id, fetch)
    except SchemaNotFoundError as exc:
        raise UnknownSchemaError(exc, context, schema_id) from exc
    except SchemaRegistryError as exc:
        raise with_context(exc, context) from exc
    except SchemaCompileError as exc:
        raise SerializationError(f"schema id {schema_id} {exc}", context, schema_id) from exc.__cause__


async def visit_references(
    client: SchemaRegistryClient,
    registered: RegisteredSchema,
    visit: Callable[[str, RegisteredSchema], None],
    *,
    format: str | None = None,
    seen: set[tuple[str, int]] | None = None,
) -> None:
    """Every schema ``registered`` references, depth first (a reference's own references before
    it), each once: ``visit(name, schema)``.  A reference the registry does not have is a
    :class:`SchemaCompileError`."""
    seen = set() if seen is None else seen
    for ref in registered.references:
        if (ref.subject, ref.version) in seen:
            continue
        seen.add((ref.subject, ref.version))
        try:
            target = await client.get_version(ref.subject, ref.version, format=format)
        except SchemaNotFoundError as exc:
            raise SchemaCompileError(
                f"references {ref.name!r} as subject {ref.subject!r} version {ref.version}, which "
                f"the registry does not have ({exc})"
            ) from exc
        await visit_references(client, target, visit, format=format, seen=seen)
        visit(ref.name, target)


class SchemaCompileError(Exception):
    """A registered schema (or one it references) does not compile."""
