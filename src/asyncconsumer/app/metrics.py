"""Assembling ``Consumer.metrics()``: the engine's counters and partition states into the frozen
dataclasses of ``asyncconsumer.metrics``, on each call."""

from __future__ import annotations

from typing import Any

from ..engine.loop import Engine
from ..metrics import (
    CommitMetrics,
    ConnectionMetrics,
    ConsumerMetrics,
    FetchMetrics,
    PartitionMetrics,
    RebalanceMetrics,
)
from ..structs import TopicPartition
from .collector import Collector


def snapshot(engine: Engine, collector: Collector[Any, Any]) -> ConsumerMetrics:
    """Assemble the snapshot from the engine's counters and states (``collector``: the consumer's
    ``app.collector.Collector``, which counts records handed out)."""
    consumed = collector.handed_out()
    read_committed = engine.config.isolation_level == "read_committed"
    committed = engine.commits.last_committed if engine.commits is not None else {}
    partitions: dict[TopicPartition, PartitionMetrics] = {}
    for tp, state in engine.subscriptions.partitions.items():
        position = state.consumed if state.has_position and state.consumed >= 0 else None
        high = state.high_watermark if state.high_watermark >= 0 else None
        stable = state.last_stable_offset if state.last_stable_offset >= 0 else None
        end = stable if read_committed else high
        lag = max(0, end - position) if end is not None and position is not None else None
        partitions[tp] = PartitionMetrics(
            tp.topic, tp.partition, position, committed.get(tp), high, stable, lag, consumed.get(tp, 0), state.paused
        )
    fetcher = engine.fetcher
    network = engine.network
    fetch = FetchMetrics(
        requests=fetcher.requests,
        responses=fetcher.responses,
        responses_by_node=dict(fetcher.responses_by_node),
        errors=fetcher.errors,
        latency=network.latency["Fetch"].snapshot(),
        response_bytes=fetcher.response_bytes,
        response_bytes_max=fetcher.response_bytes_max,
        buffer_bytes=engine.buffer.used_bytes,
    )
    member = engine.membership
    rebalances = (
        RebalanceMetrics(member.rebalances, member.last_rebalance_seconds, member.state.value, member.generation,
                         member.member_id or None)
        if member is not None
        else RebalanceMetrics()
    )
    commit_manager = engine.commits
    commits = CommitMetrics(
        commit_manager.commits_done if commit_manager is not None else 0,
        commit_manager.commit_failures if commit_manager is not None else 0,
        network.latency["OffsetCommit"].snapshot(),
    )
    connections = ConnectionMetrics(
        network.connections_open, network.connections_opened, network.connection_errors, network.reconnects
    )
    return ConsumerMetrics(
        partitions=partitions,
        records_consumed=sum(consumed.values()),
        bytes_consumed=collector.bytes_consumed,
        fetch=fetch,
        rebalances=rebalances,
        commits=commits,
        connections=connections,
        last_poll_age=0.0 if collector.waiting else max(0.0, engine.clock() - engine.last_poll),
    )
