"""examples/custom_acquire.py and the default acquire()/release() rule it overrides.

``acquire``/``release`` are plain methods that never touch the engine, so most of
these tests need no broker: a consumer that was never started is enough.  They
need a running event loop only for ``anyio.get_current_task()``.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from asyncconsumer import ConcurrentAccessError, Consumer, TopicPartition
from asyncconsumer.listener import RebalanceListener
from asyncconsumer.managers.membership import CallbackKind, CallbackRequest
from examples.custom_acquire import POLL_OPERATIONS, SharedPollConsumer, consume_with_two_pollers

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def hold(consumer: Consumer[Any, Any], operation: str, inside: anyio.Event, leave: anyio.Event) -> None:
    """Be inside ``operation`` (acquired, not yet released) until ``leave`` is set."""
    consumer.acquire(operation)
    try:
        inside.set()
        await leave.wait()
    finally:
        consumer.release(operation)


def test_example_knows_the_poll_operations() -> None:
    from asyncconsumer import consumer as consumer_module

    assert consumer_module._POLL_OPERATIONS == POLL_OPERATIONS


async def test_default_rule_refuses_a_second_polling_task(anyio_backend: str) -> None:
    consumer: Consumer[bytes, bytes] = Consumer()
    inside, leave = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, consumer, "getmany", inside, leave)
        await inside.wait()
        for operation in ("getmany", "getone", "__anext__", "partitions"):
            with pytest.raises(ConcurrentAccessError, match=rf"{operation}\(\) called from task"):
                consumer.acquire(operation)
        consumer.acquire("commit")  # not a poll: any task, any time
        consumer.release("commit")
        leave.set()
    consumer.acquire("getmany")  # the first poller released: this task may poll now
    consumer.release("getmany")


async def test_default_rule_names_the_tasks_by_anyios_ids(anyio_backend: str) -> None:
    """The poller's id is looked up without anyio on asyncio: it must still be anyio's task id."""
    consumer: Consumer[bytes, bytes] = Consumer()
    inside, leave = anyio.Event(), anyio.Event()
    poller: list[int] = []

    async def hold_and_note() -> None:
        poller.append(anyio.get_current_task().id)
        await hold(consumer, "getmany", inside, leave)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_and_note)
        await inside.wait()
        me = anyio.get_current_task().id
        with pytest.raises(ConcurrentAccessError, match=rf"from task {me} while task {poller[0]} is polling"):
            consumer.acquire("getmany")
        leave.set()


async def test_default_rule_allows_nesting_in_one_task(anyio_backend: str) -> None:
    consumer: Consumer[bytes, bytes] = Consumer()
    consumer.acquire("getone")
    consumer.acquire("getmany")  # getone() is built on getmany()
    consumer.release("getmany")
    consumer.release("getone")
    inside, leave = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:  # fully released: another task may become the poller
        tg.start_soon(hold, consumer, "__anext__", inside, leave)
        await inside.wait()
        leave.set()


async def test_default_rule_lets_a_callback_and_its_tasks_poll(anyio_backend: str) -> None:
    """KIP-957: tasks started inside a rebalance callback may poll while another task is the poller."""
    consumer: Consumer[bytes, bytes] = Consumer()
    polled_from: list[str] = []

    class StartsTasks(RebalanceListener):
        async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            async def poll_from_child(name: str) -> None:
                consumer.acquire("getmany")
                polled_from.append(name)
                consumer.release("getmany")

            async with anyio.create_task_group() as tg:  # they finish before the callback returns
                tg.start_soon(poll_from_child, "child-1")
                tg.start_soon(poll_from_child, "child-2")

    class Engine:  # what run_callback uses of the engine for an assignment
        commits = None

        def clock(self) -> float:
            return time.monotonic()

        def wake(self) -> None:
            pass

    consumer._rebalance.listener = StartsTasks()
    request = CallbackRequest(CallbackKind.ASSIGNED, frozenset({TopicPartition("t", 0)}), time.monotonic() + 10, 1)
    inside, leave = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, consumer, "getmany", inside, leave)  # another task is the poller
        await inside.wait()
        error = await consumer._rebalance.run_callback(Engine(), request)  # type: ignore[arg-type]
        assert error is None and request.acked
        assert sorted(polled_from) == ["child-1", "child-2"]
        with pytest.raises(ConcurrentAccessError):  # the permission ended with the callback
            consumer.acquire("getmany")
        leave.set()


async def test_shared_poll_consumer_lets_two_tasks_poll_at_once(anyio_backend: str) -> None:
    consumer = SharedPollConsumer()
    inside = [anyio.Event(), anyio.Event()]
    leave = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, consumer, "getmany", inside[0], leave, name="poller-a")
        tg.start_soon(hold, consumer, "__anext__", inside[1], leave, name="poller-b")
        for event in inside:
            await event.wait()
        assert consumer.active_polls == 2  # both are inside a poll operation: no ConcurrentAccessError
        leave.set()
    assert consumer.active_polls == 0
    assert consumer.max_active_polls == 2
    assert consumer.polls_by_task == {"poller-a": 1, "poller-b": 1}


async def test_shared_poll_consumer_counts_nested_polls_and_not_other_calls(anyio_backend: str) -> None:
    consumer = SharedPollConsumer()
    for operation in ("getone", "getmany"):  # one getone() = two poll operations
        consumer.acquire(operation)
    consumer.acquire("commit")
    assert (consumer.active_polls, sum(consumer.polls_by_task.values())) == (2, 2)
    for operation in ("commit", "getmany", "getone"):
        consumer.release(operation)
    assert consumer.active_polls == 0


async def test_shared_poll_consumer_release_runs_when_the_poll_fails(anyio_backend: str) -> None:
    consumer = SharedPollConsumer()
    with pytest.raises(Exception, match="not started"):
        await consumer.getmany(timeout=0)  # acquire, then the call raises, then release
    assert consumer.active_polls == 0
    assert sum(consumer.polls_by_task.values()) == 1


async def test_plain_calls_skip_the_default_brackets_while_running_and_keep_a_custom_rules(
    anyio_backend: str, bootstrap: str
) -> None:
    """With the default acquire()/release(), which do nothing for a call that is not a poll, such a
    call (``assignment()``, ``pause()``...) runs without its wrapper while the consumer runs; after
    it stops nothing of that is left (a dropped consumer is freed at once, no reference cycle).  A
    subclass with its own rule still sees every call."""
    seen: list[tuple[str, str]] = []

    class Recording(Consumer[bytes, bytes]):
        def acquire(self, operation: str) -> None:
            seen.append(("acquire", operation))

        def release(self, operation: str) -> None:
            seen.append(("release", operation))

    tp = TopicPartition("t", 0)
    plain: Consumer[bytes, bytes] = Consumer(bootstrap_servers=bootstrap)
    assert "assignment" not in vars(plain)
    async with plain:
        assert "assignment" in vars(plain) and "getmany" not in vars(plain)
        assert not hasattr(vars(plain)["assignment"], "__wrapped__")
        plain.assign([tp])
        assert plain.assignment() == {tp}
    assert "assignment" not in vars(plain)
    gone = weakref.ref(plain)
    gc.disable()  # freed by its reference count, not by a collection
    try:
        del plain
        assert gone() is None
    finally:
        gc.enable()
    async with Recording(bootstrap_servers=bootstrap) as recording:
        assert "assignment" not in vars(recording)
        recording.assign([tp])
        assert recording.assignment() == {tp}
    assert [call for call in seen if call[1] in ("assign", "assignment")] == [
        ("acquire", "assign"), ("release", "assign"), ("acquire", "assignment"), ("release", "assignment")]


async def test_example_reads_every_record_from_two_polling_tasks(
    anyio_backend: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(400)])
    with anyio.fail_after(30):
        consumer, received = await consume_with_two_pollers(bootstrap, topic, 400)
    assert received == 400
    assert set(consumer.polls_by_task) == {"poller-0", "poller-1"}
    assert consumer.active_polls == 0
