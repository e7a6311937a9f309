"""An aiohttp app with a consumer-group worker task (asyncio: ``start()``/``close()``).

    pip install "asyncconsumer[examples]"
    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python path/to/aiohttp_worker.py

Settings (environment): KAFKA_BOOTSTRAP and KAFKA_TOPIC (required), KAFKA_GROUP (default
"aiohttp-worker"), KAFKA_SESSION_TIMEOUT_MS (optional), PORT (default 8080).  Values are JSON;
``handle`` is your processing.

``cleanup_ctx`` starts the consumer and the worker task when the app starts; on shutdown
(Ctrl-C, SIGTERM) it cancels the task and closes the consumer in a ``finally``, whatever the task
did.  As in fastapi_worker.py: auto-commit is off and each batch is committed after processing; the
consumer skips a value that is not JSON (a poison pill: ``on_deserialization_error="skip"`` logs
its topic, partition and offset, counts it and moves past it); a worker that crashes is logged and
``/healthz`` answers 503.

Endpoints: ``/healthz``, ``/metrics`` (Prometheus' text format), ``/stats``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from asyncconsumer import Consumer, KafkaError
from asyncconsumer.prometheus import ConsumerCollector

log = logging.getLogger("aiohttp_worker")

STATE = web.AppKey("state", dict)


async def handle(value: Any) -> None:
    """Your processing of one record's value (None for a tombstone)."""


async def work(consumer: Consumer[bytes, Any], state: dict[str, Any]) -> None:
    try:
        while True:
            batches = await consumer.getmany(timeout=1.0)
            for records in batches.values():
                for record in records:
                    await handle(record.value)
                    state["processed"] += 1
            if batches:
                await consumer.commit()
    except Exception as exc:
        log.exception("the worker stopped; /healthz now answers 503")
        state["failed"] = exc


def create_app(bootstrap: str, topic: str, group: str, **options: Any) -> web.Application:
    app = web.Application()
    state: dict[str, Any] = {"processed": 0, "failed": None, "consumer": None}
    app[STATE] = state
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(lambda: state["consumer"]))

    async def consumer_ctx(app: web.Application) -> AsyncIterator[None]:
        consumer: Consumer[bytes, Any] = Consumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", value_deserializer=json.loads, on_deserialization_error="skip",
            **options,
        )
        await consumer.start()
        try:
            consumer.subscribe([topic])
            state["consumer"] = consumer
            task = asyncio.create_task(work(consumer, state))
            try:
                yield
            finally:
                task.cancel()
                await asyncio.wait([task])  # never raises: work() logged and kept its failure
        finally:
            state["consumer"] = None
            await consumer.close()
            log.info("the consumer is closed")

    async def healthz(request: web.Request) -> web.Response:
        if state["failed"] is not None or state["consumer"] is None:
            return web.json_response({"status": "down", "error": repr(state["failed"])}, status=503)
        try:
            m = state["consumer"].metrics()
        except KafkaError as exc:
            return web.json_response({"status": "down", "error": str(exc)}, status=503)
        ok = m.last_poll_age < 60 and m.rebalances.member_state != "fenced"
        report = {"status": "ok" if ok else "stuck or fenced", "member_state": m.rebalances.member_state}
        return web.json_response(report, status=200 if ok else 503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(request: web.Request) -> web.Response:
        consumer = state["consumer"]
        skipped = consumer.metrics().records_skipped if consumer is not None else 0  # the consumer counts them
        return web.json_response({"processed": state["processed"], "skipped": skipped})

    app.cleanup_ctx.append(consumer_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    return app


def _settings() -> dict[str, Any]:
    """``create_app``'s arguments, from the environment."""
    missing = [name for name in ("KAFKA_BOOTSTRAP", "KAFKA_TOPIC") if not os.environ.get(name)]
    if missing:
        raise SystemExit(
            f"aiohttp_worker: set {' and '.join(missing)} (and optionally KAFKA_GROUP, KAFKA_SESSION_TIMEOUT_MS,"
            " PORT), e.g.\n"
            "    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python aiohttp_worker.py"
        )
    settings: dict[str, Any] = {"bootstrap": os.environ["KAFKA_BOOTSTRAP"], "topic": os.environ["KAFKA_TOPIC"],
                                "group": os.environ.get("KAFKA_GROUP", "aiohttp-worker")}
    if os.environ.get("KAFKA_SESSION_TIMEOUT_MS"):
        settings["session_timeout_ms"] = int(os.environ["KAFKA_SESSION_TIMEOUT_MS"])
    return settings


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(create_app(**_settings()), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
