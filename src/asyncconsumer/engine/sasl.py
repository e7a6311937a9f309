"""SASL authentication: PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER as sans-I/O state machines.

A mechanism only turns server challenges into client messages; it never
touches a socket.  ``authenticate`` drives one over the Kafka
SaslHandshake + SaslAuthenticate requests through a caller-supplied
``request`` function, so the network client decides framing and timeouts,
and returns the session lifetime the broker granted (KIP-368), after which
the connection must re-authenticate.  ``TokenCache`` keeps the OAUTHBEARER
token from the application's provider until it nears its expiry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import json
import random
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, Protocol

import anyio

from ..config import SASL_MECHANISMS, OAuthTokenProvider
from ..errors import AuthenticationError, ConfigError, IllegalStateError, SaslAuthenticationError, error_for_code
from ..structs import OAuthBearerToken

__all__ = [
    "OAuthBearerMechanism",
    "PlainMechanism",
    "RequestFn",
    "SaslMechanism",
    "ScramMechanism",
    "TokenCache",
    "authenticate",
    "cleartext_warning",
    "create_mechanism",
    "reauthentication_delay",
]

#: RFC 7677 asks for at least 4096 iterations; fewer means a weak or hostile server.
MIN_SCRAM_ITERATIONS: Final = 4096
#: Upper bound so a hostile server cannot make PBKDF2 block the event loop for
#: minutes (Kafka itself caps SCRAM credentials at 16384).
MAX_SCRAM_ITERATIONS: Final = 1_000_000

_UNSUPPORTED_SASL_MECHANISM: Final = 33

RequestFn = Callable[[str, int, dict[str, Any]], Awaitable[dict[str, Any]]]


class SaslMechanism(Protocol):
    """A client-side SASL exchange, fed with server challenges."""

    name: str
    #: Who logs in, for error messages ("user 'alice'").
    identity: str

    def initial_response(self) -> bytes:
        """The first client message (sent without a challenge)."""
        ...

    def step(self, challenge: bytes) -> bytes | None:
        """The next client message, or ``None`` once the exchange is complete."""
        ...

    @property
    def complete(self) -> bool: ...


class PlainMechanism:
    """RFC 4616 PLAIN: one message, ``authzid NUL authcid NUL password``."""

    name: str = "PLAIN"

    def __init__(self, username: str, password: str, authzid: str = "") -> None:
        # A NUL would shift the field boundaries and authenticate as someone else.
        for label, value in (("username", username), ("password", password), ("authzid", authzid)):
            if "\x00" in value:
                raise ConfigError(f"SASL PLAIN {label} must not contain a NUL character")
        if not username:
            raise ConfigError("SASL PLAIN needs a non-empty username")
        self.identity = f"user {username!r}"
        self._message = b"\x00".join(s.encode("utf-8") for s in (authzid, username, password))
        self._sent = False
        self._complete = False

    def initial_response(self) -> bytes:
        if self._sent:
            raise IllegalStateError("SASL PLAIN initial response was already sent")
        self._sent = True
        return self._message

    def step(self, challenge: bytes) -> bytes | None:
        if not self._sent:
            raise IllegalStateError("SASL PLAIN step() called before initial_response()")
        if self._complete:
            raise SaslAuthenticationError("SASL PLAIN: unexpected server message after completion")
        # The server answers PLAIN with an empty message on success (failures
        # come back as error codes), so whatever arrives here means "done".
        self._complete = True
        return None

    @property
    def complete(self) -> bool:
        return self._complete


# SCRAM exchange states.
_INIT, _SENT_FIRST, _SENT_FINAL, _DONE, _FAILED = range(5)

# "biws" in the RFC: the GS2 header "n,," (no channel binding, no authzid).
_GS2_HEADER: Final = b"n,,"
_CHANNEL_BINDING: Final = base64.b64encode(_GS2_HEADER).decode("ascii")


def _escape_username(username: str) -> str:
    # RFC 5802 saslname: ',' and '=' would break attribute parsing.  '=' goes
    # first so the '=' of "=2C" is not escaped again.
    return username.replace("=", "=3D").replace(",", "=2C")


def _valid_nonce(nonce: str) -> bool:
    # RFC 5802 "printable": %x21-2B / %x2D-7E (visible ASCII except ',').
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _parse_attributes(message: str) -> list[tuple[str, str]]:
    attrs: list[tuple[str, str]] = []
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"malformed SCRAM attribute {part!r}")
        attrs.append((key, value))
    return attrs


class ScramMechanism:
    """RFC 5802 / RFC 7677 SCRAM-SHA-256 and SCRAM-SHA-512 (client side).

    The password is used as UTF-8 without SASLprep normalisation: Kafka brokers
    derive stored credentials from the raw UTF-8 password, so normalising here
    would lock out users whose non-ASCII password is not already in NFKC form.
    """

    def __init__(
        self,
        username: str,
        password: str,
        hash_name: Literal["sha256", "sha512"],
        *,
        nonce: str | None = None,
    ) -> None:
        if hash_name not in ("sha256", "sha512"):
            raise ConfigError(f"SCRAM hash must be 'sha256' or 'sha512', not {hash_name!r}")
        if not username:
            raise ConfigError("SASL SCRAM needs a non-empty username")
        if nonce is None:
            nonce = secrets.token_urlsafe(24)
        elif not _valid_nonce(nonce):
            raise ConfigError("SCRAM nonce must be non-empty printable ASCII without ','")
        self.name: str = "SCRAM-SHA-256" if hash_name == "sha256" else "SCRAM-SHA-512"
        self.identity = f"user {username!r}"
        self._hash_name = hash_name
        self._password = password.encode("utf-8")
        self._client_nonce = nonce
        self._client_first_bare = f"n={_escape_username(username)},r={nonce}"
        self._state = _INIT
        self._server_signature = b""

    def initial_response(self) -> bytes:
        if self._state != _INIT:
            raise IllegalStateError(f"{self.name} initial response was already sent")
        self._state = _SENT_FIRST
        return _GS2_HEADER + self._client_first_bare.encode("utf-8")

    def step(self, challenge: bytes) -> bytes | None:
        if self._state == _INIT:
            raise IllegalStateError(f"{self.name} step() called before initial_response()")
        if self._state == _DONE:
            raise SaslAuthenticationError(f"{self.name}: unexpected server message after completion")
        if self._state == _FAILED:
            raise SaslAuthenticationError(f"{self.name}: exchange already failed")
        try:
            text = bytes(challenge).decode("utf-8")
            if self._state == _SENT_FIRST:
                return self._client_final(text)
            self._verify_server_final(text)
            return None
        except AuthenticationError:
            self._state = _FAILED
            raise
        except ValueError as exc:
            # Covers bad UTF-8, bad base64, bad integers and malformed attributes.
            self._state = _FAILED
            raise SaslAuthenticationError(f"{self.name}: malformed server message: {exc}") from exc

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash_name).digest()

    def _client_final(self, server_first: str) -> bytes:
        attrs = _parse_attributes(server_first)
        _raise_on_server_error(self.name, attrs)
        keys = [k for k, _ in attrs]
        if keys[:1] == ["m"]:
            raise SaslAuthenticationError(f"{self.name}: server requires an unsupported SCRAM extension")
        if keys[:3] != ["r", "s", "i"]:
            raise ValueError(f"expected r=, s=, i= in the server-first message, got {server_first!r}")
        nonce, salt_b64, iterations_text = (v for _, v in attrs[:3])
        # The server must extend our nonce; anything else is a replay or a MITM.
        if not nonce.startswith(self._client_nonce) or len(nonce) == len(self._client_nonce):
            raise SaslAuthenticationError(f"{self.name}: server nonce does not extend the client nonce")
        if not _valid_nonce(nonce):
            raise ValueError("server nonce contains invalid characters")
        salt = base64.b64decode(salt_b64, validate=True)
        if not salt:
            raise ValueError("empty salt")
        if not (iterations_text.isascii() and iterations_text.isdigit()):
            raise ValueError(f"bad iteration count {iterations_text!r}")
        iterations = int(iterations_text)
        if iterations < MIN_SCRAM_ITERATIONS:
            raise SaslAuthenticationError(
                f"{self.name}: server iteration count {iterations} is below the minimum of {MIN_SCRAM_ITERATIONS}"
            )
        if iterations > MAX_SCRAM_ITERATIONS:
            raise SaslAuthenticationError(
                f"{self.name}: server iteration count {iterations} exceeds the maximum of {MAX_SCRAM_ITERATIONS}"
            )

        salted = hashlib.pbkdf2_hmac(self._hash_name, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash_name, client_key).digest()
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        client_signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, client_signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        self._state = _SENT_FINAL
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}".encode("ascii")

    def _verify_server_final(self, server_final: str) -> None:
        attrs = _parse_attributes(server_final)
        _raise_on_server_error(self.name, attrs)
        if attrs[0][0] != "v":
            raise ValueError(f"expected v= in the server-final message, got {server_final!r}")
        try:
            signature = base64.b64decode(attrs[0][1], validate=True)
        except binascii.Error as exc:
            raise SaslAuthenticationError(f"{self.name}: malformed server signature") from exc
        # Constant-time compare: the signature proves the server knows our key.
        if not hmac.compare_digest(signature, self._server_signature):
            raise SaslAuthenticationError(f"{self.name}: server signature does not match; server not trusted")
        self._state = _DONE


def _raise_on_server_error(name: str, attrs: list[tuple[str, str]]) -> None:
    if attrs and attrs[0][0] == "e":
        raise SaslAuthenticationError(f"{name} authentication failed: server error {attrs[0][1]!r}")


def create_mechanism(
    mechanism: str, username: str | None, password: str | None, token: OAuthBearerToken | None = None
) -> SaslMechanism:
    """Build the mechanism named ``mechanism`` (case-insensitive) for these credentials.

    OAUTHBEARER takes ``token`` (from a :class:`TokenCache`); the others a username and password.
    """
    name = mechanism.strip().upper()
    if name not in SASL_MECHANISMS:
        raise ConfigError(f"unsupported SASL mechanism {mechanism!r}; supported: {', '.join(SASL_MECHANISMS)}")
    if name == "OAUTHBEARER":
        if token is None:
            raise ConfigError("SASL mechanism OAUTHBEARER needs a token (sasl_oauth_token_provider)")
        return OAuthBearerMechanism(token.value, token.extensions)
    if not username or password is None:
        raise ConfigError(f"SASL mechanism {name} needs both a username and a password")
    if name == "PLAIN":
        return PlainMechanism(username, password)
    return ScramMechanism(username, password, "sha256" if name == "SCRAM-SHA-256" else "sha512")


_ILLEGAL_SASL_STATE: Final = 34


async def authenticate(
    request: RequestFn,
    mechanism: SaslMechanism,
    *,
    handshake_version: int,
    authenticate_version: int | None,
) -> int:
    """Run SaslHandshake then SaslAuthenticate rounds until ``mechanism`` completes.

    ``authenticate_version`` is the negotiated SaslAuthenticate version, or
    ``None`` when the broker does not support that API.  Returns the session
    lifetime in milliseconds the broker set (SaslAuthenticate v1+, KIP-368),
    0 when the session does not expire.
    """
    # Without SaslAuthenticate the tokens would go as raw unframed bytes
    # (handshake v0); checked first so no request is wasted.
    if authenticate_version is None:
        raise SaslAuthenticationError(
            "broker is too old for SASL: it lacks the SaslAuthenticate API (needs Kafka >= 1.0)"
        )

    response = await request("SaslHandshake", handshake_version, {"mechanism": mechanism.name})
    code = response.get("error_code", 0)
    if code:
        mechanisms = list(response.get("mechanisms") or ())
        enabled = ", ".join(mechanisms) or "none"
        if code == _UNSUPPORTED_SASL_MECHANISM:
            raise SaslAuthenticationError(
                f"broker does not enable SASL mechanism {mechanism.name}; enabled mechanisms: {enabled}"
            )
        if code == _ILLEGAL_SASL_STATE and not mechanisms:
            # What a PLAINTEXT or SSL listener answers to a SaslHandshake.
            raise SaslAuthenticationError(
                f"SASL handshake for {mechanism.name} refused ({error_for_code(code)}) and the listener enables "
                "no SASL mechanism: is this a SASL listener? (security_protocol SASL_* on a PLAINTEXT/SSL port?)"
            )
        raise SaslAuthenticationError(
            f"SASL handshake for {mechanism.name} failed: {error_for_code(code)}; enabled mechanisms: {enabled}"
        )

    message: bytes | None = mechanism.initial_response()
    while message is not None:
        response = await request("SaslAuthenticate", authenticate_version, {"auth_bytes": message})
        code = response.get("error_code", 0)
        if code:
            detail = response.get("error_message") or str(error_for_code(code))
            rejection = getattr(mechanism, "server_error", None)
            if rejection:
                detail = f"{detail} (server said {rejection})"
            raise SaslAuthenticationError(
                f"SASL {mechanism.name} authentication as {mechanism.identity} failed: {detail}"
            )
        message = mechanism.step(bytes(response.get("auth_bytes") or b""))
    if not mechanism.complete:
        # A mechanism that stops without verifying the server is a bug, not success.
        raise SaslAuthenticationError(f"SASL {mechanism.name} exchange ended without completing")
    return max(0, int(response.get("session_lifetime_ms") or 0))


def cleartext_warning(security_protocol: str, mechanism: str) -> str | None:
    """What to warn of when a login sends its credential in clear: PLAIN's password or OAUTHBEARER's
    token over ``SASL_PLAINTEXT``, for anyone on the network path to read and log in with.  None
    otherwise: SCRAM never sends the password (only a proof of it, good for one login), and
    ``SASL_SSL`` encrypts everything."""
    if security_protocol != "SASL_PLAINTEXT" or mechanism not in ("PLAIN", "OAUTHBEARER"):
        return None
    what = "the password" if mechanism == "PLAIN" else "the bearer token"
    return (
        f"security_protocol='SASL_PLAINTEXT' with sasl_mechanism={mechanism!r} sends {what} to the brokers in "
        "clear text: anyone who can see the traffic can read it and log in with it. Use security_protocol="
        "'SASL_SSL' (a SASL_SSL listener), or SCRAM-SHA-512, which never sends the password"
    )


def reauthentication_delay(
    session_lifetime_ms: int, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """Seconds after a successful login at which to re-authenticate (KIP-368): like the Java
    client, a random point between 85 % and 95 % of the session lifetime the broker granted.
    The 5-15 % left covers network latency and clock drift, the jitter keeps many connections
    from re-authenticating in step."""
    return session_lifetime_ms / 1000 * uniform(0.85, 0.95)


# -- OAUTHBEARER ----------------------------------------------------------------------------------

#: RFC 7628 key/value separator (^A).
_KVSEP: Final = "\x01"
#: RFC 6750 b64token: what Kafka's server accepts after "Bearer ".
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
#: KIP-342: extension keys are letters only; values printable ASCII plus space/tab/CR/LF.
_EXTENSION_KEY_RE: Final = re.compile(r"[A-Za-z]+")
_EXTENSION_VALUE_RE: Final = re.compile(r"[\x21-\x7E \t\r\n]+")
_OAUTH_SENT, _OAUTH_ERROR_SENT, _OAUTH_DONE = range(3)


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT (unverified: only read for its expiry and subject), or ``None``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (ValueError, binascii.Error):
        return None
    return claims if isinstance(claims, dict) else None


class OAuthBearerMechanism:
    """RFC 7628 OAUTHBEARER (client side) with KIP-342 SASL extensions.

    The initial message is ``n,,^Aauth=Bearer <token>^A[key=value^A...]^A``.  The server answers an
    empty message on success; on failure it sends a JSON status, which the client must acknowledge
    with a single ``^A`` before the server reports the failure (RFC 7628 section 3.2.3).
    """

    name: str = "OAUTHBEARER"

    def __init__(self, token: str, extensions: Mapping[str, str] | None = None) -> None:
        if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
            raise SaslAuthenticationError(
                f"OAUTHBEARER: the token from sasl_oauth_token_provider is malformed ({_malformed(token)}): a bearer "
                "token is one word of letters, digits and -._~+/ (a JWT, for example); it was not sent"
            )
        extensions = dict(extensions or {})
        for key, value in extensions.items():
            if key == "auth" or not _EXTENSION_KEY_RE.fullmatch(key):
                raise SaslAuthenticationError(
                    f"OAUTHBEARER: invalid SASL extension name {key!r} (letters only, not 'auth')"
                )
            if not isinstance(value, str) or not _EXTENSION_VALUE_RE.fullmatch(value):
                raise SaslAuthenticationError(f"OAUTHBEARER: invalid value for SASL extension {key!r}: {value!r}")
        claims = jwt_claims(token) or {}
        subject = claims.get("sub")
        self.identity = f"the token for {subject!r}" if isinstance(subject, str) else "the provider's token"
        fields = [f"auth=Bearer {token}", *(f"{k}={v}" for k, v in extensions.items())]
        self._message = ("n,," + _KVSEP + _KVSEP.join(fields) + _KVSEP + _KVSEP).encode("utf-8")
        self._state: int | None = None
        #: The server's JSON error status, once it rejected the token.
        self.server_error: str | None = None

    def initial_response(self) -> bytes:
        if self._state is not None:
            raise IllegalStateError("OAUTHBEARER initial response was already sent")
        self._state = _OAUTH_SENT
        return self._message

    def step(self, challenge: bytes) -> bytes | None:
        if self._state is None:
            raise IllegalStateError("OAUTHBEARER step() called before initial_response()")
        if self._state == _OAUTH_DONE:
            raise SaslAuthenticationError("OAUTHBEARER: unexpected server message after completion")
        if self._state == _OAUTH_ERROR_SENT:
            # The server must fail the exchange after our ^A; going on would be success by accident.
            raise SaslAuthenticationError(f"OAUTHBEARER: the server rejected the token: {self.server_error}")
        if not challenge:
            self._state = _OAUTH_DONE
            return None
        self.server_error = _describe_oauth_error(bytes(challenge))
        self._state = _OAUTH_ERROR_SENT
        return _KVSEP.encode("ascii")

    @property
    def complete(self) -> bool:
        return self._state == _OAUTH_DONE


def _malformed(token: object) -> str:
    """What is wrong with a token, without showing it (it is a credential): its length, and the first
    character a token may not hold (never a letter or a digit)."""
    if not isinstance(token, str):
        return f"a {type(token).__name__}, not a str"
    if not token:
        return "empty"
    for at, char in enumerate(token):
        if not (char.isascii() and (char.isalnum() or char in "-._~+/=")):
            return f"{len(token)} characters, {char!r} at position {at}"
    return f"{len(token)} characters, '=' padding before its end"


def _describe_oauth_error(challenge: bytes) -> str:
    text = challenge.decode("utf-8", "replace")
    try:
        status = json.loads(text)
    except ValueError:
        return repr(text[:200])
    if isinstance(status, dict) and "status" in status:
        extra = f", scope {status['scope']!r}" if status.get("scope") else ""
        return f"status {status['status']!r}{extra}"
    return repr(text[:200])


#: A token is refreshed once this share of the time from getting it to its expiry has passed
#: (the Java client's ``sasl.login.refresh.window.factor`` default).
TOKEN_REFRESH_FACTOR: Final = 0.8


class TokenCache:
    """Calls the application's token provider and keeps the token while it is fresh.

    A token with a known expiry (given, or a JWT's ``exp``) is reused until ``TOKEN_REFRESH_FACTOR``
    of its remaining lifetime at the time it was obtained has passed; a token without one is asked
    for again each time.  Concurrent callers share one provider call.
    """

    def __init__(
        self,
        provider: OAuthTokenProvider,
        *,
        timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._provider = provider
        self._timeout = timeout
        self._clock = clock
        self._lock = anyio.Lock()
        self._token: OAuthBearerToken | None = None
        self._refresh_at = 0.0
        #: How often the provider was called (for tests and debugging).
        self.calls = 0

    async def token(self, min_lifetime: float = 0.0) -> OAuthBearerToken:
        """A token that is fresh and, when its expiry is known, valid ``min_lifetime`` seconds more.

        A re-authentication asks for one that lasts as long as the session it replaces: the broker
        ends a session when its token expires, so a token about to expire would buy a session too
        short to re-authenticate in (the broker allows one re-authentication a second).
        """
        async with self._lock:
            token = self._token
            now = self._clock()
            if (
                token is not None
                and now < self._refresh_at
                and (token.expires_at is None or token.expires_at - now >= min_lifetime)
            ):
                return token
            self._token = token = await self._fetch()
            now = self._clock()
            expires_at = token.expires_at
            self._refresh_at = now + TOKEN_REFRESH_FACTOR * (expires_at - now) if expires_at is not None else now
            return token

    async def _fetch(self) -> OAuthBearerToken:
        self.calls += 1
        provider = self._provider
        call = provider.token if not callable(provider) else provider
        try:
            with anyio.fail_after(self._timeout):
                result = call()
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError:
            raise SaslAuthenticationError(
                f"OAUTHBEARER: sasl_oauth_token_provider did not return a token within {self._timeout:.1f}s"
            ) from None
        except Exception as exc:
            raise SaslAuthenticationError(
                f"OAUTHBEARER: sasl_oauth_token_provider raised {type(exc).__name__}: {exc}"
            ) from exc
        return _as_token(result)


def _as_token(result: object) -> OAuthBearerToken:
    if isinstance(result, OAuthBearerToken):
        token = result
    elif isinstance(result, str):
        token = OAuthBearerToken(result)
    elif (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], str)
        and isinstance(result[1], (int, float))
        and not isinstance(result[1], bool)
    ):
        token = OAuthBearerToken(result[0], expires_at=float(result[1]))
    else:
        raise SaslAuthenticationError(
            "OAUTHBEARER: sasl_oauth_token_provider must return a str, (token, expires_at) or an "
            f"OAuthBearerToken, not {type(result).__name__}"
        )
    if token.expires_at is None:
        exp = (jwt_claims(token.value) or {}).get("exp")
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            token = OAuthBearerToken(token.value, expires_at=float(exp), extensions=token.extensions)
    return token
