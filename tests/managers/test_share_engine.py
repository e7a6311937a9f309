"""The share loop's decisions with its real managers wired as ``ShareEngine`` wires them (scripted,
fake clock, no sockets): nothing is fetched before the member has an assignment, the share session
goes to the partition's leader, and ``fetch_buffer_bytes`` holds ShareFetch back until the
application takes the records."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.config import build_config
from asyncconsumer.engine.share_loop import ShareEngine
from asyncconsumer.structs import TopicPartition

from .scripted import FakeClock, Scripted, metadata_body, topic_id
from .test_share_fetch import fetch_answer, partition, records
from .test_share_membership import answer

pytestmark = pytest.mark.anyio

P0 = TopicPartition("jobs", 0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def engine_with(**options: Any) -> tuple[ShareEngine, Scripted]:
    clock = FakeClock()
    config = build_config({"group_id": "workers", "bootstrap_servers": "b:1", **options})
    engine = ShareEngine(config, max_records=50, clock=clock)
    return engine, Scripted(*engine.managers, clock=clock)


def join(engine: ShareEngine, h: Scripted) -> None:
    engine.membership.subscribe(frozenset({"jobs"}))
    h.poll()
    h.take("FindCoordinator", poll=False).respond({"coordinators": [
        {"key": "workers", "node_id": 7, "host": "c", "port": 1, "error_code": 0, "error_message": None}]})
    for sent in h.take_all("Metadata"):
        sent.respond(metadata_body({P0: (1, 0)}, brokers=[1, 7]))
    h.assert_idle("ShareFetch")  # not a member yet: nothing to fetch
    heartbeat = h.take("ShareGroupHeartbeat")
    assert heartbeat.body()["subscribed_topic_names"] == ["jobs"]
    heartbeat.respond(answer(1, [0]))
    assert engine.membership.assignment() == {P0}


async def test_fetching_starts_once_assigned_and_goes_to_the_leader() -> None:
    engine, h = engine_with()
    join(engine, h)
    sent = h.take("ShareFetch")
    assert sent.node_id == 1
    body = sent.body()
    assert body["max_records"] == 50 and body["share_session_epoch"] == 0
    assert [(t["topic_id"], [p["partition_index"] for p in t["partitions"]]) for t in body["topics"]] == [
        (topic_id("jobs"), [0])]


async def test_fetch_buffer_bytes_from_the_config_holds_share_fetch_back_until_records_are_taken() -> None:
    data = records(0, 40)
    engine, h = engine_with(fetch_buffer_bytes=len(data), max_partition_fetch_bytes=len(data))
    assert engine.fetcher.max_buffer_bytes == len(data)
    join(engine, h)
    h.take("ShareFetch").respond(fetch_answer(partition(0, data=data, acquired=[(0, 39, 1)])))
    assert [len(b.records) for b in engine.batches] == [40] and engine.has_news
    h.assert_idle("ShareFetch")
    batch = engine.batches.popleft()  # what ShareConsumer._take does, then tells the loop
    engine.fetcher.records_handed_out(batch.node_id, len(batch.records), batch.size)
    assert h.take("ShareFetch").body()["share_session_epoch"] == 1


async def test_no_fetch_after_the_member_leaves() -> None:
    engine, h = engine_with()
    join(engine, h)
    h.take("ShareFetch").respond(fetch_answer())
    engine.membership.leave()
    leave = h.take("ShareGroupHeartbeat")
    assert leave.body()["member_epoch"] == -1
    leave.respond(answer(-1))
    assert engine.membership.left
    (forget,) = h.sent("ShareFetch")  # one more, only to take the partition out of the session
    body = forget.body()
    assert body["topics"] == [] and body["forgotten_topics_data"] == [{"topic_id": topic_id("jobs"), "partitions": [0]}]
    forget.respond(fetch_answer())
    h.advance(5.0)
    h.assert_idle("ShareFetch")
