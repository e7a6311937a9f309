"""The share consumer's collector in implicit mode: what the next poll accepts is every record handed
out since the last one and not acknowledged otherwise, whichever way it was handed out (scripted
share loop, fake clock on the monotonic clock the lock deadlines use)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from asyncconsumer.app.share_collector import ShareCollector
from asyncconsumer.config import build_config
from asyncconsumer.engine.share_loop import ShareEngine
from asyncconsumer.structs import AcknowledgeType, TopicPartition

from .scripted import FakeClock, Scripted
from .test_share_engine import join
from .test_share_fetch import fetch_answer, partition, records

P0 = TopicPartition("jobs", 0)
ACCEPT, RELEASE, REJECT, RENEW = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT,
                                  AcknowledgeType.RENEW)

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def setup() -> tuple[ShareEngine, Scripted, ShareCollector[Any, Any]]:
    clock = FakeClock(time.monotonic())
    engine = ShareEngine(build_config({"group_id": "workers", "bootstrap_servers": "b:1"}), max_records=50,
                         clock=clock)
    h = Scripted(*engine.managers, clock=clock)
    join(engine, h)
    h.take("ShareFetch").respond(fetch_answer(partition(0, data=records(0, 9), acquired=[(0, 8, 1)])))
    return engine, h, ShareCollector(build_config({}), "implicit")


async def accepted_at_next_poll(engine: ShareEngine, h: Scripted, collector: ShareCollector[Any, Any]) -> Any:
    """The next poll (which takes the next records, left in the application's hands unlooked at):
    the acknowledgements it queued for the loop."""
    await collector.poll(engine, 3, 0)
    engine._run_events(h.now)
    return engine.fetcher.queued(P0)


async def test_a_getmany_polls_records_are_accepted_as_one_run(anyio_backend: str) -> None:
    engine, h, collector = setup()
    handed = collector.hand_out_all(await collector.poll(engine, 4, 0))
    assert [r.offset for r in handed[P0]] == [0, 1, 2, 3]
    assert await accepted_at_next_poll(engine, h, collector) == [(0, 3, ACCEPT)]
    assert not collector.unacked


async def test_records_acknowledged_in_between_keep_their_own_type(anyio_backend: str) -> None:
    engine, h, collector = setup()
    handed = collector.hand_out_all(await collector.poll(engine, 4, 0))
    collector.acknowledge(engine, handed[P0][1], REJECT)
    collector.acknowledge(engine, handed[P0][2], RENEW)  # still the application's: accepted at the poll
    assert await accepted_at_next_poll(engine, h, collector) == [(0, 0, ACCEPT), (1, 1, REJECT), (2, 3, ACCEPT)]


async def test_records_handed_out_one_at_a_time_are_accepted_too(anyio_backend: str) -> None:
    engine, h, collector = setup()
    for r in await collector.poll(engine, 3, 0):  # as ``async for`` hands them out
        collector.hand_out(r)
    rest = collector.hand_out_all(await collector.poll(engine, 3, 0))  # accepts those, takes the next
    assert [r.offset for r in rest[P0]] == [3, 4, 5]
    collector.acknowledge(engine, rest[P0][0], RELEASE)
    assert await accepted_at_next_poll(engine, h, collector) == [(0, 2, ACCEPT), (3, 3, RELEASE), (4, 5, ACCEPT)]
