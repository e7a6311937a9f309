"""No secret is ever printed: distinctive passwords, looked for in everything the library and the CLI say.

The secrets: a SCRAM password (a user made for this module with confluent-kafka's admin client), a
private key's password, key store and trust store passwords, an OAuth client secret and a bearer
token, and the wrong password of a failed login.  They are looked for, on Apache Kafka over SASL_SSL
and mutual-TLS material, in:

- every log record at DEBUG of a whole session (connect, log in, join a group, fetch, commit, close),
  ``repr(consumer.config)``, ``metrics()`` and what OpenTelemetry collects;
- every exception (message, ``repr``, chained causes, traceback) and the log records of the error
  paths about the options that hold them: a failed login, a malformed ``sasl.jaas.config``, options of
  the wrong type, wrong key and store passwords, a malformed token, a token endpoint that echoes the
  client secret;
- the CLI's stdout and stderr with every ``asyncconsumer`` logger at DEBUG: a consume over SASL_SSL, a
  wrong password, a ``sasl.jaas.config`` without its closing quote, ``--consumer-property`` without ``=``.
"""

from __future__ import annotations

import http.server
import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from support.producer import admin_client, create_topic, produce

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.config import OAuthBearerToken, build_config, from_properties
from asyncconsumer.engine.sasl import OAuthBearerMechanism
from asyncconsumer.errors import KafkaError
from asyncconsumer.oauth import ClientCredentialsTokenProvider
from asyncconsumer.testing import KafkaBroker

pytestmark = pytest.mark.anyio

_RUN = uuid.uuid4().hex[:10]
SCRAM_USER = f"secrets-{_RUN}"
SASL_PASSWORD = f"SaslPw{_RUN}"
WRONG_PASSWORD = f"WrongPw{_RUN}"
KEY_PASSWORD = f"KeyPw{_RUN}"
KEYSTORE_PASSWORD = f"KeyStorePw{_RUN}"
TRUSTSTORE_PASSWORD = f"TrustStorePw{_RUN}"
CLIENT_SECRET = f"ClientSecret{_RUN}"
TOKEN = f"eyJhbGciOiJub25lIn0.TokenValue{_RUN}.sig"
SECRETS = (SASL_PASSWORD, WRONG_PASSWORD, KEY_PASSWORD, KEYSTORE_PASSWORD, TRUSTSTORE_PASSWORD, CLIENT_SECRET, TOKEN)


def secrets_in(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # what is printed does not depend on the event loop


@dataclass
class Material:
    broker: KafkaBroker
    #: ``from_properties`` settings: SCRAM over SASL_SSL, PKCS12 trust and key stores with passwords.
    sasl_ssl: dict[str, str]
    #: A PEM key store with an encrypted key (``ssl.key.password``), PEM trust store.
    pem_store: dict[str, str]
    #: The same settings as a Java properties file, for the CLI.
    command_config: Path


def _jaas(password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{SCRAM_USER}" '
            f'password="{password}";')


@pytest.fixture(scope="module")
def material(apache_kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Material:
    broker: KafkaBroker = apache_kafka.broker
    directory = tmp_path_factory.mktemp("secrets")
    tls = broker._tls_material()
    key = serialization.load_pem_private_key(tls.client_key_file.read_bytes(), None)
    cert = x509.load_pem_x509_certificate(tls.client_cert_file.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    keystore = directory / "client.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"client", key, cert, None,  # type: ignore[arg-type]
        serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode())))
    truststore = directory / "trust.p12"
    truststore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"ca", None, None, [ca], serialization.BestAvailableEncryption(TRUSTSTORE_PASSWORD.encode())))
    pem = directory / "client-store.pem"
    pem.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
    ) + tls.client_cert_file.read_bytes())
    # A SCRAM user of this module's, made by an independent client.
    admin = admin_client(broker.bootstrap)
    upsert = UserScramCredentialUpsertion(
        SCRAM_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), SASL_PASSWORD.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    anyio.run(_wait_for_login, broker.consumer_options("SASL_SSL", mechanism="SCRAM-SHA-512"))
    sasl_ssl = {
        "bootstrap.servers": broker.bootstrap_for("SASL_SSL"), "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": _jaas(SASL_PASSWORD),
        "ssl.truststore.type": "PKCS12", "ssl.truststore.location": str(truststore),
        "ssl.truststore.password": TRUSTSTORE_PASSWORD,
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(keystore),
        "ssl.keystore.password": KEYSTORE_PASSWORD,
    }
    pem_store = {
        "bootstrap.servers": broker.bootstrap_for("SSL"), "security.protocol": "SSL",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca_file),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pem), "ssl.key.password": KEY_PASSWORD,
    }
    command_config = directory / "client.properties"
    command_config.write_text("".join(
        f"{k}={v}\n" for k, v in {**sasl_ssl, "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pem),
                                  "ssl.key.password": KEY_PASSWORD}.items() if k != "bootstrap.servers"))
    return Material(broker, sasl_ssl, pem_store, command_config)


async def _wait_for_login(options: dict[str, Any]) -> None:
    """Until the new SCRAM user reaches the broker's metadata (moments)."""
    options.update(sasl_plain_username=SCRAM_USER, sasl_plain_password=SASL_PASSWORD)
    deadline = time.monotonic() + 30
    while True:
        try:
            async with Consumer(**options) as consumer:
                await consumer.topics()
                return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.2)


def everything_about(exc: BaseException) -> str:
    """The exception as it can be seen: its message, repr, traceback, and those of what it chains."""
    seen, parts, stack = set(), [], [exc]
    while stack:
        error = stack.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        parts += [str(error), repr(error), *(repr(arg) for arg in error.args)]
        stack += [error.__cause__, error.__context__]
    return "\n".join([*parts, *traceback.format_exception(exc)])


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.levelname} {r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)


async def test_a_whole_session_at_debug_shows_no_secret(material: Material, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    caplog.set_level(logging.DEBUG, logger="asyncconsumer")
    reader = InMemoryMetricReader()
    topic = create_topic(material.broker.bootstrap, f"secrets-{uuid.uuid4().hex[:8]}", 1)
    produce(material.broker.bootstrap, topic, [b"a", b"b"])
    seen: list[str] = []
    consumer: Consumer[bytes, bytes] = Consumer.from_properties(
        material.sasl_ssl, group_id=f"g-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest",
        enable_auto_commit=False, meter_provider=MeterProvider(metric_readers=[reader]),
    )
    async with consumer:
        consumer.assign([TopicPartition(topic, 0)])
        values: list[bytes] = []
        with anyio.fail_after(30):
            while len(values) < 2:
                values += [r.value for rs in (await consumer.getmany(timeout=1)).values() for r in rs
                           if r.value is not None]
        await consumer.commit()
        seen += [repr(consumer), repr(consumer.config), str(consumer.config), repr(consumer.metrics())]
    async with Consumer.from_properties(material.pem_store) as tls_consumer:
        assert topic in await tls_consumer.topics()
        seen += [repr(tls_consumer.config), repr(tls_consumer.metrics())]
    seen.append(reader.get_metrics_data().to_json())
    seen.append(logged(caplog))
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # DEBUG was on
    assert secrets_in("\n".join(seen)) == []


class _EchoingTokenEndpoint(http.server.BaseHTTPRequestHandler):
    """A token endpoint that refuses the client and echoes its secret (an IdP showing the request)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": "invalid_client", "error_description": f"secret {CLIENT_SECRET} is wrong"})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echoing_token_endpoint() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _EchoingTokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/token"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _error_paths(material: Material, endpoint: str) -> dict[str, Callable[[], Any]]:
    """What must fail, about an option that holds a secret: name -> a call that raises."""
    sasl = material.sasl_ssl
    pem = material.pem_store
    unquoted = _jaas(SASL_PASSWORD).replace(f'"{SASL_PASSWORD}";', SASL_PASSWORD + '"')
    return {
        "jaas without closing quote": lambda: from_properties(
            {**sasl, "sasl.jaas.config": _jaas(SASL_PASSWORD).removesuffix('";')}),
        "jaas with a stray quote": lambda: from_properties({**sasl, "sasl.jaas.config": unquoted}),
        "jaas without a login module": lambda: from_properties(
            {**sasl, "sasl.jaas.config": f'password="{SASL_PASSWORD}" username="u";'}),
        "password of the wrong type": lambda: build_config({
            "security_protocol": "SASL_SSL", "sasl_plain_username": "u", "sasl_plain_password": SASL_PASSWORD.encode(),
        }),
        "a token for a token provider": lambda: build_config(
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": TOKEN}),
        "wrong key password": lambda: from_properties({**pem, "ssl.key.password": WRONG_PASSWORD}),
        "wrong key store password": lambda: from_properties({**sasl, "ssl.keystore.password": WRONG_PASSWORD}),
        "wrong trust store password": lambda: from_properties({**sasl, "ssl.truststore.password": WRONG_PASSWORD}),
        "malformed token": lambda: OAuthBearerMechanism(f"Bearer {TOKEN}"),
        "token endpoint URL with a password": lambda: ClientCredentialsTokenProvider(
            f"ftp://billing:{CLIENT_SECRET}@idp.example/token", "billing", CLIENT_SECRET),
        "token endpoint echoing the secret": lambda: anyio.run(
            ClientCredentialsTokenProvider(endpoint, "billing", CLIENT_SECRET).token),
    }


async def test_error_paths_show_no_secret(
    material: Material, echoing_token_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncconsumer")
    seen: dict[str, str] = {}
    for name, call in _error_paths(material, echoing_token_endpoint).items():
        with pytest.raises(Exception) as info:
            await anyio.to_thread.run_sync(call)
        seen[name] = everything_about(info.value)
    # The reprs of what holds a secret.
    provider = ClientCredentialsTokenProvider(f"https://billing:{CLIENT_SECRET}@idp.example/t", "billing",
                                              CLIENT_SECRET)
    seen["reprs"] = " ".join(map(repr, [OAuthBearerToken(TOKEN), provider, from_properties({
        **material.sasl_ssl, "sasl.jaas.config": _jaas(SASL_PASSWORD)})]))
    # A failed login against the broker, logged at DEBUG.
    wrong = {**material.sasl_ssl, "sasl.jaas.config": _jaas(WRONG_PASSWORD)}
    with pytest.raises(KafkaError) as failed:
        with anyio.fail_after(20):
            async with Consumer.from_properties(wrong) as consumer:
                await consumer.topics()
    seen["failed login"] = everything_about(failed.value)
    seen["log"] = logged(caplog)
    leaks = {name: secrets_in(text) for name, text in seen.items() if secrets_in(text)}
    assert leaks == {}
    assert "authentication" in seen["failed login"] and "failed authentication" in seen["log"]
    # Each error still says what is wrong, naming the option.
    assert "cannot read the value of 'password'" in seen["jaas without closing quote"]
    assert "sasl_plain_password must be a string, got a bytes [hidden]" in seen["password of the wrong type"]
    assert "ssl.key.password (wrong password?)" in seen["wrong key password"]
    assert "[hidden]" in seen["token endpoint echoing the secret"]


CLI_AT_DEBUG = textwrap.dedent("""
    # The CLI, with every asyncconsumer logger at DEBUG on stderr (the CLI sets the level itself: kept).
    import json, logging, sys
    from asyncconsumer.cli import run

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    top = logging.getLogger("asyncconsumer")
    top.setLevel(logging.DEBUG)
    top.setLevel = lambda level: None
    for argv in json.loads(sys.argv[1]):
        print("--- " + " ".join(argv[:1]), file=sys.stderr, flush=True)
        try:
            run(argv)
        except SystemExit as exit:
            print(f"exit {exit.code}", file=sys.stderr, flush=True)
""")


def test_the_cli_at_debug_shows_no_secret(material: Material, tmp_path: Path) -> None:
    broker = material.broker
    topic = create_topic(broker.bootstrap, f"secrets-cli-{uuid.uuid4().hex[:8]}", 1)
    produce(broker.bootstrap, topic, [b"record"])
    config = material.command_config
    text = config.read_text()
    wrong, unquoted = tmp_path / "wrong.properties", tmp_path / "unquoted.properties"
    wrong.write_text(text.replace(SASL_PASSWORD, WRONG_PASSWORD))
    unquoted.write_text(text.replace(f'password="{SASL_PASSWORD}";', f'password="{SASL_PASSWORD};'))
    server = broker.bootstrap_for("SASL_SSL")
    runs = [
        ["consume", "--bootstrap-server", server, "--topic", topic, "--from-beginning", "--max-messages", "1",
         "--timeout-ms", "30000", "--command-config", str(config)],
        ["consume", "--bootstrap-server", server, "--topic", topic, "--command-config", str(wrong)],
        ["consume", "--bootstrap-server", server, "--topic", topic, "--command-config", str(unquoted)],
        ["consume", "--bootstrap-server", server, "--topic", topic, "--consumer-property",
         f"sasl.password:{SASL_PASSWORD}"],
    ]
    result = subprocess.run(
        [sys.executable, "-c", CLI_AT_DEBUG, json.dumps(runs)], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, err[-3000:]
    assert "DEBUG asyncconsumer." in err  # DEBUG was on
    assert secrets_in(out + err) == [], err
    assert out == "record\n", (out, err[-3000:])
    assert [line for line in err.splitlines() if line.startswith("exit ")] == ["exit 0"] + ["exit 1"] * 3, err[-3000:]
    assert "sasl.jaas.config: cannot read the value of 'password'" in err
    assert "--consumer-property expects NAME=VALUE, got 'sasl.password' and" in err
