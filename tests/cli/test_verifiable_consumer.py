"""``asyncconsumer verifiable-consumer``: Kafka's VerifiableConsumer command line and JSON events.

The first part needs no broker: the argparse4j-compatible parsing, usage and error text (the expected
strings were printed by Apache Kafka 4.4.0's tool and argparse4j 0.7.0's ``TextHelper``), the
settings the Java client refuses, and the rebalance events for rebalances asyncconsumer's listener is
not told about.  The rest runs the tool as a process against Apache Kafka, beside Java's own
VerifiableConsumer where the two are compared.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.broker import free_port
from support.paths import ROOT
from support.share import apache_kafka_bootstrap  # noqa: F401  (the module's ``bootstrap``: Apache Kafka)
from support.verifiable import Tool, assert_contiguous, events_of, key_shape, ours, per_partition_runs, run

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.cli import _verifiable
from asyncconsumer.cli._events import Events
from asyncconsumer.cli._javaargs import ArgumentError, HelpRequested, ToolParser, wrap

RANGE = "org.apache.kafka.clients.consumer.RangeAssignor"
COOPERATIVE = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
BASE = ["--bootstrap-server", "localhost:9092", "--topic", "t", "--group-id", "g"]

# ----------------------------------------------------------------------------------------- no broker

USAGE = """\
usage: verifiable-consumer [-h] --topic TOPIC
                           [--group-protocol GROUP-PROTOCOL]
                           [--group-remote-assignor GROUP-REMOTE-ASSIGNOR]
                           --group-id GROUP-ID
                           [--group-instance-id GROUP-INSTANCE-ID]
                           [--max-messages MAX-MESSAGES]
                           [--session-timeout TIMEOUT-MS] [--verbose]
                           [--enable-autocommit]
                           [--close-timeout CLOSE-TIMEOUT-MS]
                           [--reset-policy RESET-POLICY]
                           [--assignment-strategy ASSIGNMENT-STRATEGY]
                           [--consumer.config CONFIG-FILE]
                           [--command-config CONFIG-FILE]
                           [--runtime RUNTIME]
                           --bootstrap-server HOST1:PORT1[,HOST2:PORT2[...]]
"""


def test_usage_is_javas_with_our_runtime_flag() -> None:
    assert _verifiable.PARSER.usage() == USAGE
    java_flags = ToolParser(
        _verifiable.PARSER.prog, "", tuple(o for o in _verifiable.PARSER.options if o.flag != "--runtime")
    )
    assert java_flags.usage() == USAGE.replace("                           [--runtime RUNTIME]\n", "")


def test_a_long_program_name_puts_the_flags_under_the_usage_line() -> None:
    from asyncconsumer.cli import _verifiable_share

    lines = _verifiable_share.PARSER.usage().splitlines()
    assert lines[:2] == ["usage: verifiable-share-consumer", "       [-h] --topic TOPIC --group-id GROUP-ID"]
    # argparse4j counts the 6-column indent twice on that first line: 75 columns would have fitted
    assert lines[2] == "       [--max-messages MAX-MESSAGES] [--verbose]"


@pytest.mark.parametrize(("text", "offset", "indent", "expected"), [
    # printed by argparse4j 0.7.0's TextHelper.wrap at width 75
    ("verifiable-consumer: error: argument --session-timeout: could not convert '1.5' to Integer "
     "(For input string: \"1.5\")", 0, "",
     "verifiable-consumer: error: argument  --session-timeout:  could not convert\n"
     "'1.5' to Integer (For input string: \"1.5\")"),
    ("a-very-long-word-that-is-wider-than-the-line-a-very-long-word-that-is-wider-than-the-line-too x", 0, "",
     "a-very-long-word-that-is-wider-than-the-line-a-very-long-word-that-is-\nwider-than-the-line-too x"),
    ("Joins a consumer group, reads a topic and prints what happens (startup, partitions assigned and "
     "revoked, records consumed, offsets committed, shutdown) as one JSON object per line on stdout, as "
     "Apache Kafka's VerifiableConsumer does. asyncconsumer's implementation.", 0, "",
     "Joins a consumer group, reads  a  topic  and  prints what happens (startup,\n"
     "partitions assigned  and  revoked,  records  consumed,  offsets  committed,\n"
     "shutdown) as  one  JSON  object  per  line  on  stdout,  as  Apache Kafka's\n"
     "VerifiableConsumer does. asyncconsumer's implementation."),
    ("With the CLASSIC protocol: the assignors, as Java class names separated by commas (Range, "
     "RoundRobin, Sticky or CooperativeSticky Assignor in org.apache.kafka.clients.consumer) "
     "(default: org.apache.kafka.clients.consumer.RangeAssignor)", 25, " " * 25,
     "With the CLASSIC protocol:  the assignors, as Java\n"
     "                         class   names   separated    by   commas   (Range,\n"
     "                         RoundRobin, Sticky  or  CooperativeSticky Assignor\n"
     "                         in  org.apache.kafka.clients.consumer)   (default:\n"
     "                         org.apache.kafka.clients.consumer.RangeAssignor)"),
])
def test_wrap_justifies_as_argparse4j(text: str, offset: int, indent: str, expected: str) -> None:
    assert wrap(text, 75, offset, "", indent) == expected


def error_of(args: list[str]) -> str:
    try:
        _verifiable.PARSER.parse(args)
    except ArgumentError as exc:
        return _verifiable.PARSER.error_text(exc).removeprefix(USAGE)
    raise AssertionError(f"{args} parsed")


@pytest.mark.parametrize(("args", "expected"), [
    # the text after the usage, as Apache Kafka 4.4.0's VerifiableConsumer prints it on stderr
    (["--topic", "t"], "verifiable-consumer: error: argument --group-id is required\n"),
    (["--group-id", "g"], "verifiable-consumer: error: argument --topic is required\n"),
    (["--topic", "t", "--group-id", "g"], "verifiable-consumer: error: argument --bootstrap-server is required\n"),
    ([*BASE, "--bogus"], "verifiable-consumer: error: unrecognized arguments: '--bogus'\n"),
    ([*BASE, "--topicc"],
     "verifiable-consumer: error: unrecognized arguments: '--topicc'\n\nDid you mean:\n\t--topic\n"),
    ([*BASE, "--broker-list", "x:1"], "verifiable-consumer: error: unrecognized arguments: '--broker-list'\n"),
    ([*BASE, "--max-messages", "abc"],
     "verifiable-consumer: error:  argument  --max-messages:  could  not  convert\n"
     "'abc' to Integer (For input string: \"abc\")\n"),
    ([*BASE, "--max-messages", "99999999999"],
     "verifiable-consumer: error:  argument  --max-messages:  could  not  convert\n"
     "'99999999999' to Integer (For input string: \"99999999999\")\n"),
    ([*BASE, "--max-messages", "-.5"], "verifiable-consumer: error: argument --max-messages: expected one argument\n"),
    ([*BASE, "--top"], "verifiable-consumer: error: argument --topic: expected one argument\n"),
    (["--bootstrap-server", "x:1", "--topic", "t", "--group"],
     "verifiable-consumer: error: ambiguous option:  --group could match --group-\n"
     "id, --group-instance-id, --group-protocol, --group-remote-assignor\n"),
    ([*BASE, "--verbose=true"],
     "verifiable-consumer: error: argument  --verbose:  ignore  implicit argument\n'true'\n"),
    ([*BASE, "-x"], "verifiable-consumer: error: unrecognized arguments: '-x'\n"),
    ([*BASE, "--max-messages", "-5", "foo", "bar"], "verifiable-consumer: error: unrecognized arguments: 'foo bar'\n"),
    ([*BASE, "--", "--topic", "t"], "verifiable-consumer: error: unrecognized arguments: '--topic t'\n"),
])
def test_bad_flags_fail_with_javas_message(args: list[str], expected: str) -> None:
    assert error_of(args) == expected


def test_flags_parse_as_in_java() -> None:
    values = _verifiable.PARSER.parse([
        "--bootstrap-server=h:1", "--top", "t", "--group-id", "g", "--max-messages", "-1", "--max-messages", "+7",
        "--verb", "--session-timeout", "٣",
    ])
    assert values["bootstrap_server"] == "h:1"
    assert values["topic"] == "t"
    assert values["max_messages"] == 7  # the last one wins
    assert values["verbose"] is True
    assert values["session_timeout"] == 3  # Integer.valueOf takes any Unicode digit
    assert values["enable_autocommit"] is False
    assert values["close_timeout"] == 30000
    assert values["reset_policy"] == "earliest"
    assert values["assignment_strategy"] == RANGE
    for help_flag in (["-h"], ["--he"], ["-hx"], [*BASE, "-h", "--bogus"]):
        with pytest.raises(HelpRequested):
            _verifiable.PARSER.parse(help_flag)


def test_help_lists_every_flag_with_its_default() -> None:
    text = _verifiable.PARSER.help()
    assert text.startswith(USAGE + "\n")
    for option in _verifiable.PARSER.options:
        assert f"  {option.title()}" in text
    assert "(default: classic)" in text and "(default: -1)" in text and "(default: 30000)" in text
    assert "(default: false)" in text and "(default: earliest)" in text
    assert "\nConnection Group:\n  Group of arguments for connection to brokers\n\n  --bootstrap-server" in text
    assert max(len(line) for line in text.splitlines()) <= 75 + len("--bootstrap-server HOST1:PORT1[,HOST2:PORT2[...]]")


def tool(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[_verifiable.ConsumerTool | int, str, str]:
    try:
        result: _verifiable.ConsumerTool | int = _verifiable.tool_from_args(args)
    except SystemExit as exc:
        result = int(exc.code or 0)
    out, err = capsys.readouterr()
    return result, out, err


def test_the_file_is_read_first_and_the_flags_win(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.properties"
    config.write_text("group.id=from-file\nauto.offset.reset=latest\nmax.poll.records=7\nclient.id=me\n"
                      "metadata.recovery.strategy=none\n")
    made, out, _ = tool([*BASE, "--command-config", str(config), "--assignment-strategy",
                         f"{COOPERATIVE}", "--session-timeout", "10000", "--group-instance-id", "i1"], capsys)
    assert isinstance(made, _verifiable.ConsumerTool), out
    assert made.properties == {
        "group.id": "g", "auto.offset.reset": "earliest", "max.poll.records": "7", "client.id": "me",
        "metadata.recovery.strategy": "none", "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": "10000", "group.instance.id": "i1", "bootstrap.servers": "localhost:9092",
        "enable.auto.commit": "false",
    }
    assert not made.eager  # cooperative-sticky only: no revocation of everything before a rebalance
    assert out == ""


def test_the_deprecated_config_flag_says_so_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.properties"
    config.write_text("")
    made, out, _ = tool([*BASE, "--consumer.config", str(config), "--group-protocol", "Consumer",
                         "--group-remote-assignor", "uniform"], capsys)
    assert isinstance(made, _verifiable.ConsumerTool)
    assert out == ("Option --consumer.config has been deprecated and will be removed in a future version. "
                   "Use --command-config instead.\n")
    assert made.properties["group.protocol"] == "consumer"
    assert made.properties["group.remote.assignor"] == "uniform"
    assert "partition.assignment.strategy" not in made.properties


@pytest.mark.parametrize(("args", "file", "message"), [
    (["--group-protocol", "consumer", "--session-timeout", "10000"], "",
     "session.timeout.ms cannot be set when group.protocol=CONSUMER"),
    (["--group-protocol", "CONSUMER"], "heartbeat.interval.ms=1000\npartition.assignment.strategy=x\n",
     "partition.assignment.strategy, heartbeat.interval.ms cannot be set when group.protocol=CONSUMER"),
    ([], "group.remote.assignor=range\n", "group.remote.assignor cannot be set when group.protocol=CLASSIC"),
    (["--group-protocol", "foo"], "", "--group-protocol 'foo' is not one of CLASSIC, CONSUMER"),
    (["--reset-policy", "bogus"], "", "Invalid value bogus for configuration auto.offset.reset"),
    (["--reset-policy", "by_duration:PT1H"], "", "asyncconsumer has no by_duration reset"),
    (["--assignment-strategy", "range,com.example.MyAssignor"], "", "'com.example.MyAssignor' is not an assignor"),
])
def test_settings_the_java_client_refuses_end_it_before_startup(
    args: list[str], file: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.properties"
    config.write_text(file)
    made, out, err = tool([*BASE, *args, "--command-config", str(config)], capsys)
    assert made == 1
    assert out == ""
    assert err.startswith("verifiable-consumer: error: ") and message in err and err.count("\n") == 1, err


def test_config_file_errors_are_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.properties")
    made, out, err = tool([*BASE, "--command-config", missing], capsys)
    assert (made, out) == (1, "")
    assert err == USAGE + wrap(f"verifiable-consumer: error: {missing}") + "\n"
    made, out, err = tool([*BASE, "--command-config", missing, "--consumer.config", missing], capsys)
    assert (made, out) == (1, "")
    assert err == USAGE + ("verifiable-consumer: error: Options  --consumer.config and --command-config\n"
                           "are mutually exclusive.\n")


def test_no_arguments_print_the_help_and_exit_0_and_dash_h_exits_1() -> None:
    result = run(ours("verifiable-consumer"))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == _verifiable.PARSER.help()
    result = run(ours("verifiable-consumer", "-h"))
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout == _verifiable.PARSER.help()
    result = run(ours("verifiable-consumer", *BASE, "--max-messages", "x"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == USAGE + (
        "verifiable-consumer: error: argument --max-messages:  could not convert 'x'\n"
        "to Integer (For input string: \"x\")\n"
    )


class Recorder:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.events = Events(self.out)

    def take(self) -> list[tuple[str, list[int]]]:
        lines = self.out.getvalue().splitlines()
        self.out.seek(0)
        self.out.truncate()
        return [(e["name"], [p["partition"] for p in e["partitions"]]) for e in map(json.loads, lines)]


TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_eager_rebalances_are_reported_as_javas_callbacks_report_them() -> None:
    sink = Recorder()
    group = _verifiable.GroupEvents(sink.events, eager=True)
    group.on_partitions_assigned({TP1, TP0})
    assert sink.take() == [("partitions_assigned", [0, 1])]  # the first join revokes nothing
    group.on_partitions_revoked({TP0, TP1})
    group.on_partitions_assigned(set())  # the rebalance gave this member nothing
    assert sink.take() == [("partitions_revoked", [0, 1]), ("partitions_assigned", [])]
    group.on_partitions_assigned(set())  # owned nothing, got nothing: Java revokes [] first
    assert sink.take() == [("partitions_revoked", []), ("partitions_assigned", [])]
    group.on_partitions_assigned({TP0})
    assert sink.take() == [("partitions_revoked", []), ("partitions_assigned", [0])]
    group.on_partitions_revoked({TP0})  # closing: the revocation is the last word
    assert sink.take() == [("partitions_revoked", [0])]


def test_cooperative_and_consumer_protocol_callbacks_are_printed_as_they_come() -> None:
    sink = Recorder()
    group = _verifiable.GroupEvents(sink.events, eager=False)
    group.on_partitions_assigned(set())  # joined with an empty assignment
    group.on_partitions_assigned({TP0, TP1})
    group.on_partitions_revoked({TP1})
    group.on_partitions_assigned(set())  # nothing revoked before it: no [] revocation either
    assert sink.take() == [("partitions_assigned", []), ("partitions_assigned", [0, 1]),
                           ("partitions_revoked", [1]), ("partitions_assigned", [])]


class StartedClient:
    """A client for ``run_tool`` that starts at once and notes each close's timeout."""

    def __init__(self) -> None:
        self.closed: list[float] = []

    async def __aenter__(self) -> StartedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def close(self, timeout: float) -> None:
        self.closed.append(timeout)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_signals_are_handled_before_startup_complete_is_printed(backend: str) -> None:
    """kafkatest may stop a node as soon as it printed startup_complete (the JVM's hook is in place by
    then): the tool's handler must be too, or SIGTERM kills it without shutdown_complete."""
    import anyio

    from asyncconsumer.cli._events import run_tool

    handlers: list[object] = []

    class Watched(Events):
        def emit(self, name: str, **fields: Any) -> None:
            if name == "startup_complete":
                handlers.append(signal.getsignal(signal.SIGTERM))
            super().emit(name, **fields)

    async def session(client: StartedClient, shutdown: object) -> None:
        return None

    sink = io.StringIO()
    status = anyio.run(run_tool, StartedClient, session, Watched(sink), "consumer", backend=backend)
    assert status == 0
    assert handlers and handlers[0] not in (signal.SIG_DFL, None), handlers
    assert [json.loads(line)["name"] for line in sink.getvalue().splitlines()] == [
        "startup_complete", "shutdown_complete", "shutdown_requested"]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sessions_error_is_fatal_and_the_client_closes_within_the_close_timeout(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both tools' sessions leave their error and the close to run_tool: the error is logged as
    the Java tools' last word, the client is closed once with the tool's close timeout, and the
    run ends as a shutdown does (status 0, shutdown_complete)."""
    import anyio

    from asyncconsumer.cli._events import run_tool

    client = StartedClient()

    async def session(client: StartedClient, shutdown: object) -> None:
        raise RuntimeError("the broker said no")

    sink = io.StringIO()
    status = anyio.run(run_tool, lambda: client, session, Events(sink), "consumer", 7.5, backend=backend)
    assert status == 0 and client.closed == [7.5]
    assert "terminating consumer process: the broker said no" in caplog.text
    assert [json.loads(line)["name"] for line in sink.getvalue().splitlines()] == [
        "startup_complete", "shutdown_complete", "shutdown_requested"]


def test_a_signal_while_no_broker_answers_ends_the_tool() -> None:
    port = free_port()
    with Tool(ours("verifiable-consumer", "--bootstrap-server", f"127.0.0.1:{port}", "--topic", "t",
                   "--group-id", "g", "--command-config", "/dev/null")) as proc:
        proc.wait_for_name("startup_complete", timeout=30)
        time.sleep(1.0)
        sent = proc.signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert time.monotonic() - sent < 10
        assert proc.names() == ["startup_complete", "shutdown_requested", "shutdown_complete"]


GLOBALS = ROOT / "tools" / "kafkatest" / "globals.json"


def test_the_kafkatest_globals_run_our_tools_and_pgrep_finds_them() -> None:
    """What kafkatest does with the globals file: import ``class``, run ``exec_cmd`` plus its flags, find
    the process with ``pgrep -f '<exec_cmd>'`` and stop it with SIGTERM."""
    entries = json.loads(GLOBALS.read_text())
    assert set(entries) == {"VerifiableConsumer", "VerifiableShareConsumer"}
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    port = free_port()
    for service, entry in entries.items():
        assert entry["class"] == "kafkatest.services.verifiable_client.VerifiableClientApp", service
        command = [*shlex.split(entry["exec_cmd"]), "--bootstrap-server", f"127.0.0.1:{port}", "--topic", "t",
                   "--group-id", "g"]
        with Tool(command, env=env) as proc:
            proc.wait_for_name("startup_complete", timeout=30)
            found = subprocess.run(["pgrep", "-f", entry["exec_cmd"]], capture_output=True, text=True, check=False)
            assert str(proc.proc.pid) in found.stdout.split(), (service, found)
            proc.signal(signal.SIGTERM)
            assert proc.wait(20) == 143
            assert proc.names() == ["startup_complete", "shutdown_requested", "shutdown_complete"]


# ---------------------------------------------------------------------------------- Apache Kafka


def verifiable(bootstrap: str, topic: str, group: str, *args: str) -> list[str]:
    return ours("verifiable-consumer", "--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group, *args)


@pytest.fixture
def group_name(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"vc-{name}-{time.monotonic_ns() % 10**9}"


def committed_offsets(bootstrap: str, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    import anyio

    async def fetch() -> dict[TopicPartition, int | None]:
        async with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False) as consumer:
            found = await consumer.committed(tps)
            return {tp: (om.offset if om is not None else None) for tp, om in found.items()}

    return anyio.run(fetch)


def check_stream(events: list[dict[str, Any]], total: int, *, manual: bool = True) -> None:
    """What kafkatest checks, and the order Java prints in."""
    names = [e["name"] for e in events]
    assert names[0] == "startup_complete"
    assert names[-2:] == ["shutdown_complete", "shutdown_requested"], names  # the JVM hook's quirk
    first_records = names.index("records_consumed")
    assert "partitions_assigned" in names[:first_records]
    for event in events:
        assert list(event)[:2] == ["timestamp", "name"] and isinstance(event["timestamp"], int)
    consumed = [e for e in events if e["name"] == "records_consumed"]
    assert sum(e["count"] for e in consumed) == total
    for event in consumed:
        assert event["count"] == sum(p["count"] for p in event["partitions"])
        for p in event["partitions"]:
            assert list(p) == ["topic", "partition", "count", "minOffset", "maxOffset"]
            assert p["count"] == p["maxOffset"] - p["minOffset"] + 1
    if manual:
        for index, event in enumerate(events):
            if event["name"] != "records_consumed":
                continue
            commit = events[index + 1]
            assert commit["name"] == "offsets_committed", names[index: index + 2]
            assert list(commit) == ["timestamp", "name", "offsets", "success"] and commit["success"] is True
            assert commit["offsets"] == [
                {"topic": p["topic"], "partition": p["partition"], "offset": p["maxOffset"] + 1}
                for p in event["partitions"]
            ]
    else:
        assert "offsets_committed" not in names


@pytest.mark.broker
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_plain_consume_commits_after_each_batch(
    protocol: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(3)
    produce(topic, [(i % 3, None, f"{i}") for i in range(600)])
    events, _ = events_of(verifiable(bootstrap, topic, group_name, "--group-protocol", protocol,
                                     "--max-messages", "600"))
    check_stream(events, 600)
    runs = per_partition_runs(events)
    assert {tp: assert_contiguous(r) for tp, r in runs.items()} == {(topic, p): 200 for p in range(3)}
    names = [e["name"] for e in events]
    # max-messages reached: close revokes everything still owned, then shutdown_complete
    assert names[-3:] == ["partitions_revoked", "shutdown_complete", "shutdown_requested"]
    assert events[-3]["partitions"] == [{"topic": topic, "partition": p} for p in range(3)]
    tps = [TopicPartition(topic, p) for p in range(3)]
    assert committed_offsets(bootstrap, group_name, tps) == dict.fromkeys(tps, 200)


@pytest.mark.broker
def test_max_messages_stops_mid_topic_and_commits_only_what_it_reported(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, f"{i}") for i in range(100)])
    events, _ = events_of(verifiable(bootstrap, topic, group_name, "--max-messages", "37"))
    check_stream(events, 37)
    assert committed_offsets(bootstrap, group_name, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 37}
    # the next run of the group starts where this one stopped
    events, _ = events_of(verifiable(bootstrap, topic, group_name, "--max-messages", "63"))
    assert per_partition_runs(events)[(topic, 0)][0][0] == 37
    check_stream(events, 63)


@pytest.mark.broker
def test_a_batch_that_came_back_before_a_signal_is_reported_and_committed(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    """SIGTERM right after a poll returned records: as in Java, the batch is still reported and
    committed before the consumer closes (dropping it would also hold close() up in the rebalance-safe
    wait for a commit that never comes)."""
    import anyio

    from asyncconsumer.cli._events import Shutdown

    topic = new_topic(1)
    produce(topic, [(0, None, f"{i}") for i in range(20)])
    tool = _verifiable.tool_from_args(["--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group_name])
    out = io.StringIO()
    events = Events(out)
    shutdown = Shutdown(events)

    class SignalledAfterRecords(Consumer[Any, Any]):
        async def getmany(self, *partitions: TopicPartition, timeout: float | None = None,
                          max_records: int | None = None) -> Any:
            batch = await super().getmany(*partitions, timeout=timeout, max_records=max_records)
            if batch:
                shutdown.signal = signal.SIGTERM  # as if the signal came as the poll returned
            return batch

    async def session() -> float:
        async with SignalledAfterRecords.from_properties(tool.properties) as consumer:
            began = time.monotonic()
            await _verifiable._session(tool, consumer, events, shutdown)
            return time.monotonic() - began

    took = anyio.run(session)
    names = [json.loads(line)["name"] for line in out.getvalue().splitlines()]
    assert names == ["partitions_assigned", "records_consumed", "offsets_committed", "partitions_revoked"], names
    assert committed_offsets(bootstrap, group_name, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 20}
    assert took < 8, f"{took:.1f}s"


@pytest.mark.broker
def test_verbose_prints_record_data_before_each_batch(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(2)
    records = [(0, b"k0", b"v0"), (0, None, b"no key"), (1, b"k1", None), (1, "ключ".encode(), b"\xff\xfe"),
               (0, b"", b"")]
    produce(topic, records)
    events, stdout = events_of(verifiable(bootstrap, topic, group_name, "--verbose", "--max-messages", "5"))
    check_stream(events, 5)
    data = [e for e in events if e["name"] == "record_data"]
    assert all(list(e) == ["timestamp", "name", "key", "value", "topic", "partition", "offset"] for e in data)
    assert sorted((e["partition"], e["offset"], e["key"], e["value"]) for e in data) == [
        (0, 0, "k0", "v0"), (0, 1, None, "no key"), (0, 2, "", ""), (1, 0, "k1", None), (1, 1, "ключ", "\ufffd\ufffd"),
    ]
    # each batch's record_data come right before its records_consumed, partition by partition
    pending: list[tuple[int, int]] = []
    for event in events:
        if event["name"] == "record_data":
            pending.append((event["partition"], event["offset"]))
        elif event["name"] == "records_consumed":
            listed = [(p["partition"], offset) for p in event["partitions"]
                      for offset in range(p["minOffset"], p["maxOffset"] + 1)]
            assert pending == listed
            pending = []
    assert '"key":null' in stdout and '"value":null' in stdout


@pytest.mark.broker
def test_auto_commit_prints_no_offsets_committed(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, f"{i}") for i in range(50)])
    events, _ = events_of(verifiable(bootstrap, topic, group_name, "--enable-autocommit", "--max-messages", "50"))
    check_stream(events, 50, manual=False)
    # closing commits what was consumed, as the Java client's close does with auto-commit on
    assert committed_offsets(bootstrap, group_name, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 50}


@pytest.mark.broker
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_sigterm_commits_revokes_and_completes_quickly(
    protocol: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, f"{i}") for i in range(200)])
    with Tool(verifiable(bootstrap, topic, group_name, "--group-protocol", protocol,
                         "--close-timeout", "15000")) as proc:
        proc.wait_for_name("offsets_committed")
        time.sleep(0.5)
        sent = proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        took = time.monotonic() - sent
    assert took < 10, f"{took:.1f}s from SIGTERM to exit"
    events = proc.events
    names = [e["name"] for e in events]
    tail = names[names.index("shutdown_requested"):]
    assert tail == ["shutdown_requested", "partitions_revoked", "shutdown_complete"], names
    work = [e for e in events if e["name"] in ("records_consumed", "offsets_committed")]
    assert work[-1]["name"] == "offsets_committed"  # the last batch was committed
    position = {(p["topic"], p["partition"]): p["maxOffset"] + 1
                for e in events if e["name"] == "records_consumed" for p in e["partitions"]}
    assert sum(position.values()) == sum(e["count"] for e in events if e["name"] == "records_consumed") == 200
    tps = [TopicPartition(topic, p) for p in range(2)]
    assert committed_offsets(bootstrap, group_name, tps) == {tp: position[(tp.topic, tp.partition)] for tp in tps}


def owned_by(events: list[dict[str, Any]], eager: bool) -> set[int]:
    """The partitions a member owns after ``events``, read as kafkatest's handlers read them."""
    owned: set[int] = set()
    for event in events:
        if event["name"] == "partitions_assigned":
            parts = {p["partition"] for p in event["partitions"]}
            owned = parts if eager else owned | parts
        elif event["name"] == "partitions_revoked":
            owned -= {p["partition"] for p in event["partitions"]}
    return owned


@pytest.mark.broker
@pytest.mark.parametrize(("protocol", "strategy"), [
    ("classic", RANGE), ("classic", COOPERATIVE), ("consumer", None),
])
def test_a_second_member_splits_the_partitions(
    protocol: str, strategy: str | None, bootstrap: str, new_topic: Callable[..., str],
    produce: Callable[..., Any], group_name: str,
) -> None:
    topic = new_topic(1)  # one partition for two members: one of them gets an empty assignment
    produce(topic, [(0, None, f"{i}") for i in range(10)])
    extra = ["--group-protocol", protocol] + (["--assignment-strategy", strategy] if strategy else [])
    eager = strategy == RANGE
    with Tool(verifiable(bootstrap, topic, group_name, *extra)) as first:
        first.wait_for_name("offsets_committed")
        with Tool(verifiable(bootstrap, topic, group_name, *extra)) as second:
            second.wait_for_name("partitions_assigned")
            # settled: both joined (their last rebalance event is an assignment, as kafkatest's "joined"),
            # one owns the partition and the other nothing
            until(lambda: joined(first) and joined(second) and sorted(
                map(len, (owned_by(first.events, eager), owned_by(second.events, eager)))) == [0, 1],
                  lambda: (first.names(), second.names()))
            both = first.events + second.events
            empty = [e for e in both if e["name"] == "partitions_assigned" and not e["partitions"]]
            assert empty, "the member without a partition was told so (partitions_assigned [])"
            if eager:  # every rebalance revokes everything first
                assert first.names().count("partitions_revoked") >= 1
            leaving, staying = (second, first) if owned_by(second.events, eager) else (first, second)
            seen = len(staying.events)
            leaving.signal(signal.SIGTERM)
            assert leaving.wait(30) == 143
            assert leaving.names()[-2:] == ["partitions_revoked", "shutdown_complete"]
            staying.wait_for(lambda e: e["name"] == "partitions_assigned" and e["partitions"] != [], start=seen,
                             what="the partition back")
            assert owned_by(staying.events, eager) == {0}
            staying.signal(signal.SIGTERM)
            assert staying.wait(30) == 143
    for proc in (first, second):
        assert not proc.other_lines, proc.other_lines


def joined(proc: Tool) -> bool:
    moves = [name for name in proc.names() if name in ("partitions_assigned", "partitions_revoked")]
    return bool(moves) and moves[-1] == "partitions_assigned"


def until(condition: Callable[[], bool], describe: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, describe()
        time.sleep(0.1)


@pytest.mark.broker
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_fenced_static_member_ends_by_itself(
    protocol: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, f"{i}") for i in range(10)])
    args = verifiable(bootstrap, topic, group_name, "--group-protocol", protocol, "--group-instance-id", "inst-1")
    with Tool(args) as first:
        first.wait_for_name("offsets_committed")
        with Tool(args) as second:
            # classic: the newer member takes the id over and the older one is fenced (FENCED_INSTANCE_ID);
            # KIP-848: the newer one is refused while the older one holds the id (UNRELEASED_INSTANCE_ID)
            fenced, survivor = (first, second) if protocol == "classic" else (second, first)
            assert fenced.wait(60) == 0, fenced.describe()
            names = fenced.names()
            assert names[-2:] == ["shutdown_complete", "shutdown_requested"], names
            error = "FENCED_INSTANCE_ID" if protocol == "classic" else "UNRELEASED_INSTANCE_ID"
            assert error in fenced.stderr and "Error during processing, terminating consumer process" in fenced.stderr
            if protocol == "classic":
                assert names[-3] == "partitions_revoked"
                survivor.wait_for_name("partitions_assigned")
            else:
                assert "partitions_assigned" not in names
            assert survivor.proc.poll() is None
            survivor.signal(signal.SIGTERM)
            assert survivor.wait(30) == 143


@pytest.mark.broker
def test_the_trio_runtime(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], group_name: str
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, f"{i}") for i in range(100)])
    events, _ = events_of(verifiable(bootstrap, topic, group_name, "--runtime", "trio", "--max-messages", "100",
                                     "--verbose"))
    check_stream(events, 100)
    assert sum(1 for e in events if e["name"] == "record_data") == 100


# ------------------------------------------------------------------------------------------ vs Java


def java_verifiable(apache_kafka: Any, *args: str) -> list[str]:
    return list(apache_kafka.broker.java_command("org.apache.kafka.tools.VerifiableConsumer", *args))


@pytest.mark.broker
def test_the_same_events_as_javas_verifiable_consumer(
    apache_kafka: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(3)
    produce(topic, [(i % 3, f"k{i}" if i % 2 else None, None if i % 7 == 0 else f"v{i}") for i in range(90)])
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--max-messages", "90", "--verbose"]
    java = run(java_verifiable(apache_kafka, *args, "--group-id", f"{topic}-java"), timeout=120)
    mine = run(ours("verifiable-consumer", *args, "--group-id", f"{topic}-ours"))
    assert java.returncode == mine.returncode == 0, (java.stderr[-2000:], mine.stderr)
    java_events = [json.loads(line) for line in java.stdout.splitlines()]
    our_events = [json.loads(line) for line in mine.stdout.splitlines()]
    # the same events with the same keys in the same order (batches may be cut differently)
    shapes = {(e["name"], key_shape(e)) for e in java_events}
    assert {(e["name"], key_shape(e)) for e in our_events} == shapes
    assert [e["name"] for e in java_events if e["name"] != "record_data"][:2] == ["startup_complete",
                                                                                   "partitions_assigned"]
    for events in (java_events, our_events):
        names = [e["name"] for e in events]
        assert names[:2] == ["startup_complete", "partitions_assigned"]
        assert names[-3:] == ["partitions_revoked", "shutdown_complete", "shutdown_requested"]
    # the same records, read the same way (nulls, text)
    def records(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((e["partition"], e["offset"], e["key"], e["value"]) for e in events if e["name"] == "record_data")
    assert records(our_events) == records(java_events)
    assert len(records(java_events)) == 90


@pytest.mark.broker
def test_bad_command_lines_fail_as_javas(apache_kafka: Any) -> None:
    java_usage = run(java_verifiable(apache_kafka, "-h")).stdout.split("\n\n")[0] + "\n"
    java_flags = {item.strip("[]").split()[0] for item in java_usage.split() if item.startswith(("[--", "--"))}
    # our usage, less the flags this Java tool does not have (--runtime; --close-timeout before 4.4)
    same_flags = ToolParser(_verifiable.PARSER.prog, "",
                            tuple(o for o in _verifiable.PARSER.options if o.flag in java_flags))
    assert same_flags.usage() == java_usage
    for args in (["--topic", "t"], [*BASE, "--grp-id", "x"], [*BASE, "--max-messages", "2147483648"],
                 ["--bootstrap-server", "h:1", "--group", "g"], [*BASE, "--enable-autocommit=yes"], [*BASE, "x", "y"]):
        java = run(java_verifiable(apache_kafka, *args))
        mine = run(ours("verifiable-consumer", *args))
        assert (mine.returncode, mine.stdout, java.stdout) == (1, "", ""), args
        assert java.returncode == 1, args
        assert mine.stderr.removeprefix(_verifiable.PARSER.usage()) == java.stderr.removeprefix(java_usage), args
    for args in ([*BASE, "-hx"],):  # help: on stdout (our own wording), status 1 as in Java
        java = run(java_verifiable(apache_kafka, *args))
        mine = run(ours("verifiable-consumer", *args))
        assert (mine.returncode, mine.stderr) == (java.returncode, java.stderr) == (1, ""), args
        assert java.stdout.startswith(java_usage) and mine.stdout.startswith(_verifiable.PARSER.usage())
