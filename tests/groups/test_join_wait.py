"""How long a classic group join takes, on both brokers, and what the consumer says meanwhile.

Apache Kafka answers a new group's JoinGroup after ``group.initial.rebalance.delay.ms`` (0 on the
test broker). Tansu holds every JoinGroup for half the group's session timeout, in whole seconds
(measured: 23 s with the default 45 s), a fixed wait of its coordinator that no option changes
(docs/testing.md, ``fast_join``). The consumer cannot shorten it; it says so once the join has been
held for ``JOIN_HELD_NOTICE`` seconds.  A 12 s session timeout keeps the Tansu run at about 6 s.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import anyio
import pytest
from support.broker import BrokerBackend

from asyncconsumer import Consumer
from asyncconsumer.managers.membership import JOIN_HELD_NOTICE

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

SESSION_MS = 12_000


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_join_time_and_the_held_join_notice(
    kafka_backend: BrokerBackend, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic()
    options = {"group_id": f"join-{uuid.uuid4().hex[:8]}", "session_timeout_ms": SESSION_MS,
               "heartbeat_interval_ms": 1000, "fetch_max_wait_ms": 100}
    with caplog.at_level(logging.INFO, logger="asyncconsumer.membership"):
        async with Consumer(bootstrap_servers=kafka_backend.bootstrap, **options) as consumer:
            consumer.subscribe([topic])
            started = time.monotonic()
            with anyio.fail_after(SESSION_MS / 1000):  # loosely: within the session timeout on either broker
                while not consumer.assignment():
                    await consumer.getmany(timeout=0.2)
            took = time.monotonic() - started
    held = [r.getMessage() for r in caplog.records if "held this member's JoinGroup" in r.getMessage()]
    if kafka_backend.supports("fast_join"):
        assert took < JOIN_HELD_NOTICE and held == [], (took, held)
    else:  # Tansu: held for session_timeout_ms / 2, and the consumer said so
        assert took >= SESSION_MS / 2000 - 0.5, took
        assert len(held) == 1 and "session_timeout_ms / 2, 6.0 s" in held[0], held
