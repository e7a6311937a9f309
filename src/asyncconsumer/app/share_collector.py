"""The share collector: records from the share loop to the application, and the ledger of what
was handed out and not acknowledged yet.

The share consumer's twin of ``collector.py``.  A poll (``poll``) first hands the
acknowledgement outcomes the loop collected to the application's callback, then settles the last
poll's records (implicit mode accepts them; explicit mode refuses to poll while any is not
acknowledged), then takes up to a limit of acquired records from the loop's batches,
deserializing them (``Deserializers``, app/deserializers.py: synchronously for ``f(data)``
callables, else awaiting on the polling task, the batches left as they are until nothing awaits
any more, so that a ``close()`` meanwhile releases them all).  A record no deserializer can read
goes by the ``on_deserialization_error`` policy: "raise" raises and releases it at the next poll
or commit (it comes back with a higher delivery count) unless the application acknowledges it by
its coordinates first (REJECT, say), as Java's share consumer lets it; "skip", or a handler that
returned, REJECTs it.  Every record
handed out enters the ledger until it is acknowledged; ``acknowledge``, ``commit`` and
``close_out`` queue the acknowledgements for the loop, which sends them.  It
talks to the engine only (``ShareEngine``: its batches, fetcher and wake-ups), never to
``ShareConsumer`` internals.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from itertools import groupby
from operator import itemgetter
from typing import Any, Generic, Literal, NamedTuple, cast

import anyio
from typing_extensions import TypeVar

from ..config import ConsumerConfig
from ..engine.share_loop import ShareEngine
from ..errors import (
    AcknowledgementRequiredError,
    AcquisitionLockExpiredError,
    ConsumerClosedError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    RecordDeserializationError,
)
from ..managers.share_fetch import AckResults, ShareBatch
from ..structs import AcknowledgeType, ShareConsumerRecord, TopicPartition
from .deserializers import Deserializers, Pending

KT = TypeVar("KT", default=bytes)
VT = TypeVar("VT", default=bytes)

#: ``share_acknowledgement_mode``: "implicit" accepts every record handed out at the next poll;
#: "explicit" needs each acknowledged before the next poll.
ShareAcknowledgementMode = Literal["implicit", "explicit"]


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

#: A record in the ledger: (topic, partition, offset).
_Key = tuple[str, int, int]

log = logging.getLogger("asyncconsumer.share")
#: What skipping an undeserializable record does to it (the log line says so).
REJECTED = "rejected"


_RENEW = AcknowledgeType.RENEW
#: A record's (or a ledger key's) topic and partition, its ledger key, and a key's offset.
_PARTITION = itemgetter(0, 1)
_COORDINATES = itemgetter(0, 1, 2)
_OFFSET = itemgetter(2)


class ShareCollector(Generic[KT, VT]):
    """Takes acquired records from the share loop for one share consumer and keeps its ledger."""

    def __init__(self, config: ConsumerConfig, mode: ShareAcknowledgementMode) -> None:
        self._config = config
        self.mode: ShareAcknowledgementMode = mode
        self.on_commit: AcknowledgementCommitCallback | None = None
        #: Records taken for ``async for`` and not handed out yet.
        self.pending: deque[ShareConsumerRecord[KT, VT]] = deque()
        #: The ledger: records handed out and not acknowledged yet (RENEW keeps a record here).
        self.unacked: dict[_Key, ShareConsumerRecord[KT, VT]] = {}
        #: Implicit mode: ``getmany()``'s hand-outs since the last poll, a partition's run at a time,
        #: while the ledger holds just them (None once it may not: a record acknowledged or handed
        #: out by ``async for``); the next poll accepts them without a look at the ledger's keys.
        self._handed: list[tuple[TopicPartition, list[ShareConsumerRecord[KT, VT]]]] | None = (
            [] if mode == "implicit" else None)
        #: Lock deadlines moved by RENEW.
        self._renewed: dict[_Key, float] = {}
        #: Records that could not be deserialized (never handed out), with their acknowledgement:
        #: RELEASE unless the application acknowledged them by coordinates; sent at the first poll
        #: after the one that raised the error (``_told``), at ``commit()`` or at ``close()``.
        self.undecodable: dict[_Key, AcknowledgeType] = {}
        self._told: set[_Key] = set()
        #: Records handed to the application, per (topic, partition) (metrics() and OpenTelemetry:
        #: :meth:`delivered_by_partition`).
        self.delivered: Counter[tuple[str, int]] = Counter()
        self.deserializers = Deserializers(config, log, _release_hint)
        #: Set by ``close_out``: records deserialized while the consumer closed are not handed out.
        self.closing = False
        #: Acknowledgements queued in the last event posted (``acknowledge``), its engine, and the
        #: engine's ``posts`` just after it.
        self._ack_queue: list[tuple[_Key, AcknowledgeType]] | None = None
        self._ack_engine: ShareEngine | None = None
        self._ack_posts = -1

    # -- one poll -----------------------------------------------------------------------------------

    async def poll(
        self, engine: ShareEngine, limit: int, timeout: float | None
    ) -> list[ShareConsumerRecord[KT, VT]]:
        """A poll: report acknowledgement outcomes, settle the last poll's records, then take up
        to ``limit`` records, waiting up to ``timeout`` seconds (None: until some arrive)."""
        await self.report_acknowledgements(engine)
        self._begin_poll(engine)
        deadline = None if timeout is None else engine.app_time() + timeout
        while True:
            error = engine.pop_error()
            if error is not None:
                if isinstance(error, RecordDeserializationError):
                    self._told.add((error.topic, error.partition, error.offset))
                raise error
            if engine.batches:
                des = self.deserializers
                taken = self._take(engine, limit) if des.plain or des.sync else await self._take_eager(engine, limit)
                if taken:
                    return taken
                continue  # every record taken was rejected: wait for more
            engine.check_running()
            event = engine.app_event()
            if engine.has_news:
                continue
            if deadline is None:
                await event.wait()
            else:
                if deadline <= engine.app_time():
                    return []
                await engine.wait_app(event, deadline)

    def hand_out(self, record: ShareConsumerRecord[KT, VT]) -> ShareConsumerRecord[KT, VT]:
        """``record`` goes to the application: into the ledger, counted."""
        self.unacked[_COORDINATES(record)] = record
        self._handed = None
        self.delivered[_PARTITION(record)] += 1
        return record

    def delivered_by_partition(self) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): n for tp, n in self.delivered.items()}

    def hand_out_all(
        self, records: list[ShareConsumerRecord[KT, VT]]
    ) -> dict[TopicPartition, list[ShareConsumerRecord[KT, VT]]]:
        """``records`` go to the application, by partition (``getmany()``): into the ledger and
        counted by runs of one partition (a batch's records come together), not one by one."""
        out: dict[TopicPartition, list[ShareConsumerRecord[KT, VT]]] = {}
        self.unacked.update(zip(map(_COORDINATES, records), records, strict=True))
        handed = self._handed
        for (topic, partition), group in groupby(records, _PARTITION):
            run = list(group)
            tp = TopicPartition(topic, partition)
            out.setdefault(tp, []).extend(run)
            self.delivered[tp] += len(run)
            if handed is not None:
                handed.append((tp, run))
        return out

    def _begin_poll(self, engine: ShareEngine) -> None:
        self._send_undecodable(engine, told_only=True)
        if self.mode == "implicit":
            self._accept_delivered(engine)
        elif self.unacked:
            first = min(self.unacked)
            raise AcknowledgementRequiredError(
                f"explicit acknowledgement mode: {len(self.unacked)} record(s) of the last poll are not "
                f"acknowledged (first: {first[0]}-{first[1]} offset {first[2]}); acknowledge each before polling again"
            )

    def _accept_delivered(self, engine: ShareEngine) -> None:
        """Implicit mode: accept every record handed out since the last poll."""
        handed, self._handed = self._handed, []
        if handed is not None and sum(len(run) for _, run in handed) == len(self.unacked):
            runs = [(tp, list(map(_OFFSET, run))) for tp, run in handed]  # the ledger is just these
        else:
            runs = [(TopicPartition(topic, partition), list(map(_OFFSET, keys)))
                    for (topic, partition), keys in groupby(self.unacked, _PARTITION)]
        self.unacked.clear()
        if runs:

            def ack(now: float) -> None:
                for tp, offsets in runs:
                    engine.fetcher.acknowledge_all(tp, offsets, AcknowledgeType.ACCEPT)

            engine.post(ack)

    def _take(self, engine: ShareEngine, limit: int) -> list[ShareConsumerRecord[KT, VT]]:
        """Up to ``limit`` records, deserialized without awaiting (no deserializers, or ``f(data)``
        ones with the "raise" or "skip" policy)."""
        out: list[ShareConsumerRecord[KT, VT]] = []
        taken: list[tuple[ShareBatch, int]] = []
        acks: list[tuple[TopicPartition, int, AcknowledgeType]] = []
        des = self.deserializers
        decode = None if des.plain else des.record
        bad: RecordDeserializationError | None = None
        while engine.batches and len(out) < limit and bad is None:
            batch: ShareBatch = engine.batches[0]
            if decode is None:  # handed out as they are
                some = batch.records[: limit - len(out)]
                out += cast("list[ShareConsumerRecord[KT, VT]]", some)
                taken.append((batch, len(some)))
                self._used(engine, taken[-1:])
                continue
            count = 0  # of the batch's records: handed out, or released or rejected as undecodable
            for a in batch.records[: limit - len(out)]:
                count += 1
                try:
                    r = decode(a)
                except RecordDeserializationError as exc:
                    if des.skip(a, exc, REJECTED):
                        acks.append((batch.tp, a.offset, AcknowledgeType.REJECT))
                        continue
                    # Released: it comes back (delivery_count + 1) until the group's delivery
                    # limit archives it.  The records after it stay for the poll after the error.
                    bad = exc
                    self.undecodable[_COORDINATES(a)] = AcknowledgeType.RELEASE
                    break
                out.append(_with(a, r.key, r.value))
            taken.append((batch, count))
            self._used(engine, taken[-1:])
        return self._finish(engine, taken, acks, out, bad)

    async def _take_eager(self, engine: ShareEngine, limit: int) -> list[ShareConsumerRecord[KT, VT]]:
        """``_take`` for deserializers with context or a handler policy: awaits on this task.  The
        batches stay as they are until nothing awaits any more: a ``close()`` meanwhile releases
        them (and this poll hands out nothing), a cancelled poll leaves them for the next one."""
        out: list[ShareConsumerRecord[KT, VT]] = []
        taken: list[tuple[ShareBatch, int]] = []
        acks: list[tuple[TopicPartition, int, AcknowledgeType]] = []
        des = self.deserializers
        bad: RecordDeserializationError | None = None
        for batch in list(engine.batches):
            count = 0
            for a in batch.records:
                if len(out) >= limit or bad is not None:
                    break
                count += 1
                try:
                    r = des.begin(a)
                    if type(r) is Pending:
                        r = await des.finish(r)
                except RecordDeserializationError as exc:
                    error = await des.settle(a, exc, REJECTED)
                    self._check_open()
                    if error is None:
                        acks.append((batch.tp, a.offset, AcknowledgeType.REJECT))
                        continue
                    bad = error
                    self.undecodable[_COORDINATES(a)] = AcknowledgeType.RELEASE
                    break
                self._check_open()
                out.append(_with(a, r.key, r.value))
            taken.append((batch, count))
            if len(out) >= limit or bad is not None:
                break
        self._used(engine, taken)
        return self._finish(engine, taken, acks, out, bad)

    def _check_open(self) -> None:
        if self.closing:
            raise ConsumerClosedError("the share consumer closed while records were being deserialized")

    @staticmethod
    def _used(engine: ShareEngine, taken: list[tuple[ShareBatch, int]]) -> None:
        """The first records of these batches (the first batches, in order) are taken."""
        for batch, count in taken:
            del batch.records[:count]
            if not batch.records and engine.batches and engine.batches[0] is batch:
                engine.batches.popleft()

    def _finish(
        self, engine: ShareEngine, taken: list[tuple[ShareBatch, int]],
        acks: list[tuple[TopicPartition, int, AcknowledgeType]], out: list[ShareConsumerRecord[KT, VT]],
        bad: RecordDeserializationError | None,
    ) -> list[ShareConsumerRecord[KT, VT]]:
        """Tell the loop what was taken (records and used-up batches per node) and queue the
        acknowledgements of the undecodable records; raise ``bad`` now when nothing is handed out,
        else with the next poll."""
        counts: dict[int, int] = {}
        freed: dict[int, int] = {}
        for batch, count in taken:
            counts[batch.node_id] = counts.get(batch.node_id, 0) + count
        for batch in {id(batch): batch for batch, _ in taken}.values():
            if not batch.records:
                freed[batch.node_id] = freed.get(batch.node_id, 0) + batch.size
        if counts or freed or acks:

            def handed(now: float) -> None:
                fetcher = engine.fetcher
                for tp, offset, kind in acks:
                    fetcher.acknowledge(tp, offset, kind)
                for node in counts.keys() | freed.keys():
                    fetcher.records_handed_out(node, counts.get(node, 0), freed.get(node, 0))

            engine.post(handed)
        if bad is not None and not out:
            self._told.add((bad.topic, bad.partition, bad.offset))
            raise bad
        if bad is not None:
            engine.report_error(bad)
        return out

    # -- acknowledgements ---------------------------------------------------------------------------

    def acknowledge(self, engine: ShareEngine, record: ShareConsumerRecord[KT, VT], kind: AcknowledgeType) -> None:
        """Settle ``record`` in the ledger and queue its acknowledgement for the loop."""
        key = _COORDINATES(record)
        unacked = self.unacked
        # Settled at once but for a renewal, which keeps the record in the ledger (one look-up).
        if (key in unacked) if kind is _RENEW else (unacked.pop(key, None) is not None):
            self._handed = None  # (implicit mode: the ledger is no longer just what was handed out)
            renewed = self._renewed
            deadline = self.lock_deadline(record)
            now = time.monotonic()
            if deadline and now > deadline:
                unacked.pop(key, None)
                renewed.pop(key, None)
                raise AcquisitionLockExpiredError(
                    f"the acquisition lock of {record.topic}-{record.partition} offset {record.offset} ran out "
                    f"{now - deadline:.1f}s ago: the record is back in the group"
                )
            if kind is _RENEW:
                # The broker restarts the lock when it gets the renewal: a little after now.
                renewed[key] = now + engine.fetcher.lock_timeout
            elif renewed:
                renewed.pop(key, None)
        else:
            raise IllegalStateError(
                f"{record.topic}-{record.partition} offset {record.offset} is not a record this consumer "
                "handed out and has not acknowledged yet"
            )
        # Queued for the loop with those queued just before it, in one event, while no other event
        # was queued since (acknowledgements and the other events reach the loop in the order the
        # application made them, and a record's costs no event of its own).
        queue = self._ack_queue
        if queue is None or self._ack_engine is not engine or engine.posts != self._ack_posts:
            queue = self._ack_queue = []
            self._ack_engine = engine
            engine.post(self._sender(engine, queue))
            self._ack_posts = engine.posts
        queue.append((key, kind))

    def _sender(self, engine: ShareEngine, queue: list[tuple[_Key, AcknowledgeType]]) -> Callable[[float], None]:
        def send(now: float) -> None:
            if self._ack_queue is queue:
                self._ack_queue = None  # the next acknowledgement starts a new event
            engine.fetcher.acknowledge_each(queue)

        return send

    def acknowledge_at(self, engine: ShareEngine, topic: str, partition: int, offset: int,
                       kind: AcknowledgeType) -> None:
        """Java's ``acknowledge(topic, partition, offset, type)``: a record handed out, or one that
        could not be deserialized (its RELEASE replaced), named by its coordinates."""
        key = (topic, partition, offset)
        record = self.unacked.get(key)
        if record is not None:
            self.acknowledge(engine, record, kind)
        elif key in self.undecodable:
            if kind == AcknowledgeType.RENEW:
                raise IllegalStateError(f"{topic}-{partition} offset {offset} could not be deserialized: it can be "
                                        "accepted, released or rejected, not renewed")
            self.undecodable[key] = kind
        else:
            raise IllegalStateError(
                f"{topic}-{partition} offset {offset} is neither a record this consumer handed out and has not "
                "acknowledged yet nor one of the last poll it could not deserialize")

    def _send_undecodable(self, engine: ShareEngine, *, told_only: bool = False) -> None:
        """Queue the acknowledgements of the records that could not be deserialized (at a poll:
        only those a poll has raised the error of, so that the application could answer first)."""
        keys = [k for k in self.undecodable if k in self._told or not told_only]
        if not keys:
            return
        acks = {k: self.undecodable.pop(k) for k in keys}
        self._told.difference_update(keys)

        def send(now: float) -> None:
            engine.fetcher.acknowledge_each(acks.items())

        engine.post(send)

    def lock_deadline(self, record: ShareConsumerRecord[KT, VT]) -> float:
        """When ``record``'s acquisition lock runs out (``time.monotonic()`` clock), renewals included."""
        return self._renewed.get(_COORDINATES(record), record.lock_deadline) if self._renewed else record.lock_deadline

    async def commit(self, engine: ShareEngine, timeout: float) -> AckResults:
        """Send the queued acknowledgements now (implicit mode: accept what was handed out first) and
        wait up to ``timeout`` seconds for each partition's outcome."""
        self._send_undecodable(engine)
        if self.mode == "implicit":
            self._accept_delivered(engine)
        waiter = await engine.call(lambda now: engine.fetcher.commit())
        with anyio.move_on_after(timeout) as scope:
            results = await waiter.wait()
        if scope.cancelled_caught:
            raise KafkaTimeoutError(
                f"the broker did not answer the acknowledgements within {timeout:.1f}s (they are on their way "
                "or queued; on_acknowledgement_commit hears of them)"
            )
        await self.report_acknowledgements(engine)
        return results

    async def report_acknowledgements(self, engine: ShareEngine) -> None:
        """Hand the acknowledgement outcomes collected by the loop to the callback (then forget them)."""
        outcomes, engine.fetcher.outcomes = engine.fetcher.outcomes, []
        callback = self.on_commit
        if not outcomes or callback is None:
            return
        calls: list[dict[TopicPartition, AcknowledgementResult]] = [{}]
        for tp, ledger, error in outcomes:
            if tp in calls[-1]:
                calls.append({})
            calls[-1][tp] = AcknowledgementResult(ledger.acknowledged(), error)
        for results in calls:
            result = callback(results)
            if inspect.isawaitable(result):
                await result

    def close_out(self, engine: ShareEngine, *, close_sessions: bool = True) -> Callable[[float], None]:
        """Empty the ledger and what is taken: an event for the loop that acknowledges each (implicit
        mode accepts what was handed out, the rest is released) and starts closing the sessions
        (``close_sessions=False``: ``unsubscribe()``, the sessions stay for a later subscription)."""
        self._send_undecodable(engine)
        implicit = self.mode == "implicit"
        self.closing = close_sessions  # (unsubscribe(): polls go on after a new subscribe())
        unacked = list(self.unacked.values())
        self.unacked.clear()
        self._handed = [] if implicit else None
        self._renewed.clear()
        undelivered = list(self.pending)
        self.pending.clear()

        def release(now: float) -> None:
            fetcher = engine.fetcher
            for r in unacked:
                fetcher.acknowledge(
                    r.topic_partition, r.offset, AcknowledgeType.ACCEPT if implicit else AcknowledgeType.RELEASE
                )
            for r in undelivered:
                fetcher.acknowledge(r.topic_partition, r.offset, AcknowledgeType.RELEASE)
            while engine.batches:
                batch = engine.batches.popleft()
                fetcher.acknowledge_all(batch.tp, [a.offset for a in batch.records], AcknowledgeType.RELEASE)
                fetcher.records_handed_out(batch.node_id, len(batch.records), batch.size)
            if close_sessions:
                fetcher.start_closing()

        return release


def _with(a: ShareConsumerRecord[bytes, bytes], key: Any, value: Any) -> Any:
    """Acquired record ``a`` with this key and value (deserialized: the deserializers' own record,
    ``deserializers.replaced``, has a ``ConsumerRecord``'s fields only), made by ``tuple.__new__``
    as ``NamedTuple._make`` does, without the class's Python-level ``__new__``."""
    return tuple.__new__(ShareConsumerRecord, (a[0], a[1], a[2], a[3], a[4], key, value, *a[7:]))


def _release_hint(record: Any) -> str:
    return "it was released: it comes back until the group's delivery limit archives it"


__all__ = [
    "AcknowledgementCommitCallback",
    "AcknowledgementResult",
    "ShareAcknowledgementMode",
    "ShareCollector",
]
