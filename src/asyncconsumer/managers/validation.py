"""Position validation (KIP-320): notice that the leader's log was truncated under us.

The fetch position carries the leader epoch of the batch before it.  When the
partition's leader epoch in metadata moves past the one the position was last
checked against, or a position is set with an epoch (a committed offset, a
reset), the partition waits in ``AWAIT_VALIDATION`` (not fetched) while an
OffsetForLeaderEpoch request asks the leader where that epoch ends in its log:

Waiting, the partition is back at what the application was handed (``consumed``):
read-ahead is dropped, and nothing fetched from the old leader is handed out.

- the end offset is at or after the position checked: nothing diverged, fetch on;
- (a Fetch's ``diverging_epoch`` only) it is before the fetch position but not
  before the application's position: only read-ahead diverged, so it is
  dropped and fetched again;
- it is before the application's position: the log was truncated (an unclean
  leader election).  With a reset policy the position moves back to the end
  offset; with ``auto_offset_reset="none"`` a ``LogTruncationError`` stops the
  partition until the application seeks.  An undefined epoch/offset means the
  leader knows nothing that old: reset (or the error), as the Java client does.

A seek with a leader epoch (``Consumer.seek(tp, OffsetAndMetadata)``, ``seek_to_committed``)
goes through the same check (``seek``), wherever the position was before.

Fetch v12+ answers the same question inline (``diverging_epoch``); the fetch
manager hands that to ``apply_end_offset``.  Brokers without a usable
OffsetForLeaderEpoch (below v3, or none at all, like Tansu) are not asked:
their positions count as valid, so validation never holds fetching up there.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import REFRESH_METADATA_CODES, KafkaError, LogTruncationError, UnsupportedVersionError, error_for_code
from ..structs import TopicPartition, by_topic
from .fetch_buffer import FetchBuffer
from .metadata import MetadataManager, PartitionInfo
from .requests import Body, UnsentRequest
from .subscription import PartitionPhase, PartitionState, SubscriptionState

log = logging.getLogger("asyncconsumer.validation")

_AWAIT = PartitionPhase.AWAIT_VALIDATION


@dataclass(frozen=True, slots=True)
class _Check:
    """What one partition's request asked: stale answers are recognised by it."""

    state_epoch: int
    fetch_offset: int
    fetched_epoch: int
    leader_epoch: int


class PositionValidator:
    def __init__(
        self,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        buffer: FetchBuffer,
        *,
        retry_backoff: float,
        report_error: Callable[[KafkaError], None],
    ) -> None:
        self._subscriptions = subscriptions
        self._metadata = metadata
        self._buffer = buffer
        self._retry_backoff = retry_backoff
        self._report_error = report_error
        self._in_flight: set[TopicPartition] = set()
        #: Brokers that cannot answer OffsetForLeaderEpoch v3+: positions they lead count as valid.
        self.unsupported_nodes: set[int] = set()
        #: What the last walk over the partitions saw: the cluster snapshot and the subscriptions'
        #: ``changes``.  While both stay and no partition awaits validation, a walk finds nothing.
        self._walked_cluster: object = None
        self._walked_changes = -1

    def next_deadline(self, now: float) -> float:
        if not self._subscriptions.settling():
            return float("inf")
        waiting = self._subscriptions.in_phase(_AWAIT, float("inf"))
        return min((s.retry_at for s in waiting if now < s.retry_at < float("inf")), default=float("inf"))

    def poll(self, now: float) -> list[UnsentRequest]:
        # A position needs checking when its partition's leader epoch, phase, vouched-for or fetched
        # epoch changed (a new cluster snapshot, or ``changes`` moved); one waiting for an answer or
        # a retry is looked at each turn.
        cluster = self._metadata.cluster
        subscriptions = self._subscriptions
        if (
            cluster is self._walked_cluster
            and subscriptions.changes == self._walked_changes
            and not (subscriptions.settling() and subscriptions.in_phase(_AWAIT, float("inf")))
        ):
            return []
        requests = self._walk(now, cluster.leaders)
        self._walked_cluster = cluster
        self._walked_changes = self._subscriptions.changes  # the walk's own changes are seen to
        return requests

    def _walk(self, now: float, leaders: dict[TopicPartition, PartitionInfo]) -> list[UnsentRequest]:
        by_node: dict[int, list[PartitionState]] = defaultdict(list)
        for state in self._subscriptions.partitions.values():
            if state.revoking:
                continue  # about to go: its commit must not wait for a validation
            leader = leaders.get(state.tp)
            if leader is None:
                if state.phase is _AWAIT:
                    self._metadata.request_leaders(state.tp.topic)
                continue
            if state.validated_for == leader.leader_epoch and state.phase is not _AWAIT:
                continue  # vouched for by this leader, not waiting: nothing to do (the common case, each turn)
            if state.needs_validation(leader.leader_epoch):
                state.await_validation()
                self._drop_buffered(state.tp)
                if state.fetched_epoch is None:  # nothing handed out carries an epoch: nothing to check
                    self._accept(state, leader.leader_epoch)
            if state.phase is not _AWAIT or state.retry_at > now or state.tp in self._in_flight:
                continue
            if leader.leader in self.unsupported_nodes:
                self._accept(state, leader.leader_epoch)
            else:
                by_node[leader.leader].append(state)
        return [self._request(node, states) for node, states in by_node.items()]

    def seek(self, state: PartitionState, offset: int, leader_epoch: int | None) -> None:
        """Set the position (the application's seek, or a committed offset it asked for), as
        Java's ``seek(TopicPartition, OffsetAndMetadata)``: a position given with a leader epoch is
        checked against the leader's log before fetching goes on, also where the leader already
        served that offset (the epoch, not the offset, is what may be stale).  An epoch newer than
        our metadata's asks for fresh metadata first (Java's ``updateLastSeenEpochIfNewer``)."""
        state.set_position(offset, leader_epoch)
        if leader_epoch is None:
            return
        state.validated_for = None
        leader = self._metadata.cluster.leader(state.tp)
        if leader is None or leader_epoch > leader.leader_epoch:
            self._metadata.request_update()

    # -- the outcome ------------------------------------------------------------------------------

    def apply_end_offset(
        self, state: PartitionState, checked_offset: int, end_epoch: int, end_offset: int, leader_epoch: int
    ) -> None:
        """The leader says epoch ``end_epoch`` ends at ``end_offset``; we checked ``checked_offset``."""
        tp = state.tp
        if end_epoch < 0 or end_offset < 0:
            self._truncated(state, None, None, leader_epoch)
        elif end_offset >= checked_offset:
            self._accept(state, leader_epoch)
        elif end_offset >= state.consumed:
            log.info("read-ahead of %s diverges from the leader's log at offset %d; fetching it again",
                     tp, end_offset)
            self._drop_buffered(tp)
            state.rewind(state.consumed)
            self._accept(state, leader_epoch)
        else:
            self._truncated(state, end_offset, end_epoch, leader_epoch)

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._buffer.drop(lambda f: f.tp != tp)

    def _accept(self, state: PartitionState, leader_epoch: int) -> None:
        state.phase = PartitionPhase.FETCHING
        state.validated_for = leader_epoch
        state.retry_at = 0.0

    def _truncated(self, state: PartitionState, offset: int | None, epoch: int | None, leader_epoch: int) -> None:
        tp = state.tp
        policy = self._subscriptions.default_reset
        self._drop_buffered(tp)
        if policy == "none":
            log.warning("log truncation detected for %s at position %d (divergent offset %s)",
                        tp, state.consumed, offset)
            state.rewind(state.consumed)  # nothing more is handed out (taken records go stale)
            state.phase, state.retry_at = _AWAIT, float("inf")  # stopped until the application seeks
            self._report_error(LogTruncationError(tp, state.consumed, offset, epoch))
            return
        if offset is None:
            log.info("log truncation detected for %s at position %d; resetting to %s", tp, state.consumed, policy)
            self._subscriptions.request_reset(tp)
        else:
            log.info("log truncation detected for %s at position %d; resuming at the divergent offset %d",
                     tp, state.consumed, offset)
            state.set_position(offset, epoch)
            state.validated_for = leader_epoch

    # -- the request ------------------------------------------------------------------------------

    def _request(self, node: int, states: list[PartitionState]) -> UnsentRequest:
        checks: dict[TopicPartition, _Check] = {}
        for s in states:
            epoch = s.fetched_epoch
            leader = self._metadata.cluster.leader(s.tp)
            assert epoch is not None and leader is not None  # needs_validation / poll checked both
            checks[s.tp] = _Check(s.epoch, s.fetch_offset, epoch, leader.leader_epoch)
        self._in_flight.update(checks)
        topics = by_topic(checks)

        def build(version: int) -> Body:
            return {
                "replica_id": -1,  # a consumer, not a follower
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": tp.partition,
                                "current_leader_epoch": checks[tp].leader_epoch,
                                "leader_epoch": checks[tp].fetched_epoch,
                            }
                            for tp in tps
                        ],
                    }
                    for topic, tps in topics.items()
                ],
            }

        def on_response(now: float, version: int, body: Body) -> None:
            self._in_flight.difference_update(checks)
            answered: set[TopicPartition] = set()
            for topic in body["topics"]:
                for p in topic["partitions"]:
                    tp = TopicPartition(topic["topic"], p["partition"])
                    state = self._current(tp, checks)
                    if state is not None:
                        answered.add(tp)
                        self._handle_partition(now, state, checks[tp], p)
            for tp in checks.keys() - answered:
                state = self._current(tp, checks)
                if state is not None:
                    state.retry_at = now + self._retry_backoff

        def on_error(now: float, error: BaseException) -> None:
            self._in_flight.difference_update(checks)
            current = [(s, checks[tp]) for tp in checks if (s := self._current(tp, checks)) is not None]
            if isinstance(error, UnsupportedVersionError):
                log.info("node %s cannot validate positions (%s); trusting them, as the Java client does",
                         node, error)
                self.unsupported_nodes.add(node)
                for state, check in current:
                    self._accept(state, check.leader_epoch)
                return
            log.debug("OffsetForLeaderEpoch to node %s failed: %s", node, error)
            self._metadata.request_update()
            for state, _ in current:
                state.retry_at = now + self._retry_backoff
            if not (isinstance(error, KafkaError) and error.retriable):
                self._report_error(error if isinstance(error, KafkaError) else KafkaError(repr(error)))

        return UnsentRequest("OffsetForLeaderEpoch", build, on_response, on_error, node_id=node, min_version=3)

    def _current(self, tp: TopicPartition, checks: dict[TopicPartition, _Check]) -> PartitionState | None:
        """The partition's state if the answer still applies (no seek, reset or unassignment since)."""
        state = self._subscriptions.get(tp)
        check = checks.get(tp)
        if state is None or check is None or state.phase is not _AWAIT:
            return None
        if state.epoch != check.state_epoch or state.fetch_offset != check.fetch_offset:
            return None
        return state

    def _handle_partition(self, now: float, state: PartitionState, check: _Check, p: Body) -> None:
        code = p["error_code"]
        if code == 0:
            # Documented (docs/architecture.md, "Log truncation"): the one line that shows a check
            # was made and answered.
            log.debug("OffsetForLeaderEpoch for %s at offset %d: leader epoch %d ends at offset %d "
                      "(asked for epoch %d, current leader epoch %d)", state.tp, check.fetch_offset,
                      p["leader_epoch"], p["end_offset"], check.fetched_epoch, check.leader_epoch)
            self.apply_end_offset(state, check.fetch_offset, p["leader_epoch"], p["end_offset"], check.leader_epoch)
        elif code == UnsupportedVersionError.code:
            self._accept(state, check.leader_epoch)
        elif code in REFRESH_METADATA_CODES:  # (its topic-id codes never come from OffsetForLeaderEpoch)
            self._metadata.request_update()
            state.retry_at = now + self._retry_backoff
        else:
            state.retry_at = now + self._retry_backoff
            self._report_error(error_for_code(code, f"validating the position of {state.tp}"))
