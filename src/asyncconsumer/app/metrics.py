"""Assembling ``Consumer.metrics()`` and ``ShareConsumer.metrics()``: the engine's counters and
partition states into the frozen dataclasses of ``asyncconsumer.metrics``, on each call."""

from __future__ import annotations

from typing import Any

from ..engine.buffers import BufferPool
from ..engine.core import LoopCore
from ..engine.loop import Engine
from ..engine.network import NetworkClient
from ..engine.share_loop import ShareEngine
from ..metrics import (
    AcknowledgementMetrics,
    BufferMetrics,
    CommitMetrics,
    ConnectionMetrics,
    ConsumerMetrics,
    FetchMetrics,
    LoopMetrics,
    PartitionMetrics,
    PoolMetrics,
    RebalanceMetrics,
    ShareConsumerMetrics,
    ShareFetchMetrics,
    ShareMembershipMetrics,
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
    return ConsumerMetrics(
        partitions=partitions,
        records_consumed=sum(consumed.values()),
        bytes_consumed=collector.bytes_consumed,
        fetch=fetch,
        rebalances=rebalances,
        commits=commits,
        connections=_connections(network),
        last_poll_age=0.0 if collector.waiting else max(0.0, engine.clock() - engine.last_poll),
        buffers=BufferMetrics(_pool(network.frames), _pool(collector.column_buffers)),
        loop=_loop(engine),
        records_skipped=collector.deserializers.skipped.total(),
    )


def _pool(pool: BufferPool) -> PoolMetrics:
    return PoolMetrics(pool.held_bytes, pool.kept, pool.in_use, pool.reused, pool.allocated, pool.released)


def _loop(engine: LoopCore) -> LoopMetrics:
    watch = engine.loop_lag
    return LoopMetrics(watch.lag, watch.max_lag, watch.blocks, watch.blocked_seconds)


def share_snapshot(engine: ShareEngine, records_delivered: int, records_skipped: int = 0) -> ShareConsumerMetrics:
    """The share consumer's snapshot (``records_delivered``, ``records_skipped``: counted by the
    application side)."""
    fetcher, member, network = engine.fetcher, engine.membership, engine.network
    return ShareConsumerMetrics(
        records_delivered=records_delivered,
        fetch=ShareFetchMetrics(
            requests=fetcher.requests,
            responses=fetcher.responses,
            errors=fetcher.errors,
            latency=network.latency["ShareFetch"].snapshot(),
            records_acquired=fetcher.records_acquired,
            response_bytes=fetcher.response_bytes,
            buffer_bytes=fetcher.buffered_bytes,
        ),
        acknowledgements=AcknowledgementMetrics(
            acknowledged=fetcher.acknowledged,
            failed=fetcher.acknowledgement_failures,
            pending=fetcher.pending_acknowledgements(),
            latency=network.latency["ShareAcknowledge"].snapshot(),
        ),
        membership=ShareMembershipMetrics(
            state=member.state,
            member_id=member.member_id,
            member_epoch=member.epoch,
            assignment=member.assignment(),
            assignment_changes=member.assignment_version,
        ),
        connections=_connections(network),
        buffers=BufferMetrics(frames=_pool(network.frames)),
        loop=_loop(engine),
        records_skipped=records_skipped,
    )


def _connections(network: NetworkClient) -> ConnectionMetrics:
    return ConnectionMetrics(
        network.connections_open, network.connections_opened, network.connection_errors, network.reconnects
    )
