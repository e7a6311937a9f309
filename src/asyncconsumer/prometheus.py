"""Prometheus: ``Consumer.metrics()`` and ``ShareConsumer.metrics()`` as a ``prometheus_client`` collector.

    from prometheus_client import REGISTRY, start_http_server
    from asyncconsumer.prometheus import ConsumerCollector

    REGISTRY.register(ConsumerCollector(consumer))
    start_http_server(9464)

Optional: needs ``prometheus-client`` (the ``prometheus`` extra).  The collector reads the
consumer's snapshot at each scrape, so nothing is counted twice and nothing is kept between
scrapes.  It takes a consumer, or a callable that returns the consumer to report (``None`` while
there is none: an application whose consumer lives in a lifespan task).

Names follow the Java client's metrics as Micrometer and the JMX exporter publish them
(``kafka_consumer_<group>_<name>``, the group without its ``consumer-`` prefix and ``-metrics``
suffix; e.g. Java's ``records-lag`` of ``consumer-fetch-manager-metrics`` is
``kafka_consumer_fetch_manager_records_lag``), with a ``client_id`` label, so dashboards and alerts
written for Java consumers work unchanged.  Durations are histograms in seconds rather than Java's
averages in milliseconds.  What the Java client has no metric for is named ``asyncconsumer_*``.
docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "asyncconsumer.prometheus needs prometheus-client: pip install 'asyncconsumer[prometheus]'"
    ) from exc

from .consumer import Consumer
from .errors import KafkaError
from .metrics import BufferMetrics, ConnectionMetrics, ConsumerMetrics, Latency, LoopMetrics, ShareConsumerMetrics
from .share import ShareConsumer

__all__ = ["ConsumerCollector"]

AnyConsumer = Consumer[Any, Any] | ShareConsumer[Any, Any]
#: One consumer to report, or a callable that returns it (``None``: nothing to report now).
Source = AnyConsumer | Callable[[], AnyConsumer | None]


class ConsumerCollector(Collector):
    """A ``prometheus_client`` collector of one :class:`Consumer` or :class:`ShareConsumer`.

    ``client_id`` labels every metric (default: the consumer's ``client_id`` option).  Register it
    with a ``CollectorRegistry`` (or ``prometheus_client.REGISTRY``).  A consumer that is closed,
    or not started yet, reports nothing.
    """

    def __init__(self, consumer: Source, *, client_id: str | None = None) -> None:
        self._source = consumer
        self._client_id = client_id

    def _consumer(self) -> AnyConsumer | None:
        source = self._source
        if isinstance(source, Consumer | ShareConsumer):
            return source
        return source()

    def describe(self) -> Iterable[Metric]:
        """No metric families up front: registering does not read the consumer."""
        return []

    def collect(self) -> Iterator[Metric]:
        consumer = self._consumer()
        if consumer is None:
            return
        snapshot = _snapshot(consumer)
        if snapshot is None:
            return
        client_id = self._client_id if self._client_id is not None else consumer.config.client_id
        if isinstance(snapshot, ConsumerMetrics):
            yield from _consumer_metrics(snapshot, client_id)
        else:
            yield from _share_metrics(snapshot, client_id)
        yield from _connection_metrics(snapshot.connections, client_id)
        yield from _loop_metrics(snapshot.loop, client_id)
        yield _counter("asyncconsumer_records_skipped",
                       "Records a deserializer could not read that on_deserialization_error skipped",
                       client_id, snapshot.records_skipped)


def _snapshot(consumer: AnyConsumer) -> ConsumerMetrics | ShareConsumerMetrics | None:
    """``consumer.metrics()``, or None when it is closed or not started.  A scrape from another
    thread (``prometheus_client.start_http_server``) that meets the event loop changing the
    assignment mid-snapshot (``RuntimeError``: a dict changed size) takes the snapshot again."""
    for _ in range(3):
        try:
            return consumer.metrics()
        except KafkaError:  # closed, or not started
            return None
        except RuntimeError:
            continue
    return consumer.metrics()


def _consumer_metrics(m: ConsumerMetrics, client_id: str) -> Iterator[Metric]:
    by_partition = ["client_id", "topic", "partition"]
    lag = GaugeMetricFamily("kafka_consumer_fetch_manager_records_lag",
                            "Records between the consumer's position and the end of the partition (Java: records-lag)",
                            labels=by_partition)
    position = GaugeMetricFamily("asyncconsumer_position",
                                 "The offset of the next record handed to the application", labels=by_partition)
    committed = GaugeMetricFamily("asyncconsumer_committed_offset",
                                  "The group's committed offset as last committed or read by this consumer",
                                  labels=by_partition)
    high = GaugeMetricFamily("asyncconsumer_high_watermark",
                             "The partition's high watermark as of the last fetch response", labels=by_partition)
    per_topic: dict[str, int] = {}
    for p in m.partitions.values():
        key = [client_id, p.topic, str(p.partition)]
        per_topic[p.topic] = per_topic.get(p.topic, 0) + p.records_consumed
        if p.lag is not None:
            lag.add_metric(key, p.lag)
        if p.position is not None:
            position.add_metric(key, p.position)
        if p.committed is not None:
            committed.add_metric(key, p.committed)
        if p.high_watermark is not None:
            high.add_metric(key, p.high_watermark)
    yield from (lag, position, committed, high)
    lags = [p.lag for p in m.partitions.values() if p.lag is not None]
    yield _gauge("kafka_consumer_fetch_manager_records_lag_max",
                 "The largest records-lag of the assigned partitions now (Java: records-lag-max)",
                 client_id, max(lags, default=0))
    consumed = CounterMetricFamily("kafka_consumer_fetch_manager_records_consumed",
                                   "Records handed to the application (Java: records-consumed-total)",
                                   labels=["client_id", "topic"])
    for topic, count in sorted(per_topic.items()):
        consumed.add_metric([client_id, topic], count)
    yield consumed
    yield _counter("kafka_consumer_fetch_manager_bytes_consumed",
                   "Record batch bytes handed to the application (Java: bytes-consumed-total)",
                   client_id, m.bytes_consumed)
    yield _counter("kafka_consumer_fetch_manager_fetch", "Fetch requests sent (Java: fetch-total)",
                   client_id, m.fetch.requests)
    yield _counter("asyncconsumer_fetch_errors", "Fetch requests that failed", client_id, m.fetch.errors)
    yield _histogram("kafka_consumer_fetch_manager_fetch_latency_seconds",
                     "Fetch request durations, the broker's wait included (Java: fetch-latency-avg/max)",
                     client_id, m.fetch.latency)
    yield _gauge("asyncconsumer_fetch_buffer_bytes", "Bytes fetched and not handed out yet",
                 client_id, m.fetch.buffer_bytes)
    yield _gauge("kafka_consumer_coordinator_assigned_partitions",
                 "Partitions assigned to this consumer (Java: assigned-partitions)", client_id, len(m.partitions))
    yield _counter("kafka_consumer_coordinator_rebalance", "Rebalances completed (Java: rebalance-total)",
                   client_id, m.rebalances.count)
    if m.rebalances.last_duration is not None:
        yield _gauge("asyncconsumer_last_rebalance_duration_seconds", "How long the last rebalance took",
                     client_id, m.rebalances.last_duration)
    yield _counter("kafka_consumer_coordinator_commit", "Offset commits completed (Java: commit-total)",
                   client_id, m.commits.count)
    yield _counter("asyncconsumer_commit_failures", "Offset commits that failed", client_id, m.commits.failures)
    yield _histogram("kafka_consumer_coordinator_commit_latency_seconds",
                     "OffsetCommit request durations (Java: commit-latency-avg/max)", client_id, m.commits.latency)
    yield _gauge("kafka_consumer_last_poll_seconds_ago",
                 "Seconds since the application last polled, 0 while a poll waits (Java: last-poll-seconds-ago)",
                 client_id, m.last_poll_age)
    yield from _pool_metrics(m.buffers, client_id, ("frames", "columns"))


def _share_metrics(m: ShareConsumerMetrics, client_id: str) -> Iterator[Metric]:
    yield _counter("kafka_consumer_share_fetch_manager_records_consumed",
                   "Records handed to the application (Java: records-consumed-total)", client_id, m.records_delivered)
    yield _counter("kafka_consumer_share_fetch_manager_fetch", "ShareFetch requests sent (Java: fetch-total)",
                   client_id, m.fetch.requests)
    yield _histogram("kafka_consumer_share_fetch_manager_fetch_latency_seconds",
                     "ShareFetch request durations (Java: fetch-latency-avg/max)", client_id, m.fetch.latency)
    yield _counter("asyncconsumer_share_records_acquired", "Record deliveries acquired for this member",
                   client_id, m.fetch.records_acquired)
    yield _gauge("asyncconsumer_fetch_buffer_bytes", "Bytes fetched and not handed out yet",
                 client_id, m.fetch.buffer_bytes)
    yield _counter("asyncconsumer_share_acknowledged", "Offsets whose acknowledgement the broker confirmed",
                   client_id, m.acknowledgements.acknowledged)
    yield _counter("asyncconsumer_share_acknowledgement_failures", "Offsets whose acknowledgement failed",
                   client_id, m.acknowledgements.failed)
    yield _gauge("asyncconsumer_share_acknowledgements_pending", "Acknowledgements not sent yet",
                 client_id, m.acknowledgements.pending)
    yield _gauge("kafka_consumer_coordinator_assigned_partitions",
                 "Partitions assigned to this member (Java: assigned-partitions)",
                 client_id, len(m.membership.assignment))
    yield from _pool_metrics(m.buffers, client_id, ("frames",))


def _pool_metrics(buffers: BufferMetrics, client_id: str, pools: tuple[str, ...]) -> Iterator[Metric]:
    held = GaugeMetricFamily("asyncconsumer_buffer_pool_held_bytes",
                             "Memory kept for large buffers (response frames, Arrow columns)",
                             labels=["client_id", "pool"])
    released = CounterMetricFamily("asyncconsumer_buffer_pool_released_bytes",
                                   "Memory of large buffers given back (sizes that stopped coming, idle for long)",
                                   labels=["client_id", "pool"])
    for name in pools:
        pool = getattr(buffers, name)
        held.add_metric([client_id, name], pool.held_bytes)
        released.add_metric([client_id, name], pool.released_bytes)
    yield held
    yield released


def _loop_metrics(loop: LoopMetrics, client_id: str) -> Iterator[Metric]:
    yield _gauge("asyncconsumer_event_loop_lag_seconds",
                 "How late the background loop ran its latest turn (a blocked event loop)", client_id, loop.lag)
    yield _gauge("asyncconsumer_event_loop_lag_max_seconds",
                 "The largest lag of the background loop since the consumer started", client_id, loop.lag_max)
    yield _counter("asyncconsumer_event_loop_blocks",
                   "Times the event loop was blocked for loop_lag_warning_ms or longer", client_id, loop.blocks)
    yield _counter("asyncconsumer_event_loop_blocked_seconds",
                   "Seconds the event loop was blocked, over the blocks counted", client_id, loop.blocked_seconds)


def _connection_metrics(connections: ConnectionMetrics, client_id: str) -> Iterator[Metric]:
    yield _gauge("kafka_consumer_connection_count", "Open broker connections (Java: connection-count)",
                 client_id, connections.open)
    yield _counter("kafka_consumer_connection_creation", "Connections opened (Java: connection-creation-total)",
                   client_id, connections.opened)
    yield _counter("asyncconsumer_connection_errors", "Failed connection attempts and connections lost",
                   client_id, connections.errors)


def _gauge(name: str, documentation: str, client_id: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["client_id"])
    family.add_metric([client_id], value)
    return family


def _counter(name: str, documentation: str, client_id: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["client_id"])
    family.add_metric([client_id], value)
    return family


def _histogram(name: str, documentation: str, client_id: str, latency: Latency) -> HistogramMetricFamily:
    """Prometheus' cumulative ``le`` buckets from the snapshot's per-bucket counts."""
    cumulative, buckets = 0, []
    for bound, count in latency.buckets:
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    family = HistogramMetricFamily(name, documentation, labels=["client_id"])
    family.add_metric([client_id], buckets, latency.sum)
    return family
