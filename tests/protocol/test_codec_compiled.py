"""The compiled message codec (speedups/codec.c) against the Python walks.

``protocol/api.py`` decodes every response and request with the compiled walk when the extension
is there, and falls back to the Python walk when the compiled one does not answer.  So the two must
agree on every frame the compiled one answers for, and it must never answer where the Python one
raises: checked here on bodies generated for every message and version, and on mutated frames.
Encoding likewise: the compiled encoder writes plain bodies only, byte for byte as the Python walk
does, and leaves every other body (and every error) to it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncconsumer.protocol import api, messages, records
from asyncconsumer.protocol._schemas import SCHEMAS
from asyncconsumer.protocol.primitives import DECODE_ERRORS, FrameReader, byte_view

from .test_protocol_codec import _body, _cases, _plain

compiled = api._decode_message
compiled_encode = api._encode_message
pytestmark = pytest.mark.skipif(compiled is None, reason=f"no compiled codec: {records.DECODER_DETAIL}")

_SETTINGS = settings(
    max_examples=10, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _structs(name: str, version: int) -> list[messages.MessageStruct]:
    kind = SCHEMAS[name]["type"]
    if kind == "data":
        return [messages.struct_for(name, version)]
    api_name = name.removesuffix("Request").removesuffix("Response")
    pick = api._request_structs if kind == "request" else api._response_structs
    return list(pick(api_name, version))


def _frame(name: str, version: int, body: dict[str, Any]) -> bytes:
    kind = SCHEMAS[name]["type"]
    if kind == "data":
        return api.encode_data(name, version, body)[2:]  # the struct without the version prefix
    api_name = name.removesuffix("Request").removesuffix("Response")
    if kind == "request":
        return api.encode_request(api_name, version, body, correlation_id=7, client_id="c")[4:]
    return api.encode_response(api_name, version, body, correlation_id=7)[4:]


def _encoded_by_python(monkeypatch: pytest.MonkeyPatch, name: str, version: int, body: dict[str, Any]) -> bytes:
    with monkeypatch.context() as patch:
        patch.setattr(api, "_encode_message", None)
        return _frame(name, version, body)


def _python(structs: list[messages.MessageStruct], frame: bytes | memoryview) -> list[dict[str, Any]] | None:
    """The Python walk alone; None where it raises the codec's error."""
    reader = FrameReader(frame)
    try:
        return [s._parse(reader, None, None) for s in structs]
    except DECODE_ERRORS:
        return None


def _same(structs: list[messages.MessageStruct], frame: bytes | memoryview) -> None:
    ours = compiled(api._programs(*structs), byte_view(frame))
    reference = _python(structs, frame)
    if ours is None:
        assert reference is None, "the compiled walk refused a frame the Python walk reads"
    else:
        assert reference is not None, "the compiled walk read a frame the Python walk refuses"
        assert _plain(ours) == _plain(reference)
        assert [type(b) for b in ours] == [dict] * len(ours)


@pytest.mark.parametrize(("name", "version"), _cases("request") + _cases("response") + _cases("data"))
@_SETTINGS
@given(data=st.data())
def test_both_walks_read_every_message_alike(name: str, version: int, data: st.DataObject) -> None:
    body = data.draw(_body(SCHEMAS[name]["fields"], version))
    frame = _frame(name, version, body)
    structs = _structs(name, version)
    assert compiled(api._programs(*structs), byte_view(frame)) is not None
    _same(structs, frame)


@pytest.mark.parametrize(("name", "version"), [("FetchResponse", v) for v in (4, 11, 12, 13, 16, 17)]
                         + [("MetadataResponse", 12), ("FetchRequest", 17), ("JoinGroupResponse", 9),
                            ("ConsumerGroupHeartbeatResponse", 0), ("ApiVersionsResponse", 3)])
def test_mutated_frames_are_read_alike_or_refused_by_both(name: str, version: int) -> None:
    rng = random.Random(f"{name}-{version}")
    fetch_body = {"responses": [{"topic": "t", "topic_id": b"\x01" * 16, "partitions": [
        {"partition_index": 3, "high_watermark": 10, "aborted_transactions": [{"producer_id": 1, "first_offset": 2}],
         "records": b"r" * 40}]}]}
    body = fetch_body if name == "FetchResponse" else {}
    frame = _frame(name, version, body)
    structs = _structs(name, version)
    for _ in range(400):
        mutated = bytearray(frame)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        cut = rng.choice((len(mutated), rng.randrange(len(mutated) + 1)))
        _same(structs, bytes(mutated[:cut]))


def test_a_fetch_response_is_decoded_by_the_compiled_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = api.encode_response("Fetch", 17, {"session_id": 5, "responses": [
        {"topic_id": b"\x02" * 16, "partitions": [{"partition_index": 1, "records": b"abc"}]}]}, correlation_id=3)

    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python walk ran")

    monkeypatch.setattr(messages.MessageStruct, "_parse", refuse)
    body = api.decode_response("Fetch", 17, memoryview(frame)[4:])
    assert body["session_id"] == 5
    partition = body["responses"][0]["partitions"][0]
    assert bytes(partition["records"]) == b"abc" and isinstance(partition["records"], memoryview)
    assert partition["diverging_epoch"] == {"epoch": -1, "end_offset": -1}


def test_a_frame_the_compiled_walk_refuses_gets_the_python_walks_error() -> None:
    frame = api.encode_response("Fetch", 17, {"responses": [
        {"topic_id": b"\x02" * 16, "partitions": [{"partition_index": 1, "records": b"abc"}]}]}, correlation_id=3)
    structs = _structs("FetchResponse", 17)
    truncated = memoryview(frame)[4:-6]
    assert compiled(api._programs(*structs), byte_view(truncated)) is None
    with pytest.raises(api.ProtocolDecodeError, match=r"cannot decode Fetch v17 response: responses\[\]\.partitions"):
        api.decode_response("Fetch", 17, truncated)


def test_absent_tagged_defaults_are_fresh_per_decode() -> None:
    frame = api.encode_response("Fetch", 17, {"responses": [
        {"topic_id": b"\x02" * 16, "partitions": [{"partition_index": 1}, {"partition_index": 2}]}]},
        correlation_id=3)[4:]
    first, second = (api.decode_response("Fetch", 17, frame)["responses"][0]["partitions"] for _ in range(2))
    assert first[0]["diverging_epoch"] == first[1]["diverging_epoch"]
    assert first[0]["diverging_epoch"] is not first[1]["diverging_epoch"]
    assert first[0]["diverging_epoch"] is not second[0]["diverging_epoch"]


@pytest.mark.parametrize(("name", "version"), _cases("request") + _cases("response"))
@_SETTINGS
@given(data=st.data())
def test_both_encoders_write_the_same_bytes(name: str, version: int, data: st.DataObject) -> None:
    body = data.draw(_body(SCHEMAS[name]["fields"], version))
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = _encoded_by_python(monkeypatch, name, version, body)
    assert _frame(name, version, body) == expected
    structs = _structs(name, version)
    if SCHEMAS[name]["type"] == "response":
        header = {"correlation_id": 7}
    else:
        header = {"request_api_key": api.API_KEYS[name.removesuffix("Request")], "request_api_version": version,
                  "correlation_id": 7, "client_id": "c"}
    ours = compiled_encode(api._programs(*structs), (header, body), b"")
    if ours is not None:  # a plain body (about half the bodies drawn): what the Python walk writes, byte for byte
        assert ours[4:] == expected


def test_a_fetch_request_is_encoded_by_the_compiled_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"max_wait_ms": 500, "min_bytes": 1, "session_id": 3, "session_epoch": 2, "rack_id": "",
            "topics": [{"topic_id": b"\x02" * 16, "partitions": [
                {"partition": 1, "fetch_offset": 10, "current_leader_epoch": 4, "last_fetched_epoch": 4,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": []}
    expected = api.encode_request("Fetch", 17, body, correlation_id=9, client_id="me")

    def refuse(*args: Any) -> Any:
        raise AssertionError("the Python walk ran")

    monkeypatch.setattr(messages.MessageStruct, "_build", refuse)
    assert api.encode_request("Fetch", 17, body, correlation_id=9, client_id="me") == expected
    header, decoded = api.decode_request("Fetch", 17, expected[4:])
    assert decoded["topics"][0]["partitions"][0]["fetch_offset"] == 10 and header["client_id"] == "me"


def _outcome(call: Any) -> Any:
    try:
        return call()
    except api.ProtocolEncodeError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("body", [
    {"max_wait_ms": 2**31},  # out of an int32's range: the Python walk names the field
    {"max_wait_ms": 1.5},  # not an int
    {"rack_id": None},  # null where the version allows none
    {"cluster_id": "c"},  # a tagged field given: the Python walk writes it (not its default)
    {"cluster_id": None},  # a tagged field at its default: the Python walk leaves it out
    {"replica_id": 5},  # a field this version lacks, not ignorable and not its default
    {"replica_id": -1.0},  # ... at its default as a float: the Python walk drops it
    {"replica_state": {"replica_epoch": -1}},  # ... a struct at its default: compared by the Python walk
    {"no_such_field": 1},  # a key no version knows
    {"topics": "abc"},  # not a list
    {"topics": [{"topic_id": "x" * 16, "partitions": []}]},  # a uuid that is not bytes
], ids=["range", "type", "null", "tagged", "tagged-default", "absent", "absent-default-float", "absent-struct",
        "unknown", "array", "uuid"])
def test_the_compiled_encoder_leaves_what_is_not_plain_to_the_python_walk(
        body: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    structs = _structs("FetchRequest", 17)
    header = {"request_api_key": 1, "request_api_version": 17, "correlation_id": 1, "client_id": None}
    assert compiled_encode(api._programs(*structs), (header, body), b"") is None

    def encode() -> Any:
        return api.encode_request("Fetch", 17, body, correlation_id=1, client_id=None)

    with_compiled = _outcome(encode)
    monkeypatch.setattr(api, "_encode_message", None)
    assert with_compiled == _outcome(encode)


@pytest.mark.parametrize(("version", "body"), [
    (17, {"replica_id": -1}),  # a field this version lacks, at its default
    (6, {"session_id": 5}),  # an ignorable field this version lacks (v7+), at any value
    (4, {"max_wait_ms": 1, "replica_id": -1, "rack_id": ""}),  # ignorable (v11+), at its default
    (6, {"forgotten_topics_data": []}),  # an array this version lacks (v7+), empty
], ids=["absent-default", "absent-ignorable", "absent-ignorable-str", "absent-empty-array"])
def test_the_compiled_encoder_drops_what_the_python_walk_drops(
        version: int, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A body built once for every version (a field some versions lack, at its default or ignorable)
    is still plain: the compiled encoder leaves the field out, as the Python walk does."""
    structs = _structs("FetchRequest", version)
    header = {"request_api_key": 1, "request_api_version": version, "correlation_id": 1, "client_id": None}
    ours = compiled_encode(api._programs(*structs), (header, body), b"")
    assert ours is not None
    monkeypatch.setattr(api, "_encode_message", None)
    assert ours == api.encode_request("Fetch", version, body, correlation_id=1, client_id=None)
