"""The consumer's background loop: the one task that owns sockets and consumer state.

The turn itself (application events, completed responses, polling the request managers, sleeping
until the earliest deadline) and the SASL logins are ``LoopCore``'s (``engine/core.py``), shared
with the share consumer's loop. Here are the consumer's managers and what the turn adds for them:
the auto-commit timer, the poll-interval check, the fallback from KIP-848 to the classic protocol,
metadata and the fetch buffer. It never raises into the consumer's task group: failures become
background events (errors the application side raises on its next call).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from ..assignors import get_assignor
from ..config import ConsumerConfig
from ..errors import (
    KafkaError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from ..managers.commit import CommitManager, GroupIdentity
from ..managers.consumer_membership import ConsumerMembershipManager
from ..managers.coordinator import CoordinatorManager
from ..managers.fetch import FetchManager
from ..managers.fetch_buffer import FetchBuffer
from ..managers.list_offsets import ListOffsetsManager
from ..managers.loop_lag import Deadline
from ..managers.membership import CallbackRequest, GroupSettings, MemberHooks, MembershipManager
from ..managers.metadata import Cluster, MetadataManager, MissingTopicWarnings
from ..managers.requests import HoldsWaiters, RequestManager
from ..managers.stall_watch import StallWatch
from ..managers.subscription import SubscriptionState
from ..managers.validation import PositionValidator
from ..structs import TopicPartition, by_topic
from .core import LoopCore

log = logging.getLogger("asyncconsumer.engine")

T = TypeVar("T")


class Engine(LoopCore):
    """The consumer's loop (``LoopCore`` has the turn, the events and the SASL logins): metadata,
    the group coordinator and membership (classic or KIP-848), commits, offset lookups, position
    validation and fetching."""

    OWNER = "consumer"
    log = log
    # A caught-up consumer's records come a turn of the event loop sooner (engine/core.py).
    ANSWER_AT_ONCE = frozenset({"Fetch"})

    def __init__(self, config: ConsumerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, clock)
        self.subscriptions = SubscriptionState(config.auto_offset_reset, has_group=config.group_id is not None)
        self.buffer = FetchBuffer(config.fetch_buffer_bytes, on_space=self._on_buffer_space, on_data=self.notify_app)
        self._reported_unknown: set[str] = set()
        self._missing_subscribed = MissingTopicWarnings(f"group {config.group_id!r}")
        retry = config.retry_backoff_ms / 1000

        self.metadata = MetadataManager(
            max_age=config.metadata_max_age_ms / 1000,
            retry_backoff=retry,
            topics_of_interest=self._topics_of_interest,
            on_update=self._on_metadata,
            want_all_topics=self._want_all_topics,
            bootstrap=self.network,
            recovery_strategy=config.metadata_recovery_strategy,
            rebootstrap_trigger=config.metadata_recovery_rebootstrap_trigger_ms / 1000,
        )
        self.callbacks: deque[CallbackRequest] = deque()
        self.last_poll = clock()
        self.offsets = ListOffsetsManager(
            self.subscriptions,
            self.metadata,
            read_committed=config.isolation_level == "read_committed",
            retry_backoff=retry,
            report_error=self.report_error,
        )
        self.validator = PositionValidator(
            self.subscriptions, self.metadata, self.buffer, retry_backoff=retry, report_error=self.report_error
        )
        self.fetcher = FetchManager(
            self.subscriptions,
            self.metadata,
            self.buffer,
            fetch_min_bytes=config.fetch_min_bytes,
            fetch_max_bytes=config.fetch_max_bytes,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            max_partition_fetch_bytes=config.max_partition_fetch_bytes,
            read_committed=config.isolation_level == "read_committed",
            check_crcs=config.check_crcs,
            max_decompressed=config.batch_decompress_limit,
            retry_backoff=retry,
            client_rack=config.client_rack,
            report_error=self.report_error,
            on_diverging_epoch=self.validator.apply_end_offset,
            preferred_replica_ttl=config.metadata_max_age_ms / 1000,
        )
        self.coordinator: CoordinatorManager | None = None
        self.commits: CommitManager | None = None
        self.membership: MembershipManager | ConsumerMembershipManager | None = None
        if config.group_id is not None:
            self.coordinator = CoordinatorManager(
                config.group_id, retry_backoff=retry, register_node=self.network.register_node,
                on_fatal=self._group_unavailable,
            )
            settings = GroupSettings(
                group_id=config.group_id,
                group_instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.effective_rebalance_timeout_ms,
                heartbeat_interval=config.heartbeat_interval_ms / 1000,
                retry_backoff=retry,
                assignors=[get_assignor(name) for name in config.partition_assignment_strategy],
                client_rack=config.client_rack or None,
            )
            self._group_settings = settings
            if config.group_protocol == "consumer":
                self.membership = ConsumerMembershipManager(
                    settings, self.coordinator, self.subscriptions, self.metadata, self._member_hooks(),
                    rack_id=config.client_rack or None,
                    server_assignor=config.group_remote_assignor,
                )
            else:
                self.membership = self._classic_membership()
            self.commits = CommitManager(
                self.coordinator,
                self.subscriptions,
                retry_backoff=retry,
                request_timeout=config.request_timeout_ms / 1000,
                auto_commit_interval=config.auto_commit_interval_ms / 1000 if config.enable_auto_commit else None,
                report_error=self.report_error,
                group_identity=self._group_identity,
                partition_exists=lambda tp: not self.metadata.cluster.missing(tp),
            )
        self.stalls = StallWatch(
            self.subscriptions, self.fetcher, self.buffer,
            quiet_after=config.quiet_partition_warning_s,
            describe_node=self.network.describe,
            describe_coordinator=self._describe_coordinator,
            leader_of=lambda tp: (leader.leader if (leader := self.metadata.cluster.leader(tp)) else None),
        )
        managers: tuple[RequestManager | None, ...] = (
            self.metadata, self.coordinator, self.membership, self.commits, self.offsets, self.validator, self.fetcher,
            self.telemetry,
        )
        self.managers: list[RequestManager] = [m for m in managers if m is not None]
        holders: tuple[HoldsWaiters | None, ...] = (self.metadata, self.commits, self.offsets)
        self._waiter_holders: list[HoldsWaiters] = [m for m in holders if m is not None]

    # -- the loop's hooks (LoopCore) ---------------------------------------------------------------

    def _on_start(self) -> None:
        if self.commits is not None:
            self.commits.start_auto_commit(self.clock())

    def _before_poll(self, now: float) -> None:
        if self.membership is not None:
            expired = self.membership.check_poll_interval(now, self.last_poll, self.config.max_poll_interval_ms / 1000)
            if expired is not None:
                self.report_error(expired)
        self._fall_back_to_classic()
        self.stalls.check(now)

    def _deadlines(self) -> list[Deadline]:
        """A group member's: no heartbeat while the loop is blocked (classic: this consumer's
        ``session_timeout_ms``; KIP-848: the broker's session timeout, which it does not tell its
        members), and ``max_poll_interval_ms``; and the requests' own."""
        deadlines = super()._deadlines()
        member, config = self.membership, self.config
        if member is None or not member.subscribed:
            return deadlines
        rejoin = "this member rejoins, and its partitions may have moved to another member meanwhile"
        if isinstance(member, ConsumerMembershipManager):
            interval = round(member.heartbeat_interval * 1000)
            deadlines += [
                Deadline(f"the group's heartbeat interval of {interval} ms", member.heartbeat_interval,
                         "no heartbeat was sent meanwhile"),
                Deadline("the group's session timeout, group.consumer.session.timeout.ms on the broker, 45000 ms "
                         "by default", 45.0, f"the group coordinator drops a member it hears no heartbeat from "
                         f"for that long: {rejoin}"),
            ]
        else:
            deadlines += [
                Deadline(f"heartbeat_interval_ms={config.heartbeat_interval_ms}", config.heartbeat_interval_ms / 1000,
                         "no heartbeat was sent meanwhile"),
                Deadline(f"session_timeout_ms={config.session_timeout_ms}", config.session_timeout_ms / 1000,
                         f"the group coordinator drops a member it hears no heartbeat from for that long: {rejoin}"),
            ]
        deadlines.append(Deadline(
            f"max_poll_interval_ms={config.max_poll_interval_ms}", config.max_poll_interval_ms / 1000,
            "a member whose application does not poll for that long leaves the group"))
        return deadlines

    def _describe_coordinator(self) -> str:
        coordinator = self.coordinator
        if coordinator is None:
            return "no group"
        if coordinator.node_id is None:
            return f"group coordinator not known yet; last error: {coordinator.last_error}"
        return self.network.describe(coordinator.node_id)

    def _fail_pending(self, error: BaseException) -> None:
        for holder in self._waiter_holders:
            holder.fail_all(error)

    # -- metadata ---------------------------------------------------------------------------------

    def _topics_of_interest(self) -> frozenset[str]:
        """Asked by the metadata manager each turn: without a copy while one source has them all."""
        topics = self.subscriptions.topics()
        looked_up = self.offsets.topics_of_interest()
        if looked_up:
            topics |= looked_up
        if self.membership is not None:
            member = self.membership.topics_of_interest()
            topics = member if not topics else topics | member
        return topics

    def _classic_membership(self) -> MembershipManager:
        assert self.coordinator is not None
        return MembershipManager(
            self._group_settings, self.coordinator, self.subscriptions, self.metadata, self._member_hooks()
        )

    def _member_hooks(self) -> MemberHooks:
        return MemberHooks(self._queue_callback, self._drop_buffered, self.report_error)

    def _group_identity(self) -> GroupIdentity:
        return self.membership.identity() if self.membership is not None else GroupIdentity()

    def _group_unavailable(self, error: KafkaError) -> None:
        """The group's coordinator cannot be had for good (GROUP_AUTHORIZATION_FAILED, ...): as in the
        Java client, commits and committed() fail with it at once, and the next poll raises it."""
        if self.commits is not None:
            self.commits.fail_all(error)
        self.report_once(error)

    def _fall_back_to_classic(self) -> None:
        """KIP-848 is not available on this cluster: the classic protocol takes over."""
        old = self.membership
        if old is None or not isinstance(old, ConsumerMembershipManager) or not old.unsupported:
            return
        log.warning("group_protocol='consumer' is not supported by this cluster (KIP-848 needs Kafka >= 4.0: %s); "
                    "falling back to the classic group protocol", old.unsupported_detail)
        new = self._classic_membership()
        # The manager's "not supported" notice is moot now that the classic protocol took over.
        self._errors = deque(e for e in self._errors if not isinstance(e, UnsupportedVersionError))
        self.managers[self.managers.index(old)] = new
        self.membership = new
        if old.topics or old.pattern is not None:
            new.subscribe(old.topics, old.pattern)

    def _want_all_topics(self) -> bool:
        return self.membership is not None and self.membership.wants_all_topics

    # -- group callbacks (background events) ------------------------------------------------------

    def _queue_callback(self, request: CallbackRequest) -> None:
        self.callbacks.append(request)
        self.notify_app()

    def _drop_buffered(self, tps: frozenset[TopicPartition]) -> None:
        self.buffer.drop(lambda f: f.tp not in tps)

    def _on_buffer_space(self, tp: TopicPartition, was_full: bool) -> None:
        """A completed fetch left the buffer: wake the loop if the fetch manager may send a fetch
        it could not before (a turn of the loop for every partition read is otherwise spent)."""
        if self.fetcher.may_fetch_after_release(tp, was_full):
            self.wake()

    def app_polled(self) -> None:
        """The application polled: liveness for max_poll_interval_ms."""
        self.last_poll = self.clock()
        if self.membership is not None:
            self.membership.on_poll()
            self.wake()

    def _on_metadata(self, cluster: Cluster) -> None:
        self.network.update_brokers(cluster.brokers, cluster.cluster_id)
        if self.membership is not None:
            if self.membership.wants_all_topics:
                self.membership.update_pattern_topics({n for n, t in cluster.topics.items() if not t.is_internal})
            self.membership.on_metadata()
            self._missing_subscribed.check(cluster, self.membership.topics if self.membership.pattern is None else ())
        self._report_unreadable(cluster)
        self.wake()

    def _report_unreadable(self, cluster: Cluster) -> None:
        """Assigned partitions the metadata says cannot be read: a topic that does not exist (deleted,
        or not created yet), a partition number the topic does not have, a topic we may not read.

        With ``assign()`` the application hears of each such topic once (the next poll raises), and
        again if it comes back and goes again; the partitions stay assigned, unfetched, until the
        topic exists.  A group member's partitions are the group's business: they leave at the next
        rebalance (``MembershipManager.on_metadata``), which a warning announces; only a topic it
        may not read is raised there too.
        """
        unreadable = by_topic(tp for tp in self.subscriptions.partitions
                              if tp.topic in cluster.topic_errors or cluster.missing(tp))
        group_managed = self.membership is not None and self.membership.subscribed
        for topic, tps in unreadable.items():
            if topic in self._reported_unknown:
                continue
            self._reported_unknown.add(topic)
            error = cluster.topic_errors.get(topic)
            if error is None:
                known = cluster.topics[topic]
                error, problem = UnknownTopicOrPartitionError(), f"has {len(known.partitions)} partitions"
            else:
                problem = "does not exist" if cluster.topic_missing(topic) else "may not be read by this client"
            names = ", ".join(sorted(map(str, tps)))
            if group_managed and isinstance(error, UnknownTopicOrPartitionError):
                log.warning("topic %r %s: %s leave this member at the group's next rebalance", topic, problem, names)
                continue
            log.warning("topic %r %s: %s stay assigned but are not fetched", topic, problem, names)
            self.report_error(type(error)(
                f"topic {topic!r} {problem}: {names} stay assigned but are not fetched while it lasts "
                "(assign() without them to stop)"))
        # A topic that is fine again (re-created, say) is reported again if it goes again.
        self._reported_unknown &= set(unreadable)


__all__ = ["Engine", "error_for_code"]
