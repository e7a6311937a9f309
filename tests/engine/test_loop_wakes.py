"""The background loop's sleep (engine/core.py): it waits on its wake event alone, and its alarm
task wakes it at the earliest manager deadline (or after a second), sooner when a turn asks for
sooner than the alarm meant to look."""

from __future__ import annotations

import time

import anyio
import pytest

from asyncconsumer.config import build_config
from asyncconsumer.engine.core import LoopCore
from asyncconsumer.managers.requests import UnsentRequest

pytestmark = pytest.mark.anyio


class _Timed:
    """A manager that sends nothing and whose next deadline the test sets (done with once passed);
    it notes each turn."""

    def __init__(self) -> None:
        self.deadline = float("inf")
        self.turns: list[float] = []

    def poll(self, now: float) -> list[UnsentRequest]:
        self.turns.append(now)
        if now >= self.deadline:
            self.deadline = float("inf")
        return []

    def next_deadline(self, now: float) -> float:
        return self.deadline


async def test_a_managers_deadline_wakes_the_loop_with_nothing_else_to_wake_it() -> None:
    manager = _Timed()
    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = [manager]
    deadline = manager.deadline = time.monotonic() + 0.1
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await anyio.sleep(0.6)
        loop.stop()
    assert next(t for t in manager.turns if t >= deadline) < deadline + 0.45, manager.turns  # not at the 1 s cap
    assert len(manager.turns) == 2, manager.turns  # the first turn and the deadline's: no other wake


async def test_a_turn_that_wants_to_run_sooner_than_the_alarm_meant_to_look_tells_it() -> None:
    manager = _Timed()
    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = [manager]
    manager.deadline = time.monotonic() + 0.9  # the alarm looks at 0.9 s
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await anyio.sleep(0.05)
        sooner = manager.deadline = time.monotonic() + 0.1
        loop.wake()  # a turn that sees the sooner deadline
        await anyio.sleep(0.5)
        loop.stop()
    assert any(sooner <= t < sooner + 0.3 for t in manager.turns), manager.turns


async def test_the_loop_sleeps_a_second_at_most() -> None:
    manager = _Timed()
    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = [manager]
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await anyio.sleep(1.4)
        loop.stop()
    first = manager.turns[0]
    assert any(first + 0.9 <= t < first + 1.35 for t in manager.turns), manager.turns
