"""The share consumer's background loop: the same shape as ``engine/loop.py`` (one task owns the
sockets and the managers, the application side posts events and waits on results), with the
share-group managers: coordinator lookup, ShareGroupHeartbeat membership, share fetching."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

from ..config import ConsumerConfig
from ..errors import ConsumerClosedError, KafkaError
from ..managers.coordinator import CoordinatorManager
from ..managers.metadata import Cluster, MetadataManager
from ..managers.requests import Body, RequestManager, UnsentRequest
from ..managers.share_fetch import ShareBatch, ShareFetchManager
from ..managers.share_membership import ShareMembershipManager
from ..managers.waiter import Waiter
from .network import NetworkClient

log = logging.getLogger("asyncconsumer.share")
T = TypeVar("T")
_MIN_SLEEP = 0.002


class ShareEngine:
    def __init__(
        self, config: ConsumerConfig, *, max_records: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if config.group_id is None:
            raise ValueError("a share consumer needs a group_id")
        self.config = config
        self.clock = clock
        retry = config.retry_backoff_ms / 1000
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
        self.batches: deque[ShareBatch] = deque()
        self.network = NetworkClient(config, self._spawn, self._on_complete, clock=clock)
        self.coordinator = CoordinatorManager(
            config.group_id, retry_backoff=retry, register_node=self.network.register_node
        )
        self.metadata = MetadataManager(
            max_age=config.metadata_max_age_ms / 1000,
            retry_backoff=retry,
            topics_of_interest=lambda: set(self.membership.subscription),
            on_update=self._on_metadata,
        )
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
        )
        self.managers: list[RequestManager] = [self.metadata, self.coordinator, self.membership, self.fetcher]

    def _assignment(self) -> Any:
        if self.membership.unresolved_topic_ids:
            self.metadata.request_update()
        return self.membership.assignment() if self.membership.is_member else frozenset()

    def _on_batch(self, batch: ShareBatch) -> None:
        self.batches.append(batch)
        self.notify_app()

    def _on_metadata(self, cluster: Cluster) -> None:
        self.network.update_brokers(cluster.brokers)
        self.wake()

    # -- lifecycle ----------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                task_status.started()
                try:
                    await self._loop()
                finally:
                    tg.cancel_scope.cancel()
        except Exception as exc:
            log.exception("asyncconsumer share loop failed")
            self.fatal_error = exc
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await self.network.aclose()
            self.closed = True
            error = self.fatal_error or ConsumerClosedError("the share consumer is closed")
            events, self._events = self._events, deque()
            for _, waiter in events:
                waiter.set_exception(error)
            self.fetcher.fail_all(error)
            self._stopped.set()
            self._app_event.set()

    def stop(self) -> None:
        self.closed = True
        self.wake()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _loop(self) -> None:
        while not self.closed:
            now = self.clock()
            while self._events:
                fn, waiter = self._events.popleft()
                try:
                    waiter.set_result(fn(now))
                except Exception as exc:
                    waiter.set_exception(exc)
            if self._completions:
                self.notify_app()
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
            self.network.drop_dead_connections()
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
            raise ConsumerClosedError("the share consumer is not running")
        self._task_group.start_soon(fn, *args)

    def _on_complete(
        self, request: UnsentRequest, version: int, body: Body | None, error: BaseException | None
    ) -> None:
        self._completions.append((request, version, body, error))
        self.wake()

    # -- application side -----------------------------------------------------------------------------

    def check_running(self) -> None:
        if self.fatal_error is not None:
            raise ConsumerClosedError(f"the share consumer's background loop failed: {self.fatal_error!r}")
        if self.closed or self._task_group is None:
            raise ConsumerClosedError("the share consumer is not running: use 'async with' or 'await start()'")

    def post(self, fn: Callable[[float], Any]) -> None:
        self._events.append((fn, Waiter()))
        self.wake()

    async def call(self, fn: Callable[[float], T]) -> T:
        self.check_running()
        waiter: Waiter[T] = Waiter()
        self._events.append((fn, waiter))
        self.wake()
        return await waiter.wait()

    def report_error(self, error: KafkaError) -> None:
        self._errors.append(error)
        self.notify_app()

    def pop_error(self) -> KafkaError | None:
        return self._errors.popleft() if self._errors else None

    @property
    def has_news(self) -> bool:
        """Records or an error wait for the application."""
        return bool(self.batches or self._errors)

    def notify_app(self) -> None:
        self._app_event.set()

    def app_event(self) -> anyio.Event:
        if self._app_event.is_set():
            self._app_event = anyio.Event()
        return self._app_event
