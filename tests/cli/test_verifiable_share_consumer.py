"""``asyncconsumer verifiable-share-consumer``: Kafka's VerifiableShareConsumer command line and events,
against Apache Kafka (share groups), beside Java's own tool where they are compared."""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.share import apache_kafka_bootstrap, share_group  # noqa: F401  (``bootstrap``: Apache Kafka)
from support.verifiable import Tool, events_of, key_shape, ours, run

from asyncconsumer import AcknowledgementResult, AcknowledgeType, TopicPartition
from asyncconsumer.cli import _verifiable_share
from asyncconsumer.cli._events import Events
from asyncconsumer.errors import InvalidRecordStateError

BASE = ["--bootstrap-server", "localhost:9092", "--topic", "t", "--group-id", "g"]
USAGE = """\
usage: verifiable-share-consumer
       [-h] --topic TOPIC --group-id GROUP-ID
       [--max-messages MAX-MESSAGES] [--verbose]
       [--acknowledgement-mode ACKNOWLEDGEMENT-MODE]
       [--ack-pattern ACK-PATTERN]
       [--offset-reset-strategy OFFSET-RESET-STRATEGY]
       [--command-config CONFIG-FILE] [--runtime RUNTIME]
       --bootstrap-server HOST1:PORT1[,HOST2:PORT2[...]]
"""

# ----------------------------------------------------------------------------------------- no broker


def made(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, str, str]:
    try:
        result: Any = _verifiable_share.tool_from_args(args)
    except SystemExit as exc:
        result = int(exc.code or 0)
    out, err = capsys.readouterr()
    return result, out, err


def test_usage() -> None:
    assert _verifiable_share.PARSER.usage() == USAGE


@pytest.mark.parametrize(("args", "error"), [
    # as Apache Kafka 4.4.0's VerifiableShareConsumer prints them (after the usage)
    (["--ack-pattern", "accept"],
     "verifiable-share-consumer: error: --ack-pattern requires --acknowledgement-\n"
     "mode to be 'sync' or 'async', not 'auto'\n"),
    (["--ack-pattern", "renew,RENEW", "--acknowledgement-mode", "sync"],
     "verifiable-share-consumer: error: --ack-pattern must  contain  at least one\n"
     "non-RENEW type; a pattern  of  only  'renew'  would re-deliver every record\n"
     "indefinitely without ever resolving it\n"),
    (["--consumer.config", "x"],
     "verifiable-share-consumer:  error:  unrecognized   arguments:  '--consumer.\n"
     "config'\n"),
    (["--verbose=1"],
     "verifiable-share-consumer:  error:  argument   --verbose:  ignore  implicit\n"
     "argument '1'\n"),
])
def test_bad_command_lines(args: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    result, out, err = made([*BASE, *args], capsys)
    assert (result, out) == (1, "")
    assert err == USAGE + error


@pytest.mark.parametrize(("args", "message"), [
    (["--acknowledgement-mode", "bogus"], "--acknowledgement-mode 'bogus' is not one of"),
    (["--ack-pattern", "accept, ,release", "--acknowledgement-mode", "sync"], "'' is not one of accept"),
    (["--ack-pattern", "foo", "--acknowledgement-mode", "sync"], "'foo' is not one of accept"),
])
def test_bad_values_end_it_before_startup(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    result, out, err = made([*BASE, *args], capsys)
    assert (result, out) == (1, "")
    assert err.startswith("verifiable-share-consumer: error: ") and message in err and err.count("\n") == 1


def test_properties(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.properties"
    config.write_text("group.id=other\nmax.poll.records=50\nmetadata.recovery.strategy=none\n")
    tool, out, _ = made([*BASE, "--command-config", str(config), "--ack-pattern", " Accept ,REJECT",
                         "--acknowledgement-mode", "ASYNC"], capsys)
    assert tool.properties == {"group.id": "g", "max.poll.records": "50", "metadata.recovery.strategy": "none",
                               "bootstrap.servers": "localhost:9092", "share.acknowledgement.mode": "explicit"}
    assert (tool.mode, tool.pattern) == ("async", (AcknowledgeType.ACCEPT, AcknowledgeType.REJECT))
    assert out == ""
    tool, _, _ = made(BASE, capsys)
    assert "share.acknowledgement.mode" not in tool.properties and tool.mode == "auto" and tool.pattern == ()


def test_the_ack_pattern_cycles_by_offset_and_counts_what_the_broker_confirmed() -> None:
    tp = TopicPartition("t", 0)
    state = _verifiable_share.AckState(
        (AcknowledgeType.ACCEPT, AcknowledgeType.RENEW, AcknowledgeType.RELEASE)
    )
    # offset % 3 picks the entry; a RENEW entry is passed over at once
    assert [state.choose(tp, offset) for offset in range(6)] == [
        AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.RELEASE,
        AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.RELEASE,
    ]
    assert state.choose(tp, 2) == AcknowledgeType.RELEASE  # a redelivered RELEASE stays RELEASE
    out = io.StringIO()
    state.report(Events(out), tp, AcknowledgementResult((0, 1, 2), None))
    state.report(Events(out), tp, AcknowledgementResult((3,), InvalidRecordStateError("lock gone")))
    first, second = map(json.loads, out.getvalue().splitlines())
    assert list(first) == ["timestamp", "name", "count", "partitions", "success", "ackTypeCounts"]
    assert (first["count"], first["success"], first["ackTypeCounts"]) == (3, True, {"ACCEPT": 1, "RELEASE": 2})
    assert first["partitions"] == [{"topic": "t", "partition": 0, "count": 3, "offsets": [0, 1, 2]}]
    assert list(second) == ["timestamp", "name", "count", "partitions", "success", "error"]
    assert (second["success"], "lock gone" in second["error"]) == (False, True)
    assert state.acknowledged == 3


# ---------------------------------------------------------------------------------- Apache Kafka


def share_tool(bootstrap: str, topic: str, group: str, *args: str) -> list[str]:
    return ours("verifiable-share-consumer", "--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group,
                *args)


def check_share_stream(events: list[dict[str, Any]]) -> tuple[set[tuple[int, int]], int]:
    """(the unique partition/offset pairs consumed, the records acknowledged successfully)."""
    names = [e["name"] for e in events]
    assert names[0] == "startup_complete"
    assert "shutdown_complete" in names[-2:]
    consumed: set[tuple[int, int]] = set()
    acknowledged = 0
    for event in events:
        assert list(event)[:2] == ["timestamp", "name"]
        if event["name"] == "records_consumed":
            assert list(event) == ["timestamp", "name", "count", "partitions"]
            assert event["count"] == sum(p["count"] for p in event["partitions"])
            for p in event["partitions"]:
                assert list(p) == ["topic", "partition", "count", "offsets"] and p["offsets"] == sorted(p["offsets"])
                consumed |= {(p["partition"], o) for o in p["offsets"]}
        elif event["name"] == "offsets_acknowledged":
            assert event["success"] is True, event
            assert event["count"] == sum(p["count"] for p in event["partitions"])
            acknowledged += event["count"]
    return consumed, acknowledged


@pytest.mark.broker
@pytest.mark.parametrize("mode", ["auto", "sync", "async"])
def test_each_acknowledgement_mode_acknowledges_what_it_consumed(
    mode: str, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(3)
    produce(topic, [(i % 3, None, f"{i}") for i in range(300)])
    group = f"vsc-{topic}"
    events, _ = events_of(share_tool(bootstrap, topic, group, "--acknowledgement-mode", mode, "--max-messages",
                                     "300", "--offset-reset-strategy", "earliest"))
    assert events[1] == {"timestamp": events[1]["timestamp"], "name": "offset_reset_strategy_set",
                         "offsetResetStrategy": "earliest"}
    consumed, acknowledged = check_share_stream(events)
    assert consumed == {(p, o) for p in range(3) for o in range(100)}
    assert acknowledged == 300
    assert [e["name"] for e in events][-2:] == ["shutdown_complete", "shutdown_requested"]


@pytest.mark.broker
def test_an_ack_pattern_rejects_and_releases_and_counts_the_types(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(1)
    produce(topic, [(0, None, f"{i}") for i in range(30)])
    group = share_group(bootstrap, share_delivery_count_limit=2)
    with Tool(share_tool(bootstrap, topic, group, "--acknowledgement-mode", "sync", "--verbose",
                         "--ack-pattern", "accept,reject,release")) as proc:
        # 10 accepted and 10 rejected at once; 10 released twice, then archived by the delivery limit
        proc.wait_for(lambda e: sum(x.get("ackTypeCounts", {}).get("RELEASE", 0) for x in proc.events
                                    if x["name"] == "offsets_acknowledged") >= 20, what="both releases", timeout=60)
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    consumed, acknowledged = check_share_stream(proc.events)
    assert consumed == {(0, offset) for offset in range(30)}
    counts = {"ACCEPT": 0, "REJECT": 0, "RELEASE": 0}
    for event in proc.events:
        for kind, n in event.get("ackTypeCounts", {}).items():
            counts[kind] += n
    assert counts == {"ACCEPT": 10, "REJECT": 10, "RELEASE": 20}
    assert acknowledged == 40
    data = [e for e in proc.events if e["name"] == "record_data"]
    assert len(data) == 40 and all(list(e) == ["timestamp", "name", "key", "value", "topic", "partition", "offset"]
                                   for e in data)
    assert sorted(e["offset"] for e in data if e["offset"] % 3 == 2) == sorted(2 * list(range(2, 30, 3)))


@pytest.mark.broker
def test_sigterm_ends_a_share_consumer_cleanly(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, None, f"{i}") for i in range(100)])
    group = share_group(bootstrap)
    with Tool(share_tool(bootstrap, topic, group, "--runtime", "trio")) as proc:
        proc.wait_for_name("offsets_acknowledged")
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    names = proc.names()
    assert names[0] == "startup_complete"
    assert names[-1] == "shutdown_complete" and "shutdown_requested" in names
    consumed, acknowledged = check_share_stream(proc.events)
    # what was consumed before the signal is accepted at the latest by close (implicit mode)
    assert acknowledged == len(consumed) == 100


@pytest.mark.broker
def test_the_same_events_as_javas_verifiable_share_consumer(
    apache_kafka: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    topic = new_topic(2)
    produce(topic, [(i % 2, f"k{i}" if i % 2 else None, f"v{i}") for i in range(60)])
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--max-messages", "60", "--verbose",
            "--acknowledgement-mode", "sync", "--offset-reset-strategy", "earliest"]
    java = run(apache_kafka.broker.java_command("org.apache.kafka.tools.VerifiableShareConsumer", *args,
                                                 "--group-id", f"{topic}-java"), timeout=120)
    mine = run(ours("verifiable-share-consumer", *args, "--group-id", f"{topic}-ours"), timeout=120)
    assert java.returncode == mine.returncode == 0, (java.stderr[-2000:], mine.stderr)
    java_events = [json.loads(line) for line in java.stdout.splitlines()]
    our_events = [json.loads(line) for line in mine.stdout.splitlines()]
    java_shapes = {(e["name"], key_shape(e)) for e in java_events}
    our_shapes = {(e["name"], key_shape(e)) for e in our_events}
    # Kafka 4.4's tool prints shutdown_requested last when --max-messages ends it (its shutdown hook runs
    # at exit); 4.3's share tool printed nothing then.
    assert our_shapes - java_shapes <= {("shutdown_requested", (("timestamp", "int"), ("name", "str")))}
    assert java_shapes <= our_shapes

    def records(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((e["partition"], e["offset"], e["key"], e["value"]) for e in events if e["name"] == "record_data")

    assert records(our_events) == records(java_events)
    assert check_share_stream(our_events)[1] == check_share_stream(java_events)[1] == 60
