"""Chaos proxies in front of every node of a three-node Apache Kafka cluster (issue 14).

Each node's PLAINTEXT listener advertises its own :class:`ChaosProxy`
(``KafkaCluster(advertise_plaintext=...)``): every byte between our consumers and any node goes
through a proxy, bootstrap included, while replication (the nodes' INTERNAL listener) and the
KRaft controllers talk directly.  The producer (confluent-kafka, ``acks=all``, idempotent) and
the admin calls use ``cluster.direct_bootstrap``, so the faults are only the consumers'.

A group of three members reads a six-partition topic (replication factor 3, leaders on all three
nodes) while records keep coming, and the proxies cut (FIN or RST) or stall (a black hole, then a
cut) the client connections of one node or of all three at random, the group coordinator's node
included.  Checked:

- exactly once: every record delivered to the producer is read, none twice, none foreign.  Each
  member commits every 50 records and by auto-commit; a cut or a stall costs no membership (the
  session outlives any stall), so no partition changes hands and nothing may be read twice.  A
  member whose partitions were *lost* (its session expired) could re-read its uncommitted
  window; the test counts lost partitions and allows duplicates only on those, and only then;
- progress: every record the producer was told about during the chaos is read within
  :data:`MAX_DELAY` s of its delivery report.  A stall lasts at most 1.5 s and
  ``request_timeout_ms`` is 5 s, but a member's ``commit()`` (every 50 records) waits for the
  coordinator, and so does its reading: a few strikes in a row on the coordinator's node hold
  every member for several seconds (6 s in one run).  Measured from the delivery, not as a gap
  between reads, so that a broker slow to take records (three JVMs on two busy cores) is not
  counted as a consumer stall.  A longer delay fails with the strikes and the WARNINGs the
  consumers logged, which must name anything stuck.

``ASYNCCONSUMER_CHAOS_SEED`` picks another seed (printed with the figures); ``ASYNCCONSUMER_CHAOS_LOG``
names a file for the consumers' DEBUG log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections import Counter

import anyio
import pytest
from support.broker import backend_names_from_env
from support.cluster import (
    Background,
    Reader,
    coordinator,
    group_consumer,
    leaders,
    new_topic,
    on_thread,
    read_by,
    undelivered,
    unread,
    until,
)
from support.consumers import LostRecorder
from support.proxy import ChaosProxy

from asyncconsumer import TopicPartition
from asyncconsumer.testing import KafkaCluster, KafkaNode
from asyncconsumer.testing._probe import metadata_brokers

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.timeout(300)]

SEED = int(os.environ.get("ASYNCCONSUMER_CHAOS_SEED", "14"))
CHAOS_SECONDS = 30.0
PARTITIONS = 6
MEMBERS = 3
#: The longest a record delivered during the chaos may wait to be read.
MAX_DELAY = 15.0


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Chaos:
    """Cuts and stalls on the proxies of random nodes, counted per node."""

    def __init__(self, proxies: dict[int, ChaosProxy], coordinator: int, rng: random.Random) -> None:
        self.proxies = proxies
        self.coordinator = coordinator
        self.rng = rng
        self.cuts: Counter[int] = Counter()
        self.stalls: Counter[int] = Counter()
        self.strikes = 0
        #: (time.monotonic(), what) of every strike, for failure messages.
        self.timeline: list[tuple[float, str]] = []

    def targets(self) -> list[int]:
        roll = self.rng.random()
        if roll < 0.25:
            return sorted(self.proxies)  # every node at once
        if roll < 0.5:
            return [self.coordinator]
        return [self.rng.choice(sorted(self.proxies))]

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.rng.uniform(0.5, 1.5))
            nodes = self.targets()
            self.strikes += 1
            if self.rng.random() < 0.7:
                reset = self.rng.random() < 0.5
                self.timeline.append((time.monotonic(), f"cut{' (RST)' if reset else ''} {nodes}"))
                for node in nodes:
                    await self.proxies[node].drop_all(reset=reset)
                    self.cuts[node] += 1
            else:
                self.timeline.append((time.monotonic(), f"stall {nodes}"))
                for node in nodes:
                    self.proxies[node].blackhole = True  # the node looks hung to its clients
                try:
                    await anyio.sleep(self.rng.uniform(0.5, 1.5))
                finally:
                    for node in nodes:
                        self.proxies[node].blackhole = False
                for node in nodes:
                    await self.proxies[node].drop_all()  # the hung connections are given up
                    self.stalls[node] += 1

    def summary(self) -> str:
        per_node = ", ".join(f"node {n}: {self.cuts[n]} cuts {self.stalls[n]} stalls" for n in sorted(self.proxies))
        return (f"{self.strikes} strikes, {sum(self.cuts.values())} cuts, {sum(self.stalls.values())} stalls "
                f"({per_node}; coordinator {self.coordinator})")


def delays(producer: Background, readers: list[Reader], begin: float, end: float) -> dict[int, tuple[float, float]]:
    """Per partition, the longest time a record delivered in [begin, end] waited to be first read,
    and when (seconds after ``begin``) it was delivered."""
    first_read: dict[tuple[int, int, bytes], float] = {}
    for reader in readers:
        for record, at in zip(reader.seen, reader.arrivals, strict=True):
            first_read[record] = min(at, first_read.get(record, at))
    worst: dict[int, tuple[float, float]] = {p: (0.0, 0.0) for p in range(PARTITIONS)}
    for record, delivered in zip(producer.delivered, producer.delivered_at, strict=False):
        if begin <= delivered <= end and record in first_read:
            worst[record[0]] = max(worst[record[0]], (first_read[record] - delivered, delivered - begin))
    return worst


async def test_cuts_and_stalls_of_every_nodes_client_connections_lose_nothing_and_repeat_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if "kafka" not in backend_names_from_env():
        pytest.skip("ASYNCCONSUMER_TEST_BROKER leaves Apache Kafka out")
    rng = random.Random(SEED)
    print(f"chaos seed {SEED} (ASYNCCONSUMER_CHAOS_SEED)")
    async with contextlib.AsyncExitStack() as stack:
        # The proxies listen first; each learns its node's port before that node starts advertising it.
        proxies = {n: await stack.enter_async_context(ChaosProxy("127.0.0.1", 9)) for n in (1, 2, 3)}

        def advertise(node: KafkaNode) -> str:
            proxy = proxies[node.node_id]
            proxy.retarget("127.0.0.1", node.ports.plaintext)
            return proxy.address

        cluster = KafkaCluster(3, advertise_plaintext=advertise)
        await on_thread(cluster.start)
        stack.push_async_callback(on_thread, cluster.stop)
        assert all(p.target_port == cluster.node(n).ports.plaintext for n, p in proxies.items())
        # Clients are told the proxies; the INTERNAL listener (replication, direct_bootstrap) names itself.
        first = cluster.nodes[0]
        assert await on_thread(metadata_brokers, "127.0.0.1", first.ports.plaintext) == {
            (n, "127.0.0.1", p.port) for n, p in proxies.items()}
        assert await on_thread(metadata_brokers, "127.0.0.1", first.ports.internal) == {
            (n.node_id, "127.0.0.1", n.ports.internal) for n in cluster.nodes}
        assert cluster.direct_bootstrap == ",".join(f"127.0.0.1:{n.ports.internal}" for n in cluster.nodes)

        topic = await on_thread(new_topic, cluster, PARTITIONS)
        assert set((await on_thread(leaders, cluster, topic)).values()) == {1, 2, 3}
        group = f"g-{topic}"
        through_proxies = ",".join(p.address for p in proxies.values())
        producer = Background(cluster, topic, rate=500).start()
        stack.push_async_callback(producer.stop_async)  # (again) on the way out, before the cluster stops
        recorders = [LostRecorder() for _ in range(MEMBERS)]
        readers: list[Reader] = []
        for recorder in recorders:
            consumer = await stack.enter_async_context(group_consumer(
                through_proxies, group, request_timeout_ms=5000, reconnect_backoff_ms=20,
                reconnect_backoff_max_ms=500, auto_commit_interval_ms=500))
            consumer.subscribe([topic], listener=recorder)
            readers.append(Reader(consumer, commit_every=50))
        before = sum(p.connections_accepted for p in proxies.values())
        assert before > 0  # the members bootstrapped through the proxies

        debug_log = os.environ.get("ASYNCCONSUMER_CHAOS_LOG")  # a file for the consumers' DEBUG log
        if debug_log:
            handler = logging.FileHandler(debug_log, mode="w")
            handler.setFormatter(logging.Formatter("%(created).3f %(name)s %(levelname)s %(message)s"))
            logging.getLogger("asyncconsumer").addHandler(handler)
            stack.callback(handler.close)
            stack.callback(logging.getLogger("asyncconsumer").removeHandler, handler)
        with caplog.at_level(logging.DEBUG if debug_log else logging.WARNING, logger="asyncconsumer"):
            async with anyio.create_task_group() as tg:
                for reader in readers:
                    tg.start_soon(reader.run)

                def settled() -> bool:
                    held = [r.consumer.assignment() for r in readers]
                    return all(held) and sum(map(len, held)) == PARTITIONS and all(len(r.seen) > 50 for r in readers)

                await until(settled, 60, "three members each holding partitions and reading")
                # The backlog of the join read first: the waits measured below are the chaos's.
                backlog = set(producer.delivered)
                await until(lambda: not unread(backlog, read_by(*readers)), 60, "the backlog")
                chaos = Chaos(proxies, await on_thread(coordinator, cluster, group), rng)
                settled_rebalances = sum(r.consumer.metrics().rebalances.count for r in readers)
                began = time.monotonic()
                with anyio.move_on_after(CHAOS_SECONDS):
                    await chaos.run()
                ended = time.monotonic()
                for proxy in proxies.values():
                    proxy.blackhole = False
                await producer.stop_async()
                want = set(producer.delivered)
                await until(lambda: not unread(want, read_by(*readers)), 60, "the last records")
                drained = time.monotonic()
                await anyio.sleep(1.0)  # anything read twice would show up now
                tg.cancel_scope.cancel()
        metrics = [r.consumer.metrics() for r in readers]

    seen = [r for reader in readers for r in reader.seen]
    counts = Counter(seen)
    twice = {r for r, n in counts.items() if n > 1}
    lost_partitions = {tp for rec in recorders for kind, tps in rec.events if kind == "lost" for tp in tps}
    rebalances = sum(m.rebalances.count for m in metrics) - settled_rebalances
    reconnects = sum(m.connections.reconnects for m in metrics)
    commit_failures = sum(m.commits.failures for m in metrics)
    waits = delays(producer, readers, began, ended)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    figures = (
        f"seed {SEED}: {len(producer.delivered)} records, {PARTITIONS} partitions, {MEMBERS} members, "
        f"{ended - began:.0f} s of chaos: {chaos.summary()}; {len(twice)} read twice, "
        f"{len(unread(producer.delivered, set(counts)))} lost, {rebalances} rebalances during the chaos, "
        f"{len(lost_partitions)} partitions lost, {reconnects} reconnects, {commit_failures} failed commits, "
        f"{len(warnings)} warnings; longest wait of a record {max(waits.values())[0]:.1f} s; cluster start "
        f"{cluster.startup_seconds:.0f} s, the last records {drained - ended:.1f} s after the chaos"
    )
    strikes = ", ".join(f"{t - began:.1f} {what}" for t, what in chaos.timeline)
    print(figures)
    print("worst wait per partition:", {p: f"{w:.1f} s at {at:.1f} s" for p, (w, at) in waits.items()},
          f"(seconds after the chaos began, at {time.time() - (time.monotonic() - began):.3f} wall clock)")
    print("strikes:", strikes)

    assert not unread(producer.delivered, set(counts)), figures
    assert not undelivered(counts, producer.delivered), f"read records nobody produced; {figures}"
    # A cut or stall repeats nothing; only a partition lost with its session could be read again.
    assert all(TopicPartition(topic, p) in lost_partitions for p, _, _ in twice), figures
    assert all(chaos.cuts[n] + chaos.stalls[n] >= 3 for n in proxies), figures  # every node's clients hit
    assert chaos.cuts[chaos.coordinator] + chaos.stalls[chaos.coordinator] >= 5, figures
    assert sum(p.connections_accepted for p in proxies.values()) > before + 20, figures  # they reconnected
    stuck = {p: f"{w:.1f} s, delivered at {at:.1f} s" for p, (w, at) in waits.items() if w > MAX_DELAY}
    assert not stuck, (
        f"records read more than {MAX_DELAY} s after their delivery: {stuck}; {figures}; strikes: {strikes}; "
        + ("warnings: " + " | ".join(warnings[-10:]) if warnings else "and not one WARNING said why (a silent stall)"))
