"""Rack awareness for the classic assignors (KIP-881): when does an assignor look at racks?

Each member may put its ``client_rack`` in its subscription (``ConsumerProtocolSubscription``
v3 ``RackId``); the leader knows, from the cluster metadata, the racks of every partition's
replicas (a broker's ``broker.rack``).  A member *matches* a partition when one of the
partition's replicas is in the member's rack: it can then fetch from a replica next to it
(KIP-392) instead of across racks.

An assignor uses racks only when they can make a difference, the same test as the Java client's
(``AbstractPartitionAssignor.useRackAwareAssignment``):

- at least one member has a rack (an empty string counts as none),
- at least one member's rack holds a replica of some partition, and
- the partitions are not all on the same racks: when every partition has a replica in every
  rack there is nothing to prefer, and the assignment is exactly the one without racks.

Partitions the leader knows no replica racks for (a broker without ``broker.rack``, or no
metadata) match no member that has a rack; a member without a rack matches every partition.

This module holds the pieces the assignors share; each assignor says how it uses them.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..structs import TopicPartition
from .base import Subscription

__all__ = ["member_racks", "use_rack_aware_assignment"]


def member_racks(subscriptions: Mapping[str, Subscription]) -> dict[str, str]:
    """Member id -> its rack, for the members that sent a non-empty ``rack_id``."""
    return {member: sub.rack_id for member, sub in subscriptions.items() if sub.rack_id}


def use_rack_aware_assignment(
    consumer_racks: set[str] | frozenset[str], racks_per_partition: Mapping[TopicPartition, frozenset[str]]
) -> bool:
    """Whether racks can make a difference (see the module docstring): some member rack holds a
    replica, and not every partition has replicas on the same set of racks."""
    if not consumer_racks:
        return False
    all_racks = frozenset().union(*racks_per_partition.values())
    if consumer_racks.isdisjoint(all_racks):
        return False
    return any(racks != all_racks for racks in racks_per_partition.values())
