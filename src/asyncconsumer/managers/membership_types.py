"""The vocabulary of group membership, shared by both group protocols."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..assignors import Assignor
from ..structs import TopicPartition


class MemberState(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"
    PREPARE_REVOCATION = "prepare_revocation"
    REVOKING_PARTITIONS = "revoking_partitions"
    PARTITIONS_REVOKED = "partitions_revoked"
    JOINING = "joining"
    SYNCING = "syncing"
    ASSIGNING_PARTITIONS = "assigning_partitions"
    STABLE = "stable"
    LOST = "lost"
    LEAVING = "leaving"
    FENCED = "fenced"


class CallbackKind(enum.Enum):
    REVOKED = "on_partitions_revoked"
    ASSIGNED = "on_partitions_assigned"
    LOST = "on_partitions_lost"


@dataclass(eq=False)
class CallbackRequest:
    """A background event: run a rebalance callback on the application side, then ``ack``."""

    kind: CallbackKind
    partitions: frozenset[TopicPartition]
    deadline: float
    generation: int
    acked: bool = False
    error: BaseException | None = None

    def ack(self, error: BaseException | None = None) -> None:
        self.acked = True
        self.error = error


@dataclass
class GroupSettings:
    group_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_interval: float
    retry_backoff: float
    assignors: list[Assignor] = field(default_factory=list)


@dataclass
class RebalancePlan:
    """What the current rebalance (or reconciliation) still has to do: revoke first, then assign."""

    revoke: frozenset[TopicPartition] = frozenset()
    assign: frozenset[TopicPartition] = frozenset()
    lost: bool = False
    rejoin_after: bool = False
