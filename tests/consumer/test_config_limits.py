"""Options and arguments at and past the limits of what the protocol can carry (issue 14, items 3-6).

* Every integer option is declared either with the protocol field it is sent in
  (``config.PROTOCOL_INT_FIELDS``) or with the bound the Java client's type gives it
  (``config.LOCAL_INT_LIMITS``).  At its limit it is accepted; past it, ``Consumer(...)`` raises
  ``ConfigError`` naming the option (and the field) before any I/O.  For the options that are
  sent, the codec is the judge: the limit encodes in the request the option goes into and one
  more does not (so the limit is neither too tight nor too loose).
* String options sent as protocol STRINGs (``client_id``, ``group_id``, ``group_instance_id``,
  ``client_rack``): ``Consumer(...)`` accepts exactly the strings the codec can encode (at most
  32767 bytes of UTF-8, no lone surrogates).  A ``client_id`` one byte too long used to crash
  the background loop (item 4).
* Arguments of the public API are checked at the call, with a typed error naming the argument:
  ``getmany(timeout="1")`` raises ``ConfigTypeError`` (a ``TypeError``) naming ``timeout``
  (item 6); a ``bytes`` topic in ``assign()`` is refused at the call (item 5).  Against a real
  broker, after every bad call the consumer still works: the background loop did not die of
  the user's input.
* A value the protocol carries but the broker refuses (``session_timeout_ms`` past Apache
  Kafka's ``group.max.session.timeout.ms``) is reported at the next poll with a typed error.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.consumers import FAST

from asyncconsumer import Consumer, ConsumerConfig, OffsetAndMetadata, TopicPartition
from asyncconsumer._args import INT16_STRING_BYTES, INT32_MAX, INT64_MAX
from asyncconsumer.config import (
    LOCAL_INT_LIMITS,
    PROTOCOL_INT_FIELDS,
    PROTOCOL_STRING_FIELDS,
    build_config,
    from_properties,
)
from asyncconsumer.errors import ConfigError, ConfigTypeError, IllegalStateError, ProtocolError
from asyncconsumer.protocol.api import encode_data, encode_request

INT_OPTIONS = sorted(
    f.name for f in dataclasses.fields(ConsumerConfig) if str(f.type).startswith("int") and f.name != "group_id"
)

#: Other options an option at its limit needs to stay consistent (heartbeat < session, ...).
COMPANIONS: dict[str, dict[str, int]] = {
    "heartbeat_interval_ms": {"session_timeout_ms": INT32_MAX},
    "reconnect_backoff_ms": {"reconnect_backoff_max_ms": INT64_MAX},
    "max_partition_fetch_bytes": {"fetch_buffer_bytes": INT32_MAX},
}


def _limit(name: str) -> int:
    return PROTOCOL_INT_FIELDS[name][1] if name in PROTOCOL_INT_FIELDS else LOCAL_INT_LIMITS[name]


def _largest_consistent(name: str) -> int:
    # heartbeat_interval_ms must stay below session_timeout_ms, itself an int32
    return _limit(name) - 1 if name == "heartbeat_interval_ms" else _limit(name)


def _config(name: str, value: int) -> ConsumerConfig:
    return build_config({**COMPANIONS.get(name, {}), name: value})


# ------------------------------------------------------------------ integer options


def test_every_integer_option_has_a_declared_limit() -> None:
    undeclared = [n for n in INT_OPTIONS if n not in PROTOCOL_INT_FIELDS and n not in LOCAL_INT_LIMITS]
    assert not undeclared, f"integer options without a protocol field or a limit: {undeclared}"
    assert not set(PROTOCOL_INT_FIELDS) & set(LOCAL_INT_LIMITS)


@pytest.mark.parametrize("name", INT_OPTIONS)
def test_an_option_at_its_limit_is_accepted_and_one_more_is_refused(name: str) -> None:
    value = _largest_consistent(name)
    assert getattr(_config(name, value), name) == value
    with pytest.raises(ConfigError, match=re.escape(name)) as info:
        _config(name, _limit(name) + 1)
    if name in PROTOCOL_INT_FIELDS:
        assert PROTOCOL_INT_FIELDS[name][0] in str(info.value)  # names the field it is sent in


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(INT_OPTIONS), excess=st.integers(min_value=1, max_value=2**70))
def test_any_value_past_the_limit_is_refused_with_the_option_named(name: str, excess: int) -> None:
    with pytest.raises(ConfigError, match=re.escape(name)):
        _config(name, _limit(name) + excess)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(INT_OPTIONS), data=st.data())
def test_any_value_up_to_the_limit_passes_the_limit_check(name: str, data: st.DataObject) -> None:
    value = data.draw(st.integers(min_value=1, max_value=_largest_consistent(name)))
    try:
        config = _config(name, value)
    except ConfigError as exc:
        # only the consistency rules between options may refuse it, never the limit
        assert "at most" not in str(exc), exc
    else:
        assert getattr(config, name) == value


def _fetch(**fields: int) -> dict[str, Any]:
    pmb = fields.pop("partition_max_bytes", 1)
    return {**fields, "topics": [{"topic": "t", "partitions": [{"partition": 0, "partition_max_bytes": pmb}]}]}


#: Each option sent in a request: the requests it goes into, built with the value.
REQUESTS: dict[str, list[tuple[str, int, Callable[[int], dict[str, Any]]]]] = {
    "session_timeout_ms": [("JoinGroup", 5, lambda v: {"session_timeout_ms": v})],
    "max_poll_interval_ms": [("JoinGroup", 5, lambda v: {"rebalance_timeout_ms": v})],
    "rebalance_timeout_ms": [
        ("JoinGroup", 5, lambda v: {"rebalance_timeout_ms": v}),
        ("ConsumerGroupHeartbeat", 0, lambda v: {"rebalance_timeout_ms": v}),
    ],
    "fetch_max_wait_ms": [("Fetch", 12, lambda v: _fetch(max_wait_ms=v))],
    "fetch_min_bytes": [("Fetch", 12, lambda v: _fetch(min_bytes=v))],
    "fetch_max_bytes": [("Fetch", 12, lambda v: _fetch(max_bytes=v))],
    "max_partition_fetch_bytes": [("Fetch", 12, lambda v: _fetch(partition_max_bytes=v))],
}


def test_every_protocol_option_has_its_requests_here() -> None:
    assert set(REQUESTS) == set(PROTOCOL_INT_FIELDS)


@pytest.mark.parametrize("name", sorted(PROTOCOL_INT_FIELDS))
def test_the_limit_is_what_the_codec_can_carry(name: str) -> None:
    limit = _limit(name)
    for api, version, body in REQUESTS[name]:
        encode_request(api, version, body(limit), correlation_id=0, client_id="c")
        with pytest.raises(ProtocolError):
            encode_request(api, version, body(limit + 1), correlation_id=0, client_id="c")


# ------------------------------------------------------------------ string options


def _string_request(name: str, value: str) -> bytes:
    if name == "client_id":
        return encode_request("ApiVersions", 0, {}, correlation_id=0, client_id=value)
    if name == "client_rack":
        # Fetch v11 is the last version with a classic (int16-length) string; the group
        # subscription (ConsumerProtocolSubscription v3) carries the rack too
        encode_data("ConsumerProtocolSubscription", 3, {"topics": [], "rack_id": value})
        return encode_request("Fetch", 11, {"rack_id": value}, correlation_id=0, client_id="c")
    field = {"group_id": "group_id", "group_instance_id": "group_instance_id"}[name]
    return encode_request("JoinGroup", 5, {"group_id": "g", field: value}, correlation_id=0, client_id="c")


def _string_options(name: str, value: str) -> dict[str, Any]:
    return {"group_id": "g", name: value} if name == "group_instance_id" else {name: value}


def _encodes(name: str, value: str) -> bool:
    try:
        _string_request(name, value)
    except (ProtocolError, UnicodeEncodeError):
        return False
    return True


@pytest.mark.parametrize("name", sorted(PROTOCOL_STRING_FIELDS))
@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("x" * INT16_STRING_BYTES, True),
        ("x" * (INT16_STRING_BYTES + 1), False),
        ("€" * (INT16_STRING_BYTES // 3), True),  # 32766 bytes
        ("€" * (INT16_STRING_BYTES // 3 + 1), False),  # 10923 characters, 32769 bytes
        ("a\ud800b", False),  # a lone surrogate has no UTF-8
    ],
    ids=["32767-ascii", "32768-ascii", "32766-bytes-utf8", "32769-bytes-utf8", "surrogate"],
)
def test_string_options_at_and_past_the_int16_length(name: str, value: str, ok: bool) -> None:
    assert _encodes(name, value) is ok
    if ok:
        assert getattr(build_config(_string_options(name, value)), name) == value
    else:
        with pytest.raises(ConfigError, match=name):
            build_config(_string_options(name, value))


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(PROTOCOL_STRING_FIELDS)),
    char=st.characters(),
    repeat=st.sampled_from([1, 2, 8191, 8192, 10922, 10923, 16383, 16384, 32767, 32768]),
)
def test_a_string_option_is_accepted_exactly_when_it_can_be_sent(name: str, char: str, repeat: int) -> None:
    value = char * repeat
    if name == "group_id" and not value.strip():
        return  # an empty or blank group_id is refused for another reason
    try:
        build_config(_string_options(name, value))
        accepted = True
    except ConfigError as exc:
        assert name in str(exc)
        accepted = False
    assert accepted is _encodes(name, value)


def test_a_client_id_too_long_for_the_header_is_refused_before_any_io() -> None:
    with pytest.raises(ConfigError, match=r"client_id .*32768 bytes"):
        Consumer(client_id="c" * 32768)


def test_wrong_types_are_type_errors_naming_the_option() -> None:
    for options in ({"session_timeout_ms": "45000"}, {"check_crcs": 1}, {"client_id": b"c"}):
        with pytest.raises(ConfigTypeError, match=next(iter(options))) as info:
            Consumer(**options)
        assert isinstance(info.value, TypeError) and isinstance(info.value, ConfigError)
    with pytest.raises(ConfigTypeError, match="properties"):
        from_properties([("bootstrap.servers", "x:1")])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"fetch_max_bytes.*int32"):
        from_properties({"fetch.max.bytes": str(2**31)})


# ------------------------------------------------------------------ arguments (no broker needed)


BAD_TIMEOUTS = ["1", b"1", True, -1, -0.5, math.nan, [1]]


@pytest.mark.anyio
@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
async def test_getmany_refuses_a_bad_timeout_naming_it(timeout: Any) -> None:
    c: Consumer[Any, Any] = Consumer()
    kind = ConfigError if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else ConfigTypeError
    with pytest.raises(kind, match=r"getmany\(\): timeout"):
        await c.getmany(timeout=timeout)
    with pytest.raises(kind, match=r"close\(\): timeout"):
        await c.close(timeout)


@pytest.mark.anyio
async def test_the_timeout_of_every_call_is_checked_first() -> None:
    c: Consumer[Any, Any] = Consumer(group_id="g")
    tp = TopicPartition("t", 0)
    calls = {
        "position": lambda: c.position(tp, timeout="1"),
        "beginning_offsets": lambda: c.beginning_offsets([tp], timeout="1"),
        "end_offsets": lambda: c.end_offsets([tp], timeout="1"),
        "offsets_for_times": lambda: c.offsets_for_times({tp: 0}, timeout="1"),
        "commit": lambda: c.commit({tp: 1}, timeout="1"),
        "committed": lambda: c.committed(tp, timeout="1"),
        "topics": lambda: c.topics(timeout="1"),
        "partitions_for_topic": lambda: c.partitions_for_topic("t", timeout="1"),
        "unsubscribe": lambda: c.unsubscribe(timeout="1"),
    }
    for name, call in calls.items():
        with pytest.raises(ConfigTypeError, match=rf"{name}\(\): timeout"):
            await call()
    # a good timeout gets past the check (and then finds the consumer not started)
    with pytest.raises(IllegalStateError):
        await c.topics(timeout=math.inf)


BAD_PARTITIONS: list[tuple[Any, type[Exception], str]] = [
    (TopicPartition(b"t", 0), ConfigTypeError, "must be a str"),  # type: ignore[arg-type]
    (TopicPartition("t", "0"), ConfigTypeError, "must be an int"),  # type: ignore[arg-type]
    (TopicPartition("t", True), ConfigTypeError, "must be an int"),  # type: ignore[arg-type]
    (TopicPartition("t", -1), ConfigError, "between 0 and"),
    (TopicPartition("t", 2**31), ConfigError, "between 0 and"),
    (TopicPartition("", 0), ConfigError, "not a valid Kafka topic name"),
    (TopicPartition("a b", 0), ConfigError, "not a valid Kafka topic name"),
    (TopicPartition("t" * 250, 0), ConfigError, "not a valid Kafka topic name"),
    (TopicPartition("..", 0), ConfigError, "not a valid Kafka topic name"),
    (("t", 0), ConfigTypeError, "expected a TopicPartition"),
]


@pytest.mark.parametrize(("tp", "kind", "message"), BAD_PARTITIONS, ids=lambda v: repr(v)[:40])
def test_assign_refuses_a_bad_topic_partition_at_the_call(tp: Any, kind: type[Exception], message: str) -> None:
    c: Consumer[Any, Any] = Consumer()
    with pytest.raises(kind, match=message) as info:
        c.assign([TopicPartition("ok", 0), tp])
    assert "assign()" in str(info.value)


def test_topic_partition_limits_are_accepted() -> None:
    from asyncconsumer._args import check_topic_partitions

    good = [TopicPartition("t" * 249, INT32_MAX), TopicPartition("a.b_c-D9", 0), TopicPartition("...", 1)]
    assert check_topic_partitions(good, "assign") == good


@pytest.mark.anyio
async def test_other_arguments_are_checked_and_named() -> None:
    c: Consumer[Any, Any] = Consumer(group_id="g")
    tp = TopicPartition("t", 0)
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: c.getmany(max_records="5"), ConfigTypeError, r"getmany\(\): max_records"),
        (lambda: c.getmany(max_records=2**31), ConfigError, r"getmany\(\): max_records"),
        (lambda: c.getmany(tp, b"x"), ConfigTypeError, r"getmany\(\): expected a TopicPartition"),
        (lambda: c.seek(tp, "1"), ConfigTypeError, r"seek\(\): offset"),
        (lambda: c.seek(tp, 2**63), ConfigError, r"seek\(\): offset"),
        (lambda: c.seek(tp, -1), ConfigError, r"seek\(\): offset"),
        (lambda: c.commit({tp: 2**63}), ConfigError, r"commit\(\): offset for t-0"),
        (lambda: c.commit({tp: "1"}), ConfigTypeError, r"commit\(\): offset for t-0"),
        (lambda: c.commit([tp]), ConfigTypeError, r"commit\(\): offsets must be a mapping"),
        (lambda: c.commit({tp: OffsetAndMetadata(1, "m" * 40000)}), ConfigError, r"metadata for t-0"),
        (lambda: c.commit({tp: OffsetAndMetadata(1, b"m")}), ConfigTypeError, r"metadata for t-0"),
        (lambda: c.commit({tp: OffsetAndMetadata(1, "", 2**31)}), ConfigError, r"leader_epoch for t-0"),
        (lambda: c.offsets_for_times({tp: "0"}), ConfigTypeError, r"offsets_for_times\(\): timestamp"),
        (lambda: c.offsets_for_times({tp: 2**63}), ConfigError, r"offsets_for_times\(\): timestamp"),
        (lambda: c.partitions_for_topic(b"t"), ConfigTypeError, r"partitions_for_topic\(\): topic"),
        (lambda: c.beginning_offsets("t-0"), ConfigTypeError, r"beginning_offsets\(\): expected TopicPartition"),
    ]
    wrong = []
    for call, kind, message in cases:
        try:
            await call()
        except kind as exc:
            if not re.search(message, str(exc)):
                wrong.append((message, exc))
        except Exception as exc:
            wrong.append((message, exc))
        else:
            wrong.append((message, None))
    assert not wrong, wrong
    sync_cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: c.subscribe([b"t"]), ConfigTypeError, r"subscribe\(\): topic must be a str"),
        (lambda: c.subscribe(["bad topic"]), ConfigError, r"subscribe\(\): topic 'bad topic'"),
        (lambda: c.subscribe(pattern=re.compile(b"t.*")), ConfigTypeError, r"bytes pattern"),
        (lambda: c.subscribe(pattern=5), ConfigTypeError, r"pattern must be a str"),
        (lambda: c.partitions(buffer_records="50"), ConfigTypeError, r"partitions\(\): buffer_records"),
        (lambda: c.partitions(buffer_records=0), ConfigError, r"partitions\(\): buffer_records"),
        (lambda: c.batches(max_records=1.5), ConfigTypeError, r"batches\(\): max_records"),
        (lambda: c.pause([tp]), ConfigError, r"expected a TopicPartition"),
    ]
    for call, kind, message in sync_cases:
        try:
            call()
        except kind as exc:
            assert re.search(message, str(exc)), (message, exc)
        except IllegalStateError:
            # pause() checks that the consumer is running first; the argument check follows it
            assert "pause" in message or "expected a TopicPartition" in message
        else:
            raise AssertionError(f"no error for {message}")


# ------------------------------------------------------------------ against a broker: the loop lives on


@pytest.mark.anyio
async def test_bad_arguments_leave_a_running_consumer_working(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, b"%d" % i) for i in range(5)])
    tp = TopicPartition(topic, 0)
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **FAST) as c:
        with pytest.raises(ConfigTypeError, match=r"assign\(\).*must be a str"):
            c.assign([tp, TopicPartition(topic.encode(), 0)])  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"assign\(\).*between 0 and"):
            c.assign([TopicPartition(topic, 2**31)])
        c.assign([tp])
        for bad in (TopicPartition(b"x", 0), TopicPartition(topic, -1)):
            with pytest.raises(ConfigError):
                c.pause(bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError):
                await c.seek(bad, 0)  # type: ignore[arg-type]
        with pytest.raises(ConfigTypeError, match=r"getmany\(\): timeout"):
            await c.getmany(timeout="1")
        with pytest.raises(ConfigError, match=r"seek\(\): offset"):
            await c.seek(tp, 2**63)
        got: list[bytes | None] = []
        with anyio.fail_after(20):
            while len(got) < 5:
                for records in (await c.getmany(timeout=1)).values():
                    got.extend(r.value for r in records)
        assert got == [b"%d" % i for i in range(5)]
        assert topic in await c.topics(timeout=10)


@pytest.mark.anyio
async def test_a_value_the_broker_refuses_is_reported_at_the_next_poll(apache_kafka: Any) -> None:
    # session_timeout_ms at the int32 limit can be sent, but Apache Kafka refuses anything past
    # group.max.session.timeout.ms (30 min): the member cannot join, and says so at the next
    # poll with a typed error instead of retrying silently
    import uuid

    from support.producer import create_topic

    from asyncconsumer.errors import InvalidSessionTimeoutError

    bootstrap = str(apache_kafka.bootstrap)
    topic = create_topic(bootstrap, f"limits-{uuid.uuid4().hex[:12]}")
    options: dict[str, Any] = {**FAST, "group_id": f"g-{uuid.uuid4().hex[:12]}", "session_timeout_ms": INT32_MAX}
    async with Consumer(bootstrap_servers=bootstrap, **options) as c:
        c.subscribe([topic])
        with anyio.fail_after(60), pytest.raises(InvalidSessionTimeoutError, match="JoinGroup"):
            while True:
                await c.getmany(timeout=1)
