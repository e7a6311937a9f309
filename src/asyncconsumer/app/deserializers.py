"""Deserializers, and the policy for records they cannot read: how both collectors turn a record's
bytes into the application's types.

``Deserializers`` is built once per consumer from its options.  Each deserializer is called as
its form says (``config.deserializer_kind``): ``f(data)``, as it always was, synchronously and with
no context (``record`` below, the collectors' fast paths); ``obj.deserialize(data, context)`` and
``async def f(data, context)`` with a ``DeserializationContext``, the result awaited when it is
awaitable (``begin``, then ``finish`` only when there is something to await, on the polling
task).  ``sync`` says whether a consumer's records never need an await: only ``f(data)``
deserializers and a policy of "raise" or "skip".

A deserializer that raises gives a ``RecordDeserializationError`` naming the record and the key or
value (``failure``), and the ``on_deserialization_error`` policy settles it (``settle``): "raise"
hands it back to be raised; "skip" logs a WARNING and counts the record (``skipped``: metrics(),
OpenTelemetry, Prometheus); a handler is awaited with the undeserialized record, after which the
record counts as skipped, and an error it raises is raised instead (its ``__cause__``).  What
becomes of positions, commits and acknowledgements is the collectors' business.
"""

from __future__ import annotations

import inspect
import logging
import types
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NamedTuple

from ..config import ConsumerConfig, DeserializerKind, deserializer_kind
from ..errors import RecordDeserializationError
from ..structs import ConsumerRecord, DeserializationContext, ShareConsumerRecord, TopicPartition

#: A record as decoded from the fetch response: keys and values are bytes.
Raw = ConsumerRecord[bytes, bytes]
#: A record undeserialized as the policy's handler gets it (a share consumer's, with its delivery).
Undeserialized = Raw | ShareConsumerRecord[bytes, bytes]


class Pending(NamedTuple):
    """A record whose key or value deserializer returned an awaitable (``Deserializers.begin``)."""

    record: Undeserialized
    field: Literal["key", "value"]
    awaitable: Awaitable[Any]
    #: The key deserialized already, when the value is the one awaited.
    key: Any


#: Types whose values were not awaitable: a deserializer returns values of a few types, record
#: after record, and ``inspect.isawaitable`` costs about what building the context does.
_NOT_AWAITABLE: set[type] = set()


def awaitable(value: object) -> bool:
    """``inspect.isawaitable(value)``, the types of values that are not remembered (but for
    generators: one may be a generator-based coroutine, another not)."""
    kind = type(value)
    if kind in _NOT_AWAITABLE:
        return False
    if inspect.isawaitable(value):
        return True
    if kind is not types.GeneratorType:
        _NOT_AWAITABLE.add(kind)
    return False


def replaced(record: Undeserialized, key: Any, value: Any) -> Any:
    """``record._replace(key=key, value=value)``, at half the cost (it is paid per record).  Of a
    share record it keeps a ``ConsumerRecord``'s fields only: the share collector reads the key and
    value and puts them back into its own record."""
    r = record
    return tuple.__new__(type(r), (r[0], r[1], r[2], r[3], r[4], key, value, r[7], r[8], r[9], r[10]))


class Deserializers:
    """One consumer's key and value deserializers and its ``on_deserialization_error`` policy."""

    def __init__(self, config: ConsumerConfig, log: logging.Logger, hint: Callable[[Undeserialized], str]) -> None:
        self.key: Any = config.key_deserializer
        self.value: Any = config.value_deserializer
        self.key_kind: DeserializerKind | None = (
            None if self.key is None else deserializer_kind("key_deserializer", self.key))
        self.value_kind: DeserializerKind | None = (
            None if self.value is None else deserializer_kind("value_deserializer", self.value))
        self.policy: Any = config.on_deserialization_error
        #: No deserializers: records are handed out as they are decoded.
        self.plain = self.key is None and self.value is None
        #: Only ``f(data)`` deserializers (or none) and a policy that never awaits: ``record``
        #: does all the work, synchronously.
        self.sync = {self.key_kind, self.value_kind} <= {"plain", None} and self.policy in ("raise", "skip")
        #: Records the policy skipped ("skip", or a handler that returned), per partition.
        self.skipped: Counter[TopicPartition] = Counter()
        self._log = log
        #: What the application may do about a record to raise for (the error message's end).
        self._hint = hint

    # -- deserializing ------------------------------------------------------------------------------

    def record(self, record: Undeserialized) -> Any:
        """``record`` with its key and value deserialized by ``f(data)`` deserializers (``sync``);
        what a deserializer raises becomes a ``RecordDeserializationError`` (not settled)."""
        key_fn, value_fn = self.key, self.value
        key, value = record.key, record.value
        if key_fn is not None and key is not None:
            try:
                key = key_fn(key)
            except Exception as exc:
                raise self.failure(record, "key", exc) from exc
        if value_fn is not None and value is not None:
            try:
                value = value_fn(value)
            except Exception as exc:
                raise self.failure(record, "value", exc) from exc
        return replaced(record, key, value)

    def begin(self, record: Undeserialized) -> Any:
        """``record`` deserialized, whatever the forms, when no deserializer returns an awaitable;
        else a ``Pending`` for ``finish``.  Raises ``RecordDeserializationError`` (not settled).
        Split from ``finish`` so that a record needing no await costs no coroutine."""
        key = record.key
        if key is not None and self.key is not None:
            key = self._call(self.key, self.key_kind, key, record, "key")
            if self.key_kind != "plain" and awaitable(key):
                return Pending(record, "key", key, None)
        value = record.value
        if value is not None and self.value is not None:
            value = self._call(self.value, self.value_kind, value, record, "value")
            if self.value_kind != "plain" and awaitable(value):
                return Pending(record, "value", value, key)
        return replaced(record, key, value)

    async def finish(self, pending: Pending) -> Any:
        """The record of ``pending`` deserialized: its awaitable awaited, and then (if that was the
        key's) the value deserialized too."""
        record = pending.record
        try:
            result = await pending.awaitable
        except Exception as exc:
            raise self.failure(record, pending.field, exc) from exc
        if pending.field == "value":
            return replaced(record, pending.key, result)
        value = record.value
        if value is not None and self.value is not None:
            value = self._call(self.value, self.value_kind, value, record, "value")
            if self.value_kind != "plain" and awaitable(value):
                return await self.finish(Pending(record, "value", value, result))
        return replaced(record, result, value)

    def _call(self, function: Any, kind: DeserializerKind | None, data: bytes, record: Undeserialized,
              field: Literal["key", "value"]) -> Any:
        """The deserializer's result: the value, or (not for ``f(data)``) perhaps an awaitable."""
        try:
            if kind == "plain":
                return function(data)
            context = DeserializationContext(record.topic, record.partition, record.offset, field, record.headers)
            if kind == "object":
                return function.deserialize(data, context)
            return function(data, context)
        except Exception as exc:
            raise self.failure(record, field, exc) from exc

    def failure(self, record: Undeserialized, field: str, exc: Exception, handler: Exception | None = None
                ) -> RecordDeserializationError:
        """The error for ``record`` whose ``field`` ("key" or "value") could not be deserialized
        (``exc``, its ``__cause__``), or whose handler then raised (``handler``, the cause then)."""
        also = f"; on_deserialization_error raised {handler!r}" if handler is not None else ""
        error = RecordDeserializationError(
            f"the {field} deserializer raised {exc!r}{also}; {self._hint(record)}",
            topic=record.topic, partition=record.partition, offset=record.offset, field=field,
        )
        error.__cause__ = exc if handler is None else handler
        return error

    # -- the policy ---------------------------------------------------------------------------------

    async def settle(
        self, record: Undeserialized, error: RecordDeserializationError, skipped: str
    ) -> RecordDeserializationError | None:
        """Apply the policy to ``error`` (``record``: undeserialized, for a handler): None when the
        record is skipped (logged, counted), else the error to raise.  ``skipped`` says what
        skipping does to it (for the log)."""
        policy = self.policy
        if policy == "raise":
            return error
        if policy != "skip":
            try:
                await policy(record, error)
            except Exception as exc:
                if exc.__context__ is None:
                    exc.__context__ = error
                cause = error.__cause__ if isinstance(error.__cause__, Exception) else error
                return self.failure(record, error.field, cause, exc)
            self.count(record, "handled by on_deserialization_error", error, skipped, logging.INFO)
            return None
        self.count(record, "skipped", error, skipped, logging.WARNING)
        return None

    def skip(self, record: Undeserialized, error: RecordDeserializationError,
             skipped: str) -> bool:
        """``settle`` when it needs no await (``sync``): True when the record is skipped."""
        if self.policy != "skip":
            return False
        self.count(record, "skipped", error, skipped, logging.WARNING)
        return True

    def count(self, record: Undeserialized, what: str, error: RecordDeserializationError,
              skipped: str, level: int) -> None:
        self.skipped[TopicPartition(record.topic, record.partition)] += 1
        cause = error.__cause__ if error.__cause__ is not None else error
        self._log.log(level, "%s-%d offset %d %s (%s): the %s deserializer raised %r", record.topic,
                      record.partition, record.offset, what, skipped, error.field, cause)


__all__ = ["Deserializers", "Pending", "Raw", "Undeserialized", "replaced"]
