"""docs/compatibility.md's tables of the Java client (tools/gen_compatibility.py): the page is what
the generator writes, every public method of Kafka 4.4's ``KafkaConsumer`` and
``KafkaShareConsumer`` is in them (read from the test broker's jars by reflection: a method Java
adds fails here until the table names it), and every Python name they give exists."""

from __future__ import annotations

import inspect
import subprocess
from typing import Any

import pytest
from support.paths import tool

from asyncconsumer import Consumer, ShareConsumer
from asyncconsumer.testing.kafka import find_java, kafka_libs

_PROGRAM = """
import java.lang.reflect.*;
import java.util.*;

public class Api {
    public static void main(String[] args) throws Exception {
        for (String name : new String[] {"org.apache.kafka.clients.consumer.KafkaConsumer",
                                         "org.apache.kafka.clients.consumer.KafkaShareConsumer"}) {
            Class<?> c = Class.forName(name);
            List<Executable> all = new ArrayList<>(Arrays.asList(c.getConstructors()));
            for (Method m : c.getDeclaredMethods()) {
                if (Modifier.isPublic(m.getModifiers()) && !m.isSynthetic() && !m.isBridge()) all.add(m);
            }
            for (Executable e : all) {
                StringJoiner call = new StringJoiner(", ", (e instanceof Constructor ? c.getSimpleName()
                                                                                     : e.getName()) + "(", ")");
                for (Class<?> p : e.getParameterTypes()) call.add(p.getSimpleName());
                System.out.println("method\\t" + c.getSimpleName() + "\\t" + call);
            }
        }
        Field refused = Class.forName("org.apache.kafka.clients.consumer.ShareConsumerConfig")
            .getDeclaredField("SHARE_GROUP_UNSUPPORTED_CONFIGS");
        refused.setAccessible(true);
        for (Object name : (List<?>) refused.get(null)) System.out.println("share-refused\\t" + name);
    }
}
"""


def _generator() -> Any:
    return tool("gen_compatibility")


@pytest.fixture(scope="module")
def java_api(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """``{"KafkaConsumer": {"seek(TopicPartition, long)", ...}, ..., "share-refused": {...}}``."""
    java, _ = find_java()
    source = tmp_path_factory.mktemp("java-api") / "Api.java"
    source.write_text(_PROGRAM)
    done = subprocess.run([java, "-cp", str(kafka_libs() / "*"), str(source)], capture_output=True, text=True,
                          timeout=120, check=True)
    found: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        kind, *rest = line.split("\t")
        if kind == "method":
            found.setdefault(rest[0], set()).add(rest[1])
        else:
            found.setdefault(kind, set()).add(rest[0])
    return found


def test_the_page_is_what_the_generator_writes() -> None:
    """Edit tools/gen_compatibility.py (or asyncconsumer.java_properties), then run it."""
    generator = _generator()
    assert generator.PAGE.read_text() == generator.updated(generator.PAGE.read_text())


@pytest.mark.parametrize("java_class", ["KafkaConsumer", "KafkaShareConsumer"])
def test_every_public_method_of_the_java_client_has_its_row(java_api: dict[str, set[str]], java_class: str) -> None:
    table = set(_generator().METHODS[java_class])
    in_jar = java_api[java_class]
    assert len(in_jar) > 20
    assert not in_jar - table, f"methods of Kafka's {java_class} missing in tools/gen_compatibility.py"
    assert not table - in_jar, f"rows of tools/gen_compatibility.py that Kafka's {java_class} does not have"


def test_the_properties_javas_share_consumer_refuses_are_the_tables(java_api: dict[str, set[str]]) -> None:
    assert set(_generator().SHARE_GROUP_UNSUPPORTED) == java_api["share-refused"]


def test_every_counterpart_the_tables_name_exists() -> None:
    classes = {"KafkaConsumer": Consumer, "KafkaShareConsumer": ShareConsumer}
    for java_class, rows in _generator().METHODS.items():
        for signature, row in rows.items():
            assert row.shown or row.note, f"{java_class}.{signature}: neither a counterpart nor why not"
            for name in row.names:
                assert hasattr(classes[java_class], name), f"{java_class}.{signature}: no {name} in Python"
    # close(CloseOptions): the membership choice the table names is close()'s
    assert "membership" in inspect.signature(Consumer.close).parameters
