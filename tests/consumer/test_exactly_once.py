"""Exactly-once consume-transform-produce (KIP-447) on Apache Kafka: our consumer, their producers.

``Consumer.group_metadata()`` goes to confluent-kafka's transactional producer
(``send_offsets_to_transaction(offsets, metadata.for_confluent_kafka())``) and its ``group_id``
to aiokafka's.  Shown here:

- ``for_confluent_kafka()`` is byte for byte what confluent-kafka's own consumer serializes for
  the same group state, and librdkafka commits offsets with it, on both group protocols;
- a zombie (a member frozen past its session timeout while another takes its partitions) has its
  transactional offset commit refused, and the output holds no duplicate;
- members of examples/exactly_once.py SIGKILLed and restarted mid-stream: the output read with
  read_committed holds every input record exactly once.

Input is produced by confluent-kafka's plain producer; output is read by confluent-kafka's
read_committed consumer.  Tansu has no transactions: Apache Kafka only.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from support.consumers import FAST, tps
from support.paths import ROOT, SUPPORT
from support.producer import client_quiet, produce
from support.share import set_share_group_config

from asyncconsumer import Consumer, ConsumerClosedError, ConsumerGroupMetadata, TopicPartition

pytestmark = [pytest.mark.broker]

EXAMPLE = ROOT / "examples" / "exactly_once.py"
ZOMBIE = SUPPORT / "eos_zombie.py"
PROTOCOLS = ["classic", "consumer"]
SESSION_MS = 3000
#: What an OffsetFetch may answer while the group's coordinator moves or loads.
PASSING_GROUP_ERRORS = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                        KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT}


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic`` uses it too)."""
    return str(apache_kafka.bootstrap)


def group_name(topic: str) -> str:
    return f"eos-{topic}"


def short_sessions(bootstrap: str, group: str, protocol: str) -> dict[str, Any]:
    """Sessions of ``SESSION_MS``: set by the member (classic) or on the group (KIP-848)."""
    if protocol == "consumer":
        set_share_group_config(bootstrap, group, consumer_session_timeout_ms=SESSION_MS,
                               consumer_heartbeat_interval_ms=500)
        return {}
    return {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 300}


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(client_quiet({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                      "transaction.timeout.ms": 60000}))
    producer.init_transactions(30)
    return producer


def read_committed(bootstrap: str, topic: str, *, timeout: float = 30.0,
                   isolation: str = "read_committed") -> list[bytes]:
    """Every value of ``topic`` a read_committed reader sees, each partition read to its end."""
    consumer = ConfluentConsumer(client_quiet({
        "bootstrap.servers": bootstrap, "group.id": "eos-reference-reader", "enable.auto.commit": False,
        "isolation.level": isolation, "enable.partition.eof": True,
    }))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout).topics[topic].partitions)
        consumer.assign([ConfluentTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(at_end)} of {partitions} read to the end"
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                error = msg.error()
                if error is not None and error.code() == error._PARTITION_EOF:
                    at_end.add(msg.partition())
                elif error is not None:
                    raise KafkaException(error)
                else:
                    at_end.discard(msg.partition())
                    values.append(msg.value())
        return values
    finally:
        consumer.close()


def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """The group's committed offsets on ``topic``, added up (what an OffsetFetch says now); -1 when
    the coordinator cannot say yet (NOT_COORDINATOR while the group's coordinator loads, say)."""
    consumer = ConfluentConsumer(client_quiet({"bootstrap.servers": bootstrap, "group.id": group}))
    try:
        offsets = consumer.committed([ConfluentTopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return sum(max(0, tp.offset) for tp in offsets)
    except KafkaException as exc:
        if exc.args[0].code() not in PASSING_GROUP_ERRORS:
            raise
        return -1
    finally:
        consumer.close()


def expect_exactly_once(output: list[bytes], total: int) -> str:
    """Figures; raises when an input record's output is missing or there twice."""
    counts = Counter(output)
    expected = {b"processed:%d" % i for i in range(total)}
    lost = len(expected - counts.keys())
    twice = {value: n for value, n in counts.items() if n > 1}
    strange = counts.keys() - expected
    figures = f"{total} input records, {len(output)} output records: lost {lost}, duplicated {len(twice)}"
    assert not strange, f"{figures}; unexpected output {sorted(strange)[:5]}"
    assert lost == 0 and not twice, f"{figures}; e.g. {sorted(twice.items())[:5]}"
    return figures


# -- the group metadata and the producers ----------------------------------------------------------


def parse_librdkafka(metadata: bytes) -> tuple[int, str, str, str | None]:
    """(generation, group id, member id, instance id) from librdkafka's serialized form."""
    assert metadata[:7] == b"CGMDv2:"
    generation = int.from_bytes(metadata[7:11], sys.byteorder, signed=True)
    group, member, rest = metadata[11:].split(b"\0", 2)
    instance = None if rest[:1] == b"\x01" else rest[1:-1].decode()
    return generation, group.decode(), member.decode(), instance


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_for_confluent_kafka_is_what_confluents_own_consumer_serializes(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """One classic group, a confluent-kafka member and ours: same generation, and our bytes for the
    confluent member's id and instance id are the bytes its consumer hands out."""
    topic = new_topic(2)
    group = group_name(topic)
    theirs = ConfluentConsumer(client_quiet({
        "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": "theirs-1",
        "session.timeout.ms": 6000, "partition.assignment.strategy": "range", "enable.auto.commit": False,
    }))
    theirs.subscribe([topic])
    admin = AdminClient(client_quiet({"bootstrap.servers": bootstrap}))
    try:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, group_instance_id="ours-1",
                            session_timeout_ms=6000, enable_auto_commit=False, rebalance_safe_commits=False,
                            **FAST) as ours:
            ours.subscribe([topic])
            deadline = time.monotonic() + 40
            while True:
                assert time.monotonic() < deadline, "the two members never shared a stable generation"
                # Their consumer is polled here, not in a thread of its own: its
                # consumer_group_metadata() holds the GIL while it waits for librdkafka's group thread.
                theirs.poll(0.05)
                await ours.getmany(timeout=0.2)
                mine = ours.group_metadata()
                their_bytes = theirs.consumer_group_metadata()
                their_generation = parse_librdkafka(their_bytes)[0]
                try:
                    members = admin.describe_consumer_groups([group])[group].result(timeout=10).members
                except KafkaException:  # the coordinator is still loading, say
                    continue
                ids = {m.group_instance_id: m.member_id for m in members}
                stable = ours.metrics().rebalances.member_state == "stable"
                if stable and mine.generation_id == their_generation >= 1 and set(ids) == {"theirs-1", "ours-1"}:
                    break
            assert mine == ConsumerGroupMetadata(group, their_generation, ids["ours-1"], "ours-1")
            expected = ConsumerGroupMetadata(group, mine.generation_id, ids["theirs-1"], "theirs-1")
            assert expected.for_confluent_kafka() == their_bytes
    finally:
        theirs.close()


@pytest.mark.anyio
@pytest.mark.parametrize(("anyio_backend", "group_protocol"), [("asyncio", "classic"), ("trio", "consumer")])
async def test_confluent_producer_commits_offsets_with_our_group_metadata(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    topic, output = new_topic(2), new_topic(1)
    group = group_name(topic)
    produce(bootstrap, topic, [(i % 2, None, b"%d" % i) for i in range(20)])
    producer = transactional_producer(bootstrap, f"tx-{topic}")
    async with Consumer(bootstrap_servers=bootstrap, group_id=group, group_protocol=group_protocol,
                        isolation_level="read_committed", enable_auto_commit=False, auto_offset_reset="earliest",
                        rebalance_safe_commits=False, **FAST) as consumer:
        consumer.subscribe([topic])
        got: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + 30
        while sum(got.values()) < 20:
            assert time.monotonic() < deadline, got
            for tp, records in (await consumer.getmany(timeout=0.5)).items():
                got[tp] = got.get(tp, 0) + len(records)
        metadata = consumer.group_metadata()
        assert metadata.group_id == group and metadata.generation_id >= 1 and metadata.member_id
        producer.begin_transaction()
        for i in range(20):
            producer.produce(output, value=b"processed:%d" % i)
        offsets = [ConfluentTopicPartition(topic, p, 10) for p in range(2)]
        await anyio.to_thread.run_sync(producer.send_offsets_to_transaction, offsets, metadata.for_confluent_kafka())
        await anyio.to_thread.run_sync(producer.commit_transaction)
        committed = await consumer.committed(tps(topic, 2))
        assert {tp: om.offset if om else None for tp, om in committed.items()} == dict.fromkeys(tps(topic, 2), 10)
    with pytest.raises(ConsumerClosedError):
        consumer.group_metadata()
    expect_exactly_once(read_committed(bootstrap, output), 20)


@pytest.mark.anyio
@pytest.mark.parametrize(("anyio_backend", "group_protocol"), [("asyncio", "classic"), ("trio", "consumer")])
async def test_a_revocation_counts_the_offsets_the_producer_committed(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    """``rebalance_safe_commits`` (the default) with manual commits: a revocation waits until what
    was handed out is committed.  The offsets a transactional producer committed count (only the
    group coordinator sees them), so a member giving its partitions up between two transactions
    does not wait; one whose last batch was never committed waits ``rebalance_commit_wait_ms``."""
    topic, output = new_topic(2), new_topic(1)
    group = group_name(topic)
    produce(bootstrap, topic, [(i % 2, None, b"%d" % i) for i in range(20)])
    producer = transactional_producer(bootstrap, f"tx-{topic}")
    wait_ms = 20_000
    async with Consumer(bootstrap_servers=bootstrap, group_id=group, group_protocol=group_protocol,
                        isolation_level="read_committed", enable_auto_commit=False, auto_offset_reset="earliest",
                        rebalance_commit_wait_ms=wait_ms, **FAST) as consumer:
        consumer.subscribe([topic])
        got = 0
        with anyio.fail_after(30):
            while got < 20:
                got += sum(len(records) for records in (await consumer.getmany(timeout=0.5)).values())
        producer.begin_transaction()
        producer.produce(output, value=b"processed")
        offsets = [ConfluentTopicPartition(topic, p, 10) for p in range(2)]
        metadata = consumer.group_metadata().for_confluent_kafka()
        await anyio.to_thread.run_sync(producer.send_offsets_to_transaction, offsets, metadata)
        await anyio.to_thread.run_sync(producer.commit_transaction)
        started = time.monotonic()
        await consumer.unsubscribe()  # revokes both partitions
        took = time.monotonic() - started
    assert took < wait_ms / 4000, f"the revocation took {took:.1f}s: it waited for commits the producer had made"
    # The wait is still there for what nobody committed.
    produce(bootstrap, topic, [(0, None, b"more")])
    short_ms = 2000
    async with Consumer(bootstrap_servers=bootstrap, group_id=group, group_protocol=group_protocol,
                        isolation_level="read_committed", enable_auto_commit=False, auto_offset_reset="earliest",
                        rebalance_commit_wait_ms=short_ms, **FAST) as consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            while not await consumer.getmany(timeout=0.5):
                pass
        started = time.monotonic()
        await consumer.unsubscribe()
        took = time.monotonic() - started
        assert took >= short_ms / 1000 * 0.9, f"the revocation took {took:.1f}s: it did not wait for a commit"
        assert await consumer.committed(TopicPartition(topic, 0)) == 10


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiokafka is asyncio-only
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
async def test_aiokafka_producer_takes_the_group_id(
    bootstrap: str, new_topic: Callable[..., str], group_protocol: str
) -> None:
    """aiokafka's ``send_offsets_to_transaction(offsets, group_id)`` sends no generation and no
    member id (TxnOffsetCommit v0): both kinds of group take it, without checking who sent it (no
    zombie fencing through the group), as docs/exactly-once.md says."""
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.structs import TopicPartition as AIOTopicPartition

    topic = new_topic(1)
    group = group_name(topic)
    produce(bootstrap, topic, [(0, None, b"%d" % i) for i in range(5)])
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}")
    await producer.start()
    try:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, group_protocol=group_protocol,
                            isolation_level="read_committed", enable_auto_commit=False,
                            auto_offset_reset="earliest", rebalance_safe_commits=False, **FAST) as consumer:
            consumer.subscribe([topic])
            while not await consumer.getmany(timeout=0.5):
                pass
            async with producer.transaction():
                await producer.send_offsets_to_transaction({AIOTopicPartition(topic, 0): 5},
                                                           consumer.group_metadata().group_id)
            assert await consumer.committed(TopicPartition(topic, 0)) == 5
    finally:
        await producer.stop()


# -- a zombie's commit is refused ------------------------------------------------------------------


class Example:
    """One instance of examples/exactly_once.py, started from a directory of its own."""

    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.stderr = tmp / f"{name}.err"
        workdir = tmp / name
        workdir.mkdir(exist_ok=True)
        with self.stderr.open("a") as err:
            self.proc = subprocess.Popen([sys.executable, str(EXAMPLE), *args], cwd=workdir,
                                         stdout=subprocess.DEVNULL, stderr=err)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM: it stops between two transactions and leaves the group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} did not stop on SIGTERM: {self.stderr.read_text()[-2000:]}") from None


def example_args(bootstrap: str, topic: str, output: str, group: str, transactional_id: str, protocol: str,
                 *, max_records: int = 50, backend: str = "asyncio") -> list[str]:
    args = ["--bootstrap", bootstrap, "--input", topic, "--output", output, "--group", group,
            "--transactional-id", transactional_id, "--max-records", str(max_records), "--backend", backend,
            "-X", f"group.protocol={protocol}", "-X", "fetch.max.wait.ms=100", "-X", "retry.backoff.ms=50",
            "-P", "transaction.timeout.ms=60000", "-P", "log_level=3"]
    if protocol == "classic":
        args += ["-X", f"session.timeout.ms={SESSION_MS}", "-X", "heartbeat.interval.ms=300"]
    return args


def wait_for(what: str, condition: Callable[[], bool], timeout: float, *, procs: Sequence[Example] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.name} exited ({p.proc.returncode}) while waiting for {what}: "
                                     f"{p.stderr.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("group_protocol", PROTOCOLS)
@pytest.mark.timeout(120)
def test_a_zombies_transactional_commit_is_refused(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, group_protocol: str
) -> None:
    """A member frozen (SIGSTOP) mid-transaction past its session timeout, while another takes its
    partitions and processes them: thawed, it sees that it lost its generation, and its commit of
    the batch it held is refused; the output holds every input record once."""
    total = 100
    topic, output = new_topic(2), new_topic(2)
    group = group_name(topic)
    short_sessions(bootstrap, group, group_protocol)
    produce(bootstrap, topic, [(i % 2, None, b"%d" % i) for i in range(total)])
    files = {name: tmp_path / name for name in ("holding", "go", "result")}
    cfg = {"bootstrap": bootstrap, "input": topic, "output": output, "group": group, "group_protocol": group_protocol,
           "transactional_id": f"zombie-{topic}", "session_timeout_ms": SESSION_MS, "max_records": 30,
           **{name: str(path) for name, path in files.items()}}
    err = (tmp_path / "zombie.err").open("w")
    zombie = subprocess.Popen([sys.executable, str(ZOMBIE), json.dumps(cfg)], stdout=subprocess.DEVNULL, stderr=err)
    survivor: Example | None = None
    try:
        wait_for("the zombie to hold a batch", files["holding"].exists, 60)
        holding = json.loads(files["holding"].read_text())
        zombie.send_signal(signal.SIGSTOP)
        survivor = Example(tmp_path, "survivor", example_args(bootstrap, topic, output, group, f"survivor-{topic}",
                                                               group_protocol))
        wait_for("the survivor to commit every input offset",
                 lambda: committed_total(bootstrap, group, topic, 2) == total, 60, procs=[survivor])
        zombie.send_signal(signal.SIGCONT)
        files["go"].touch()
        assert zombie.wait(timeout=60) == 0, (tmp_path / "zombie.err").read_text()[-3000:]
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            zombie.wait()
        err.close()
        survivor_code = survivor.stop() if survivor is not None else None
    assert survivor_code == 0, survivor.stderr.read_text()[-3000:] if survivor is not None else None
    result = json.loads(files["result"].read_text())
    figures = expect_exactly_once(read_committed(bootstrap, output), total)
    assert result["outcome"].startswith("refused") and "abortable: True" in result["outcome"], result
    # It knew it was no longer a member, yet kept the generation it held the batch under.
    assert result["generation_now"] != holding["generation"]
    assert result["metadata"] == [holding["generation"], holding["member_id"]]
    print(f"zombie: {holding}, {result}; {figures}")


# -- members killed and restarted mid-stream ---------------------------------------------------------


def produce_steadily(bootstrap: str, topic: str, partitions: int, total: int, seconds: float) -> threading.Thread:
    """Produce ``total`` records over about ``seconds`` (a plain confluent-kafka producer), in a thread."""

    def run() -> None:
        producer = Producer(client_quiet({"bootstrap.servers": bootstrap, "linger.ms": 5}))
        step = max(1, total // 50)
        for start in range(0, total, step):
            for i in range(start, min(total, start + step)):
                producer.produce(topic, value=b"%d" % i, partition=i % partitions)
            producer.poll(0)
            time.sleep(seconds / 50)
        assert producer.flush(30) == 0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_with_kills(bootstrap: str, tmp_path: Path, topic: str, output: str, *, partitions: int, total: int,
                   members: int, kills: int, interval: float, protocol: str, produce_seconds: float) -> str:
    group = group_name(topic)
    if protocol == "consumer":
        short_sessions(bootstrap, group, protocol)
    backends = ["asyncio", "trio"]
    started = 0

    def start(slot: int) -> Example:
        nonlocal started
        started += 1
        return Example(tmp_path, f"m{slot}-{started}", example_args(
            bootstrap, topic, output, group, f"eos-{topic}-{slot}", protocol, backend=backends[started % 2]))

    live = [start(slot) for slot in range(members)]
    producer = produce_steadily(bootstrap, topic, partitions, total, produce_seconds)
    try:
        wait_for("the first transactions", lambda: committed_total(bootstrap, group, topic, partitions) > 0, 60,
                 procs=live)
        for kill in range(kills):
            time.sleep(interval)
            slot = kill % members
            live[slot].kill()  # mid-stream: a transaction is open most of the time
            live[slot] = start(slot)  # the same transactional.id: its open transaction is aborted at once
        producer.join(timeout=120)
        wait_for("every input offset committed", lambda: committed_total(bootstrap, group, topic, partitions) == total,
                 90, procs=live)
    finally:
        codes = [member.stop() for member in live]
    assert codes == [0] * len(live), [m.stderr.read_text()[-2000:] for m in live]
    refused = sum(err.read_text().count("transaction aborted") for err in tmp_path.glob("*.err"))
    committed = read_committed(bootstrap, output)
    # Records of transactions the kills left open (aborted when the instance came back).
    left_open = len(read_committed(bootstrap, output, isolation="read_uncommitted")) - len(committed)
    return (f"{members} members, {kills} SIGKILLs, {started} processes, {left_open} output records of killed "
            f"transactions aborted, {refused} transactions refused and read again; "
            + expect_exactly_once(committed, total))


@pytest.mark.timeout(150)
def test_members_killed_and_restarted_mid_stream_output_exactly_once(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic, output = new_topic(4), new_topic(3)
    figures = run_with_kills(bootstrap, tmp_path, topic, output, partitions=4, total=3000, members=2, kills=3,
                             interval=1.5, protocol="classic", produce_seconds=5.0)
    print(figures)


@pytest.mark.long
@pytest.mark.timeout(600)
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
def test_long_members_killed_and_restarted_mid_stream_output_exactly_once(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, group_protocol: str
) -> None:
    topic, output = new_topic(6), new_topic(4)
    figures = run_with_kills(bootstrap, tmp_path, topic, output, partitions=6, total=30000, members=3, kills=12,
                             interval=2.0, protocol=group_protocol, produce_seconds=25.0)
    print(figures)
