"""The pytest plugin (``pytest11`` entry point), used by a small user project in a pytest subprocess:
tests/plugin_project has no conftest.py and gets kafka_broker / kafka_topic / kafka_produce from the
installed package."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time

import pytest
from support.broker import BrokerBackend, backend_names_from_env, free_port
from support.paths import TESTS

PROJECT = TESTS / "plugin_project"


def run_project(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_entry_point_is_registered() -> None:
    plugins = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert plugins.get("asyncconsumer") == "asyncconsumer.testing.pytest_plugin"
    help_text = run_project("--help").stdout
    assert "--kafka-broker={tansu,kafka,testcontainers[:IMAGE]}" in help_text
    assert "--kafka-bootstrap=HOST:PORT" in help_text


def test_user_project_on_embedded_tansu() -> None:
    result = run_project("-s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 passed" in result.stdout, result.stdout
    assert "kafka_broker: EmbeddedBroker" in result.stdout, result.stdout


@pytest.mark.broker
@pytest.mark.kafka_jvm
def test_user_project_on_its_own_apache_kafka() -> None:
    """``--kafka-broker=kafka``: the plugin starts a private Apache Kafka (KRaft, from the Maven jars)
    for the user's session, and stops it after."""
    if "kafka" not in backend_names_from_env():
        pytest.skip("ASYNCCONSUMER_TEST_BROKER leaves Apache Kafka out")
    result = run_project("--kafka-broker=kafka", "-s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 passed" in result.stdout, result.stdout
    assert "kafka_broker: KafkaBroker" in result.stdout, result.stdout


@pytest.mark.broker
def test_user_project_on_an_existing_cluster(kafka_backend: BrokerBackend) -> None:
    """``--kafka-bootstrap`` points the fixtures at a running cluster (here the suite's own broker,
    Tansu and Apache Kafka)."""
    result = run_project(f"--kafka-bootstrap={kafka_backend.bootstrap}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 passed" in result.stdout, result.stdout


def test_a_failing_user_test_fails() -> None:
    """The fixtures do not hide failures: a wrong expectation in the user's test makes it fail."""
    result = run_project("-k", "test_each_test_had_its_own_topic")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout


def test_an_unreachable_cluster_ends_the_session_at_once_in_one_line() -> None:
    """``--kafka-bootstrap`` where nothing listens: one line naming the address, no test run, no
    librdkafka log, instead of a TimeoutError per test after 30 s each."""
    port = free_port()
    started = time.monotonic()
    result = run_project(f"--kafka-bootstrap=127.0.0.1:{port}")
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.INTERNAL_ERROR, output
    reason = (f"asyncconsumer pytest plugin: no Kafka broker reachable at --kafka-bootstrap=127.0.0.1:{port} "
              f"(127.0.0.1:{port}: Connection refused)")
    [line] = [line for line in output.splitlines() if f"127.0.0.1:{port}" in line]
    assert reason in line and "Exit" in line, output
    assert "rdkafka" not in output and "TimeoutError" not in output and "passed" not in output, output
    assert elapsed < 30, elapsed
