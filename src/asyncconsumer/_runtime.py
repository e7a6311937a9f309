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
from typing import Literal

__all__ = ["current_async_library"]


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
