"""Consumer configuration: Kafka's option names in snake_case, validated up front.

``ConsumerConfig`` is immutable; ``Consumer(**kwargs)`` builds one and every
problem (unknown name, wrong type, out-of-range value, inconsistent security
settings) is a ``ConfigError`` that names the option before any I/O happens.
``from_properties`` accepts Java / librdkafka dotted names.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from .errors import ConfigError

Deserializer = Callable[[bytes], Any]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
OFFSET_RESETS = ("earliest", "latest", "none")
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
ASSIGNORS = ("range", "roundrobin", "sticky", "cooperative-sticky")
GROUP_PROTOCOLS = ("classic", "consumer")


@dataclasses.dataclass(frozen=True, slots=True)
class OAuthBearerToken:
    """An OAUTHBEARER token with what the client needs to know about it.

    ``value`` is the token itself (typically a JWT).  ``expires_at`` is its expiry as a Unix time in
    seconds (a JWT's ``exp`` claim; for a plain string token the client reads ``exp`` itself when the
    token is a JWT): the client asks the provider for a new token once 80 % of the time from getting it
    to ``expires_at`` has passed.  ``extensions`` are SASL extensions sent with the token (KIP-342),
    such as ``{"logicalCluster": "lkc-1"}``; keys are letters only and ``auth`` is reserved.
    """

    value: str
    expires_at: float | None = None
    extensions: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: What a token provider may return: the token, ``(token, expires_at)`` as librdkafka's and
#: confluent-kafka's ``oauth_cb`` return it, or an :class:`OAuthBearerToken`.
OAuthTokenResult: TypeAlias = "str | tuple[str, float] | OAuthBearerToken"


@runtime_checkable
class OAuthTokenSource(Protocol):
    """An object with an async ``token()`` method (the shape of aiokafka's ``AbstractTokenProvider``)."""

    def token(self) -> Awaitable[OAuthTokenResult]: ...


#: ``sasl_oauth_token_provider``: a plain or async callable taking no arguments, or an object with an
#: async ``token()`` method.
OAuthTokenProvider: TypeAlias = (
    "Callable[[], OAuthTokenResult | Awaitable[OAuthTokenResult]] | OAuthTokenSource"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """Every consumer option with its default.  Durations keep Kafka's ``_ms`` names."""

    bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    client_id: str = "asyncconsumer"
    client_rack: str = ""
    # Group and offsets.
    group_id: str | None = None
    group_instance_id: str | None = None
    auto_offset_reset: Literal["earliest", "latest", "none"] = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    rebalance_timeout_ms: int | None = None
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    group_protocol: Literal["classic", "consumer"] = "classic"
    #: ``group_protocol="consumer"``: the broker-side assignor to ask for ("uniform", "range", or
    #: any name in the broker's ``group.consumer.assignors``); ``None`` lets the coordinator choose.
    group_remote_assignor: str | None = None
    #: Commit what was handed out for revoked partitions before giving them up.
    rebalance_safe_commits: bool = True
    #: With manual commits: how long a revocation waits for the application's commits.
    rebalance_commit_wait_ms: int = 10000
    # Fetching.
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 52428800
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1048576
    fetch_buffer_bytes: int = 67108864
    #: Records per poll: getmany()'s default max_records, a batches() item, an async-for chunk.
    max_poll_records: int = 500
    #: read_committed: no records of aborted transactions, nothing past the last stable offset, and
    #: end_offsets()/seek_to_end()/"latest" mean the LSO; markers are never returned (either level).
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    check_crcs: bool = True
    exclude_internal_topics: bool = True
    key_deserializer: Deserializer | None = None
    value_deserializer: Deserializer | None = None
    # Network.
    request_timeout_ms: int = 30000
    socket_connection_setup_timeout_ms: int = 10000
    connections_max_idle_ms: int = 540000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    #: Also the least time between two metadata refreshes asked for one after the other.
    retry_backoff_ms: int = 100
    #: The longest between metadata refreshes: a group's leader notices added partitions then.
    metadata_max_age_ms: int = 300000
    # Security.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] = "PLAIN"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = dataclasses.field(default=None, repr=False)
    #: For ``sasl_mechanism="OAUTHBEARER"``: called (and awaited, if it returns an awaitable) for a
    #: token when a connection authenticates or re-authenticates and the last token is near its expiry.
    #: Returns a ``str``, ``(token, expires_at)`` or an :class:`OAuthBearerToken`.  An object with an
    #: async ``token()`` method works too.  It must not block: do blocking I/O in a thread.
    sasl_oauth_token_provider: OAuthTokenProvider | None = dataclasses.field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def effective_rebalance_timeout_ms(self) -> int:
        return self.rebalance_timeout_ms if self.rebalance_timeout_ms is not None else self.max_poll_interval_ms


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
    "socket_connection_setup_timeout_ms",
    "connections_max_idle_ms",
    "metadata_max_age_ms",
    "rebalance_commit_wait_ms",
}
_NON_NEGATIVE = {
    "fetch_min_bytes",
    "fetch_max_wait_ms",
    "reconnect_backoff_ms",
    "reconnect_backoff_max_ms",
    "retry_backoff_ms",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "auto_offset_reset": OFFSET_RESETS,
    "isolation_level": ISOLATION_LEVELS,
    "security_protocol": SECURITY_PROTOCOLS,
    "sasl_mechanism": SASL_MECHANISMS,
    "group_protocol": GROUP_PROTOCOLS,
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
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, _CHOICES[name]))}")
        return value
    annotation = str(field.type)
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
        return value
    if annotation.startswith("int"):
        if value is None and "None" in annotation:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if name in _POSITIVE and value <= 0:
            raise ConfigError(f"{name} must be > 0, got {value}")
        if name in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        return value
    if name == "ssl_context":
        if value is not None and not isinstance(value, ssl.SSLContext):
            raise ConfigError(f"ssl_context must be an ssl.SSLContext, got {type(value).__name__}")
        return value
    if name == "sasl_oauth_token_provider":
        if value is not None and not callable(value) and not _has_token_method(value):
            raise ConfigError(
                "sasl_oauth_token_provider must be a callable returning a token (str, (token, expires_at) or "
                f"OAuthBearerToken), or an object with an async token() method, got {value!r}"
            )
        return value
    if name.endswith("_deserializer"):
        if value is not None and not callable(value):
            raise ConfigError(f"{name} must be callable (bytes -> value), got {value!r}")
        return value
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


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


# Java / librdkafka names that are not simply dots -> underscores.
_PROPERTY_ALIASES = {
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.jaas.config": None,
    "metadata.broker.list": "bootstrap_servers",
    "group.instance.id": "group_instance_id",
    "partition.assignment.strategy": "partition_assignment_strategy",
    "socket.connection.setup.timeout.ms": "socket_connection_setup_timeout_ms",
}
_RESET_ALIASES = {
    "smallest": "earliest",
    "beginning": "earliest",
    "largest": "latest",
    "end": "latest",
    "error": "none",
}
_SSL_PROPERTIES = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
)


def from_properties(properties: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> ConsumerConfig:
    """Build a config from dotted Java/librdkafka names (``"bootstrap.servers"``).

    ``overrides`` are snake_case options applied on top before validation.
    """
    options: dict[str, Any] = {}
    ssl_props: dict[str, str] = {}
    for key, raw in properties.items():
        if key in _SSL_PROPERTIES:
            ssl_props[key] = str(raw)
            continue
        name = _PROPERTY_ALIASES.get(key, key.replace(".", "_"))
        if name is None:
            raise ConfigError(f"{key} is not supported: use sasl.username / sasl.password")
        if name not in _FIELDS:
            raise ConfigError(f"unknown consumer property {key!r}")
        options[name] = _from_text(name, raw)
    options.update(overrides or {})
    if ssl_props and options.get("ssl_context") is None:
        options["ssl_context"] = _ssl_context_from_properties(ssl_props)
    return build_config(options)


def _from_text(name: str, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    annotation = str(_FIELDS[name].type)
    if annotation.startswith("bool"):
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{name} must be 'true' or 'false', got {raw!r}")
        return raw.lower() == "true"
    if annotation.startswith("int"):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if name == "auto_offset_reset":
        return _RESET_ALIASES.get(raw, raw)
    if name == "security_protocol":
        return raw.upper()
    if name == "sasl_mechanism":
        return raw.upper()
    return raw


def _ssl_context_from_properties(props: Mapping[str, str]) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=props.get("ssl.ca.location"))
        # librdkafka turns hostname checks off with "none", the Java client with "" (empty).
        if props.get("ssl.endpoint.identification.algorithm", "https").strip().lower() in ("none", ""):
            context.check_hostname = False
        if "ssl.certificate.location" in props:
            context.load_cert_chain(
                props["ssl.certificate.location"], props.get("ssl.key.location"), props.get("ssl.key.password")
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files given in ssl.* properties: {exc}") from exc
    return context
