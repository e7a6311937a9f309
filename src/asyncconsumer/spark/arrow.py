"""The source's output schema, as a Spark ``StructType`` and as the matching Arrow schema.

Spark's Kafka source columns: ``key`` binary, ``value`` binary, ``topic`` string, ``partition``
int, ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int, and with
``includeHeaders=true`` ``headers`` array<struct<key: string, value: binary>>.  Every column is
nullable, as in Spark.

Rows go to Spark as Arrow record batches.  Spark checks that a batch's schema *equals* the Arrow
form of the declared schema (``timestamp[us, tz=UTC]``, a list whose item field is named
``element``), so :func:`arrow_schema` spells it out exactly and :func:`records_to_batch` builds
the columns with those types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from ..structs import ConsumerRecord

__all__ = ["arrow_schema", "records_to_batch", "spark_schema"]

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


def spark_schema(include_headers: bool) -> StructType:
    """The DataFrame schema (Spark's Kafka source schema)."""
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
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
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


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects for :func:`spark_schema` (``include_headers`` alike)."""
    return _SCHEMA_WITH_HEADERS if include_headers else _SCHEMA


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
