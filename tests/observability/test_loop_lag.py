"""A blocked event loop is named: the background loop measures how late it runs (managers/loop_lag.py).

Without a broker: a ``time.sleep`` on the event loop is measured by the loop and named in a WARNING
(asyncio and trio).  On Apache Kafka: a group member whose application blocks the loop past
``session_timeout_ms`` is told why in a WARNING naming the block and the session timeout, rejoins,
and reads every record (records produced with confluent-kafka); a share consumer blocked past its
records' acquisition lock is told so, and every record is accepted in the end.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from support.share import apache_kafka_bootstrap, share_group  # noqa: F401 (a fixture: bootstrap)

from asyncconsumer import AcknowledgeType, AcquisitionLockExpiredError, Consumer, ShareConsumer
from asyncconsumer.config import build_config
from asyncconsumer.engine.loop import Engine
from asyncconsumer.prometheus import ConsumerCollector

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

BLOCKED = re.compile(r"the event loop was blocked for (\d+\.\d)s")


def blocks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and BLOCKED.match(r.getMessage())]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_loop_measures_a_blocking_call_and_names_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    engine = Engine(build_config({"bootstrap_servers": "127.0.0.1:1", "loop_lag_warning_ms": 200}))
    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)
        await anyio.sleep(0.2)
        time.sleep(1.5)  # noqa: ASYNC251 (the point) the loop waits 1 s at most: it runs 0.5 s late or more
        await anyio.sleep(0.2)
        engine.stop()
    watch = engine.loop_lag
    assert 0.5 <= watch.max_lag <= 1.5 + 0.5 and watch.lag < 0.2
    assert watch.blocks == 1 and watch.blocked_seconds == watch.max_lag
    [message] = blocks(caplog)
    assert float(BLOCKED.match(message).group(1)) == pytest.approx(watch.max_lag, abs=0.06)  # type: ignore[union-attr]
    assert "anyio.to_thread.run_sync" in message


# -- on Apache Kafka -----------------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_member_blocked_past_its_session_timeout_is_told_why_rejoins_and_loses_nothing(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    topic = new_topic(2)
    produced = {(p, o) for p, o in produce(topic, [(i % 2, None, b"before-%d" % i) for i in range(400)])}
    seen: set[tuple[int, int]] = set()
    reader, registry = InMemoryMetricReader(), CollectorRegistry()
    async with Consumer(bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
                        session_timeout_ms=3000, heartbeat_interval_ms=300, fetch_max_wait_ms=100,
                        max_poll_records=50, meter_provider=MeterProvider(metric_readers=[reader])) as consumer:
        registry.register(ConsumerCollector(consumer, client_id="c"))
        consumer.subscribe([topic])
        joins = 0
        with anyio.fail_after(60):
            async for record in consumer:
                seen.add((record.partition, record.offset))
                if len(seen) == 100 and not joins:
                    joins = consumer.metrics().rebalances.count
                    time.sleep(5.0)  # noqa: ASYNC251 (the mistake: a synchronous call in the async-for body)
                    produced |= set(await anyio.to_thread.run_sync(
                        lambda: produce(topic, [(i % 2, None, b"after-%d" % i) for i in range(200)])))
                if seen >= produced:
                    break
        metrics = consumer.metrics()
        data = reader.get_metrics_data()
        assert data is not None
        telemetry = {m.name: m.data.data_points[0].value for r in data.resource_metrics for scope in r.scope_metrics
                     for m in scope.metrics if m.name.startswith("asyncconsumer.loop")}
        prometheus = {name: registry.get_sample_value(name, {"client_id": "c"}) for name in (
            "asyncconsumer_event_loop_lag_max_seconds", "asyncconsumer_event_loop_blocks_total")}
    assert seen == produced  # every record read, none lost (some read twice after the rejoin)
    [warning] = blocks(caplog)
    assert float(BLOCKED.match(warning).group(1)) >= 4.0  # type: ignore[union-attr]
    assert "past session_timeout_ms=3000 (the group coordinator drops a member it hears no heartbeat" in warning
    assert "anyio.to_thread.run_sync" in warning
    assert metrics.loop.blocks == 1 and metrics.loop.lag_max >= 4.0
    assert telemetry["asyncconsumer.loop.blocks"] == 1
    assert telemetry["asyncconsumer.loop.lag.max"] == metrics.loop.lag_max
    assert prometheus == {"asyncconsumer_event_loop_lag_max_seconds": metrics.loop.lag_max,
                          "asyncconsumer_event_loop_blocks_total": 1}
    assert metrics.rebalances.count > joins  # it joined again
    # The WARNING comes first: whoever reads the log sees the cause before what followed from it.
    messages = [r.getMessage() for r in caplog.records]
    lost = [i for i, m in enumerate(messages) if "partitions lost" in m]
    assert lost and messages.index(warning) < lost[0]


@pytest.mark.broker_feature("share_groups")
async def test_a_share_consumer_blocked_past_its_acquisition_lock_is_told_and_every_record_is_accepted(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    topic = new_topic(1)
    group = await anyio.to_thread.run_sync(lambda: share_group(bootstrap, share_record_lock_duration_ms=2000))
    await anyio.to_thread.run_sync(lambda: produce(topic, [(0, None, b"job-%d" % i) for i in range(60)]))
    accepted: set[bytes] = set()
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group, max_poll_records=20,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        blocked = False
        with anyio.fail_after(60):
            while len(accepted) < 60:
                for records in (await consumer.getmany(timeout=0.5)).values():
                    if not blocked:
                        blocked = True
                        time.sleep(3.5)  # noqa: ASYNC251 (the mistake) holding acquired records past their lock
                    for record in records:
                        try:
                            consumer.acknowledge(record, AcknowledgeType.ACCEPT)
                        except AcquisitionLockExpiredError:
                            continue  # it comes back
                        accepted.add(record.value)
                    assert set((await consumer.commit()).values()) <= {None}
        metrics = consumer.metrics()
    assert accepted == {b"job-%d" % i for i in range(60)}
    [warning] = blocks(caplog)
    assert "past the acquisition lock of 2000 ms, the group's share.record.lock.duration.ms (records acquired and " \
        "not acknowledged by then go back to the broker, which delivers them again)" in warning
    assert metrics.loop.blocks == 1 and metrics.loop.lag_max >= 2.5
