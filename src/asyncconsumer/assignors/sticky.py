"""The ``sticky`` and ``cooperative-sticky`` assignors (KIP-54, KIP-341, KIP-429).

Both run the same algorithm; they differ in where a member's current
partitions come from and in what the leader may hand out at once.

Goals, in order:

1. **Balance.**  When every member can take the same topics, member sizes
   differ by at most one.  Otherwise the assignment is balanced in the strong
   sense that no chain of moves ``A -> B -> ... -> Z`` (each member handing one
   partition to the next, who is subscribed to its topic) could take a
   partition from a member with ``k`` partitions to one with ``k - 2`` or fewer.
   That is the same as minimising the sum of the squares of the member sizes.
2. **Stickiness.**  A member keeps the partitions it owned unless they must
   move for balance.  When everyone takes the same topics, a member that owned
   no more than ``floor(partitions / members)`` keeps all of them.

Ownership
---------
``sticky`` (eager) members revoke everything before they join, so, like the
Java ``StickyAssignor``, it reads the previous assignment and generation from
the subscription user data (Java's ``StickyAssignorUserData``: ``[topic
[partition]]`` then an int32 generation, which v0 lacks), falling back to the
subscription's ``owned_partitions`` / ``generation_id`` when a member sends no
user data or data that does not parse.  ``cooperative-sticky`` uses
``owned_partitions`` and ``generation_id`` (subscription v1+/v2+); before v2
the generation is the int32 Java puts in the user data.

A claim is ignored when the topic is unknown, the partition number is out of
range, or the member no longer subscribes to the topic.  When several members
claim one partition, the claim with the highest generation wins.  If the
highest generation is shared, the member first in member order wins (Java
drops such a partition from both members instead; keeping one owner lets the
cooperative protocol treat the other claim like any stale claim).

Cooperative hand-over (KIP-429)
-------------------------------
With ``cooperative-sticky`` a partition whose owner is still in the group is
left out of this rebalance's assignment when the plan gives it to another
member.  The owner sees it missing, revokes it and rejoins.  In the follow-up
rebalance nobody claims it, and it goes to its new member.  A partition is
never given to a new member while its (winning) owner still holds it.

Racks (KIP-881)
---------------
When members send their rack and racks can make a difference (see
:mod:`~asyncconsumer.assignors.racks`), the plan prefers, after balance and
before stickiness, members in the same rack as one of a partition's replicas,
as the Java sticky assignors do:

- an owned partition none of whose replicas is in its owner's rack is not kept
  as owned when a subscribed member is in one of those racks (it may move
  there; with ``cooperative-sticky`` its owner revokes it first, as any moving
  partition); when no member is, it stays with its owner;
- when everyone takes the same topics, the partitions left after the owners
  kept theirs go first to members in a matching rack with room under their
  quota (the partitions with the fewest such members first, each to the
  smallest of them), then the rest to whoever has room, the previous owner
  first;
- otherwise every partition left goes to the smallest subscribed member in a
  matching rack, if there is one, before the balancing moves; a move takes,
  of the partitions it may move, one in the new member's rack if it can.

Without rack information the plan is exactly the one without racks.  Run again
with every member owning what it was given, the plan gives the same assignment,
racks or not, so a group does not keep rebalancing.
"""

from __future__ import annotations

import heapq
import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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
from .racks import member_racks, use_rack_aware_assignment

__all__ = [
    "CooperativeStickyAssignor",
    "StickyAssignor",
    "decode_sticky_user_data",
    "encode_sticky_user_data",
]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


# --- Java StickyAssignorUserData ------------------------------------------------------------


def encode_sticky_user_data(partitions: Iterable[TopicPartition], generation: int | None) -> bytes:
    """Java's ``StickyAssignor`` user data: v1 (with ``generation``), or v0 when it is ``None``.

    Schema: ``previous_assignment: [topic: string(int16 length), partitions: [int32]]``
    then ``generation: int32``; arrays have an int32 count.  Topics are written
    in Java string order and partitions in ascending order.
    """
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(_I32.pack(len(by_topic)))
    for topic in sorted(by_topic, key=java_string_key):
        name = topic.encode("utf-8")
        if len(name) > 0x7FFF:
            raise ValueError(f"topic name of {len(name)} bytes is too long")
        out += _I16.pack(len(name)) + name
        parts = sorted(set(by_topic[topic]))
        out += _I32.pack(len(parts))
        out += struct.pack(f">{len(parts)}i", *parts)
    if generation is not None:
        out += _I32.pack(generation)
    return bytes(out)


def decode_sticky_user_data(data: bytes) -> tuple[tuple[TopicPartition, ...], int | None] | None:
    """Parse Java ``StickyAssignor`` user data: ``(partitions, generation)``, or ``None`` if malformed.

    The generation is ``None`` for v0 data (no trailing int32), as in Java,
    which tries v1 and falls back to v0.  Bytes after the generation are ignored.
    """
    try:
        offset = 0
        (topic_count,) = _I32.unpack_from(data, offset)
        offset += 4
        if topic_count < 0:
            return None
        result: list[TopicPartition] = []
        for _ in range(topic_count):
            (name_len,) = _I16.unpack_from(data, offset)
            offset += 2
            if name_len < 0 or offset + name_len > len(data):
                return None
            topic = bytes(data[offset : offset + name_len]).decode("utf-8")
            offset += name_len
            (part_count,) = _I32.unpack_from(data, offset)
            offset += 4
            if part_count < 0 or offset + 4 * part_count > len(data):
                return None
            parts = struct.unpack_from(f">{part_count}i", data, offset)
            offset += 4 * part_count
            result.extend(TopicPartition(topic, p) for p in parts)
        generation: int | None = None
        if len(data) - offset >= 4:
            generation = int(_I32.unpack_from(data, offset)[0])
        return tuple(result), generation
    except (struct.error, UnicodeDecodeError):
        return None


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    member_id: str
    topics: frozenset[str]  # subscribed topics that exist and have partitions
    claims: tuple[TopicPartition, ...]
    generation: int
    rack: str | None = None


class _Racks:
    """Who matches what: members' racks (only when racks can make a difference) and the partitions'
    replica racks."""

    def __init__(self, members: Sequence[_Member], counts: dict[str, int], replica_racks: ReplicaRacks) -> None:
        racks = {m.rack for m in members if m.rack}
        per_partition = {TopicPartition(t, p): replica_racks.get(TopicPartition(t, p), frozenset())
                         for t, n in counts.items() for p in range(n)} if racks else {}
        self.active = use_rack_aware_assignment(racks, per_partition)
        self._member_rack = [m.rack if self.active else None for m in members]
        self._partition_racks = per_partition if self.active else {}

    def mismatch(self, member: int, tp: TopicPartition) -> bool:
        """``member`` has a rack and none of ``tp``'s replicas is in it."""
        rack = self._member_rack[member]
        return rack is not None and rack not in self._partition_racks.get(tp, ())

    def misplaced(self, member: int, tp: TopicPartition, candidates: Iterable[int]) -> bool:
        """``member`` owns ``tp`` outside its replicas' racks and one of ``candidates`` is in them:
        the partition is not kept as owned.  A partition no candidate's rack matches stays with its
        owner (moving it would gain nothing, and running the plan again would move it back)."""
        return self.mismatch(member, tp) and any(self.matches(m, tp) for m in candidates)

    def matches(self, member: int, tp: TopicPartition) -> bool:
        """``member`` has a rack and a replica of ``tp`` is in it (what rack-aware steps look for)."""
        rack = self._member_rack[member]
        return rack is not None and rack in self._partition_racks.get(tp, ())

    def scarcity(self, members: Sequence[int]) -> Callable[[TopicPartition], int]:
        """Sort key: how many of ``members`` a partition matches (the scarcest first)."""
        return lambda tp: sum(1 for m in members if self.matches(m, tp))


def _resolve_owners(counts: dict[str, int], members: Sequence[_Member]) -> dict[TopicPartition, int]:
    """Partition -> index of its owner: the valid claim with the highest generation (earliest member on ties)."""
    owner: dict[TopicPartition, int] = {}
    owner_generation: dict[TopicPartition, int] = {}
    for index, member in enumerate(members):
        for tp in member.claims:
            if tp.topic not in member.topics or not 0 <= tp.partition < counts[tp.topic]:
                continue
            best = owner_generation.get(tp)
            if best is None or member.generation > best:
                owner[tp] = index
                owner_generation[tp] = member.generation
    return owner


class _Quotas:
    """Every member takes the same topics: each ends with ``quota`` or ``quota + 1`` partitions, and
    exactly ``extra`` members with ``quota + 1``.  Handing out only to members with :meth:`room`
    always ends there, whatever the order (the partitions left always fit the room left)."""

    def __init__(self, total: int, n_members: int) -> None:
        self.quota, self.extra = divmod(total, n_members)
        self.size = [0] * n_members
        self.at_max = 0

    def room(self, member: int) -> bool:
        size = self.size[member]
        return size < self.quota or (size == self.quota and self.at_max < self.extra)

    def give(self, member: int, plan: list[list[TopicPartition]], tp: TopicPartition) -> None:
        plan[member].append(tp)
        self.size[member] += 1
        if self.size[member] == self.quota + 1:
            self.at_max += 1


def _plan_same_topics(
    topics: frozenset[str],
    counts: dict[str, int],
    owned_by: list[list[TopicPartition]],
    owner: dict[TopicPartition, int],
    racks: _Racks,
) -> list[list[TopicPartition]]:
    """Every member takes the same topics: owners keep up to their quota (with racks: what is in their
    rack), the rest goes to members in a matching rack with room, then to anyone with room."""
    n_members = len(owned_by)
    partitions = [TopicPartition(t, p) for t in sorted(topics) for p in range(counts[t])]
    quotas = _Quotas(len(partitions), n_members)
    plan: list[list[TopicPartition]] = [[] for _ in range(n_members)]
    taken: set[TopicPartition] = set()
    for index, owned in enumerate(owned_by):
        keepable = [tp for tp in owned if not racks.misplaced(index, tp, range(n_members))]
        for tp in keepable:
            if not quotas.room(index):
                break
            quotas.give(index, plan, tp)
            taken.add(tp)
    left = [tp for tp in partitions if tp not in taken]
    if racks.active:
        everyone = range(n_members)
        for tp in sorted(left, key=racks.scarcity(everyone)):
            takers = [m for m in everyone if racks.matches(m, tp) and quotas.room(m)]
            if takers:
                quotas.give(min(takers, key=lambda m: (quotas.size[m], m)), plan, tp)
                taken.add(tp)
        left = [tp for tp in left if tp not in taken]
    # The rest: to its previous owner if it has room (a partition its owner could not keep for its
    # rack comes back when nobody in a matching rack has room: running the plan again moves
    # nothing), else to the smallest member (first in member order on ties).
    heap = [(size, index) for index, size in enumerate(quotas.size) if quotas.room(index)]
    heapq.heapify(heap)
    for tp in left:
        previous = owner.get(tp)
        if previous is not None and quotas.room(previous):
            quotas.give(previous, plan, tp)
            continue
        while True:
            size, index = heapq.heappop(heap)
            if size == quotas.size[index] and quotas.room(index):
                break
            if quotas.room(index):  # a stale entry: the member grew meanwhile
                heapq.heappush(heap, (quotas.size[index], index))
        quotas.give(index, plan, tp)
        if quotas.room(index):
            heapq.heappush(heap, (quotas.size[index], index))
    return plan


class _Balancer:
    """Members with different subscriptions: start from ownership, then move partitions along chains.

    Held partitions are split into those the holder owned before this
    rebalance (``own``) and the rest (``free``).  Balancing runs twice: first
    moving only ``free`` partitions (costs no stickiness), then any partition.
    Each move along a chain takes one partition from a member with ``k`` to one
    with ``k - 2`` or fewer, so the sum of squared sizes falls every time and
    the loop ends; it ends exactly when no such chain exists, which for this
    (convex, flow-like) problem means the sum of squares is minimal.  With racks,
    a move takes a partition in the new holder's rack when it can, else one
    outside the old holder's rack.
    """

    def __init__(self, topic_members: dict[str, list[int]], n_members: int, owner: dict[TopicPartition, int],
                 racks: _Racks) -> None:
        self.topic_members = topic_members
        self.owner = owner
        self.racks = racks
        self.size = [0] * n_members
        # member -> topic -> partitions, as insertion-ordered dicts (O(1) pop, deterministic order)
        self.free: list[dict[str, dict[int, None]]] = [{} for _ in range(n_members)]
        self.own: list[dict[str, dict[int, None]]] = [{} for _ in range(n_members)]

    def add(self, member: int, tp: TopicPartition) -> None:
        bucket = self.own if self.owner.get(tp) == member else self.free
        bucket[member].setdefault(tp.topic, {})[tp.partition] = None
        self.size[member] += 1

    def _movable_topics(self, member: int, any_partition: bool) -> list[str]:
        topics = set(self.free[member])
        if any_partition:
            topics.update(self.own[member])
        return sorted(topics)

    def _has_movable(self, member: int, topic: str, any_partition: bool) -> bool:
        return topic in self.free[member] or (any_partition and topic in self.own[member])

    def _pick(self, held: dict[int, None], topic: str, src: int, dst: int) -> int:
        """The partition of ``held`` to move from ``src`` to ``dst``: the last one, or with racks
        the last one in ``dst``'s rack, else the last one outside ``src``'s rack."""
        if self.racks.active:
            racks = self.racks
            for partition in reversed(held):
                if racks.matches(dst, TopicPartition(topic, partition)):
                    return partition
            for partition in reversed(held):
                if racks.mismatch(src, TopicPartition(topic, partition)):
                    return partition
        return next(reversed(held))

    def _move(self, src: int, dst: int, topic: str) -> None:
        # Prefer a partition src did not own before: moving it costs no stickiness.
        buckets = self.free[src] if topic in self.free[src] else self.own[src]
        held = buckets[topic]
        partition = self._pick(held, topic, src, dst)
        del held[partition]
        if not held:
            del buckets[topic]
        self.size[src] -= 1
        self.add(dst, TopicPartition(topic, partition))

    def _direct_moves(self, any_partition: bool) -> None:
        """Cheap pass: single hops from big members to the smallest member of the topic."""
        size = self.size
        moved = True
        while moved:
            moved = False
            for src in sorted(range(len(size)), key=lambda m: (-size[m], m)):
                for topic in self._movable_topics(src, any_partition):
                    candidates = self.topic_members[topic]
                    while self._has_movable(src, topic, any_partition):
                        dst = min(candidates, key=lambda m: (size[m], m))
                        if size[src] - size[dst] < 2:
                            break
                        self._move(src, dst, topic)
                        moved = True

    def _move_along_chain(self, any_partition: bool) -> bool:
        """Find one chain from a member with >= level to one with <= level - 2 and shift along it."""
        size = self.size
        for level in range(max(size), min(size) + 1, -1):
            sources = [m for m in range(len(size)) if size[m] >= level]
            parent: dict[int, tuple[int, str]] = {}
            seen = set(sources)
            queue = deque(sources)
            target = -1
            while queue and target < 0:
                holder = queue.popleft()
                for topic in self._movable_topics(holder, any_partition):
                    for taker in self.topic_members[topic]:
                        if taker in seen:
                            continue
                        seen.add(taker)
                        parent[taker] = (holder, topic)
                        if size[taker] <= level - 2:
                            target = taker
                            break
                        queue.append(taker)
                    if target >= 0:
                        break
            if target >= 0:
                taker = target
                while taker in parent:
                    holder, topic = parent[taker]
                    self._move(holder, taker, topic)
                    taker = holder
                return True
        return False

    def balance(self) -> None:
        if not self.size:
            return
        for any_partition in (False, True):
            self._direct_moves(any_partition)
            while self._move_along_chain(any_partition):
                pass

    def polish_racks(self) -> None:
        """With racks, once balanced: a partition held outside its replicas' racks goes to a member
        of the topic in one of them that holds fewer (no less balanced), or is swapped for one that
        member holds outside its own rack.  Each step puts one more partition in a matching rack,
        so it ends; and the next rebalance, starting from this plan, finds nothing to do (an owned
        partition is kept, and balance and this pass move nothing), so a group does not keep
        rebalancing."""
        if not self.racks.active:
            return
        racks, size = self.racks, self.size
        moved = True
        while moved:
            moved = False
            for holder in range(len(size)):
                for tp in self._held(holder):
                    if not racks.mismatch(holder, tp):
                        continue
                    for taker in self.topic_members[tp.topic]:
                        if taker == holder or not racks.matches(taker, tp):
                            continue
                        if size[taker] < size[holder]:
                            self._take(holder, tp)
                            self.add(taker, tp)
                            moved = True
                            break
                        back = next((q for q in self._held(taker) if racks.mismatch(taker, q)
                                     and holder in self.topic_members[q.topic]), None)
                        if back is not None:
                            self._take(holder, tp)
                            self._take(taker, back)
                            self.add(taker, tp)
                            self.add(holder, back)
                            moved = True
                            break
                    if moved:
                        break
                if moved:
                    break

    def _held(self, member: int) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for buckets in (self.free[member], self.own[member])
                for topic, held in sorted(buckets.items()) for p in held]

    def _take(self, member: int, tp: TopicPartition) -> None:
        for buckets in (self.free[member], self.own[member]):
            held = buckets.get(tp.topic)
            if held is not None and tp.partition in held:
                del held[tp.partition]
                if not held:
                    del buckets[tp.topic]
                self.size[member] -= 1
                return
        raise KeyError(tp)

    def plan(self) -> list[list[TopicPartition]]:
        return [
            [TopicPartition(topic, p) for buckets in (free, own) for topic, held in buckets.items() for p in held]
            for free, own in zip(self.free, self.own, strict=True)
        ]


def _plan_mixed_topics(
    members: Sequence[_Member],
    counts: dict[str, int],
    owner: dict[TopicPartition, int],
    owned_by: list[list[TopicPartition]],
    racks: _Racks,
) -> list[list[TopicPartition]]:
    all_topics = sorted({t for m in members for t in m.topics})
    topic_members = {t: [i for i, m in enumerate(members) if t in m.topics] for t in all_topics}
    balancer = _Balancer(topic_members, len(members), owner, racks)
    for index, owned in enumerate(owned_by):
        for tp in owned:
            balancer.add(index, tp)
    kept = {tp for owned in owned_by for tp in owned}
    # Partitions nobody keeps, topics with the fewest possible takers first, each to the smallest
    # taker in a matching rack (with racks), else to the smallest taker (its previous owner first
    # among the smallest).
    for topic in sorted(all_topics, key=lambda t: (len(topic_members[t]), t)):
        takers = topic_members[topic]
        for partition in range(counts[topic]):
            tp = TopicPartition(topic, partition)
            if tp in kept:
                continue
            matching = [m for m in takers if racks.matches(m, tp)]
            pool = matching or takers
            previous = owner.get(tp, -1)
            balancer.add(min(pool, key=lambda m: (balancer.size[m], m != previous, m)), tp)
    balancer.balance()
    balancer.polish_racks()
    return balancer.plan()


_Plan = list[list[TopicPartition]]


def _plan(
    counts: dict[str, int], members: Sequence[_Member], replica_racks: ReplicaRacks
) -> tuple[_Plan, dict[TopicPartition, int]]:
    """Target partitions per member (by index) and the resolved previous owner of each partition."""
    owner = _resolve_owners(counts, members)
    owned_by: list[list[TopicPartition]] = [[] for _ in members]
    for tp, index in owner.items():
        owned_by[index].append(tp)
    for owned in owned_by:
        owned.sort()
    if not members:
        return [], owner
    racks = _Racks(members, counts, replica_racks)
    if all(m.topics == members[0].topics for m in members):
        return _plan_same_topics(members[0].topics, counts, owned_by, owner, racks), owner
    return _plan_mixed_topics(members, counts, owner, owned_by, racks), owner



# --- the assignors --------------------------------------------------------------------------


class _StickyBase(Assignor):
    def __init__(self) -> None:
        self._partitions: tuple[TopicPartition, ...] | None = None
        self._generation = -1

    def _claims(self, sub: Subscription) -> tuple[tuple[TopicPartition, ...], int]:
        raise NotImplementedError

    def on_assignment(self, assignment: MemberAssignment, generation: int) -> None:
        self._partitions = assignment.partitions
        self._generation = generation

    def assign(
        self,
        partitions_per_topic: dict[str, int],
        subscriptions: dict[str, Subscription],
        replica_racks: ReplicaRacks = NO_RACKS,
    ) -> dict[str, MemberAssignment]:
        counts = {t: n for t, n in partitions_per_topic.items() if n > 0}
        racks = member_racks(subscriptions)
        members: list[_Member] = []
        for member_id in sorted_member_ids(subscriptions):
            sub = subscriptions[member_id]
            claims, generation = self._claims(sub)
            topics = frozenset(t for t in sub.topics if t in counts)
            members.append(_Member(member_id, topics, claims, generation, racks.get(member_id)))
        plan, owner = _plan(counts, members, replica_racks)
        if self.protocol is RebalanceProtocol.COOPERATIVE:
            # KIP-429: a partition changing owner is withheld until its owner has revoked it.
            plan = [[tp for tp in parts if owner.get(tp, index) == index] for index, parts in enumerate(plan)]
        return {m.member_id: MemberAssignment(tuple(sorted(parts))) for m, parts in zip(members, plan, strict=True)}


class StickyAssignor(_StickyBase):
    """Java's ``StickyAssignor``: balanced and sticky, eager protocol.

    Sends the last assignment and its generation as user data (Java's
    format), since eager members own nothing when they join.
    """

    name: ClassVar[str] = "sticky"
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.EAGER
    supported_protocols: ClassVar[tuple[RebalanceProtocol, ...]] = (RebalanceProtocol.EAGER,)

    def subscription_user_data(self, topics: set[str], owned: list[TopicPartition], generation: int) -> bytes | None:
        """``owned`` if given, else the partitions from the last :meth:`on_assignment`; ``None`` before any."""
        partitions = tuple(owned) if owned else self._partitions
        if partitions is None:
            return None
        return encode_sticky_user_data(partitions, generation if generation >= 0 else self._generation)

    def _claims(self, sub: Subscription) -> tuple[tuple[TopicPartition, ...], int]:
        if sub.user_data:
            decoded = decode_sticky_user_data(sub.user_data)
            if decoded is not None:
                partitions, generation = decoded
                return partitions, generation if generation is not None else sub.generation_id
        return sub.owned_partitions, sub.generation_id


class CooperativeStickyAssignor(_StickyBase):
    """Java's ``CooperativeStickyAssignor``: the sticky plan, handed over incrementally (KIP-429).

    User data is the int32 generation, as Java sends it (read only from
    subscriptions older than v2, which lack ``GenerationId``).
    """

    name: ClassVar[str] = "cooperative-sticky"
    protocol: ClassVar[RebalanceProtocol] = RebalanceProtocol.COOPERATIVE
    supported_protocols: ClassVar[tuple[RebalanceProtocol, ...]] = (
        RebalanceProtocol.EAGER,
        RebalanceProtocol.COOPERATIVE,
    )

    def subscription_user_data(self, topics: set[str], owned: list[TopicPartition], generation: int) -> bytes | None:
        return _I32.pack(generation if generation >= 0 else self._generation)

    def _claims(self, sub: Subscription) -> tuple[tuple[TopicPartition, ...], int]:
        generation = sub.generation_id
        if generation < 0 and sub.user_data:
            if len(sub.user_data) == 4:
                generation = int(_I32.unpack(sub.user_data)[0])
            else:
                # librdkafka sends the StickyAssignor layout for cooperative-sticky too.
                decoded = decode_sticky_user_data(sub.user_data)
                if decoded is not None and decoded[1] is not None:
                    generation = decoded[1]
        return sub.owned_partitions, generation
