"""Per-member event handlers: kafkatest's bookkeeping of one verifiable consumer, and its checks.

A handler follows one member's JSON events (startup, assignment, revocation, consumption,
commits, shutdown) and asserts at every event what kafkatest's handlers assert
(kafkatest's services/verifiable_consumer.py).  The three handler kinds differ only in what an
assignment and a revocation do; that difference is data (:class:`Kind`), the rest is shared:

==================  ==========================  ==========================================
kind                ``partitions_assigned``     ``partitions_revoked``
==================  ==========================  ==========================================
eager (classic)     replaces the assignment     state Rebalancing; assignment kept
incremental         extends it                  state Rebalancing; each partition must be
(classic                                        owned, and is removed
cooperative)
consumer (KIP-848)  extends it                  state unchanged; owned partitions removed
==================  ==========================  ==========================================

Every revocation also forgets the member's positions, so the next batch of a partition may start
anywhere at or after the group's last commit (which the service checks).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerState(enum.Enum):
    STARTED = 1
    DEAD = 2
    REBALANCING = 3
    JOINED = 4


@dataclass(frozen=True)
class Kind:
    """How one handler kind treats assignments and revocations (the table in the module docstring)."""

    name: str
    on_assigned: Literal["replace", "extend"]
    #: The state a revocation leads to; None keeps the state (KIP-848 members consume while reconciling).
    revoked_state: ConsumerState | None
    #: Revoked partitions leave the assignment (incremental kinds); eager keeps it until the next assignment.
    revoked_removed: bool
    #: A revoked partition must be in the assignment (classic cooperative).
    revoked_must_be_owned: bool


EAGER = Kind("eager", "replace", ConsumerState.REBALANCING, revoked_removed=False, revoked_must_be_owned=False)
INCREMENTAL = Kind("incremental", "extend", ConsumerState.REBALANCING, revoked_removed=True,
                   revoked_must_be_owned=True)
CONSUMER_PROTOCOL = Kind("consumer", "extend", None, revoked_removed=True, revoked_must_be_owned=False)

COOPERATIVE_STICKY = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"


def handler_kind(group_protocol: str | None, assignment_strategy: str | None) -> Kind:
    """kafkatest's choice: KIP-848 for ``consumer``; eager for ``classic`` with an eager assignor;
    incremental otherwise (also for no protocol at all, whatever the tool then does)."""
    if group_protocol is not None and group_protocol.lower() == "consumer":
        return CONSUMER_PROTOCOL
    if group_protocol == "classic" and assignment_strategy != COOPERATIVE_STICKY:
        return EAGER
    return INCREMENTAL


def partitions(event: Mapping[str, Any]) -> list[TopicPartition]:
    return [TopicPartition(p["topic"], p["partition"]) for p in event["partitions"]]


@dataclass
class ConsumerHandler:
    """One member's state; the checks raise ``AssertionError`` with kafkatest's messages."""

    idx: int
    kind: Kind
    verify_offsets: bool = True
    state: ConsumerState = ConsumerState.DEAD
    revoked_count: int = 0
    assigned_count: int = 0
    assignment: list[TopicPartition] = field(default_factory=list)
    position: dict[TopicPartition, int] = field(default_factory=dict)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    total_consumed: int = 0
    shutdown_complete: bool = False
    #: Offset mismatches let through because ``verify_offsets`` is off (kafkatest logs them).
    warnings: list[str] = field(default_factory=list)

    def restarted(self) -> ConsumerHandler:
        """The handler of the member's next process: kafkatest carries the counts, the assignment, the
        positions and the commits over, and resets only ``shutdown_complete``."""
        return ConsumerHandler(
            self.idx, self.kind, self.verify_offsets, self.state, self.revoked_count, self.assigned_count,
            list(self.assignment), dict(self.position), dict(self.committed), self.total_consumed,
        )

    # -- events -------------------------------------------------------------------------------------

    def handle_startup_complete(self, event: Mapping[str, Any] | None = None) -> None:
        self.state = ConsumerState.STARTED

    def handle_shutdown_complete(self, event: Mapping[str, Any] | None = None) -> None:
        self.state = ConsumerState.DEAD
        self.assignment = []
        self.position = {}
        self.shutdown_complete = True

    def handle_partitions_assigned(self, event: Mapping[str, Any]) -> None:
        self.assigned_count += 1
        self.state = ConsumerState.JOINED
        if self.kind.on_assigned == "replace":
            self.assignment = partitions(event)
        else:
            self.assignment.extend(partitions(event))

    def handle_partitions_revoked(self, event: Mapping[str, Any]) -> None:
        self.revoked_count += 1
        if self.kind.revoked_state is not None:
            self.state = self.kind.revoked_state
        self.position = {}
        if not self.kind.revoked_removed:
            return
        for tp in partitions(event):
            if self.kind.revoked_must_be_owned:
                assert tp in self.assignment, (
                    f"Topic partition {tp} cannot be revoked from {self.assignment} as it was not previously "
                    "assigned to that consumer"
                )
            if tp in self.assignment:
                self.assignment.remove(tp)

    def handle_records_consumed(self, event: Mapping[str, Any]) -> None:
        assert self.state is ConsumerState.JOINED, (
            f"Consumed records should only be received when joined (current state: {self.state})"
        )
        for entry in event["partitions"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            assert tp in self.assignment, (
                f"Consumed records for partition {tp} which is not assigned (current assignment: {self.assignment})"
            )
            if tp not in self.position or self.position[tp] == entry["minOffset"]:
                self.position[tp] = entry["maxOffset"] + 1
                continue
            message = (f"Consumed from an unexpected offset ({self.position[tp]}, {entry['minOffset']}) "
                       f"for partition {tp}")
            assert not self.verify_offsets, message
            self.warnings.append(message)
            self.position[tp] = entry["maxOffset"] + 1
        self.total_consumed += event["count"]

    def handle_offsets_committed(self, event: Mapping[str, Any]) -> None:
        if not event["success"]:
            return  # a failed commit is only logged, as kafkatest does
        for entry in event["offsets"]:
            if entry.get("error"):
                continue
            tp = TopicPartition(entry["topic"], entry["partition"])
            assert tp in self.assignment, (
                f"Committed offsets for partition {tp} not assigned (current assignment: {self.assignment})"
            )
            assert tp in self.position, f"No previous position for {tp}: {self.position}"
            assert self.position[tp] >= entry["offset"], (
                f"The committed offset {entry['offset']} was greater than the current position "
                f"{self.position[tp]} for partition {tp}"
            )
            self.committed[tp] = entry["offset"]

    def handle_kill_process(self, clean_shutdown: bool) -> None:
        """A SIGKILLed process cannot report its end: it is dead now.  A clean stop waits for the
        member's own ``shutdown_complete``."""
        if not clean_shutdown:
            self.handle_shutdown_complete()


class ShareConsumerState(enum.Enum):
    STARTED = 1
    DEAD = 2


@dataclass
class ShareConsumerHandler:
    """kafkatest's share-consumer bookkeeping: counts only, no assertions."""

    idx: int
    state: ShareConsumerState = ShareConsumerState.DEAD
    total_consumed: int = 0
    total_acknowledged_successfully: int = 0
    total_acknowledged_failed: int = 0
    ack_type_counts: dict[str, int] = field(default_factory=dict)
    consumed_per_partition: dict[TopicPartition, int] = field(default_factory=dict)
    acknowledged_per_partition: dict[TopicPartition, int] = field(default_factory=dict)
    acknowledged_per_partition_failed: dict[TopicPartition, int] = field(default_factory=dict)

    def restarted(self) -> ShareConsumerHandler:
        return self  # kafkatest keeps one share handler per node across restarts

    def handle_startup_complete(self, event: Mapping[str, Any] | None = None) -> None:
        self.state = ShareConsumerState.STARTED

    def handle_shutdown_complete(self, event: Mapping[str, Any] | None = None) -> None:
        self.state = ShareConsumerState.DEAD

    def handle_offsets_acknowledged(self, event: Mapping[str, Any]) -> None:
        if event["success"]:
            self.total_acknowledged_successfully += event["count"]
            _add_counts(self.acknowledged_per_partition, event)
            for name, count in (event.get("ackTypeCounts") or {}).items():
                self.ack_type_counts[name] = self.ack_type_counts.get(name, 0) + count
        else:
            self.total_acknowledged_failed += event["count"]
            _add_counts(self.acknowledged_per_partition_failed, event)

    def handle_records_consumed(self, event: Mapping[str, Any]) -> None:
        self.total_consumed += event["count"]
        _add_counts(self.consumed_per_partition, event)

    def handle_kill_process(self, clean_shutdown: bool) -> None:
        if not clean_shutdown:
            self.handle_shutdown_complete()


def _add_counts(into: dict[TopicPartition, int], event: Mapping[str, Any]) -> None:
    for entry in event["partitions"]:
        tp = TopicPartition(entry["topic"], entry["partition"])
        into[tp] = into.get(tp, 0) + entry["count"]
