"""The errors of the schema registry client and of the registry deserializers.

Two families, both under :class:`asyncconsumer.errors.KafkaError`:

- :class:`SchemaRegistryError`: the registry could not give what was asked (no answer within the
  timeout, or an error status).  It names the request's URL (never its credentials) and the HTTP
  status; :class:`SchemaRegistryUnavailableError` (no answer, 429, 502-504) is ``retriable``,
  :class:`SchemaNotFoundError` is a 404.
- :class:`SerializationError`: one record's bytes could not be turned into a value.  It names the
  topic, partition, offset and field (key or value) from the deserialization context, and the
  schema id when it was read: :class:`WireFormatError` (not the Confluent wire format: too short,
  magic byte not 0, a broken message-index array), :class:`UnknownSchemaError` (the registry has
  no schema of that id: also a :class:`SchemaNotFoundError`), or the payload does not decode with
  its schema (the cause is chained).

A registry that is down while a record needs a schema raises the :class:`SchemaRegistryError`
(the record's position added to its message), not a :class:`SerializationError`: the record is
not at fault, and skipping it would lose data.
"""

from __future__ import annotations

import re
from typing import Protocol

from ..errors import KafkaError, RecordError

__all__ = [
    "ContextLike",
    "SchemaNotFoundError",
    "SchemaRegistryError",
    "SchemaRegistryUnavailableError",
    "SerializationError",
    "UnknownSchemaError",
    "UnsupportedSchemaError",
    "WireFormatError",
]


class ContextLike(Protocol):
    """What the deserializers read of a record's context (``asyncconsumer.DeserializationContext``
    has these fields)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def field(self) -> str: ...


_USERINFO = re.compile(r"(?<=//)[^/@\s]+@")


def scrub(text: str) -> str:
    """``text`` with any ``user:password@`` of a URL in it replaced by ``***@``."""
    return _USERINFO.sub("***@", text)


class SchemaRegistryError(KafkaError):
    """The schema registry did not give what was asked: the message names the URL and the status.

    Attributes: ``url`` (the request, without credentials), ``status`` (the HTTP status, None when
    no answer came) and ``error_code`` (the registry's own code from the answer's body, such as
    40403 for an unknown schema id, when it gave one).
    """

    def __init__(
        self, message: str, *, url: str = "", status: int | None = None, error_code: int | None = None
    ) -> None:
        super().__init__(scrub(message))
        self.url = scrub(url)
        self.status = status
        self.error_code = error_code


class SchemaRegistryUnavailableError(SchemaRegistryError):
    """No answer within the client's timeout (refused, unreachable, hung), or an answer saying to
    come back later (429, 502, 503, 504) until the timeout ran out.  Trying again later may work."""

    retriable = True


class SchemaNotFoundError(SchemaRegistryError):
    """The registry answered 404: no such schema id, subject or version."""


class SerializationError(RecordError):
    """One record's key or value could not be deserialized; names its topic, partition and offset.

    Attributes: ``topic``, ``partition``, ``offset`` (``""``/-1 without a context), ``field``
    (``"key"`` or ``"value"``; ``""`` without a context) and ``schema_id`` (None if not read).
    """

    def __init__(self, message: str, context: ContextLike | None = None, schema_id: int | None = None) -> None:
        if context is None:
            super().__init__(message)
            self.field = ""
        else:
            super().__init__(
                f"{context.field}: {message}", topic=context.topic, partition=context.partition,
                offset=context.offset,
            )
            self.field = context.field
        self.schema_id = schema_id


class WireFormatError(SerializationError):
    """The bytes are not in the Confluent wire format (magic byte 0, a 4-byte big-endian schema id,
    for Protobuf the message-index array, then the payload)."""


class UnknownSchemaError(SerializationError, SchemaNotFoundError):
    """The record names a schema id the registry does not have (a 404 for ``/schemas/ids/{id}``)."""

    def __init__(self, cause: SchemaNotFoundError, context: ContextLike | None, schema_id: int) -> None:
        SerializationError.__init__(
            self, f"schema id {schema_id} is not in the registry ({cause})", context, schema_id
        )
        self.url = cause.url
        self.status = cause.status
        self.error_code = cause.error_code


class UnsupportedSchemaError(KafkaError, ValueError):
    """A schema has a type no Arrow column can hold as Spark's ``from_avro`` types it (a recursive
    record, a decimal of more than 38 digits, a union whose branches decode alike): names the field
    (``value.address.zip``) and why.  Raised by ``AvroColumns`` for its reader schema."""


def where(context: ContextLike | None) -> str:
    """`` while deserializing the value of topic-0 at offset 12`` (empty without a context)."""
    if context is None:
        return ""
    return f" while deserializing the {context.field} of {context.topic}-{context.partition} at offset {context.offset}"


def with_context(error: SchemaRegistryError, context: ContextLike | None) -> SchemaRegistryError:
    """A new error of the same class as ``error`` whose message also names the record."""
    if context is None:
        return error
    copy = type(error)(str(error) + where(context), url=error.url, status=error.status, error_code=error.error_code)
    return copy
