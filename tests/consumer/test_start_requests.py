"""The requests between ``assign()`` and the first record, on a real broker.

After ``assign()`` the consumer needs the topic's leaders and a position: one Metadata refresh
naming the topic, one ListOffsets per leader, then fetches.  Until that refresh is answered the
reset manager finds the leader unknown at every turn; the refresh in flight already names the
topic, so it asks for no second one (``MetadataManager.request_leaders``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.consumers import FAST, tps

from asyncconsumer import Consumer
from asyncconsumer.managers.requests import UnsentRequest

pytestmark = [pytest.mark.anyio, pytest.mark.broker]


def _record_requests(consumer: Consumer[Any, Any]) -> list[str]:
    """The API of every request the consumer's loop sends from now on, in order."""
    network = consumer._engine.network  # type: ignore[union-attr]
    sent: list[str] = []
    send = network.send

    def recording(request: UnsentRequest) -> None:
        sent.append(request.api)
        send(request)

    network.send = recording
    return sent


async def test_assign_asks_for_metadata_once_before_the_first_record(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(p, None, b"v") for p in (0, 1)])
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        sent = _record_requests(consumer)
        consumer.assign(tps(topic, 2))
        with anyio.fail_after(30):
            got = 0
            while got < 2:
                got += sum(len(records) for records in (await consumer.getmany(timeout=5)).values())
    first_fetch = sent.index("Fetch")
    before = sent[:first_fetch]
    assert before.count("Metadata") == 1, sent
    assert before.count("ListOffsets") == 1, sent  # one broker: one request for both partitions
    assert "OffsetForLeaderEpoch" not in before, sent  # a reset answered by the leader is not checked
