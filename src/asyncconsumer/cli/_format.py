"""How ``asyncconsumer consume`` prints a record: kafka-console-consumer's text, or JSON lines."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..structs import LOG_APPEND_TIME, ConsumerRecord

#: ``--property`` names of kafka-console-consumer's ``DefaultMessageFormatter`` that are understood.
FORMATTER_PROPERTIES = (
    "print.timestamp",
    "print.key",
    "print.offset",
    "print.partition",
    "print.headers",
    "print.value",
    "key.separator",
    "line.separator",
    "headers.separator",
    "null.literal",
)


def _unescape(text: str) -> str:
    # kafka-console-consumer users write separators as "\t" or "\n" on the command line
    return text.encode("utf-8").decode("unicode_escape") if "\\" in text else text


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"--property {name} must be true or false, got {value!r}")
    return lowered == "true"


@dataclass(frozen=True)
class TextFormat:
    """kafka-console-consumer's default formatter (``--property print.key=true`` ...)."""

    print_timestamp: bool = False
    print_key: bool = False
    print_offset: bool = False
    print_partition: bool = False
    print_headers: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> TextFormat:
        options: dict[str, Any] = {}
        for name, value in properties.items():
            if name not in FORMATTER_PROPERTIES:
                raise ConfigError(f"unknown --property {name!r} (known: {', '.join(FORMATTER_PROPERTIES)})")
            field = name.replace(".", "_")
            if name.startswith("print."):
                options[field] = _flag(name, value)
            else:
                options[field] = _unescape(value).encode("utf-8")
        return cls(**options)

    def render(self, record: ConsumerRecord[Any, Any]) -> bytes:
        fields: list[bytes] = []
        if self.print_timestamp:
            if record.timestamp < 0:
                fields.append(b"NO_TIMESTAMP")
            else:
                kind = "LogAppendTime" if record.timestamp_type == LOG_APPEND_TIME else "CreateTime"
                fields.append(f"{kind}:{record.timestamp}".encode())
        if self.print_partition:
            fields.append(f"Partition:{record.partition}".encode())
        if self.print_offset:
            fields.append(f"Offset:{record.offset}".encode())
        if self.print_headers:
            if record.headers:
                fields.append(
                    self.headers_separator.join(
                        name.encode("utf-8") + b":" + (value if value is not None else self.null_literal)
                        for name, value in record.headers
                    )
                )
            else:
                fields.append(b"NO_HEADERS")
        if self.print_key:
            fields.append(_raw(record.key, self.null_literal))
        if self.print_value:
            fields.append(_raw(record.value, self.null_literal))
        return self.key_separator.join(fields) + self.line_separator


def _raw(data: Any, null: bytes) -> bytes:
    if data is None:
        return null
    return bytes(data)


def _text_or_base64(data: bytes | None) -> tuple[str | None, bool]:
    if data is None:
        return None, False
    try:
        return bytes(data).decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def json_row(record: ConsumerRecord[Any, Any]) -> dict[str, Any]:
    """One record as a JSON object.

    ``key``, ``value`` and each header's ``value`` are UTF-8 text; bytes that are not valid UTF-8
    are given in base64 instead, with ``"key_encoding"`` / ``"value_encoding"`` (in a header:
    ``"value_encoding"``) set to ``"base64"``.  ``null`` stands for an absent key or value.
    """
    row: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    for name in ("key", "value"):
        text, encoded = _text_or_base64(getattr(record, name))
        row[name] = text
        if encoded:
            row[f"{name}_encoding"] = "base64"
    headers = []
    for header_key, header_value in record.headers:
        text, encoded = _text_or_base64(header_value)
        header: dict[str, Any] = {"key": header_key, "value": text}
        if encoded:
            header["value_encoding"] = "base64"
        headers.append(header)
    row["headers"] = headers
    return row


def render_json(record: ConsumerRecord[Any, Any]) -> bytes:
    return json.dumps(json_row(record), ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
