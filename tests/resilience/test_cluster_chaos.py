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
- no silent stall: every record the producer was told about during the chaos is read within the
  consumers' quiet bound (``ConsumerConfig.quiet_partition_warning_s``: 5.5 s with these settings,
  derived from ``fetch_max_wait_ms`` and ``reconnect_backoff_max_ms``) and the stall watch's
  interval between two looks (0.5 s) of its delivery report, or a WARNING named its partition
  meanwhile (the consumer says what it is waiting for).  The time the
  record's reader spent in its own ``commit()`` does not count: a member commits every 50 records,
  and while it waits for the coordinator it does not ask for records.  On two cores loaded with
  other work, with the coordinator's connections cut every second or two, those commits took
  0.9 s each and the readers spent 29.7-30.0 s of the 30 s chaos in them, so records waited
  20-37 s from their delivery; each ``commit()`` is bounded by its own deadline
  (``request_timeout_ms``: one that does not complete in time raises and fails the test).
  Measured from the delivery, not as a gap between reads, so that a broker slow to take records
  (three JVMs on two busy cores) is not counted as a consumer stall.

``ASYNCCONSUMER_CHAOS_SEED`` picks another seed (printed with the figures); ``ASYNCCONSUMER_CHAOS_LOG``
names a file for the consumers' DEBUG log; ``ASYNCCONSUMER_CPU_PRESSURE=N`` runs N busy processes
during the chaos (``./dev nox -s chaos`` runs both chaos tests that way for several seeds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
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
from support.pressure import cpu_pressure
from support.proxy import ChaosProxy

from asyncconsumer import TopicPartition
from asyncconsumer.managers.stall_watch import check_interval
from asyncconsumer.testing import KafkaCluster, KafkaNode
from asyncconsumer.testing._probe import metadata_brokers

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.timeout(300)]

SEED = int(os.environ.get("ASYNCCONSUMER_CHAOS_SEED", "14"))
CHAOS_SECONDS = 30.0
PARTITIONS = 6
MEMBERS = 3
#: How a consumer names a quiet partition (managers/stall_watch.py).
QUIET = re.compile(r"no records fetched for (.+?) for [0-9.]+s \(")


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


def delays(producer: Background, readers: list[Reader], begin: float, end: float,
           *, net: bool = False) -> dict[int, list[tuple[float, float, float]]]:
    """Per partition, (wait, delivered, read) of each record delivered in [begin, end]: the time
    from its delivery report to its first read (``net``: less the time its reader spent in
    ``commit()`` meanwhile, the application not asking for records)."""
    first_read: dict[tuple[int, int, bytes], tuple[float, Reader]] = {}
    for reader in readers:
        for record, at in zip(reader.seen, reader.arrivals, strict=True):
            if record not in first_read or at < first_read[record][0]:
                first_read[record] = (at, reader)
    waits: dict[int, list[tuple[float, float, float]]] = {p: [] for p in range(PARTITIONS)}
    for record, delivered in zip(producer.delivered, producer.delivered_at, strict=False):
        if begin <= delivered <= end and record in first_read:
            at, reader = first_read[record]
            wait = at - delivered - (reader.committing(delivered, at) if net else 0.0)
            waits[record[0]].append((wait, delivered, at))
    return waits


def quiet_warnings(records: list[logging.LogRecord], topic: str) -> dict[int, list[float]]:
    """Per partition, when (time.monotonic()) a consumer's WARNING named it as quiet."""
    to_monotonic = time.monotonic() - time.time()
    named: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    for record in records:
        match = QUIET.match(record.getMessage()) if record.levelno == logging.WARNING else None
        for name in match.group(1).split(", ") if match else ():
            if name.rpartition("-")[0] == topic:
                named[int(name.rpartition("-")[2])].append(record.created + to_monotonic)
    return named


def worst(waits: dict[int, list[tuple[float, float, float]]], begin: float) -> dict[int, str]:
    return {p: (lambda w: f"{w[0]:.1f} s at {w[1] - begin:.1f} s")(max(ws, default=(0.0, begin, begin)))
            for p, ws in waits.items()}


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
                with cpu_pressure() as busy, anyio.move_on_after(CHAOS_SECONDS):
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
    net_waits = delays(producer, readers, began, ended, net=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    bound = readers[0].consumer.config.quiet_partition_warning_s
    late = bound + check_interval(bound)  # a partition quiet for just over the bound is named at the next look
    named = quiet_warnings(caplog.records, topic)
    silent = {p: [(w, d, a) for w, d, a in ws if w > late and not any(d <= t <= a for t in named[p])]
              for p, ws in net_waits.items()}
    longest = max((w for ws in waits.values() for w, _, _ in ws), default=0.0)
    figures = (
        f"seed {SEED}: {len(producer.delivered)} records, {PARTITIONS} partitions, {MEMBERS} members, "
        f"{ended - began:.0f} s of chaos ({len(busy)} busy processes beside): "
        f"{chaos.summary()}; {len(twice)} read twice, "
        f"{len(unread(producer.delivered, set(counts)))} lost, {rebalances} rebalances during the chaos, "
        f"{len(lost_partitions)} partitions lost, {reconnects} reconnects, {commit_failures} failed commits, "
        f"{len(warnings)} warnings; longest wait of a record {longest:.1f} s; cluster start "
        f"{cluster.startup_seconds:.0f} s, the last records {drained - ended:.1f} s after the chaos"
    )
    strikes = ", ".join(f"{t - began:.1f} {what}" for t, what in chaos.timeline)
    committing = []
    for r, m in zip(readers, metrics, strict=True):
        spans = [b - a for a, b in r.commits if began <= a <= ended]
        committing.append(
            f"{r.committing(began, ended):.1f} s in {len(spans)} commits (longest {max(spans, default=0):.1f} s; "
            f"OffsetCommit requests {m.commits.latency.count}, mean {(m.commits.latency.mean or 0) * 1000:.0f} ms, "
            f"max {m.commits.latency.max * 1000:.0f} ms)")
    figures += f"; the readers' commit() during the chaos: {'; '.join(committing)}"
    print(figures)
    print("worst wait per partition:", worst(waits, began),
          f"(seconds after the chaos began, at {time.time() - (time.monotonic() - began):.3f} wall clock)")
    print(f"worst wait per partition less the reader's time in commit() (quiet bound {bound:.1f} s):",
          worst(net_waits, began))
    print("strikes:", strikes)

    assert not unread(producer.delivered, set(counts)), figures
    assert not undelivered(counts, producer.delivered), f"read records nobody produced; {figures}"
    # A cut or stall repeats nothing; only a partition lost with its session could be read again.
    assert all(TopicPartition(topic, p) in lost_partitions for p, _, _ in twice), figures
    assert all(chaos.cuts[n] + chaos.stalls[n] >= 3 for n in proxies), figures  # every node's clients hit
    assert chaos.cuts[chaos.coordinator] + chaos.stalls[chaos.coordinator] >= 5, figures
    assert sum(p.connections_accepted for p in proxies.values()) > before + 20, figures  # they reconnected
    stuck = {p: f"{len(ws)} records, the longest {worst({p: ws}, began)[p]}" for p, ws in silent.items() if ws}
    assert not stuck, (
        f"records read more than {late:.1f} s after their delivery (less their reader's time in commit()) while "
        f"no WARNING named their partition (a silent stall): {stuck}; {figures}; strikes: {strikes}; "
        + ("warnings: " + " | ".join(warnings[-10:]) if warnings else "no warnings"))
