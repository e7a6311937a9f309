"""from_properties with the Java client's properties: every name Kafka's ConsumerConfig has, the
trust and key stores Java users have (JKS, PKCS12, PEM), and OAUTHBEARER's client-credentials flow
against a broker that validates signed JWTs through a JWKS endpoint (KIP-768)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.oidc import TokenServer, token_server
from support.producer import create_topic, produce

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.config import from_properties
from asyncconsumer.errors import ConfigError, SaslAuthenticationError
from asyncconsumer.java_properties import APPLIED, IGNORED, JAVA_CONSUMER_PROPERTIES, REJECTED
from asyncconsumer.oauth import ClientCredentialsTokenProvider, TokenEndpointError
from asyncconsumer.testing import KafkaBroker
from asyncconsumer.testing.kafka import find_java, kafka_libs

OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"

_CONFIG_NAMES = """
public class Names {
    public static void main(String[] args) {
        for (String name : new java.util.TreeSet<>(org.apache.kafka.clients.consumer.ConsumerConfig.configNames())) {
            System.out.println(name);
        }
    }
}
"""


def test_every_java_consumer_property_is_classified(tmp_path: Path) -> None:
    """The table holds every name of Kafka's own ConsumerConfig (from the test broker's jars; the
    table is Kafka 4.4's, a superset of older versions')."""
    java, _ = find_java()
    source = tmp_path / "Names.java"
    source.write_text(_CONFIG_NAMES)
    done = subprocess.run(
        [java, "-cp", str(kafka_libs() / "*"), str(source)], capture_output=True, text=True, timeout=120, check=True
    )
    names = set(done.stdout.split())
    assert len(names) > 100
    assert names <= set(JAVA_CONSUMER_PROPERTIES), sorted(names - set(JAVA_CONSUMER_PROPERTIES))
    assert not (set(APPLIED) & set(IGNORED)) and not (set(IGNORED) & set(REJECTED))


# What Spark passes through to its consumer (kafka.* options), and Java defaults: all accepted.
SPARK_PASSTHROUGH = {
    "bootstrap.servers": "h:9092",
    "receive.buffer.bytes": "65536",
    "send.buffer.bytes": "-1",
    "client.dns.lookup": "use_all_dns_ips",
    "ssl.protocol": "TLSv1.3",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256",
    "allow.auto.create.topics": "false",
    "metrics.recording.level": "DEBUG",
    "metrics.num.samples": "2",
    "metric.reporters": "",
    "partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor,"
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
    "retry.backoff.max.ms": "1000",
    "socket.connection.setup.timeout.max.ms": "30000",
    "enable.metrics.push": "true",
    "interceptor.classes": "",
    "security.providers": "",
    "key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
    "value.deserializer": "org.apache.kafka.common.serialization.StringDeserializer",
    "sasl.kerberos.service.name": "kafka",
    "sasl.login.refresh.window.factor": "0.8",
    "group.protocol": "classic",
}


def test_properties_spark_passes_through_are_accepted() -> None:
    c = from_properties(SPARK_PASSTHROUGH)
    assert c.partition_assignment_strategy == ("range", "cooperative-sticky")
    assert c.key_deserializer is None and c.value_deserializer is not None
    assert c.value_deserializer(b"caf\xc3\xa9") == "café"
    assert c.ssl_context is None  # no TLS asked for: the ssl.* versions alone build none


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"interceptor.classes": "com.example.Audit"}, "cannot run in Python"),
        ({"config.providers": "file"}, "resolve the ${provider:...} values"),
        ({"sasl.mechanism": "GSSAPI", "security.protocol": "SASL_SSL"}, "use SCRAM-SHA-512 or OAUTHBEARER"),
        ({"sasl.mechanism": "AWS_MSK_IAM", "security.protocol": "SASL_SSL"}, "aws-msk-iam-sasl-signer-python"),
        (
            {"sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;"},
            "MSKAuthTokenProvider",
        ),
        (
            {"sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;"},
            "Kerberos (GSSAPI) is not supported",
        ),
        ({"sasl.login.callback.handler.class": "com.example.MyHandler"}, "OAuthBearerLoginCallbackHandler"),
        ({"ssl.engine.factory.class": "com.example.Engine"}, "pass ssl_context"),
        ({"key.deserializer": "io.confluent.kafka.serializers.KafkaAvroDeserializer"}, "a Python callable"),
        ({"client.dns.lookup": "default"}, "use_all_dns_ips"),
        ({"receive.buffer.bytes": "big"}, "must be an integer"),
        ({"ssl.protocol": "SSLv3", "security.protocol": "SSL"}, "TLS version 'SSLv3'"),
        ({"ssl.truststore.type": "JCEKS", "ssl.truststore.location": __file__, "security.protocol": "SSL"}, "JCEKS"),
        ({"fetch.max.wait": "5"}, "did you mean 'fetch.max.wait.ms'"),
    ],
)
def test_what_cannot_be_done_is_rejected_with_what_to_use(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_properties({"bootstrap.servers": "h:9092", **properties})
    assert message in str(info.value)


def test_oauth_settings_make_a_client_credentials_provider() -> None:
    c = from_properties(
        {
            "bootstrap.servers": "h:9092",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.login.callback.handler.class": OAUTH_HANDLER,
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'clientId="spark-job" clientSecret="s3cret" scope="kafka" extension_logicalCluster="lkc-1";',
        }
    )
    provider = c.sasl_oauth_token_provider
    assert isinstance(provider, ClientCredentialsTokenProvider)
    assert (provider.url, provider.scope, provider.extensions) == (
        "https://idp.example/oauth2/token",
        "kafka",
        {"logicalCluster": "lkc-1"},
    )
    assert "s3cret" not in repr(provider) and "s3cret" not in repr(c)


# ---------------------------------------------------------------------------------- TLS stores


@pytest.fixture(scope="module")
def mtls_broker() -> Iterator[KafkaBroker]:
    """A broker whose SSL listener requires a client certificate."""
    broker = KafkaBroker(listeners=("SSL",), config={"ssl.client.auth": "required"}, heap_mb=384).start()
    try:
        yield broker
    finally:
        broker.stop()


def keytool(*args: str) -> None:
    java, _ = find_java()
    tool = Path(java).with_name("keytool")
    subprocess.run(
        [str(tool if tool.exists() else shutil.which("keytool")), *args], check=True, capture_output=True, timeout=120
    )


def make_stores(broker: KafkaBroker, directory: Path) -> dict[str, dict[str, str]]:
    """Trust and key stores made by Java's keytool (and openssl for the PKCS12 key store)."""
    tls = broker._tls_material()
    password = "changeit"
    stores: dict[str, dict[str, str]] = {}
    for kind in ("JKS", "PKCS12"):
        trust = directory / f"trust.{kind.lower()}"
        keytool(
            "-importcert",
            "-noprompt",
            "-alias",
            "ca",
            "-file",
            str(tls.ca_file),
            "-keystore",
            str(trust),
            "-storetype",
            kind,
            "-storepass",
            password,
        )
        stores[kind] = {
            "ssl.truststore.location": str(trust),
            "ssl.truststore.type": kind,
            "ssl.truststore.password": password,
        }
    p12 = directory / "client.p12"
    subprocess.run(
        [
            "openssl",
            "pkcs12",
            "-export",
            "-in",
            str(tls.client_cert_file),
            "-inkey",
            str(tls.client_key_file),
            "-certfile",
            str(tls.ca_file),
            "-name",
            "client",
            "-out",
            str(p12),
            "-passout",
            f"pass:{password}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    jks = directory / "client.jks"
    keytool(
        "-importkeystore",
        "-srckeystore",
        str(p12),
        "-srcstoretype",
        "PKCS12",
        "-srcstorepass",
        password,
        "-destkeystore",
        str(jks),
        "-deststoretype",
        "JKS",
        "-deststorepass",
        password,
        "-destkeypass",
        password,
    )
    stores["JKS"].update(
        {
            "ssl.keystore.location": str(jks),
            "ssl.keystore.type": "JKS",
            "ssl.keystore.password": password,
            "ssl.key.password": password,
        }
    )
    stores["PKCS12"].update(
        {"ssl.keystore.location": str(p12), "ssl.keystore.type": "PKCS12", "ssl.keystore.password": password}
    )
    stores["PEM"] = {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_file),
        "ssl.keystore.key": tls.client_key_file.read_text(),
        "ssl.keystore.certificate.chain": tls.client_cert_file.read_text(),
    }
    return stores


async def read_all(properties: dict[str, Any], topic: str, count: int) -> list[bytes]:
    values: list[bytes] = []
    async with Consumer.from_properties(properties, request_timeout_ms=10_000) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        with anyio.fail_after(60):
            while len(values) < count:
                batch = await consumer.getmany(timeout=1)
                values += [r.value for records in batch.values() for r in records if r.value is not None]
    return values


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["JKS", "PKCS12", "PEM"])
async def test_trust_and_key_stores(mtls_broker: KafkaBroker, tmp_path: Path, kind: str, anyio_backend: str) -> None:
    stores = make_stores(mtls_broker, tmp_path)
    topic = create_topic(mtls_broker.bootstrap, f"stores-{uuid.uuid4().hex[:8]}", 1)
    expected = [f"{kind}-{i}".encode() for i in range(5)]
    await anyio.to_thread.run_sync(lambda: produce(mtls_broker.bootstrap, topic, expected))
    properties = {"bootstrap.servers": mtls_broker.bootstrap_for("SSL"), "security.protocol": "SSL", **stores[kind]}
    assert await read_all(properties, topic, len(expected)) == expected


def test_wrong_store_password_is_named(mtls_broker: KafkaBroker, tmp_path: Path) -> None:
    stores = make_stores(mtls_broker, tmp_path)
    for kind in ("JKS", "PKCS12"):
        bad = {
            **stores[kind],
            "ssl.truststore.password": "wrong",
            "ssl.keystore.password": "wrong",
            "ssl.key.password": "wrong",
        }
        with pytest.raises(ConfigError, match="wrong"):
            from_properties({"bootstrap.servers": "h:1", "security.protocol": "SSL", **bad})


# ----------------------------------------------------------------------- OAUTHBEARER (KIP-768)


@pytest.fixture(scope="module")
def oidc() -> Iterator[tuple[TokenServer, KafkaBroker]]:
    with token_server({"spark-job": "s3cret"}) as server:
        broker = KafkaBroker(listeners=("SASL_PLAINTEXT",), oauth_jwks_url=server.jwks_url, heap_mb=384).start()
        try:
            yield server, broker
        finally:
            broker.stop()


def oauth_properties(broker: KafkaBroker, server: TokenServer, secret: str) -> dict[str, str]:
    return {
        "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class": OAUTH_HANDLER,
        "sasl.oauthbearer.token.endpoint.url": server.token_url,
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        f'clientId="spark-job" clientSecret="{secret}" scope="kafka";',
    }


@pytest.mark.anyio
async def test_client_credentials_against_a_jwks_validating_broker(
    oidc: tuple[TokenServer, KafkaBroker], anyio_backend: str
) -> None:
    server, broker = oidc
    topic = create_topic(broker.bootstrap, f"oidc-{uuid.uuid4().hex[:8]}", 1)
    expected = [f"oidc-{i}".encode() for i in range(5)]
    await anyio.to_thread.run_sync(lambda: produce(broker.bootstrap, topic, expected))
    before = len(server.token_requests)
    assert await read_all(oauth_properties(broker, server, "s3cret"), topic, len(expected)) == expected
    asked = server.token_requests[before:]
    assert asked and all(
        r == {"client_id": "spark-job", "grant_type": "client_credentials", "scope": "kafka"} for r in asked
    )


@pytest.mark.anyio
async def test_the_broker_refuses_a_token_it_cannot_verify(
    oidc: tuple[TokenServer, KafkaBroker], anyio_backend: str
) -> None:
    """An unsigned token (what the unsecured login makes) fails on the JWKS-validating broker: the
    broker really checks signatures, so the test above proves the signed token was verified."""
    _, broker = oidc
    unsecured = {
        "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'unsecuredLoginStringClaim_sub="mallory";',
    }
    with pytest.raises(SaslAuthenticationError):
        async with Consumer.from_properties(unsecured, request_timeout_ms=10_000) as consumer:
            with anyio.fail_after(30):
                await consumer.topics()


@pytest.mark.anyio
async def test_a_wrong_client_secret_is_the_token_endpoints_answer(
    oidc: tuple[TokenServer, KafkaBroker], anyio_backend: str
) -> None:
    server, broker = oidc
    with pytest.raises(Exception) as info:
        async with Consumer.from_properties(oauth_properties(broker, server, "wrong"), request_timeout_ms=10_000) as c:
            with anyio.fail_after(30):
                await c.topics()
    chain = [info.value, info.value.__cause__, info.value.__context__]
    assert any(isinstance(e, TokenEndpointError) and "invalid_client" in str(e) for e in chain), chain
