"""kafkatest's ``AssignmentValidationTest`` (consumer_test.py): three members join a six-partition
topic (replication factor 1, two brokers) one at a time; after each join every partition must be
owned by exactly one member, by the members' own assigned/revoked events.  Every classic assignor,
and both server-side assignors of the consumer protocol with assignment batching on and off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import cluster as clusters
from .base import ConsumerTest
from .clients import Client
from .services import Scenario

pytestmark = pytest.mark.kafkatest_cluster(brokers=2, controllers=1)
PARTITIONS = 6
CLASSIC_ASSIGNORS = [f"org.apache.kafka.clients.consumer.{name}" for name in
                     ("RangeAssignor", "RoundRobinAssignor", "StickyAssignor", "CooperativeStickyAssignor")]
#: kafkatest's two ``@matrix``es: each classic assignor, and the consumer protocol with each remote
#: assignor and assignment batching off and on.
MATRIX = [pytest.param(s, "classic", None, True, id=f"classic-{s.rsplit('.', 1)[1]}") for s in CLASSIC_ASSIGNORS] + [
    pytest.param(None, "consumer", remote, batching, id=f"consumer-{remote}-{'batching' if batching else 'nobatching'}")
    for remote in ("range", "uniform") for batching in (False, True)
]


@pytest.fixture
def t(scenario: Scenario, client: Client) -> Iterator[ConsumerTest]:
    topic = clusters.new_topic(scenario.cluster, "test_topic", partitions=PARTITIONS, replication_factor=1)
    yield ConsumerTest(scenario, client, topic, num_consumers=3, num_producers=0)


@pytest.mark.parametrize(
    ("assignment_strategy", "group_protocol", "group_remote_assignor", "enable_assignment_batching"), MATRIX)
def test_valid_assignment(t: ConsumerTest, assignment_strategy: str | None, group_protocol: str,
                          group_remote_assignor: str | None, enable_assignment_batching: bool) -> None:
    consumer = t.setup_consumer(t.topic, assignment_strategy=assignment_strategy, group_protocol=group_protocol,
                                group_remote_assignor=group_remote_assignor)
    for num_started, node in enumerate(consumer.nodes, 1):
        consumer.start_node(node)
        t.await_members(consumer, num_started)

        def invalid(num_started: int = num_started) -> str:
            owned = [(str(n), [tp.partition for tp in a]) for n, a in consumer.current_assignment().items()]
            return (f"expected valid assignments of {PARTITIONS} partitions when num_started {num_started}: "
                    f"{owned}")

        t.scenario.wait_until(lambda: t.valid_assignment(t.topic, PARTITIONS, consumer.current_assignment()), 30,
                              invalid)
    t.record(consumer)
