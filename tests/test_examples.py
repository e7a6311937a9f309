"""The documented web-framework examples run against the real broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

GROUP_OPTIONS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100}


def test_fastapi_lifespan_worker(bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]) -> None:
    from fastapi.testclient import TestClient

    from examples.fastapi_worker import create_app

    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(200)])
    app = create_app(bootstrap, topic, f"g-{topic}", **GROUP_OPTIONS)
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while client.get("/stats").json()["consumed"] < 200:
            assert time.monotonic() < deadline, client.get("/stats").json()
            time.sleep(0.1)
        assert client.get("/stats").json()["last_offset_by_partition"] == {"0": 99, "1": 99}
        health = client.get("/healthz")
        assert health.status_code == 200, health.json()
        assert health.json()["member_state"] == "stable" and health.json()["status"] == "ok"
        assert health.json()["lag"] == 0 and health.json()["last_poll_age"] < 5
        scrape = client.get("/metrics")
        assert scrape.headers["content-type"].startswith("text/plain")
        lines = set(scrape.text.splitlines())
        for partition in (0, 1):
            labels = f'{{client_id="asyncconsumer",partition="{partition}",topic="{topic}"}}'
            assert f"kafka_consumer_fetch_manager_records_lag{labels} 0.0" in lines
            assert f"asyncconsumer_position{labels} 100.0" in lines
        topic_labels = f'{{client_id="asyncconsumer",topic="{topic}"}}'
        assert f"kafka_consumer_fetch_manager_records_consumed_total{topic_labels} 200.0" in lines
        assert 'kafka_consumer_coordinator_rebalance_total{client_id="asyncconsumer"} 1.0' in lines
        assert 'asyncconsumer_buffer_pool_held_bytes{client_id="asyncconsumer",pool="columns"} 0.0' in lines
        inf_bucket = 'kafka_consumer_fetch_manager_fetch_latency_seconds_bucket{client_id="asyncconsumer",le="+Inf"}'
        assert any(line.startswith(inf_bucket) for line in lines)
    # Shutdown committed what was consumed: a second instance has nothing left to read.
    produce(topic, [(0, None, b"late")])
    with TestClient(create_app(bootstrap, topic, f"g-{topic}", **GROUP_OPTIONS)) as client:
        deadline = time.monotonic() + 30
        while client.get("/stats").json()["consumed"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        assert client.get("/stats").json()["consumed"] == 1


def test_fastapi_healthz_fails_when_the_worker_fails(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    from fastapi.testclient import TestClient

    from examples.fastapi_worker import create_app

    def refuse(value: bytes) -> bytes:
        raise ValueError("not JSON")

    topic = new_topic(1)
    produce(topic, [(0, None, b"bad")])
    app = create_app(bootstrap, topic, f"g-{topic}", value_deserializer=refuse, **GROUP_OPTIONS)
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while (health := client.get("/healthz")).status_code == 200:
            assert time.monotonic() < deadline, health.json()
            time.sleep(0.1)
        assert health.status_code == 503
        assert health.json()["status"] == "down" and "RecordDeserializationError" in health.json()["error"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiohttp is asyncio-only
async def test_aiohttp_background_task(
    anyio_backend: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    import anyio
    from aiohttp.test_utils import TestClient, TestServer

    from examples.aiohttp_worker import create_app

    topic = new_topic(1)
    produce(topic, [(0, None, b"x")] * 50)
    app = create_app(bootstrap, topic, f"g-{topic}", **GROUP_OPTIONS)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        with anyio.fail_after(30):
            while (await (await client.get("/stats")).json())["consumed"] < 50:  # noqa: ASYNC110
                await anyio.sleep(0.1)
