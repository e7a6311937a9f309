"""What ``Consumer`` and ``ShareConsumer`` share on the application side: the ``async with``
lifecycle around their background loop, and the KIP-957 ``acquire``/``release`` hooks with
their default rule (one polling task at a time).

``ClientBase`` is the common base class; each client says which of its operations are polls
(``POLL_OPERATIONS``) and builds its own loop (``_new_engine``) and first step (``_bootstrap``).
``bracketed``/``bracketed_sync`` wrap a public method between ``acquire(operation)`` and
``release(operation)``; ``bracketed`` also answers the arguments of other clients that Python
would refuse with a bare ``TypeError`` (aiokafka's ``timeout_ms=``) with what to write instead, as
``check_keyword_only`` does for the constructors (aiokafka's topics as positional arguments).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ClassVar, ParamSpec, Self, TypeVar

import anyio
import anyio.abc

from .._args import check_timeout
from ..engine.core import LoopCore
from ..errors import ConcurrentAccessError, ConfigTypeError, ConsumerClosedError, IllegalStateError
from .rebalance import CALLBACK_OWNER

P = ParamSpec("P")
R = TypeVar("R")


def check_keyword_only(kind: str, args: tuple[Any, ...]) -> None:
    """A client's options are keywords only; topics given first (aiokafka's
    ``AIOKafkaConsumer("events", bootstrap_servers=...)``) get told where they go."""
    if not args:
        return
    given = ", ".join(repr(a) for a in args[:3]) + (", ..." if len(args) > 3 else "")
    plural = "s" if len(args) > 1 else ""
    hint = ""
    if all(isinstance(a, str) for a in args):
        names = [t for a in args for t in a.split(",") if t]
        after = "after starting (with a group_id), or assign() partitions" if kind == "Consumer" else "after starting"
        hint = f"; topics are not options here (aiokafka takes them first): call consumer.subscribe({names!r}) {after}"
    raise ConfigTypeError(
        f"{kind}() takes keyword options only (bootstrap_servers=..., group_id=...), "
        f"got {len(args)} positional argument{plural} ({given}){hint}"
    )


def _no_timeout_ms(method: Callable[..., Any], operation: str) -> str:
    """What ``timeout_ms=`` (aiokafka's name, in milliseconds) is to be in ``operation()``."""
    if "timeout" in inspect.signature(method).parameters:
        return f"{operation}() takes timeout= in seconds, not timeout_ms= (e.g. timeout_ms=500 is timeout=0.5)"
    return (f"{operation}() has no timeout: bound it with anyio.fail_after(seconds) "
            "or asyncio.timeout(seconds) (timeout_ms= is aiokafka's)")


def bracketed(operation: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Run an async public method between ``acquire(operation)`` and ``release(operation)``."""

    def decorate(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        timeout_ms_hint = _no_timeout_ms(method, operation)

        @functools.wraps(method)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            self: ClientBase = args[0]  # type: ignore[assignment]  # the instance; no typing.cast() call a poll
            if "timeout_ms" in kwargs:
                raise ConfigTypeError(timeout_ms_hint)
            check_timeout(kwargs.get("timeout"), operation)
            self.acquire(operation)
            try:
                return await method(*args, **kwargs)
            finally:
                self.release(operation)

        return wrapper

    return decorate


#: The attribute naming a ``bracketed_sync`` wrapper's operation (``ClientBase._unbracketed``).
_SYNC_OPERATION = "_bracketed_operation"


def bracketed_sync(operation: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run a plain public method between ``acquire(operation)`` and ``release(operation)``."""

    def decorate(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            self: ClientBase = args[0]  # type: ignore[assignment]  # the instance; no typing.cast() call a poll
            self.acquire(operation)
            try:
                return method(*args, **kwargs)
            finally:
                self.release(operation)

        wrapper.__dict__[_SYNC_OPERATION] = operation
        return wrapper

    return decorate


def _current_task_id() -> int:
    """``anyio.get_current_task().id`` without the ``TaskInfo`` it builds on asyncio (its name,
    coroutine and parent looked up: several times the cost of this lookup, paid on every poll)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop in this thread: another backend (trio)
        task = None
    return id(task) if task is not None else anyio.get_current_task().id


async def _until(engine: LoopCore, condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (checked again whenever the loop handled responses) or the
    loop stops."""
    while not engine.closed:
        event = engine.app_event()
        if condition():
            return
        await event.wait()


class PollOwner:
    """Which task polls a client now, as the default ``acquire()``/``release()`` keep it (one
    polling task at a time): ``task``, that task's id (None: no poll in progress), and ``depth``,
    how many poll calls it is inside (``getone()`` calls ``getmany()``; a callback polls).

    ``async for`` reads ``task`` for every record it hands out without a poll (through the
    collector's ``FastPath``; the compiled ``RecordStream`` reads its slot)."""

    __slots__ = ("depth", "task")

    def __init__(self) -> None:
        self.task: int | None = None
        self.depth = 0


class ClientBase:
    """The application-side base of ``Consumer`` and ``ShareConsumer``."""

    #: How errors name the client ("consumer", "share consumer").
    KIND: ClassVar[str] = "consumer"
    #: The operations the default ``acquire`` rule treats as polls (one polling task at a time).
    POLL_OPERATIONS: ClassVar[frozenset[str]] = frozenset()

    #: The ``bracketed_sync`` methods whose operation is not a poll: (name, the method inside the
    #: wrapper); see ``_direct_plain_calls``.
    _unbracketed: ClassVar[tuple[tuple[str, Callable[..., Any]], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            found.update(vars(klass))
        cls._unbracketed = tuple(
            (name, value.__wrapped__)
            for name, value in found.items()
            if (operation := getattr(value, _SYNC_OPERATION, None)) is not None
            and operation not in cls.POLL_OPERATIONS
        )

    def __init__(self) -> None:
        self._engine: LoopCore | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        #: asyncio only: the loop's task when started with ``start()`` instead of ``async with``.
        self._runner: Any = None
        #: The polling task (the default acquire()/release() rule).
        self._poll_owner = PollOwner()
        #: ``close()`` was called: the client cannot be started (again).
        self._closed = False
        # ``async for`` may hand out records already taken without acquire()/release() when they
        # are the default ones: it does not await, so no other task sees the client in between.
        self._default_hooks = type(self).acquire is ClientBase.acquire and type(self).release is ClientBase.release

    def _direct_plain_calls(self, direct: bool) -> None:
        """While the client runs with the default ``acquire()``/``release()``, which do nothing for
        an operation that is not a poll, its plain (not async) methods of those operations are set
        on the instance as the methods themselves, without the wrapper's call
        (``ShareConsumer.acknowledge()`` is called once a record).  Taken off when it stops: a
        method bound on the instance is a reference cycle, which would keep a dropped client (and
        its buffers) until the cyclic GC runs."""
        if not self._default_hooks:
            return
        for name, method in self._unbracketed:
            if direct:
                setattr(self, name, method.__get__(self))
            else:
                self.__dict__.pop(name, None)

    # -- hooks for the subclass -------------------------------------------------------------------

    def _new_engine(self) -> LoopCore:
        """Build the background loop and keep it as ``self._engine``."""
        raise NotImplementedError

    async def _bootstrap(self) -> None:
        """The first step once the loop runs (reach the cluster); raising aborts the start."""

    def _callback_token(self) -> object | None:
        """Set while a callback runs that may poll although another task is the poller (KIP-957)."""
        return None

    async def close(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------------

    def _check_startable(self) -> None:
        if self._closed:
            raise ConsumerClosedError(
                f"the {self.KIND} is closed: a {self.KIND} runs once; create a new {type(self).__name__}"
            )
        if self._engine is not None:
            raise IllegalStateError(f"the {self.KIND} was already started")

    async def __aenter__(self) -> Self:
        self._check_startable()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            engine = self._new_engine()
            self._direct_plain_calls(True)
            await task_group.start(engine.run)
            await self._bootstrap()
        except BaseException:
            # Nothing may outlive a failed start: the loop stops and the task group is left.
            await self._shutdown(1.0)
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            self._task_group = None
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.close()
        finally:
            task_group, self._task_group = self._task_group, None
            if task_group is not None:
                # The loop has stopped; exiting with no exception keeps the caller's own
                # exception (if any) unwrapped instead of inside an ExceptionGroup.
                task_group.cancel_scope.cancel()
                await task_group.__aexit__(None, None, None)

    async def _shutdown(self, timeout: float) -> None:
        """Stop the loop and wait (at most ``timeout`` seconds) until its connections are closed;
        the first half of that time may go to the last client metrics push (KIP-714)."""
        engine = self._engine
        if engine is None:
            return
        self._direct_plain_calls(False)
        began = anyio.current_time()
        await self._push_final_metrics(engine, timeout / 2)
        timeout = max(0.0, timeout - (anyio.current_time() - began))
        engine.stop(within=timeout)
        with anyio.move_on_after(timeout, shield=True):
            await engine.wait_stopped()
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            runner.cancel()

    # -- client metrics push (KIP-714) ---------------------------------------------------------------

    @staticmethod
    async def _push_final_metrics(engine: LoopCore, timeout: float) -> None:
        """The terminating push, when a subscription is in hand (bounded by ``timeout``)."""
        telemetry = engine.telemetry
        if telemetry is None or telemetry.done or engine.closed or engine.fatal_error is not None:
            return
        with anyio.move_on_after(timeout, shield=True):
            try:
                await engine.call(telemetry.close)  # done at once without a subscription
            except ConsumerClosedError:
                return
            await _until(engine, lambda: telemetry.done)

    async def _client_instance_id(self, engine: LoopCore, timeout: float) -> uuid.UUID | None:
        """What ``client_instance_id()`` returns: the broker's id for this client, waiting up to
        ``timeout`` seconds for it; None if it did not come (or the cluster does not do KIP-714)."""
        telemetry = engine.telemetry
        if telemetry is None:
            raise IllegalStateError(
                f"client metrics push is off (enable_metrics_push=False): this {self.KIND} has no client instance id"
            )
        with anyio.move_on_after(timeout):
            await _until(engine, lambda: telemetry.client_instance_id is not None or telemetry.done)
        return telemetry.client_instance_id

    # -- KIP-957: acquire / release ---------------------------------------------------------------

    def acquire(self, operation: str) -> None:
        """Called before every public call; override to change the concurrency rules.

        Default: any task may call the client, but only one task at a time may
        poll it (``POLL_OPERATIONS``: ``async for``, ``getmany``, ...).  While a
        consumer callback runs, the callback and tasks it started may poll and
        commit too.  Another task polling at the same time gets
        ``ConcurrentAccessError``.
        """
        if operation not in self.POLL_OPERATIONS:
            return
        me = _current_task_id()
        owner = self._poll_owner
        if owner.task is None or owner.task == me:
            owner.task = me
            owner.depth += 1
            return
        token = self._callback_token()
        if token is not None and CALLBACK_OWNER.get() is token:
            owner.depth += 1
            return
        name = type(self).__name__
        raise ConcurrentAccessError(
            f"{operation}() called from task {me} while task {owner.task} is polling this {self.KIND}; "
            f"poll from one task, or override {name}.acquire()/release() (docs/concurrency.md)"
        )

    def release(self, operation: str) -> None:
        """Called after every public call (also on error or cancellation)."""
        owner = self._poll_owner
        if operation not in self.POLL_OPERATIONS or owner.depth == 0:
            return
        owner.depth -= 1
        if owner.depth == 0:
            owner.task = None
