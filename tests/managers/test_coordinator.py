"""CoordinatorManager: FindCoordinator request shapes, node ids, backoff, rediscovery."""

from __future__ import annotations

import pytest

from asyncconsumer.errors import (
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
)
from asyncconsumer.managers.coordinator import COORDINATOR_NODE_BASE, CoordinatorManager

from .scripted import Scripted

BACKOFF = 0.25


def make() -> tuple[CoordinatorManager, Scripted, list[tuple[int, str, int]]]:
    registered: list[tuple[int, str, int]] = []
    manager = CoordinatorManager("group-1", retry_backoff=BACKOFF,
                                 register_node=lambda n, host, port: registered.append((n, host, port)))
    return manager, Scripted(manager), registered


def v4_response(node: int = 3, error_code: int = 0) -> dict[str, object]:
    return {"coordinators": [{"key": "group-1", "node_id": node, "host": f"coord{node}", "port": 9000 + node,
                              "error_code": error_code, "error_message": "nope" if error_code else None}]}


def test_find_coordinator_v3_body() -> None:
    _manager, h, _ = make()
    request = h.take("FindCoordinator").at(3)
    assert request.request.build(3) == {"key": "group-1", "key_type": 0}
    assert request.body()["key"] == "group-1"  # and the schema agrees
    assert request.node_id is None


def test_find_coordinator_v4_body() -> None:
    _manager, h, _ = make()
    request = h.take("FindCoordinator").at(4)
    assert request.request.build(4) == {"key_type": 0, "coordinator_keys": ["group-1"]}
    assert request.body()["key"] == ""  # v4 moved the key into coordinator_keys


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5, 6])
def test_find_coordinator_body_encodes_at_every_version(version: int) -> None:
    _manager, h, _ = make()
    body = h.take("FindCoordinator").at(version).body()  # the codec rejects a wrong shape
    keys = body["coordinator_keys"] if version >= 4 else [body["key"]]
    assert keys == ["group-1"]


def test_v4_response_sets_node_and_registers_it() -> None:
    manager, h, registered = make()
    assert manager.next_deadline(h.now) == h.now
    h.take("FindCoordinator").at(4).respond(v4_response(node=3))
    assert manager.node_id == COORDINATOR_NODE_BASE - 3
    assert registered == [(COORDINATOR_NODE_BASE - 3, "coord3", 9003)]
    assert manager.last_error is None
    assert manager.next_deadline(h.now) == float("inf")
    h.assert_idle()


def test_v3_response_sets_node_and_registers_it() -> None:
    manager, h, registered = make()
    h.take("FindCoordinator").at(3).respond(
        {"error_code": 0, "error_message": None, "node_id": 0, "host": "c0", "port": 19092})
    assert manager.node_id == COORDINATOR_NODE_BASE
    assert registered == [(COORDINATOR_NODE_BASE, "c0", 19092)]


def test_one_request_in_flight() -> None:
    _manager, h, _ = make()
    h.take("FindCoordinator")
    h.assert_idle()
    h.advance(10)
    h.assert_idle()


def test_error_code_sets_backoff() -> None:
    manager, h, registered = make()
    h.take("FindCoordinator").at(4).respond(v4_response(error_code=15))
    assert manager.node_id is None
    assert registered == []
    assert isinstance(manager.last_error, CoordinatorNotAvailableError)
    assert manager.next_deadline(h.now) == h.now + BACKOFF
    h.advance(BACKOFF - 0.001)
    h.assert_idle()
    h.advance(0.001)
    h.take("FindCoordinator").at(4).respond(v4_response(node=1))
    assert manager.node_id == COORDINATOR_NODE_BASE - 1
    assert manager.last_error is None


def test_v3_error_code_sets_backoff() -> None:
    manager, h, _ = make()
    h.take("FindCoordinator").at(3).respond(
        {"error_code": 15, "error_message": None, "node_id": -1, "host": "", "port": -1})
    assert manager.node_id is None
    assert isinstance(manager.last_error, CoordinatorNotAvailableError)
    h.assert_idle()
    h.advance(BACKOFF)
    h.take("FindCoordinator")


def test_transport_error_sets_backoff() -> None:
    manager, h, _ = make()
    h.take("FindCoordinator").fail(KafkaConnectionError("refused"))
    assert isinstance(manager.last_error, KafkaConnectionError)
    h.assert_idle()
    h.advance(BACKOFF)
    h.take("FindCoordinator")


def test_mark_unknown_triggers_rediscovery() -> None:
    manager, h, registered = make()
    h.take("FindCoordinator").respond(v4_response(node=3))
    h.advance(5)
    h.assert_idle()
    manager.mark_unknown(h.now, "NOT_COORDINATOR")
    assert manager.node_id is None
    assert manager.next_deadline(h.now) == h.now
    h.take("FindCoordinator").respond(v4_response(node=2))
    assert manager.node_id == COORDINATOR_NODE_BASE - 2
    assert [r[0] for r in registered] == [COORDINATOR_NODE_BASE - 3, COORDINATOR_NODE_BASE - 2]


def test_mark_unknown_while_in_flight_does_not_duplicate() -> None:
    manager, h, _ = make()
    request = h.take("FindCoordinator")
    manager.mark_unknown(h.now, "whatever")
    h.assert_idle()
    request.respond(v4_response(node=4))
    assert manager.node_id == COORDINATOR_NODE_BASE - 4


def test_an_answer_retrying_cannot_fix_goes_to_on_fatal_each_time_less_and_less_often() -> None:
    """GROUP_AUTHORIZATION_FAILED: the Java client raises it from every poll; here ``on_fatal`` hears
    of it at each lookup, and the lookups slow down to once a second (an ACL may be granted later)."""
    fatal: list[KafkaError] = []
    manager = CoordinatorManager("group-1", retry_backoff=BACKOFF, register_node=lambda *a: None,
                                 on_fatal=fatal.append)
    h = Scripted(manager)
    pauses = []
    for _ in range(5):
        h.take("FindCoordinator").at(4).respond(v4_response(error_code=30))
        pauses.append(manager.next_deadline(h.now) - h.now)
        h.assert_idle()
        h.advance(pauses[-1])
    assert [type(e) for e in fatal] == [GroupAuthorizationFailedError] * 5
    assert pauses == [BACKOFF, 2 * BACKOFF, 4 * BACKOFF, 1.0, 1.0]
    h.take("FindCoordinator").at(4).respond(v4_response(error_code=15))  # retriable: not fatal
    assert len(fatal) == 5 and manager.next_deadline(h.now) - h.now == BACKOFF
    h.advance(BACKOFF)
    h.take("FindCoordinator").at(4).respond(v4_response(node=3))
    assert manager.node_id == COORDINATOR_NODE_BASE - 3
    manager.mark_unknown(h.now)
    h.take("FindCoordinator").at(4).respond(v4_response(error_code=30))
    assert manager.next_deadline(h.now) - h.now == BACKOFF  # a success started the pauses over
