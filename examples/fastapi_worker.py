"""A FastAPI app whose lifespan runs a consumer-group worker in the background.

    pip install "asyncconsumer[examples]"
    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python path/to/fastapi_worker.py
    # or, with uvicorn's own flags:  KAFKA_BOOTSTRAP=... KAFKA_TOPIC=... uvicorn fastapi_worker:app --app-dir path/to

Settings (environment): KAFKA_BOOTSTRAP and KAFKA_TOPIC (required), KAFKA_GROUP (default
"api-worker"), KAFKA_SESSION_TIMEOUT_MS (default the consumer's 45000: how soon the group hands the
partitions of an instance that died without leaving to the others), PORT (default 8000).  Records'
values are JSON; ``handle`` is where your processing goes.  docs/getting-started.md shows this code
(from ``import json`` to ``create_app``); keep the two alike.

- At-least-once: auto-commit is off and the worker commits after processing each batch, so that
  shutdown never commits a batch whose processing was cut short.
- Poison pills: the consumer skips a value that is not JSON (``on_deserialization_error="skip"``):
  it logs the record's topic, partition and offset at WARNING, counts it (``/stats``' skipped,
  ``/metrics``' ``asyncconsumer_records_skipped_total``) and moves past it, so the worker's next
  commit includes it.  The records around it are processed as usual; the bad one is not retried.
- A crashed worker (your ``handle`` raised) is logged with its traceback and ``/healthz`` answers
  503 from then on, so the orchestrator restarts the instance; it resumes from the last commit.
- Shutdown (Ctrl-C, SIGTERM): the worker is cancelled and leaving ``async with consumer`` closes the
  consumer (it leaves the group), whether the worker is running, crashed or never started.

Endpoints: ``/healthz`` (200 while the worker polls and the member is not fenced, else 503: a
liveness probe), ``/metrics`` (``Consumer.metrics()`` in Prometheus' text format, the Java
client's metric names), ``/stats`` (records processed and skipped).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from asyncconsumer import CommitFailedError, Consumer, KafkaError
from asyncconsumer.prometheus import ConsumerCollector

log = logging.getLogger("worker")

#: /healthz fails when the worker has not polled for this long (keep it under max_poll_interval_ms).
POLL_AGE_LIMIT = 60.0


async def handle(value: Any) -> None:
    """Your processing of one record's value (None for a tombstone)."""


class Worker:
    """Polls, processes, commits; keeps what /healthz and /stats report."""

    def __init__(self, consumer: Consumer[bytes, Any], process: Callable[[Any], Awaitable[None]]) -> None:
        self.consumer = consumer
        self.process = process
        self.processed = 0
        self.failed: Exception | None = None

    async def run(self) -> None:
        try:
            while True:
                batches = await self.consumer.getmany(timeout=1.0)
                for records in batches.values():
                    for record in records:
                        await self.process(record.value)
                        self.processed += 1
                if batches:
                    await self.commit()
        except Exception as exc:  # your handler raised, or a non-retriable Kafka error
            log.exception("the worker stopped; /healthz now answers 503")
            self.failed = exc

    async def commit(self) -> None:
        try:
            await self.consumer.commit()
        except CommitFailedError as exc:  # a rebalance moved the partitions: their new owner goes on
            log.warning("commit failed: %s", exc)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            log.warning("commit failed, the next one covers it: %s", exc)

    def stats(self) -> dict[str, int]:
        """Records processed, and records skipped as not JSON (the consumer counts those)."""
        return {"processed": self.processed, "skipped": self.consumer.metrics().records_skipped}

    def health(self) -> tuple[bool, dict[str, Any]]:
        if self.failed is not None:
            return False, {"status": "worker stopped", "error": repr(self.failed)}
        try:
            m = self.consumer.metrics()
        except KafkaError as exc:  # closed, or its background loop failed
            return False, {"status": "consumer down", "error": str(exc)}
        state = m.rebalances.member_state
        problems = []
        if m.last_poll_age > POLL_AGE_LIMIT:
            problems.append(f"no poll for {m.last_poll_age:.0f}s")
        if state == "fenced":
            problems.append("fenced out of the group")
        report = {"status": "; ".join(problems) or "ok", "member_state": state, "lag": m.lag,
                  "last_poll_age": round(m.last_poll_age, 3)}
        return not problems, report


def create_app(bootstrap: str, topic: str, group: str, *,
               process: Callable[[Any], Awaitable[None]] = handle, **options: Any) -> FastAPI:
    running: dict[str, Worker] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        consumer: Consumer[bytes, Any] = Consumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", value_deserializer=json.loads, on_deserialization_error="skip",
            **options,
        )
        async with consumer, anyio.create_task_group() as tasks:  # leaving it closes the consumer
            consumer.subscribe([topic])
            worker = running["worker"] = Worker(consumer, process)
            tasks.start_soon(worker.run)  # run() catches what it raises: nothing escapes to here
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
        log.info("the consumer is closed")

    app = FastAPI(lifespan=lifespan)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(lambda: w.consumer if (w := running.get("worker")) else None))

    # async handlers: they run on the consumer's event loop (a plain def would run in a thread).
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        worker = running.get("worker")
        ok, report = worker.health() if worker else (False, {"status": "not started"})
        return JSONResponse(report, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        worker = running.get("worker")
        return worker.stats() if worker else {}

    return app


def _settings() -> dict[str, Any]:
    """``create_app``'s arguments, from the environment."""
    import os

    missing = [name for name in ("KAFKA_BOOTSTRAP", "KAFKA_TOPIC") if not os.environ.get(name)]
    if missing:
        raise SystemExit(
            f"fastapi_worker: set {' and '.join(missing)} (and optionally KAFKA_GROUP, KAFKA_SESSION_TIMEOUT_MS,"
            " PORT), e.g.\n"
            "    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python fastapi_worker.py"
        )
    settings: dict[str, Any] = {"bootstrap": os.environ["KAFKA_BOOTSTRAP"], "topic": os.environ["KAFKA_TOPIC"],
                                "group": os.environ.get("KAFKA_GROUP", "api-worker")}
    if os.environ.get("KAFKA_SESSION_TIMEOUT_MS"):
        settings["session_timeout_ms"] = int(os.environ["KAFKA_SESSION_TIMEOUT_MS"])
    return settings


def __getattr__(name: str) -> Any:
    """``uvicorn fastapi_worker:app``: the app is made from the environment when uvicorn asks for it."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    app = globals()["app"] = create_app(**_settings())
    return app


if __name__ == "__main__":
    import os

    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(**_settings()), host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
