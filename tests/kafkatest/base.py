"""kafkatest's test base classes, as helpers over a :class:`Scenario`.

``ConsumerTest`` is ``VerifiableConsumerTest`` plus ``OffsetValidationTest``'s bounce helpers
(kafkatest's verifiable_consumer_test.py and consumer_test.py); ``ShareConsumerTest`` is
``VerifiableShareConsumerTest`` plus ``ShareConsumerTest``'s (share_consumer_test.py).  The waits keep
kafkatest's figures; :meth:`Scenario.timeout` scales them (``--kafkatest-timeout-scale``).
"""

from __future__ import annotations

from typing import Any

from asyncconsumer.testing import KafkaCluster

from . import cluster as clusters
from .clients import Client
from .handlers import TopicPartition
from .services import Scenario, VerifiableConsumer, VerifiableProducer, VerifiableShareConsumer

RANGE = "org.apache.kafka.clients.consumer.RangeAssignor"
#: kafkatest: ``VerifiableConsumerTest.consumption_timeout_sec``.
CONSUMPTION_TIMEOUT_SEC = 35
PRODUCER_REQUEST_TIMEOUT_SEC = 30


class KafkaTest:
    """What kafkatest's consumer and share-consumer test bases share: the scenario, the client
    under test, a group of its own, and Kafka's producer."""

    def __init__(self, scenario: Scenario, client: Client, *, num_consumers: int,
                 group_id: str = "test_group_id") -> None:
        self.scenario = scenario
        self.kafka: KafkaCluster = scenario.cluster
        self.client = client
        self.num_consumers = num_consumers
        self.group_id = clusters.unique(group_id)

    def setup_producer(self, topic: str, max_messages: int = -1, throughput: int = 500) -> VerifiableProducer:
        return VerifiableProducer(self.scenario, topic, max_messages=max_messages, throughput=throughput,
                                  request_timeout_sec=PRODUCER_REQUEST_TIMEOUT_SEC)

    def await_produced_messages(self, producer: VerifiableProducer, min_messages: int = 1000,
                                timeout_sec: float = 10) -> None:
        current = producer.num_acked
        self.scenario.wait_until(lambda: producer.num_acked >= current + min_messages, timeout_sec,
                                 "Timeout awaiting messages to be produced and acked")


class ConsumerTest(KafkaTest):
    """One consumer scenario's topic, group and helpers."""

    def __init__(self, scenario: Scenario, client: Client, topic: str, *, num_consumers: int = 1,
                 num_producers: int = 0, group_id: str = "test_group_id") -> None:
        super().__init__(scenario, client, num_consumers=num_consumers, group_id=group_id)
        self.topic = topic
        self.num_producers = num_producers

    # -- services ---------------------------------------------------------------------------------------

    def setup_consumer(self, topic: str, *, static_membership: bool = False, enable_autocommit: bool = False,
                       assignment_strategy: str | None = RANGE, group_remote_assignor: str | None = "range",
                       name: str = "consumer", **kwargs: Any) -> VerifiableConsumer:
        return VerifiableConsumer(
            self.scenario, self.num_consumers, topic, self.group_id, client=self.client, name=name,
            static_membership=static_membership, enable_autocommit=enable_autocommit,
            assignment_strategy=assignment_strategy, group_remote_assignor=group_remote_assignor, **kwargs,
        )

    # -- waits ------------------------------------------------------------------------------------------

    def await_consumed_messages(self, consumer: VerifiableConsumer, min_messages: int = 1) -> None:
        current = consumer.total_consumed()
        self.scenario.wait_until(lambda: consumer.total_consumed() >= current + min_messages,
                                 CONSUMPTION_TIMEOUT_SEC, "Timed out waiting for consumption", needs=consumer)

    def await_members(self, consumer: VerifiableConsumer, num_consumers: int) -> None:
        self.scenario.wait_until(lambda: len(consumer.joined_nodes()) == num_consumers, 60,
                                 "Consumers failed to join in a reasonable amount of time")

    def await_all_members(self, consumer: VerifiableConsumer) -> None:
        self.await_members(consumer, self.num_consumers)

    def valid_assignment(self, topic: str, num_partitions: int, assignment: dict[Any, list[TopicPartition]]) -> bool:
        every = [tp for partitions in assignment.values() for tp in partitions]
        return len(every) == num_partitions and set(every) == {TopicPartition(topic, p) for p in range(num_partitions)}

    def await_all_members_stabilized(self, topic: str, num_partitions: int, consumer: VerifiableConsumer,
                                     timeout_sec: float) -> None:
        group = consumer.group_id
        self.scenario.wait_until(lambda: group in clusters.groups_in_state(self.kafka, "stable"), timeout_sec,
                                 f"Timed out waiting for group {group} to transition to STABLE state.",
                                 backoff_sec=0.5)
        self.scenario.wait_until(
            lambda: self.valid_assignment(topic, num_partitions, consumer.current_assignment()), timeout_sec,
            "Timeout awaiting for the consumers to reconcile to a valid assignment.",
        )

    # -- bounces (OffsetValidationTest) -----------------------------------------------------------------

    def rolling_bounce_consumers(self, consumer: VerifiableConsumer, keep_alive: int = 0, num_bounces: int = 5,
                                 clean_shutdown: bool = True) -> None:
        for _ in range(num_bounces):
            for node in consumer.nodes[keep_alive:]:
                consumer.stop_node(node, clean_shutdown)
                self.scenario.wait_until(lambda: len(consumer.dead_nodes()) == 1, 60,
                                         "Timed out waiting for the consumer to shutdown")
                consumer.start_node(node)
                self.await_all_members(consumer)
                self.await_consumed_messages(consumer)

    def bounce_all_consumers(self, consumer: VerifiableConsumer, keep_alive: int = 0, num_bounces: int = 5,
                             clean_shutdown: bool = True) -> None:
        for _ in range(num_bounces):
            for node in consumer.nodes[keep_alive:]:
                consumer.stop_node(node, clean_shutdown)
            self.scenario.wait_until(lambda: len(consumer.dead_nodes()) == self.num_consumers - keep_alive, 10,
                                     "Timed out waiting for the consumers to shutdown")
            for node in consumer.nodes[keep_alive:]:
                consumer.start_node(node)
            self.await_all_members(consumer)
            self.await_consumed_messages(consumer)

    def rolling_bounce_brokers(self, consumer: VerifiableConsumer, num_bounces: int = 5,
                               clean_shutdown: bool = True) -> None:
        for _ in range(num_bounces):
            for node in self.kafka.nodes:
                clusters.restart_broker(node, clean_shutdown=True)
                self.await_all_members(consumer)
                self.await_consumed_messages(consumer)

    def await_conflict_consumers_fenced(self, conflict_consumer: VerifiableConsumer) -> None:
        def fenced() -> bool:
            done = set(conflict_consumer.shutdown_complete_nodes())
            dead = set(conflict_consumer.dead_nodes())
            return all(node in done and node in dead for node in conflict_consumer.nodes)

        self.scenario.wait_until(
            fenced, 60, "Timed out waiting for conflict consumers to report shutdown completion after fencing")

    # -- figures ----------------------------------------------------------------------------------------

    def record(self, consumer: VerifiableConsumer, producer: VerifiableProducer | None = None, **more: Any) -> None:
        """The figures docs/kafkatest.md tabulates."""
        with consumer.lock:
            figures = {
                "consumed": consumer.total_consumed(),
                "rebalances": consumer.num_rebalances(),
                "revocations": max((h.revoked_count for h in consumer.handlers.values()), default=0),
                "position_warnings": len(consumer.position_warnings),
            }
        if producer is not None:
            figures["acked"] = producer.num_acked
        figures.update(more)
        self.scenario.figures.update(figures)


class ShareConsumerTest(KafkaTest):
    """One share-consumer scenario's topics, group and helpers (``VerifiableShareConsumerTest``)."""

    def __init__(self, scenario: Scenario, client: Client, *, num_consumers: int = 3,
                 group_id: str = "test_group_id") -> None:
        super().__init__(scenario, client, num_consumers=num_consumers, group_id=group_id)

    def setup_share_group(self, topic: str, acknowledgement_mode: str = "auto", **kwargs: Any
                          ) -> VerifiableShareConsumer:
        return VerifiableShareConsumer(self.scenario, self.num_consumers, topic, self.group_id, client=self.client,
                                       acknowledgement_mode=acknowledgement_mode, **kwargs)

    def await_consumed_messages(self, consumer: VerifiableShareConsumer, min_messages: int = 1,
                                timeout: float = 10) -> None:
        current = consumer.total_consumed()
        self.scenario.wait_until(lambda: consumer.total_consumed() >= current + min_messages, timeout,
                                 "Timed out waiting for consumption", needs=consumer)

    def await_consumed_messages_by_a_consumer(self, consumer: VerifiableShareConsumer, node: Any,
                                              min_messages: int = 1, timeout: float = 10) -> None:
        current = consumer.total_consumed_by(node)
        self.scenario.wait_until(lambda: consumer.total_consumed_by(node) >= current + min_messages, timeout,
                                 "Timed out waiting for consumption", needs=consumer)

    def await_unique_consumed_messages(self, consumer: VerifiableShareConsumer, min_messages: int,
                                       timeout: float) -> None:
        self.scenario.wait_until(lambda: consumer.total_unique_consumed() >= min_messages, timeout,
                                 "Timed out waiting for consumption", needs=consumer)

    def await_acknowledged_messages(self, consumer: VerifiableShareConsumer, min_messages: int,
                                    timeout: float) -> None:
        self.scenario.wait_until(lambda: consumer.total_acknowledged() >= min_messages, timeout,
                                 "Timed out waiting for consumption", needs=consumer)

    def await_members(self, consumer: VerifiableShareConsumer, num_consumers: int, timeout: float = 10) -> None:
        self.scenario.wait_until(lambda: len(consumer.alive_nodes()) == num_consumers, timeout,
                                 "Consumers failed to start in a reasonable amount of time")

    def await_all_members(self, consumer: VerifiableShareConsumer, timeout: float = 10) -> None:
        self.await_members(consumer, self.num_consumers, timeout)

    # -- ShareConsumerTest's helpers ----------------------------------------------------------------------

    def rolling_bounce_brokers(self, topic: str, replication_factor: int, num_bounces: int = 5,
                               clean_shutdown: bool = True, timeout: float = 60) -> None:
        for _ in range(num_bounces):
            for node in self.kafka.nodes:
                clusters.restart_broker(node, clean_shutdown=clean_shutdown)
                self.scenario.wait_until(
                    lambda: set(clusters.isr_sizes(self.kafka, topic)) == {replication_factor}, timeout,
                    f"Timed out waiting for the partitions of {topic} to have {replication_factor} in-sync replicas",
                    backoff_sec=0.5)

    def fail_brokers(self, topic: str, replication_factor: int, num_brokers: int = 1, clean_shutdown: bool = True,
                     timeout: float = 60) -> None:
        for i in range(num_brokers):
            clusters.signal_broker(self.scenario, self.kafka.nodes[i], clean_shutdown)
            expected = replication_factor - (i + 1)

            def shrunk(expected: int = expected) -> bool:
                return set(clusters.isr_sizes(self.kafka, topic)) == {expected}

            self.scenario.wait_until(
                shrunk, timeout,
                f"Timed out waiting for the partitions of {topic} to shrink to {expected} in-sync replicas",
                backoff_sec=0.5)
        self.scenario.wait_until(lambda: clusters.all_partitions_have_a_leader(self.kafka, topic), timeout,
                                 f"Timed out waiting for every partition of {topic} to have a leader", backoff_sec=0.5)

    def rolling_bounce_share_consumers(self, consumer: VerifiableShareConsumer, keep_alive: int = 0,
                                       num_bounces: int = 5, clean_shutdown: bool = True, timeout: float = 60) -> None:
        for _ in range(num_bounces):
            for node in consumer.nodes[keep_alive:]:
                consumer.stop_node(node, clean_shutdown)
                self.scenario.wait_until(lambda: len(consumer.dead_nodes()) == 1, timeout,
                                         "Timed out waiting for the consumer to shutdown")
                consumer.start_node(node)
                self.await_all_members(consumer, timeout)
                self.await_consumed_messages_by_a_consumer(consumer, node, timeout=timeout)

    def bounce_all_share_consumers(self, consumer: VerifiableShareConsumer, keep_alive: int = 0,
                                   num_bounces: int = 5, clean_shutdown: bool = True, timeout: float = 60) -> None:
        for _ in range(num_bounces):
            for node in consumer.nodes[keep_alive:]:
                consumer.stop_node(node, clean_shutdown)
            self.scenario.wait_until(lambda: len(consumer.dead_nodes()) == self.num_consumers - keep_alive, timeout,
                                     "Timed out waiting for the consumers to shutdown")
            for num_started, node in enumerate(consumer.nodes[keep_alive:], keep_alive + 1):
                consumer.start_node(node)
                self.await_members(consumer, num_started, timeout)
                self.await_consumed_messages_by_a_consumer(consumer, node, timeout=timeout)

    def fail_share_consumers(self, consumer: VerifiableShareConsumer, num_consumers: int = 1,
                             clean_shutdown: bool = True, timeout: float = 60) -> None:
        for i in range(num_consumers):
            consumer.kill_node(consumer.nodes[i], clean_shutdown=clean_shutdown)

            def dead(count: int = i + 1) -> bool:
                return len(consumer.dead_nodes()) == count

            self.scenario.wait_until(dead, timeout, "Timed out waiting for the consumer to be killed")

    def record(self, consumer: VerifiableShareConsumer, producer: VerifiableProducer | None = None,
               **more: Any) -> None:
        figures: dict[str, Any] = {
            "consumed": consumer.total_consumed(), "unique_consumed": consumer.total_unique_consumed(),
            "acknowledged": consumer.total_acknowledged_successfully(),
        }
        if producer is not None:
            figures["acked"] = producer.num_acked
        figures.update(more)
        self.scenario.figures.update(figures)
