"""CommitManager: OffsetCommit / OffsetFetch bodies, coordinator errors, positions, auto-commit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncconsumer.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    UnknownMemberIdError,
)
from asyncconsumer.managers.commit import CommitManager, GroupIdentity
from asyncconsumer.managers.coordinator import COORDINATOR_NODE_BASE, CoordinatorManager
from asyncconsumer.managers.subscription import PartitionPhase, SubscriptionState
from asyncconsumer.protocol.api import SUPPORTED_VERSIONS
from asyncconsumer.structs import OffsetAndMetadata, TopicPartition

from .scripted import FakeClock, Scripted, Sent

BACKOFF = 0.125
TIMEOUT = 4.0
INTERVAL = 5.0
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
U0 = TopicPartition("u", 0)


class Setup:
    def __init__(self, *, has_group: bool = False, auto_commit: float | None = None,
                 identity: GroupIdentity | None = None, versions: dict[str, int] | None = None,
                 gone: set[TopicPartition] | None = None,
                 identity_of: Callable[[], GroupIdentity] | None = None) -> None:
        self.clock = FakeClock()
        self.subs = SubscriptionState("earliest", has_group=has_group)
        self.errors: list[KafkaError] = []
        self.coordinator = CoordinatorManager("g", retry_backoff=BACKOFF, register_node=lambda *a: None)
        kwargs: dict[str, Any] = {}
        if identity is not None:
            kwargs["group_identity"] = lambda: identity
        if identity_of is not None:
            kwargs["group_identity"] = identity_of
        if gone is not None:
            kwargs["partition_exists"] = lambda tp: tp not in gone
        self.commits = CommitManager(self.coordinator, self.subs, retry_backoff=BACKOFF,
                                     request_timeout=TIMEOUT, auto_commit_interval=auto_commit,
                                     report_error=self.errors.append, **kwargs)
        self.h = Scripted(self.coordinator, self.commits, clock=self.clock, versions=versions)

    def find_coordinator(self, node: int = 3) -> int:
        self.h.take("FindCoordinator").at(4).respond({"coordinators": [
            {"key": "g", "node_id": node, "host": "c", "port": 1, "error_code": 0, "error_message": None}]})
        assert self.coordinator.node_id == COORDINATOR_NODE_BASE - node
        return COORDINATOR_NODE_BASE - node


def commit_partitions(sent: Sent) -> dict[TopicPartition, tuple[int, int, str | None]]:
    return {TopicPartition(t["name"], p["partition_index"]):
            (p["committed_offset"], p["committed_leader_epoch"], p["committed_metadata"])
            for t in sent.body()["topics"] for p in t["partitions"]}


def commit_answer(codes: dict[TopicPartition, int]) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, int]]] = {}
    for tp, code in codes.items():
        by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "error_code": code})
    return {"topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}


Committed = dict[TopicPartition, tuple[int, int, str | None] | int]


def fetch_answer(version: int, committed: Committed, group_error: int = 0) -> dict[str, Any]:
    """tp -> (offset, leader epoch, metadata), or tp -> partition error code."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, value in committed.items():
        if isinstance(value, int):
            entry = {"partition_index": tp.partition, "committed_offset": -1, "committed_leader_epoch": -1,
                     "metadata": None, "error_code": value}
        else:
            offset, epoch, metadata = value
            entry = {"partition_index": tp.partition, "committed_offset": offset,
                     "committed_leader_epoch": epoch if version >= 5 else -1, "metadata": metadata,
                     "error_code": 0}
        by_topic.setdefault(tp.topic, []).append(entry)
    topics = [{"name": n, "partitions": ps} for n, ps in by_topic.items()]
    if version >= 8:
        return {"groups": [{"group_id": "g", "topics": topics, "error_code": group_error}]}
    return {"topics": topics, "error_code": group_error}


# -- OffsetCommit --------------------------------------------------------------------------------------


def test_commit_body_for_manual_assignment() -> None:
    s = Setup()
    node = s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10, "meta", 4), U0: OffsetAndMetadata(7)})
    request = s.h.take("OffsetCommit")
    assert request.node_id == node
    body = request.body()
    assert body["group_id"] == "g"
    assert body["generation_id_or_member_epoch"] == -1
    assert body["member_id"] == ""
    assert body["group_instance_id"] is None
    assert commit_partitions(request) == {T0: (10, 4, "meta"), U0: (7, -1, "")}
    assert not waiter.done()
    s.h.assert_idle("OffsetCommit")


def test_commit_body_uses_group_identity() -> None:
    s = Setup(identity=GroupIdentity(generation=5, member_id="m-1", group_instance_id="static-1"))
    s.find_coordinator()
    s.commits.commit(s.h.now, {T0: OffsetAndMetadata(1)})
    body = s.h.take("OffsetCommit").body()
    assert (body["generation_id_or_member_epoch"], body["member_id"], body["group_instance_id"]) == (
        5, "m-1", "static-1")


@pytest.mark.parametrize("version", range(2, SUPPORTED_VERSIONS["OffsetCommit"][1] + 1))
def test_commit_encodes_at_every_version(version: int) -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10, "m", 4)})
    request = s.h.take("OffsetCommit").at(version)
    offset, epoch, _ = commit_partitions(request)[T0]
    assert offset == 10
    assert epoch == (4 if version >= 6 else -1)
    request.respond(commit_answer({T0: 0}))
    assert waiter.result() is None


def test_empty_commit_resolves_at_once() -> None:
    s = Setup()
    assert s.commits.commit(s.h.now, {}).result() is None
    s.h.assert_idle("OffsetCommit")


def test_commit_success_resolves_and_records_last_committed() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10), T1: OffsetAndMetadata(11)})
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0, T1: 0}))
    assert waiter.done()
    assert waiter.result() is None
    assert s.commits.last_committed == {T0: 10, T1: 11}
    s.h.advance(TIMEOUT * 2)
    s.h.assert_idle()


def test_commit_waits_for_the_coordinator() -> None:
    s = Setup()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    assert s.h.sent("OffsetCommit") == []
    s.find_coordinator(node=1)
    request = s.h.take("OffsetCommit")
    assert request.node_id == COORDINATOR_NODE_BASE - 1
    request.respond(commit_answer({T0: 0}))
    assert waiter.result() is None


def test_not_coordinator_marks_unknown_and_retries_failed_partitions() -> None:
    s = Setup()
    s.find_coordinator(node=3)
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10), T1: OffsetAndMetadata(11)})
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0, T1: 16}))  # NOT_COORDINATOR for t-1
    assert s.coordinator.node_id is None
    assert not waiter.done()
    assert s.commits.last_committed == {T0: 10}
    node = s.find_coordinator(node=2)  # rediscovery is sent at once
    s.h.assert_idle("OffsetCommit")  # but the commit waits for its backoff
    s.h.advance(BACKOFF)
    retry = s.h.take("OffsetCommit")
    assert retry.node_id == node
    assert commit_partitions(retry) == {T1: (11, -1, "")}
    retry.respond(commit_answer({T1: 0}))
    assert waiter.result() is None
    assert s.commits.last_committed == {T0: 10, T1: 11}


def test_retriable_code_retries_without_rediscovery() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    s.h.take("OffsetCommit").respond(commit_answer({T0: 7}))  # REQUEST_TIMED_OUT
    assert s.coordinator.node_id is not None
    s.h.assert_idle()
    s.h.advance(BACKOFF)
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0}))
    assert waiter.result() is None


@pytest.mark.parametrize("code", [25, 22])  # UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION
def test_fatal_code_fails_with_commit_failed_naming_the_partition(code: int) -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10), U0: OffsetAndMetadata(3)})
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0, U0: code}))
    with pytest.raises(CommitFailedError, match="u-0") as info:
        waiter.result()
    assert "t-0" not in str(info.value)
    assert isinstance(info.value.__cause__, KafkaError)
    if code == 25:
        assert isinstance(info.value.__cause__, UnknownMemberIdError)
    assert s.commits.last_committed == {T0: 10}
    s.h.advance(BACKOFF)
    s.h.assert_idle("OffsetCommit")


@pytest.mark.parametrize("then", ["newer epoch", "fenced", "lost and back"])
def test_stale_member_epoch_retries_with_the_newer_epoch_only(then: str) -> None:
    """KIP-848: a commit that crossed a heartbeat bumping the member epoch is answered
    STALE_MEMBER_EPOCH; it goes again with the new epoch.  A member that left the group meanwhile
    does not commit with an epoch it no longer has (or as a non-member): the commit fails.  So does
    one that lost its partitions and joined again under its member id: they may be another's now."""
    identity = [GroupIdentity(generation=4, member_id="m-1")]
    s = Setup(identity_of=lambda: identity[0])
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    first = s.h.take("OffsetCommit")
    assert first.body()["generation_id_or_member_epoch"] == 4
    identity[0] = {
        "newer epoch": GroupIdentity(generation=5, member_id="m-1"),
        "fenced": GroupIdentity(),
        "lost and back": GroupIdentity(generation=5, member_id="m-1", losses=1),
    }[then]
    first.respond(commit_answer({T0: 113}))
    if then != "newer epoch":
        with pytest.raises(CommitFailedError, match="STALE_MEMBER_EPOCH"):
            waiter.result()
        s.h.advance(BACKOFF)
        s.h.assert_idle("OffsetCommit")
        return
    s.h.advance(BACKOFF)
    again = s.h.take("OffsetCommit")
    assert again.body()["generation_id_or_member_epoch"] == 5 and again.body()["member_id"] == "m-1"
    again.respond(commit_answer({T0: 0}))
    assert waiter.result() is None and s.commits.last_committed == {T0: 10}


@pytest.mark.parametrize("then", ["newer epoch", "left", "lost and back"])
def test_a_members_commit_waiting_to_be_sent_goes_only_while_its_membership_lasts(then: str) -> None:
    """A member's commit that could not go yet (no coordinator) goes under the member's current
    epoch, but not once the member left or lost its partitions: as a non-member an empty group
    would take it, and under a new membership it could commit over another member's partitions."""
    identity = [GroupIdentity(generation=4, member_id="m-1")]
    s = Setup(identity_of=lambda: identity[0])
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    assert s.h.take_all("OffsetCommit") == [] and not waiter.done()  # looking for the coordinator
    identity[0] = {
        "newer epoch": GroupIdentity(generation=5, member_id="m-1"),
        "left": GroupIdentity(),
        "lost and back": GroupIdentity(generation=5, member_id="m-1", losses=1),
    }[then]
    s.find_coordinator()
    if then == "newer epoch":
        sent = s.h.take("OffsetCommit")
        assert sent.body()["generation_id_or_member_epoch"] == 5 and sent.body()["member_id"] == "m-1"
        sent.respond(commit_answer({T0: 0}))
        assert waiter.result() is None and s.commits.last_committed == {T0: 10}
        return
    with pytest.raises(CommitFailedError, match=r"t-0.*not sent"):
        waiter.result()
    s.h.assert_idle("OffsetCommit")
    assert s.commits.last_committed == {}


def test_commit_times_out_without_a_coordinator() -> None:
    s = Setup()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)}, timeout=1.0)
    s.h.take("FindCoordinator").at(4).respond({"coordinators": [
        {"key": "g", "node_id": -1, "host": "", "port": -1, "error_code": 15, "error_message": None}]})
    s.h.advance(0.5)
    s.h.poll()
    assert not waiter.done()
    s.h.advance(0.5)
    s.h.poll()
    with pytest.raises(KafkaTimeoutError, match="t-0") as info:
        waiter.result()
    assert "COORDINATOR_NOT_AVAILABLE" in str(info.value)
    # The coordinator shows up late: the timed-out commit is not sent.
    [retry] = s.h.take_all("FindCoordinator")
    retry.at(4).respond({"coordinators": [
        {"key": "g", "node_id": 1, "host": "c", "port": 1, "error_code": 0, "error_message": None}]})
    assert s.coordinator.node_id is not None
    s.h.assert_idle("OffsetCommit")


def test_default_timeout_is_request_timeout() -> None:
    s = Setup()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    s.h.take("FindCoordinator")  # never answered
    s.h.advance(TIMEOUT - 0.5)
    s.h.poll()
    assert not waiter.done()
    s.h.advance(0.5)
    s.h.poll()
    with pytest.raises(KafkaTimeoutError):
        waiter.result()


def test_in_flight_commit_is_not_timed_out_before_its_answer() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)}, timeout=1.0)
    request = s.h.take("OffsetCommit")
    s.h.advance(2.0)
    s.h.poll()
    assert not waiter.done()
    request.respond(commit_answer({T0: 0}))
    assert waiter.result() is None


def test_transport_error_retries_after_rediscovery() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    s.h.take("OffsetCommit").fail(KafkaConnectionError("broken pipe"))
    assert s.coordinator.node_id is None
    assert not waiter.done()
    s.find_coordinator()
    s.h.advance(BACKOFF)
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0}))
    assert waiter.result() is None


def test_a_commit_timing_out_after_a_timed_out_request_names_that_request() -> None:
    # The coordinator's connection hung: the request timed out, the coordinator was found again, and
    # the deadline came before the retry was answered.  The timeout names the hung request, not
    # the (by now healthy) coordinator lookup.
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)}, timeout=2.0)
    s.h.advance(1.0)
    s.h.take("OffsetCommit").fail(KafkaTimeoutError("OffsetCommit request to c:1 timed out after 1.0s"))
    assert not waiter.done() and s.coordinator.node_id is None
    s.find_coordinator()
    assert s.coordinator.last_error is None
    s.h.advance(1.0)
    s.h.poll()
    with pytest.raises(KafkaTimeoutError, match="t-0") as info:
        waiter.result()
    assert "OffsetCommit request to c:1 timed out" in str(info.value)


def test_non_retriable_transport_error_fails_the_commit() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.commit(s.h.now, {T0: OffsetAndMetadata(10)})
    s.h.take("OffsetCommit").fail(KafkaError("bad body"))
    with pytest.raises(KafkaError, match="bad body"):
        waiter.result()


# -- OffsetFetch ---------------------------------------------------------------------------------------


def test_offset_fetch_v7_body() -> None:
    s = Setup()
    s.find_coordinator()
    s.commits.fetch_committed([T0, U0, T1, T0])
    request = s.h.take("OffsetFetch").at(7)
    raw = request.request.build(7)
    assert raw == {"group_id": "g", "require_stable": True,
                   "topics": [{"name": "t", "partition_indexes": [0, 1]}, {"name": "u", "partition_indexes": [0]}]}
    assert request.body()["group_id"] == "g"  # and the schema agrees


def test_offset_fetch_v8_body() -> None:
    s = Setup()
    s.find_coordinator()
    s.commits.fetch_committed([T0, U0])
    request = s.h.take("OffsetFetch").at(8)
    raw = request.request.build(8)
    assert raw["require_stable"] is True
    assert "group_id" not in raw
    [group] = raw["groups"]
    assert group["group_id"] == "g"
    assert group["topics"] == [{"name": "t", "partition_indexes": [0]}, {"name": "u", "partition_indexes": [0]}]
    assert request.body()["groups"][0]["group_id"] == "g"


@pytest.mark.parametrize("version", [7, 8, 9])
def test_offset_fetch_result(version: int) -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.fetch_committed([T0, T1, U0])
    request = s.h.take("OffsetFetch").at(version)
    request.respond(fetch_answer(version, {T0: (10, 3, "m"), T1: (-1, -1, ""), U0: (5, -1, None)}))
    assert waiter.result() == {
        T0: OffsetAndMetadata(10, "m", 3),
        T1: None,
        U0: OffsetAndMetadata(5, "", None),
    }


@pytest.mark.parametrize(
    "version",
    [pytest.param(v) for v in range(1, 7)]
    + list(range(7, SUPPORTED_VERSIONS["OffsetFetch"][1] + 1)),
)
def test_offset_fetch_encodes_at_every_version(version: int) -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.fetch_committed([T0])
    request = s.h.take("OffsetFetch").at(version)
    request.respond(fetch_answer(version, {T0: (10, -1, "")}))
    assert waiter.result() == {T0: OffsetAndMetadata(10, "", None)}


def test_offset_fetch_group_error_fails() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.fetch_committed([T0])
    s.h.take("OffsetFetch").respond(fetch_answer(9, {}, group_error=30))
    with pytest.raises(GroupAuthorizationFailedError):
        waiter.result()


def test_offset_fetch_not_coordinator_and_unstable_retry() -> None:
    s = Setup()
    s.find_coordinator()
    waiter = s.commits.fetch_committed([T0])
    s.h.take("OffsetFetch").respond(fetch_answer(9, {}, group_error=16))
    assert s.coordinator.node_id is None
    s.find_coordinator()
    s.h.assert_idle("OffsetFetch")
    s.h.advance(BACKOFF)
    s.h.take("OffsetFetch").respond(fetch_answer(9, {T0: 88}))  # UNSTABLE_OFFSET_COMMIT
    assert s.coordinator.node_id is not None
    assert not waiter.done()
    s.h.assert_idle("OffsetFetch")
    s.h.advance(BACKOFF)
    s.h.take("OffsetFetch").respond(fetch_answer(9, {T0: (4, -1, "")}))
    assert waiter.result() == {T0: OffsetAndMetadata(4, "", None)}


# -- committed offsets become positions ----------------------------------------------------------------


def test_await_committed_partitions_get_positions() -> None:
    s = Setup(has_group=True)
    s.find_coordinator()
    s.subs.assign([T0, T1])
    assert all(st.phase is PartitionPhase.AWAIT_COMMITTED for st in s.subs.partitions.values())
    request = s.h.take("OffsetFetch")
    s.h.assert_idle("OffsetFetch")  # asked once
    request.respond(fetch_answer(9, {T0: (10, 2, ""), T1: (-1, -1, "")}))
    t0, t1 = s.subs.partitions[T0], s.subs.partitions[T1]
    assert (t0.phase, t0.position, t0.fetch_offset, t0.leader_epoch) == (PartitionPhase.FETCHING, 10, 10, 2)
    assert t1.phase is PartitionPhase.AWAIT_RESET
    assert t1.reset_to == "earliest"
    assert s.commits.last_committed == {T0: 10}
    assert s.commits.processed_offsets() == {}  # nothing new to commit
    s.h.assert_idle("OffsetFetch")


def test_positions_wait_for_the_coordinator() -> None:
    s = Setup(has_group=True)
    s.subs.assign([T0])
    assert s.h.sent("OffsetFetch") == []
    s.find_coordinator()
    s.h.take("OffsetFetch").respond(fetch_answer(9, {T0: (3, -1, "")}))
    assert s.subs.partitions[T0].position == 3


def test_newly_added_partitions_are_fetched_separately() -> None:
    s = Setup(has_group=True)
    s.find_coordinator()
    s.subs.assign([T0])
    first = s.h.take("OffsetFetch")
    s.subs.add([T1])
    second = s.h.take("OffsetFetch")
    assert [(t["name"], t["partition_indexes"]) for t in second.body()["groups"][0]["topics"]] == [("t", [1])]
    second.respond(fetch_answer(9, {T1: (8, -1, "")}))
    first.respond(fetch_answer(9, {T0: (9, -1, "")}))
    assert (s.subs.partitions[T0].position, s.subs.partitions[T1].position) == (9, 8)


def test_seek_during_position_fetch_wins() -> None:
    s = Setup(has_group=True)
    s.find_coordinator()
    s.subs.assign([T0])
    request = s.h.take("OffsetFetch")
    s.subs.seek(T0, 1000)
    request.respond(fetch_answer(9, {T0: (10, -1, "")}))
    state = s.subs.partitions[T0]
    assert (state.phase, state.position) == (PartitionPhase.FETCHING, 1000)
    assert T0 not in s.commits.last_committed


def test_position_fetch_error_is_reported_and_parks_partitions() -> None:
    s = Setup(has_group=True)
    s.find_coordinator()
    s.subs.assign([T0])
    s.h.take("OffsetFetch").respond(fetch_answer(9, {}, group_error=30))
    assert [type(e) for e in s.errors] == [GroupAuthorizationFailedError]
    state = s.subs.partitions[T0]
    assert state.phase is PartitionPhase.AWAIT_COMMITTED
    assert state.retry_at == float("inf")
    s.h.advance(100)
    s.h.assert_idle("OffsetFetch")


def test_waiting_for_the_coordinator_is_not_a_busy_deadline() -> None:
    s = Setup(has_group=True)
    s.subs.assign([T0])
    s.h.take("FindCoordinator").fail(KafkaConnectionError("coordinator down"))
    s.h.poll()
    assert s.coordinator.next_deadline(s.h.now) == s.h.now + BACKOFF
    assert s.commits.next_deadline(s.h.now) > s.h.now


# -- auto-commit -------------------------------------------------------------------------------------


def test_auto_commit_commits_processed_offsets_when_changed() -> None:
    s = Setup(auto_commit=INTERVAL)
    s.find_coordinator()
    s.subs.assign([T0, T1])
    s.subs.seek(T0, 5)
    s.subs.seek(T1, 7)
    start = s.h.now
    s.commits.start_auto_commit(start)
    assert s.commits.next_deadline(start) == start + INTERVAL
    t0 = s.subs.partitions[T0]
    t0.consumed = 20  # handed to the application, not yet finished with
    s.h.advance(INTERVAL - 0.5)
    s.h.assert_idle("OffsetCommit")
    s.h.advance(0.5)
    first = s.h.take("OffsetCommit")
    assert commit_partitions(first) == {T0: (5, -1, ""), T1: (7, -1, "")}  # processed, not consumed
    first.respond(commit_answer({T0: 0, T1: 0}))
    assert s.commits.last_committed == {T0: 5, T1: 7}
    s.h.advance(INTERVAL)
    s.h.assert_idle("OffsetCommit")  # nothing changed
    t0.processed = 20
    s.h.advance(INTERVAL)
    second = s.h.take("OffsetCommit")
    assert commit_partitions(second) == {T0: (20, -1, "")}


def test_auto_commit_skips_partitions_without_position() -> None:
    s = Setup(auto_commit=INTERVAL)
    s.find_coordinator()
    s.subs.assign([T0, T1])
    s.subs.seek(T1, 3)
    s.commits.start_auto_commit(s.h.now)
    s.h.advance(INTERVAL)
    assert set(commit_partitions(s.h.take("OffsetCommit"))) == {T1}


def test_auto_commit_leaves_out_partitions_that_no_longer_exist() -> None:
    # The broker refuses offsets of a deleted topic (UNKNOWN_TOPIC_OR_PARTITION) and dropped the
    # group's offsets of it with the topic: there is nothing to commit there.
    gone: set[TopicPartition] = set()
    s = Setup(auto_commit=INTERVAL, gone=gone)
    s.find_coordinator()
    s.subs.assign([T0, T1])
    s.subs.seek(T0, 4)
    s.subs.seek(T1, 3)
    gone.add(T0)
    s.commits.start_auto_commit(s.h.now)
    s.h.advance(INTERVAL)
    assert set(commit_partitions(s.h.take("OffsetCommit"))) == {T1}
    assert s.commits.processed_offsets() == {T1: OffsetAndMetadata(3)}


def test_no_auto_commit_without_interval() -> None:
    s = Setup(auto_commit=None)
    s.find_coordinator()
    s.subs.assign([T0])
    s.subs.seek(T0, 5)
    s.commits.start_auto_commit(s.h.now)
    assert s.commits.next_deadline(s.h.now) == float("inf")
    s.h.advance(3600)
    s.h.assert_idle("OffsetCommit")


@pytest.mark.parametrize("kept", [True, False])
def test_metadata_dropped_by_the_broker_is_named_once(kept: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Apache Kafka answers OffsetFetch with the metadata committed; a broker that drops it (Tansu)
    gets one WARNING naming the partition and the metadata's length, never its text."""
    s = Setup()
    s.find_coordinator()
    s.commits.commit(s.clock.now, {T0: OffsetAndMetadata(7, "batch-42-secret")})
    s.h.take("OffsetCommit").respond(commit_answer({T0: 0}))
    with caplog.at_level("WARNING", logger="asyncconsumer.commit"):
        for _ in range(2):
            waiter = s.commits.fetch_committed([T0])
            request = s.h.take("OffsetFetch")
            request.respond(fetch_answer(request.version, {T0: (7, -1, "batch-42-secret" if kept else "")}))
            assert waiter.result()[T0] == OffsetAndMetadata(7, "batch-42-secret" if kept else "", None)
    warnings = [r.getMessage() for r in caplog.records]
    if kept:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        assert "t-0" in warnings[0] or "'t', partition=0" in warnings[0], warnings
        assert "15 characters" in warnings[0] and "secret" not in warnings[0], warnings
