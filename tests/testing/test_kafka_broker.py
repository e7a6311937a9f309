"""``asyncconsumer.testing.KafkaBroker``: real Apache Kafka from Maven Central's jars.

The broker the rest of the suite runs on is started by the ``kafka_backend`` fixture; these tests
check the broker helper itself: its listeners, its errors when Java or Maven Central are missing or
the configuration is bad, that it stops by its own pid and leaves no files, and that the jar cache
makes later starts offline.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.producer import create_topic, produce

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.testing import (
    KAFKA_VERSION,
    KAFKA_VERSIONS,
    JavaNotFoundError,
    KafkaBroker,
    KafkaCluster,
    KafkaDownloadError,
    KafkaStartError,
    UnknownKafkaVersionError,
)
from asyncconsumer.testing import kafka as kafka_module

pytestmark = pytest.mark.broker


def _java_or_skip() -> None:
    try:
        kafka_module.find_java()
    except JavaNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def test_find_java_names_what_to_install_when_there_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFoundError, match=r"no 'java' found.*Java 17 or newer.*JAVA_HOME"):
        kafka_module.find_java()
    with pytest.raises(JavaNotFoundError):
        KafkaBroker().start()


def test_a_java_too_old_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match=r"is Java 11.*Java 17 or newer"):
        kafka_module.find_java()


def test_maven_central_unreachable_is_a_clear_error_not_a_hang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connection refused at once
    monkeypatch.setenv("ASYNCCONSUMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASYNCCONSUMER_MAVEN_REPOSITORY", f"http://127.0.0.1:{port}/maven2")
    monkeypatch.delenv("ASYNCCONSUMER_KAFKA_LIBS", raising=False)
    with pytest.raises(KafkaDownloadError) as info:
        kafka_module.kafka_libs(progress=open(os.devnull, "w"))
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/maven2/" in message and ".jar" in message
    assert "ASYNCCONSUMER_KAFKA_LIBS" in message and "Connection refused" in message
    assert not (tmp_path / "cache" / f"kafka-{KAFKA_VERSION}" / ".complete").exists()


def test_the_cache_makes_later_starts_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _java_or_skip()
    monkeypatch.delenv("ASYNCCONSUMER_KAFKA_LIBS", raising=False)
    monkeypatch.delenv("ASYNCCONSUMER_MAVEN_REPOSITORY", raising=False)
    libs = kafka_module.kafka_libs()  # the suite's broker already filled the cache
    assert (libs / ".complete").exists()
    # An unreachable repository does not matter once the cache is complete.
    monkeypatch.setenv("ASYNCCONSUMER_MAVEN_REPOSITORY", "http://127.0.0.1:9/nowhere")
    assert kafka_module.kafka_libs() == libs
    # A jar that went missing is fetched again (here: from the real cache, copied as the "repository"
    # would be): the marker alone is not trusted for a different cache directory.
    copy = tmp_path / "cache" / f"kafka-{KAFKA_VERSION}"
    shutil.copytree(libs, copy)
    (copy / ".complete").unlink()
    victim = next(copy.glob("kafka-clients-*.jar"))
    victim.write_bytes(b"corrupt")
    monkeypatch.setenv("ASYNCCONSUMER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(KafkaDownloadError, match="kafka-clients"):
        kafka_module.kafka_libs(progress=open(os.devnull, "w"))


def test_a_bad_setting_ends_the_start_with_the_brokers_own_words() -> None:
    _java_or_skip()
    broker = KafkaBroker(listeners=(), config={"num.io.threads": "many"}, startup_timeout=60)
    with pytest.raises(KafkaStartError) as info:
        broker.start()
    message = str(info.value)
    assert "num.io.threads" in message and "many" in message
    assert "\tat " not in message  # the broker's words, not a Java stack trace
    assert broker.nodes == []


def test_advertise_plaintext_is_checked_before_any_node_starts() -> None:
    """``KafkaCluster(advertise_plaintext=...)`` (used and shown working by test_cluster_chaos.py)."""
    with pytest.raises(ValueError, match=r"advertise_plaintext and config\['advertised.listeners'\] both set"):
        KafkaCluster(3, advertise_plaintext=lambda node: "127.0.0.1:1", config={"advertised.listeners": "x"})
    _java_or_skip()
    asked: list[int] = []

    def nowhere(node: kafka_module.KafkaNode) -> str:
        asked.append(node.node_id)
        return "127.0.0.1" if node.node_id == 2 else f"127.0.0.1:{node.ports.plaintext}"

    cluster = KafkaCluster(3, advertise_plaintext=nowhere)
    with pytest.raises(ValueError, match=r"returned '127.0.0.1' for node 2; expected 'host:port'"):
        cluster.start()
    assert asked == [1, 2]
    assert cluster.nodes == []  # stopped and cleaned up; no process was started


def test_a_cluster_id_is_never_drawn_with_a_leading_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 in the first byte encodes to "-" in URL-safe base64: a command line reads that as an option
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x1d" + bytes(15))])
    monkeypatch.setattr(kafka_module.uuid, "uuid4", lambda: next(draws))
    cluster_id = kafka_module.new_cluster_id()
    assert cluster_id == "HQAAAAAAAAAAAAAAAAAAAA"


def test_a_moved_node_takes_fresh_ports_from_its_cluster_and_keeps_its_controller_port(tmp_path: Path) -> None:
    """A move leases its five client ports from the cluster (which holds them, and every port it
    had, until it stops: tests/testing/test_ports.py); the quorum's port stays."""
    class Owner:
        configured: list[object] = []
        leased: list[int] = []

        def lease_ports(self, count: int) -> list[int]:
            self.leased.append(count)
            return [2001, 2002, 2003, 2004, 2005][:count]

        def configure(self, node: object) -> None:
            self.configured.append(node)

    first = kafka_module._Ports(plaintext=1001, ssl=1002, sasl_plaintext=1003, sasl_ssl=1004, controller=1005,
                                internal=1006)
    node = kafka_module.KafkaNode(Owner(), 1, first, tmp_path)  # type: ignore[arg-type]
    node.stop = lambda timeout=30.0: None  # type: ignore[method-assign]
    node.launch = lambda: None  # type: ignore[method-assign]
    node.move(wait=False)
    assert node.ports == kafka_module._Ports(2001, 2002, 2003, 2004, 1005, 2005)
    assert Owner.leased == [5] and Owner.configured == [node]


def test_every_listener_serves_records_and_stop_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    _java_or_skip()
    # an id Kafka's own Uuid would never draw, yet the format command must take it (CI once drew one)
    monkeypatch.setattr(kafka_module, "new_cluster_id", lambda: "-Hx5F8YWQDCSc3Eh94JctA")
    broker = KafkaBroker(users={"carol": "carol-pw"}).start()
    try:
        assert broker.startup_seconds is not None and broker.startup_seconds < 90
        directory = broker.node.directory
        assert directory.exists() and broker.pid is not None
        topic = create_topic(broker.bootstrap, "listeners", 1)
        produce(broker.bootstrap, topic, [(0, b"k", b"hello")])

        async def read_through(options: dict[str, object]) -> list[bytes | None]:
            async with Consumer(**options, auto_offset_reset="earliest") as consumer:  # type: ignore[arg-type]
                consumer.assign([TopicPartition(topic, 0)])
                batch = await consumer.getmany(timeout=20)
                return [r.value for records in batch.values() for r in records]

        routes = [
            broker.consumer_options("PLAINTEXT"),
            broker.consumer_options("SSL"),
            broker.consumer_options("SASL_PLAINTEXT", mechanism="PLAIN"),
            broker.consumer_options("SASL_PLAINTEXT", mechanism="SCRAM-SHA-256"),
            broker.consumer_options("SASL_SSL", mechanism="SCRAM-SHA-512"),
        ]
        for options in routes:
            assert anyio.run(read_through, options) == [b"hello"], options["security_protocol"]
        pid = broker.pid
    finally:
        broker.stop()
    assert not directory.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_kafkas_own_tools_run_from_the_same_jars(apache_kafka: Any) -> None:
    broker = apache_kafka.broker
    out = broker.run_tool("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", broker.bootstrap, "describe")
    features = {line.split()[1]: line for line in out.stdout.splitlines() if line.startswith("Feature:")}
    assert "share.version" in features and "group.version" in features, out.stdout
    assert "FinalizedVersionLevel: 0" not in features["share.version"]  # share groups on (4.4.0: level 2)


def test_an_unknown_release_is_a_typed_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownKafkaVersionError, match=r"'3\.8\.1'.*4\.4\.0, 4\.0\.2, 3\.9\.2, 3\.7\.2") as info:
        KafkaBroker(version="3.8.1")
    assert isinstance(info.value, ValueError) and isinstance(info.value, kafka_module.KafkaBrokerError)
    with pytest.raises(UnknownKafkaVersionError):
        KafkaCluster(3, version="latest")
    assert KAFKA_VERSIONS[0] == KAFKA_VERSION == KafkaBroker().version == "4.4.0"
    assert KafkaBroker(version="3.7.2").release == (3, 7)


@pytest.mark.kafka_jvm
@pytest.mark.timeout(600)  # three JVMs, one started twice and the controller restarted: minutes on 2 busy cores
def test_isolated_controllers_keep_the_quorum_while_a_broker_is_down() -> None:
    """``KafkaCluster(controllers=N)``: two broker-only nodes beside one controller-only node (Kafka's
    isolated KRaft mode).  With one of two brokers killed, the controller still moves leadership to
    the other (two combined nodes would have lost their quorum), and the controller itself restarts."""
    with pytest.raises(ValueError, match="controllers=-1"):
        KafkaCluster(2, controllers=-1)
    _java_or_skip()
    cluster = KafkaCluster(2, controllers=1, heap_mb=384, config={"min.insync.replicas": 1}).start()
    try:
        assert [(n.node_id, n.roles) for n in cluster.nodes] == [(1, "broker"), (2, "broker")]
        assert [(n.node_id, n.roles) for n in cluster.controllers] == [(3, "controller")]
        assert "+ 1 controllers" in repr(cluster)
        properties = (cluster.nodes[0].directory / "server.properties").read_text()
        voter = f"controller.quorum.voters=3@127.0.0.1:{cluster.controllers[0].ports.controller}\n"
        assert voter in properties and "CONTROLLER://" not in properties.split("listeners=", 1)[1].split("\n")[0]
        topic = create_topic(cluster.bootstrap, "isolated", 1, replication_factor=2)
        produce(cluster.bootstrap, topic, [(0, None, b"before")])
        cluster.nodes[0].kill()
        produce(cluster.nodes[1].bootstrap, topic, [(0, None, b"one broker down")], timeout=60)
        cluster.nodes[0].restart()
        controller = cluster.controllers[0]
        controller.stop()
        assert not controller.alive
        controller.restart()
        assert controller.alive
        produce(cluster.bootstrap, topic, [(0, None, b"after")], timeout=60)
        pids = [n.pid for n in (*cluster.nodes, *cluster.controllers)]
        directory = controller.directory.parent
    finally:
        cluster.stop()
    assert cluster.nodes == [] and cluster.controllers == [] and not directory.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # type: ignore[arg-type]
