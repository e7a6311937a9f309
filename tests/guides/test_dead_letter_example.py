"""examples/dead_letter.py, run as a user runs it (a new process, from another directory), on
Apache Kafka (the behaviour under it is the consumer's, tested on both brokers in
test_deserializers.py): the JSON records are processed, those that are not JSON are in the dead-letter topic
(read back with confluent-kafka) with headers naming where they came from and why, and the group's
committed offsets are past everything, dead letters included."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from support.paths import ROOT
from support.producer import client_quiet, consume

EXAMPLE = ROOT / "examples" / "dead_letter.py"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    return str(apache_kafka.bootstrap)


def test_records_that_are_not_json_go_to_the_dead_letter_topic(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], tmp_path: pathlib.Path
) -> None:
    topic = new_topic(2)
    dead_letter = new_topic(1, name=f"{topic}.dead-letter")
    records = [
        (0, b"a", b'{"id": 1}'), (0, b"b", b"<order id=2/>", [("source", b"legacy")]), (0, b"c", b'{"id": 3}'),
        (1, b"d", b'{"id": 4}'), (1, b"e", b"\xff\xfe"), (1, b"f", b'{"id": 6}'),
    ]
    produce(topic, records)
    group = f"g-{topic}"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--bootstrap", bootstrap, "--topic", topic, "--group", group,
         "--max-records", "4", "--session-timeout-ms", "6000"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert sorted(lines[:-1]) == sorted([f"{topic}-0@0: {{\"id\": 1}}", f"{topic}-0@2: {{\"id\": 3}}",
                                         f"{topic}-1@0: {{\"id\": 4}}", f"{topic}-1@2: {{\"id\": 6}}"])
    assert lines[-1] == f"4 records processed, 2 sent to {dead_letter!r}"

    letters = sorted(consume(bootstrap, dead_letter, 2), key=lambda m: m.key())
    assert [(m.key(), m.value()) for m in letters] == [(b"b", b"<order id=2/>"), (b"e", b"\xff\xfe")]
    headers = dict(letters[0].headers())
    assert headers["source"] == b"legacy"  # the record's own headers are kept
    assert (headers["dead-letter.topic"], headers["dead-letter.partition"], headers["dead-letter.offset"]) == (
        topic.encode(), b"0", b"1")
    assert headers["dead-letter.error"].startswith(b"value: JSONDecodeError(")
    assert dict(letters[1].headers())["dead-letter.error"].startswith(b"value: JSONDecodeError(")

    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **client_quiet(None)})
    try:
        committed = reader.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=30)
    finally:
        reader.close()
    assert [tp.offset for tp in committed] == [3, 3]
