"""Client metrics push (KIP-714) where the cluster takes no pushes, on each backend: the suite's
Apache Kafka has no telemetry plugin (its ApiVersions answer lists no GetTelemetrySubscriptions)
and Tansu answers with an id and a subscription that asks for nothing.  Neither costs the
application anything: ``client_instance_id()`` answers at once and ``close()`` does not wait.
What a cluster with a plugin receives is tests/observability/test_metrics_push.py."""

from __future__ import annotations

import time
import uuid

import anyio
import pytest
from support.broker import BrokerBackend

from asyncconsumer import Consumer
from asyncconsumer.errors import ConfigError, IllegalStateError

pytestmark = [pytest.mark.anyio, pytest.mark.broker]


async def test_no_push_costs_no_wait(kafka_backend: BrokerBackend, anyio_backend: str) -> None:
    async with Consumer(bootstrap_servers=kafka_backend.bootstrap) as consumer:
        began = time.monotonic()
        instance_id = await consumer.client_instance_id(timeout=20)
        assert time.monotonic() - began < 5, "client_instance_id() waited for what will not come"
        if kafka_backend.name == "kafka":
            assert instance_id is None  # no plugin: no such API, nothing sent
        else:
            assert isinstance(instance_id, uuid.UUID)
            assert await consumer.client_instance_id(0) == instance_id
        closing = time.monotonic()
    assert time.monotonic() - closing < 2, "close() waited for a push that will not come"


async def test_push_off(kafka_backend: BrokerBackend, anyio_backend: str) -> None:
    async with Consumer(bootstrap_servers=kafka_backend.bootstrap, enable_metrics_push=False) as consumer:
        with pytest.raises(IllegalStateError, match="enable_metrics_push=False"):
            await consumer.client_instance_id()
        with pytest.raises(ConfigError, match="timeout must be >= 0"):
            await consumer.client_instance_id(-1)
    with anyio.fail_after(1), pytest.raises(IllegalStateError, match="not started"):
        await Consumer(bootstrap_servers=kafka_backend.bootstrap).client_instance_id(0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_java_property(anyio_backend: str) -> None:
    assert Consumer.from_properties({"enable.metrics.push": "false"}).config.enable_metrics_push is False
    assert Consumer.from_properties({"enable.metrics.push": "true"}).config.enable_metrics_push is True
    assert Consumer().config.enable_metrics_push is True  # on by default, as in Java's client
    with pytest.raises(ConfigError, match="enable_metrics_push must be True or False"):
        Consumer(enable_metrics_push="yes")  # type: ignore[arg-type]
