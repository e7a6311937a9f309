"""The ``roundrobin`` assignor (the Java client's ``RoundRobinAssignor``).

All partitions of every topic anybody subscribes to are listed in order (topic
name in Java string order, then partition number) and dealt out one at a time
to the members in a circle (member order as in
:func:`~asyncconsumer.assignors.base.sorted_member_ids`).  A member that is not
subscribed to a partition's topic is skipped, and the circle carries on from
where it stopped: it does not restart for each topic.  Example, ``t0`` and
``t1`` with three partitions each and members ``C0``, ``C1``::

    C0: t0-0, t0-2, t1-1
    C1: t0-1, t1-0, t1-2

It does not look at racks (the Java client's ``RoundRobinAssignor`` does not either).
"""

from __future__ import annotations

from typing import ClassVar

from ..structs import TopicPartition
from .base import (
    NO_RACKS,
    Assignor,
    MemberAssignment,
    RebalanceProtocol,
    ReplicaRacks,
    Subscription,
    java_string_key,
    sorted_member_ids,
)

__all__ = ["RoundRobinAssignor"]


class RoundRobinAssignor(Assignor):
    """Deal partitions out one by one, skipping members not subscribed to the topic."""

    name: ClassVar[str] = "roundrobin"
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.EAGER

    def assign(
        self,
        partitions_per_topic: dict[str, int],
        subscriptions: dict[str, Subscription],
        replica_racks: ReplicaRacks = NO_RACKS,
    ) -> dict[str, MemberAssignment]:
        # Not rack-aware, as in the Java client: ``replica_racks`` is not looked at.
        order = sorted_member_ids(subscriptions)
        topics_of = {m: set(subscriptions[m].topics) for m in order}
        result: dict[str, list[TopicPartition]] = {m: [] for m in order}
        all_topics = sorted({t for topics in topics_of.values() for t in topics}, key=java_string_key)
        position = 0
        for topic in all_topics:
            count = partitions_per_topic.get(topic)
            if count is None:
                continue
            # Every topic here has at least one subscriber, so the search below terminates.
            for partition in range(count):
                while topic not in topics_of[order[position]]:
                    position = (position + 1) % len(order)
                result[order[position]].append(TopicPartition(topic, partition))
                position = (position + 1) % len(order)
        return {m: MemberAssignment(tuple(sorted(parts))) for m, parts in result.items()}
