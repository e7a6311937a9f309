"""A consumer-group worker on trio, with the two endpoints an orchestrator asks for.

    pip install "asyncconsumer[examples]"
    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python path/to/trio_worker.py

Settings (environment): KAFKA_BOOTSTRAP and KAFKA_TOPIC (required), KAFKA_GROUP (default
"trio-worker"), KAFKA_SESSION_TIMEOUT_MS (optional), PORT (default 8080).  Values are JSON;
``handle`` is your processing.

On trio a consumer lives in ``async with``: its background loop is a task of the nursery that
block opens.  The worker, the HTTP server and the signal watcher are tasks of one nursery inside
it; Ctrl-C or SIGTERM cancels the nursery, and leaving ``async with`` closes the consumer.  As in
fastapi_worker.py: auto-commit is off and each batch is committed after processing; the consumer
skips a value that is not JSON (a poison pill: ``on_deserialization_error="skip"`` logs its topic,
partition and offset, counts it and moves past it); a worker that crashes is logged and ``/healthz``
answers 503.

``/healthz`` and ``/metrics`` (Prometheus' text format) are served by a few lines of trio below,
enough for probes and scrapes; an application with an HTTP API would use its web framework.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from functools import partial
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from asyncconsumer import Consumer, KafkaError
from asyncconsumer.prometheus import ConsumerCollector

log = logging.getLogger("trio_worker")

Route = Callable[[], tuple[int, str, bytes]]


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


async def serve_http(port: int, routes: dict[str, Route]) -> None:
    """Answer ``GET <path>`` from ``routes`` (one request per connection)."""

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(10):
                request = await stream.receive_some(65536)
                parts = request.split(b" ", 2)
                path = parts[1].decode(errors="replace") if len(parts) > 2 else ""
                route = routes.get(path.split("?")[0])
                status, content_type, body = route() if route else (404, "text/plain", b"not found\n")
                head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {content_type}\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
                await stream.send_all(head.encode() + body)

    await trio.serve_tcp(answer, port, host="127.0.0.1")


async def main(bootstrap: str, topic: str, group: str, port: int, **options: Any) -> None:
    state: dict[str, Any] = {"processed": 0, "failed": None}
    consumer: Consumer[bytes, Any] = Consumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", value_deserializer=json.loads, on_deserialization_error="skip",
        **options,
    )
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(consumer))

    def healthz() -> tuple[int, str, bytes]:
        if state["failed"] is not None:
            report: dict[str, Any] = {"status": "worker stopped", "error": repr(state["failed"])}
            return 503, "application/json", json.dumps(report).encode()
        try:
            m = consumer.metrics()
        except KafkaError as exc:
            return 503, "application/json", json.dumps({"status": "consumer down", "error": str(exc)}).encode()
        ok = m.last_poll_age < 60 and m.rebalances.member_state != "fenced"
        report = {"status": "ok" if ok else "stuck or fenced", "member_state": m.rebalances.member_state}
        return 200 if ok else 503, "application/json", json.dumps(report).encode()

    def stats() -> tuple[int, str, bytes]:
        try:
            skipped = consumer.metrics().records_skipped  # the consumer counts the records it skipped
        except KafkaError as exc:  # a route that raised would end the nursery: answer instead
            return 503, "application/json", json.dumps({"status": "consumer down", "error": str(exc)}).encode()
        return 200, "application/json", json.dumps({"processed": state["processed"], "skipped": skipped}).encode()

    routes: dict[str, Route] = {
        "/healthz": healthz,
        "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
        "/stats": stats,
    }
    async with consumer, trio.open_nursery() as nursery:  # leaving it closes the consumer
        consumer.subscribe([topic])
        nursery.start_soon(work, consumer, state)
        nursery.start_soon(serve_http, port, routes)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("%s: stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
    log.info("the consumer is closed")


def _settings() -> dict[str, Any]:
    """``main``'s arguments, from the environment."""
    missing = [name for name in ("KAFKA_BOOTSTRAP", "KAFKA_TOPIC") if not os.environ.get(name)]
    if missing:
        raise SystemExit(
            f"trio_worker: set {' and '.join(missing)} (and optionally KAFKA_GROUP, KAFKA_SESSION_TIMEOUT_MS,"
            " PORT), e.g.\n"
            "    KAFKA_BOOTSTRAP=127.0.0.1:9092 KAFKA_TOPIC=orders python trio_worker.py"
        )
    settings: dict[str, Any] = {"bootstrap": os.environ["KAFKA_BOOTSTRAP"], "topic": os.environ["KAFKA_TOPIC"],
                                "group": os.environ.get("KAFKA_GROUP", "trio-worker"),
                                "port": int(os.environ.get("PORT", "8080"))}
    if os.environ.get("KAFKA_SESSION_TIMEOUT_MS"):
        settings["session_timeout_ms"] = int(os.environ["KAFKA_SESSION_TIMEOUT_MS"])
    return settings


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(partial(main, **_settings()))
