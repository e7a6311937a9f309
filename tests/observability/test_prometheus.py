"""``asyncconsumer.prometheus.ConsumerCollector`` against the real broker: every exported number is
the one ``Consumer.metrics()`` / ``ShareConsumer.metrics()`` gives, under the Java client's names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.consumers import FAST, tps
from support.share import share_group

from asyncconsumer import Consumer, ShareConsumer, TopicPartition
from asyncconsumer.prometheus import ConsumerCollector

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample of the registry's exposition text, parsed back: (name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labels(**values: object) -> frozenset[tuple[str, str]]:
    return frozenset((k, str(v)) for k, v in values.items())


async def test_the_collector_exports_the_snapshot_under_java_client_names(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, ((i % 2, None, b"v%d" % i) for i in range(300)))
    registry = CollectorRegistry()
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", client_id="billing-7",
                        auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=100,
                        **FAST) as consumer:
        registry.register(ConsumerCollector(consumer))
        consumer.assign(tps(topic, 2))
        got = 0
        with anyio.fail_after(30):
            while got < 200:
                got += sum(map(len, (await consumer.getmany(timeout=1)).values()))
        await consumer.commit()
        m = consumer.metrics()
        samples = scrape(registry)
    client = labels(client_id="billing-7")
    for tp, p in m.partitions.items():
        key = labels(client_id="billing-7", topic=tp.topic, partition=tp.partition)
        assert p.lag == 150 - (p.position or 0)
        assert samples[("kafka_consumer_fetch_manager_records_lag", key)] == p.lag
        assert samples[("asyncconsumer_position", key)] == p.position
        assert samples[("asyncconsumer_committed_offset", key)] == p.committed == p.position
    assert m.lag == 300 - got > 0
    assert samples[("kafka_consumer_fetch_manager_records_lag_max", client)] == max(
        p.lag for p in m.partitions.values() if p.lag is not None)
    per_topic = labels(client_id="billing-7", topic=topic)
    assert samples[("kafka_consumer_fetch_manager_records_consumed_total", per_topic)] == m.records_consumed == got
    assert samples[("kafka_consumer_coordinator_commit_total", client)] == m.commits.count == 1
    assert samples[("kafka_consumer_coordinator_assigned_partitions", client)] == 2
    assert samples[("kafka_consumer_fetch_manager_fetch_total", client)] == m.fetch.requests > 0
    # Prometheus' buckets are cumulative: the +Inf bucket and _count are every fetch that completed.
    inf = labels(client_id="billing-7", le="+Inf")
    assert samples[("kafka_consumer_fetch_manager_fetch_latency_seconds_bucket", inf)] == m.fetch.latency.count
    assert samples[("kafka_consumer_fetch_manager_fetch_latency_seconds_count", client)] == m.fetch.latency.count
    assert samples[("kafka_consumer_connection_count", client)] == m.connections.open >= 1
    # A closed consumer reports nothing (it does not fail the scrape).
    assert scrape(registry) == {}


async def test_a_source_callable_is_read_at_each_scrape_and_not_at_registration(bootstrap: str) -> None:
    asked = 0
    current: list[Consumer[Any, Any]] = []

    def source() -> Consumer[Any, Any] | None:
        nonlocal asked
        asked += 1
        return current[0] if current else None

    registry = CollectorRegistry()
    registry.register(ConsumerCollector(source))
    assert asked == 0
    assert scrape(registry) == {} and asked == 1
    async with Consumer(bootstrap_servers=bootstrap, **FAST) as consumer:
        current.append(consumer)
        consumer.assign([TopicPartition("prometheus-none", 0)])
        samples = scrape(registry)
    assert samples[("kafka_consumer_coordinator_assigned_partitions", labels(client_id="asyncconsumer"))] == 1
    assert asked == 2


async def test_the_share_consumer_is_exported_too(apache_kafka: Any) -> None:
    """On Apache Kafka (Tansu has no share groups)."""
    from asyncconsumer.testing.producer import create_topic, produce

    apache_kafka_bootstrap = str(apache_kafka.bootstrap)
    topic = create_topic(apache_kafka_bootstrap, f"prom-share-{id(object())}", 1)
    produce(apache_kafka_bootstrap, topic, [(0, None, b"job-%d" % i) for i in range(40)])
    group = await anyio.to_thread.run_sync(lambda: share_group(apache_kafka_bootstrap))
    registry = CollectorRegistry()
    async with ShareConsumer(bootstrap_servers=apache_kafka_bootstrap, group_id=group, client_id="share-1") as consumer:
        registry.register(ConsumerCollector(consumer))
        consumer.subscribe([topic])
        got = 0
        with anyio.fail_after(60):
            while got < 40:
                got += sum(map(len, (await consumer.getmany(timeout=1)).values()))
        m = consumer.metrics()
        samples = scrape(registry)
    client = labels(client_id="share-1")
    assert samples[("kafka_consumer_share_fetch_manager_records_consumed_total", client)] == m.records_delivered == 40
    assert samples[("kafka_consumer_share_fetch_manager_fetch_total", client)] == m.fetch.requests > 0
    assert samples[("kafka_consumer_coordinator_assigned_partitions", client)] == 1
