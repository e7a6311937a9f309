"""An aiohttp app with an asyncconsumer background task (asyncio: start()/close()).

    python -m examples.aiohttp_worker BOOTSTRAP TOPIC GROUP

``cleanup_ctx`` starts the consumer and a task that iterates it when the app
starts, and cancels the task and closes the consumer (commit + leave) on
shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from asyncconsumer import Consumer

STATS = web.AppKey("stats", dict)


def create_app(bootstrap: str, topic: str, group: str, **consumer_options: Any) -> web.Application:
    app = web.Application()
    app[STATS] = {"consumed": 0}

    async def consume(consumer: Consumer[bytes, bytes]) -> None:
        async for _record in consumer:
            app[STATS]["consumed"] += 1

    async def consumer_ctx(app: web.Application) -> AsyncIterator[None]:
        consumer: Consumer[bytes, bytes] = Consumer(
            bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", **consumer_options
        )
        await consumer.start()
        consumer.subscribe([topic])
        task = asyncio.create_task(consume(consumer))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.close()

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(request.app[STATS])

    app.cleanup_ctx.append(consumer_ctx)
    app.router.add_get("/stats", stats)
    return app


if __name__ == "__main__":
    web.run_app(create_app(*sys.argv[1:4]), host="127.0.0.1", port=8080)
