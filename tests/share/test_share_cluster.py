"""The share consumer's ``fetch_buffer_bytes`` bound on a two-node Apache Kafka cluster: with two
partition leaders, the bound is what holds a ShareFetch back (with one leader, the rule "fetch from
a node once its last records are handed out" already does).  Runs on Apache Kafka only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from support.cluster import admin
from support.cluster import leaders as leaders_of
from support.share import share_group

from asyncconsumer import ShareConsumer
from asyncconsumer.testing import KafkaCluster

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def cluster(apache_kafka: Any) -> Iterator[KafkaCluster]:  # apache_kafka: skipped unless Kafka is tested
    with KafkaCluster(2, heap_mb=384) as kafka:
        yield kafka


def two_leader_topic(cluster: KafkaCluster, per_partition: int) -> str:
    bootstrap = cluster.bootstrap
    name = f"share-buffer-{uuid.uuid4().hex[:8]}"
    client = admin(cluster)  # kept while the creation runs: a dropped client cancels it
    client.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    leaders = leaders_of(cluster, name, partitions=2)
    assert len(set(leaders.values())) == 2, leaders
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3})
    for i in range(per_partition):
        for partition in (0, 1):
            producer.produce(name, value=b"%d-%06d-" % (partition, i) + b"x" * 150, partition=partition)
        producer.poll(0)
    assert producer.flush(30) == 0
    return name


async def test_no_share_fetch_while_the_buffer_is_at_its_bound_with_two_leaders(cluster: KafkaCluster) -> None:
    bootstrap = cluster.bootstrap
    per_partition = 3000
    topic = await anyio.to_thread.run_sync(two_leader_topic, cluster, per_partition)
    group = await anyio.to_thread.run_sync(lambda: share_group(bootstrap))
    bound = 8192
    sent_while_full = held_back = 0
    peak = largest = 0
    seen: set[bytes] = set()
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, fetch_buffer_bytes=bound,
                             max_partition_fetch_bytes=bound, max_poll_records=50) as consumer:
        consumer.subscribe([topic])
        engine = consumer._engine
        assert engine is not None
        fetcher = engine.fetcher
        poll, hand_over = fetcher.poll, fetcher._on_batch

        def watched_poll(now: float) -> list[Any]:
            nonlocal sent_while_full, held_back
            full = fetcher.buffer_full
            requests = poll(now)
            if full:
                sent_while_full += sum(r.api == "ShareFetch" for r in requests)
                # A node whose records are all handed out, idle: without the bound it would fetch.
                held_back += any(s.buffered == 0 and not s.in_flight and s.epoch > 0
                                 for s in fetcher._sessions.values())
            return requests

        def watched_batch(batch: Any) -> None:
            nonlocal peak, largest
            hand_over(batch)
            largest = max(largest, batch.size)
            peak = max(peak, fetcher.buffered_bytes)

        fetcher.poll, fetcher._on_batch = watched_poll, watched_batch  # type: ignore[method-assign]
        with anyio.fail_after(120):
            while len(seen) < 2 * per_partition:
                for records in (await consumer.getmany(timeout=0.5)).values():
                    seen.update(r.value for r in records if r.value is not None)
                await anyio.sleep(0.005)  # a slow application: the buffer stays at its bound
        assert all(e is None for e in (await consumer.commit()).values())
    assert len(seen) == 2 * per_partition
    assert sent_while_full == 0
    assert held_back > 0, "the bound never held a fetch back: the test did not exercise it"
    assert largest > 0 and peak <= bound + 2 * largest, (peak, bound, largest)  # one response per leader
