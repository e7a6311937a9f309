"""ShareMembershipManager: ShareGroupHeartbeat join, assignment, errors, leave (scripted, fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.errors import COORDINATOR_CODES, GroupAuthorizationFailedError, KafkaError, UnsupportedVersionError
from asyncconsumer.managers.coordinator import CoordinatorManager
from asyncconsumer.managers.share_membership import ShareMembershipManager
from asyncconsumer.structs import TopicPartition

from .scripted import Scripted, topic_id

COORD = -1000


def make() -> tuple[ShareMembershipManager, Scripted, list[KafkaError]]:
    coordinator = CoordinatorManager("workers", retry_backoff=0.1, register_node=lambda *a: None)
    coordinator.node_id = COORD
    names = {topic_id("jobs"): "jobs"}
    errors: list[KafkaError] = []
    manager = ShareMembershipManager(
        "workers", coordinator, topic_name=names.get, report_error=errors.append, retry_backoff=0.1
    )
    return manager, Scripted(manager), errors


def answer(epoch: int, partitions: list[int] | None = None, *, code: int = 0, interval: int = 1000) -> dict[str, Any]:
    assignment = None
    if partitions is not None:
        assignment = {"topic_partitions": [{"topic_id": topic_id("jobs"), "partitions": partitions}]}
    return {"throttle_time_ms": 0, "error_code": code, "error_message": None, "member_id": None,
            "member_epoch": epoch, "heartbeat_interval_ms": interval, "assignment": assignment}


def test_nothing_is_sent_before_subscribe() -> None:
    manager, h, _ = make()
    h.assert_idle()
    assert manager.next_deadline(h.now) == float("inf")


def test_join_with_a_client_generated_member_id_epoch_0_and_the_topics() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    sent = h.take("ShareGroupHeartbeat")
    body = sent.body()
    assert sent.node_id == COORD
    assert body["member_epoch"] == 0
    assert body["subscribed_topic_names"] == ["jobs"]
    assert len(body["member_id"]) == 22 and body["member_id"] == manager.member_id
    sent.respond(answer(1, [0, 2]))
    assert manager.epoch == 1 and manager.is_member
    assert manager.assignment() == {TopicPartition("jobs", 0), TopicPartition("jobs", 2)}
    h.assert_idle()  # in flight: nothing; next heartbeat after the interval


def test_heartbeats_every_interval_with_the_epoch_and_no_topic_list() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(answer(3, [0], interval=2000))
    h.advance(1.9)
    h.assert_idle()
    h.advance(0.2)
    body = h.take("ShareGroupHeartbeat").body()
    assert body["member_epoch"] == 3
    assert body["subscribed_topic_names"] is None  # unchanged since the last heartbeat


def test_a_null_assignment_keeps_the_current_one_and_a_new_one_replaces_it() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(answer(1, [0, 1]))
    version = manager.assignment_version
    h.advance(1.0)
    h.take("ShareGroupHeartbeat").respond(answer(1, None))
    assert manager.assignment() == {TopicPartition("jobs", 0), TopicPartition("jobs", 1)}
    assert manager.assignment_version == version
    h.advance(1.0)
    h.take("ShareGroupHeartbeat").respond(answer(2, [1]))
    assert manager.assignment() == {TopicPartition("jobs", 1)}
    assert manager.assignment_version == version + 1


def test_changed_subscription_is_sent_at_once() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(answer(1, [0]))
    manager.subscribe(frozenset({"jobs", "more"}))
    assert h.take("ShareGroupHeartbeat").body()["subscribed_topic_names"] == ["jobs", "more"]


def test_fenced_member_rejoins_with_epoch_0_and_the_same_id() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    member = manager.member_id
    h.take("ShareGroupHeartbeat").respond(answer(4, [0]))
    h.advance(1.0)
    h.take("ShareGroupHeartbeat").respond(answer(0, code=110))  # FENCED_MEMBER_EPOCH
    assert manager.assignment() == frozenset()
    body = h.take("ShareGroupHeartbeat").body()
    assert body["member_epoch"] == 0 and body["member_id"] == member
    assert body["subscribed_topic_names"] == ["jobs"]


@pytest.mark.parametrize("code", sorted(COORDINATOR_CODES))
def test_coordinator_error_looks_the_coordinator_up_again(code: int) -> None:
    """Every code of the generated coordinator set, NETWORK_EXCEPTION (13) too: the manager once
    kept its own copy without it, and reported it to the application instead."""
    manager, h, errors = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(answer(0, code=code))
    assert manager._coordinator.node_id is None
    assert not errors
    h.advance(0.1)
    h.assert_idle()  # no coordinator known: the next heartbeat waits for the lookup


def test_other_errors_are_reported_typed_and_retried() -> None:
    manager, h, errors = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").respond(answer(0, code=30))  # GROUP_AUTHORIZATION_FAILED
    assert len(errors) == 1 and isinstance(errors[0], GroupAuthorizationFailedError)
    h.assert_idle()
    h.advance(1.0)
    assert h.take("ShareGroupHeartbeat").body()["member_epoch"] == 0


def test_leave_sends_epoch_minus_1_and_clears_the_assignment() -> None:
    manager, h, _ = make()
    manager.subscribe(frozenset({"jobs"}))
    assert manager.state == "joining"
    h.take("ShareGroupHeartbeat").respond(answer(2, [0]))
    assert manager.state == "stable"
    manager.leave()
    assert not manager.is_member and manager.state == "leaving"
    sent = h.take("ShareGroupHeartbeat")
    assert sent.body()["member_epoch"] == -1
    sent.respond(answer(-1))
    assert manager.left and manager.assignment() == frozenset() and manager.state == "left"
    h.assert_idle()


def test_leave_before_joining_sends_nothing() -> None:
    manager, h, _ = make()
    manager.leave()
    assert manager.left
    h.assert_idle()


def test_a_coordinator_without_share_groups_ends_the_membership_with_a_typed_error() -> None:
    """No ShareGroupHeartbeat in common (Kafka 3.x, 4.0): reported once, kept in ``unsupported`` (the
    share loop raises it at every poll), and no more heartbeats; leaving has nothing to tell."""
    manager, h, errors = make()
    manager.subscribe(frozenset({"jobs"}))
    h.take("ShareGroupHeartbeat").fail(UnsupportedVersionError(
        "broker 127.0.0.1:9092 does not support ShareGroupHeartbeat (API key 76): its ApiVersions answer lists "
        "no such API (Apache Kafka 3.9)"))
    assert len(errors) == 1 and errors[0] is manager.unsupported
    message = str(manager.unsupported)
    assert "share group 'workers' cannot be joined: broker 127.0.0.1:9092 does not support ShareGroupHeartbeat" \
        in message
    assert "(Apache Kafka 3.9)" in message and "need Apache Kafka 4.1 or newer" in message
    assert manager._coordinator.node_id == COORD  # not a coordinator problem: no lookup again
    assert manager.next_deadline(h.now) == float("inf")
    h.advance(60)
    h.assert_idle()
    manager.leave()
    h.assert_idle()
    assert manager.left and len(errors) == 1
