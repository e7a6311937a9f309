"""The rebalance runner: rebalance callbacks on the application side, and the rebalance-safe commit.

The background loop queues a ``CallbackRequest`` when partitions move
(``Engine.callbacks``); the next call that polls the consumer runs the
listener's method here, inside the application's task, lets revoke hooks
(per-partition streams) finish their records, commits what was handed out
before the partitions are given up (``rebalance_safe_commits``) and
acknowledges the request, so the member state machine goes on.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Iterable
from typing import Protocol

import anyio

from ..config import ConsumerConfig
from ..engine.loop import Engine
from ..errors import KafkaError, RebalanceCallbackError
from ..listener import RebalanceListener
from ..managers.membership_types import CallbackKind, CallbackRequest
from ..structs import OffsetAndMetadata, TopicPartition

log = logging.getLogger("asyncconsumer.consumer")

#: While a revocation waits for commits of what was handed out: how often it asks the group
#: coordinator whether they were made elsewhere (a transactional producer's), in seconds.
GROUP_CHECK_INTERVAL = 0.5

#: Set while a consumer callback runs; tasks started inside it inherit it (KIP-957).
CALLBACK_OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar("asyncconsumer_callback", default=None)


class RevokeHook(Protocol):
    """Steps around a revocation (per-partition streams use them): before the listener runs, and
    after the rebalance-safe commit, just before the partitions are given up."""

    async def before_revoke(self, partitions: set[TopicPartition], *, lost: bool) -> None: ...

    def after_revoke(self, partitions: set[TopicPartition]) -> None: ...


def names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(sorted(str(tp) for tp in tps)) or "no partitions"


class RebalanceRunner:
    """Runs queued rebalance callbacks and commits offsets, talking to the engine only."""

    def __init__(self, config: ConsumerConfig) -> None:
        self._config = config
        self.listener: RebalanceListener | None = None
        self.revoke_hooks: list[RevokeHook] = []
        #: While a callback runs: the token its task (and tasks it starts) carry in CALLBACK_OWNER.
        self.callback_token: object | None = None
        #: ``close()`` is under way: the application is done, so the revocation of its leave does not
        #: wait for manual commits (there is no worker left to make them).
        self.closing = False

    async def run_callbacks(self, engine: Engine, *, raise_errors: bool = True) -> None:
        """Run queued rebalance callbacks here, on the application side, and acknowledge them."""
        first_error: BaseException | None = None
        while engine.callbacks:
            request = engine.callbacks.popleft()
            error = await self.run_callback(engine, request)
            first_error = first_error or error
        if first_error is not None and raise_errors:
            raise first_error

    async def run_callback(self, engine: Engine, request: CallbackRequest) -> BaseException | None:
        listener = self.listener or RebalanceListener()
        method = {
            CallbackKind.REVOKED: listener.on_partitions_revoked,
            CallbackKind.ASSIGNED: listener.on_partitions_assigned,
            CallbackKind.LOST: listener.on_partitions_lost,
        }[request.kind]
        partitions = set(request.partitions)
        error: BaseException | None = None
        token = object()
        previous_token = self.callback_token
        self.callback_token = token
        context_token = CALLBACK_OWNER.set(token)
        hooks = list(self.revoke_hooks) if request.kind is not CallbackKind.ASSIGNED else []
        commit = request.kind is CallbackKind.REVOKED and self._commits_before_revoke(engine)
        remaining = max(0.0, request.deadline - engine.clock())
        # Time kept back from the callback for the rebalance-safe commit: a callback that raises or
        # overruns still leaves the commit its turn before the partitions are given up.
        reserve = min(self._config.request_timeout_ms / 1000, remaining / 2) if commit else 0.0
        try:
            try:
                with anyio.move_on_after(remaining - reserve) as scope:
                    for hook in hooks:
                        await hook.before_revoke(partitions, lost=request.kind is CallbackKind.LOST)
                    result = method(partitions)
                    if inspect.isawaitable(result):
                        await result
                if scope.cancelled_caught:
                    error = RebalanceCallbackError(
                        f"{request.kind.value} for {names(partitions)} did not finish within rebalance_timeout_ms; "
                        "the rebalance went on without it")
            except Exception as exc:
                error = RebalanceCallbackError(f"{request.kind.value} for {names(partitions)} raised {exc!r}")
                error.__cause__ = exc
            except anyio.get_cancelled_exc_class():
                error = RebalanceCallbackError(
                    f"{request.kind.value} for {names(partitions)} was cancelled with the polling call; "
                    "the rebalance went on without it")
                raise
            finally:
                # The partitions are given up however the callback ended, even when the polling call
                # was cancelled: the rebalance-safe commit and the end of their streams come first.
                with anyio.CancelScope(shield=True):
                    if commit:
                        commit_error = await self._commit_before_revoke_within(engine, request)
                        error = error or commit_error
                    for hook in hooks:
                        hook.after_revoke(partitions)
        finally:
            CALLBACK_OWNER.reset(context_token)
            self.callback_token = previous_token
            if not request.acked:
                request.ack(error)
                engine.wake()
        if error is not None:
            log.error("%s", error)
        return error

    async def _commit_before_revoke_within(self, engine: Engine, request: CallbackRequest) -> KafkaError | None:
        """The rebalance-safe commit, by the callback's deadline; a failure is returned, not raised."""
        with anyio.move_on_after(max(0.0, request.deadline - engine.clock())):
            try:
                await self._commit_before_revoke(engine, request.partitions)
            except KafkaError as exc:
                partitions = names(request.partitions)
                log.warning("committing %s before giving them up failed: %s", partitions, exc)
                error = RebalanceCallbackError(f"committing {partitions} before giving them up failed: {exc}")
                error.__cause__ = exc
                return error
        return None

    def _commits_before_revoke(self, engine: Engine) -> bool:
        return engine.commits is not None and self._config.rebalance_safe_commits

    async def _commit_before_revoke(self, engine: Engine, partitions: frozenset[TopicPartition]) -> None:
        """Rebalance-safe commits: the next owner starts exactly where this member stopped."""
        commits = engine.commits
        if commits is None:
            return
        consumed = {tp: om for tp, om in consumed_offsets(engine).items() if tp in partitions}
        if self._config.enable_auto_commit:
            pending = {tp: om for tp, om in consumed.items() if commits.last_committed.get(tp) != om.offset}
            if pending:
                await commit_now(engine, pending, self._config.request_timeout_ms / 1000)
            return
        # Manual commits: wait until what the application was handed is committed, by its own
        # commits or elsewhere: an exactly-once loop's transactional producer commits the offsets
        # (TxnOffsetCommit), which only the group coordinator sees, so it is asked at once and then
        # every GROUP_CHECK_INTERVAL seconds.  A partition the application was handed nothing from
        # since its position was set (a reset, a seek) has nothing to wait for, though no commit
        # names its position; nor does anything while closing.
        if self.closing:
            return
        partitions_now = engine.subscriptions.partitions
        consumed = {tp: om for tp, om in consumed.items() if partitions_now[tp].handed_out_since_set}
        ask_at = engine.clock()
        with anyio.move_on_after(self._config.rebalance_commit_wait_ms / 1000):
            while True:
                consumed = {tp: om for tp, om in consumed.items() if commits.last_committed.get(tp, -1) < om.offset}
                if not consumed:
                    return
                if engine.clock() >= ask_at:
                    ask_at = engine.clock() + GROUP_CHECK_INTERVAL
                    committed = await _group_committed(engine, list(consumed))
                    if committed is None:
                        ask_at = float("inf")  # the coordinator will not say: wait for our own commits only
                    consumed = {tp: om for tp, om in consumed.items() if committed is None
                                or (group := committed.get(tp)) is None or group.offset < om.offset}
                    continue
                event = engine.app_event()
                with anyio.move_on_after(0.05):
                    await event.wait()


async def _group_committed(
    engine: Engine, partitions: list[TopicPartition]
) -> dict[TopicPartition, OffsetAndMetadata | None] | None:
    """The group's committed offsets of ``partitions`` (OffsetFetch, waiting out a transaction
    still open on them), or None when the coordinator refuses to say (logged)."""
    commits = engine.commits
    assert commits is not None
    waiter = await engine.call(lambda now: commits.fetch_committed(partitions))
    try:
        return await waiter.wait()
    except KafkaError as exc:
        log.debug("fetching the committed offsets of %s before giving them up failed: %s", names(partitions), exc)
        return None
    finally:
        if not waiter.done():  # cut short (the wait is over): the commit manager drops the lookup
            waiter.set_exception(KafkaError("no longer wanted"))


async def commit_now(engine: Engine, offsets: dict[TopicPartition, OffsetAndMetadata], timeout: float) -> None:
    """Commit ``offsets`` through the background loop and wait for the answer."""
    commits = engine.commits
    assert commits is not None
    # What is committed counts as finished: the background auto-commit, which commits what was
    # finished as of the last poll, must not take this commit back before the next poll.
    for tp, om in offsets.items():
        state = engine.subscriptions.partitions.get(tp)
        if state is not None:
            state.committed_through(om.offset)
    waiter = await engine.call(lambda now: commits.commit(now, offsets, timeout))
    await waiter.wait()


def consumed_offsets(engine: Engine | None) -> dict[TopicPartition, OffsetAndMetadata]:
    """The position after what was handed out, per partition (not for partitions that no longer
    exist: a deleted topic's offsets cannot be committed, and went with it)."""
    if engine is None:
        return {}
    cluster = engine.metadata.cluster
    return {
        tp: OffsetAndMetadata(s.consumed, "", s.epoch_before(s.consumed))
        for tp, s in engine.subscriptions.partitions.items()
        if s.has_position and s.consumed >= 0 and not cluster.missing(tp)
    }
