"""The examples run as their docstrings say: each as its own process, started from a directory
outside the repository, against the test broker, with a poison pill among its records (produced by
confluent-kafka).  Each serves /healthz and /metrics; its consumer skips the pill
(``on_deserialization_error="skip"``: the WARNING naming its topic, partition and offset, counted
alike in /stats and /metrics) and the worker goes on past it; SIGTERM closes the consumer (exit
status 0, offsets committed).  The group workers get ``KAFKA_SESSION_TIMEOUT_MS=6000``: Tansu holds
a JoinGroup for half the session timeout (23 s with the default).

docs/getting-started.md shows fastapi_worker.py's code: the two must not drift apart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.broker import free_port
from support.paths import ROOT

EXAMPLES = ROOT / "examples"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
#: Three good records, a value that is not JSON at offset 3, two more good ones.
RECORDS = [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b"not json", b'{"n": 4}', b'{"n": 5}']
PILL_OFFSET = 3
#: The examples' session timeout here (KAFKA_SESSION_TIMEOUT_MS): Tansu then holds a join for 3 s.
SESSION_TIMEOUT_MS = "6000"


@dataclass
class Example:
    """An example running as ``python examples/NAME.py`` in its own process."""

    process: subprocess.Popen[bytes]
    log: Path
    port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"the example exited ({self.process.returncode}):\n{self.output()}"
            try:
                if check():
                    return
            except (OSError, ValueError):  # not listening yet
                pass
            assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s:\n{self.output()}"
            time.sleep(0.1)

    def stats(self) -> dict[str, Any]:
        status, body = self.get("/stats")
        return json.loads(body) if status == 200 else {}

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the example did not stop within 30 s of SIGTERM:\n{self.output()}") from None


@pytest.fixture
def run_example(tmp_path: Path) -> Iterator[Callable[..., Example]]:
    started: list[Example] = []

    def start(script: str, *args: str, **env: str) -> Example:
        port = free_port()
        log = tmp_path / f"{script}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "PYTEST_"))}
        environment.pop("PYTHONPATH", None)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path,  # outside the repository
                env={**environment, "PORT": str(port), **env}, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        example = Example(process, log, port)
        started.append(example)
        return example

    yield start
    for example in started:
        if example.process.poll() is None:
            example.process.kill()
            example.process.wait()


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0, read by confluent-kafka."""
    from confluent_kafka import Consumer as ConfluentConsumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    client = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        [tp] = client.committed([ConfluentPartition(topic, 0)], timeout=20)
        return int(tp.offset)
    finally:
        client.close()


def check_pill_and_close(example: Example, topic: str, metric: str, skipped: int) -> None:
    """/healthz, ``metric`` (a regex) in /metrics, the consumer's WARNING for the pill and the
    ``skipped`` records counted in /metrics, then a clean close on SIGTERM."""
    status, body = example.get("/healthz")
    assert status == 200, body
    status, scrape = example.get("/metrics")
    assert status == 200 and re.search(metric, scrape, re.MULTILINE), scrape
    assert re.findall(r"^asyncconsumer_records_skipped_total{[^}]*} (\S+)$", scrape, re.MULTILINE) == [f"{skipped}.0"]
    pattern = (rf"WARNING asyncconsumer\.\w+: {topic}-0 offset {PILL_OFFSET} skipped \(.*\): "
               r"the value deserializer raised JSONDecodeError")
    assert len(re.findall(pattern, example.output())) == 1, example.output()
    # uvicorn ends by raising the signal again once shut down (status -SIGTERM); the others exit 0
    assert example.terminate() in (0, -signal.SIGTERM), example.output()
    assert "the consumer is closed" in example.output(), example.output()
    assert "Traceback" not in example.output(), example.output()


def run_group_worker(script: str, bootstrap: str, run_example: Callable[..., Example]) -> None:
    from support.producer import create_topic
    from support.producer import produce as produce_to

    topic = create_topic(bootstrap, f"{script.partition('_')[0]}-{time.monotonic_ns()}", 1)
    group = f"g-{topic}"
    produce_to(bootstrap, topic, [(0, None, value) for value in RECORDS])
    example = run_example(script, KAFKA_BOOTSTRAP=bootstrap, KAFKA_TOPIC=topic, KAFKA_GROUP=group,
                          KAFKA_SESSION_TIMEOUT_MS=SESSION_TIMEOUT_MS)
    example.wait_for(lambda: example.stats().get("processed") == 5, "processing the five good records")
    assert example.stats() == {"processed": 5, "skipped": 1}
    # the position is past every record, the pill included
    position = rf'^asyncconsumer_position{{[^}}]*partition="0",topic="{topic}"}} 6\.0$'
    check_pill_and_close(example, topic, position, skipped=1)
    assert committed(bootstrap, group, topic) == len(RECORDS)  # the pill included: it is not read again


def test_fastapi_worker_example(bootstrap: str, run_example: Callable[..., Example]) -> None:
    """The getting-started page's worker, on each test broker."""
    run_group_worker("fastapi_worker.py", bootstrap, run_example)


@pytest.mark.parametrize("script", ["aiohttp_worker.py", "trio_worker.py"])
def test_other_group_worker_examples(script: str, apache_kafka: Any, run_example: Callable[..., Example]) -> None:
    """The same worker on aiohttp and on trio (on Apache Kafka only: what they add is not the broker's)."""
    run_group_worker(script, apache_kafka.bootstrap, run_example)


@pytest.mark.broker_feature("share_groups")
def test_share_worker_example(apache_kafka: Any, run_example: Callable[..., Example]) -> None:
    """A share group: the consumer rejects the pill (archived, never delivered again); the five good
    jobs are done once each."""
    from support.producer import create_topic
    from support.producer import produce as produce_to
    from support.share import share_group

    bootstrap = apache_kafka.bootstrap
    topic = create_topic(bootstrap, f"jobs-{time.monotonic_ns()}", 1)
    group = share_group(bootstrap)
    produce_to(bootstrap, topic, [(0, None, value) for value in RECORDS])
    example = run_example("share_worker.py", KAFKA_BOOTSTRAP=bootstrap, KAFKA_TOPIC=topic, KAFKA_GROUP=group)
    example.wait_for(lambda: example.stats().get("done") == 5, "the five good jobs")
    assert example.stats() == {"done": 5, "released": 0, "rejected": 0, "undecodable": 1, "in_progress": 0}
    # the five jobs handed out (never the pill)
    consumed = r"^kafka_consumer_share_fetch_manager_records_consumed_total{[^}]*} 5\.0$"
    check_pill_and_close(example, topic, consumed, skipped=1)


def test_custom_acquire_example(
    tmp_path: Path, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    """The KIP-957 example (no web server, no group): two tasks poll one consumer at once."""
    topic = new_topic(2)
    produce(topic, [(i % 2, None, b"%d" % i) for i in range(20)])
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_acquire.py"), bootstrap, topic, "20"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result
    assert result.stdout.startswith("read 20 records; polls by task: {"), result.stdout
    assert "'poller-0'" in result.stdout and "'poller-1'" in result.stdout, result.stdout


def test_forgotten_settings_are_named(tmp_path: Path) -> None:
    """``python fastapi_worker.py`` and ``uvicorn fastapi_worker:app`` without the environment: one
    message naming what to set (not uvicorn's 'Attribute "app" not found'), exit status 1.  Run side
    by side; the other examples read their settings with the same few lines."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    commands = [[str(EXAMPLES / "fastapi_worker.py")]]
    commands.append(["-m", "uvicorn", "fastapi_worker:app", "--app-dir", str(EXAMPLES)])
    processes = [subprocess.Popen([sys.executable, *command], cwd=tmp_path, env=environment, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                 for command in commands]
    for command, process in zip(commands, processes, strict=True):
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 1, (command, stderr)
        assert "set KAFKA_BOOTSTRAP and KAFKA_TOPIC" in stderr, (command, stderr)
        assert "Traceback" not in stderr and "not found" not in stderr, (command, stderr)


def test_getting_started_shows_the_fastapi_example() -> None:
    """The page's FastAPI block is fastapi_worker.py's code, from its first import to ``create_app``'s
    end, plus the line that makes the app."""
    page = GETTING_STARTED.read_text()
    section = page[page.index("## A background worker"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[: block.index("```\n")]
    *shown, last = block.rstrip("\n").split("\n")
    assert last == 'app = create_app("127.0.0.1:9092", "events", "api-worker")'
    source = (EXAMPLES / "fastapi_worker.py").read_text()
    start = source.index("import json\n")
    end = source.index("\n\n\ndef _settings()")
    assert "\n".join(shown).strip() == source[start:end].strip()


def test_the_examples_page_shows_every_example() -> None:
    """docs/examples.md includes each file of examples/ (the wheel and the sdist do not ship them:
    the docs are where a user copies them from); ``mkdocs --strict`` fails on a file that is gone."""
    page = (ROOT / "docs" / "examples.md").read_text()
    shown = re.findall(r'^--8<-- "examples/([\w.]+)"$', page, re.MULTILINE)
    files = sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "__init__.py")
    assert sorted(shown) == files
    for name in files:
        assert f"`{name}`" in page, f"{name} has no heading or row on the page"


def test_a_crashed_fastapi_worker_turns_healthz_to_503(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Your handler raising stops the worker: logged with its traceback, and /healthz answers 503 (the
    app goes on serving, so its orchestrator must be told).  In the test process (TestClient)."""
    from fastapi.testclient import TestClient

    sys.path.insert(0, str(EXAMPLES))
    try:
        from fastapi_worker import create_app
    finally:
        sys.path.remove(str(EXAMPLES))

    async def refuse(value: Any) -> None:
        if value == {"n": 2}:
            raise ValueError(f"cannot process {value!r}")

    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100}
    topic = new_topic(1)
    produce(topic, [(0, None, value) for value in RECORDS[:3]])
    with TestClient(create_app(bootstrap, topic, f"g-{topic}", process=refuse, **options)) as client:
        deadline = time.monotonic() + 30
        while (health := client.get("/healthz")).status_code == 200:
            assert time.monotonic() < deadline, health.json()
            time.sleep(0.1)
        assert health.json() == {"status": "worker stopped", "error": "ValueError(\"cannot process {'n': 2}\")"}
        assert client.get("/stats").json() == {"processed": 2, "skipped": 0}
        shutdown = time.monotonic()
    # Records were handed out and not committed: close() leaves at once, not after
    # rebalance_commit_wait_ms (10 s) waiting for commits no worker will make.
    assert time.monotonic() - shutdown < 5
    [stopped] = [r for r in caplog.records if r.getMessage().startswith("the worker stopped")]
    assert stopped.exc_info is not None and "cannot process" in str(stopped.exc_info[1])
