"""The background loop's sleep (engine/core.py): it waits on its wake event alone, and its alarm
task wakes it at the earliest manager deadline (or after a second), sooner when a turn asks for
sooner than the alarm meant to look.  And its hand-over: an application waiting for news takes a
turn's responses before the managers build the next requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.ticker import Ticker

from asyncconsumer._runtime import current_async_library, loop_clock
from asyncconsumer.config import build_config
from asyncconsumer.engine.core import LoopCore
from asyncconsumer.engine.loop import Engine
from asyncconsumer.errors import KafkaConnectionError, KafkaError
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


# -- a waiting application takes a turn's responses before the next requests are built ------------


class _Logged:
    """A manager that notes each poll in a shared log; it never has a deadline."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def poll(self, now: float) -> list[UnsentRequest]:
        self.log.append("poll")
        return []

    def next_deadline(self, now: float) -> float:
        return float("inf")


def _response(log: list[str]) -> UnsentRequest:
    def on_error(now: float, error: BaseException) -> None:
        raise AssertionError(error)

    return UnsentRequest("Fetch", lambda version: {}, lambda now, version, body: log.append("filed"), on_error)


async def _waiting_app(loop: LoopCore, log: list[str], then: Callable[[], None] = lambda: None) -> None:
    await loop.app_event().wait()
    log.append("app")
    then()


async def _one_response(loop: LoopCore, log: list[str], app: Callable[[], None] | None) -> list[str]:
    """The log of a loop's turns around one response, with an application task waiting for news
    (``app`` run when it wakes) or none; from the response on."""
    return (await _answer(loop, log, app=app))[1]


async def _answer(loop: LoopCore, log: list[str], request: UnsentRequest | None = None,
                  error: BaseException | None = None, *, app: Callable[[], None] | None = None,
                  before: Callable[[], object] = lambda: None) -> tuple[list[str], list[str]]:
    """A sleeping loop gets one outcome of ``request`` (a Fetch logging "filed"): ``error``, or an
    answer; ``before`` runs just before it.  The log as ``_on_complete`` returned, and the log of
    the turns after (both from the outcome on)."""
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        if app is not None:
            tg.start_soon(_waiting_app, loop, log, app)
        await anyio.sleep(0.05)  # the loop's first turn is done; it sleeps, the application waits
        log.clear()
        before()
        loop._on_complete(request or _response(log), 0, None if error else {}, error)
        at_once = list(log)
        await anyio.sleep(0.05)
        loop.stop()
    return at_once, log


def _new_loop(log: list[str], kind: type[LoopCore] = LoopCore) -> LoopCore:
    loop = kind(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = [_Logged(log)]
    return loop


#: Scenarios run this often: trio runs the tasks of one step in a random order, so an order that
#: held by chance would fail one of these.
TRIES = 6


async def test_a_waiting_application_takes_the_response_before_the_next_requests_are_built() -> None:
    for _ in range(TRIES):
        log: list[str] = []
        assert await _one_response(_new_loop(log), log, lambda: None) == ["filed", "app", "poll"]


async def test_what_the_application_does_meanwhile_is_seen_by_the_same_turn() -> None:
    """Its ``wake()`` (a partition's buffer room, a seek) costs no turn of its own."""
    for _ in range(TRIES):
        log: list[str] = []
        loop = _new_loop(log)
        assert await _one_response(loop, log, loop.wake) == ["filed", "app", "poll"]


async def test_the_application_let_in_is_told_once_that_the_loop_runs_next() -> None:
    """``loop_runs_next()``: a poll right after a hand-over need not yield for the loop first
    (app/collector.py); once, so a poll that keeps finding records still lets it run."""
    for _ in range(TRIES):
        log: list[str] = []
        loop = _new_loop(log)

        def asks(log: list[str] = log, loop: LoopCore = loop) -> None:
            log.extend(f"next {loop.loop_runs_next()}" for _ in range(2))

        assert await _one_response(loop, log, asks) == ["filed", "app", "next True", "next False", "poll"]
        assert not loop.loop_runs_next()  # and not outside a hand-over


async def test_with_no_application_waiting_the_turn_goes_straight_on() -> None:
    log: list[str] = []
    assert await _one_response(_new_loop(log), log, None) == ["filed", "poll"]


class _Checked(LoopCore):
    """A loop whose per-turn checks are logged too (in its manager's log)."""

    def _before_poll(self, now: float) -> None:
        manager = self.managers[0]
        assert isinstance(manager, _Logged)
        manager.log.append("checks")


async def test_the_application_sees_the_turn_after_its_checks() -> None:
    """The subclass's checks may settle what a response reported (a KIP-848 member's fallback to the
    classic protocol takes back the "not supported" error): the application sees it settled."""
    for _ in range(TRIES):
        log: list[str] = []
        assert await _one_response(_new_loop(log, _Checked), log, lambda: None) == ["filed", "checks", "app", "poll"]


class _NoHandOver(LoopCore):
    HAND_OVER = False  # as the share consumer's loop


async def test_a_loop_without_the_hand_over_polls_its_managers_first() -> None:
    log: list[str] = []
    assert await _one_response(_new_loop(log, _NoHandOver), log, lambda: None) == ["filed", "poll", "app"]


async def test_a_stop_while_the_application_takes_its_turn_ends_the_loop_at_once() -> None:
    log: list[str] = []
    loop = _new_loop(log)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        tg.start_soon(_waiting_app, loop, log, loop.stop)
        await anyio.sleep(0.05)
        loop._on_complete(_response(log), 0, {}, None)
        with anyio.fail_after(0.5):  # not the loop's one-second sleep
            await loop.wait_stopped()


# -- an answer that comes while the loop sleeps goes to its manager at once ------------------------


class _AtOnce(LoopCore):
    ANSWER_AT_ONCE = frozenset({"Fetch"})  # as the consumer's loop (engine/loop.py)


@pytest.mark.parametrize("kind", [_AtOnce, Engine])
async def test_an_answer_while_the_loop_sleeps_is_filed_by_the_task_that_read_it(kind: type[LoopCore]) -> None:
    """Filed before ``_on_complete`` returns (the reader's task); then the application and the
    loop's turn, in that order on asyncio (trio runs them in either order)."""
    for _ in range(TRIES):
        log: list[str] = []
        at_once, log = await _answer(_new_loop(log, kind), log, app=lambda: None)
        assert at_once == ["filed"]
        assert log[0] == "filed" and sorted(log[1:]) == ["app", "poll"], log
        if current_async_library() == "asyncio":
            assert log == ["filed", "app", "poll"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio runs the tasks of one step in either order
async def test_an_answer_taken_at_once_wakes_the_application_a_turn_of_the_event_loop_sooner() -> None:
    async def turns_to_the_application(kind: type[LoopCore]) -> int:
        ticker = Ticker()
        loop = _new_loop([], kind)
        woken: list[int] = []
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            tg.start_soon(_waiting_app, loop, [], lambda: woken.append(ticker.turns))
            await anyio.sleep(0.05)
            tg.start_soon(ticker.run)
            await anyio.sleep(0.01)
            before = ticker.turns
            loop._on_complete(_response([]), 0, {}, None)
            await anyio.sleep(0.01)
            loop.stop()
            tg.cancel_scope.cancel()
        return woken[0] - before

    assert await turns_to_the_application(_AtOnce) == await turns_to_the_application(LoopCore) - 1


async def test_the_application_woken_by_an_answer_taken_at_once_is_told_once_that_the_loop_runs_next() -> None:
    log: list[str] = []
    loop = _new_loop(log, _AtOnce)

    def asks() -> None:
        log.extend(f"next {loop.loop_runs_next()}" for _ in range(2))

    app_first = ["filed", "app", "next True", "next False", "poll"]
    loop_first = ["filed", "poll", "app", "next False", "next False"]  # trio may: the loop's turn took the pass back
    log_of_turn = await _one_response(loop, log, asks)
    assert log_of_turn in ([app_first] if current_async_library() == "asyncio" else [app_first, loop_first])
    assert not loop.loop_runs_next()


class _CompletesDuringPoll(_Logged):
    """A manager whose first poll ends a request there and then (as ``NetworkClient.send`` does when
    the request cannot be built)."""

    def __init__(self, log: list[str], loop: LoopCore) -> None:
        super().__init__(log)
        self.loop, self.done = loop, False

    def poll(self, now: float) -> list[UnsentRequest]:
        self.log.append("poll")
        if not self.done:
            self.done = True
            self.loop._on_complete(_response(self.log), 0, {}, None)
            self.log.append("poll done")
        return []


async def test_an_answer_during_a_turn_is_left_to_the_next_turn() -> None:
    log: list[str] = []
    loop = _AtOnce(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = [_CompletesDuringPoll(log, loop)]
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await anyio.sleep(0.05)
        loop.stop()
    assert log[:4] == ["poll", "poll done", "filed", "poll"], log


async def test_an_answer_behind_queued_events_waits_for_the_turn_that_runs_them() -> None:
    log: list[str] = []
    loop = _new_loop(log, _AtOnce)
    at_once, log = await _answer(loop, log, before=lambda: loop.post(lambda now: log.append("event")))
    assert at_once == []
    assert log == ["event", "filed", "poll"]


@pytest.mark.parametrize("api, error", [("Fetch", KafkaConnectionError("gone")), ("Metadata", None)])
async def test_errors_and_other_answers_wait_for_the_turn(api: str, error: BaseException | None) -> None:
    log: list[str] = []
    loop = _new_loop(log, _AtOnce)

    def on_error(now: float, error: BaseException) -> None:
        log.append("failed")

    request = UnsentRequest(api, lambda version: {}, lambda now, version, body: log.append("filed"), on_error)
    at_once, log = await _answer(loop, log, request, error=error)
    assert at_once == []
    assert log == ["failed" if error else "filed", "poll"]


async def test_a_handler_that_fails_on_an_answer_taken_at_once_is_reported_to_the_application() -> None:
    """Not to the connection's reader that read the answer (it would close the connection)."""
    log: list[str] = []
    loop = _new_loop(log, _AtOnce)

    def broken(now: float, version: int, body: object) -> None:
        raise ValueError("a bug")

    await _answer(loop, log, UnsentRequest("Fetch", lambda version: {}, broken, lambda now, error: None))
    error = loop.pop_error()
    assert isinstance(error, KafkaError) and "internal error handling Fetch" in str(error) and "a bug" in str(error)


async def test_the_pass_of_an_answer_taken_at_once_ends_with_the_loops_turn() -> None:
    """No application was waiting: the loop's turn ran before any poll, so a later poll is not told
    that the loop runs next."""
    log: list[str] = []
    loop = _new_loop(log, _AtOnce)
    _, log = await _answer(loop, log)
    assert log == ["filed", "poll"]
    assert not loop.loop_runs_next()


async def test_the_loop_clock_reads_the_clock_anyios_deadlines_are_on() -> None:
    """``loop_clock()``: what a connection times its requests by (trio's clock has an offset, so a
    process clock would fail there)."""
    clock = loop_clock()
    start = anyio.current_time()
    await anyio.sleep(0.01)
    assert start < clock() <= anyio.current_time()


async def test_a_polls_wait_for_news_ends_at_its_deadline_or_at_the_news_whichever_comes_first() -> None:
    """``wait_app``: a poll's timed wait (on asyncio a timer of the loop's sets the application's
    event at the deadline; on trio a cancel scope).  The loop's wake events are the backend's own."""
    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = []
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        event = loop.app_event()
        own = asyncio.Event if current_async_library() == "asyncio" else anyio.Event
        assert isinstance(event, (anyio.Event, own))  # perhaps the one made before the loop ran
        start = anyio.current_time()
        assert start <= loop.app_time() <= anyio.current_time()  # the deadlines' clock (trio's has an offset)
        with anyio.fail_after(5):  # a wait that misses its deadline fails here instead of hanging
            await loop.wait_app(event, start + 0.2)
        waited = anyio.current_time() - start
        assert 0.2 - 1e-6 <= waited < 1.0, waited  # never early; late on a loaded machine

        news = loop.app_event()
        assert isinstance(news, own) and not news.is_set()
        start = anyio.current_time()
        tg.start_soon(_notify_after, loop, 0.05)
        await loop.wait_app(news, start + 5.0)
        assert anyio.current_time() - start < 1.0

        quiet = loop.app_event()
        with anyio.move_on_after(0.05) as scope:  # cancelled from outside: the cancellation comes through
            await loop.wait_app(quiet, anyio.current_time() + 0.1)
        assert scope.cancelled_caught

        # Waits that end with news leave their alarm to a later wait whose deadline is no earlier:
        # it rings first (a wake with no news), and that wait goes on to its own deadline.
        start = anyio.current_time()
        for _ in range(5):
            soon = loop.app_event()
            tg.start_soon(_notify_after, loop, 0.01)
            await loop.wait_app(soon, anyio.current_time() + 0.3)
        late = start + 0.3 + 0.2
        while anyio.current_time() < late:
            event = loop.app_event()
            with anyio.fail_after(2):
                await loop.wait_app(event, late)
        assert late <= anyio.current_time() < late + 1.0
        # A deadline earlier than the alarm's gets an alarm of its own.
        tg.start_soon(_notify_after, loop, 0.01)
        await loop.wait_app(loop.app_event(), anyio.current_time() + 5.0)  # leaves an alarm 5 s away
        start = anyio.current_time()
        with anyio.fail_after(2):
            await loop.wait_app(loop.app_event(), start + 0.05)
        assert 0.05 - 1e-6 <= anyio.current_time() - start < 1.0
        loop.stop()


async def _notify_after(loop: LoopCore, delay: float) -> None:
    await anyio.sleep(delay)
    loop.notify_app()


# -- application events -------------------------------------------------------------------------


async def test_posted_events_run_in_order_with_called_ones_and_a_failing_one_is_reported() -> None:
    """``post`` queues an event nobody waits for (the share consumer posts its acknowledgements):
    it runs in its place among the ``call``s, and what it raises is an internal error the next poll
    sees, not an exception lost in a waiter nobody reads."""
    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    ran: list[str] = []

    def fails(now: float) -> None:
        raise ValueError("a bug")

    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        posts = loop.posts
        loop.post(lambda now: ran.append("first"))
        loop.post(fails)
        assert await loop.call(lambda now: ran.append("called") or "result") == "result"
        loop.post(lambda now: ran.append("last"))
        await loop.call(lambda now: None)
        loop.stop()
    assert ran == ["first", "called", "last"]
    assert loop.posts == posts + 5
    error = loop.pop_error()
    assert isinstance(error, KafkaError) and "a bug" in str(error)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_polls_that_keep_finding_news_share_one_timer(anyio_backend: str) -> None:
    """On asyncio a poll's timed wait sets a timer of the loop's; waits that end with news leave it
    for the next wait whose deadline is no earlier: one timer every timeout, not one a poll."""
    import asyncio

    loop = LoopCore(build_config({"bootstrap_servers": "127.0.0.1:1"}))
    loop.managers = []
    running = asyncio.get_running_loop()
    timers: list[float] = []  # set for our waits' deadlines (the loop's own tasks set others)
    deadlines: set[float] = set()
    call_at = running.call_at

    def counted(when: float, callback: Callable[..., object], *args: object, **kwargs: Any) -> asyncio.TimerHandle:
        if when in deadlines:
            timers.append(when)
        return call_at(when, callback, *args, **kwargs)

    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        running.call_at = counted  # type: ignore[method-assign]
        try:
            for _ in range(20):
                event = loop.app_event()
                running.call_soon(loop.notify_app)  # news, at the next turn of the event loop
                deadline = anyio.current_time() + 1.0
                deadlines.add(deadline)
                await loop.wait_app(event, deadline)
        finally:
            running.call_at = call_at  # type: ignore[method-assign]
        loop.stop()
    assert len(timers) == 1, timers
