"""The three-node Apache Kafka cluster under faults: helpers shared by ``test_failover.py`` and
``test_cluster_chaos.py``.

Admin calls and the background producer use ``cluster.direct_bootstrap``: with a proxy in front of
each node (``KafkaCluster(advertise_plaintext=...)``) they still talk to the nodes directly, so
only the consumers under test see the faults.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as OracleTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from asyncconsumer import Consumer
from asyncconsumer.errors import KafkaTimeoutError
from asyncconsumer.testing import KafkaCluster

from .consumers import FAST
from .producer import consume


def admin(cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.direct_bootstrap, "log_level": 3})


def heal(cluster: KafkaCluster, timeout: float = 90.0) -> None:
    down = [n for n in cluster.nodes if not n.alive]
    for node in down:
        node.launch()
    if down:
        cluster.wait_ready(timeout)
    wait_in_sync(cluster, timeout)


def wait_in_sync(cluster: KafkaCluster, timeout: float = 90.0) -> None:
    """Until every partition of every topic has a leader and all its replicas in sync."""
    client = admin(cluster)
    deadline = time.monotonic() + timeout
    problem = ""
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(timeout=5)
        except Exception as exc:
            problem = repr(exc)
        else:
            lagging = [
                f"{t.topic}-{p.id} isr={p.isrs} leader={p.leader}"
                for t in md.topics.values()
                for p in t.partitions.values()
                if len(p.isrs) < len(p.replicas) or p.leader < 0
            ]
            if len(md.brokers) == len(cluster.nodes) and not lagging:
                return
            problem = f"{len(md.brokers)} brokers; " + ", ".join(lagging[:5])
        time.sleep(0.2)
    raise TimeoutError(f"cluster not whole after {timeout}s: {problem}")


def new_topic(cluster: KafkaCluster, partitions: int = 3, *, config: dict[str, str] | None = None) -> str:
    name = f"failover-{uuid.uuid4().hex[:8]}"
    topic = NewTopic(name, num_partitions=partitions, replication_factor=3, config=config or {})
    client = admin(cluster)
    client.create_topics([topic], operation_timeout=30)[name].result(30)
    wait_in_sync(cluster)
    leaders(cluster, name, partitions=partitions)
    return name


def leaders(cluster: KafkaCluster, topic: str, *, partitions: int | None = None, timeout: float = 30.0,
            until: Callable[[dict[int, int]], bool] | None = None, waiting_for: str = "") -> dict[int, int]:
    """Partition → leader's node id, as the metadata tells it.

    Right after a topic's creation the node answering may not know it yet (red in clean-clone CI
    runs twice: an empty partition list), so this asks again until the topic is listed with its
    partitions (all ``partitions`` of them, each with a leader, when given), and, given ``until``,
    until the answer satisfies it (``waiting_for`` names what for the timeout's message).
    """
    client = admin(cluster)
    deadline = time.monotonic() + timeout
    while True:
        md = client.list_topics(topic, timeout=10).topics[topic]
        found = {p.id: p.leader for p in md.partitions.values()}
        if partitions is None:
            listed = bool(found) and md.error is None
        else:
            listed = len(found) == partitions and all(leader >= 0 for leader in found.values())
        if listed and (until is None or until(found)):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: metadata lists {found} (error {md.error}) after {timeout}s{waiting_for}")
        time.sleep(0.2)


def moved_off(cluster: KafkaCluster, topic: str, node: int, partitions: list[int],
              timeout: float = 30.0) -> dict[int, int]:
    """Wait until the metadata gives each of ``partitions`` a live leader other than ``node``.

    A killed broker keeps its partitions until its session times out, and each broker applies the
    controller's change at its own pace, so this asks until the answer shows the move.
    """
    return leaders(cluster, topic, timeout=timeout,
                   until=lambda found: all(found.get(p, -1) not in (node, -1) for p in partitions),
                   waiting_for=f", waiting for partitions {partitions} to move off node {node}")


def coordinator(cluster: KafkaCluster, group: str) -> int:
    client = admin(cluster)
    for _ in range(50):
        (future,) = client.describe_consumer_groups([group], request_timeout=10).values()
        try:
            return int(future.result(10).coordinator.id)
        except KafkaException:  # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS: a moment later
            time.sleep(0.2)
    raise TimeoutError(f"no coordinator for group {group!r}")


@dataclass
class Background:
    """Records produced from a thread, ``acks=all`` and idempotent, until stopped."""

    cluster: KafkaCluster
    topic: str
    rate: float = 400.0  # records per second
    #: More librdkafka settings, over the defaults below.
    config: dict[str, Any] = field(default_factory=dict)
    #: ``(partition, offset, value)``; the offset None where the report has none (see :func:`unread`).
    delivered: list[tuple[int, int | None, bytes]] = field(default_factory=list)
    #: When each delivery report came (``time.monotonic()``), in the order of ``delivered``.
    delivered_at: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Background:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.cluster.direct_bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120000, "log_level": 0, **self.config,
        })

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                self.failures.append(str(err))
            else:
                self.delivered.append((msg.partition(), msg.offset(), msg.value()))
                self.delivered_at.append(time.monotonic())

        sent = 0
        begin = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - begin) * self.rate)
            while sent < due:
                producer.produce(self.topic, value=b"%d" % sent, on_delivery=report)
                sent += 1
            producer.poll(0.01)
        if producer.flush(120):
            self.failures.append("undelivered after 120 s")

    def delivered_after(self, moment: float) -> list[tuple[int, int | None, bytes]]:
        """The records whose delivery was reported after ``moment``."""
        return [r for r, t in zip(self.delivered, self.delivered_at, strict=False) if t > moment]

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(150)
        assert not self.failures, self.failures[:5]

    async def stop_async(self) -> None:
        await anyio.to_thread.run_sync(self.stop)


@dataclass
class Reader:
    """A group member reading into ``seen`` (and committing every ``commit_every`` records)."""

    consumer: Consumer[Any, Any]
    commit_every: int = 0
    #: Commits that timed out (only allowed where the whole cluster is down for longer).
    timed_out: list[KafkaTimeoutError] = field(default_factory=list)
    tolerate_timeouts: bool = False
    seen: list[tuple[int, int, bytes]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    #: (time.monotonic() when each commit() began, when it returned).
    commits: list[tuple[float, float]] = field(default_factory=list)

    async def run(self) -> None:
        async for record in self.consumer:
            self.seen.append((record.partition, record.offset, record.value))
            self.arrivals.append(time.monotonic())
            if self.commit_every and len(self.seen) % self.commit_every == 0:
                began = time.monotonic()
                try:
                    await self.consumer.commit()
                except KafkaTimeoutError as exc:
                    if not self.tolerate_timeouts:
                        raise
                    self.timed_out.append(exc)  # the next commit covers these offsets too
                finally:
                    self.commits.append((began, time.monotonic()))

    def committing(self, begin: float, end: float) -> float:
        """Seconds of [begin, end] this reader spent waiting in ``commit()``."""
        return sum(max(0.0, min(b, end) - max(a, begin)) for a, b in self.commits)

    def arrived_after(self, moment: float) -> int:
        return sum(1 for t in self.arrivals if t > moment)


def group_consumer(bootstrap: str, group: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, group_id=group, **{
        **FAST, "auto_offset_reset": "earliest", "session_timeout_ms": 30000, "heartbeat_interval_ms": 1000,
        "reconnect_backoff_max_ms": 1000, "auto_commit_interval_ms": 500, **options})


def log_of(cluster: KafkaCluster, topic: str, timeout: float = 60.0) -> set[tuple[int, int, bytes]]:
    """Every record in ``topic`` up to each partition's high watermark, as an independent client
    (confluent-kafka) reads it: the oracle for what the log holds."""
    client = admin(cluster)
    partitions = client.list_topics(topic, timeout=10).topics[topic].partitions

    def offsets(spec: OffsetSpec) -> int:
        asked = client.list_offsets({OracleTopicPartition(topic, p): spec for p in partitions}, request_timeout=10)
        return sum(future.result(10).offset for future in asked.values())

    count = offsets(OffsetSpec.latest()) - offsets(OffsetSpec.earliest())
    records = consume(cluster.direct_bootstrap, topic, count, timeout=timeout)
    return {(m.partition(), m.offset(), m.value()) for m in records}


def exactly_once(producer: Background, *reads: list[tuple[int, int, bytes]]) -> None:
    """Every record the producer was told is written was read, none twice, and nothing else read.

    A record whose acknowledgement was lost (every broker killed while it was in flight) can be in
    the log without a delivery report, and the retry that was acknowledged sits at a later offset:
    a record read beyond the delivery reports passes when the log holds it there (read by an
    independent client, :func:`log_of`).
    """
    produced = producer.delivered
    seen = [r for read in reads for r in read]
    duplicates = len(seen) - len(set(seen))
    missing = unread(produced, set(seen))
    foreign = undelivered(seen, produced)
    assert not duplicates, f"{duplicates} records read twice"
    assert not missing, f"{len(missing)} of {len(produced)} records never read, e.g. {sorted(missing)[:5]}"
    if foreign:
        unlogged = foreign - log_of(producer.cluster, producer.topic)
        assert not unlogged, f"read records the log does not hold: {sorted(unlogged)[:5]}"


def read_by(*readers: Reader) -> set[tuple[int, int, bytes]]:
    """Every record the readers have read, as ``(partition, offset, value)``."""
    return {r for reader in readers for r in reader.seen}


# A delivery report may carry no offset (None): librdkafka reports a retried batch that the broker
# had already written (DUPLICATE_SEQUENCE_NUMBER, after a broker went away mid-request) as
# delivered at an unknown offset.  Such a record is matched by partition and value instead (each
# value a Background producer sends is unique).


def unread(want: Iterable[tuple[int, int | None, bytes]], seen: set[tuple[int, int, bytes]]) -> set[Any]:
    """The records of ``want`` (delivery reports) that ``seen`` lacks."""
    missing = set(want) - seen
    if any(offset is None for _, offset, _ in missing):
        values = {(partition, value) for partition, _, value in seen}
        missing = {r for r in missing if r[1] is not None or (r[0], r[2]) not in values}
    return missing


def undelivered(seen: Iterable[tuple[int, int, bytes]], delivered: Iterable[tuple[int, int | None, bytes]]) -> set[Any]:
    """The records of ``seen`` that no delivery report names."""
    reported = set(delivered)
    unknown = {(partition, value) for partition, offset, value in reported if offset is None}
    return {r for r in set(seen) - reported if (r[0], r[2]) not in unknown}


def missing_by_partition(want: set[tuple[int, int | None, bytes]], *readers: Reader) -> str:
    """What is still unread, per partition: how many, from which offset, and the last offset read;
    and the commits that timed out (a reader waits a request timeout in each)."""
    seen = read_by(*readers)
    gaps: dict[int, list[int | None]] = {}
    for partition, offset, _ in unread(want, seen):
        gaps.setdefault(partition, []).append(offset)
    last: dict[int, int] = {}
    for partition, offset, _ in seen:
        last[partition] = max(last.get(partition, -1), offset)

    def first(offsets: list[int | None]) -> str:
        known = [o for o in offsets if o is not None]
        return f"offset {min(known)}" if known else "unknown offsets"

    gone = "; ".join(f"partition {p}: {len(offs)} unread from {first(offs)} (last read {last.get(p)})"
                     for p, offs in sorted(gaps.items()))
    timed_out = [exc for reader in readers for exc in reader.timed_out]
    return gone + (f"; {len(timed_out)} commits timed out, the last: {timed_out[-1]}" if timed_out else "")


async def until(predicate: Any, timeout: float, what: str | Callable[[], str]) -> None:
    """Wait for ``predicate()``; after ``timeout`` s fail naming ``what`` (or what it returns)."""
    try:
        with anyio.fail_after(timeout):
            while not predicate():  # noqa: ASYNC110
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"no {what if isinstance(what, str) else what()} within {timeout}s") from None


async def drain(producer: Background, *readers: Reader, timeout: float = 60.0) -> None:
    await producer.stop_async()
    want = set(producer.delivered)
    await until(lambda: not unread(want, read_by(*readers)), timeout,
                lambda: f"the last records ({missing_by_partition(want, *readers)})")
    await anyio.sleep(0.5)  # anything read twice would show up now


async def on_thread(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)
