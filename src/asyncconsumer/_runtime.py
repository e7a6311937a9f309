"""Which event loop runs the calling task: ``"asyncio"``, ``"trio"`` or ``None``.

The consumer needs to know this in three places: ``Consumer.start()`` without ``async with`` works
on asyncio only, a per-partition stream remembers the coroutine of the task that reads it, and the
background loop yields twice on trio where once does on asyncio to let a waiting poll run first
(engine/core.py, ``LoopCore._hand_over``). anyio no longer installs ``sniffio`` (from 4.16), so the
answer comes from the two runtimes' own public calls: trio is asked only when it has been imported
(a trio program always has), asyncio otherwise.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Literal

import anyio

__all__ = ["current_async_library", "loop_clock"]


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
