"""kafkatest's ``OffsetValidationTest`` (consumer_test.py): three members of one group on a
one-partition topic (replication factor 2) of two brokers and one KRaft controller, a producer at
500 records a second, and the group's offsets checked at every event.  The parameters are
kafkatest's ``@matrix`` (metadata_quorum is always isolated KRaft here)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import cluster as clusters
from .base import RANGE, ConsumerTest
from .clients import Client
from .handlers import TopicPartition
from .services import Scenario, VerifiableConsumer

PROTOCOLS = ["classic", "consumer"]
#: kafkatest's ``group_protocol`` x ``enable_assignment_batching`` where it varies batching: both
#: protocols with it on (the brokers' default), the consumer protocol also with it off.
WITH_BATCHING = [pytest.param("classic", True, id="classic-batching"),
                 pytest.param("consumer", True, id="consumer-batching"),
                 pytest.param("consumer", False, id="consumer-nobatching")]
pytestmark = pytest.mark.kafkatest_cluster(brokers=2, controllers=1)


@pytest.fixture
def t(scenario: Scenario, client: Client) -> Iterator[ConsumerTest]:
    topic = clusters.new_topic(scenario.cluster, "test_topic", partitions=1, replication_factor=2)
    yield ConsumerTest(scenario, client, topic, num_consumers=3, num_producers=1)


def tp(t: ConsumerTest) -> TopicPartition:
    return TopicPartition(t.topic, 0)


def assert_position_is_total(t: ConsumerTest, consumer: VerifiableConsumer, clean_shutdown: bool = True) -> None:
    position, total = consumer.current_position(tp(t)), consumer.total_consumed()
    if clean_shutdown:
        assert position == total, f"Total consumed records {total} did not match consumed position {position}"
    else:
        assert position is not None and position <= total, (
            f"Current position {position} greater than the total number of consumed records {total}")


@pytest.mark.parametrize("group_protocol", PROTOCOLS)
def test_broker_rolling_bounce(t: ConsumerTest, group_protocol: str) -> None:
    """Bouncing every broker in turn (five times) causes no rebalance and loses nothing."""
    producer = t.setup_producer(t.topic)
    consumer = t.setup_consumer(t.topic, group_protocol=group_protocol, prop_file="metadata.recovery.strategy=none")
    producer.start()
    t.await_produced_messages(producer)
    consumer.start()
    t.await_all_members(consumer)
    t.await_all_members_stabilized(t.topic, 1, consumer, timeout_sec=60)
    num_rebalances = consumer.num_rebalances()
    t.rolling_bounce_brokers(consumer, num_bounces=5)
    unexpected = consumer.num_rebalances() - num_rebalances
    t.record(consumer, producer, bounces=5)
    assert unexpected == 0, f"Broker rolling bounce caused {unexpected} unexpected group rebalances"
    consumer.stop_all()
    t.record(consumer, producer, bounces=5)
    assert_position_is_total(t, consumer)


@pytest.mark.parametrize(("group_protocol", "enable_assignment_batching"), WITH_BATCHING)
def test_group_consumption(t: ConsumerTest, group_protocol: str, enable_assignment_batching: bool) -> None:
    """Members join one at a time, then leave one at a time; the group keeps consuming throughout."""
    producer = t.setup_producer(t.topic)
    consumer = t.setup_consumer(t.topic, group_protocol=group_protocol)
    producer.start()
    for num_started, node in enumerate(consumer.nodes, 1):
        consumer.start_node(node)
        t.await_members(consumer, num_started)
        t.await_consumed_messages(consumer)
    for num_stopped, node in enumerate(consumer.nodes, 1):
        consumer.stop_node(node)
        if num_stopped < t.num_consumers:
            t.await_members(consumer, t.num_consumers - num_stopped)
            t.await_consumed_messages(consumer)
    t.record(consumer, producer)
    assert_position_is_total(t, consumer)
    position, commit = consumer.current_position(tp(t)), consumer.last_commit(tp(t))
    assert commit == position, f"Last committed offset {commit} did not match last consumed position {position}"



@pytest.mark.parametrize("clean_shutdown", [True], ids=["clean"])
@pytest.mark.parametrize("bounce_mode", ["all", "rolling"])
@pytest.mark.parametrize(("group_protocol", "enable_assignment_batching"), WITH_BATCHING)
def test_consumer_bounce(t: ConsumerTest, clean_shutdown: bool, bounce_mode: str, group_protocol: str,
                         enable_assignment_batching: bool) -> None:
    """Bouncing the members (all at once, or one at a time; five times) loses and repeats nothing."""
    producer = t.setup_producer(t.topic)
    consumer = t.setup_consumer(t.topic, group_protocol=group_protocol)
    producer.start()
    t.await_produced_messages(producer)
    consumer.start()
    t.await_all_members(consumer)
    if bounce_mode == "all":
        t.bounce_all_consumers(consumer, clean_shutdown=clean_shutdown)
    else:
        t.rolling_bounce_consumers(consumer, clean_shutdown=clean_shutdown)
    consumer.stop_all()
    t.record(consumer, producer)
    assert_position_is_total(t, consumer, clean_shutdown)


@pytest.mark.parametrize("clean_shutdown", [True], ids=["clean"])
@pytest.mark.parametrize("static_membership", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize("bounce_mode", ["all", "rolling"])
@pytest.mark.parametrize("num_bounces", [5], ids=["5bounces"])
@pytest.mark.parametrize("group_protocol", ["classic"])
def test_static_consumer_bounce_with_eager_assignment(t: ConsumerTest, clean_shutdown: bool,
                                                      static_membership: bool, bounce_mode: str, num_bounces: int,
                                                      group_protocol: str) -> None:
    """With eager range assignment, bouncing members 2 and 3 revokes member 1's partitions when the
    members are dynamic, and never when they are static (a static member's restart is no rebalance)."""
    producer = t.setup_producer(t.topic)
    producer.start()
    t.await_produced_messages(producer)
    consumer = t.setup_consumer(t.topic, static_membership=static_membership, group_protocol=group_protocol,
                                assignment_strategy=RANGE)
    consumer.start()
    t.await_all_members(consumer)
    num_revokes_before_bounce = consumer.num_revokes_for_alive()
    num_keep_alive = 1
    if bounce_mode == "all":
        t.bounce_all_consumers(consumer, keep_alive=num_keep_alive, num_bounces=num_bounces)
    else:
        t.rolling_bounce_consumers(consumer, keep_alive=num_keep_alive, num_bounces=num_bounces)
    num_revokes_after_bounce = consumer.num_revokes_for_alive() - num_revokes_before_bounce
    t.record(consumer, producer, revocations_of_kept_member=num_revokes_after_bounce)
    if static_membership:
        assert num_revokes_after_bounce == 0, (
            "Unexpected revocation triggered when bouncing static member. Expecting 0 but had "
            f"{num_revokes_after_bounce} revocations")
    else:
        assert num_revokes_after_bounce != 0, (
            "Revocations not triggered as expected when bouncing member with eager assignment")
    consumer.stop_all()
    t.record(consumer, producer, revocations_of_kept_member=num_revokes_after_bounce)
    if clean_shutdown:
        assert_position_is_total(t, consumer)


@pytest.mark.parametrize("bounce_mode", ["all", "rolling"])
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
def test_static_consumer_persisted_after_rejoin(t: ConsumerTest, bounce_mode: str, group_protocol: str) -> None:
    """Static members bounced once, then every broker bounced once: the group comes back each time
    (all members joined within 60 s and consuming within 35 s after each restart)."""
    producer = t.setup_producer(t.topic)
    producer.start()
    t.await_produced_messages(producer)
    consumer = t.setup_consumer(t.topic, static_membership=True, group_protocol=group_protocol)
    consumer.start()
    t.await_all_members(consumer)
    if bounce_mode == "all":
        t.bounce_all_consumers(consumer, num_bounces=1)
    else:
        t.rolling_bounce_consumers(consumer, num_bounces=1)
    t.rolling_bounce_brokers(consumer, num_bounces=1)
    t.record(consumer, producer)


@pytest.mark.parametrize("num_conflict_consumers", [1, 2], ids=["1conflict", "2conflicts"])
@pytest.mark.parametrize("fencing_stage", ["stable", "all"])
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
def test_fencing_static_consumer(t: ConsumerTest, num_conflict_consumers: int, fencing_stage: str,
                                 group_protocol: str) -> None:
    """A second process with a static member's instance id: on the classic protocol the newer one
    fences the older; on the consumer protocol the newer one is refused (UnreleasedInstanceId) and
    nothing rebalances.  Either way the fenced processes report shutdown and exit by themselves."""
    producer = t.setup_producer(t.topic)
    producer.start()
    t.await_produced_messages(producer, timeout_sec=120)
    consumer = t.setup_consumer(t.topic, static_membership=True, group_protocol=group_protocol)
    t.num_consumers = num_conflict_consumers
    conflict_consumer = t.setup_consumer(t.topic, static_membership=True, group_protocol=group_protocol,
                                         name="conflict_consumer")
    total = len(consumer.nodes)
    if fencing_stage == "stable":
        consumer.start()
        t.await_members(consumer, total)
        t.await_all_members_stabilized(t.topic, 1, consumer, timeout_sec=120)
        num_rebalances = consumer.num_rebalances()
        conflict_consumer.start()
        if group_protocol == "classic":
            t.await_members(conflict_consumer, num_conflict_consumers)
            t.await_members(consumer, total - num_conflict_consumers)
            t.scenario.wait_until(lambda: len(consumer.dead_nodes()) == num_conflict_consumers, 10,
                                  "Timed out waiting for the fenced consumers to stop")
        else:
            t.await_consumed_messages(consumer)
            assert num_rebalances == consumer.num_rebalances(), (
                "Static consumers attempt to join with instance id in use should not cause a rebalance")
            assert len(consumer.joined_nodes()) == total, clusters.describe_group(t.kafka, consumer.group_id)
            assert len(conflict_consumer.joined_nodes()) == 0, clusters.describe_group(t.kafka, consumer.group_id)
            t.await_conflict_consumers_fenced(conflict_consumer)
            consumer.stop_all()
            t.scenario.wait_until(lambda: len(consumer.dead_nodes()) == total, 60,
                                  "Timed out waiting for the consumer to shutdown")
            t.scenario.wait_until(lambda: consumer.group_id in clusters.groups_in_state(t.kafka, "empty"), 60,
                                  f"Timed out waiting for group {consumer.group_id} to transition to EMPTY state.",
                                  backoff_sec=0.5)
            conflict_consumer.start()
            t.await_members(conflict_consumer, num_conflict_consumers)
    else:
        consumer.start()
        conflict_consumer.start()

        def joined() -> str:
            return (f"Timed out waiting for consumers to join, expected total {total} joined, but only see "
                    f"{len(consumer.joined_nodes())} joined from normal consumer group and "
                    f"{len(conflict_consumer.joined_nodes())} from conflict consumer group")

        t.scenario.wait_until(
            lambda: len(consumer.joined_nodes()) + len(conflict_consumer.joined_nodes()) == total, 60, joined)

        def dead() -> str:
            return (f"Timed out waiting for fenced consumers to die, expected total {num_conflict_consumers} dead, "
                    f"but only see {len(consumer.dead_nodes())} dead in normal consumer group and "
                    f"{len(conflict_consumer.dead_nodes())} dead in conflict consumer group")

        t.scenario.wait_until(
            lambda: len(consumer.dead_nodes()) + len(conflict_consumer.dead_nodes()) == num_conflict_consumers,
            60, dead)
    t.record(consumer, producer, conflict_dead=len(conflict_consumer.dead_nodes()),
             original_dead=len(consumer.dead_nodes()))


CONSUMER_FAILURE = [
    pytest.param(autocommit, protocol, batching, id=f"{'auto' if autocommit else 'manual'}commit-{protocol}-"
                                                    f"{'batching' if batching else 'nobatching'}")
    for autocommit, protocol, batching in [(True, "classic", True), (False, "classic", True), (True, "consumer", True),
                                           (False, "consumer", True), (True, "consumer", False)]
]


@pytest.mark.parametrize("clean_shutdown", [True], ids=["clean"])
@pytest.mark.parametrize(("enable_autocommit", "group_protocol", "enable_assignment_batching"), CONSUMER_FAILURE)
def test_consumer_failure(t: ConsumerTest, clean_shutdown: bool, enable_autocommit: bool, group_protocol: str,
                          enable_assignment_batching: bool) -> None:
    """The member that owns the partition is stopped: another takes it over and goes on from the
    last commit; with manual commits, the last commit ends up at the last position."""
    partition = tp(t)
    consumer = t.setup_consumer(t.topic, enable_autocommit=enable_autocommit, group_protocol=group_protocol)
    producer = t.setup_producer(t.topic)
    consumer.start()
    t.await_all_members(consumer)
    t.await_all_members_stabilized(t.topic, 1, consumer, timeout_sec=60)
    partition_owner = consumer.owner(partition)
    assert partition_owner is not None
    producer.start()
    t.await_produced_messages(producer)
    consumer.kill_node(partition_owner, clean_shutdown=clean_shutdown)
    t.scenario.wait_until(
        lambda: len(consumer.joined_nodes()) == t.num_consumers - 1 and consumer.owner(partition) is not None,
        60, "Timed out waiting for consumer to close")
    t.await_consumed_messages(consumer, min_messages=1000)
    consumer.stop_all()
    t.record(consumer, producer)
    assert_position_is_total(t, consumer, clean_shutdown)
    if not enable_autocommit:
        commit, position = consumer.last_commit(partition), consumer.current_position(partition)
        assert commit == position, f"Last committed offset {commit} did not match last consumed position {position}"


@pytest.mark.parametrize("clean_shutdown", [True, False], ids=["clean", "sigkill"])
@pytest.mark.parametrize("enable_autocommit", [True, False], ids=["autocommit", "manualcommit"])
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
def test_broker_failure(t: ConsumerTest, clean_shutdown: bool, enable_autocommit: bool, group_protocol: str) -> None:
    """One of the two brokers goes down for good (SIGTERM or SIGKILL): no rebalance, nothing lost."""
    partition = tp(t)
    producer = t.setup_producer(t.topic)
    consumer = t.setup_consumer(t.topic, enable_autocommit=enable_autocommit, group_protocol=group_protocol)
    producer.start()
    consumer.start()
    t.await_all_members(consumer)
    t.await_all_members_stabilized(t.topic, 1, consumer, timeout_sec=60)
    num_rebalances = consumer.num_rebalances()
    clusters.signal_broker(t.scenario, t.kafka.nodes[0], clean_shutdown)
    t.await_consumed_messages(consumer, min_messages=1000)
    t.record(consumer, producer)
    assert consumer.num_rebalances() == num_rebalances, "Broker failure should not cause a rebalance"
    consumer.stop_all()
    t.record(consumer, producer)
    assert_position_is_total(t, consumer)
    if not enable_autocommit:
        commit, position = consumer.last_commit(partition), consumer.current_position(partition)
        assert commit == position, f"Last committed offset {commit} did not match last consumed position {position}"
