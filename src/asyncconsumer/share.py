"""The share consumer (KIP-932, "queues for Kafka"): records handed out one member at a time,
each acknowledged (accept, release for redelivery, reject, renew the lock).

    async with ShareConsumer(bootstrap_servers="...", group_id="workers",
                             share_acknowledgement_mode="explicit") as consumer:
        consumer.subscribe(["jobs"])
        async for record in consumer:
            ...
            consumer.acknowledge(record, AcknowledgeType.ACCEPT)

See docs/share-groups.md.  The background loop (``engine/share_loop.py``) owns every request;
this side hands records out, queues acknowledgements and waits on results.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import time
import weakref
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, Literal, NamedTuple, Unpack, cast

import anyio
import anyio.abc
from typing_extensions import TypeVar

from . import otel
from .app.client import ClientBase, bracketed, bracketed_sync
from .app.collector import RecordDeserializationError
from .app.metrics import share_snapshot
from .config import ConsumerConfig, ConsumerOptions, build_config, options_from_properties
from .engine.share_loop import ShareEngine
from .errors import (
    AcknowledgementRequiredError,
    AcquisitionLockExpiredError,
    ConfigError,
    ConfigTypeError,
    ConsumerClosedError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
)
from .managers.share_fetch import AckResults, ShareBatch
from .metrics import ShareConsumerMetrics
from .structs import TopicPartition

log = logging.getLogger("asyncconsumer.share")

KT = TypeVar("KT", default=bytes)
VT = TypeVar("VT", default=bytes)
ShareAcknowledgementMode = Literal["implicit", "explicit"]
#: KIP-1206 (ShareFetch v2): "batch_optimized" acquires whole record batches (a poll's acquisition
#: may pass ``max_poll_records``); "record_limit" acquires at most ``max_poll_records`` records.
ShareAcquireMode = Literal["batch_optimized", "record_limit"]
_ACQUIRE_MODES: dict[str, int] = {"batch_optimized": 0, "record_limit": 1}


class AcknowledgeType(enum.IntEnum):
    """How a share consumer acknowledges a record (the protocol's values)."""

    #: Processed: the record is done for the whole group.
    ACCEPT = 1
    #: Not processed: give it back for another delivery (``delivery_count`` grows).
    RELEASE = 2
    #: Cannot be processed: archive it, never deliver it again.
    REJECT = 3
    #: Still working: extend the acquisition lock (KIP-1222; brokers with ShareAcknowledge v2).
    RENEW = 4


class ShareConsumerRecord(NamedTuple, Generic[KT, VT]):
    """A record as a share consumer hands it out: a ``ConsumerRecord`` plus the delivery count and
    the acquisition lock's deadline."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: KT | None
    value: VT | None
    serialized_key_size: int
    serialized_value_size: int
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int | None = None
    #: 1 on the first delivery, 2 after one release or lock expiry, ...
    delivery_count: int = 1
    #: When the acquisition lock runs out, on ``time.monotonic()``'s clock (computed when the
    #: records arrived, so slightly later than the broker's own deadline).
    lock_deadline: float = 0.0

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class AcknowledgementResult(NamedTuple):
    """What the broker did with one partition's acknowledgements (``on_acknowledgement_commit``)."""

    #: The acknowledged offsets (ACCEPT, RELEASE, REJECT and RENEW alike), ascending.
    offsets: tuple[int, ...]
    #: ``None``: committed; else the typed error (``InvalidRecordStateError`` for a lock that ran out,
    #: say): none of ``offsets`` took effect.
    error: KafkaError | None


#: ``on_acknowledgement_commit``: a plain function or a coroutine function; it gets the outcome of
#: each partition whose acknowledgements the broker answered, whichever request carried them.
AcknowledgementCommitCallback = Callable[[dict[TopicPartition, AcknowledgementResult]], Awaitable[None] | None]

_Key = tuple[str, int, int]
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
        *,
        share_acknowledgement_mode: ShareAcknowledgementMode = "implicit",
        on_acknowledgement_commit: AcknowledgementCommitCallback | None = None,
        share_acquire_mode: ShareAcquireMode = "batch_optimized",
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if share_acknowledgement_mode not in ("implicit", "explicit"):
            raise ConfigError(
                f"share_acknowledgement_mode must be 'implicit' or 'explicit', not {share_acknowledgement_mode!r}"
            )
        super().__init__()
        if share_acquire_mode not in _ACQUIRE_MODES:
            raise ConfigError(
                f"share_acquire_mode must be 'batch_optimized' or 'record_limit', not {share_acquire_mode!r}"
            )
        self.acquire_mode: ShareAcquireMode = share_acquire_mode
        self._config: ConsumerConfig = build_config(options)
        if self._config.group_id is None:
            raise ConfigError("a share consumer needs a group_id (the share group's name)")
        self.acknowledgement_mode: ShareAcknowledgementMode = share_acknowledgement_mode
        self._on_ack_commit: AcknowledgementCommitCallback | None = None
        self.set_acknowledgement_commit_callback(on_acknowledgement_commit)
        self._engine: ShareEngine | None = None
        self._topics: frozenset[str] = frozenset()
        self._pending: deque[ShareConsumerRecord[KT, VT]] = deque()
        self._unacked: dict[_Key, ShareConsumerRecord[KT, VT]] = {}
        self._renewed: dict[_Key, float] = {}
        self._closed = False
        #: Records handed to the application, per partition (metrics() and OpenTelemetry).
        self._delivered: Counter[TopicPartition] = Counter()

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
        self._engine = ShareEngine(
            self._config, max_records=self._config.max_poll_records, acquire_mode=_ACQUIRE_MODES[self.acquire_mode]
        )
        # OpenTelemetry (asyncconsumer.otel): records handed out and request durations; no lag.
        ref = weakref.ref(self)
        telemetry = otel.telemetry_for(
            self._config, None, lambda: dict(c._delivered) if (c := ref()) is not None else {}
        )
        otel.attach(self._engine, telemetry)
        return self._engine

    async def _bootstrap(self) -> None:
        engine = self._running()
        await engine.wait_for_metadata(self._config.request_timeout_ms / 1000)
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
            implicit = self.acknowledgement_mode == "implicit"
            unacked = list(self._unacked.values())
            self._unacked.clear()
            undelivered = list(self._pending)
            self._pending.clear()

            def release(now: float) -> None:
                fetcher = engine.fetcher
                for r in unacked:
                    fetcher.acknowledge(r.topic_partition, r.offset, 1 if implicit else 2)
                for r in undelivered:
                    fetcher.acknowledge(r.topic_partition, r.offset, 2)
                while engine.batches:
                    batch = engine.batches.popleft()
                    for a in batch.records:
                        fetcher.acknowledge(batch.tp, a.record.offset, 2)
                fetcher.start_closing()

            try:
                await engine.call(release)
                await self._until(engine, lambda: engine.fetcher.done_closing)
                try:
                    await self._report_acknowledgements(engine)
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
        return share_snapshot(self._running(), sum(self._delivered.values()))

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
        self._on_ack_commit = callback

    async def _report_acknowledgements(self, engine: ShareEngine) -> None:
        """Hand the acknowledgement outcomes collected by the loop to the callback (then forget them)."""
        outcomes, engine.fetcher.outcomes = engine.fetcher.outcomes, []
        callback = self._on_ack_commit
        if not outcomes or callback is None:
            return
        calls: list[dict[TopicPartition, AcknowledgementResult]] = [{}]
        for tp, offsets, error in outcomes:
            if tp in calls[-1]:
                calls.append({})
            calls[-1][tp] = AcknowledgementResult(offsets, error)
        for results in calls:
            result = callback(results)
            if inspect.isawaitable(result):
                await result

    @bracketed_sync("acknowledge")
    def acknowledge(self, record: ShareConsumerRecord[KT, VT], type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        """Acknowledge a record handed out by the last poll; sent with the next fetch or ``commit()``.

        RENEW keeps the record acquired (and needs a later ACCEPT/RELEASE/REJECT); a record whose
        lock already ran out raises ``AcquisitionLockExpiredError`` (the broker gave it back)."""
        engine = self._running()
        kind = AcknowledgeType(type)
        key = (record.topic, record.partition, record.offset)
        if key not in self._unacked:
            raise IllegalStateError(
                f"{record.topic}-{record.partition} offset {record.offset} is not a record this consumer "
                "handed out and has not acknowledged yet"
            )
        deadline = self.lock_deadline(record)
        now = time.monotonic()
        if deadline and now > deadline:
            del self._unacked[key]
            self._renewed.pop(key, None)
            raise AcquisitionLockExpiredError(
                f"the acquisition lock of {record.topic}-{record.partition} offset {record.offset} ran out "
                f"{now - deadline:.1f}s ago: the record is back in the group"
            )
        if kind == AcknowledgeType.RENEW:
            # The broker restarts the lock when it gets the renewal: a little after now.
            self._renewed[key] = now + engine.fetcher.lock_timeout
        else:
            del self._unacked[key]
            self._renewed.pop(key, None)
        tp = record.topic_partition
        engine.post(lambda now: engine.fetcher.acknowledge(tp, record.offset, int(kind)))

    def lock_deadline(self, record: ShareConsumerRecord[KT, VT]) -> float:
        """When ``record``'s acquisition lock runs out (``time.monotonic()`` clock), renewals included."""
        return self._renewed.get((record.topic, record.partition, record.offset), record.lock_deadline)

    @bracketed("commit")
    async def commit(self, timeout: float | None = None) -> dict[TopicPartition, KafkaError | None]:
        """Send the queued acknowledgements now and wait for the broker: each partition's outcome,
        ``None`` for success or the typed error (``InvalidRecordStateError`` for a lock that ran out,
        say).  In implicit mode the records handed out so far are accepted first."""
        engine = self._running()
        if self.acknowledgement_mode == "implicit":
            self._accept_delivered(engine)
        waiter = await engine.call(lambda now: engine.fetcher.commit())
        with anyio.fail_after(timeout if timeout is not None else self._config.default_api_timeout_ms / 1000):
            results: AckResults = await waiter.wait()
        await self._report_acknowledgements(engine)
        return results

    def _accept_delivered(self, engine: ShareEngine) -> None:
        records = list(self._unacked.values())
        self._unacked.clear()
        if records:

            def ack(now: float) -> None:
                for r in records:
                    engine.fetcher.acknowledge(r.topic_partition, r.offset, 1)

            engine.post(ack)

    def _begin_poll(self, engine: ShareEngine) -> None:
        if self.acknowledgement_mode == "implicit":
            self._accept_delivered(engine)
        elif self._unacked:
            first = min(self._unacked)
            raise AcknowledgementRequiredError(
                f"explicit acknowledgement mode: {len(self._unacked)} record(s) of the last poll are not "
                f"acknowledged (first: {first[0]}-{first[1]} offset {first[2]}); acknowledge each before polling again"
            )

    # -- polling ----------------------------------------------------------------------------------------

    @bracketed("getmany")
    async def getmany(
        self, *, timeout: float | None = None, max_records: int | None = None
    ) -> dict[TopicPartition, list[ShareConsumerRecord[KT, VT]]]:
        """The next records by partition, waiting up to ``timeout`` seconds (None: until some arrive).

        A poll: implicit mode accepts the records handed out before; explicit mode raises
        ``AcknowledgementRequiredError`` if any of them is not acknowledged."""
        engine = self._running()
        await self._report_acknowledgements(engine)
        self._begin_poll(engine)
        limit = max_records or self._config.max_poll_records
        records = await self._poll_records(engine, limit, timeout)
        out: dict[TopicPartition, list[ShareConsumerRecord[KT, VT]]] = {}
        for r in records:
            self._unacked[(r.topic, r.partition, r.offset)] = r
            out.setdefault(r.topic_partition, []).append(r)
        for tp, handed in out.items():
            self._delivered[tp] += len(handed)
        return out

    def __aiter__(self) -> AsyncIterator[ShareConsumerRecord[KT, VT]]:
        return self

    async def __anext__(self) -> ShareConsumerRecord[KT, VT]:
        """The next record; when the current batch runs out, the next batch is a poll (see getmany)."""
        if self._pending and self._default_hooks and self._poller is None:
            # Handed out without acquire()/release() (the default ones): no await, so no other
            # task can see the consumer in between.
            record = self._pending.popleft()
        else:
            record = await self._next_record()
        self._unacked[(record.topic, record.partition, record.offset)] = record
        self._delivered[record.topic_partition] += 1
        return record

    async def _next_record(self) -> ShareConsumerRecord[KT, VT]:
        self.acquire("__anext__")
        try:
            if not self._pending:
                engine = self._running()
                await self._report_acknowledgements(engine)
                self._begin_poll(engine)
                self._pending.extend(await self._poll_records(engine, self._config.max_poll_records, None))
            return self._pending.popleft()
        except ConsumerClosedError as exc:
            if self._closed:
                raise StopAsyncIteration from None
            raise exc
        finally:
            self.release("__anext__")

    async def _poll_records(
        self, engine: ShareEngine, limit: int, timeout: float | None
    ) -> list[ShareConsumerRecord[KT, VT]]:
        deadline = None if timeout is None else anyio.current_time() + timeout
        while True:
            error = engine.pop_error()
            if error is not None:
                raise error
            if engine.batches:
                return self._take(engine, limit)
            engine.check_running()
            event = engine.app_event()
            if engine.has_news:
                continue
            if deadline is None:
                await event.wait()
            else:
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return []
                with anyio.move_on_after(remaining):
                    await event.wait()

    def _take(self, engine: ShareEngine, limit: int) -> list[ShareConsumerRecord[KT, VT]]:
        out: list[ShareConsumerRecord[KT, VT]] = []
        counts: dict[int, int] = {}
        freed: dict[int, int] = {}
        key_fn, value_fn = self._config.key_deserializer, self._config.value_deserializer
        bad: RecordDeserializationError | None = None
        while engine.batches and len(out) < limit and bad is None:
            batch: ShareBatch = engine.batches[0]
            taken = 0  # of the batch's records: handed out, or released as undecodable
            for a in batch.records[: limit - len(out)]:
                taken += 1
                r = a.record
                key: Any = r.key
                value: Any = r.value
                try:
                    if key_fn is not None and key is not None:
                        key = key_fn(key)
                    if value_fn is not None and value is not None:
                        value = value_fn(value)
                except Exception as exc:
                    # Released: it comes back (delivery_count + 1) until the group's delivery
                    # limit archives it.  The records after it stay for the poll after the error.
                    bad = RecordDeserializationError(
                        f"deserializing the record failed: {exc!r}; it was released",
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                    )
                    engine.post(functools.partial(_release, engine, batch.tp, r.offset))
                    break
                out.append(
                    cast(
                        "ShareConsumerRecord[KT, VT]",
                        ShareConsumerRecord(
                            r.topic,
                            r.partition,
                            r.offset,
                            r.timestamp,
                            r.timestamp_type,
                            key,
                            value,
                            r.serialized_key_size,
                            r.serialized_value_size,
                            r.headers,
                            r.leader_epoch,
                            a.delivery_count,
                            a.lock_deadline,
                        ),
                    )
                )
            del batch.records[:taken]
            if not batch.records:
                engine.batches.popleft()
                freed[batch.node_id] = freed.get(batch.node_id, 0) + batch.size
            counts[batch.node_id] = counts.get(batch.node_id, 0) + taken
        if counts or freed:

            def handed(now: float) -> None:
                for node in counts.keys() | freed.keys():
                    engine.fetcher.records_handed_out(node, counts.get(node, 0), freed.get(node, 0))

            engine.post(handed)
        if bad is not None and not out:
            raise bad
        if bad is not None:
            engine.report_error(bad)
        return out

    @bracketed("wait_for_assignment")
    async def wait_for_assignment(self, timeout: float = 30.0) -> set[TopicPartition]:
        """Wait until the broker has assigned this member at least one partition."""
        engine = self._running()
        with anyio.move_on_after(timeout):
            await self._until(engine, lambda: bool(engine.membership.is_member and engine.membership.assignment()))
            return self.assignment()
        raise KafkaTimeoutError(f"no share-group assignment within {timeout}s")


def _release(engine: ShareEngine, tp: TopicPartition, offset: int, now: float) -> None:
    engine.fetcher.acknowledge(tp, offset, AcknowledgeType.RELEASE)


__all__ = [
    "ShareAcquireMode",
    "AcknowledgementCommitCallback",
    "AcknowledgementResult",
    "AcknowledgeType",
    "ShareAcknowledgementMode",
    "ShareConsumer",
    "ShareConsumerRecord",
]
