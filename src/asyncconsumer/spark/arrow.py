"""The source's output schema, as a Spark ``StructType`` and as the matching Arrow schema.

Spark's Kafka source columns: ``key`` binary, ``value`` binary, ``topic`` string, ``partition``
int, ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int, and with
``includeHeaders=true`` ``headers`` array<struct<key: string, value: binary>>.  Every column is
nullable, as in Spark.

Rows go to Spark as Arrow record batches.  Spark checks that a batch's schema *equals* the Arrow
form of the declared schema (``timestamp[us, tz=UTC]``, a list whose item field is named
``element``), so :func:`arrow_schema` spells it out exactly and :func:`records_to_batch` builds
the columns with those types.

With ``keyFormat=avro`` / ``valueFormat=avro`` that column's type is the reader schema's, as
``asyncconsumer.schema_registry.AvroColumns`` makes it (Spark's ``from_avro`` types, already in
the Arrow form Spark expects): :func:`column_types` looks it up in the registry on the driver, and
pins a subject's latest version for the executors; :func:`column_decoders` makes the executors'
decoders.  Those need the ``avro`` extra (fastavro, httpx), imported only when a format is set.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import ConfigError
from ..tls_stores import load_cert_chain
from .options import ColumnFormat, RegistryOptions, SourceOptionError, SourceOptions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from ..schema_registry import AvroColumns, SchemaRegistryClient
    from ..structs import ConsumerRecord

__all__ = [
    "arrow_schema",
    "column_decoders",
    "column_types",
    "records_to_batch",
    "registry_client",
    "require_avro",
    "spark_schema",
]

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_HEADERS_TYPE = pa.list_(pa.field("element", _HEADER_TYPE))
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", _TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
]
_SCHEMA = pa.schema(_BASE_FIELDS)
_SCHEMA_WITH_HEADERS = pa.schema([*_BASE_FIELDS, pa.field("headers", _HEADERS_TYPE)])


def spark_schema(include_headers: bool, key_type: Any = None, value_type: Any = None) -> StructType:
    """The DataFrame schema (Spark's Kafka source schema); ``key_type``/``value_type``: the Arrow
    type of a decoded key or value column (None: binary)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType() if key_type is None else from_arrow_type(key_type)),
        StructField("value", BinaryType() if value_type is None else from_arrow_type(value_type)),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def arrow_schema(include_headers: bool, key_type: Any = None, value_type: Any = None) -> pa.Schema:
    """The Arrow schema Spark expects for :func:`spark_schema` (the same arguments)."""
    schema = _SCHEMA_WITH_HEADERS if include_headers else _SCHEMA
    for index, type_ in ((0, key_type), (1, value_type)):
        if type_ is not None:
            schema = schema.set(index, pa.field(schema.field(index).name, type_))
    return schema


# -- keyFormat / valueFormat: the schema registry --------------------------------------------------


def require_avro() -> Any:
    """``asyncconsumer.schema_registry.arrow``, or a :class:`SourceOptionError` naming the extra to install."""
    try:
        import asyncconsumer.schema_registry.arrow as module
    except ImportError as exc:
        raise SourceOptionError(
            f"asyncconsumer source: keyFormat=avro and valueFormat=avro need the avro extra ({exc}): "
            "pip install 'asyncconsumer[avro,spark]'"
        ) from None
    return module


def registry_client(registry: RegistryOptions) -> SchemaRegistryClient:
    """The ``SchemaRegistryClient`` of ``schemaRegistryUrl`` and the ``schemaRegistry.*`` options."""
    module = require_avro()
    user_info = registry.get("basic.auth.user.info")
    basic_auth = tuple(user_info.split(":", 1)) if user_info is not None else None
    context: ssl.SSLContext | None = None
    ca, cert = registry.get("ssl.ca.location"), registry.get("ssl.certificate.location")
    if ca is not None or cert is not None:
        try:
            context = ssl.create_default_context(cafile=ca)
            if cert is not None:
                load_cert_chain(
                    context, cert, registry.get("ssl.key.location"), password=registry.get("ssl.key.password"),
                    where="schemaRegistry.ssl.key.location",
                )
        except (OSError, ssl.SSLError, ConfigError) as exc:
            raise SourceOptionError(f"asyncconsumer source: invalid schemaRegistry.ssl.* option: {exc}") from None
    timeout = registry.get("timeout.ms")
    client: SchemaRegistryClient = module.SchemaRegistryClient(
        registry.url,
        basic_auth=basic_auth,
        ssl_context=context,
        **({"timeout": int(timeout) / 1000} if timeout is not None else {}),
    )
    return client


async def _reader_schema(client: SchemaRegistryClient, column: ColumnFormat) -> Any:
    """The reader schema of ``column``: its JSON, or its subject's (pinned or latest) version."""
    if column.schema is not None:
        return column.schema
    assert column.subject is not None
    if column.version is None:
        return await client.get_latest_version(column.subject)
    return await client.get_version(column.subject, column.version)


async def column_decoders(options: SourceOptions, client: SchemaRegistryClient) -> tuple[Any, Any]:
    """The ``(key_format, value_format)`` of ``Consumer.arrow_batch`` for ``options`` (None: binary)."""
    module = require_avro()
    decoders: list[AvroColumns | None] = []
    for column in (options.key_format, options.value_format):
        decoders.append(
            None if column is None else module.AvroColumns(client, reader_schema=await _reader_schema(client, column))
        )
    return decoders[0], decoders[1]


async def column_types(options: SourceOptions) -> tuple[SourceOptions, Any, Any]:
    """On the driver: ``options`` with each format's subject pinned to the version it has now, and
    the Arrow types of the key and value columns (None: binary).  Errors (the registry, a subject
    it does not have, a schema with no Arrow type) are :class:`SourceOptionError` naming the option."""
    if not options.formats:
        return options, None, None
    assert options.registry is not None
    from ..schema_registry import SchemaRegistryError, UnsupportedSchemaError

    types: list[Any] = []
    pinned: dict[str, ColumnFormat | None] = {}
    async with registry_client(options.registry) as client:
        for name, column in (("key_format", options.key_format), ("value_format", options.value_format)):
            if column is None:
                types.append(None)
                pinned[name] = None
                continue
            try:
                reader = await _reader_schema(client, column)
                decoder = require_avro().AvroColumns(client, reader_schema=reader)
                types.append(await decoder.arrow_type())
            except (SchemaRegistryError, UnsupportedSchemaError, ValueError) as exc:
                raise SourceOptionError(
                    f"asyncconsumer source: {column.field}Format=avro with {column.describe()}: {exc}"
                ) from exc
            version = getattr(reader, "version", None)
            pinned[name] = dataclasses.replace(column, version=version) if column.subject is not None else column
    resolved = dataclasses.replace(options, key_format=pinned["key_format"], value_format=pinned["value_format"])
    return resolved, types[0], types[1]


def records_to_batch(records: Sequence[ConsumerRecord[Any, Any]], include_headers: bool) -> pa.RecordBatch:
    """One Arrow record batch holding ``records`` (raw records: ``key``/``value`` are bytes or None)."""
    n = len(records)
    keys: list[bytes | None] = [None] * n
    values: list[bytes | None] = [None] * n
    offsets: list[int] = [0] * n
    timestamps: list[int] = [0] * n
    timestamp_types: list[int] = [0] * n
    topics: list[str] = [""] * n
    partitions: list[int] = [0] * n
    for i, r in enumerate(records):
        keys[i] = r.key
        values[i] = r.value
        topics[i] = r.topic
        partitions[i] = r.partition
        offsets[i] = r.offset
        timestamps[i] = r.timestamp * 1000  # ms -> us; -1 ("no timestamp") stays 1 ms before the epoch, as in Spark
        timestamp_types[i] = r.timestamp_type
    columns: list[pa.Array] = [
        pa.array(keys, type=pa.binary()),
        pa.array(values, type=pa.binary()),
        _repeated_or_array(topics, pa.string()),
        _repeated_or_array(partitions, pa.int32()),
        pa.array(offsets, type=pa.int64()),
        pa.array(timestamps, type=_TIMESTAMP_TYPE),
        pa.array(timestamp_types, type=pa.int32()),
    ]
    if include_headers:
        columns.append(_headers_column(records))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _repeated_or_array(items: list[Any], type_: pa.DataType) -> pa.Array:
    # A read covers one partition, so topic and partition are usually constant: skip the conversion.
    if items and items[0] == items[-1] and all(x == items[0] for x in items):
        return pa.repeat(pa.scalar(items[0], type=type_), len(items))
    return pa.array(items, type=type_)


def _headers_column(records: Sequence[ConsumerRecord[Any, Any]]) -> pa.Array:
    list_offsets = [0]
    header_keys: list[str] = []
    header_values: list[bytes | None] = []
    for r in records:
        for key, value in r.headers:
            header_keys.append(key)
            header_values.append(value)
        list_offsets.append(len(header_keys))
    items = pa.StructArray.from_arrays(
        [pa.array(header_keys, type=pa.string()), pa.array(header_values, type=pa.binary())],
        fields=list(_HEADER_TYPE),
    )
    return pa.ListArray.from_arrays(pa.array(list_offsets, type=pa.int32()), items, type=_HEADERS_TYPE)
