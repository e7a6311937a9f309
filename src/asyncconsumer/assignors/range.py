"""The ``range`` assignor (the Java client's ``RangeAssignor``).

Topic by topic: the members subscribed to the topic are put in order (see
:func:`~asyncconsumer.assignors.base.sorted_member_ids`: static members by
``group.instance.id`` first, then dynamic members by member id, which is what
Java does), the partitions in numeric order, and each member gets a contiguous
range.  With ``n`` partitions and ``m`` members every member gets ``n // m``
and the first ``n % m`` members one more.  Example, topics ``t0`` and ``t1``
with three partitions each and members ``C0``, ``C1``::

    C0: t0-0, t0-1, t1-0, t1-1
    C1: t0-2, t1-2

Java's rack-aware variant (KIP-881) needs partition replica racks, which
``assign`` is not given, so it is not implemented; with no rack information
Java falls back to exactly this assignment.
"""

from __future__ import annotations

from typing import ClassVar

from ..structs import TopicPartition
from .base import Assignor, MemberAssignment, RebalanceProtocol, Subscription, sorted_member_ids

__all__ = ["RangeAssignor"]


class RangeAssignor(Assignor):
    """Contiguous per-topic ranges; the first members get one extra partition."""

    name: ClassVar[str] = "range"
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.EAGER

    def assign(
        self, partitions_per_topic: dict[str, int], subscriptions: dict[str, Subscription]
    ) -> dict[str, MemberAssignment]:
        order = sorted_member_ids(subscriptions)
        topics_of = {m: set(subscriptions[m].topics) for m in order}
        result: dict[str, list[TopicPartition]] = {m: [] for m in order}
        for topic in sorted(partitions_per_topic):
            count = partitions_per_topic[topic]
            members = [m for m in order if topic in topics_of[m]]
            if not members or count <= 0:
                continue
            per_member, extra = divmod(count, len(members))
            start = 0
            for i, member in enumerate(members):
                length = per_member + (1 if i < extra else 0)
                result[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
                start += length
        return {m: MemberAssignment(tuple(sorted(parts))) for m, parts in result.items()}
