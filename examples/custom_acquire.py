"""Overriding ``Consumer.acquire`` / ``release`` (the KIP-957 hooks): let several tasks poll.

    python path/to/custom_acquire.py BOOTSTRAP TOPIC [COUNT]   (TOPIC needs partitions 0 and 1)

By default only one task at a time may poll a consumer (``getmany``,
``getone``, ``async for``, ``partitions()``); a second task that polls
meanwhile gets ``ConcurrentAccessError``.  ``SharedPollConsumer`` lifts that
rule: any task may poll, even at the same time as another one.  In exchange
it keeps a record of who polls: ``polls_by_task`` counts poll operations per
task name and ``max_active_polls`` is the largest number of poll operations
that were in progress at once.  Every other operation (``commit``, ``seek``,
...) goes to the default rule through ``super()``.

The hooks are synchronous and get the operation name; ``release`` runs in a
``finally`` (also on error and cancellation) and only if ``acquire`` returned.
Calls nest: ``getone()`` runs ``getmany()`` inside it, so one ``getone()``
counts as two poll operations.  See docs/concurrency.md for the contract.

Lifting the single-poller rule is only safe when each partition is polled by
one task, so ``main`` gives each worker task its own partitions
(``getmany(*partitions)``) and uses no consumer group (no auto-commit, which
would count a record as finished as soon as *any* task polls again).
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from typing import Any

import anyio

from asyncconsumer import Consumer, TopicPartition

log = logging.getLogger("examples.custom_acquire")

#: The operation names the default rule treats as polling.
POLL_OPERATIONS = frozenset({"getmany", "getone", "__anext__", "batches", "arrow_batches", "arrow_batch", "partitions"})


class SharedPollConsumer(Consumer[bytes, bytes]):
    """Any task may poll at any time; who polls is counted and logged."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.polls_by_task: Counter[str] = Counter()
        self.active_polls = 0
        self.max_active_polls = 0

    def acquire(self, operation: str) -> None:
        if operation not in POLL_OPERATIONS:
            super().acquire(operation)  # keep the default rule for everything else
            return
        task = anyio.get_current_task()
        name = task.name or f"task-{task.id}"
        self.polls_by_task[name] += 1
        self.active_polls += 1
        self.max_active_polls = max(self.max_active_polls, self.active_polls)
        log.debug("%s() from task %s (%d poll operations in progress)", operation, name, self.active_polls)

    def release(self, operation: str) -> None:
        if operation not in POLL_OPERATIONS:
            super().release(operation)
            return
        self.active_polls -= 1


async def consume_with_two_pollers(bootstrap: str, topic: str, expected: int) -> tuple[SharedPollConsumer, int]:
    """Read partitions 0 and 1 of ``topic`` from two tasks that poll concurrently.

    Returns the consumer (for its counters) and the number of records read, once
    ``expected`` records were read.
    """
    received = 0
    done = anyio.Event()

    async def worker(consumer: SharedPollConsumer, partition: TopicPartition) -> None:
        nonlocal received
        while not done.is_set():
            batches = await consumer.getmany(partition, timeout=0.2)  # only this task's partition
            received += sum(len(records) for records in batches.values())
            if received >= expected:
                done.set()

    async with SharedPollConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100
    ) as consumer:
        partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        consumer.assign(partitions)
        async with anyio.create_task_group() as tg:
            for tp in partitions:
                tg.start_soon(worker, consumer, tp, name=f"poller-{tp.partition}")
    return consumer, received


async def main(bootstrap: str, topic: str, expected: int) -> None:
    consumer, received = await consume_with_two_pollers(bootstrap, topic, expected)
    print(
        f"read {received} records; polls by task: {dict(consumer.polls_by_task)}; "
        f"at most {consumer.max_active_polls} polls at once"
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
