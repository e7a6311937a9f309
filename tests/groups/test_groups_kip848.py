"""KIP-848 (``group_protocol="consumer"``) on Apache Kafka: what only that protocol has.

The behaviour both protocols share (joins, leaves, callbacks, commits, static members, regexes,
librdkafka in the group) is tested in test_groups.py with its ``group_protocol`` dimension; here:
what the broker says the group is, the member id of the client's own (KIP-1082), and fencing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.consumers import LostRecorder

from asyncconsumer import CommitFailedError, Consumer, TopicPartition
from asyncconsumer.managers.consumer_membership import ConsumerMembershipManager
from asyncconsumer.managers.membership import MemberState
from groups.test_groups import member, wait_for_assignment

pytestmark = [pytest.mark.anyio, pytest.mark.broker_feature("kip848")]


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too; Tansu has no KIP-848)."""
    return str(apache_kafka.bootstrap)

confluent_admin = pytest.importorskip("confluent_kafka.admin")


def membership(c: Consumer[Any, Any]) -> ConsumerMembershipManager:
    engine = c._engine
    assert engine is not None and isinstance(engine.membership, ConsumerMembershipManager)
    return engine.membership


def admin(bootstrap: str) -> Any:
    return confluent_admin.AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def set_group_config(bootstrap: str, group: str, **configs: str) -> None:
    """Per-group settings (KIP-848 group configs), e.g. a short ``consumer.session.timeout.ms``."""
    entries = [confluent_admin.ConfigEntry(name.replace("_", "."), value,
                                           incremental_operation=confluent_admin.AlterConfigOpType.SET)
               for name, value in configs.items()]
    resource = confluent_admin.ConfigResource(confluent_admin.ResourceType.GROUP, group,
                                              incremental_configs=entries)
    client = admin(bootstrap)  # kept alive until the answers are in (a dropped client cancels them)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=20)


def describe(bootstrap: str, group: str) -> Any:
    client = admin(bootstrap)
    [future] = client.describe_consumer_groups([group]).values()
    return future.result(timeout=20)


async def test_the_broker_sees_a_consumer_group_of_our_members(
    apache_kafka: Any, new_topic: Callable[..., str]
) -> None:
    """No fallback to classic: the coordinator describes the group as a KIP-848 ``consumer``
    group whose members are ours, under the ids they made for themselves (KIP-1082, v1)."""
    bootstrap = apache_kafka.bootstrap
    topic = new_topic(4)
    group = f"g-{topic}"
    async with member(bootstrap, group, group_protocol="consumer", group_remote_assignor="range") as a, \
            member(bootstrap, group, group_protocol="consumer", group_remote_assignor="range") as b:
        a.subscribe([topic])
        b.subscribe([topic])
        with anyio.fail_after(30):
            while len(a.assignment()) + len(b.assignment()) != 4 or not (a.assignment() and b.assignment()):
                await a.getmany(timeout=0.05)
                await b.getmany(timeout=0.05)
        description = await anyio.to_thread.run_sync(describe, bootstrap, group)
        ma, mb = membership(a), membership(b)
        assert str(description.type).endswith("CONSUMER")
        assert description.partition_assignor == "range"
        assert ma.version == mb.version == 1
        assert ma.member_id == ma.client_member_id and mb.member_id == mb.client_member_id
        members = {m.member_id: m for m in description.members}
        assert set(members) == {ma.member_id, mb.member_id}
        for c, m in ((a, members[ma.member_id]), (b, members[mb.member_id])):
            assert {TopicPartition(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} == c.assignment()


async def test_a_missed_session_fences_the_member_which_loses_its_partitions_and_rejoins(
    apache_kafka: Any, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """The member misses its session (the whole event loop blocked past the group's
    consumer.session.timeout.ms): the coordinator removes it, its next heartbeat is fenced
    (UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH), its partitions are lost (on_partitions_lost, no
    rebalance-safe commit, an explicit commit fails), and it rejoins with epoch 0 under the same
    member id, getting its partition back."""
    bootstrap = apache_kafka.bootstrap
    topic = new_topic(1)
    tp = TopicPartition(topic, 0)
    produce(topic, [(0, None, b"%d" % i) for i in range(20)])
    group = f"g-{topic}"
    await anyio.to_thread.run_sync(lambda: set_group_config(bootstrap, group, consumer_session_timeout_ms="2000"))
    listener = LostRecorder()
    # Auto-commit on, but its timer never fires in the test: only a (wrong) rebalance commit could commit.
    async with member(bootstrap, group, group_protocol="consumer", auto_commit_interval_ms=600_000) as c:
        c.subscribe([topic], listener=listener)
        await wait_for_assignment(c)
        m = membership(c)
        epoch, member_id = m.generation, m.member_id
        assert epoch >= 1 and member_id == m.client_member_id
        handed = (await c.getmany(timeout=10, max_records=5))[tp]
        time.sleep(3.5)  # noqa: ASYNC251 (on purpose: no heartbeat can go out, the session expires)
        got: list[Any] = []

        async def poll() -> None:  # keeps what it reads once the partition was lost (and is back)
            records = (await c.getmany(timeout=0.2)).get(tp, [])
            if any(kind == "lost" for kind, _ in listener.events):
                got.extend(records)

        with anyio.fail_after(20), pytest.raises(CommitFailedError):
            while True:  # until the fencing shows: the commit fails (no commit with the stale epoch)
                await c.commit({tp: handed[-1].offset + 1})
                await poll()
        with anyio.fail_after(20):
            while listener.events[-1] != ("assigned", frozenset({tp})) or not got:
                await poll()
        # (an empty first target, after the join or the rejoin, which a loaded coordinator may send,
        # is reported too: leave those out before the first assignment is)
        events = [e for e in listener.events if e != ("assigned", frozenset())]
        assert events == [("assigned", frozenset({tp})), ("lost", frozenset({tp})), ("assigned", frozenset({tp}))]
        assert (MemberState.LOST, MemberState.REVOKING_PARTITIONS) in m.transitions
        assert m.member_id == member_id and m.generation > epoch  # rejoined: the same id, a new epoch
        assert await c.committed(tp) is None  # nothing was committed for the lost partition ...
        assert got[0].offset == 0  # ... so it is read again from the start
        # Back in the group, commits work again (with the new epoch).
        await c.commit({tp: got[-1].offset + 1})
        assert await c.committed(tp) == got[-1].offset + 1


async def test_a_classic_member_joins_a_consumer_group(
    apache_kafka: Any, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Apache Kafka lets a classic-protocol member (JoinGroup/SyncGroup) join a KIP-848 group: the
    coordinator assigns for it too.  Ours of each kind share the partitions, every record is read
    once (rebalance-safe commits on both sides), and the group stays a consumer group."""
    bootstrap = apache_kafka.bootstrap
    topic = new_topic(4)
    total = 800
    produce(topic, ((i % 4, None, b"%d" % i) for i in range(total // 2)))
    group = f"g-{topic}"
    seen: list[tuple[int, int]] = []
    by: dict[str, set[int]] = {"consumer": set(), "classic": set()}

    async def read(c: Consumer[Any, Any], name: str) -> None:
        for records in (await c.getmany(timeout=0.1, max_records=20)).values():
            seen.extend((r.partition, r.offset) for r in records)
            by[name].add(records[0].partition)

    with anyio.fail_after(60):
        async with member(bootstrap, group, group_protocol="consumer") as new:
            new.subscribe([topic])
            while len(seen) < 100:
                await read(new, "consumer")
            async with member(bootstrap, group, group_protocol="classic") as old:
                old.subscribe([topic])
                while not (old.assignment() and new.assignment()):
                    await read(new, "consumer")
                    await read(old, "classic")
                    await anyio.sleep(0.01)
                description = await anyio.to_thread.run_sync(describe, bootstrap, group)
                assert str(description.type).endswith("CONSUMER")
                assert len(description.members) == 2
                assert old.assignment().isdisjoint(new.assignment())
                await anyio.to_thread.run_sync(
                    produce, topic, [(i % 4, None, b"%d" % i) for i in range(total // 2, total)]
                )
                while len(set(seen)) < total:
                    await read(new, "consumer")
                    await read(old, "classic")
    counts = Counter(seen)
    assert len(counts) == total and max(counts.values()) == 1
    assert by["consumer"] and by["classic"]


async def test_a_regex_the_broker_cannot_take_is_matched_in_the_client(
    apache_kafka: Any, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """A lookahead is Python's, not RE2/J's: the coordinator answers INVALID_REGULAR_EXPRESSION,
    and the member matches the pattern itself and subscribes by name, without an error."""
    bootstrap = apache_kafka.bootstrap
    prefix = f"rxl{time.monotonic_ns()}"
    wanted = new_topic(1, name=f"{prefix}-a")
    skipped = new_topic(1, name=f"{prefix}-skip")
    produce(wanted, [(0, None, b"a")])
    produce(skipped, [(0, None, b"skip")])
    async with member(bootstrap, f"g-{prefix}", group_protocol="consumer") as c:
        c.subscribe(pattern=rf"{prefix}-(?!skip).*")
        values: list[bytes] = []
        with anyio.fail_after(30):
            while not values:
                values += [r.value for rs in (await c.getmany(timeout=0.5)).values() for r in rs]
        m = membership(c)
        assert m.generation >= 1 and not m.broker_regex
        assert values == [b"a"] and c.subscription() == {wanted} and c.assignment() == {TopicPartition(wanted, 0)}
