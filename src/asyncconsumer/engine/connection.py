"""One TCP (optionally TLS) connection to one broker.

Requests are pipelined: ``request()`` writes a frame and waits for the response
with the same correlation id, which a reader task delivers (Kafka answers in
order on a connection).  A request that times out, or any protocol error,
closes the connection, because nothing after it on that stream can be trusted.

SASL re-authentication (KIP-368): when the broker limits the session
(``connections.max.reauth.ms``), the connection logs in again on the same
socket before the session ends, at a random point in 85-95 % of its lifetime
(as the Java client), or earlier when a long-poll request would otherwise still
be waiting at that point.  The broker reads one request at a time per
connection and answers in order, so the SaslHandshake goes out behind the
requests already in flight; new requests wait until the login is done, because
the broker fails any other request between SaslHandshake and the last
SaslAuthenticate.

Most requests need no task of their own: ``send_nowait()`` encodes the request and writes
it to the socket from the caller's task (the background loop), and the reader hands the
response to the request's ``Outcome`` (the network client's, which passes it on to the
loop).  It applies while the connection is plain TCP, no re-authentication is due and no
other send is under way; otherwise the caller awaits ``request_version()``.  The kernel
takes a request whole in nearly every case; when it takes only part, a task sends the
rest while later requests wait for the send lock.  One watchdog task per connection ends
such requests at their deadlines, as ``request_version()`` does its own: the connection
closes with a ``KafkaTimeoutError``.

On asyncio's own loop the reader task is not woken for a response that arrives whole between
frames: the socket's readiness callback reads it and delivers it (``_take_frames``,
``SocketStream.receive_fed`` in engine/sockets.py).  The reader task finishes the frames that
arrive in pieces.

Set-up negotiates API versions.  Given ``expect`` (the cluster id and broker id the connection is
meant to reach), ApiVersions goes out in v5 with both (KIP-1242): a broker that is another node,
or in another cluster (an address reused by a replacement machine, a misrouted connection), answers
REBOOTSTRAP_REQUIRED and the set-up fails with ``MisroutedConnection``; the network client then
has the consumer go back to its bootstrap servers.  Otherwise ApiVersions goes out in v3.  A
broker that does not know the version asked answers UNSUPPORTED_VERSION with its own range; the
request goes again at the highest version both know (v0 before v3).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc

from .._runtime import loop_clock
from .._version import __version__
from ..errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProtocolError,
    RebootstrapRequiredError,
    TLSHandshakeError,
    UnsupportedVersionError,
    clear_frame_locals,
)
from ..managers.waiter import Waiter
from ..protocol import api as protocol
from .buffers import BufferPool
from .sasl import SaslMechanism, authenticate, reauthentication_delay
from .sockets import SocketStream, connect

log = logging.getLogger("asyncconsumer.connection")

Body = dict[str, Any]
Spawn = Callable[..., None]
#: Logs a connection in (SaslHandshake + SaslAuthenticate) and returns the session lifetime in ms
#: (0: the session does not expire).
SaslHook = Callable[["BrokerConnection"], Awaitable[int]]
#: The requests of a login: they pass while other requests wait for a re-authentication.
_SASL_APIS = frozenset({"SaslHandshake", "SaslAuthenticate"})
#: The most ``_read_exactly`` reads at once from a TLS stream (anyio's).
_READ_CHUNK = 1 << 20
#: What it reads ahead from a plaintext socket (engine/sockets.py) for frame headers and small frames;
#: the rest of a larger frame is read straight into the frame's buffer.
_SOCKET_CHUNK = 64 << 10
_EMPTY = memoryview(b"")

#: Response frames larger than this are refused before anything is allocated.  It stays
#: under 0x14030000 (~320 MiB), the smallest size a TLS record header reads as, so a
#: plaintext client on a TLS listener fails on the first reply, like one on an HTTP port
#: ("HTTP" reads as ~1.1 GiB).  Far above any response with default fetch sizes.
MAX_FRAME_BYTES = 256 << 20
#: Room above ``fetch_max_bytes``: a broker may return one batch past it to make progress.
_FRAME_HEADROOM = 64 << 20


def _part(chunk: memoryview, start: int, end: int) -> memoryview | bytearray:
    """``chunk[start:end]`` for a frame: a view, or a copy when it is under a quarter of the chunk
    (the fetch buffer counts a response's own bytes, so a small one must not pin a large chunk)."""
    return chunk[start:end] if (end - start) * 4 >= len(chunk) else bytearray(chunk[start:end])


def frame_limit(fetch_max_bytes: int) -> int:
    """The frame size limit for a consumer: grows with ``fetch_max_bytes`` so it never cuts a fetch."""
    return max(MAX_FRAME_BYTES, fetch_max_bytes + _FRAME_HEADROOM)


_LISTENER_HINT = "is this a Kafka listener? (TLS/SASL port mismatch?)"
#: Why a connection may end before its first answer: the port speaks TLS, or the listener is a TCP
#: proxy or load balancer that accepted the connection for a broker that is down.
_HUNG_UP_HINT = ("a TLS listener hangs up on plaintext (TLS/SASL port mismatch?), and so does a proxy or load "
                 "balancer in front of a broker that is down")


def _looks_like(header: bytes) -> str:
    if 0x14 <= header[0] <= 0x18 and header[1] == 0x03:
        return ", which looks like a TLS record"
    if all(0x20 <= b < 0x7F for b in header):
        return ", which looks like text"
    return ""


class Outcome(Protocol):
    """Where a request's response goes: its decoded body, or the error that ended it (the
    connection's closing error, or the response's own).  ``Waiter`` is one."""

    def set_result(self, result: Body) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


class RefusedBeforeLogin(KafkaConnectionError):
    """The broker hung up on a connection's first request after ApiVersions, and it did not log in."""


class MisroutedConnection(KafkaConnectionError):
    """The broker at this address answered ApiVersions with REBOOTSTRAP_REQUIRED: it is not the node,
    or not in the cluster, the connection was meant for (KIP-1242).  Retriable: the network client
    has the consumer go back to its bootstrap servers (see ``expect``)."""


class TLSHandshakeCutOff(KafkaConnectionError):
    """The server hung up during the TLS handshake without a word (retriable: it may be restarting)."""


#: TLS alerts by which a server refuses the client's certificate, or its lack of one: the listener
#: requires mutual TLS (``ssl.client.auth=required``).  Under TLS 1.3 the server checks the client's
#: certificate after the client has finished its side of the handshake, so the alert comes with
#: the first read, not from the handshake itself.
_CERTIFICATE_ALERTS = frozenset({
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV1_ALERT_ACCESS_DENIED",
})


def _tls_error(where: str, exc: ssl.SSLError) -> TLSHandshakeError:
    if exc.reason in _CERTIFICATE_ALERTS:
        return TLSHandshakeError(
            f"the broker at {where} refused this client's certificate (TLS alert {exc.reason}): the listener "
            "requires mutual TLS, and no client certificate was sent or the broker does not trust it (not signed "
            "by a CA in the broker's trust store, expired, or not for client authentication); load one with "
            "ssl_context.load_cert_chain(), or give from_properties ssl.keystore.location"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = ""
        if exc.verify_code in (2, 19, 20, 21):  # unknown issuer, self-signed chain
            hint = " (does ssl_context trust the CA that signed the broker's certificate?)"
        elif "mismatch" in str(exc.verify_message):  # "Hostname mismatch", "IP address mismatch"
            hint = " (the certificate must name the host in bootstrap_servers / the broker's advertised listener)"
        return TLSHandshakeError(
            f"TLS handshake with {where} failed: certificate verify failed: {exc.verify_message}{hint}"
        )
    if exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return TLSHandshakeError(
            f"the TLS handshake with {where} did not complete: the server did not answer in TLS ({exc}): "
            "is this a TLS listener?"
        )
    return TLSHandshakeError(f"TLS handshake with {where} failed: {exc}")


def describe_node(node_id: int) -> str:
    """A connection id in words: a bootstrap server, a broker, or a group coordinator's connection."""
    if node_id < 0:
        return "bootstrap server"
    if node_id > COORDINATOR_IDS:
        return f"group coordinator (broker {2**31 - 1 - node_id})"
    return f"broker {node_id}"


#: Connection ids above this are group coordinators' own (managers/coordinator.py, ``2**31 - 1 - id``).
COORDINATOR_IDS = 2**30


class BrokerConnection:
    """A connection to ``host:port``; ``node_id`` is negative for bootstrap servers."""

    def __init__(
        self,
        node_id: int,
        host: str,
        port: int,
        *,
        client_id: str,
        request_timeout: float,
        setup_timeout: float,
        ssl_context: ssl.SSLContext | None,
        sasl: SaslHook | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        frames: BufferPool | None = None,
        expect: tuple[str, int] | None = None,
    ) -> None:
        self.node_id = node_id
        #: (cluster id, broker id) this connection is meant to reach, checked by the broker (KIP-1242).
        self.expect = expect
        self.host = host
        self.port = port
        self._client_id = client_id
        self._request_timeout = request_timeout
        self._setup_timeout = setup_timeout
        self._ssl_context = ssl_context
        self._sasl = sasl
        self._max_frame_bytes = max_frame_bytes
        self._frames = frames if frames is not None else BufferPool(0)
        self._stream: anyio.abc.ByteStream | None = None
        # Held while a frame goes out over awaits (a semaphore: the rest of a frame ``send_nowait``
        # began is sent by a task of its own, which releases it).
        self._send_lock = anyio.Semaphore(1)
        self._pending: dict[int, tuple[str, int, Outcome]] = {}
        # The requests of ``send_nowait``: correlation id -> (deadline on the anyio clock, timeout),
        # and their watchdog (it sleeps until ``_watch_until``, or until ``_watch_event`` is set).
        self._deadlines: dict[int, tuple[float, float]] = {}
        self._watch_event: anyio.Event | None = None
        self._watch_until = float("inf")
        #: The event loop's clock, which the requests' deadlines are on (``loop_clock``, set by ``open``).
        self._now: Callable[[], float] = anyio.current_time
        self._watch_scope = anyio.CancelScope()
        self._next_correlation_id = 1
        # Bytes received but not yet consumed: ``_chunk[_pos:]`` (an offset, so taking a
        # frame never copies the rest of the chunk).
        self._chunk = _EMPTY
        self._pos = 0
        self._closed_error: KafkaError | None = None
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.last_used = 0.0
        self._reader_scope = anyio.CancelScope()
        self._spawn: Spawn | None = None
        # Responses delivered after set-up: none before the broker hangs up means it refused the
        # first request, which is how a SASL listener answers a client that did not log in.
        self._set_up = False
        self._answered = 0
        # KIP-368: when to re-authenticate and when the broker ends the session (anyio clock).
        self._reauth_at: float | None = None
        self._session_ends: float | None = None
        self._reauth_gate: anyio.Event | None = None  # set while a re-authentication runs
        self._reauth_timer = False
        self._reauth_scope = anyio.CancelScope()
        #: Re-authentications that succeeded on this connection.
        self.reauthentications = 0
        #: The lifetime in seconds of the current SASL session (0: none, or it does not expire).
        self.session_lifetime = 0.0

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    @property
    def connected(self) -> bool:
        return self._stream is not None and self._closed_error is None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def closed_error(self) -> KafkaError | None:
        """Why the connection closed, once it did."""
        return self._closed_error

    # -- set-up ---------------------------------------------------------------------------------

    async def open(self, spawn: Spawn) -> None:
        """Connect, negotiate API versions and authenticate; raise a typed error on failure."""
        self._now = loop_clock()
        where = f"{self.host}:{self.port}"
        try:
            with anyio.fail_after(self._setup_timeout):
                if self._ssl_context is not None:
                    self._stream = await anyio.connect_tcp(
                        self.host, self.port, ssl_context=self._ssl_context, tls_standard_compatible=False
                    )
                else:
                    self._stream = await connect(self.host, self.port)
        except TimeoutError:
            what = "the TLS handshake with" if self._ssl_context is not None else "connecting to"
            raise KafkaConnectionError(f"{what} {where} timed out after {self._setup_timeout:.1f}s") from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            # A TLS server answers a ClientHello or sends an alert; hanging up without a word is what
            # a plaintext Kafka listener does with the ClientHello (a frame size of ~350 MB), but also
            # what a broker going down may do: retriable once, the network client gives up on a streak.
            raise TLSHandshakeCutOff(
                f"the TLS handshake with {where} did not complete: the server closed the connection without "
                "answering: is this a TLS listener? (security_protocol SSL/SASL_SSL on a PLAINTEXT or "
                f"SASL_PLAINTEXT port?) [{exc!r}]"
            ) from exc
        except ssl.SSLError as exc:  # certificate, protocol or cipher mismatch: retrying will not help
            raise _tls_error(where, exc) from exc
        except OSError as exc:
            raise KafkaConnectionError(f"cannot connect to {where}: {exc.strerror or exc}") from exc
        self._spawn = spawn
        spawn(self._read_loop)
        try:
            await self._negotiate_versions()
            if self._sasl is not None:
                self._session_started(await self._sasl(self))
            self._set_up = True
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, KafkaConnectionError) and not isinstance(exc, MisroutedConnection) and (
                    not self.api_versions):
                # Hanging up on the very first request is how a TLS listener answers plaintext.
                raise KafkaConnectionError(f"{exc} before answering ApiVersions: {_HUNG_UP_HINT}") from exc
            raise

    async def _negotiate_versions(self) -> None:
        high = protocol.SUPPORTED_VERSIONS["ApiVersions"][1]
        version = min(high, 5 if self.expect is not None else 3)
        response = await self.request_version("ApiVersions", version, self._api_versions_body(version))
        if response["error_code"] == UnsupportedVersionError.code:
            # The broker is older than our request: it answered in v0 with its own range.
            theirs = {k["api_key"]: k["max_version"] for k in response["api_keys"]}
            retry = min(3, theirs.get(protocol.API_KEYS["ApiVersions"], 0), version - 1)
            retry = retry if retry >= 3 else 0
            response = await self.request_version("ApiVersions", retry, self._api_versions_body(retry))
        if response["error_code"] == RebootstrapRequiredError.code and self.expect is not None:
            cluster, broker = self.expect
            raise MisroutedConnection(
                f"{self.host}:{self.port} is not broker {broker} of cluster {cluster}: it answered "
                "REBOOTSTRAP_REQUIRED (the address leads to another node or cluster now)"
            )
        if response["error_code"]:
            raise ProtocolError(f"ApiVersions to {self.host}:{self.port} failed with code {response['error_code']}")
        self.api_versions = {k["api_key"]: (k["min_version"], k["max_version"]) for k in response["api_keys"]}

    def _api_versions_body(self, version: int) -> Body:
        if version < 3:
            return {}
        body: Body = {"client_software_name": "asyncconsumer", "client_software_version": __version__}
        if version >= 5 and self.expect is not None:
            body["cluster_id"], body["node_id"] = self.expect
        return body

    def choose_version(self, api: str, min_version: int = 0, max_version: int | None = None) -> int:
        """Highest version both sides support, within ``[min_version, max_version]``."""
        ours_low, ours_high = protocol.SUPPORTED_VERSIONS[api]
        if max_version is not None:
            ours_high = min(ours_high, max_version)
        ours_low = max(ours_low, min_version)
        key = protocol.API_KEYS[api]
        theirs = self.api_versions.get(key)
        if theirs is None:
            raise UnsupportedVersionError(
                f"broker {self.host}:{self.port} does not support {api} (API key {key}): its ApiVersions answer "
                f"lists no such API ({self.release})"
            )
        version = min(ours_high, theirs[1])
        if version < max(ours_low, theirs[0]):
            raise UnsupportedVersionError(
                f"no common {api} version: broker {self.host}:{self.port} ({self.release}) supports "
                f"{theirs[0]}-{theirs[1]}, this client {ours_low}-{ours_high}"
            )
        return version

    @property
    def release(self) -> str:
        """The Apache Kafka releases the broker's ApiVersions answer matches (``"Apache Kafka 3.9"``)."""
        return protocol.broker_release(self.api_versions)

    # -- requests -------------------------------------------------------------------------------

    async def log_in(self, mechanism: SaslMechanism) -> int:
        """SaslHandshake, then SaslAuthenticate rounds until ``mechanism`` completes, at the versions
        this connection negotiated; returns the session lifetime the broker set (ms, 0: none)."""
        handshake_version = self.choose_version("SaslHandshake")
        try:
            authenticate_version: int | None = self.choose_version("SaslAuthenticate")
        except KafkaError:
            authenticate_version = None
        return await authenticate(self.request_version, mechanism, handshake_version=handshake_version,
                                  authenticate_version=authenticate_version)

    async def request_version(self, api: str, version: int, body: Body, extra_timeout: float = 0.0) -> Body:
        """Send one request at a given version and wait for its response.

        ``extra_timeout`` is how long the broker may hold the request on top of the request timeout
        (a long-poll Fetch): a request that would still be waiting when the session is due for
        re-authentication waits for an early re-authentication instead.
        """
        login = api in _SASL_APIS
        if not login:
            await self._wait_for_session(extra_timeout)
        if self._closed_error is not None:
            raise self._closed_error
        stream = self._stream
        if stream is None:
            raise KafkaConnectionError(f"connection to {self.host}:{self.port} is not open")
        correlation_id, frame = self._frame(api, version, body)
        waiter: Waiter[Body] = Waiter()
        try:
            while True:
                async with self._send_lock:
                    # Checked under the lock: a re-authentication may have begun while this waited.
                    if login or self._reauth_gate is None:
                        if self._closed_error is not None:
                            raise self._closed_error
                        self._pending[correlation_id] = (api, version, waiter)
                        try:
                            await stream.send(frame)
                        except BaseException:
                            if isinstance(stream, SocketStream) and stream.closed:
                                self._fail(self._cut_off(api))
                            raise
                        break
                await self._wait_for_session(extra_timeout)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._fail(self._send_failed(api, exc))
            raise self._closed_error or KafkaConnectionError(str(exc)) from exc
        timeout = self._request_timeout + extra_timeout
        with anyio.move_on_after(timeout) as scope:
            return await waiter.wait()
        if scope.cancelled_caught:
            raise self._timed_out(api, timeout)
        raise AssertionError("unreachable")  # pragma: no cover

    def _frame(self, api: str, version: int, body: Body) -> tuple[int, bytes]:
        """The request's frame, under the next correlation id (which it returns)."""
        correlation_id = self._next_correlation_id
        frame = protocol.encode_request(api, version, body, correlation_id=correlation_id, client_id=self._client_id)
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        return correlation_id, frame

    def _send_failed(self, api: str, exc: BaseException) -> KafkaError:
        if isinstance(exc, ssl.SSLError):
            return self._tls_closed(exc)
        return KafkaConnectionError(f"sending {api} to {self.host}:{self.port} failed: {exc}")

    def _tls_closed(self, exc: ssl.SSLError) -> KafkaError:
        """The error a TLS error after the handshake closes the connection with.  The broker's refusal
        of the client's certificate (the alert of a mutual-TLS listener, which TLS 1.3 delivers with
        the first read), or any alert before the connection was set up, is a ``TLSHandshakeError``:
        not retriable, as a failed handshake.  Later, anything else is a broken connection."""
        error: KafkaError
        if exc.reason in _CERTIFICATE_ALERTS or (not self._set_up and "ALERT" in str(exc.reason)):
            error = _tls_error(f"{self.host}:{self.port}", exc)
        else:
            error = KafkaConnectionError(f"connection to {self.host}:{self.port} closed by a TLS error: {exc}")
        error.__cause__ = exc
        clear_frame_locals(error)  # it stays on as the closing error: its traceback must not pin a frame
        return error

    def _cut_off(self, api: str) -> KafkaConnectionError:
        """A send cancelled part way through a frame: the connection must close."""
        return KafkaConnectionError(
            f"sending {api} to {self.host}:{self.port} was cancelled half way through the request; "
            "the connection is closed (nothing after it could be framed)"
        )

    def _timed_out(self, api: str, timeout: float) -> KafkaTimeoutError:
        """A request went unanswered for ``timeout`` seconds: the connection closes with this error."""
        error = KafkaTimeoutError(f"{api} request to {self.host}:{self.port} timed out after {timeout:.1f}s")
        if self._closed_error is None:  # not a silent stall: say which broker does not answer
            log.warning("%s at %s:%s did not answer a %s request within %.1fs; closing the connection",
                        describe_node(self.node_id), self.host, self.port, api, timeout)
        self._fail(error)
        return error

    @property
    def can_send_now(self) -> bool:
        """Whether ``send_nowait`` applies: the connection is open on plain TCP, set up, no
        re-authentication is due and no send is under way."""
        return (
            self._closed_error is None
            and self._set_up
            and self._reauth_at is None
            and self._send_lock.value > 0
            and type(self._stream) is SocketStream
        )

    def send_nowait(self, api: str, version: int, body: Body, extra_timeout: float, outcome: Outcome) -> None:
        """Send a request from the caller's task, without waiting; only when ``can_send_now``.

        The response, or the error that ends the request, goes to ``outcome`` (from the reader's
        task, or from this call when the socket fails).  The request times out after the request
        timeout plus ``extra_timeout``, as with ``request_version``.  Raises only what encoding
        the request raises (then nothing was sent).
        """
        stream = self._stream
        assert self.can_send_now and isinstance(stream, SocketStream) and self._spawn is not None
        correlation_id, frame = self._frame(api, version, body)
        timeout = self._request_timeout + extra_timeout
        deadline = self._now() + timeout
        self._pending[correlation_id] = (api, version, outcome)
        self._deadlines[correlation_id] = (deadline, timeout)
        try:
            rest = stream.send_nowait(frame)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._fail(self._send_failed(api, exc))
            return
        try:
            if rest:  # the kernel took part of it: the rest before anything else
                self._send_lock.acquire_nowait()
                self._spawn(self._send_rest, api, stream, rest)
            if self._watch_event is None:
                self._watch_event = anyio.Event()
                self._spawn(self._watchdog)
            elif deadline < self._watch_until:
                self._watch_event.set()
        except Exception as exc:  # no task to finish it or to time it (the consumer is closing)
            self._fail(self._send_failed(api, exc))

    async def _send_rest(self, api: str, stream: SocketStream, rest: memoryview) -> None:
        """The rest of a frame ``send_nowait`` began; the send lock is held for it."""
        try:
            await stream.send(rest)
        except Exception as exc:  # anyio's BrokenResourceError, ClosedResourceError
            self._fail(self._send_failed(api, exc))
        except BaseException:  # cancelled: half a frame may be out
            self._fail(self._cut_off(api))
            raise
        finally:
            self._send_lock.release()

    async def _watchdog(self) -> None:
        """Ends the requests of ``send_nowait`` at their deadlines (one task per connection)."""
        with self._watch_scope:
            while self._closed_error is None:
                event = self._watch_event = anyio.Event()
                if not self._deadlines:
                    self._watch_until = float("inf")
                    await event.wait()
                    continue
                correlation_id = min(self._deadlines, key=self._deadlines.__getitem__)
                deadline, timeout = self._deadlines[correlation_id]
                if self._now() >= deadline:
                    self._timed_out(self._pending[correlation_id][0], timeout)
                    return
                self._watch_until = deadline
                with anyio.move_on_after(deadline - self._now()):
                    await event.wait()

    async def _read_exactly(self, stream: anyio.abc.ByteStream, size: int) -> memoryview | bytearray:
        """The next ``size`` bytes: a view of the current chunk if it holds them, else a buffer from the
        frame pool (engine/buffers.py: large frames' buffers are used again).

        The view is not a copy; it keeps its chunk (at most ``_READ_CHUNK``) alive while the
        response's records point into it.  Only frames spanning chunks are copied, once, and
        frames under a quarter of their chunk: the fetch buffer counts a response's own bytes, so a
        view must not pin much more than that (a small fetch could otherwise hold a whole chunk).
        On a plaintext socket the rest of a frame of ``_SOCKET_CHUNK`` or more is not read in
        chunks: each piece goes from the socket straight into the frame's buffer as it arrives
        (``SocketStream.receive_exactly_into``).
        """
        chunk, start = self._chunk, self._pos
        end = start + size
        if end <= len(chunk):
            self._pos = end
            return _part(chunk, start, end)
        buffer = self._frames.take(size)
        filled = len(chunk) - start
        buffer[:filled] = chunk[start:]
        self._chunk, self._pos = _EMPTY, 0
        read_ahead = _READ_CHUNK
        receive = stream.receive
        if isinstance(stream, SocketStream):
            if size - filled >= _SOCKET_CHUNK:
                await stream.receive_exactly_into(memoryview(buffer)[filled:])
                return buffer
            read_ahead, receive = _SOCKET_CHUNK, stream.receive_ready  # cancelled, the reader closes the stream
        while filled < size:
            data = memoryview(await receive(read_ahead))
            take = min(len(data), size - filled)
            buffer[filled : filled + take] = data[:take]
            filled += take
            if take < len(data):
                self._chunk, self._pos = data, take
        return buffer

    async def _read_loop(self) -> None:
        stream = self._stream
        assert stream is not None
        try:
            with self._reader_scope:
                await self._read_frames(stream)
        except ssl.SSLError as exc:  # a TLS alert from the broker (an OSError: caught first)
            self._fail(self._tls_closed(exc))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._fail(self._refused_without_login() or KafkaConnectionError(
                f"connection to {self.host}:{self.port} closed: {str(exc) or 'EOF'}"))
        except KafkaError as exc:
            clear_frame_locals(exc)  # it stays on: its traceback must not pin the frame's buffer
            self._fail(exc)
        except Exception as exc:  # a decoding bug must not kill the consumer's task group
            self._fail(ProtocolError(f"unexpected error reading from {self.host}:{self.port}: {exc!r}"))
        finally:
            await self._close_stream()

    async def _read_frames(self, stream: anyio.abc.ByteStream) -> None:
        fed = stream if isinstance(stream, SocketStream) and stream.feeds else None
        while True:
            if fed is not None and self._pos >= len(self._chunk):
                # Between frames: what arrives goes to _take_frames, from the loop's readiness
                # callback while this task waits; it comes back for a frame only part there.
                self._chunk, self._pos = _EMPTY, 0
                await fed.receive_fed(self._take_frames, _SOCKET_CHUNK)
                if self._pos >= len(self._chunk):
                    continue
            size = self._frame_size(await self._read_exactly(stream, 4))
            self._deliver(await self._read_exactly(stream, size))

    def _frame_size(self, header: memoryview | bytearray) -> int:
        """The size a frame's 4-byte header gives, checked before anything is allocated for it."""
        size = int.from_bytes(header, "big", signed=True)
        if not 4 <= size <= self._max_frame_bytes:
            raise self._bad_frame_size(bytes(header), size)
        return size

    def _take_frames(self, data: bytes) -> bool:
        """Bytes read between frames (``SocketStream.receive_fed``): every whole frame in them is
        delivered now (views or copies, by ``_read_exactly``'s rule); True when nothing is left,
        else the rest stays in the chunk for the reader."""
        chunk = self._chunk = memoryview(data)
        pos = self._pos = 0
        length = len(chunk)
        while length - pos >= 4:
            start = pos + 4
            end = start + self._frame_size(chunk[pos:start])
            if end > length:
                break
            pos = self._pos = end
            self._deliver(_part(chunk, start, end))
        if pos < length:
            return False
        self._chunk, self._pos = _EMPTY, 0  # pins nothing while the reader waits
        return True

    @property
    def answered(self) -> int:
        """Responses received after set-up (ApiVersions and the login)."""
        return self._answered

    def _refused_without_login(self) -> RefusedBeforeLogin | None:
        """The broker hung up on the first request after ApiVersions of a connection that did not log
        in: a SASL listener does exactly that (it allows only ApiVersions and SaslHandshake), but so
        may a broker going down, so this stays retriable (the network client judges a streak)."""
        if self._sasl is not None or not self._set_up or self._answered or not self._pending:
            return None
        first = min(self._pending)
        return RefusedBeforeLogin(
            f"{self.host}:{self.port} closed the connection on the first request after ApiVersions "
            f"({self._pending[first][0]}) without answering: the listener probably requires SASL "
            "authentication (security_protocol SASL_PLAINTEXT or SASL_SSL, with sasl_mechanism and credentials)"
        )

    # -- re-authentication (KIP-368) --------------------------------------------------------------

    def _session_started(self, lifetime_ms: int) -> None:
        """A login succeeded; the broker ends the session after ``lifetime_ms`` (0: never)."""
        self.session_lifetime = max(0, lifetime_ms) / 1000
        if lifetime_ms <= 0:
            self._reauth_at = self._session_ends = None
            return
        now = self._now()
        self._session_ends = now + lifetime_ms / 1000
        self._reauth_at = now + reauthentication_delay(lifetime_ms)
        log.debug("%r: session lifetime %d ms, re-authenticating in %.3fs", self, lifetime_ms, self._reauth_at - now)
        if not self._reauth_timer and self._spawn is not None:
            self._reauth_timer = True
            self._spawn(self._reauthentication_timer)

    async def _reauthentication_timer(self) -> None:
        """Re-authenticates idle connections too: the broker would close them on their next request."""
        try:
            with self._reauth_scope:
                while self._reauth_at is not None and self._closed_error is None:
                    delay = self._reauth_at - self._now()
                    if delay > 0:
                        await anyio.sleep(delay)  # then look again: an early re-authentication moves it
                    else:
                        await self._begin_reauthentication().wait()
        finally:
            self._reauth_timer = False

    async def _wait_for_session(self, extra_timeout: float) -> None:
        """Hold a request while the connection re-authenticates, or until it has when it is due."""
        if self._reauth_at is None:
            return
        now = self._now()
        if self._session_ends is not None and now >= self._session_ends and self._reauth_gate is None:
            # Too late (the loop did not get to run): the broker closes the connection on any request.
            self._fail(KafkaConnectionError(
                f"the SASL session with {self.host}:{self.port} expired before it could be re-authenticated"))
            return
        if self._reauth_gate is None and now + extra_timeout < self._reauth_at:
            return
        await self._begin_reauthentication().wait()

    def _begin_reauthentication(self) -> anyio.Event:
        gate = self._reauth_gate
        if gate is None:
            gate = anyio.Event()
            assert self._spawn is not None
            self._spawn(self._reauthenticate, gate)  # may raise (consumer closing): then no gate is left
            self._reauth_gate = gate
        return gate

    async def _reauthenticate(self, gate: anyio.Event) -> None:
        assert self._sasl is not None
        try:
            lifetime_ms = await self._sasl(self)
        except KafkaError as exc:
            self._reauth_at = None
            self._fail(exc)
        except Exception as exc:  # a bug must close this connection, not the consumer's task group
            self._reauth_at = None
            self._fail(ProtocolError(f"re-authentication with {self.host}:{self.port} failed: {exc!r}"))
        else:
            self.reauthentications += 1
            log.debug("%r re-authenticated", self)
            self._session_started(lifetime_ms)
        finally:
            self._reauth_gate = None
            gate.set()

    def _bad_frame_size(self, header: bytes, size: int) -> ProtocolError:
        # Checked before allocating: garbage from a non-Kafka peer must fail now, not after
        # the request timeout spent waiting for hundreds of MB that never come.
        limit = f" (limit {self._max_frame_bytes})" if size > self._max_frame_bytes else ""
        return ProtocolError(
            f"bad response frame size {size}{limit} from {self.host}:{self.port}: first bytes "
            f"{header!r}{_looks_like(header)}; {_LISTENER_HINT}"
        )

    def _deliver(self, frame: memoryview | bytearray) -> None:
        correlation_id = protocol.peek_correlation_id(frame)
        entry = self._pending.pop(correlation_id, None)
        self._deadlines.pop(correlation_id, None)
        if entry is None:
            raise ProtocolError(f"unexpected correlation id {correlation_id} from {self.host}:{self.port}")
        if self._set_up:
            self._answered += 1
        api, version, outcome = entry
        try:
            outcome.set_result(protocol.decode_response(api, version, memoryview(frame)))
        except KafkaError as exc:
            outcome.set_exception(exc)
            raise

    # -- teardown -------------------------------------------------------------------------------

    def _fail(self, error: KafkaError) -> None:
        if self._closed_error is None:
            self._closed_error = error
            log.debug("%r failed: %s", self, error)
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        for _, _, outcome in pending.values():
            outcome.set_exception(error)
        # Cancelling the reader makes it close the stream on its way out.
        self._reader_scope.cancel()
        self._reauth_scope.cancel()
        self._watch_scope.cancel()

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await stream.aclose()

    async def aclose(self) -> None:
        self._fail(KafkaConnectionError(f"connection to {self.host}:{self.port} was closed by the client"))
        await self._close_stream()
