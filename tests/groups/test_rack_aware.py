"""Rack-aware classic assignors (KIP-881): ``range``, ``sticky`` and ``cooperative-sticky``.

Three kinds of evidence:

- the scenarios of the Java client's own unit tests (``RangeAssignorTest``,
  ``AbstractStickyAssignorTest``: replica placement, racks and expected assignments), as facts:
  ``range`` must give exactly Java's assignment; the sticky assignors, whose plans differ from
  Java's partition for partition, at most as many partitions outside their member's rack as Java
  and the same balance;
- properties: without usable rack information every assignor gives exactly its assignment without
  racks; with racks the balance is the same, every partition goes to one member, and a second run
  with every member owning what it was given changes nothing (no rebalance storm);
- Java's assignors themselves (``kafka-clients`` 4.4.0, run through ``support/java_assignors.py``)
  on random scenarios: ``range`` equal partition for partition.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from asyncconsumer.assignors import (
    CooperativeStickyAssignor,
    MemberAssignment,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
)
from asyncconsumer.assignors.racks import use_rack_aware_assignment
from asyncconsumer.structs import TopicPartition

TP = TopicPartition
ALL_RACKS = ("a", "b", "c", "d", "e", "f")
Racks = dict[TopicPartition, frozenset[str]]


def racks(n: int) -> list[str | None]:
    """Java's ``AbstractPartitionAssignorTest.racks(n)``: a, b, c, ... for n brokers or members."""
    return [ALL_RACKS[i % len(ALL_RACKS)] for i in range(n)]


def null_racks(n: int) -> list[str | None]:
    return [None] * n


def replica_racks(topics: Mapping[str, int], replication: int, broker_racks: Sequence[str | None]) -> Racks:
    """Java's test placement (``AbstractPartitionAssignorTest.partitionInfos``): topics in the
    order given, partition ``i`` of the topic starting at broker index ``next`` has its replicas on
    brokers ``(i + j + next) % brokers`` for ``j < replication``; ``next`` grows by each topic's
    partition count."""
    result: Racks = {}
    start = 0
    for topic, count in topics.items():
        for i in range(count):
            nodes = [(i + j + start) % len(broker_racks) for j in range(replication)]
            result[TP(topic, i)] = frozenset(r for n in nodes if (r := broker_racks[n]) is not None)
        start += count
    return result


def parse(spec: str) -> set[TopicPartition]:
    """``"t1-0, t2-3"`` (Java's ``toSortedString``) -> {t1-0, t2-3}."""
    out = set()
    for item in filter(None, (s.strip() for s in spec.split(","))):
        topic, _, partition = item.rpartition("-")
        out.add(TP(topic, int(partition)))
    return out


def subscriptions(consumer_topics: Sequence[Sequence[str]], consumer_racks: Sequence[str | None],
                  owned: Sequence[str] | None = None, generation: int = -1) -> dict[str, Subscription]:
    """Members ``consumer0``, ``consumer1``, ... as in Java's tests."""
    return {
        f"consumer{i}": Subscription(topics, owned_partitions=tuple(parse(owned[i])) if owned else (),
                                     generation_id=generation, rack_id=consumer_racks[i])
        for i, topics in enumerate(consumer_topics)
    }


def as_sets(result: Mapping[str, MemberAssignment]) -> dict[str, set[TopicPartition]]:
    return {m: set(a.partitions) for m, a in result.items()}


def mismatched(result: Mapping[str, set[TopicPartition]], subs: Mapping[str, Subscription], rr: Racks) -> int:
    """Partitions given to a member with a rack that holds none of their replicas (Java's count)."""
    return sum(1 for m, parts in result.items() for tp in parts
               if (rack := subs[m].rack_id) is not None and rack not in rr.get(tp, ()))


# --- when racks are used: Java's AbstractPartitionAssignorTest.testUseRackAwareAssignment ------


def test_use_rack_aware_assignment_as_java() -> None:
    all_racks, two = {"a", "b", "c"}, {"a", "b"}
    on_all = {TP("topic", i): frozenset(all_racks) for i in range(10)}
    on_subset = {TP("topic", i): frozenset({"abc"[i % 3]}) for i in range(10)}
    assert not use_rack_aware_assignment(set(), on_all)
    assert not use_rack_aware_assignment(all_racks, {})
    assert not use_rack_aware_assignment({"d"}, on_all)
    assert not use_rack_aware_assignment(all_racks, on_all)
    assert not use_rack_aware_assignment(two, on_all)
    assert not use_rack_aware_assignment({"a", "d"}, on_all)
    assert use_rack_aware_assignment(all_racks, on_subset)
    assert use_rack_aware_assignment(two, on_subset)
    assert use_rack_aware_assignment({"a", "d"}, on_subset)
    assert not use_rack_aware_assignment({"d"}, on_subset)  # no member rack holds a replica


# --- range: Java's RangeAssignorTest, partition for partition -----------------------------------


def check_range(topics: dict[str, int], replication: int, broker_racks: list[str | None],
                consumer_racks: list[str | None], consumer_topics: list[list[str]], expected: list[str],
                expected_mismatched: int) -> None:
    rr = replica_racks(topics, replication, broker_racks)
    subs = subscriptions(consumer_topics, consumer_racks)
    result = as_sets(RangeAssignor().assign(dict(topics), subs, rr))
    assert result == {f"consumer{i}": parse(e) for i, e in enumerate(expected)}
    if expected_mismatched >= 0:
        assert mismatched(result, subs, rr) == expected_mismatched


def check_range_without_racks(topics: dict[str, int], consumer_topics: list[list[str]], expected: list[str]) -> None:
    """Java's ``verifyNonRackAwareAssignment`` (less its test-only ``preferRackAwareLogic``)."""
    check_range(topics, 3, null_racks(3), racks(3), consumer_topics, expected, -1)
    check_range(topics, 3, racks(3), null_racks(3), consumer_topics, expected, -1)
    check_range(topics, 3, racks(3), racks(3), consumer_topics, expected, 0)
    check_range(topics, 4, racks(4), racks(3), consumer_topics, expected, 0)
    check_range(topics, 3, racks(3), ["d", "e", "f"], consumer_topics, expected, -1)
    check_range(topics, 3, racks(3), [None, "e", "f"], consumer_topics, expected, -1)


def test_range_uniform_subscription() -> None:
    topics = {"t1": 6, "t2": 7, "t3": 2}
    every = [["t1", "t2", "t3"]] * 3
    check_range_without_racks(topics, every, [
        "t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1", "t1-4, t1-5, t2-5, t2-6"])
    check_range(topics, 1, racks(3), racks(3), every, [
        "t1-0, t1-3, t2-0, t2-3, t2-6", "t1-1, t1-4, t2-1, t2-4, t3-0", "t1-2, t1-5, t2-2, t2-5, t3-1"], 0)
    check_range(topics, 2, racks(3), racks(3), every, [
        "t1-0, t1-2, t2-0, t2-2, t2-3, t3-1", "t1-1, t1-3, t2-1, t2-4, t3-0", "t1-4, t1-5, t2-5, t2-6"], 1)
    check_range(topics, 3, racks(2), racks(3), every, [  # one member on a rack without replicas
        "t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1", "t1-4, t1-5, t2-5, t2-6"], 4)


def test_range_non_equal_subscription() -> None:
    topics = {"t1": 6, "t2": 7, "t3": 2}
    subs = [["t1", "t2", "t3"], ["t1", "t2", "t3"], ["t1", "t3"]]
    check_range_without_racks(topics, subs, [
        "t1-0, t1-1, t2-0, t2-1, t2-2, t2-3, t3-0", "t1-2, t1-3, t2-4, t2-5, t2-6, t3-1", "t1-4, t1-5"])
    check_range(topics, 1, racks(3), racks(3), subs, [
        "t1-0, t1-3, t2-0, t2-2, t2-3, t2-6", "t1-1, t1-4, t2-1, t2-4, t2-5, t3-0", "t1-2, t1-5, t3-1"], 2)
    check_range(topics, 2, racks(3), racks(3), subs, [
        "t1-0, t1-2, t2-0, t2-2, t2-3, t2-5, t3-1", "t1-1, t1-3, t2-1, t2-4, t2-6, t3-0", "t1-4, t1-5"], 0)
    check_range(topics, 3, racks(2), racks(3), subs, [
        "t1-0, t1-1, t2-0, t2-1, t2-2, t2-3, t3-0", "t1-2, t1-3, t2-4, t2-5, t2-6, t3-1", "t1-4, t1-5"], 2)


def test_range_keeps_co_partitioning_over_racks() -> None:
    topics = {"t1": 5, "t2": 5, "t3": 5}
    every = [["t1", "t2", "t3"]] * 3
    plain = ["t1-0, t1-1, t2-0, t2-1, t3-0, t3-1", "t1-2, t1-3, t2-2, t2-3, t3-2, t3-3", "t1-4, t2-4, t3-4"]
    check_range_without_racks(topics, every, plain)
    check_range(topics, 1, racks(3), racks(3), every, plain, 10)
    check_range(topics, 2, racks(3), racks(3), every, plain, 5)
    check_range(topics, 3, racks(2), racks(3), every, plain, 3)

    subs = [["t1", "t2", "t3"], ["t1", "t2", "t3"], ["t1", "t3"]]
    check_range(topics, 1, racks(3), racks(3), subs, [
        "t1-0, t1-1, t2-0, t2-1, t2-4, t3-0, t3-1", "t1-2, t1-3, t2-2, t2-3, t3-2, t3-3", "t1-4, t3-4"], 9)
    check_range(topics, 2, racks(3), racks(3), subs, [
        "t1-2, t2-0, t2-1, t2-3, t3-2", "t1-0, t1-3, t2-2, t2-4, t3-0, t3-3", "t1-1, t1-4, t3-1, t3-4"], 0)
    check_range(topics, 3, racks(2), racks(3), subs, [
        "t1-0, t1-1, t2-0, t2-1, t2-2, t3-0, t3-1", "t1-2, t1-3, t2-3, t2-4, t3-2, t3-3", "t1-4, t3-4"], 2)


def test_range_co_partitioned_topics_follow_racks_together() -> None:
    topics = {"t1": 6, "t2": 6, "t3": 2, "t4": 2}
    member_racks = ["a", "b", "b", "a"]
    split = [["t1", "t2"], ["t1", "t2"], ["t3", "t4"], ["t3", "t4"]]
    plain = ["t1-0, t1-1, t1-2, t2-0, t2-1, t2-2", "t1-3, t1-4, t1-5, t2-3, t2-4, t2-5", "t3-0, t4-0", "t3-1, t4-1"]
    check_range(topics, 3, racks(2), member_racks, split, plain, -1)
    check_range(topics, 2, racks(2), member_racks, split, plain, 0)
    check_range(topics, 1, racks(2), member_racks, split, [
        "t1-0, t1-2, t1-4, t2-0, t2-2, t2-4", "t1-1, t1-3, t1-5, t2-1, t2-3, t2-5", "t3-1, t4-1", "t3-0, t4-0"], 0)

    every = [["t1", "t2", "t3", "t4"]] * 4
    plain = ["t1-0, t1-1, t2-0, t2-1, t3-0, t4-0", "t1-2, t1-3, t2-2, t2-3, t3-1, t4-1", "t1-4, t2-4", "t1-5, t2-5"]
    check_range(topics, 3, racks(2), member_racks, every, plain, -1)
    check_range(topics, 2, racks(2), member_racks, every, plain, 0)
    check_range(topics, 1, racks(2), member_racks, every, [
        "t1-0, t1-2, t2-0, t2-2, t3-0, t4-0", "t1-1, t1-3, t2-1, t2-3, t3-1, t4-1", "t1-5, t2-5", "t1-4, t2-4"], 0)
    check_range(topics, 1, racks(3), member_racks, every, [
        "t1-0, t1-3, t2-0, t2-3, t3-0, t4-0", "t1-1, t1-4, t2-1, t2-4, t3-1, t4-1", "t1-2, t2-2", "t1-5, t2-5"], 6)


def test_range_co_partitioned_with_same_subscription() -> None:
    topics = {"t1": 6, "t2": 6, "t3": 2, "t4": 2, "t5": 4, "t6": 4}
    every = [["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"]] * 3
    check_range(topics, 3, null_racks(3), racks(3), every, [
        "t1-0, t1-1, t2-0, t2-1, t3-0, t4-0, t5-0, t5-1, t6-0, t6-1",
        "t1-2, t1-3, t2-2, t2-3, t3-1, t4-1, t5-2, t6-2",
        "t1-4, t1-5, t2-4, t2-5, t5-3, t6-3"], -1)
    check_range(topics, 2, racks(3), racks(3), every, [
        "t1-0, t1-2, t2-0, t2-2, t3-0, t4-0, t5-1, t6-1",
        "t1-1, t1-3, t2-1, t2-3, t3-1, t4-1, t5-2, t6-2",
        "t1-4, t1-5, t2-4, t2-5, t5-0, t5-3, t6-0, t6-3"], 0)


def test_range_static_members_keep_rack_aligned_ranges_across_member_ids() -> None:
    topics = {"t1": 5, "t2": 5}
    rr = replica_racks({"t1": 5}, 2, racks(3)) | replica_racks({"t2": 5}, 2, racks(3))
    expected = {"i1": parse("t1-0, t1-2, t2-0, t2-2"), "i2": parse("t1-1, t1-3, t2-1, t2-3"), "i3": parse("t1-4, t2-4")}

    def by_instance(member_ids: Sequence[str]) -> dict[str, set[TopicPartition]]:
        subs = {m: Subscription(["t1", "t2"], rack_id=rack, group_instance_id=inst)
                for m, rack, inst in zip(member_ids, "abc", ("i1", "i2", "i3"), strict=True)}
        result = RangeAssignor().assign(topics, subs, rr)
        return {subs[m].group_instance_id or "": set(a.partitions) for m, a in result.items()}

    assert by_instance(["consumer1", "consumer2", "consumer3"]) == expected
    assert by_instance(["consumer1", "consumer5", "consumer4"]) == expected


# --- sticky and cooperative-sticky: Java's AbstractStickyAssignorTest scenarios ----------------

STICKY = [StickyAssignor, CooperativeStickyAssignor]


def sizes(result: Mapping[str, set[TopicPartition]]) -> list[int]:
    return sorted(len(p) for p in result.values())


def run_sticky(cls: type, topics: dict[str, int], rr: Racks, subs: dict[str, Subscription]) -> dict[str, set[TP]]:
    return as_sets(cls().assign(dict(topics), subs, rr))


@pytest.mark.parametrize("cls", STICKY)
@pytest.mark.parametrize(("consumer_topics", "java_mismatches"), [
    ([["t1", "t2", "t3"]] * 3, {1: 0, 2: 0}),
    ([["t1", "t2", "t3"], ["t1", "t2", "t3"], ["t1", "t3"]], {1: 4, 2: 0}),
], ids=["uniform", "non-equal"])
def test_sticky_prefers_racks_as_java(cls: type, consumer_topics: list[list[str]],
                                      java_mismatches: dict[int, int]) -> None:
    topics = {"t1": 6, "t2": 7, "t3": 2}
    subs = subscriptions(consumer_topics, racks(3))
    plain = run_sticky(cls, topics, {}, subs)
    for replication, java in java_mismatches.items():
        rr = replica_racks(topics, replication, racks(3))
        result = run_sticky(cls, topics, rr, subs)
        assert sizes(result) == sizes(plain)  # balance first
        assert mismatched(result, subs, rr) <= min(java, mismatched(plain, subs, rr))
    # Every partition on every rack, or no usable racks: exactly the plan without racks.
    for rr in (replica_racks(topics, 3, racks(3)), replica_racks(topics, 3, null_racks(3)),
               replica_racks(topics, 4, racks(4))):
        assert run_sticky(cls, topics, rr, subs) == plain
    assert run_sticky(cls, topics, replica_racks(topics, 1, racks(3)),
                      subscriptions(consumer_topics, ["d", "e", "f"])) == plain
    # One member in a rack without replicas still gets its share, outside its rack (balance first).
    rr = replica_racks(topics, 3, racks(2))
    result = run_sticky(cls, topics, rr, subs)
    assert sizes(result) == sizes(plain)
    assert mismatched(result, subs, rr) == len(result["consumer2"]) <= 5


@pytest.mark.parametrize("consumer_topics", [[["t1", "t2", "t3"]] * 3,
                                             [["t1", "t2", "t3"], ["t1", "t2", "t3"], ["t1", "t3"]]],
                         ids=["uniform", "non-equal"])
def test_cooperative_revokes_owned_partitions_outside_the_members_rack_first(
        consumer_topics: list[list[str]]) -> None:
    """Java's scenario: everyone owns partitions outside its rack (replication 1); the first round
    keeps only what is in each owner's rack, the second hands out the rest, aligned."""
    topics = {"t1": 6, "t2": 7, "t3": 2}
    rr = replica_racks(topics, 1, racks(3))
    owned = ["t1-0, t1-1, t1-2, t1-3, t1-4", "t1-5, t2-0, t2-1, t2-2, t2-3", "t2-4, t2-5, t2-6, t3-0, t3-1"]
    subs = subscriptions(consumer_topics, racks(3), owned, generation=1)
    first = run_sticky(CooperativeStickyAssignor, topics, rr, subs)
    claims = {tp: m for m, sub in subs.items() for tp in sub.owned_partitions if tp.topic in sub.topics}
    for member, parts in first.items():
        # What another member owns is not handed out while it has it; what nobody may keep is.
        assert all(claims.get(tp, member) == member for tp in parts)
    before = {m: {tp for tp in sub.owned_partitions if tp.topic in sub.topics} for m, sub in subs.items()}
    assert mismatched(first, subs, rr) < mismatched(before, subs, rr)
    follow_up = {m: Subscription(s.topics, owned_partitions=tuple(first[m]), generation_id=2, rack_id=s.rack_id)
                 for m, s in subs.items()}
    second = run_sticky(CooperativeStickyAssignor, topics, rr, follow_up)
    assert sizes(second) == sizes(run_sticky(CooperativeStickyAssignor, topics, {},
                                             subscriptions(consumer_topics, racks(3))))
    assert mismatched(second, subs, rr) <= (0 if consumer_topics[2] == consumer_topics[0] else 4)
    for member in subs:
        assert first[member] <= second[member]


@pytest.mark.parametrize("cls", STICKY)
def test_sticky_keeps_owned_partitions_when_racks_match(cls: type) -> None:
    topics = {"t1": 6, "t2": 7, "t3": 2}
    rr = replica_racks(topics, 1, racks(3))
    every = [["t1", "t2", "t3"]] * 3
    aligned = run_sticky(cls, topics, rr, subscriptions(every, racks(3)))
    owned = [", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(aligned[f"consumer{i}"])) for i in range(3)]
    again = run_sticky(cls, topics, rr, subscriptions(every, racks(3), owned, generation=1))
    assert again == aligned


# --- properties ------------------------------------------------------------------------------

TOPICS = ("t0", "t1", "t2", "t3")


@st.composite
def rack_scenarios(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, Subscription], Racks]:
    counts = {t: draw(st.integers(0, 8)) for t in TOPICS[: draw(st.integers(1, 4))]}
    rack_pool = ALL_RACKS[: draw(st.integers(1, 4))]
    rr: Racks = {
        TP(t, p): frozenset(draw(st.lists(st.sampled_from(rack_pool), max_size=3)))
        for t, n in counts.items() for p in range(n)
    }
    members = draw(st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, max_size=6, unique=True))
    same = draw(st.booleans())
    shared = draw(st.lists(st.sampled_from(list(counts)), min_size=1, unique=True))
    subs = {
        m: Subscription(shared if same else draw(st.lists(st.sampled_from(list(counts)), min_size=1, unique=True)),
                        rack_id=draw(st.none() | st.sampled_from((*rack_pool, "z"))))
        for m in members
    }
    return counts, subs, rr


ALL_ASSIGNORS = [RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor]


@settings(max_examples=80, deadline=None)
@given(s=rack_scenarios())
def test_without_usable_racks_the_assignment_is_the_plain_one(
        s: tuple[dict[str, int], dict[str, Subscription], Racks]) -> None:
    counts, subs, rr = s
    no_member_racks = {m: Subscription(sub.topics) for m, sub in subs.items()}
    same_racks_everywhere = {tp: frozenset(ALL_RACKS) for tp in rr}
    for cls in ALL_ASSIGNORS:
        plain = cls().assign(counts, subs)
        assert cls().assign(counts, no_member_racks, rr) == cls().assign(counts, no_member_racks)
        assert cls().assign(counts, subs, same_racks_everywhere) == plain
        assert cls().assign(counts, subs, {}) == plain
    assert RoundRobinAssignor().assign(counts, subs, rr) == RoundRobinAssignor().assign(counts, subs)


@settings(max_examples=80, deadline=None)
@given(s=rack_scenarios())
def test_racks_change_who_not_how_many(s: tuple[dict[str, int], dict[str, Subscription], Racks]) -> None:
    counts, subs, rr = s
    every = {TP(t, p) for t, n in counts.items() if any(t in sub.topics for sub in subs.values()) for p in range(n)}
    for cls in (RangeAssignor, StickyAssignor, CooperativeStickyAssignor):
        result, plain = as_sets(cls().assign(counts, subs, rr)), as_sets(cls().assign(counts, subs))
        given_out = [tp for parts in result.values() for tp in parts]
        assert Counter(given_out) == Counter(every)  # each partition once
        for member, parts in result.items():
            assert all(tp.topic in subs[member].topics for tp in parts)
        if cls is RangeAssignor:  # per topic, the same quotas
            for topic in counts:
                assert (sorted(sum(tp.topic == topic for tp in p) for p in result.values())
                        == sorted(sum(tp.topic == topic for tp in p) for p in plain.values()))
        else:  # as balanced (the sum of squares is minimal in both)
            assert sum(n * n for n in sizes(result)) == sum(n * n for n in sizes(plain))


#: Found by the property below: a partition whose replicas' racks no member is in (here: none
#: known) was taken from its owner on every run, and a group of our members rebalanced forever.
_NO_RACK_MATCHES = (
    {"t0": 0, "t1": 7},
    {"m0": Subscription(("t0", "t1"), rack_id="a"), "m1": Subscription(("t0", "t1"), rack_id="a"),
     "m2": Subscription(("t0",))},
    {**{TopicPartition("t1", p): frozenset() for p in range(6)}, TopicPartition("t1", 6): frozenset({"a"})},
)


@settings(max_examples=80, deadline=None)
@given(s=rack_scenarios())
@example(s=_NO_RACK_MATCHES)
def test_sticky_plans_are_fixed_points(s: tuple[dict[str, int], dict[str, Subscription], Racks]) -> None:
    """Run again with every member owning what it was given (generation 2): nothing moves, so a
    group of our members does not rebalance again and again."""
    counts, subs, rr = s
    for cls in (StickyAssignor, CooperativeStickyAssignor):
        first = as_sets(cls().assign(counts, subs, rr))
        owning = {m: Subscription(sub.topics, owned_partitions=tuple(first[m]), generation_id=2, rack_id=sub.rack_id)
                  for m, sub in subs.items()}
        assert as_sets(cls().assign(counts, owning, rr)) == first


# --- Java's assignors themselves ------------------------------------------------------------------


def random_scenario(rng: random.Random) -> tuple[dict[str, list[list[str | None]]], dict[str, dict[str, object]]]:
    topics = {}
    for i in range(rng.randint(1, 4)):
        pool = ALL_RACKS[: rng.randint(1, 4)]
        replication = rng.randint(1, 3)
        topics[f"t{i}"] = [[rng.choice((*pool, None)) if rng.random() < 0.1 else rng.choice(pool)
                            for _ in range(replication)] for _ in range(rng.randint(1, 8))]
    members: dict[str, dict[str, object]] = {}
    for j in range(rng.randint(1, 5)):
        subscribed = [t for t in topics if rng.random() < 0.7] or [rng.choice(list(topics))]
        members[f"m{rng.randint(0, 99)}-{j}"] = {
            "topics": subscribed,
            "rack": rng.choice((*ALL_RACKS[:4], None)),
            "instance": f"i{rng.randint(0, 9)}{j}" if rng.random() < 0.3 else None,
        }
    return topics, members


def test_range_is_javas_partition_for_partition(java_assignors: object) -> None:
    from support.java_assignors import JavaAssignors

    assert isinstance(java_assignors, JavaAssignors)
    rng = random.Random(881)
    aware = 0
    for _ in range(200):
        topics, members = random_scenario(rng)
        counts = {t: len(parts) for t, parts in topics.items()}
        rr = {TP(t, p): frozenset(r for r in reps if r) for t, parts in topics.items() for p, reps in enumerate(parts)}
        subs = {m: Subscription(spec["topics"], rack_id=spec["rack"], group_instance_id=spec["instance"])  # type: ignore[arg-type]
                for m, spec in members.items()}
        ours = as_sets(RangeAssignor().assign(counts, subs, rr))
        assert ours == java_assignors.assign("range", topics, members), (topics, members)
        aware += ours != as_sets(RangeAssignor().assign(counts, subs))
    assert aware > 30  # the racks changed the assignment in many of the scenarios


@pytest.fixture(scope="module")
def java_assignors() -> Iterator[object]:
    from support.java_assignors import JavaAssignors, javac

    if javac() is None:
        pytest.skip("no JDK (javac): Java's assignors cannot be run")
    with JavaAssignors() as java:
        yield java
