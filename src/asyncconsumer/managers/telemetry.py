"""Client metrics push (KIP-714): GetTelemetrySubscriptions, then PushTelemetry, sans-I/O.

The story, as Java's ``ClientTelemetryReporter`` tells it.  Once the loop runs, the manager asks
any broker for its subscription (``GetTelemetrySubscriptions`` with the zero client instance id):
the broker assigns this client an instance id and answers with the metric name prefixes it wants,
the push interval, the compression types it accepts, whether sums go as deltas, and the largest
payload.  With a subscription that asks for something, the first push goes out after the interval
times a random factor between 0.5 and 1.5 (so that clients started together do not push
together), and every interval after that: the consumer's metrics whose names start with one of
the prefixes (``*`` or an empty prefix: all of them), in OTLP ``MetricsData`` (``protocol/otlp.py``),
compressed with the first accepted type this client has a codec for (uncompressed otherwise).
A subscription that asks for nothing (the broker has no client metrics subscription for this
client, or no telemetry plugin) is asked for again each interval.

The numbers are the consumer's own counters (``Consumer.metrics()``/``ShareConsumer.metrics()``,
assembled by ``app/metrics.py``), read at each push through :attr:`TelemetryManager.source`; this
module only names them as Java's consumer does (``consumer_metrics``/``share_metrics``) and turns
running totals into what a push carries: a ``.total`` is a monotonic sum (the change since the
last push when the subscription asks for deltas, else the running total), a ``.rate`` is that
change per second, an ``.avg`` the mean over the requests since the last push.

Errors, as Java's client acts on them: UNKNOWN_SUBSCRIPTION_ID or UNSUPPORTED_COMPRESSION_TYPE ask
for the subscription again at once; TELEMETRY_TOO_LARGE or THROTTLING_QUOTA_EXCEEDED after the
interval; a request that got no answer (a lost connection, a time-out) after five minutes;
UNSUPPORTED_VERSION (a broker before Apache Kafka 3.7, or one without a telemetry plugin: its
ApiVersions answer lists no such API), INVALID_REQUEST, INVALID_RECORD or an error code not in
this list stop the pushing for good.  :meth:`TelemetryManager.close` (the client is closing) sends
one last push marked ``terminating``, which the broker takes whatever the interval.

The states and the moves between them are :data:`TRANSITIONS`.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from ..errors import (
    TelemetryTooLargeError,
    ThrottlingQuotaExceededError,
    UnknownSubscriptionIdError,
    UnsupportedCompressionTypeError,
    UnsupportedVersionError,
    error_for_code,
)
from ..metrics import ConsumerMetrics, Latency, ShareConsumerMetrics
from ..protocol import compression
from ..protocol.otlp import Attributes, DataPoint, Metric, Temporality, encode_metrics_data
from .requests import Body, UnsentRequest

log = logging.getLogger("asyncconsumer.telemetry")

__all__ = [
    "DEFAULT_PUSH_INTERVAL",
    "TRANSITIONS",
    "Reading",
    "Subscription",
    "TelemetryManager",
    "TelemetryState",
    "consumer_metrics",
    "resource_attributes",
    "share_metrics",
]

#: Seconds between pushes when the broker gives no interval, and the wait after a request that
#: got no answer (Java's ``ClientTelemetryReporter.DEFAULT_PUSH_INTERVAL_MS``).
DEFAULT_PUSH_INTERVAL = 300.0
#: The first push after a new subscription waits its interval times a factor in this range.
FIRST_PUSH_JITTER = (0.5, 1.5)
ZERO_UUID = bytes(16)
#: Java's metric name prefix: the domain, then the metric group less "-metrics", dotted.
CONSUMER = "org.apache.kafka.consumer."
_COORDINATOR = CONSUMER + "coordinator."
_FETCH_MANAGER = CONSUMER + "fetch.manager."
_SHARE = CONSUMER + "share."
_SHARE_FETCH_MANAGER = _SHARE + "fetch.manager."


class TelemetryState(Enum):
    SUBSCRIPTION_NEEDED = "subscription_needed"
    SUBSCRIPTION_IN_PROGRESS = "subscription_in_progress"
    PUSH_NEEDED = "push_needed"
    PUSH_IN_PROGRESS = "push_in_progress"
    TERMINATING_PUSH_NEEDED = "terminating_push_needed"
    TERMINATING_PUSH_IN_PROGRESS = "terminating_push_in_progress"
    #: Closed, or stopped for good (:attr:`TelemetryManager.stopped` says why).
    TERMINATED = "terminated"


S = TelemetryState
#: The states that wait for ``_next_at`` (read once a turn, without the enum class's lookups).
_WAITING = (S.SUBSCRIPTION_NEEDED, S.PUSH_NEEDED)
_TERMINATING_PUSH = S.TERMINATING_PUSH_NEEDED
#: Where each state may go next (Java's ``ClientTelemetryState.validateTransition``).
TRANSITIONS: dict[TelemetryState, frozenset[TelemetryState]] = {
    S.SUBSCRIPTION_NEEDED: frozenset({S.SUBSCRIPTION_IN_PROGRESS, S.TERMINATED}),
    S.SUBSCRIPTION_IN_PROGRESS: frozenset({S.PUSH_NEEDED, S.SUBSCRIPTION_NEEDED, S.TERMINATING_PUSH_NEEDED,
                                           S.TERMINATED}),
    S.PUSH_NEEDED: frozenset({S.PUSH_IN_PROGRESS, S.SUBSCRIPTION_NEEDED, S.TERMINATING_PUSH_NEEDED, S.TERMINATED}),
    S.PUSH_IN_PROGRESS: frozenset({S.PUSH_NEEDED, S.SUBSCRIPTION_NEEDED, S.TERMINATING_PUSH_NEEDED, S.TERMINATED}),
    S.TERMINATING_PUSH_NEEDED: frozenset({S.TERMINATING_PUSH_IN_PROGRESS, S.TERMINATED}),
    S.TERMINATING_PUSH_IN_PROGRESS: frozenset({S.TERMINATED}),
    S.TERMINATED: frozenset(),
}
_IN_PROGRESS = frozenset({S.SUBSCRIPTION_IN_PROGRESS, S.PUSH_IN_PROGRESS, S.TERMINATING_PUSH_IN_PROGRESS})
_TERMINATING = frozenset({S.TERMINATING_PUSH_NEEDED, S.TERMINATING_PUSH_IN_PROGRESS, S.TERMINATED})
#: Broker answers that ask for the subscription again at once / after the interval.
_RESUBSCRIBE_NOW = frozenset({UnknownSubscriptionIdError.code, UnsupportedCompressionTypeError.code})
_RESUBSCRIBE_LATER = frozenset({TelemetryTooLargeError.code, ThrottlingQuotaExceededError.code})


@dataclass(frozen=True, slots=True)
class Subscription:
    """What a GetTelemetrySubscriptions answer asked for."""

    client_instance_id: uuid.UUID
    subscription_id: int
    #: Seconds between pushes.
    interval: float
    #: Metric name prefixes pushed (``("",)``: every metric; ``()``: none).
    prefixes: tuple[str, ...]
    #: The codec pushes are compressed with (``protocol.compression.CODEC_*``).
    codec: int
    #: Sums go as the change since the last push (else as running totals).
    delta: bool
    #: The largest payload the broker takes (it answers TELEMETRY_TOO_LARGE to a larger one).
    max_bytes: int

    def wants(self, name: str) -> bool:
        return any(name.startswith(prefix) for prefix in self.prefixes)


@dataclass(frozen=True, slots=True)
class Reading:
    """One of the consumer's numbers, named as Java's consumer names it.

    ``kind``: ``"gauge"`` (pushed as it is), ``"meter"`` (a running total: pushed as ``NAME.total``,
    a monotonic sum, and ``NAME.rate``, its change per second), ``"total"`` (only the sum, as
    ``NAME`` itself) or ``"mean"`` (``value`` is a running sum and ``count`` the running number
    of events: pushed as the mean over the events since the last push, times ``scale``).
    """

    name: str
    kind: Literal["gauge", "meter", "total", "mean"]
    value: int | float
    attributes: Attributes = ()
    count: int = 0
    scale: float = 1.0


def resource_attributes(group_id: str | None, group_instance_id: str | None, client_rack: str) -> Attributes:
    """The resource attributes Java's consumer takes from its configuration."""
    named = (("group_id", group_id), ("group_instance_id", group_instance_id), ("client_rack", client_rack))
    return tuple((key, value) for key, value in named if value)


def _latency_ms(name: str, latency: Latency) -> Reading:
    return Reading(name, "mean", latency.sum, count=latency.count, scale=1000.0)


def _member_id(member_id: str | None) -> Attributes:
    return (("group_member_id", member_id),) if member_id else ()


def consumer_metrics(m: ConsumerMetrics, group: bool) -> tuple[Attributes, list[Reading]]:
    """``Consumer.metrics()`` as Java's consumer pushes it: the member id as a resource
    attribute and the readings (``group``: the consumer has a ``group_id``, which adds Java's
    coordinator metrics)."""
    fetch = m.fetch
    lags = [p.lag for p in m.partitions.values() if p.lag is not None]
    readings = [
        Reading(CONSUMER + "connection.count", "gauge", m.connections.open),
        Reading(CONSUMER + "connection.creation", "meter", m.connections.opened),
        Reading(CONSUMER + "last.poll.seconds.ago", "gauge", float(m.last_poll_age)),
        Reading(_FETCH_MANAGER + "fetch", "meter", fetch.requests),
        _latency_ms(_FETCH_MANAGER + "fetch.latency.avg", fetch.latency),
        Reading(_FETCH_MANAGER + "fetch.size.avg", "mean", fetch.response_bytes, count=fetch.responses),
        Reading(_FETCH_MANAGER + "bytes.consumed", "meter", m.bytes_consumed),
        Reading(_FETCH_MANAGER + "records.consumed", "meter", m.records_consumed),
    ]
    if lags:
        readings.append(Reading(_FETCH_MANAGER + "records.lag.max", "gauge", float(max(lags))))
    readings += [
        Reading(_FETCH_MANAGER + "records.lag", "gauge", float(p.lag),
                (("topic", p.topic), ("partition", str(p.partition))))
        for p in m.partitions.values() if p.lag is not None
    ]
    if group:
        readings += [
            Reading(_COORDINATOR + "assigned.partitions", "gauge", float(len(m.partitions))),
            Reading(_COORDINATOR + "commit", "meter", m.commits.count),
            _latency_ms(_COORDINATOR + "commit.latency.avg", m.commits.latency),
            Reading(_COORDINATOR + "rebalance.total", "total", m.rebalances.count),
        ]
    return _member_id(m.rebalances.member_id), readings


def share_metrics(m: ShareConsumerMetrics) -> tuple[Attributes, list[Reading]]:
    """``ShareConsumer.metrics()`` as Java's share consumer pushes it (its network metrics keep
    the consumer's names; the rest are under ``org.apache.kafka.consumer.share.``)."""
    fetch, acks = m.fetch, m.acknowledgements
    readings = [
        Reading(CONSUMER + "connection.count", "gauge", m.connections.open),
        Reading(CONSUMER + "connection.creation", "meter", m.connections.opened),
        Reading(_SHARE_FETCH_MANAGER + "fetch", "meter", fetch.requests),
        _latency_ms(_SHARE_FETCH_MANAGER + "fetch.latency.avg", fetch.latency),
        Reading(_SHARE_FETCH_MANAGER + "fetch.size.avg", "mean", fetch.response_bytes, count=fetch.responses),
        Reading(_SHARE_FETCH_MANAGER + "bytes.consumed", "meter", fetch.response_bytes),
        Reading(_SHARE_FETCH_MANAGER + "records.consumed", "meter", m.records_delivered),
        Reading(_SHARE_FETCH_MANAGER + "acknowledgements.send", "meter", acks.acknowledged + acks.failed),
        Reading(_SHARE_FETCH_MANAGER + "acknowledgements.error", "meter", acks.failed),
        Reading(_SHARE + "coordinator.rebalance.total", "total", m.membership.assignment_changes),
    ]
    return _member_id(m.membership.member_id), readings


Snapshot = ConsumerMetrics | ShareConsumerMetrics


class TelemetryManager:
    """The KIP-714 request manager (module docstring).  ``resource``: the resource attributes
    from the configuration (``group_id``, ``group_instance_id``, ``client_rack``); ``group``: the
    consumer has a group (Java's coordinator metrics); ``retry_backoff``: seconds after a failed
    request before the next; ``wall_clock`` (nanoseconds since the epoch, for the data points) and
    ``uniform`` (the first push's jitter) are there for tests."""

    def __init__(
        self,
        *,
        resource: Attributes,
        group: bool,
        wall_clock: Callable[[], int] = time.time_ns,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self._resource = resource
        self._group = group
        self._wall_clock = wall_clock
        self._uniform = uniform
        #: The consumer's metrics snapshot, read at each push (set by the application side).
        self.source: Callable[[], Snapshot | None] | None = None
        self.state = TelemetryState.SUBSCRIPTION_NEEDED
        self.subscription: Subscription | None = None
        #: Why pushing stopped for good (None while it goes on or after a plain close).
        self.stopped: str | None = None
        #: Pushes the broker took (the terminating one included).
        self.pushes = 0
        self._next_at = -math.inf
        self._started_ns = wall_clock()
        self._started: float | None = None
        # The last push's running values (for deltas, rates and means) and when it went out.
        self._last: dict[tuple[str, Attributes], tuple[float, int]] = {}
        self._last_at: float | None = None
        self._last_ns = self._started_ns
        self._member: Attributes = ()

    @property
    def client_instance_id(self) -> uuid.UUID | None:
        """The id the broker assigned to this client (None until the first subscription)."""
        return self.subscription.client_instance_id if self.subscription is not None else None

    @property
    def done(self) -> bool:
        """Nothing more will be sent (closed, or stopped for good)."""
        return self.state is TelemetryState.TERMINATED

    def _move(self, state: TelemetryState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"telemetry: no move from {self.state.value} to {state.value}")
        self.state = state

    def _stop(self, reason: str) -> None:
        if self.state is not TelemetryState.TERMINATED:
            log.info("client metrics push stopped: %s", reason)
            self.stopped = reason
            self._move(TelemetryState.TERMINATED)

    # -- the loop's side ---------------------------------------------------------------------------

    def next_deadline(self, now: float) -> float:
        state = self.state
        if state in _WAITING:
            return max(now, self._next_at)
        if state is _TERMINATING_PUSH:
            return now
        return math.inf

    def poll(self, now: float) -> list[UnsentRequest]:
        if self._started is None:
            self._started = self._last_at = now
        state = self.state
        if state is _TERMINATING_PUSH:
            return self._push(now, terminating=True)
        if now < self._next_at:
            return []  # nothing is due (the turns in between)
        if state is S.SUBSCRIPTION_NEEDED:
            self._move(S.SUBSCRIPTION_IN_PROGRESS)
            instance = self.subscription.client_instance_id.bytes if self.subscription is not None else ZERO_UUID
            return [UnsentRequest("GetTelemetrySubscriptions", lambda version: {"client_instance_id": instance},
                                  self._on_subscription, self._on_subscription_error)]
        if state is S.PUSH_NEEDED:
            return self._push(now, terminating=False)
        return []

    def close(self, now: float) -> None:
        """The client is closing: one last push marked terminating if a subscription is in hand,
        else nothing more (:attr:`done`)."""
        if self.state in _TERMINATING:
            return
        if self.subscription is not None and self.subscription.prefixes:
            self._move(S.TERMINATING_PUSH_NEEDED)
        else:
            self._move(S.TERMINATED)

    # -- GetTelemetrySubscriptions -----------------------------------------------------------------

    def _on_subscription(self, now: float, version: int, body: Body) -> None:
        if self.state is not S.SUBSCRIPTION_IN_PROGRESS:
            return  # closed meanwhile
        if body["error_code"]:
            self._on_error_code(now, body["error_code"])
            return
        if body["client_instance_id"] == ZERO_UUID:
            self._stop("the broker assigned no client instance id")
            return
        old = self.subscription
        interval = body["push_interval_ms"] / 1000 if body["push_interval_ms"] > 0 else DEFAULT_PUSH_INTERVAL
        requested = tuple(body["requested_metrics"] or ())
        self.subscription = Subscription(
            client_instance_id=uuid.UUID(bytes=bytes(body["client_instance_id"])),
            subscription_id=body["subscription_id"],
            interval=interval,
            prefixes=("",) if "*" in requested else requested,
            codec=next((c for c in body["accepted_compression_types"]
                        if c in compression.CODEC_NAMES and compression.has_codec(c)), compression.CODEC_NONE),
            delta=body["delta_temporality"],
            max_bytes=body["telemetry_max_bytes"],
        )
        if old is None or old.client_instance_id != self.subscription.client_instance_id:
            log.info("client metrics push: the broker assigned client instance id %s",
                     self.subscription.client_instance_id)
        if not requested:
            # Nothing asked for: ask again after the interval.
            self._move(S.SUBSCRIPTION_NEEDED)
            self._next_at = now + interval
            return
        log.debug("client metrics push: %s every %.1f s (%s)", ", ".join(requested), interval,
                  compression.CODEC_NAMES[self.subscription.codec])
        self._move(S.PUSH_NEEDED)
        self._next_at = now + interval * self._uniform(*FIRST_PUSH_JITTER)

    def _on_subscription_error(self, now: float, error: BaseException) -> None:
        if self.state is S.SUBSCRIPTION_IN_PROGRESS:
            self._on_failed_request(now, error)

    # -- PushTelemetry ------------------------------------------------------------------------------

    def _push(self, now: float, *, terminating: bool) -> list[UnsentRequest]:
        subscription = self.subscription
        assert subscription is not None  # PUSH_NEEDED and TERMINATING_PUSH_NEEDED come with one
        try:
            payload = self._payload(now, subscription)
        except Exception:
            log.warning("client metrics push: the metrics could not be read; trying again next interval",
                        exc_info=True)
            if terminating:
                self._move(S.TERMINATED)
            else:
                self._next_at = now + subscription.interval
            return []
        codec = subscription.codec
        try:
            data = compression.compress(codec, payload)
        except Exception:
            log.info("client metrics push: %s compression failed, sending uncompressed",
                     compression.CODEC_NAMES[codec], exc_info=True)
            codec, data = compression.CODEC_NONE, payload
        self._move(S.TERMINATING_PUSH_IN_PROGRESS if terminating else S.PUSH_IN_PROGRESS)
        body = {
            "client_instance_id": subscription.client_instance_id.bytes,
            "subscription_id": subscription.subscription_id,
            "terminating": terminating,
            "compression_type": codec,
            "metrics": data,
        }
        return [UnsentRequest(
            "PushTelemetry", lambda version: body,
            lambda now, version, answer: self._on_push(now, answer, terminating),
            lambda now, error: self._on_push_error(now, error, terminating),
        )]

    def _on_push(self, now: float, body: Body, terminating: bool) -> None:
        if terminating:
            if not body["error_code"]:
                self.pushes += 1
            self._move(S.TERMINATED)
            return
        if self.state is not S.PUSH_IN_PROGRESS:
            return  # closing meanwhile: the terminating push follows
        if body["error_code"]:
            self._on_error_code(now, body["error_code"])
            return
        self.pushes += 1
        assert self.subscription is not None
        self._move(S.PUSH_NEEDED)
        self._next_at = now + self.subscription.interval

    def _on_push_error(self, now: float, error: BaseException, terminating: bool) -> None:
        if terminating:
            self._move(S.TERMINATED)
        elif self.state is S.PUSH_IN_PROGRESS:
            self._on_failed_request(now, error)

    # -- errors --------------------------------------------------------------------------------------

    def _on_error_code(self, now: float, code: int) -> None:
        error = error_for_code(code)
        interval = self.subscription.interval if self.subscription is not None else DEFAULT_PUSH_INTERVAL
        if code in _RESUBSCRIBE_NOW:
            wait = 0.0
        elif code in _RESUBSCRIBE_LATER:
            wait = interval
        else:  # UNSUPPORTED_VERSION, INVALID_REQUEST, INVALID_RECORD and the unexpected
            self._stop(f"the broker answered {type(error).__name__}: {error}")
            return
        log.debug("client metrics push: the broker answered %s; asking for the subscription again in %.1f s",
                  type(error).__name__, wait)
        self._move(S.SUBSCRIPTION_NEEDED)
        self._next_at = now + wait

    def _on_failed_request(self, now: float, error: BaseException) -> None:
        if isinstance(error, UnsupportedVersionError):
            # A broker before Apache Kafka 3.7, or one without a telemetry plugin, lists no such API.
            self._stop(f"the cluster takes no pushed client metrics (no telemetry plugin, or Apache Kafka "
                       f"before 3.7): {error}")
            return
        log.debug("client metrics push: a request got no answer (%s); asking for the subscription again in %.0f s",
                  error, DEFAULT_PUSH_INTERVAL)
        self._move(S.SUBSCRIPTION_NEEDED)
        self._next_at = now + DEFAULT_PUSH_INTERVAL

    # -- the payload ---------------------------------------------------------------------------------

    def _payload(self, now: float, subscription: Subscription) -> bytes:
        source = self.source
        snapshot = source() if source is not None else None
        if isinstance(snapshot, ConsumerMetrics):
            member, readings = consumer_metrics(snapshot, self._group)
        elif isinstance(snapshot, ShareConsumerMetrics):
            member, readings = share_metrics(snapshot)
        else:
            member, readings = (), []
        # The member id stays once known (a member that left still pushes as itself), as Java's labels do.
        member = self._member = member or self._member
        wall = self._wall_clock()
        since = self._last_at if self._last_at is not None else now
        metrics = list(self._metrics(readings, subscription, max(now - since, 1e-9), wall))
        self._last_at, self._last_ns = now, wall
        return encode_metrics_data(self._resource + member, metrics)

    def _metrics(self, readings: Iterable[Reading], subscription: Subscription, elapsed: float,
                 wall: int) -> Iterable[Metric]:
        temporality = Temporality.DELTA if subscription.delta else Temporality.CUMULATIVE
        start = self._last_ns if subscription.delta else self._started_ns
        by_name: dict[tuple[str, str], list[DataPoint]] = {}

        def add(name: str, kind: str, point: DataPoint) -> None:
            if subscription.wants(name):
                by_name.setdefault((name, kind), []).append(point)

        for reading in readings:
            if reading.kind == "gauge":  # doubles, as Java's measurables push
                add(reading.name, "gauge", DataPoint(float(reading.value), wall, 0, reading.attributes))
                continue
            key = (reading.name, reading.attributes)
            last_value, last_count = self._last.get(key, (0, 0))
            self._last[key] = (reading.value, reading.count)
            change = reading.value - last_value
            if reading.kind == "mean":
                if reading.count > last_count:  # no events since the last push: no mean to push
                    mean = change / (reading.count - last_count) * reading.scale
                    add(reading.name, "gauge", DataPoint(float(mean), wall, 0, reading.attributes))
            else:
                total = float(change if subscription.delta else reading.value)
                name = reading.name + ".total" if reading.kind == "meter" else reading.name
                add(name, "sum", DataPoint(total, wall, start, reading.attributes))
                if reading.kind == "meter":
                    add(reading.name + ".rate", "gauge", DataPoint(change / elapsed, wall, 0, reading.attributes))
        for (name, kind), points in by_name.items():
            yield Metric(name, "gauge" if kind == "gauge" else "sum", tuple(points), temporality)
