"""Multi-broker failover (issue 13) on a three-node Apache Kafka cluster.

One cluster for the module (nodes 1, 2, 3 in racks a, b, c; replication factor 3,
``min.insync.replicas=2``).  Each scenario consumes through a group while brokers are killed,
stopped and restarted, and checks that every record produced (confluent-kafka, ``acks=all``,
idempotent, so the producer itself adds no duplicates) is read exactly once: the same
(partition, offset, value) triples the producer was told about, none missing, none twice.  A test
leaves the cluster whole: every node running and every partition with all its replicas in sync.
The truncation test (7) assigns its partition instead of joining a group: for a moment two of the
three controller voters are down there.  The last test (8) uses the racks: a mixed group with a
Java member, rack-aware ``range`` (no failover).
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import time
import uuid
from collections.abc import Iterator

import anyio
import pytest
from support.cluster import (
    Background,
    Reader,
    coordinator,
    drain,
    exactly_once,
    group_consumer,
    heal,
    leaders,
    moved_off,
    new_topic,
    on_thread,
    unread,
    until,
    wait_in_sync,
)
from support.consumers import FAST
from support.producer import produce
from support.rack_group import check_rack_aligned_group

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.errors import LogTruncationError
from asyncconsumer.testing import KafkaCluster

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.timeout(300)]

RACKS = ("a", "b", "c")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the scenarios are about the brokers, not the event loop: one backend


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster(3, racks=RACKS) as kafka:
        yield kafka


@pytest.fixture
def whole(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The cluster, made whole again after the test (every node up, every replica in sync)."""
    yield cluster
    heal(cluster)


# -- 1. the leader killed mid-fetch --------------------------------------------------------------


async def test_the_leader_of_the_partitions_being_read_is_killed_mid_fetch_and_later_restarted(
    whole: KafkaCluster,
) -> None:
    cluster = whole
    topic = new_topic(cluster, 3)
    victim = cluster.node(leaders(cluster, topic)[0])
    led = [p for p, leader in leaders(cluster, topic).items() if leader == victim.node_id]
    producer = Background(cluster, topic).start()
    async with group_consumer(cluster.bootstrap, f"g-{topic}") as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            await until(lambda: len(reader.seen) > 500, 30, "records before the kill")
            await on_thread(victim.kill)
            # Records fetched before the kill may still arrive after it (from the fetch buffer), so
            # "moved" is judged by the metadata, and "flowing again" by records written after that:
            # those can only have come from the new leaders.
            await on_thread(moved_off, cluster, topic, victim.node_id, led)
            moved_at = time.monotonic()
            await until(lambda: any(r[0] in led for r in set(producer.delivered_after(moved_at)) & set(reader.seen)),
                        30, "records from the moved partitions")
            await on_thread(victim.restart)
            await on_thread(wait_in_sync, cluster)
            await drain(producer, reader)
            tg.cancel_scope.cancel()
    exactly_once(producer, reader.seen)


# -- 2. the group coordinator killed -------------------------------------------------------------


async def test_the_group_coordinator_is_killed_commits_are_retried_and_the_rebalance_safe_commit_holds(
    whole: KafkaCluster,
) -> None:
    """Commits go on throughout (every 50 records, and auto-commit); the coordinator's broker dies;
    the member finds the new coordinator, its commits in flight are retried there and none fails.
    Then a second member joins: the first hands over its partitions committed (rebalance-safe
    commits), and the two together read every record exactly once."""
    cluster = whole
    topic = new_topic(cluster, 4)
    group = f"g-{topic}"
    producer = Background(cluster, topic).start()
    async with group_consumer(cluster.bootstrap, group) as a:
        a.subscribe([topic])
        first = Reader(a, commit_every=50)
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.run)
            await until(lambda: len(first.seen) > 400, 30, "records before the kill")
            victim = cluster.node(await on_thread(coordinator, cluster, group))
            await on_thread(victim.kill)
            killed_at = time.monotonic()
            await until(lambda: first.arrived_after(killed_at) > 800, 40, "records after the kill")
            assert await on_thread(coordinator, cluster, group) != victim.node_id
            async with group_consumer(cluster.bootstrap, group) as b:
                b.subscribe([topic])
                second = Reader(b, commit_every=50)
                tg.start_soon(second.run)
                await until(lambda: len(second.seen) > 100 and len(a.assignment()) == 2, 40,
                            "the second member's records")
                await on_thread(victim.restart)
                await drain(producer, first, second)
                tg.cancel_scope.cancel()
    exactly_once(producer, first.seen, second.seen)


# -- 3. a rolling restart ------------------------------------------------------------------------


# Three controlled restarts of a JVM broker, each waited in sync: 110 s alone, and over 300 s once in a
# loaded local CI run (2 cores, a Spark test on the other worker) with every phase inside its own
# deadline.  The phases' deadlines catch a stall; this one only bounds the whole.
@pytest.mark.long  # 3.5 minutes, more under load: ./dev nox -s long
@pytest.mark.timeout(600)
async def test_a_rolling_restart_of_all_three_brokers_while_a_group_consumes_and_commits(
    whole: KafkaCluster,
) -> None:
    cluster = whole
    topic = new_topic(cluster, 3)
    group = f"g-{topic}"
    producer = Background(cluster, topic).start()
    async with group_consumer(cluster.bootstrap, group) as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            for node in cluster.nodes:
                await until(lambda: len(reader.seen) > 200, 30, "records")
                before = len(reader.seen)
                await on_thread(node.restart)  # a controlled shutdown, then started again
                await on_thread(wait_in_sync, cluster)
                await until(lambda b=before: len(reader.seen) > b + 200, 30, f"records after restarting {node}")
            await drain(producer, reader)
            tg.cancel_scope.cancel()
        await c.commit()
        committed = await c.committed(c.assignment())
    exactly_once(producer, reader.seen)
    ends: dict[int, int] = {}
    for partition, offset, _ in reader.seen:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert {tp.partition: om.offset if om else None for tp, om in committed.items()} == ends


# -- 4. a controlled shutdown --------------------------------------------------------------------


async def test_a_controlled_shutdown_moves_leadership_before_the_broker_stops_and_reading_goes_on(
    whole: KafkaCluster,
) -> None:
    cluster = whole
    topic = new_topic(cluster, 3)
    victim = cluster.node(leaders(cluster, topic)[0])
    led = [p for p, leader in leaders(cluster, topic).items() if leader == victim.node_id]
    producer = Background(cluster, topic).start()
    async with group_consumer(cluster.bootstrap, f"g-{topic}") as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            await until(lambda: len(reader.seen) > 300, 30, "records before the shutdown")
            await on_thread(victim.stop)
            stopped_at = time.monotonic()
            moved = leaders(cluster, topic)
            assert all(moved[p] not in (victim.node_id, -1) for p in led), moved
            await until(lambda: any(t > stopped_at for (p, _, _), t in zip(reader.seen, reader.arrivals, strict=True)
                                    if p in led), 20, "records from the moved partitions")
            await on_thread(victim.restart)
            await on_thread(wait_in_sync, cluster)
            await drain(producer, reader)
            tg.cancel_scope.cancel()
    exactly_once(producer, reader.seen)


# -- 5. bootstrap servers down -------------------------------------------------------------------


@pytest.mark.long  # 3 minutes: ./dev nox -s long
async def test_a_bootstrap_server_down_at_start_then_every_broker_down_for_20_s_and_back(
    whole: KafkaCluster, caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = whole
    topic = new_topic(cluster, 3)
    first = cluster.node(1)
    await on_thread(first.kill)
    bootstrap = ",".join(n.bootstrap for n in cluster.nodes)  # the dead one first
    producer = Background(cluster, topic).start()
    # A commit gets one request timeout (not default_api_timeout_ms' minute), so commits in flight
    # while every broker is down time out: a typed error, and the next one covers them.
    async with group_consumer(bootstrap, f"g-{topic}", default_api_timeout_ms=FAST["request_timeout_ms"]) as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100, tolerate_timeouts=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            await until(lambda: len(reader.seen) > 300, 30, "records with a bootstrap server down")
            await on_thread(heal, cluster)
            with caplog.at_level(logging.WARNING, logger="asyncconsumer"):
                for node in cluster.nodes:
                    await on_thread(node.kill)
                down_at = time.monotonic()
                timeout = c.config.request_timeout_ms / 1000
                await until(lambda: any(r.levelno >= logging.WARNING and "unreachable" in r.getMessage()
                                        for r in caplog.records), timeout, "a warning naming the broker")
                said = time.monotonic() - down_at
                await anyio.sleep(20 - said)
                before = len(reader.seen)
                for node in cluster.nodes:
                    await on_thread(node.launch)
                await on_thread(cluster.wait_ready)
                await until(lambda: len(reader.seen) > before + 200, 60, "records after the cluster came back")
            await on_thread(wait_in_sync, cluster)
            await drain(producer, reader)
            tg.cancel_scope.cancel()
    exactly_once(producer, reader.seen)


# -- 6. fetching from a follower (KIP-392) -------------------------------------------------------


async def test_fetches_go_to_the_follower_in_the_consumers_rack_and_back_to_the_leader_when_it_fails(
    whole: KafkaCluster,
) -> None:
    """One partition; the consumer is in the rack of one of its followers.  The leader names that
    follower as the preferred read replica, and the follower serves the fetches.  The follower
    killed: the leader serves them again, nothing lost; the follower back: the leader names it again."""
    cluster = whole
    topic = new_topic(cluster, 1)
    leader = leaders(cluster, topic)[0]
    follower, other = (n.node_id for n in cluster.nodes if n.node_id != leader)
    producer = Background(cluster, topic).start()
    async with group_consumer(cluster.bootstrap, f"g-{topic}", client_rack=RACKS[follower - 1]) as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            await until(lambda: len(reader.seen) > 400, 30, "records")
            # Once the leader has named the follower (its first answers), the follower serves.
            # (Counted in answers, not records: under load one answer can carry a second's records.)
            start = dict(c.metrics().fetch_responses_by_node)
            await until(lambda: c.metrics().fetch_responses_by_node.get(follower, 0) - start.get(follower, 0) >= 5,
                        30, lambda: f"5 answers from the follower ({start} -> {c.metrics().fetch_responses_by_node})")
            served = c.metrics().fetch_responses_by_node
            assert served.get(leader, 0) - start.get(leader, 0) <= 1, (start, served)
            assert served.get(other, 0) == 0, served

            await on_thread(cluster.node(follower).kill)
            killed = dict(c.metrics().fetch_responses_by_node)
            before = len(reader.seen)
            await until(lambda: len(reader.seen) > before + 400, 30, "records with the follower gone")
            served = c.metrics().fetch_responses_by_node
            assert served.get(leader, 0) > killed.get(leader, 0) + 5, (killed, served)  # the leader again
            assert served.get(other, 0) == 0, served  # not another rack's replica

            await on_thread(cluster.node(follower).restart)
            await on_thread(wait_in_sync, cluster)
            back = dict(c.metrics().fetch_responses_by_node)
            await until(lambda: c.metrics().fetch_responses_by_node.get(follower, 0) > back.get(follower, 0) + 5,
                        30, "fetches from the follower again")
            await drain(producer, reader)
            tg.cancel_scope.cancel()
    exactly_once(producer, reader.seen)


# -- 7. truncation after an unclean leader election (KIP-320) ------------------------------------


async def test_an_unclean_leader_election_truncates_the_log_and_the_consumer_resets_or_raises(
    whole: KafkaCluster,
) -> None:
    """A topic on nodes 1 (leader) and 2, ``min.insync.replicas=1``, unclean elections allowed.
    Node 2 dies; 50 records go to node 1 alone and are read.  Node 1 dies, node 2 comes back and
    is elected uncleanly: its log ends where node 1's went on alone.  A consumer with
    ``auto_offset_reset="earliest"`` resumes at the divergent offset and reads the new leader's
    records exactly once; one with ``"none"`` raises ``LogTruncationError`` naming that offset.
    (Node 3 keeps the controller quorum: two of three voters are up throughout but for a moment.)"""
    cluster = whole
    topic = f"unclean-{uuid.uuid4().hex[:8]}"
    await on_thread(lambda: cluster.run_tool(
        "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.bootstrap, "--create",
        "--topic", topic, "--replica-assignment", "1:2", "--config", "min.insync.replicas=1",
        "--config", "unclean.leader.election.enable=true"))
    await on_thread(wait_in_sync, cluster)
    tp = TopicPartition(topic, 0)
    await on_thread(lambda: produce(cluster.bootstrap, topic, [(0, None, b"old-%d" % i) for i in range(100)]))
    leader, follower = cluster.node(1), cluster.node(2)
    assert leaders(cluster, topic) == {0: 1}

    await on_thread(follower.kill)
    await on_thread(lambda: produce(cluster.bootstrap, topic, [(0, None, b"alone-%d" % i) for i in range(50)],
                                    timeout=60))
    resets = Consumer(bootstrap_servers=cluster.bootstrap, **{**FAST, "auto_offset_reset": "earliest"})
    raises = Consumer(bootstrap_servers=cluster.bootstrap, **{**FAST, "auto_offset_reset": "none"})
    async with resets, raises:
        resets.assign([tp])
        raises.assign([tp])
        await raises.seek(tp, 0)
        for c in (resets, raises):
            offsets: list[int] = []
            with anyio.fail_after(30):
                while len(offsets) < 150:
                    offsets += [r.offset for r in (await c.getmany(tp, timeout=1)).get(tp, [])]
            assert offsets == list(range(150))

        await on_thread(leader.kill)
        await on_thread(lambda: follower.restart(wait=False))
        deadline = time.monotonic() + 60
        while leaders(cluster, topic).get(0) != 2:
            assert time.monotonic() < deadline, "node 2 was not elected"
            if time.monotonic() > deadline - 50:
                await on_thread(lambda: cluster.run_tool(
                    "org.apache.kafka.tools.LeaderElectionCommand", "--bootstrap-server", follower.bootstrap,
                    "--election-type", "UNCLEAN", "--topic", topic, "--partition", "0", check=False))
            await anyio.sleep(0.5)
        await on_thread(lambda: produce(follower.bootstrap, topic, [(0, None, b"new-%d" % i) for i in range(30)],
                                        timeout=60))

        got: list[tuple[int, bytes]] = []
        with anyio.fail_after(60):
            while len(got) < 30:
                got += [(r.offset, r.value) for r in (await resets.getmany(tp, timeout=1)).get(tp, [])]
        assert got == [(100 + i, b"new-%d" % i) for i in range(30)]
        assert await resets.getmany(tp, timeout=1) == {}

        with anyio.fail_after(60), pytest.raises(LogTruncationError) as caught:
            while True:
                assert not await raises.getmany(tp, timeout=1)
        assert (caught.value.partition, caught.value.position, caught.value.divergent_offset) == (tp, 150, 100)


# -- a broker that hangs -------------------------------------------------------------------------


async def test_a_hung_leader_is_named_in_a_warning_within_the_request_timeout_and_reading_goes_on(
    whole: KafkaCluster, caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGSTOP, not SIGKILL: the leader's sockets stay open and nothing answers.  No silent stall:
    a WARNING names the broker within ``request_timeout_ms`` (plus the fetch's own wait), another
    names the partition if it stays quiet longer than ``quiet_partition_warning_s``, the
    connection is dropped, and reading goes on from the new leader."""
    cluster = whole
    topic = new_topic(cluster, 1)
    victim = cluster.node(leaders(cluster, topic)[0])
    assert victim.pid is not None
    # librdkafka holds a ProduceRequest to a hung broker for socket.timeout.ms (60 s by default).
    producer = Background(cluster, topic, config={"socket.timeout.ms": 10000}).start()
    # A commit to a hung coordinator times out after one request (it would otherwise retry until the
    # coordinator moves, holding the reader): the test measures reading.
    async with group_consumer(cluster.bootstrap, f"g-{topic}", request_timeout_ms=5000, default_api_timeout_ms=5000,
                              socket_connection_setup_timeout_ms=5000) as c:
        c.subscribe([topic])
        reader = Reader(c, commit_every=100, tolerate_timeouts=True)
        named = (f"broker {victim.node_id} at", f"(broker {victim.node_id}) at")
        stopped_at = time.monotonic()

        def timeline() -> str:
            return (f"{time.monotonic() - stopped_at:.1f}s after the hang: producer delivered "
                    f"{len(producer.delivered_after(stopped_at))} since, reader read "
                    f"{reader.arrived_after(stopped_at)} since, commit timeouts {len(reader.timed_out)}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.run)
            await until(lambda: len(reader.seen) > 300, 30, "records before the hang")
            # The consumer's own quiet spell: from the hang to its first fetch answered by another
            # broker (the new leader; the topic has one partition).  Records may come later than
            # that, when the producer gets going again.
            others_before = {n: v for n, v in c.metrics().fetch_responses_by_node.items() if n != victim.node_id}
            fetching_again: list[float] = []

            async def watch_fetches() -> None:
                while not fetching_again:
                    by_node = c.metrics().fetch_responses_by_node
                    if any(v > others_before.get(n, 0) for n, v in by_node.items() if n != victim.node_id):
                        fetching_again.append(time.monotonic())
                    await anyio.sleep(0.05)

            with caplog.at_level(logging.WARNING, logger="asyncconsumer"):
                os.kill(victim.pid, signal.SIGSTOP)
                try:
                    stopped_at = time.monotonic()
                    tg.start_soon(watch_fetches)
                    limit = (c.config.request_timeout_ms + c.config.fetch_max_wait_ms) / 1000 + 2
                    await until(lambda: any(r.levelno == logging.WARNING and r.getMessage().startswith(named)
                                            for r in caplog.records), limit, "a warning naming the hung broker")
                    # How soon the cluster and the (independent) producer get going again is not the
                    # consumer's doing: librdkafka holds its in-flight ProduceRequest for up to
                    # socket.timeout.ms, and the cluster must elect a new leader.  Wait for the first
                    # 100 records delivered after the hang; the consumer must read them within the
                    # budget below.
                    await until(lambda: len(producer.delivered_after(stopped_at)) >= 100, 150,
                                lambda: f"records delivered by the producer after the hang ({timeline()})")
                    fresh = set(producer.delivered_after(stopped_at)[:100])
                    delivered = time.monotonic()
                    # A new connection to the hung broker is accepted by its kernel and then hangs until
                    # the set-up timeout; a fetch in flight waits out the request timeout.  Either may
                    # be met once more before the metadata names the new leader.
                    budget = 2 * (c.config.request_timeout_ms + c.config.socket_connection_setup_timeout_ms) / 1000 + 10
                    await until(lambda: not unread(fresh, set(reader.seen)), budget,
                                lambda: f"read of the records the new leader has ({timeline()})")
                    recovered = next(t for t in reader.arrivals if t > stopped_at + 1) - stopped_at
                    await until(lambda: bool(fetching_again), 5, "a fetch answered by the new leader")
                    quiet_spell = fetching_again[0] - stopped_at
                    # A partition quiet for longer than quiet_partition_warning_s (plus a check
                    # interval and a loop turn) is named in a warning with its broker, while it is quiet.
                    quiet = f"no records fetched for {topic}-0 for "
                    if quiet_spell > c.config.quiet_partition_warning_s + 2:
                        assert any(r.levelno == logging.WARNING and r.getMessage().startswith(quiet)
                                   for r in caplog.records), (
                            f"no warning named the partition, quiet for {quiet_spell:.1f}s ({timeline()})")
                    print(f"fetching from the new leader {quiet_spell:.1f}s after the hang, records again "
                          f"{recovered:.1f}s after it; the producer's came {delivered - stopped_at:.1f}s after it")
                finally:
                    os.kill(victim.pid, signal.SIGCONT)
            await on_thread(wait_in_sync, cluster)
            await drain(producer, reader)
            tg.cancel_scope.cancel()
    exactly_once(producer, reader.seen)


# -- 8. rack-aware assignment in a mixed group (KIP-881) ------------------------------------------


async def test_a_mixed_group_with_java_gets_a_rack_aligned_range_assignment(
    whole: KafkaCluster, tmp_path: pathlib.Path
) -> None:
    """Two members of ours (racks a, b) lead, a Java member (rack c) joins: with ``range`` each gets
    the partitions of its own rack, and the group stays put.  The whole matrix (every shared
    assignor, either side leading) is tests/groups/test_rack_aware_kafka.py (long)."""
    await check_rack_aligned_group(whole, tmp_path, assignor="range", java_leads=False)
