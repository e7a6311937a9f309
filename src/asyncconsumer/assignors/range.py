"""The ``range`` assignor (the Java client's ``RangeAssignor``), rack-aware as in KIP-881.

Topic by topic: the members subscribed to the topic are put in order (see
:func:`~asyncconsumer.assignors.base.sorted_member_ids`: static members by
``group.instance.id`` first, then dynamic members by member id, which is what
Java does), the partitions in numeric order, and each member gets a contiguous
range.  With ``n`` partitions and ``m`` members every member gets ``n // m``
and the first ``n % m`` members one more.  Example, topics ``t0`` and ``t1``
with three partitions each and members ``C0``, ``C1``::

    C0: t0-0, t0-1, t1-0, t1-1
    C1: t0-2, t1-2

Racks
-----
When members send their rack and racks can make a difference (see
:mod:`~asyncconsumer.assignors.racks`: some topic has partitions whose replicas
are on a subset of the racks), partitions are first handed to members in the
same rack as one of their replicas, within the same per-topic quotas (every
member still ends with ``n // m`` or one more of each topic), then the rest as
above.  Balance comes first, rack alignment second; partitions that cannot be
aligned within the quotas go to whoever has room.  Per topic, walking the
members in order, each takes up to its quota of the still unassigned partitions
it matches, lowest numbers first.

Topics taken by the same members with the same number of partitions are
*co-partitioned*: without racks a member gets the same partition numbers of
each, and a join of those topics by partition stays on one member.  Rack
awareness keeps that: partition ``p`` of all of them goes, together, to the
first member (in order, with room left in each topic) that matches ``p`` in
every one of them.

The result is partition for partition the Java client's, so a group whose
leader is sometimes a Java member and sometimes ours sees the same assignment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import ClassVar

from ..structs import TopicPartition
from .base import NO_RACKS, Assignor, MemberAssignment, RebalanceProtocol, ReplicaRacks, Subscription, sorted_member_ids
from .racks import member_racks, use_rack_aware_assignment

__all__ = ["RangeAssignor"]


class _TopicState:
    """One topic's assignment in progress: its members (in order), what is left, the quotas."""

    def __init__(self, topic: str, count: int, members: list[str], racks: dict[str, str],
                 replica_racks: ReplicaRacks) -> None:
        self.topic = topic
        self.members = members
        self.member_rack = {m: racks.get(m) for m in members}
        self.unassigned: dict[int, None] = dict.fromkeys(range(count))
        self.assigned = dict.fromkeys(members, 0)
        self.per_member, self.extra = divmod(count, len(members)) if members else (0, 0)
        member_rack_set = {r for r in self.member_rack.values() if r is not None}
        #: Partition -> replica racks; empty when no member of the topic has a rack (as in Java).
        self.partition_racks: dict[int, frozenset[str]] = (
            {p: replica_racks.get(TopicPartition(topic, p), frozenset()) for p in range(count)}
            if member_rack_set else {}
        )
        self.needs_racks = use_rack_aware_assignment(
            member_rack_set, {TopicPartition(topic, p): r for p, r in self.partition_racks.items()}
        )

    def racks_match(self, member: str, partition: int) -> bool:
        rack = self.member_rack[member]
        return rack is None or rack in self.partition_racks.get(partition, ())

    def room(self, member: str) -> int:
        """How many more partitions of this topic ``member`` may take."""
        return max(0, self.per_member + (1 if self.extra > 0 else 0) - self.assigned[member])

    def take(self, member: str, partitions: Sequence[int], result: dict[str, list[TopicPartition]]) -> None:
        result[member].extend(TopicPartition(self.topic, p) for p in partitions)
        self.assigned[member] += len(partitions)
        if self.assigned[member] > self.per_member:
            self.extra -= 1
        for p in partitions:
            del self.unassigned[p]

    def assign_ranges(self, may_take: Callable[[str, int], bool], result: dict[str, list[TopicPartition]]) -> None:
        for member in self.members:
            if not self.unassigned:
                break
            room = self.room(member)
            chosen = [p for p in self.unassigned if may_take(member, p)][:room]
            if chosen:
                self.take(member, chosen, result)


def _assign_co_partitioned(members: list[str], count: int, states: list[_TopicState],
                           result: dict[str, list[TopicPartition]]) -> None:
    remaining = list(members)
    for p in range(count):
        match = next((m for m in remaining
                      if all(s.racks_match(m, p) and s.room(m) > 0 for s in states)), None)
        if match is None:
            continue
        for state in states:
            state.take(match, [p], result)
        if not any(s.room(match) > 0 for s in states):
            remaining.remove(match)
            if not remaining:
                break


class RangeAssignor(Assignor):
    """Contiguous per-topic ranges; the first members get one extra partition; rack-aware."""

    name: ClassVar[str] = "range"
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.EAGER

    def assign(
        self,
        partitions_per_topic: dict[str, int],
        subscriptions: dict[str, Subscription],
        replica_racks: ReplicaRacks = NO_RACKS,
    ) -> dict[str, MemberAssignment]:
        order = sorted_member_ids(subscriptions)
        racks = member_racks(subscriptions)
        topics_of = {m: set(subscriptions[m].topics) for m in order}
        result: dict[str, list[TopicPartition]] = {m: [] for m in order}
        states = [
            _TopicState(topic, count, [m for m in order if topic in topics_of[m]], racks, replica_racks)
            for topic, count in sorted(partitions_per_topic.items())
            if count > 0
        ]
        if any(s.needs_racks for s in states):
            # Topics with the same members and (as Java counts them) the same number of partitions
            # with rack information are assigned together, partition by partition.
            groups: dict[tuple[tuple[str, ...], int], list[_TopicState]] = defaultdict(list)
            for state in states:
                groups[(tuple(state.members), len(state.partition_racks))].append(state)
            for (members, count), group in groups.items():
                if len(group) > 1:
                    _assign_co_partitioned(list(members), count, group, result)
                elif group[0].needs_racks:
                    group[0].assign_ranges(group[0].racks_match, result)
        for state in states:
            state.assign_ranges(lambda member, partition: True, result)
        return {m: MemberAssignment(tuple(sorted(parts))) for m, parts in result.items()}
