"""``asyncconsumer verifiable-consumer``: Apache Kafka's ``org.apache.kafka.tools.VerifiableConsumer``
(4.4's command line and events) on asyncconsumer, so that Kafka's system tests (kafkatest) can drive
asyncconsumer.  See docs/verifiable-consumer.md for the events and every difference from Java.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from ..consumer import Consumer
from ..errors import FencedInstanceIdError, KafkaError
from ..listener import RebalanceListener
from ..structs import ConsumerRecord, TopicPartition
from ._events import (
    BOOTSTRAP_SERVER,
    COMMAND_CONFIG,
    RUNTIME,
    TOPIC,
    VERBOSE,
    Events,
    Shutdown,
    ToolConfigError,
    configure_logging,
    drop_not_applicable,
    fail_config,
    fail_usage,
    launch,
    load_properties,
    parse_or_exit,
    partition_list,
    record_data,
)
from ._javaargs import ArgumentError, Option, ToolParser

log = logging.getLogger("asyncconsumer.cli.verifiable")

_JAVA_PACKAGE = "org.apache.kafka.clients.consumer."
#: ``--assignment-strategy``: the Java client's assignor classes -> asyncconsumer's assignors.
JAVA_ASSIGNORS = {
    _JAVA_PACKAGE + "RangeAssignor": "range",
    _JAVA_PACKAGE + "RoundRobinAssignor": "roundrobin",
    _JAVA_PACKAGE + "StickyAssignor": "sticky",
    _JAVA_PACKAGE + "CooperativeStickyAssignor": "cooperative-sticky",
}
#: What the Java client refuses in the properties with each group protocol (ConsumerConfig's check),
#: in the order its message lists them.
REFUSED_WITH = {
    "CONSUMER": (
        "partition.assignment.strategy",
        "heartbeat.interval.ms",
        "session.timeout.ms",
        "share.acknowledgement.mode",
        "share.acquire.mode",
    ),
    "CLASSIC": ("group.remote.assignor", "share.acknowledgement.mode", "share.acquire.mode"),
}
RESET_POLICIES = ("earliest", "latest", "none")
#: How long one poll waits before the tool looks for a stop request again.
POLL_SLICE = 0.2

PARSER = ToolParser(
    prog="verifiable-consumer",
    description="Joins a consumer group, reads a topic and prints what happens (startup, partitions "
    "assigned and revoked, records consumed, offsets committed, shutdown) as one JSON object per line "
    "on stdout, as Apache Kafka's VerifiableConsumer does. asyncconsumer's implementation.",
    options=(
        TOPIC,
        Option("--group-protocol", "CLASSIC or CONSUMER (KIP-848), in any case", "GROUP-PROTOCOL", default="classic"),
        Option(
            "--group-remote-assignor",
            "With the CONSUMER protocol: the assignor the coordinator runs (range, uniform)",
            "GROUP-REMOTE-ASSIGNOR",
        ),
        Option("--group-id", "The consumer group to join", "GROUP-ID", required=True),
        Option("--group-instance-id", "Makes the member static (KIP-345) under this id", "GROUP-INSTANCE-ID"),
        Option(
            "--max-messages",
            "Stop after this many records; a negative number: run until a signal stops the tool",
            "MAX-MESSAGES",
            "integer",
            -1,
        ),
        Option(
            "--session-timeout",
            "The session timeout in milliseconds; the CONSUMER protocol refuses it",
            "TIMEOUT-MS",
            "integer",
        ),
        VERBOSE,
        Option("--enable-autocommit", "Commit offsets automatically instead of after each batch", default=False),
        Option("--close-timeout", "How long closing may take, in ms", "CLOSE-TIMEOUT-MS", "integer", 30000),
        Option(
            "--reset-policy",
            "Where to start without a committed offset: earliest, latest or none",
            "RESET-POLICY",
            default="earliest",
        ),
        Option(
            "--assignment-strategy",
            "With the CLASSIC protocol: the assignors, as Java class names separated by commas (Range, "
            "RoundRobin, Sticky or CooperativeSticky Assignor in org.apache.kafka.clients.consumer)",
            "ASSIGNMENT-STRATEGY",
            default=_JAVA_PACKAGE + "RangeAssignor",
        ),
        Option("--consumer.config", "Deprecated: use --command-config", "CONFIG-FILE"),
        COMMAND_CONFIG,
        RUNTIME,
        BOOTSTRAP_SERVER,
    ),
)


@dataclass(frozen=True)
class ConsumerTool:
    """A checked command line: the consumer's properties and what the tool itself does."""

    properties: dict[str, str]
    topic: str
    max_messages: int
    verbose: bool
    auto_commit: bool
    close_timeout: float
    #: The classic protocol with an assignor that is not cooperative: every rebalance revokes everything.
    eager: bool
    runtime: str


def main(args: list[str], verbose_logs: bool = False) -> None:
    """``asyncconsumer verifiable-consumer ARGS``: exits with the Java tool's status."""
    configure_logging(verbose_logs)
    tool = tool_from_args(args)
    events = Events(sys.stdout)
    launch(
        PARSER.prog,
        "consumer",
        tool.runtime,
        lambda: Consumer.from_properties(tool.properties),
        lambda consumer, shutdown: _session(tool, consumer, events, shutdown),
        events,
        tool.close_timeout,
    )


def tool_from_args(args: list[str]) -> ConsumerTool:
    """Parse and check ``args`` as the Java tool does (exits on a bad command line or setting)."""
    values = parse_or_exit(PARSER, args)
    if values["consumer_config"] is not None and values["command_config"] is not None:
        fail_usage(PARSER, ArgumentError("Options --consumer.config and --command-config are mutually exclusive."))
    config_file = values["command_config"]
    if values["consumer_config"] is not None:
        config_file = values["consumer_config"]
        sys.stdout.write(
            "Option --consumer.config has been deprecated and will be removed in a future version. "
            "Use --command-config instead.\n"
        )
        sys.stdout.flush()
    from_file = load_properties(PARSER, config_file) if config_file is not None else {}
    try:
        properties, eager = consumer_properties(values, from_file)
    except ToolConfigError as exc:
        fail_config(PARSER.prog, str(exc))
    return ConsumerTool(
        properties=properties,
        topic=values["topic"],
        max_messages=values["max_messages"],
        verbose=values["verbose"],
        auto_commit=values["enable_autocommit"],
        close_timeout=max(0, values["close_timeout"]) / 1000,
        eager=eager,
        runtime=values["runtime"],
    )


def consumer_properties(values: dict[str, Any], from_file: dict[str, str]) -> tuple[dict[str, str], bool]:
    """The Java tool's properties (the file, then the flags on top), checked as the Java client checks
    them, then mapped to asyncconsumer's: (properties, eager)."""
    protocol = str(values["group_protocol"]).upper()
    if protocol not in REFUSED_WITH:
        raise ToolConfigError(f"--group-protocol {values['group_protocol']!r} is not one of CLASSIC, CONSUMER")
    props = dict(from_file)
    props["group.protocol"] = protocol
    if protocol == "CONSUMER":
        if values["group_remote_assignor"] is not None:
            props["group.remote.assignor"] = values["group_remote_assignor"]
    else:
        props["partition.assignment.strategy"] = values["assignment_strategy"]
    if values["session_timeout"] is not None:
        props["session.timeout.ms"] = str(values["session_timeout"])
    props["group.id"] = values["group_id"]
    if values["group_instance_id"] is not None:
        props["group.instance.id"] = values["group_instance_id"]
    props["bootstrap.servers"] = values["bootstrap_server"]
    props["enable.auto.commit"] = "true" if values["enable_autocommit"] else "false"
    props["auto.offset.reset"] = values["reset_policy"]
    refused = [key for key in REFUSED_WITH[protocol] if props.get(key, "").strip()]
    if refused:
        raise ToolConfigError(f"{', '.join(refused)} cannot be set when group.protocol={protocol}")
    reset = props["auto.offset.reset"]
    if reset.startswith("by_duration:"):
        raise ToolConfigError(f"auto.offset.reset={reset}: asyncconsumer has no by_duration reset")
    if reset not in RESET_POLICIES:
        raise ToolConfigError(
            f"Invalid value {reset} for configuration auto.offset.reset: must be 'earliest', 'latest' or 'none'"
        )
    props = drop_not_applicable(props)
    props["group.protocol"] = protocol.lower()
    eager = False
    if protocol == "CLASSIC":
        assignors = [_assignor(name) for name in props["partition.assignment.strategy"].split(",")]
        props["partition.assignment.strategy"] = ",".join(assignors)
        eager = not all(name == "cooperative-sticky" for name in assignors)
    return props, eager


def _assignor(name: str) -> str:
    name = name.strip()
    if name in JAVA_ASSIGNORS:
        return JAVA_ASSIGNORS[name]
    if name in JAVA_ASSIGNORS.values():
        return name
    raise ToolConfigError(
        f"partition.assignment.strategy: {name!r} is not an assignor asyncconsumer has "
        f"({', '.join(n.removeprefix(_JAVA_PACKAGE) for n in JAVA_ASSIGNORS)} of {_JAVA_PACKAGE.rstrip('.')})"
    )


class GroupEvents(RebalanceListener):
    """``partitions_assigned`` / ``partitions_revoked`` as the Java client's callbacks produce them.

    asyncconsumer's listener is called as Java's is: ``on_partitions_assigned`` at the end of every
    rebalance, with nothing when nothing was added.  One difference is left to the tool: in Java an
    eager rebalance (classic, non-cooperative assignors) after the first join starts with
    ``onPartitionsRevoked`` of everything owned, ``[]`` when nothing was, and asyncconsumer does not
    call back with nothing to revoke; the tool prints that ``partitions_revoked`` itself.
    """

    def __init__(self, events: Events, *, eager: bool) -> None:
        self._events = events
        self._eager = eager
        self._joined = False
        self._revoked = False

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._events.emit("partitions_revoked", partitions=partition_list(revoked))
        self._revoked = True

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._eager and self._joined and not self._revoked:
            self.on_partitions_revoked(set())
        self._events.emit("partitions_assigned", partitions=partition_list(assigned))
        self._joined, self._revoked = True, False


async def _session(tool: ConsumerTool, consumer: Consumer[Any, Any], events: Events, shutdown: Shutdown) -> None:
    """Poll, report and commit until ``--max-messages`` or a signal (``run_tool`` closes the consumer)."""
    consumer.subscribe([tool.topic], listener=GroupEvents(events, eager=tool.eager))
    consumed = 0
    while not (tool.max_messages >= 0 and consumed >= tool.max_messages) and not shutdown.requested:
        limit = tool.max_messages - consumed if tool.max_messages >= 0 else None
        with shutdown.wakeable() as poll:
            batch = await consumer.getmany(timeout=POLL_SLICE, max_records=limit)
        if poll.cancelled_caught:
            break
        # a batch that came back is reported and committed even if a signal came meanwhile, as
        # Java's tool does (its wakeup then interrupts the commit, which it makes again)
        if not batch:
            continue
        consumed += _report_batch(batch, events, tool.verbose)
        if not tool.auto_commit:
            await _commit(consumer, events, {tp: records[-1].offset + 1 for tp, records in batch.items()})


def _report_batch(
    batch: dict[TopicPartition, list[ConsumerRecord[Any, Any]]], events: Events, verbose: bool
) -> int:
    """``record_data`` (with --verbose) and ``records_consumed`` for one poll's records; their count."""
    summaries = []
    total = 0
    for tp, records in batch.items():
        if verbose:
            for r in records:
                record_data(events, r)
        summaries.append({
            "topic": tp.topic,
            "partition": tp.partition,
            "count": len(records),
            "minOffset": records[0].offset,
            "maxOffset": records[-1].offset,
        })
        total += len(records)
    events.emit("records_consumed", count=total, partitions=summaries)
    return total


async def _commit(consumer: Consumer[Any, Any], events: Events, offsets: dict[TopicPartition, int]) -> None:
    """Commit synchronously and print ``offsets_committed``; a failure is printed and the tool goes on,
    except for fencing, which ends it (as Java's tool re-throws FencedInstanceIdException)."""
    listed = [{"topic": tp.topic, "partition": tp.partition, "offset": offset} for tp, offset in offsets.items()]
    try:
        await consumer.commit(offsets)
    except FencedInstanceIdError:
        raise
    except KafkaError as exc:
        events.emit("offsets_committed", offsets=listed, error=str(exc) or ..., success=False)
        return
    events.emit("offsets_committed", offsets=listed, success=True)
