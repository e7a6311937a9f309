"""The public ``Consumer``: the application side of the engine.

Every public call is bracketed by ``acquire()``/``release()`` (KIP-957), packs
its work as an application event for the background loop when it needs the
network, and hands the application-side work to app/ (the fetch collector,
the rebalance runner, per-partition streams).  See docs/architecture.md for
the whole picture.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from types import MethodType
from typing import Any, Generic, Never, NoReturn, ParamSpec, Unpack, cast, overload

import anyio
import anyio.abc
from typing_extensions import TypeVar

from ._args import (
    check_commit_offsets,
    check_offset,
    check_pattern,
    check_positive_int,
    check_timeout,
    check_timestamps,
    check_topic,
    check_topic_partitions,
    check_topics,
)
from ._runtime import current_async_library
from .app.arrow import ARROW_BATCH_RECORDS, ColumnDecoder, check_column_decoder, require_pyarrow, take_arrow_batch
from .app.client import ClientBase, bracketed, bracketed_sync, check_keyword_only
from .app.collector import Collector
from .app.iterators import RecordStream, Steps, ready
from .app.metrics import snapshot as metrics_snapshot
from .app.rebalance import RebalanceRunner, RevokeHook, commit_now, consumed_offsets, names
from .app.streams import PartitionStream, PartitionStreams
from .config import ConsumerConfig, ConsumerOptions, build_config, options_from_properties
from .engine.loop import Engine
from .errors import (
    CommitFailedError,
    ConfigError,
    ConfigTypeError,
    ConsumerClosedError,
    IllegalStateError,
    InvalidGroupIdError,
    KafkaError,
    KafkaTimeoutError,
    RecordDeserializationError,
)
from .listener import RebalanceListener
from .managers.list_offsets import EARLIEST, LATEST, OffsetResult
from .managers.member_base import MEMBERSHIP_OPERATIONS, MembershipOperation
from .managers.membership import MemberState
from .managers.subscription import PartitionState
from .metrics import ConsumerMetrics
from .otel import attach as attach_telemetry
from .otel import telemetry_for
from .structs import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

log = logging.getLogger("asyncconsumer.consumer")

# Defaults (PEP 696) let ``Consumer(...)`` without deserializers type as Consumer[bytes, bytes].
KT = TypeVar("KT", default=bytes)
VT = TypeVar("VT", default=bytes)
P = ParamSpec("P")
R = TypeVar("R")

#: Said once per process (INFO), when a group member starts with the default group_protocol.
_DEFAULT_PROTOCOL_NOTICE = (
    "group_protocol is 'classic', the default as in Kafka 4.x's Java client; with Kafka 5.0 (KIP-1274) the "
    "default becomes 'consumer' (KIP-848). Set group_protocol to keep your choice (docs/groups.md#kafka-50)"
)
_default_protocol_said = False

_POLL_OPERATIONS = frozenset(
    {"getmany", "getone", "__anext__", "batches", "partitions", "arrow_batches", "arrow_batch"}
)


class Consumer(ClientBase, Generic[KT, VT]):
    """An Apache Kafka consumer for asyncio and trio.

    Options are keyword arguments with Kafka's names in snake_case (``ConsumerOptions``
    documents each, docs/configuration.md at length); ``Consumer.from_properties`` takes
    dotted names.
    Use it as ``async with Consumer(...) as consumer:`` (asyncio and trio), or
    ``await consumer.start()`` / ``await consumer.close()`` on asyncio.
    """

    KIND = "consumer"
    POLL_OPERATIONS = _POLL_OPERATIONS

    def __init__(self, *args: Never, **options: Unpack[ConsumerOptions]) -> None:
        check_keyword_only("Consumer", args)
        super().__init__()
        self._config = build_config(options)
        self._engine: Engine | None = None
        self._rebalance = RebalanceRunner(self._config)
        self._collector: Collector[KT, VT] = Collector(self._config, self._rebalance, self._poll_owner)
        #: Records taken for ``async for``/``batches()`` and not handed out yet (the collector's).
        self._chunks = self._collector.chunks
        #: What ``async for`` reads per record (the collector's; ``RecordStream`` reads it too).
        self._fast_path = self._collector.fast_path
        #: No deserializers: ``async for`` may run in C (``RecordStream``).
        self._plain_records = self._collector.mode == "plain"
        #: Records in chunks are handed out as they are: no deserializers, or deserialized already
        #: ("eager" mode, app/collector.py); else each is deserialized as it is handed out.
        self._ready_records = self._collector.mode != "lazy"
        self._closing = False
        #: group_protocol was chosen, not left to its default (the Kafka 5.0 notice, ``subscribe``).
        self._protocol_chosen = "group_protocol" in options

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any], **options: Unpack[ConsumerOptions]) -> Consumer[Any, Any]:
        """Build from Java/librdkafka dotted names (``{"bootstrap.servers": ...}``); ``options`` override."""
        consumer = cls(**options_from_properties(properties, options))
        consumer._protocol_chosen = "group.protocol" in properties or "group_protocol" in options
        return consumer

    @property
    def config(self) -> ConsumerConfig:
        return self._config

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start without ``async with`` (asyncio only: trio needs a nursery, so use ``async with``)."""
        self._check_startable()
        if current_async_library() != "asyncio":
            raise IllegalStateError(
                "start()/close() without 'async with' work on asyncio only; "
                "on trio use 'async with Consumer(...) as consumer:'"
            )
        import asyncio

        engine = self._new_engine()
        self._direct_plain_calls(True)
        started = asyncio.get_running_loop().create_future()

        class _Status:
            def started(self, value: object = None) -> None:
                if not started.done():
                    started.set_result(None)

        self._runner = asyncio.create_task(engine.run(task_status=cast(Any, _Status())))
        await started
        try:
            await self._bootstrap()
        except BaseException:
            await self._shutdown(1.0)
            raise

    def _new_engine(self) -> Engine:
        self._engine = self._fast_path.engine = Engine(self._config)
        self._engine.watch_pool(self._collector.column_buffers)  # idle Arrow column buffers go back too
        # OpenTelemetry (asyncconsumer.otel): nothing at all without a meter provider to report to.
        ref = weakref.ref(self)
        telemetry = telemetry_for(
            self._config,
            lambda: c._engine if (c := ref()) is not None else None,
            lambda: c._collector.handed_out() if (c := ref()) is not None else {},
            lambda: dict(c._collector.deserializers.skipped) if (c := ref()) is not None else {},
        )
        attach_telemetry(self._engine, telemetry)
        if self._engine.telemetry is not None:  # client metrics push (KIP-714): the numbers of metrics()
            engine = self._engine
            self._engine.telemetry.source = lambda: metrics_snapshot(engine, c._collector) if (c := ref()) else None
        return self._engine

    async def _bootstrap(self) -> None:
        engine = self._running()
        await engine.wait_for_metadata(self._config.request_timeout_ms / 1000, all_topics=False)

    async def close(self, timeout: float = 30.0, *, membership: MembershipOperation = "default") -> None:
        """Commit (with auto-commit on), leave, stop the loop and close connections.

        Returns within ``timeout`` seconds, whatever the brokers do; safe to call twice.
        ``membership`` (KIP-1092, Java's ``CloseOptions.GroupMembershipOperation``): ``"default"``
        (``async with`` too) makes a dynamic member leave the group and keeps a static one
        (``group_instance_id``) in it; ``"leave_group"`` makes a static member leave too (its
        partitions move at once); ``"remain_in_group"`` keeps a dynamic member in the group too
        (its partitions wait for it until its session times out).  Either way the revoke callback
        runs and auto-commit commits first (docs/groups.md#closing).
        """
        check_timeout(timeout, "close", optional=False)
        if membership not in MEMBERSHIP_OPERATIONS:
            raise ConfigError(
                f"close(): membership must be one of {', '.join(map(repr, MEMBERSHIP_OPERATIONS))}, got {membership!r}")
        if self._closed or self._engine is None:
            self._closed = True
            return
        engine = self._engine
        self._closing = self._rebalance.closing = self._collector.closing = True
        deadline = anyio.current_time() + timeout
        # The last part of the time is kept for stopping the loop and closing connections.
        teardown = min(1.0, timeout / 4)
        try:
            with anyio.move_on_after(timeout - teardown, shield=True):
                # Partition streams stop and their tasks finish the records in hand (bounded), so
                # that the commit below covers what they processed and nothing they still hold.
                for hook in list(self._rebalance.revoke_hooks):
                    if isinstance(hook, PartitionStreams):
                        await hook.finish(self._config.rebalance_commit_wait_ms / 1000)
                # Commit what was handed out, then leave (the revoke callback commits nothing more).
                if engine.commits is not None and self._config.enable_auto_commit and not engine.closed:
                    offsets = consumed_offsets(engine)
                    if offsets:
                        try:
                            await commit_now(engine, offsets, timeout)
                        except KafkaError as exc:
                            log.warning("final auto-commit on close failed: %s", exc)
                if engine.membership is not None and not engine.closed:
                    await self._leave_group("the consumer is closing", timeout, membership)
        finally:
            self._closed = True
            await self._shutdown(max(0.0, deadline - anyio.current_time()))

    def _running(self) -> Engine:
        if self._engine is None:
            raise IllegalStateError("the consumer is not started: use 'async with' or 'await start()'")
        if self._closed:
            raise ConsumerClosedError("the consumer is closed")
        self._engine.check_running()
        return self._engine

    def _reading(self, operation: str) -> Engine:
        """The running loop, for a call that reads records: with nothing assigned or subscribed it
        would wait forever, so it raises at once, as the Java consumer's ``poll()`` does."""
        engine = self._running()
        if not engine.subscriptions.partitions and not (engine.membership is not None and engine.membership.subscribed):
            if self._closing:  # close() from another task has left the group: the read ends as closed
                raise ConsumerClosedError("the consumer is closing")
            raise IllegalStateError(
                f"{operation}: the consumer is not subscribed to any topics or assigned any partitions; "
                "call subscribe() or assign() first"
            )
        return engine

    # -- KIP-957: acquire / release (the default rule is ClientBase's) -----------------------------

    def _callback_token(self) -> object | None:
        return self._rebalance.callback_token

    # -- consumer groups --------------------------------------------------------------------------

    @bracketed_sync("subscribe")
    def subscribe(
        self,
        topics: Iterable[str] = (),
        *,
        pattern: str | re.Pattern[str] | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Join the consumer group (``group_id``) and read the partitions it assigns to this member.

        ``topics`` or a regex ``pattern`` (matched against whole topic names; topics created or
        deleted later are followed).  ``listener`` is told about partitions that move.
        """
        if isinstance(topics, str):
            topics = [topics]
        names = check_topics(topics, "subscribe")
        if pattern is None and not names:
            raise ConfigError("subscribe() needs topics or a pattern (use unsubscribe() to stop)")
        if pattern is not None and names:
            raise ConfigError("subscribe() takes topics or a pattern, not both")
        if any(not isinstance(t, str) or not t for t in names):
            raise ConfigError(f"subscribe(): topic names must be non-empty strings, got {sorted(map(repr, names))}")
        check_pattern(pattern, "subscribe")
        try:
            compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        except re.error as exc:
            raise ConfigError(f"subscribe(): invalid pattern {pattern!r}: {exc}") from None
        if listener is not None and not isinstance(listener, RebalanceListener):
            raise ConfigError("listener must be a RebalanceListener (asyncconsumer.RebalanceListener)")
        engine = self._running()
        membership = engine.membership
        if membership is None:
            raise ConfigError("subscribe() needs a group_id: partitions are shared out within a consumer group")
        if engine.subscriptions.partitions and membership.state is MemberState.UNSUBSCRIBED:
            raise IllegalStateError("subscribe() after assign(): call assign([]) first (they do not mix)")
        self._rebalance.listener = listener or RebalanceListener()
        membership.subscribe(names, compiled)
        engine.wake()
        self._say_default_protocol()

    def _say_default_protocol(self) -> None:
        """KIP-1274: once per process, that the default group_protocol changes with Kafka 5.0."""
        global _default_protocol_said
        if not self._protocol_chosen and not _default_protocol_said:
            _default_protocol_said = True
            log.info(_DEFAULT_PROTOCOL_NOTICE)

    @bracketed_sync("subscription")
    def subscription(self) -> set[str]:
        """The topics currently subscribed (for a pattern: the topics it matches now)."""
        engine = self._engine
        if engine is None or engine.membership is None:
            return set()
        return set(engine.membership.topics)

    @bracketed_sync("group_metadata")
    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group metadata a transactional producer commits this consumer's offsets with (KIP-447,
        Java's ``groupMetadata()``): ``group_id``, the generation (with ``group_protocol="consumer"``
        the member epoch), the member id and ``group_instance_id``.

        Pass ``group_metadata().for_confluent_kafka()`` to confluent-kafka's
        ``Producer.send_offsets_to_transaction`` (docs/exactly-once.md).  The broker takes the
        offsets only while this member is still the group's current owner of the partitions: a
        member that lost them (fenced, its session or ``max_poll_interval_ms`` expired, a revocation
        past its deadline) keeps reporting the membership it lost until its next poll, so a
        transaction with records from before the loss is refused and must be aborted.  Before the
        member first joined, and with ``assign()``, the generation is -1 and the member id empty.

        Raises ``InvalidGroupIdError`` without a ``group_id`` and ``ConsumerClosedError`` once closed.
        """
        group_id = self._config.group_id
        if group_id is None:
            raise InvalidGroupIdError(
                "group_metadata() needs a group_id: offsets are committed for a consumer group")
        if self._closed:
            raise ConsumerClosedError("the consumer is closed")
        membership = self._engine.membership if self._engine is not None else None
        if membership is None:  # not started yet
            return ConsumerGroupMetadata(group_id, -1, "", self._config.group_instance_id)
        return membership.group_metadata()

    @bracketed("unsubscribe")
    async def unsubscribe(self, *, timeout: float | None = None) -> None:
        """Give up every partition (the revoke callback runs and offsets are committed) and leave the group."""
        await self._leave_group("unsubscribe", self._timeout(timeout))

    async def _leave_group(self, reason: str, timeout: float, operation: MembershipOperation = "default") -> None:
        engine = self._running()
        membership = engine.membership
        if membership is None or membership.state in (MemberState.UNSUBSCRIBED, MemberState.FENCED):
            return
        membership.leave(reason, operation)
        engine.wake()
        with anyio.move_on_after(timeout):
            while membership.state not in (MemberState.UNSUBSCRIBED, MemberState.FENCED):
                event = engine.app_event()
                await self._rebalance.run_callbacks(engine, raise_errors=False)
                if membership.state in (MemberState.UNSUBSCRIBED, MemberState.FENCED):
                    break
                with anyio.move_on_after(0.05):
                    await event.wait()

    @bracketed_sync("enforce_rebalance")
    def enforce_rebalance(self, reason: str | None = None) -> None:
        """Ask for a rebalance of the group (Java's ``enforceRebalance``): with the classic protocol
        the member rejoins (``reason`` goes in its JoinGroup, which the broker logs), and the
        partitions move as the assignors say, through the listener's callbacks on later polls.
        With ``group_protocol="consumer"`` (KIP-848) the coordinator alone decides when partitions
        move: the call only logs a warning, as the Java client does.

        Raises ``IllegalStateError`` without a ``group_id`` or a ``subscribe()``.
        """
        if reason is not None and not isinstance(reason, str):
            raise ConfigTypeError(f"enforce_rebalance(): reason must be a str or None, got {reason!r}")
        engine = self._running()
        membership = engine.membership
        if membership is None or not membership.subscribed:
            raise IllegalStateError(
                "enforce_rebalance() needs a group subscription: a group_id and subscribe() (not assign())")
        membership.enforce_rebalance(reason or "rebalance enforced by user")
        engine.wake()

    # -- assignment (plain methods) ---------------------------------------------------------------

    @bracketed_sync("assign")
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (manual assignment, no group membership)."""
        tps = _check_partitions(partitions, "assign")
        engine = self._running()
        if engine.membership is not None and engine.membership.subscribed:
            raise IllegalStateError("assign() while subscribed: call unsubscribe() first (they do not mix)")
        self._collector.drop_chunks(engine)
        commits = engine.commits
        if commits is not None and self._config.enable_auto_commit:
            # Partitions given up keep what the application finished with (Java does the same).
            keep = set(tps)
            leaving = {tp: om for tp, om in commits.processed_offsets().items() if tp not in keep}
            if leaving:
                engine.post(lambda now: commits.commit(now, leaving))
        engine.subscriptions.assign(tps)
        assigned = engine.subscriptions.partitions
        engine.buffer.drop(lambda f: f.tp in assigned)
        engine.wake()

    @bracketed_sync("assignment")
    def assignment(self) -> set[TopicPartition]:
        return set(self._engine.subscriptions.partitions) if self._engine is not None else set()

    @bracketed_sync("pause")
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning (and fetching) records for these partitions until ``resume``."""
        states = self._states(partitions, "pause")
        for state in states:
            state.pause()
        engine = self._running()
        self._collector.drop_chunks(engine, {state.tp for state in states})
        engine.wake()  # a fetch held back while a paused partition's records were read may go now

    @bracketed_sync("resume")
    def resume(self, *partitions: TopicPartition) -> None:
        for state in self._states(partitions, "resume"):
            state.resume()
        self._running().wake()

    @bracketed_sync("paused")
    def paused(self) -> set[TopicPartition]:
        if self._engine is None:
            return set()
        return {tp for tp, s in self._engine.subscriptions.partitions.items() if s.paused}

    @bracketed_sync("fetch_until")
    def fetch_until(self, partition: TopicPartition, offset: int | None) -> None:
        """Fetch ``partition`` only up to ``offset`` (``None``: no limit, the default).

        For reading a known range: the partition is fetched only while its next fetch offset is
        below ``offset``, so the consumer reads about one fetch (``max_partition_fetch_bytes``, or
        one record batch if that is larger) past the range instead of filling the partition's
        share of ``fetch_buffer_bytes``.  Records at and past ``offset`` that came in the fetch
        that reached it are still returned, as Kafka serves whole record batches: stop taking them
        at ``offset`` yourself.  Seeks keep the limit (a seek back below it fetches again), and so
        does an ``assign()`` that keeps the partition; it lasts until it is changed or the
        partition is unassigned (with ``subscribe()``, set it again in ``on_partitions_assigned``)."""
        end = None if offset is None else check_offset(offset, "fetch_until")
        for state in self._states([partition], "fetch_until"):
            state.fetch_until(end)
        self._running().wake()

    @bracketed_sync("highwater")
    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark of an assigned partition as of its last fetch response (None before
        one arrived): the offset the next produced record gets.  Lag is ``highwater - position``."""
        mark = self._states([partition], "highwater")[0].high_watermark
        return mark if mark >= 0 else None

    @bracketed_sync("last_stable_offset")
    def last_stable_offset(self, partition: TopicPartition) -> int | None:
        """Like ``highwater()``, for the last stable offset (what ``read_committed`` can read up to)."""
        mark = self._states([partition], "last_stable_offset")[0].last_stable_offset
        return mark if mark >= 0 else None

    @bracketed_sync("current_lag")
    def current_lag(self, partition: TopicPartition) -> int | None:
        """How many records ``partition`` has past this consumer's position, as of its last fetch
        response (Java's ``currentLag``): the high watermark, or with ``read_committed`` the last
        stable offset, minus ``position()``.  No request is sent: None until a fetch response for
        the partition arrived and while its position is not known (Java's empty ``OptionalLong``).
        Raises ``IllegalStateError`` for a partition not assigned to this consumer."""
        state = self._states([partition], "current_lag")[0]
        read_committed = self._config.isolation_level == "read_committed"
        end = state.last_stable_offset if read_committed else state.high_watermark
        if end < 0 or not state.has_position:
            return None
        return end - state.consumed

    def metrics(self) -> ConsumerMetrics:
        """A snapshot of the consumer's counters: per partition offsets and lag, records and bytes
        handed out, fetches, rebalances, commits, connections, the age of the last poll
        (docs/metrics.md).  Assembled on each call; cheap, but not meant for a per-record loop."""
        return metrics_snapshot(self._running(), self._collector)

    @bracketed("client_instance_id")
    async def client_instance_id(self, timeout: float | None = None) -> uuid.UUID | None:
        """The id the cluster gave this consumer for its pushed metrics (KIP-714, Java's
        ``clientInstanceId(Duration)``): what a broker's telemetry plugin sees the pushes come
        with, to find this client's metrics there.  Waits up to ``timeout`` seconds
        (``default_api_timeout_ms`` by default; 0: only what is known now) for the first
        GetTelemetrySubscriptions answer after start; ``None`` if none came, or the cluster does
        not take pushed metrics.  Kafka's tools print it as URL-safe base64:
        ``base64.urlsafe_b64encode(id.bytes).rstrip(b"=")``.  ``IllegalStateError`` with
        ``enable_metrics_push=False``.  See docs/metrics.md."""
        check_timeout(timeout, "client_instance_id")
        return await self._client_instance_id(self._running(), self._timeout(timeout))

    def _states(self, partitions: Iterable[TopicPartition], operation: str) -> list[PartitionState]:
        engine = self._running()
        states = []
        for tp in _check_partitions(partitions, operation):
            state = engine.subscriptions.get(tp)
            if state is None:
                raise IllegalStateError(f"{operation}: partition {tp} is not assigned to this consumer")
            states.append(state)
        return states

    # -- positions --------------------------------------------------------------------------------

    @bracketed("seek")
    async def seek(self, partition: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """Make ``offset`` the next record returned for ``partition``.

        An ``OffsetAndMetadata`` with a ``leader_epoch`` (a committed offset, or one saved from a
        record's ``leader_epoch``) is checked against the leader's log before fetching, as Java's
        ``seek(TopicPartition, OffsetAndMetadata)`` does (KIP-320): if the log was truncated under
        it, the consumer resumes where the log diverged, or with ``auto_offset_reset="none"``
        raises ``LogTruncationError`` (docs/getting-started.md#log-truncation).  Without an epoch,
        no check."""
        epoch: int | None = None
        if isinstance(offset, OffsetAndMetadata):
            epoch = offset.leader_epoch
            if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
                raise ConfigError(f"seek(): leader_epoch must be an int >= 0 or None, got {epoch!r}")
            offset = offset.offset
        check_offset(offset, "seek")
        state = self._states([partition], "seek")[0]
        engine = self._running()
        engine.validator.seek(state, offset, epoch)
        self._collector.forget_buffered(engine, [partition])

    @bracketed("seek_to_committed")
    async def seek_to_committed(
        self, *partitions: TopicPartition, timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """Move each partition (all assigned partitions when none are given) to the group's
        committed offset, as aiokafka's ``seek_to_committed``; returns the committed offsets (None
        where there is none: that partition stays where it is).  A committed offset carrying a
        leader epoch is checked against the leader's log, as on a restart (KIP-320).  Raises
        ``IllegalStateError`` without a ``group_id`` or for a partition not assigned."""
        engine = self._running()
        tps = list(partitions) or list(engine.subscriptions.partitions)
        self._states(tps, "seek_to_committed")
        if engine.commits is None:
            raise IllegalStateError("seek_to_committed() needs a group_id: offsets are committed per consumer group")
        committed = await self.committed(tps, timeout=timeout)
        moved = []
        for tp, om in committed.items():
            state = engine.subscriptions.get(tp)
            if om is not None and state is not None:  # (unassigned by a rebalance meanwhile: left alone)
                engine.validator.seek(state, om.offset, om.leader_epoch)
                moved.append(tp)
        self._collector.forget_buffered(engine, moved)
        return {tp: om.offset if om is not None else None for tp, om in committed.items()}

    @bracketed("seek_to_beginning")
    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the earliest offset (all assigned partitions when none are given)."""
        self._seek_to(partitions, "earliest", "seek_to_beginning")

    @bracketed("seek_to_end")
    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the end: only records produced from now on are returned."""
        self._seek_to(partitions, "latest", "seek_to_end")

    def _seek_to(self, partitions: tuple[TopicPartition, ...], where: str, operation: str) -> None:
        engine = self._running()
        tps = list(partitions) or list(engine.subscriptions.partitions)
        self._states(tps, operation)
        for tp in tps:
            engine.subscriptions.request_reset(tp, where)
        self._collector.forget_buffered(engine, tps)

    @bracketed("position")
    async def position(self, partition: TopicPartition, *, timeout: float | None = None) -> int:
        """The offset of the next record returned for ``partition`` (waits for it to be known)."""
        state = self._states([partition], "position")[0]
        engine = self._running()
        with anyio.move_on_after(self._timeout(timeout)):
            while True:
                event = engine.app_event()
                self._collector.raise_background_error(engine)
                if state.has_position:
                    return state.consumed
                await event.wait()
        raise KafkaTimeoutError(f"the position of {partition} was not known within {self._timeout(timeout):.1f}s")

    # -- offsets lookups --------------------------------------------------------------------------

    @bracketed("beginning_offsets")
    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        results = await self._list_offsets(
            {tp: EARLIEST for tp in _check_partitions(partitions, "beginning_offsets")}, timeout
        )
        return {tp: r[0] if r is not None else -1 for tp, r in results.items()}

    @bracketed("end_offsets")
    async def end_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The offset after the last record: the high watermark, or with ``read_committed`` the last
        stable offset (the first record of the oldest open transaction), as in the Java client."""
        results = await self._list_offsets({tp: LATEST for tp in _check_partitions(partitions, "end_offsets")}, timeout)
        return {tp: r[0] if r is not None else -1 for tp, r in results.items()}

    @bracketed("offsets_for_times")
    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], *, timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the first offset whose timestamp is >= the given one (ms)."""
        check_timestamps(timestamps)
        results = await self._list_offsets(dict(timestamps), timeout)
        return {tp: OffsetAndTimestamp(*r) if r is not None else None for tp, r in results.items()}

    async def _list_offsets(
        self, timestamps: dict[TopicPartition, int], timeout: float | None
    ) -> dict[TopicPartition, OffsetResult]:
        engine = self._running()
        waiter = await engine.call(lambda now: engine.offsets.lookup(timestamps))
        seconds = self._timeout(timeout)
        with anyio.move_on_after(seconds):
            return await waiter.wait()
        waiter.set_exception(KafkaTimeoutError("cancelled"))
        raise engine.unreachable_or_timeout("ListOffsets", seconds)

    # -- commits ----------------------------------------------------------------------------------

    @bracketed("commit")
    async def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None, *, timeout: float | None = None
    ) -> None:
        """Commit ``offsets`` (the *next* offset to read), or the positions of every record returned so far."""
        given = check_commit_offsets(offsets) if offsets is not None else {}
        engine = self._running()
        if engine.commits is None:
            raise IllegalStateError("commit() needs a group_id: offsets are stored per consumer group")
        if offsets is None:
            to_commit = consumed_offsets(engine)
        else:
            to_commit = given
        membership = engine.membership
        if membership is not None and membership.subscribed:
            # Only what this member owns, while it is a member: after a rebalance, a poll-interval
            # expiry or fencing, another member may own the partitions and commit for them.
            owned = engine.subscriptions.partitions if membership.is_member else {}
            not_owned = [tp for tp in to_commit if tp not in owned]
            if not_owned:
                raise CommitFailedError(
                    f"cannot commit {names(not_owned)}: no longer assigned to this member "
                    f"(group {self._config.group_id!r}, member state {membership.state.name}); "
                    "another member may own them now")
            if offsets is None and membership.dropped_out:
                raise CommitFailedError(
                    f"cannot commit: this consumer dropped out of group {self._config.group_id!r} (member state "
                    f"{membership.state.name}: it left after max_poll_interval_ms or was fenced) and its "
                    "partitions were reassigned; nothing was committed")
        await commit_now(engine, to_commit, self._timeout(timeout))

    @overload
    async def committed(self, partitions: TopicPartition, *, timeout: float | None = None) -> int | None: ...

    @overload
    async def committed(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]: ...

    async def committed(
        self, partitions: TopicPartition | Iterable[TopicPartition], *, timeout: float | None = None
    ) -> int | dict[TopicPartition, OffsetAndMetadata | None] | None:
        """The group's committed offsets: for one partition an int (or None), for several a dict."""
        check_timeout(timeout, "committed")
        self.acquire("committed")
        try:
            single = isinstance(partitions, TopicPartition)
            tps = _check_partitions([partitions] if single else partitions, "committed")
            engine = self._running()
            commits = engine.commits
            if commits is None:
                raise IllegalStateError("committed() needs a group_id")
            waiter = await engine.call(lambda now: commits.fetch_committed(tps))
            seconds = self._timeout(timeout)
            with anyio.move_on_after(seconds):
                result = await waiter.wait()
                if single:
                    om = result.get(tps[0])
                    return om.offset if om is not None else None
                return result
            waiter.set_exception(KafkaTimeoutError("cancelled"))
            raise KafkaTimeoutError(
                f"OffsetFetch did not complete within {seconds:.1f}s "
                f"(coordinator: {engine.coordinator.last_error if engine.coordinator else None})"
            )
        finally:
            self.release("committed")

    # -- metadata ---------------------------------------------------------------------------------

    @bracketed("topics")
    async def topics(self, *, timeout: float | None = None) -> set[str]:
        """Every topic this client may see (internal topics left out unless configured)."""
        cluster = await self._running().wait_for_metadata(self._timeout(timeout))
        return {
            name for name, t in cluster.topics.items() if not (t.is_internal and self._config.exclude_internal_topics)
        }

    @bracketed("partitions_for_topic")
    async def partitions_for_topic(self, topic: str, *, timeout: float | None = None) -> set[int] | None:
        """Partition numbers of ``topic``, or None if it does not exist."""
        check_topic(topic, "partitions_for_topic")
        cluster = await self._running().wait_for_metadata(self._timeout(timeout))
        info = cluster.topics.get(topic)
        return set(info.partitions) if info is not None else None

    # -- records ----------------------------------------------------------------------------------

    @bracketed("getmany")
    async def getmany(
        self, *partitions: TopicPartition, timeout: float | None = None, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[KT, VT]]]:
        """Records by partition: waits up to ``timeout`` seconds (None: until there are some; 0: don't wait)."""
        if max_records is not None:
            check_positive_int(max_records, "getmany", "max_records")
        limit = max_records or self._batch_limit()
        only = set(_check_partitions(partitions, "getmany")) if partitions else None
        engine = self._reading("getmany()")
        self._collector.drop_chunks(engine)
        return await self._collector.poll(engine, only, limit, timeout, mark_consumed=True)

    def _batch_limit(self) -> int:
        return self._config.max_poll_records

    def partitions(
        self, *, buffer_records: int = 1000
    ) -> AsyncIterator[tuple[TopicPartition, PartitionStream[KT, VT]]]:
        """One stream per assigned partition, for processing partitions concurrently.

        ``async for tp, stream in consumer.partitions(): tg.start_soon(work, stream)``.  Each
        stream holds at most ``buffer_records`` records; a full stream pauses its partition.
        A revoked partition's stream ends after its records are processed and committed.
        """
        check_positive_int(buffer_records, "partitions", "buffer_records")
        streams = PartitionStreams(_StreamSource(self), buffer_records)
        return Steps(functools.partial(self._next_stream, streams), on_close=streams.close)

    async def _next_stream(self, streams: PartitionStreams[KT, VT]) -> tuple[TopicPartition, PartitionStream[KT, VT]]:
        """One ``partitions()`` step, bracketed by acquire/release as a poll."""
        self.acquire("partitions")
        try:
            self._reading("partitions()")
            return await streams.__anext__()
        except ConsumerClosedError as exc:
            streams.close()
            self._end_of_iteration(exc)
        finally:
            self.release("partitions")

    def batches(self, *, max_records: int | None = None) -> AsyncIterator[list[ConsumerRecord[KT, VT]]]:
        """Records a partition at a time: ``async for batch in consumer.batches():``.

        Each item is a non-empty list of one partition's records in offset order, as many as
        are decoded and ready (at most ``max_records``, default ``max_poll_records``).  The
        fastest way to read: no per-record call.  ``commit()`` covers every batch handed out,
        as with ``getmany()``.
        """
        if max_records is not None:
            check_positive_int(max_records, "batches", "max_records")
        return Steps(functools.partial(self._next_batch, max_records or self._batch_limit()))

    def arrow_batches(
        self,
        *,
        max_records: int | None = None,
        include_headers: bool = True,
        key_format: ColumnDecoder | None = None,
        value_format: ColumnDecoder | None = None,
    ) -> AsyncIterator[Any]:
        """Records a partition at a time as ``pyarrow.RecordBatch`` (docs/arrow.md); needs pyarrow.

        ``batches()`` without a Python object per record: the fetched batches are decoded straight
        into Arrow buffers, in Spark's Kafka source schema.  At most ``max_records`` records per
        batch (default ``ARROW_BATCH_RECORDS``, 10,000); ``commit()`` covers every batch handed
        out.  Keys and values are the raw bytes (deserializers are not applied), unless
        ``key_format`` / ``value_format`` (a ``ColumnDecoder``, such as
        ``asyncconsumer.schema_registry.AvroColumns``) decodes that column into a typed one.
        Raises ``PyArrowMissingError`` when pyarrow is not installed.
        """
        if max_records is not None:
            check_positive_int(max_records, "arrow_batches", "max_records")
        formats = (check_column_decoder(key_format, "key_format"), check_column_decoder(value_format, "value_format"))
        require_pyarrow()
        limit = max_records or ARROW_BATCH_RECORDS

        async def step() -> Any:
            try:
                return await self._next_arrow_batch(limit, include_headers, formats)
            except ConsumerClosedError as exc:
                self._end_of_iteration(exc)

        return Steps(step)

    @bracketed("arrow_batches")
    async def _next_arrow_batch(
        self, limit: int, include_headers: bool, formats: tuple[ColumnDecoder | None, ColumnDecoder | None]
    ) -> Any:
        """One ``arrow_batches()`` step."""
        return await self._take_arrow_batch(limit, None, None, include_headers, formats)

    @bracketed("arrow_batch")
    async def arrow_batch(
        self,
        *partitions: TopicPartition,
        timeout: float | None = None,
        max_records: int | None = None,
        include_headers: bool = True,
        key_format: ColumnDecoder | None = None,
        value_format: ColumnDecoder | None = None,
    ) -> Any:
        """One poll as Arrow (docs/arrow.md): up to ``max_records`` records (default
        ``ARROW_BATCH_RECORDS``, 10,000) of one partition, of ``partitions`` or any, as a
        ``pyarrow.RecordBatch``; waits up to ``timeout`` seconds (None: until there are some) and
        returns None when the time passes with nothing.  ``arrow_batches()`` a step at a time, for a
        caller that keeps its own loop (the PySpark source's executors); ``key_format`` and
        ``value_format`` as there.  Raises ``PyArrowMissingError`` when pyarrow is not installed."""
        if max_records is not None:
            check_positive_int(max_records, "arrow_batch", "max_records")
        only = set(_check_partitions(partitions, "arrow_batch")) if partitions else None
        formats = (check_column_decoder(key_format, "key_format"), check_column_decoder(value_format, "value_format"))
        require_pyarrow()
        return await self._take_arrow_batch(
            max_records or ARROW_BATCH_RECORDS, timeout, only, include_headers, formats
        )

    async def _take_arrow_batch(
        self,
        limit: int,
        timeout: float | None,
        only: set[TopicPartition] | None,
        include_headers: bool,
        formats: tuple[ColumnDecoder | None, ColumnDecoder | None] = (None, None),
    ) -> Any:
        """None: ``timeout`` passed with nothing; app/arrow.py does the work."""
        engine = self._reading("arrow_batch()")
        self._collector.drop_chunks(engine)  # records taken for async for/batches() go back first
        collector = self._collector
        return await take_arrow_batch(
            collector, engine, limit, timeout, only=only, include_headers=include_headers,
            key_format=formats[0], value_format=formats[1],
        )

    @bracketed("getone")
    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord[KT, VT]:
        """The next record (from the given partitions, or any)."""
        result = await self.getmany(*partitions, timeout=None, max_records=1)
        return next(iter(result.values()))[0]

    def __aiter__(self) -> AsyncIterator[ConsumerRecord[KT, VT]]:
        # With the compiled decoder, no deserializers and the default acquire()/release() (all fixed
        # for the consumer's life), __anext__'s common case runs in C (app/iterators.RecordStream),
        # reading the same FastPath, which hands everything else to __anext__ below: the same
        # records, checks and bookkeeping.
        if RecordStream is not None and self._plain_records and self._default_hooks:
            stream = RecordStream(self._fast_path, MethodType(Consumer.__anext__, self))
            return cast("AsyncIterator[ConsumerRecord[KT, VT]]", stream)
        return self

    def __anext__(self) -> Awaitable[ConsumerRecord[KT, VT]]:
        # Fast path: the next record of the current chunk, handed out as an awaitable already
        # complete (``ready``: with the compiled decoder no coroutine, no frame, no suspension), so
        # no other task runs in between and there is no acquire()/release() while no other poll
        # is in progress.  The event loop gets its turn (a checkpoint) once per chunk, when the
        # chunks run out and ``_next_record`` polls for more.  Inlined rather than shared with
        # _next_record: a call here is a fifth of the cost per record.  What it reads is the
        # collector's FastPath, as the compiled RecordStream does.
        fast = self._fast_path
        chunks = fast.chunks
        engine = fast.engine
        if chunks and fast.owner.task is None and self._default_hooks and engine is not None and not engine.closed:
            chunk = chunks[0]
            state = chunk.state
            if state.epoch == chunk.epoch and not state.paused and not state.revoking:
                records = chunk.records
                index = chunk.index
                record = records[index]
                index += 1
                if index == len(records):
                    chunks.popleft()
                    state.handed_out(chunk.end)
                    self._collector.handed(state.tp, index)
                else:
                    chunk.index = index
                    # PartitionState.handed_out(record.offset + 1), inlined (one of the two writes to
                    # a partition's offsets outside managers/subscription.py; RecordStream's in C is
                    # the other).  The record is of a live chunk (same epoch: no seek or rewind
                    # since), so it is below the position and after what was handed out before it:
                    # the invariant holds.
                    state.consumed = record.offset + 1
                if self._ready_records:
                    return ready(record)
                decoded = self._collector.deserialize(engine, record)
                if decoded is not None:
                    return ready(decoded)
        return self._next_record()

    async def _next_record(self) -> ConsumerRecord[KT, VT]:
        self.acquire("__anext__")
        collector = self._collector
        try:
            engine = self._reading("async for")
            while True:
                chunk = collector.live_chunk()
                if chunk is not None:
                    record = chunk.records[chunk.index]
                    chunk.index += 1
                    if chunk.index == len(chunk.records):
                        self._chunks.popleft()
                        chunk.state.handed_out(chunk.end)
                        collector.handed(chunk.state.tp, chunk.index)
                    else:
                        chunk.state.handed_out(record.offset + 1)
                    if self._ready_records:
                        return cast("ConsumerRecord[KT, VT]", record)
                    decoded = collector.deserialize(engine, record)
                    if decoded is not None:
                        return decoded
                    continue  # skipped
                await collector.refill(engine, self._batch_limit())
        except ConsumerClosedError as exc:
            self._end_of_iteration(exc)
        finally:
            self.release("__anext__")

    async def _next_batch(self, limit: int) -> list[ConsumerRecord[KT, VT]]:
        self.acquire("batches")
        collector = self._collector
        try:
            engine = self._reading("batches()")
            while True:
                chunk = collector.live_chunk()
                if chunk is not None:
                    self._chunks.popleft()
                    records = chunk.records[chunk.index:] if chunk.index else chunk.records
                    tp = chunk.state.tp
                    chunk.state.handed_out(chunk.end)
                    # A deserializer error on the first record raises, a later one is deferred; empty
                    # when every record was skipped.
                    batch = (cast("list[ConsumerRecord[KT, VT]]", records) if self._ready_records
                             else collector.deserialize_many(engine, {tp: records}).get(tp, []))
                    collector.handed(tp, chunk.index + len(batch))
                    if batch:
                        return batch
                await collector.refill(engine, limit)
        except ConsumerClosedError as exc:
            self._end_of_iteration(exc)
        finally:
            self.release("batches")

    def _end_of_iteration(self, closed: ConsumerClosedError) -> NoReturn:
        """A closed consumer ends ``async for`` loops; a crashed one is an error, not an end."""
        if self._engine is not None and self._engine.fatal_error is not None:
            raise closed  # it names the failure
        raise StopAsyncIteration from None

    # -- helpers ----------------------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        return self._config.default_api_timeout_ms / 1000 if timeout is None else timeout



def _check_partitions(partitions: Iterable[Any], operation: str) -> list[TopicPartition]:
    return check_topic_partitions(partitions, operation)


class _StreamSource(Generic[KT, VT]):
    """What per-partition streams see of the consumer (``app.streams.StreamSource``)."""

    def __init__(self, consumer: Consumer[KT, VT]) -> None:
        self._consumer = consumer

    @property
    def closing(self) -> bool:
        return self._consumer._closing

    @property
    def revoke_wait(self) -> float:
        return self._consumer.config.rebalance_commit_wait_ms / 1000

    @property
    def revoke_hooks(self) -> list[RevokeHook]:
        return self._consumer._rebalance.revoke_hooks

    def partitions(self) -> Mapping[TopicPartition, PartitionState]:
        engine = self._consumer._engine
        return engine.subscriptions.partitions if engine is not None else {}

    def wake(self) -> None:
        engine = self._consumer._engine
        if engine is not None:
            engine.wake()

    def notify(self) -> None:
        engine = self._consumer._engine
        if engine is not None:
            engine.notify_app()

    async def take(self) -> dict[TopicPartition, list[ConsumerRecord[KT, VT]]]:
        consumer = self._consumer
        collector = consumer._collector
        taken = await collector.poll(consumer._running(), None, consumer._batch_limit(), 0.2, mark_consumed=False,
                                     return_on_wake=True)
        for tp, records in taken.items():
            collector.handed(tp, len(records))
        return taken


__all__ = ["Consumer", "RecordDeserializationError"]
