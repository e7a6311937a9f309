"""SASL authentication: PLAIN and SCRAM-SHA-256/512 as sans-I/O state machines.

A mechanism only turns server challenges into client messages; it never
touches a socket.  ``authenticate`` drives one over the Kafka
SaslHandshake + SaslAuthenticate requests through a caller-supplied
``request`` function, so the network client decides framing and timeouts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, Protocol

from ..errors import AuthenticationError, ConfigError, IllegalStateError, error_for_code

__all__ = [
    "SUPPORTED_MECHANISMS",
    "PlainMechanism",
    "RequestFn",
    "SaslMechanism",
    "ScramMechanism",
    "authenticate",
    "create_mechanism",
]

SUPPORTED_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

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
            raise AuthenticationError("SASL PLAIN: unexpected server message after completion")
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
            raise AuthenticationError(f"{self.name}: unexpected server message after completion")
        if self._state == _FAILED:
            raise AuthenticationError(f"{self.name}: exchange already failed")
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
            raise AuthenticationError(f"{self.name}: malformed server message: {exc}") from exc

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
            raise AuthenticationError(f"{self.name}: server requires an unsupported SCRAM extension")
        if keys[:3] != ["r", "s", "i"]:
            raise ValueError(f"expected r=, s=, i= in the server-first message, got {server_first!r}")
        nonce, salt_b64, iterations_text = (v for _, v in attrs[:3])
        # The server must extend our nonce; anything else is a replay or a MITM.
        if not nonce.startswith(self._client_nonce) or len(nonce) == len(self._client_nonce):
            raise AuthenticationError(f"{self.name}: server nonce does not extend the client nonce")
        if not _valid_nonce(nonce):
            raise ValueError("server nonce contains invalid characters")
        salt = base64.b64decode(salt_b64, validate=True)
        if not salt:
            raise ValueError("empty salt")
        if not (iterations_text.isascii() and iterations_text.isdigit()):
            raise ValueError(f"bad iteration count {iterations_text!r}")
        iterations = int(iterations_text)
        if iterations < MIN_SCRAM_ITERATIONS:
            raise AuthenticationError(
                f"{self.name}: server iteration count {iterations} is below the minimum of {MIN_SCRAM_ITERATIONS}"
            )
        if iterations > MAX_SCRAM_ITERATIONS:
            raise AuthenticationError(
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
            raise AuthenticationError(f"{self.name}: malformed server signature") from exc
        # Constant-time compare: the signature proves the server knows our key.
        if not hmac.compare_digest(signature, self._server_signature):
            raise AuthenticationError(f"{self.name}: server signature does not match; server not trusted")
        self._state = _DONE


def _raise_on_server_error(name: str, attrs: list[tuple[str, str]]) -> None:
    if attrs and attrs[0][0] == "e":
        raise AuthenticationError(f"{name} authentication failed: server error {attrs[0][1]!r}")


def create_mechanism(mechanism: str, username: str | None, password: str | None) -> SaslMechanism:
    """Build the mechanism named ``mechanism`` (case-insensitive) for these credentials."""
    name = mechanism.strip().upper()
    if name not in SUPPORTED_MECHANISMS:
        raise ConfigError(f"unsupported SASL mechanism {mechanism!r}; supported: {', '.join(SUPPORTED_MECHANISMS)}")
    if not username or password is None:
        raise ConfigError(f"SASL mechanism {name} needs both a username and a password")
    if name == "PLAIN":
        return PlainMechanism(username, password)
    return ScramMechanism(username, password, "sha256" if name == "SCRAM-SHA-256" else "sha512")


async def authenticate(
    request: RequestFn,
    mechanism: SaslMechanism,
    *,
    handshake_version: int,
    authenticate_version: int | None,
) -> None:
    """Run SaslHandshake then SaslAuthenticate rounds until ``mechanism`` completes.

    ``authenticate_version`` is the negotiated SaslAuthenticate version, or
    ``None`` when the broker does not support that API.
    """
    # Without SaslAuthenticate the tokens would go as raw unframed bytes
    # (handshake v0); checked first so no request is wasted.
    if authenticate_version is None:
        raise AuthenticationError("broker is too old for SASL: it lacks the SaslAuthenticate API (needs Kafka >= 1.0)")

    response = await request("SaslHandshake", handshake_version, {"mechanism": mechanism.name})
    code = response.get("error_code", 0)
    if code:
        enabled = ", ".join(response.get("mechanisms") or ()) or "none"
        if code == _UNSUPPORTED_SASL_MECHANISM:
            raise AuthenticationError(
                f"broker does not enable SASL mechanism {mechanism.name}; enabled mechanisms: {enabled}"
            )
        raise AuthenticationError(
            f"SASL handshake for {mechanism.name} failed: {error_for_code(code)}; enabled mechanisms: {enabled}"
        )

    message: bytes | None = mechanism.initial_response()
    while message is not None:
        response = await request("SaslAuthenticate", authenticate_version, {"auth_bytes": message})
        code = response.get("error_code", 0)
        if code:
            detail = response.get("error_message") or str(error_for_code(code))
            raise AuthenticationError(f"SASL authentication failed: {detail}")
        message = mechanism.step(bytes(response.get("auth_bytes") or b""))
    if not mechanism.complete:
        # A mechanism that stops without verifying the server is a bug, not success.
        raise AuthenticationError(f"SASL {mechanism.name} exchange ended without completing")
