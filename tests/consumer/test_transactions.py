"""Transactions on Apache Kafka: ``isolation_level`` against confluent-kafka's transactional producer.

Tansu has no transaction filtering, so this module runs on Apache Kafka only.  The records are
written by librdkafka's transactional producer (``transactional.id``, ``init_transactions``,
``begin_transaction``, ``commit_transaction``, ``abort_transaction``) and plain records by a
non-transactional producer, interleaved; every expected offset comes from their delivery reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from support.consumers import FAST, tps
from support.producer import Transactions, produce

from asyncconsumer import Consumer, TopicPartition

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

Seen = tuple[int, int, bytes]  # (partition, offset, value)


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too)."""
    return str(apache_kafka.bootstrap)


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, **{**FAST, "auto_offset_reset": "earliest", **options})


@dataclass
class Log:
    """What was written: the records a reader should get, and the ones it must not."""

    topic: str
    partitions: int
    committed: list[Seen] = field(default_factory=list)  # committed transactions and plain records
    aborted: list[Seen] = field(default_factory=list)

    @property
    def tps(self) -> list[TopicPartition]:
        return tps(self.topic, self.partitions)


def write_transactions(bootstrap: str, new_topic: Callable[..., str]) -> Log:
    """Three partitions, four transactions, plain records in between:

    - T1 (committed) spans every partition and two batches on each (a flush in the middle), with
      plain records written to partitions 0 and 1 while it is open;
    - T2 (aborted) on partitions 0 and 1;
    - T3 (committed) on partitions 0 and 2, so that on partition 0 an aborted transaction lies
      between two committed ones;
    - T4 (aborted) on partition 2, so that partition 2 ends with an abort marker, partition 1 with
      T2's abort marker and partition 0 with T3's commit marker.
    """
    log = Log(new_topic(3), 3)

    def plain(partition: int, value: bytes) -> None:
        ((p, offset),) = produce(bootstrap, log.topic, [(partition, None, value)])
        log.committed.append((p, offset, value))

    with Transactions(bootstrap, log.topic) as tx:
        tx.begin()
        for p in range(3):
            tx.send(p, b"t1-%d-a" % p)
        tx.flush()
        plain(0, b"plain-0")
        plain(1, b"plain-1")
        for p in range(3):
            tx.send(p, b"t1-%d-b" % p)
        tx.commit()
        log.committed += tx.delivered
        tx.delivered.clear()

        tx.begin()
        for p in (0, 1, 0, 1):
            tx.send(p, b"t2-%d" % p)
        tx.abort()
        log.aborted += tx.delivered
        tx.delivered.clear()

        tx.begin()
        for p in (0, 2, 0):
            tx.send(p, b"t3-%d" % p)
        tx.commit()
        log.committed += tx.delivered
        tx.delivered.clear()

        tx.begin()
        tx.send(2, b"t4-2")
        tx.abort()
        log.aborted += tx.delivered
    log.committed.sort()
    log.aborted.sort()
    assert len(log.committed) == 11 and len(log.aborted) == 5
    return log


async def read_all(c: Consumer[Any, Any], api: str, count: int, log: Log) -> list[Seen]:
    """Read ``count`` records with one of the four reading APIs; then wait (with the partition
    streams still running) until every position is past the end of its partition's log."""
    seen: list[Seen] = []
    ends = await c.end_offsets(log.tps)

    async def past_the_end() -> None:
        with anyio.fail_after(10):
            while {tp: await c.position(tp) for tp in log.tps} != ends:  # noqa: ASYNC110 (positions are polled, not signalled)
                await anyio.sleep(0.05)

    with anyio.fail_after(60):
        if api == "getmany":
            while len(seen) < count:
                for records in (await c.getmany(timeout=1)).values():
                    seen += [(r.partition, r.offset, r.value) for r in records]
        elif api == "async for":
            async for r in c:
                seen.append((r.partition, r.offset, r.value))
                if len(seen) == count:
                    break
        elif api == "batches":
            async for batch in c.batches():
                seen += [(r.partition, r.offset, r.value) for r in batch]
                if len(seen) >= count:
                    break
        else:
            done = anyio.Event()

            async def drain(stream: Any) -> None:
                async for r in stream:
                    seen.append((r.partition, r.offset, r.value))
                    if len(seen) == count:
                        done.set()

            async with anyio.create_task_group() as tg:

                async def open_streams() -> None:
                    async for _, stream in c.partitions():
                        tg.start_soon(drain, stream)

                tg.start_soon(open_streams)
                await done.wait()
                await past_the_end()  # the streams' poll loop moves idle partitions on
                tg.cancel_scope.cancel()
    await past_the_end()
    return sorted(seen)


@pytest.mark.parametrize("api", ["getmany", "async for", "batches", "partitions"])
async def test_read_committed_gets_committed_and_plain_records_never_aborted_ones_nor_markers(
    bootstrap: str, new_topic: Callable[..., str], api: str
) -> None:
    log = write_transactions(bootstrap, new_topic)
    async with consumer(bootstrap, isolation_level="read_committed", group_id=f"g-{log.topic}",
                        enable_auto_commit=False) as c:
        c.assign(log.tps)
        seen = await read_all(c, api, len(log.committed), log)
        assert seen == log.committed
        # Nothing more comes: no aborted record, no control record.
        assert await c.getmany(timeout=0.5) == {}
        # Positions and commits are past the markers that end each partition (Java's position too).
        ends = await c.end_offsets(log.tps)
        assert ends == {tp: c.highwater(tp) for tp in log.tps}  # no transaction open: LSO = HW
        for tp in log.tps:
            last_data = max(o for p, o, _ in log.committed + log.aborted if p == tp.partition)
            assert ends[tp] == last_data + 2  # one marker after the last record
            assert await c.position(tp) == ends[tp]
        await c.commit()
        committed = await c.committed(log.tps)
        assert {tp: om.offset if om else None for tp, om in committed.items()} == ends


async def test_read_uncommitted_gets_every_record_of_every_transaction_but_no_marker(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    log = write_transactions(bootstrap, new_topic)
    everything = sorted(log.committed + log.aborted)
    async with consumer(bootstrap) as c:
        c.assign(log.tps)
        seen = await read_all(c, "getmany", len(everything), log)
        assert seen == everything
        assert await c.getmany(timeout=0.5) == {}
        ends = await c.end_offsets(log.tps)
        assert {tp: await c.position(tp) for tp in log.tps} == ends


@pytest.fixture
def open_transaction(bootstrap: str, new_topic: Callable[..., str]) -> Iterator[tuple[str, Transactions]]:
    """A one-partition topic: three plain records (offsets 0-2), an open transaction with two
    records in the log (3-4), then two more plain records (5-6) after the last stable offset."""
    topic = new_topic(1)
    produce(bootstrap, topic, [(0, None, b"before-%d" % i) for i in range(3)])
    with Transactions(bootstrap, topic) as tx:
        tx.begin()
        tx.send(0, b"open-0")
        tx.send(0, b"open-1")
        tx.flush()
        assert [o for _, o, _ in tx.delivered] == [3, 4]
        after = produce(bootstrap, topic, [(0, None, b"after-0"), (0, None, b"after-1")])
        assert [o for _, o in after] == [5, 6]
        yield topic, tx


@pytest.mark.parametrize("outcome", ["commit", "abort"])
async def test_an_open_transaction_holds_read_committed_at_the_last_stable_offset(
    bootstrap: str, open_transaction: tuple[str, Transactions], outcome: str
) -> None:
    topic, tx = open_transaction
    tp = TopicPartition(topic, 0)

    async def values(c: Consumer[Any, Any], count: int) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        with anyio.fail_after(30):
            while len(got) < count:
                got += [(r.offset, r.value) for rs in (await c.getmany(timeout=1)).values() for r in rs]
        return got

    async with consumer(bootstrap, isolation_level="read_committed") as held, consumer(bootstrap) as free:
        held.assign([tp])
        free.assign([tp])
        assert await values(held, 3) == [(i, b"before-%d" % i) for i in range(3)]
        # Held at the LSO: nothing past it comes, however long it waits.
        assert await held.getmany(timeout=1.5) == {}
        assert (held.last_stable_offset(tp), held.highwater(tp)) == (3, 7)
        assert await held.position(tp) == 3
        # end_offsets(): the LSO with read_committed (as in Java), the high watermark without.
        assert await held.end_offsets([tp]) == {tp: 3}
        assert await free.end_offsets([tp]) == {tp: 7}
        # read_uncommitted reads on through the open transaction.
        assert [o for o, _ in await values(free, 7)] == list(range(7))
        assert (free.last_stable_offset(tp), free.highwater(tp)) == (3, 7)
        # The end, and auto_offset_reset="latest", are the LSO for a read_committed consumer.
        await held.seek_to_end(tp)
        assert await held.position(tp) == 3
        async with consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="latest") as late:
            late.assign([tp])
            assert await late.position(tp) == 3

        if outcome == "commit":
            tx.commit()
            expected = [(3, b"open-0"), (4, b"open-1"), (5, b"after-0"), (6, b"after-1")]
        else:
            tx.abort()
            expected = [(5, b"after-0"), (6, b"after-1")]
        assert await values(held, len(expected)) == expected
        assert await held.getmany(timeout=0.5) == {}
        # The marker is offset 7: the position is past it, and the LSO caught up with the end.
        assert await held.position(tp) == 8
        assert (held.last_stable_offset(tp), held.highwater(tp)) == (8, 8)
        assert await held.end_offsets([tp]) == await free.end_offsets([tp]) == {tp: 8}
