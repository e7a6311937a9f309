"""Tests for the Kafka message codec (asyncconsumer.protocol.api).

Round trips are property-based, with bodies generated from the schema literals
for every message and version; byte-level tests check hand-built encodings
taken from the protocol description.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from asyncconsumer.errors import ProtocolError
from asyncconsumer.protocol import messages
from asyncconsumer.protocol._schemas import SCHEMAS
from asyncconsumer.protocol.api import (
    API_KEYS,
    API_NAMES,
    CLIENT_MAX_VERSIONS,
    SUPPORTED_VERSIONS,
    ProtocolDecodeError,
    ProtocolEncodeError,
    broker_release,
    decode_data,
    decode_request,
    decode_response,
    encode_data,
    encode_request,
    encode_response,
    peek_correlation_id,
    peek_request_header,
)

Field = dict[str, Any]


# --- schema-driven strategies ------------------------------------------------------------


def _in(versions: tuple[int, int | None] | None, v: int) -> bool:
    return versions is not None and versions[0] <= v and (versions[1] is None or v <= versions[1])


def _default(f: Field) -> Any:
    d = f["default"]
    if d is None:
        return None
    if f["type"].startswith("[]"):
        return []
    if "fields" in f:
        return {sf["key"]: _default(sf) for sf in f["fields"]}
    return d


_INT_RANGES = {
    "int8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
}


def _scalar(ftype: str) -> st.SearchStrategy[Any]:
    if ftype in _INT_RANGES:
        bits = _INT_RANGES[ftype]
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if ftype == "uint16":
        return st.integers(0, 0xFFFF)
    if ftype == "uint32":
        return st.integers(0, 0xFFFFFFFF)
    if ftype == "bool":
        return st.booleans()
    if ftype == "float64":
        return st.floats(allow_nan=False)
    if ftype == "uuid":
        return st.binary(min_size=16, max_size=16)
    if ftype == "string":
        return st.text(max_size=12)
    if ftype in ("bytes", "records"):
        return st.binary(max_size=24)
    raise AssertionError(ftype)


def _value(f: Field, v: int) -> st.SearchStrategy[Any]:
    ftype: str = f["type"]
    if ftype.startswith("[]"):
        elem = _body(f["fields"], v) if "fields" in f else _scalar(ftype[2:])
        s: st.SearchStrategy[Any] = st.lists(elem, max_size=2)
    elif "fields" in f:
        s = _body(f["fields"], v)
    else:
        s = _scalar(ftype)
    return st.one_of(st.none(), s) if _in(f["nullable_versions"], v) else s


def _body(fields: tuple[Field, ...], v: int) -> st.SearchStrategy[dict[str, Any]]:
    """Present fields: any value (key sometimes omitted).  Absent fields: sometimes given,
    with the default or, when ignorable, anything -- the encoder must drop them."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields:
        if _in(f["versions"], v):
            optional[f["key"]] = _value(f, v)
        elif f["ignorable"]:
            optional[f["key"]] = _value(f, f["versions"][0])
        else:
            optional[f["key"]] = st.just(_default(f))
    return st.fixed_dictionaries({}, optional=optional)


def _expected(fields: tuple[Field, ...], v: int, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        key = f["key"]
        if not _in(f["versions"], v) or key not in body:
            out[key] = _default(f)
            continue
        value = body[key]
        if value is not None and "fields" in f:
            if f["type"].startswith("[]"):
                value = [_expected(f["fields"], v, item) for item in value]
            else:
                value = _expected(f["fields"], v, value)
        out[key] = value
    return out


def _plain(obj: Any) -> Any:
    """Decoded output with memoryviews turned into bytes; also checks only plain types leak."""
    if isinstance(obj, memoryview):
        return obj.tobytes()
    if isinstance(obj, dict):
        assert type(obj) is dict
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        assert type(obj) is list
        return [_plain(v) for v in obj]
    assert obj is None or type(obj) in (int, bool, str, bytes, float), type(obj)
    return obj


def _cases(kind: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for name, s in SCHEMAS.items():
        if s["type"] == kind:
            lo, hi = s["valid_versions"]
            out.extend((name, v) for v in range(lo, hi + 1))
    return out


_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize(("name", "version"), _cases("request"))
@_SETTINGS
@given(data=st.data())
def test_request_round_trip(name: str, version: int, data: st.DataObject) -> None:
    fields = SCHEMAS[name]["fields"]
    body = data.draw(_body(fields, version))
    correlation_id = data.draw(st.integers(-(2**31), 2**31 - 1))
    client_id = data.draw(st.one_of(st.none(), st.text(max_size=10)))
    api = name.removesuffix("Request")
    frame = encode_request(api, version, body, correlation_id=correlation_id, client_id=client_id)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert peek_request_header(frame[4:]) == (API_KEYS[api], version, correlation_id)
    header, decoded = decode_request(api, version, frame[4:])
    assert header["correlation_id"] == correlation_id
    assert header["client_id"] == client_id
    assert _plain(decoded) == _expected(fields, version, body)


@pytest.mark.parametrize(("name", "version"), _cases("response"))
@_SETTINGS
@given(data=st.data())
def test_response_round_trip(name: str, version: int, data: st.DataObject) -> None:
    fields = SCHEMAS[name]["fields"]
    body = data.draw(_body(fields, version))
    correlation_id = data.draw(st.integers(-(2**31), 2**31 - 1))
    api = name.removesuffix("Response")
    frame = encode_response(api, version, body, correlation_id=correlation_id)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert peek_correlation_id(frame[4:]) == correlation_id
    assert _plain(decode_response(api, version, memoryview(frame)[4:])) == _expected(fields, version, body)


@pytest.mark.parametrize(("name", "version"), _cases("data"))
@_SETTINGS
@given(data=st.data())
def test_data_round_trip(name: str, version: int, data: st.DataObject) -> None:
    fields = SCHEMAS[name]["fields"]
    body = data.draw(_body(fields, version))
    got_version, decoded = decode_data(name, encode_data(name, version, body))
    assert got_version == version
    assert _plain(decoded) == _expected(fields, version, body)


def test_every_api_is_covered() -> None:
    wanted = {
        "ApiVersions": 18, "Metadata": 3, "FindCoordinator": 10, "Fetch": 1, "ListOffsets": 2,
        "OffsetCommit": 8, "OffsetFetch": 9, "JoinGroup": 11, "SyncGroup": 14, "Heartbeat": 12,
        "LeaveGroup": 13, "ConsumerGroupHeartbeat": 68, "ConsumerGroupDescribe": 69,
        "OffsetForLeaderEpoch": 23, "SaslHandshake": 17, "SaslAuthenticate": 36, "CreateTopics": 19,
        "Produce": 0, "InitProducerId": 22,
        # Kafka 4.x era (messages-2026): admin calls for tests and tools, telemetry, share groups.
        "CreatePartitions": 37, "DeleteTopics": 20, "DescribeCluster": 60, "GetTelemetrySubscriptions": 71,
        "PushTelemetry": 72, "ShareGroupHeartbeat": 76, "ShareGroupDescribe": 77, "ShareFetch": 78,
        "ShareAcknowledge": 79, "DescribeShareGroupOffsets": 90,
    }  # fmt: skip
    assert wanted == API_KEYS
    assert {v: k for k, v in wanted.items()} == API_NAMES
    # Kafka 4.0 dropped the oldest versions (KIP-896): the definitions start there.
    assert SUPPORTED_VERSIONS["Fetch"] == (4, 17)
    assert SUPPORTED_VERSIONS["ListOffsets"] == (1, 10)
    assert SUPPORTED_VERSIONS["ApiVersions"] == (0, 5)  # v5 only with a cluster and node to check (KIP-1242)
    assert SUPPORTED_VERSIONS["ShareFetch"] == (1, 2)


def test_client_max_versions_cap_what_is_negotiated() -> None:
    for api, cap in CLIENT_MAX_VERSIONS.items():
        lo, hi = SCHEMAS[api + "Request"]["valid_versions"]
        assert lo <= cap <= hi, api
        assert SUPPORTED_VERSIONS[api] == (lo, cap)
    # v1 (KIP-1082: the client makes its member id; SubscribedTopicRegex) is negotiated: the
    # KIP-848 member sends its own id from the first heartbeat.
    assert SCHEMAS["ConsumerGroupHeartbeatRequest"]["valid_versions"] == (0, 1)
    assert SUPPORTED_VERSIONS["ConsumerGroupHeartbeat"] == (0, 1)


# --- byte-level tests --------------------------------------------------------------------


def _str16(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    data = s.encode()
    return struct.pack(">h", len(data)) + data


def _cstr(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    data = s.encode()
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def test_api_versions_v0_request_bytes() -> None:
    expected = _framed(struct.pack(">hhi", 18, 0, 42) + _str16("cli"))
    assert encode_request("ApiVersions", 0, {}, correlation_id=42, client_id="cli") == expected
    header, body = decode_request("ApiVersions", 0, expected[4:])
    assert header == {
        "request_api_key": 18, "request_api_version": 0, "correlation_id": 42, "client_id": "cli"
    }  # fmt: skip
    # v5's fields (KIP-1242) read back as their defaults
    assert body == {"client_software_name": "", "client_software_version": "", "cluster_id": None, "node_id": -1}


def test_null_client_id_and_flexible_header_keeps_int16_client_id() -> None:
    # Request header v2: ClientId keeps its int16 length; then an empty tag section.
    frame = encode_request(
        "ApiVersions", 3, {"client_software_name": "ac", "client_software_version": "1"},
        correlation_id=1, client_id=None,
    )  # fmt: skip
    assert (
        frame[4:]
        == struct.pack(">hhi", 18, 3, 1) + _str16(None) + b"\x00" + _cstr("ac") + _cstr("1") + b"\x00"
    )


def test_metadata_v12_request_bytes() -> None:
    topic_id = bytes(range(16))
    body = {
        "topics": [{"topic_id": topic_id, "name": "orders"}, {"topic_id": bytes(16), "name": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": True,
    }
    header = struct.pack(">hhi", 3, 12, 7) + _str16("c") + b"\x00"
    topics = (
        b"\x03"  # compact array: 2 elements + 1
        + topic_id + _cstr("orders") + b"\x00"
        + bytes(16) + _cstr(None) + b"\x00"
    )  # fmt: skip
    expected = _framed(header + topics + b"\x00" + b"\x01" + b"\x00")
    assert encode_request("Metadata", 12, body, correlation_id=7, client_id="c") == expected
    _, decoded = decode_request("Metadata", 12, expected[4:])
    assert decoded["topics"] == body["topics"]
    assert decoded["allow_auto_topic_creation"] is False
    assert decoded["include_cluster_authorized_operations"] is False  # absent in v12: default


def _api_versions_v3_body(tags: bytes) -> bytes:
    return (
        struct.pack(">h", 0)
        + b"\x03"  # two api keys
        + struct.pack(">hhh", 1, 0, 17) + b"\x00"
        + struct.pack(">hhh", 18, 0, 4) + b"\x00"
        + struct.pack(">i", 10)
        + tags
    )  # fmt: skip


def test_api_versions_v3_response_uses_header_v0() -> None:
    body = _api_versions_v3_body(b"\x00")
    frame = struct.pack(">i", 99) + body  # no tag section after the correlation id
    decoded = decode_response("ApiVersions", 3, frame)
    assert decoded["api_keys"] == [
        {"api_key": 1, "min_version": 0, "max_version": 17},
        {"api_key": 18, "min_version": 0, "max_version": 4},
    ]
    assert decoded["throttle_time_ms"] == 10
    assert decoded["finalized_features_epoch"] == -1  # tagged, absent: default
    assert decoded["supported_features"] == []
    assert encode_response("ApiVersions", 3, decoded, correlation_id=99) == _framed(frame)


def test_flexible_response_uses_header_v1() -> None:
    frame = encode_response("Heartbeat", 4, {"error_code": 27}, correlation_id=5)
    assert frame == _framed(struct.pack(">i", 5) + b"\x00" + struct.pack(">ih", 0, 27) + b"\x00")


def test_unknown_tagged_field_is_skipped() -> None:
    tags = (
        b"\x02"
        + b"\x01\x08" + struct.pack(">q", 12345)  # tag 1: FinalizedFeaturesEpoch
        + b"\x63\x03" + b"xyz"  # tag 99: unknown, 3 bytes
    )  # fmt: skip
    frame = struct.pack(">i", 1) + _api_versions_v3_body(tags)
    decoded = decode_response("ApiVersions", 3, frame)
    assert decoded["finalized_features_epoch"] == 12345
    assert decoded["zk_migration_ready"] is False


def test_tagged_fields_written_only_when_not_default() -> None:
    base = {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}
    plain = encode_response("ApiVersions", 3, base, correlation_id=0)
    assert plain.endswith(b"\x01" + bytes(4) + b"\x00")
    tagged = encode_response("ApiVersions", 3, {**base, "zk_migration_ready": True}, correlation_id=0)
    assert tagged.endswith(bytes(4) + b"\x01" + b"\x03\x01\x01")


def test_api_versions_unsupported_version_falls_back_to_v0_body() -> None:
    # An old broker answers UNSUPPORTED_VERSION (35) to our v3 request in v0 format.
    frame = struct.pack(">ih", 8, 35) + struct.pack(">i", 1) + struct.pack(">hhh", 18, 0, 2)
    decoded = decode_response("ApiVersions", 3, frame)
    assert decoded["error_code"] == 35
    assert decoded["api_keys"] == [{"api_key": 18, "min_version": 0, "max_version": 2}]


def test_nullable_struct_field() -> None:
    common = struct.pack(">ih", 0, 0) + _cstr(None) + _cstr("m") + struct.pack(">ii", 3, 5000)
    null_frame = struct.pack(">i", 1) + b"\x00" + common + b"\xff" + b"\x00"
    decoded = decode_response("ConsumerGroupHeartbeat", 0, null_frame)
    assert decoded["assignment"] is None
    assert decoded["member_id"] == "m"
    tid = bytes(range(16, 32))
    present = b"\x01" + b"\x02" + tid + b"\x03" + struct.pack(">ii", 0, 4) + b"\x00" + b"\x00"
    frame = struct.pack(">i", 1) + b"\x00" + common + present + b"\x00"
    decoded = decode_response("ConsumerGroupHeartbeat", 0, frame)
    assert decoded["assignment"] == {"topic_partitions": [{"topic_id": tid, "partitions": [0, 4]}]}
    assert encode_response("ConsumerGroupHeartbeat", 0, decoded, correlation_id=1) == _framed(frame)


def test_subscription_v3_and_assignment_v0_bytes() -> None:
    sub = {
        "topics": ["a", "b"],
        "user_data": None,
        "owned_partitions": [{"topic": "a", "partitions": [1, 2]}],
        "generation_id": 4,
        "rack_id": "r1",
    }
    expected = (
        struct.pack(">h", 3)
        + struct.pack(">i", 2) + _str16("a") + _str16("b")
        + struct.pack(">i", -1)
        + struct.pack(">i", 1) + _str16("a") + struct.pack(">iii", 2, 1, 2)
        + struct.pack(">i", 4)
        + _str16("r1")
    )  # fmt: skip
    assert encode_data("ConsumerProtocolSubscription", 3, sub) == expected
    assert decode_data("ConsumerProtocolSubscription", expected) == (3, sub)

    assignment = (
        struct.pack(">hi", 0, 1) + _str16("t") + struct.pack(">ii", 1, 9) + struct.pack(">i", 2) + b"ud"
    )
    version, body = decode_data("ConsumerProtocolAssignment", assignment)
    assert version == 0
    assert body == {"assigned_partitions": [{"topic": "t", "partitions": [9]}], "user_data": b"ud"}
    assert encode_data("ConsumerProtocolAssignment", 0, body) == assignment


def test_subscription_v0_fills_defaults() -> None:
    data = struct.pack(">hi", 0, 1) + _str16("x") + struct.pack(">i", -1)
    assert decode_data("ConsumerProtocolSubscription", data) == (
        0, {"topics": ["x"], "user_data": None, "owned_partitions": [], "generation_id": -1, "rack_id": None},
    )  # fmt: skip


def test_newer_data_version_parses_with_highest_known() -> None:
    v3 = encode_data("ConsumerProtocolSubscription", 3, {"topics": ["t"], "rack_id": "r"})
    newer = struct.pack(">h", 7) + v3[2:] + b"future fields"
    version, body = decode_data("ConsumerProtocolSubscription", newer)
    assert version == 3
    assert body["topics"] == ["t"]
    assert body["rack_id"] == "r"
    with pytest.raises(ProtocolDecodeError):
        decode_data("ConsumerProtocolSubscription", struct.pack(">h", -1) + v3[2:])


# --- encoding rules ----------------------------------------------------------------------


def test_non_ignorable_field_missing_from_version_raises() -> None:
    # AllowAutoTopicCreation exists from v4, is not ignorable and defaults to true.
    with pytest.raises(ProtocolEncodeError, match=r"allow_auto_topic_creation.*version 3") as info:
        encode_request("Metadata", 3, {"allow_auto_topic_creation": False}, correlation_id=0, client_id=None)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ProtocolError)
    # The default value is fine, and so is an ignorable field (SessionId is v7+).
    encode_request("Metadata", 3, {"allow_auto_topic_creation": True}, correlation_id=0, client_id=None)
    frame = encode_request("Fetch", 6, {"session_id": 1000}, correlation_id=0, client_id=None)
    assert decode_request("Fetch", 6, frame[4:])[1]["session_id"] == 0


def test_nested_non_ignorable_field_raises() -> None:
    body = {"topics": [{"topic": "t", "partitions": [{"partition": 0, "last_fetched_epoch": 3}]}]}
    with pytest.raises(ProtocolEncodeError, match=r"topics\[\]\.partitions\[\]\.last_fetched_epoch"):
        encode_request("Fetch", 11, body, correlation_id=0, client_id=None)
    encode_request("Fetch", 12, body, correlation_id=0, client_id=None)


@pytest.mark.parametrize(
    ("api", "version", "body"),
    [
        ("Heartbeat", 0, {"group_id": None}),  # null in a non-nullable string
        ("Heartbeat", 0, {"generation_id": 2**31}),  # int32 overflow
        ("Heartbeat", 0, {"group_id": 5}),  # wrong type
        ("Heartbeat", 0, {"no_such_field": 1}),  # typo protection
        ("Heartbeat", 0, {"group_id": "x" * 40000}),  # too long for an int16 length
        ("Fetch", 4, {"topics": [{"partitions": "nope"}]}),
        ("Fetch", 4, {"topics": [5]}),
        ("Heartbeat", 9, {}),  # unknown version
        ("NoSuchApi", 0, {}),
    ],
)
def test_bad_bodies_raise_encode_error(api: str, version: int, body: dict[str, Any]) -> None:
    with pytest.raises(ProtocolEncodeError):
        encode_request(api, version, body, correlation_id=0, client_id=None)


# --- malformed input ---------------------------------------------------------------------


def _fetch_response(version: int) -> bytes:
    body: dict[str, Any] = {
        "responses": [
            {
                "topic": "t",
                "topic_id": bytes(range(16)),
                "partitions": [
                    {
                        "partition_index": 0,
                        "aborted_transactions": [{"producer_id": 1, "first_offset": 2}],
                        "records": b"r" * 30,
                    }
                ],
            }
        ],
        "node_endpoints": [{"node_id": 1, "host": "h", "port": 9092}] if version >= 16 else [],
    }
    if version >= 12:  # tagged fields: exercise the tag section too
        body["responses"][0]["partitions"][0]["current_leader"] = {"leader_id": 1, "leader_epoch": 2}
    return encode_response("Fetch", version, body, correlation_id=3)[4:]


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_truncated_frames_raise_protocol_error(version: int) -> None:
    frame = _fetch_response(version)
    decode_response("Fetch", version, frame)
    for cut in range(len(frame)):
        with pytest.raises(ProtocolDecodeError):
            decode_response("Fetch", version, frame[:cut])


def test_truncated_request_and_data_raise_protocol_error() -> None:
    frame = encode_request(
        "JoinGroup", 9, {"protocols": [{"name": "range"}]}, correlation_id=1, client_id="c"
    )
    for cut in range(4, len(frame) - 1):
        with pytest.raises(ProtocolDecodeError):
            decode_request("JoinGroup", 9, frame[4:cut])
    data = encode_data("ConsumerProtocolAssignment", 1, {"assigned_partitions": [{"topic": "t"}]})
    for cut in range(len(data)):
        with pytest.raises(ProtocolDecodeError):
            decode_data("ConsumerProtocolAssignment", data[:cut])
    with pytest.raises(ProtocolDecodeError):
        peek_correlation_id(b"\x00\x01")


def test_malformed_values_raise_protocol_error() -> None:
    def resp(body: bytes) -> bytes:
        return struct.pack(">i", 0) + body

    cases = [
        ("SaslHandshake", 0, resp(struct.pack(">hi", 0, 1) + b"\xff\xff")),  # null non-nullable string
        ("SaslHandshake", 0, resp(struct.pack(">hi", 0, 1) + b"\x00\x02\xc3\x28")),  # bad UTF-8
        ("SaslHandshake", 0, resp(struct.pack(">hi", 0, 10**9))),  # absurd array count
        ("SaslHandshake", 0, resp(struct.pack(">hi", 0, -2))),  # negative count
        ("Heartbeat", 4, resp(b"\x00" + bytes(6) + b"\xff\xff\xff\xff\xff\xff")),  # varint too long
        ("Heartbeat", 4, resp(b"\x00" + bytes(6) + b"\x01\x05\x09xx")),  # unknown tag overruns frame
        ("ApiVersions", 0, b"\x00"),
    ]
    for api, version, frame in cases:
        with pytest.raises(ProtocolDecodeError, match=f"{api} v{version}"):
            decode_response(api, version, frame)


def test_request_header_mismatch_raises() -> None:
    frame = encode_request("Heartbeat", 1, {}, correlation_id=1, client_id=None)
    with pytest.raises(ProtocolDecodeError, match="header says"):
        decode_request("Heartbeat", 2, frame[4:])


@settings(max_examples=300, deadline=None, database=None)
@given(garbage=st.binary(max_size=64), version=st.sampled_from([0, 7, 12, 17]))
def test_garbage_never_escapes_as_another_exception(garbage: bytes, version: int) -> None:
    for call in (
        lambda: decode_response("Fetch", version, garbage),
        lambda: decode_response("Metadata", 12, garbage),
        lambda: decode_request("Fetch", version, garbage),
        lambda: decode_data("ConsumerProtocolSubscription", garbage),
    ):
        try:
            call()
        except ProtocolError:
            pass


# --- records: zero copy and speed ----------------------------------------------------------


def test_records_are_zero_copy_views_of_the_frame() -> None:
    records = os.urandom(100_000)
    for version in (4, 12, 17):
        body = {"responses": [{"topic": "t", "partitions": [{"partition_index": 0, "records": records}]}]}
        frame = bytearray(encode_response("Fetch", version, body, correlation_id=1))
        frame_view = memoryview(frame)[4:]
        got = decode_response("Fetch", version, frame_view)["responses"][0]["partitions"][0]["records"]
        assert isinstance(got, memoryview)
        assert got.obj is frame  # a slice of the caller's buffer, not a copy
        assert got == records
        start = bytes(frame).find(records)
        frame[start] ^= 0xFF  # a write to the frame shows through: the bytes are shared
        assert got[0] == frame[start] != records[0]
        by_bytes = decode_response("Fetch", version, bytes(frame_view))
        assert by_bytes["responses"][0]["partitions"][0]["records"].obj is not frame


def test_records_accept_bytes_memoryview_none() -> None:
    for value in (b"abc", memoryview(b"xabc")[1:], None):
        body = {"topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": value}]}]}
        frame = encode_request("Produce", 9, body, correlation_id=1, client_id=None)
        got = decode_request("Produce", 9, frame[4:])[1]["topic_data"][0]["partition_data"][0]["records"]
        assert (got is None) if value is None else (bytes(got) == b"abc")


def test_fetch_decode_speed() -> None:
    records = os.urandom(1_000_000)
    partitions = [
        {"partition_index": i, "high_watermark": 10, "records": records,
         "aborted_transactions": [{"producer_id": 1, "first_offset": 0}]}
        for i in range(4)
    ]  # fmt: skip
    frame = memoryview(
        encode_response("Fetch", 16, {"responses": [{"partitions": partitions}]}, correlation_id=1)
    )
    frame = frame[4:]
    decode_response("Fetch", 16, frame)  # warm the struct cache
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        decode_response("Fetch", 16, frame)
    per_call = (time.perf_counter() - start) / rounds
    print(f"Fetch v16 response, 4 x 1 MB partitions: {per_call * 1e6:.0f} us per decode")
    assert per_call < 0.005  # target is well under 1 ms; generous bound for slow CI machines


@pytest.mark.parametrize(
    ("ours", "fmt", "values"),
    [
        ("INT8", "b", [-128, 0, 127]),
        ("INT16", "h", [-(2**15), 7, 2**15 - 1]),
        ("UINT16", "H", [0, 2**16 - 1]),
        ("INT32", "l", [-(2**31), 1, 2**31 - 1]),
        ("UINT32", "L", [0, 2**32 - 1]),
        ("INT64", "q", [-(2**63), 5, 2**63 - 1]),
        ("FLOAT64", "d", [0.0, -1.5, 1e300]),
    ],
)
def test_fixed_width_numbers_are_constructs_own(ours: str, fmt: str, values: list[Any]) -> None:
    """The codec's fixed-width numbers read from a frame's view and write with a precompiled
    struct: the same values, bytes and errors as construct's FormatField, on every stream."""
    import io

    from construct import FormatField

    from asyncconsumer.protocol import primitives
    from asyncconsumer.protocol.primitives import FrameReader

    field, reference = getattr(primitives, ours), FormatField(">", fmt)
    for value in values:
        data = reference.build(value)
        assert field.build(value) == data
        for stream in (FrameReader(b"\x00" + data + b"\x01"), io.BytesIO(b"\x00" + data + b"\x01")):
            stream.read(1)
            assert field._parse(stream, None, "") == value and stream.tell() == 1 + len(data)
    for bad in (None, "1", 2**64 if fmt != "d" else "x"):
        expected = _raised(reference.build, bad)
        with pytest.raises(type(expected)) as got:
            field.build(bad)
        assert str(got.value) == str(expected)
    short = reference.build(values[0])[:-1]
    for stream_of in (FrameReader, io.BytesIO):
        expected = _raised(reference._parse, stream_of(short), None, "(path)")
        with pytest.raises(type(expected)) as got:
            field._parse(stream_of(short), None, "(path)")
        assert str(got.value) == str(expected)


def _raised(call: Any, *args: Any) -> BaseException:
    try:
        call(*args)
    except Exception as exc:
        return exc
    raise AssertionError("expected an error")


# -- the defaults a decoded message fills in -------------------------------------------------------


def _all_fields(fields: list[Field]) -> list[Field]:
    out: list[Field] = []
    for f in fields:
        out.append(f)
        out.extend(_all_fields(f.get("fields", [])))
    return out


def _containers(value: Any) -> list[Any]:
    """``value`` and every list or dict inside it."""
    if isinstance(value, dict):
        return [value, *(c for v in value.values() for c in _containers(v))]
    if isinstance(value, list):
        return [value, *(c for v in value for c in _containers(v))]
    return []


def test_default_factories_make_default_values_fresh_each_time() -> None:
    # Every field of every message: the factory a struct keeps makes what default_value makes, and
    # no list or dict of one default is shared with another (a caller may mutate what it decoded).
    fields = [f for s in SCHEMAS.values() for f in _all_fields(s["fields"])]
    assert any("fields" in f and f["default"] is not None for f in fields)  # structs with defaults exist
    for f in fields:
        make = messages.default_factory(f)
        one, two = make(), make()
        assert one == two == messages.default_value(f), f["name"]
        assert type(one) is type(messages.default_value(f))
        shared = {id(c) for c in _containers(one)} & {id(c) for c in _containers(two)}
        assert not shared, f["name"]


def test_decoded_absent_tagged_structs_are_not_shared() -> None:
    # Fetch responses whose partitions leave out the tagged structs (diverging_epoch, current_leader,
    # snapshot_id): each decoded partition gets defaults of its own.
    partition = {"partition_index": 0, "records": b""}
    body = {"responses": [{"topic_id": b"\x01" * 16, "partitions": [partition, {**partition, "partition_index": 1}]}]}
    frame = encode_response("Fetch", 17, body, correlation_id=5)
    first, second = (decode_response("Fetch", 17, frame[4:])["responses"][0]["partitions"] for _ in range(2))
    first[0]["current_leader"]["leader_id"] = 7
    assert [p["current_leader"]["leader_id"] for p in (*first[1:], *second)] == [-1, -1, -1]


# -- varints: a frame's view and any other stream read them alike ------------------------------------


@settings(max_examples=300, deadline=None, database=None)
@given(value=st.integers(0, 2**32 - 1), prefix=st.binary(max_size=3), tail=st.binary(max_size=3))
@example(value=0x7F, prefix=b"", tail=b"")
@example(value=0x80, prefix=b"", tail=b"")
@example(value=2**14, prefix=b"", tail=b"")
@example(value=2**32 - 1, prefix=b"", tail=b"")
def test_varints_read_the_same_from_a_frame_and_a_stream(value: int, prefix: bytes, tail: bytes) -> None:
    import io

    from asyncconsumer.protocol.primitives import FrameReader, read_uvarint, write_uvarint

    out = io.BytesIO()
    write_uvarint(out, value)
    encoded = out.getvalue()
    # LEB128, 7 bits a byte, the high bit set on every byte but the last.
    assert len(encoded) == max(1, -(-value.bit_length() // 7))
    assert all(b & 0x80 for b in encoded[:-1]) and encoded[-1] < 0x80
    data = prefix + encoded + tail
    for stream in (FrameReader(data), io.BytesIO(data)):
        stream.read(len(prefix))
        assert read_uvarint(stream) == value
        assert stream.tell() == len(prefix) + len(encoded)
    for bad, message in ((encoded[:-1], "truncated varint"), (b"\xff" * 5 + b"\x01", "longer than 5 bytes")):
        if not bad:
            continue
        for stream in (FrameReader(bad), io.BytesIO(bad)):
            with pytest.raises(ProtocolDecodeError, match=message):
                read_uvarint(stream)


def test_any_mapping_and_sequence_encode_as_dicts_and_lists_do() -> None:
    from types import MappingProxyType

    body = {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 3]}]}
    topic = MappingProxyType({"name": "t", "partition_indexes": (0, 3)})
    other = MappingProxyType({"group_id": "g", "topics": (topic,)})
    for version in (1, 7):
        assert encode_request("OffsetFetch", version, other, correlation_id=1, client_id="c") == encode_request(
            "OffsetFetch", version, body, correlation_id=1, client_id="c"
        )
    with pytest.raises(ProtocolEncodeError, match="expected a list"):
        encode_request("OffsetFetch", 1, {"group_id": "g", "topics": "t"}, correlation_id=1, client_id="c")
    with pytest.raises(ProtocolEncodeError, match="expected a mapping"):
        encode_request("OffsetFetch", 1, {"group_id": "g", "topics": ["t"]}, correlation_id=1, client_id="c")


@pytest.mark.parametrize(
    ("apis", "fetch", "release"),
    [
        # (ApiVersions, Fetch) ranges as the brokers of these releases answer (measured with KafkaBroker)
        ((0, 5), (4, 18), "Apache Kafka 4.4 or newer"),  # 4.4.0
        ((0, 4), (4, 18), "Apache Kafka 4.1-4.3"),  # 4.1-4.3 (their definitions)
        ((0, 4), (4, 17), "Apache Kafka 4.0"),  # 4.0.2
        ((0, 4), (0, 17), "Apache Kafka 3.9"),  # 3.9.2
        ((0, 3), (0, 16), "Apache Kafka 3.7-3.8"),  # 3.7.2
        ((0, 3), (0, 15), "Apache Kafka 3.6"),
        ((0, 3), (0, 13), "Apache Kafka 3.5 or older"),
        ((0, 0), (0, 0), "Apache Kafka 3.5 or older"),
    ],
)
def test_the_release_a_brokers_api_versions_match(
    apis: tuple[int, int], fetch: tuple[int, int], release: str
) -> None:
    answer = {API_KEYS["ApiVersions"]: apis, API_KEYS["Fetch"]: fetch, API_KEYS["Metadata"]: (0, 12)}
    assert broker_release(answer) == release
    assert broker_release({}) == "Apache Kafka 3.5 or older"


def test_runs_of_fixed_width_fields_name_the_field_that_fails() -> None:
    """Consecutive fixed-width numbers are packed and unpacked by one ``struct`` each (a Fetch
    request's six header fields); a value that does not pack, or a frame that ends inside the run,
    is still reported at the field, as field by field."""
    steps = messages.struct_for("FetchRequest", 17).steps
    runs = [sub.keys for _, sub, _ in steps if isinstance(sub, messages.FixedRun)]
    assert runs == [("max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "session_id", "session_epoch")]
    body = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 2**31, "session_id": 7, "session_epoch": 3}
    with pytest.raises(ProtocolEncodeError, match=r"^cannot encode Fetch v17 request: max_bytes: "):
        encode_request("Fetch", 17, body, correlation_id=1, client_id="c")
    body["max_bytes"] = 1 << 20
    frame = encode_request("Fetch", 17, body, correlation_id=1, client_id="c")
    _, decoded = decode_request("Fetch", 17, frame[4:])
    assert {key: decoded[key] for key in body} == body
    # The request header (v2): correlation id 4 bytes, client id 2 + 1, no tags; then the body,
    # cut inside session_id (max_wait_ms 4, min_bytes 4, max_bytes 4, isolation_level 1).
    cut = 4 + (2 + 2 + 4 + 2 + 1 + 1) + 13 + 2
    with pytest.raises(ProtocolDecodeError, match=r": session_id: "):
        decode_request("Fetch", 17, frame[4:cut])


def test_a_request_header_made_once_carries_each_requests_correlation_id() -> None:
    """The request header is encoded once per api, version and client id; each frame carries its
    own correlation id, and bad ones are refused as before."""
    body = {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
    first = encode_request("ListOffsets", 9, body, correlation_id=1, client_id="é")
    second = encode_request("ListOffsets", 9, body, correlation_id=2**31 - 1, client_id="é")
    assert first[:8] == second[:8] and first[12:] == second[12:]
    assert peek_request_header(second[4:]) == (API_KEYS["ListOffsets"], 9, 2**31 - 1)
    assert decode_request("ListOffsets", 9, first[4:])[0]["client_id"] == "é"
    other = encode_request("ListOffsets", 9, body, correlation_id=1, client_id=None)
    assert decode_request("ListOffsets", 9, other[4:])[0]["client_id"] is None
    with pytest.raises(ProtocolEncodeError, match="correlation_id"):
        encode_request("ListOffsets", 9, body, correlation_id=2**31, client_id="c")
    with pytest.raises(ProtocolEncodeError, match="client_id"):
        encode_request("ListOffsets", 9, body, correlation_id=1, client_id=b"c")  # type: ignore[arg-type]
