"""The share consumer's background loop: ``LoopCore`` (``engine/core.py``: one task owns the
sockets and the managers, the application side posts events and waits on results, SASL logins)
with the share-group managers: coordinator lookup, ShareGroupHeartbeat membership, share fetching."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..config import ConsumerConfig
from ..errors import KafkaError
from ..managers.coordinator import CoordinatorManager
from ..managers.loop_lag import Deadline
from ..managers.metadata import Cluster, MetadataManager, MissingTopicWarnings
from ..managers.share_fetch import ShareAcquireMode, ShareBatch, ShareFetchManager
from ..managers.share_membership import ShareMembershipManager
from .core import LoopCore

log = logging.getLogger("asyncconsumer.share")


class ShareEngine(LoopCore):
    OWNER = "share consumer"
    log = log
    # Not measured better here: a node is fetched from only once its records are handed out, and in
    # three interleaved rounds at 1,000 records/s the share consumer's p50 was no lower with it.
    HAND_OVER = False

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        max_records: int,
        acquire_mode: ShareAcquireMode = "batch_optimized",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.group_id is None:
            raise ValueError("a share consumer needs a group_id")
        super().__init__(config, clock)
        retry = config.retry_backoff_ms / 1000
        self.batches: deque[ShareBatch] = deque()
        self.coordinator = CoordinatorManager(
            config.group_id, retry_backoff=retry, register_node=self.network.register_node,
            on_fatal=self.report_once,
        )
        self.metadata = MetadataManager(
            max_age=config.metadata_max_age_ms / 1000,
            retry_backoff=retry,
            topics_of_interest=lambda: self.membership.subscription,
            on_update=self._on_metadata,
            bootstrap=self.network,
            recovery_strategy=config.metadata_recovery_strategy,
            rebootstrap_trigger=config.metadata_recovery_rebootstrap_trigger_ms / 1000,
        )
        self._missing_subscribed = MissingTopicWarnings(f"share group {config.group_id!r}")
        self.membership = ShareMembershipManager(
            config.group_id,
            self.coordinator,
            topic_name=lambda tid: self.metadata.cluster.topic_name(tid),
            report_error=self.report_error,
            retry_backoff=retry,
            rack_id=config.client_rack or None,
        )
        self.fetcher = ShareFetchManager(
            config.group_id,
            self.metadata,
            member_id=lambda: self.membership.member_id,
            assignment=self._assignment,
            can_fetch=lambda: self.membership.is_member,
            on_batch=self._on_batch,
            report_error=self.report_error,
            max_wait_ms=config.fetch_max_wait_ms,
            min_bytes=config.fetch_min_bytes,
            max_bytes=config.fetch_max_bytes,
            max_records=max_records,
            retry_backoff=retry,
            check_crcs=config.check_crcs,
            max_decompressed=config.batch_decompress_limit,
            buffer_bytes=config.fetch_buffer_bytes,
            acquire_mode=acquire_mode,
        )
        self.managers = [self.metadata, self.coordinator, self.membership, self.fetcher]
        if self.telemetry is not None:
            self.managers.append(self.telemetry)

    def _assignment(self) -> Any:
        if self.membership.unresolved_topic_ids:
            self.metadata.request_update()
        return self.membership.assignment() if self.membership.is_member else frozenset()

    def _on_batch(self, batch: ShareBatch) -> None:
        self.batches.append(batch)
        self.notify_app()

    def _on_metadata(self, cluster: Cluster) -> None:
        self.network.update_brokers(cluster.brokers, cluster.cluster_id)
        self._missing_subscribed.check(cluster, self.membership.subscription)
        self.wake()

    def _fail_pending(self, error: BaseException) -> None:
        self.fetcher.fail_all(error)

    def _deadlines(self) -> list[Deadline]:
        """A share group member's: no heartbeat while the loop is blocked (the broker's session
        timeout, which it does not tell its members), and the acquisition lock of the records it
        holds; and the requests' own."""
        deadlines = super()._deadlines()
        member, lock = self.membership, self.fetcher.lock_timeout
        if not member.is_member:
            return deadlines
        interval = round(member.heartbeat_interval * 1000)
        deadlines += [
            Deadline(f"the share group's heartbeat interval of {interval} ms", member.heartbeat_interval,
                     "no heartbeat was sent meanwhile"),
            Deadline("the share group's session timeout, group.share.session.timeout.ms on the broker, 45000 ms by "
                     "default", 45.0, "the group coordinator drops a member it hears no heartbeat from for that long: "
                     "this member joins again, and the records it had acquired go to other members"),
        ]
        if lock > 0:
            deadlines.append(Deadline(
                f"the acquisition lock of {round(lock * 1000)} ms, the group's share.record.lock.duration.ms", lock,
                "records acquired and not acknowledged by then go back to the broker, which delivers them again"))
        return deadlines

    @property
    def has_news(self) -> bool:
        """Records or an error wait for the application."""
        return bool(self.batches or self._errors or self.membership.unsupported)

    def pop_error(self) -> KafkaError | None:
        """The next error for the application; once the coordinator turned out to have no share
        groups, that error at every call (the membership is over: no silent stall)."""
        return super().pop_error() or self.membership.unsupported
