"""Position validation (KIP-320) against Apache Kafka: OffsetForLeaderEpoch is asked and answered.

Tansu has no OffsetForLeaderEpoch, and on one broker no log can be truncated, but validation still
runs: a committed offset carries the leader epoch of the record before it, a position set with an
epoch is checked before it is fetched, and a leader epoch that moves (a broker restarted) has every
position checked again.  Each answer is logged at debug level on ``asyncconsumer.validation``
(docs/architecture.md, "Log truncation"); the tests read those lines and check that reading resumes
exactly where it should.  A diverging answer needs a cluster that loses records (not here).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from support.consumers import FAST
from support.producer import create_topic, produce

from asyncconsumer import Consumer, OffsetAndMetadata, TopicPartition
from asyncconsumer.testing import KafkaBroker

pytestmark = [pytest.mark.anyio, pytest.mark.broker]

_ANSWER = re.compile(r"OffsetForLeaderEpoch for (\S+) at offset (\d+): leader epoch (-?\d+) ends at offset (-?\d+) "
                     r"\(asked for epoch (-?\d+), current leader epoch (-?\d+)\)")


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    """This module's broker: Apache Kafka (``new_topic``/``produce`` use it too)."""
    return str(apache_kafka.bootstrap)


def consumer(bootstrap: str, **options: Any) -> Consumer[Any, Any]:
    return Consumer(bootstrap_servers=bootstrap, **{**FAST, "auto_offset_reset": "earliest", **options})


def answers(caplog: pytest.LogCaptureFixture, tp: TopicPartition) -> list[dict[str, int]]:
    """The OffsetForLeaderEpoch answers logged for ``tp``, in order."""
    found = []
    for record in caplog.records:
        match = _ANSWER.fullmatch(record.getMessage())
        if record.name == "asyncconsumer.validation" and match and match[1] == str(tp):
            offset, epoch, end, asked, current = map(int, match.groups()[1:])
            found.append({"offset": offset, "epoch": epoch, "end": end, "asked": asked, "current": current})
    return found


@pytest.fixture
def validation_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="asyncconsumer.validation"):
        yield caplog


async def read(c: Consumer[Any, Any], count: int) -> list[int]:
    offsets: list[int] = []
    with anyio.fail_after(30):
        async for record in c:
            offsets.append(record.offset)
            if len(offsets) == count:
                return offsets
    return offsets


async def test_a_committed_offset_is_validated_with_its_leader_epoch_before_reading_resumes(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any],
    validation_log: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(1)
    tp = TopicPartition(topic, 0)
    produce(topic, [(0, None, b"%d" % i) for i in range(10)])
    group = f"g-{topic}"
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign([tp])
        assert await read(c, 6) == list(range(6))
        await c.commit()
        # The commit carries the leader epoch of the record before the committed offset.
        assert await c.committed([tp]) == {tp: OffsetAndMetadata(6, "", 0)}
    validation_log.clear()

    # A member starting from that committed offset asks the leader before it fetches from there.
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign([tp])
        assert await read(c, 4) == [6, 7, 8, 9]
        assert answers(validation_log, tp) == [{"offset": 6, "epoch": 0, "end": 10, "asked": 0, "current": 0}]
        assert await c.getmany(timeout=0.3) == {}

    # A committed offset without an epoch (an explicit commit of a bare offset) is not checked.
    async with consumer(bootstrap, group_id=group) as c:
        await c.commit({tp: 3})
    validation_log.clear()
    async with consumer(bootstrap, group_id=group, enable_auto_commit=False) as c:
        c.assign([tp])
        assert await read(c, 7) == list(range(3, 10))
        assert answers(validation_log, tp) == []


async def test_a_leader_epoch_that_moves_has_the_position_checked_and_reading_goes_on_exactly_once(
    apache_kafka: Any, validation_log: pytest.LogCaptureFixture
) -> None:
    """A private broker, restarted: the partition's leader epoch moves, the consumer checks its
    position (what it handed out, its read-ahead dropped) against the new epoch, and reads on."""
    with KafkaBroker(listeners=("PLAINTEXT",)) as kafka:
        bootstrap = kafka.bootstrap
        topic = create_topic(bootstrap, "epochs", 1)
        tp = TopicPartition(topic, 0)
        produce(bootstrap, topic, [(0, None, b"%d" % i) for i in range(10)])
        async with consumer(bootstrap, reconnect_backoff_max_ms=500) as c:
            c.assign([tp])
            assert await read(c, 5) == list(range(5))  # the other five wait as read-ahead
            # The reset to the earliest offset was answered by the leader under its epoch (as the
            # ListOffsets request named it): nothing to check, as in Java's consumer.
            assert answers(validation_log, tp) == []
            validation_log.clear()
            await anyio.to_thread.run_sync(kafka.node.restart)
            with anyio.fail_after(30):
                while not answers(validation_log, tp):  # noqa: ASYNC110 (the loop's log is polled)
                    await anyio.sleep(0.05)
            (answer,) = answers(validation_log, tp)
            # Checked at what was handed out (5), not at the read-ahead (10), under the new epoch.
            assert answer["current"] > 0
            assert answer == {"offset": 5, "epoch": 0, "end": 10, "asked": 0, "current": answer["current"]}
            produce(bootstrap, topic, [(0, None, b"after-%d" % i) for i in range(5)])
            assert await read(c, 10) == list(range(5, 15))
            assert await c.getmany(timeout=0.3) == {}
