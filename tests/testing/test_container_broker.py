"""``ContainerBroker``: Apache Kafka's image in a container, through testcontainers, for real.

The session takes the Docker daemon that runs, or starts one of its own (root, Debian's
``docker.io``; no bridge, host networking only), builds the local Kafka image from the jars
``KafkaBroker`` downloaded (``tools/kafka_image``: nothing is pulled) and runs the container broker
on it, the same code that runs ``apache/kafka:4.4.0`` where that image can be pulled.  At the end no
container and no daemon of the session is left (the fixtures check).  Where no daemon can be had
(not root, no ``dockerd``) the tests that need one skip, saying why.

CI runs one of them, a group consuming and committing on asyncio and trio.  The ``long`` ones run
the pytest plugin's ``--kafka-broker=testcontainers:IMAGE`` on a user's project, and a subset of the
suite's own consumer, group and offsets tests on the container broker
(``ASYNCCONSUMER_KAFKA_IMAGE``), in pytest subprocesses.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.broker import in_ci
from support.consumers import FAST, tps
from support.paths import ROOT
from support.producer import admin_client, produce

from asyncconsumer import Consumer
from asyncconsumer.testing import KAFKA_IMAGE, ContainerBroker, ContainerBrokerError
from asyncconsumer.testing._probe import metadata_brokers
from asyncconsumer.testing.container import LOG_DIRS, image_version, kafka_env
from asyncconsumer.testing.pytest_plugin import broker_kind

# ------------------------------------------------------------------------------------- no Docker


def test_properties_become_the_official_images_variables() -> None:
    assert kafka_env({"log.dirs": "/x", "num.partitions": 3, "auto.create.topics.enable": False}) == {
        "KAFKA_LOG_DIRS": "/x", "KAFKA_NUM_PARTITIONS": "3", "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }
    # "_" and "-" in a name: the image reads "__" as "_" and "___" as "-"
    assert kafka_env({"listener.name.sasl_ssl.x": 1, "a-b.c": 2}) == {
        "KAFKA_LISTENER_NAME_SASL__SSL_X": "1", "KAFKA_A___B_C": "2",
    }


@pytest.mark.parametrize(("name", "why"), [
    ("Log.Dirs", "'log.dirs'"),  # the image lowers every name
    ("a._b", "'a-b'"),  # "._" is "___": it reads back as "-"
    ("heap.opts", "JVM setting"),  # KAFKA_HEAP_OPTS is the broker's heap, not an entry
])
def test_a_name_the_variables_cannot_carry_is_refused_before_any_container(name: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        kafka_env({name: "1"})
    with pytest.raises(ValueError, match=f"entry {re.escape(repr(name))}"):
        ContainerBroker("local/kafka:4.4.0", config={name: "1"})


def test_the_image_tag_names_the_release() -> None:
    assert KAFKA_IMAGE == "apache/kafka:4.4.0"
    assert image_version("apache/kafka:3.9.1") == "3.9.1"
    assert image_version("registry.example:5000/kafka:4.0.0-rc1") == "4.0.0"
    assert image_version("registry.example:5000/kafka") is None
    assert image_version("apache/kafka:latest") is None
    assert image_version("apache/kafka:4.4.0@sha256:abc") == "4.4.0"


def test_the_plugin_option_takes_testcontainers_and_an_image() -> None:
    for value in ("tansu", "kafka", "testcontainers", "testcontainers:apache/kafka:4.4.0", "testcontainers:x"):
        assert broker_kind(value) == value
    for value in ("docker", "testcontainers:", "testcontainers: ", "kafka:4.4.0"):
        with pytest.raises(argparse.ArgumentTypeError, match="choose tansu, kafka, testcontainers"):
            broker_kind(value)


def test_without_testcontainers_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "testcontainers.core.container", None)  # import fails
    with pytest.raises(ContainerBrokerError, match=re.escape("pip install 'asyncconsumer[testcontainers]'")):
        ContainerBroker().start()


def test_no_docker_daemon_is_a_typed_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("testcontainers")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    broker = ContainerBroker("local/kafka:4.4.0")
    with pytest.raises(ContainerBrokerError, match="no Docker daemon answers"):
        broker.start()
    with pytest.raises(ContainerBrokerError, match="not started"):
        _ = broker.bootstrap


# ------------------------------------------------------------------------------- Docker fixtures


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[Any]:
    """The session's Docker daemon (``support.docker``): at the end no container of the session is
    left and a daemon started here is gone, with every process it started."""
    if in_ci():
        import testcontainers  # noqa: F401  (in CI a missing test dependency is an error)
    else:
        pytest.importorskip("testcontainers")
    from support.docker import DockerUnavailable, start_daemon

    try:
        daemon = start_daemon()
    except DockerUnavailable as exc:
        pytest.skip(f"the container broker's tests need Docker: {exc}")
    try:
        yield daemon
    finally:
        problems = daemon.stop()
        assert not problems, "; ".join(problems)


@pytest.fixture(scope="session")
def kafka_image(docker_daemon: Any) -> str:
    """The local Kafka image (``tools/kafka_image``), built once per session at most."""
    from support.docker import local_image

    from tools.kafka_image import ImageBuildError

    try:
        tag, _ = local_image(docker_daemon)
    except ImageBuildError as exc:
        if in_ci():
            raise
        pytest.skip(f"cannot build the local Kafka image: {exc}")
    return tag


@pytest.fixture(scope="module")
def container_kafka(kafka_image: str, docker_daemon: Any) -> Iterator[ContainerBroker]:
    """A container broker for this module, removed at its end (checked)."""
    with ContainerBroker(kafka_image, config={"group.max.size": 77}) as broker:
        container = broker.container_id
        yield broker
    left = subprocess.run(["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"id={container}"],
                          capture_output=True, text=True, env=docker_daemon.env, check=True).stdout.split()
    assert left == [], f"the container {container} outlived stop()"


# ----------------------------------------------------------------------------------- CI's test


@pytest.mark.kafka_jvm  # a Kafka JVM of its own (in the container): on the Apache Kafka worker
@pytest.mark.timeout(300)  # the first one starts the daemon, builds the image and starts the broker
@pytest.mark.anyio
async def test_a_group_consumes_and_commits_on_the_container_broker(
    container_kafka: ContainerBroker, anyio_backend: str
) -> None:
    """What CI runs of the container path: the broker advertises exactly where it listens (127.0.0.1
    and its own port), took its settings from the official image's variables, and a group reads
    what confluent-kafka wrote and commits it, as another client then sees."""
    broker = container_kafka
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert metadata_brokers("127.0.0.1", broker.port) == {(1, "127.0.0.1", broker.port)}
    configs = await anyio.to_thread.run_sync(_broker_configs, broker.bootstrap)
    assert configs["group.max.size"] == "77" and configs["log.dirs"] == LOG_DIRS
    assert configs["group.min.session.timeout.ms"] == "2000"  # KafkaBroker's short group timers too

    topic = broker.create_topic(f"container-{anyio_backend}-{uuid.uuid4().hex[:8]}", partitions=2)
    produce(broker.bootstrap, topic, [(i % 2, b"k%d" % i, b"v%d" % i) for i in range(40)])
    group = f"g-{topic}"
    options = {**FAST, "bootstrap_servers": broker.bootstrap, "group_id": group, "auto_offset_reset": "earliest",
               "enable_auto_commit": False, "session_timeout_ms": 6000, "heartbeat_interval_ms": 300}
    seen: list[tuple[int, int, bytes | None]] = []
    async with Consumer(**options) as consumer:
        consumer.subscribe([topic])
        with anyio.fail_after(60):
            while len(seen) < 40:
                for records in (await consumer.getmany(timeout=1)).values():
                    seen += [(r.partition, r.offset, r.value) for r in records]
        await consumer.commit()
    assert sorted(seen) == sorted((i % 2, i // 2, b"v%d" % i) for i in range(40))

    committed = await anyio.to_thread.run_sync(_committed_by_confluent, broker.bootstrap, group, topic)
    assert committed == {0: 20, 1: 20}
    async with Consumer(**options) as again:  # the group resumes where it committed: nothing is left
        again.subscribe([topic])
        assert {tp: await again.committed(tp) for tp in tps(topic, 2)} == {tp: 20 for tp in tps(topic, 2)}
        assert await again.getmany(timeout=1.5) == {}


def _broker_configs(bootstrap: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource

    with admin_client(bootstrap) as admin:
        resource = ConfigResource(ConfigResource.Type.BROKER, "1")
        entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: str(entry.value) for name, entry in entries.items()}


def _committed_by_confluent(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer as ConfluentConsumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    reader = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        offsets = reader.committed([ConfluentPartition(topic, p) for p in (0, 1)], timeout=30)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in offsets}


# ---------------------------------------------------------------------------------- long ones


def _pytest(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean,
                          stdin=subprocess.DEVNULL)


def _containers(daemon: Any) -> set[str]:
    result = subprocess.run(["docker", "ps", "-a", "-q"], capture_output=True, text=True, env=daemon.env, check=True)
    return set(result.stdout.split())


def _started(daemon: Any, image: str, since: float) -> list[str]:
    """The containers of ``image`` the daemon started since ``since`` (its event log)."""
    result = subprocess.run(
        ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter", "type=container",
         "--filter", "event=start", "--filter", f"image={image}", "--format", "{{.ID}}"],
        capture_output=True, text=True, env=daemon.env, check=True, timeout=30,
    )
    return result.stdout.split()


@pytest.mark.long
@pytest.mark.kafka_jvm
@pytest.mark.timeout(300)
def test_the_plugin_runs_a_users_tests_on_the_container_broker(kafka_image: str, docker_daemon: Any) -> None:
    """``--kafka-broker=testcontainers:IMAGE``: the plugin starts the container broker for the user's
    session (tests/plugin_project, asyncio and trio) and removes it after."""
    before, began = _containers(docker_daemon), time.time()
    env = {k: v for k, v in docker_daemon.env.items() if not k.startswith("ASYNCCONSUMER_TEST_")}
    result = _pytest([f"--kafka-broker=testcontainers:{kafka_image}", "-q", "-s"], ROOT / "tests" / "plugin_project",
                     env, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "7 passed" in result.stdout, result.stdout[-3000:]
    assert "kafka_broker: ContainerBroker" in result.stdout, result.stdout[-3000:]
    assert len(_started(docker_daemon, kafka_image, began)) == 1  # one broker for the user's session
    assert _containers(docker_daemon) == before  # the plugin removed its container


#: The suite's core consume, commit, group and offsets tests run on the container broker.
SUBSET = [
    "tests/consumer/test_consumer.py::test_commit_then_new_consumer_resumes_after_committed_offsets",
    "tests/consumer/test_consumer.py::test_auto_commit_on_close_commits_consumed_positions",
    "tests/consumer/test_consumer.py::test_seek_pause_resume_position",
    "tests/consumer/test_consumer.py::test_auto_offset_reset_earliest_latest_none",
    "tests/groups/test_groups.py::test_manual_commits_from_a_worker_land_before_the_partition_moves",
    "tests/groups/test_groups.py::test_commit_after_losing_partitions_names_them",
    "tests/groups/test_groups.py::test_regex_subscription_picks_up_a_topic_created_later",
    "tests/consumer/test_offsets_kafka.py",
]


@pytest.mark.long
@pytest.mark.kafka_jvm
@pytest.mark.timeout(600)
def test_the_suites_core_tests_pass_on_the_container_broker(kafka_image: str, docker_daemon: Any) -> None:
    """``ASYNCCONSUMER_TEST_BROKER=kafka ASYNCCONSUMER_KAFKA_IMAGE=IMAGE``: the session's Apache Kafka
    is a container broker, started and stopped by the suite's own broker fixture."""
    before, began = _containers(docker_daemon), time.time()
    env = {**docker_daemon.env, "ASYNCCONSUMER_TEST_BROKER": "kafka", "ASYNCCONSUMER_KAFKA_IMAGE": kafka_image}
    result = _pytest(["-v", *SUBSET], ROOT, env, timeout=560)
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-3000:]
    passed = [line for line in out.splitlines() if " PASSED" in line]
    for loop in ("asyncio", "trio"):  # every test of the subset, on both event loops
        assert sum(loop in line for line in passed) >= len(SUBSET), (loop, out[-5000:])
    assert "kafka-" in passed[0], passed[0]  # on the session's Apache Kafka, which was a container:
    assert len(_started(docker_daemon, kafka_image, began)) == 1
    assert _containers(docker_daemon) == before  # the suite's broker fixture removed its container


@pytest.mark.long
@pytest.mark.kafka_jvm
def test_a_broker_that_exits_is_a_typed_error_with_its_own_words(kafka_image: str) -> None:
    broker = ContainerBroker(kafka_image, config={"process.roles": "bystander"}, startup_timeout=60)
    with pytest.raises(ContainerBrokerError, match=r"(?s)exited.*bystander"):
        broker.start()
    with pytest.raises(ContainerBrokerError, match="not started"):
        _ = broker.container  # removed after the failed start
