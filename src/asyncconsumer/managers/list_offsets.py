"""ListOffsets: offset lookups by timestamp, and position resets.

Serves ``beginning_offsets``/``end_offsets``/``offsets_for_times`` and moves
partitions in ``AWAIT_RESET`` to earliest/latest (``auto_offset_reset``), or
with ``"by_duration:<ISO 8601 duration>"`` (KIP-1106) to the first record at or
after that long before now: a ListOffsets by timestamp, and where no record is
that recent, to latest (a second ListOffsets), as the Java client does.
Requests go to each partition's leader; leadership errors refresh metadata
and retry after ``retry_backoff_ms``.

The end of a partition is the high watermark (with ``read_committed``, the
last stable offset), and a Fetch answer states it for every partition it
names.  Apache Kafka's ListOffsets(latest) answers exactly that, but a broker
may answer less (Tansu answers the start of the last batch + 1, inside it), and
an answer lower than a high watermark a fetch showed is wrong by definition.
So every ListOffsets(latest) answer is *confirmed*: one sessionless Fetch to
the same leader at the offset answered (answered at once, one byte asked for:
on Apache Kafka an empty answer), and the end is the largest of the ListOffsets answer,
that Fetch's mark and the mark the consumer's own fetches last saw for the
partition.  A confirmation that fails leaves the ListOffsets answer.  The
first answer a broker gets wrong is named in one INFO line.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import (
    REFRESH_METADATA_CODES,
    KafkaError,
    NoOffsetForPartitionError,
    error_for_code,
)
from ..structs import TopicPartition, by_topic
from .metadata import ZERO_UUID, MetadataManager
from .requests import Body, UnsentRequest
from .subscription import PartitionPhase, SubscriptionState
from .waiter import Waiter

_NONE: frozenset[str] = frozenset()

log = logging.getLogger("asyncconsumer.offsets")

EARLIEST = -2
LATEST = -1
_RESET_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}

#: ``auto_offset_reset="by_duration:<duration>"`` (KIP-1106): the prefix, then an ISO 8601 duration
#: as Java's ``Duration.parse`` reads it: ``PnDTnHnMn.nS`` (days of 24 hours; letters in either
#: case; each number may carry a sign, the whole too), e.g. ``PT1H``, ``P7D``, ``PT0.5S``.
BY_DURATION = "by_duration:"
_ISO_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=16)
def reset_duration_ms(strategy: str) -> int:
    """The milliseconds of ``"by_duration:<ISO 8601 duration>"``; ``ValueError`` names what is wrong
    (the words of Java's ``AutoOffsetResetStrategy``: no duration, one it cannot read, a negative one)."""
    if not strategy.startswith(BY_DURATION):
        raise ValueError(f"{strategy!r} is not 'by_duration:<duration>'")
    text = strategy[len(BY_DURATION):]
    match = _ISO_DURATION.fullmatch(text)
    if not text or match is None or match.group(3) == "T" or not any(match.group(i) for i in (2, 3)):
        raise ValueError(f"cannot read the duration {text!r}: an ISO 8601 duration (PnDTnHnMn.nS) such as PT1H or P7D")
    sign, days, _, hours, minutes, seconds, fraction = match.groups()

    def number(group: str | None) -> int:
        return int(group) if group else 0

    nanos = (fraction or "").ljust(9, "0")
    total_ns = ((number(days) * 24 + number(hours)) * 60 + number(minutes)) * 60 * 10**9
    whole = number(seconds)
    total_ns += whole * 10**9 + (-1 if (seconds or "").startswith("-") else 1) * int(nanos or "0")
    if sign == "-":
        total_ns = -total_ns
    if total_ns < 0:
        raise ValueError(f"the duration {text!r} is negative: by_duration takes a duration back from now")
    return total_ns // 10**6

#: (offset, timestamp, leader_epoch), or None when no record is at/after the timestamp.
OffsetResult = tuple[int, int, int | None] | None


@dataclass(eq=False)
class _Lookup:
    timestamps: dict[TopicPartition, int]
    waiter: Waiter[dict[TopicPartition, OffsetResult]]
    results: dict[TopicPartition, OffsetResult] = field(default_factory=dict)
    in_flight: set[TopicPartition] = field(default_factory=set)
    retry_at: float = 0.0


@dataclass(eq=False)
class _Confirmation:
    """ListOffsets(latest) answers of one leader, waiting for a Fetch to state the partitions' ends."""

    node: int
    ends: dict[TopicPartition, int]
    finish: Callable[[float, dict[TopicPartition, int]], None]


class ListOffsetsManager:
    def __init__(
        self,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        *,
        read_committed: bool,
        retry_backoff: float,
        report_error: Callable[[KafkaError], None],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._subscriptions = subscriptions
        self._metadata = metadata
        #: Seconds since the epoch: what "by_duration" resets count back from.
        self._wall_clock = wall_clock
        self._read_committed = read_committed
        self._retry_backoff = retry_backoff
        self._report_error = report_error
        self._lookups: list[_Lookup] = []
        self._resets_in_flight: set[TopicPartition] = set()
        self._confirmations: list[_Confirmation] = []
        #: Brokers whose ListOffsets(latest) answer was below a Fetch's mark (each named once in the log).
        self.inexact_nodes: set[int] = set()

    def lookup(self, timestamps: dict[TopicPartition, int]) -> Waiter[dict[TopicPartition, OffsetResult]]:
        waiter: Waiter[dict[TopicPartition, OffsetResult]] = Waiter()
        if not timestamps:
            waiter.set_result({})
        else:
            self._lookups.append(_Lookup(dict(timestamps), waiter))
        return waiter

    def fail_all(self, error: BaseException) -> None:
        lookups, self._lookups = self._lookups, []
        for lookup in lookups:
            lookup.waiter.set_exception(error)

    def topics_of_interest(self) -> frozenset[str]:
        return frozenset(tp.topic for lookup in self._lookups for tp in lookup.timestamps) if self._lookups else _NONE

    def next_deadline(self, now: float) -> float:
        # Only future retries: what could be sent now was sent by poll(), and what waits for a
        # leader is woken by the metadata response.
        if not self._lookups and not self._subscriptions.settling():
            return float("inf")
        deadlines = [lk.retry_at for lk in self._lookups if lk.retry_at > now]
        resets = self._subscriptions.in_phase(PartitionPhase.AWAIT_RESET, float("inf"))
        deadlines += [s.retry_at for s in resets if now < s.retry_at < float("inf")]
        return min(deadlines, default=float("inf"))

    def poll(self, now: float) -> list[UnsentRequest]:
        if not self._lookups and not self._confirmations and not self._subscriptions.settling():
            return []  # most turns: every position known, nothing asked
        requests = self._poll_lookups(now)
        requests += self._poll_resets(now)
        confirmations, self._confirmations = self._confirmations, []
        requests += [self._confirm_request(c) for c in confirmations]
        return requests

    # -- application lookups ----------------------------------------------------------------------

    def _poll_lookups(self, now: float) -> list[UnsentRequest]:
        requests: list[UnsentRequest] = []
        cluster = self._metadata.cluster
        for lookup in list(self._lookups):
            if lookup.waiter.done():  # cancelled by the caller's timeout
                self._lookups.remove(lookup)
                continue
            if now < lookup.retry_at:
                continue
            by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
            for tp, ts in lookup.timestamps.items():
                if tp in lookup.results or tp in lookup.in_flight:
                    continue
                if tp.topic in cluster.topic_errors:
                    self._lookups.remove(lookup)
                    lookup.waiter.set_exception(self._topic_error(tp))
                    break
                leader = cluster.leader(tp)
                topic = cluster.topics.get(tp.topic)
                if topic is not None and tp.partition not in topic.partitions:
                    self._lookups.remove(lookup)
                    lookup.waiter.set_exception(self._topic_error(tp))
                    break
                if leader is None:
                    self._metadata.request_leaders(tp.topic)
                    continue
                by_leader[leader.leader][tp] = ts
            else:
                for node, parts in by_leader.items():
                    lookup.in_flight.update(parts)
                    requests.append(self._request(node, parts, self._lookup_handler(lookup, parts)))
        return requests

    def _topic_error(self, tp: TopicPartition) -> KafkaError:
        error = self._metadata.cluster.topic_errors.get(tp.topic)
        if error is not None:
            return type(error)(
                f"topic {tp.topic!r} (partition {tp.partition}): {error.detail}"
                if hasattr(error, "detail")
                else str(error)
            )
        return error_for_code(3, f"partition {tp} does not exist")

    def _lookup_handler(
        self, lookup: _Lookup, parts: dict[TopicPartition, int]
    ) -> Callable[[float, dict[TopicPartition, OffsetResult] | KafkaError], None]:
        def handle(now: float, outcome: dict[TopicPartition, OffsetResult] | KafkaError) -> None:
            lookup.in_flight.difference_update(parts)
            if isinstance(outcome, KafkaError):
                if not outcome.retriable:
                    self._finish(lookup, outcome)
                    return
                lookup.retry_at = now + self._retry_backoff
                return
            lookup.results.update(outcome)
            if len(lookup.results) == len(lookup.timestamps):
                self._finish(lookup, None)
            elif any(tp not in lookup.results for tp in parts):  # these are asked again after the backoff
                lookup.retry_at = now + self._retry_backoff

        return handle

    def _finish(self, lookup: _Lookup, error: KafkaError | None) -> None:
        if lookup in self._lookups:
            self._lookups.remove(lookup)
        if error is not None:
            lookup.waiter.set_exception(error)
        else:
            lookup.waiter.set_result(dict(lookup.results))

    # -- position resets --------------------------------------------------------------------------

    def _poll_resets(self, now: float) -> list[UnsentRequest]:
        cluster = self._metadata.cluster
        by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
        sent_under: dict[TopicPartition, int] = {}  # the leader epoch each request names (build)
        missing: list[TopicPartition] = []
        for state in self._subscriptions.in_phase(PartitionPhase.AWAIT_RESET, now):
            tp = state.tp
            if tp in self._resets_in_flight:
                continue
            timestamp = self._reset_timestamp(state.reset_to)
            if timestamp is None:
                missing.append(tp)
                continue
            leader = cluster.leader(tp)
            if leader is None:
                self._metadata.request_leaders(tp.topic)
                continue
            by_leader[leader.leader][tp] = timestamp
            sent_under[tp] = leader.leader_epoch
        if missing:
            for tp in missing:
                self._subscriptions.partitions[tp].retry_at = float("inf")  # until the user seeks
            self._report_error(NoOffsetForPartitionError(missing))
        requests = []
        for node, parts in by_leader.items():
            epochs = {tp: self._subscriptions.partitions[tp].epoch for tp in parts}
            self._resets_in_flight.update(parts)
            requests.append(self._request(node, parts, self._reset_handler(parts, epochs, sent_under)))
        return requests

    def _reset_handler(
        self, parts: dict[TopicPartition, int], epochs: dict[TopicPartition, int], sent_under: dict[TopicPartition, int]
    ) -> Callable[[float, dict[TopicPartition, OffsetResult] | KafkaError], None]:
        """A reset's answers become positions.  One that the leader gave under the leader epoch
        the request named (``current_leader_epoch``: the broker answers only at that epoch, else
        with FENCED/UNKNOWN_LEADER_EPOCH) is what that leader has, so it counts as validated for
        that epoch (KIP-320: no OffsetForLeaderEpoch before the first fetch; Java's consumer
        skips the check after a reset too); a later epoch has it checked as any position."""

        def handle(now: float, outcome: dict[TopicPartition, OffsetResult] | KafkaError) -> None:
            self._resets_in_flight.difference_update(parts)
            for tp in parts:
                state = self._subscriptions.get(tp)
                if state is None or state.epoch != epochs[tp] or state.phase is not PartitionPhase.AWAIT_RESET:
                    continue  # seeked or unassigned meanwhile
                result = outcome.get(tp) if isinstance(outcome, dict) else None
                if result is None and isinstance(outcome, dict) and tp in outcome and parts[tp] >= 0:
                    # by_duration: no record that recent; the end of the partition, as Java does.
                    log.debug("no record of %s since %s: resetting to latest", tp, state.reset_to)
                    state.reset_to = "latest"
                    continue
                if result is None:
                    if isinstance(outcome, KafkaError) and not outcome.retriable:
                        self._report_error(outcome)
                    state.retry_at = now + self._retry_backoff
                    continue
                offset, _, leader_epoch = result
                log.debug("reset %s to %s offset %d", tp, state.reset_to, offset)
                state.set_position(offset, leader_epoch)
                if sent_under[tp] >= 0:
                    state.validated_for = sent_under[tp]

        return handle

    def _reset_timestamp(self, strategy: str | None) -> int | None:
        """The ListOffsets timestamp of a reset strategy (None: "none", the application must seek)."""
        if strategy in _RESET_TIMESTAMPS:
            return _RESET_TIMESTAMPS[strategy]
        if strategy is not None and strategy.startswith(BY_DURATION):
            return max(0, int(self._wall_clock() * 1000) - reset_duration_ms(strategy))
        return None

    # -- the request ------------------------------------------------------------------------------

    def _request(
        self,
        node: int,
        parts: dict[TopicPartition, int],
        handle: Callable[[float, dict[TopicPartition, OffsetResult] | KafkaError], None],
    ) -> UnsentRequest:
        cluster = self._metadata.cluster
        grouped = by_topic(parts)

        def build(version: int) -> Body:
            topics = []
            for topic, tps in grouped.items():
                partitions = []
                for tp in tps:
                    leader = cluster.leader(tp)
                    epoch = leader.leader_epoch if leader is not None else -1
                    partitions.append(
                        {"partition_index": tp.partition, "current_leader_epoch": epoch, "timestamp": parts[tp]}
                    )
                topics.append({"name": topic, "partitions": partitions})
            return {
                "replica_id": -1,
                "isolation_level": int(self._read_committed),
                "topics": topics,
                "timeout_ms": 30000,
            }

        def on_response(now: float, version: int, body: Body) -> None:
            results: dict[TopicPartition, OffsetResult] = {}
            refresh = False
            fatal: KafkaError | None = None
            for topic in body["topics"]:
                for p in topic["partitions"]:
                    tp = TopicPartition(topic["name"], p["partition_index"])
                    code = p["error_code"]
                    if code == 0:
                        offset = p["offset"]
                        epoch = p["leader_epoch"] if p["leader_epoch"] >= 0 else None
                        results[tp] = None if offset < 0 else (offset, p["timestamp"], epoch)
                    elif code in REFRESH_METADATA_CODES:
                        refresh = True
                    else:
                        fatal = error_for_code(code, f"ListOffsets for {tp}")
            if refresh:
                self._metadata.request_update()
            latest = {tp: r[0] for tp, r in results.items() if r is not None and parts[tp] == LATEST}
            if fatal is not None or not latest:
                handle(now, fatal if fatal is not None else results)
                return

            def confirmed(when: float, ends: dict[TopicPartition, int]) -> None:
                for tp, end in ends.items():
                    result = results[tp]
                    assert result is not None
                    results[tp] = (end, -1, result[2])
                handle(when, results)

            self._confirmations.append(_Confirmation(node, latest, confirmed))

        def on_error(now: float, error: BaseException) -> None:
            self._metadata.request_update()
            handle(now, error if isinstance(error, KafkaError) else KafkaError(repr(error)))

        return UnsentRequest("ListOffsets", build, on_response, on_error, node_id=node, min_version=1)

    # -- confirming the end of a partition -----------------------------------------------------------

    def _mark(self, tp: TopicPartition) -> int:
        """The end the consumer's own fetches last saw for ``tp`` (-1: none)."""
        state = self._subscriptions.get(tp)
        if state is None:
            return -1
        if self._read_committed and state.last_stable_offset >= 0:
            return state.last_stable_offset
        return state.high_watermark

    def _confirm_request(self, confirmation: _Confirmation) -> UnsentRequest:
        cluster = self._metadata.cluster
        node, ends = confirmation.node, confirmation.ends
        grouped = by_topic(ends)
        ids = {topic: (cluster.topics[topic].topic_id if topic in cluster.topics else ZERO_UUID) for topic in grouped}

        def build(version: int) -> Body:
            topics = []
            for topic, tps in grouped.items():
                partitions = []
                for tp in tps:
                    leader = cluster.leader(tp)
                    partitions.append({
                        "partition": tp.partition,
                        "current_leader_epoch": leader.leader_epoch if leader is not None else -1,
                        "fetch_offset": ends[tp],
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1,
                    })
                key = {"topic_id": ids[topic]} if version >= 13 else {"topic": topic}
                topics.append({**key, "partitions": partitions})
            return {
                "replica_id": -1,
                # min_bytes 0: answered at once.  Not a 0 ms wait: Tansu answers that with no partitions.
                "max_wait_ms": 1,
                "min_bytes": 0,
                "max_bytes": 1,
                "isolation_level": int(self._read_committed),
                "session_id": 0,
                "session_epoch": -1,
                "topics": topics,
                "forgotten_topics_data": [],
                "rack_id": "",
            }

        def finish(now: float, marks: dict[TopicPartition, int]) -> None:
            confirmed = {}
            for tp, listed in ends.items():
                best = max(listed, marks.get(tp, -1), self._mark(tp))
                confirmed[tp] = best
                if best > listed and node not in self.inexact_nodes:
                    self.inexact_nodes.add(node)
                    log.info(
                        "node %s answered ListOffsets(latest) %d for %s, below the %s %d a Fetch shows: its "
                        "end offsets are taken from Fetch answers", node, listed, tp,
                        "last stable offset" if self._read_committed else "high watermark", best,
                    )
            confirmation.finish(now, confirmed)

        def on_response(now: float, version: int, body: Body) -> None:
            marks: dict[TopicPartition, int] = {}
            for topic in body["responses"] if not body["error_code"] else ():
                name = topic["topic"] if version < 13 else cluster.topic_name(topic["topic_id"])
                for p in topic["partitions"]:
                    tp = TopicPartition(name or "", p["partition_index"])
                    if tp not in ends or p["error_code"]:
                        continue
                    stable = p["last_stable_offset"]
                    marks[tp] = stable if self._read_committed and stable >= 0 else p["high_watermark"]
            finish(now, marks)

        def on_error(now: float, error: BaseException) -> None:
            finish(now, {})  # unconfirmed: the ListOffsets answer (and what fetches saw) stands

        have_ids = all(topic_id != ZERO_UUID for topic_id in ids.values())
        return UnsentRequest(
            "Fetch", build, on_response, on_error, node_id=node, min_version=4, max_version=None if have_ids else 12
        )
