"""A one-shot result slot awaited by one side and completed by the other.

The seed design's ``CompletableFuture``: an application event carries one, the
background loop completes it.  Works on asyncio and trio (anyio.Event).
"""

from __future__ import annotations

from typing import Generic, TypeVar, cast

import anyio

T = TypeVar("T")
_UNSET = object()


class Waiter(Generic[T]):
    __slots__ = ("_event", "_exception", "_result")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._result: object = _UNSET
        self._exception: BaseException | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, result: T) -> None:
        if not self._event.is_set():
            self._result = result
            self._event.set()

    def set_exception(self, exc: BaseException) -> None:
        if not self._event.is_set():
            self._exception = exc
            self._event.set()

    def result(self) -> T:
        if self._exception is not None:
            raise self._exception
        if self._result is _UNSET:
            raise RuntimeError("Waiter.result() called before completion")
        return cast(T, self._result)

    async def wait(self) -> T:
        await self._event.wait()
        return self.result()
