"""The share consumer's application side shared with ``Consumer`` (app/client.py): the KIP-957
``acquire``/``release`` hooks and the ``async with`` lifecycle (a failed start leaves nothing
running).  The hook-rule and failed-start tests need no broker; the others run on Apache Kafka.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support.share import apache_kafka_bootstrap, share_group  # noqa: F401 (a fixture: bootstrap)

from asyncconsumer import (
    AcknowledgeType,
    ConcurrentAccessError,
    Consumer,
    NoBrokersAvailableError,
    ShareConsumer,
    ShareConsumerRecord,
)
from asyncconsumer.errors import ConfigError, IllegalStateError

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.broker_feature("share_groups")]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class RecordingShareConsumer(ShareConsumer[bytes, bytes]):
    """Logs every acquire/release; lets any number of tasks poll at once (implicit mode)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls: list[tuple[str, str]] = []
        self.polls_by_task: Counter[str] = Counter()
        self.active_polls = 0
        self.max_active_polls = 0

    def acquire(self, operation: str) -> None:
        self.calls.append(("acquire", operation))
        if operation not in self.POLL_OPERATIONS:
            super().acquire(operation)
            return
        task = anyio.get_current_task()
        self.polls_by_task[task.name or str(task.id)] += 1
        self.active_polls += 1
        self.max_active_polls = max(self.max_active_polls, self.active_polls)

    def release(self, operation: str) -> None:
        self.calls.append(("release", operation))
        if operation not in self.POLL_OPERATIONS:
            super().release(operation)
            return
        self.active_polls -= 1


async def test_default_rule_refuses_a_second_polling_task_and_allows_nesting() -> None:
    consumer: ShareConsumer[bytes, bytes] = ShareConsumer(group_id="g")
    inside, leave = anyio.Event(), anyio.Event()

    async def hold() -> None:
        consumer.acquire("getmany")
        try:
            inside.set()
            await leave.wait()
        finally:
            consumer.release("getmany")

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await inside.wait()
        for operation in ("getmany", "__anext__"):
            with pytest.raises(ConcurrentAccessError, match=rf"{operation}\(\) called from task .* share consumer"):
                consumer.acquire(operation)
        consumer.acquire("commit")  # not a poll
        consumer.release("commit")
        leave.set()
    consumer.acquire("__anext__")
    consumer.acquire("getmany")  # nested in one task
    consumer.release("getmany")
    consumer.release("__anext__")
    assert consumer._poll_owner.task is None


@pytest.mark.parametrize("client", [Consumer, ShareConsumer])
async def test_a_failed_start_leaves_no_task_running(client: type[Any]) -> None:
    """Consumer and ShareConsumer share __aenter__ (app/client.py): a start that fails (no broker
    reachable) raises the typed error, stops the loop and leaves its task group."""
    from support.broker import free_port

    dead = [f"127.0.0.1:{free_port()}"]
    before = set(asyncio.all_tasks())
    consumer = client(bootstrap_servers=dead, group_id="g", request_timeout_ms=1500)
    with anyio.fail_after(10), pytest.raises(NoBrokersAvailableError, match="no broker reachable"):
        async with consumer:
            pytest.fail("started without a broker")
    assert consumer._task_group is None
    assert consumer._engine is not None and consumer._engine.closed
    await anyio.lowlevel.checkpoint()
    assert set(asyncio.all_tasks()) - before == set()
    with pytest.raises(IllegalStateError, match="already started"):
        async with consumer:
            pass


async def test_every_public_call_is_bracketed_and_a_custom_rule_lets_two_tasks_poll(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    group = await anyio.to_thread.run_sync(lambda: share_group(bootstrap))
    total = 400
    await anyio.to_thread.run_sync(lambda: produce(topic, [(i % 2, None, b"%d" % i) for i in range(total)]))
    seen: list[bytes] = []
    async with RecordingShareConsumer(bootstrap_servers=bootstrap, group_id=group, max_poll_records=10) as consumer:
        consumer.subscribe([topic])
        assert consumer.subscription() == {topic}
        done = anyio.Event()

        async def poller() -> None:
            while not done.is_set():
                for records in (await consumer.getmany(timeout=0.2)).values():
                    seen.extend(r.value for r in records if r.value is not None)
                    await anyio.sleep(0.005)  # still "inside" the work while the other task polls
                if len(seen) >= total:
                    done.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poller, name="poller-0")
                tg.start_soon(poller, name="poller-1")
        with pytest.raises(IllegalStateError):  # release runs also when the call fails
            consumer.acknowledge(
                ShareConsumerRecord(topic, 0, 10**9, 0, 0, None, None, 0, 0, ()), AcknowledgeType.ACCEPT)
        assert all(e is None for e in (await consumer.commit()).values())
    assert sorted(seen, key=int) == [b"%d" % i for i in range(total)]
    assert set(consumer.polls_by_task) == {"poller-0", "poller-1"}
    assert consumer.active_polls == 0
    assert consumer._poll_owner.task is None  # the default rule saw no poll at all
    operations = [op for kind, op in consumer.calls if kind == "acquire"]
    for operation in ("subscribe", "subscription", "getmany", "acknowledge", "commit"):
        assert operation in operations
    # Each acquire has its release, in nesting order.
    stack: list[str] = []
    for kind, operation in consumer.calls:
        if kind == "acquire":
            stack.append(operation)
        else:
            assert operation in stack
            stack.remove(operation)
    assert stack == []


def test_from_properties_takes_java_names_and_the_share_ones() -> None:
    consumer = ShareConsumer.from_properties({
        "bootstrap.servers": "broker:9092", "group.id": "workers", "max.poll.records": "7",
        "fetch.buffer.bytes": "2097152", "share.acknowledgement.mode": "explicit",
        "share.acquire.mode": "record_limit",
    })
    assert (consumer.acknowledgement_mode, consumer.acquire_mode) == ("explicit", "record_limit")
    assert (consumer.config.group_id, consumer.config.max_poll_records) == ("workers", 7)
    assert consumer.config.fetch_buffer_bytes == 2097152
    default = ShareConsumer.from_properties({"group.id": "g"})
    assert (default.acknowledgement_mode, default.acquire_mode) == ("implicit", "batch_optimized")
    overridden = ShareConsumer.from_properties(
        {"group.id": "g", "share.acknowledgement.mode": "explicit", "max.poll.records": "7"},
        share_acknowledgement_mode="implicit", max_poll_records=9)
    assert (overridden.acknowledgement_mode, overridden.config.max_poll_records) == ("implicit", 9)
    seen: list[object] = []
    with_callback = ShareConsumer.from_properties({"group.id": "g"}, on_acknowledgement_commit=seen.append)
    assert with_callback._collector.on_commit == seen.append


@pytest.mark.parametrize(("properties", "message"), [
    ({"group.id": "g", "share.acknowledgement.mode": "sometimes"}, "share_acknowledgement_mode must be"),
    ({"group.id": "g", "share.acquire.mode": "record-limit"}, "share_acquire_mode must be"),
    ({"bootstrap.servers": "b:1"}, "needs a group_id"),
    ({"group.id": "g", "no.such.thing": "1"}, "unknown consumer property 'no.such.thing'"),
    ({"group.id": "g", "max.poll.records": "many"}, "max_poll_records must be an integer"),
])
def test_from_properties_rejects_what_a_share_consumer_cannot_use(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShareConsumer.from_properties(properties)
    with pytest.raises(ConfigError, match="mapping"):
        ShareConsumer.from_properties([("group.id", "g")])  # type: ignore[arg-type]
