"""The vocabulary of group membership, shared by both group protocols, and its state machine as data.

A member is in one :class:`MemberState` at a time.  ``GroupMemberBase._to()`` is the only place that
moves it, and it accepts a move only if the protocol's table below lists it; any other move is a bug
and raises :class:`IllegalStateTransition` naming both states.  Staying in a state is not a move.

The states, and who moves the member between them:

- ``UNSUBSCRIBED``: not in the group.  ``subscribe()`` (or the first poll after the poll interval
  expired, or a subscription made while leaving) starts a join: the classic member through
  ``PREPARE_REVOCATION`` (an eager member revokes first), the KIP-848 member straight to ``JOINING``.
- ``JOINING``: classic JoinGroup, or the KIP-848 heartbeat with epoch 0, is under way.  Its answer
  moves a classic member to ``SYNCING`` and a KIP-848 member to ``STABLE``.
- ``SYNCING`` (classic only): SyncGroup is under way.  The assignment starts a rebalance at
  ``PREPARE_REVOCATION`` (what moves away is revoked first); an error goes back to ``JOINING``.
- The callback steps of a rebalance, driven by ``_advance()`` on each poll of the manager:
  ``PREPARE_REVOCATION`` (stop fetching what moves, queue the revoke callback) →
  ``REVOKING_PARTITIONS`` (wait for its acknowledgement or deadline) → ``PARTITIONS_REVOKED`` (the
  acknowledged partitions go; then leave, assign, rejoin or settle) → ``ASSIGNING_PARTITIONS`` (the
  assigned callback) → ``STABLE``.  With nothing to revoke ``PREPARE_REVOCATION`` goes straight to
  ``PARTITIONS_REVOKED``.  A KIP-848 member in ``STABLE`` starts the steps again when its target
  assignment changes; a classic member when it must rejoin (eager: by revoking everything).
- ``LOST``: the coordinator no longer knows this member's generation (or epoch): its partitions go
  to the lost callback (no commit), as ``REVOKING_PARTITIONS`` does for the revoke callback, then the
  member joins again.
- ``LEAVING``: ``unsubscribe()``/``close()`` revoked everything, or the application stopped polling
  (``check_poll_interval``, from any joined state).  LeaveGroup (or the leave heartbeat) answered
  (or failed) → ``UNSUBSCRIBED``.
- ``FENCED``: final.  Another member took our ``group_instance_id``, the group is full, or the
  cluster has no KIP-848 (``_fatal``, from any joined state or ``LEAVING``).

``CLASSIC_TRANSITIONS`` and ``CONSUMER_TRANSITIONS`` are two sibling tables grown from one core
(``_CORE``: the callback steps, losing partitions, leaving, fencing).  The edges each protocol adds
say how the assignment arrives (classic: JoinGroup then SyncGroup; KIP-848: the heartbeat) and a few
races of their own, each with its reason next to it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..assignors import Assignor
from ..errors import IllegalStateError, KafkaError
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


class IllegalStateTransition(IllegalStateError):
    """Internal: the membership manager tried a state transition its protocol's table does not allow.

    A bug in asyncconsumer, not in the application; the message names the protocol and both states.
    """

    def __init__(self, protocol: str, source: MemberState, target: MemberState) -> None:
        super().__init__(f"{protocol} group membership: no transition from {source.name} to {target.name}")
        self.protocol = protocol
        self.source = source
        self.target = target


#: Which state may follow which (staying in a state is not a transition).
Transitions = Mapping[MemberState, frozenset[MemberState]]

_S = MemberState

#: In the group (or on the way in): what ``check_poll_interval`` leaves from, and ``_fatal`` fences from.
JOINED_STATES = frozenset(_S) - {_S.UNSUBSCRIBED, _S.LEAVING, _S.FENCED}


def _table(*parts: Mapping[MemberState, Iterable[MemberState]]) -> Transitions:
    """The union of edge lists, read-only, with every state present (no way out: an empty set)."""
    table: dict[MemberState, frozenset[MemberState]] = {state: frozenset() for state in MemberState}
    for part in parts:
        for source, targets in part.items():
            table[source] |= frozenset(targets)
    return MappingProxyType(table)


_CORE = _table(
    {
        # The callback steps of a rebalance (GroupMemberBase._advance, _prepare_revocation).
        _S.PREPARE_REVOCATION: {_S.REVOKING_PARTITIONS, _S.PARTITIONS_REVOKED},
        _S.LOST: {_S.REVOKING_PARTITIONS, _S.PARTITIONS_REVOKED},
        _S.REVOKING_PARTITIONS: {_S.PARTITIONS_REVOKED},
        # Then: leave, assign, join again (classic: rejoin; KIP-848: after losing them), or settle.
        _S.PARTITIONS_REVOKED: {_S.LEAVING, _S.ASSIGNING_PARTITIONS, _S.JOINING, _S.STABLE},
        _S.ASSIGNING_PARTITIONS: {_S.STABLE},
        # The answer to the LeaveGroup request (or the leave heartbeat); fenced while leaving.
        _S.LEAVING: {_S.UNSUBSCRIBED, _S.FENCED},
    },
    # leave() revokes everything first (and a classic STABLE member starts a rebalance here; a
    # KIP-848 one when its target assignment changes).
    {state: {_S.PREPARE_REVOCATION} for state in (_S.JOINING, _S.ASSIGNING_PARTITIONS, _S.STABLE)},
    # The coordinator no longer knows our generation (or epoch): the partitions are lost.
    {state: {_S.LOST} for state in (_S.JOINING, _S.PREPARE_REVOCATION, _S.REVOKING_PARTITIONS,
                                    _S.ASSIGNING_PARTITIONS, _S.STABLE)},
    # The poll interval expired (check_poll_interval) or the member cannot go on (_fatal).
    {state: {_S.LEAVING, _S.FENCED} for state in JOINED_STATES - {_S.SYNCING}},
)

#: The classic protocol (``membership.MembershipManager``).
CLASSIC_TRANSITIONS = _table(
    _CORE,
    {
        # A join always starts as a rebalance: an eager member revokes everything first.
        _S.UNSUBSCRIBED: {_S.PREPARE_REVOCATION},
        _S.JOINING: {_S.SYNCING},
        # SyncGroup's assignment starts the callback steps; its errors rejoin or lose the partitions.
        _S.SYNCING: {_S.PREPARE_REVOCATION, _S.JOINING, _S.LOST, _S.LEAVING, _S.FENCED},
        # A rejoin asked for during the assignment: cooperative rejoins, eager revokes first.
        _S.ASSIGNING_PARTITIONS: {_S.JOINING},
        # Leaving during a rebalance: what the interrupted rebalance kept is revoked before leaving.
        _S.PARTITIONS_REVOKED: {_S.PREPARE_REVOCATION},
        # Leaving while LeaveGroup is in flight: subscribe() or leave() again start the steps (nothing
        # to revoke), and a Heartbeat answered with ILLEGAL_GENERATION loses (no) partitions.
        _S.LEAVING: {_S.PREPARE_REVOCATION, _S.LOST},
        # The LeaveGroup answer may come before the next poll moved on from those two.
        _S.PREPARE_REVOCATION: {_S.UNSUBSCRIBED},
        _S.LOST: {_S.UNSUBSCRIBED},
    },
)

#: The consumer group protocol, KIP-848 (``consumer_membership.ConsumerMembershipManager``).
CONSUMER_TRANSITIONS = _table(
    _CORE,
    {
        # The join is a heartbeat with epoch 0; its answer makes the member STABLE (then reconciles).
        _S.UNSUBSCRIBED: {_S.JOINING},
        _S.JOINING: {_S.STABLE},
        # leave() during a revocation starts over, revoking everything (one callback for all).
        _S.REVOKING_PARTITIONS: {_S.PREPARE_REVOCATION},
    },
)


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
    #: The member's ``client_rack`` (None: none), sent in its subscription for rack-aware assignors.
    client_rack: str | None = None


@dataclass
class RebalancePlan:
    """What the current rebalance (or reconciliation) still has to do: revoke first, then assign."""

    revoke: frozenset[TopicPartition] = frozenset()
    assign: frozenset[TopicPartition] = frozenset()
    lost: bool = False
    rejoin_after: bool = False
    #: The plan ends a rebalance (a SyncGroup answer, a KIP-848 reconciliation): the assigned
    #: callback runs even when nothing is added, as the Java client's does.
    completes: bool = False


@dataclass(frozen=True, slots=True)
class MemberHooks:
    """What a membership manager asks of the loop that drives it (``engine.loop.Engine`` gives its
    own methods); tests give lists' ``append``."""

    #: Hand a rebalance callback to the application side; the loop waits for its ``acked``.
    run_callback: Callable[[CallbackRequest], None]
    #: Forget the buffered records of partitions being revoked or lost (before the callback runs).
    drop_buffered: Callable[[frozenset[TopicPartition]], None]
    #: An error the application's next poll raises.
    report_error: Callable[[KafkaError], None]
