"""Registry Avro as Arrow columns: :class:`AvroColumns` turns a column of records in the Confluent
wire format (``arrow_batches()``'s raw ``key`` or ``value``) into one typed Arrow column, as Spark's
``from_avro`` types it.

The story of a batch (:meth:`AvroColumns.decode_column`):

1. **Headers.**  Each record's magic byte and 4-byte schema id are read (a record that is not in
   the wire format is a :class:`WireFormatError` naming its offset).  The writer schemas of ids
   not seen before are fetched (one registry request per id, shared by every batch waiting for
   it, and one per schema it references) and compiled once: fastavro parses them, with the
   logical types whose Python objects Arrow would only take apart again (timestamps, dates, times,
   uuid) left as the numbers and strings Arrow stores.
2. **One reader schema, one Arrow type.**  Every record is resolved from its writer's schema to
   the *reader* schema (Avro schema resolution, fastavro's): the one given, or else the writer
   schema of the first record this object decodes, kept for its life.  So every batch has the
   same Arrow type, whatever mix of writer versions it holds.  The type is the reader schema's,
   mapped as Spark's ``from_avro`` maps it (:func:`avro_arrow_type`; the table is in
   docs/typed-records.md).
3. **Decode, then one conversion.**  fastavro decodes each payload (its compiled reader, no Python
   per field), and pyarrow converts all the values of the batch into the column in one call (a
   union of several types is first reshaped into Spark's ``member0``, ``member1`` ... struct; a
   ``timestamp-millis`` is built as milliseconds and cast to Spark's microseconds).  A batch of
   :data:`THREAD_ROWS` records or more is decoded in a worker thread, so the event loop (the
   consumer's fetches and heartbeats) keeps running between the interpreter's thread switches.

A record that does not decode raises :class:`SerializationError` naming its topic, partition,
offset and schema id; the consumer hands out the records before it and stops at it.  A registry
that cannot answer raises :class:`SchemaRegistryError`.  A reader schema with a type no Arrow
column of Spark's can hold (a recursive record, a decimal of more than 38 digits, a union whose
branches decode to the same Python type) raises :class:`UnsupportedSchemaError` naming the field.
"""

from __future__ import annotations

import dataclasses
import decimal
import io
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from ..app.arrow import ColumnContext
from ._base import HEADER_SIZE, MAGIC_BYTE, SchemaCompileError, compile_once, visit_references
from .avro import AvroSchema, load_schema
from .client import RegisteredSchema, SchemaRegistryClient, SingleFlight
from .errors import (
    SerializationError,
    UnsupportedSchemaError,
    WireFormatError,
)

try:
    import fastavro
    import pyarrow as pa
    import pyarrow.compute  # Array.cast needs it: imported here, not by a first batch on the event loop
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError(
        "AvroColumns needs fastavro and pyarrow: pip install 'asyncconsumer[avro,arrow]'"
    ) from None

__all__ = ["THREAD_ROWS", "AvroColumns", "avro_arrow_type"]

#: Batches of at least this many records are decoded in a worker thread (fewer: on the event loop,
#: where a thread's hand-over would cost more than the decode).
THREAD_ROWS = 1000

#: Logical types fastavro would turn into Python objects that Arrow stores as plain numbers or
#: strings: decoded without them (the Arrow type gives the meaning back).  ``decimal`` stays:
#: pyarrow builds decimals from ``Decimal`` objects.
_NUMERIC_LOGICAL = frozenset({
    "date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros", "timestamp-nanos",
    "local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos", "uuid",
})
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
#: The largest decimal precision of Spark's ``DecimalType`` (and of Arrow's ``decimal128``).
MAX_PRECISION = 38
_UTC_US = pa.timestamp("us", tz="UTC")


def _strip(schema: Any) -> Any:
    """``schema`` (loaded JSON) without the logical types of :data:`_NUMERIC_LOGICAL`."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if isinstance(schema, dict):
        return {
            k: _strip(v) if k in ("type", "items", "values", "fields") else v
            for k, v in schema.items()
            if not (k == "logicalType" and v in _NUMERIC_LOGICAL)
        }
    return schema


def _parse(schemas: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
    """The last of ``schemas`` parsed by fastavro after the named types of the ones before it (the
    schemas it references): (the parsed schema, its named types by full name)."""
    named: dict[str, Any] = {}
    parsed: Any = None
    for schema in schemas:
        parsed = fastavro.parse_schema(schema, named_schemas=named)
    return parsed, named


# -- Avro types to Arrow types (Spark's from_avro) ---------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Node:
    """One Avro type as a column: its Arrow ``type``, the ``build`` type pyarrow makes from the
    decoded values (``type`` but for timestamps in milliseconds), whether it is nullable (a union
    with null), and ``convert``: what reshapes a decoded non-null value first (None: nothing)."""

    type: Any
    build: Any
    nullable: bool
    convert: Callable[[Any], Any] | None = None


def _field(name: str, node: _Node, build: bool = False) -> Any:
    return pa.field(name, node.build if build else node.type, nullable=node.nullable)


class _Mapper:
    """Spark's ``SchemaConverters.toSqlType`` over a fastavro-parsed schema, as Arrow types (the
    form ``pyspark``'s ``to_arrow_type`` gives them: ``element`` list items, ``key``/``value`` map
    entries, ``timestamp[us, tz=UTC]``).

    ``tuples``: fastavro decodes with ``return_named_type``, so a union's value of a named type
    (record, enum, fixed) comes as ``(full name, value)``: needed to tell the branches of a union
    of several records apart.  :func:`_map` turns it on when a union needs it."""

    def __init__(self, named: dict[str, Any], tuples: bool) -> None:
        self.named = named
        self.tuples = tuples
        #: A union of several types with a named type among them was seen (``tuples`` needed).
        self.needs_tuples = False

    def resolve(self, schema: Any) -> Any:
        """A named type's reference (its full name) replaced by its definition."""
        while isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.named:
                raise UnsupportedSchemaError(f"unknown named type {schema!r}")
            schema = self.named[schema]
        while isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
            schema = schema["type"]
        return schema

    def kind(self, schema: Any) -> str:
        schema = self.resolve(schema)
        if isinstance(schema, str):
            return schema
        if isinstance(schema, list):
            return "union"
        return str(schema["type"])

    def node(self, schema: Any, path: str, records: frozenset[str] = frozenset()) -> _Node:
        schema = self.resolve(schema)
        if isinstance(schema, str):
            return self.primitive(schema, None, {}, path)
        if isinstance(schema, list):
            return self.union(schema, path, records)
        kind = schema["type"]
        if kind in ("record", "error"):
            return self.record(schema, path, records)
        if kind == "enum":
            return _Node(pa.string(), pa.string(), False)
        if kind == "array":
            item = self.node(schema["items"], f"{path}[]", records)
            convert = None if item.convert is None else _each(item.convert)
            return _Node(pa.list_(_field("element", item)), pa.list_(_field("element", item, True)), False, convert)
        if kind == "map":
            value = self.node(schema["values"], f"{path}{{}}", records)
            key = pa.field("key", pa.string(), nullable=False)
            convert = None if value.convert is None else _each_value(value.convert)
            return _Node(
                pa.map_(key, _field("value", value)), pa.map_(key, _field("value", value, True)), False, convert
            )
        if kind == "fixed":
            if schema.get("logicalType") == "decimal":
                return self.decimal(schema, path)
            return _Node(pa.binary(), pa.binary(), False)
        if kind in _PRIMITIVES:
            return self.primitive(kind, schema.get("logicalType"), schema, path)
        raise UnsupportedSchemaError(f"{path}: Avro type {kind!r} is not one Arrow or Spark columns have")

    def primitive(self, kind: str, logical: Any, schema: dict[str, Any], path: str) -> _Node:
        if kind == "null":
            return _Node(pa.null(), pa.null(), True)
        if kind == "int":
            arrow = pa.date32() if logical == "date" else pa.int32()
            return _Node(arrow, arrow, False)
        if kind == "long":
            unit = "ms" if str(logical).endswith("-millis") else "us"
            if logical in ("timestamp-millis", "timestamp-micros"):
                return _Node(_UTC_US, pa.timestamp(unit, tz="UTC"), False)
            if logical in ("local-timestamp-millis", "local-timestamp-micros"):
                return _Node(pa.timestamp("us"), pa.timestamp(unit), False)
            return _Node(pa.int64(), pa.int64(), False)
        if kind == "bytes" and logical == "decimal":
            return self.decimal(schema, path)
        arrow = {"boolean": pa.bool_(), "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(),
                 "string": pa.string()}[kind]
        return _Node(arrow, arrow, False)

    def decimal(self, schema: dict[str, Any], path: str) -> _Node:
        precision, scale = schema.get("precision"), schema.get("scale", 0)
        if not isinstance(precision, int) or not isinstance(scale, int) or not 0 <= scale <= precision:
            raise UnsupportedSchemaError(f"{path}: decimal with precision {precision!r} and scale {scale!r}")
        if precision > MAX_PRECISION:
            raise UnsupportedSchemaError(
                f"{path}: decimal({precision}, {scale}) has more than {MAX_PRECISION} digits, the most Spark's "
                "DecimalType and Arrow's decimal128 hold"
            )
        arrow = pa.decimal128(precision, scale)
        return _Node(arrow, arrow, False)

    def record(self, schema: dict[str, Any], path: str, records: frozenset[str]) -> _Node:
        name = schema["name"]
        if name in records:
            raise UnsupportedSchemaError(
                f"{path}: record {name!r} contains itself (a recursive type), which no Arrow or Spark column can hold"
            )
        inner = records | {name}
        fields = [(f["name"], self.node(f["type"], f"{path}.{f['name']}", inner)) for f in schema["fields"]]
        convert = _record([(n, c.convert) for n, c in fields if c.convert is not None])
        return _Node(
            pa.struct([_field(n, c) for n, c in fields]), pa.struct([_field(n, c, True) for n, c in fields]), False,
            convert,
        )

    def union(self, branches: list[Any], path: str, records: frozenset[str]) -> _Node:
        others = [b for b in branches if self.kind(b) != "null"]
        nullable = len(others) < len(branches)
        if not others:
            return _Node(pa.null(), pa.null(), True)
        if len(others) == 1:
            node = self.node(others[0], path, records)
            convert = node.convert
            if self.tuples and self.kind(others[0]) in _NAMED:
                convert = _unwrap(convert)
            return dataclasses.replace(node, nullable=nullable or node.nullable, convert=convert)
        kinds = {self.kind(b) for b in others}
        if len(others) == 2 and kinds in ({"int", "long"}, {"float", "double"}):
            arrow = pa.int64() if "int" in kinds else pa.float64()  # as Spark: the wider of the two
            return _Node(arrow, arrow, nullable)
        # Spark's layout of any other union: a struct of the branches, member0, member1 ..., one set.
        members = [self.node(b, f"{path}.member{i}", records) for i, b in enumerate(others)]
        named = [i for i, b in enumerate(others) if self.kind(b) in _NAMED]
        if named:
            self.needs_tuples = True
        by_name = {self.full_name(others[i]): i for i in named} if self.tuples else {}
        by_type: dict[type, int] = {}
        for i, branch in enumerate(others):
            if i in named:  # decoded as (full name, value): told apart by name (the first pass's result is not used)
                continue
            for py_type in self.python_types(branch):
                if py_type in by_type:
                    first = self.describe(others[by_type[py_type]])
                    raise UnsupportedSchemaError(
                        f"{path}: a union of {first} and {self.describe(branch)} (with other types): both decode "
                        f"to {py_type.__name__}, so the member a value belongs to cannot be told"
                    )
                by_type[py_type] = i
        names = [f"member{i}" for i in range(len(members))]
        arrow = pa.struct([pa.field(n, m.type) for n, m in zip(names, members, strict=True)])
        build = pa.struct([pa.field(n, m.build) for n, m in zip(names, members, strict=True)])
        return _Node(arrow, build, nullable, _members(names, [m.convert for m in members], by_name, by_type))

    def full_name(self, schema: Any) -> str:
        if isinstance(schema, str):
            return schema
        resolved = self.resolve(schema)
        return str(resolved["name"])

    def describe(self, schema: Any) -> str:
        kind = self.kind(schema)
        return f"{kind} {self.full_name(schema)}" if kind in _NAMED else kind

    def python_types(self, schema: Any) -> tuple[type, ...]:
        """What fastavro decodes a union branch of ``schema`` to (the logical types of
        :data:`_NUMERIC_LOGICAL` left out)."""
        resolved = self.resolve(schema)
        kind = self.kind(resolved)
        decimal_ = isinstance(resolved, dict) and resolved.get("logicalType") == "decimal"
        if kind in ("bytes", "fixed"):
            return (decimal.Decimal,) if decimal_ else (bytes,)
        return {
            "boolean": (bool,), "int": (int,), "long": (int,), "float": (float,), "double": (float,),
            "string": (str,), "enum": (str,), "array": (list,), "map": (dict,), "record": (dict,), "error": (dict,),
        }[kind]


def _each(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda items: [None if x is None else convert(x) for x in items]


def _each_value(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda entries: {k: None if x is None else convert(x) for k, x in entries.items()}


def _unwrap(convert: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A nullable union's one named type, decoded as ``(name, value)``: its value."""
    if convert is None:
        return lambda named: named[1]
    return lambda named: convert(named[1])


def _record(converts: list[tuple[str, Callable[[Any], Any]]]) -> Callable[[Any], Any] | None:
    if not converts:
        return None

    def convert(record: dict[str, Any]) -> dict[str, Any]:
        for name, field_convert in converts:
            value = record[name]
            if value is not None:
                record[name] = field_convert(value)
        return record

    return convert


def _members(
    names: list[str], converts: list[Callable[[Any], Any] | None], by_name: dict[str, int], by_type: dict[type, int]
) -> Callable[[Any], Any]:
    """A value of a union of several types as Spark's struct of members: the one it belongs to set,
    the others null.  A named type's value comes as ``(full name, value)``."""

    def convert(value: Any) -> dict[str, Any]:
        if by_name and type(value) is tuple:
            name, value = value
            index = by_name[name]
        else:
            index = by_type[type(value)]
        out: dict[str, Any] = dict.fromkeys(names)
        member_convert = converts[index]
        out[names[index]] = value if member_convert is None else member_convert(value)
        return out

    return convert


def _map(parsed: Any, named: dict[str, Any], path: str) -> tuple[_Node, bool]:
    """The column node of a parsed schema, and whether fastavro must decode it with
    ``return_named_type`` (a union of several types with a record, enum or fixed among them)."""
    mapper = _Mapper(named, tuples=False)
    node = mapper.node(parsed, path)
    if not mapper.needs_tuples:
        return node, False
    return _Mapper(named, tuples=True).node(parsed, path), True


def avro_arrow_type(schema: AvroSchema, *, references: Sequence[AvroSchema] = ()) -> Any:
    """The Arrow type of a column of ``schema``'s values, as Spark's ``from_avro`` types them
    (``references``: the schemas of the named types it uses from elsewhere, each before the ones
    that use it).  Raises :class:`UnsupportedSchemaError` naming the field that has no such type."""
    parsed, named = _parse([load_schema(s) for s in (*references, schema)])
    return _map(parsed, named, "value")[0].type


# -- the schemas of one AvroColumns ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    """A schema compiled twice: as given (for the Arrow type) and stripped (for decoding)."""

    loaded: tuple[Any, ...]  # the referenced schemas, then the schema (loaded JSON)
    stripped: Any  # fastavro-parsed, without the logical types of _NUMERIC_LOGICAL
    #: A top-level ``"bytes"`` schema: Confluent's serializers write the bytes themselves, unframed.
    raw_bytes: bool

    @classmethod
    def compile(cls, loaded: Sequence[Any]) -> _Schema:
        stripped, _ = _parse([_strip(s) for s in loaded])
        raw = stripped == "bytes" or (isinstance(stripped, dict) and stripped.get("type") == "bytes"
                                       and "logicalType" not in stripped)
        return cls(tuple(loaded), stripped, raw)


@dataclasses.dataclass(frozen=True, slots=True)
class _Reader:
    schema: _Schema
    node: _Node
    tuples: bool

    @classmethod
    def of(cls, schema: _Schema) -> _Reader:
        parsed, named = _parse(schema.loaded)
        node, tuples = _map(parsed, named, "value")
        return cls(schema, node, tuples)


@dataclasses.dataclass(frozen=True, slots=True)
class _Where:
    """A record's place, for errors (what ``SerializationError`` reads of a context)."""

    topic: str
    partition: int
    offset: int
    field: str


class _BadRecord(Exception):
    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


class AvroColumns:
    """Decodes a column of Avro records in the schema registry wire format into one Arrow column.

    Give it to ``Consumer.arrow_batches(value_format=...)`` (or ``key_format=``): the batch's
    ``value`` column then holds the decoded records, a struct column for a record schema, typed
    as Spark's ``from_avro`` types them; a tombstone is a null.

    ``client``
        The :class:`SchemaRegistryClient` the writer schemas are fetched from.
    ``reader_schema``
        The schema the column has: each record is resolved from its writer's schema to this one
        (fields added with defaults, removed ones skipped, promotions), so every batch has the
        same Arrow type.  JSON text, a loaded dict, or a :class:`RegisteredSchema` from the client
        (``await client.get_latest_version("orders-value")``; the schemas it references are
        fetched).  Default: the writer schema of the first record decoded, kept from then on; a
        later writer's records are resolved to it, and a record that cannot be fails.

    One object can serve several consumers; each writer schema is fetched and compiled once.
    """

    def __init__(self, client: SchemaRegistryClient, *, reader_schema: AvroSchema | RegisteredSchema | None = None):
        if not isinstance(client, SchemaRegistryClient):
            raise TypeError(f"client: expected a SchemaRegistryClient, got {type(client).__name__}")
        self.client = client
        self._writers: dict[int, _Schema] = {}
        self._compiling: SingleFlight[Any, _Schema] = SingleFlight()
        self._reader: _Reader | None = None
        self._registered_reader: RegisteredSchema | None = None
        if isinstance(reader_schema, RegisteredSchema):
            if reader_schema.schema_type != "AVRO":
                raise ValueError(f"reader_schema is a {reader_schema.schema_type} schema, not Avro")
            self._registered_reader = reader_schema
        elif reader_schema is not None:
            try:
                schema = _Schema.compile([load_schema(reader_schema)])
            except UnsupportedSchemaError:
                raise
            except Exception as exc:
                raise ValueError(f"reader_schema is not a valid Avro schema: {exc}") from exc
            self._reader = _Reader.of(schema)

    @property
    def type(self) -> Any:
        """The column's Arrow type, once known (None before the first batch when no reader schema
        was given as JSON)."""
        return None if self._reader is None else self._reader.node.type

    async def arrow_type(self) -> Any:
        """The column's Arrow type: the reader schema's (its references fetched first), or None
        when no reader schema was given and no record has been decoded yet."""
        reader = await self._reader_schema()
        return None if reader is None else reader.node.type

    async def _reader_schema(self) -> _Reader | None:
        if self._reader is None and self._registered_reader is not None:
            registered = self._registered_reader

            async def compile_reader() -> _Schema:
                return await self._compile(registered)

            schema = await self._compiling.run("reader", compile_reader)
            if self._reader is None:
                self._reader = _Reader.of(schema)
        return self._reader

    async def _compile(self, registered: RegisteredSchema) -> _Schema:
        if registered.schema_type != "AVRO":
            raise SchemaCompileError(f"is a {registered.schema_type} schema, not Avro")
        loaded: list[Any] = []
        await visit_references(self.client, registered, lambda name, schema: loaded.append(load_schema(schema.schema)))
        loaded.append(load_schema(registered.schema))
        try:
            return _Schema.compile(loaded)
        except Exception as exc:
            raise SchemaCompileError(f"does not compile: {type(exc).__name__}: {exc}") from exc

    async def _writer(self, schema_id: int, where: _Where) -> _Schema:
        """The compiled writer schema of ``schema_id``, fetched once."""
        compiled = self._writers.get(schema_id)
        if compiled is not None:
            return compiled

        async def fetch() -> _Schema:
            registered = await self.client.get_schema(schema_id)
            schema = await self._compile(registered)
            if len(self._writers) >= self.client.cache_size:
                del self._writers[next(iter(self._writers))]  # the oldest
            self._writers[schema_id] = schema
            return schema

        return await compile_once(self._compiling, schema_id, fetch, where)

    async def decode_column(self, column: Any, context: ColumnContext) -> Any:
        """``column`` (a pyarrow binary array of records in the wire format, nulls allowed) as one
        Arrow array of the reader schema's type (:class:`~asyncconsumer.app.arrow.ColumnDecoder`).

        Raises :class:`WireFormatError`, :class:`UnknownSchemaError` or
        :class:`SerializationError` naming the first record that does not decode (the ones
        before it do), :class:`SchemaRegistryError` when the registry cannot answer, and
        :class:`UnsupportedSchemaError` when the reader schema has no Arrow type."""
        items: list[bytes | None] = column.to_pylist()

        def where(index: int) -> _Where:
            return _Where(context.topic, context.partition, int(context.offsets[index].as_py()), context.field)

        ids = [-1] * len(items)
        first: dict[int, int] = {}
        for i, data in enumerate(items):
            if data is None:
                continue
            if len(data) < HEADER_SIZE or data[0] != MAGIC_BYTE:
                detail = (
                    f"{len(data)} byte(s) are too short for the schema registry wire format (a magic byte and a "
                    "4-byte schema id come first)" if len(data) < HEADER_SIZE
                    else f"magic byte is {data[0]}, expected 0"
                )
                raise WireFormatError(f"{detail}: not written by a schema registry serializer?", where(i))
            ids[i] = schema_id = int.from_bytes(data[1:HEADER_SIZE], "big")
            first.setdefault(schema_id, i)
        for schema_id, i in first.items():
            if schema_id not in self._writers:
                await self._writer(schema_id, where(i))
        reader = await self._reader_schema()
        if reader is None:
            if not first:
                return pa.nulls(len(items))  # only tombstones, and no schema yet to type them
            schema_id, i = next(iter(first.items()))
            self._reader = reader = _Reader.of(self._writers[schema_id])
        writers = {schema_id: self._writers[schema_id] for schema_id in first}
        try:
            if len(items) >= THREAD_ROWS:
                return await anyio.to_thread.run_sync(_build, reader, writers, items, ids)
            return _build(reader, writers, items, ids)
        except _BadRecord as bad:
            schema_id = ids[bad.index]
            raise SerializationError(
                f"the payload does not decode with schema id {schema_id} into the reader schema's column: "
                f"{type(bad.cause).__name__}: {bad.cause}", where(bad.index), schema_id,
            ) from bad.cause

    def __repr__(self) -> str:
        known = "no reader schema yet" if self._reader is None else f"type {self._reader.node.type}"
        return f"<AvroColumns {self.client!r} ({known}, {len(self._writers)} writer schema(s))>"


def _build(reader: _Reader, writers: dict[int, _Schema], items: list[bytes | None], ids: list[int]) -> Any:
    """Decode ``items`` (their schema ids ``ids``) and convert them into the reader's column; a
    record that fails raises :class:`_BadRecord` with its index."""
    node = reader.node
    target = reader.schema.stripped
    # A writer schema equal to the reader's is read without a reader schema: no resolution (fastavro
    # would also compare the two schemas on every call).
    plans = {
        schema_id: (w.stripped, None if w.stripped == target else target, w.raw_bytes)
        for schema_id, w in writers.items()
    }
    read = fastavro.schemaless_reader
    tuples = reader.tuples
    convert = node.convert
    rows: list[Any] = [None] * len(items)
    for i, data in enumerate(items):
        if data is None:
            continue
        writer, target_schema, raw = plans[ids[i]]
        try:
            if raw:
                value: Any = bytes(data[HEADER_SIZE:])
            else:
                stream = io.BytesIO(data)
                stream.seek(HEADER_SIZE)
                value = read(stream, writer, target_schema, return_named_type=tuples)
            rows[i] = value if convert is None else convert(value)
        except Exception as exc:
            raise _BadRecord(i, exc) from exc
    try:
        array = pa.array(rows, type=node.build)
        return array if node.build == node.type else array.cast(node.type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        for i, row in enumerate(rows):  # which record: convert one at a time
            try:
                one = pa.array([row], type=node.build)
                if node.build != node.type:
                    one.cast(node.type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                raise _BadRecord(i, exc) from exc
        raise
