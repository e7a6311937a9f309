"""The async iterators the consumer's read APIs return (``batches()``, ``arrow_batches()``,
``partitions()``): each step is one call of a step function (a poll, bracketed by the consumer's
``acquire()``/``release()``), and ``aclose()`` runs an optional cleanup.  And ``ready``, the
awaitable ``Consumer.__anext__`` returns for a record it already holds."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from ..protocol import records

T = TypeVar("T")


async def ready_py(value: T) -> T:
    """An awaitable whose value is ``value``: the pure-Python twin of the compiled ``ready``."""
    return value


#: ``ready(value)``: an awaitable already complete, ``await ready(x)`` is ``x``.  The compiled one
#: (``asyncconsumer._speedups.ready``, used with the compiled decoder) is no coroutine: no frame, no
#: suspension, so ``async for`` pays no coroutine per buffered record; ``ready_py`` otherwise.
ready: Callable[[Any], Awaitable[Any]] = cast(
    "Callable[[Any], Awaitable[Any]]",
    getattr(importlib.import_module("asyncconsumer._speedups"), "ready", ready_py)
    if records.DECODER == "c"
    else ready_py,
)


class Steps(Generic[T]):
    """``async for item in Steps(step)``: each item is ``await step()``; ``step`` ends the iteration
    by raising ``StopAsyncIteration``."""

    __slots__ = ("_on_close", "_step")

    def __init__(self, step: Callable[[], Awaitable[T]], on_close: Callable[[], None] | None = None) -> None:
        self._step = step
        self._on_close = on_close

    def __aiter__(self) -> Steps[T]:
        return self

    async def __anext__(self) -> T:
        return await self._step()

    async def aclose(self) -> None:
        if self._on_close is not None:
            self._on_close()
