"""The network client delegate: turns unsent requests into responses.

It owns every connection.  ``send()`` picks the version, builds the body and
sends it on the broker's connection when that is open and free
(``BrokerConnection.send_nowait``: no task, no wait); otherwise it starts a task
that gets (or opens) the connection and sends the request there.  Either way the
outcome goes to ``on_complete`` — the background loop, which runs the manager's
handler on its next turn.  Brokers that fail are retried with exponential
backoff and jitter.

Broker addresses: the ``bootstrap_servers`` until the first metadata, then the
brokers the metadata names (each metadata answer replaces them; a connection
to a broker that moved is dropped).  ``rebootstrap()`` goes back to the
bootstrap servers when the metadata manager decides the known brokers are gone
(KIP-899/KIP-1102, see ``managers/metadata.py``): it forgets them, closes their
connections and says so; a bootstrap server's name is resolved again at each
connection.  Until then, and with ``metadata_recovery_strategy="none"`` always,
requests go only to the known brokers.  With ``"rebootstrap"``, once the
cluster id is known and its brokers speak ApiVersions v5, a new connection to a
known broker names the cluster and broker it means (KIP-1242); a broker that is
not that one refuses it (``MisroutedConnection``), and ``rebootstrap_requested()``
tells the metadata manager so.

A failed login (``AuthenticationError``: wrong SASL credentials, an untrusted
certificate) is fatal at once, as in the Java client (``SaslAuthenticationException``
and ``SslAuthenticationException`` are not retriable there): it is logged as an
error, never as "retrying", and ``pop_fatal_error()`` hands it to the loop, which
raises it in the application's next call.  The broker is still tried again after
the backoff, so a fixed credential (a rotated secret) recovers.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from .._logging import RateLimitedWarnings
from ..config import ConsumerConfig, parse_host_port
from ..errors import (
    AuthenticationError,
    KafkaConnectionError,
    KafkaError,
    NoBrokersAvailableError,
    TLSHandshakeError,
)
from ..managers.requests import Body, UnsentRequest
from ..metrics import LatencyRecorder
from ..protocol.api import API_KEYS
from .buffers import BufferPool
from .connection import (
    COORDINATOR_IDS,
    BrokerConnection,
    MisroutedConnection,
    RefusedBeforeLogin,
    SaslHook,
    Spawn,
    TLSHandshakeCutOff,
    describe_node,
    frame_limit,
)
from .sasl import cleartext_warning

log = logging.getLogger("asyncconsumer.network")

API_VERSIONS_KEY = API_KEYS["ApiVersions"]

Completion = Callable[[UnsentRequest, int, "Body | None", "BaseException | None"], None]
#: Called after each timed request: (api, seconds, error or None); OpenTelemetry's operation.duration.
RequestObserver = Callable[[str, float, "BaseException | None"], None]
#: The requests whose durations are kept (``Consumer.metrics()``: fetch and commit latency;
#: ``ShareConsumer.metrics()``: share fetch and acknowledgement latency).
TIMED_APIS = ("Fetch", "OffsetCommit", "ShareFetch", "ShareAcknowledge")
#: TLS handshakes in a row that a server hangs up on before the client takes it for a listener
#: without TLS (a restarting broker refuses connections rather than accepting and hanging up).
TLS_CUT_OFFS_FOR_GOOD = 3
#: Likewise, connections in a row whose first request after ApiVersions a bootstrap server hangs up
#: on, before any metadata: a SASL listener and a client that does not log in.
REFUSALS_FOR_GOOD = 3


def reconnect_delay(
    failures: int, base: float, cap: float, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """``base * 2**failures`` up to ``cap``, with ±20% jitter, never above ``cap``.

    The jitter keeps many clients from reconnecting in step.  It applies to the capped
    delay (so clients that all reached the cap still spread out), then the cap again, so
    that ``reconnect_backoff_max_ms`` really is the longest wait.
    """
    delay = min(cap, base * (1 << min(failures, 16)))
    return min(cap, delay * uniform(0.8, 1.2))


@dataclass(slots=True)
class _NodeHealth:
    failures: int = 0
    next_attempt: float = 0.0
    last_error: KafkaError | None = None
    tls_cut_offs: int = 0
    refusals: int = 0
    refusal: KafkaError | None = None


class _Outcome:
    """Where the connection puts the response to a request ``NetworkClient.send`` sent without a
    task (``BrokerConnection.send_nowait``): it goes to the loop once."""

    __slots__ = ("_done", "_network", "_request", "_started", "_version")

    def __init__(self, network: NetworkClient, request: UnsentRequest, version: int, started: float) -> None:
        self._network, self._request, self._version, self._started = network, request, version, started
        self._done = False

    def set_result(self, result: Body) -> None:
        self._end(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._end(None, exc)

    def _end(self, body: Body | None, error: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._network._answered(self._request, self._version, self._started, body, error)


class NetworkClient:
    def __init__(
        self,
        config: ConsumerConfig,
        spawn: Spawn,
        on_complete: Completion,
        *,
        sasl: SaslHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._spawn = spawn
        self._on_complete = on_complete
        self._sasl = sasl
        self._clock = clock
        self._bootstrap = {-(i + 1): parse_host_port(s) for i, s in enumerate(config.bootstrap_servers)}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._extra: dict[int, tuple[str, int]] = {}
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, anyio.Event] = {}
        self._health: dict[int, _NodeHealth] = {}
        self._closed = False
        #: Buffers of large response frames, shared by the connections (see engine/buffers.py): at
        #: most what the fetch buffer may hold (frames) and the response on its way (a fetch goes
        #: out while the buffer has room), at most twice the fetch buffer (what an idle consumer
        #: may keep), and at most four responses of the largest size.
        budget, response = config.fetch_buffer_bytes, config.fetch_max_bytes
        self.frames = BufferPool(min(budget + response, 2 * budget, 4 * response))
        #: Connections opened so far (set-up included), for tests and debugging.
        self.connections_opened = 0
        #: Failed connection attempts and lost connections; connections opened to a broker again.
        self.connection_errors = 0
        self.reconnects = 0
        self._ever_connected: set[int] = set()
        #: Durations of the requests in ``TIMED_APIS`` (metrics), and who else wants them (OpenTelemetry).
        self.latency: dict[str, LatencyRecorder] = {api: LatencyRecorder() for api in TIMED_APIS}
        self.observe_request: RequestObserver | None = None
        #: A broker that keeps coming back and failing again is named once a minute, not every time.
        self._warnings = RateLimitedWarnings(log, clock=clock)
        #: The last failed login (fatal, as in the Java client), and whether the loop has taken it.
        self.auth_failure: AuthenticationError | None = None
        self._auth_failure_new = False
        #: Rebootstraps so far; a broker's REBOOTSTRAP_REQUIRED not yet taken by the metadata manager.
        self.rebootstraps = 0
        self._rebootstrap_requested = False
        #: The cluster's id (metadata), and whether its brokers know ApiVersions v5 (the cluster and
        #: node checks of KIP-1242): both needed before a connection asks a broker to check.
        self._cluster_id: str | None = None
        self._check_nodes = False
        #: Said once, before the first connection: a login that sends its credential in clear.
        self._cleartext = cleartext_warning(config.security_protocol, config.sasl_mechanism) if sasl else None

    # -- broker addresses -----------------------------------------------------------------------

    def update_brokers(self, brokers: dict[int, tuple[str, int]], cluster_id: str | None = None) -> None:
        """Called with each metadata response; connections to moved brokers are dropped.  With the
        cluster id, new connections to the brokers check they reach the node meant (KIP-1242)."""
        if cluster_id:
            self._cluster_id = cluster_id
        for node_id, address in brokers.items():
            connection = self._connections.get(node_id)
            if connection is not None and (connection.host, connection.port) != address:
                self._spawn(self._connections.pop(node_id).aclose)
        self._brokers = dict(brokers)

    def known_brokers_unavailable(self) -> bool:
        """Every broker of the last metadata is out of reach for now: none is connected, and each
        is being connected to or waits out its reconnect backoff (KIP-899's test)."""
        if not self._brokers:
            return False
        now = self._clock()
        for node_id in self._brokers:
            connection = self._connections.get(node_id)
            if connection is not None and connection.connected:
                return False
            if node_id not in self._connecting and self._health.get(node_id, _NodeHealth()).next_attempt <= now:
                return False
        return True

    def rebootstrap_requested(self) -> bool:
        """A broker refused a connection with REBOOTSTRAP_REQUIRED since the last call (KIP-1242)."""
        requested, self._rebootstrap_requested = self._rebootstrap_requested, False
        return requested

    def rebootstrap(self, reason: str) -> None:
        """Forget the known brokers: close their connections (and the bootstrap servers', so that
        their names are resolved again) and try the bootstrap servers at once.  A known broker's
        reconnect backoff is kept: metadata naming it again (a broker that keeps being the wrong
        one) does not have it retried at once.  Said in a WARNING, at most once a minute (the
        next one says how many were left out)."""
        known = ", ".join(f"{describe_node(n)} at {host}:{port}" for n, (host, port) in sorted(self._brokers.items()))
        self._warnings.warning("rebootstrap", "going back to bootstrap_servers %s: %s (forgetting %s)",
                               ",".join(self._config.bootstrap_servers), reason, known or "no broker")
        for node_id in (*self._brokers, *self._bootstrap):
            connection = self._connections.pop(node_id, None)
            if connection is not None:
                self._spawn(connection.aclose)
        for node_id in self._bootstrap:
            self._health.pop(node_id, None)
        self._brokers = {}
        self.rebootstraps += 1

    def register_node(self, node_id: int, host: str, port: int) -> None:
        """An address outside the broker list (the group coordinator's own connection)."""
        old = self._extra.get(node_id)
        if old is not None and old != (host, port) and node_id in self._connections:
            self._spawn(self._connections.pop(node_id).aclose)
        self._extra[node_id] = (host, port)

    def address(self, node_id: int) -> tuple[str, int] | None:
        return self._brokers.get(node_id) or self._extra.get(node_id) or self._bootstrap.get(node_id)

    def least_loaded_node(self) -> int:
        """A connected broker with the fewest requests in flight, else one not in backoff."""
        now = self._clock()
        candidates = list(self._brokers) or list(self._bootstrap)
        connected = [n for n in candidates if (c := self._connections.get(n)) is not None and c.connected]
        if connected:
            return min(connected, key=lambda n: self._connections[n].in_flight)
        ready = [n for n in candidates if self._health.get(n, _NodeHealth()).next_attempt <= now]
        pool = ready or candidates
        return min(pool, key=lambda n: self._health.get(n, _NodeHealth()).next_attempt)

    def all_unreachable_error(self) -> KafkaError | None:
        """If every broker requests may go to (the known ones, else the bootstrap servers) failed
        its last attempt, the error that says so."""
        nodes = list(self._brokers) or list(self._bootstrap)
        if any(n in self._connections for n in nodes):
            return None
        health = [self._health.get(n) for n in nodes]
        if not all(h is not None and h.failures for h in health):
            return None
        last = next((h.last_error for h in reversed(health) if h is not None and h.last_error), None)
        servers = ", ".join(self._config.bootstrap_servers)
        if self._brokers:
            known = ", ".join(f"{n} at {host}:{port}" for n, (host, port) in sorted(self._brokers.items()))
            where = f"known brokers {known}; metadata_recovery_strategy={self._config.metadata_recovery_strategy!r}"
        else:
            where = f"bootstrap_servers={servers}"
        return NoBrokersAvailableError(f"no broker reachable ({where}); last error: {last}")

    def pop_fatal_error(self) -> KafkaError | None:
        """A login that failed since the last call (None: none did): the application is to hear of
        it at once, as a Java consumer's ``poll()`` throws ``SaslAuthenticationException``."""
        if not self._auth_failure_new:
            return None
        self._auth_failure_new = False
        return self.auth_failure

    def bootstrap_failed_for_good(self) -> KafkaError | None:
        """A login failed (the first one is enough, as in the Java client); or, before any broker
        is known, every bootstrap server failed with an error that retrying will not fix (not a
        Kafka listener), so waiting on is pointless."""
        if self.auth_failure is not None:
            return self.auth_failure
        if self._brokers or self._connections:
            return None
        errors = [h.last_error if (h := self._health.get(n)) is not None else None for n in self._bootstrap]
        if not errors or any(e is None or e.retriable for e in errors):
            return None
        if isinstance(errors[-1], AuthenticationError):
            return errors[-1]  # the same typed error the first metadata request fails with
        servers = ", ".join(self._config.bootstrap_servers)
        return NoBrokersAvailableError(f"no usable broker (bootstrap_servers={servers}): {errors[-1]}")

    # -- sending ----------------------------------------------------------------------------------

    def send(self, request: UnsentRequest) -> None:
        node_id = request.node_id if request.node_id is not None else self.least_loaded_node()
        connection = self._connections.get(node_id)
        if connection is None or not connection.can_send_now:
            self._spawn(self._run, request, node_id)
            return
        version = -1
        try:
            version = connection.choose_version(request.api, request.min_version, request.max_version)
            body = request.build(version)
            outcome = _Outcome(self, request, version, self._clock())
            connection.send_nowait(request.api, version, body, request.extra_timeout_ms / 1000, outcome)
        except Exception as exc:  # as in _run: no version in common, a bug in a body builder
            self._on_complete(request, version, None, exc)

    async def _run(self, request: UnsentRequest, node_id: int) -> None:
        version = -1
        try:
            connection = await self._connection(node_id)
            version = connection.choose_version(request.api, request.min_version, request.max_version)
            body = request.build(version)
            started = self._clock()
            try:
                response = await connection.request_version(
                    request.api, version, body, extra_timeout=request.extra_timeout_ms / 1000
                )
            except KafkaError as exc:
                self._timed(request.api, started, exc)
                raise
            self._timed(request.api, started, None)
        except Exception as exc:  # a KafkaError, or a bug in a body builder: it must surface, not kill the loop
            self._on_complete(request, version, None, exc)
        else:
            self._on_complete(request, version, response, None)

    def _answered(
        self, request: UnsentRequest, version: int, started: float, body: Body | None, error: BaseException | None
    ) -> None:
        """A request of ``send`` ended (``_Outcome``): timed as in ``_run``, then to the loop, always
        (a failing ``observe_request`` ends the request with its error, as in ``_run``)."""
        try:
            self._timed(request.api, started, error)
        except Exception as exc:
            body, error = None, exc
        self._on_complete(request, version, body, error)

    def _timed(self, api: str, started: float, error: BaseException | None) -> None:
        recorder = self.latency.get(api)
        if recorder is not None:
            seconds = self._clock() - started
            recorder.record(seconds)
            if self.observe_request is not None:
                self.observe_request(api, seconds, error)

    def describe(self, node_id: int) -> str:
        """The connection to ``node_id`` in words, for warnings: where it is, and whether it is
        open, being opened, or failing (how often, the last error, when the next attempt is)."""
        address = self.address(node_id)
        where = f"{describe_node(node_id)} at {address[0]}:{address[1]}" if address else describe_node(node_id)
        connection = self._connections.get(node_id)
        if connection is not None and connection.connected:
            return f"{where} (connected, {connection.in_flight} requests in flight)"
        health = self._health.get(node_id) or _NodeHealth()
        tried = f"{health.failures} failed attempts, last error: {health.last_error}"
        if node_id in self._connecting:
            return f"{where} (connecting{'; ' + tried if health.failures else ''})"
        if health.failures:
            wait = max(0.0, health.next_attempt - self._clock())
            return f"{where} (unreachable: {tried}; next attempt in {wait:.1f}s)"
        return f"{where} (not connected)"

    @property
    def connections_open(self) -> int:
        return sum(1 for c in self._connections.values() if c.connected)

    async def _connection(self, node_id: int) -> BrokerConnection:
        while True:
            existing = self._connections.get(node_id)
            if existing is not None and existing.connected:
                return existing
            pending = self._connecting.get(node_id)
            if pending is None:
                break
            await pending.wait()
            if node_id not in self._connections:
                health = self._health.get(node_id)
                raise (
                    health.last_error
                    if health and health.last_error
                    else KafkaConnectionError(f"cannot connect to node {node_id}")
                )
        address = self.address(node_id)
        if address is None:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        if self._closed:
            raise KafkaConnectionError("the consumer is closing")
        health = self._health.setdefault(node_id, _NodeHealth())
        dead = self._connections.pop(node_id, None)
        if dead is not None:
            self._note_closed(health, dead)
        if health.refusals >= REFUSALS_FOR_GOOD and not self._brokers:
            raise AuthenticationError(f"{health.refusal} ({health.refusals} connections in a row)")
        delay = health.next_attempt - self._clock()
        event = anyio.Event()
        self._connecting[node_id] = event
        try:
            if delay > 0:
                await anyio.sleep(delay)
            connection = self._new_connection(node_id, *address)
            await connection.open(self._spawn)
        except KafkaError as exc:
            if isinstance(exc, MisroutedConnection):
                self._rebootstrap_requested = True
            error = self._tls_streak(health, exc)
            self._report_failure(node_id, health, address, error)
            self._backoff(node_id, health, error)
            if error is exc:
                raise
            raise error from exc
        finally:
            del self._connecting[node_id]
            event.set()
        if self.address(node_id) != address:  # the broker moved, or a rebootstrap forgot it, meanwhile
            self._spawn(connection.aclose)
            raise KafkaConnectionError(f"{describe_node(node_id)} is no longer at {address[0]}:{address[1]}")
        if connection.api_versions.get(API_VERSIONS_KEY, (0, 0))[1] >= 5:
            self._check_nodes = True
        health.failures = 0
        health.last_error = None
        health.tls_cut_offs = 0
        self.auth_failure = None  # logged in (a credential fixed): no longer fatal
        self.connections_opened += 1
        if node_id in self._ever_connected:
            self.reconnects += 1
        self._ever_connected.add(node_id)
        self._connections[node_id] = connection
        log.debug("connected to node %s at %s:%s", node_id, *address)
        return connection

    def _report_failure(
        self, node_id: int, health: _NodeHealth, address: tuple[str, int], error: KafkaError
    ) -> None:
        """Say why a connection attempt failed: a retriable failure once after a success (not a
        silent stall), a failed login each time (at most once a minute per broker) and as fatal."""
        if isinstance(error, AuthenticationError):
            self.auth_failure = error
            self._auth_failure_new = True
            self._warnings.error(("login", node_id), "%s at %s:%s failed authentication: %s",
                                 describe_node(node_id), *address, error)
        elif health.failures == 0:
            if error.retriable:
                self._warnings.warning(node_id, "%s at %s:%s unreachable (%s); retrying with backoff",
                                       describe_node(node_id), *address, error)
            else:
                self._warnings.warning(node_id, "%s at %s:%s cannot be used: %s", describe_node(node_id),
                                       *address, error)

    def _new_connection(self, node_id: int, host: str, port: int) -> BrokerConnection:
        config = self._config
        if self._cleartext is not None:
            log.warning("%s", self._cleartext)
            self._cleartext = None
        sasl = self._sasl
        return BrokerConnection(
            node_id,
            host,
            port,
            client_id=config.client_id,
            request_timeout=config.request_timeout_ms / 1000,
            setup_timeout=config.socket_connection_setup_timeout_ms / 1000,
            ssl_context=self._ssl_context(),
            sasl=sasl,
            max_frame_bytes=frame_limit(config.fetch_max_bytes),
            frames=self.frames,
            expect=self._expect(node_id),
        )

    def _expect(self, node_id: int) -> tuple[str, int] | None:
        """The (cluster id, broker id) a new connection to ``node_id`` asks the broker to check, as the
        Java client does with ``metadata.recovery.strategy=rebootstrap``: once the cluster id is known
        and its brokers can check (not for a bootstrap server: any broker there is right)."""
        if node_id < 0 or self._cluster_id is None or not self._check_nodes:
            return None
        if self._config.metadata_recovery_strategy != "rebootstrap":
            return None
        return self._cluster_id, (2**31 - 1 - node_id if node_id > COORDINATOR_IDS else node_id)

    def _ssl_context(self) -> ssl.SSLContext | None:
        """A new connection's TLS context (the config's; a seam the certificate tests replace)."""
        return self._config.tls_context()

    @staticmethod
    def _note_closed(health: _NodeHealth, connection: BrokerConnection) -> None:
        if isinstance(connection.closed_error, RefusedBeforeLogin):
            health.refusals += 1
            health.refusal = connection.closed_error
        elif connection.answered:
            health.refusals = 0

    @staticmethod
    def _tls_streak(health: _NodeHealth, error: KafkaError) -> KafkaError:
        """A server that hangs up on every TLS handshake is not a TLS listener: a typed error then."""
        health.tls_cut_offs = health.tls_cut_offs + 1 if isinstance(error, TLSHandshakeCutOff) else 0
        if health.tls_cut_offs < TLS_CUT_OFFS_FOR_GOOD:
            return error
        return TLSHandshakeError(f"{error} ({health.tls_cut_offs} handshakes in a row)")

    def _backoff(self, node_id: int, health: _NodeHealth, error: KafkaError) -> None:
        base, cap = self._config.reconnect_backoff_ms / 1000, self._config.reconnect_backoff_max_ms / 1000
        delay = reconnect_delay(health.failures, base, cap)
        self.connection_errors += 1
        health.failures += 1
        health.next_attempt = self._clock() + delay
        health.last_error = error
        log.debug("node %s unreachable (%s); next attempt in %.3fs", node_id, error, delay)

    def drop_dead_connections(self) -> None:
        for connection in self._connections.values():
            if not connection.connected:
                break
        else:
            return  # all alive (each turn)
        for node_id, connection in list(self._connections.items()):
            if not connection.connected:
                del self._connections[node_id]
                health = self._health.setdefault(node_id, _NodeHealth())
                self._note_closed(health, connection)
                error = connection.closed_error or KafkaConnectionError(f"connection to node {node_id} was lost")
                self._backoff(node_id, health, error)

    async def aclose(self) -> None:
        self._closed = True
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.aclose()
