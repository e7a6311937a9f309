"""The Apache Kafka cluster of the scenarios, kafkatest's topology on loopback.

kafkatest runs its consumer scenarios on two brokers beside one isolated KRaft controller, and its
share-consumer scenarios on three brokers beside three controllers; each test gets a fresh
cluster.  Here :class:`ClusterPool` keeps one ``KafkaCluster`` of each shape for as long as the
tests that need it run in a row (tests are ordered by shape), and each test gets a topic and a
group of its own.  After a test the cluster is healed: every stopped broker started again and
every partition's replicas back in sync.

Broker settings are kafkatest's where its broker template sets them, ``KafkaCluster``'s short
group timers otherwise (the table in docs/kafkatest.md lists every difference).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient
from support.cluster import heal, wait_in_sync

from asyncconsumer.testing import KafkaCluster, KafkaNode
from asyncconsumer.testing.producer import create_topic


@dataclass(frozen=True)
class Shape:
    """A cluster as kafkatest's tests size it."""

    brokers: int
    controllers: int
    #: KIP-1263 assignment batching (kafkatest's ``enable_assignment_batching``): on leaves the brokers'
    #: default assignment interval, off sets it to 0.
    assignment_batching: bool = True

    def config(self) -> dict[str, object]:
        interval = 1000 if self.assignment_batching else 0  # 1000 ms: Kafka's default
        return {
            # kafkatest's broker template
            "offsets.topic.num.partitions": self.brokers,
            "offsets.topic.replication.factor": min(3, self.brokers),
            "group.initial.rebalance.delay.ms": 100,
            "min.insync.replicas": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": min(3, self.brokers),
            "share.coordinator.state.topic.min.isr": 1,
            # enable_assignment_batching
            "group.consumer.assignment.interval.ms": interval,
            "group.share.assignment.interval.ms": interval,
        }

    def __str__(self) -> str:
        return f"{self.brokers}b+{self.controllers}c{'' if self.assignment_batching else '-nobatch'}"


class ClusterPool:
    """One running cluster at a time: asking for another shape stops the current one."""

    def __init__(self) -> None:
        self._shape: Shape | None = None
        self._cluster: KafkaCluster | None = None

    def get(self, shape: Shape) -> KafkaCluster:
        if self._cluster is not None and self._shape == shape:
            heal(self._cluster)
            return self._cluster
        self.stop()
        cluster = KafkaCluster(shape.brokers, controllers=shape.controllers, config=shape.config(), heap_mb=512,
                               startup_timeout=300)
        cluster.start()
        self._cluster, self._shape = cluster, shape
        return cluster

    def stop(self) -> None:
        cluster, self._cluster, self._shape = self._cluster, None, None
        if cluster is not None:
            _ADMINS.pop(cluster.bootstrap, None)
            cluster.stop()


_ADMINS: dict[str, AdminClient] = {}


def admin(cluster: KafkaCluster) -> AdminClient:
    """One admin client per running cluster (a new one per call would bootstrap each time)."""
    client = _ADMINS.get(cluster.bootstrap)
    if client is None:
        client = _ADMINS[cluster.bootstrap] = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    return client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(cluster: KafkaCluster, prefix: str, partitions: int, replication_factor: int) -> str:
    name = create_topic(cluster.bootstrap, unique(prefix), partitions, replication_factor=replication_factor)
    wait_in_sync(cluster)
    return name


PartitionState = tuple[int, list[int], list[int]]


def partition_states(cluster: KafkaCluster, topic: str | None = None) -> dict[tuple[str, int], PartitionState]:
    """(topic, partition) -> (leader, isr, replicas) from a broker's metadata."""
    md = admin(cluster).list_topics(topic, timeout=10)
    return {
        (str(t.topic), int(p.id)): (p.leader, list(p.isrs), list(p.replicas))
        for t in md.topics.values() if t.error is None
        for p in t.partitions.values()
    }


def restart_broker(node: KafkaNode, *, clean_shutdown: bool = True, timeout: float = 120.0) -> None:
    """kafkatest's ``kafka.restart_node``: stop (SIGTERM, a controlled shutdown, 60 s; or SIGKILL),
    then start and wait until the broker answers."""
    if clean_shutdown:
        node.stop(timeout=60)
    else:
        node.kill()
    node.restart(timeout=timeout)


def signal_broker(scenario: Any, node: KafkaNode, clean_shutdown: bool) -> None:
    """kafkatest's ``kafka.signal_node``: SIGTERM or SIGKILL, not waiting for the exit.  The scenario
    waits for it at its end (a broker still shutting down cannot be started again by the next test)."""
    assert node.process is not None
    scenario.brokers_signalled.append(node)
    if clean_shutdown:
        node.process.terminate()
    else:
        node.process.kill()


def groups_in_state(cluster: KafkaCluster, state: str) -> set[str]:
    """``kafka-consumer-groups --list --state <state>`` (classic and consumer groups)."""
    wanted = ConsumerGroupState[state.upper()]
    try:
        result = admin(cluster).list_consumer_groups(states={wanted}, request_timeout=10).result(15)
    except (KafkaException, TimeoutError):  # a broker restarting, a slow answer: none known yet
        return set()
    return {listing.group_id for listing in result.valid}


def describe_group(cluster: KafkaCluster, group_id: str) -> str:
    """What kafkatest logs on a failed fencing check (``kafka-consumer-groups --describe``)."""
    try:
        (future,) = admin(cluster).describe_consumer_groups([group_id], request_timeout=10).values()
        group = future.result(15)
    except KafkaException as exc:
        return f"describe {group_id}: {exc}"
    members = "; ".join(
        f"{m.member_id} instance={m.group_instance_id} "
        f"assignment={[tp.partition for tp in m.assignment.topic_partitions]}"
        for m in group.members
    )
    return f"{group_id}: state={group.state} members: {members}"


def set_share_group_offset_reset_strategy(cluster: KafkaCluster, group_id: str, strategy: str) -> str | None:
    """kafkatest's ``kafka.set_share_group_offset_reset_strategy``: ``kafka-configs --group <id> --alter
    --add-config share.auto.offset.reset=<strategy>`` through Kafka's own tool.  None once it
    completed, else the tool's last lines (why not)."""
    result = cluster.run_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", cluster.bootstrap,
                              "--group", group_id, "--alter", "--add-config", f"share.auto.offset.reset={strategy}",
                              check=False)
    if "Completed" in result.stdout:
        return None
    output = (result.stdout + result.stderr).splitlines()
    lines = [line for line in output if line.strip() and not line.startswith("\t")]
    return f"exit {result.returncode}: " + " | ".join(lines[-4:])


def isr_sizes(cluster: KafkaCluster, topic: str) -> list[int]:
    """The in-sync replica count of each of ``topic``'s partitions (kafkatest's ``isr_idx_list``)."""
    try:
        states = partition_states(cluster, topic)
    except KafkaException:
        return []
    return [len(isr) for (_, _), (_, isr, _) in sorted(states.items())]


def all_partitions_have_a_leader(cluster: KafkaCluster, topic: str) -> bool:
    try:
        states = partition_states(cluster, topic)
    except KafkaException:
        return False
    return bool(states) and all(leader >= 0 for leader, _, _ in states.values())
