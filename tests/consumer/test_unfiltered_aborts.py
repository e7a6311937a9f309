"""read_committed on each test broker, with an aborted transaction in each of two partitions
(confluent-kafka's transactional producer).  Apache Kafka filters aborted transactions: the
consumer hands out only committed records and says nothing.  Tansu takes the transaction but
names no aborted transaction in its Fetch answers, so their records are handed out; the consumer
names the broker in one WARNING (not one per partition or per transaction)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.broker import BrokerBackend
from support.consumers import FAST, tps
from support.producer import Transactions

from asyncconsumer import Consumer

pytestmark = [pytest.mark.anyio, pytest.mark.broker]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the warning is the fetch manager's, whatever the event loop


async def test_read_committed_on_a_broker_that_does_not_filter_aborts_is_named_once(
    kafka_backend: BrokerBackend, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    bootstrap = kafka_backend.bootstrap
    topic = new_topic(2)
    with Transactions(bootstrap, topic) as tx:
        tx.begin()
        tx.send(0, b"aborted-0")
        tx.send(1, b"aborted-1")
        tx.abort()
        tx.begin()
        tx.send(0, b"committed-0")
        tx.send(1, b"committed-1")
        tx.commit()
    caplog.set_level(logging.WARNING, logger="asyncconsumer")
    seen: list[Any] = []
    async with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed", **FAST) as consumer:
        consumer.assign(tps(topic, 2))
        for tp in tps(topic, 2):
            await consumer.seek(tp, 0)
        with anyio.fail_after(30):
            while {b"committed-0", b"committed-1"} - set(seen):
                for records in (await consumer.getmany(timeout=1)).values():
                    seen += [r.value for r in records]
    warnings = [r.getMessage() for r in caplog.records if "read_committed" in r.getMessage()]
    if kafka_backend.supports("transactions"):
        assert sorted(seen) == [b"committed-0", b"committed-1"]
        assert warnings == []
    else:
        assert sorted(seen) == [b"aborted-0", b"aborted-1", b"committed-0", b"committed-1"]
        [warning] = warnings
        assert "isolation_level='read_committed' does not hold on node " in warning
        assert f"({bootstrap}): it answered a fetch of {topic}-" in warning
        assert "does not filter aborted transactions" in warning
