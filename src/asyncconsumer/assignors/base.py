"""Client-side partition assignment for the classic consumer-group protocol.

In the classic protocol every member sends a *subscription*
(``ConsumerProtocolSubscription``) inside its JoinGroup ``Metadata``; the
elected leader runs an :class:`Assignor` over all of them and sends one
*assignment* (``ConsumerProtocolAssignment``) per member in SyncGroup.  Both
payloads are an int16 version followed by a non-flexible struct; the codecs
here go through :func:`asyncconsumer.protocol.api.encode_data` /
:func:`~asyncconsumer.protocol.api.decode_data`, so the bytes are the same as
the Java client's and librdkafka's and mixed groups work.

Member order
------------
Range and round-robin hand out partitions by position, so the order of the
members decides who gets what.  We sort them exactly as the Java client does
(``AbstractPartitionAssignor.MemberInfo``): static members (those with a
``group.instance.id``) first, ordered by instance id, then dynamic members
ordered by member id.  Strings are compared as Java compares them (by UTF-16
code unit), which only differs from Python's ordering for characters outside
the Basic Multilingual Plane.  The instance id is not part of the wire
subscription; the leader takes it from the JoinGroup response and puts it in
:attr:`Subscription.group_instance_id`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..protocol.api import decode_data, encode_data
from ..structs import TopicPartition, by_topic

__all__ = [
    "LATEST_VERSION",
    "NO_RACKS",
    "Assignor",
    "MemberAssignment",
    "RebalanceProtocol",
    "ReplicaRacks",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "java_string_key",
    "sorted_member_ids",
]

_SUBSCRIPTION = "ConsumerProtocolSubscription"
_ASSIGNMENT = "ConsumerProtocolAssignment"

#: Highest ConsumerProtocolSubscription / ConsumerProtocolAssignment version we write.
LATEST_VERSION = 3

#: Partition -> the racks of its replicas (every replica, in sync or not, as in the Java client;
#: a partition missing here has no known replica rack).  See :mod:`asyncconsumer.assignors.racks`.
ReplicaRacks = Mapping[TopicPartition, frozenset[str]]

#: No rack information at all: what an assignor is given when the leader knows none.
NO_RACKS: ReplicaRacks = {}


class RebalanceProtocol(enum.Enum):
    """How members hand partitions over during a rebalance (KIP-429)."""

    #: Every member revokes everything before joining; the new assignment is applied at once.
    EAGER = "eager"
    #: Members keep what they own; partitions that change owner are revoked first and handed
    #: out in a follow-up rebalance.
    COOPERATIVE = "cooperative"


@dataclass(frozen=True)
class Subscription:
    """One member's ``ConsumerProtocolSubscription``.

    ``owned_partitions`` exists on the wire from v1, ``generation_id`` from v2
    (``-1`` when unknown) and ``rack_id`` from v3.  ``group_instance_id`` is
    *not* on the wire: the leader fills it from the JoinGroup response so the
    assignors can order static members the way Java does.
    """

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1
    rack_id: str | None = None
    group_instance_id: str | None = None

    def __post_init__(self) -> None:
        # Accept any iterable (lists are common in callers and tests) but store tuples.
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "owned_partitions", tuple(TopicPartition(*tp) for tp in self.owned_partitions))
        if self.user_data is not None:
            object.__setattr__(self, "user_data", bytes(self.user_data))


@dataclass(frozen=True)
class MemberAssignment:
    """One member's ``ConsumerProtocolAssignment``."""

    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple(TopicPartition(*tp) for tp in self.partitions))
        if self.user_data is not None:
            object.__setattr__(self, "user_data", bytes(self.user_data))


class Assignor(ABC):
    """A client-side partition assignor, identified in JoinGroup by :attr:`name`.

    The leader calls :meth:`assign`; every member calls
    :meth:`subscription_user_data` before joining and :meth:`on_assignment`
    after SyncGroup.  Instances keep per-consumer state (for stickiness), so use
    one instance per consumer.
    """

    #: Protocol name sent in JoinGroup (``"range"``, ``"roundrobin"``, ...).
    name: ClassVar[str]
    #: The rebalance protocol this assignor is meant for.
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.EAGER
    #: Every protocol the assignor works with.  As in the Java client, a consumer
    #: configured with several assignors uses the highest protocol all of them support.
    supported_protocols: ClassVar[tuple[RebalanceProtocol, ...]] = (RebalanceProtocol.EAGER,)

    def subscription_user_data(self, topics: set[str], owned: list[TopicPartition], generation: int) -> bytes | None:
        """``UserData`` for this member's subscription; ``None`` unless the assignor needs some."""
        return None

    @abstractmethod
    def assign(
        self,
        partitions_per_topic: dict[str, int],
        subscriptions: dict[str, Subscription],
        replica_racks: ReplicaRacks = NO_RACKS,
    ) -> dict[str, MemberAssignment]:
        """Leader side: map every member id in ``subscriptions`` to its assignment.

        ``partitions_per_topic`` holds the partition count of every subscribed
        topic the leader has metadata for; topics missing from it are skipped.
        ``replica_racks`` gives the racks of each partition's replicas, for the
        assignors that prefer members in the same rack (KIP-881); without it
        they assign as without racks.  The result has one entry per member
        (possibly with no partitions), in the assignor's member order, with each
        member's partitions sorted.
        """

    def on_assignment(self, assignment: MemberAssignment, generation: int) -> None:  # noqa: B027 - optional hook
        """Member side: called with this member's assignment after SyncGroup."""


# --- member ordering ------------------------------------------------------------------------


def java_string_key(s: str) -> bytes:
    """Sort key that orders strings like Java's ``String.compareTo`` (UTF-16 code units)."""
    return s.encode("utf-16-be", "surrogatepass")


def _member_key(member_id: str, sub: Subscription) -> tuple[int, bytes, bytes]:
    if sub.group_instance_id is not None:
        return (0, java_string_key(sub.group_instance_id), java_string_key(member_id))
    return (1, java_string_key(member_id), b"")


def sorted_member_ids(subscriptions: Mapping[str, Subscription]) -> list[str]:
    """Member ids in the Java client's order: static members by instance id, then the rest by member id."""
    return sorted(subscriptions, key=lambda m: _member_key(m, subscriptions[m]))


# --- wire codecs ----------------------------------------------------------------------------


def _group_by_topic(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    """``[{topic, partitions}]`` with topics in order of first appearance (as Java writes them)."""
    return [{"topic": topic, "partitions": [tp.partition for tp in tps]} for topic, tps in by_topic(partitions).items()]


def _flatten(entries: Iterable[Mapping[str, Any]]) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(str(e["topic"]), int(p)) for e in entries for p in e["partitions"])


def _opt_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def encode_subscription(sub: Subscription, version: int = LATEST_VERSION) -> bytes:
    """Serialize as ``ConsumerProtocolSubscription`` (int16 version prefix + struct).

    Fields the version cannot carry (owned partitions before v1, generation
    before v2, rack before v3) are dropped, as they are ignorable.
    """
    body = {
        "topics": list(sub.topics),
        "user_data": sub.user_data,
        "owned_partitions": _group_by_topic(sub.owned_partitions),
        "generation_id": sub.generation_id,
        "rack_id": sub.rack_id,
    }
    return encode_data(_SUBSCRIPTION, version, body)


def decode_subscription(data: bytes | bytearray | memoryview) -> Subscription:
    """Parse a ``ConsumerProtocolSubscription``; newer versions parse as the highest known one."""
    _, body = decode_data(_SUBSCRIPTION, data)
    return Subscription(
        topics=tuple(str(t) for t in body["topics"]),
        user_data=_opt_bytes(body["user_data"]),
        owned_partitions=_flatten(body["owned_partitions"]),
        generation_id=int(body["generation_id"]),
        rack_id=body["rack_id"],
    )


def encode_assignment(a: MemberAssignment, version: int = LATEST_VERSION) -> bytes:
    """Serialize as ``ConsumerProtocolAssignment`` (the layout is the same in every version)."""
    body = {"assigned_partitions": _group_by_topic(a.partitions), "user_data": a.user_data}
    return encode_data(_ASSIGNMENT, version, body)


def decode_assignment(data: bytes | bytearray | memoryview) -> MemberAssignment:
    """Parse a ``ConsumerProtocolAssignment``.

    Zero bytes mean "no partitions": the coordinator sends that to a member the
    leader left out of SyncGroup (librdkafka reads it the same way).
    """
    if len(data) == 0:
        return MemberAssignment(partitions=())
    _, body = decode_data(_ASSIGNMENT, data)
    return MemberAssignment(partitions=_flatten(body["assigned_partitions"]), user_data=_opt_bytes(body["user_data"]))
