"""Checks of the arguments of the public API, at the boundary.

A value that reaches the background loop must be one the loop can use and the protocol can
carry: a ``bytes`` topic, a partition past int32 or an offset past int64 would otherwise fail
inside the loop (stopping it) or be retried silently forever.  Each check raises
``ConfigTypeError`` (also a ``TypeError``) for a wrong type and ``ConfigError`` (also a
``ValueError``) for a value out of range, naming the argument and the call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigError, ConfigTypeError
from .structs import OffsetAndMetadata, TopicPartition

__all__ = [
    "INT16_STRING_BYTES",
    "INT32_MAX",
    "INT64_MAX",
    "check_commit_offsets",
    "check_offset",
    "check_pattern",
    "check_positive_int",
    "check_timeout",
    "check_timestamps",
    "check_topic",
    "check_topic_partitions",
    "check_topics",
    "protocol_string_error",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: The most bytes a protocol STRING (int16 length) holds.
INT16_STRING_BYTES = 2**15 - 1
#: Kafka's topic names: at most 249 of these characters, and not "." or ".." (Java's ``Topic.validate``).
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_timeout(value: object, operation: str, name: str = "timeout", *, optional: bool = True) -> float | None:
    """A duration in seconds: an int or float >= 0 (``inf`` allowed), or None where the call allows it."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        allowed = "a number of seconds or None" if optional else "a number of seconds"
        raise ConfigTypeError(f"{operation}(): {name} must be {allowed}, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(f"{operation}(): {name} must be >= 0 seconds, got {value!r}")
    return seconds


def check_positive_int(value: object, operation: str, name: str, *, limit: int = INT32_MAX) -> int:
    if not _is_int(value):
        raise ConfigTypeError(f"{operation}(): {name} must be an int, got {value!r}")
    assert isinstance(value, int)
    if not 0 < value <= limit:
        raise ConfigError(f"{operation}(): {name} must be between 1 and {limit}, got {value}")
    return value


def check_offset(value: object, operation: str, name: str = "offset") -> int:
    """An offset: an int from 0 to 2**63 - 1 (the int64 the protocol carries)."""
    if not _is_int(value):
        raise ConfigTypeError(f"{operation}(): {name} must be an int, got {value!r}")
    assert isinstance(value, int)
    if not 0 <= value <= INT64_MAX:
        raise ConfigError(f"{operation}(): {name} must be an int >= 0 (at most 2**63 - 1), got {value}")
    return value


def protocol_string_error(value: str) -> str | None:
    """Why ``value`` cannot be a protocol STRING (int16 length, UTF-8), None if it can."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"it cannot be encoded as UTF-8 ({exc.reason} at index {exc.start})"
    if size > INT16_STRING_BYTES:
        return f"it is {size} bytes in UTF-8 and a protocol string (int16 length) holds at most {INT16_STRING_BYTES}"
    return None


def check_topic(value: object, operation: str, name: str = "topic") -> str:
    """A topic name as Kafka allows it: 1 to 249 of ``a-z A-Z 0-9 . _ -``, not "." or ".."."""
    if not isinstance(value, str):
        raise ConfigTypeError(f"{operation}(): {name} must be a str, got {type(value).__name__} {value!r:.80}")
    if not _TOPIC.fullmatch(value) or value in (".", ".."):
        raise ConfigError(
            f"{operation}(): {name} {value!r:.80} is not a valid Kafka topic name "
            "(1 to 249 characters from a-z, A-Z, 0-9, '.', '_', '-'; not '.' or '..')"
        )
    return value


def check_topics(values: Iterable[object], operation: str) -> frozenset[str]:
    if isinstance(values, (bytes, bytearray)) or not isinstance(values, Iterable):
        raise ConfigTypeError(f"{operation}(): topics must be an iterable of str, got {values!r:.80}")
    return frozenset(check_topic(t, operation) for t in values)


def _check_tp(tp: object, operation: str) -> TopicPartition:
    if not isinstance(tp, TopicPartition):
        raise ConfigTypeError(f"{operation}(): expected a TopicPartition, got {tp!r:.80}")
    check_topic(tp.topic, operation, f"topic of {tp!r:.80}")
    p = tp.partition
    if not _is_int(p):
        raise ConfigTypeError(f"{operation}(): partition of {tp!r:.80} must be an int, got {p!r}")
    if not 0 <= p <= INT32_MAX:
        raise ConfigError(f"{operation}(): partition of {tp!r:.80} must be between 0 and {INT32_MAX}, got {p}")
    return tp


def check_topic_partitions(values: Iterable[Any], operation: str) -> list[TopicPartition]:
    """Every item a valid ``TopicPartition`` (str topic Kafka allows, int partition in 0..2**31 - 1)."""
    if isinstance(values, TopicPartition) or isinstance(values, (str, bytes, bytearray)):
        raise ConfigTypeError(f"{operation}(): expected TopicPartition objects, got {values!r:.80}")
    if not isinstance(values, Iterable):
        raise ConfigTypeError(f"{operation}(): expected TopicPartition objects, got {values!r:.80}")
    return [_check_tp(tp, operation) for tp in values]


def check_pattern(value: object, operation: str) -> re.Pattern[str] | None:
    if value is None:
        return None
    if isinstance(value, re.Pattern):
        if not isinstance(value.pattern, str):
            raise ConfigTypeError(f"{operation}(): pattern must match str topic names, got a bytes pattern {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigTypeError(f"{operation}(): pattern must be a str or re.Pattern, got {value!r:.80}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise ConfigError(f"{operation}(): invalid pattern {value!r}: {exc}") from None


def check_commit_offsets(offsets: object, operation: str = "commit") -> dict[TopicPartition, OffsetAndMetadata]:
    """``{TopicPartition: int | OffsetAndMetadata}`` with values OffsetCommit can carry."""
    if not isinstance(offsets, Mapping):
        raise ConfigTypeError(
            f"{operation}(): offsets must be a mapping of TopicPartition to offset, got {offsets!r:.80}"
        )
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, value in offsets.items():
        _check_tp(tp, operation)
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        check_offset(om.offset, operation, f"offset for {tp}")
        if not isinstance(om.metadata, str):
            raise ConfigTypeError(f"{operation}(): metadata for {tp} must be a str, got {om.metadata!r:.80}")
        why = protocol_string_error(om.metadata)
        if why is not None:
            raise ConfigError(f"{operation}(): metadata for {tp} cannot be sent: {why}")
        epoch = om.leader_epoch
        if epoch is not None and (not _is_int(epoch) or not -1 <= epoch <= INT32_MAX):
            raise ConfigError(f"{operation}(): leader_epoch for {tp} must be None or an int32 >= -1, got {epoch!r}")
        out[tp] = om
    return out


def check_timestamps(timestamps: object, operation: str = "offsets_for_times") -> dict[TopicPartition, int]:
    if not isinstance(timestamps, Mapping):
        raise ConfigTypeError(
            f"{operation}(): timestamps must be a mapping of TopicPartition to ms, got {timestamps!r:.80}"
        )
    out: dict[TopicPartition, int] = {}
    for tp, ts in timestamps.items():
        _check_tp(tp, operation)
        out[tp] = check_offset(ts, operation, f"timestamp (ms) for {tp}")
    return out
