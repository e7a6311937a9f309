"""Configuration is validated at construction with errors that name the option."""

from __future__ import annotations

import ast
import dataclasses
import re
import ssl

import pytest
from support.paths import ROOT

from asyncconsumer import ConfigError, Consumer
from asyncconsumer.config import ConsumerConfig, ConsumerOptions, build_config, from_properties, parse_host_port


def test_defaults_follow_kafka() -> None:
    c = build_config({})
    assert (c.auto_offset_reset, c.enable_auto_commit, c.fetch_max_bytes, c.max_partition_fetch_bytes) == (
        "latest",
        True,
        52428800,
        1048576,
    )
    assert c.isolation_level == "read_uncommitted" and c.check_crcs is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bootstrap_server": "x:1"}, "did you mean 'bootstrap_servers'"),
        ({"bootstrap_servers": ""}, "bootstrap_servers is empty"),
        ({"bootstrap_servers": "host:notaport"}, "is not 'host:port'"),
        ({"bootstrap_servers": "kafka://127.0.0.1:9092"},
         "'kafka://127.0.0.1:9092' has a URL scheme (kafka://): bootstrap_servers takes plain 'host:port' addresses, "
         "such as '127.0.0.1:9092'"),
        ({"bootstrap_servers": ["a:1", "SASL_SSL://b:9093"]}, "has a URL scheme (SASL_SSL://)"),
        ({"bootstrap_servers": "host/path:9092"}, "'host/path:9092' is not 'host:port'"),
        ({"auto_offset_reset": "smallest"}, "auto_offset_reset='smallest' is not one of"),
        ({"fetch_max_wait_ms": -1}, "fetch_max_wait_ms must be >= 0"),
        ({"request_timeout_ms": 0}, "request_timeout_ms must be > 0"),
        ({"request_timeout_ms": "30"}, "request_timeout_ms must be an integer"),
        ({"default_api_timeout_ms": 0}, "default_api_timeout_ms must be > 0"),
        ({"default_api_timeout_ms": 2**31}, "default_api_timeout_ms must be at most 2147483647"),
        ({"enable_auto_commit": "yes"}, "enable_auto_commit must be True or False"),
        ({"fetch_buffer_bytes": 1000}, "fetch_buffer_bytes (1000) must be >= max_partition_fetch_bytes"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_plain_username and sasl_plain_password"),
        ({"ssl_context": ssl.create_default_context()}, "use 'SSL' or 'SASL_SSL'"),
        ({"ssl_context": "not a context", "security_protocol": "SSL"}, "must be an ssl.SSLContext"),
        ({"group_instance_id": "i1"}, "group_instance_id needs a group_id"),
        ({"value_deserializer": 3}, "must be callable"),
        ({"partition_assignment_strategy": "fair"}, "is not one of range"),
        ({"heartbeat_interval_ms": 50000}, "heartbeat_interval_ms must be lower than session_timeout_ms"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "needs sasl_oauth_token_provider"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": "tok"},
         "sasl_oauth_token_provider must be a callable"),
        ({"sasl_oauth_token_provider": lambda: "tok"}, "sasl_oauth_token_provider is set but not used"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "is not one of"),
    ],
)
def test_bad_options_name_the_problem(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Consumer(**options)
    assert message in str(info.value)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Consumer(max_poll_records=0)


def test_from_properties_java_and_librdkafka_names() -> None:
    c = from_properties(
        {
            "bootstrap.servers": "a:1,b:2",
            "group.id": "g",
            "enable.auto.commit": "false",
            "auto.offset.reset": "smallest",
            "fetch.max.wait.ms": "250",
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "scram-sha-512",
            "sasl.username": "u",
            "sasl.password": "s3cr3t-pw",
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    assert c.bootstrap_servers == ("a:1", "b:2")
    assert (c.group_id, c.enable_auto_commit, c.auto_offset_reset, c.fetch_max_wait_ms) == ("g", False, "earliest", 250)
    assert (c.security_protocol, c.sasl_mechanism, c.sasl_plain_username) == ("SASL_PLAINTEXT", "SCRAM-SHA-512", "u")
    assert c.partition_assignment_strategy == ("cooperative-sticky",)
    assert "s3cr3t-pw" not in repr(c)  # the password is not printed


def test_from_properties_rejects_unknown_and_bad_values() -> None:
    with pytest.raises(ConfigError, match=r"unknown consumer property 'fetch\.bogus'"):
        from_properties({"fetch.bogus": "1"})
    with pytest.raises(ConfigError, match="must be 'true' or 'false'"):
        from_properties({"enable.auto.commit": "maybe"})
    with pytest.raises(ConfigError, match="must be an integer"):
        from_properties({"fetch.min.bytes": "lots"})


def test_consumer_from_properties_with_overrides() -> None:
    c = Consumer.from_properties({"bootstrap.servers": "h:9"}, client_id="me")
    assert c.config.bootstrap_servers == ("h:9",) and c.config.client_id == "me"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("h:1", ("h", 1)), ("h", ("h", 9092)), ("[::1]:9093", ("::1", 9093)), ("127.0.0.1:65535", ("127.0.0.1", 65535))],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(("algorithm", "checked"), [("https", True), ("", False), ("none", False)])
def test_hostname_check_follows_ssl_endpoint_identification_algorithm(algorithm: str, checked: bool) -> None:
    # "" is the Java client's way to turn the check off, "none" librdkafka's.
    props = {"bootstrap.servers": "h:9093", "security.protocol": "SSL",
             "ssl.endpoint.identification.algorithm": algorithm}
    context = from_properties(props).ssl_context
    assert context is not None and context.check_hostname is checked


def test_oauthbearer_options() -> None:
    class Source:  # an object with an async token() method, like aiokafka's AbstractTokenProvider
        async def token(self) -> str:
            return "tok"

    for provider in (lambda: "tok", Source()):
        c = build_config({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                          "sasl_oauth_token_provider": provider})
        assert c.sasl_oauth_token_provider is provider
        assert "sasl_oauth_token_provider" not in repr(c)  # it may close over secrets
    # A synchronous token() method is not the async shape: refused rather than called wrongly.
    class SyncSource:
        def token(self) -> str:
            return "tok"

    with pytest.raises(ConfigError, match="async token"):
        build_config({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                      "sasl_oauth_token_provider": SyncSource()})
    assert from_properties({"security.protocol": "SASL_SSL", "sasl.mechanisms": "oauthbearer"},
                           {"sasl_oauth_token_provider": lambda: "t"}).sasl_mechanism == "OAUTHBEARER"


# -- one list of options: ConsumerOptions, ConsumerConfig and docs/configuration.md ------------------


def _documented_options() -> dict[str, str]:
    """option -> its default cell, from the reference tables of docs/configuration.md."""
    text = (ROOT / "docs/configuration.md").read_text()
    reference = text.split("## Reference", 1)[1].split("\n## ", 1)[0]
    options: dict[str, str] = {}
    for line in reference.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]  # a "\|" inside a cell is no border
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        assert name not in options, f"docs/configuration.md lists {name} twice"
        options[name] = cells[2]
    return options


def test_the_typed_options_are_the_config_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ConsumerConfig)}
    assert set(ConsumerOptions.__annotations__) == fields
    assert not ConsumerOptions.__required_keys__  # every option is optional


def test_docs_list_exactly_the_options_with_their_defaults() -> None:
    documented = _documented_options()
    fields = {f.name: f for f in dataclasses.fields(ConsumerConfig)}
    assert sorted(documented) == sorted(fields)
    for name, cell in documented.items():
        literal = re.match(r"`([^`]*)`", cell.strip())
        assert literal is not None, f"{name}: the default {cell!r} is not a `literal`"
        default = fields[name].default
        assert default is not dataclasses.MISSING
        assert ast.literal_eval(literal.group(1)) == default, f"{name}: docs say {cell}, ConsumerConfig has {default!r}"


def test_the_docs_check_can_fail() -> None:
    """The parser finds every row: a row with a wrong default or a name too many would be seen."""
    documented = _documented_options()
    assert documented["fetch_max_bytes"].startswith("`52428800`")
    assert documented["auto_offset_reset"] == '`"latest"`'
    assert documented["sasl_oauth_token_provider"] == "`None`"


def test_docs_ignored_table_covers_the_ignored_properties() -> None:
    """docs/configuration.md sums ``java_properties.IGNORED`` up by hand (``metrics.*``,
    ``sasl.kerberos.*``...): every ignored property matches a row's pattern, and every pattern an
    ignored property, so the two cannot drift apart."""
    from fnmatch import fnmatchcase

    from asyncconsumer.java_properties import IGNORED

    text = (ROOT / "docs/configuration.md").read_text()
    table = text.split("\nIgnored (", 1)[1].split("\n\n", 2)[1]
    patterns = [p for line in table.splitlines()[2:] for p in re.findall(r"`([^`]+)`", line.split("|")[1])]
    assert patterns, "no Ignored table found in docs/configuration.md"
    unmatched = [name for name in IGNORED if not any(fnmatchcase(name, p) for p in patterns)]
    stale = [p for p in patterns if not any(fnmatchcase(name, p) for name in IGNORED)]
    assert (unmatched, stale) == ([], [])
