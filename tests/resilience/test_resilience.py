"""Connections cut mid-fetch, TLS, and reconnects — through a chaos proxy in front of a private broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from asyncconsumer import Consumer, TopicPartition

pytestmark = pytest.mark.anyio


async def test_connections_cut_mid_fetch_lose_nothing_and_repeat_nothing(proxied_broker: Any) -> None:
    async with proxied_broker() as pb:
        topic = await anyio.to_thread.run_sync(pb.new_topic, 2)
        total = 60_000
        records = ((i % 2, None, b"%d" % i) for i in range(total))
        small_batches = {"batch.num.messages": 1000}
        await anyio.to_thread.run_sync(lambda: pb.produce(topic, records, client_config=small_batches))
        # The next four connections are cut after 100 kB from the broker: fetch responses here are
        # larger (Tansu sends up to a whole partition at once), so each one breaks off mid-frame.
        pb.proxy.drop_after_bytes(100_000, connections=4)
        seen: list[int] = []
        async with Consumer(
            bootstrap_servers=pb.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
            max_partition_fetch_bytes=16384, fetch_buffer_bytes=65536,
            reconnect_backoff_ms=20, retry_backoff_ms=20, request_timeout_ms=5000,
        ) as c:
            c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
            with anyio.fail_after(90):
                async for record in c:
                    seen.append(int(record.value))
                    if len(seen) % 15000 == 0:
                        await pb.proxy.drop_all(reset=True)  # and a few resets for good measure
                    if len(seen) == total:
                        break
            pb.proxy.drop_after_bytes(None)
            assert await c.getmany(timeout=0.5) == {}
        assert pb.proxy.connections_accepted >= 5  # it had to reconnect again and again
        assert sorted(seen) == list(range(total))  # nothing lost, nothing twice


async def test_broker_restart_behind_the_same_address_is_survived(proxied_broker: Any) -> None:
    """All connections refused for a while (broker unreachable), then back: the consumer carries on."""
    async with proxied_broker() as pb:
        topic = await anyio.to_thread.run_sync(pb.new_topic, 1)
        await anyio.to_thread.run_sync(lambda: pb.produce(topic, ((0, None, b"%d" % i) for i in range(100))))
        async with Consumer(
            bootstrap_servers=pb.bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            reconnect_backoff_ms=20,
            reconnect_backoff_max_ms=200,
            request_timeout_ms=3000,
        ) as c:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            first: list[Any] = []
            with anyio.fail_after(20):
                while len(first) < 100:
                    first += (await c.getmany(timeout=5)).get(tp, [])
            pb.proxy.refuse_new = True
            await pb.proxy.drop_all()
            assert await c.getmany(timeout=2) == {}  # unreachable for a while: nothing new, and no error
            pb.proxy.refuse_new = False
            await anyio.to_thread.run_sync(lambda: pb.produce(topic, [(0, None, b"late")]))
            rest = []
            with anyio.fail_after(20):
                while not rest or rest[-1].value != b"late":
                    rest += (await c.getmany(timeout=5)).get(tp, [])
        offsets = [r.offset for r in first + rest]
        assert offsets == list(range(101))


async def test_close_returns_within_its_timeout_when_the_broker_hangs(proxied_broker: Any) -> None:
    """The final commit and the LeaveGroup get no answer: close(timeout) still returns in time."""
    async with proxied_broker() as pb:
        topic = await anyio.to_thread.run_sync(pb.new_topic, 1)
        await anyio.to_thread.run_sync(lambda: pb.produce(topic, ((0, None, b"%d" % i) for i in range(10))))
        tp = TopicPartition(topic, 0)
        async with Consumer(
            bootstrap_servers=pb.bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
            fetch_max_wait_ms=100, request_timeout_ms=30_000, session_timeout_ms=6000, heartbeat_interval_ms=300,
        ) as c:
            c.subscribe([topic])
            with anyio.fail_after(30):
                while not (await c.getmany(timeout=1)).get(tp):
                    pass
            pb.proxy.blackhole = True  # the broker stops answering: a hung peer
            started = anyio.current_time()
            await c.close(timeout=2)
            closed_in = anyio.current_time() - started
        exited_in = anyio.current_time() - started
    assert closed_in < 2.3 and exited_in < 2.5, (closed_in, exited_in)


async def test_tls_broker(tls_broker: Any, produce: Callable[..., Any]) -> None:
    from support.producer import create_topic
    from support.producer import produce as produce_to

    client = {"security.protocol": "SSL", "ssl.ca.location": str(tls_broker.ca_file)}
    topic = await anyio.to_thread.run_sync(
        lambda: create_topic(tls_broker.bootstrap, "tls-topic", 1, None, client_config=client)
    )
    await anyio.to_thread.run_sync(
        lambda: produce_to(tls_broker.bootstrap, topic, [(0, b"k", b"secret")], client_config=client)
    )
    async with Consumer(
        bootstrap_servers=tls_broker.bootstrap,
        security_protocol="SSL",
        ssl_context=tls_broker.ssl_context,
        auto_offset_reset="earliest",
    ) as c:
        c.assign([TopicPartition(topic, 0)])
        record = await c.getone()
    assert (record.key, record.value) == (b"k", b"secret")


async def test_tls_from_properties(tls_broker: Any) -> None:
    from support.producer import create_topic

    client = {"security.protocol": "SSL", "ssl.ca.location": str(tls_broker.ca_file)}
    topic = await anyio.to_thread.run_sync(
        lambda: create_topic(tls_broker.bootstrap, "tls-props-topic", 2, None, client_config=client)
    )
    c = Consumer.from_properties(
        {
            "bootstrap.servers": tls_broker.bootstrap,
            "security.protocol": "ssl",
            "ssl.ca.location": str(tls_broker.ca_file),
        }
    )
    async with c:
        assert topic in await c.topics()
        assert await c.partitions_for_topic(topic) == {0, 1}
