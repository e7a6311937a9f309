"""Tests for the classic-protocol partition assignors (asyncconsumer.assignors).

Concrete assignments follow the examples in the Java client's documentation;
wire bytes are built by hand from the ConsumerProtocol / StickyAssignorUserData
schemas; the sticky assignors are also checked with Hypothesis for validity,
balance, stickiness, the cooperative two-round hand-over and determinism.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncconsumer.assignors import (
    ASSIGNORS,
    Assignor,
    CooperativeStickyAssignor,
    MemberAssignment,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
    decode_assignment,
    decode_sticky_user_data,
    decode_subscription,
    encode_assignment,
    encode_sticky_user_data,
    encode_subscription,
    get_assignor,
    sorted_member_ids,
)
from asyncconsumer.errors import ProtocolError
from asyncconsumer.structs import TopicPartition

TP = TopicPartition
Assignment = dict[str, set[TopicPartition]]


def tps(spec: str) -> set[TopicPartition]:
    """``"t0:0,1 t1:2"`` -> {t0-0, t0-1, t1-2}."""
    out: set[TopicPartition] = set()
    for chunk in spec.split():
        topic, parts = chunk.split(":")
        out.update(TP(topic, int(p)) for p in parts.split(","))
    return out


def as_sets(result: Mapping[str, MemberAssignment]) -> Assignment:
    return {m: set(a.partitions) for m, a in result.items()}


# --- hand-built wire bytes ----------------------------------------------------------------


def _i16(v: int) -> bytes:
    return struct.pack(">h", v)


def _i32(v: int) -> bytes:
    return struct.pack(">i", v)


def _str(s: str | None) -> bytes:
    if s is None:
        return _i16(-1)
    raw = s.encode()
    return _i16(len(raw)) + raw


def _bytes(b: bytes | None) -> bytes:
    return _i32(-1) if b is None else _i32(len(b)) + b


def _array(items: list[bytes]) -> bytes:
    return _i32(len(items)) + b"".join(items)


def _int32s(values: list[int]) -> bytes:
    return _array([_i32(v) for v in values])


def _topic_partitions(entries: list[tuple[str, list[int]]]) -> bytes:
    return _array([_str(t) + _int32s(ps) for t, ps in entries])


# --- ConsumerProtocolSubscription / Assignment ----------------------------------------------


def test_subscription_v3_bytes() -> None:
    sub = Subscription(
        topics=("orders", "pay"),
        user_data=b"\x01\x02",
        owned_partitions=(TP("orders", 0), TP("orders", 2), TP("pay", 1)),
        generation_id=7,
        rack_id="rack-a",
    )
    expected = (
        _i16(3)
        + _array([_str("orders"), _str("pay")])
        + _bytes(b"\x01\x02")
        + _topic_partitions([("orders", [0, 2]), ("pay", [1])])
        + _i32(7)
        + _str("rack-a")
    )
    assert encode_subscription(sub) == expected
    assert decode_subscription(expected) == sub


@pytest.mark.parametrize(
    ("version", "tail"),
    [
        (0, b""),
        (1, _topic_partitions([("a", [1])])),
        (2, _topic_partitions([("a", [1])]) + _i32(4)),
        (3, _topic_partitions([("a", [1])]) + _i32(4) + _str(None)),
    ],
)
def test_subscription_older_versions_drop_newer_fields(version: int, tail: bytes) -> None:
    sub = Subscription(topics=("a",), owned_partitions=(TP("a", 1),), generation_id=4)
    data = encode_subscription(sub, version)
    assert data == _i16(version) + _array([_str("a")]) + _bytes(None) + tail
    decoded = decode_subscription(data)
    assert decoded.topics == ("a",)
    assert decoded.user_data is None
    assert decoded.owned_partitions == (() if version < 1 else (TP("a", 1),))
    assert decoded.generation_id == (-1 if version < 2 else 4)
    assert decoded.rack_id is None


def test_subscription_from_a_newer_version_parses_as_latest() -> None:
    # A future v4 appends a field; we parse the v3 prefix and ignore the rest.
    data = (
        _i16(4)
        + _array([_str("t")])
        + _bytes(b"")
        + _topic_partitions([("t", [3])])
        + _i32(9)
        + _str("r1")
        + b"\x00\x00\x00\x2a"
    )
    assert decode_subscription(data) == Subscription(
        topics=("t",), user_data=b"", owned_partitions=(TP("t", 3),), generation_id=9, rack_id="r1"
    )


def test_subscription_truncated_raises() -> None:
    data = encode_subscription(Subscription(topics=("t",), owned_partitions=(TP("t", 0),)))
    with pytest.raises(ProtocolError):
        decode_subscription(data[:-3])


def test_subscription_accepts_lists_and_is_hashable() -> None:
    sub = Subscription(topics=["a", "b"], owned_partitions=[("a", 0)])  # type: ignore[arg-type]
    assert sub.topics == ("a", "b")
    assert sub.owned_partitions == (TP("a", 0),)
    assert hash(sub) == hash(Subscription(topics=("a", "b"), owned_partitions=(TP("a", 0),)))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_bytes(version: int) -> None:
    a = MemberAssignment(partitions=(TP("t1", 0), TP("t1", 5), TP("t0", 2)), user_data=b"xyz")
    expected = _i16(version) + _topic_partitions([("t1", [0, 5]), ("t0", [2])]) + _bytes(b"xyz")
    assert encode_assignment(a, version) == expected
    assert decode_assignment(expected) == a


def test_assignment_null_user_data_and_empty_bytes() -> None:
    assert encode_assignment(MemberAssignment(())) == _i16(3) + _array([]) + _bytes(None)
    assert decode_assignment(_i16(0) + _array([]) + _bytes(None)) == MemberAssignment(())
    # A member the leader left out of SyncGroup gets zero bytes.
    assert decode_assignment(b"") == MemberAssignment(())


@given(
    topics=st.lists(st.text(max_size=8), max_size=4),
    user_data=st.none() | st.binary(max_size=10),
    owned=st.lists(st.tuples(st.sampled_from(["a", "b", "ü"]), st.integers(0, 2**31 - 1)), max_size=6),
    generation=st.integers(-1, 2**31 - 1),
    rack=st.none() | st.text(max_size=5),
)
@settings(max_examples=60, deadline=None)
def test_subscription_round_trip(
    topics: list[str], user_data: bytes | None, owned: list[tuple[str, int]], generation: int, rack: str | None
) -> None:
    # Owned partitions are grouped by topic on the wire, so give them grouped.
    owned_sorted = tuple(TP(t, p) for t, p in sorted(owned))
    sub = Subscription(tuple(topics), user_data, owned_sorted, generation, rack)
    assert decode_subscription(encode_subscription(sub)) == sub


# --- StickyAssignor user data ---------------------------------------------------------------


def test_sticky_user_data_bytes() -> None:
    data = encode_sticky_user_data([TP("b", 1), TP("a", 3), TP("b", 0)], 12)
    assert data == _topic_partitions([("a", [3]), ("b", [0, 1])]) + _i32(12)
    assert decode_sticky_user_data(data) == ((TP("a", 3), TP("b", 0), TP("b", 1)), 12)


def test_sticky_user_data_v0_has_no_generation() -> None:
    data = _topic_partitions([("t", [0, 1])])
    assert encode_sticky_user_data([TP("t", 0), TP("t", 1)], None) == data
    assert decode_sticky_user_data(data) == ((TP("t", 0), TP("t", 1)), None)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x00",
        _i32(-1),
        _i32(1) + _str("t"),
        _i32(1) + _str("t") + _i32(2) + _i32(0),
        _i32(1) + _i16(5) + b"ab",
    ],
)
def test_sticky_user_data_malformed(data: bytes) -> None:
    assert decode_sticky_user_data(data) is None


def test_sticky_subscription_user_data_remembers_last_assignment() -> None:
    assignor = StickyAssignor()
    assert assignor.subscription_user_data({"t"}, [], -1) is None
    assignor.on_assignment(MemberAssignment((TP("t", 2), TP("t", 0))), 5)
    # Eager: the member revoked everything before joining, so `owned` is empty; the remembered
    # assignment and generation are sent, in Java's StickyAssignorUserData v1 layout.
    assert assignor.subscription_user_data({"t"}, [], -1) == _topic_partitions([("t", [0, 2])]) + _i32(5)
    assert assignor.subscription_user_data({"t"}, [TP("t", 9)], 6) == _topic_partitions([("t", [9])]) + _i32(6)


def test_cooperative_subscription_user_data_is_the_generation() -> None:
    assignor = CooperativeStickyAssignor()
    assert assignor.subscription_user_data({"t"}, [], -1) == _i32(-1)
    assignor.on_assignment(MemberAssignment((TP("t", 0),)), 8)
    assert assignor.subscription_user_data({"t"}, [TP("t", 0)], -1) == _i32(8)
    assert assignor.subscription_user_data({"t"}, [TP("t", 0)], 9) == _i32(9)


# --- registry ------------------------------------------------------------------------------


def test_registry() -> None:
    assert list(ASSIGNORS) == ["range", "roundrobin", "sticky", "cooperative-sticky"]
    for name, cls in ASSIGNORS.items():
        assert cls.name == name
        assignor = get_assignor(name)
        assert isinstance(assignor, cls)
        assert assignor.protocol in assignor.supported_protocols
    assert ASSIGNORS["cooperative-sticky"].protocol is RebalanceProtocol.COOPERATIVE
    assert {ASSIGNORS[n].protocol for n in ("range", "roundrobin", "sticky")} == {RebalanceProtocol.EAGER}
    with pytest.raises(KeyError, match="unknown partition assignor"):
        get_assignor("nope")


def test_member_order_matches_java() -> None:
    subs = {
        "b-1": Subscription(("t",)),
        "a-9": Subscription(("t",)),
        "z-0": Subscription(("t",), group_instance_id="inst-2"),
        "y-0": Subscription(("t",), group_instance_id="inst-1"),
        # U+FFFD sorts after a surrogate pair in Java (UTF-16 code units), not in Python.
        "\U0001f600": Subscription(("t",)),
        "\ufffd": Subscription(("t",)),
    }
    assert sorted_member_ids(subs) == ["y-0", "z-0", "a-9", "b-1", "\U0001f600", "\ufffd"]


# --- range ---------------------------------------------------------------------------------


def test_range_classic_example() -> None:
    subs = {"C1": Subscription(("t0", "t1")), "C0": Subscription(("t0", "t1"))}
    result = RangeAssignor().assign({"t0": 3, "t1": 3}, subs)
    assert list(result) == ["C0", "C1"]
    assert result["C0"].partitions == (TP("t0", 0), TP("t0", 1), TP("t1", 0), TP("t1", 1))
    assert result["C1"].partitions == (TP("t0", 2), TP("t1", 2))
    assert result["C0"].user_data is None


def test_range_uneven_and_mixed_subscriptions() -> None:
    subs = {
        "m1": Subscription(("big", "small")),
        "m2": Subscription(("big",)),
        "m3": Subscription(("big", "small", "missing")),
        "m4": Subscription(("other",)),
    }
    result = as_sets(RangeAssignor().assign({"big": 7, "small": 1, "other": 0}, subs))
    assert result == {
        "m1": tps("big:0,1,2 small:0"),
        "m2": tps("big:3,4"),
        "m3": tps("big:5,6"),
        "m4": set(),
    }


def test_range_static_members_first_by_instance_id() -> None:
    subs = {
        "aaa": Subscription(("t",)),
        "zzz": Subscription(("t",), group_instance_id="i1"),
        "mmm": Subscription(("t",), group_instance_id="i0"),
    }
    result = as_sets(RangeAssignor().assign({"t": 4}, subs))
    assert result == {"mmm": tps("t:0,1"), "zzz": tps("t:2"), "aaa": tps("t:3")}


# --- roundrobin ----------------------------------------------------------------------------


def test_roundrobin_classic_example() -> None:
    subs = {"C0": Subscription(("t0", "t1")), "C1": Subscription(("t0", "t1"))}
    result = as_sets(RoundRobinAssignor().assign({"t0": 3, "t1": 3}, subs))
    assert result == {"C0": tps("t0:0,2 t1:1"), "C1": tps("t0:1 t1:0,2")}


def test_roundrobin_mixed_subscriptions_java_example() -> None:
    # From the RoundRobinAssignor javadoc: t0, t1, t2 with 1, 2, 3 partitions.
    subs = {
        "C0": Subscription(("t0",)),
        "C1": Subscription(("t0", "t1")),
        "C2": Subscription(("t0", "t1", "t2")),
    }
    result = as_sets(RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, subs))
    assert result == {"C0": tps("t0:0"), "C1": tps("t1:0"), "C2": tps("t1:1 t2:0,1,2")}


def test_roundrobin_skips_unknown_topics_and_keeps_position() -> None:
    subs = {"a": Subscription(("x", "ghost")), "b": Subscription(("x", "y")), "c": Subscription(("y",))}
    result = as_sets(RoundRobinAssignor().assign({"x": 3, "y": 3}, subs))
    # x-0 a, x-1 b, x-2 a (c skipped), y-0 b, y-1 c, y-2 b (a skipped)
    assert result == {"a": tps("x:0,2"), "b": tps("x:1 y:0,2"), "c": tps("y:1")}


# --- sticky: concrete cases ----------------------------------------------------------------


def _sticky_sub(topics: Iterable[str], owned: str = "", generation: int = 1) -> Subscription:
    """Subscription as a Java StickyAssignor member sends it: previous assignment in user data."""
    return Subscription(tuple(topics), user_data=encode_sticky_user_data(tps(owned) if owned else (), generation))


def _coop_sub(topics: Iterable[str], owned: str = "", generation: int = 1) -> Subscription:
    return Subscription(
        tuple(topics), owned_partitions=tuple(sorted(tps(owned) if owned else ())), generation_id=generation
    )


FOUR_TOPICS = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}


def test_sticky_initial_assignment_is_balanced() -> None:
    subs = {c: Subscription(tuple(FOUR_TOPICS)) for c in ("C0", "C1", "C2")}
    result = as_sets(StickyAssignor().assign(FOUR_TOPICS, subs))
    assert sorted(len(p) for p in result.values()) == [2, 3, 3]
    assert set().union(*result.values()) == {TP(t, p) for t in FOUR_TOPICS for p in range(2)}


def test_sticky_java_example_member_leaves() -> None:
    # StickyAssignor javadoc: C1 leaves; C0 and C2 keep everything and split C1's partitions.
    topics = tuple(FOUR_TOPICS)
    subs = {"C0": _sticky_sub(topics, "t0:0 t1:1 t3:0"), "C2": _sticky_sub(topics, "t1:0 t2:1")}
    result = as_sets(StickyAssignor().assign(FOUR_TOPICS, subs))
    assert result == {"C0": tps("t0:0 t1:1 t2:0 t3:0"), "C2": tps("t0:1 t1:0 t2:1 t3:1")}


def test_sticky_java_example_mixed_subscriptions() -> None:
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {"C0": Subscription(("t0",)), "C1": Subscription(("t0", "t1")), "C2": Subscription(("t0", "t1", "t2"))}
    first = as_sets(StickyAssignor().assign(counts, subs))
    assert first == {"C0": tps("t0:0"), "C1": tps("t1:0,1"), "C2": tps("t2:0,1,2")}
    # C0 leaves: t0-0 goes to C1 and nothing else moves (round robin would move t1-1 and t2-*).
    subs = {"C1": _sticky_sub(("t0", "t1"), "t1:0,1"), "C2": _sticky_sub(("t0", "t1", "t2"), "t2:0,1,2")}
    second = as_sets(StickyAssignor().assign(counts, subs))
    assert second == {"C1": tps("t0:0 t1:0,1"), "C2": tps("t2:0,1,2")}


def test_sticky_falls_back_to_owned_partitions_without_user_data() -> None:
    subs = {"a": _coop_sub(["t"], "t:2,3"), "b": _coop_sub(["t"], "t:0,1"), "c": Subscription(("t",))}
    result = as_sets(StickyAssignor().assign({"t": 6}, subs))
    assert result == {"a": tps("t:2,3"), "b": tps("t:0,1"), "c": tps("t:4,5")}


def test_sticky_v0_user_data_uses_subscription_generation() -> None:
    v0 = _topic_partitions([("t", [0])])
    subs = {
        "a": Subscription(("t",), user_data=v0, generation_id=9),
        "b": Subscription(("t",), user_data=encode_sticky_user_data([TP("t", 0)], 3)),
    }
    assert as_sets(StickyAssignor().assign({"t": 2}, subs)) == {"a": tps("t:0"), "b": tps("t:1")}


@pytest.mark.parametrize("assignor", [StickyAssignor(), CooperativeStickyAssignor()], ids=lambda a: a.name)
def test_sticky_conflicting_claims_highest_generation_wins(assignor: Assignor) -> None:
    make = _sticky_sub if assignor.protocol is RebalanceProtocol.EAGER else _coop_sub
    # a (generation 5) and b (generation 4) both claim t-0: a keeps it.
    subs = {"a": make(["t"], "t:0", 5), "b": make(["t"], "t:0,1", 4)}
    assert as_sets(assignor.assign({"t": 2}, subs)) == {"a": tps("t:0"), "b": tps("t:1")}
    # Now b is the newer claim for both partitions; a's stale claim on t-0 is ignored.
    subs = {"a": make(["t"], "t:0", 3), "b": make(["t"], "t:0,1", 4)}
    result = as_sets(assignor.assign({"t": 2}, subs))
    if assignor.protocol is RebalanceProtocol.EAGER:
        assert result == {"a": tps("t:1"), "b": tps("t:0")}
    else:
        # b owns t-1 until it has revoked it; a gets it in the follow-up rebalance.
        assert result == {"a": set(), "b": tps("t:0")}


def test_sticky_same_generation_conflict_goes_to_first_member() -> None:
    subs = {"b": _coop_sub(["t"], "t:0", 2), "a": _coop_sub(["t"], "t:0", 2)}
    assert as_sets(StickyAssignor().assign({"t": 2}, subs)) == {"a": tps("t:0"), "b": tps("t:1")}


def test_sticky_ignores_invalid_claims_and_spreads_new_topics() -> None:
    subs = {
        # "gone" no longer exists, t-9 is out of range, and "old" is no longer subscribed.
        "a": _sticky_sub(["t", "new"], "t:0,9 gone:0 old:0"),
        "b": _sticky_sub(["t", "new"], "t:1"),
    }
    result = as_sets(StickyAssignor().assign({"t": 2, "new": 4, "old": 1}, subs))
    assert result["a"] >= tps("t:0") and result["b"] >= tps("t:1")
    assert [len(result["a"]), len(result["b"])] == [3, 3]
    assert result["a"] | result["b"] == tps("t:0,1 new:0,1,2,3")


def test_sticky_balances_along_a_chain() -> None:
    # a (x only) has 3, b (x and y) 2, c (y only) 1.  No single hand-over helps (a cannot give to c,
    # and a->b or b->c only swaps sizes), but a->b plus b->c evens everyone out at 2.
    subs = {"a": _sticky_sub(["x"], "x:0,1,2"), "b": _sticky_sub(["x", "y"], "y:0,1"), "c": _sticky_sub(["y"], "y:2")}
    result = as_sets(StickyAssignor().assign({"x": 3, "y": 3}, subs))
    assert result == {"a": tps("x:0,1"), "b": tps("x:2 y:0"), "c": tps("y:1,2")}
    # Cooperative: both moving partitions are still owned, so round 1 only takes them away.
    subs = {"a": _coop_sub(["x"], "x:0,1,2"), "b": _coop_sub(["x", "y"], "y:0,1"), "c": _coop_sub(["y"], "y:2")}
    result = as_sets(CooperativeStickyAssignor().assign({"x": 3, "y": 3}, subs))
    assert result == {"a": tps("x:0,1"), "b": tps("y:0"), "c": tps("y:2")}


def test_cooperative_new_member_gets_partitions_in_second_round() -> None:
    assignor = CooperativeStickyAssignor()
    counts = {"t": 6}
    subs = {"C0": _coop_sub(["t"], "t:0,1,2"), "C1": _coop_sub(["t"], "t:3,4,5"), "C2": _coop_sub(["t"])}
    round1 = as_sets(assignor.assign(counts, subs))
    assert round1 == {"C0": tps("t:0,1"), "C1": tps("t:3,4"), "C2": set()}
    # C0 and C1 revoke t-2 and t-5 and rejoin owning what they kept.
    subs = {m: Subscription(("t",), owned_partitions=tuple(sorted(p)), generation_id=2) for m, p in round1.items()}
    round2 = as_sets(assignor.assign(counts, subs))
    assert round2 == {"C0": tps("t:0,1"), "C1": tps("t:3,4"), "C2": tps("t:2,5")}
    # The eager flavour moves them at once.
    subs = {"C0": _sticky_sub(["t"], "t:0,1,2"), "C1": _sticky_sub(["t"], "t:3,4,5"), "C2": _sticky_sub(["t"])}
    assert as_sets(StickyAssignor().assign(counts, subs)) == round2


def test_cooperative_generation_from_user_data_before_v2() -> None:
    # Java's CooperativeStickyAssignor puts the generation in user data for subscriptions < v2.
    subs = {
        "a": Subscription(("t",), owned_partitions=(TP("t", 0),), generation_id=5),
        "b": Subscription(("t",), user_data=_i32(7), owned_partitions=(TP("t", 0),)),
        "c": Subscription(("t",), user_data=encode_sticky_user_data([], 1), owned_partitions=(TP("t", 1),)),
    }
    assert as_sets(CooperativeStickyAssignor().assign({"t": 3}, subs)) == {
        "a": tps("t:2"),
        "b": tps("t:0"),
        "c": tps("t:1"),
    }


def test_sticky_end_to_end_through_the_wire() -> None:
    """Members encode their subscriptions, the leader decodes, assigns and encodes the assignments."""
    counts = {"a": 3, "b": 5}
    members = {m: StickyAssignor() for m in ("m1", "m2", "m3")}
    generation = 1
    current: dict[str, tuple[TopicPartition, ...]] = {}
    for joined in (["m1", "m2"], ["m1", "m2", "m3"], ["m2", "m3"]):
        wire = {
            m: encode_subscription(
                Subscription(("a", "b"), user_data=members[m].subscription_user_data({"a", "b"}, [], -1))
            )
            for m in joined
        }
        leader = StickyAssignor()
        result = leader.assign(counts, {m: decode_subscription(data) for m, data in wire.items()})
        new = {m: decode_assignment(encode_assignment(a)) for m, a in result.items()}
        sizes = sorted(len(a.partitions) for a in new.values())
        assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 8
        for m, a in new.items():
            quota = 8 // len(joined)
            if len(current.get(m, ())) <= quota:
                assert set(current.get(m, ())) <= set(a.partitions)
            members[m].on_assignment(a, generation)
        current = {m: a.partitions for m, a in new.items()}
        generation += 1


# --- property tests ------------------------------------------------------------------------

MEMBER_POOL = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "static-x"]
TOPIC_POOL = ["t0", "t1", "t2", "t3"]


class Scenario:
    def __init__(
        self,
        counts: dict[str, int],
        topics: dict[str, frozenset[str]],
        claims: dict[str, tuple[frozenset[TopicPartition], int]],
        same_topics: bool,
    ) -> None:
        self.counts = counts
        self.topics = topics  # member -> subscribed topics (may include unknown ones)
        self.claims = claims  # member -> (claimed partitions, generation)
        self.same_topics = same_topics

    def __repr__(self) -> str:
        return f"Scenario({self.counts!r}, {self.topics!r}, {self.claims!r}, {self.same_topics!r})"

    def subscriptions(self, eager: bool, use_user_data: Mapping[str, bool] | None = None) -> dict[str, Subscription]:
        subs: dict[str, Subscription] = {}
        for m, topics in self.topics.items():
            owned, generation = self.claims.get(m, (frozenset(), -1))
            instance = "inst" if m == "static-x" else None
            if eager and (use_user_data is None or use_user_data.get(m, True)):
                data = encode_sticky_user_data(sorted(owned), generation)
                subs[m] = Subscription(tuple(sorted(topics)), user_data=data, group_instance_id=instance)
            else:
                subs[m] = Subscription(
                    tuple(sorted(topics)), None, tuple(sorted(owned)), generation, group_instance_id=instance
                )
        return subs

    def eligible(self, member: str) -> set[str]:
        return {t for t in self.topics[member] if self.counts.get(t, 0) > 0}

    def all_partitions(self) -> set[TopicPartition]:
        wanted = set().union(*(self.eligible(m) for m in self.topics)) if self.topics else set()
        return {TP(t, p) for t in wanted for p in range(self.counts[t])}

    def owners(self) -> dict[TopicPartition, str]:
        """The documented rule: valid claims only, highest generation, ties to the first member in order."""
        subs = {m: Subscription((), group_instance_id="inst" if m == "static-x" else None) for m in self.topics}
        owner: dict[TopicPartition, str] = {}
        best: dict[TopicPartition, int] = {}
        for m in sorted_member_ids(subs):
            owned, generation = self.claims.get(m, (frozenset(), -1))
            for tp in owned:
                if tp.topic in self.eligible(m) and tp.partition < self.counts[tp.topic]:
                    if tp not in best or generation > best[tp]:
                        owner[tp], best[tp] = m, generation
        return owner


@st.composite
def scenarios(draw: st.DrawFn, conflicts: bool = True) -> Scenario:
    n_topics = draw(st.integers(1, 4))
    counts = {t: draw(st.integers(0, 9)) for t in TOPIC_POOL[:n_topics]}
    members = draw(st.lists(st.sampled_from(MEMBER_POOL), min_size=1, max_size=7, unique=True))
    known = sorted(counts)
    same_topics = draw(st.booleans())
    if same_topics:
        shared = frozenset(draw(st.lists(st.sampled_from(known), min_size=1, unique=True)))
        topics = dict.fromkeys(members, shared)
    else:
        choices = [*known, "ghost"]
        topics = {m: frozenset(draw(st.lists(st.sampled_from(choices), unique=True))) for m in members}
    # Previous owners: also members that have left, partitions beyond the current count (the
    # topic shrank or was recreated) and, when allowed, several claims on one partition.
    everything = [TP(t, p) for t in [*known, "gone"] for p in range(counts.get(t, 2) + 1)]
    claimants = MEMBER_POOL if conflicts else members
    claims_by_member: dict[str, set[TopicPartition]] = {}
    for tp in everything:
        holders = draw(st.lists(st.sampled_from(claimants), max_size=2 if conflicts else 1, unique=True))
        for h in holders:
            claims_by_member.setdefault(h, set()).add(tp)
    claims = {
        m: (frozenset(owned), draw(st.integers(0, 3)) if conflicts else 1) for m, owned in claims_by_member.items()
    }
    return Scenario(counts, topics, claims, same_topics)


def check_valid(s: Scenario, result: Assignment, complete: bool = True) -> None:
    assert set(result) == set(s.topics)
    seen: set[TopicPartition] = set()
    for m, parts in result.items():
        for tp in parts:
            assert tp.topic in s.eligible(m) and 0 <= tp.partition < s.counts[tp.topic], (m, tp)
            assert tp not in seen, f"{tp} assigned twice"
            seen.add(tp)
    if complete:
        assert seen == s.all_partitions()
    else:
        assert seen <= s.all_partitions()


def check_balanced(s: Scenario, result: Assignment) -> None:
    size = {m: len(p) for m, p in result.items()}
    if s.same_topics:
        assert max(size.values()) - min(size.values()) <= 1, size
    # In general: no chain of hand-overs from a member with k partitions reaches one with k - 2 or fewer.
    for start in result:
        reached, frontier = {start}, [start]
        while frontier:
            holder = frontier.pop()
            for topic in {tp.topic for tp in result[holder]}:
                for taker in result:
                    if taker not in reached and topic in s.eligible(taker):
                        reached.add(taker)
                        frontier.append(taker)
        for other in reached:
            assert size[other] >= size[start] - 1, (start, other, size)


def check_sticky(s: Scenario, result: Assignment) -> None:
    """Members at or below the fair share keep everything; overall, as much as possible stays put."""
    if not s.same_topics:
        return
    owners = s.owners()
    owned: dict[str, set[TopicPartition]] = {m: set() for m in s.topics}
    for tp, m in owners.items():
        owned[m].add(tp)
    quota, extra = divmod(len(s.all_partitions()), len(s.topics))
    for m, parts in owned.items():
        if len(parts) <= quota:
            assert parts <= result[m], (m, parts, result[m])
    # The most that can stay: everyone keeps up to the quota, `extra` members one more.
    best = sum(min(len(p), quota) for p in owned.values()) + min(extra, sum(len(p) > quota for p in owned.values()))
    stayed = sum(len(owned[m] & result[m]) for m in s.topics)
    assert stayed == best


def shuffled(subs: dict[str, Subscription], seed: int) -> dict[str, Subscription]:
    items = list(subs.items())
    random.Random(seed).shuffle(items)
    return dict(items)


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(s=scenarios(), user_data=st.dictionaries(st.sampled_from(MEMBER_POOL), st.booleans()), seed=st.integers())
def test_sticky_properties(s: Scenario, user_data: dict[str, bool], seed: int) -> None:
    subs = s.subscriptions(eager=True, use_user_data=user_data)
    result = StickyAssignor().assign(s.counts, subs)
    sets = as_sets(result)
    check_valid(s, sets)
    check_balanced(s, sets)
    check_sticky(s, sets)
    # Determinism: a fresh instance and another dict order give the same answer, key order included.
    again = StickyAssignor().assign(dict(reversed(s.counts.items())), shuffled(subs, seed))
    assert list(again.items()) == list(result.items())
    assert all(list(a.partitions) == sorted(a.partitions) for a in result.values())


@PROPS
@given(s=scenarios(), seed=st.integers())
def test_cooperative_sticky_two_rounds(s: Scenario, seed: int) -> None:
    assignor = CooperativeStickyAssignor()
    owners = s.owners()
    subs = s.subscriptions(eager=False)
    first = assignor.assign(s.counts, subs)
    assert list(CooperativeStickyAssignor().assign(s.counts, shuffled(subs, seed)).items()) == list(first.items())
    round1 = as_sets(first)
    check_valid(s, round1, complete=False)
    check_sticky(s, round1)  # nobody loses what they own except to make room
    for m, parts in round1.items():
        for tp in parts:
            # Never handed to someone else while its owner (who is here and subscribed) still holds it.
            assert owners.get(tp, m) == m, (tp, owners.get(tp), m)
    # Everyone revokes what they were not given and rejoins with the rest.
    generation = max((g for _, g in s.claims.values()), default=0) + 1
    again = Scenario(s.counts, s.topics, {m: (frozenset(p), generation) for m, p in round1.items()}, s.same_topics)
    round2 = as_sets(assignor.assign(s.counts, again.subscriptions(eager=False)))
    check_valid(s, round2)
    check_balanced(s, round2)
    for m in round1:
        assert round1[m] <= round2[m], "the second round must not revoke anything"


@settings(max_examples=100, deadline=None)
@given(
    counts=st.dictionaries(st.sampled_from(TOPIC_POOL), st.integers(0, 12), min_size=1),
    before=st.lists(st.sampled_from(MEMBER_POOL), min_size=1, max_size=7, unique=True),
    after=st.lists(st.sampled_from(MEMBER_POOL), min_size=1, max_size=7, unique=True),
    cooperative=st.booleans(),
)
def test_sticky_membership_change_moves_little(
    counts: dict[str, int], before: list[str], after: list[str], cooperative: bool
) -> None:
    """Start from a sticky assignment, change membership, and check what moved."""
    topics = frozenset(counts)
    assignor: Assignor = CooperativeStickyAssignor() if cooperative else StickyAssignor()
    start = Scenario(counts, dict.fromkeys(before, topics), {}, True)
    previous = as_sets(assignor.assign(counts, start.subscriptions(eager=not cooperative)))
    changed = Scenario(counts, dict.fromkeys(after, topics), {m: (frozenset(p), 1) for m, p in previous.items()}, True)
    result = as_sets(assignor.assign(counts, changed.subscriptions(eager=not cooperative)))
    check_valid(changed, result, complete=not cooperative)
    if not cooperative:
        check_balanced(changed, result)
    check_sticky(changed, result)
    # Only members above the fair share give anything up.
    quota = sum(counts.values()) // len(after)
    for m in set(before) & set(after):
        lost = previous[m] - result[m]
        if lost:
            assert len(previous[m]) > quota


@settings(max_examples=60, deadline=None)
@given(s=scenarios(conflicts=False), seed=st.integers())
def test_range_and_roundrobin_valid_and_deterministic(s: Scenario, seed: int) -> None:
    for cls in (RangeAssignor, RoundRobinAssignor):
        subs = s.subscriptions(eager=False)
        result = cls().assign(s.counts, subs)
        check_valid(s, as_sets(result))
        assert list(cls().assign(s.counts, shuffled(subs, seed)).items()) == list(result.items())
        if s.same_topics and cls is RoundRobinAssignor:
            sizes = [len(a.partitions) for a in result.values()]
            assert max(sizes) - min(sizes) <= 1
