"""``Consumer.metrics()``: a typed snapshot of the consumer's counters, with no dependency.

The counters live where the events happen (the fetch manager, the network client, the commit
manager, the group member, the collector) and cost an integer addition each, per request, per
chunk of records or per state change, never per record.  ``Consumer.metrics()`` reads them and the
partition states into the frozen dataclasses below only when it is called (``app/metrics.py``).  docs/metrics.md
describes each field; ``asyncconsumer.otel`` reports the same numbers through OpenTelemetry.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from .structs import TopicPartition

#: Upper bounds (seconds) of the latency histogram buckets; the last bucket is everything above.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


class LatencyRecorder:
    """Count, sum, max and a small histogram of durations (mutable; the engine's side)."""

    __slots__ = ("buckets", "count", "max", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.max = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)

    def record(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        if seconds > self.max:
            self.max = seconds
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def snapshot(self) -> Latency:
        return Latency(self.count, self.sum, self.max, tuple(zip((*LATENCY_BUCKETS, float("inf")), self.buckets,
                                                                   strict=True)))


@dataclass(frozen=True, slots=True)
class Latency:
    """Durations of one kind of request, in seconds."""

    #: Requests that completed (with a response or an error).
    count: int = 0
    #: Their total duration: ``sum / count`` is the mean.
    sum: float = 0.0
    #: The longest one.
    max: float = 0.0
    #: ``(upper bound, requests that took at most that long and longer than the previous bound)``;
    #: the last bound is ``inf``.  Not cumulative (Prometheus' ``le`` buckets are the running sums).
    buckets: tuple[tuple[float, int], ...] = ()

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class PartitionMetrics:
    """One assigned partition.  Offsets are ``None`` while unknown."""

    topic: str
    partition: int
    #: The offset of the next record handed to the application (``Consumer.position()``).
    position: int | None
    #: The last offset this consumer committed or read as committed for the group (None: none known).
    committed: int | None
    #: The high watermark as of the last fetch response: the offset the next produced record gets.
    high_watermark: int | None
    #: The last stable offset as of the last fetch response (what ``read_committed`` reads up to).
    last_stable_offset: int | None
    #: Records not yet handed out: ``high_watermark - position`` (with ``isolation_level=
    #: "read_committed"``: ``last_stable_offset - position``), as Java's ``records-lag``.
    lag: int | None
    #: Records handed to the application from this partition.
    records_consumed: int = 0
    paused: bool = False

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class FetchMetrics:
    """Fetch requests and the fetch buffer."""

    #: Fetch requests sent.
    requests: int
    #: Fetch responses with data handled (a response for a partition since unassigned is not).
    responses: int
    #: ``responses`` per broker id that served them: with ``client_rack`` and a rack-aware cluster
    #: (KIP-392), a follower in the consumer's rack shows up here rather than the leader.
    responses_by_node: Mapping[int, int]
    #: Failed fetch requests (lost connection, timeout, a top-level error code).
    errors: int
    #: Time from sending a fetch to its response (the broker's ``fetch_max_wait_ms`` included).
    latency: Latency
    #: Record bytes received in fetch responses, in all.
    response_bytes: int
    #: The largest records size of one fetch response.
    response_bytes_max: int
    #: Bytes in the fetch buffer now: the response frames holding records not handed out yet, each
    #: whole until every partition in it is read; at most about ``fetch_buffer_bytes``.
    buffer_bytes: int


@dataclass(frozen=True, slots=True)
class RebalanceMetrics:
    """Group membership (``group_id`` set and ``subscribe()`` used; otherwise zeros and ``None``)."""

    #: Rebalances completed: times the member reached the stable state (the first join included).
    count: int = 0
    #: How long the last completed rebalance took, in seconds (from leaving the stable state, or from
    #: the first join, to the stable state).
    last_duration: float | None = None
    #: The member's state now: ``"stable"``, ``"joining"``, ``"syncing"``, ``"assigning_partitions"``,
    #: ``"fenced"``... (the value of ``MemberState``), ``None`` without a group.
    member_state: str | None = None
    #: Classic: the group generation.  ``group_protocol="consumer"``: the member epoch.
    generation: int | None = None
    member_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitMetrics:
    """Offset commits (``commit()`` and auto-commit)."""

    #: Commits that completed.
    count: int = 0
    #: Commits that failed (a commit error, a time-out, a non-retriable error).
    failures: int = 0
    #: OffsetCommit request durations (a retried commit counts each request).
    latency: Latency = field(default_factory=Latency)


@dataclass(frozen=True, slots=True)
class ConnectionMetrics:
    """Broker connections."""

    #: Connections open now.
    open: int
    #: Connections opened so far (reconnects included).
    opened: int
    #: Failed connection attempts and connections lost.
    errors: int
    #: Connections opened to a broker this consumer had been connected to before.
    reconnects: int


@dataclass(frozen=True, slots=True)
class PoolMetrics:
    """One pool of large buffers used again (``engine/buffers.py``): what it keeps and how often
    a buffer it kept was used again instead of a new one."""

    #: Bytes of the buffers the pool keeps, in use or idle (at most ``fetch_buffer_bytes``; for
    #: frames, plus ``fetch_max_bytes`` and at most twice ``fetch_buffer_bytes``).
    held_bytes: int = 0
    #: Buffers the pool keeps, in use or idle.
    kept: int = 0
    #: Of those, the buffers in use now (something still points into them).
    in_use: int = 0
    #: Large buffers asked for that a kept buffer served / that got a new buffer.
    reused: int = 0
    allocated: int = 0
    #: Bytes of buffers the pool let go so far: of sizes that stopped coming, idle for longer
    #: than ``engine.buffers.IDLE_AFTER`` (30 s), or to make room.
    released_bytes: int = 0


@dataclass(frozen=True, slots=True)
class BufferMetrics:
    """The consumer's pools of large buffers: response frames, and ``arrow_batches()``' columns."""

    frames: PoolMetrics = field(default_factory=PoolMetrics)
    columns: PoolMetrics = field(default_factory=PoolMetrics)


@dataclass(frozen=True, slots=True)
class LoopMetrics:
    """How late the background loop runs: the event loop's lag (``managers/loop_lag.py``).  The loop
    is a task on the application's event loop; code that does not yield (a synchronous call,
    ``time.sleep``) holds it up, and with it heartbeats, fetches and commits."""

    #: How late the loop's latest turn was, in seconds (0: on time).
    lag: float = 0.0
    #: The largest lag since the consumer started, in seconds.
    lag_max: float = 0.0
    #: Lags of ``loop_lag_warning_ms`` or more (each named in a WARNING, rate-limited), and their
    #: total in seconds (0 with ``loop_lag_warning_ms=None``).
    blocks: int = 0
    blocked_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ConsumerMetrics:
    """A read-only snapshot of the consumer's counters, from :meth:`Consumer.metrics`."""

    #: One entry per assigned partition.
    partitions: Mapping[TopicPartition, PartitionMetrics]
    #: Records handed to the application (``getmany``, ``batches()``, ``async for``, partition streams).
    records_consumed: int
    #: Bytes of fetched record batches whose records were all taken for the application (counted
    #: when a poll finds the completed fetch used up).
    bytes_consumed: int
    fetch: FetchMetrics
    rebalances: RebalanceMetrics
    commits: CommitMetrics
    connections: ConnectionMetrics
    #: Seconds since the application last polled (``getmany``, ``getone``, ``batches()``, ``async for``...),
    #: 0 while a poll is waiting for records: an application stuck in its processing shows a growing
    #: age (liveness; past ``max_poll_interval_ms`` a group member leaves the group).
    last_poll_age: float
    #: The memory kept for large buffers (response frames, Arrow columns) and how well it is used again.
    buffers: BufferMetrics = field(default_factory=BufferMetrics)
    #: How late the background loop runs (a blocked event loop).
    loop: LoopMetrics = field(default_factory=LoopMetrics)
    #: Records a deserializer could not read that ``on_deserialization_error`` skipped ("skip", or a
    #: handler that returned); not in ``records_consumed``.
    records_skipped: int = 0

    @property
    def lag(self) -> int:
        """The total lag over the assigned partitions whose lag is known."""
        return sum(p.lag for p in self.partitions.values() if p.lag is not None)

    # The names of the first version of this snapshot.
    @property
    def fetch_responses(self) -> int:
        return self.fetch.responses

    @property
    def fetch_responses_by_node(self) -> Mapping[int, int]:
        return self.fetch.responses_by_node

    @property
    def connections_opened(self) -> int:
        return self.connections.opened


@dataclass(frozen=True, slots=True)
class ShareFetchMetrics:
    """ShareFetch requests, the records they acquired, and the fetch buffer."""

    #: ShareFetch requests sent.
    requests: int
    #: ShareFetch responses handled.
    responses: int
    #: Failed ShareFetch requests (lost connection, timeout, a top-level error code).
    errors: int
    #: Time from sending a ShareFetch to its response (the broker's ``fetch_max_wait_ms`` included).
    latency: Latency
    #: Records acquired for this member (each delivery counts: a record released and acquired again
    #: counts twice).
    records_acquired: int
    #: Record bytes received in ShareFetch responses, in all.
    response_bytes: int
    #: Bytes in the fetch buffer now (acquired, not handed out yet); at most about ``fetch_buffer_bytes``.
    buffer_bytes: int


@dataclass(frozen=True, slots=True)
class AcknowledgementMetrics:
    """Acknowledgements (accept, release, reject, renew), by record offset."""

    #: Offsets whose acknowledgement the broker confirmed.
    acknowledged: int
    #: Offsets whose acknowledgement failed (the lock ran out, the session was lost...): the broker
    #: delivers those records again, or archives them past the group's delivery limit.
    failed: int
    #: Offsets acknowledged by the application and not sent yet.
    pending: int
    #: ShareAcknowledge request durations (acknowledgements that ride on a ShareFetch are not timed
    #: separately).
    latency: Latency


@dataclass(frozen=True, slots=True)
class ShareMembershipMetrics:
    """The member of the share group."""

    #: ``"joining"`` (no assignment epoch yet), ``"stable"``, ``"leaving"`` or ``"left"``.
    state: str
    member_id: str
    #: The member epoch the coordinator gave (0 before joining).
    member_epoch: int
    #: Partitions assigned now.
    assignment: frozenset[TopicPartition]
    #: Times the assignment changed (the first assignment included).
    assignment_changes: int


@dataclass(frozen=True, slots=True)
class ShareConsumerMetrics:
    """A read-only snapshot of the share consumer's counters, from :meth:`ShareConsumer.metrics`."""

    #: Records handed to the application (``getmany``, ``getone``, ``async for``).
    records_delivered: int
    fetch: ShareFetchMetrics
    acknowledgements: AcknowledgementMetrics
    membership: ShareMembershipMetrics
    connections: ConnectionMetrics
    #: The memory kept for large response frames (``frames``; a share consumer has no ``columns``).
    buffers: BufferMetrics = field(default_factory=BufferMetrics)
    #: How late the background loop runs (a blocked event loop).
    loop: LoopMetrics = field(default_factory=LoopMetrics)
    #: Records a deserializer could not read that ``on_deserialization_error`` skipped (rejected:
    #: "skip", or a handler that returned); not in ``records_delivered``.
    records_skipped: int = 0


__all__ = [
    "LATENCY_BUCKETS",
    "AcknowledgementMetrics",
    "BufferMetrics",
    "CommitMetrics",
    "ConnectionMetrics",
    "ConsumerMetrics",
    "FetchMetrics",
    "Latency",
    "LatencyRecorder",
    "LoopMetrics",
    "PartitionMetrics",
    "PoolMetrics",
    "RebalanceMetrics",
    "ShareConsumerMetrics",
    "ShareFetchMetrics",
    "ShareMembershipMetrics",
]
