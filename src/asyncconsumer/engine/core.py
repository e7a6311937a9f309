"""What every background loop shares: the consumer's (``engine/loop.py``) and the share consumer's
(``engine/share_loop.py``).

A loop is one task that owns the sockets and the request managers. Each turn it runs queued
application events (closures the public API posts with ``call()``/``post()``), hands completed
responses to the managers that sent them (an answer in ``ANSWER_AT_ONCE`` that comes while the loop
sleeps goes to its manager at once, from the connection's reader task: ``_on_complete``), lets each
subclass do its own per-turn checks (``_before_poll``), yields (in the consumer's loop) if the
application was waiting for news, so it takes the records before the next requests are built
(``_hand_over``), polls every manager for unsent requests and gives them to the network client,
then sleeps until the earliest manager deadline or until something wakes it. How late it runs again
is the event loop's lag (``managers/loop_lag.py``): a loop blocked by the application for long
enough is named in a WARNING with the deadline it put at risk (``_deadlines``, extended by each
subclass). Every few seconds it also has the buffer pools give back what they have not used for a
while (engine/buffers.py: the frame pool, and the consumer's Arrow column pool). It never raises
into the caller's task group: failures become background events (errors the application side raises
at its next call), and a bug in the loop itself ends it with ``fatal_error`` set, after which every
call says so.

The subclass builds its managers and lists them in ``managers``; everything else, including SASL
logins on new connections, is here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc

from .._runtime import WakeEvent, current_async_library, loop_clock, wake_event_factory
from ..config import ConsumerConfig
from ..errors import ConsumerClosedError, KafkaError, KafkaTimeoutError
from ..managers.loop_lag import Deadline, LoopLagWatch
from ..managers.metadata import Cluster, MetadataManager
from ..managers.requests import Body, RequestManager, UnsentRequest
from ..managers.telemetry import TelemetryManager, resource_attributes
from ..managers.waiter import Waiter
from . import sasl as sasl_module
from .buffers import BufferPool
from .connection import BrokerConnection
from .network import NetworkClient

T = TypeVar("T")
_MIN_SLEEP = 0.002  # a floor so a wrong deadline can never spin the CPU
#: How often the loop has the buffer pools give back what they have not used for a while (seconds).
TRIM_INTERVAL = 5.0


class LoopCore:
    # ``closed`` in a slot: ``async for``'s compiled step (speedups/ready.c) reads it for every
    # record it hands out, straight from the slot; every other attribute is in the instance dict.
    __slots__ = ("__dict__", "__weakref__", "closed")

    #: What the errors call this loop's owner ("consumer", "share consumer").
    OWNER: ClassVar[str] = "consumer"
    log: ClassVar[logging.Logger] = logging.getLogger("asyncconsumer.engine")
    #: Whether a turn whose responses an application task was waiting for yields to it before the
    #: managers run (``_hand_over``).
    HAND_OVER: ClassVar[bool] = True
    #: The requests whose answers go to their manager at once, in the task that read them, when the
    #: loop is asleep between turns with nothing queued (``_on_complete``).
    ANSWER_AT_ONCE: ClassVar[frozenset[str]] = frozenset()
    #: Built by the subclass (both loops keep cluster metadata).
    metadata: MetadataManager

    def __init__(self, config: ConsumerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        #: Application events: a function to run on the loop, and the waiter of its result (None:
        #: nobody waits, ``post``).
        self._events: deque[tuple[Callable[[float], Any], Waiter[Any] | None]] = deque()
        #: Events queued so far (``post`` and ``call``): equal counts mean none was queued in between.
        self.posts = 0
        self._completions: deque[tuple[UnsentRequest, int, Body | None, BaseException | None]] = deque()
        self._errors: deque[KafkaError] = deque()
        #: Makes the loop's and the application's wake events: ``anyio.Event`` until the loop runs,
        #: then ``_runtime.wake_event_factory()``'s: asyncio's own event on asyncio, the backend's
        #: class elsewhere (made directly, without ``anyio.Event()``'s look-up of the backend).
        self._new_event: Callable[[], WakeEvent] = anyio.Event
        #: The running asyncio loop once the loop runs on one (``wait_app``'s timer); None elsewhere.
        self._asyncio_loop: asyncio.AbstractEventLoop | None = None
        #: anyio's clock, read without its backend lookup once the loop runs (``app_time``).
        self._app_clock: Callable[[], float] = anyio.current_time
        self._wake_event: WakeEvent = anyio.Event()
        self._woken = False
        # When the loop is to run its next turn at the latest (its clock; inf while it runs), and
        # the alarm task that wakes it then: when that task means to look next, and what tells it
        # to look sooner (see ``_alarm``).
        self._wake_at = float("inf")
        self._alarm_at = float("inf")
        self._rearm: WakeEvent = anyio.Event()
        self._app_event: WakeEvent = anyio.Event()
        #: ``wait_app``'s timer on asyncio, and when it rings (inf: none).
        self._app_alarm: asyncio.TimerHandle | None = None
        self._app_alarm_at = float("inf")
        #: The loop runs again right after the application task now woken (``loop_runs_next``): a
        #: hand-over is under way, or an answer taken at once woke both.
        self._handing_over = False
        #: The loop sleeps between turns (``_on_complete`` may hand an answer to its manager).
        self._asleep = False
        self._task_group: anyio.abc.TaskGroup | None = None
        #: The loop runs (``run()`` started it and has not ended); see ``closed`` for a stop under way.
        self.running = False
        self._stopped = anyio.Event()
        self.fatal_error: BaseException | None = None
        self.closed = False
        self._close_within = 2.0  # how long closing the connections may take (see stop())
        self._tokens = (
            sasl_module.TokenCache(config.sasl_oauth_token_provider, timeout=config.request_timeout_ms / 1000)
            if config.sasl_oauth_token_provider is not None
            else None
        )
        self.network = NetworkClient(
            config, self._spawn, self._on_complete, sasl=self._authenticate if config.uses_sasl else None, clock=clock
        )
        self.managers: list[RequestManager] = []
        warn_after = config.loop_lag_warning_ms
        #: How late the loop runs: the event loop's lag, and the WARNING when it was blocked.
        self.loop_lag = LoopLagWatch(
            warn_after=warn_after / 1000 if warn_after is not None else None, deadlines=self._deadlines, log=self.log
        )
        self._pools: list[BufferPool] = [self.network.frames]
        self._next_trim = 0.0
        #: Client metrics push (KIP-714), a manager the subclass lists; None with enable_metrics_push off.
        self.telemetry = TelemetryManager(
            resource=resource_attributes(config.group_id, config.group_instance_id, config.client_rack),
            group=config.group_id is not None,
        ) if config.enable_metrics_push else None

    # -- hooks for the subclass -------------------------------------------------------------------

    def _on_start(self) -> None:
        """Once, when the loop starts."""

    def _before_poll(self, now: float) -> None:
        """Each turn, after events and completions, before the managers are polled."""

    def _fail_pending(self, error: BaseException) -> None:
        """The loop ended: fail what the managers still hold for the application."""

    def _deadlines(self) -> list[Deadline]:
        """What a blocked event loop puts at risk now (asked when it was blocked): the subclass adds
        its group's deadlines to the requests' own."""
        timeout = self.config.request_timeout_ms
        return [Deadline(f"request_timeout_ms={timeout}", timeout / 1000,
                         "a fetch, commit or other request in flight fails after that long and its connection is "
                         "closed")]

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The background loop; returns when ``stop()`` is called."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                self.running = True
                tg.start_soon(self._alarm)
                task_status.started()
                try:
                    await self._loop()
                finally:
                    tg.cancel_scope.cancel()
        except Exception as exc:  # never let a bug escape into the user's task group
            self.log.exception("asyncconsumer %s background loop failed", self.OWNER)
            self.fatal_error = exc
        finally:
            self._task_group = None
            self.running = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._close_within):
                await self.network.aclose()
            self.closed = True
            error = self.fatal_error or ConsumerClosedError(f"the {self.OWNER} is closed")
            events, self._events = self._events, deque()
            for _, waiter in events:
                if waiter is not None:
                    waiter.set_exception(error)
            self._fail_pending(error)
            if self._app_alarm is not None:
                self._app_alarm.cancel()
            self._stopped.set()
            self._app_event.set()

    def stop(self, within: float = 2.0) -> None:
        """Stop the loop; closing the connections may take up to ``within`` seconds."""
        self._close_within = within
        self.closed = True
        self.wake()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _loop(self) -> None:
        self._new_event = wake_event_factory()
        self._on_start()
        backend = current_async_library()
        self._hand_over_yields = 2 if backend == "trio" else 1
        self._asyncio_loop = asyncio.get_running_loop() if backend == "asyncio" else None
        self._app_clock = loop_clock()
        lag = self.loop_lag
        while not self.closed:
            now = self.clock()
            lag.ran(now)
            if now >= self._next_trim:
                self._next_trim = now + TRIM_INTERVAL
                for pool in self._pools:
                    pool.trim()
            if self._events:
                self._run_events(now)
            hand_over = False
            if self._completions:
                hand_over = self.HAND_OVER and self._app_event.statistics().tasks_waiting > 0
                self._run_completions(now)
            self.network.drop_dead_connections()
            failed_login = self.network.pop_fatal_error()
            if failed_login is not None:
                self.report_once(failed_login)  # fatal at once, as in the Java client
            self._before_poll(now)
            if hand_over:  # after _before_poll: the application sees what it settled (a fallback's error gone)
                now = await self._hand_over()
            deadline = float("inf")
            for manager in self.managers:
                for request in manager.poll(now):
                    self.network.send(request)
                deadline = min(deadline, manager.next_deadline(now))
            if self._woken or self._events or self._completions:
                self._woken = False
                lag.due = self.clock()
                await anyio.lowlevel.checkpoint()
                continue
            start = self.clock()
            due = lag.due = start + min(max(_MIN_SLEEP, deadline - start), 1.0)
            self._wake_at = due
            if due < self._alarm_at:
                self._rearm.set()
            self._asleep = True
            try:
                await self._wake_event.wait()
            finally:
                self._asleep = False
            self._handing_over = False
            self._wake_at = float("inf")
            self._take_wake()

    async def _hand_over(self) -> float:
        """The application was waiting for news and this turn's responses brought some: let it take
        them before the managers build and send the next requests, which would otherwise run
        first.  A consumer that has caught up gets its next records that much sooner (a poll's
        wake-up does not wait for the next fetch's encoding and send); the fetch goes out at the
        application's next ``await``, and on a backlog the application is rarely waiting, so
        there the next fetch still goes out before the records are worked through.  What the
        application does meanwhile (taking records frees buffer room, a seek, a commit) is seen by
        the rest of this turn, so the ``wake()`` it may call is not another turn; events and
        completions it queued still are.  asyncio runs the woken poll before the loop that
        yielded after waking it; trio runs the tasks of one step in either order, so there the
        loop yields twice (the poll runs in the first step after, the loop again in the second).
        Returns the time after."""
        lag = self.loop_lag
        lag.due = self.clock()
        self._handing_over = True
        try:
            for _ in range(self._hand_over_yields):
                await anyio.lowlevel.checkpoint()
        finally:
            self._handing_over = False
        now = self.clock()
        lag.ran(now)
        if not self.closed:
            self._take_wake()
        return now

    def _take_wake(self) -> None:
        """What woke the loop is being seen by the turn that runs now: the next wake needs a new call."""
        self._woken = False
        if self._wake_event.is_set():
            self._wake_event = self._new_event()

    async def _alarm(self) -> None:
        """Wakes the loop at its ``_wake_at``: the loop sleeps on its wake event alone, without a
        timeout of its own (a cancel scope and a timer each turn, that is each fetch round trip).

        The loop's next wake time mostly moves later (a second after each turn, or a manager's
        deadline), so the alarm looks when the time it last saw comes; it sleeps on to the new time
        if the loop's moved on (or the loop is running, ``inf``), and wakes the loop if it is due.
        A turn that wants to run sooner than the alarm looks tells it (``_rearm``)."""
        while True:
            rearm = self._rearm = self._new_event()
            wake_at = self._wake_at
            delay = wake_at - self.clock()
            if delay <= 0:
                self._wake_at = self._alarm_at = float("inf")
                self.wake()
                await rearm.wait()
                continue
            self._alarm_at = wake_at
            with anyio.move_on_after(delay):
                await rearm.wait()

    def wake(self) -> None:
        self._woken = True
        self._wake_event.set()

    def watch_pool(self, pool: BufferPool) -> None:
        """Have ``pool`` give back its idle buffers too (every ``TRIM_INTERVAL`` seconds; the pool
        must be used on this event loop only: the consumer's Arrow column pool)."""
        self._pools.append(pool)

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._task_group is None:
            raise ConsumerClosedError(f"the {self.OWNER} is not running")
        self._task_group.start_soon(fn, *args)

    # -- metadata ----------------------------------------------------------------------------------

    async def wait_for_metadata(self, timeout: float, *, all_topics: bool = True) -> Cluster:
        """A fresh all-topics metadata snapshot (for ``topics()``); with ``all_topics=False`` the
        cluster after the next Metadata answer, whatever it asked (a client's first step: the
        brokers answer)."""
        metadata = self.metadata
        waiter = await self.call(lambda now: metadata.fetch_all_topics() if all_topics else metadata.next_answer())
        with anyio.move_on_after(timeout):
            while True:
                with anyio.move_on_after(0.05):
                    return await waiter.wait()
                failed = self.network.bootstrap_failed_for_good()
                if failed is not None:
                    raise failed
        raise self.unreachable_or_timeout("metadata request", timeout)

    def unreachable_or_timeout(self, what: str, timeout: float) -> KafkaError:
        unreachable = self.network.all_unreachable_error()
        if unreachable is not None:
            return unreachable
        last = self.metadata.last_error
        suffix = f" (last error: {last})" if last else ""
        return KafkaTimeoutError(f"{what} did not complete within {timeout:.1f}s{suffix}")

    # -- application events -----------------------------------------------------------------------

    def post(self, fn: Callable[[float], Any]) -> None:
        """Queue an application event whose result nobody waits for (no waiter made: the share
        consumer posts one for each record it acknowledges); what it raises is reported as an
        internal error, as for a response handler."""
        self._events.append((fn, None))
        self.posts += 1
        self.wake()

    async def call(self, fn: Callable[[float], T]) -> T:
        """Run ``fn(now)`` on the background loop (an application event) and return its result."""
        self.check_running()
        waiter: Waiter[T] = Waiter()
        self._events.append((fn, waiter))
        self.posts += 1
        self.wake()
        return await waiter.wait()

    def check_running(self) -> None:
        if self.fatal_error is not None:
            raise ConsumerClosedError(f"the {self.OWNER}'s background loop failed: {self.fatal_error!r}")
        if self.closed or not self.running:
            raise ConsumerClosedError(f"the {self.OWNER} is not running: use 'async with' or 'await start()'")

    def _run_events(self, now: float) -> None:
        while self._events:
            fn, waiter = self._events.popleft()
            if waiter is None:  # posted
                try:
                    fn(now)
                except Exception as exc:
                    self.log.exception("an application event of the %s failed", self.OWNER)
                    self.report_error(KafkaError(f"internal error running an application event: {exc!r}"))
                continue
            if waiter.done():
                continue
            try:
                waiter.set_result(fn(now))
            except Exception as exc:
                waiter.set_exception(exc)

    # -- completions from the network -------------------------------------------------------------

    def _on_complete(
        self, request: UnsentRequest, version: int, body: Body | None, error: BaseException | None
    ) -> None:
        """A request ended: its outcome goes to the loop's next turn; or, for an answer in
        ``ANSWER_AT_ONCE`` that comes while the loop sleeps between turns with nothing queued, to
        its manager now, in the task that read it (the connection's reader).  Nothing else is
        touching the managers then, and the answer is handled as the turn would have, first thing:
        the application task waiting for records wakes a turn of the event loop sooner, and the
        loop, woken after it, runs its turn to send what follows (``loop_runs_next``)."""
        if self._asleep and not self._woken and body is not None and error is None \
                and request.api in self.ANSWER_AT_ONCE:
            self.notify_app()  # first: asyncio runs the application's task before the loop's
            self._complete(self.clock(), request, version, body, None)
            self._handing_over = True
            self.wake()
            return
        self._completions.append((request, version, body, error))
        self.wake()

    def _run_completions(self, now: float) -> None:
        if self._completions:
            self.notify_app()  # positions, offsets or errors may have changed: let waiters re-check
        while self._completions:
            self._complete(now, *self._completions.popleft())

    def _complete(
        self, now: float, request: UnsentRequest, version: int, body: Body | None, error: BaseException | None
    ) -> None:
        try:
            if error is None and body is not None:
                request.on_response(now, version, body)
            else:
                request.on_error(now, error or KafkaError("no response"))
        except Exception as exc:
            self.log.exception("handling a %s response failed", request.api)
            self.report_error(KafkaError(f"internal error handling {request.api}: {exc!r}"))

    # -- background events (to the application side) ----------------------------------------------

    def report_error(self, error: KafkaError) -> None:
        self._errors.append(error)
        self.notify_app()

    def report_once(self, error: KafkaError) -> None:
        """``report_error`` unless an error of the same class still waits for the application (a
        condition that repeats each retry: raised at each call, never piled up meanwhile)."""
        if not any(type(queued) is type(error) for queued in self._errors):
            self.report_error(error)

    def notify_app(self) -> None:
        self._app_event.set()

    def loop_runs_next(self) -> bool:
        """The loop is handing over (``_hand_over``), or an answer taken at once woke the calling
        task before the loop (``_on_complete``), and the loop runs as soon as the calling task
        waits or yields: a poll need not yield to let it run first.  True once each time, so a
        task that keeps finding records still lets the loop run between its polls."""
        if self._handing_over:
            self._handing_over = False
            return True
        return False

    async def wait_app(self, event: WakeEvent, deadline: float) -> None:
        """Until ``event`` (an :meth:`app_event`) is set or the anyio clock reaches ``deadline``: a
        poll's wait for news with a timeout.

        On asyncio a timer of the loop's, the application's alarm, sets the application's event
        at the deadline (the poll woken then finds its time up; a wake with no news is what every
        waiter of that event expects), instead of a cancel scope: anyio's scope and its timer cost
        about as much again as the wait itself.  The alarm stays when the wait ends with news, and a
        later wait whose deadline is no earlier keeps it (it rings first, and that poll waits again
        from there with an alarm of its own), so polls that keep finding records make one timer
        every timeout instead of one each, and leave no cancelled timers to asyncio's heap (whose
        entries compare in Python).  Elsewhere, and before the loop runs, a cancel scope."""
        loop = self._asyncio_loop
        if loop is None:
            with anyio.CancelScope(deadline=deadline):
                await event.wait()
            return
        if deadline < self._app_alarm_at:  # none rings by then
            if self._app_alarm is not None:
                self._app_alarm.cancel()
            self._app_alarm = loop.call_at(deadline, self._ring_app_alarm)
            self._app_alarm_at = deadline
        await event.wait()

    def _ring_app_alarm(self) -> None:
        self._app_alarm = None
        self._app_alarm_at = float("inf")
        self._app_event.set()

    def app_time(self) -> float:
        """anyio's clock, which :meth:`wait_app`'s deadlines are on: on asyncio the event loop's
        own, read without anyio's lookup of the running backend (a poll reads it twice)."""
        return self._app_clock()

    def app_event(self) -> WakeEvent:
        if self._app_event.is_set():
            self._app_event = self._new_event()
        return self._app_event

    def pop_error(self) -> KafkaError | None:
        return self._errors.popleft() if self._errors else None

    # -- SASL -------------------------------------------------------------------------------------

    async def _authenticate(self, connection: BrokerConnection) -> int:
        """Log ``connection`` in (also to re-authenticate it); returns the session lifetime in ms."""
        config = self.config
        token = await self._tokens.token(connection.session_lifetime) if self._tokens is not None else None
        mechanism = sasl_module.create_mechanism(
            config.sasl_mechanism, config.sasl_plain_username, config.sasl_plain_password, token
        )
        return await connection.log_in(mechanism)
