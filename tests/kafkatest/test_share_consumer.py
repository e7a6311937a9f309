"""kafkatest's ``ShareConsumerTest`` (share_consumer_test.py): three share consumers of one share
group (KIP-932), Kafka's producer, three brokers.  ``test_topic1`` has one partition (replication
factor 1), ``test_topic2`` three (replication factor 3).  The group's ``share.auto.offset.reset``
is set to ``earliest`` with Kafka's own ``kafka-configs`` first.  Every wait is kafkatest's 600 s;
the checks are on counts: every acked record consumed (by offset, redeliveries aside) and, without
faults, acknowledged exactly once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import cluster as clusters
from .base import ShareConsumerTest
from .clients import Client
from .services import Scenario, VerifiableProducer, VerifiableShareConsumer

pytestmark = [pytest.mark.kafkatest_cluster(brokers=3, controllers=1),
              pytest.mark.parametrize("enable_assignment_batching", [False, True], ids=["nobatching", "batching"])]
DEFAULT_TIMEOUT_SEC = 600
TOOL = "share-consumer"
TOPIC2_REPLICATION = 3


class ShareTopics(ShareConsumerTest):
    topic1: str
    topic2: str


@pytest.fixture
def t(scenario: Scenario, client: Client) -> Iterator[ShareTopics]:
    test = ShareTopics(scenario, client, num_consumers=3)
    test.topic1 = clusters.new_topic(scenario.cluster, "test_topic1", partitions=1, replication_factor=1)
    test.topic2 = clusters.new_topic(scenario.cluster, "test_topic2", partitions=3,
                                     replication_factor=TOPIC2_REPLICATION)
    # kafkatest: 20 s with a 2 s backoff; each attempt here starts a JVM, which alone can take 10 s
    last: list[str | None] = [None]

    def reset_set() -> bool:
        last[0] = clusters.set_share_group_offset_reset_strategy(scenario.cluster, test.group_id, "earliest")
        return last[0] is None

    scenario.wait_until(reset_set, 120, lambda: f"share.auto.offset.reset not set to earliest ({last[0]})",
                        backoff_sec=2)
    yield test


def finish(t: ShareTopics, consumer: VerifiableShareConsumer, producer: VerifiableProducer) -> None:
    """The producer stopped, every record it got acked must be consumed; then the consumers stop."""
    producer.stop()
    t.await_unique_consumed_messages(consumer, min_messages=producer.num_acked, timeout=DEFAULT_TIMEOUT_SEC)
    unique, acked = consumer.total_unique_consumed(), producer.num_acked
    t.record(consumer, producer)
    assert unique >= acked, f"Total unique consumed {unique} is less than the total acked {acked}"
    consumer.stop_all()


def start_and_consume(t: ShareTopics, topic: str) -> tuple[VerifiableProducer, VerifiableShareConsumer]:
    producer = t.setup_producer(topic)
    consumer = t.setup_share_group(topic)
    producer.start()
    t.await_produced_messages(producer)
    consumer.start()
    t.await_all_members(consumer, timeout=DEFAULT_TIMEOUT_SEC)
    t.await_consumed_messages(consumer, timeout=DEFAULT_TIMEOUT_SEC)
    return producer, consumer


def _exactly_once(t: ShareTopics, topic: str, total_messages: int, throughput: int) -> None:
    producer = t.setup_producer(topic, max_messages=total_messages, throughput=throughput)
    consumer = t.setup_share_group(topic)
    producer.start()
    consumer.start()
    t.await_all_members(consumer, timeout=DEFAULT_TIMEOUT_SEC)
    t.await_acknowledged_messages(consumer, min_messages=total_messages, timeout=DEFAULT_TIMEOUT_SEC)
    t.record(consumer, producer)
    consumed, acknowledged, acked = consumer.total_consumed(), consumer.total_acknowledged_successfully(), \
        producer.num_acked
    assert consumed >= acked, f"Total consumed {consumed} is less than the total acked {acked}"
    assert acknowledged == acked, f"Total acknowledged {acknowledged} does not match the total acked {acked}"
    for node, handler in consumer.per_node().items():
        assert handler.total_consumed > 0, f"{node} consumed nothing"
        assert handler.total_acknowledged_successfully > 0, f"{node} acknowledged nothing"
    producer.stop()
    consumer.stop_all()


def test_share_single_topic_partition(t: ShareTopics, enable_assignment_batching: bool) -> None:
    """100,000 records on one partition: all three consumers get some, each is acknowledged once."""
    _exactly_once(t, t.topic1, total_messages=100000, throughput=500)


def test_share_multiple_partitions(t: ShareTopics, enable_assignment_batching: bool) -> None:
    """1,000,000 records on three partitions at 5,000 a second, each acknowledged once."""
    _exactly_once(t, t.topic2, total_messages=1000000, throughput=5000)


@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "sigkill"])
def test_broker_rolling_bounce(t: ShareTopics, clean_shutdown: bool, enable_assignment_batching: bool) -> None:
    """Every broker restarted once (with a controlled shutdown or SIGKILL): nothing acked goes unconsumed."""
    producer, consumer = start_and_consume(t, t.topic2)
    t.rolling_bounce_brokers(t.topic2, TOPIC2_REPLICATION, num_bounces=1, clean_shutdown=clean_shutdown,
                             timeout=DEFAULT_TIMEOUT_SEC)
    t.await_consumed_messages(consumer, min_messages=1000, timeout=DEFAULT_TIMEOUT_SEC)
    finish(t, consumer, producer)


@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "sigkill"])
@pytest.mark.parametrize("num_failed_brokers", [1, 2], ids=["1broker", "2brokers"])
def test_broker_failure(t: ShareTopics, clean_shutdown: bool, num_failed_brokers: int,
                        enable_assignment_batching: bool) -> None:
    """One or two of the three brokers down for good: nothing acked goes unconsumed."""
    producer, consumer = start_and_consume(t, t.topic2)
    t.fail_brokers(t.topic2, TOPIC2_REPLICATION, num_brokers=num_failed_brokers, clean_shutdown=clean_shutdown,
                   timeout=DEFAULT_TIMEOUT_SEC)
    t.await_consumed_messages(consumer, min_messages=1000, timeout=DEFAULT_TIMEOUT_SEC)
    finish(t, consumer, producer)


@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "sigkill"])
@pytest.mark.parametrize("bounce_mode", ["all", "rolling"])
def test_share_consumer_bounce(t: ShareTopics, clean_shutdown: bool, bounce_mode: str,
                               enable_assignment_batching: bool) -> None:
    """The consumers bounced five times (all at once or one at a time; SIGTERM or SIGKILL)."""
    producer, consumer = start_and_consume(t, t.topic2)
    if bounce_mode == "all":
        t.bounce_all_share_consumers(consumer, clean_shutdown=clean_shutdown, timeout=DEFAULT_TIMEOUT_SEC)
    else:
        t.rolling_bounce_share_consumers(consumer, clean_shutdown=clean_shutdown, timeout=DEFAULT_TIMEOUT_SEC)
    finish(t, consumer, producer)


@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "sigkill"])
@pytest.mark.parametrize("num_failed_consumers", [1, 2], ids=["1consumer", "2consumers"])
def test_share_consumer_failure(t: ShareTopics, clean_shutdown: bool, num_failed_consumers: int,
                                enable_assignment_batching: bool) -> None:
    """One or two consumers stopped for good: the rest consume everything."""
    producer, consumer = start_and_consume(t, t.topic2)
    t.fail_share_consumers(consumer, num_failed_consumers, clean_shutdown=clean_shutdown,
                           timeout=DEFAULT_TIMEOUT_SEC)
    t.await_consumed_messages(consumer, min_messages=1000, timeout=DEFAULT_TIMEOUT_SEC)
    finish(t, consumer, producer)
