"""Options of the ``asyncconsumer`` Spark source, parsed and checked on the driver.

The names and meanings follow Spark's own Kafka source (``spark-sql-kafka``) so that an existing
job switches by changing the format name.  Everything is checked when the DataFrame is defined
(``load()``) and when the query is planned, so a bad option is a :class:`SourceOptionError` with a
plain message before any Spark task runs.

This module has no PySpark import: it is plain Python and is unit tested on its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from ..config import from_properties
from ..errors import ConfigError
from ..structs import TopicPartition
from .java_regex import JavaRegexError
from .java_regex import translate as java_regex_translate

__all__ = [
    "EARLIEST",
    "LATEST",
    "REGISTRY_PROPERTIES",
    "ColumnFormat",
    "OffsetSpec",
    "RegistryOptions",
    "SourceOptionError",
    "SourceOptions",
    "Subscription",
    "parse_options",
]

#: In per-partition offsets JSON, ``-2`` means the earliest offset and ``-1`` the latest (as in Spark).
EARLIEST = -2
LATEST = -1

# Spark's option names, spelled as its documentation spells them (matching is case-insensitive).
_SUBSCRIPTION_OPTIONS = ("assign", "subscribe", "subscribePattern")
# In Spark's order of precedence: the first one set wins.
_START_OPTIONS = ("startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets")
_END_OPTIONS = ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
_KNOWN = (
    *_SUBSCRIPTION_OPTIONS,
    *_START_OPTIONS,
    *_END_OPTIONS,
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "includeHeaders",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "groupIdPrefix",
    "commitOffsetsToGroup",
    "kafkaConsumer.pollTimeoutMs",
    "consumerCacheTimeout",
    "minRecordsPerTask",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "keyFormat",
    "valueFormat",
    "keySchema",
    "valueSchema",
    "keySchemaSubject",
    "valueSchemaSubject",
    "schemaRegistryUrl",
)
#: The ``schemaRegistry.<property>`` options: confluent-kafka's ``SchemaRegistryClient`` settings of
#: the same names, and what each becomes.  The secrets among them never appear in a repr or an error.
REGISTRY_PROPERTIES = {
    "basic.auth.user.info": "'user:password' for HTTP basic authentication (Confluent Cloud: 'key:secret')",
    "ssl.ca.location": "a PEM file of the CAs to trust instead of the system's",
    "ssl.certificate.location": "a PEM client certificate (with ssl.key.location)",
    "ssl.key.location": "the PEM private key of ssl.certificate.location",
    "ssl.key.password": "the password of ssl.key.location",
    "timeout.ms": "how long one lookup may take, retries included (default 10000)",
}
#: The formats of ``keyFormat`` / ``valueFormat``.
_FORMATS = ("binary", "avro")
# The kafka.* parameters Spark rejects (KafkaSourceProvider.validateGeneralOptions): the source
# manages these itself.
_FORBIDDEN_KAFKA = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint; the source never auto-commits",
    "key.deserializer": "keys are always returned as binary; cast or parse them with DataFrame operations",
    "value.deserializer": "values are always returned as binary; cast or parse them with DataFrame operations",
    "interceptor.classes": "consumer interceptors can change what is read, so Spark does not allow them either",
}
#: ``consumerCacheTimeout``'s default: 5 minutes, as Spark's own consumer cache
#: (``spark.kafka.consumer.cache.timeout``); 0 closes each task's consumer when the task ends.
DEFAULT_CONSUMER_CACHE_TIMEOUT_MS = 5 * 60 * 1000
#: ``minRecordsPerTask``'s default: ranges smaller than this are read together by one task.
DEFAULT_MIN_RECORDS_PER_TASK = 10_000
#: ``maxTriggerDelay``'s default, as in Spark: 15 minutes.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
# Spark's time strings (JavaUtils.timeStringAsMs): a number and an optional unit; no unit is ms.
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME_STRING = re.compile(r"(-?[0-9]+)([a-z]+)?")
_CANONICAL = {name.lower(): name for name in _KNOWN}
_STRATEGIES = ("error", "latest")


class SourceOptionError(ValueError):
    """An option of the ``asyncconsumer`` source is missing, unknown, malformed or conflicting."""


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: ``assign`` (fixed), ``subscribe`` (topic names) or ``subscribePattern``."""

    kind: Literal["assign", "subscribe", "subscribePattern"]
    topics: tuple[str, ...] = ()
    #: ``subscribePattern`` as given: a Java regular expression, as in Spark.
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()
    #: ``pattern`` translated to Python's ``re`` syntax (:func:`~asyncconsumer.spark.java_regex.translate`).
    regex: str = ""

    def describe(self) -> str:
        if self.kind == "assign":
            return "assign=" + ",".join(str(tp) for tp in self.partitions)
        if self.kind == "subscribe":
            return "subscribe=" + ",".join(self.topics)
        return f"subscribePattern={self.pattern}"

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.regex, topic) is not None
        return any(tp.topic == topic for tp in self.partitions)


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a read starts or ends.

    ``kind``:

    - ``"earliest"`` / ``"latest"``;
    - ``"offsets"``: ``offsets`` maps each partition to an offset, ``EARLIEST`` or ``LATEST``;
    - ``"timestamp"``: every partition at the first offset whose timestamp is >= ``timestamp`` (ms);
    - ``"timestamps"``: ``timestamps`` maps each partition to a timestamp (ms).

    ``strategy`` says what happens when no record is at or after the timestamp: ``"error"`` or
    ``"latest"`` (ending offsets always use the latest offset, as in Spark).
    """

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    offsets: tuple[tuple[TopicPartition, int], ...] = ()
    timestamp: int = -1
    timestamps: tuple[tuple[TopicPartition, int], ...] = ()
    strategy: Literal["error", "latest"] = "error"
    option: str = ""

    @property
    def offsets_map(self) -> dict[TopicPartition, int]:
        return dict(self.offsets)

    @property
    def timestamps_map(self) -> dict[TopicPartition, int]:
        return dict(self.timestamps)


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnFormat:
    """``keyFormat=avro`` / ``valueFormat=avro``: the column is decoded from the schema registry's
    Avro into a typed one.  Its reader schema is ``schema`` (``valueSchema``, Avro JSON) or the
    ``subject``'s version (``valueSchemaSubject``, by default ``<topic>-value``): ``version`` None
    means its latest, which the driver looks up when the query is planned and pins for the
    executors."""

    field: Literal["key", "value"]
    schema: str | None = None
    subject: str | None = None
    version: int | None = None

    def describe(self) -> str:
        if self.schema is not None:
            return f"{self.field}Schema"
        return f"subject {self.subject!r}" + ("" if self.version is None else f" version {self.version}")


@dataclasses.dataclass(frozen=True, slots=True)
class RegistryOptions:
    """``schemaRegistryUrl`` and the ``schemaRegistry.*`` options (:data:`REGISTRY_PROPERTIES`).
    Its repr shows the URL without credentials and no secret."""

    url: str
    properties: tuple[tuple[str, str], ...] = ()

    def get(self, name: str) -> str | None:
        return dict(self.properties).get(name)

    def __repr__(self) -> str:
        shown = [name for name, _ in self.properties if name not in ("basic.auth.user.info", "ssl.key.password")]
        secret = [name for name, _ in self.properties if name not in shown]
        return (
            f"RegistryOptions(url={_shown_url(self.url)!r}, properties={shown!r}"
            + (f", secrets={secret!r} (hidden)" if secret else "") + ")"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every option, parsed.  Picklable: it travels with the reader to the executors."""

    subscription: Subscription
    #: ``kafka.*`` options without the prefix, as given (dotted names for ``Consumer.from_properties``).
    kafka_params: tuple[tuple[str, str], ...] = dataclasses.field(repr=False)  # may hold a password
    starting: OffsetSpec
    ending: OffsetSpec | None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    #: ``minOffsetsPerTrigger``: a micro-batch waits for this many new records, or for
    #: ``max_trigger_delay_ms`` since the last batch (as in Spark; not with availableNow).
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    #: The group that ``commitOffsetsToGroup`` commits to (``kafka.group.id``, else from
    #: ``groupIdPrefix``); None when nothing is committed, which is the default, as in Spark.
    group_id: str | None = None
    poll_timeout_ms: int = 120_000
    #: ``consumerCacheTimeout`` (ours): how long an executor's consumer stays open, idle, for the
    #: next task of its Python worker with the same ``kafka.*`` options; 0 (the default) closes it
    #: after each task.
    consumer_cache_timeout_ms: int = DEFAULT_CONSUMER_CACHE_TIMEOUT_MS
    #: ``minRecordsPerTask`` (ours): a read's offset ranges of fewer records than this are packed
    #: into tasks of at least this many (each Python task costs PySpark tens of milliseconds; a
    #: continuously running query's micro-batches are small).  0: one task per range, as Spark.
    #: Not applied when ``minPartitions`` or ``maxRecordsPerPartition`` asks for task sizes.
    min_records_per_task: int = DEFAULT_MIN_RECORDS_PER_TASK
    #: ``keyFormat=avro`` / ``valueFormat=avro``: how the column is decoded (None: raw binary).
    key_format: ColumnFormat | None = None
    value_format: ColumnFormat | None = None
    #: The schema registry the formats read from (``schemaRegistryUrl``, ``schemaRegistry.*``).
    registry: RegistryOptions | None = None

    @property
    def formats(self) -> tuple[ColumnFormat, ...]:
        """The columns to decode (none: the key and value stay binary, Spark's Kafka schema)."""
        return tuple(f for f in (self.key_format, self.value_format) if f is not None)

    @property
    def consumer_properties(self) -> dict[str, str]:
        """The ``kafka.*`` options for ``Consumer.from_properties`` (the group settings left out)."""
        return reader_properties(dict(self.kafka_params))

    @property
    def read_committed(self) -> bool:
        return dict(self.kafka_params).get("isolation.level", "read_uncommitted") == "read_committed"


# ------------------------------------------------------------------------------------- parsing


def _fail(message: str) -> SourceOptionError:
    return SourceOptionError(f"asyncconsumer source: {message}")


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise _fail(f"option {name!r} must be 'true' or 'false', got {raw!r}")
    return value == "true"


def _int_at_least(name: str, raw: str, minimum: int, what: str) -> int:
    """``raw`` as an integer of ``minimum`` or more; else an error saying it must be ``what``."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise _fail(f"option {name!r} must be {what}, got {raw!r}") from None
    if value < minimum:
        raise _fail(f"option {name!r} must be {what}, got {raw!r}")
    return value


def _positive_int(name: str, raw: str) -> int:
    return _int_at_least(name, raw, 1, "a positive integer")


def _non_negative_int(name: str, raw: str) -> int:
    return _int_at_least(name, raw, 0, "an integer of 0 or more")


def _json_object(name: str, raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _fail(f"option {name!r} is not valid JSON ({exc.msg} at position {exc.pos}): {raw!r}") from None
    if not isinstance(value, dict):
        raise _fail(f"option {name!r} must be a JSON object, got {raw!r}")
    return value


def _partition_number(name: str, topic: str, key: Any) -> int:
    try:
        number = int(key)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or isinstance(key, bool):
        raise _fail(f"option {name!r}: {key!r} is not a partition number (topic {topic!r})")
    return number


def _parse_assign(raw: str) -> tuple[TopicPartition, ...]:
    obj = _json_object("assign", raw)
    partitions: list[TopicPartition] = []
    for topic, numbers in obj.items():
        if not isinstance(numbers, list):
            raise _fail(f"option 'assign' must look like {{\"topicA\":[0,1]}}; got {raw!r}")
        for number in numbers:
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise _fail(f"option 'assign': {number!r} is not a partition number (topic {topic!r})")
            partitions.append(TopicPartition(topic, number))
    if not partitions:
        raise _fail("option 'assign' names no partition")
    return tuple(sorted(set(partitions)))


def _parse_per_partition(name: str, raw: str, *, offsets: bool) -> tuple[tuple[TopicPartition, int], ...]:
    obj = _json_object(name, raw)
    result: dict[TopicPartition, int] = {}
    example = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}' if offsets else '{"topicA":{"0":1700000000000}}'
    for topic, per in obj.items():
        if not isinstance(per, dict):
            raise _fail(f"option {name!r} must look like {example}; got {raw!r}")
        for key, value in per.items():
            number = _partition_number(name, topic, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(f"option {name!r}: value for {topic}-{number} must be an integer, got {value!r}")
            if offsets and value < EARLIEST:
                raise _fail(
                    f"option {name!r}: offset {value} for {topic}-{number} is invalid "
                    "(use an offset >= 0, -2 for earliest or -1 for latest)"
                )
            if not offsets and value < 0:
                raise _fail(f"option {name!r}: timestamp {value} for {topic}-{number} must be >= 0 (ms)")
            result[TopicPartition(topic, number)] = value
    if not result:
        raise _fail(f"option {name!r} names no partition")
    return tuple(sorted(result.items()))


def _parse_spec(options: Mapping[str, str], which: str, strategy: Literal["error", "latest"]) -> OffsetSpec | None:
    """The first of ``{which}Timestamp``, ``{which}OffsetsByTimestamp``, ``{which}Offsets`` that is set
    (Spark's order: KafkaSourceProvider.getKafkaOffsetRangeLimit)."""
    by_ts, ts, offs = f"{which}OffsetsByTimestamp", f"{which}Timestamp", f"{which}Offsets"
    if ts in options:
        try:
            value = int(options[ts].strip())
        except ValueError:
            value = -1
        if value < 0:
            raise _fail(f"option {ts!r} must be a timestamp in milliseconds (an integer >= 0), got {options[ts]!r}")
        return OffsetSpec("timestamp", timestamp=value, strategy=strategy, option=ts)
    if by_ts in options:
        return OffsetSpec(
            "timestamps",
            timestamps=_parse_per_partition(by_ts, options[by_ts], offsets=False),
            strategy=strategy,
            option=by_ts,
        )
    if offs in options:
        raw = options[offs].strip()
        if raw.lower() == "earliest":
            return OffsetSpec("earliest", option=offs)
        if raw.lower() == "latest":
            return OffsetSpec("latest", option=offs)
        if raw.startswith("{"):
            return OffsetSpec("offsets", offsets=_parse_per_partition(offs, raw, offsets=True), option=offs)
        raise _fail(
            f"option {offs!r} must be 'earliest', 'latest' or per-partition JSON "
            f'like {{"topicA":{{"0":23,"1":-1}}}}; got {raw!r}'
        )
    return None


def _canonical_options(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Split into (Spark-style source options by canonical name, kafka.* params, schemaRegistry.*
    properties); unknown names fail."""
    source: dict[str, str] = {}
    kafka: dict[str, str] = {}
    registry: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        text = "" if value is None else str(value)
        if lower.startswith("kafka."):
            kafka[lower[len("kafka.") :]] = text
            continue
        if lower.startswith("schemaregistry."):
            name = lower[len("schemaregistry.") :]
            if name not in REGISTRY_PROPERTIES:
                hint = difflib.get_close_matches(name, list(REGISTRY_PROPERTIES), n=1, cutoff=0.6)
                suggestion = f"; did you mean 'schemaRegistry.{hint[0]}'?" if hint else ""
                raise _fail(
                    f"unknown option {key!r}{suggestion} (schema registry settings: "
                    + ", ".join(f"schemaRegistry.{n}" for n in REGISTRY_PROPERTIES) + ")"
                )
            registry[name] = text
            continue
        if lower not in _CANONICAL:
            hint = difflib.get_close_matches(lower, list(_CANONICAL), n=1, cutoff=0.6)
            suggestion = f"; did you mean {_CANONICAL[hint[0]]!r}?" if hint else ""
            raise _fail(
                f"unknown option {key!r}{suggestion} (source options: {', '.join(_KNOWN)}; "
                "consumer settings are passed as 'kafka.<property>')"
            )
        source[_CANONICAL[lower]] = text
    return source, kafka, registry


def _check_kafka_params(kafka: dict[str, str]) -> None:
    if not kafka.get("bootstrap.servers", "").strip():
        raise _fail("option 'kafka.bootstrap.servers' is required (e.g. 'host1:9092,host2:9092')")
    for name, reason in _FORBIDDEN_KAFKA.items():
        if name in kafka:
            raise _fail(f"option 'kafka.{name}' is not supported: {reason}")
    try:
        from_properties(reader_properties(kafka))
    except ConfigError as exc:
        raise _fail(f"invalid kafka.* option: {exc}") from None
    except OSError as exc:  # an ssl.* file that cannot be read
        raise _fail(f"invalid kafka.ssl.* option: {exc}") from None


#: Group settings the reading consumers leave out: they join no group (Spark's consumers do not
#: either; they only ``assign``).
_GROUP_PROPERTIES = ("group.id", "group.instance.id", "group.protocol", "group.remote.assignor")


def reader_properties(kafka: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` parameters for the reading consumers: the group settings left out."""
    return {k: v for k, v in kafka.items() if k not in _GROUP_PROPERTIES}


def _time_ms(name: str, raw: str) -> int:
    """A Spark time string (``"15m"``, ``"30s"``, ``"500"`` = ms) in milliseconds."""
    match = _TIME_STRING.fullmatch(raw.strip().lower())
    if match is None or (match.group(2) or "ms") not in _TIME_UNITS_MS:
        raise _fail(
            f"option {name!r} must be a time such as '15m', '30s' or '500ms' "
            f"(units {', '.join(_TIME_UNITS_MS)}), got {raw!r}"
        )
    value = int(match.group(1)) * _TIME_UNITS_MS[match.group(2) or "ms"]
    if value < 0:
        raise _fail(f"option {name!r} must not be negative, got {raw!r}")
    return int(value)


def _check_per_partition_subscription(spec: OffsetSpec | None, subscription: Subscription) -> None:
    if spec is None or spec.kind not in ("offsets", "timestamps"):
        return
    named = spec.offsets if spec.kind == "offsets" else spec.timestamps
    for tp, _ in named:
        if not subscription.matches(tp.topic):
            raise _fail(f"option {spec.option!r} names {tp}, which is not part of {subscription.describe()}")
    if subscription.kind == "assign":
        missing = sorted(set(subscription.partitions) - {tp for tp, _ in named})
        if missing:
            raise _fail(
                f"option {spec.option!r} must give every assigned partition; missing: "
                + ", ".join(str(tp) for tp in missing)
                + " (use -2 for earliest, -1 for latest)"
            )


def parse_options(options: Mapping[str, str], *, streaming: bool | None = None) -> SourceOptions:
    """Parse and check the options given to ``spark.read`` / ``spark.readStream``.

    ``streaming`` is None when the kind of query is not known yet (``DataSource.schema()``); then only
    the checks common to batch and streaming run.
    """
    source, kafka, registry_properties = _canonical_options(options)
    _check_kafka_params(kafka)

    given = [name for name in _SUBSCRIPTION_OPTIONS if name in source]
    if len(given) != 1:
        which = " and ".join(repr(g) for g in given) if given else "none"
        raise _fail(f"exactly one of 'assign', 'subscribe' or 'subscribePattern' must be set; got {which}")
    kind = given[0]
    subscription: Subscription
    if kind == "assign":
        subscription = Subscription("assign", partitions=_parse_assign(source["assign"]))
    elif kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in source["subscribe"].split(",") if t.strip()))
        if not topics:
            raise _fail("option 'subscribe' names no topic (a comma-separated list of topics)")
        subscription = Subscription("subscribe", topics=topics)
    else:
        pattern = source["subscribePattern"].strip()
        if not pattern:
            raise _fail("option 'subscribePattern' is empty")
        try:
            regex = java_regex_translate(pattern)
        except JavaRegexError as exc:
            raise _fail(f"option 'subscribePattern': {exc}") from None
        subscription = Subscription("subscribePattern", pattern=pattern, regex=regex)

    strategy_raw = source.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
    if strategy_raw not in _STRATEGIES:
        raise _fail(f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got {strategy_raw!r}")
    strategy: Literal["error", "latest"] = "latest" if strategy_raw == "latest" else "error"

    starting = _parse_spec(source, "starting", strategy)
    ending = _parse_spec(source, "ending", "latest")
    _check_per_partition_subscription(starting, subscription)
    _check_per_partition_subscription(ending, subscription)

    if streaming is True:
        if ending is not None:
            raise _fail(
                f"option {ending.option!r} is for batch queries (spark.read) only; a streaming query has no end"
            )
    if streaming is False:
        if starting is not None and starting.kind == "latest":
            raise _fail(
                "startingOffsets='latest' is not valid for batch queries (spark.read): "
                "it would read nothing; use 'earliest' or per-partition offsets"
            )
        if starting is not None and starting.kind == "offsets" and any(o == LATEST for _, o in starting.offsets):
            raise _fail("startingOffsets: -1 (latest) is not valid for batch queries (spark.read)")
        if ending is not None and ending.kind == "earliest":
            raise _fail(
                "endingOffsets='earliest' is not valid for batch queries (spark.read): "
                "it would read nothing; use 'latest' or per-partition offsets"
            )
        if ending is not None and ending.kind == "offsets" and any(o == EARLIEST for _, o in ending.offsets):
            raise _fail("endingOffsets: -2 (earliest) is not valid for batch queries (spark.read)")

    if starting is None:
        starting = OffsetSpec("latest" if streaming else "earliest", option="startingOffsets")

    group_id: str | None = None
    if _bool("commitOffsetsToGroup", source.get("commitOffsetsToGroup", "false")):
        group_prefix = source.get("groupIdPrefix", "").strip()
        group_id = kafka.get("group.id", "").strip() or None
        if group_id is None and group_prefix:
            group_id = _group_name(group_prefix, subscription)
        if group_id is None:
            raise _fail("commitOffsetsToGroup=true needs the group to commit to: set kafka.group.id or groupIdPrefix")

    def optional_positive(name: str) -> int | None:
        return _positive_int(name, source[name]) if name in source else None

    max_per_trigger = optional_positive("maxOffsetsPerTrigger")
    min_per_trigger = optional_positive("minOffsetsPerTrigger")
    if min_per_trigger is not None and max_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise _fail(f"minOffsetsPerTrigger ({min_per_trigger}) is higher than maxOffsetsPerTrigger ({max_per_trigger})")

    key_format = _column_format(source, "key", subscription)
    value_format = _column_format(source, "value", subscription)
    registry = _registry(source, registry_properties, key_format is not None or value_format is not None)

    return SourceOptions(
        subscription=subscription,
        kafka_params=tuple(sorted(kafka.items())),
        starting=starting,
        ending=ending,
        fail_on_data_loss=_bool("failOnDataLoss", source.get("failOnDataLoss", "true")),
        include_headers=_bool("includeHeaders", source.get("includeHeaders", "false")),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=(
            _time_ms("maxTriggerDelay", source["maxTriggerDelay"])
            if "maxTriggerDelay" in source
            else DEFAULT_MAX_TRIGGER_DELAY_MS
        ),
        min_partitions=optional_positive("minPartitions"),
        max_records_per_partition=optional_positive("maxRecordsPerPartition"),
        group_id=group_id,
        poll_timeout_ms=(
            _positive_int("kafkaConsumer.pollTimeoutMs", source["kafkaConsumer.pollTimeoutMs"])
            if "kafkaConsumer.pollTimeoutMs" in source
            else 120_000
        ),
        consumer_cache_timeout_ms=(
            _time_ms("consumerCacheTimeout", source["consumerCacheTimeout"])
            if "consumerCacheTimeout" in source
            else DEFAULT_CONSUMER_CACHE_TIMEOUT_MS
        ),
        min_records_per_task=(
            _non_negative_int("minRecordsPerTask", source["minRecordsPerTask"])
            if "minRecordsPerTask" in source
            else DEFAULT_MIN_RECORDS_PER_TASK
        ),
        key_format=key_format,
        value_format=value_format,
        registry=registry,
    )


def _column_format(
    source: Mapping[str, str], field: Literal["key", "value"], subscription: Subscription
) -> ColumnFormat | None:
    """``keyFormat``/``valueFormat`` and its reader schema options."""
    option, schema_option, subject_option = f"{field}Format", f"{field}Schema", f"{field}SchemaSubject"
    kind = source.get(option, "binary").strip().lower()
    if kind not in _FORMATS:
        raise _fail(f"option {option!r} must be one of {', '.join(_FORMATS)}, got {source[option]!r}")
    if kind == "binary":
        for name in (schema_option, subject_option):
            if name in source:
                raise _fail(f"option {name!r} is for {option}=avro; {option} is binary")
        return None
    schema = source.get(schema_option, "").strip() or None
    subject = source.get(subject_option, "").strip() or None
    if schema is not None and subject is not None:
        raise _fail(f"set {schema_option!r} (the reader schema itself) or {subject_option!r}, not both")
    if schema is not None:
        try:
            json.loads(schema)
        except json.JSONDecodeError:
            if schema not in ("null", "boolean", "int", "long", "float", "double", "bytes", "string"):
                raise _fail(f"option {schema_option!r} is not an Avro schema (JSON): {schema[:200]!r}") from None
        return ColumnFormat(field, schema=schema)
    if subject is None:
        topics = {tp.topic for tp in subscription.partitions} if subscription.kind == "assign" else set(
            subscription.topics)
        if len(topics) != 1:
            raise _fail(
                f"{option}=avro needs {subject_option!r} (the subject whose latest schema the column has) or "
                f"{schema_option!r} (an Avro schema): {subscription.describe()} reads more than one topic, so "
                f"there is no single '<topic>-{field}' subject to default to"
            )
        subject = f"{next(iter(topics))}-{field}"
    return ColumnFormat(field, subject=subject)


def _shown_url(url: str) -> str:
    """``url`` with a ``user:password@`` in it replaced by ``***@``."""
    return re.sub(r"(?<=//)[^/@\s]+@", "***@", url)


def _registry(source: Mapping[str, str], properties: dict[str, str], needed: bool) -> RegistryOptions | None:
    url = source.get("schemaRegistryUrl", "").strip()
    if not needed:
        if url or properties:
            raise _fail(
                "schemaRegistryUrl and schemaRegistry.* are for keyFormat=avro or valueFormat=avro; neither is set"
            )
        return None
    if not url:
        raise _fail("keyFormat=avro and valueFormat=avro need 'schemaRegistryUrl' (e.g. 'http://registry:8081')")
    if not re.match(r"https?://[^/\s]+", url):
        raise _fail(f"option 'schemaRegistryUrl' must be an http(s) URL, got {_shown_url(url)!r}")
    if "timeout.ms" in properties:
        _positive_int("schemaRegistry.timeout.ms", properties["timeout.ms"])
    for name in ("ssl.certificate.location", "ssl.key.location"):
        other = "ssl.key.location" if name == "ssl.certificate.location" else "ssl.certificate.location"
        if name in properties and other not in properties:
            raise _fail(f"option 'schemaRegistry.{name}' needs 'schemaRegistry.{other}' too")
    user_info = properties.get("basic.auth.user.info")
    if user_info is not None and ":" not in user_info:
        raise _fail("option 'schemaRegistry.basic.auth.user.info' must be 'user:password' (the value is not shown)")
    return RegistryOptions(url, tuple(sorted(properties.items())))


def _group_name(prefix: str, subscription: Subscription) -> str:
    """A stable group id for lag monitoring: ``{prefix}-{what is read}``, the same on every restart."""
    import hashlib

    digest = hashlib.sha1(subscription.describe().encode("utf-8"), usedforsecurity=False).hexdigest()[:12]
    return f"{prefix}-{digest}"
