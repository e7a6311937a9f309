"""Every property of the Java consumer, and what ``from_properties`` does with it.

The names are Apache Kafka 4.4's ``ConsumerConfig.configNames()`` (consumer, common client,
SASL and SSL settings).  Each is one of:

- **applied**: it sets an asyncconsumer option (``fetch.max.wait.ms`` -> ``fetch_max_wait_ms``), or
  builds the TLS context or the SASL credentials (``ssl.*``, ``sasl.*``, handled in
  :mod:`asyncconsumer.config`);
- **ignored**: accepted and checked where its value has a fixed form, but it changes nothing
  here: it tunes the JVM, Java's metrics, or a feature this client does differently.  The reason
  is in :data:`IGNORED`;
- **rejected**: the property asks for something this client cannot do (load a Java class,
  Kerberos); :data:`REJECTED` says what to use instead.  A rejected property given an empty
  value (the Java default) is accepted.

docs/configuration.md lists them for users.

Some hold secrets (:data:`SECRET_PROPERTIES`, and any option named like one: :func:`is_secret`).
Every message about an option goes through :func:`shown`, which gives the value's type in place
of a secret's value, so that no error, log line or repr prints one (docs/security.md).
"""

from __future__ import annotations

import re

__all__ = [
    "APPLIED",
    "HIDDEN",
    "IGNORED",
    "JAVA_CONSUMER_PROPERTIES",
    "REJECTED",
    "SECRET_PROPERTIES",
    "is_secret",
    "shown",
]

#: Java property -> what it sets (an option name, or where it goes).
APPLIED: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "client.rack": "client_rack",
    "group.id": "group_id",
    "group.instance.id": "group_instance_id",
    "group.protocol": "group_protocol",
    "group.remote.assignor": "group_remote_assignor",
    "auto.offset.reset": "auto_offset_reset",
    "enable.auto.commit": "enable_auto_commit",
    "auto.commit.interval.ms": "auto_commit_interval_ms",
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "partition.assignment.strategy": "partition_assignment_strategy (Java class names are translated)",
    "fetch.min.bytes": "fetch_min_bytes",
    "fetch.max.bytes": "fetch_max_bytes",
    "fetch.max.wait.ms": "fetch_max_wait_ms",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "max.poll.records": "max_poll_records",
    "isolation.level": "isolation_level",
    "check.crcs": "check_crcs",
    "exclude.internal.topics": "exclude_internal_topics",
    "enable.metrics.push": "enable_metrics_push",
    "request.timeout.ms": "request_timeout_ms",
    "default.api.timeout.ms": "default_api_timeout_ms",
    "socket.connection.setup.timeout.ms": "socket_connection_setup_timeout_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "reconnect.backoff.ms": "reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "reconnect_backoff_max_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "metadata.recovery.strategy": "metadata_recovery_strategy",
    "metadata.recovery.rebootstrap.trigger.ms": "metadata_recovery_rebootstrap_trigger_ms",
    "security.protocol": "security_protocol",
    "key.deserializer": "key_deserializer (ByteArrayDeserializer: bytes; StringDeserializer: UTF-8 str)",
    "value.deserializer": "value_deserializer (ByteArrayDeserializer: bytes; StringDeserializer: UTF-8 str)",
    "sasl.mechanism": "sasl_mechanism (GSSAPI and AWS_MSK_IAM are rejected)",
    "sasl.jaas.config": "PlainLoginModule/ScramLoginModule: the username and password; OAuthBearerLoginModule: "
    "the token (client credentials, or an unsecured token)",
    "sasl.login.callback.handler.class": "Kafka's OAuthBearerLoginCallbackHandler: the client-credentials flow",
    "sasl.login.connect.timeout.ms": "the token endpoint request's connect timeout",
    "sasl.login.read.timeout.ms": "the token endpoint request's read timeout",
    "sasl.login.retry.backoff.ms": "the first wait before retrying the token endpoint",
    "sasl.login.retry.backoff.max.ms": "the longest wait between token endpoint retries",
    "sasl.oauthbearer.token.endpoint.url": "the token endpoint (https:, http: or file:)",
    "sasl.oauthbearer.client.credentials.client.id": "the client id of the client-credentials flow",
    "sasl.oauthbearer.client.credentials.client.secret": "the client secret of the client-credentials flow",
    "sasl.oauthbearer.scope": "the scope asked of the token endpoint",
    "sasl.oauthbearer.header.urlencode": "URL-encode the client id and secret in the Basic header",
    "sasl.oauthbearer.jwt.retriever.class": "Kafka's own retrievers (client credentials, file, default)",
    "ssl.truststore.location": "the trusted CAs (JKS, PKCS12 or PEM)",
    "ssl.truststore.password": "the trust store's password (JKS integrity check, PKCS12)",
    "ssl.truststore.type": "JKS, PKCS12 or PEM",
    "ssl.truststore.certificates": "trusted CAs as PEM text",
    "ssl.keystore.location": "the client certificate and key (JKS, PKCS12 or PEM)",
    "ssl.keystore.password": "the key store's password",
    "ssl.keystore.type": "JKS, PKCS12 or PEM",
    "ssl.keystore.key": "the client key as PEM text",
    "ssl.keystore.certificate.chain": "the client certificate chain as PEM text",
    "ssl.key.password": "the private key's password",
    "ssl.endpoint.identification.algorithm": "'https' checks the broker's host name; '' does not",
    "ssl.protocol": "the highest TLS version (TLSv1.2, TLSv1.3)",
    "ssl.enabled.protocols": "the TLS versions allowed",
}

#: Java property -> why it changes nothing here.
IGNORED: dict[str, str] = {
    "allow.auto.create.topics": "the consumer never asks the broker to create topics (Metadata requests say no)",
    "bootstrap.resolve.timeout.ms": "bootstrap names are resolved on each connection attempt",
    "client.dns.lookup": "every address of a name is tried in turn (what use_all_dns_ips does)",
    "internal.throw.on.fetch.stable.offset.unsupported": "a Java client internal",
    "metadata.cluster.check.enable": "always on with metadata_recovery_strategy='rebootstrap' (off with 'none')",
    "metric.reporters": "metrics go to OpenTelemetry (meter_provider) and asyncconsumer.prometheus",
    "metrics.num.samples": "metrics go to OpenTelemetry, which does its own aggregation",
    "metrics.recording.level": "every metric is always recorded",
    "metrics.sample.window.ms": "metrics go to OpenTelemetry, which does its own aggregation",
    "receive.buffer.bytes": "the operating system sizes socket buffers",
    "send.buffer.bytes": "the operating system sizes socket buffers",
    "retry.backoff.max.ms": "retries wait retry.backoff.ms each time",
    "socket.connection.setup.timeout.max.ms": "each attempt gets socket.connection.setup.timeout.ms",
    "security.providers": "Java security providers; Python uses OpenSSL",
    "share.acknowledgement.mode": "share groups are read with asyncconsumer.share.ShareConsumer's own options",
    "share.acquire.mode": "share groups are read with asyncconsumer.share.ShareConsumer's own options",
    "sasl.kerberos.kinit.cmd": "Kerberos (GSSAPI) is not supported; only used with it",
    "sasl.kerberos.min.time.before.relogin": "Kerberos (GSSAPI) is not supported; only used with it",
    "sasl.kerberos.service.name": "Kerberos (GSSAPI) is not supported; only used with it",
    "sasl.kerberos.ticket.renew.jitter": "Kerberos (GSSAPI) is not supported; only used with it",
    "sasl.kerberos.ticket.renew.window.factor": "Kerberos (GSSAPI) is not supported; only used with it",
    "sasl.login.refresh.buffer.seconds": "a token is renewed at 80 % of its lifetime",
    "sasl.login.refresh.min.period.seconds": "a token is renewed at 80 % of its lifetime",
    "sasl.login.refresh.window.factor": "a token is renewed at 80 % of its lifetime",
    "sasl.login.refresh.window.jitter": "a token is renewed at 80 % of its lifetime",
    "sasl.oauthbearer.allow.unverified.audience": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.allow.unverified.issuer": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.clock.skew.seconds": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.expected.audience": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.expected.issuer": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.jwks.endpoint.url": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.jwt.validator.class": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.scope.claim.name": "the broker validates tokens; the client does not",
    "sasl.oauthbearer.sub.claim.name": "the broker validates tokens; the client does not",
    "ssl.cipher.suites": "OpenSSL's default cipher suites are used (Java's suite names are not OpenSSL's)",
    "ssl.keymanager.algorithm": "a JSSE setting; Python uses OpenSSL",
    "ssl.trustmanager.algorithm": "a JSSE setting; Python uses OpenSSL",
    "ssl.provider": "a JSSE setting; Python uses OpenSSL",
    "ssl.secure.random.implementation": "a JSSE setting; Python uses OpenSSL",
}

#: Java property -> why it cannot be honoured, and what to do instead (accepted when empty).
REJECTED: dict[str, str] = {
    "config.providers": "Java config providers are not supported: resolve the ${provider:...} values before "
    "passing them",
    "interceptor.classes": "Java consumer interceptors cannot run in Python: wrap the records in your own code",
    "sasl.client.callback.handler.class": "Java SASL callback handlers cannot run in Python: use "
    "sasl_oauth_token_provider for custom OAUTHBEARER tokens",
    "sasl.login.class": "Java login classes cannot run in Python: use sasl.jaas.config, or "
    "sasl_oauth_token_provider for custom OAUTHBEARER tokens",
    "ssl.engine.factory.class": "a Java SSLEngine factory cannot run in Python: pass ssl_context "
    "(an ssl.SSLContext) instead",
    "sasl.oauthbearer.assertion.algorithm": "the jwt-bearer grant (KIP-1139) is not supported: use client "
    "credentials, or sasl_oauth_token_provider",
    "sasl.oauthbearer.assertion.claim.aud": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.claim.exp.seconds": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.claim.iss": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.claim.jti.include": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.claim.nbf.seconds": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.claim.sub": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.file": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.private.key.file": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.private.key.passphrase": "the jwt-bearer grant (KIP-1139) is not supported",
    "sasl.oauthbearer.assertion.template.file": "the jwt-bearer grant (KIP-1139) is not supported",
}

#: Every Java consumer property, with "applied", "ignored" or "rejected".
JAVA_CONSUMER_PROPERTIES: dict[str, str] = {
    **dict.fromkeys(APPLIED, "applied"),
    **dict.fromkeys(IGNORED, "ignored"),
    **dict.fromkeys(REJECTED, "rejected"),
}

#: Properties whose values are secrets (besides any named like one, see :func:`is_secret`).
SECRET_PROPERTIES = frozenset({
    "sasl.jaas.config",
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "ssl.keystore.key",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
})
#: What a message shows in place of a secret.
HIDDEN = "[hidden]"
#: Words that make a name (a property, an option, a JAAS option such as ``clientSecret``) a secret's.
_SECRET_NAME = re.compile(r"pass(word|wd|phrase)|secret|jaas|token(?!.endpoint)|keystore.key$", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Whether the property, option or JAAS option ``name`` holds a secret: ``ssl.key.password``,
    ``sasl_plain_password``, ``sasl.jaas.config``, ``clientSecret``, ``sasl_oauth_token_provider``..."""
    return name in SECRET_PROPERTIES or _SECRET_NAME.search(name) is not None


def shown(name: str, value: object) -> str:
    """``value`` as a message about ``name`` shows it: its ``repr``, or for a secret only its type
    (``"a str (hidden)"``)."""
    if is_secret(name) and value is not None:
        return f"a {type(value).__name__} {HIDDEN}"
    return repr(value)
