"""``asyncconsumer verifiable-share-consumer``: Apache Kafka's
``org.apache.kafka.tools.VerifiableShareConsumer`` (4.4's command line and events) on asyncconsumer's
``ShareConsumer``.  See docs/verifiable-consumer.md.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import KafkaError
from ..share import AcknowledgementResult, AcknowledgeType, ShareConsumer, ShareConsumerRecord
from ..structs import TopicPartition
from ._events import (
    BOOTSTRAP_SERVER,
    COMMAND_CONFIG,
    RUNTIME,
    TOPIC,
    VERBOSE,
    Events,
    Shutdown,
    configure_logging,
    drop_not_applicable,
    fail_config,
    fail_usage,
    launch,
    load_properties,
    log,
    parse_or_exit,
    record_data,
)
from ._javaargs import ArgumentError, Option, ToolParser

MODES = ("auto", "sync", "async")
#: How long one poll waits.  (Java's waits 5 s, but its acknowledgement callback runs as soon as the
#: broker answers; asyncconsumer's runs at the start of the next poll, so polls are kept short.)
POLL_SLICE = 0.2
#: How long the group config change (``--offset-reset-strategy``) may take.
ALTER_CONFIG_SECONDS = 60.0
#: The Java tool's ``close()`` (the share consumer's default close timeout).
CLOSE_SECONDS = 30.0

PARSER = ToolParser(
    prog="verifiable-share-consumer",
    description="Joins a share group, reads a topic and prints what happens (startup, records "
    "consumed, acknowledgements committed, shutdown) as one JSON object per line on stdout, as Apache "
    "Kafka's VerifiableShareConsumer does. asyncconsumer's implementation.",
    options=(
        TOPIC,
        Option("--group-id", "The share group to join", "GROUP-ID", required=True),
        Option(
            "--max-messages",
            "Stop once this many records were acknowledged; a negative number: run until a signal stops "
            "the tool",
            "MAX-MESSAGES",
            "integer",
            -1,
        ),
        VERBOSE,
        Option(
            "--acknowledgement-mode",
            "auto: records are accepted by the next poll; sync or async: after each poll the "
            "acknowledgements are committed (and waited for, with sync)",
            "ACKNOWLEDGEMENT-MODE",
            default="auto",
        ),
        Option(
            "--ack-pattern",
            "Acknowledge records explicitly, cycling through these types (accept, release, reject, renew; "
            "comma-separated) by record offset; needs --acknowledgement-mode sync or async",
            "ACK-PATTERN",
            default="",
        ),
        Option(
            "--offset-reset-strategy",
            "Set the group's share.auto.offset.reset first: earliest or latest",
            "OFFSET-RESET-STRATEGY",
            default="",
        ),
        COMMAND_CONFIG,
        RUNTIME,
        BOOTSTRAP_SERVER,
    ),
)


@dataclass(frozen=True)
class ShareTool:
    properties: dict[str, str]
    topic: str
    group_id: str
    bootstrap: str
    max_messages: int
    verbose: bool
    mode: str
    pattern: tuple[AcknowledgeType, ...]
    offset_reset: str
    runtime: str


def main(args: list[str], verbose_logs: bool = False) -> None:
    """``asyncconsumer verifiable-share-consumer ARGS``: exits with the Java tool's status."""
    configure_logging(verbose_logs)
    tool = tool_from_args(args)
    events = Events(sys.stdout)
    state = AckState(tool.pattern)
    launch(
        PARSER.prog,
        "share consumer",
        tool.runtime,
        lambda: ShareConsumer.from_properties(tool.properties, on_acknowledgement_commit=state.callback(events)),
        lambda consumer, shutdown: _session(tool, consumer, events, shutdown, state),
        events,
        CLOSE_SECONDS,
    )


def tool_from_args(args: list[str]) -> ShareTool:
    values = parse_or_exit(PARSER, args)
    mode = str(values["acknowledgement_mode"]).lower()
    if mode not in MODES:
        fail_config(PARSER.prog, f"--acknowledgement-mode {values['acknowledgement_mode']!r} is not one of {MODES}")
    pattern = parse_pattern(str(values["ack_pattern"]))
    if pattern and mode == "auto":
        needs = "--ack-pattern requires --acknowledgement-mode to be 'sync' or 'async', not 'auto'"
        fail_usage(PARSER, ArgumentError(needs))
    if pattern and all(t == AcknowledgeType.RENEW for t in pattern):
        fail_usage(
            PARSER,
            ArgumentError(
                "--ack-pattern must contain at least one non-RENEW type; a pattern of only 'renew' would "
                "re-deliver every record indefinitely without ever resolving it"
            ),
        )
    config_file = values["command_config"]
    props = load_properties(PARSER, config_file) if config_file is not None else {}
    props["group.id"] = values["group_id"]
    props["bootstrap.servers"] = values["bootstrap_server"]
    if pattern:
        props["share.acknowledgement.mode"] = "explicit"
    return ShareTool(
        properties=drop_not_applicable(props),
        topic=values["topic"],
        group_id=values["group_id"],
        bootstrap=values["bootstrap_server"],
        max_messages=values["max_messages"],
        verbose=values["verbose"],
        mode=mode,
        pattern=pattern,
        offset_reset=str(values["offset_reset_strategy"]).lower(),
        runtime=values["runtime"],
    )


def parse_pattern(text: str) -> tuple[AcknowledgeType, ...]:
    """``"accept,release"`` -> the types (any case, spaces around names ignored); ``""`` -> none."""
    if not text:
        return ()
    types = []
    for name in text.split(","):
        try:
            types.append(AcknowledgeType[name.strip().upper()])
        except KeyError:
            fail_config(PARSER.prog, f"--ack-pattern: {name.strip()!r} is not one of accept, release, reject, renew")
    return tuple(types)


@dataclass
class AckState:
    """The acknowledgement bookkeeping: records acknowledged successfully, and with an ack pattern
    which type each offset was given (for ``ackTypeCounts``) and where in the pattern each offset is."""

    pattern: tuple[AcknowledgeType, ...]
    acknowledged: int = 0
    _types: dict[tuple[TopicPartition, int], AcknowledgeType] = field(default_factory=dict)
    _index: dict[tuple[TopicPartition, int], int] = field(default_factory=dict)

    def choose(self, tp: TopicPartition, offset: int) -> AcknowledgeType:
        """The type for this delivery: the pattern entry at ``offset % len``, or where the offset's last
        RENEW left it.  A RENEW entry is passed over at once (see the docs: asyncconsumer does not
        deliver a renewed record again), so the result is never RENEW."""
        key = (tp, offset)
        index = self._index.get(key, offset % len(self.pattern))
        while self.pattern[index] == AcknowledgeType.RENEW:
            index = (index + 1) % len(self.pattern)
        self._index[key] = index
        self._types[key] = self.pattern[index]
        return self.pattern[index]

    def callback(self, events: Events) -> Any:
        def on_commit(results: dict[TopicPartition, AcknowledgementResult]) -> None:
            for tp, result in results.items():
                self.report(events, tp, result)

        return on_commit

    def report(self, events: Events, tp: TopicPartition, result: AcknowledgementResult) -> None:
        """``offsets_acknowledged`` for one partition's answer (Java's callback comes per partition)."""
        offsets = list(result.offsets)
        success = result.error is None
        counts: dict[str, int] | Any = ...
        if success:
            self.acknowledged += len(offsets)
            if self.pattern:
                tally: Counter[str] = Counter()
                for offset in offsets:
                    kind = self._types.pop((tp, offset), None)
                    self._index.pop((tp, offset), None)
                    if kind is not None:
                        tally[kind.name] += 1
                counts = dict(tally)
        events.emit(
            "offsets_acknowledged",
            count=len(offsets),
            partitions=[{"topic": tp.topic, "partition": tp.partition, "count": len(offsets), "offsets": offsets}],
            success=success,
            error=str(result.error) if result.error is not None else ...,
            ackTypeCounts=counts,
        )


async def _session(
    tool: ShareTool, consumer: ShareConsumer[Any, Any], events: Events, shutdown: Shutdown, state: AckState
) -> None:
    """Poll, acknowledge and commit until ``--max-messages`` acknowledged or a signal (``run_tool``
    closes the consumer)."""
    async with anyio.create_task_group() as commits:
        if tool.offset_reset:
            await _set_offset_reset(tool, events)
        consumer.subscribe([tool.topic])
        while not (tool.max_messages >= 0 and state.acknowledged >= tool.max_messages) and not shutdown.requested:
            with shutdown.wakeable() as poll:
                batch = await consumer.getmany(timeout=POLL_SLICE)
            if poll.cancelled_caught:
                break
            if not batch:
                continue
            _process(tool, consumer, events, state, batch)
            if tool.mode == "sync":
                _log_failures(await consumer.commit(), "synchronously")
            elif tool.mode == "async":
                commits.start_soon(_commit_async, consumer)


def _process(
    tool: ShareTool,
    consumer: ShareConsumer[Any, Any],
    events: Events,
    state: AckState,
    batch: dict[TopicPartition, list[ShareConsumerRecord[Any, Any]]],
) -> None:
    """``record_data`` (with --verbose), the pattern's acknowledgements, then ``records_consumed``."""
    summaries = []
    for tp, records in batch.items():
        offsets = sorted({r.offset for r in records})
        summaries.append({"topic": tp.topic, "partition": tp.partition, "count": len(offsets), "offsets": offsets})
        for r in records:
            if tool.verbose:
                record_data(events, r)
            if tool.pattern:
                consumer.acknowledge(r, state.choose(tp, r.offset))
    events.emit("records_consumed", count=sum(len(records) for records in batch.values()), partitions=summaries)


async def _commit_async(consumer: ShareConsumer[Any, Any]) -> None:
    """``commitAsync()``: the outcome reaches the acknowledgement-commit callback."""
    try:
        _log_failures(await consumer.commit(), "asynchronously")
    except KafkaError as exc:
        log.error("Failed to commit acknowledgements asynchronously: %s", exc)


def _log_failures(results: dict[TopicPartition, KafkaError | None], how: str) -> None:
    for tp, error in results.items():
        if error is not None:
            log.error("Failed to commit offset %s for topic partition: %s: %s", how, tp, error)


async def _set_offset_reset(tool: ShareTool, events: Events) -> None:
    """``--offset-reset-strategy``: the group config ``share.auto.offset.reset``, through
    confluent-kafka's admin client (asyncconsumer has no admin client)."""
    strategy = tool.offset_reset
    if strategy not in ("earliest", "latest") and not strategy.startswith("by_duration:"):
        raise ValueError(f"Unsupported strategy for ShareGroup: {strategy}")
    try:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AdminClient,
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
        )
    except ImportError as exc:
        raise RuntimeError("--offset-reset-strategy needs confluent-kafka (pip install confluent-kafka)") from exc

    def alter() -> None:
        admin = AdminClient({"bootstrap.servers": tool.bootstrap, "log_level": 3})
        entry = ConfigEntry("share.auto.offset.reset", strategy, incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource("GROUP", tool.group_id, incremental_configs=[entry])
        admin.incremental_alter_configs([resource])[resource].result(timeout=ALTER_CONFIG_SECONDS)

    await anyio.to_thread.run_sync(alter, abandon_on_cancel=True)
    events.emit("offset_reset_strategy_set", offsetResetStrategy=strategy.partition(":")[0])
