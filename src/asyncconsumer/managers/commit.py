"""Offset commits and committed-offset lookups for a ``group_id``.

Works with manual assignment (generation -1, no member id), as in the Java
client, and later with group membership (``generation`` / ``member_id`` are
read from ``group_identity`` at send time).  Also moves newly assigned
partitions out of ``AWAIT_COMMITTED``: a committed offset becomes the
position, no committed offset means ``AWAIT_RESET``.

Apache Kafka keeps a commit's metadata string with its offset.  A broker that
answers OffsetFetch with the very offset this consumer committed but without
the metadata it committed with (Tansu) has dropped it: one WARNING says so,
naming the partition and the metadata's length (never its text).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import (
    COORDINATOR_CODES,
    RETRY_LATER_CODES,
    CommitFailedError,
    KafkaError,
    KafkaTimeoutError,
    StaleMemberEpochError,
    error_for_code,
)
from ..structs import OffsetAndMetadata, TopicPartition, by_topic
from .coordinator import CoordinatorManager
from .requests import Body, UnsentRequest
from .subscription import PartitionPhase, SubscriptionState
from .waiter import Waiter

log = logging.getLogger("asyncconsumer.commit")


@dataclass(frozen=True, slots=True)
class GroupIdentity:
    generation: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    #: How many times the member lost its partitions without giving them up (fenced, its session
    #: expired): a commit built before a loss never goes again under a later epoch, even of the
    #: same member id (KIP-848 members rejoin under it).  Not part of what a commit carries, nor
    #: of equality.
    losses: int = field(default=0, compare=False)

    def same_membership(self, other: GroupIdentity) -> bool:
        """Both are of one membership of a member: the same member id, no loss in between (the
        epoch or generation may have moved on)."""
        return self.member_id == other.member_id != "" and self.losses == other.losses


@dataclass(eq=False)
class _Commit:
    offsets: dict[TopicPartition, OffsetAndMetadata]
    waiter: Waiter[None]
    deadline: float
    in_flight: bool = False
    retry_at: float = 0.0
    #: Why the last attempt did not commit (a retriable error code, a timed-out request, a lost
    #: connection), for the timeout's message.
    last_error: BaseException | None = None
    #: Who made it: a member's commit goes only while that membership lasts (``_outlived``).
    made_by: GroupIdentity = field(default_factory=GroupIdentity)


@dataclass(eq=False)
class _Fetch:
    partitions: list[TopicPartition]
    waiter: Waiter[dict[TopicPartition, OffsetAndMetadata | None]]
    in_flight: bool = False
    retry_at: float = 0.0
    for_positions: bool = False
    epochs: dict[TopicPartition, int] = field(default_factory=dict)


class CommitManager:
    def __init__(
        self,
        coordinator: CoordinatorManager,
        subscriptions: SubscriptionState,
        *,
        retry_backoff: float,
        request_timeout: float,
        auto_commit_interval: float | None,
        report_error: Callable[[KafkaError], None],
        group_identity: Callable[[], GroupIdentity] = GroupIdentity,
        partition_exists: Callable[[TopicPartition], bool] = lambda tp: True,
    ) -> None:
        self._report_error = report_error
        self._exists = partition_exists
        self._coordinator = coordinator
        self._subscriptions = subscriptions
        self._retry_backoff = retry_backoff
        self._request_timeout = request_timeout
        self._auto_commit_interval = auto_commit_interval
        self._identity = group_identity
        self._commits: list[_Commit] = []
        self._fetches: list[_Fetch] = []
        self._position_fetch_in_flight: set[TopicPartition] = set()
        self._next_auto_commit = float("inf")
        self.last_committed: dict[TopicPartition, int] = {}
        #: The non-empty metadata of this consumer's last commit per partition (see the module's story).
        self._metadata_sent: dict[TopicPartition, tuple[int, str]] = {}
        self._metadata_warned = False
        #: Commits completed and failed (metrics).
        self.commits_done = 0
        self.commit_failures = 0

    # -- public operations ------------------------------------------------------------------------

    def commit(
        self, now: float, offsets: dict[TopicPartition, OffsetAndMetadata], timeout: float | None = None
    ) -> Waiter[None]:
        waiter: Waiter[None] = Waiter()
        if not offsets:
            waiter.set_result(None)
            return waiter
        deadline = now + (timeout if timeout is not None else self._request_timeout)
        self._commits.append(_Commit(dict(offsets), waiter, deadline, made_by=self._identity()))
        return waiter

    def fetch_committed(
        self, partitions: list[TopicPartition]
    ) -> Waiter[dict[TopicPartition, OffsetAndMetadata | None]]:
        waiter: Waiter[dict[TopicPartition, OffsetAndMetadata | None]] = Waiter()
        if not partitions:
            waiter.set_result({})
        else:
            self._fetches.append(_Fetch(list(dict.fromkeys(partitions)), waiter))
        return waiter

    def start_auto_commit(self, now: float) -> None:
        if self._auto_commit_interval is not None and self._next_auto_commit == float("inf"):
            self._next_auto_commit = now + self._auto_commit_interval

    def processed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Offsets the application has finished with and that were not committed yet (not for
        partitions that no longer exist: the broker refuses those, and dropped the group's offsets
        of a deleted topic with it)."""
        offsets = {}
        for tp, state in self._subscriptions.partitions.items():
            if not self._exists(tp):
                continue
            if state.has_position and state.processed >= 0 and self.last_committed.get(tp) != state.processed:
                offsets[tp] = OffsetAndMetadata(state.processed, "", state.epoch_before(state.processed))
        return offsets

    def fail_all(self, error: BaseException) -> None:
        """The consumer stops: nobody may wait forever for a commit or a lookup."""
        commits, self._commits = self._commits, []
        fetches, self._fetches = self._fetches, []
        for commit in commits:
            commit.waiter.set_exception(error)
        for fetch in fetches:
            fetch.waiter.set_exception(error)

    # -- the manager protocol ---------------------------------------------------------------------

    def _quiet(self) -> bool:
        """No commit or offset fetch pending and no position awaited: most turns, where only the
        auto-commit's time matters."""
        return not self._commits and not self._fetches and not self._subscriptions.settling()

    def next_deadline(self, now: float) -> float:
        if self._quiet():
            return max(now, self._next_auto_commit)
        times = [self._next_auto_commit]
        times += [c.deadline for c in self._commits]
        if self._coordinator.node_id is not None:  # otherwise the coordinator manager's deadline wakes us
            times += [c.retry_at for c in self._commits if not c.in_flight]
            times += [f.retry_at for f in self._fetches if not f.in_flight]
            waiting = self._subscriptions.in_phase(PartitionPhase.AWAIT_COMMITTED, now)
            if any(s.tp not in self._position_fetch_in_flight for s in waiting):
                times.append(now)
        return max(now, min(times))

    def poll(self, now: float) -> list[UnsentRequest]:
        if now >= self._next_auto_commit:
            self._next_auto_commit = now + (self._auto_commit_interval or 0)
            offsets = self.processed_offsets()
            if offsets:
                self.commit(now, offsets)
        if self._quiet():
            return []
        for commit in list(self._commits):
            if commit.waiter.done():
                self._commits.remove(commit)
                continue
            if commit.in_flight:
                continue
            error: KafkaError | None = None
            if now >= commit.deadline:
                error = KafkaTimeoutError(
                    f"commit of {_names(commit.offsets)} did not complete in time "
                    f"(last error: {commit.last_error or self._coordinator.last_error})"
                )
            elif self._outlived(commit):
                error = CommitFailedError(
                    f"commit of {_names(commit.offsets)} not sent: the member of group "
                    f"{self._coordinator.group_id!r} that made it lost its partitions or left the "
                    "group before it could go (another member may own them now)"
                )
            if error is not None:
                self._commits.remove(commit)
                self.commit_failures += 1
                commit.waiter.set_exception(error)
        self._queue_position_fetches(now)
        coordinator = self._coordinator.node_id
        if coordinator is None:
            return []
        requests = [
            self._commit_request(c, coordinator) for c in self._commits if not c.in_flight and now >= c.retry_at
        ]
        requests += [
            self._fetch_request(f, coordinator)
            for f in self._fetches
            if not f.in_flight and now >= f.retry_at and not f.waiter.done()
        ]
        self._fetches = [f for f in self._fetches if not f.waiter.done() or f.in_flight]
        return requests

    # -- committed offsets become positions -------------------------------------------------------

    def _queue_position_fetches(self, now: float) -> None:
        waiting = [
            s
            for s in self._subscriptions.in_phase(PartitionPhase.AWAIT_COMMITTED, now)
            if s.tp not in self._position_fetch_in_flight
        ]
        if not waiting:
            return
        fetch = _Fetch([s.tp for s in waiting], Waiter(), for_positions=True, epochs={s.tp: s.epoch for s in waiting})
        self._position_fetch_in_flight.update(fetch.partitions)
        self._fetches.append(fetch)

    def _apply_positions(self, fetch: _Fetch, result: dict[TopicPartition, OffsetAndMetadata | None]) -> None:
        self._position_fetch_in_flight.difference_update(fetch.partitions)
        for tp, committed in result.items():
            state = self._subscriptions.get(tp)
            if (
                state is None
                or state.epoch != fetch.epochs.get(tp)
                or state.phase is not PartitionPhase.AWAIT_COMMITTED
            ):
                continue
            if committed is None:
                state.phase = PartitionPhase.AWAIT_RESET
            else:
                log.debug("%s starts at committed offset %d", tp, committed.offset)
                state.set_position(committed.offset, committed.leader_epoch)
                self.last_committed[tp] = committed.offset

    # -- OffsetCommit -----------------------------------------------------------------------------

    def _moved_on(self, sent: GroupIdentity) -> bool:
        """KIP-848: STALE_MEMBER_EPOCH answers a commit built just before a heartbeat brought the
        member a newer epoch (the coordinator bumps it whenever the assignment changes).  The same
        member with a newer epoch commits again; a member that is out of the group does not, nor
        one that lost its partitions since and joined again (its partitions may be another's now)."""
        now = self._identity()
        return now.same_membership(sent) and now.generation > sent.generation

    def _outlived(self, commit: _Commit) -> bool:
        """A member's commit waiting to be sent (no coordinator yet, a retry) whose membership is
        over: the member left, was fenced or lost its partitions and joined again.  Sent now, it
        would go as a non-member (which an empty group takes) or under the new membership: either
        could commit over another member's partitions."""
        made = commit.made_by
        if not made.member_id:
            return False  # not a member's (manual assignment): nothing to outlive
        return not self._identity().same_membership(made)

    def _commit_request(self, commit: _Commit, node: int) -> UnsentRequest:
        commit.in_flight = True
        identity = self._identity()
        grouped: dict[str, list[tuple[int, OffsetAndMetadata]]] = defaultdict(list)
        for tp, om in commit.offsets.items():
            grouped[tp.topic].append((tp.partition, om))

        def build(version: int) -> Body:
            return {
                "group_id": self._coordinator.group_id,
                "generation_id_or_member_epoch": identity.generation,
                "member_id": identity.member_id,
                "group_instance_id": identity.group_instance_id,
                "retention_time_ms": -1,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": p,
                                "committed_offset": om.offset,
                                "committed_leader_epoch": om.leader_epoch if om.leader_epoch is not None else -1,
                                "committed_metadata": om.metadata,
                            }
                            for p, om in parts
                        ],
                    }
                    for topic, parts in grouped.items()
                ],
            }

        def on_response(now: float, version: int, body: Body) -> None:
            commit.in_flight = False
            failed: dict[TopicPartition, KafkaError] = {}
            retry = False
            for topic in body["topics"]:
                for p in topic["partitions"]:
                    code = p["error_code"]
                    tp = TopicPartition(topic["name"], p["partition_index"])
                    if code == 0:
                        om = commit.offsets[tp]
                        self.last_committed[tp] = om.offset
                        if om.metadata:
                            self._metadata_sent[tp] = (om.offset, om.metadata)
                        else:
                            self._metadata_sent.pop(tp, None)
                        continue
                    if code in COORDINATOR_CODES:
                        commit.last_error = error_for_code(code)
                        self._coordinator.mark_unknown(now, commit.last_error)
                        retry = True
                    elif code in RETRY_LATER_CODES or (code == StaleMemberEpochError.code and self._moved_on(identity)):
                        commit.last_error = error_for_code(code)
                        retry = True
                    else:
                        failed[tp] = error_for_code(code)
            if failed:
                self._done(commit)
                first = next(iter(failed.values()))
                error = CommitFailedError(f"commit failed for {_names(failed)}: {first}")
                error.__cause__ = first
                self.commit_failures += 1
                commit.waiter.set_exception(error)
            elif retry:
                commit.offsets = {
                    tp: om for tp, om in commit.offsets.items() if self.last_committed.get(tp) != om.offset
                }
                commit.retry_at = now + self._retry_backoff
            else:
                self._done(commit)
                self.commits_done += 1
                commit.waiter.set_result(None)

        def on_error(now: float, error: BaseException) -> None:
            commit.in_flight = False
            commit.last_error = error
            self._coordinator.mark_unknown(now, error)
            if isinstance(error, KafkaError) and error.retriable:
                commit.retry_at = now + self._retry_backoff
            else:
                self._done(commit)
                self.commit_failures += 1
                commit.waiter.set_exception(error)

        return UnsentRequest("OffsetCommit", build, on_response, on_error, node_id=node, min_version=2)

    def _done(self, commit: _Commit) -> None:
        if commit in self._commits:
            self._commits.remove(commit)

    # -- OffsetFetch ------------------------------------------------------------------------------

    def _fetch_request(self, fetch: _Fetch, node: int) -> UnsentRequest:
        fetch.in_flight = True
        topics = [
            {"name": topic, "partition_indexes": [tp.partition for tp in tps]}
            for topic, tps in by_topic(fetch.partitions).items()
        ]
        group_id = self._coordinator.group_id

        def build(version: int) -> Body:
            if version >= 8:
                return {
                    "groups": [{"group_id": group_id, "member_id": None, "member_epoch": -1, "topics": topics}],
                    "require_stable": True,
                }
            return {"group_id": group_id, "topics": topics, "require_stable": version >= 7}

        def on_response(now: float, version: int, body: Body) -> None:
            fetch.in_flight = False
            if version >= 8:
                group = body["groups"][0]
                group_error, result_topics = group["error_code"], group["topics"]
            else:
                group_error, result_topics = body["error_code"], body["topics"]
            codes = [group_error] + [p["error_code"] for t in result_topics for p in t["partitions"]]
            bad = [c for c in codes if c]
            if any(c in COORDINATOR_CODES for c in bad):
                self._coordinator.mark_unknown(now, error_for_code(bad[0]))
                fetch.retry_at = now + self._retry_backoff
                return
            if any(c in RETRY_LATER_CODES for c in bad):
                fetch.retry_at = now + self._retry_backoff
                return
            if bad:
                self._finish_fetch(fetch, error_for_code(bad[0], f"OffsetFetch for group {group_id!r}"))
                return
            result: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(fetch.partitions)
            for t in result_topics:
                for p in t["partitions"]:
                    if p["committed_offset"] >= 0:
                        epoch = p["committed_leader_epoch"]
                        result[TopicPartition(t["name"], p["partition_index"])] = OffsetAndMetadata(
                            p["committed_offset"], p["metadata"] or "", epoch if epoch >= 0 else None
                        )
            self._check_metadata_kept(node, result)
            self._finish_fetch(fetch, result)

        def on_error(now: float, error: BaseException) -> None:
            fetch.in_flight = False
            self._coordinator.mark_unknown(now, error)
            if isinstance(error, KafkaError) and error.retriable:
                fetch.retry_at = now + self._retry_backoff
            else:
                self._finish_fetch(fetch, error if isinstance(error, KafkaError) else KafkaError(repr(error)))

        return UnsentRequest("OffsetFetch", build, on_response, on_error, node_id=node, min_version=1)

    def _check_metadata_kept(self, node: int, result: dict[TopicPartition, OffsetAndMetadata | None]) -> None:
        if self._metadata_warned:
            return
        for tp, om in result.items():
            sent = self._metadata_sent.get(tp)
            if om is not None and sent is not None and om.offset == sent[0] and not om.metadata:
                self._metadata_warned = True
                log.warning(
                    "group %r: the coordinator (node %s) answered the offset %d committed for %s without the "
                    "metadata it was committed with (%d characters): this broker does not keep commit metadata",
                    self._coordinator.group_id, node, om.offset, tp, len(sent[1]),
                )
                return

    def _finish_fetch(
        self, fetch: _Fetch, outcome: dict[TopicPartition, OffsetAndMetadata | None] | KafkaError
    ) -> None:
        if fetch in self._fetches:
            self._fetches.remove(fetch)
        if fetch.for_positions:
            if isinstance(outcome, KafkaError):
                self._position_fetch_in_flight.difference_update(fetch.partitions)
                log.warning("could not fetch committed offsets for %s: %s", _names(fetch.partitions), outcome)
                for tp in fetch.partitions:
                    state = self._subscriptions.get(tp)
                    if state is not None:
                        state.retry_at = float("inf")
                self._report_error(outcome)
                fetch.waiter.set_exception(outcome)
                return
            self._apply_positions(fetch, outcome)
        if isinstance(outcome, KafkaError):
            fetch.waiter.set_exception(outcome)
        else:
            fetch.waiter.set_result(outcome)


def _names(tps: object) -> str:
    return ", ".join(sorted(str(tp) for tp in tps))  # type: ignore[attr-defined]
