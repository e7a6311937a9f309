"""Settings and small helpers shared by the consumer tests."""

from __future__ import annotations

from asyncconsumer import TopicPartition

#: Short waits and backoffs: tests against a local broker need not wait as long as production does.
FAST = {"fetch_max_wait_ms": 100, "request_timeout_ms": 10000, "retry_backoff_ms": 50}


def tps(topic: str, partitions: int) -> list[TopicPartition]:
    """Partitions 0 .. ``partitions - 1`` of ``topic``."""
    return [TopicPartition(topic, p) for p in range(partitions)]
