"""Settings and small helpers shared by the consumer tests."""

from __future__ import annotations

from asyncconsumer import TopicPartition
from asyncconsumer.listener import RebalanceListener

#: Short waits and backoffs: tests against a local broker need not wait as long as production does.
FAST = {"fetch_max_wait_ms": 100, "request_timeout_ms": 10000, "retry_backoff_ms": 50}


def tps(topic: str, partitions: int) -> list[TopicPartition]:
    """Partitions 0 .. ``partitions - 1`` of ``topic``."""
    return [TopicPartition(topic, p) for p in range(partitions)]


class Recorder(RebalanceListener):
    """A rebalance listener keeping its callbacks in order: ``("assigned" | "revoked", partitions)``.

    Lost partitions go through the listener's default, ``on_partitions_revoked``.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", frozenset(assigned)))

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", frozenset(revoked)))


class LostRecorder(Recorder):
    """A :class:`Recorder` that keeps lost partitions apart: ``("lost", partitions)``."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.events.append(("lost", frozenset(lost)))
