"""The end of a partition, on both brokers: ``end_offsets()``, ``seek_to_end()``, the CLI's ``lag``
and ``consume`` without ``--from-beginning``, and commit metadata.

Tansu answers ListOffsets(latest) with the start of the last batch + 1 (several records in one
batch: inside it); the consumer confirms every such answer with a Fetch's high watermark
(managers/list_offsets.py), so the answers here are Apache Kafka's on both brokers.  Records are
produced in a few multi-record batches by confluent-kafka (one produce call, one batch).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.broker import BrokerBackend

from asyncconsumer import Consumer, OffsetAndMetadata, TopicPartition

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

FAST = {"fetch_max_wait_ms": 100, "request_timeout_ms": 10_000}


def batches(produce: Callable[..., Any], topic: str, sizes: tuple[int, ...] = (5, 3)) -> int:
    """Produce ``sizes`` records in as many batches to partition 0; returns the high watermark."""
    total = 0
    for n, size in enumerate(sizes):
        produce(topic, [(0, None, f"b{n}-{i}".encode()) for i in range(size)])
        total += size
    return total


async def test_end_offsets_is_the_high_watermark(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic()
    end = batches(produce, topic)
    tp = TopicPartition(topic, 0)
    async with Consumer(bootstrap_servers=bootstrap, **FAST) as consumer:
        assert await consumer.end_offsets([tp]) == {tp: end}  # unassigned: no fetch of ours has seen it
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        assert await consumer.position(tp) == end
        assert await consumer.getmany(timeout=0.5) == {}  # nothing old after seek_to_end
        produce(topic, [(0, None, b"new")])
        with anyio.fail_after(10):
            got: list[bytes | None] = []
            while not got:
                got = [r.value for records in (await consumer.getmany(timeout=1)).values() for r in records]
        assert got == [b"new"]
        assert await consumer.end_offsets([tp]) == {tp: end + 1}
        assert consumer.highwater(tp) == end + 1


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncconsumer", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the commands run once per broker
def test_cli_lag_and_consume_from_the_end(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], anyio_backend: str
) -> None:
    topic = new_topic()
    end = batches(produce, topic, (4, 4, 3))
    group = f"lag-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)

    async def commit() -> None:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                            **FAST) as consumer:
            consumer.assign([tp])
            await consumer.commit({tp: 2})

    anyio.run(commit, backend=anyio_backend)
    result = cli("lag", "--bootstrap-server", bootstrap, "--group", group, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"topic": topic, "partition": 0, "current_offset": 2, "log_end_offset": end, "lag": end - 2}
    ]
    # Without --from-beginning only records produced from now on are printed: none here.
    result = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--timeout-ms", "1500")
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr.strip()) == ("", "Processed a total of 0 messages")


async def test_commit_metadata_kept_or_named(
    bootstrap: str, kafka_backend: BrokerBackend, new_topic: Callable[..., str], produce: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Apache Kafka gives back a commit's metadata; Tansu drops it, and the consumer says so."""
    topic = new_topic()
    produce(topic, [(0, None, b"x")])
    tp = TopicPartition(topic, 0)
    group = f"meta-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="asyncconsumer.commit"):
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                            **FAST) as consumer:
            consumer.assign([tp])
            await consumer.commit({tp: OffsetAndMetadata(1, "batch 42")})
            committed = await consumer.committed([tp])
    warned = [r.getMessage() for r in caplog.records if "metadata" in r.getMessage()]
    if kafka_backend.supports("commit_metadata"):
        assert committed == {tp: OffsetAndMetadata(1, "batch 42", committed[tp].leader_epoch)}  # type: ignore[union-attr]
        assert warned == []
    else:
        assert committed[tp] is not None and committed[tp].offset == 1  # type: ignore[union-attr]
        assert committed[tp].metadata == ""  # type: ignore[union-attr]
        assert len(warned) == 1 and "does not keep commit metadata" in warned[0], warned
