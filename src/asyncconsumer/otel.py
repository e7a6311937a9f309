"""OpenTelemetry: the consumer's metrics through a ``MeterProvider``, and a ``process`` span helper.

Optional: needs ``opentelemetry-api`` (the ``otel`` extra), imported only when used.  A consumer
reports to the ``meter_provider=`` option, else to the global ``MeterProvider``; without
``opentelemetry-api`` installed and no ``meter_provider`` it reports nothing and costs nothing.
The instruments follow OpenTelemetry's messaging semantic conventions (docs/metrics.md):

- ``messaging.client.consumed.messages`` (counter, observed): records handed to the application, per
  partition;
- ``messaging.client.operation.duration`` (histogram, seconds): fetch and commit requests,
  ``messaging.operation.name`` ``"fetch"`` or ``"commit"``; for a ``ShareConsumer``, ShareFetch
  (``"fetch"``) and ShareAcknowledge (``"ack"``, type ``"settle"``) requests;
- ``kafka.consumer.records_lag`` (observable gauge): per assigned partition, as ``Consumer.metrics()``
  (not for a ``ShareConsumer``: a share group has no position per member);
- ``asyncconsumer.loop.lag`` and ``asyncconsumer.loop.lag.max`` (observable gauges, seconds) and
  ``asyncconsumer.loop.blocks`` (counter, observed): how late the background loop runs, as
  ``metrics().loop`` (a blocked event loop).
- ``kafka.consumer.records_skipped`` (counter, observed): records a deserializer could not read
  that ``on_deserialization_error`` skipped, per partition.

Attributes: ``messaging.system="kafka"``, ``messaging.destination.name``,
``messaging.destination.partition.id`` and ``messaging.consumer.group.name`` (with a ``group_id``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ._version import __version__
from .structs import ConsumerRecord, TopicPartition

if TYPE_CHECKING:
    from .config import ConsumerConfig
    from .engine.core import LoopCore
    from .engine.loop import Engine

#: Bucket bounds (seconds) the semantic conventions advise for ``messaging.client.operation.duration``.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
#: The request APIs timed, by their operation name and type.
OPERATIONS = {
    "Fetch": ("fetch", "receive"),
    "OffsetCommit": ("commit", "settle"),
    "ShareFetch": ("fetch", "receive"),
    "ShareAcknowledge": ("ack", "settle"),
}

Attributes = dict[str, str | int]


def available() -> bool:
    """``opentelemetry-api`` is installed."""
    return importlib.util.find_spec("opentelemetry") is not None and (
        importlib.util.find_spec("opentelemetry.metrics") is not None
    )


class ConsumerTelemetry:
    """The instruments of one consumer: request durations recorded through the network client's
    ``observe_request`` hook; consumed records and lag observed at collection time.  ``engine``
    None (a share consumer: no position per member) registers no lag gauge."""

    def __init__(
        self,
        meter_provider: Any,
        config: ConsumerConfig,
        engine: Callable[[], Engine | None] | None,
        consumed: Callable[[], Mapping[TopicPartition, int]] = dict,
        skipped: Callable[[], Mapping[TopicPartition, int]] = dict,
    ) -> None:
        self._engine = engine
        self._consumed = consumed
        self._skipped = skipped
        self._read_committed = config.isolation_level == "read_committed"
        base: Attributes = {"messaging.system": "kafka"}
        if config.group_id is not None:
            base["messaging.consumer.group.name"] = config.group_id
        self._base = base
        self._partition_attributes: dict[TopicPartition, Attributes] = {}
        self._operation_attributes: dict[str, Attributes] = {}
        meter = meter_provider.get_meter("asyncconsumer", __version__)
        # Observed at collection from the counts Consumer.metrics() keeps: a counter's data (a monotonic
        # sum) at no cost per chunk of records (a synchronous add costs microseconds each).
        self.consumed_messages = meter.create_observable_counter(
            "messaging.client.consumed.messages",
            callbacks=[self._observe_consumed],
            unit="{message}",
            description="Records handed to the application.",
        )
        self.records_skipped = meter.create_observable_counter(
            "kafka.consumer.records_skipped",
            callbacks=[self._observe_skipped],
            unit="{message}",
            description="Records a deserializer could not read that on_deserialization_error skipped.",
        )
        try:
            self.operation_duration = meter.create_histogram(
                "messaging.client.operation.duration",
                unit="s",
                description="Duration of fetch and commit requests.",
                explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
            )
        except TypeError:  # opentelemetry-api before 1.23 takes no advisory bounds
            self.operation_duration = meter.create_histogram(
                "messaging.client.operation.duration", unit="s", description="Duration of fetch and commit requests."
            )
        self.records_lag = None if engine is None else meter.create_observable_gauge(
            "kafka.consumer.records_lag",
            callbacks=[self._observe_lag],
            unit="{message}",
            description="Records between the position and the end of an assigned partition.",
        )
        #: The background loop whose lag is observed (``attach``).
        self._loop: weakref.ref[LoopCore] | None = None
        self.loop_lag = meter.create_observable_gauge(
            "asyncconsumer.loop.lag",
            callbacks=[lambda options: self._observe_loop("lag")],
            unit="s",
            description="How late the consumer's background loop ran its latest turn (a blocked event loop).",
        )
        self.loop_lag_max = meter.create_observable_gauge(
            "asyncconsumer.loop.lag.max",
            callbacks=[lambda options: self._observe_loop("max_lag")],
            unit="s",
            description="The largest lag of the consumer's background loop since it started.",
        )
        self.loop_blocks = meter.create_observable_counter(
            "asyncconsumer.loop.blocks",
            callbacks=[lambda options: self._observe_loop("blocks")],
            unit="{block}",
            description="Times the event loop was blocked for loop_lag_warning_ms or longer.",
        )

    def partition_attributes(self, tp: TopicPartition) -> Attributes:
        attributes = self._partition_attributes.get(tp)
        if attributes is None:
            attributes = {
                **self._base,
                "messaging.operation.name": "poll",
                "messaging.operation.type": "receive",
                "messaging.destination.name": tp.topic,
                "messaging.destination.partition.id": str(tp.partition),
            }
            self._partition_attributes[tp] = attributes
        return attributes

    def _observe_consumed(self, options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(count, self.partition_attributes(tp)) for tp, count in self._consumed().items()]

    def _observe_skipped(self, options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(count, self._topic_attributes(tp)) for tp, count in self._skipped().items()]

    def _topic_attributes(self, tp: TopicPartition) -> Attributes:
        """A partition's attributes without the operation (what lag and skips are reported with)."""
        return {k: v for k, v in self.partition_attributes(tp).items() if not k.startswith("messaging.op")}

    def request_done(self, api: str, seconds: float, error: BaseException | None) -> None:
        attributes = self._operation_attributes.get(api)
        if attributes is None:
            name, kind = OPERATIONS.get(api, (api, "receive"))
            attributes = {**self._base, "messaging.operation.name": name, "messaging.operation.type": kind}
            self._operation_attributes[api] = attributes
        if error is not None:
            attributes = {**attributes, "error.type": type(error).__name__}
        self.operation_duration.record(seconds, attributes)

    def watch_loop(self, engine: LoopCore) -> None:
        self._loop = weakref.ref(engine)

    def _observe_loop(self, name: str) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        engine = self._loop() if self._loop is not None else None
        if engine is None or engine.closed:
            return []
        return [Observation(getattr(engine.loop_lag, name), self._base)]

    def _observe_lag(self, options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        engine = self._engine() if self._engine is not None else None
        if engine is None or engine.closed:
            return []
        observations = []
        for tp, state in list(engine.subscriptions.partitions.items()):
            end = state.last_stable_offset if self._read_committed else state.high_watermark
            if end < 0 or not state.has_position or state.consumed < 0:
                continue
            observations.append(Observation(max(0, end - state.consumed), self._topic_attributes(tp)))
        return observations


def telemetry_for(
    config: ConsumerConfig,
    engine: Callable[[], Engine | None] | None,
    consumed: Callable[[], Mapping[TopicPartition, int]] = dict,
    skipped: Callable[[], Mapping[TopicPartition, int]] = dict,
) -> ConsumerTelemetry | None:
    """The consumer's instruments: on ``config.meter_provider``, else on the global ``MeterProvider``
    when ``opentelemetry-api`` is installed; ``None`` (nothing reported) otherwise."""
    provider = config.meter_provider
    if provider is None:
        if not available():
            return None
        from opentelemetry import metrics

        provider = metrics.get_meter_provider()
    return ConsumerTelemetry(provider, config, engine, consumed, skipped)


def attach(engine: LoopCore, telemetry: ConsumerTelemetry | None) -> None:
    """Connect the instruments to a new engine (no-op for ``None``)."""
    if telemetry is not None:
        engine.network.observe_request = telemetry.request_done
        telemetry.watch_loop(engine)


# -- tracing ----------------------------------------------------------------------------------------


class _HeaderGetter:
    """Reads W3C trace context (``traceparent``, ``tracestate``) from Kafka record headers."""

    def get(self, carrier: Mapping[str, bytes | None], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        return [value.decode("utf-8", "replace")]

    def keys(self, carrier: Mapping[str, bytes | None]) -> list[str]:
        return list(carrier)


_HEADERS = _HeaderGetter()


def _carrier(record: ConsumerRecord[Any, Any]) -> dict[str, bytes | None]:
    return {key.lower(): value for key, value in record.headers}


def extract_context(record: ConsumerRecord[Any, Any]) -> Any:
    """The OpenTelemetry context propagated in the record's headers (W3C ``traceparent``), through
    the global propagator."""
    from opentelemetry import propagate

    return propagate.extract(_carrier(record), getter=cast(Any, _HEADERS))


@contextlib.contextmanager
def process_span(
    records: ConsumerRecord[Any, Any] | Sequence[ConsumerRecord[Any, Any]],
    *,
    consumer_group: str | None = None,
    tracer_provider: Any = None,
) -> Iterator[Any]:
    """A ``process`` span (kind CONSUMER) around handling one record or one batch::

        async for batch in consumer.batches():
            with process_span(batch, consumer_group="billing") as span:
                handle(batch)

    One record: its span is a child of the trace context in the record's ``traceparent`` header.
    A batch: the span links to each record's context (the messaging conventions' batch form).
    An exception leaving the block is recorded on the span, which is marked as an error.
    """
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    single = isinstance(records, ConsumerRecord)
    batch = (
        [cast("ConsumerRecord[Any, Any]", records)] if single else cast("Sequence[ConsumerRecord[Any, Any]]", records)
    )
    if not batch:
        raise ValueError("process_span needs a record or a non-empty batch")
    first = batch[0]
    topics = {r.topic for r in batch}
    partitions = {r.partition for r in batch}
    attributes: Attributes = {
        "messaging.system": "kafka",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
    }
    if len(topics) == 1:
        attributes["messaging.destination.name"] = first.topic
        if len(partitions) == 1:
            attributes["messaging.destination.partition.id"] = str(first.partition)
    if consumer_group is not None:
        attributes["messaging.consumer.group.name"] = consumer_group
    tracer = trace.get_tracer("asyncconsumer", __version__, tracer_provider=tracer_provider)
    name = f"process {first.topic}" if len(topics) == 1 else "process"
    if single:
        attributes["messaging.kafka.offset"] = first.offset
        context = extract_context(first)
        with tracer.start_as_current_span(name, context=context, kind=SpanKind.CONSUMER,
                                          attributes=attributes) as span:
            yield span
        return
    attributes["messaging.batch.message_count"] = len(batch)
    links = []
    for record in batch:
        span_context = trace.get_current_span(extract_context(record)).get_span_context()
        if span_context.is_valid:
            links.append(Link(span_context))
    with tracer.start_as_current_span(name, kind=SpanKind.CONSUMER, attributes=attributes, links=links) as span:
        yield span


__all__ = ["ConsumerTelemetry", "available", "extract_context", "process_span", "telemetry_for"]
