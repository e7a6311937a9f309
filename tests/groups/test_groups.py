"""Consumer groups against a real broker: rebalances are a non-event.

Tansu holds a JoinGroup for session_timeout/2, so these tests use short session timeouts.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.consumers import Recorder

from asyncconsumer import CommitFailedError, Consumer, TopicPartition
from asyncconsumer.errors import PollIntervalExceededError, RebalanceCallbackError
from asyncconsumer.listener import RebalanceListener
from asyncconsumer.managers.consumer_membership import ConsumerMembershipManager
from asyncconsumer.managers.membership import MembershipManager, MemberState

pytestmark = pytest.mark.anyio

#: KIP-848 stand-ins for the classic client-side assignors in parametrized tests.
REMOTE_ASSIGNOR = {"range": "range", "cooperative-sticky": "uniform"}

GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100,
         "retry_backoff_ms": 50, "auto_offset_reset": "earliest", "request_timeout_ms": 10000}


def member(bootstrap: str, group: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, group_id=group, **{**GROUP, **options})


@pytest.fixture(params=["classic", "consumer"])
def group_protocol(request: pytest.FixtureRequest, kafka_backend: Any) -> str:
    """The group protocol dimension: classic everywhere, KIP-848 ("consumer") on Apache Kafka
    (conftest deselects Tansu's "consumer" items: Tansu has no KIP-848)."""
    assert request.param == "classic" or kafka_backend.supports("kip848")
    return str(request.param)


def assert_protocol(c: Consumer[Any, Any], group_protocol: str) -> None:
    """No silent fallback: the member speaks the protocol the test asked for.  With KIP-848 a
    member epoch >= 1 is the coordinator's answer to a ConsumerGroupHeartbeat."""
    engine = c._engine
    assert engine is not None and engine.membership is not None
    membership = engine.membership
    if group_protocol == "consumer":
        assert isinstance(membership, ConsumerMembershipManager), "fell back to the classic protocol"
        assert not membership.unsupported and membership.generation >= 1, membership.state
    else:
        assert isinstance(membership, MembershipManager)


async def wait_for_assignment(c: Consumer[Any, Any], timeout: float = 20) -> set[TopicPartition]:
    """Poll (callbacks only run inside polls) until the member is stable with partitions."""
    engine = c._engine
    assert engine is not None and engine.membership is not None
    with anyio.fail_after(timeout):
        while not (engine.membership.state is MemberState.STABLE and c.assignment()):
            c.pause(*c.assignment())  # keep records in the topic for the test to read later
            # A partition assigned during this poll is not paused yet: put back what it returned.
            for tp, records in (await c.getmany(timeout=0.1)).items():
                await c.seek(tp, records[0].offset)
        c.resume(*c.assignment())
        return c.assignment()


async def wait_until_settled(c: Consumer[Any, Any], other: Consumer[Any, Any], *, partitions: int,
                             quiet: float, timeout: float = 30) -> None:
    """Poll ``c`` (``other`` is polled elsewhere) until the two members are stable, hold all
    ``partitions`` between them, each some, and neither assignment changed for ``quiet`` seconds."""
    def snapshot() -> tuple[Any, ...]:
        states = tuple(m._engine.membership.state for m in (c, other))  # type: ignore[union-attr]
        return states, frozenset(c.assignment()), frozenset(other.assignment())

    with anyio.fail_after(timeout):
        seen, since = snapshot(), time.monotonic()
        while True:
            states, mine, theirs = seen
            settled = (all(s is MemberState.STABLE for s in states) and mine and theirs
                       and len(mine) + len(theirs) == partitions)
            if settled and time.monotonic() - since >= quiet:
                return
            await c.getmany(timeout=0.05)
            now = snapshot()
            if now != seen:
                seen, since = now, time.monotonic()


@pytest.mark.parametrize(("strategy", "api"), [("range", "getmany"), ("cooperative-sticky", "getmany"),
                                               ("cooperative-sticky", "async for")])
async def test_members_come_and_go_every_record_exactly_once(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], strategy: str, api: str,
    kafka_backend: Any, group_protocol: str
) -> None:
    """Two members, then three, then two, then one, each change while records are still unread."""
    topic = new_topic(6)
    total = 6000
    produce(topic, ((i % 6, None, b"%d" % i) for i in range(total)))
    group = f"g-{topic}"
    # KIP-848: the broker assigns; its two assignors stand in for the client-side ones.
    protocol_options: dict[str, Any] = (
        {"group_protocol": "consumer", "group_remote_assignor": REMOTE_ASSIGNOR[strategy]}
        if group_protocol == "consumer" else {"partition_assignment_strategy": strategy}
    )
    seen: list[tuple[int, int]] = []
    seen_by: dict[str, set[int]] = {"a": set(), "b": set(), "c": set()}  # partitions each member read
    budget = [0]  # the members read up to this many records in the current phase, then wait
    stop = {"a": anyio.Event(), "b": anyio.Event(), "c": anyio.Event()}
    members: dict[str, Consumer[Any, Any]] = {}

    async def poll(c: Consumer[Any, Any], name: str) -> None:
        while True:
            for records in (await c.getmany(timeout=0.1)).values():
                seen.extend((r.partition, r.offset) for r in records)
                seen_by[name].add(records[0].partition)
            await anyio.sleep(0.01)

    async def iterate(c: Consumer[Any, Any], name: str) -> None:
        async for r in c:
            seen.append((r.partition, r.offset))
            seen_by[name].add(r.partition)
            if len(seen) % 7 == 0:
                await anyio.sleep(0.01)  # rebalances happen with records taken but not handed out

    async def run(name: str) -> None:
        async with member(bootstrap, group, max_poll_records=20, **protocol_options) as c:
            c.subscribe([topic])
            members[name] = c
            async with anyio.create_task_group() as tg:

                async def pace() -> None:  # hold at the phase's budget, still polling (callbacks run)
                    while True:
                        if len(seen) >= budget[0]:
                            c.pause(*c.assignment())
                        elif c.paused():
                            c.resume(*c.paused())
                        await anyio.sleep(0.02)

                async def stopper() -> None:
                    await stop[name].wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(pace)
                tg.start_soon(stopper)
                await (poll if api == "getmany" else iterate)(c, name)
            del members[name]

    async def settled(*names: str) -> None:
        """The group has these members, sharing all six partitions."""
        def shared() -> bool:
            held = [members[n].assignment() for n in names if n in members]
            return len(held) == len(names) and all(held) and sum(map(len, held)) == 6
        while not shared():  # noqa: ASYNC110 (the members' progress)
            await anyio.sleep(0.05)

    def leaving(*names: str) -> str:
        """Who leaves next: the leader where the broker elects a new one, else a follower."""
        def leads(n: str) -> bool:
            membership = members[n]._engine.membership  # type: ignore[union-attr]
            assert_protocol(members[n], group_protocol)
            return isinstance(membership, MembershipManager) and membership.leader_id == membership.member_id
        wanted = kafka_backend.supports("leader_handover")
        if group_protocol == "consumer":  # no leader: the coordinator assigns
            return names[0] if not any(leads(n) for n in names) else ""
        return next((n for n in names if leads(n) == wanted), names[0])

    async def read(count: int, *names: str) -> None:
        budget[0] = count
        while len(seen) < count or not all(seen_by[n] for n in names):  # noqa: ASYNC110 (members' progress)
            await anyio.sleep(0.05)

    with anyio.fail_after(100):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a")
            tg.start_soon(run, "b")
            await settled("a", "b")
            await read(1500, "a", "b")  # two members
            tg.start_soon(run, "c")
            await settled("a", "b", "c")
            await read(3000, "c")  # three
            first = leaving("a", "b", "c")
            stop[first].set()
            staying = [n for n in ("a", "b", "c") if n != first]
            await settled(*staying)
            await read(4500)  # two
            second = leaving(*staying)
            stop[second].set()
            await read(total)  # one finishes the topic
            for event in stop.values():
                event.set()
    counts = Counter(seen)
    assert len(counts) == total
    duplicates = {k: v for k, v in counts.items() if v > 1}
    assert not duplicates, f"{len(duplicates)} records were delivered twice"
    # Partitions changed hands mid-stream: c read partitions that a or b had read from before, and
    # the last member read partitions the others had.
    assert seen_by["c"] & (seen_by["a"] | seen_by["b"])
    last = next(n for n in ("a", "b", "c") if n not in (first, second))
    assert seen_by[last] & (seen_by[first] | seen_by[second])


@pytest.mark.parametrize("how", ["tasks", "direct", "gather"])
async def test_revoke_callback_tasks_commit_and_the_next_owner_starts_after(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], how: str, anyio_backend: str,
    group_protocol: str
) -> None:
    """KIP-957: the revoke callback commits itself, or from tasks it starts (an anyio task group,
    or asyncio.gather on asyncio); those calls complete before the partitions are given up."""
    if how == "gather" and anyio_backend != "asyncio":
        pytest.skip("asyncio.gather is asyncio's (trio's counterpart is the task group case)")
    topic = new_topic(3)
    produce(topic, ((i % 3, None, b"%d" % i) for i in range(3000)))
    group = f"g-{topic}"
    handed: dict[TopicPartition, int] = {}

    class CommitFromTasks(RebalanceListener):
        def __init__(self, consumer: Consumer[Any, Any]) -> None:
            self.consumer = consumer
            self.committed: list[TopicPartition] = []

        async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            async def commit_one(tp: TopicPartition) -> None:
                await self.consumer.commit({tp: handed[tp]})  # KIP-957: from a task the callback started
                self.committed.append(tp)

            mine = [tp for tp in revoked if tp in handed]
            if how == "direct":
                for tp in mine:
                    await commit_one(tp)
            elif how == "gather":
                import asyncio

                await asyncio.gather(*(commit_one(tp) for tp in mine))
            else:
                async with anyio.create_task_group() as tg:
                    for tp in mine:
                        tg.start_soon(commit_one, tp)

    async with member(bootstrap, group, group_protocol=group_protocol,
                      enable_auto_commit=False, rebalance_safe_commits=False) as c:
        listener = CommitFromTasks(c)
        c.subscribe([topic], listener=listener)
        got = 0
        with anyio.fail_after(30):
            while got < 150:
                for tp, records in (await c.getmany(timeout=1, max_records=50)).items():
                    handed[tp] = records[-1].offset + 1
                    got += len(records)
        assert_protocol(c, group_protocol)
        await c.unsubscribe()
        assert sorted(listener.committed) == sorted(handed)
    async with member(bootstrap, group, group_protocol=group_protocol) as c:
        c.subscribe([topic])
        firsts: dict[TopicPartition, int] = {}
        with anyio.fail_after(30):
            while len(firsts) < 3:
                for tp, records in (await c.getmany(timeout=1)).items():
                    firsts.setdefault(tp, records[0].offset)
    for tp in handed:
        assert firsts[tp] == handed[tp]


async def test_heartbeats_keep_a_member_that_does_not_poll(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    """Heartbeats come from the background loop: a member busy for longer than session_timeout_ms
    (but within max_poll_interval_ms) keeps its partitions without any rebalance."""
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")])
    listener = Recorder()
    async with member(bootstrap, f"g-{topic}", group_protocol=group_protocol,
                      session_timeout_ms=6000, max_poll_interval_ms=30_000) as c:
        c.subscribe([topic], listener=listener)
        await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        engine = c._engine
        assert engine is not None and engine.membership is not None
        generation, events = engine.membership.generation, list(listener.events)
        await anyio.sleep(8)  # busy, not polling, past the session timeout
        records = await c.getmany(timeout=10)
        assert [r.value for rs in records.values() for r in rs] == [b"x"]
        assert listener.events == events and engine.membership.generation == generation
        assert engine.membership.state is MemberState.STABLE


async def test_callback_that_raises_and_one_that_overruns_do_not_hang(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 10)

    class Raises(RebalanceListener):
        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            if assigned:  # (a first, empty target of the consumer protocol is reported too)
                raise RuntimeError("boom in the listener")

    async with member(bootstrap, f"g1-{topic}", group_protocol=group_protocol) as c:
        c.subscribe([topic], listener=Raises())
        with anyio.fail_after(20), pytest.raises(RebalanceCallbackError, match="boom in the listener"):
            while True:
                await c.getmany(timeout=0.2)
        records = await c.getmany(timeout=5)  # the group moved on: the partition is ours
        assert sum(len(r) for r in records.values()) == 10
        assert_protocol(c, group_protocol)

    class Sleeps(RebalanceListener):
        async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            if assigned:
                await anyio.sleep(60)

    async with member(bootstrap, f"g2-{topic}", group_protocol=group_protocol, rebalance_timeout_ms=1500) as c:
        c.subscribe([topic], listener=Sleeps())
        started = time.monotonic()
        with anyio.fail_after(20), pytest.raises(RebalanceCallbackError, match="did not finish"):
            while True:
                await c.getmany(timeout=0.2)
        assert time.monotonic() - started < 15
        records = await c.getmany(timeout=5)
        assert sum(len(r) for r in records.values()) == 10
        assert_protocol(c, group_protocol)


@pytest.mark.parametrize("misbehaves", ["raises", "overruns", "is cancelled"])
async def test_revoke_callback_that_misbehaves_still_commits_what_was_handed_out(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], misbehaves: str, group_protocol: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"%d" % i) for i in range(100)])
    tp = TopicPartition(topic, 0)

    class Misbehaves(RebalanceListener):
        async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            if misbehaves == "raises":
                raise RuntimeError("boom in on_partitions_revoked")
            await anyio.sleep(60)

    # No periodic auto-commit during the test: only the rebalance-safe commit can commit.
    async with member(bootstrap, f"g-{topic}", group_protocol=group_protocol,
                      rebalance_timeout_ms=3000, auto_commit_interval_ms=600_000) as c:
        c.subscribe([topic], listener=Misbehaves())
        await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        handed = (await c.getmany(timeout=10, max_records=30))[tp]
        started = time.monotonic()
        if misbehaves == "is cancelled":  # the caller gives up on the call the callback runs in
            with anyio.move_on_after(0.5):
                await c.unsubscribe()
        else:
            await c.unsubscribe()  # revokes: the callback misbehaves
        assert time.monotonic() - started < 10
        assert await c.committed(tp) == handed[-1].offset + 1


async def test_manual_commits_from_a_worker_land_before_the_partition_moves(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    """With manual commits, a revocation waits (rebalance_commit_wait_ms) for the application's
    commits of what it was handed, so the next owner starts right after them."""
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(400)])
    group = f"g-{topic}"
    async with member(bootstrap, group, group_protocol=group_protocol, enable_auto_commit=False) as a:
        a.subscribe([topic])
        await wait_for_assignment(a)
        assert_protocol(a, group_protocol)
        handed = await a.getmany(timeout=10, max_records=60)
        assert handed
        done = {tp: records[-1].offset + 1 for tp, records in handed.items()}

        async def worker() -> None:  # slow processing in another task, then a manual commit
            await anyio.sleep(2)
            await a.commit(done)

        firsts: dict[TopicPartition, int] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with member(bootstrap, group, group_protocol=group_protocol) as b:
                b.subscribe([topic])
                with anyio.fail_after(40):
                    while not firsts:
                        a.pause(*a.assignment())  # a reads no further: what it has is in the worker
                        await a.getmany(timeout=0.1)  # the revocation runs (and waits) in here
                        for tp, records in (await b.getmany(timeout=0.1)).items():
                            firsts.setdefault(tp, records[0].offset)
    moved = set(firsts)
    assert moved and moved <= set(done) | set(firsts)
    for tp in moved:
        assert firsts[tp] == done.get(tp, 0), f"{tp}: the next owner started at {firsts[tp]}, not after the commit"


async def test_manual_commits_a_partition_handed_nothing_moves_without_waiting(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    """The revocation waits for commits of what was handed out; a partition the application was
    handed nothing from (an empty topic: the position came from a reset, no commit names it) has
    nothing to wait for, so neither the next owner nor ``close()`` waits out
    rebalance_commit_wait_ms."""
    topic = new_topic(2)
    group = f"g-{topic}"
    wait_ms = 60_000
    async with member(bootstrap, group, group_protocol=group_protocol, enable_auto_commit=False,
                      rebalance_commit_wait_ms=wait_ms) as a:
        a.subscribe([topic])
        for tp in await wait_for_assignment(a):
            assert await a.position(tp, timeout=10) == 0
        async with member(bootstrap, group, group_protocol=group_protocol) as b:
            b.subscribe([topic])
            started = time.monotonic()
            with anyio.fail_after(wait_ms / 2000):
                while not b.assignment():
                    assert await a.getmany(timeout=0.1) == {}  # the revocation runs in here
                    assert await b.getmany(timeout=0.1) == {}
            moved = time.monotonic() - started
            assert a.assignment(), "each member owns one of the two partitions"
            started = time.monotonic()
            await a.close()
            closed = time.monotonic() - started
    assert moved < wait_ms / 2000 and closed < wait_ms / 2000, (moved, closed)


async def test_commit_after_losing_partitions_names_them(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"x") for p in (0, 1)])
    group = f"g-{topic}"
    async with member(bootstrap, group, group_protocol=group_protocol,
                      max_poll_interval_ms=1500, enable_auto_commit=False) as c:
        c.subscribe([topic])
        await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        with pytest.raises(CommitFailedError, match=re.escape(str(TopicPartition(topic, 7)))):
            await c.commit({TopicPartition(topic, 7): 1})  # never owned
        handed = await c.getmany(timeout=10)
        assert handed
        await anyio.sleep(2.5)  # "processing" past max_poll_interval_ms: the member drops out
        tp = next(iter(handed))
        with pytest.raises(CommitFailedError, match=re.escape(str(tp))):
            await c.commit({tp: handed[tp][-1].offset + 1})
        with pytest.raises(CommitFailedError, match="dropped out"):
            await c.commit()
        with pytest.raises(PollIntervalExceededError):
            await c.getmany(timeout=1)
    async with member(bootstrap, group, group_protocol=group_protocol) as c:
        assert await c.committed(tp) is None  # nothing of it was committed


async def test_regex_subscription_picks_up_a_topic_created_later(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    prefix = f"rx{time.monotonic_ns()}"
    first = new_topic(1, name=f"{prefix}-a")
    produce(first, [(0, None, b"a")])
    async with member(bootstrap, f"g-{prefix}", group_protocol=group_protocol, metadata_max_age_ms=300) as c:
        c.subscribe(pattern=rf"{prefix}-.*")
        values: set[bytes] = set()
        with anyio.fail_after(40):
            while b"a" not in values:
                values |= {r.value for rs in (await c.getmany(timeout=0.5)).values() for r in rs}
            assert_protocol(c, group_protocol)
            if group_protocol == "consumer":  # KIP-848 v1: the coordinator resolves the regex itself
                membership = c._engine.membership  # type: ignore[union-attr]
                assert isinstance(membership, ConsumerMembershipManager) and membership.broker_regex
            later = await anyio.to_thread.run_sync(lambda: new_topic(1, name=f"{prefix}-b"))
            produce(later, [(0, None, b"b")])
            while b"b" not in values:
                values |= {r.value for rs in (await c.getmany(timeout=0.5)).values() for r in rs}
        assert c.subscription() == {first, later}


async def test_not_polling_past_max_poll_interval_leaves_then_rejoins(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"%d" % i) for i in range(5)])
    listener = Recorder()
    async with member(bootstrap, f"g-{topic}", group_protocol=group_protocol,
                      max_poll_interval_ms=1500, enable_auto_commit=False) as c:
        c.subscribe([topic], listener=listener)
        await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        await anyio.sleep(2.5)  # "processing" without polling
        with pytest.raises(PollIntervalExceededError, match="max_poll_interval_ms"):
            await c.getmany(timeout=1)
        assert ("revoked", frozenset({TopicPartition(topic, 0)})) in listener.events  # lost → revoked (default)
        assigned = await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        assert assigned == {TopicPartition(topic, 0)}


@pytest.mark.parametrize("api", ["getmany", "async for"])
async def test_waiting_inside_a_poll_is_polling(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], api: str, group_protocol: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"first")])
    listener = Recorder()
    async with member(bootstrap, f"g-{topic}", group_protocol=group_protocol, max_poll_interval_ms=1500) as c:
        c.subscribe([topic], listener=listener)
        await wait_for_assignment(c)
        assert_protocol(c, group_protocol)
        events = list(listener.events)
        # Blocked in the consumer, waiting for records, for longer than max_poll_interval_ms.
        if api == "getmany":
            assert [r.value for rs in (await c.getmany(timeout=10)).values() for r in rs] == [b"first"]
            assert await c.getmany(timeout=3) == {}
        else:
            with anyio.move_on_after(3):
                async for record in c:
                    assert record.value == b"first"
        assert await c.getmany(timeout=0.2) == {}  # no PollIntervalExceededError
        assert listener.events == events  # kept its partition all along
        assert c.assignment() == {TopicPartition(topic, 0)}


async def test_static_member_restart_keeps_its_partitions(
    bootstrap: str, new_topic: Callable[..., str], kafka_backend: Any, group_protocol: str
) -> None:
    if not kafka_backend.supports("static_rejoin_without_rebalance"):
        # Tansu rebalances on the rejoin at generation 0 and can then leave a member waiting for ever
        # (seen under load in CI): KIP-345 is Apache Kafka's to show.
        pytest.skip("Tansu lacks KIP-345 static rejoin (static_rejoin_without_rebalance)")
    topic = new_topic(4)
    group = f"g-{topic}"
    other_listener = Recorder()
    async with member(bootstrap, group, group_protocol=group_protocol, group_instance_id="worker-2") as other:
        async with anyio.create_task_group() as tg:

            async def keep_polling() -> None:  # as a real worker does: its callbacks run
                while True:
                    await other.getmany(timeout=0.05)

            async with member(bootstrap, group, group_protocol=group_protocol, group_instance_id="worker-1") as c:
                # Both join in one round (a second round would be a rebalance of its own); worker-1
                # first, so that with the classic protocol it is likely the leader.
                c.subscribe([topic])
                other.subscribe([topic], listener=other_listener)
                tg.start_soon(keep_polling)
                # Both hold partitions (KIP-848: one first gets all four, then gives two up), both
                # stable, and for a second (three heartbeats) nothing moved: a restarted static member
                # gets its predecessor's target assignment, which may differ from what it holds while
                # the group still settles (seen under load in CI).
                await wait_until_settled(c, other, partitions=4, quiet=1.0)
                before = c.assignment()
                events_before = list(other_listener.events)
            # worker-1 is gone but within session_timeout_ms: it left no LeaveGroup (static), so its
            # partitions wait for it and the other member is not rebalanced.
            # Frequent metadata: a static leader back with SkipAssignment (KIP-814) must not take the
            # first metadata refresh for a partition count change and rebalance the group.
            async with member(bootstrap, group, group_protocol=group_protocol, group_instance_id="worker-1",
                              metadata_max_age_ms=200) as c:
                c.subscribe([topic])
                after = await wait_for_assignment(c, timeout=30)
                assert_protocol(c, group_protocol)
                transitions = c._engine.membership.transitions  # type: ignore[union-attr]
                settled = len(transitions)
                await anyio.sleep(1.5)  # a rebalance of the other member would show meanwhile
                # ... and one of its own (not polling, it would stay in the revocation).
                moved_on = transitions[settled:]
            tg.cancel_scope.cancel()
        events_after = list(other_listener.events)  # before its own close revokes its partitions
    assert after == before
    assert events_after == events_before, "the other member saw a rebalance"
    assert moved_on == [], "the member that came back started a rebalance"


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
async def test_mixed_group_with_librdkafka_member(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], strategy: str, group_protocol: str
) -> None:
    """librdkafka reads alone, then asyncconsumer joins: partitions move mid-stream, each side
    starts where the other committed, and nothing committed is read twice.

    librdkafka's commit of a record can fail while the group rebalances (REBALANCE_IN_PROGRESS,
    ILLEGAL_GENERATION): such a record was delivered but not committed, so its next owner reads it
    again, which is at-least-once working as designed. Only records whose commit succeeded count
    towards "read twice". The second half of the data is produced once asyncconsumer holds
    partitions, so both members have records to read however fast the join is.
    """
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import KafkaException

    # librdkafka speaks the same protocol as we do: with KIP-848 the broker assigns (both members
    # name the same remote assignor), with the classic one the leader's assignor does.
    rd_options: dict[str, Any]
    options: dict[str, Any]
    if group_protocol == "consumer":
        rd_options = {"group.protocol": "consumer", "group.remote.assignor": REMOTE_ASSIGNOR[strategy]}
        options = {"group_protocol": "consumer", "group_remote_assignor": REMOTE_ASSIGNOR[strategy]}
    else:
        rd_options = {"partition.assignment.strategy": strategy, "session.timeout.ms": 6000}
        options = {"partition_assignment_strategy": [strategy]}

    topic = new_topic(4)
    total = 2000
    half = total // 2
    produce(topic, ((i % 4, None, b"%d" % i) for i in range(half)))
    group = f"g-{topic}"
    theirs: list[tuple[int, int]] = []  # delivered to librdkafka and committed
    theirs_uncommitted: list[tuple[int, int]] = []  # delivered, but the commit failed in a rebalance
    done = threading.Event()

    def librdkafka_member() -> None:
        rd = RdConsumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "log_level": 3, **rd_options})
        rd.subscribe([topic])
        try:
            while not done.is_set():
                message = rd.poll(0.1)
                if message is None or message.error() is not None:
                    continue
                try:
                    rd.commit(message=message, asynchronous=False)
                except KafkaException:
                    theirs_uncommitted.append((message.partition(), message.offset()))
                else:
                    theirs.append((message.partition(), message.offset()))
                time.sleep(0.004)  # slow enough that partitions move while records are unread
        finally:
            rd.close()

    def read() -> set[tuple[int, int]]:
        return set(ours) | set(theirs) | set(theirs_uncommitted)

    ours: list[tuple[int, int]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, librdkafka_member)
        with anyio.fail_after(90):
            while len({p for p, _ in theirs}) < 4:  # noqa: ASYNC110 (the librdkafka thread's progress)
                await anyio.sleep(0.05)  # it reads all four partitions alone first
            async with member(bootstrap, group, **options) as c:
                c.subscribe([topic])
                second_half_sent = False
                while len(read()) < total:
                    for records in (await c.getmany(timeout=0.2)).values():
                        ours.extend((r.partition, r.offset) for r in records)
                    await c.commit()
                    if c.assignment() and not second_half_sent:
                        assert_protocol(c, group_protocol)
                        second_half_sent = True
                        await anyio.to_thread.run_sync(
                            produce, topic, [(i % 4, None, b"%d" % i) for i in range(half, total)]
                        )
                committed = await c.committed({TopicPartition(topic, p) for p in range(4)})
        done.set()
    assert ours and theirs, "both members got partitions"
    counts = Counter(ours + theirs)
    assert len(read()) == total and max(counts.values()) == 1, "a committed record was read twice"
    for p in {p for p, _ in ours}:  # moved from librdkafka: we started right after its last commit
        last_commit = max((o for q, o in theirs if q == p), default=-1)
        assert min(o for q, o in ours if q == p) == last_commit + 1
    # Each side sees the other's commits: every partition's committed offset is its end.
    assert all(om is not None and om.offset == total // 4 for om in committed.values())


async def test_partition_streams_slow_partition_does_not_stall_others(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"%d" % i) for p in (0, 1) for i in range(300)])
    done: dict[int, list[int]] = {0: [], 1: []}
    fast_done = anyio.Event()
    slow_when_fast_done: list[int] = []

    async def work(tp: TopicPartition, stream: Any) -> None:
        async for record in stream:
            done[tp.partition].append(record.offset)
            if tp.partition == 0:
                await anyio.sleep(0.01)  # the slow partition
            elif len(done[1]) == 300:
                slow_when_fast_done.append(len(done[0]))
                fast_done.set()

    async with member(bootstrap, f"g-{topic}", max_poll_records=50) as c:
        c.subscribe([topic])

        async def drive() -> None:
            async for tp, stream in c.partitions(buffer_records=20):
                tg.start_soon(work, tp, stream)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                await fast_done.wait()
                tg.cancel_scope.cancel()
    assert done[1] == list(range(300))
    assert slow_when_fast_done[0] < 300  # the slow partition was still behind: it did not hold the other back
    assert done[0] == list(range(len(done[0])))  # in order, nothing skipped


async def test_partition_stream_of_a_revoked_partition_ends_after_its_records_are_committed(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    topic = new_topic(2)
    total = 2000
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(total)])
    group = f"g-{topic}"
    seen: list[tuple[int, int]] = []
    streamed: list[tuple[int, int]] = []
    ended: list[int] = []

    async def work(tp: TopicPartition, stream: Any) -> None:
        async for record in stream:
            await anyio.sleep(0.005)  # processing: ~5 s per partition, so the handover is mid-stream
            seen.append((record.partition, record.offset))
            streamed.append((record.partition, record.offset))
        ended.append(tp.partition)

    async def streaming_member(stop: anyio.Event) -> None:
        async with member(bootstrap, group, group_protocol=group_protocol, max_poll_records=20) as c:
            c.subscribe([topic])
            async with anyio.create_task_group() as tg:
                async def drive() -> None:
                    async for tp, stream in c.partitions(buffer_records=10):
                        assert_protocol(c, group_protocol)
                        tg.start_soon(work, tp, stream)

                tg.start_soon(drive)
                await stop.wait()
                tg.cancel_scope.cancel()

    async def plain_member(stop: anyio.Event) -> None:
        async with member(bootstrap, group, group_protocol=group_protocol) as c:
            c.subscribe([topic])
            while not stop.is_set():
                for records in (await c.getmany(timeout=0.1)).values():
                    seen.extend((r.partition, r.offset) for r in records)

    stop = anyio.Event()
    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(streaming_member, stop)
            while len(streamed) < 50:  # noqa: ASYNC110 (waiting on the member's progress)
                await anyio.sleep(0.05)
            tg.start_soon(plain_member, stop)  # a rebalance: one partition moves to the plain member
            while not ended or len(set(seen)) < total:  # noqa: ASYNC110 (waiting on the members' progress)
                await anyio.sleep(0.1)
            stop.set()
    assert ended, "the revoked partition's stream ended"
    counts = Counter(seen)
    assert len(counts) == total and max(counts.values()) == 1  # exactly once across the handover
    by_plain = set(seen) - set(streamed)
    [moved] = {p for p, _ in by_plain}  # the partition that moved to the plain member
    by_stream = [o for p, o in streamed if p == moved]
    assert by_stream, "the partition moved while it still had records to read"
    # The next owner started right after the last record the stream's reader processed.
    assert min(o for p, o in by_plain if p == moved) == max(by_stream) + 1


async def test_group_protocol_consumer_falls_back_to_classic_where_kip848_is_missing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], kafka_backend: Any
) -> None:
    if kafka_backend.supports("kip848"):
        pytest.skip("this broker supports KIP-848: no fallback to test")
    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 3)
    async with member(bootstrap, f"g-{topic}", group_protocol="consumer") as c:
        c.subscribe([topic])
        got: list[Any] = []
        with anyio.fail_after(30):
            while len(got) < 3:
                try:
                    got += [r for rs in (await c.getmany(timeout=0.5)).values() for r in rs]
                except Exception as exc:  # the one-time notice that KIP-848 is unavailable
                    assert "KIP-848" in str(exc) or "group_protocol" in str(exc)
        from asyncconsumer.managers.membership import MembershipManager

        assert isinstance(c._engine.membership, MembershipManager)
