"""``asyncconsumer``: a console consumer and a consumer-group lag report, with the flags of Kafka's
own tools (``kafka-console-consumer``, ``kafka-consumer-groups --describe``), a local broker and a
line producer for trying things, and Kafka's verifiable consumers for its system tests.  See
docs/cli.md and docs/verifiable-consumer.md.

    asyncconsumer broker --topic events:3
    printf 'user-1:hello\n' | asyncconsumer produce --bootstrap-server localhost:9092 --topic events \
        --property parse.key=true --property key.separator=:
    asyncconsumer consume --bootstrap-server localhost:9092 --topic events --from-beginning --format json
    asyncconsumer lag --bootstrap-server localhost:9092 --group billing
    asyncconsumer verifiable-consumer --bootstrap-server localhost:9092 --topic events --group-id g1
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
import click

from .. import __version__
from ..errors import KafkaError
from ._format import TextFormat
from ._properties import consumer_properties, parse_pairs, read_properties_file
from ._run import (
    EXIT_INTERRUPTED,
    ConsumeArgs,
    Interrupt,
    LagArgs,
    _UsageError,
    connection_config,
    consume,
    lag,
    run_interruptible,
    stdout_bytes,
)

__all__ = ["main", "run", "version_text"]

F = TypeVar("F", bound=Callable[..., Any])


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _fail(message: str) -> NoReturn:
    click.echo(f"asyncconsumer: error: {message}", err=True)
    sys.exit(1)


def _run(body: Callable[[Interrupt], Any]) -> None:
    """Run an async command body; every expected failure becomes one line on stderr and exit 1."""
    try:
        status = anyio.run(run_interruptible, body)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # the reader went away (``| head``): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
    except BaseException as exc:  # narrowed below; anything else is a real bug
        inner = _innermost(exc)
        if isinstance(inner, KafkaError | _UsageError | OSError | TimeoutError):
            _fail(_one_line(inner))
        if isinstance(inner, BrokenPipeError):
            sys.exit(0)
        raise
    sys.exit(status)


def _connection_options(function: F) -> F:
    @click.option(
        "--bootstrap-server",
        "bootstrap_server",
        required=True,
        metavar="HOST:PORT[,...]",
        help="The brokers to connect to (comma-separated).",
    )
    @click.option(
        "--consumer-property",
        "consumer_property",
        multiple=True,
        metavar="NAME=VALUE",
        help="A consumer property with the Java client's dotted name (repeatable), e.g. fetch.max.bytes=1048576.",
    )
    @click.option(
        "--command-config",
        "command_config",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="A Java properties file of client settings (security.protocol, sasl.mechanism, sasl.jaas.config, ...).",
    )
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _properties(bootstrap_server: str, consumer_property: Sequence[str], command_config: Path | None) -> dict[str, str]:
    from_file = read_properties_file(command_config) if command_config is not None else {}
    merged = consumer_properties(from_file, parse_pairs(consumer_property, "--consumer-property"))
    merged["bootstrap.servers"] = bootstrap_server
    merged.setdefault("client.id", "asyncconsumer-cli")
    return merged


def version_text() -> str:
    """What ``asyncconsumer --version`` prints: the version, which record decoder this install runs
    (the compiled one, or the pure-Python one and why), and the Python and anyio it runs on."""
    from importlib.metadata import version

    from ..protocol.records import DECODER_DETAIL

    return (
        f"asyncconsumer {__version__}\n"
        f"record decoder: {DECODER_DETAIL}\n"
        f"{platform.python_implementation()} {platform.python_version()}, anyio {version('anyio')}"
    )


def _print_version(context: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not context.resilient_parsing:
        click.echo(version_text())
        context.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version, the record decoder in use (compiled or pure Python) and exit.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log the client's warnings and progress on stderr.")
def main(verbose: bool) -> None:
    """Read Kafka topics and consumer-group lag from the command line (asyncconsumer)."""
    # The client logs retries as warnings (an unreachable broker, a slow coordinator); the tool
    # reports the failure that ends it in one line, so those stay quiet unless asked for.  The
    # client logs at ERROR only what it also raises (docs/metrics.md), which the tool prints itself.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncconsumer").setLevel(logging.INFO if verbose else logging.CRITICAL)


@main.command("consume")
@_connection_options
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--group", default=None, help="Consumer group: join it and commit what was printed.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset when there is no committed one.")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Read only this partition.")
@click.option(
    "--offset",
    default=None,
    metavar="OFFSET|earliest|latest",
    help="Where to start in --partition (default: latest, or earliest with --from-beginning).",
)
@click.option("--max-messages", type=click.IntRange(min=1), default=None, help="Stop after this many records.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Stop when no record arrived for this many milliseconds.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: kafka-console-consumer's lines; json: one JSON object per record.",
)
@click.option(
    "--property",
    "formatter_property",
    multiple=True,
    metavar="NAME=VALUE",
    help="A text formatter property (repeatable): print.key, print.partition, print.offset, print.timestamp, "
    "print.headers, print.value, key.separator, line.separator, headers.separator, null.literal.",
)
def consume_command(
    bootstrap_server: str,
    consumer_property: tuple[str, ...],
    command_config: Path | None,
    topic: str,
    group: str | None,
    from_beginning: bool,
    partition: int | None,
    offset: str | None,
    max_messages: int | None,
    timeout_ms: int | None,
    output_format: str,
    formatter_property: tuple[str, ...],
) -> None:
    """Print the records of a topic (like kafka-console-consumer)."""
    if offset is not None:
        if partition is None:
            raise click.UsageError("--offset needs --partition")
        if offset not in ("earliest", "latest"):
            try:
                if int(offset) < 0:
                    raise ValueError
            except ValueError:
                raise click.BadParameter(
                    f"{offset!r} is not an offset (a number >= 0, 'earliest' or 'latest')", param_hint="--offset"
                ) from None
    try:
        args = ConsumeArgs(
            properties=_properties(bootstrap_server, consumer_property, command_config),
            overrides={},
            topic=topic,
            group=group,
            from_beginning=from_beginning,
            partition=partition,
            offset=offset,
            max_messages=max_messages,
            timeout_ms=timeout_ms,
            output_format=output_format,
            text_format=TextFormat.from_properties(parse_pairs(formatter_property, "--property")),
        )
    except KafkaError as exc:
        _fail(_one_line(exc))
    _run(lambda interrupt: consume(args, stdout_bytes(), sys.stderr, interrupt))


@main.command("lag")
@_connection_options
@click.option("--group", required=True, help="The consumer group to describe.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: aligned columns; json: a list of objects.",
)
def lag_command(
    bootstrap_server: str,
    consumer_property: tuple[str, ...],
    command_config: Path | None,
    group: str,
    output_format: str,
) -> None:
    """Per partition: the group's committed offset, the log end offset and the lag (like
    kafka-consumer-groups --describe)."""
    try:
        args = LagArgs(
            properties=_properties(bootstrap_server, consumer_property, command_config),
            overrides={},
            group=group,
            output_format=output_format,
        )
    except KafkaError as exc:
        _fail(_one_line(exc))
    _run(lambda interrupt: lag(args, sys.stdout, sys.stderr, interrupt))


@main.command("broker")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="The port to listen on (127.0.0.1); 0: a free one.  [default: 9092, or a free port if it is taken]",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="NAME[:PARTITIONS]",
    help="Create this topic at start (repeatable), e.g. events:3.",
)
@click.option(
    "--kind",
    type=click.Choice(["auto", "kafka", "embedded"]),
    default="auto",
    show_default=True,
    help="kafka: Apache Kafka from its jars (needs Java 17+); embedded: the Tansu broker; auto: Kafka if Java is "
    "found.",
)
@click.option(
    "--listener",
    "listeners",
    multiple=True,
    type=click.Choice(["SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
    help="Add this listener on a free port (repeatable; Apache Kafka only); its client settings go to a file "
    "whose path is printed.",
)
@click.option(
    "--user",
    "users",
    multiple=True,
    metavar="NAME:PASSWORD",
    help="A SASL user (repeatable; the first is in the client settings).  [default: 'client', random password]",
)
def broker_command(
    port: int | None, topics: tuple[str, ...], kind: str, listeners: tuple[str, ...], users: tuple[str, ...]
) -> None:
    """Run a local broker for trying things, until Ctrl-C (prints its bootstrap address)."""
    from . import _broker

    try:
        specs = [_broker.TopicSpec.parse(text) for text in topics]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--topic") from None
    try:
        named = [_broker.parse_user(text) for text in users]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--user") from None
    secured = [name for name in _broker.SECURED_LISTENERS if name in listeners]
    try:
        status = _broker.serve(kind, port, specs, sys.stdout, sys.stderr, secured, named)
    except (_broker.BrokerCommandError, KafkaError, OSError, RuntimeError) as exc:
        _fail(_one_line(_innermost(exc)))
    sys.exit(status)


@main.command("produce")
@click.option("--bootstrap-server", "bootstrap_server", required=True, metavar="HOST:PORT[,...]",
              help="The brokers to connect to (comma-separated).")
@click.option("--topic", required=True, help="The topic to write to (created if the broker creates topics on use).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Write every record to this partition (default: by key, as Kafka's producer does).")
@click.option(
    "--property",
    "reader_property",
    multiple=True,
    metavar="NAME=VALUE",
    help="A line reader property (repeatable): parse.key, key.separator, parse.headers, headers.delimiter, "
         "headers.separator, headers.key.separator, null.marker, ignore.error.",
)
@click.option(
    "--command-config",
    "command_config",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A Java properties file of connection settings (security.protocol, ssl.*, sasl.mechanism PLAIN or SCRAM, "
    "sasl.jaas.config).",
)
def produce_command(
    bootstrap_server: str,
    topic: str,
    partition: int | None,
    reader_property: tuple[str, ...],
    command_config: Path | None,
) -> None:
    """Write each line of stdin as a record (like kafka-console-producer)."""
    from . import _produce

    try:
        line_format = _produce.LineFormat.from_properties(parse_pairs(reader_property, "--property"))
    except (ValueError, KafkaError) as exc:
        raise click.BadParameter(str(exc), param_hint="--property") from None
    try:
        security = connection_config(_properties(bootstrap_server, (), command_config)) if command_config else None
    except KafkaError as exc:
        _fail(_one_line(exc))
    args = _produce.ProduceArgs(bootstrap=bootstrap_server, topic=topic, partition=partition, line_format=line_format,
                                security=security)
    _run(lambda interrupt: _produce.produce(args, _produce.stdin_bytes(), sys.stderr))


#: The verifiable tools parse their own arguments, exactly as the Java tools do (argparse4j's rules).
_RAW_ARGUMENTS = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@main.command("verifiable-consumer", context_settings=_RAW_ARGUMENTS, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def verifiable_consumer_command(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Kafka's VerifiableConsumer (for kafkatest): JSON events on stdout; -h lists its flags."""
    from . import _verifiable

    _verifiable.main(list(args), verbose_logs=_verbose(ctx))


@main.command("verifiable-share-consumer", context_settings=_RAW_ARGUMENTS, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def verifiable_share_consumer_command(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Kafka's VerifiableShareConsumer (for kafkatest): JSON events on stdout; -h lists its flags."""
    from . import _verifiable_share

    _verifiable_share.main(list(args), verbose_logs=_verbose(ctx))


def _verbose(ctx: click.Context) -> bool:
    return bool(ctx.parent is not None and ctx.parent.params.get("verbose"))


def run(argv: Sequence[str] | None = None) -> None:
    """The console script: like ``main()``, but a bad flag is one line on stderr (exit status 2)."""
    try:
        main.main(args=list(argv) if argv is not None else None, prog_name="asyncconsumer", standalone_mode=False)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"asyncconsumer: error: {_one_line(Exception(exc.format_message()))}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"asyncconsumer: error: {_one_line(Exception(exc.format_message()))}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
