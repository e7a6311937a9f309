"""OTLP ``MetricsData`` (OpenTelemetry's metrics protocol, protobuf): what a PushTelemetry request
carries (KIP-714).

Only the few messages a push needs are written, by hand: ``MetricsData`` > ``ResourceMetrics``
(the client's resource attributes) > ``ScopeMetrics`` > ``Metric`` (a ``Gauge``, or a monotonic
``Sum`` with its temporality) > ``NumberDataPoint`` (string attributes, start and end time, a
double or an int64 value).  Fields go out in field-number order and proto3 defaults are left out,
as protobuf's own serializers write them, so the bytes equal ``opentelemetry-proto``'s for the same
message (tests/protocol/test_otlp.py holds them to that).  The field numbers are those of
``opentelemetry/proto/metrics/v1/metrics.proto``, ``resource/v1/resource.proto`` and
``common/v1/common.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

__all__ = ["DataPoint", "Metric", "Temporality", "encode_metrics_data"]

Attributes = tuple[tuple[str, str], ...]

# Wire types.
_VARINT, _I64, _LEN = 0, 1, 2


class Temporality(IntEnum):
    """``AggregationTemporality``: how a ``Sum``'s points relate to each other."""

    DELTA = 1
    CUMULATIVE = 2


@dataclass(frozen=True, slots=True)
class DataPoint:
    """One ``NumberDataPoint``: an ``int`` value goes out as ``as_int``, a ``float`` as ``as_double``."""

    value: int | float
    time_ns: int
    #: The start of the interval a ``Sum``'s point covers (0: none, as for a gauge).
    start_ns: int = 0
    attributes: Attributes = ()


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Literal["gauge", "sum"]
    points: tuple[DataPoint, ...]
    #: A ``Sum``'s temporality (ignored for a gauge); sums are monotonic.
    temporality: Temporality = Temporality.CUMULATIVE


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int32/int64 values take ten bytes, as protobuf writes them
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _len_field(field, text.encode("utf-8")) if text else b""


def _fixed64(field: int, value: int) -> bytes:
    return _tag(field, _I64) + struct.pack("<Q", value) if value else b""


def _key_value(key: str, value: str) -> bytes:
    # KeyValue {key = 1; AnyValue value = 2}, AnyValue {string_value = 1 (oneof: written even if empty)}
    return _string(1, key) + _len_field(2, _len_field(1, value.encode("utf-8")))


def _attributes(field: int, attributes: Iterable[tuple[str, str]]) -> bytes:
    return b"".join(_len_field(field, _key_value(key, value)) for key, value in attributes)


def _data_point(point: DataPoint) -> bytes:
    # NumberDataPoint {start_time_unix_nano = 2 (fixed64); time_unix_nano = 3 (fixed64);
    #   oneof value {as_double = 4 (double); as_int = 6 (sfixed64)}; attributes = 7}
    value = point.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a data point's value is an int or a float, not {value!r}")
    encoded = (
        _tag(6, _I64) + struct.pack("<q", value) if isinstance(value, int)
        else _tag(4, _I64) + struct.pack("<d", value)
    )
    return _fixed64(2, point.start_ns) + _fixed64(3, point.time_ns) + encoded + _attributes(7, point.attributes)


def _metric(metric: Metric) -> bytes:
    # Metric {name = 1; gauge = 5; sum = 7}; Gauge {data_points = 1};
    # Sum {data_points = 1; aggregation_temporality = 2 (enum); is_monotonic = 3}
    points = b"".join(_len_field(1, _data_point(point)) for point in metric.points)
    if metric.kind == "gauge":
        data = _len_field(5, points)
    elif metric.kind == "sum":
        data = _len_field(7, points + _tag(2, _VARINT) + _varint(metric.temporality) + _tag(3, _VARINT) + b"\x01")
    else:
        raise ValueError(f"a metric is a 'gauge' or a 'sum', not {metric.kind!r}")
    return _string(1, metric.name) + data


def encode_metrics_data(resource: Attributes, metrics: Sequence[Metric]) -> bytes:
    """One ``MetricsData``: one ``ResourceMetrics`` (``resource``'s attributes) holding one
    ``ScopeMetrics`` with ``metrics``."""
    # MetricsData {resource_metrics = 1}; ResourceMetrics {resource = 1; scope_metrics = 2};
    # Resource {attributes = 1}; ScopeMetrics {metrics = 2}
    scope = b"".join(_len_field(2, _metric(metric)) for metric in metrics)
    resource_metrics = _len_field(1, _attributes(1, resource)) + _len_field(2, scope)
    return _len_field(1, resource_metrics)
