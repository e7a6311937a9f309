"""Public surface of the Kafka message codec: frames in, dicts out (and back).

Bodies are plain dicts keyed by the schema's field names in snake_case
(``ThrottleTimeMs`` -> ``throttle_time_ms``).  Values: ints, bools, ``str``,
``bytes``; ``uuid`` fields are 16-byte ``bytes`` (``uuid.UUID`` is also
accepted when encoding); arrays are lists; structs are dicts; null is
``None``.  ``records`` fields decode to a zero-copy ``memoryview`` of the
frame passed in, so keep the frame alive while using them.

Decoding fills in every field the schema knows, with its default when the
version does not carry it.  Encoding takes defaults for missing keys, drops
fields the version lacks if they are ignorable or hold their default, and
raises :class:`ProtocolEncodeError` otherwise.  Malformed input raises
:class:`ProtocolDecodeError`; both subclass ``asyncconsumer.errors.ProtocolError``.
Bytes after the body are ignored, as the Java client does.
"""

from __future__ import annotations

import functools
import importlib
import io
import struct
from collections.abc import Mapping
from typing import Any

from construct import Container

from ._schemas import SCHEMAS
from .messages import MessageStruct, Program, in_range, struct_for
from .primitives import DECODE_ERRORS, FrameReader, ProtocolDecodeError, ProtocolEncodeError, byte_view
from .records import DECODER

__all__ = [
    "API_KEYS",
    "API_NAMES",
    "CLIENT_MAX_VERSIONS",
    "SUPPORTED_VERSIONS",
    "ProtocolDecodeError",
    "broker_release",
    "ProtocolEncodeError",
    "decode_data",
    "decode_request",
    "decode_response",
    "encode_data",
    "encode_request",
    "encode_response",
    "peek_correlation_id",
    "peek_request_header",
]

Frame = bytes | bytearray | memoryview

#: The compiled twins of the struct walks (speedups/codec.c), with the compiled record decoder (the
#: same switch, ``ASYNCCONSUMER_NO_EXTENSION``): a frame to dicts in one call, or None when the
#: frame is not well formed, and the Python walk then names the problem; plain bodies to a frame,
#: or None for any other, which the Python walk then writes or refuses.
_speedups: Any = importlib.import_module("asyncconsumer._speedups") if DECODER == "c" else None
_decode_message: Any = getattr(_speedups, "decode_message", None)
_encode_message: Any = getattr(_speedups, "encode_message", None)

API_KEYS: dict[str, int] = {
    s["name"].removesuffix("Request"): s["api_key"] for s in SCHEMAS.values() if s["type"] == "request"
}
API_NAMES: dict[int, str] = {key: name for name, key in API_KEYS.items()}


#: The highest version of each API that this client's request managers implement.  The codec
#: knows every version in Apache Kafka's definitions, but a newer version can change what a
#: request must carry (ConsumerGroupHeartbeat v1: a client-generated member id, KIP-1082;
#: OffsetCommit/OffsetFetch v10: topic ids instead of names), so a version is only negotiated
#: once the code that builds the request has been taught it.  APIs not listed: up to the newest.
CLIENT_MAX_VERSIONS: dict[str, int] = {
    "ApiVersions": 5,  # v5 (cluster id / node id checks, KIP-1242) only with them: engine/connection.py
    "ConsumerGroupHeartbeat": 1,  # v1 (client-generated member ids, KIP-1082; broker-side regex) is built
    "Fetch": 17,  # v18: a high watermark for replica fetchers (KIP-1166), nothing for consumers
    "ListOffsets": 10,  # v11: earliest pending upload (KIP-1023)
    "Metadata": 13,  # v13: a top-level error code (REBOOTSTRAP_REQUIRED, KIP-1102: managers/metadata.py)
    "OffsetCommit": 9,  # v10: topic ids only
    "OffsetFetch": 9,  # v10: topic ids only
}


#: Which Apache Kafka releases a broker's ApiVersions answer matches, by the versions that changed
#: between releases (Apache Kafka's message definitions of each release; checked against the
#: ApiVersions of 3.7.2, 3.9.2, 4.0.2 and 4.4.0 brokers): (ApiVersions max, Fetch min, Fetch max)
#: at least -> the releases.  The first row that matches wins.
_RELEASE_SIGNATURES: tuple[tuple[tuple[int, int, int], str], ...] = (
    ((5, 4, 18), "Apache Kafka 4.4 or newer"),  # ApiVersions v5 (KIP-1242)
    ((4, 4, 18), "Apache Kafka 4.1-4.3"),  # Fetch v18 (KIP-1166)
    ((4, 4, 17), "Apache Kafka 4.0"),  # Fetch v0-3 removed (KIP-896)
    ((4, 0, 17), "Apache Kafka 3.9"),  # Fetch v17 (KIP-853), ApiVersions v4
    ((3, 0, 16), "Apache Kafka 3.7-3.8"),  # Fetch v16 (KIP-951)
    ((3, 0, 15), "Apache Kafka 3.6"),
    ((0, 0, 0), "Apache Kafka 3.5 or older"),
)


def broker_release(api_versions: Mapping[int, tuple[int, int]]) -> str:
    """The Apache Kafka releases a broker's ApiVersions answer (api key -> (min, max)) matches,
    e.g. ``"Apache Kafka 3.9"``: brokers do not say their version, so errors name this instead.
    Another implementation (or a broker of a later release) may answer alike."""
    apis = api_versions.get(API_KEYS["ApiVersions"], (0, 0))[1]
    fetch_min, fetch_max = api_versions.get(API_KEYS["Fetch"], (0, 0))
    for (least_apis, least_fetch_min, least_fetch_max), release in _RELEASE_SIGNATURES:
        if apis >= least_apis and fetch_min >= least_fetch_min and fetch_max >= least_fetch_max:
            return release
    raise AssertionError("unreachable: the last signature matches every answer")  # pragma: no cover


def _supported(name: str, s: dict[str, Any]) -> tuple[int, int]:
    lo, hi = s["valid_versions"]
    # An unstable latest version is only exposed by brokers configured for it; never negotiate it.
    if s["latest_version_unstable"] and hi > lo:
        hi -= 1
    return (lo, min(hi, CLIENT_MAX_VERSIONS.get(name, hi)))


SUPPORTED_VERSIONS: dict[str, tuple[int, int]] = {
    name: _supported(name, SCHEMAS[name + "Request"]) for name in API_KEYS
}

_DATA_NAMES = frozenset(s["name"] for s in SCHEMAS.values() if s["type"] == "data")
_SIZE = struct.Struct(">i")
_HEADER_START = struct.Struct(">hhi")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _message(api: str, kind: str, version: int) -> tuple[str, MessageStruct]:
    if api not in API_KEYS:
        raise ProtocolEncodeError(f"unknown api {api!r}")
    name = api + kind
    try:
        return name, struct_for(name, version)
    except ProtocolEncodeError:
        lo, hi = SCHEMAS[name]["valid_versions"]
        raise ProtocolEncodeError(
            f"{api} has no {kind.lower()} version {version} (valid: {lo}-{hi})"
        ) from None


def _flexible(name: str, version: int) -> bool:
    return in_range(SCHEMAS[name]["flexible_versions"], version)


def _request_header_version(api: str, version: int) -> int:
    return 2 if _flexible(api + "Request", version) else 1


def _response_header_version(api: str, version: int) -> int:
    # KIP-511: ApiVersions responses keep header v0 so any client can read them.
    if api == "ApiVersions" or not _flexible(api + "Response", version):
        return 0
    return 1


@functools.cache
def _request_structs(api: str, version: int) -> tuple[MessageStruct, MessageStruct]:
    """The request header's struct and the body's, for ``api`` at ``version``."""
    _, body_struct = _message(api, "Request", version)
    return struct_for("RequestHeader", _request_header_version(api, version)), body_struct


@functools.cache
def _response_structs(api: str, version: int) -> tuple[MessageStruct, MessageStruct]:
    """The response header's struct and the body's, for ``api`` at ``version``."""
    _, body_struct = _message(api, "Response", version)
    return struct_for("ResponseHeader", _response_header_version(api, version)), body_struct


@functools.lru_cache(maxsize=256)
def _request_header(api: str, version: int, client_id: str | None) -> tuple[bytes, bytes]:
    """A request header as the codec writes it, around its correlation id: (api key and version,
    the client id and tagged fields).  Only the correlation id differs from request to request."""
    header_struct, _ = _request_structs(api, version)
    header = {"request_api_key": API_KEYS[api], "request_api_version": version, "correlation_id": 0,
              "client_id": client_id}
    encoded = _encode([(header_struct, header)], f"{api} v{version} request header")[4:]
    return encoded[:4], encoded[8:]


@functools.cache
def _programs(*structs: MessageStruct) -> tuple[Program, ...]:
    """The compiled codec's programs of ``structs`` (``MessageStruct.program``), kept per combination."""
    return tuple(s.program() for s in structs)


def _encode(parts: list[tuple[MessageStruct, Mapping[str, Any]]], what: str, prefix: bytes = b"") -> bytes:
    if _encode_message is not None:
        frame: bytes | None = _encode_message(_programs(*[s for s, _ in parts]), tuple(b for _, b in parts), prefix)
        if frame is not None:
            return frame
        # Not a plain body (see speedups/codec.c): the Python walk writes it, or names what is wrong.
    stream = io.BytesIO()
    stream.write(b"\0\0\0\0")  # size, patched below
    stream.write(prefix)
    context = Container()
    try:
        for struct_, obj in parts:
            struct_._build(obj, stream, context, None)
    except ProtocolEncodeError as exc:
        raise ProtocolEncodeError(f"cannot encode {what}: {exc}") from None
    size = stream.tell() - 4
    stream.seek(0)
    stream.write(_SIZE.pack(size))
    return stream.getvalue()


def _decode(structs: list[MessageStruct], frame: Frame, what: str) -> list[dict[str, Any]]:
    view = byte_view(frame)
    if _decode_message is not None:
        bodies: list[dict[str, Any]] | None = _decode_message(_programs(*structs), view)
        if bodies is not None:
            return bodies
        # Not a well-formed frame of these structs: the Python decoder says what is wrong (or answers).
    reader = FrameReader(view)
    context = Container()
    bodies = []
    try:
        for s in structs:  # not a comprehension: its closure would keep ``reader`` (the frame) in a traceback
            bodies.append(s._parse(reader, context, None))  # (construct's _parsereport adds a hook we never set)
        return bodies
    except DECODE_ERRORS as exc:
        raise ProtocolDecodeError(f"cannot decode {what}: {exc}") from None


def encode_request(
    api: str, version: int, body: Mapping[str, Any], *, correlation_id: int, client_id: str | None
) -> bytes:
    """Full request frame: int32 size, request header (v1, or v2 when flexible), body."""
    header_struct, body_struct = _request_structs(api, version)
    what = f"{api} v{version} request"
    plain_id = client_id is None or type(client_id) is str
    if plain_id and type(correlation_id) is int and _INT32_MIN <= correlation_id <= _INT32_MAX:
        # The header as encoded before for this api, version and client id, with this correlation id.
        start, rest = _request_header(api, version, client_id)
        return _encode([(body_struct, body)], what, start + _SIZE.pack(correlation_id) + rest)
    header = {
        "request_api_key": API_KEYS[api],
        "request_api_version": version,
        "correlation_id": correlation_id,
        "client_id": client_id,
    }
    return _encode([(header_struct, header), (body_struct, body)], what)


def compiled_encoder_writes(api: str, version: int, body: Mapping[str, Any]) -> bool | None:
    """Whether the compiled encoder writes this request ``body`` itself (None: no compiled codec in
    this build).  What it leaves to the Python walk (a field this version lacks at a value other
    than its default, a tagged field given, a value of another type: see speedups/codec.c) costs
    many times as much to encode, so the bodies a manager builds on every turn should be plain."""
    if _encode_message is None:
        return None
    _, body_struct = _request_structs(api, version)
    return _encode_message(_programs(body_struct), (body,), b"") is not None


def decode_request(api: str, version: int, frame: Frame) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse a request frame (bytes after the size prefix) into ``(header, body)``."""
    header_struct, body_struct = _request_structs(api, version)
    header, body = _decode([header_struct, body_struct], frame, f"{api} v{version} request")
    if (header["request_api_key"], header["request_api_version"]) != (API_KEYS[api], version):
        raise ProtocolDecodeError(
            f"expected {api} v{version} request, header says api key {header['request_api_key']} "
            f"v{header['request_api_version']}"
        )
    return header, body


def encode_response(api: str, version: int, body: Mapping[str, Any], *, correlation_id: int) -> bytes:
    """Full response frame: int32 size, response header, body (for tests and scripted brokers)."""
    _, body_struct = _message(api, "Response", version)
    header_struct = struct_for("ResponseHeader", _response_header_version(api, version))
    return _encode(
        [(header_struct, {"correlation_id": correlation_id}), (body_struct, body)],
        f"{api} v{version} response",
    )


def decode_response(api: str, version: int, frame: Frame) -> dict[str, Any]:
    """Parse a response frame (bytes after the size prefix) and return its body."""
    header_struct, body_struct = _response_structs(api, version)
    try:
        return _decode([header_struct, body_struct], frame, f"{api} v{version} response")[1]
    except ProtocolDecodeError:
        if api != "ApiVersions" or version == 0:
            raise
    # A broker that does not know our ApiVersions version answers UNSUPPORTED_VERSION
    # in a v0 body; like the Java client, fall back to v0 when the real version fails.
    v0 = struct_for("ApiVersionsResponse", 0)
    return _decode([header_struct, v0], frame, f"{api} v{version} response (or v0 fallback)")[1]


def peek_correlation_id(frame: Frame) -> int:
    """Correlation id of a response frame (bytes after the size prefix); every header starts with it."""
    if len(frame) < 4:
        raise ProtocolDecodeError(f"response frame of {len(frame)} bytes has no correlation id")
    return int(_SIZE.unpack_from(frame, 0)[0])


def peek_request_header(frame: Frame) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame, to pick the decoder."""
    if len(frame) < 8:
        raise ProtocolDecodeError(f"request frame of {len(frame)} bytes is too short for a header")
    api_key, version, correlation_id = _HEADER_START.unpack_from(frame, 0)
    return int(api_key), int(version), int(correlation_id)


def _data_schema(name: str) -> tuple[int, int]:
    if name not in _DATA_NAMES:
        raise ProtocolEncodeError(f"unknown data type {name!r} (known: {sorted(_DATA_NAMES)})")
    lo, hi = SCHEMAS[name]["valid_versions"]
    return int(lo), int(hi)


def encode_data(name: str, version: int, body: Mapping[str, Any]) -> bytes:
    """int16 version followed by the struct, e.g. ``ConsumerProtocolSubscription``."""
    _data_schema(name)
    stream = io.BytesIO()
    stream.write(struct.pack(">h", version))
    try:
        struct_for(name, version)._build(body, stream, Container(), None)
    except ProtocolEncodeError as exc:
        raise ProtocolEncodeError(f"cannot encode {name} v{version}: {exc}") from None
    return stream.getvalue()


def decode_data(name: str, data: Frame) -> tuple[int, dict[str, Any]]:
    """Parse an int16-versioned struct; returns ``(version used to parse, body)``.

    A version newer than we know is parsed with the highest known one (later
    versions only append fields, so the extra bytes are ignored).
    """
    lo, hi = _data_schema(name)
    if len(data) < 2:
        raise ProtocolDecodeError(f"cannot decode {name}: {len(data)} bytes is too short for a version")
    wire_version = int(struct.unpack_from(">h", data, 0)[0])
    if wire_version < lo:
        raise ProtocolDecodeError(f"cannot decode {name}: unknown version {wire_version}")
    version = min(wire_version, hi)
    body = _decode([struct_for(name, version)], memoryview(data)[2:], f"{name} v{wire_version}")[0]
    return version, body
