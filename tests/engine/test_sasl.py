"""SASL PLAIN / SCRAM / OAUTHBEARER state machines, the token cache and the SaslHandshake + SaslAuthenticate driver."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncconsumer.config import SASL_MECHANISMS, OAuthBearerToken
from asyncconsumer.engine.sasl import (
    MIN_SCRAM_ITERATIONS,
    OAuthBearerMechanism,
    PlainMechanism,
    SaslMechanism,
    ScramMechanism,
    TokenCache,
    authenticate,
    cleartext_warning,
    create_mechanism,
    jwt_claims,
    reauthentication_delay,
)
from asyncconsumer.errors import AuthenticationError, ConfigError, IllegalStateError, SaslAuthenticationError

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# RFC 7677 section 3 test vector.
RFC_USER = "user"
RFC_PASSWORD = "pencil"
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def reference_scram(
    hash_name: str, password: str, client_first_bare: str, server_first: str, nonce: str
) -> tuple[str, str]:
    """Independent RFC 5802 section 3 computation: (client-final, server-final)."""
    attrs = dict(p.split("=", 1) for p in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = _hmac(hash_name, salted, b"Client Key")
    stored_key = hashlib.new(hash_name, client_key).digest()
    without_proof = "c=biws,r=" + nonce
    auth_message = ",".join([client_first_bare, server_first, without_proof]).encode()
    proof = _xor(client_key, _hmac(hash_name, stored_key, auth_message))
    server_key = _hmac(hash_name, salted, b"Server Key")
    server_signature = _hmac(hash_name, server_key, auth_message)
    return f"{without_proof},p={_b64(proof)}", f"v={_b64(server_signature)}"


class ScramServer:
    """The server half of SCRAM, built on stored credentials the way a broker keeps them."""

    def __init__(
        self,
        hash_name: str,
        username: str,
        password: str,
        *,
        iterations: int = 4096,
        salt: bytes | None = None,
    ) -> None:
        self.hash_name = hash_name
        self.username = username
        self.iterations = iterations
        self.salt = salt if salt is not None else os.urandom(16)
        salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), self.salt, iterations)
        self.stored_key = hashlib.new(hash_name, _hmac(hash_name, salted, b"Client Key")).digest()
        self.server_key = _hmac(hash_name, salted, b"Server Key")
        self.server_nonce = _b64(os.urandom(18))

    def first(self, client_first: bytes) -> bytes:
        text = client_first.decode()
        assert text.startswith("n,,")
        self.client_first_bare = text[3:]
        attrs = dict(p.split("=", 1) for p in self.client_first_bare.split(","))
        assert attrs["n"].replace("=2C", ",").replace("=3D", "=") == self.username
        self.nonce = attrs["r"] + self.server_nonce
        self.server_first = f"r={self.nonce},s={_b64(self.salt)},i={self.iterations}"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> bytes | None:
        """Server-final ``v=...`` if the proof checks out, else ``None``."""
        text = client_final.decode()
        without_proof, _, proof_attr = text.rpartition(",")
        attrs = dict(p.split("=", 1) for p in text.split(","))
        assert attrs["c"] == "biws"
        assert attrs["r"] == self.nonce
        assert proof_attr.startswith("p=")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = _hmac(self.hash_name, self.stored_key, auth_message)
        client_key = _xor(base64.b64decode(attrs["p"]), signature)
        if hashlib.new(self.hash_name, client_key).digest() != self.stored_key:
            return None
        return f"v={_b64(_hmac(self.hash_name, self.server_key, auth_message))}".encode()


# --- SCRAM state machine -----------------------------------------------------


def test_rfc7677_scram_sha256_vector() -> None:
    mech = ScramMechanism(RFC_USER, RFC_PASSWORD, "sha256", nonce=RFC_CLIENT_NONCE)
    assert mech.name == "SCRAM-SHA-256"
    assert mech.initial_response() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert not mech.complete
    assert mech.step(RFC_SERVER_FIRST.encode()) == RFC_CLIENT_FINAL.encode()
    assert not mech.complete
    assert mech.step(RFC_SERVER_FINAL.encode()) is None
    assert mech.complete


def test_reference_matches_rfc7677_vector() -> None:
    # Guards the test's own reference implementation used for SHA-512 below.
    assert reference_scram(
        "sha256",
        RFC_PASSWORD,
        "n=user,r=" + RFC_CLIENT_NONCE,
        RFC_SERVER_FIRST,
        RFC_SERVER_FIRST.split(",")[0][2:],
    ) == (RFC_CLIENT_FINAL, RFC_SERVER_FINAL)


def test_scram_sha512_matches_reference() -> None:
    nonce = "fyko+d2lbbFgONRv9qkxdawL"
    full_nonce = nonce + "3rfcNHYJY1ZVvWVs7j"
    server_first = f"r={full_nonce},s={_b64(b'salt-for-sha512!')},i=4096"
    client_final, server_final = reference_scram(
        "sha512", "s3cr3t pässword", f"n=alice,r={nonce}", server_first, full_nonce
    )

    mech = ScramMechanism("alice", "s3cr3t pässword", "sha512", nonce=nonce)
    assert mech.name == "SCRAM-SHA-512"
    assert mech.initial_response() == f"n,,n=alice,r={nonce}".encode()
    msg = mech.step(server_first.encode())
    assert msg == client_final.encode()
    assert len(base64.b64decode(client_final.rsplit("p=", 1)[1])) == 64
    assert mech.step(server_final.encode()) is None
    assert mech.complete


def test_username_escaping() -> None:
    mech = ScramMechanism("a,b=c", "pw", "sha256", nonce="abc")
    assert mech.initial_response() == b"n,,n=a=2Cb=3Dc,r=abc"
    # '=' is escaped before ',' so an escape sequence is not escaped twice.
    assert ScramMechanism("=2C", "pw", "sha256", nonce="x").initial_response() == b"n,,n==3D2C,r=x"


def test_generated_nonce_is_fresh_and_printable() -> None:
    first = ScramMechanism("u", "p", "sha256").initial_response()
    second = ScramMechanism("u", "p", "sha256").initial_response()
    assert first != second
    nonce = first.decode().split("r=", 1)[1]
    assert len(nonce) >= 24
    assert all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _first_sent() -> ScramMechanism:
    mech = ScramMechanism(RFC_USER, RFC_PASSWORD, "sha256", nonce=RFC_CLIENT_NONCE)
    mech.initial_response()
    return mech


def test_wrong_server_signature_rejected() -> None:
    mech = _first_sent()
    mech.step(RFC_SERVER_FIRST.encode())
    forged = base64.b64decode(RFC_SERVER_FINAL[2:])
    forged = bytes([forged[0] ^ 1]) + forged[1:]
    with pytest.raises(AuthenticationError, match="server signature"):
        mech.step(b"v=" + _b64(forged).encode())
    assert not mech.complete
    # A failed exchange stays failed.
    with pytest.raises(AuthenticationError, match="already failed"):
        mech.step(RFC_SERVER_FINAL.encode())


def test_truncated_server_signature_rejected() -> None:
    mech = _first_sent()
    mech.step(RFC_SERVER_FIRST.encode())
    with pytest.raises(AuthenticationError):
        mech.step(RFC_SERVER_FINAL[:-8].encode() + b"AAAA")


@pytest.mark.parametrize(
    "server_nonce",
    [
        "XXprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAf",  # does not start with the client nonce
        RFC_CLIENT_NONCE,  # server added nothing of its own
        "rOprNGfwEbeRWgbNEk",  # a prefix of the client nonce
    ],
)
def test_server_nonce_mismatch_rejected(server_nonce: str) -> None:
    mech = _first_sent()
    with pytest.raises(AuthenticationError, match="nonce"):
        mech.step(f"r={server_nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode())


def test_server_error_in_server_final() -> None:
    mech = _first_sent()
    mech.step(RFC_SERVER_FIRST.encode())
    with pytest.raises(AuthenticationError, match="server error 'invalid-proof'"):
        mech.step(b"e=invalid-proof")
    assert not mech.complete


def test_server_error_in_server_first() -> None:
    mech = _first_sent()
    with pytest.raises(AuthenticationError, match="unknown-user"):
        mech.step(b"e=unknown-user")


@pytest.mark.parametrize("iterations", [1, 1000, MIN_SCRAM_ITERATIONS - 1])
def test_low_iteration_count_rejected(iterations: int) -> None:
    mech = _first_sent()
    server_first = RFC_SERVER_FIRST.replace("i=4096", f"i={iterations}")
    with pytest.raises(AuthenticationError, match="iteration count"):
        mech.step(server_first.encode())


def test_huge_iteration_count_rejected() -> None:
    mech = _first_sent()
    with pytest.raises(AuthenticationError, match="iteration count"):
        mech.step(RFC_SERVER_FIRST.replace("i=4096", "i=4000000000").encode())


@pytest.mark.parametrize(
    "server_first",
    [
        b"",
        b"garbage",
        b"\xff\xfe",
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,r=rOprNGfwEbeRWgbNEkqOxyz,i=4096",  # wrong order
        b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==",  # no i=
        b"r=rOprNGfwEbeRWgbNEkqOxyz,s=not base64!,i=4096",
        b"r=rOprNGfwEbeRWgbNEkqOxyz,s=,i=4096",
        b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-4096",
        b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4k",
        b"m=ext,r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    ],
)
def test_malformed_server_first_rejected(server_first: bytes) -> None:
    mech = _first_sent()
    with pytest.raises(AuthenticationError):
        mech.step(server_first)
    assert not mech.complete


def test_server_first_extensions_are_ignored() -> None:
    mech = _first_sent()
    assert mech.step((RFC_SERVER_FIRST + ",x=extension").encode()) is not None


def test_misuse_of_state_machine() -> None:
    mech = ScramMechanism("u", "p", "sha256", nonce="n")
    with pytest.raises(IllegalStateError):
        mech.step(b"r=nx,s=AAAA,i=4096")
    mech.initial_response()
    with pytest.raises(IllegalStateError):
        mech.initial_response()

    done = _first_sent()
    done.step(RFC_SERVER_FIRST.encode())
    done.step(RFC_SERVER_FINAL.encode())
    with pytest.raises(AuthenticationError, match="after completion"):
        done.step(RFC_SERVER_FINAL.encode())


@pytest.mark.parametrize("nonce", ["", "a,b", "with space", "caf\u00e9"])
def test_invalid_injected_nonce(nonce: str) -> None:
    with pytest.raises(ConfigError):
        ScramMechanism("u", "p", "sha256", nonce=nonce)


def test_invalid_scram_arguments() -> None:
    with pytest.raises(ConfigError):
        ScramMechanism("u", "p", "sha1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ScramMechanism("", "p", "sha256")


@settings(max_examples=25, deadline=None)
@given(
    username=st.text(min_size=1, max_size=20),
    password=st.text(max_size=20),
    hash_name=st.sampled_from(["sha256", "sha512"]),
)
def test_scram_round_trip_against_server(username: str, password: str, hash_name: str) -> None:
    server = ScramServer(hash_name, username, password)
    mech = ScramMechanism(username, password, "sha256" if hash_name == "sha256" else "sha512")
    final = mech.step(server.first(mech.initial_response()))
    assert final is not None
    server_final = server.final(final)
    assert server_final is not None
    assert mech.step(server_final) is None
    assert mech.complete


# --- PLAIN -------------------------------------------------------------------


def test_plain_message() -> None:
    mech = PlainMechanism("user", "pass")
    assert mech.name == "PLAIN"
    assert mech.initial_response() == b"\x00user\x00pass"
    assert not mech.complete
    assert mech.step(b"") is None
    assert mech.complete


def test_plain_with_authzid_and_utf8() -> None:
    assert PlainMechanism("user", "pass", authzid="admin").initial_response() == b"admin\x00user\x00pass"
    assert PlainMechanism("j\u00fcrgen", "p\u00e4ss").initial_response() == (
        b"\x00j\xc3\xbcrgen\x00p\xc3\xa4ss"
    )


def test_plain_rejects_nul_and_empty_username() -> None:
    with pytest.raises(ConfigError, match="NUL"):
        PlainMechanism("us\x00er", "pass")
    with pytest.raises(ConfigError, match="NUL"):
        PlainMechanism("user", "pa\x00ss")
    with pytest.raises(ConfigError):
        PlainMechanism("", "pass")


@pytest.mark.parametrize("make", [lambda: PlainMechanism("user", "pass"), lambda: OAuthBearerMechanism("tok")],
                         ids=["PLAIN", "OAUTHBEARER"])
def test_one_message_mechanism_misuse(make: Any) -> None:
    mech = make()
    with pytest.raises(IllegalStateError):
        mech.step(b"")
    mech.initial_response()
    with pytest.raises(IllegalStateError):
        mech.initial_response()
    mech.step(b"")
    with pytest.raises(SaslAuthenticationError, match="after completion"):
        mech.step(b"")


# --- create_mechanism --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "expected_name"),
    [
        ("PLAIN", PlainMechanism, "PLAIN"),
        ("plain", PlainMechanism, "PLAIN"),
        ("SCRAM-SHA-256", ScramMechanism, "SCRAM-SHA-256"),
        ("scram-sha-512", ScramMechanism, "SCRAM-SHA-512"),
    ],
)
def test_create_mechanism(name: str, cls: type, expected_name: str) -> None:
    mech = create_mechanism(name, "user", "pass")
    assert isinstance(mech, cls)
    assert mech.name == expected_name


@pytest.mark.parametrize("name", ["GSSAPI", "SCRAM-SHA-1", ""])
def test_create_mechanism_unknown(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        create_mechanism(name, "user", "pass")
    for supported in SASL_MECHANISMS:
        assert supported in str(info.value)


@pytest.mark.parametrize(("username", "password"), [(None, "pass"), ("user", None), ("", "pass")])
def test_create_mechanism_missing_credentials(username: str | None, password: str | None) -> None:
    with pytest.raises(ConfigError, match="username and a password"):
        create_mechanism("SCRAM-SHA-256", username, password)


# --- authenticate() driver ---------------------------------------------------


class FakeBroker:
    """Plays SaslHandshake + SaslAuthenticate; records every request it gets."""

    def __init__(
        self,
        *,
        scram: ScramServer | None = None,
        enabled: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        plain_credentials: tuple[str, str] | None = None,
        reject_with_scram_error: bool = False,
    ) -> None:
        self.scram = scram
        self.enabled = list(enabled)
        self.plain_credentials = plain_credentials
        self.reject_with_scram_error = reject_with_scram_error
        self.calls: list[tuple[str, int, dict[str, Any]]] = []
        self.mechanism = ""
        self.round = 0

    async def request(self, api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((api, version, body))
        if api == "SaslHandshake":
            self.mechanism = body["mechanism"]
            code = 0 if self.mechanism in self.enabled else 33
            return {"error_code": code, "mechanisms": self.enabled}
        assert api == "SaslAuthenticate"
        assert self.mechanism, "SaslAuthenticate before SaslHandshake"
        self.round += 1
        if self.mechanism == "PLAIN":
            assert self.plain_credentials is not None
            user, password = self.plain_credentials
            if body["auth_bytes"] != b"\x00" + user.encode() + b"\x00" + password.encode():
                return self._failed()
            return self._ok(b"")
        assert self.scram is not None
        if self.round == 1:
            return self._ok(self.scram.first(body["auth_bytes"]))
        assert self.round == 2
        server_final = self.scram.final(body["auth_bytes"])
        if server_final is None:
            if self.reject_with_scram_error:
                return self._ok(b"e=invalid-proof")
            return self._failed()
        return self._ok(server_final)

    @staticmethod
    def _ok(auth_bytes: bytes) -> dict[str, Any]:
        return {"error_code": 0, "error_message": None, "auth_bytes": auth_bytes, "session_lifetime_ms": 0}

    def _failed(self) -> dict[str, Any]:
        return {
            "error_code": 58,
            "error_message": f"Authentication failed during authentication due to invalid "
            f"credentials with SASL mechanism {self.mechanism}",
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }


@pytest.mark.parametrize("hash_name", ["sha256", "sha512"])
async def test_authenticate_scram_success(hash_name: str) -> None:
    broker = FakeBroker(scram=ScramServer(hash_name, "alice", "wonderland", iterations=8192))
    mech = ScramMechanism("alice", "wonderland", "sha256" if hash_name == "sha256" else "sha512")
    await authenticate(broker.request, mech, handshake_version=1, authenticate_version=2)
    assert mech.complete
    assert [(api, version) for api, version, _ in broker.calls] == [
        ("SaslHandshake", 1),
        ("SaslAuthenticate", 2),
        ("SaslAuthenticate", 2),
    ]
    assert broker.calls[0][2] == {"mechanism": mech.name}


async def test_authenticate_scram_wrong_password() -> None:
    broker = FakeBroker(scram=ScramServer("sha256", "alice", "wonderland"))
    mech = ScramMechanism("alice", "looking-glass", "sha256")
    with pytest.raises(
        SaslAuthenticationError, match=r"SASL SCRAM-SHA-256 authentication as user 'alice' failed: .*invalid"
    ):
        await authenticate(broker.request, mech, handshake_version=1, authenticate_version=1)
    assert not mech.complete


async def test_authenticate_scram_server_error_attribute() -> None:
    broker = FakeBroker(scram=ScramServer("sha512", "alice", "wonderland"), reject_with_scram_error=True)
    mech = ScramMechanism("alice", "looking-glass", "sha512")
    with pytest.raises(AuthenticationError, match="invalid-proof"):
        await authenticate(broker.request, mech, handshake_version=1, authenticate_version=0)


async def test_authenticate_rejects_impostor_server() -> None:
    # The server knows a different password: it cannot produce our server signature.
    class Impostor(FakeBroker):
        async def request(self, api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
            response = await super().request(api, version, body)
            if api == "SaslAuthenticate" and self.round == 2:
                response["auth_bytes"] = b"v=" + _b64(os.urandom(32)).encode()
            return response

    broker = Impostor(scram=ScramServer("sha256", "alice", "wonderland"))
    mech = ScramMechanism("alice", "wonderland", "sha256")
    with pytest.raises(AuthenticationError, match="server signature"):
        await authenticate(broker.request, mech, handshake_version=1, authenticate_version=1)


async def test_authenticate_plain() -> None:
    broker = FakeBroker(plain_credentials=("user", "pass"))
    mech = create_mechanism("PLAIN", "user", "pass")
    await authenticate(broker.request, mech, handshake_version=1, authenticate_version=1)
    assert mech.complete
    assert broker.calls[1][2] == {"auth_bytes": b"\x00user\x00pass"}

    broker = FakeBroker(plain_credentials=("user", "pass"))
    with pytest.raises(SaslAuthenticationError, match="SASL PLAIN authentication as user 'user' failed"):
        await authenticate(
            broker.request, PlainMechanism("user", "nope"), handshake_version=1, authenticate_version=1
        )


async def test_handshake_unsupported_mechanism_lists_enabled() -> None:
    broker = FakeBroker(enabled=("PLAIN", "GSSAPI"))
    mech = ScramMechanism("alice", "wonderland", "sha512")
    with pytest.raises(AuthenticationError) as info:
        await authenticate(broker.request, mech, handshake_version=1, authenticate_version=1)
    text = str(info.value)
    assert "does not enable SASL mechanism SCRAM-SHA-512" in text
    assert "PLAIN, GSSAPI" in text
    assert [api for api, _, _ in broker.calls] == ["SaslHandshake"]


async def test_handshake_other_error_is_named() -> None:
    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return {"error_code": 34, "mechanisms": []}

    with pytest.raises(AuthenticationError, match="ILLEGAL_SASL_STATE"):
        await authenticate(request, PlainMechanism("u", "p"), handshake_version=0, authenticate_version=0)


async def test_authenticate_error_without_message_names_code() -> None:
    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        if api == "SaslHandshake":
            return {"error_code": 0, "mechanisms": ["PLAIN"]}
        return {"error_code": 58, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}

    with pytest.raises(AuthenticationError, match="SASL_AUTHENTICATION_FAILED"):
        await authenticate(request, PlainMechanism("u", "p"), handshake_version=1, authenticate_version=1)


async def test_broker_without_sasl_authenticate_is_too_old() -> None:
    calls: list[str] = []

    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        calls.append(api)
        return {"error_code": 0, "mechanisms": ["PLAIN"]}

    with pytest.raises(AuthenticationError, match="too old"):
        await authenticate(request, PlainMechanism("u", "p"), handshake_version=0, authenticate_version=None)
    assert calls == []


async def test_mechanism_that_stops_early_is_not_success() -> None:
    class Lazy:
        name = "PLAIN"
        identity = "user ''"
        complete = False

        def initial_response(self) -> bytes:
            return b"\x00\x00"  # what the fake broker accepts for empty credentials

        def step(self, challenge: bytes) -> bytes | None:
            return None

    broker = FakeBroker(plain_credentials=("", ""))
    with pytest.raises(AuthenticationError, match="without completing"):
        await authenticate(broker.request, Lazy(), handshake_version=1, authenticate_version=1)


def test_mechanism_protocol_is_satisfied() -> None:
    mechanisms: list[SaslMechanism] = [PlainMechanism("u", "p"), ScramMechanism("u", "p", "sha256")]
    assert [m.name for m in mechanisms] == ["PLAIN", "SCRAM-SHA-256"]


# --- OAUTHBEARER -------------------------------------------------------------

def _jwt(**claims: Any) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}."


def test_oauthbearer_initial_response_is_rfc7628() -> None:
    mech = OAuthBearerMechanism("abc.def.ghi")
    assert mech.name == "OAUTHBEARER"
    assert mech.initial_response() == b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"
    assert not mech.complete
    assert mech.step(b"") is None  # success: an empty server message
    assert mech.complete


def test_oauthbearer_extensions_kip342() -> None:
    mech = OAuthBearerMechanism("tok", {"logicalCluster": "lkc-1", "traceId": "a b"})
    assert mech.initial_response() == b"n,,\x01auth=Bearer tok\x01logicalCluster=lkc-1\x01traceId=a b\x01\x01"


@pytest.mark.parametrize("extensions", [{"auth": "x"}, {"bad-key": "x"}, {"k": ""}, {"k": "\x01"}])
def test_oauthbearer_invalid_extensions(extensions: dict[str, str]) -> None:
    with pytest.raises(SaslAuthenticationError, match="extension"):
        OAuthBearerMechanism("tok", extensions)


@pytest.mark.parametrize(
    ("token", "said"),
    [("", "empty"), ("two words", "9 characters, ' ' at position 3"), ("tab\there", r"'\t' at position 3"),
     ("x\x01y", r"'\x01' at position 1"), ("Bearer secretvalue", "18 characters, ' ' at position 6"),
     ("abc=def", "'=' padding before its end")],
)
def test_oauthbearer_malformed_token(token: str, said: str) -> None:
    """The error says what is wrong, never the token: it is a credential."""
    with pytest.raises(SaslAuthenticationError, match="malformed") as info:
        OAuthBearerMechanism(token)
    assert said in str(info.value)
    assert all(part not in str(info.value) for part in token.split() if len(part) > 2)


def test_oauthbearer_identity_names_the_subject() -> None:
    assert OAuthBearerMechanism(_jwt(sub="svc-billing")).identity == "the token for 'svc-billing'"
    assert OAuthBearerMechanism("opaque-token").identity == "the provider's token"


def test_oauthbearer_server_error_is_acknowledged() -> None:
    mech = OAuthBearerMechanism("tok")
    mech.initial_response()
    # RFC 7628 3.2.3: the client answers the JSON status with a single ^A.
    assert mech.step(b'{"status":"invalid_token","scope":"kafka"}') == b"\x01"
    assert mech.server_error == "status 'invalid_token', scope 'kafka'"
    assert not mech.complete
    with pytest.raises(SaslAuthenticationError, match="rejected the token: status 'invalid_token'"):
        mech.step(b"")  # a server that "succeeds" after an error must not pass


async def test_authenticate_oauthbearer_failure_names_status() -> None:
    sent: list[bytes] = []

    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        if api == "SaslHandshake":
            return {"error_code": 0, "mechanisms": ["OAUTHBEARER"]}
        sent.append(body["auth_bytes"])
        if len(sent) == 1:
            return {"error_code": 0, "auth_bytes": b'{"status":"invalid_token"}', "session_lifetime_ms": 0}
        return {"error_code": 58, "error_message": "Authentication failed", "auth_bytes": b"",
                "session_lifetime_ms": 0}

    with pytest.raises(SaslAuthenticationError, match=r"OAUTHBEARER authentication as .* status 'invalid_token'"):
        await authenticate(request, OAuthBearerMechanism(_jwt(sub="bob")), handshake_version=1,
                           authenticate_version=2)
    assert sent[1] == b"\x01"


async def test_authenticate_returns_session_lifetime() -> None:
    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        if api == "SaslHandshake":
            return {"error_code": 0, "mechanisms": ["PLAIN"]}
        return {"error_code": 0, "auth_bytes": b"", "session_lifetime_ms": 3000}

    assert await authenticate(request, PlainMechanism("u", "p"), handshake_version=1, authenticate_version=2) == 3000


async def test_handshake_on_a_listener_without_sasl() -> None:
    async def request(api: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return {"error_code": 34, "mechanisms": []}

    with pytest.raises(SaslAuthenticationError, match="is this a SASL listener"):
        await authenticate(request, PlainMechanism("u", "p"), handshake_version=1, authenticate_version=2)


def test_create_mechanism_oauthbearer() -> None:
    mech = create_mechanism("OAUTHBEARER", None, None, OAuthBearerToken("tok", extensions={"a": "b"}))
    assert isinstance(mech, OAuthBearerMechanism)
    assert mech.initial_response() == b"n,,\x01auth=Bearer tok\x01a=b\x01\x01"
    with pytest.raises(ConfigError, match="needs a token"):
        create_mechanism("OAUTHBEARER", None, None)


def test_jwt_claims() -> None:
    assert jwt_claims(_jwt(sub="a", exp=5)) == {"sub": "a", "exp": 5}
    assert jwt_claims("opaque") is None
    assert jwt_claims("a.!!!.c") is None
    assert jwt_claims(f"a.{base64.urlsafe_b64encode(b'[1]').decode()}.c") is None


def test_reauthentication_delay_is_85_to_95_percent() -> None:
    assert reauthentication_delay(10_000, lambda lo, hi: lo) == pytest.approx(8.5)
    assert reauthentication_delay(10_000, lambda lo, hi: hi) == pytest.approx(9.5)
    assert 8.5 <= reauthentication_delay(10_000) <= 9.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_token_cache_reuses_until_80_percent_of_lifetime() -> None:
    clock = FakeClock()
    minted: list[str] = []

    def provider() -> str:
        minted.append(_jwt(sub="svc", exp=clock.now + 100))
        return minted[-1]

    cache = TokenCache(provider, timeout=1, clock=clock)
    first = await cache.token()
    assert first.value == minted[0] and first.expires_at == clock.now + 100  # read from the JWT
    clock.now += 79
    assert (await cache.token()).value == minted[0]
    assert cache.calls == 1
    clock.now += 2  # past 80 % of the lifetime
    assert (await cache.token()).value == minted[1]
    assert cache.calls == 2


async def test_token_cache_min_lifetime_forces_a_new_token() -> None:
    clock = FakeClock()
    cache = TokenCache(lambda: ("tok", clock.now + 100), timeout=1, clock=clock)
    await cache.token()
    clock.now += 10
    await cache.token(min_lifetime=80)  # 90 s left: enough
    assert cache.calls == 1
    await cache.token(min_lifetime=95)  # a session as long as the last one would outlive it
    assert cache.calls == 2


async def test_token_cache_without_expiry_asks_every_time() -> None:
    cache = TokenCache(lambda: "opaque", timeout=1)
    await cache.token()
    await cache.token()
    assert cache.calls == 2


async def test_token_cache_accepts_every_shape() -> None:
    class Source:  # aiokafka's AbstractTokenProvider shape
        async def token(self) -> str:
            return "from-object"

    async def async_provider() -> OAuthBearerToken:
        return OAuthBearerToken("typed", expires_at=2e9, extensions={"k": "v"})

    assert (await TokenCache(Source(), timeout=1).token()).value == "from-object"
    typed = await TokenCache(async_provider, timeout=1).token()
    assert typed == OAuthBearerToken("typed", expires_at=2e9, extensions={"k": "v"})
    assert (await TokenCache(lambda: ("t", 123), timeout=1).token()).expires_at == 123.0


async def test_token_cache_provider_errors_are_typed() -> None:
    def raises() -> str:
        raise KeyError("vault")

    with pytest.raises(SaslAuthenticationError, match="sasl_oauth_token_provider raised KeyError") as info:
        await TokenCache(raises, timeout=1).token()
    assert isinstance(info.value.__cause__, KeyError)

    with pytest.raises(SaslAuthenticationError, match="must return a str"):
        await TokenCache(lambda: 42, timeout=1).token()  # type: ignore[arg-type,return-value]

    async def hangs() -> str:
        await anyio.sleep(10)
        return "late"

    with pytest.raises(SaslAuthenticationError, match=r"did not return a token within 0\.1s"):
        await TokenCache(hangs, timeout=0.1).token()


async def test_token_cache_shares_one_call() -> None:
    calls = 0

    async def slow() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        return "tok", 4e9

    cache = TokenCache(slow, timeout=1)
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(cache.token)
    assert calls == 1


@pytest.mark.parametrize(
    ("protocol", "mechanism", "sends"),
    [("SASL_PLAINTEXT", "PLAIN", "the password"), ("SASL_PLAINTEXT", "OAUTHBEARER", "the bearer token"),
     ("SASL_PLAINTEXT", "SCRAM-SHA-256", None), ("SASL_PLAINTEXT", "SCRAM-SHA-512", None),
     ("SASL_SSL", "PLAIN", None), ("SASL_SSL", "OAUTHBEARER", None)],
)
def test_cleartext_warning(protocol: str, mechanism: str, sends: str | None) -> None:
    """PLAIN's password and OAUTHBEARER's token travel as they are: over SASL_PLAINTEXT, in clear.
    SCRAM sends only a proof of the password, good for one login; SASL_SSL encrypts everything."""
    warning = cleartext_warning(protocol, mechanism)
    if sends is None:
        assert warning is None
    else:
        assert warning is not None and f"sends {sends} to the brokers in clear text" in warning
        assert "security_protocol='SASL_SSL'" in warning
