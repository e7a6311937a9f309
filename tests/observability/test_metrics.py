"""``Consumer.metrics()`` against the real broker: every number checked against a known one.

N records read through each API are N records consumed; bytes consumed equal the record bytes the
fetch responses carried; lag is the end offset minus the position after a partial read; a commit,
a rebalance, fetch latencies and connections are counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.consumers import FAST, tps

from asyncconsumer import Consumer, ConsumerMetrics, TopicPartition
from asyncconsumer.metrics import LATENCY_BUCKETS, LatencyRecorder

pytestmark = pytest.mark.anyio

VALUE = b"v" * 100


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **{**FAST, **options})


async def read(c: Consumer[Any, Any], n: int, api: str) -> int:
    got = 0
    with anyio.fail_after(60):
        if api == "batches":
            async for batch in c.batches():
                got += len(batch)
                if got >= n:
                    break
        elif api == "arrow_batches":
            async for record_batch in c.arrow_batches():
                got += record_batch.num_rows
                if got >= n:
                    break
        elif api == "async for":
            async for _ in c:
                got += 1
                if got >= n:
                    break
        else:
            while got < n:
                got += sum(map(len, (await c.getmany(timeout=1)).values()))
    return got


@pytest.mark.parametrize("api", ["batches", "async for", "getmany", "arrow_batches"])
async def test_records_and_bytes_consumed_equal_what_was_read(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], api: str
) -> None:
    topic = new_topic(2)
    n = 1000
    produce(topic, ((i % 2, None, VALUE) for i in range(n)))
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 2))
        assert await read(c, n, api) == n
        # A completed fetch counts as used up once a poll finds nothing more in it.
        assert await c.getmany(timeout=0.3) == {}
        m = c.metrics()
    assert isinstance(m, ConsumerMetrics)
    assert m.records_consumed == n
    assert {tp: p.records_consumed for tp, p in m.partitions.items()} == {tp: n // 2 for tp in tps(topic, 2)}
    # Every fetched batch was used up: the bytes handed out are the record bytes fetched, which hold
    # at least the values and at most the values plus a record's and a batch's overhead each.
    assert m.bytes_consumed == m.fetch.response_bytes
    assert n * len(VALUE) < m.bytes_consumed < n * (len(VALUE) + 30) + 61 * n // 10
    for tp, p in m.partitions.items():
        assert (p.position, p.high_watermark, p.lag) == (n // 2, n // 2, 0), tp
    assert m.lag == 0
    assert m.fetch.buffer_bytes == 0


async def test_lag_is_end_minus_position_after_a_partial_read(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], kafka_backend: Any
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, b"%d" % i) for i in range(500)))
    tp = TopicPartition(topic, 0)
    async with consumer(bootstrap, max_poll_records=120) as c:
        c.assign([tp])
        got = await c.getmany(timeout=10)
        assert len(got[tp]) == 120
        p = c.metrics().partitions[tp]
        assert (p.position, p.high_watermark, p.last_stable_offset) == (120, 500, 500)
        assert p.lag == 500 - 120
        assert p.position == await c.position(tp)
        if kafka_backend.name == "kafka":  # Tansu's ListOffsets(latest) answers 1 here, not the end
            assert p.lag == (await c.end_offsets([tp]))[tp] - await c.position(tp)
        assert p.records_consumed == 120
        # More produced: the lag follows the high watermark of the next fetch response.
        produce(topic, ((0, None, b"x") for _ in range(100)))
        for _ in range(400):  # the buffered records are not read: only the fetches move on
            if c.metrics().partitions[tp].high_watermark == 600:
                break
            await anyio.sleep(0.05)
        assert c.metrics().partitions[tp].lag == 600 - 120
        assert c.metrics().lag == 480


async def test_fetch_requests_latency_and_connections(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, ((0, None, VALUE) for _ in range(50)))
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        await read(c, 50, "getmany")
        await anyio.sleep(0.5)  # idle fetches wait fetch_max_wait_ms (100 ms) on the broker
        m = c.metrics()
    f = m.fetch
    assert f.responses >= 1 and f.requests >= f.responses
    latency = f.latency
    assert latency.count >= f.responses
    assert 0 < latency.max <= latency.sum
    assert latency.sum / latency.count == latency.mean
    assert sum(count for _, count in latency.buckets) == latency.count
    assert [bound for bound, _ in latency.buckets] == [*LATENCY_BUCKETS, float("inf")]
    # Idle fetches parked by the broker take about fetch_max_wait_ms each.
    assert latency.max >= 0.05
    assert f.response_bytes_max <= f.response_bytes
    assert m.connections.open >= 1 and m.connections.opened >= m.connections.open
    assert m.connections.errors == 0 and m.connections.reconnects == 0
    # No group: no rebalances, no commits.
    assert m.rebalances.count == 0 and m.rebalances.member_state is None
    assert m.commits.count == 0 and m.commits.latency.count == 0
    # The names of the first version of the snapshot.
    assert m.fetch_responses == f.responses and m.fetch_responses_by_node == f.responses_by_node
    assert m.connections_opened == m.connections.opened


async def test_last_poll_age_grows_while_the_application_does_not_poll(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    async with consumer(bootstrap) as c:
        c.assign(tps(topic, 1))
        await c.getmany(timeout=0)
        assert c.metrics().last_poll_age < 0.5
        # Waiting inside a poll (nothing to read) is polling: the age stays 0 meanwhile.
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.getmany)
            await anyio.sleep(0.8)
            assert c.metrics().last_poll_age == 0
            tg.cancel_scope.cancel()
        await anyio.sleep(0.6)
        assert c.metrics().last_poll_age >= 0.6
        await c.getmany(timeout=0)
        assert c.metrics().last_poll_age < 0.5


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])  # "consumer": Apache Kafka only (conftest)
async def test_a_commit_and_a_rebalance_are_counted(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_protocol: str
) -> None:
    topic = new_topic(2)
    produce(topic, ((i % 2, None, b"x") for i in range(10)))
    group = f"g-{topic}"
    options = {"group_id": group, "session_timeout_ms": 6000, "heartbeat_interval_ms": 300,
               "enable_auto_commit": False, "group_protocol": group_protocol}
    async with consumer(bootstrap, **options) as c:
        c.subscribe([topic])
        got = 0
        with anyio.fail_after(30):
            while c.metrics().rebalances.member_state != "stable" or len(c.assignment()) != 2:
                got += sum(map(len, (await c.getmany(timeout=0.1)).values()))
        first = c.metrics().rebalances
        # Classic: one join, one rebalance.  KIP-848: every reconciliation to a new assignment counts,
        # and the first heartbeat often makes the member stable with no partitions yet.
        assert first.count == 1 if group_protocol == "classic" else first.count >= 1
        assert first.last_duration is not None and 0 < first.last_duration < 30
        assert first.generation is not None and first.generation >= 0 and first.member_id

        # Read everything, commit once.
        with anyio.fail_after(30):
            while got < 10:
                got += sum(map(len, (await c.getmany(timeout=0.5)).values()))
        await c.commit()
        m = c.metrics()
        assert (m.commits.count, m.commits.failures) == (1, 0)
        assert m.commits.latency.count == 1 and m.commits.latency.sum > 0
        assert {tp: p.committed for tp, p in m.partitions.items()} == {tp: 5 for tp in tps(topic, 2)}

        # A second member joins: one more rebalance, each member ends with one partition.
        async with consumer(bootstrap, **options) as other:
            other.subscribe([topic])
            with anyio.fail_after(30):
                while not (len(c.assignment()) == 1 and len(other.assignment()) == 1
                           and c.metrics().rebalances.member_state == "stable"
                           and other.metrics().rebalances.member_state == "stable"):
                    await c.getmany(timeout=0.05)
                    await other.getmany(timeout=0.05)
            after = c.metrics().rebalances
            transitions = c._engine.membership.transitions  # type: ignore[union-attr]
            if group_protocol == "classic":
                assert after.count == 2, transitions
                assert other.metrics().rebalances.count == 1
            else:  # giving a partition up is one reconciliation at least (the member epoch moves on)
                assert after.count > first.count, transitions
                assert other.metrics().rebalances.count >= 1
            assert after.generation is not None and after.generation > first.generation


def test_latency_recorder_counts_sums_and_buckets() -> None:
    recorder = LatencyRecorder()
    for seconds in (0.0005, 0.001, 0.002, 0.2, 7.0):
        recorder.record(seconds)
    snap = recorder.snapshot()
    assert (snap.count, snap.max) == (5, 7.0)
    assert snap.sum == pytest.approx(7.2035)
    counts = dict(snap.buckets)
    assert counts[0.001] == 2 and counts[0.005] == 1 and counts[0.5] == 1 and counts[float("inf")] == 1
    assert sum(counts.values()) == 5
