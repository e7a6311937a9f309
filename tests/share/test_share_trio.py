"""A share-group member on trio (the rest of the share suite, test_share.py, runs on asyncio)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.share import apache_kafka_bootstrap  # noqa: F401 (a fixture: bootstrap)

from asyncconsumer import AcknowledgeType, ShareConsumer
from share.test_share import group_for, nothing_more, poll_until, values

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.broker_feature("share_groups")]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"


async def test_a_trio_member_reads_releases_and_accepts(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    group = await group_for(bootstrap)
    await anyio.to_thread.run_sync(lambda: produce(topic, [(i % 2, None, v) for i, v in enumerate(values(30))]))
    async with ShareConsumer(bootstrap_servers=bootstrap, group_id=group,
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe([topic])
        first = await poll_until(
            consumer, 30, ack=lambda r: AcknowledgeType.RELEASE if r.value == b"job-7" else AcknowledgeType.ACCEPT)
        assert all(e is None for e in (await consumer.commit()).values())
        (again,) = await poll_until(consumer, 1)
        assert (again.value, again.delivery_count) == (b"job-7", 2)
        await consumer.commit()
        assert await nothing_more(consumer, 2.0) == []
    assert sorted(r.value for r in first) == sorted(values(30))  # type: ignore[type-var]
