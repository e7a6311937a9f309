"""A FastAPI job worker on a share group (KIP-932), acknowledging each job explicitly.

    pip install "asyncconsumer[examples]"
    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=jobs python path/to/share_worker.py
    # or:  KAFKA_BOOTSTRAP=... KAFKA_TOPIC=... uvicorn share_worker:app --app-dir path/to

Settings (environment): KAFKA_BOOTSTRAP and KAFKA_TOPIC (required), KAFKA_GROUP (default
"workers"), PORT (default 8000).  Share groups need Apache Kafka 4.1 or later.

Run as many instances as you like on the same group: each job (record) is handed to one of
them at a time.  A job that succeeds is ACCEPTed; one that fails with a retriable error is
RELEASEd (it comes back, to this or another worker, with ``delivery_count`` one higher); one
that can never succeed is REJECTed (archived).  A worker that dies holding jobs loses them to
the others when their locks run out.

- Poison pills: the consumer REJECTs a job that is not JSON (``on_deserialization_error="skip"``:
  no retry can make it JSON), so the broker archives it at once; it logs the record's topic,
  partition and offset at WARNING and counts it (``/stats``' undecodable, ``/metrics``'
  ``asyncconsumer_records_skipped_total``).  The worker never sees it.
- A crashed worker is logged and ``/healthz`` answers 503; shutdown (Ctrl-C, SIGTERM) cancels the
  worker and leaving ``async with consumer`` releases every job not finished and closes it.

The group must read from the start of the topic for jobs produced before its first member
joined: ``kafka-configs --bootstrap-server ... --alter --entity-type groups --entity-name workers
--add-config share.auto.offset.reset=earliest`` (see docs/share-groups.md).

Endpoints: ``/healthz``, ``/metrics`` (Prometheus' text format), ``/stats`` (jobs by outcome).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from asyncconsumer import AcknowledgeType, ShareConsumer, ShareConsumerRecord
from asyncconsumer.prometheus import ConsumerCollector

log = logging.getLogger("share_worker")


class RetriableJobError(Exception):
    """The job failed this time; another attempt may succeed."""


Job = Callable[[dict[str, Any]], Awaitable[None]]


async def run_job(job: dict[str, Any]) -> None:
    """Stand-in for real work: ``{"sleep": seconds, "fail": "retriable" | "permanent"}``."""
    await anyio.sleep(float(job.get("sleep", 0)))
    if job.get("fail") == "retriable":
        raise RetriableJobError("try again")
    if job.get("fail") == "permanent":
        raise ValueError("this job can never succeed")


def create_app(bootstrap: str, topic: str, group: str, *, handler: Job = run_job, **options: Any) -> FastAPI:
    stats: dict[str, Any] = {"done": 0, "released": 0, "rejected": 0, "in_progress": 0}
    running: dict[str, Any] = {"consumer": None, "failed": None}

    async def handle(consumer: ShareConsumer[bytes, dict[str, Any]], record: ShareConsumerRecord[bytes, Any]) -> None:
        stats["in_progress"] += 1
        try:
            await handler(record.value or {})
        except RetriableJobError:
            consumer.acknowledge(record, AcknowledgeType.RELEASE)
            stats["released"] += 1
        except Exception:
            log.exception("job %s-%d@%d failed for good: rejected", record.topic, record.partition, record.offset)
            consumer.acknowledge(record, AcknowledgeType.REJECT)
            stats["rejected"] += 1
        else:
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)
            stats["done"] += 1
        finally:
            stats["in_progress"] -= 1

    async def work(consumer: ShareConsumer[bytes, dict[str, Any]]) -> None:
        try:
            while True:
                batch = await consumer.getmany(timeout=1.0, max_records=10)
                # The jobs of one poll run concurrently; every one is acknowledged before the next poll.
                async with anyio.create_task_group() as tg:
                    for records in batch.values():
                        for record in records:
                            tg.start_soon(handle, consumer, record)
        except Exception as exc:
            log.exception("the worker stopped; /healthz now answers 503")
            running["failed"] = exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        consumer: ShareConsumer[bytes, dict[str, Any]] = ShareConsumer(
            bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
            value_deserializer=json.loads, on_deserialization_error="skip", **options,
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
        # Leaving the consumer sent the acknowledgements and released every job not finished.
        log.info("the consumer is closed")

    app = FastAPI(lifespan=lifespan)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(lambda: running["consumer"]))

    @app.get("/stats")
    async def read_stats() -> dict[str, Any]:
        consumer = running["consumer"]  # it counts the jobs it rejected as not JSON
        return {**stats, "undecodable": consumer.metrics().records_skipped if consumer is not None else 0}

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if running["failed"] is not None or running["consumer"] is None:
            return JSONResponse({"status": "down", "error": repr(running["failed"])}, status_code=503)
        member = running["consumer"].metrics().membership
        return JSONResponse({"status": "ok", "member_state": member.state, "assignment": len(member.assignment)})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _settings() -> tuple[str, str, str]:
    missing = [name for name in ("KAFKA_BOOTSTRAP", "KAFKA_TOPIC") if not os.environ.get(name)]
    if missing:
        raise SystemExit(
            f"share_worker: set {' and '.join(missing)} (and optionally KAFKA_GROUP, PORT), e.g.\n"
            "    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=jobs python share_worker.py"
        )
    return os.environ["KAFKA_BOOTSTRAP"], os.environ["KAFKA_TOPIC"], os.environ.get("KAFKA_GROUP", "workers")


def __getattr__(name: str) -> Any:
    """``uvicorn share_worker:app``: the app is made from the environment when uvicorn asks for it."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    app = globals()["app"] = create_app(*_settings())
    return app


if __name__ == "__main__":
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(*_settings()), host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
