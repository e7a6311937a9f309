"""The rebalance listener: what the application is told when partitions move.

Subclass ``RebalanceListener`` and override what you need; each method may be
a plain function or a coroutine.  The methods run on the application side,
inside the call that is iterating or polling the consumer, and may call the
consumer again (``await consumer.commit(...)``), also from tasks they start:
those calls complete before the partitions are given up (KIP-957).
"""

from __future__ import annotations

from collections.abc import Awaitable

from .structs import TopicPartition


class RebalanceListener:
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> Awaitable[None] | None:
        """These partitions go to another member; the last chance to commit their offsets."""
        return None

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> Awaitable[None] | None:
        """These partitions are now this member's (positions come from committed offsets).

        Called at the end of every rebalance, with an empty set when nothing was added (as the Java
        client does): the rebalance is over.  On the consumer protocol, at the end of every
        reconciliation and after joining.
        """
        return None

    def on_partitions_lost(self, lost: set[TopicPartition]) -> Awaitable[None] | None:
        """These partitions were taken away without a clean handover (e.g. the session expired).

        Committing is no longer possible for them.  Defaults to ``on_partitions_revoked``.
        """
        return self.on_partitions_revoked(lost)
