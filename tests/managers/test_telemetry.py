"""TelemetryManager (KIP-714): subscriptions, pushes, their timing, errors and the terminating push,
with scripted answers on a fake clock; payloads decoded with ``opentelemetry-proto``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from asyncconsumer.errors import (
    InvalidRecordError,
    KafkaConnectionError,
    RequestTimedOutError,
    TelemetryTooLargeError,
    ThrottlingQuotaExceededError,
    UnknownSubscriptionIdError,
    UnsupportedCompressionTypeError,
    UnsupportedVersionError,
)
from asyncconsumer.managers.telemetry import (
    DEFAULT_PUSH_INTERVAL,
    TRANSITIONS,
    TelemetryManager,
    TelemetryState,
    resource_attributes,
)
from asyncconsumer.metrics import (
    AcknowledgementMetrics,
    CommitMetrics,
    ConnectionMetrics,
    ConsumerMetrics,
    FetchMetrics,
    Latency,
    PartitionMetrics,
    RebalanceMetrics,
    ShareConsumerMetrics,
    ShareFetchMetrics,
    ShareMembershipMetrics,
)
from asyncconsumer.protocol import compression
from asyncconsumer.structs import TopicPartition

from .scripted import Scripted, Sent

metrics_pb2 = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")

INSTANCE = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
WALL = 1_800_000_000_000_000_000
FETCH = "org.apache.kafka.consumer.fetch.manager."


class Counters:
    """What ``Consumer.metrics()`` would say; the test moves the numbers."""

    def __init__(self) -> None:
        self.records = 0
        self.fetches = 0
        self.latency = Latency()
        self.lag: int | None = 7
        self.member_id: str | None = "member-1"

    def snapshot(self) -> ConsumerMetrics:
        tp = TopicPartition("t", 0)
        return ConsumerMetrics(
            partitions={tp: PartitionMetrics("t", 0, 3, None, 10, 10, self.lag, self.records)},
            records_consumed=self.records,
            bytes_consumed=10 * self.records,
            fetch=FetchMetrics(self.fetches, self.fetches, {}, 0, self.latency, 100 * self.fetches, 100, 0),
            rebalances=RebalanceMetrics(1, 0.5, "stable", 1, self.member_id),
            commits=CommitMetrics(2, 0, Latency()),
            connections=ConnectionMetrics(2, 3, 0, 0),
            last_poll_age=1.5,
        )


class Harness:
    def __init__(self, *, group: bool = True, resource: Any = (("group_id", "g"),)) -> None:
        self.wall = WALL
        self.jitter: list[tuple[float, float]] = []
        self.counters = Counters()
        self.manager = TelemetryManager(resource=resource, group=group, wall_clock=lambda: self.wall,
                                        uniform=self._uniform)
        self.manager.source = self.counters.snapshot
        self.h = Scripted(self.manager)

    def _uniform(self, low: float, high: float) -> float:
        self.jitter.append((low, high))
        return 1.0

    def advance(self, seconds: float) -> None:
        self.h.advance(seconds)
        self.wall += int(seconds * 1e9)

    def subscribe(self, **fields: Any) -> Sent:
        sent = self.h.take("GetTelemetrySubscriptions")
        sent.respond(subscription(**fields))
        return sent

    def push(self, *, advance: float | None = None) -> Sent:
        if advance is not None:
            self.advance(advance)
        return self.h.take("PushTelemetry")

    def pushed(self, sent: Sent) -> Any:
        body = sent.body()
        data = compression.decompress(body["compression_type"], body["metrics"])
        return metrics_pb2.MetricsData.FromString(data)


def subscription(**fields: Any) -> dict[str, Any]:
    body = {
        "error_code": 0,
        "client_instance_id": INSTANCE.bytes,
        "subscription_id": 42,
        "accepted_compression_types": [],
        "push_interval_ms": 10_000,
        "telemetry_max_bytes": 1 << 20,
        "delta_temporality": True,
        "requested_metrics": ["org.apache.kafka.consumer."],
    }
    body.update(fields)
    return body


def metrics_of(data: Any) -> dict[str, Any]:
    (rm,) = data.resource_metrics
    return {m.name: m for sm in rm.scope_metrics for m in sm.metrics}


def value(metric: Any) -> float:
    (point,) = getattr(metric, metric.WhichOneof("data")).data_points
    return float(point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)


# -- subscriptions -----------------------------------------------------------------------------------


def test_the_first_request_asks_for_an_instance_id_at_once() -> None:
    t = Harness()
    assert t.manager.next_deadline(t.h.now) == t.h.now
    sent = t.h.take("GetTelemetrySubscriptions")
    assert sent.body() == {"client_instance_id": bytes(16)}  # the zero id: "give me one"
    assert t.manager.state is TelemetryState.SUBSCRIPTION_IN_PROGRESS
    t.h.assert_idle()  # one request at a time
    sent.respond(subscription())
    assert t.manager.client_instance_id == INSTANCE
    assert t.manager.state is TelemetryState.PUSH_NEEDED


def test_the_first_push_waits_the_interval_times_a_jitter_then_each_interval() -> None:
    t = Harness()
    t.subscribe(push_interval_ms=10_000)
    assert t.jitter == [(0.5, 1.5)]
    assert t.manager.next_deadline(t.h.now) == t.h.now + 10.0
    t.advance(9.9)
    t.h.assert_idle()
    first = t.push(advance=0.1)
    assert first.body()["terminating"] is False
    first.respond({"error_code": 0})
    t.advance(9.9)
    t.h.assert_idle()
    t.push(advance=0.1).respond({"error_code": 0})
    assert t.manager.pushes == 2


def test_a_subscription_asking_for_nothing_is_asked_for_again_each_interval() -> None:
    t = Harness()
    t.subscribe(requested_metrics=[], push_interval_ms=5_000)
    assert t.manager.client_instance_id == INSTANCE  # an id all the same
    assert t.manager.state is TelemetryState.SUBSCRIPTION_NEEDED
    t.advance(4.9)
    t.h.assert_idle()
    t.advance(0.1)
    again = t.h.take("GetTelemetrySubscriptions")
    assert again.body() == {"client_instance_id": INSTANCE.bytes}  # the id it has
    assert not t.h.take_all("PushTelemetry")


def test_no_interval_from_the_broker_means_javas_default() -> None:
    t = Harness()
    t.subscribe(push_interval_ms=0)
    assert t.manager.subscription is not None and t.manager.subscription.interval == DEFAULT_PUSH_INTERVAL


# -- what a push carries -------------------------------------------------------------------------------


def test_a_push_carries_the_id_the_subscription_and_the_metrics_under_javas_names() -> None:
    t = Harness(resource=resource_attributes("g", "static-1", "rack-a"))
    t.subscribe(subscription_id=42)
    t.counters.records, t.counters.fetches = 30, 4
    sent = t.push(advance=10)
    body = sent.body()
    assert (body["client_instance_id"], body["subscription_id"], body["compression_type"]) == (INSTANCE.bytes, 42, 0)
    data = t.pushed(sent)
    resource = {kv.key: kv.value.string_value for kv in data.resource_metrics[0].resource.attributes}
    assert resource == {"group_id": "g", "group_instance_id": "static-1", "client_rack": "rack-a",
                        "group_member_id": "member-1"}
    metrics = metrics_of(data)
    assert value(metrics[FETCH + "records.consumed.total"]) == 30
    assert value(metrics[FETCH + "records.consumed.rate"]) == pytest.approx(3.0)  # 30 in 10 s
    assert value(metrics[FETCH + "fetch.total"]) == 4
    assert value(metrics[FETCH + "records.lag.max"]) == 7
    (lag,) = metrics[FETCH + "records.lag"].gauge.data_points
    assert [(a.key, a.value.string_value) for a in lag.attributes] == [("topic", "t"), ("partition", "0")]
    assert value(metrics["org.apache.kafka.consumer.connection.count"]) == 2
    assert value(metrics["org.apache.kafka.consumer.coordinator.commit.total"]) == 2
    total = metrics[FETCH + "records.consumed.total"]
    assert total.sum.is_monotonic and total.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    assert total.sum.data_points[0].time_unix_nano == t.wall
    assert total.sum.data_points[0].start_time_unix_nano == WALL  # since the manager started
    assert all(name.startswith("org.apache.kafka.consumer.") for name in metrics)


def test_without_a_group_there_are_no_coordinator_metrics() -> None:
    t = Harness(group=False, resource=())
    t.counters.member_id = None
    t.subscribe()
    data = t.pushed(t.push(advance=10))
    assert not any(".coordinator." in name for name in metrics_of(data))
    assert list(data.resource_metrics[0].resource.attributes) == []


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (["org.apache.kafka.consumer.fetch.manager.records."], {
            FETCH + "records.consumed.total", FETCH + "records.consumed.rate", FETCH + "records.lag.max",
            FETCH + "records.lag"}),
        (["org.apache.kafka.consumer.connection.count", "org.apache.kafka.consumer.coordinator.rebalance"], {
            "org.apache.kafka.consumer.connection.count", "org.apache.kafka.consumer.coordinator.rebalance.total"}),
        (["org.apache.kafka.producer."], set()),
    ],
)
def test_only_the_metrics_the_prefixes_ask_for_go(requested: list[str], expected: set[str]) -> None:
    t = Harness()
    t.subscribe(requested_metrics=requested)
    assert set(metrics_of(t.pushed(t.push(advance=10)))) == expected


@pytest.mark.parametrize("everything", [["*"], [""]])
def test_star_or_an_empty_prefix_asks_for_everything(everything: list[str]) -> None:
    t = Harness()
    t.subscribe(requested_metrics=everything)
    names = set(metrics_of(t.pushed(t.push(advance=10))))
    assert {FETCH + "fetch.total", "org.apache.kafka.consumer.coordinator.assigned.partitions"} <= names


def test_deltas_totals_rates_and_means_between_pushes() -> None:
    t = Harness()
    t.subscribe(delta_temporality=True)
    t.counters.records, t.counters.fetches = 10, 2
    t.counters.latency = Latency(count=2, sum=0.2, max=0.15)
    sent = t.push(advance=10)
    first = metrics_of(t.pushed(sent))
    assert value(first[FETCH + "fetch.latency.avg"]) == pytest.approx(100.0)  # ms
    assert value(first[FETCH + "fetch.size.avg"]) == pytest.approx(100.0)
    sent.respond({"error_code": 0})
    pushed_at = t.wall
    # 10 s later: 15 more records and one more fetch, of 400 ms.
    t.counters.records, t.counters.fetches = 25, 3
    t.counters.latency = Latency(count=3, sum=0.6, max=0.4)
    second = metrics_of(t.pushed(t.push(advance=10)))
    records = second[FETCH + "records.consumed.total"].sum.data_points[0]
    assert records.as_double == 15  # the change since the last push
    assert records.start_time_unix_nano == pushed_at
    assert value(second[FETCH + "records.consumed.rate"]) == pytest.approx(1.5)
    assert value(second[FETCH + "fetch.latency.avg"]) == pytest.approx(400.0)  # the mean of the new one only


def test_running_totals_when_the_broker_asks_for_cumulative_sums() -> None:
    t = Harness()
    t.subscribe(delta_temporality=False)
    t.counters.records = 10
    t.push(advance=10).respond({"error_code": 0})
    t.counters.records = 25
    sent = t.push(advance=10)
    total = metrics_of(t.pushed(sent))[FETCH + "records.consumed.total"]
    assert total.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert total.sum.data_points[0].as_double == 25
    assert total.sum.data_points[0].start_time_unix_nano == WALL


def test_no_mean_without_requests_since_the_last_push() -> None:
    t = Harness()
    t.subscribe()
    assert FETCH + "fetch.latency.avg" not in metrics_of(t.pushed(t.push(advance=10)))


def test_a_member_that_left_still_pushes_as_itself() -> None:
    t = Harness()
    t.subscribe()
    t.push(advance=10).respond({"error_code": 0})
    t.counters.member_id = None  # left the group
    data = t.pushed(t.push(advance=10))
    assert ("group_member_id", "member-1") in [(kv.key, kv.value.string_value)
                                               for kv in data.resource_metrics[0].resource.attributes]


def test_the_share_consumers_metrics() -> None:
    t = Harness()
    t.manager.source = lambda: ShareConsumerMetrics(
        records_delivered=8,
        fetch=ShareFetchMetrics(2, 2, 0, Latency(), 8, 800, 0),
        acknowledgements=AcknowledgementMetrics(6, 1, 1, Latency()),
        membership=ShareMembershipMetrics("stable", "share-member", 3, frozenset(), 1),
        connections=ConnectionMetrics(1, 1, 0, 0),
    )
    t.subscribe(requested_metrics=["*"])
    data = t.pushed(t.push(advance=10))
    metrics = metrics_of(data)
    share = "org.apache.kafka.consumer.share."
    assert value(metrics[share + "fetch.manager.records.consumed.total"]) == 8
    assert value(metrics[share + "fetch.manager.acknowledgements.send.total"]) == 7
    assert value(metrics[share + "fetch.manager.acknowledgements.error.total"]) == 1
    assert value(metrics[share + "coordinator.rebalance.total"]) == 1
    assert "org.apache.kafka.consumer.connection.creation.total" in metrics  # Java's share consumer's name too
    assert ("group_member_id", "share-member") in [(kv.key, kv.value.string_value)
                                                   for kv in data.resource_metrics[0].resource.attributes]


@pytest.mark.parametrize(
    ("accepted", "codec"),
    [
        ([compression.CODEC_ZSTD, compression.CODEC_GZIP], compression.CODEC_ZSTD),
        ([99, compression.CODEC_LZ4], compression.CODEC_LZ4),  # an id this client does not know is passed over
        ([compression.CODEC_SNAPPY], compression.CODEC_SNAPPY),
        ([], compression.CODEC_NONE),
    ],
)
def test_the_first_accepted_compression_this_client_has(accepted: list[int], codec: int) -> None:
    t = Harness()
    t.subscribe(accepted_compression_types=accepted)
    sent = t.push(advance=10)
    assert sent.body()["compression_type"] == codec
    assert FETCH + "fetch.total" in metrics_of(t.pushed(sent))  # and it decompresses to the payload


def test_a_source_that_fails_skips_one_push() -> None:
    t = Harness()

    def broken() -> ConsumerMetrics:
        raise RuntimeError("boom")

    t.manager.source = broken
    t.subscribe()
    t.advance(10)
    t.h.assert_idle()
    assert t.manager.state is TelemetryState.PUSH_NEEDED
    t.manager.source = t.counters.snapshot
    t.push(advance=10)


# -- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [UnknownSubscriptionIdError, UnsupportedCompressionTypeError])
def test_a_stale_subscription_is_asked_for_again_at_once(error: type[Exception]) -> None:
    t = Harness()
    t.subscribe()
    t.push(advance=10).respond({"error_code": error.code})  # type: ignore[attr-defined]
    again = t.h.take("GetTelemetrySubscriptions")
    assert again.body() == {"client_instance_id": INSTANCE.bytes}
    again.respond(subscription(subscription_id=43))
    assert t.push(advance=10).body()["subscription_id"] == 43


@pytest.mark.parametrize("error", [TelemetryTooLargeError, ThrottlingQuotaExceededError])
def test_too_large_or_throttled_waits_an_interval(error: type[Exception]) -> None:
    t = Harness()
    t.subscribe(push_interval_ms=10_000)
    t.push(advance=10).respond({"error_code": error.code})  # type: ignore[attr-defined]
    t.advance(9.9)
    t.h.assert_idle()
    t.advance(0.1)
    t.h.take("GetTelemetrySubscriptions")


def test_throttled_before_any_subscription_waits_javas_default() -> None:
    t = Harness()
    t.h.take("GetTelemetrySubscriptions").respond(subscription(error_code=ThrottlingQuotaExceededError.code))
    assert t.manager.next_deadline(t.h.now) == t.h.now + DEFAULT_PUSH_INTERVAL


@pytest.mark.parametrize("error", [UnsupportedVersionError, InvalidRecordError])
def test_errors_that_retrying_cannot_fix_stop_the_pushing(error: type[Exception]) -> None:
    t = Harness()
    t.subscribe()
    t.push(advance=10).respond({"error_code": error.code})  # type: ignore[attr-defined]
    assert t.manager.done and t.manager.stopped is not None and error.__name__ in t.manager.stopped
    t.advance(3600)
    t.h.assert_idle()
    assert t.manager.next_deadline(t.h.now) == float("inf")


def test_a_broker_without_the_api_stops_it_for_good() -> None:
    t = Harness()
    t.h.take("GetTelemetrySubscriptions").fail(UnsupportedVersionError("no GetTelemetrySubscriptions (Kafka 3.6)"))
    assert t.manager.done and t.manager.client_instance_id is None
    assert "Kafka 3.6" in (t.manager.stopped or "")
    t.advance(3600)
    t.h.assert_idle()


@pytest.mark.parametrize("error", [KafkaConnectionError("lost"), RequestTimedOutError("slow")])
def test_a_request_without_an_answer_tries_again_after_five_minutes(error: Exception) -> None:
    t = Harness()
    t.subscribe()
    t.push(advance=10).fail(error)
    assert t.manager.state is TelemetryState.SUBSCRIPTION_NEEDED
    t.advance(DEFAULT_PUSH_INTERVAL - 1)
    t.h.assert_idle()
    t.advance(1)
    t.h.take("GetTelemetrySubscriptions")


# -- closing ----------------------------------------------------------------------------------------------


def test_close_sends_a_terminating_push_at_once() -> None:
    t = Harness()
    t.subscribe()
    t.push(advance=10).respond({"error_code": 0})
    t.advance(1)  # long before the next interval
    t.manager.close(t.h.now)
    assert t.manager.next_deadline(t.h.now) == t.h.now
    last = t.h.take("PushTelemetry")
    assert last.body()["terminating"] is True
    assert not t.manager.done
    last.respond({"error_code": 0})
    assert t.manager.done and t.manager.stopped is None and t.manager.pushes == 2
    t.h.assert_idle()


def test_close_while_a_push_is_in_flight_still_ends_with_the_terminating_one() -> None:
    t = Harness()
    t.subscribe()
    in_flight = t.push(advance=10)
    t.manager.close(t.h.now)
    last = t.h.take("PushTelemetry")
    assert last.body()["terminating"] is True
    in_flight.respond({"error_code": 0})  # answered late: changes nothing
    assert t.manager.state is TelemetryState.TERMINATING_PUSH_IN_PROGRESS
    last.fail(KafkaConnectionError("gone"))
    assert t.manager.done


def test_close_before_any_subscription_sends_nothing() -> None:
    t = Harness()
    sent = t.h.take("GetTelemetrySubscriptions")
    t.manager.close(t.h.now)
    assert t.manager.done
    sent.respond(subscription())  # answered after the close: ignored
    t.h.assert_idle()
    assert t.manager.done


def test_the_states_can_only_move_as_the_table_says() -> None:
    assert TRANSITIONS[TelemetryState.TERMINATED] == frozenset()
    assert set(TRANSITIONS) == set(TelemetryState)
    t = Harness()
    with pytest.raises(AssertionError, match="no move from subscription_needed to push_in_progress"):
        t.manager._move(TelemetryState.PUSH_IN_PROGRESS)
