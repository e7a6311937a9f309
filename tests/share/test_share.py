"""Share groups (KIP-932) on Apache Kafka: ShareConsumer against the real share-group coordinator.

Runs on Apache Kafka only (Tansu has no share groups) and on asyncio (test_share_trio.py has the
trio member).  Every group reads from the earliest offset (``share.auto.offset.reset``, set with
IncrementalAlterConfigs on the GROUP resource); lock durations and delivery limits are per group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from security.test_security import security_options
from support.share import apache_kafka_bootstrap, share_group  # noqa: F401 (a fixture: bootstrap)

from asyncconsumer import (
    AcknowledgementRequiredError,
    AcknowledgementResult,
    AcknowledgeType,
    AcquisitionLockExpiredError,
    ConcurrentAccessError,
    KafkaError,
    KafkaTimeoutError,
    RecordDeserializationError,
    ShareConsumer,
    ShareConsumerRecord,
    TopicPartition,
)
from asyncconsumer.errors import DecompressionLimitError
from asyncconsumer.share import ShareAcquireMode

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180), pytest.mark.broker_feature("share_groups")]

Records = list[ShareConsumerRecord[bytes, bytes]]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def group_for(bootstrap: str, **configs: object) -> str:
    return await anyio.to_thread.run_sync(lambda: share_group(bootstrap, **configs))


def values(n: int, prefix: str = "job") -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


Decide = Callable[[ShareConsumerRecord[bytes, bytes]], AcknowledgeType]


async def poll_until(consumer: ShareConsumer[bytes, bytes], want: int, *, timeout: float = 30.0,
                     ack: AcknowledgeType | Decide | None = AcknowledgeType.ACCEPT) -> Records:
    """Poll until ``want`` records arrived, acknowledging each with ``ack`` (or ``ack(record)``);
    ``None``: leave the last poll's records unacknowledged (explicit mode needs them in one poll)."""
    got: Records = []
    with anyio.fail_after(timeout):
        while len(got) < want:
            for records in (await consumer.getmany(timeout=0.5)).values():
                for r in records:
                    got.append(r)
                    if isinstance(ack, AcknowledgeType):
                        consumer.acknowledge(r, ack)
                    elif ack is not None:
                        consumer.acknowledge(r, ack(r))
    return got


async def nothing_more(consumer: ShareConsumer[bytes, bytes], seconds: float) -> Records:
    """Whatever arrives within ``seconds`` (accepted), expected to be nothing."""
    got: Records = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout=0.3)).values():
            for r in records:
                got.append(r)
                consumer.acknowledge(r, AcknowledgeType.ACCEPT)
    return got


def settled(consumer: ShareConsumer[bytes, bytes]) -> bool:
    """One partition assigned, and the member's share sessions hold exactly that one."""
    engine = consumer._engine
    assert engine is not None
    in_sessions = {tp for session in engine.fetcher._sessions.values() for tp in session.partitions}
    return len(consumer.assignment()) == 1 and in_sessions == consumer.assignment()


async def test_three_share_consumers_split_the_work_each_record_accepted_once(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(3)
    group = await group_for(bootstrap)
    total = 600
    accepted: Counter[bytes] = Counter()
    per_member: Counter[int] = Counter()
    assignments: dict[int, list[int]] = {}
    members: list[ShareConsumer[bytes, bytes]] = []
    done = anyio.Event()

    async def member(index: int, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                                 share_acknowledgement_mode="explicit", max_poll_records=20) as consumer:
            consumer.subscribe([topic])
            await consumer.wait_for_assignment()
            members.append(consumer)
            task_status.started()
            while not done.is_set():
                for records in (await consumer.getmany(timeout=0.2)).values():
                    for r in records:
                        await anyio.sleep(0.002)  # a little work per job, so that the members share
                        assert r.value is not None
                        accepted[r.value] += 1
                        per_member[index] += 1
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT)
                if sum(accepted.values()) >= total:
                    done.set()
            assignments[index] = sorted(tp.partition for tp in consumer.assignment())
            assert all(error is None for error in (await consumer.commit()).values())

    async with anyio.create_task_group() as tg:
        for i in range(3):
            await tg.start(member, i)
        # A member learns of a new assignment at its next heartbeat, and a long-polling ShareFetch
        # sent before still names the partitions it had (the broker serves them).  Produce once the
        # three hold one partition each and their share sessions say so too.
        with anyio.fail_after(30):
            while not all(settled(m) for m in members):  # noqa: ASYNC110
                await anyio.sleep(0.1)
        await anyio.to_thread.run_sync(lambda: produce(topic, [(i % 3, None, v) for i, v in enumerate(values(total))]))
        with anyio.fail_after(60):
            await done.wait()

    assert set(accepted) == set(values(total))
    assert max(accepted.values()) == 1, [v for v, n in accepted.items() if n > 1][:5]
    assert len(per_member) == 3 and min(per_member.values()) > 0, (per_member, assignments)
    # Nothing left for a latecomer: every record was accepted.
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as late:
        late.subscribe([topic])
        assert await nothing_more(late, 3.0) == []


async def test_release_redelivers_with_delivery_count_2(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(5)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        first = await poll_until(
            consumer, 5, ack=lambda r: AcknowledgeType.RELEASE if r.offset == 2 else AcknowledgeType.ACCEPT)
        assert [r.delivery_count for r in first] == [1] * 5
        assert all(e is None for e in (await consumer.commit()).values())
        first_round = consumer.metrics()
        again = await poll_until(consumer, 1)
        assert [(r.offset, r.value, r.delivery_count) for r in again] == [(2, b"job-2", 2)]
        await consumer.commit()
        assert await nothing_more(consumer, 2.0) == []
        m = consumer.metrics()
    # The released record was delivered, acquired and acknowledged twice.
    assert first_round.records_delivered == 5 and first_round.fetch.records_acquired in (5, 6)  # 6: re-acquired
    assert (first_round.acknowledgements.acknowledged, first_round.acknowledgements.failed) == (5, 0)
    assert (m.records_delivered, m.fetch.records_acquired, m.acknowledgements.acknowledged) == (6, 6, 6)
    assert (m.acknowledgements.failed, m.acknowledgements.pending, m.fetch.errors) == (0, 0, 0)
    assert m.fetch.requests >= m.fetch.responses >= 2 and m.fetch.latency.count >= 2
    assert m.fetch.response_bytes > 0 and m.fetch.buffer_bytes == 0
    assert m.membership.state == "stable" and m.membership.assignment == {TopicPartition(topic, 0)}
    assert m.membership.member_epoch > 0 and m.membership.assignment_changes >= 1 and m.membership.member_id
    assert m.connections.open >= 1 and m.connections.errors == 0


async def test_the_meter_provider_sees_delivered_records_and_share_request_durations(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    from observability.test_otel import points
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    topic = new_topic(2)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, [(i % 2, None, b"%d" % i) for i in range(40)]))
    reader = InMemoryMetricReader()
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             meter_provider=MeterProvider(metric_readers=[reader])) as consumer:
        consumer.subscribe([topic])
        await poll_until(consumer, 40)
        assert all(e is None for e in (await consumer.commit()).values())
        ours = consumer.metrics()
        consumed = points(reader, "messaging.client.consumed.messages")
        durations = points(reader, "messaging.client.operation.duration")
        lag = points(reader, "kafka.consumer.records_lag")
        data = reader.get_metrics_data()
        names = {m.name for r in data.resource_metrics for sc in r.scope_metrics for m in sc.metrics} if data else set()
    assert "messaging.client.consumed.messages" in names and "kafka.consumer.records_lag" not in names
    assert {int(p.attributes["messaging.destination.partition.id"]): p.value for p in consumed} == {0: 20, 1: 20}
    assert ours.records_delivered == 40
    assert all(p.attributes["messaging.consumer.group.name"] == group for p in consumed)
    ops = {p.attributes["messaging.operation.name"]: p for p in durations}
    assert ops["fetch"].count == ours.fetch.latency.count > 0
    assert ops.get("ack") is None or ops["ack"].count == ours.acknowledgements.latency.count
    assert lag == []  # a share group has no position per member


SECURED = [("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"), ("SSL", None),
           ("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "OAUTHBEARER"), ("SASL_SSL", "OAUTHBEARER")]


@pytest.mark.parametrize(("listener", "mechanism"), SECURED, ids=[f"{lst}-{m or 'tls'}" for lst, m in SECURED])
async def test_a_share_consumer_reads_over_every_secured_listener(
    apache_kafka: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any],
    listener: str, mechanism: str | None,
) -> None:
    """The share loop connects and logs in as the consumer's does (engine/core.py): TLS with the
    brokers' CA and host name checked, SASL PLAIN, SCRAM and OAUTHBEARER (an async token provider)."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(3)))
    options = security_options(apache_kafka.broker, listener, mechanism)
    async with ShareConsumer(group_id=group, **options) as consumer:
        consumer.subscribe([topic])
        got = await poll_until(consumer, 3)
        assert sorted(r.value for r in got) == values(3)
        assert all(e is None for e in (await consumer.commit()).values())
    if mechanism == "OAUTHBEARER":
        assert options["sasl_oauth_token_provider"].calls >= 1


async def test_reject_is_never_redelivered(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(3)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        await poll_until(consumer, 3, ack=lambda r: AcknowledgeType.REJECT if r.offset == 0 else AcknowledgeType.ACCEPT)
        assert all(e is None for e in (await consumer.commit()).values())
        assert await nothing_more(consumer, 4.0) == []  # longer than the lock: not just still locked


async def test_an_undecodable_record_is_released_and_the_records_after_it_come_decoded_after_the_error(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=5000, share_delivery_count_limit=2)
    jobs = [b'{"n": 0}', b'{"n": 1}', b"not json", b'{"n": 3}', b'{"n": 4}']
    await anyio.to_thread.run_sync(lambda: produce(topic, jobs))  # one partition, one batch
    seen: list[int] = []
    errors: list[tuple[int, RecordDeserializationError]] = []  # (records seen before it, the error)
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             value_deserializer=json.loads) as consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            while len(seen) < 4:
                try:
                    polled = await consumer.getmany(timeout=0.5)
                except RecordDeserializationError as exc:
                    errors.append((len(seen), exc))
                    continue
                for records in polled.values():
                    for r in records:
                        assert isinstance(r.value, dict), f"handed out undecoded: {r}"
                        seen.append(r.value["n"])
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT)
    assert seen == [0, 1, 3, 4]
    # The error comes between the records before the bad one and those after it, naming it.
    assert errors and errors[0][0] == 2 and errors[0][1].offset == 2
    assert "it was released" in str(errors[0][1])


async def test_a_batch_over_the_decompression_bound_is_released_until_the_delivery_limit(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """A gzip batch that decompresses to more than ``max_batch_decompressed_bytes``: each poll
    that meets it raises DecompressionLimitError naming it, and its record is released (a member
    with more room could read it) until the group's delivery limit archives it; the records
    before and after it (separate batches, produced by confluent-kafka) are handed out once."""
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000, share_delivery_count_limit=2)
    for batch in ([b"a0", b"a1"], [bytes(256 * 1024)], [b"c3", b"c4"]):  # one batch each: offsets 0-1, 2, 3-4
        await anyio.to_thread.run_sync(lambda batch=batch: produce(topic, batch, "gzip"))
    seen: list[int] = []
    errors: list[DecompressionLimitError] = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             max_batch_decompressed_bytes=64 * 1024) as consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            while len(seen) < 4 or len(errors) < 2:
                try:
                    polled = await consumer.getmany(timeout=0.5)
                except DecompressionLimitError as exc:
                    errors.append(exc)
                    continue
                seen += [r.offset for records in polled.values() for r in records]
        assert await nothing_more(consumer, 4.0) == []  # longer than the lock: archived, not locked
    assert sorted(seen) == [0, 1, 3, 4]
    assert [(e.topic, e.partition, e.offset) for e in errors] == [(topic, 0, 2)] * 2
    assert "max_batch_decompressed_bytes" in str(errors[0]) and "released" in errors[0].__notes__[0]


async def test_implicit_mode_accepts_what_was_handed_out_at_the_next_poll(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, [(i % 2, None, v) for i, v in enumerate(values(50))]))
    seen: list[bytes] = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as consumer:
        assert consumer.acknowledgement_mode == "implicit"
        consumer.subscribe([topic])
        with anyio.fail_after(30):
            async for record in consumer:
                assert record.value is not None
                seen.append(record.value)
                if len(seen) == 50:
                    break
        await consumer.commit()  # accepts the last records handed out too
    assert sorted(seen) == sorted(values(50))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as again:
        again.subscribe([topic])
        assert await nothing_more(again, 4.0) == []


async def test_explicit_mode_refuses_to_poll_with_unacknowledged_records(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(3)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        got = await poll_until(consumer, 3, ack=None)
        consumer.acknowledge(got[0], AcknowledgeType.ACCEPT)
        with pytest.raises(AcknowledgementRequiredError, match="2 record"):
            await consumer.getmany(timeout=0.1)
        for r in got[1:]:
            consumer.acknowledge(r)
        assert await consumer.getmany(timeout=0.1) == {}


async def test_a_commit_not_answered_in_time_raises_kafka_timeout_error(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """Like every error of the library a KafkaError (docs/errors.md), also a TimeoutError; the
    acknowledgements still reach the broker, and a later commit() reports them."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(2)))
    outcomes: list[dict[TopicPartition, AcknowledgementResult]] = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             on_acknowledgement_commit=outcomes.append) as consumer:
        consumer.subscribe([topic])
        got = await poll_until(consumer, 2, ack=None)
        with pytest.raises(TypeError):
            await consumer.commit(5.0)  # type: ignore[misc]  # timeout is keyword-only
        for r in got:
            consumer.acknowledge(r, AcknowledgeType.ACCEPT)
        with pytest.raises(KafkaTimeoutError, match=r"did not answer the acknowledgements within 0\.0s") as raised:
            await consumer.commit(timeout=0)  # the ShareAcknowledge is not even sent yet
        assert isinstance(raised.value, KafkaError) and isinstance(raised.value, TimeoutError)
        await consumer.commit(timeout=30)  # waits for the acknowledgements on their way, if still
        assert outcomes == [{TopicPartition(topic, 0): AcknowledgementResult((0, 1), None)}]
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as again:
        again.subscribe([topic])
        assert await nothing_more(again, 4.0) == []


async def test_a_lock_that_ran_out_is_a_typed_error_and_the_record_comes_back(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(1)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        (record,) = await poll_until(consumer, 1, ack=None)
        assert record.lock_deadline - time.monotonic() == pytest.approx(2.0, abs=1.0)
        await anyio.sleep(max(0.0, record.lock_deadline - time.monotonic()) + 0.3)
        with pytest.raises(AcquisitionLockExpiredError, match="offset 0"):
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)
        (back,) = await poll_until(consumer, 1)
        assert (back.offset, back.delivery_count) == (0, 2)


async def test_the_delivery_count_limit_archives_the_record(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_delivery_count_limit=2, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(1)))
    counts = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        for _ in range(2):
            (record,) = await poll_until(consumer, 1, ack=AcknowledgeType.RELEASE)
            counts.append(record.delivery_count)
            await consumer.commit()
        assert counts == [1, 2]
        assert await nothing_more(consumer, 4.0) == []


_KILLED_MEMBER = textwrap.dedent("""
    import sys, anyio
    from asyncconsumer import ShareConsumer

    async def main(bootstrap, group, topic):
        async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                                 share_acknowledgement_mode="explicit") as consumer:
            consumer.subscribe([topic])
            got = 0
            while True:
                batch = await consumer.getmany(timeout=0.5, max_records=1000)
                got += sum(len(rs) for rs in batch.values())
                if got:
                    print("acquired", got, flush=True)
                    await anyio.sleep(3600)  # holds the records, never acknowledges

    anyio.run(main, *sys.argv[1:])
""")


async def test_a_sigkilled_members_records_come_back_after_the_lock_timeout(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=3000)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(20)))
    proc = await anyio.to_thread.run_sync(lambda: subprocess.Popen(
        [sys.executable, "-c", _KILLED_MEMBER, bootstrap, group, topic], stdout=subprocess.PIPE, text=True))
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)  # type: ignore[union-attr]
        assert line.startswith("acquired"), line
        held = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = time.monotonic()
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as survivor:
        survivor.subscribe([topic])
        got = await poll_until(survivor, 20, ack=None)
        await survivor.commit()
    redelivered = [r for r in got if r.delivery_count == 2]
    assert len(redelivered) == held and {r.delivery_count for r in got} <= {1, 2}
    assert sorted(r.value for r in got) == sorted(values(20))  # type: ignore[type-var]
    # The held records came back only once their locks ran out (3 s after acquisition).
    assert time.monotonic() - killed_at > 1.0


async def test_a_group_shared_with_javas_console_share_consumer(
    apache_kafka: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    group = await group_for(bootstrap)
    total = 400
    command = apache_kafka.broker.java_command(
        "org.apache.kafka.tools.consumer.ConsoleShareConsumer", "--bootstrap-server", bootstrap,
        "--topic", topic, "--group", group, "--timeout-ms", "8000")
    java = await anyio.to_thread.run_sync(lambda: subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    ours: list[bytes] = []
    try:
        async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                                 share_acknowledgement_mode="explicit", max_poll_records=10) as consumer:
            consumer.subscribe([topic])
            await consumer.wait_for_assignment()
            # The Java member has joined once ours is down to one of the two partitions.
            with anyio.fail_after(60):
                while not settled(consumer):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            await anyio.to_thread.run_sync(
                lambda: produce(topic, [(i % 2, None, v) for i, v in enumerate(values(total))]))
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 5.0:
                for records in (await consumer.getmany(timeout=0.3)).values():
                    idle_since = time.monotonic()
                    for r in records:
                        await anyio.sleep(0.005)  # slower than Java per record, so that both get work
                        assert r.value is not None
                        ours.append(r.value)
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT)
            await consumer.commit()
        out, _ = await anyio.to_thread.run_sync(lambda: java.communicate(timeout=60))
    finally:
        if java.poll() is None:
            java.kill()
            java.wait()
    theirs = [line.encode() for line in out.splitlines() if line.startswith("job-")]
    assert ours and theirs, (len(ours), len(theirs))
    assert sorted(ours + theirs) == sorted(values(total))  # every record once, in one member or the other


async def test_renew_keeps_a_slow_record_acquired_past_its_lock(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap, share_record_lock_duration_ms=2000)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(1)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        (record,) = await poll_until(consumer, 1, ack=None)
        first_deadline = consumer.lock_deadline(record)
        for _ in range(3):  # 3 s of work on a 2 s lock
            await anyio.sleep(1.0)
            consumer.acknowledge(record, AcknowledgeType.RENEW)
            assert all(e is None for e in (await consumer.commit()).values())
        assert consumer.lock_deadline(record) > first_deadline + 2.0
        consumer.acknowledge(record, AcknowledgeType.ACCEPT)
        assert all(e is None for e in (await consumer.commit()).values())
        assert await nothing_more(consumer, 3.0) == []


async def test_the_share_apis_are_negotiated_at_their_newest_versions(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """The codec's ShareGroupHeartbeat v1, ShareFetch v2, ShareAcknowledge v2 (KIP-1222 renewals) are
    what Kafka 4.4.0 offers and what the share consumer's connections pick."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(1)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as consumer:
        consumer.subscribe([topic])
        await poll_until(consumer, 1, ack=None)
        engine = consumer._engine
        assert engine is not None
        connections = list(engine.network._connections.values())
        assert connections
        chosen = {api: connections[0].choose_version(api)
                  for api in ("ShareGroupHeartbeat", "ShareFetch", "ShareAcknowledge", "ShareGroupDescribe")}
    assert chosen == {"ShareGroupHeartbeat": 1, "ShareFetch": 2, "ShareAcknowledge": 2, "ShareGroupDescribe": 1}


async def test_close_releases_what_explicit_mode_left_unacknowledged(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap)  # the broker's 15 s lock: a redelivery within it was a release
    await anyio.to_thread.run_sync(lambda: produce(topic, values(4)))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as first:
        first.subscribe([topic])
        got = await poll_until(first, 4, ack=None)
        first.acknowledge(got[0], AcknowledgeType.ACCEPT)
        closing = time.monotonic()
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as second:
        second.subscribe([topic])
        again = await poll_until(second, 3, ack=None, timeout=10.0)
        await second.commit()
    assert time.monotonic() - closing < 12.0
    assert sorted((r.offset, r.delivery_count) for r in again) == [(1, 2), (2, 2), (3, 2)]


async def test_a_second_task_polling_at_the_same_time_is_refused(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap)
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group) as consumer:
        consumer.subscribe([topic])
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consumer.getmany(timeout=1.0))
            await anyio.sleep(0.1)
            with pytest.raises(ConcurrentAccessError, match=r"getmany\(\) called from task .* share consumer"):
                await consumer.getmany(timeout=0.1)
        assert await consumer.getmany(timeout=0.1) == {}  # free again once the first poll returned


async def test_fetch_buffer_bytes_bounds_the_share_batches_and_fetching_resumes_as_records_are_taken(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """The consumer's ``fetch_buffer_bytes``: records not handed out yet never hold more than the
    bound plus one response (one leader here), and the loop fetches again as the application takes
    them (bytes freed: every record arrives)."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    total = 3000
    payload = [b"%05d-" % i + b"x" * 100 for i in range(total)]
    await anyio.to_thread.run_sync(lambda: produce(topic, payload))
    bound = 16384
    seen: list[bytes] = []
    peak = largest = 0
    full_seen = 0
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, fetch_buffer_bytes=bound,
                             max_partition_fetch_bytes=bound, max_poll_records=100) as consumer:
        consumer.subscribe([topic])
        engine = consumer._engine
        assert engine is not None and engine.fetcher.max_buffer_bytes == bound
        with anyio.fail_after(60):
            while len(seen) < total:
                largest = max([largest, *(b.size for b in engine.batches)])
                peak = max(peak, engine.fetcher.buffered_bytes)
                full_seen += engine.fetcher.buffer_full
                for records in (await consumer.getmany(timeout=0.5)).values():
                    seen.extend(r.value for r in records if r.value is not None)
                await anyio.sleep(0.001)
        assert all(e is None for e in (await consumer.commit()).values())
    assert sorted(seen) == payload
    assert largest > 0 and full_seen > 0  # responses are bigger than the bound: it was reached
    assert peak <= bound + largest, (peak, bound, largest)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_acknowledgement_commit_callback_sees_every_acknowledgement_once(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], kind: str
) -> None:
    """Acknowledgements sent by commit() (accept 0-4 and 7-9, reject 5 and 6), riding on a
    ShareFetch (accept 10 and 11, reported at a later poll) and sent by close() (12 and 13, released):
    each offset reaches the callback once, with no error."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(12)))
    calls: list[dict[TopicPartition, AcknowledgementResult]] = []

    def sync_callback(results: dict[TopicPartition, AcknowledgementResult]) -> None:
        calls.append(results)

    async def async_callback(results: dict[TopicPartition, AcknowledgementResult]) -> None:
        await anyio.lowlevel.checkpoint()
        calls.append(results)

    callback = sync_callback if kind == "sync" else async_callback
    tp = TopicPartition(topic, 0)

    def offsets() -> list[int]:
        assert all(set(c) == {tp} and c[tp].error is None for c in calls), calls
        return sorted(o for c in calls for o in c[tp].offsets)

    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             max_poll_records=5, on_acknowledgement_commit=callback) as consumer:
        consumer.subscribe([topic])
        assert [r.offset for r in await poll_until(consumer, 5)] == [0, 1, 2, 3, 4]
        more = await poll_until(consumer, 5, ack=None)  # the accepts rode on this poll's ShareFetch
        assert calls == []  # answered, but the callback runs in a poll, commit() or close()
        consumer.acknowledge(more[0], AcknowledgeType.REJECT)
        consumer.acknowledge(more[1], AcknowledgeType.REJECT)
        for r in more[2:]:
            consumer.acknowledge(r, AcknowledgeType.ACCEPT)
        assert await consumer.commit() == {tp: None}
        assert offsets() == list(range(10))  # commit() ran the callback before returning
        assert [r.offset for r in await poll_until(consumer, 2)] == [10, 11]  # accepted
        with anyio.fail_after(10):
            while offsets() != list(range(12)):
                assert await consumer.getmany(timeout=0.2) == {}  # the callback runs as a poll starts
        await anyio.to_thread.run_sync(lambda: produce(topic, values(2, "late")))
        assert [r.offset for r in await poll_until(consumer, 2, ack=None)] == [12, 13]
    assert offsets() == list(range(14))  # close() released 12 and 13 and reported them


@pytest.mark.parametrize("mode", ["record_limit", "batch_optimized"])
async def test_record_limit_acquires_at_most_max_poll_records_per_fetch(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], mode: ShareAcquireMode
) -> None:
    """KIP-1206 on Apache Kafka: with "record_limit" no ShareFetch acquires more than max_records
    (``max_poll_records``), although the records were written in large batches; "batch_optimized"
    (the default) acquires whole batches, more than that, from the same data."""
    topic = new_topic(1)
    group = await group_for(bootstrap)
    total, limit = 200, 7
    await anyio.to_thread.run_sync(lambda: produce(topic, values(total)))
    acquisitions: list[int] = []
    seen: list[int] = []
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, max_poll_records=limit,
                             share_acquire_mode=mode) as consumer:
        consumer.subscribe([topic])
        engine = consumer._engine
        assert engine is not None
        hand_over = engine.fetcher._on_batch

        def count(batch: Any) -> None:
            acquisitions.append(len(batch.records))
            hand_over(batch)

        engine.fetcher._on_batch = count
        seen += [r.offset for r in await poll_until(consumer, total)]
        assert all(e is None for e in (await consumer.commit()).values())
    assert sorted(seen) == list(range(total))
    if mode == "record_limit":
        assert max(acquisitions) <= limit, acquisitions
    else:
        assert max(acquisitions) > limit, acquisitions


async def test_what_the_acknowledgement_commit_callback_raises_comes_out_of_commit_and_the_next_poll(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, values(4)))

    class Boom(Exception):
        pass

    raised = 0

    def callback(results: object) -> None:
        nonlocal raised
        raised += 1
        raise Boom(f"callback call {raised}")

    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
                             max_poll_records=2) as consumer:
        consumer.subscribe([topic])
        first = await poll_until(consumer, 2)
        consumer.set_acknowledgement_commit_callback(callback)
        with pytest.raises(Boom, match="call 1"):
            await consumer.commit()
        consumer.set_acknowledgement_commit_callback(None)
        assert [r.offset for r in first] == [0, 1]
        second = await poll_until(consumer, 2)  # the callback is gone: polls go on
        assert [r.offset for r in second] == [2, 3]
        consumer.set_acknowledgement_commit_callback(callback)
        # The accepts of 2 and 3 ride on the next ShareFetch; a poll after its answer raises.
        with anyio.fail_after(10), pytest.raises(Boom, match="call 2"):
            while True:
                assert await consumer.getmany(timeout=0.2) == {}
        consumer.set_acknowledgement_commit_callback(None)
    assert raised == 2
