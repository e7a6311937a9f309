"""TLS and SASL against Apache Kafka: every listener and mechanism, re-authentication, and the errors.

Records come from confluent-kafka (an independent client) through the PLAINTEXT listener; the
consumer reads them through the listener under test, as a member of a consumer group that commits
and reads back its offsets, so the group coordinator's connection is secured and logged in too.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import pty
import ssl
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support.broker import private_kafka
from support.producer import create_topic, produce
from support.proxy import ChaosProxy

from asyncconsumer import Consumer, ShareConsumer, TopicPartition
from asyncconsumer.config import SASL_MECHANISMS, OAuthBearerToken
from asyncconsumer.errors import AuthenticationError, SaslAuthenticationError, TLSHandshakeError
from asyncconsumer.testing import KafkaBroker

pytestmark = pytest.mark.anyio

#: Errors must come well within this (the consumer's request_timeout_ms).
REQUEST_TIMEOUT_MS = 10_000


def _b64url(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode("ascii")


def unsecured_jws(sub: str = "alice", *, lifetime: float = 3600.0, **claims: Any) -> str:
    """A token Kafka's unsecured-JWS validator accepts: ``{"alg": "none"}`` header, no signature."""
    now = time.time()
    payload = {"sub": sub, "iat": int(now), "exp": int(now + lifetime), **claims}
    return f"{_b64url({'alg': 'none'})}.{_b64url(payload)}."


class CountingProvider:
    """A token provider that counts its calls and mints a fresh short-lived token each time."""

    def __init__(self, lifetime: float = 3600.0) -> None:
        self.lifetime = lifetime
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        await anyio.lowlevel.checkpoint()  # an async provider: the consumer awaits it
        return unsecured_jws(lifetime=self.lifetime)


def security_options(broker: KafkaBroker, listener: str, mechanism: str | None) -> dict[str, Any]:
    if mechanism == "OAUTHBEARER":
        options = broker.consumer_options(listener)  # type: ignore[arg-type]
        for key in ("sasl_plain_username", "sasl_plain_password"):
            options.pop(key)
        options.update(sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=CountingProvider())
        return options
    return broker.consumer_options(listener, mechanism=mechanism or "PLAIN")  # type: ignore[arg-type]


def new_topic(broker: KafkaBroker, prefix: str) -> str:
    return create_topic(broker.bootstrap, f"{prefix}-{uuid.uuid4().hex[:10]}", 1)


async def consume_and_commit(consumer: Consumer[bytes, bytes], topic: str, count: int) -> list[bytes]:
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    values: list[bytes] = []
    with anyio.fail_after(30):
        while len(values) < count:
            batch = await consumer.getmany(timeout=1)
            values += [r.value for records in batch.values() for r in records if r.value is not None]
    await consumer.commit()
    committed = await consumer.committed({tp})
    assert committed[tp] is not None and committed[tp].offset == count
    return values


# -- every listener and mechanism -----------------------------------------------------------------

CASES = [("SSL", None)] + [(listener, m) for listener in ("SASL_PLAINTEXT", "SASL_SSL") for m in SASL_MECHANISMS]


#: The logins that send their credential in clear, which the consumer warns of once.
IN_CLEAR = {("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "OAUTHBEARER")}


@pytest.mark.parametrize(("listener", "mechanism"), CASES, ids=[f"{lst}-{m or 'tls'}" for lst, m in CASES])
async def test_consume_and_commit_over_secured_listener(
    apache_kafka: Any, anyio_backend: str, listener: str, mechanism: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Also: PLAIN's password and OAUTHBEARER's token over SASL_PLAINTEXT are warned of, once per consumer
    (not per connection: it opens several here); SCRAM (no password on the wire) and TLS are not."""
    caplog.set_level(logging.WARNING, logger="asyncconsumer")
    broker: KafkaBroker = apache_kafka.broker
    topic = new_topic(broker, "secured")
    expected = [f"{listener}-{mechanism}-{i}".encode() for i in range(20)]
    await anyio.to_thread.run_sync(lambda: produce(broker.bootstrap, topic, expected))
    options = security_options(broker, listener, mechanism)
    async with Consumer(
        **options, group_id=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest", enable_auto_commit=False,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    ) as consumer:
        assert await consume_and_commit(consumer, topic, len(expected)) == expected
        engine = consumer._engine
        assert engine is not None
        # The bootstrap, partition leader and group coordinator connections: all logged in.
        assert engine.network.connections_opened >= 2
    in_clear = [(r.levelno, r.getMessage()) for r in caplog.records if "clear text" in r.getMessage()]
    if (listener, mechanism) in IN_CLEAR:
        assert len(in_clear) == 1, in_clear
        level, text = in_clear[0]
        assert level == logging.WARNING and "security_protocol='SASL_SSL'" in text, text
    else:
        assert in_clear == []
    provider = options.get("sasl_oauth_token_provider")
    if provider is not None:
        # One token served every connection: it was fresh (an hour's lifetime).
        assert provider.calls == 1


async def test_oauth_token_with_extensions_and_sync_provider(apache_kafka: Any, anyio_backend: str) -> None:
    """A plain callable returning an OAuthBearerToken with KIP-342 extensions (the broker accepts
    unknown extensions), and confluent-kafka's ``(token, expires_at)`` shape."""
    broker: KafkaBroker = apache_kafka.broker
    topic = new_topic(broker, "oauth-ext")
    await anyio.to_thread.run_sync(lambda: produce(broker.bootstrap, topic, [b"x"]))
    shapes = [
        lambda: OAuthBearerToken(unsecured_jws(), extensions={"traceId": "abc-123"}),
        lambda: (unsecured_jws(), time.time() + 3600),
    ]
    for provider in shapes:
        async with Consumer(
            bootstrap_servers=broker.bootstrap_for("SASL_PLAINTEXT"), security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=provider, group_id=f"g-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest", enable_auto_commit=False, request_timeout_ms=REQUEST_TIMEOUT_MS,
        ) as consumer:
            assert await consume_and_commit(consumer, topic, 1) == [b"x"]


# -- errors: typed, named, in time ----------------------------------------------------------------


async def expect_start_error(error: type[Exception], match: str, **options: Any) -> Exception:
    started = time.monotonic()
    with pytest.raises(error, match=match) as info:
        with anyio.fail_after(REQUEST_TIMEOUT_MS / 1000):
            async with Consumer(request_timeout_ms=REQUEST_TIMEOUT_MS, **options) as consumer:
                await consumer.topics()
    # Well within the request timeout: nothing waits for a timeout to say what is wrong.
    assert time.monotonic() - started < REQUEST_TIMEOUT_MS / 1000 / 2
    return info.value


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_wrong_password(apache_kafka: Any, anyio_backend: str, mechanism: str) -> None:
    options = apache_kafka.broker.consumer_options("SASL_PLAINTEXT", mechanism=mechanism, user="alice")
    options["sasl_plain_password"] = "not-the-password"
    await expect_start_error(
        SaslAuthenticationError, rf"SASL {mechanism} authentication as user 'alice' failed: .*", **options
    )


async def test_failed_login_is_fatal_at_once(
    apache_kafka: Any, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As in the Java client (``SaslAuthenticationException`` is not retriable), the first failed
    login ends the start with the typed error: no other bootstrap server is tried first (the
    second one here would only be asked after the 5 s retry backoff), and nothing logs the broker
    as unreachable and retried: the failure is logged once, as an error naming the broker."""
    options = apache_kafka.broker.consumer_options("SASL_PLAINTEXT", mechanism="SCRAM-SHA-256", user="alice")
    options["sasl_plain_password"] = "not-the-password"
    address = options["bootstrap_servers"]
    options["bootstrap_servers"] = f"{address},{address}"
    caplog.set_level(logging.DEBUG, logger="asyncconsumer")
    started = time.monotonic()
    with pytest.raises(SaslAuthenticationError, match=r"SASL SCRAM-SHA-256 authentication as user 'alice' failed"):
        with anyio.fail_after(REQUEST_TIMEOUT_MS / 1000):
            async with Consumer(request_timeout_ms=REQUEST_TIMEOUT_MS, retry_backoff_ms=5000, **options) as consumer:
                await consumer.topics()
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"the failed login took {elapsed:.1f}s to surface"
    said = [(record.levelno, record.getMessage()) for record in caplog.records if record.levelno >= logging.WARNING]
    assert not [text for _, text in said if "retrying" in text or "unreachable" in text], said
    failures = [text for level, text in said if level == logging.ERROR and "failed authentication" in text]
    assert len(failures) == 1 and address in failures[0], said


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_unknown_user(apache_kafka: Any, anyio_backend: str, mechanism: str) -> None:
    options = apache_kafka.broker.consumer_options("SASL_SSL", mechanism=mechanism)
    options.update(sasl_plain_username="mallory", sasl_plain_password="guess")
    await expect_start_error(SaslAuthenticationError, rf"SASL {mechanism} authentication as user 'mallory'", **options)


def oauth_options(broker: KafkaBroker, provider: Any) -> dict[str, Any]:
    return {
        "bootstrap_servers": broker.bootstrap_for("SASL_PLAINTEXT"), "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": provider,
    }


async def test_expired_oauth_token(apache_kafka: Any, anyio_backend: str) -> None:
    expired = unsecured_jws("bob", lifetime=-60)
    # The broker's JSON status came back and was acknowledged (RFC 7628): its verdict is in the error.
    await expect_start_error(
        SaslAuthenticationError, r"SASL OAUTHBEARER authentication as the token for 'bob' failed: .*invalid_token",
        **oauth_options(apache_kafka.broker, lambda: expired),
    )


async def test_oauth_token_the_broker_cannot_parse(apache_kafka: Any, anyio_backend: str) -> None:
    await expect_start_error(
        SaslAuthenticationError, r"SASL OAUTHBEARER authentication as the provider's token failed: .*invalid_token",
        **oauth_options(apache_kafka.broker, lambda: "not-a-jws.at-all"),
    )


async def test_malformed_oauth_token_is_refused_before_sending(apache_kafka: Any, anyio_backend: str) -> None:
    await expect_start_error(
        SaslAuthenticationError,
        r"token from sasl_oauth_token_provider is malformed \(10 characters, ' ' at position 6\)",
        **oauth_options(apache_kafka.broker, lambda: "Bearer abc"),
    )


async def test_token_provider_that_raises(apache_kafka: Any, anyio_backend: str) -> None:
    async def provider() -> str:
        raise RuntimeError("identity provider unreachable")

    error = await expect_start_error(
        SaslAuthenticationError, r"sasl_oauth_token_provider raised RuntimeError: identity provider unreachable",
        **oauth_options(apache_kafka.broker, provider),
    )
    assert isinstance(error.__cause__, RuntimeError)


async def test_untrusted_certificate(apache_kafka: Any, anyio_backend: str) -> None:
    untrusted = ssl.create_default_context()  # the system CAs: not the test CA
    await expect_start_error(
        TLSHandshakeError, "certificate verify failed: .*does ssl_context trust the CA",
        bootstrap_servers=apache_kafka.broker.bootstrap_for("SSL"), security_protocol="SSL", ssl_context=untrusted,
    )


async def test_hostname_mismatch(apache_kafka: Any, anyio_backend: str) -> None:
    # 127.0.0.2 is loopback too, but the broker's certificate names only 127.0.0.1 and localhost.
    host, port = apache_kafka.broker.bootstrap_for("SSL").rsplit(":", 1)
    async with ChaosProxy(host, int(port), listen_host="127.0.0.2") as proxy:
        await expect_start_error(
            TLSHandshakeError, r"certificate verify failed: .*mismatch, certificate is not valid for '127\.0\.0\.2'",
            bootstrap_servers=proxy.address, security_protocol="SSL", ssl_context=apache_kafka.broker.ssl_context(),
        )


# -- security protocol and listener mismatches ----------------------------------------------------


async def test_tls_to_a_plaintext_listener(apache_kafka: Any, anyio_backend: str) -> None:
    broker: KafkaBroker = apache_kafka.broker
    await expect_start_error(
        TLSHandshakeError, r"TLS handshake with 127\.0\.0\.1:\d+ did not complete.*is this a TLS listener",
        bootstrap_servers=broker.bootstrap_for("PLAINTEXT"), security_protocol="SSL", ssl_context=broker.ssl_context(),
    )


async def test_sasl_to_a_plaintext_listener(apache_kafka: Any, anyio_backend: str) -> None:
    options = apache_kafka.broker.consumer_options("SASL_PLAINTEXT")
    options["bootstrap_servers"] = apache_kafka.broker.bootstrap_for("PLAINTEXT")
    await expect_start_error(SaslAuthenticationError, "is this a SASL listener", **options)


@pytest.mark.parametrize(("protocol", "listener"), [("PLAINTEXT", "SASL_PLAINTEXT"), ("SSL", "SASL_SSL")])
async def test_no_sasl_to_a_sasl_listener(apache_kafka: Any, anyio_backend: str, protocol: str, listener: str) -> None:
    broker: KafkaBroker = apache_kafka.broker
    options: dict[str, Any] = {"bootstrap_servers": broker.bootstrap_for(listener), "security_protocol": protocol}
    if protocol == "SSL":
        options["ssl_context"] = broker.ssl_context()
    await expect_start_error(AuthenticationError, "the listener probably requires SASL authentication", **options)


async def test_plaintext_to_a_tls_listener(apache_kafka: Any, anyio_backend: str) -> None:
    # Already named before this work (the TLS alert read as a frame size); kept as a guard.
    await expect_start_error(
        Exception, "looks like a TLS record", bootstrap_servers=apache_kafka.broker.bootstrap_for("SSL")
    )


# -- the module's own broker: mutual TLS, short SASL sessions ---------------------------------------

#: The session lifetime the private broker grants (connections.max.reauth.ms).
REAUTH_MS = 3000


@pytest.fixture(scope="module")
def own_broker() -> Iterator[KafkaBroker]:
    """One broker for what the session's cannot do: its SSL listener requires client certificates
    (mutual TLS), and its SASL listeners end sessions after ``REAUTH_MS`` (KIP-368)."""
    config = {"connections.max.reauth.ms": str(REAUTH_MS), "listener.name.ssl.ssl.client.auth": "required"}
    with private_kafka(listeners=("SSL", "SASL_PLAINTEXT", "SASL_SSL"), config=config) as broker:
        yield broker


# -- mutual TLS ------------------------------------------------------------------------------------

#: What a broker answers a client certificate it refuses, or none (TLS 1.2 in the handshake, TLS 1.3
#: with the first read after it).
CERTIFICATE_REFUSED = r"refused this client's certificate \(TLS alert (SSLV3_ALERT_BAD_CERTIFICATE|\w+CERTIFICATE\w*)\)"


def mtls_context(broker: KafkaBroker, *, with_client_cert: bool, version: str = "TLSv1.3") -> ssl.SSLContext:
    context = broker.ssl_context(with_client_cert=with_client_cert)
    context.maximum_version = ssl.TLSVersion[version.replace(".", "_")]
    return context


@pytest.mark.parametrize(("client", "version"), [("Consumer", "TLSv1.3"), ("Consumer", "TLSv1.2"),
                                                 ("ShareConsumer", "TLSv1.3")])
async def test_mutual_tls_without_a_client_certificate_is_refused_at_once(
    own_broker: KafkaBroker, anyio_backend: str, caplog: pytest.LogCaptureFixture, client: str, version: str
) -> None:
    """As the Java client's SslAuthenticationException: a typed error that is not retried, naming the
    certificate problem, in well under the request timeout (TLS 1.3 delivers the broker's alert with the
    first read after the handshake, not from the handshake), and logged once as a failed login."""
    caplog.set_level(logging.DEBUG, logger="asyncconsumer")
    cls = Consumer if client == "Consumer" else ShareConsumer
    options: dict[str, Any] = {
        "bootstrap_servers": own_broker.bootstrap_for("SSL"), "security_protocol": "SSL",
        "ssl_context": mtls_context(own_broker, with_client_cert=False, version=version),
        "group_id": f"g-{uuid.uuid4().hex[:8]}", "request_timeout_ms": REQUEST_TIMEOUT_MS,
    }
    started = time.monotonic()
    with pytest.raises(TLSHandshakeError, match=CERTIFICATE_REFUSED) as info:
        with anyio.fail_after(REQUEST_TIMEOUT_MS / 1000):
            async with cls(**options):
                pass
    elapsed = time.monotonic() - started
    assert elapsed < 5, f"the refusal took {elapsed:.1f}s to surface"
    assert not info.value.retriable and "load_cert_chain" in str(info.value)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [text for _, text in said if "unreachable" in text or "retrying" in text], said
    assert [level for level, text in said if "failed authentication" in text] == [logging.ERROR], said


async def test_mutual_tls_refusal_after_the_start_is_raised_by_the_next_poll(
    own_broker: KafkaBroker, anyio_backend: str
) -> None:
    """A broker that stops accepting the client's certificate later (a new connection after the start):
    the next poll raises the refusal, as a Java consumer's poll() throws SslAuthenticationException."""
    topic = new_topic(own_broker, "mtls")
    await anyio.to_thread.run_sync(lambda: produce(own_broker.bootstrap, topic, [b"a"]))
    async with Consumer(
        bootstrap_servers=own_broker.bootstrap_for("SSL"), security_protocol="SSL",
        ssl_context=mtls_context(own_broker, with_client_cert=True), auto_offset_reset="earliest",
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        with anyio.fail_after(20):
            while not got:
                got += [r.value for rs in (await consumer.getmany(timeout=1)).values() for r in rs if r.value]
        assert got == [b"a"]
        # From now on the client's connections carry no certificate; the open ones are closed.
        network = consumer._engine.network  # type: ignore[union-attr]
        without = mtls_context(own_broker, with_client_cert=False)
        network._ssl_context = lambda: without  # type: ignore[method-assign]
        for connection in list(network._connections.values()):
            await connection.aclose()
        started = time.monotonic()
        with pytest.raises(TLSHandshakeError, match=CERTIFICATE_REFUSED):
            with anyio.fail_after(REQUEST_TIMEOUT_MS / 1000):
                while True:
                    await consumer.getmany(timeout=0.5)
        assert time.monotonic() - started < 5


ENCRYPTED_KEY_SCRIPT = textwrap.dedent("""
    import json, sys, anyio
    from asyncconsumer import Consumer, TopicPartition
    from asyncconsumer.config import from_properties
    from asyncconsumer.errors import ConfigError

    base, variants, topic = json.loads(sys.argv[1])
    outcome = {}
    for name, extra in variants.items():
        try:
            from_properties({**base, **extra})
            outcome[name] = "ok"
        except ConfigError as exc:
            outcome[name] = str(exc)

    async def read():
        async with Consumer.from_properties({**base, **variants["pem store"]}, request_timeout_ms=10000) as c:
            c.assign([TopicPartition(topic, 0)])
            await c.seek_to_beginning()
            with anyio.fail_after(30):
                while True:
                    for records in (await c.getmany(timeout=1)).values():
                        return records[0].value.decode()

    outcome["read"] = anyio.run(read)
    print(json.dumps(outcome))
""")


def test_encrypted_private_keys_use_ssl_key_password_and_never_prompt(own_broker: KafkaBroker, tmp_path: Path) -> None:
    """A Java PEM key store (``ssl.keystore.type=PEM``), librdkafka's ``ssl.key.location`` and
    ``ssl.keystore.key`` with an encrypted key: ``ssl.key.password`` decrypts it; without it, or with a
    wrong one, a ConfigError names ``ssl.key.password``.  Run with a terminal for stdin that nobody types
    on: a pass phrase prompt would wait there until the test's timeout."""
    from cryptography.hazmat.primitives import serialization

    tls = own_broker._tls_material()
    key = serialization.load_pem_private_key(tls.client_key_file.read_bytes(), None)
    password = "k3y-pa55word"
    encrypted = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode()),
    ).decode()
    store = tmp_path / "client-store.pem"
    store.write_text(encrypted + tls.client_cert_file.read_text())
    key_file = tmp_path / "client.key"
    key_file.write_text(encrypted)
    topic = new_topic(own_broker, "pem-store")
    produce(own_broker.bootstrap, topic, [b"through mutual TLS"])
    base = {
        "bootstrap.servers": own_broker.bootstrap_for("SSL"), "security.protocol": "SSL",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca_file),
    }
    pem_store = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(store)}
    variants = {
        "pem store": {**pem_store, "ssl.key.password": password},
        "key location": {"ssl.certificate.location": str(tls.client_cert_file), "ssl.key.location": str(key_file),
                         "ssl.key.password": password},
        "inline key": {"ssl.keystore.key": encrypted, "ssl.key.password": password,
                       "ssl.keystore.certificate.chain": tls.client_cert_file.read_text()},
        "no password": pem_store,
        "wrong password": {**pem_store, "ssl.key.password": "not-it"},
    }
    # stdin is a terminal nobody types on; no controlling terminal (a new session), so OpenSSL's prompt
    # would read that stdin, and wait.
    terminal, typist = pty.openpty()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", ENCRYPTED_KEY_SCRIPT, json.dumps([base, variants, topic])],
            stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        ) as process:
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                pytest.fail(f"loading the key waited for input (a pass phrase prompt?): {err[-500:]}")
    finally:
        os.close(terminal)
        os.close(typist)
    assert process.returncode == 0, err[-2000:]
    assert "pass phrase" not in err, err
    outcome = json.loads(out)
    assert outcome["pem store"] == outcome["key location"] == outcome["inline key"] == "ok", outcome
    assert outcome["read"] == "through mutual TLS"
    assert f"private key in {store} is encrypted: give its password in ssl.key.password" in outcome["no password"]
    assert f"cannot decrypt the private key in {store} with ssl.key.password (wrong password?)" in (
        outcome["wrong password"])
    assert password not in out + err


# -- KIP-368 re-authentication --------------------------------------------------------------------


@dataclass
class Lifetimes:
    opened_after_first_round: int = -1
    opened_at_end: int = -1
    #: Successful re-authentications of each connection open at the end.
    reauthentications: list[int] = field(default_factory=list)


async def read_across_lifetimes(broker: KafkaBroker, options: dict[str, Any], lifetimes: float) -> Lifetimes:
    """Produce, consume and commit in rounds for ``lifetimes`` session lifetimes."""
    topic = new_topic(broker, "reauth")
    tp = TopicPartition(topic, 0)
    seen = Lifetimes()
    async with Consumer(
        **options, group_id=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest", enable_auto_commit=False,
        request_timeout_ms=REQUEST_TIMEOUT_MS, fetch_max_wait_ms=500,
    ) as consumer:
        consumer.assign([tp])
        engine = consumer._engine
        assert engine is not None
        deadline = time.monotonic() + lifetimes * REAUTH_MS / 1000
        produced = 0
        while time.monotonic() < deadline:
            batch = [f"r{produced + i}".encode() for i in range(5)]
            await anyio.to_thread.run_sync(functools.partial(produce, broker.bootstrap, topic, batch))
            produced += len(batch)
            got: list[bytes] = []
            with anyio.fail_after(REQUEST_TIMEOUT_MS / 1000):
                while len(got) < len(batch):
                    records = await consumer.getmany(timeout=1)
                    got += [r.value for rs in records.values() for r in rs if r.value is not None]
            assert got == batch
            await consumer.commit()
            assert (await consumer.committed({tp}))[tp].offset == produced  # type: ignore[union-attr]
            if seen.opened_after_first_round < 0:
                seen.opened_after_first_round = engine.network.connections_opened
            await anyio.sleep(0.7)
        seen.opened_at_end = engine.network.connections_opened
        seen.reauthentications = [c.reauthentications for c in engine.network._connections.values()]
    return seen


@pytest.mark.parametrize(("listener", "mechanism"), [("SASL_PLAINTEXT", "SCRAM-SHA-256"), ("SASL_SSL", "PLAIN")])
async def test_reauthentication_keeps_connections(
    own_broker: KafkaBroker, anyio_backend: str, listener: str, mechanism: str
) -> None:
    options = own_broker.consumer_options(listener, mechanism=mechanism)  # type: ignore[arg-type]
    seen = await read_across_lifetimes(own_broker, options, lifetimes=4)
    assert seen.opened_at_end == seen.opened_after_first_round, "a connection was lost: its session expired"
    # Bootstrap, leader and coordinator connections all re-authenticated (about once per lifetime).
    assert len(seen.reauthentications) >= 2 and min(seen.reauthentications) >= 2, seen


async def test_reauthentication_with_fresh_oauth_tokens(own_broker: KafkaBroker, anyio_backend: str) -> None:
    # Tokens live 4 s, so the broker's sessions end with them and re-authentications need new ones.
    provider = CountingProvider(lifetime=4)
    seen = await read_across_lifetimes(own_broker, oauth_options(own_broker, provider), lifetimes=4)
    assert seen.opened_at_end == seen.opened_after_first_round, "a connection was lost: its session expired"
    assert len(seen.reauthentications) >= 2 and min(seen.reauthentications) >= 2, seen
    assert provider.calls >= 3, provider.calls
    # Fewer calls than logins: a fresh token serves several connections and re-authentications.
    assert provider.calls < seen.opened_at_end + sum(seen.reauthentications), (provider.calls, seen)


async def test_without_reauthentication_the_broker_drops_sessions(
    own_broker: KafkaBroker, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: a client that ignores the session lifetime (as before KIP-368 support) has its
    connections closed by the broker and must reconnect, so the tests above can tell the difference."""
    from asyncconsumer.engine.connection import BrokerConnection

    monkeypatch.setattr(BrokerConnection, "_session_started", lambda self, lifetime_ms: None)
    options = own_broker.consumer_options("SASL_PLAINTEXT", mechanism="PLAIN")
    seen = await read_across_lifetimes(own_broker, options, lifetimes=3)
    assert seen.opened_at_end > seen.opened_after_first_round, seen
