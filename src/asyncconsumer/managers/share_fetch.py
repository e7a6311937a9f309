"""Share fetching (KIP-932): ShareFetch / ShareAcknowledge with share sessions, sans-I/O.

One share session per partition leader.  Epoch 0 opens it (listing every partition
of the member's assignment that the node leads), later requests carry the next
epoch and list only partitions that are new or have acknowledgements, plus the
partitions to forget; -1 closes it.  The broker hands out *acquired* records:
``AcquiredRecords`` ranges with a delivery count, locked for
``AcquisitionLockTimeoutMs``.  Offsets of an acquired range with no record (control
batches, compacted away) are acknowledged as GAP at once.

Acknowledgements queued by the application ride on the node's next ShareFetch; a
``commit`` (or RENEW, or close) sends them in a ShareAcknowledge as soon as the
node has nothing in flight.  Only one request per node is in flight, so the
session epoch stays in order.  A node is fetched from only when the records it
sent last are all handed to the application (the buffer stays bounded and the
broker does not lock more than the application can work through), and no node
is fetched from while the records not handed out hold ``fetch_buffer_bytes``
(the consumer's bound, with its meaning: the responses in flight, at most one
per leader, may go past it).
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

from ..errors import (
    REFRESH_METADATA_CODES,
    SHARE_SESSION_CODES,
    CorruptRecordError,
    DecompressionLimitError,
    KafkaError,
    RecordError,
    UnsupportedVersionError,
    error_for_code,
)
from ..protocol.compression import DEFAULT_MAX_SIZE
from ..protocol.records import RecordSetRead, decode_record_set, extend_records
from ..structs import AcknowledgeType, ConsumerRecord, ShareConsumerRecord, TopicPartition
from .metadata import MetadataManager, PartitionInfo
from .requests import Body, UnsentRequest
from .share_acks import GAP, AckLedger
from .waiter import Waiter

log = logging.getLogger("asyncconsumer.share")

__all__ = ["GAP", "AckResults", "ShareAcquireMode", "ShareBatch", "ShareFetchManager", "acquired"]

_RENEW = AcknowledgeType.RENEW
_OFFSET = itemgetter(2)
_FIRST = itemgetter("first_offset")
#: ``share_acquire_mode`` (KIP-1206, ShareFetch v2): "batch_optimized" acquires whole record batches
#: (an acquisition may pass ``max_poll_records``); "record_limit" at most ``max_poll_records`` records.
ShareAcquireMode = Literal["batch_optimized", "record_limit"]
#: ShareFetch's ShareAcquireMode field for each.
ACQUIRE_MODES: dict[ShareAcquireMode, int] = {"batch_optimized": 0, "record_limit": 1}
_MAX_EPOCH = 2**31 - 1

AckResults = dict[TopicPartition, KafkaError | None]


@dataclass(slots=True)
class ShareBatch:
    """One partition's acquired records of one ShareFetch response, in offset order, each with its
    delivery count and lock deadline (as the application gets them, with raw key and value)."""

    node_id: int
    tp: TopicPartition
    records: list[ShareConsumerRecord[bytes, bytes]]
    #: The bytes of this partition's records in the response (what it holds of the fetch buffer).
    size: int = 0


@dataclass(slots=True)
class _Session:
    epoch: int = 0
    partitions: set[TopicPartition] = field(default_factory=set)
    in_flight: bool = False
    #: Records of this node not handed to the application yet.
    buffered: int = 0


@dataclass(slots=True)
class _Commit:
    waiter: Waiter[AckResults]
    remaining: set[TopicPartition]
    results: AckResults = field(default_factory=dict)

    def settle(self, tp: TopicPartition, error: KafkaError | None) -> None:
        if tp in self.remaining:
            self.remaining.discard(tp)
            self.results[tp] = error
            if not self.remaining:
                self.waiter.set_result(self.results)


#: A partition's acknowledgements taken into a request: its ledger and the commits waiting for them.
_Taken = tuple[AckLedger, list[_Commit]]


def acquired(
    records: list[ConsumerRecord[bytes, bytes]], ranges: Iterable[Body], deadline: float
) -> tuple[list[ShareConsumerRecord[bytes, bytes]], list[int]]:
    """The records of a ShareFetch answer's partition that its ``AcquiredRecords`` ranges cover, as
    share records with the range's delivery count and ``deadline``; and the offsets of the ranges
    with no record (a control batch's, compacted away).  ``records`` are in offset order and may
    start before the first range or run past the last (a batch's records, acquired or not).  A
    range's records are found by bisection and made without a Python step per record."""
    out: list[ShareConsumerRecord[bytes, bytes]] = []
    gaps: list[int] = []
    for r in sorted(ranges, key=_FIRST):
        first, last = r["first_offset"], r["last_offset"]
        start = bisect_left(records, first, key=_OFFSET)
        stop = bisect_right(records, last, start, key=_OFFSET)
        if stop - start != last - first + 1:  # offsets are unique: else every one is there
            gaps += sorted(set(range(first, last + 1)).difference(map(_OFFSET, records[start:stop])))
        if stop > start:
            out += extend_records(ShareConsumerRecord, records, start, stop, (r["delivery_count"], deadline))
    return out, gaps


class ShareFetchManager:
    def __init__(
        self,
        group_id: str,
        metadata: MetadataManager,
        *,
        member_id: Callable[[], str],
        assignment: Callable[[], frozenset[TopicPartition]],
        can_fetch: Callable[[], bool],
        on_batch: Callable[[ShareBatch], None],
        report_error: Callable[[KafkaError], None],
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 52428800,
        max_records: int = 500,
        retry_backoff: float = 0.1,
        check_crcs: bool = True,
        max_decompressed: int = DEFAULT_MAX_SIZE,
        buffer_bytes: int = 2**63 - 1,
        acquire_mode: ShareAcquireMode = "batch_optimized",
    ) -> None:
        self.group_id = group_id
        self._metadata = metadata
        self._member_id = member_id
        self._assignment = assignment
        self._can_fetch = can_fetch
        self._on_batch = on_batch
        self._report_error = report_error
        self._max_wait_ms = max_wait_ms
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self.max_records = max_records
        self._retry_backoff = retry_backoff
        self._check_crcs = check_crcs
        #: ``batch_decompress_limit``: the most one compressed batch may decompress to.
        self._max_decompressed = max_decompressed
        #: ``fetch_buffer_bytes``: no ShareFetch while the records not handed out hold this much.
        self.max_buffer_bytes = buffer_bytes
        self.buffered_bytes = 0
        self.acquire_mode: ShareAcquireMode = acquire_mode
        self._sessions: dict[int, _Session] = {}
        self._retry_at: dict[int, float] = {}
        #: Acknowledgements not sent yet, a ledger of runs a partition.
        self._acks: dict[TopicPartition, AckLedger] = {}
        self._commits: dict[TopicPartition, list[_Commit]] = {}
        self._urgent: set[TopicPartition] = set()
        #: Partitions whose acknowledgements are on their way, with the commits waiting for them.
        self._sending: dict[TopicPartition, list[_Commit]] = {}
        self.closing = False
        self.closed_nodes: set[int] = set()
        #: The acquisition lock duration the broker last announced (seconds).
        self.lock_timeout = 0.0
        # Counters for ShareConsumer.metrics() (an addition per request or per partition, never per record).
        #: ShareFetch requests sent, answered, and failed (a transport error or a top-level error code).
        self.requests = 0
        self.responses = 0
        self.errors = 0
        #: The bytes of records the ShareFetch responses carried.
        self.response_bytes = 0
        #: Records acquired (and handed to the application's buffer).
        self.records_acquired = 0
        #: Acknowledged offsets the broker confirmed, and those whose acknowledgement failed.
        self.acknowledged = 0
        self.acknowledgement_failures = 0
        #: Acknowledgements the broker answered (or that failed), for the application's
        #: acknowledgement-commit callback: (partition, its ledger as sent, error or None).
        self.outcomes: list[tuple[TopicPartition, AckLedger, KafkaError | None]] = []

    # -- application side (through engine events) -------------------------------------------------

    def _ledger(self, tp: TopicPartition) -> AckLedger:
        ledger = self._acks.get(tp)
        if ledger is None:
            ledger = self._acks[tp] = AckLedger()
        return ledger

    def acknowledge(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> None:
        self._ledger(tp).add_range(offset, offset, kind)
        if kind is _RENEW:
            self._urgent.add(tp)

    def acknowledge_each(self, acks: Iterable[tuple[tuple[str, int, int], AcknowledgeType]]) -> None:
        """``acknowledge`` for each ``((topic, partition, offset), kind)``, in order: the application's
        queue of explicit acknowledgements, where a run of one partition's consecutive offsets of
        one type is one step of its ledger (no call, and no ``TopicPartition`` made, a record)."""
        urgent = self._urgent
        topic, partition = "", -1  # no partition's: the first acknowledgement starts a run
        tp, ledger = TopicPartition(topic, partition), AckLedger()  # (replaced before any use)
        first = last = run_kind = -1
        for (t, p, offset), kind in acks:
            if offset == last + 1 and kind == run_kind and p == partition and t == topic:
                last = offset
                continue
            if first >= 0:
                ledger.add_range(first, last, run_kind)
            if p != partition or t != topic:
                topic, partition = t, p
                tp = TopicPartition(t, p)
                ledger = self._ledger(tp)
            if kind is _RENEW:
                urgent.add(tp)
            first = last = offset
            run_kind = kind
        if first >= 0:
            ledger.add_range(first, last, run_kind)

    def acknowledge_all(self, tp: TopicPartition, offsets: Sequence[int], kind: int) -> None:
        """``acknowledge`` for each of ``offsets`` (a poll's records of ``tp``, say: one run of the
        ledger); ``kind`` an ``AcknowledgeType``, or ``GAP``."""
        self._ledger(tp).add_all(offsets, kind)
        if kind is _RENEW:
            self._urgent.add(tp)

    def commit(self) -> Waiter[AckResults]:
        """Send every queued acknowledgement now; the waiter gets each partition's outcome."""
        waiter: Waiter[AckResults] = Waiter()
        queued = {tp for tp, acks in self._acks.items() if acks}
        if not queued and not self._sending:
            waiter.set_result({})
            return waiter
        commit = _Commit(waiter, queued | set(self._sending))
        for tp in queued:
            self._commits.setdefault(tp, []).append(commit)
        for commits in self._sending.values():  # sent already, not answered yet
            commits.append(commit)
        self._urgent |= queued
        return waiter

    def records_handed_out(self, node_id: int, count: int, freed_bytes: int = 0) -> None:
        """The application took ``count`` records of ``node_id`` and used up batches of
        ``freed_bytes`` (``ShareBatch.size``)."""
        session = self._sessions.get(node_id)
        if session is not None:
            session.buffered = max(0, session.buffered - count)
        self.buffered_bytes = max(0, self.buffered_bytes - freed_bytes)

    @property
    def buffer_full(self) -> bool:
        """The fetch buffer is at its bound: no ShareFetch (acknowledgements still go out)."""
        return self.buffered_bytes >= self.max_buffer_bytes

    def pending_acknowledgements(self) -> int:
        return sum(len(a) for a in self._acks.values())

    def queued(self, tp: TopicPartition) -> list[tuple[int, int, int]]:
        """``tp``'s acknowledgements not sent yet: ``(first, last, type)`` runs, ascending."""
        ledger = self._acks.get(tp)
        return ledger.runs() if ledger is not None else []

    def start_closing(self) -> None:
        """Close every share session (epoch -1) carrying the acknowledgements still queued."""
        self.closing = True

    @property
    def done_closing(self) -> bool:
        return self.closing and all(node in self.closed_nodes for node in self._sessions)

    def fail_all(self, error: BaseException) -> None:
        for commits in [*self._commits.values(), *self._sending.values()]:
            for commit in commits:
                commit.waiter.set_exception(error)
        self._commits.clear()
        self._sending.clear()

    # -- RequestManager -----------------------------------------------------------------------------

    def next_deadline(self, now: float) -> float:
        if self._retry_at:
            return min(self._retry_at.values())
        return float("inf")

    def _topic_id(self, topic: str) -> bytes | None:
        info = self._metadata.cluster.topics.get(topic)
        return info.topic_id if info is not None else None

    def _acks_for(self, node: int, leaders: Mapping[TopicPartition, PartitionInfo]) -> list[TopicPartition]:
        return [tp for tp, acks in self._acks.items()
                if acks and (info := leaders.get(tp)) is not None and info.leader == node]

    def poll(self, now: float) -> list[UnsentRequest]:
        leaders = self._metadata.cluster.leaders  # this turn's snapshot: one dict lookup a partition
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in self._assignment():
            info = leaders.get(tp)
            if info is None:
                self._metadata.request_leaders(tp.topic)
                continue
            by_node.setdefault(info.leader, []).append(tp)
        for tp in list(self._acks):
            if self._acks[tp] and tp not in leaders:
                self._fail_acks(tp, KafkaError(f"no leader known for {tp}: its acknowledgements are dropped"))
        requests: list[UnsentRequest] = []
        nodes = set(by_node) | set(self._sessions) | {
            info.leader for tp in self._acks if (info := leaders.get(tp)) is not None}
        for node in nodes:
            session = self._sessions.setdefault(node, _Session())
            if session.in_flight or now < self._retry_at.get(node, 0.0):
                continue
            self._retry_at.pop(node, None)
            acked = self._acks_for(node, leaders)
            if self.closing:
                if session.epoch == 0:
                    for tp in acked:  # no session to carry them: the locks run out instead
                        self._fail_acks(tp, KafkaError(f"no share session open for {tp}'s acknowledgements"))
                    self.closed_nodes.add(node)
                elif node not in self.closed_nodes:
                    requests.append(self._acknowledge(now, node, session, acked, final=True))
                continue
            wanted = set(by_node.get(node, ()))
            renew = any(self._acks[tp].has(_RENEW) for tp in acked)
            urgent = [tp for tp in acked if tp in self._urgent]
            fetchable = wanted and session.buffered == 0 and not self.buffer_full and self._can_fetch()
            if urgent and session.epoch != 0 and (renew or not fetchable):
                requests.append(self._acknowledge(now, node, session, acked, final=False, renew=renew))
            elif fetchable or (session.partitions - wanted) or (urgent and session.epoch == 0):
                requests.append(self._fetch(node, session, wanted, acked))
        return requests

    # -- ShareFetch ---------------------------------------------------------------------------------

    def _take_acks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, _Taken]:
        taken: dict[TopicPartition, _Taken] = {}
        for tp in tps:
            commits = self._commits.pop(tp, [])
            ledger = self._acks.pop(tp, None)
            taken[tp] = (ledger if ledger is not None else AckLedger(), commits)
            self._sending[tp] = commits
            self._urgent.discard(tp)
        return taken

    def _fetch(
        self, node: int, session: _Session, wanted: set[TopicPartition], acked: list[TopicPartition]
    ) -> UnsentRequest:
        if session.epoch == 0:
            # A new session carries no acknowledgements (the broker would reject them).
            acked = []
            send = set(wanted)
        else:
            send = (wanted - session.partitions) | set(acked)
        forget = session.partitions - wanted if session.epoch != 0 else set()
        epoch = session.epoch
        taken = self._take_acks(acked)
        session.in_flight = True
        self.requests += 1
        member_id = self._member_id()

        def build(version: int) -> Body:
            return {
                "group_id": self.group_id,
                "member_id": member_id,
                "share_session_epoch": epoch,
                "max_wait_ms": self._max_wait_ms,
                "min_bytes": self._min_bytes,
                "max_bytes": self._max_bytes,
                "max_records": self.max_records,
                "batch_size": self.max_records,
                "topics": self._topics(send, taken),
                "forgotten_topics_data": self._topics(forget, {}, forgotten=True),
                **({"share_acquire_mode": ACQUIRE_MODES[self.acquire_mode]} if version >= 2 else {}),
            }

        def on_response(now: float, version: int, body: Body) -> None:
            session.in_flight = False
            self._on_fetch(now, node, session, epoch, send, forget, taken, body)

        def on_error(now: float, error: BaseException) -> None:
            session.in_flight = False
            self.errors += 1
            if isinstance(error, UnsupportedVersionError) and self.acquire_mode == "record_limit":
                self._report_error(
                    UnsupportedVersionError(
                        f"share_acquire_mode='record_limit' (KIP-1206) needs ShareFetch v2 (Apache Kafka 4.2 or "
                        f"later); node {node} cannot do it ({error}): use 'batch_optimized' with this cluster"
                    )
                )
            self._session_failed(now, node, session, taken, error)

        return UnsentRequest(
            "ShareFetch",
            build,
            on_response,
            on_error,
            node_id=node,
            extra_timeout_ms=self._max_wait_ms,
            min_version=2 if self.acquire_mode == "record_limit" else 0,
        )

    def _topics(
        self,
        tps: Iterable[TopicPartition],
        taken: dict[TopicPartition, _Taken],
        *,
        forgotten: bool = False,
    ) -> list[Body]:
        grouped: dict[bytes, list[Any]] = {}
        for tp in sorted(tps):
            tid = self._topic_id(tp.topic)
            if tid is None:
                continue
            if forgotten:
                grouped.setdefault(tid, []).append(tp.partition)
                continue
            sent = taken.get(tp)
            entry: Body = {"partition_index": tp.partition,
                           "acknowledgement_batches": sent[0].batches() if sent is not None else []}
            grouped.setdefault(tid, []).append(entry)
        return [{"topic_id": tid, "partitions": parts} for tid, parts in grouped.items()]

    def _next_epoch(self, epoch: int) -> int:
        return 1 if epoch >= _MAX_EPOCH else epoch + 1

    def _on_fetch(
        self,
        now: float,
        node: int,
        session: _Session,
        epoch: int,
        sent: set[TopicPartition],
        forget: set[TopicPartition],
        taken: dict[TopicPartition, _Taken],
        body: Body,
    ) -> None:
        self.responses += 1
        code = body["error_code"]
        if code != 0:
            self.errors += 1
            self._session_failed(now, node, session, taken, error_for_code(code, body.get("error_message")))
            return
        session.epoch = self._next_epoch(epoch)
        session.partitions = (session.partitions | sent) - forget
        if body.get("acquisition_lock_timeout_ms", 0) > 0:
            self.lock_timeout = body["acquisition_lock_timeout_ms"] / 1000
        deadline = now + self.lock_timeout
        answered: set[TopicPartition] = set()
        for topic in body["responses"]:
            name = self._metadata.cluster.topic_name(topic["topic_id"])
            if name is None:
                continue
            for p in topic["partitions"]:
                tp = TopicPartition(name, p["partition_index"])
                answered.add(tp)
                if tp in taken:
                    ack_code = p["acknowledge_error_code"]
                    self._settle(
                        taken[tp],
                        tp,
                        error_for_code(ack_code, p.get("acknowledge_error_message")) if ack_code else None,
                    )
                if p["error_code"] != 0:
                    if p["error_code"] in REFRESH_METADATA_CODES:
                        # A moved leader (a broker restarting) or a topic being recreated: new metadata
                        # sends the partition to its leader, as Java's share consumer does; not the
                        # application's error.  The node waits the backoff so that a stale leader is
                        # not asked again at once.
                        log.debug("share fetch of %s from node %s: %s; refreshing metadata", tp, node,
                                  error_for_code(p["error_code"], p.get("error_message")))
                        self._metadata.request_update()
                        self._retry_at[node] = now + self._retry_backoff
                        continue
                    self._report_error(error_for_code(p["error_code"], p.get("error_message")))
                    continue
                self._acquired(node, tp, session, p, deadline)
        for tp, entry in taken.items():
            if tp not in answered:
                self._settle(entry, tp, None)

    def _acquired(self, node: int, tp: TopicPartition, session: _Session, p: Body, deadline: float) -> None:
        ranges = p.get("acquired_records")
        if not ranges:
            return
        records = p.get("records")
        read = decode_record_set(
            records, topic=tp.topic, partition=tp.partition, check_crcs=self._check_crcs,
            max_decompressed=self._max_decompressed,
        ) if records else RecordSetRead([])
        out, gaps = acquired(read.records, ranges, deadline)
        if read.failed:
            gaps = self._unreadable(tp, read, gaps)
        if gaps:  # acquired, but no record there (control batch, compacted away)
            self.acknowledge_all(tp, gaps, GAP)
        if out and self.closing:  # arrived while closing: straight back to the group
            self.acknowledge_all(tp, [r.offset for r in out], AcknowledgeType.RELEASE)
        elif out:
            size = len(records) if records else 0
            self.records_acquired += len(out)
            self.response_bytes += size
            session.buffered += len(out)
            self.buffered_bytes += size
            self._on_batch(ShareBatch(node, tp, out, size))

    def _unreadable(self, tp: TopicPartition, read: RecordSetRead, gaps: list[int]) -> list[int]:
        """An answer with batches that could not be read: the acquired offsets with no record
        between the records read before such a batch and those read after it are its records, not
        gaps.  As Java's share consumer does, they are rejected (archived: they would fail again)
        when the batch is corrupt, and the error goes to the application.  They are released
        instead, for another member or a later try (the delivery limit bounds the tries), when the
        batch may be sound but cannot be read here (a codec's library missing, past
        ``max_batch_decompressed_bytes``, a format this client does not read), and when the read
        stopped at the batch (its length is wrong): then every acquired offset after the records
        read is unread, the batch's and those after it alike.  Returns the gaps left."""
        records = read.records
        spans = [
            (records[before - 1].offset if before else -(1 << 63),
             records[before].offset if before < len(records) else 1 << 63, error)
            for error, before in read.failed
        ]
        left: list[int] = []
        hit: dict[int, tuple[RecordError, list[int]]] = {}
        for offset in gaps:
            for i, (after, before, error) in enumerate(spans):
                if after < offset < before:
                    hit.setdefault(i, (error, []))[1].append(offset)
                    break
            else:
                left.append(offset)
        for i, (error, offsets) in hit.items():
            stopped = read.stopped and i == len(spans) - 1
            corrupt = isinstance(error, CorruptRecordError) and not isinstance(error, DecompressionLimitError)
            kind = AcknowledgeType.REJECT if corrupt and not stopped else AcknowledgeType.RELEASE
            self.acknowledge_all(tp, offsets, kind)
            outcome = (f"{len(offsets)} acquired record(s) from it on released (where it ends is not known)"
                       if stopped else f"its {len(offsets)} acquired record(s) {'rejected' if corrupt else 'released'}")
            error.add_note(f"share consumer: {outcome}")
            log.warning("share fetch of %s: %s; %s", tp, error, outcome)
            self._report_error(error)
        for i, (error, _) in enumerate(read.failed):
            if i not in hit:
                log.debug("share fetch of %s: %s (in no acquired record's batch)", tp, error)
        return left

    # -- ShareAcknowledge -----------------------------------------------------------------------------

    def _acknowledge(
        self, now: float, node: int, session: _Session, acked: list[TopicPartition], *, final: bool, renew: bool = False
    ) -> UnsentRequest:
        epoch = -1 if final else session.epoch
        taken = self._take_acks(acked)
        session.in_flight = True
        member_id = self._member_id()

        def build(version: int) -> Body:
            body: Body = {
                "group_id": self.group_id,
                "member_id": member_id,
                "share_session_epoch": epoch,
                "topics": self._topics(taken, taken),
            }
            if version >= 2:
                body["is_renew_ack"] = renew
            return body

        def on_response(now: float, version: int, body: Body) -> None:
            session.in_flight = False
            if final:
                self.closed_nodes.add(node)
            code = body["error_code"]
            if code != 0:
                self._session_failed(now, node, session, taken, error_for_code(code, body.get("error_message")))
                return
            if not final:
                session.epoch = self._next_epoch(epoch)
            if body.get("acquisition_lock_timeout_ms", 0) > 0:
                self.lock_timeout = body["acquisition_lock_timeout_ms"] / 1000
            answered = set()
            for topic in body["responses"]:
                name = self._metadata.cluster.topic_name(topic["topic_id"])
                for p in topic["partitions"]:
                    if name is None:
                        continue
                    tp = TopicPartition(name, p["partition_index"])
                    answered.add(tp)
                    if tp in taken:
                        c = p["error_code"]
                        self._settle(taken[tp], tp, error_for_code(c, p.get("error_message")) if c else None)
            for tp, entry in taken.items():
                if tp not in answered:
                    self._settle(entry, tp, None)

        def on_error(now: float, error: BaseException) -> None:
            session.in_flight = False
            if final:
                self.closed_nodes.add(node)
            self._session_failed(now, node, session, taken, error)

        return UnsentRequest(
            "ShareAcknowledge", build, on_response, on_error, node_id=node, min_version=2 if renew else 0
        )

    # -- outcomes -----------------------------------------------------------------------------------

    def _settle(self, taken: _Taken, tp: TopicPartition, error: KafkaError | None) -> None:
        acks, commits = taken
        count = acks.acknowledged_count()
        if count:
            self.outcomes.append((tp, acks, error))
            if error is None:
                self.acknowledged += count
            else:
                self.acknowledgement_failures += count
        if self._sending.get(tp) is commits:
            del self._sending[tp]
        for commit in commits:
            commit.settle(tp, error)

    def _fail_acks(self, tp: TopicPartition, error: KafkaError) -> None:
        acks = self._acks.pop(tp, None) or AckLedger()
        self._urgent.discard(tp)
        self._settle((acks, self._commits.pop(tp, [])), tp, error)

    def _session_failed(
        self,
        now: float,
        node: int,
        session: _Session,
        taken: dict[TopicPartition, _Taken],
        error: BaseException,
    ) -> None:
        kafka_error = error if isinstance(error, KafkaError) else KafkaError(repr(error))
        for tp, entry in taken.items():
            self._settle(entry, tp, kafka_error)
        # Start a new session: the broker forgets ours on most errors; records acquired in it are
        # released when their locks run out.
        session.epoch = 0
        session.partitions = set()
        self._retry_at[node] = now + self._retry_backoff
        self._metadata.request_update()
        if not (isinstance(error, KafkaError) and getattr(error, "code", None) in SHARE_SESSION_CODES):
            log.debug("share session with node %s failed: %r", node, error)
