"""The ``asyncconsumer`` command-line tool, run as a subprocess against the test brokers."""

from __future__ import annotations

import base64
import json
import os
import pty
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.broker import BrokerBackend, free_port

from asyncconsumer.testing.producer import create_topic
from asyncconsumer.testing.producer import produce as produce_to

pytestmark = pytest.mark.broker

BINARY = b"\xff\xfe\x00binary"
TS = 1_700_000_000_000


def cli(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncconsumer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("asyncconsumer: error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]


def produce_one_per_batch(produce: Callable[..., Any], topic: str, records: list[Any]) -> None:
    """One produce call (one batch) per record: Tansu's ListOffsets(latest) is the last batch's base
    offset + 1, exact only with one-record batches."""
    for record in records:
        produce(topic, [record])


def test_consume_json_rows_exact(bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]) -> None:
    topic = new_topic(2)
    produce(topic, [
        (0, b"k1", b"v1", [("h", b"x"), ("h", b"y")], TS),
        (0, None, BINARY, [("bin", BINARY), ("none", None)], TS + 1),
        (1, BINARY, None, None, TS + 2),
        (1, "ключ".encode(), "значение".encode(), None, TS + 3),
    ])
    result = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
                 "--max-messages", "4", "--timeout-ms", "20000", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = sorted(map(json.loads, result.stdout.splitlines()), key=lambda r: (r["partition"], r["offset"]))
    b64 = base64.b64encode(BINARY).decode()
    assert rows == [
        {"topic": topic, "partition": 0, "offset": 0, "timestamp": TS, "key": "k1", "value": "v1",
         "headers": [{"key": "h", "value": "x"}, {"key": "h", "value": "y"}]},
        {"topic": topic, "partition": 0, "offset": 1, "timestamp": TS + 1, "key": None,
         "value": b64, "value_encoding": "base64",
         "headers": [{"key": "bin", "value": b64, "value_encoding": "base64"}, {"key": "none", "value": None}]},
        {"topic": topic, "partition": 1, "offset": 0, "timestamp": TS + 2, "key": b64, "key_encoding": "base64",
         "value": None, "headers": []},
        {"topic": topic, "partition": 1, "offset": 1, "timestamp": TS + 3, "key": "ключ", "value": "значение",
         "headers": []},
    ]
    assert result.stderr == "Processed a total of 4 messages\n"  # no progress line: stderr is a pipe


def test_consume_text_with_formatter_properties(bootstrap: str, kafka_topic: str, kafka_produce: Any) -> None:
    """(Written with the package's own pytest plugin fixtures, on each of the suite's brokers.)"""
    topic = kafka_topic
    kafka_produce(topic, [(0, b"a", b"one", [("h", b"1")], TS), (0, None, b"two", None, TS + 1)])
    result = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
                 "--max-messages", "2", "--timeout-ms", "20000",
                 "--property", "print.key=true", "--property", "print.partition=true",
                 "--property", "print.offset=true", "--property", "print.timestamp=true",
                 "--property", "print.headers=true", "--property", "key.separator= | ")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"CreateTime:{TS} | Partition:0 | Offset:0 | h:1 | a | one",
        f"CreateTime:{TS + 1} | Partition:0 | Offset:1 | NO_HEADERS | null | two",
    ]
    plain = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
                "--max-messages", "2", "--timeout-ms", "20000")
    assert plain.stdout == "one\ntwo\n"


def test_consume_partition_and_offset(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(1, None, f"v{i}".encode(), None, TS + i) for i in range(5)])
    result = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "1",
                 "--offset", "3", "--timeout-ms", "3000", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [(r["offset"], r["value"]) for r in map(json.loads, result.stdout.splitlines())] == [(3, "v3"), (4, "v4")]


def lag_json(bootstrap: str, group: str) -> list[dict[str, Any]]:
    result = cli("lag", "--bootstrap-server", bootstrap, "--group", group, "--format", "json")
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def test_group_consume_commits_and_lag_is_exact(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce_one_per_batch(produce, topic, [(p, None, f"{p}-{i}".encode()) for p in (0, 1) for i in range(4)])
    group = f"cli-{topic}"
    assert lag_json(bootstrap, group) == []
    # one partition at a time: with --partition the group only commits, nothing to rebalance
    for partition, count in ((0, 3), (1, 1)):
        result = cli("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
                     "--partition", str(partition), "--offset", "earliest", "--max-messages", str(count),
                     "--timeout-ms", "20000")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [f"{partition}-{i}" for i in range(count)]
    assert lag_json(bootstrap, group) == [
        {"topic": topic, "partition": 0, "current_offset": 3, "log_end_offset": 4, "lag": 1},
        {"topic": topic, "partition": 1, "current_offset": 1, "log_end_offset": 4, "lag": 3},
    ]
    table = cli("lag", "--bootstrap-server", bootstrap, "--group", group)
    assert table.returncode == 0, table.stderr
    lines = [line.split() for line in table.stdout.splitlines()]
    assert lines == [
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"],
        [group, topic, "0", "3", "4", "1"],
        [group, topic, "1", "1", "4", "3"],
    ]


def test_subscribed_group_continues_where_it_committed(
    kafka_backend: BrokerBackend, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic()
    produce_one_per_batch(produce, topic, [f"r{i}".encode() for i in range(5)])
    group = f"cli-sub-{topic}"
    args = ("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--group", group, "--from-beginning",
            "--timeout-ms", "30000", "--max-messages")
    first = cli(*args, "2", "--consumer-property", "session.timeout.ms=6000")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "r0\nr1\n"
    second = cli(*args, "3", "--consumer-property", "session.timeout.ms=6000")
    assert second.returncode == 0, second.stderr
    assert second.stdout == "r2\nr3\nr4\n"
    assert lag_json(bootstrap, group) == [
        {"topic": topic, "partition": 0, "current_offset": 5, "log_end_offset": 5, "lag": 0}
    ]


@pytest.mark.parametrize("how", ["assigned", "subscribed"])
def test_ctrl_c_stops_cleanly_and_commits(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], how: str
) -> None:
    """Ctrl+C commits what was printed, whether the partition was assigned or came from the group."""
    topic = new_topic()
    produce_one_per_batch(produce, topic, [f"r{i}".encode() for i in range(3)])
    group = f"cli-int-{how}-{topic}"
    where = ["--partition", "0", "--offset", "earliest"] if how == "assigned" else [
        "--from-beginning", "--consumer-property", "session.timeout.ms=6000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncconsumer", "consume", "--bootstrap-server", bootstrap, "--topic", topic,
         "--group", group, *where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines == ["r0\n", "r1\n", "r2\n"]
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip() == "Processed a total of 3 messages"
    assert lag_json(bootstrap, group)[0]["current_offset"] == 3


def test_progress_on_a_terminal_stderr(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """With stderr a terminal, a running count is drawn there (and wiped at the end); stdout keeps
    only the records."""
    topic = new_topic()
    produce(topic, [f"r{i}".encode() for i in range(3)])
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "asyncconsumer", "consume", "--bootstrap-server", bootstrap, "--topic", topic,
             "--from-beginning", "--max-messages", "3", "--timeout-ms", "20000"],
            stdout=subprocess.PIPE, stderr=terminal, stdin=subprocess.DEVNULL, timeout=60,
        )
        os.close(terminal)
        terminal = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0
    assert proc.stdout == b"r0\nr1\nr2\n"
    assert b" messages consumed" in drawn and b"\x1b[K" in drawn, drawn
    assert drawn.rstrip().endswith(b"Processed a total of 3 messages"), drawn


def test_a_refused_port_is_one_line_at_once(tmp_path: Path) -> None:
    """Every bootstrap server refuses: the tool says so at once, not after request.timeout.ms (30 s)."""
    port = free_port()
    for command in (["consume", "--topic", "t"], ["lag", "--group", "g"]):
        started = time.monotonic()
        result = cli(command[0], "--bootstrap-server", f"127.0.0.1:{port}", *command[1:], timeout=25)
        assert_one_line_error(result, f"127.0.0.1:{port}: connection refused", "is a broker running there?")
        assert result.returncode == 1
        assert time.monotonic() - started < 10, result


def test_a_broker_that_does_not_answer_is_waited_for(tmp_path: Path) -> None:
    """A server that accepts connections but says nothing is not refusing: the consumer's own wait
    (request.timeout.ms) decides."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        result = cli("consume", "--bootstrap-server", f"127.0.0.1:{port}", "--topic", "t",
                     "--consumer-property", "request.timeout.ms=1500", timeout=25)
    assert_one_line_error(result, "did not complete within 1.5s")


def test_missing_topic_is_one_line(bootstrap: str) -> None:
    result = cli("consume", "--bootstrap-server", bootstrap, "--topic", "no-such-topic-here", "--timeout-ms", "1000")
    assert_one_line_error(result, "'no-such-topic-here' does not exist")
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("args", "needles", "code"),
    [
        (["consume", "--topic", "t", "--nope"], ["--nope"], 2),
        (["consume", "--topic", "t"], ["--bootstrap-server"], 2),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--offset", "3"], ["--partition"], 2),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--partition", "0", "--offset", "x"],
         ["--offset"], 2),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--format", "xml"], ["xml"], 2),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--consumer-property", "no.such.thing=1"],
         ["no.such.thing"], 1),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--consumer-property", "fetch.max.bytes=lots"],
         ["fetch.max.bytes must be an integer, got 'lots'"], 1),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--consumer-property", "fetch.max.bytes=10"],
         ["fetch.max.bytes must be at least 1024"], 1),
        (["lag", "--bootstrap-server", "h:1", "--group", "g", "--consumer-property", "session.timeout.ms=0"],
         ["session.timeout.ms must be > 0"], 1),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--consumer-property", "novalue"],
         ["NAME=VALUE"], 1),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--property", "print.everything=true"],
         ["print.everything"], 1),
        (["lag", "--bootstrap-server", "h:1"], ["--group"], 2),
        (["lag", "--bootstrap-server", "h:1", "--group", "g", "--command-config", "/nonexistent/x.properties"],
         ["/nonexistent/x.properties"], 1),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], needles: list[str], code: int) -> None:
    result = cli(*args, timeout=30)
    assert_one_line_error(result, *needles)
    assert result.returncode == code
    assert result.stdout == ""


def test_python_m_and_console_script_agree() -> None:
    script = Path(sys.executable).with_name("asyncconsumer")
    assert script.exists(), "the console script is installed with the package"
    help_text = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert help_text == cli("--help").stdout
    assert "consume" in help_text and "lag" in help_text


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_command_config_sasl_login_and_bad_credentials(apache_kafka: Any, mechanism: str, tmp_path: Path) -> None:
    """``--command-config`` with a Java client's SASL settings: the right password reads, a wrong one
    ends in one line naming the failed login."""
    broker = apache_kafka.broker
    user, password = next(iter(broker.users.items()))
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    topic = create_topic(apache_kafka.bootstrap, f"cli-sasl-{mechanism.lower()}-{uuid.uuid4().hex[:8]}")
    produce_to(apache_kafka.bootstrap, topic, [b"secret"])

    def config(secret: str) -> Path:
        path = tmp_path / f"{secret}.properties"
        path.write_text(
            "# a Java client's settings\n"
            "security.protocol=SASL_PLAINTEXT\n"
            f"sasl.mechanism={mechanism}\n"
            f"sasl.jaas.config=org.apache.kafka.common.security.{module} required \\\n"
            f'    username="{user}" password="{secret}";\n'
        )
        return path

    sasl = broker.bootstrap_for("SASL_PLAINTEXT")
    good = cli("consume", "--bootstrap-server", sasl, "--topic", topic, "--from-beginning", "--max-messages", "1",
               "--timeout-ms", "20000", "--command-config", str(config(password)))
    assert good.returncode == 0, good.stderr
    assert good.stdout == "secret\n"
    bad = cli("consume", "--bootstrap-server", sasl, "--topic", topic, "--command-config", str(config("wrong")))
    assert_one_line_error(bad, "uthenticat")
    assert bad.returncode == 1
    bad_lag = cli("lag", "--bootstrap-server", sasl, "--group", "g", "--command-config", str(config("wrong")))
    assert_one_line_error(bad_lag, "uthenticat")
