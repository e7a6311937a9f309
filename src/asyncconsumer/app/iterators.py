"""The async iterators the consumer's read APIs return (``batches()``, ``arrow_batches()``,
``partitions()``): each step is one call of a step function (a poll, bracketed by the consumer's
``acquire()``/``release()``), and ``aclose()`` runs an optional cleanup."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


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
