"""The share consumer (KIP-932, "queues for Kafka"): records handed out one member at a time,
each acknowledged (accept, release for redelivery, reject, renew the lock).

    async with ShareConsumer(bootstrap_servers="...", group_id="workers",
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe(["jobs"])
        async for record in consumer:
            ...
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)

See docs/share-groups.md.  Like ``Consumer``, a facade: every public call is bracketed by
``acquire()``/``release()`` (KIP-957), the background loop (``engine/share_loop.py``) owns every
request, and the application-side work (polls, the ledger of records handed out and not
acknowledged, acknowledgements, commits) is the share collector's (``app/share_collector.py``).
"""

from __future__ import annotations

import logging
import typing
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Generic, Never, Unpack

import anyio
from typing_extensions import TypeVar

from ._args import check_timeout
from .app.client import ClientBase, bracketed, bracketed_sync, check_keyword_only
from .app.metrics import share_snapshot
from .app.share_collector import (
    AcknowledgementCommitCallback,
    AcknowledgementResult,
    ShareAcknowledgementMode,
    ShareCollector,
)
from .config import ConsumerConfig, ConsumerOptions, build_config, options_from_properties
from .engine.share_loop import ShareEngine
from .errors import (
    ConfigError,
    ConfigTypeError,
    ConsumerClosedError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
)
from .managers.share_fetch import ShareAcquireMode
from .metrics import ShareConsumerMetrics
from .otel import attach as attach_telemetry
from .otel import telemetry_for
from .structs import AcknowledgeType, ShareConsumerRecord, TopicPartition

log = logging.getLogger("asyncconsumer.share")

KT = TypeVar("KT", default=bytes)
VT = TypeVar("VT", default=bytes)

#: The share consumer's own properties (Java's names) -> its constructor options.
_SHARE_PROPERTIES = {
    "share.acknowledgement.mode": "share_acknowledgement_mode",
    "share.acquire.mode": "share_acquire_mode",
}


class ShareConsumer(ClientBase, Generic[KT, VT]):
    """An asyncio/trio share-group consumer; options as for ``Consumer`` (``group_id`` required),
    plus ``share_acknowledgement_mode`` ("implicit": every record handed out is accepted at the
    next poll; "explicit": each must be acknowledged before the next poll),
    ``on_acknowledgement_commit`` (see ``set_acknowledgement_commit_callback``) and
    ``share_acquire_mode`` (``ShareAcquireMode``; "record_limit" needs Apache Kafka 4.2 or later)."""

    KIND = "share consumer"
    #: The operations the default ``acquire`` rule treats as polls.
    POLL_OPERATIONS = frozenset({"getmany", "__anext__"})

    def __init__(
        self,
        *args: Never,
        share_acknowledgement_mode: ShareAcknowledgementMode = "implicit",
        on_acknowledgement_commit: AcknowledgementCommitCallback | None = None,
        share_acquire_mode: ShareAcquireMode = "batch_optimized",
        **options: Unpack[ConsumerOptions],
    ) -> None:
        check_keyword_only("ShareConsumer", args)
        if share_acknowledgement_mode not in typing.get_args(ShareAcknowledgementMode):
            raise ConfigError(
                f"share_acknowledgement_mode must be 'implicit' or 'explicit', not {share_acknowledgement_mode!r}"
            )
        super().__init__()
        if share_acquire_mode not in typing.get_args(ShareAcquireMode):
            raise ConfigError(
                f"share_acquire_mode must be 'batch_optimized' or 'record_limit', not {share_acquire_mode!r}"
            )
        self.acquire_mode: ShareAcquireMode = share_acquire_mode
        self._config: ConsumerConfig = build_config(options)
        if self._config.group_id is None:
            raise ConfigError("a share consumer needs a group_id (the share group's name)")
        self.acknowledgement_mode: ShareAcknowledgementMode = share_acknowledgement_mode
        self._collector: ShareCollector[KT, VT] = ShareCollector(self._config, share_acknowledgement_mode)
        #: Records taken for ``async for`` and not handed out yet (the collector's).
        self._pending = self._collector.pending
        self.set_acknowledgement_commit_callback(on_acknowledgement_commit)
        self._engine: ShareEngine | None = None
        self._topics: frozenset[str] = frozenset()

    @classmethod
    def from_properties(
        cls,
        properties: Mapping[str, Any],
        *,
        on_acknowledgement_commit: AcknowledgementCommitCallback | None = None,
        **options: Any,
    ) -> ShareConsumer[Any, Any]:
        """Build from the Java client's dotted names (``{"bootstrap.servers": ..., "group.id": ...,
        "share.acknowledgement.mode": "explicit"}``), as ``Consumer.from_properties``; keyword
        ``options`` (snake_case, ``share_acknowledgement_mode`` too) override them."""
        if not isinstance(properties, Mapping):
            raise ConfigTypeError(f"properties must be a mapping of dotted names to values, got {properties!r:.80}")
        consumer_properties = dict(properties)
        share = {name: consumer_properties.pop(key) for key, name in _SHARE_PROPERTIES.items() if key in properties}
        share.update({name: options.pop(name) for name in _SHARE_PROPERTIES.values() if name in options})
        return cls(
            on_acknowledgement_commit=on_acknowledgement_commit,
            **share,
            **options_from_properties(consumer_properties, options),
        )

    @property
    def config(self) -> ConsumerConfig:
        return self._config

    # -- lifecycle ----------------------------------------------------------------------------------

    def _new_engine(self) -> ShareEngine:
        config = self._config
        self._engine = ShareEngine(config, max_records=config.max_poll_records, acquire_mode=self.acquire_mode)
        # OpenTelemetry (asyncconsumer.otel): records handed out and request durations; no lag.
        ref = weakref.ref(self)
        telemetry = telemetry_for(
            config, None, lambda: c._collector.delivered_by_partition() if (c := ref()) is not None else {},
            lambda: dict(c._collector.deserializers.skipped) if (c := ref()) is not None else {},
        )
        attach_telemetry(self._engine, telemetry)
        if self._engine.telemetry is not None:  # client metrics push (KIP-714): the numbers of metrics()
            engine = self._engine
            self._engine.telemetry.source = (
                lambda: share_snapshot(engine, sum(c._collector.delivered.values())) if (c := ref()) else None
            )
        return self._engine

    async def _bootstrap(self) -> None:
        engine = self._running()
        await engine.wait_for_metadata(self._config.request_timeout_ms / 1000, all_topics=False)
        if self._topics:
            topics = self._topics
            engine.post(lambda now: engine.membership.subscribe(topics))

    async def close(self, timeout: float = 30.0) -> None:
        """Send the pending acknowledgements (implicit mode: accept what was handed out), release the
        rest, close the share sessions, leave the group and stop."""
        engine = self._engine
        if engine is None or self._closed:
            return
        self._closed = True
        if engine.closed:
            return
        with anyio.move_on_after(timeout, shield=True):
            release = self._collector.close_out(engine)
            try:
                await engine.call(release)
                await self._until(engine, lambda: engine.fetcher.done_closing)
                try:
                    await self._collector.report_acknowledgements(engine)
                except Exception:
                    log.exception("the acknowledgement-commit callback raised while the share consumer closed")
                await engine.call(lambda now: engine.membership.leave())
                await self._until(engine, lambda: engine.membership.left)
            except ConsumerClosedError:
                pass
        await self._shutdown(5.0)

    @staticmethod
    async def _until(engine: ShareEngine, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds (re-checked whenever the loop handled responses)."""
        while not engine.closed:
            event = engine.app_event()
            if condition():
                return
            with anyio.move_on_after(0.5):
                await event.wait()

    def _running(self) -> ShareEngine:
        engine = self._engine
        if engine is None or self._closed:
            raise ConsumerClosedError("the share consumer is not running: use 'async with'")
        engine.check_running()
        return engine

    def _reading(self, operation: str) -> ShareEngine:
        """The running loop, for a poll: without a subscription it would wait forever, so it raises
        at once, as the Java share consumer's ``poll()`` does."""
        engine = self._running()
        if not self._topics:
            raise IllegalStateError(
                f"{operation}: the share consumer is not subscribed to any topics; call subscribe() first"
            )
        return engine

    # -- subscription ---------------------------------------------------------------------------------

    @bracketed_sync("subscribe")
    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group for ``topics`` (names; a share group has no patterns)."""
        if isinstance(topics, str):
            raise TypeError("subscribe() takes a list of topic names, not a string")
        names = frozenset(topics)
        if not names or any(not isinstance(t, str) or not t for t in names):
            raise ValueError("subscribe() needs at least one non-empty topic name")
        self._topics = names
        engine = self._engine
        if engine is not None and not engine.closed:
            engine.post(lambda now: engine.membership.subscribe(names))

    @bracketed("unsubscribe")
    async def unsubscribe(self, *, timeout: float | None = None) -> None:
        """Leave the share group (Java's ``unsubscribe``): the records of the last poll are settled
        as in ``close()`` (implicit mode accepts them, explicit mode releases those not
        acknowledged), records fetched and not handed out are released, the acknowledgements are
        sent and answered, then the member leaves.  ``subscribe()`` joins again later.  Waits up
        to ``timeout`` seconds (None: ``default_api_timeout_ms``), then raises ``KafkaTimeoutError``."""
        engine = self._running()
        seconds = self._config.default_api_timeout_ms / 1000 if timeout is None else timeout
        self._topics = frozenset()
        membership = engine.membership
        with anyio.move_on_after(seconds) as scope:
            await engine.call(self._collector.close_out(engine, close_sessions=False))
            await self._collector.commit(engine, seconds)
            await engine.call(lambda now: membership.unsubscribe())
            await self._until(engine, lambda: not membership.leaving)
        if scope.cancelled_caught:
            raise KafkaTimeoutError(f"unsubscribe() did not complete within {seconds:.1f}s")

    @bracketed_sync("subscription")
    def subscription(self) -> set[str]:
        return set(self._topics)

    @bracketed_sync("assignment")
    def assignment(self) -> set[TopicPartition]:
        """The partitions the broker currently lets this member fetch from."""
        engine = self._engine
        return set(engine.membership.assignment()) if engine is not None else set()

    @property
    def member_id(self) -> str | None:
        return self._engine.membership.member_id if self._engine is not None else None

    def metrics(self) -> ShareConsumerMetrics:
        """A snapshot of the share consumer's counters: records handed out, ShareFetch requests and
        the records they acquired, acknowledgements confirmed and failed, the member, connections
        (docs/metrics.md).  Assembled on each call; cheap, but not meant for a per-record loop.  Like
        ``Consumer.metrics()``, not bracketed by ``acquire``/``release``: a reporting task may call it
        while another task polls."""
        collector = self._collector
        return share_snapshot(self._running(), collector.delivered.total(), collector.deserializers.skipped.total())

    @bracketed("client_instance_id")
    async def client_instance_id(self, timeout: float | None = None) -> uuid.UUID | None:
        """The id the cluster gave this share consumer for its pushed metrics (KIP-714, Java's
        ``KafkaShareConsumer.clientInstanceId(Duration)``), as ``Consumer.client_instance_id``:
        waits up to ``timeout`` seconds (``default_api_timeout_ms`` by default) for it, ``None``
        if none came; ``IllegalStateError`` with ``enable_metrics_push=False``."""
        check_timeout(timeout, "client_instance_id")
        seconds = self._config.default_api_timeout_ms / 1000 if timeout is None else timeout
        return await self._client_instance_id(self._running(), seconds)

    # -- acknowledgements -------------------------------------------------------------------------------

    def set_acknowledgement_commit_callback(self, callback: AcknowledgementCommitCallback | None) -> None:
        """Call ``callback({partition: AcknowledgementResult(offsets, error)})`` when the broker has
        answered acknowledgements (Java's ``setAcknowledgementCommitCallback``); ``None`` stops it.

        It runs in the application's task, at the start of the next poll (``getmany``, or
        ``async for`` fetching its next batch), at the end of ``commit()`` and in ``close()``, for
        every acknowledgement answered since, whether it rode on a ShareFetch, a ShareAcknowledge,
        ``commit()`` or ``close()``.  A partition answered twice in that time comes in two calls.
        What it raises comes out of that poll or ``commit()`` (``close()`` logs it)."""
        if callback is not None and not callable(callback):
            raise ConfigError(f"on_acknowledgement_commit must be callable, not {callback!r}")
        self._collector.on_commit = callback

    @typing.overload
    def acknowledge(
        self, record: ShareConsumerRecord[KT, VT], type: AcknowledgeType = AcknowledgeType.ACCEPT
    ) -> None: ...

    @typing.overload
    def acknowledge(self, topic: str, partition: int, offset: int, type: AcknowledgeType, /) -> None: ...

    @bracketed_sync("acknowledge")
    def acknowledge(
        self,
        record: ShareConsumerRecord[KT, VT] | str,
        type: AcknowledgeType | int = AcknowledgeType.ACCEPT,
        offset: int | None = None,
        kind: AcknowledgeType | None = None,
    ) -> None:
        """Acknowledge a record handed out by the last poll; sent with the next fetch or ``commit()``.

        ``acknowledge(record, type)``, or by coordinates ``acknowledge(topic, partition, offset,
        type)`` as Java's ``KafkaShareConsumer``: that form also takes a record of the last poll
        that could not be deserialized (the poll raised ``RecordDeserializationError`` naming it),
        which is otherwise released at the next poll: ``AcknowledgeType.REJECT`` keeps it from
        coming back.  RENEW keeps a record acquired (and needs a later ACCEPT/RELEASE/REJECT); a
        record whose lock already ran out raises ``AcquisitionLockExpiredError`` (the broker gave
        it back); anything else raises ``IllegalStateError``."""
        engine = self._engine
        if engine is None or self._closed or engine.closed or not engine.running:  # _running()'s checks, no call
            engine = self._running()  # raises, saying why
        if isinstance(record, str):  # (topic, partition, offset, type): ``type`` holds the partition
            partition = type
            if isinstance(partition, (bool, AcknowledgeType)) or not isinstance(partition, int):
                raise ConfigTypeError(f"acknowledge(): partition must be an int, got {partition!r}")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ConfigTypeError(f"acknowledge(): offset must be an int, got {offset!r}")
            if kind is None:
                raise ConfigTypeError("acknowledge(topic, partition, offset, type): the AcknowledgeType is required")
            self._collector.acknowledge_at(engine, record, partition, offset, AcknowledgeType(kind))
            return
        if offset is not None or kind is not None:
            raise ConfigTypeError("acknowledge() takes (record, type) or (topic, partition, offset, type)")
        ack_type = type if type.__class__ is AcknowledgeType else AcknowledgeType(type)  # no call for one
        self._collector.acknowledge(engine, record, ack_type)

    @bracketed_sync("acquisition_lock_timeout_ms")
    def acquisition_lock_timeout_ms(self) -> int | None:
        """How long the broker locks a record acquired by this member (the group's
        ``share.record.lock.duration.ms``), in milliseconds, as the broker last said it in a
        ShareFetch or ShareAcknowledge answer; None before the first (Java's
        ``acquisitionLockTimeoutMs``)."""
        engine = self._engine
        timeout = engine.fetcher.lock_timeout if engine is not None else 0.0
        return round(timeout * 1000) if timeout > 0 else None

    def lock_deadline(self, record: ShareConsumerRecord[KT, VT]) -> float:
        """When ``record``'s acquisition lock runs out (``time.monotonic()`` clock), renewals included."""
        return self._collector.lock_deadline(record)

    @bracketed("commit")
    async def commit(self, *, timeout: float | None = None) -> dict[TopicPartition, KafkaError | None]:
        """Send the queued acknowledgements now and wait for the broker: each partition's outcome,
        ``None`` for success or the typed error (``InvalidRecordStateError`` for a lock that ran out,
        say).  In implicit mode the records handed out so far are accepted first.  Waits up to
        ``timeout`` seconds (None: ``default_api_timeout_ms``), then raises ``KafkaTimeoutError``."""
        engine = self._running()
        seconds = self._config.default_api_timeout_ms / 1000 if timeout is None else timeout
        return await self._collector.commit(engine, seconds)

    # -- polling ----------------------------------------------------------------------------------------

    @bracketed("getmany")
    async def getmany(
        self, *, timeout: float | None = None, max_records: int | None = None
    ) -> dict[TopicPartition, list[ShareConsumerRecord[KT, VT]]]:
        """The next records by partition, waiting up to ``timeout`` seconds (None: until some arrive).

        A poll: implicit mode accepts the records handed out before; explicit mode raises
        ``AcknowledgementRequiredError`` if any of them is not acknowledged."""
        collector = self._collector
        limit = max_records or self._config.max_poll_records
        return collector.hand_out_all(await collector.poll(self._reading("getmany()"), limit, timeout))

    def __aiter__(self) -> AsyncIterator[ShareConsumerRecord[KT, VT]]:
        return self

    async def __anext__(self) -> ShareConsumerRecord[KT, VT]:
        """The next record; when the current batch runs out, the next batch is a poll (see getmany)."""
        if self._pending and self._default_hooks and self._poll_owner.task is None:
            # Handed out without acquire()/release() (the default ones): no await, so no other
            # task can see the consumer in between.
            return self._collector.hand_out(self._pending.popleft())
        return self._collector.hand_out(await self._next_record())

    async def _next_record(self) -> ShareConsumerRecord[KT, VT]:
        self.acquire("__anext__")
        try:
            if not self._pending:
                engine = self._reading("async for")
                self._pending.extend(await self._collector.poll(engine, self._config.max_poll_records, None))
            return self._pending.popleft()
        except ConsumerClosedError as exc:
            if self._closed:
                raise StopAsyncIteration from None
            raise exc
        finally:
            self.release("__anext__")

    @bracketed("wait_for_assignment")
    async def wait_for_assignment(self, timeout: float = 30.0) -> set[TopicPartition]:
        """Wait until the broker has assigned this member at least one partition."""
        engine = self._running()
        with anyio.move_on_after(timeout):
            await self._until(engine, lambda: bool(engine.membership.is_member and engine.membership.assignment()))
            return self.assignment()
        raise KafkaTimeoutError(f"no share-group assignment within {timeout}s")


__all__ = [
    "ShareAcquireMode",
    "AcknowledgementCommitCallback",
    "AcknowledgementResult",
    "AcknowledgeType",
    "ShareAcknowledgementMode",
    "ShareConsumer",
    "ShareConsumerRecord",
]
