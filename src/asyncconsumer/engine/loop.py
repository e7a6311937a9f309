"""The background loop: the one task that owns sockets and consumer state.

Each turn it runs queued application events (closures from the public API),
hands completed responses to their managers, polls every request manager for
unsent requests, gives those to the network client, and sleeps until the
earliest manager deadline or until something wakes it.  It never raises into
the consumer's task group: failures become background events (errors the
application side raises on its next call).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

from ..assignors import get_assignor
from ..config import ConsumerConfig
from ..errors import (
    ConsumerClosedError,
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
from ..managers.membership import CallbackRequest, GroupSettings, MembershipManager
from ..managers.metadata import Cluster, MetadataManager
from ..managers.requests import Body, HoldsWaiters, RequestManager, UnsentRequest
from ..managers.subscription import SubscriptionState
from ..managers.validation import PositionValidator
from ..managers.waiter import Waiter
from ..structs import TopicPartition, by_topic
from . import sasl as sasl_module
from .connection import BrokerConnection
from .network import NetworkClient

log = logging.getLogger("asyncconsumer.engine")

T = TypeVar("T")
_MIN_SLEEP = 0.002  # a floor so a wrong deadline can never spin the CPU


class Engine:
    def __init__(self, config: ConsumerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.subscriptions = SubscriptionState(config.auto_offset_reset, has_group=config.group_id is not None)
        self.buffer = FetchBuffer(config.fetch_buffer_bytes, on_space=self.wake, on_data=self.notify_app)
        self._events: deque[tuple[Callable[[float], Any], Waiter[Any]]] = deque()
        self._completions: deque[tuple[UnsentRequest, int, Body | None, BaseException | None]] = deque()
        self._errors: deque[KafkaError] = deque()
        self._wake_event = anyio.Event()
        self._woken = False
        self._app_event = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._stopped = anyio.Event()
        self.fatal_error: BaseException | None = None
        self.closed = False
        self._close_within = 2.0  # how long closing the connections may take (see stop())
        self._reported_unknown: set[str] = set()
        retry = config.retry_backoff_ms / 1000

        self._tokens = (
            sasl_module.TokenCache(config.sasl_oauth_token_provider, timeout=config.request_timeout_ms / 1000)
            if config.sasl_oauth_token_provider is not None
            else None
        )
        self.network = NetworkClient(
            config, self._spawn, self._on_complete, sasl=self._authenticate if config.uses_sasl else None, clock=clock
        )
        self.metadata = MetadataManager(
            max_age=config.metadata_max_age_ms / 1000,
            retry_backoff=retry,
            topics_of_interest=self._topics_of_interest,
            on_update=self._on_metadata,
            want_all_topics=self._want_all_topics,
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
                config.group_id, retry_backoff=retry, register_node=self.network.register_node
            )
            settings = GroupSettings(
                group_id=config.group_id,
                group_instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.effective_rebalance_timeout_ms,
                heartbeat_interval=config.heartbeat_interval_ms / 1000,
                retry_backoff=retry,
                assignors=[get_assignor(name) for name in config.partition_assignment_strategy],
            )
            self._group_settings = settings
            if config.group_protocol == "consumer":
                self.membership = ConsumerMembershipManager(
                    settings, self.coordinator, self.subscriptions, self.metadata,
                    run_callback=self._queue_callback, drop_buffered=self._drop_buffered,
                    report_error=self.report_error, rack_id=config.client_rack or None,
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
        managers: tuple[RequestManager | None, ...] = (
            self.metadata, self.coordinator, self.membership, self.commits, self.offsets, self.validator, self.fetcher
        )
        self.managers: list[RequestManager] = [m for m in managers if m is not None]
        holders: tuple[HoldsWaiters | None, ...] = (self.metadata, self.commits, self.offsets)
        self._waiter_holders: list[HoldsWaiters] = [m for m in holders if m is not None]

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The background loop; returns when ``stop()`` is called."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                task_status.started()
                try:
                    await self._loop()
                finally:
                    tg.cancel_scope.cancel()
        except Exception as exc:  # never let a bug escape into the user's task group
            log.exception("asyncconsumer background loop failed")
            self.fatal_error = exc
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._close_within):
                await self.network.aclose()
            self.closed = True
            self._fail_waiters(self.fatal_error or ConsumerClosedError("the consumer is closed"))
            self._stopped.set()
            self._app_event.set()

    def stop(self, within: float = 2.0) -> None:
        """Stop the loop; closing the connections may take up to ``within`` seconds."""
        self._close_within = within
        self.closed = True
        self.wake()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _fail_waiters(self, error: BaseException) -> None:
        events, self._events = self._events, deque()
        for _, waiter in events:
            waiter.set_exception(error)
        for holder in self._waiter_holders:
            holder.fail_all(error)

    async def _loop(self) -> None:
        if self.commits is not None:
            self.commits.start_auto_commit(self.clock())
        while not self.closed:
            now = self.clock()
            self._run_events(now)
            self._run_completions(now)
            self.network.drop_dead_connections()
            if self.membership is not None:
                expired = self.membership.check_poll_interval(
                    now, self.last_poll, self.config.max_poll_interval_ms / 1000)
                if expired is not None:
                    self.report_error(expired)
            self._fall_back_to_classic()
            deadline = float("inf")
            for manager in self.managers:
                for request in manager.poll(now):
                    self.network.send(request)
                deadline = min(deadline, manager.next_deadline(now))
            if self._woken or self._events or self._completions:
                self._woken = False
                await anyio.lowlevel.checkpoint()
                continue
            timeout = max(_MIN_SLEEP, deadline - self.clock())
            with anyio.move_on_after(min(timeout, 1.0)):
                await self._wake_event.wait()
            self._wake_event = anyio.Event()
            self._woken = False

    def wake(self) -> None:
        self._woken = True
        self._wake_event.set()

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._task_group is None:
            raise ConsumerClosedError("the consumer is not running")
        self._task_group.start_soon(fn, *args)

    # -- application events -----------------------------------------------------------------------

    def post(self, fn: Callable[[float], Any]) -> None:
        """Queue an application event whose result nobody waits for."""
        self._events.append((fn, Waiter()))
        self.wake()

    async def call(self, fn: Callable[[float], T]) -> T:
        """Run ``fn(now)`` on the background loop (an application event) and return its result."""
        self.check_running()
        waiter: Waiter[T] = Waiter()
        self._events.append((fn, waiter))
        self.wake()
        return await waiter.wait()

    def check_running(self) -> None:
        if self.fatal_error is not None:
            raise ConsumerClosedError(f"the consumer's background loop failed: {self.fatal_error!r}")
        if self.closed or self._task_group is None:
            raise ConsumerClosedError("the consumer is not running: use 'async with' or 'await start()'")

    def _run_events(self, now: float) -> None:
        while self._events:
            fn, waiter = self._events.popleft()
            if waiter.done():
                continue
            try:
                waiter.set_result(fn(now))
            except Exception as exc:
                waiter.set_exception(exc)

    # -- completions from the network -------------------------------------------------------------

    def _on_complete(
        self, request: UnsentRequest, version: int, body: Body | None, error: BaseException | None
    ) -> None:
        self._completions.append((request, version, body, error))
        self.wake()

    def _run_completions(self, now: float) -> None:
        if self._completions:
            self.notify_app()  # positions, offsets or errors may have changed: let waiters re-check
        while self._completions:
            request, version, body, error = self._completions.popleft()
            try:
                if error is None and body is not None:
                    request.on_response(now, version, body)
                else:
                    request.on_error(now, error or KafkaError("no response"))
            except Exception as exc:
                log.exception("handling a %s response failed", request.api)
                self.report_error(KafkaError(f"internal error handling {request.api}: {exc!r}"))

    # -- background events (to the application side) ----------------------------------------------

    def report_error(self, error: KafkaError) -> None:
        self._errors.append(error)
        self.notify_app()

    def notify_app(self) -> None:
        self._app_event.set()

    def app_event(self) -> anyio.Event:
        if self._app_event.is_set():
            self._app_event = anyio.Event()
        return self._app_event

    def pop_error(self) -> KafkaError | None:
        return self._errors.popleft() if self._errors else None

    # -- metadata ---------------------------------------------------------------------------------

    def _topics_of_interest(self) -> set[str]:
        topics = self.subscriptions.topics() | self.offsets.topics_of_interest()
        if self.membership is not None:
            topics |= self.membership.topics_of_interest()
        return topics

    def _classic_membership(self) -> MembershipManager:
        assert self.coordinator is not None
        return MembershipManager(
            self._group_settings, self.coordinator, self.subscriptions, self.metadata,
            run_callback=self._queue_callback, drop_buffered=self._drop_buffered, report_error=self.report_error,
        )

    def _group_identity(self) -> GroupIdentity:
        return self.membership.identity() if self.membership is not None else GroupIdentity()

    def _fall_back_to_classic(self) -> None:
        """KIP-848 is not available on this cluster: the classic protocol takes over."""
        old = self.membership
        if not isinstance(old, ConsumerMembershipManager) or not old.unsupported:
            return
        log.warning("group_protocol='consumer' is not supported by this cluster (KIP-848 needs Kafka >= 4.0); "
                    "falling back to the classic group protocol")
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

    def app_polled(self) -> None:
        """The application polled: liveness for max_poll_interval_ms."""
        self.last_poll = self.clock()
        if self.membership is not None:
            self.membership.on_poll()
            self.wake()

    def _on_metadata(self, cluster: Cluster) -> None:
        self.network.update_brokers(cluster.brokers)
        if self.membership is not None:
            if self.membership.wants_all_topics:
                self.membership.update_pattern_topics({n for n, t in cluster.topics.items() if not t.is_internal})
            self.membership.on_metadata()
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

    async def wait_for_metadata(self, timeout: float) -> Cluster:
        """A fresh all-topics metadata snapshot (for ``topics()``)."""
        waiter = await self.call(lambda now: self.metadata.fetch_all_topics())
        with anyio.move_on_after(timeout):
            while True:
                with anyio.move_on_after(0.05):
                    return await waiter.wait()
                failed = self.network.bootstrap_failed_for_good()
                if failed is not None:
                    raise failed
        raise self.unreachable_or_timeout("metadata request", timeout)

    def unreachable_or_timeout(self, what: str, timeout: float) -> KafkaError:
        from ..errors import KafkaTimeoutError

        unreachable = self.network.all_unreachable_error()
        if unreachable is not None:
            return unreachable
        last = self.metadata.last_error
        suffix = f" (last error: {last})" if last else ""
        return KafkaTimeoutError(f"{what} did not complete within {timeout:.1f}s{suffix}")

    # -- SASL -------------------------------------------------------------------------------------

    async def _authenticate(self, connection: BrokerConnection) -> int:
        """Log ``connection`` in (also to re-authenticate it); returns the session lifetime in ms."""
        config = self.config
        token = await self._tokens.token(connection.session_lifetime) if self._tokens is not None else None
        mechanism = sasl_module.create_mechanism(
            config.sasl_mechanism, config.sasl_plain_username, config.sasl_plain_password, token
        )

        async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
            return await connection.request_version(api, version, body)

        handshake_version = connection.choose_version("SaslHandshake")
        try:
            authenticate_version: int | None = connection.choose_version("SaslAuthenticate")
        except KafkaError:
            authenticate_version = None
        return await sasl_module.authenticate(
            request, mechanism, handshake_version=handshake_version, authenticate_version=authenticate_version
        )


__all__ = ["Engine", "error_for_code"]
