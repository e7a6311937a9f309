"""Which event loop runs the calling task: ``"asyncio"``, ``"trio"`` or ``None``.

The consumer needs to know this in four places: ``Consumer.start()`` without ``async with`` works
on asyncio only, a per-partition stream remembers the coroutine of the task that reads it, and the
background loop yields twice on trio where once does on asyncio to let a waiting poll run first
(engine/core.py, ``LoopCore._hand_over``). anyio no longer installs ``sniffio`` (from 4.16), so the
answer comes from the two runtimes' own public calls: trio is asked only when it has been imported
(a trio program always has), asyncio otherwise.  The fourth: the background loop's wake events
(``wake_event_factory``), which on asyncio are the loop's own events with nothing around them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Literal, Protocol

import anyio
from anyio import EventStatistics

__all__ = ["WakeEvent", "current_async_library", "loop_clock", "wake_event_factory"]


def current_async_library() -> Literal["asyncio", "trio"] | None:
    """``"trio"`` inside a trio task, ``"asyncio"`` inside an asyncio task, ``None`` outside both."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return "asyncio"


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock, the one anyio's deadlines are on, as a function to call
    later: on asyncio the loop's own ``time`` (``anyio.current_time()`` looks the backend up on
    every call), elsewhere ``anyio.current_time``.  Only for use on the loop it was taken on."""
    if current_async_library() == "asyncio":
        return asyncio.get_running_loop().time
    return anyio.current_time


class WakeEvent(Protocol):
    """What the background loop and the polls need of an event (``anyio.Event``'s calls)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...

    def statistics(self) -> EventStatistics: ...


class _AsyncioWakeEvent(asyncio.Event):
    """``asyncio.Event`` with anyio's ``statistics()``: the loop's and the polls' wake events on
    asyncio, where anyio's ``Event`` wraps one and adds two Python calls to each wait and one to
    each set and each creation (about a dozen a fetch round trip).  One difference to anyio's: a
    wait on an event already set returns without yielding; the loop and the polls wait only on an
    event that was not set when they took it, and take a new one after each wake."""

    __slots__ = ()

    def statistics(self) -> EventStatistics:
        return EventStatistics(len(self._waiters))


def wake_event_factory() -> Callable[[], WakeEvent]:
    """What makes the wake events on the running event loop: ``asyncio.Event`` itself (with
    ``statistics()``) on asyncio, anyio's own class for the backend elsewhere, made without
    ``anyio.Event()``'s look-up of the backend on each call."""
    if current_async_library() == "asyncio":
        return _AsyncioWakeEvent
    return type(anyio.Event())
