"""A task that counts its turns: how many turns of the event loop something took."""

from __future__ import annotations

import anyio
import anyio.lowlevel


class Ticker:
    """Run ``run()`` in a task: ``turns`` counts its turns (one a turn of the event loop, on asyncio)."""

    def __init__(self) -> None:
        self.turns = 0

    async def run(self) -> None:
        while True:
            self.turns += 1
            await anyio.lowlevel.checkpoint()
