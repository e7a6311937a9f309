"""The body of ``asyncconsumer produce``: lines from stdin become records, as with Kafka's
``kafka-console-producer`` (its ``LineMessageReader``).

Each line (without its ``\\n`` or ``\\r\\n``) is one record's value, its bytes as read; with
``parse.key=true`` the text before the first ``key.separator`` is the key, and with
``parse.headers=true`` the text before the first ``headers.delimiter`` comes first and holds the
headers (``k1:v1,k2:v2``).  Lines are read as they
arrive: everything stdin has at a moment goes out in one Produce request (so a pipe is sent in
large batches, and a line typed at a terminal is sent when Enter is pressed), and the next read
waits for its answer.
"""

from __future__ import annotations

import os
import random
import stat
import sys
from dataclasses import dataclass
from typing import IO

import anyio

from ..config import ConsumerConfig
from ..errors import KafkaError
from ..protocol.record_writer import Header, Record
from ._client import ProduceClient, TopicLayout, partition_for_key

#: ``--property`` names and their defaults (``kafka-console-producer``'s reader properties).
READER_PROPERTIES = {
    "parse.key": "false",
    "key.separator": "\t",
    "parse.headers": "false",
    "headers.delimiter": "\t",
    "headers.separator": ",",
    "headers.key.separator": ":",
    "null.marker": None,
    "ignore.error": "false",
}
#: Separators that must differ (as ``kafka-console-producer`` requires): otherwise a line could be
#: read two ways.
_DISTINCT = [
    ("headers.delimiter", "headers.separator"),
    ("headers.delimiter", "headers.key.separator"),
    ("headers.separator", "headers.key.separator"),
    ("null.marker", "key.separator"),
    ("null.marker", "headers.separator"),
    ("null.marker", "headers.delimiter"),
    ("null.marker", "headers.key.separator"),
]

#: Bytes read from stdin at most at once (and so the most one request carries).
_CHUNK = 1 << 20


class ProduceUsageError(KafkaError):
    """A line the reader cannot take (no key separator with ``parse.key=true``, no headers
    delimiter with ``parse.headers=true``, a header without its key separator)."""

    retriable = False


@dataclass(frozen=True)
class LineFormat:
    parse_key: bool = False
    key_separator: bytes = b"\t"
    parse_headers: bool = False
    headers_delimiter: bytes = b"\t"
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"
    null_marker: bytes | None = None
    ignore_error: bool = False

    @classmethod
    def from_properties(cls, properties: dict[str, str]) -> LineFormat:
        unknown = sorted(set(properties) - set(READER_PROPERTIES))
        if unknown:
            raise ValueError(f"unknown property {unknown[0]!r}; known: {', '.join(READER_PROPERTIES)}")
        given = {**READER_PROPERTIES, **properties}
        for name in ("key.separator", "headers.delimiter", "headers.separator", "headers.key.separator"):
            if not given[name]:
                raise ValueError(f"{name} is empty")
        for first, second in _DISTINCT:
            if given[first] is not None and given[first] == given[second]:
                raise ValueError(f"{first} and {second} may not be equal (both {given[first]!r})")
        marker = given["null.marker"]
        return cls(
            parse_key=_boolean(properties, "parse.key"),
            key_separator=_text(given, "key.separator"),
            parse_headers=_boolean(properties, "parse.headers"),
            headers_delimiter=_text(given, "headers.delimiter"),
            headers_separator=_text(given, "headers.separator"),
            headers_key_separator=_text(given, "headers.key.separator"),
            null_marker=marker.encode() if marker else None,
            ignore_error=_boolean(properties, "ignore.error"),
        )

    def record(self, line: bytes, number: int) -> Record:
        headers: list[Header] = []
        rest = line
        if self.parse_headers:
            text, found, after = line.partition(self.headers_delimiter)
            if found:
                rest = after
                if text != self.null_marker:
                    headers = [self._header(pair, number) for pair in self._pairs(text)]
            elif not self.ignore_error:
                raise self._missing("headers delimiter", self.headers_delimiter, line, number)
        key: bytes | None = None
        value: bytes | None = rest
        if self.parse_key:
            found_key, found, after = rest.partition(self.key_separator)
            if found:
                key, value = found_key, after
            elif not self.ignore_error:
                raise self._missing("key separator", self.key_separator, line, number)
            if key is not None and key == self.null_marker:
                key = None
        if value == self.null_marker:
            value = None
        return Record(key, value, headers)

    def _pairs(self, text: bytes) -> list[bytes]:
        """A line's headers split at ``headers.separator``, without the empty ones at the end, as
        Java's ``String.split`` splits them: ``a:1,`` is one header and ``,`` none, while empty
        headers text is one empty header (without its key separator)."""
        if not text:
            return [text]
        pairs = text.split(self.headers_separator)
        while pairs and not pairs[-1]:
            pairs.pop()
        return pairs

    def _header(self, pair: bytes, number: int) -> Header:
        """One ``key:value`` of a line's headers (``headers.key.separator``); the value may be the
        null marker, the key may not (a header key cannot be null)."""
        key, found, value = pair.partition(self.headers_key_separator)
        if not found and not self.ignore_error:
            raise ProduceUsageError(
                f"no header key separator {_shown(self.headers_key_separator)} in {_shown(pair)} on line {number}")
        if key == self.null_marker:
            raise ProduceUsageError(
                f"header key {_shown(key)} on line {number} is the null marker: a header key cannot be null")
        try:
            name = key.decode()
        except UnicodeDecodeError:
            raise ProduceUsageError(f"header key {_shown(key)} on line {number} is not UTF-8") from None
        return name, (None if not found or value == self.null_marker else value)

    @staticmethod
    def _missing(what: str, separator: bytes, line: bytes, number: int) -> ProduceUsageError:
        return ProduceUsageError(f"no {what} {_shown(separator)} on line {number}: {_shown(line[:80])}")


def _shown(data: bytes) -> str:
    return repr(data.decode(errors="replace"))


def _text(properties: dict[str, str | None], name: str) -> bytes:
    value = properties[name]
    assert value is not None
    return value.encode()


def _boolean(properties: dict[str, str], name: str) -> bool:
    value = properties.get(name, READER_PROPERTIES[name] or "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{name}={value!r}: expected true or false")
    return value == "true"


@dataclass
class ProduceArgs:
    bootstrap: str
    topic: str
    partition: int | None
    line_format: LineFormat
    request_timeout: float = 30.0
    #: The connection's security (``--command-config``): None, PLAINTEXT.
    security: ConsumerConfig | None = None


class _Lines:
    """Complete lines from stdin, a chunk at a time; the last line may lack its newline."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._rest = b""
        self._regular = stat.S_ISREG(os.fstat(fd).st_mode)  # a file: reads never block (and cannot be polled)
        self.number = 0

    async def next_chunk(self) -> list[bytes] | None:
        """The lines that are there now (waiting for at least one); None at the end of input."""
        while True:
            if not self._regular:
                await anyio.wait_readable(self._fd)
            data = os.read(self._fd, _CHUNK)
            if not data:
                if self._rest:
                    lines, self._rest = [self._rest], b""
                    return self._strip(lines)
                return None
            *lines, self._rest = (self._rest + data).split(b"\n")
            if lines:
                return self._strip(lines)

    def _strip(self, lines: list[bytes]) -> list[bytes]:
        self.number += len(lines)
        return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def assign(
    records: list[Record], layout: TopicLayout, partition: int | None
) -> dict[int, list[Record]]:
    """Per partition, its records: ``partition`` if given, a key's partition as Kafka's producer
    picks it, and one partition for all keyless records of this batch (sticky)."""
    if partition is not None:
        return {partition: records}
    sticky = random.randrange(layout.partitions)
    batches: dict[int, list[Record]] = {}
    for record in records:
        target = partition_for_key(record.key, layout.partitions) if record.key is not None else sticky
        batches.setdefault(target, []).append(record)
    return batches


def _records(lines: list[bytes], first_number: int, line_format: LineFormat) -> tuple[list[Record], KafkaError | None]:
    """The records of ``lines``, up to the first line that cannot be read (and its error)."""
    records = []
    for index, line in enumerate(lines):
        try:
            records.append(line_format.record(line, first_number + index))
        except ProduceUsageError as exc:
            return records, exc
    return records, None


async def produce(args: ProduceArgs, stdin: IO[bytes], err: IO[str]) -> int:
    reader = _Lines(stdin.fileno())
    count = 0
    try:
        client = ProduceClient(args.bootstrap, request_timeout=args.request_timeout, security=args.security)
        async with client:
            layout = await client.topic(args.topic)
            if args.partition is not None and args.partition >= layout.partitions:
                raise ProduceUsageError(
                    f"topic {args.topic!r} has {layout.partitions} partition(s): there is no partition {args.partition}"
                )
            while (lines := await reader.next_chunk()) is not None:
                first = reader.number - len(lines) + 1
                records, failure = _records(lines, first, args.line_format)
                if records:  # the lines before a bad one go out, as with Kafka's tool
                    layout = await client.produce(layout, assign(records, layout, args.partition))
                    count += len(records)
                if failure is not None:
                    raise failure
    finally:
        err.write(f"Produced a total of {count} messages\n")
        err.flush()
    return 0


def stdin_bytes() -> IO[bytes]:
    return sys.stdin.buffer
