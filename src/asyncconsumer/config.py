"""Consumer configuration: Kafka's option names in snake_case, validated up front.

``ConsumerOptions`` lists and documents the options (``Consumer(**options)``);
``ConsumerConfig`` is their immutable, validated form: ``Consumer`` builds one and every
problem (unknown name, wrong type, out-of-range value, inconsistent security
settings) is a ``ConfigError`` that names the option before any I/O happens.
``from_properties`` accepts Java / librdkafka dotted names.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, get_args, runtime_checkable

from ._args import INT32_MAX, INT64_MAX, protocol_string_error
from .assignors import ASSIGNORS
from .errors import ConfigError, ConfigTypeError, RecordDeserializationError
from .java_properties import IGNORED, JAVA_CONSUMER_PROPERTIES, REJECTED, shown
from .managers.list_offsets import BY_DURATION, reset_duration_ms
from .structs import ConsumerRecord, DeserializationContext, RecordDeserializer, ShareConsumerRecord
from .structs import OAuthBearerToken as OAuthBearerToken  # documented as asyncconsumer.config.OAuthBearerToken

#: ``f(data) -> value``: a deserializer without context (``bytes.decode``, ``json.loads``).
Deserializer = Callable[[bytes], Any]
#: ``async def f(data, context) -> value``: a deserializer with context, awaited per record.
AsyncDeserializer = Callable[[bytes, DeserializationContext], Awaitable[Any]]
#: What ``key_deserializer`` and ``value_deserializer`` accept, told apart in this order: an object
#: with a ``deserialize(data, context)`` method (a :class:`RecordDeserializer`), a coroutine function
#: ``(data, context)``, any other callable ``(data)``.
AnyDeserializer: TypeAlias = "RecordDeserializer[Any] | AsyncDeserializer | Deserializer"
#: How a deserializer is called: ``"object"`` (``obj.deserialize(data, context)``, awaited when it
#: returns an awaitable), ``"async"`` (``await f(data, context)``), ``"plain"`` (``f(data)``).
DeserializerKind = Literal["object", "async", "plain"]
#: ``on_deserialization_error``'s handler: ``async def handler(record, error)``, given the record
#: undeserialized (keys and values as bytes; a ``ShareConsumerRecord`` for a share consumer) and the
#: ``RecordDeserializationError``.  Once it returns, the record counts as skipped.
DeserializationErrorHandler: TypeAlias = (
    "Callable[[ConsumerRecord[bytes, bytes], RecordDeserializationError], Awaitable[object]]"
    " | Callable[[ShareConsumerRecord[bytes, bytes], RecordDeserializationError], Awaitable[object]]"
)
#: ``on_deserialization_error``: "raise", "skip" or a handler.
DeserializationErrorPolicy: TypeAlias = "Literal['raise', 'skip'] | DeserializationErrorHandler"

# The choice options: each list of names once, as a type; the tuples of names come from it.
SecurityProtocol: TypeAlias = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism: TypeAlias = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
OffsetReset: TypeAlias = Literal["earliest", "latest", "none"]
IsolationLevel: TypeAlias = Literal["read_uncommitted", "read_committed"]
GroupProtocol: TypeAlias = Literal["classic", "consumer"]
MetadataRecoveryStrategy: TypeAlias = Literal["rebootstrap", "none"]
SECURITY_PROTOCOLS: tuple[SecurityProtocol, ...] = get_args(SecurityProtocol)
SASL_MECHANISMS: tuple[SaslMechanism, ...] = get_args(SaslMechanism)
OFFSET_RESETS: tuple[OffsetReset, ...] = get_args(OffsetReset)
ISOLATION_LEVELS: tuple[IsolationLevel, ...] = get_args(IsolationLevel)
GROUP_PROTOCOLS: tuple[GroupProtocol, ...] = get_args(GroupProtocol)
METADATA_RECOVERY_STRATEGIES: tuple[MetadataRecoveryStrategy, ...] = get_args(MetadataRecoveryStrategy)


#: What a token provider may return: the token, ``(token, expires_at)`` as librdkafka's and
#: confluent-kafka's ``oauth_cb`` return it, or an :class:`OAuthBearerToken`.
OAuthTokenResult: TypeAlias = "str | tuple[str, float] | OAuthBearerToken"


@runtime_checkable
class OAuthTokenSource(Protocol):
    """An object with an async ``token()`` method (the shape of aiokafka's ``AbstractTokenProvider``)."""

    def token(self) -> Awaitable[OAuthTokenResult]: ...


#: ``sasl_oauth_token_provider``: a plain or async callable taking no arguments, or an object with an
#: async ``token()`` method.
OAuthTokenProvider: TypeAlias = "Callable[[], OAuthTokenResult | Awaitable[OAuthTokenResult]] | OAuthTokenSource"


#: ``batch_decompress_limit`` without ``max_batch_decompressed_bytes``: this many times the largest fetch
#: size, and never under ``_MIN_DECOMPRESS_LIMIT`` (a broker hands out a batch up to its
#: ``message.max.bytes`` whatever the fetch sizes are).
_DECOMPRESS_EXPANSION = 4
_MIN_DECOMPRESS_LIMIT = 64 << 20


class ConsumerOptions(TypedDict, total=False):
    """The keyword arguments of ``Consumer(...)``: every option, each documented here, once.

    The long form (defaults, interactions, examples) is docs/configuration.md, which a test holds
    to exactly these options and ``ConsumerConfig``'s defaults.  Durations keep Kafka's ``_ms``.
    """

    # Connection and identity.
    #: The brokers to connect to first: ``"host:port"`` strings, or one comma-separated string.
    bootstrap_servers: str | Sequence[str]
    #: Sent in every request header (broker logs and quotas).
    client_id: str
    #: This client's rack: Fetch's ``rack_id``, and the member's rack in its group (the classic
    #: subscription's, for the rack-aware assignors; ``group_protocol="consumer"``'s).
    client_rack: str
    # Group and offsets.
    #: The consumer group: needed for ``subscribe()``, ``commit()``, ``committed()`` and auto-commit.
    group_id: str | None
    #: Makes the member static (KIP-345): a restart within ``session_timeout_ms`` keeps its partitions.
    group_instance_id: str | None
    #: Where to start without a committed offset, and where to go when out of range ("none": raise;
    #: ``"by_duration:PT1H"``: the first record of the last hour, KIP-1106, an ISO 8601 duration).
    auto_offset_reset: OffsetReset | str
    #: Commit what was handed out every ``auto_commit_interval_ms`` and on ``close()``.
    enable_auto_commit: bool
    #: The interval of the periodic auto-commit.
    auto_commit_interval_ms: int
    #: Classic protocol: how long the coordinator waits for a heartbeat before removing the member.
    session_timeout_ms: int
    #: How often the background loop heartbeats while the member is in the group.
    heartbeat_interval_ms: int
    #: The longest time between two polls while subscribed; then the member leaves the group.
    max_poll_interval_ms: int
    #: How long a member may take through a rebalance, and each rebalance callback's deadline
    #: (None: ``max_poll_interval_ms``).
    rebalance_timeout_ms: int | None
    #: Classic protocol: the assignors offered, by preference (range, roundrobin, sticky, cooperative-sticky).
    partition_assignment_strategy: str | Sequence[str]
    #: "classic" (JoinGroup/SyncGroup) or "consumer" (KIP-848, Kafka 4.0+; falls back to classic).
    group_protocol: GroupProtocol
    #: ``group_protocol="consumer"``: the broker-side assignor to ask for ("uniform", "range", or any
    #: name in the broker's ``group.consumer.assignors``); None lets the coordinator choose.
    group_remote_assignor: str | None
    #: Commit what was handed out for revoked partitions before giving them up.
    rebalance_safe_commits: bool
    #: With manual commits: how long a revocation waits for the group's commits of what was handed
    #: out (the application's, or its transactional producer's), and for a partition stream to drain.
    rebalance_commit_wait_ms: int
    # Fetching.
    #: The broker holds a Fetch until it has this many bytes (or ``fetch_max_wait_ms`` passes).
    #: Raised: fewer, fuller fetches (less CPU with many partitions and little traffic), records
    #: wait longer.
    fetch_min_bytes: int
    #: Upper bound of one Fetch response.
    fetch_max_bytes: int
    #: How long the broker may hold a Fetch.
    fetch_max_wait_ms: int
    #: Upper bound per partition in one Fetch; also a partition's least read-ahead.
    max_partition_fetch_bytes: int
    #: The byte budget for fetch responses the application has not finished reading (shared by
    #: partitions; a response's frame counts whole until every partition in it is read); also,
    #: about, the most each of the consumer's buffer pools (large response frames, Arrow column
    #: blocks) may keep for reuse (engine/buffers.py).
    fetch_buffer_bytes: int
    #: Records per poll: getmany()'s default max_records, a batches() item, an async-for chunk.
    max_poll_records: int
    #: read_committed: no records of aborted transactions, nothing past the last stable offset, and
    #: end_offsets()/seek_to_end()/"latest" mean the LSO; markers are never returned (either level).
    isolation_level: IsolationLevel
    #: Check each batch's CRC when it is decoded.
    check_crcs: bool
    #: The most one compressed batch may decompress to (None: 4 times the largest fetch size, at least
    #: 64 MiB); a batch declaring or producing more is a ``CorruptRecordError``.
    max_batch_decompressed_bytes: int | None
    #: ``topics()`` leaves out internal topics such as ``__consumer_offsets``.
    exclude_internal_topics: bool
    #: Key bytes to your key type (not called for None keys): ``f(data)``, ``async def f(data,
    #: context)`` or an object with a ``deserialize(data, context)`` method (docs/typed-records.md).
    key_deserializer: AnyDeserializer | None
    #: Value bytes to your value type (not called for None values), in the same three forms.
    value_deserializer: AnyDeserializer | None
    #: What a record that a deserializer cannot read does: "raise" (``RecordDeserializationError``,
    #: the position stays at the record), "skip" (a WARNING, counted, the position moves past it; a
    #: share consumer REJECTs it) or ``async def handler(record, error)`` given the undeserialized
    #: record (then skipped; if it raises, as "raise").
    on_deserialization_error: DeserializationErrorPolicy
    # Network.
    #: The time limit of one request (a request that times out closes its connection).
    request_timeout_ms: int
    #: The default ``timeout`` of the one-shot methods (``commit()``, ``committed()``, ``position()``,
    #: offset lookups, metadata): each retries through timed-out requests and reconnects until then.
    default_api_timeout_ms: int
    #: The time limit for opening a connection (TCP plus TLS).
    socket_connection_setup_timeout_ms: int
    #: Accepted and checked; idle connections are not closed yet.
    connections_max_idle_ms: int
    #: The first delay before reconnecting to a failed broker (doubling per failure).
    reconnect_backoff_ms: int
    #: The cap of that delay.
    reconnect_backoff_max_ms: int
    #: The wait before retrying a failed request; also the least time between two metadata refreshes
    #: asked for one after the other.
    retry_backoff_ms: int
    #: The longest between metadata refreshes: a group's leader notices added partitions then.
    metadata_max_age_ms: int
    #: When no broker the consumer knows can be reached (KIP-899), or none has given it metadata for
    #: ``metadata_recovery_rebootstrap_trigger_ms``, or one answers REBOOTSTRAP_REQUIRED (KIP-1102):
    #: "rebootstrap" forgets the brokers it knows and starts again from ``bootstrap_servers``
    #: (their names resolved again); "none" keeps trying the brokers it knows.
    metadata_recovery_strategy: MetadataRecoveryStrategy
    #: With "rebootstrap": how long metadata may be due and not come from any known broker before
    #: the consumer goes back to ``bootstrap_servers``.
    metadata_recovery_rebootstrap_trigger_ms: int
    # Security.
    #: Transport and authentication.
    security_protocol: SecurityProtocol
    #: TLS settings for SSL/SASL_SSL (None: ``ssl.create_default_context()``).
    ssl_context: ssl.SSLContext | None
    #: The SASL mechanism for SASL_PLAINTEXT/SASL_SSL.
    sasl_mechanism: SaslMechanism
    #: The SASL username for PLAIN and SCRAM.
    sasl_plain_username: str | None
    #: The SASL password for PLAIN and SCRAM (left out of ``repr(config)``).
    sasl_plain_password: str | None
    #: For OAUTHBEARER: called (and awaited, if it returns an awaitable) for a token when a connection
    #: authenticates or re-authenticates and the last token is near its expiry.  Returns a ``str``,
    #: ``(token, expires_at)`` or an :class:`OAuthBearerToken`; an object with an async ``token()``
    #: method works too.  It must not block: do blocking I/O in a thread.
    sasl_oauth_token_provider: OAuthTokenProvider | None
    # Observability.
    #: Push the client's metrics to the cluster when the cluster asks for them (KIP-714; Java's
    #: ``enable.metrics.push``): names and types as Java's consumer pushes them, at the interval of
    #: the broker's client metrics subscription (docs/metrics.md).  False: never, and
    #: ``client_instance_id()`` raises ``IllegalStateError``.
    enable_metrics_push: bool
    #: An OpenTelemetry ``MeterProvider`` the consumer reports its metrics to (docs/metrics.md).
    #: ``None``: the global one when ``opentelemetry-api`` is installed (the ``otel`` extra), else none.
    meter_provider: Any
    #: The event loop blocked this long or longer (the background loop ran that late: no heartbeats,
    #: fetches or commits meanwhile) is a block: counted in ``metrics().loop`` and named in a WARNING
    #: with the deadline it put at risk (session timeout, ``max_poll_interval_ms``, a request's
    #: timeout) and what to do.  ``None``: no WARNING and no count (the lag is still measured).
    loop_lag_warning_ms: int | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """The validated options with their defaults (``ConsumerOptions`` documents each one)."""

    bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    client_id: str = "asyncconsumer"
    client_rack: str = ""
    group_id: str | None = None
    group_instance_id: str | None = None
    auto_offset_reset: OffsetReset | str = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    rebalance_timeout_ms: int | None = None
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    group_protocol: GroupProtocol = "classic"
    group_remote_assignor: str | None = None
    rebalance_safe_commits: bool = True
    rebalance_commit_wait_ms: int = 10000
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 52428800
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1048576
    fetch_buffer_bytes: int = 67108864
    max_poll_records: int = 500
    isolation_level: IsolationLevel = "read_uncommitted"
    check_crcs: bool = True
    #: The most one compressed batch may decompress to; ``None``: ``batch_decompress_limit``'s default.
    max_batch_decompressed_bytes: int | None = None
    exclude_internal_topics: bool = True
    key_deserializer: AnyDeserializer | None = None
    value_deserializer: AnyDeserializer | None = None
    on_deserialization_error: DeserializationErrorPolicy = "raise"
    request_timeout_ms: int = 30000
    default_api_timeout_ms: int = 60000
    socket_connection_setup_timeout_ms: int = 10000
    connections_max_idle_ms: int = 540000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300000
    metadata_recovery_strategy: MetadataRecoveryStrategy = "rebootstrap"
    metadata_recovery_rebootstrap_trigger_ms: int = 300000
    security_protocol: SecurityProtocol = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = dataclasses.field(default=None, repr=False)
    sasl_oauth_token_provider: OAuthTokenProvider | None = dataclasses.field(default=None, repr=False)
    enable_metrics_push: bool = True
    meter_provider: Any = dataclasses.field(default=None, repr=False)
    loop_lag_warning_ms: int | None = 1000

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context a connection uses: ``ssl_context``, else one trusting the system's CAs
        (made at each call); None without TLS."""
        if not self.uses_tls:
            return None
        return self.ssl_context if self.ssl_context is not None else ssl.create_default_context()

    @property
    def batch_decompress_limit(self) -> int:
        """The most one compressed batch may decompress to: ``max_batch_decompressed_bytes``, or
        ``4 * max(fetch_max_bytes, max_partition_fetch_bytes)`` but at least 64 MiB (200 MiB by default)."""
        if self.max_batch_decompressed_bytes is not None:
            return self.max_batch_decompressed_bytes
        return max(
            _MIN_DECOMPRESS_LIMIT, _DECOMPRESS_EXPANSION * max(self.fetch_max_bytes, self.max_partition_fetch_bytes)
        )

    @property
    def effective_rebalance_timeout_ms(self) -> int:
        return self.rebalance_timeout_ms if self.rebalance_timeout_ms is not None else self.max_poll_interval_ms

    @property
    def quiet_partition_warning_s(self) -> float:
        """How long a partition the consumer should be reading may go without a fetch response
        before a WARNING names it, its broker and the reason (docs/failure-behaviour.md): a healthy
        broker answers within ``fetch_max_wait_ms``; twice that or 5 s, whichever is longer, plus
        ``reconnect_backoff_max_ms`` for one reconnect, is more than a blip.  6 s by default."""
        return max(5.0, 2 * self.fetch_max_wait_ms / 1000) + self.reconnect_backoff_max_ms / 1000


_FIELDS = {f.name: f for f in dataclasses.fields(ConsumerConfig)}
_POSITIVE = {
    "max_poll_records",
    "auto_commit_interval_ms",
    "session_timeout_ms",
    "heartbeat_interval_ms",
    "max_poll_interval_ms",
    "fetch_max_bytes",
    "max_partition_fetch_bytes",
    "fetch_buffer_bytes",
    "request_timeout_ms",
    "default_api_timeout_ms",
    "socket_connection_setup_timeout_ms",
    "connections_max_idle_ms",
    "metadata_max_age_ms",
    "rebalance_commit_wait_ms",
    "max_batch_decompressed_bytes",
    "loop_lag_warning_ms",
}
_NON_NEGATIVE = {
    "fetch_min_bytes",
    "fetch_max_wait_ms",
    "reconnect_backoff_ms",
    "reconnect_backoff_max_ms",
    "retry_backoff_ms",
    "metadata_recovery_rebootstrap_trigger_ms",
}
#: The protocol field each integer option is sent in, and so the largest value it may take.
PROTOCOL_INT_FIELDS: dict[str, tuple[str, int]] = {
    "session_timeout_ms": ("JoinGroup SessionTimeoutMs (int32)", INT32_MAX),
    "max_poll_interval_ms": ("JoinGroup RebalanceTimeoutMs (int32) when rebalance_timeout_ms is None", INT32_MAX),
    "rebalance_timeout_ms": ("JoinGroup / ConsumerGroupHeartbeat RebalanceTimeoutMs (int32)", INT32_MAX),
    "fetch_max_wait_ms": ("Fetch MaxWaitMs (int32)", INT32_MAX),
    "fetch_min_bytes": ("Fetch MinBytes (int32)", INT32_MAX),
    "fetch_max_bytes": ("Fetch MaxBytes (int32)", INT32_MAX),
    "max_partition_fetch_bytes": ("Fetch PartitionMaxBytes (int32)", INT32_MAX),
}
#: Integer options used only by the client: bounded by the type the Java client gives them (int or long).
LOCAL_INT_LIMITS: dict[str, int] = {
    "auto_commit_interval_ms": INT32_MAX,
    "heartbeat_interval_ms": INT32_MAX,
    "max_poll_records": INT32_MAX,
    "request_timeout_ms": INT32_MAX,
    "default_api_timeout_ms": INT32_MAX,
    "rebalance_commit_wait_ms": INT32_MAX,
    "fetch_buffer_bytes": INT64_MAX,
    "max_batch_decompressed_bytes": INT64_MAX,
    "socket_connection_setup_timeout_ms": INT64_MAX,
    "connections_max_idle_ms": INT64_MAX,
    "reconnect_backoff_ms": INT64_MAX,
    "reconnect_backoff_max_ms": INT64_MAX,
    "retry_backoff_ms": INT64_MAX,
    "metadata_max_age_ms": INT64_MAX,
    "loop_lag_warning_ms": INT64_MAX,
    "metadata_recovery_rebootstrap_trigger_ms": INT64_MAX,
}
#: String options sent as protocol STRINGs (int16 length, UTF-8).
PROTOCOL_STRING_FIELDS: dict[str, str] = {
    "client_id": "the request header's ClientId",
    "group_id": "GroupId",
    "group_instance_id": "GroupInstanceId",
    "client_rack": "Fetch RackId / the assignor's rack",
}


def _check_int_limit(name: str, value: int) -> None:
    if name in PROTOCOL_INT_FIELDS:
        field, limit = PROTOCOL_INT_FIELDS[name]
        if value > limit:
            raise ConfigError(f"{name}={value} cannot be sent: {field} holds at most {limit}")
    elif name in LOCAL_INT_LIMITS and value > LOCAL_INT_LIMITS[name]:
        raise ConfigError(f"{name} must be at most {LOCAL_INT_LIMITS[name]}, got {value}")


_CHOICES: dict[str, tuple[str, ...]] = {
    "auto_offset_reset": OFFSET_RESETS,
    "isolation_level": ISOLATION_LEVELS,
    "security_protocol": SECURITY_PROTOCOLS,
    "sasl_mechanism": SASL_MECHANISMS,
    "group_protocol": GROUP_PROTOCOLS,
    "metadata_recovery_strategy": METADATA_RECOVERY_STRATEGIES,
}


def _unknown(name: str) -> ConfigError:
    hint = difflib.get_close_matches(name, _FIELDS, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    return ConfigError(f"unknown consumer option {name!r}{extra}")


def _servers(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"bootstrap_servers must be a 'host:port[,host:port]' string or a list, got {value!r}")
    servers = tuple(str(s).strip() for s in items if str(s).strip())
    if not servers:
        raise ConfigError("bootstrap_servers is empty: give at least one 'host:port'")
    for server in servers:
        parse_host_port(server)
    return servers


def parse_host_port(server: str) -> tuple[str, int]:
    """Split 'host:port' ('[::1]:9092' for IPv6); a missing port means 9092."""
    scheme, sep, rest = server.partition("://")
    if sep:
        raise ConfigError(
            f"bootstrap server {server!r} has a URL scheme ({scheme}://): bootstrap_servers takes plain "
            f"'host:port' addresses, such as {rest.split('/')[0]!r}; TLS and SASL are chosen by security_protocol"
        )
    if "/" in server or any(c.isspace() for c in server):
        raise ConfigError(f"bootstrap server {server!r} is not 'host:port'")
    host, sep, port = server.rpartition(":")
    if not sep or (host.endswith(":") and not host.startswith("[")):
        host, port = server, "9092"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bootstrap server {server!r} is not 'host:port'")
    return host, int(port)


def _coerce(name: str, value: Any) -> Any:
    field = _FIELDS[name]
    if name == "bootstrap_servers":
        return _servers(value)
    if name == "partition_assignment_strategy":
        items = value.split(",") if isinstance(value, str) else value
        strategies = tuple(str(s).strip() for s in items)
        for s in strategies:
            if s not in ASSIGNORS:
                raise ConfigError(f"partition_assignment_strategy {s!r} is not one of {', '.join(ASSIGNORS)}")
        if not strategies:
            raise ConfigError("partition_assignment_strategy is empty")
        return strategies
    if name == "auto_offset_reset" and isinstance(value, str) and value.startswith("by_duration"):
        try:
            reset_duration_ms(value)
        except ValueError as exc:
            detail = exc if value.startswith(BY_DURATION) else "the duration is missing ('by_duration:PT1H')"
            raise ConfigError(f"auto_offset_reset={value!r}: {detail}") from None
        return value
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            also = " or 'by_duration:<ISO 8601 duration>'" if name == "auto_offset_reset" else ""
            raise ConfigError(
                f"{name}={shown(name, value)} is not one of {', '.join(map(repr, _CHOICES[name]))}{also}")
        return value
    annotation = str(field.type)
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigTypeError(f"{name} must be True or False, got {shown(name, value)}")
        return value
    if annotation.startswith("int"):
        if value is None and "None" in annotation:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigTypeError(f"{name} must be an integer, got {shown(name, value)}")
        if name in _POSITIVE and value <= 0:
            raise ConfigError(f"{name} must be > 0, got {value}")
        if name in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        _check_int_limit(name, value)
        return value
    if name == "ssl_context":
        if value is not None and not isinstance(value, ssl.SSLContext):
            raise ConfigError(f"ssl_context must be an ssl.SSLContext, got {type(value).__name__}")
        return value
    if name == "sasl_oauth_token_provider":
        if value is not None and not callable(value) and not _has_token_method(value):
            raise ConfigError(
                "sasl_oauth_token_provider must be a callable returning a token (str, (token, expires_at) or "
                f"OAuthBearerToken), or an object with an async token() method, got {shown(name, value)}"
            )
        return value
    if name == "meter_provider":
        if value is not None and not callable(getattr(value, "get_meter", None)):
            raise ConfigError(
                f"meter_provider must be an OpenTelemetry MeterProvider (with get_meter()), got {value!r}"
            )
        return value
    if name.endswith("_deserializer"):
        if value is not None:
            deserializer_kind(name, value)
        return value
    if name == "on_deserialization_error":
        return _error_policy(value)
    if value is not None and not isinstance(value, str):
        raise ConfigTypeError(f"{name} must be a string, got {shown(name, value)}")
    if value is not None and name in PROTOCOL_STRING_FIELDS:
        why = protocol_string_error(value)
        if why is not None:
            raise ConfigError(f"{name} cannot be sent as {PROTOCOL_STRING_FIELDS[name]}: {why}")
    return value


def deserializer_kind(name: str, value: object) -> DeserializerKind:
    """How the deserializer ``value`` of option ``name`` is called (``DeserializerKind``); a
    ``ConfigTypeError`` naming the option when it is none of the three forms, or cannot take the
    arguments its form is called with."""
    method = getattr(value, "deserialize", None)
    if callable(method):
        if not _accepts(method, 2):
            raise ConfigTypeError(
                f"{name}: {_name(value)}.deserialize cannot be called as deserialize(data, context)"
                + (" (a class: pass an instance)" if isinstance(value, type) else "")
            )
        return "object"
    if _is_coroutine_function(value):
        if not _accepts(value, 2):
            raise ConfigTypeError(
                f"{name}: the coroutine function {_name(value)} cannot be called as f(data, context); an async "
                "deserializer takes the bytes and a DeserializationContext"
            )
        return "async"
    if callable(value):
        if not _accepts(value, 1):
            raise ConfigTypeError(
                f"{name}: {_name(value)} cannot be called as f(data); a deserializer with context is an "
                "'async def f(data, context)' or an object with a deserialize(data, context) method"
            )
        return "plain"
    raise ConfigTypeError(
        f"{name} must be callable (bytes -> value), an 'async def f(data, context)' or an object with a "
        f"deserialize(data, context) method, got {value!r:.80}"
    )


def _error_policy(value: object) -> Any:
    if isinstance(value, str) and value in ("raise", "skip"):
        return value
    if _is_coroutine_function(value):
        if not _accepts(value, 2):
            raise ConfigTypeError(
                f"on_deserialization_error: {_name(value)} cannot be called as handler(record, error)"
            )
        return value
    raise ConfigTypeError(
        "on_deserialization_error must be 'raise', 'skip' or an 'async def handler(record, error)' "
        f"(a plain function is not awaited: make it async), got {value!r:.80}"
    )


def _is_coroutine_function(value: object) -> bool:
    """A coroutine function, a ``functools.partial`` of one, or an object with ``async def __call__``."""
    call = getattr(type(value), "__call__", None)  # noqa: B004 (whether it is a coroutine function)
    return inspect.iscoroutinefunction(value) or (not inspect.isroutine(value) and inspect.iscoroutinefunction(call))


def _accepts(function: object, count: int) -> bool:
    """``function`` can be called with ``count`` positional arguments (True when its signature is
    unknown, as for some builtins)."""
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _name(value: object) -> str:
    return str(getattr(value, "__qualname__", None) or type(value).__qualname__)


def _has_token_method(value: object) -> bool:
    method = getattr(value, "token", None)
    return callable(method) and inspect.iscoroutinefunction(method)


def build_config(options: Mapping[str, Any]) -> ConsumerConfig:
    values = {}
    for name, value in options.items():
        if name not in _FIELDS:
            raise _unknown(name)
        values[name] = _coerce(name, value)
    config = ConsumerConfig(**values)
    _check_consistency(config)
    return config


def _check_consistency(c: ConsumerConfig) -> None:
    if c.fetch_max_bytes < 1024:
        raise ConfigError("fetch_max_bytes must be at least 1024")
    if c.fetch_buffer_bytes < c.max_partition_fetch_bytes:
        raise ConfigError(
            f"fetch_buffer_bytes ({c.fetch_buffer_bytes}) must be >= max_partition_fetch_bytes "
            f"({c.max_partition_fetch_bytes}), or no fetch could ever be buffered"
        )
    if c.heartbeat_interval_ms >= c.session_timeout_ms:
        raise ConfigError("heartbeat_interval_ms must be lower than session_timeout_ms")
    if c.reconnect_backoff_max_ms < c.reconnect_backoff_ms:
        raise ConfigError("reconnect_backoff_max_ms must be >= reconnect_backoff_ms")
    if c.group_id is not None and not c.group_id.strip():
        raise ConfigError("group_id must not be empty (leave it None to use no consumer group)")
    if c.rebalance_timeout_ms is not None and c.rebalance_timeout_ms <= 0:
        raise ConfigError(f"rebalance_timeout_ms must be > 0, got {c.rebalance_timeout_ms}")
    if c.group_instance_id is not None and c.group_id is None:
        raise ConfigError("group_instance_id needs a group_id")
    if c.uses_sasl and c.sasl_mechanism == "OAUTHBEARER":
        if c.sasl_oauth_token_provider is None:
            raise ConfigError(
                "sasl_mechanism='OAUTHBEARER' needs sasl_oauth_token_provider (a callable returning a token)"
            )
    elif c.uses_sasl and (not c.sasl_plain_username or c.sasl_plain_password is None):
        raise ConfigError(
            f"security_protocol={c.security_protocol} with sasl_mechanism={c.sasl_mechanism!r} needs "
            "sasl_plain_username and sasl_plain_password"
        )
    if c.sasl_oauth_token_provider is not None and not (c.uses_sasl and c.sasl_mechanism == "OAUTHBEARER"):
        raise ConfigError(
            "sasl_oauth_token_provider is set but not used: it needs sasl_mechanism='OAUTHBEARER' and "
            f"security_protocol 'SASL_PLAINTEXT' or 'SASL_SSL' (got {c.sasl_mechanism!r}, {c.security_protocol!r})"
        )
    if c.ssl_context is not None and not c.uses_tls:
        raise ConfigError(f"ssl_context is set but security_protocol={c.security_protocol}; use 'SSL' or 'SASL_SSL'")


# librdkafka names that are not Java's (the Java names are java_properties.APPLIED).
_PROPERTY_ALIASES = {
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "metadata.broker.list": "bootstrap_servers",
}
_RESET_ALIASES = {
    "smallest": "earliest",
    "beginning": "earliest",
    "largest": "latest",
    "end": "latest",
    "error": "none",
}
# The Java client's assignor classes, by the names asyncconsumer gives them.
_ASSIGNOR_CLASSES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.StickyAssignor": "sticky",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}
_DESERIALIZERS: dict[str, Deserializer | None] = {
    "org.apache.kafka.common.serialization.ByteArrayDeserializer": None,
    "org.apache.kafka.common.serialization.BytesDeserializer": None,
    "org.apache.kafka.common.serialization.StringDeserializer": lambda data: data.decode("utf-8"),
}
# ssl.* properties (the Java client's and librdkafka's) that build the SSLContext.
_SSL_PROPERTIES = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.truststore.type",
    "ssl.truststore.certificates",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.type",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
    "ssl.protocol",
    "ssl.enabled.protocols",
)
# sasl.* properties that make the credentials or the OAUTHBEARER token provider.
_SASL_PROPERTIES = (
    "sasl.jaas.config",
    "sasl.login.callback.handler.class",
    "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms",
    "sasl.login.retry.backoff.ms",
    "sasl.login.retry.backoff.max.ms",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.header.urlencode",
    "sasl.oauthbearer.jwt.retriever.class",
)
_OAUTH_LOGIN_HANDLERS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
)
_UNSECURED_LOGIN_HANDLER = (
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredLoginCallbackHandler"
)
_JWT_RETRIEVERS = (
    "org.apache.kafka.common.security.oauthbearer.DefaultJwtRetriever",
    "org.apache.kafka.common.security.oauthbearer.ClientCredentialsJwtRetriever",
    "org.apache.kafka.common.security.oauthbearer.FileJwtRetriever",
)
_MSK_IAM = (
    "AWS MSK IAM authentication is not supported by its Java classes; MSK IAM also speaks OAUTHBEARER: pass "
    "sasl_mechanism='OAUTHBEARER' and a sasl_oauth_token_provider that returns "
    "aws-msk-iam-sasl-signer-python's MSKAuthTokenProvider.generate_auth_token(region), or use SASL/SCRAM"
)
_GSSAPI = (
    "Kerberos (GSSAPI) is not supported: use SCRAM-SHA-512 or OAUTHBEARER, or a librdkafka-based client "
    "(confluent-kafka) for Kerberos"
)
_JAAS_ENTRY = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\b(?P<rest>.*)$", re.S)
_JAAS_OPTION = re.compile(r'\s*([\w.]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')
_JAAS_NAME = re.compile(r"\s*([\w.]+)\s*=")


def property_option(key: str) -> str:
    """The keyword option a property of :func:`from_properties` sets: ``"fetch.max.bytes"`` and
    ``"fetch_max_bytes"`` are ``"fetch_max_bytes"``, librdkafka's ``"sasl.mechanisms"`` is
    ``"sasl_mechanism"``.  (Whether it is a known option is :func:`from_properties`' check.)"""
    return _PROPERTY_ALIASES.get(key, key.replace(".", "_"))


def from_properties(properties: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> ConsumerConfig:
    """Build a config from dotted Java/librdkafka names (``"bootstrap.servers"``).

    Every property of the Java consumer is accepted: applied, ignored when it changes nothing
    here, or rejected when it asks for what this client cannot do
    (:mod:`asyncconsumer.java_properties` lists each).  ``overrides`` are snake_case options
    applied on top before validation.
    """
    if not isinstance(properties, Mapping):
        raise ConfigTypeError(f"properties must be a mapping of dotted names to values, got {properties!r:.80}")
    options: dict[str, Any] = {}
    ssl_props: dict[str, str] = {}
    sasl_props: dict[str, str] = {}
    for key, raw in properties.items():
        if key in _SSL_PROPERTIES:
            ssl_props[key] = str(raw)
        elif key in _SASL_PROPERTIES:
            sasl_props[key] = str(raw)
        elif key in IGNORED:
            _check_ignored(key, raw)
        elif key in REJECTED:
            if str(raw).strip():
                raise ConfigError(f"{key} is not supported: {REJECTED[key]}")
        elif key in ("key.deserializer", "value.deserializer"):
            options[key.replace(".", "_")] = _deserializer(key, raw)
        else:
            name = property_option(key)
            if name not in _FIELDS:
                known = [*JAVA_CONSUMER_PROPERTIES, *_PROPERTY_ALIASES, *_SSL_PROPERTIES]
                hint = difflib.get_close_matches(key, known, n=1)
                raise ConfigError(
                    f"unknown consumer property {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                )
            options[name] = _from_text(name, raw)
    options.update(overrides or {})
    mechanism = str(options.get("sasl_mechanism", "")).upper()
    if mechanism == "GSSAPI":
        raise ConfigError(_GSSAPI)
    if mechanism == "AWS_MSK_IAM":
        raise ConfigError(_MSK_IAM)
    if sasl_props:
        _apply_sasl(sasl_props, options)
    # TLS when the protocol asks for it, or when a store or certificate is named (a file that cannot
    # be read, or TLS material with security.protocol=PLAINTEXT, is then a clear error); protocol
    # versions and cipher suites alone (Spark passes them through) ask for nothing.
    tls = str(options.get("security_protocol", "PLAINTEXT")).upper() in ("SSL", "SASL_SSL")
    material = any(key.endswith((".location", ".certificates", ".key", ".certificate.chain")) for key in ssl_props)
    if ssl_props and (tls or material) and options.get("ssl_context") is None:
        from .tls_stores import ssl_context_from_properties

        options["ssl_context"] = ssl_context_from_properties(ssl_props)
    return build_config(options)


def _check_ignored(key: str, raw: Any) -> None:
    text = str(raw).strip()
    if key == "client.dns.lookup" and text not in ("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only"):
        raise ConfigError(
            f"client.dns.lookup must be use_all_dns_ips or resolve_canonical_bootstrap_servers_only, got {text!r}"
        )
    if key == "metrics.recording.level" and text.upper() not in ("INFO", "DEBUG", "TRACE"):
        raise ConfigError(f"metrics.recording.level must be INFO, DEBUG or TRACE, got {text!r}")
    if key.endswith((".ms", ".bytes", ".samples")) and text and not text.lstrip("-").isdigit():
        raise ConfigError(f"{key} must be an integer, got {shown(key, text)}")


def _deserializer(key: str, raw: Any) -> AnyDeserializer | None:
    if callable(raw) or raw is None or callable(getattr(raw, "deserialize", None)):
        return raw  # type: ignore[no-any-return]
    name = str(raw).strip()
    if name in _DESERIALIZERS:
        return _DESERIALIZERS[name]
    raise ConfigError(
        f"{key}={name!r}: only Kafka's ByteArrayDeserializer (bytes) and StringDeserializer (UTF-8) have a "
        f"Python equivalent here; pass {key.replace('.', '_')}=<a Python callable> instead"
    )


def _jaas(text: str) -> tuple[str, dict[str, str]]:
    """(login module's class name, options) of a ``sasl.jaas.config``: ``<class> <flag> key=value ... ;``.

    A ``ConfigError`` says where the text cannot be read, naming the option but never showing a
    value: this text holds the password."""
    match = _JAAS_ENTRY.match(text)
    if match is None:
        first = text.split(None, 1)[0] if text.strip() else ""
        raise ConfigError(
            "sasl.jaas.config must look like '<LoginModule class> required key=\"value\" ...;', got "
            + (f"{first!r}..." if re.fullmatch(r"[\w.$]+", first) else "text that does not begin with a class name")
        )
    rest = match.group("rest")
    values: dict[str, str] = {}
    position = 0
    while (option := _JAAS_OPTION.match(rest, position)) is not None:
        key, quoted, bare = option.groups()
        values[key] = quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted is not None else bare
        position = option.end()
    if rest[position:].strip() not in ("", ";"):
        name = _JAAS_NAME.match(rest, position)
        if name is not None:
            problem = (
                f"cannot read the value of {name.group(1)!r}: a value in double quotes needs its closing quote, "
                "one without quotes cannot hold spaces, quotes or ';'"
            )
        else:
            after = f"after {list(values)[-1]!r}" if values else "after the control flag"
            problem = f"cannot read what comes {after}: expected key=\"value\" pairs, then ';'"
        raise ConfigError(f"sasl.jaas.config: {problem}")
    return match.group("module"), values


def _apply_sasl(props: dict[str, str], options: dict[str, Any]) -> None:
    """``sasl.jaas.config`` and the OAUTHBEARER login settings, applied to ``options``."""
    module, jaas = _jaas(props["sasl.jaas.config"]) if "sasl.jaas.config" in props else ("", {})
    short = module.rsplit(".", 1)[-1]
    handler = props.get("sasl.login.callback.handler.class", "").strip()
    retriever = props.get("sasl.oauthbearer.jwt.retriever.class", "").strip()
    if short in ("PlainLoginModule", "ScramLoginModule"):
        if "username" not in jaas or "password" not in jaas:
            raise ConfigError(f'sasl.jaas.config: {short} needs username="..." and password="..."')
        options.setdefault("sasl_plain_username", jaas["username"])
        options.setdefault("sasl_plain_password", jaas["password"])
        return
    if short in ("Krb5LoginModule",):
        raise ConfigError(_GSSAPI)
    if short == "IAMLoginModule" or handler.startswith("software.amazon.msk."):
        raise ConfigError(_MSK_IAM)
    if module and short != "OAuthBearerLoginModule":
        raise ConfigError(
            f"sasl.jaas.config: login module {module} is not supported; use PlainLoginModule, ScramLoginModule "
            "or OAuthBearerLoginModule"
        )
    if handler and handler not in (*_OAUTH_LOGIN_HANDLERS, _UNSECURED_LOGIN_HANDLER):
        raise ConfigError(
            f"sasl.login.callback.handler.class={handler} is not supported: Kafka's OAuthBearerLoginCallbackHandler "
            "(the client-credentials flow) is; for other tokens pass sasl_oauth_token_provider"
        )
    if retriever and retriever not in _JWT_RETRIEVERS:
        raise ConfigError(f"sasl.oauthbearer.jwt.retriever.class={retriever} is not supported; Kafka's own are")
    if options.get("sasl_oauth_token_provider") is not None:
        return
    from .oauth import ClientCredentialsTokenProvider, unsecured_token

    extensions = {k.removeprefix("extension_"): v for k, v in jaas.items() if k.startswith("extension_")}
    url = props.get("sasl.oauthbearer.token.endpoint.url", "").strip()
    if url and handler != _UNSECURED_LOGIN_HANDLER:

        def number(name: str, default: int) -> int:
            return int(_from_text("request_timeout_ms", props.get(name, str(default))))

        options["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider(
            url,
            props.get("sasl.oauthbearer.client.credentials.client.id") or jaas.get("clientId"),
            props.get("sasl.oauthbearer.client.credentials.client.secret") or jaas.get("clientSecret"),
            props.get("sasl.oauthbearer.scope") or jaas.get("scope"),
            url_encode_header=props.get("sasl.oauthbearer.header.urlencode", "false").strip().lower() == "true",
            connect_timeout_ms=number("sasl.login.connect.timeout.ms", 10_000),
            read_timeout_ms=number("sasl.login.read.timeout.ms", 10_000),
            retry_backoff_ms=number("sasl.login.retry.backoff.ms", 100),
            retry_backoff_max_ms=number("sasl.login.retry.backoff.max.ms", 10_000),
            extensions=extensions,
        )
    elif "unsecuredLoginStringClaim_sub" in jaas:
        subject = jaas["unsecuredLoginStringClaim_sub"]
        lifetime = int(jaas.get("unsecuredLoginLifetimeSeconds", "3600"))
        scope = jaas.get("unsecuredLoginListClaim_scope")

        async def unsecured() -> OAuthBearerToken:
            return unsecured_token(subject, lifetime_seconds=lifetime, scope=scope, extensions=extensions)

        options["sasl_oauth_token_provider"] = unsecured
    elif short == "OAuthBearerLoginModule" or handler:
        raise ConfigError(
            "OAUTHBEARER from properties needs sasl.oauthbearer.token.endpoint.url (client credentials) or "
            "unsecuredLoginStringClaim_sub in sasl.jaas.config; or pass sasl_oauth_token_provider"
        )


def options_from_properties(
    properties: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``from_properties``'s validated config as keyword options (for a client's constructor)."""
    config = from_properties(properties, overrides)
    return {name: getattr(config, name) for name in _FIELDS}


def _from_text(name: str, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    annotation = str(_FIELDS[name].type)
    if annotation.startswith("bool"):
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{name} must be 'true' or 'false', got {shown(name, raw)}")
        return raw.lower() == "true"
    if annotation.startswith("int"):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {shown(name, raw)}") from None
    if name == "auto_offset_reset":
        return _RESET_ALIASES.get(raw, raw)
    if name == "partition_assignment_strategy":
        return [_ASSIGNOR_CLASSES.get(part.strip(), part.strip()) for part in raw.split(",") if part.strip()]
    if name == "security_protocol":
        return raw.upper()
    if name == "metadata_recovery_strategy":  # case-insensitive, as in the Java client
        return raw.lower()
    if name == "sasl_mechanism":
        return raw.upper()
    return raw
