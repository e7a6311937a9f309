"""A FastAPI job worker on a share group (KIP-932), acknowledging each job explicitly.

    uvicorn examples.share_worker:app   (with KAFKA_BOOTSTRAP, KAFKA_TOPIC, KAFKA_GROUP set)

Run as many instances as you like on the same group: each job (record) is handed to one of
them at a time.  A job that succeeds is ACCEPTed; one that fails with a retriable error is
RELEASEd (it comes back, to this or another worker, with ``delivery_count`` one higher); one
that can never succeed is REJECTed (archived).  A job that takes long RENEWs its lock.  A worker
that dies holding jobs loses them to the others when their locks run out.

The group must read from the start of the topic for jobs produced before its first member
joined: ``kafka-configs --bootstrap-server ... --alter --entity-type groups --entity-name workers
--add-config share.auto.offset.reset=earliest`` (see docs/share-groups.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI

from asyncconsumer import AcknowledgeType, RecordDeserializationError, ShareConsumer, ShareConsumerRecord


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
    stats: dict[str, Any] = {"done": 0, "released": 0, "rejected": 0, "in_progress": 0, "undecodable": 0}

    async def handle(consumer: ShareConsumer[bytes, dict[str, Any]], record: ShareConsumerRecord[bytes, Any]) -> None:
        stats["in_progress"] += 1
        try:
            await handler(record.value or {})
        except RetriableJobError:
            consumer.acknowledge(record, AcknowledgeType.RELEASE)
            stats["released"] += 1
        except Exception:
            consumer.acknowledge(record, AcknowledgeType.REJECT)
            stats["rejected"] += 1
        else:
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)
            stats["done"] += 1
        finally:
            stats["in_progress"] -= 1

    async def work(consumer: ShareConsumer[bytes, dict[str, Any]]) -> None:
        while True:
            try:
                batch = await consumer.getmany(timeout=1.0, max_records=10)
            except RecordDeserializationError:
                stats["undecodable"] += 1  # released: it is archived once the delivery limit is reached
                continue
            # The jobs of one poll run concurrently; every one is acknowledged before the next poll.
            async with anyio.create_task_group() as tg:
                for records in batch.values():
                    for record in records:
                        tg.start_soon(handle, consumer, record)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        consumer: ShareConsumer[bytes, dict[str, Any]] = ShareConsumer(
            bootstrap_servers=bootstrap, group_id=group, share_acknowledgement_mode="explicit",
            value_deserializer=json.loads, **options,
        )
        async with consumer, anyio.create_task_group() as tg:
            consumer.subscribe([topic])
            tg.start_soon(work, consumer)
            yield
            tg.cancel_scope.cancel()
        # Leaving the consumer sent the acknowledgements and released every job not finished.

    app = FastAPI(lifespan=lifespan)

    @app.get("/stats")
    def read_stats() -> dict[str, Any]:
        return stats

    return app


if os.environ.get("KAFKA_BOOTSTRAP"):
    app = create_app(os.environ["KAFKA_BOOTSTRAP"], os.environ["KAFKA_TOPIC"], os.environ.get("KAFKA_GROUP", "workers"))
