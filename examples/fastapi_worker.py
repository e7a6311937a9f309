"""A FastAPI app whose lifespan runs an asyncconsumer worker in the background.

    uvicorn examples.fastapi_worker:app   (with KAFKA_BOOTSTRAP, KAFKA_TOPIC, KAFKA_GROUP set)

The consumer lives in the lifespan task (its task group is entered there), the
worker task iterates it, and request handlers read the worker's state.  On
shutdown the worker is cancelled and the consumer closes: it commits what was
processed and leaves the group, so the next instance starts where it stopped.

``/healthz`` answers 200 while the worker polls and the member is not fenced out of
its group, 503 otherwise (a Kubernetes liveness probe); ``/metrics`` is
``Consumer.metrics()`` in Prometheus' text format through
``asyncconsumer.prometheus.ConsumerCollector`` (the ``prometheus`` extra; read at each scrape,
nothing is counted twice; the Java client's metric names).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from asyncconsumer import Consumer
from asyncconsumer.prometheus import ConsumerCollector

#: /healthz fails when the worker has not polled for this long (keep it under max_poll_interval_ms).
POLL_AGE_LIMIT = 60.0


def health(consumer: Consumer[Any, Any] | None, worker_failed: BaseException | None) -> tuple[bool, dict[str, Any]]:
    """Liveness from ``Consumer.metrics()``: the worker polls, and the member is not fenced."""
    if consumer is None or worker_failed is not None:
        return False, {"status": "down", "error": repr(worker_failed) if worker_failed else "not started"}
    m = consumer.metrics()
    state = m.rebalances.member_state
    report = {"last_poll_age": round(m.last_poll_age, 3), "member_state": state, "lag": m.lag,
              "rebalances": m.rebalances.count}
    problems = []
    if m.last_poll_age > POLL_AGE_LIMIT:
        problems.append(f"no poll for {m.last_poll_age:.0f}s")
    if state == "fenced":
        problems.append("fenced out of the group")
    report["status"] = "; ".join(problems) if problems else "ok"
    return not problems, report


def create_app(bootstrap: str, topic: str, group: str, **consumer_options: Any) -> FastAPI:
    stats: dict[str, Any] = {"consumed": 0, "last_offset_by_partition": {}}
    running: dict[str, Any] = {"consumer": None, "failed": None}

    async def work(consumer: Consumer[bytes, bytes]) -> None:
        try:
            async for record in consumer:
                stats["consumed"] += 1
                stats["last_offset_by_partition"][record.partition] = record.offset
        except Exception as exc:  # /healthz reports it
            running["failed"] = exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        consumer: Consumer[bytes, bytes] = Consumer(
            bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", **consumer_options
        )
        async with consumer, anyio.create_task_group() as tg:
            consumer.subscribe([topic])
            running["consumer"] = consumer
            tg.start_soon(work, consumer)
            try:
                yield
            finally:
                running["consumer"] = None
                tg.cancel_scope.cancel()

    app = FastAPI(lifespan=lifespan)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(lambda: running["consumer"]))

    @app.get("/stats")
    def read_stats() -> dict[str, Any]:
        return stats

    # async handlers: they run on the consumer's event loop (a plain def would run in a thread).
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok, report = health(running["consumer"], running["failed"])
        return JSONResponse(report, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


if os.environ.get("KAFKA_BOOTSTRAP"):
    app = create_app(os.environ["KAFKA_BOOTSTRAP"], os.environ["KAFKA_TOPIC"], os.environ.get("KAFKA_GROUP", "web"))
