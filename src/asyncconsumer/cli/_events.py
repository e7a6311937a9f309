"""What the verifiable tools share: the JSON event lines on stdout, shutdown by signal, the Java tools'
error behaviour, and their ``.properties`` files.  See docs/verifiable-consumer.md.

The Java tools print one JSON object per line, ``{"timestamp":<ms>,"name":"<event>",...}``, compact
and with the fields in a fixed order; Kafka's system tests (kafkatest) read those lines and nothing
else from stdout.  Logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol, TypeVar

import anyio
import anyio.abc

from ..errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from ..structs import TopicPartition
from ._javaargs import ArgumentError, HelpRequested, Option, ToolParser
from ._properties import read_properties_file

log = logging.getLogger("asyncconsumer.cli.verifiable")

#: Exit status when the arguments or the settings are bad (the JVM's for an uncaught exception too).
EXIT_USAGE = 1
#: The pause between two attempts to start while no broker answers.
RETRY_SECONDS = 1.0
RUNTIMES = ("asyncio", "trio")

#: The flags both tools have, in their Java places: --topic first; --verbose; then, last, the
#: properties file, our own --runtime and the connection group.
TOPIC = Option("--topic", "The topic to subscribe to.", "TOPIC", required=True)
VERBOSE = Option("--verbose", "Print a record_data event for every record", default=False)
COMMAND_CONFIG = Option(
    "--command-config",
    "A Java properties file of consumer settings; the flags above override the settings they set",
    "CONFIG-FILE",
)
RUNTIME = Option("--runtime", "asyncconsumer's own: the async runtime, asyncio or trio", "RUNTIME", default="asyncio")
BOOTSTRAP_SERVER = Option(
    "--bootstrap-server",
    "The brokers to connect to, comma-separated",
    "HOST1:PORT1[,HOST2:PORT2[...]]",
    required=True,
    connection=True,
)


class ToolConfigError(Exception):
    """A setting the Java client refuses when it is constructed (the Java tool dies with a stack trace
    and exit status 1, before ``startup_complete``); here one line on stderr, same status."""


class Events:
    """Writes the events, one compact JSON object per line, flushed at once.

    A write that fails (the reader went away) stops the output, as Java's ``System.out`` does, and
    the tool goes on; stderr says so once.
    """

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._broken = False

    def emit(self, name: str, **fields: Any) -> None:
        """``{"timestamp": now in ms, "name": name, **fields}``; fields whose value is ``...`` are left out."""
        event = {"timestamp": int(time.time() * 1000), "name": name}
        event.update((key, value) for key, value in fields.items() if value is not ...)
        self.line(json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    def line(self, text: str) -> None:
        if self._broken:
            return
        try:
            self._out.write(text + "\n")
            self._out.flush()
        except (OSError, ValueError) as exc:
            self._broken = True
            log.error("stdout is gone (%s): no more events are printed", exc)


def partition_list(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    """``[{"topic": ..., "partition": ...}]`` sorted as Java's rebalance callbacks give them."""
    return [{"topic": tp.topic, "partition": tp.partition} for tp in sorted(partitions)]


def text(data: bytes | memoryview | None) -> str | None:
    """A key or value as Java's ``StringDeserializer`` reads it: UTF-8, bad bytes as U+FFFD."""
    return None if data is None else bytes(data).decode("utf-8", "replace")


class Shutdown:
    """SIGTERM and SIGINT, as the Java tools' shutdown hook handles them.

    The first signal prints ``shutdown_requested`` and wakes the consumer up: the poll in progress
    (inside :meth:`wakeable`) is cancelled, as ``consumer.wakeup()`` makes Java's ``poll()`` throw;
    work outside it (processing a batch, committing it) finishes first.  Later signals change
    nothing.  :attr:`exit_status` is the JVM's: 128 + the signal number (143 for SIGTERM).
    """

    def __init__(self, events: Events) -> None:
        self._events = events
        self.signal: int | None = None
        self._poll: anyio.CancelScope | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def exit_status(self) -> int:
        return 0 if self.signal is None else 128 + self.signal

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Handle the signals (started once the handlers are in place, as the JVM's hook is before
        ``startup_complete``)."""
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                if self.signal is None:
                    self.signal = int(signum)
                    self._events.emit("shutdown_requested")
                    if self._poll is not None:
                        self._poll.cancel()

    def disarm(self) -> None:
        """From now on a signal only cancels polls (``wakeable`` scopes entered later)."""
        self._poll = None

    @contextmanager
    def wakeable(self) -> Iterator[anyio.CancelScope]:
        """A scope that a shutdown request cancels (at once if one came already)."""
        scope = anyio.CancelScope()
        if self.requested:
            scope.cancel()
        self._poll = scope
        try:
            with scope:
                yield scope
        finally:
            self._poll = None

    def after_exit(self) -> None:
        """The Java tools' hook also runs when ``main`` returns: ``shutdown_requested`` comes last then."""
        if self.signal is None:
            self._events.emit("shutdown_requested")


class ToolClient(Protocol):
    """What a tool runs: a consumer or a share consumer (``async with``, ``close(timeout)``)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...

    async def close(self, timeout: float) -> None: ...


Client = TypeVar("Client", bound=ToolClient)


def launch(
    prog: str,
    what: str,
    runtime: str,
    make: Callable[[], Client],
    session: Callable[[Client, Shutdown], Awaitable[None]],
    events: Events,
    close_timeout: float,
) -> NoReturn:
    """Check the settings by building the client once (refused ones end the tool before any event),
    then :func:`run_tool` on ``runtime``; exits with its status."""
    try:
        make()
    except KafkaError as exc:
        fail_config(prog, str(exc))
    raise SystemExit(anyio.run(run_tool, make, session, events, what, close_timeout, backend=runtime))


async def run_tool(
    make: Callable[[], Client],
    session: Callable[[Client, Shutdown], Awaitable[None]],
    events: Events,
    what: str,
    close_timeout: float = 30.0,
) -> int:
    """The Java tools' ``run()`` and shutdown hook around ``session``; returns the exit status.

    ``startup_complete`` first; then the client is started (again and again while no broker answers,
    as Java's poll keeps trying) and ``session`` runs; ``shutdown_complete`` at the end, whatever
    happened.  An error of the session is fatal: it is logged and ends the run like a shutdown.
    Either way the client is closed, within ``close_timeout`` seconds, even when cancelled.
    """
    shutdown = Shutdown(events)
    async with anyio.create_task_group() as tasks:
        await tasks.start(shutdown.watch)
        events.emit("startup_complete")
        try:
            while not shutdown.requested:
                client = make()
                try:
                    with shutdown.wakeable():  # a signal while starting ends the start
                        async with client:
                            shutdown.disarm()
                            await _run_session(client, shutdown, session, what, close_timeout)
                    break
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    log.warning("no broker answered (%s); trying again", exc)
                    with shutdown.wakeable():
                        await anyio.sleep(RETRY_SECONDS)
                except Exception as exc:
                    fatal(what, exc)
                    break
        finally:
            events.emit("shutdown_complete")
            tasks.cancel_scope.cancel()
    shutdown.after_exit()
    return shutdown.exit_status


async def _run_session(client: Client, shutdown: Shutdown, session: Callable[[Client, Shutdown], Awaitable[None]],
                       what: str, close_timeout: float) -> None:
    """``session``, whose errors are fatal (logged), then the client closed within ``close_timeout``."""
    try:
        await session(client, shutdown)
    except Exception as exc:
        fatal(what, exc)
    finally:
        with anyio.CancelScope(shield=True):
            await client.close(close_timeout)


def record_data(events: Events, record: Any) -> None:
    """``record_data`` (``--verbose``): one record's key and value as text, and where it is."""
    events.emit("record_data", key=text(record.key), value=text(record.value), topic=record.topic,
                partition=record.partition, offset=record.offset)


def fatal(what: str, exc: BaseException) -> None:
    """The Java tools' last word on an error that ends them (logged; the run then closes normally)."""
    log.error("Error during processing, terminating %s process: %s", what, exc, exc_info=exc)


def parse_or_exit(parser: ToolParser, args: list[str]) -> dict[str, Any]:
    """Parse as the Java tool does: no arguments prints the help (exit 0); ``-h`` the help (exit 1,
    as the Kafka tools treat it); a bad flag the usage and the error on stderr (exit 1)."""
    if not args:
        sys.stdout.write(parser.help())
        sys.stdout.flush()
        raise SystemExit(0)
    try:
        values = parser.parse(args)
    except HelpRequested:
        sys.stdout.write(parser.help())
        sys.stdout.flush()
        raise SystemExit(EXIT_USAGE) from None
    except ArgumentError as exc:
        fail_usage(parser, exc)
    if values["runtime"] not in RUNTIMES:
        fail_usage(parser, ArgumentError(f"argument --runtime: must be one of {', '.join(RUNTIMES)}"))
    return values


def fail_usage(parser: ToolParser, error: ArgumentError) -> NoReturn:
    sys.stderr.write(parser.error_text(error))
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


def fail_config(prog: str, message: str) -> NoReturn:
    """A setting refused before the consumer starts: one line on stderr, exit status 1, no events."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


def load_properties(parser: ToolParser, path: str) -> dict[str, str]:
    """A Java ``.properties`` file; one that cannot be read is an argument error, as in the Java tool
    (whose message is the exception's: the bare path for a missing file)."""
    try:
        Path(path).read_bytes()
    except FileNotFoundError:
        fail_usage(parser, ArgumentError(path))
    except OSError as exc:
        fail_usage(parser, ArgumentError(f"{path} ({exc.strerror or exc})"))
    try:
        return read_properties_file(Path(path))
    except KafkaError as exc:
        fail_usage(parser, ArgumentError(str(exc)))


#: Java client settings that asyncconsumer has no counterpart for and that change nothing it does:
#: they are left out (with a warning) instead of failing, so that kafkatest's property files work.
#: The deserializers: the tools read keys and values as UTF-8 text, as Java's tools force.
NOT_APPLICABLE = frozenset({
    "key.deserializer",
    "value.deserializer",
})


def drop_not_applicable(properties: Mapping[str, str]) -> dict[str, str]:
    kept = {}
    for key, value in properties.items():
        if key in NOT_APPLICABLE:
            log.warning("ignoring %s=%s: asyncconsumer has no such setting", key, value)
        else:
            kept[key] = value
    return kept


def configure_logging(verbose: bool) -> None:
    """WARN and above on stderr in the Java tools' layout (``-v`` before the subcommand: INFO)."""
    logging.basicConfig(format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)", force=True)
    logging.getLogger("asyncconsumer").setLevel(logging.INFO if verbose else logging.WARNING)
