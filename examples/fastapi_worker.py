"""A FastAPI app whose lifespan runs an asyncconsumer worker in the background.

    uvicorn examples.fastapi_worker:app   (with KAFKA_BOOTSTRAP, KAFKA_TOPIC, KAFKA_GROUP set)

The consumer lives in the lifespan task (its task group is entered there), the
worker task iterates it, and request handlers read the worker's state.  On
shutdown the worker is cancelled and the consumer closes: it commits what was
processed and leaves the group, so the next instance starts where it stopped.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI

from asyncconsumer import Consumer


def create_app(bootstrap: str, topic: str, group: str, **consumer_options: Any) -> FastAPI:
    stats: dict[str, Any] = {"consumed": 0, "last_offset_by_partition": {}}

    async def work(consumer: Consumer[bytes, bytes]) -> None:
        async for record in consumer:
            stats["consumed"] += 1
            stats["last_offset_by_partition"][record.partition] = record.offset

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        consumer: Consumer[bytes, bytes] = Consumer(
            bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", **consumer_options
        )
        async with consumer, anyio.create_task_group() as tg:
            consumer.subscribe([topic])
            tg.start_soon(work, consumer)
            yield
            tg.cancel_scope.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/stats")
    def read_stats() -> dict[str, Any]:
        return stats

    return app


if os.environ.get("KAFKA_BOOTSTRAP"):
    app = create_app(os.environ["KAFKA_BOOTSTRAP"], os.environ["KAFKA_TOPIC"], os.environ.get("KAFKA_GROUP", "web"))
