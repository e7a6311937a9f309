"""OpenTelemetry against the real broker: the SDK's in-memory reader sees the numbers
``Consumer.metrics()`` gives, with the messaging conventions' names and attributes; the
``process`` span continues the trace in a record's ``traceparent`` header."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support.consumers import FAST, tps

from asyncconsumer import ConfigError, Consumer, TopicPartition
from asyncconsumer.otel import process_span

pytestmark = pytest.mark.anyio


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    found = []
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


async def test_the_meter_provider_sees_consumed_records_durations_and_lag(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, ((i % 2, None, b"x") for i in range(400)))
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    group = f"g-{topic}"
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=group,
                        enable_auto_commit=False, max_poll_records=150, meter_provider=provider, **FAST) as c:
        c.assign(tps(topic, 2))
        got = 0
        with anyio.fail_after(30):
            async for batch in c.batches():
                got += len(batch)
                if got >= 300:
                    break
        await c.commit()
        ours = c.metrics()  # no await between this and the reader: the same instant
        consumed = points(reader, "messaging.client.consumed.messages")
        durations = points(reader, "messaging.client.operation.duration")
        lag = points(reader, "kafka.consumer.records_lag")

    by_partition = {int(p.attributes["messaging.destination.partition.id"]): p for p in consumed}
    assert {k: p.value for k, p in by_partition.items()} == {
        tp.partition: ours.partitions[tp].records_consumed for tp in tps(topic, 2)
    }
    assert sum(p.value for p in consumed) == ours.records_consumed == got
    for p in consumed:
        assert p.attributes["messaging.system"] == "kafka"
        assert p.attributes["messaging.destination.name"] == topic
        assert p.attributes["messaging.consumer.group.name"] == group

    ops = {p.attributes["messaging.operation.name"]: p for p in durations}
    assert set(ops) == {"fetch", "commit"}
    assert ops["fetch"].count == ours.fetch.latency.count > 0
    assert ops["fetch"].sum == pytest.approx(ours.fetch.latency.sum)
    assert ops["commit"].count == ours.commits.latency.count == 1
    assert all(p.attributes["messaging.system"] == "kafka" for p in durations)

    assert {int(p.attributes["messaging.destination.partition.id"]): p.value for p in lag} == {
        tp.partition: ours.partitions[tp].lag for tp in tps(topic, 2)
    }
    assert sum(p.value for p in lag) == 400 - got
    assert all(p.attributes["messaging.destination.name"] == topic for p in lag)


def test_meter_provider_must_be_a_meter_provider() -> None:
    with pytest.raises(ConfigError, match="meter_provider must be an OpenTelemetry MeterProvider"):
        Consumer(meter_provider="prometheus")  # type: ignore[typeddict-item]


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


async def test_process_span_continues_the_trace_in_the_record_headers(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    traceparent = f"00-{TRACE_ID}-{PARENT}-01".encode()
    other = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    produce(topic, [(0, None, b"a", {"traceparent": traceparent}), (0, None, b"b", {"traceparent": other}),
                    (0, None, b"c")])
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST) as c:
        c.assign([TopicPartition(topic, 0)])
        records: list[Any] = []
        with anyio.fail_after(20):
            while len(records) < 3:
                for batch in (await c.getmany(timeout=1)).values():
                    records.extend(batch)
    with process_span(records[0], consumer_group="g", tracer_provider=tracer_provider):
        pass
    with pytest.raises(RuntimeError), process_span(records, tracer_provider=tracer_provider):
        raise RuntimeError("handler failed")
    single, batch = exporter.get_finished_spans()

    assert single.name == f"process {topic}" and single.kind is SpanKind.CONSUMER
    assert format(single.context.trace_id, "032x") == TRACE_ID
    assert single.parent is not None and format(single.parent.span_id, "016x") == PARENT
    assert single.attributes is not None
    assert dict(single.attributes) == {
        "messaging.system": "kafka",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": "0",
        "messaging.consumer.group.name": "g",
        "messaging.kafka.offset": 0,
    }

    # A batch: a new trace, linked to each record's context (the third record has none).
    assert batch.parent is None and batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 3
    assert [format(link.context.trace_id, "032x") for link in batch.links] == [
        TRACE_ID, "0af7651916cd43dd8448eb211c80319c"
    ]
    assert batch.status.status_code is StatusCode.ERROR


def test_without_opentelemetry_and_meter_provider_nothing_is_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncconsumer import otel
    from asyncconsumer.config import build_config

    monkeypatch.setattr(otel, "available", lambda: False)  # as without opentelemetry-api installed
    assert otel.telemetry_for(build_config({}), lambda: None) is None
    # ... while a meter_provider given is used whatever is installed.
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    assert otel.telemetry_for(build_config({"meter_provider": provider}), lambda: None) is not None


GLOBAL_PROVIDER_SCRIPT = """
import sys, anyio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from asyncconsumer import Consumer, TopicPartition

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

async def main():
    async with Consumer(bootstrap_servers=sys.argv[1], auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign([TopicPartition(sys.argv[2], 0)])
        got = 0
        with anyio.fail_after(30):
            while got < 25:
                got += sum(map(len, (await c.getmany(timeout=1)).values()))
        data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "messaging.client.consumed.messages":
                    print(sm.scope.name, sum(p.value for p in m.data.data_points))

anyio.run(main)
"""


def test_the_global_meter_provider_is_used_without_meter_provider(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    import subprocess
    import sys

    topic = new_topic(1)
    produce(topic, ((0, None, b"x") for _ in range(25)))
    # A process of its own: the global MeterProvider can be set once per process.
    out = subprocess.run([sys.executable, "-c", GLOBAL_PROVIDER_SCRIPT, bootstrap, topic],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["asyncconsumer", "25"]
