"""The async bodies of ``asyncconsumer consume`` and ``asyncconsumer lag``.

Both start with :func:`open_consumer`: the consumer from the user's properties (an error names
the dotted property the user typed, ``fetch.max.bytes``, not the option it sets), and a quick look
at the bootstrap servers.  The library's ``start()`` waits up to ``request.timeout.ms`` for a broker,
as a service must (its broker may still be starting, or restarting); a person at a terminal who
typed a wrong port wants to hear it at once.  So when every bootstrap server refuses the connection
(or its name does not resolve) the tool stops with one line, without waiting; a server that does not
answer at all is left to the consumer's own wait, which ends with the last error it saw.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import anyio
import anyio.to_thread

from ..config import ConsumerConfig, from_properties, parse_host_port, property_option
from ..consumer import Consumer
from ..errors import ConfigError, NoBrokersAvailableError
from ..structs import TopicPartition
from ._format import TextFormat, render_json

#: Exit status after Ctrl+C (128 + SIGINT), as shells and the JVM report it.
EXIT_INTERRUPTED = 130


@dataclass
class ConsumeArgs:
    properties: dict[str, str]
    overrides: dict[str, Any]
    topic: str
    group: str | None
    from_beginning: bool
    partition: int | None
    offset: str | None
    max_messages: int | None
    timeout_ms: int | None
    output_format: str
    text_format: TextFormat


@dataclass
class _Progress:
    """``consumed N messages`` on stderr, rewritten in place, when stderr is a terminal."""

    stream: IO[str]
    enabled: bool
    count: int = 0
    _last: float = field(default=0.0)

    def update(self, count: int) -> None:
        self.count = count
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.25:
            self._last = now
            self.stream.write(f"\r{count} messages consumed")
            self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self._last:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class Interrupt:
    """Ctrl+C (or SIGTERM) handling.

    While records are being read, the first signal cancels only :attr:`stop`, the scope around the
    reading loop: ``async with Consumer`` then closes the consumer normally (committing what was
    printed, in a group).  At any other moment, or on a second signal, the whole command is cancelled.
    """

    def __init__(self) -> None:
        self.stop = anyio.CancelScope()
        self.reading = False
        self.signalled = False

    async def watch(self, everything: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                first, self.signalled = not self.signalled, True
                if first and self.reading:
                    self.stop.cancel()
                else:
                    everything.cancel()
                    return


async def run_interruptible(body: Callable[[Interrupt], Awaitable[int]]) -> int:
    """Run ``body``; a signal stops it as :class:`Interrupt` says, and the status is then 130."""
    interrupt = Interrupt()
    result = 0
    async with anyio.create_task_group() as group:
        group.start_soon(interrupt.watch, group.cancel_scope)
        try:
            result = await body(interrupt)
        finally:
            group.cancel_scope.cancel()
    return EXIT_INTERRUPTED if interrupt.signalled else result


#: How long the look at each bootstrap server may take (a server that does not answer in this time
#: is left to the consumer's own wait).
PROBE_TIMEOUT = 3.0


def _with_property_names(error: ConfigError, properties: Mapping[str, Any]) -> ConfigError:
    """``error`` naming the dotted properties the user typed (``fetch.max.bytes``) instead of the
    options they set (``fetch_max_bytes``)."""
    text = str(error)
    for key in properties:
        option = property_option(key)
        if option != key:
            text = re.sub(rf"(?<![\w.]){re.escape(option)}(?!\w)", key, text)
    return ConfigError(text) if text != str(error) else error


def connection_config(properties: Mapping[str, str]) -> ConsumerConfig:
    """``from_properties``'s config (what ``produce`` takes its connection's security from), its errors
    naming the properties as the user typed them."""
    try:
        return from_properties(properties)
    except ConfigError as exc:
        raise _with_property_names(exc, properties) from None


def new_consumer(properties: Mapping[str, str], overrides: Mapping[str, Any]) -> Consumer[bytes, bytes]:
    """``Consumer.from_properties``, its errors naming the properties as the user typed them."""
    try:
        return Consumer.from_properties(properties, **overrides)
    except ConfigError as exc:
        raise _with_property_names(exc, properties) from None


def _refusal(server: str) -> str | None:
    """Why ``server`` refuses a TCP connection at once (None: it accepted, or did not answer in time)."""
    host, port = parse_host_port(server)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except TimeoutError:
        return None
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror or exc}"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None


async def check_bootstrap(servers: tuple[str, ...]) -> None:
    """Raise ``NoBrokersAvailableError`` at once when every bootstrap server refuses (see the module
    docstring); the servers are tried side by side."""
    refusals: dict[str, str | None] = {}

    async def look(server: str) -> None:
        refusals[server] = await anyio.to_thread.run_sync(_refusal, server, abandon_on_cancel=True)

    async with anyio.create_task_group() as group:
        for server in servers:
            group.start_soon(look, server)
    if all(refusals.get(server) is not None for server in servers):
        details = "; ".join(f"{server}: {refusals[server]}" for server in servers)
        raise NoBrokersAvailableError(
            f"no broker reachable (bootstrap_servers={','.join(servers)}): {details}; is a broker running there?"
        )


def _start_offset(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    return int(text)


async def consume(args: ConsumeArgs, out: IO[bytes], err: IO[str], interrupt: Interrupt) -> int:
    overrides = dict(args.overrides)
    if args.group is not None:
        overrides["group_id"] = args.group
    else:
        overrides["enable_auto_commit"] = False
    if args.from_beginning:
        overrides["auto_offset_reset"] = "earliest"
    elif "auto.offset.reset" not in args.properties:
        overrides["auto_offset_reset"] = "latest"
    consumer = new_consumer(args.properties, overrides)
    await check_bootstrap(consumer.config.bootstrap_servers)
    render = render_json if args.output_format == "json" else args.text_format.render
    progress = _Progress(err, enabled=err.isatty())
    count = 0
    failed = False
    try:
        async with consumer:
            if args.partition is not None or args.group is None:
                if args.partition is not None:
                    partitions = [TopicPartition(args.topic, args.partition)]
                else:
                    numbers = await consumer.partitions_for_topic(args.topic)
                    if numbers is None:
                        raise _UsageError(f"topic {args.topic!r} does not exist")
                    partitions = [TopicPartition(args.topic, p) for p in sorted(numbers)]
                consumer.assign(partitions)
                start = _start_offset(args.offset) if args.offset is not None else None
                if start == "earliest" or (start is None and args.from_beginning):
                    await consumer.seek_to_beginning(*partitions)
                elif start == "latest" or (start is None and args.group is None):
                    await consumer.seek_to_end(*partitions)
                elif isinstance(start, int):
                    for tp in partitions:
                        await consumer.seek(tp, start)
            else:
                consumer.subscribe([args.topic])
            interrupt.reading = True
            with interrupt.stop:
                idle_limit = args.timeout_ms / 1000 if args.timeout_ms is not None else None
                last_record = time.monotonic()
                while args.max_messages is None or count < args.max_messages:
                    wait = 0.5
                    if idle_limit is not None:
                        left = idle_limit - (time.monotonic() - last_record)
                        if left <= 0:
                            break
                        wait = min(wait, left)
                    remaining = None if args.max_messages is None else args.max_messages - count
                    batches = await consumer.getmany(timeout=wait, max_records=remaining)
                    if not batches:
                        progress.update(count)
                        continue
                    for records in batches.values():
                        for record in records:
                            out.write(render(record))
                        count += len(records)
                    out.flush()
                    last_record = time.monotonic()
                    progress.update(count)
            interrupt.reading = False
    except Exception:
        failed = True
        raise
    finally:
        progress.clear()
        if not failed:  # as kafka-console-consumer, also after Ctrl+C
            err.write(f"Processed a total of {count} messages\n")
            err.flush()
    return 0


class _UsageError(Exception):
    """A problem to report in one line (exit status 1)."""


@dataclass
class LagArgs:
    properties: dict[str, str]
    overrides: dict[str, Any]
    group: str
    output_format: str


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    current_offset: int
    log_end_offset: int
    lag: int


async def group_lag(properties: Mapping[str, str], overrides: Mapping[str, Any], group: str) -> list[PartitionLag]:
    """Per partition with a committed offset of ``group``: the committed offset, the log end offset
    (``ListOffsets`` latest, read_uncommitted as in ``kafka-consumer-groups``) and their difference."""
    options = {**overrides, "group_id": group, "enable_auto_commit": False, "isolation_level": "read_uncommitted"}
    consumer = new_consumer(properties, options)
    await check_bootstrap(consumer.config.bootstrap_servers)
    async with consumer:
        candidates = []
        for topic in sorted(await consumer.topics()):
            numbers = await consumer.partitions_for_topic(topic) or set()
            candidates += [TopicPartition(topic, p) for p in sorted(numbers)]
        committed = await consumer.committed(candidates) if candidates else {}
        current = {tp: om.offset for tp, om in committed.items() if om is not None and om.offset >= 0}
        ends = await consumer.end_offsets(list(current)) if current else {}
    return [
        PartitionLag(tp.topic, tp.partition, offset, ends[tp], max(0, ends[tp] - offset))
        for tp, offset in sorted(current.items(), key=lambda item: (item[0].topic, item[0].partition))
    ]


async def lag(args: LagArgs, out: IO[str], err: IO[str], interrupt: Interrupt) -> int:
    rows = await group_lag(args.properties, args.overrides, args.group)
    if args.output_format == "json":
        out.write(json.dumps([row.__dict__ for row in rows]) + "\n")
        return 0
    if not rows:
        err.write(f"Consumer group '{args.group}' has no committed offsets.\n")
        return 0
    header = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")
    table = [header] + [
        (args.group, r.topic, str(r.partition), str(r.current_offset), str(r.log_end_offset), str(r.lag)) for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n")
    return 0


def stdout_bytes() -> IO[bytes]:
    return sys.stdout.buffer
