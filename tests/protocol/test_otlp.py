"""The hand-written OTLP encoder (protocol/otlp.py) against OpenTelemetry's own protobuf classes
(``opentelemetry-proto``): the same message gives the same bytes, and what we write decodes to
what we meant."""

from __future__ import annotations

import math

import pytest

from asyncconsumer.protocol.otlp import DataPoint, Metric, Temporality, encode_metrics_data

metrics_pb2 = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")


def reference(resource: tuple[tuple[str, str], ...], metrics: list[Metric]) -> bytes:
    """The same message built with opentelemetry-proto, serialized by protobuf."""
    data = metrics_pb2.MetricsData()
    rm = data.resource_metrics.add()
    rm.resource.SetInParent()
    for key, value in resource:
        kv = rm.resource.attributes.add()
        kv.key = key
        kv.value.string_value = value
    sm = rm.scope_metrics.add()
    for metric in metrics:
        m = sm.metrics.add()
        m.name = metric.name
        if metric.kind == "gauge":
            container = m.gauge
            container.SetInParent()
        else:
            container = m.sum
            container.aggregation_temporality = int(metric.temporality)
            container.is_monotonic = True
        for point in metric.points:
            dp = container.data_points.add()
            dp.start_time_unix_nano = point.start_ns
            dp.time_unix_nano = point.time_ns
            if isinstance(point.value, int):
                dp.as_int = point.value
            else:
                dp.as_double = point.value
            for key, value in point.attributes:
                kv = dp.attributes.add()
                kv.key = key
                kv.value.string_value = value
    return data.SerializeToString()


NOW = 1_796_395_714_148_000_000
CASES = {
    "empty": ((), []),
    "gauge and sum": (
        (("group_id", "g1"), ("group_member_id", "m-1")),
        [
            Metric("org.apache.kafka.consumer.connection.count", "gauge", (DataPoint(3, NOW),)),
            Metric("org.apache.kafka.consumer.connection.creation.total", "sum",
                   (DataPoint(4.0, NOW, NOW - 10**9),), Temporality.DELTA),
            Metric("org.apache.kafka.consumer.fetch.manager.fetch.rate", "gauge", (DataPoint(0.0, NOW),)),
        ],
    ),
    "attributes, negatives, cumulative, unicode": (
        (("group_id", "gr\u00fcppe"), ("client_rack", "")),
        [
            Metric("org.apache.kafka.consumer.fetch.manager.records.lag", "gauge", (
                DataPoint(-1, NOW, 0, (("topic", "t\u00e9"), ("partition", "0"))),
                DataPoint(2**40, NOW, 0, (("topic", "t"), ("partition", "1"))),
                DataPoint(-0.5, NOW + 1),
            )),
            Metric("x.total", "sum", (DataPoint(12.5, NOW, 1),), Temporality.CUMULATIVE),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bytes_equal_protobufs_own(case: str) -> None:
    resource, metrics = CASES[case]
    assert encode_metrics_data(resource, metrics) == reference(resource, metrics)


def test_decodes_to_what_was_meant() -> None:
    resource, metrics = CASES["attributes, negatives, cumulative, unicode"]
    decoded = metrics_pb2.MetricsData.FromString(encode_metrics_data(resource, metrics))
    (rm,) = decoded.resource_metrics
    assert [(kv.key, kv.value.string_value) for kv in rm.resource.attributes] == list(resource)
    lag, total = rm.scope_metrics[0].metrics
    assert lag.WhichOneof("data") == "gauge"
    assert [p.as_int if p.WhichOneof("value") == "as_int" else p.as_double for p in lag.gauge.data_points] == [
        -1, 2**40, -0.5]
    assert [(kv.key, kv.value.string_value) for kv in lag.gauge.data_points[0].attributes] == [
        ("topic", "t\u00e9"), ("partition", "0")]
    assert total.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert total.sum.is_monotonic and total.sum.data_points[0].start_time_unix_nano == 1


def test_nan_and_infinity_are_doubles() -> None:
    data = encode_metrics_data((), [Metric("m", "gauge", (DataPoint(math.inf, NOW), DataPoint(math.nan, NOW)))])
    points = metrics_pb2.MetricsData.FromString(data).resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    assert points[0].as_double == math.inf and math.isnan(points[1].as_double)


def test_bad_values_are_refused() -> None:
    with pytest.raises(TypeError, match="int or a float"):
        encode_metrics_data((), [Metric("m", "gauge", (DataPoint(True, NOW),))])
    with pytest.raises(ValueError, match="'gauge' or a 'sum'"):
        encode_metrics_data((), [Metric("m", "histogram", (DataPoint(1, NOW),))])  # type: ignore[arg-type]
