"""When a poll lets the background loop run (app/collector.py, ``Collector.poll_for``).

A poll yields before the application works through what it takes, so the loop sends the next
fetch meanwhile.  Right after a hand-over (engine/core.py) the loop runs as soon as the poll waits
or yields: a poll that finds nothing waits at once, one that takes records yields once it has
them.  Driven here with a stand-in engine and a ticker task that counts the turns it gets.  That
a poll did *not* yield holds on both backends; that it did shows on asyncio only (trio runs the
tasks of one step in either order, so the ticker may get its turn after the poll resumed).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from support.ticker import Ticker

from asyncconsumer.app.client import PollOwner
from asyncconsumer.app.collector import Collector
from asyncconsumer.app.rebalance import RebalanceRunner
from asyncconsumer.config import build_config

pytestmark = pytest.mark.anyio


class _Subscriptions:
    partitions: dict[Any, Any] = {}

    def finished(self) -> None:
        pass


class _Engine:
    """What ``poll_for`` asks of the engine; ``passes`` hand-overs' worth of ``loop_runs_next()``."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.subscriptions = _Subscriptions()
        self.callbacks: list[Any] = []
        self.event = anyio.Event()

    def loop_runs_next(self) -> bool:
        if self.passes:
            self.passes -= 1
            return True
        return False

    def app_polled(self) -> None:
        pass

    def app_event(self) -> anyio.Event:
        return self.event

    async def wait_app(self, event: anyio.Event, deadline: float) -> None:
        with anyio.CancelScope(deadline=deadline):  # as LoopCore's before its loop runs
            await event.wait()

    def app_time(self) -> float:
        return anyio.current_time()

    def pop_error(self) -> None:
        return None

    def check_running(self) -> None:
        pass


def _collector() -> Collector[Any, Any]:
    return Collector(build_config({"bootstrap_servers": "127.0.0.1:1"}), RebalanceRunner(build_config({})), PollOwner())


async def _poll(engine: _Engine, results: list[Any], ticker: Ticker, seen: list[int]) -> Any:
    """One ``poll_for`` whose ``collect()`` gives ``results`` in turn, noting the ticker's turns at
    each collect and at the return."""

    def collect() -> Any:
        seen.append(ticker.turns)
        return results.pop(0)

    got = await _collector().poll_for(engine, 5, collect)  # type: ignore[arg-type]
    seen.append(ticker.turns)
    return got


async def _with_ticker(engine: _Engine, results: list[Any], *, set_event: bool = False) -> tuple[Any, list[int]]:
    ticker = Ticker()
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.sleep(0.01)
        if set_event:  # the news arrives while the poll waits
            tg.start_soon(_set_later, engine)
        start = ticker.turns
        got = await _poll(engine, results, ticker, seen)
        tg.cancel_scope.cancel()
    return got, [turns - start for turns in seen]


async def _set_later(engine: _Engine) -> None:
    await anyio.sleep(0.05)
    engine.event.set()


ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@ASYNCIO
async def test_a_poll_lets_the_loop_run_before_it_takes_records() -> None:
    got, seen = await _with_ticker(_Engine(passes=0), [{"tp": [1]}])
    assert got == {"tp": [1]}
    assert seen[0] >= 1  # a turn before the collect


async def test_after_a_hand_over_a_poll_with_nothing_to_take_waits_at_once() -> None:
    got, seen = await _with_ticker(_Engine(passes=1), [{}, {"tp": [1]}], set_event=True)
    assert got == {"tp": [1]}
    assert seen[0] == 0  # no turn before the first collect: the wait after it is the loop's turn
    assert seen[1] >= 1


@ASYNCIO
async def test_after_a_hand_over_a_poll_that_takes_records_yields_before_returning_them() -> None:
    got, seen = await _with_ticker(_Engine(passes=1), [{"tp": [1]}])
    assert got == {"tp": [1]}
    assert seen[0] == 0  # taken at once ...
    assert seen[1] >= 1  # ... and the loop ran before the application got them


@ASYNCIO
async def test_the_pass_is_used_once() -> None:
    engine = _Engine(passes=1)
    _, first = await _with_ticker(engine, [{"tp": [1]}])
    _, second = await _with_ticker(engine, [{"tp": [2]}])
    assert first[0] == 0 and second[0] >= 1


async def test_a_cancelled_poll_after_a_hand_over_is_still_cancelled() -> None:
    engine = _Engine(passes=1)
    collected: list[int] = []

    def collect() -> Any:
        collected.append(1)
        return {"tp": [1]}

    with anyio.CancelScope() as scope:
        scope.cancel()
        await _collector().poll_for(engine, 5, collect)  # type: ignore[arg-type]
    assert scope.cancelled_caught and not collected  # nothing taken, so nothing lost
