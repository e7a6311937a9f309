"""Topic creation and test-data production with confluent-kafka (``pip install asyncconsumer[testing]``).

An independent client writes the test data, so that a test of a consumer does not depend on the
consumer's own encoder.  These helpers are synchronous (librdkafka does its own I/O in background
threads); they block for milliseconds on a local broker: call them through
``anyio.to_thread.run_sync`` from async code if that matters.  The pytest plugin's ``kafka_topic``
and ``kafka_produce`` fixtures are built on them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

try:
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("asyncconsumer.testing.producer needs 'pip install confluent-kafka'") from exc

__all__ = [
    "COMPRESSION_TYPES",
    "Compression",
    "ProduceError",
    "RecordSpec",
    "client_quiet",
    "admin_client",
    "create_topic",
    "produce",
    "wait_for_topic",
]

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
COMPRESSION_TYPES: tuple[Compression, ...] = ("none", "gzip", "snappy", "lz4", "zstd")

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None
#: ``(partition, key, value)``, ``(partition, key, value, headers)`` or
#: ``(partition, key, value, headers, timestamp_ms)``; ``partition=None`` lets the partitioner choose.
#: A bare ``bytes``/``str`` is shorthand for ``(None, None, value, None)``.
RecordSpec = tuple[Any, ...] | bytes | str


class ProduceError(RuntimeError):
    """At least one record was not delivered."""


def client_quiet(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """librdkafka settings with its log level lowered to errors."""
    return {"log_level": 3, **(config or {})}


def admin_client(bootstrap: str, client_config: Mapping[str, Any] | None = None) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **client_quiet(client_config)})


def wait_for_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Wait until metadata shows *name* with at least *partitions* partitions, all with a leader."""
    admin = admin_client(bootstrap, client_config)
    deadline = time.monotonic() + timeout
    problem = "not in metadata"
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic=name, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
        except KafkaException as exc:
            problem = str(exc)
        else:
            topic = md.topics.get(name)
            if topic is not None and topic.error is None:
                ready = [p for p in topic.partitions.values() if p.error is None and p.leader >= 0]
                if len(ready) >= partitions:
                    return
                problem = f"{len(ready)}/{partitions} partitions have a leader"
            elif topic is not None:
                problem = str(topic.error)
        time.sleep(0.02)
    raise TimeoutError(f"topic {name!r} not ready after {timeout}s: {problem}")


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    *,
    replication_factor: int = 1,
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
) -> str:
    """Create *name* and wait until its metadata is complete.  Returns the name."""
    admin = admin_client(bootstrap, client_config)
    new = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={str(k): str(v) for k, v in (config or {}).items()},
    )
    futures = admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    wait_for_topic(bootstrap, name, partitions, timeout=timeout, client_config=client_config)
    return name


def _normalize(spec: RecordSpec) -> tuple[int | None, Any, Any, Any, int | None]:
    if isinstance(spec, bytes | str):
        return None, None, spec, None, None
    if not 3 <= len(spec) <= 5:
        raise ValueError(f"record must be (partition, key, value[, headers[, timestamp_ms]]), got {spec!r}")
    partition, key, value, headers, timestamp = (*spec, None, None)[:5]
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    elif headers is not None:
        headers = list(headers)
    return partition, key, value, headers, timestamp


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[RecordSpec],
    compression: Compression = "none",
    *,
    linger_ms: int = 50,
    batch_size: int | None = None,
    acks: str | int = "all",
    idempotent: bool = False,
    timeout: float = 30.0,
    client_config: Mapping[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Produce *records* to *topic*; returns ``(partition, offset)`` for each record, in input order.

    Records produced in one call are batched (``linger_ms``) and the final ``flush`` sends at once,
    so a call yields multi-record batches -- compressed with *compression* -- without waiting for the
    linger.  *records* may be any iterable, including a generator.  Raises :class:`ProduceError` if
    any record fails and ``TimeoutError`` if delivery does not finish within *timeout*.
    """
    if compression not in COMPRESSION_TYPES:
        raise ValueError(f"compression must be one of {COMPRESSION_TYPES}, got {compression!r}")
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "compression.type": compression,
        "linger.ms": linger_ms,
        "acks": acks,
        "enable.idempotence": idempotent,
        "message.timeout.ms": int(timeout * 1000),
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        **client_quiet(client_config),
    }
    if batch_size is not None:
        config["batch.size"] = batch_size
    producer = Producer(config)

    results: list[tuple[int, int] | None] = []
    failures: list[str] = []

    def on_delivery_for(index: int) -> Any:
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(f"record #{index}: {err}")
            else:
                results[index] = (msg.partition(), msg.offset())

        return on_delivery

    for index, spec in enumerate(records):
        partition, key, value, headers, timestamp = _normalize(spec)
        results.append(None)
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery_for(index)}
        if partition is not None:
            kwargs["partition"] = partition
        if headers is not None:
            kwargs["headers"] = headers
        if timestamp is not None:
            kwargs["timestamp"] = timestamp
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

    remaining = producer.flush(timeout)
    if remaining:
        raise TimeoutError(f"{remaining} record(s) to {topic!r} still undelivered after {timeout}s")
    if failures:
        raise ProduceError(f"{len(failures)} record(s) to {topic!r} failed: " + "; ".join(failures[:5]))
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise ProduceError(f"no delivery report for records {missing[:10]}")
    return [r for r in results if r is not None]
