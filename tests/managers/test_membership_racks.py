"""Rack-aware assignment in a classic group (KIP-881), sans-I/O: the member's ``client_rack`` goes
in its subscription, and the leader hands its assignor the racks of every partition's replicas
from the metadata (``Cluster.replica_racks``)."""

from __future__ import annotations

from typing import Any

from asyncconsumer.assignors import Subscription, decode_assignment, encode_subscription
from asyncconsumer.managers.membership import MemberState as S
from asyncconsumer.managers.requests import Body
from asyncconsumer.structs import TopicPartition

from .scripted import Sent, metadata_body
from .test_membership import Group, join_response, join_subscription

T = [TopicPartition("t", p) for p in range(6)]


def racked_metadata() -> Body:
    """Topic ``t``: 6 partitions, each with one replica, on brokers 1, 2, 3 in turn; broker ``n`` is
    in rack ``r<n>``."""
    body = metadata_body({tp: (1 + tp.partition % 3, 0) for tp in T}, brokers=[1, 2, 3])
    for broker in body["brokers"]:
        broker["rack"] = f"r{broker['node_id']}"
    for partition in body["topics"][0]["partitions"]:
        partition["replica_nodes"] = partition["isr_nodes"] = [partition["leader_id"]]
    return body


def test_metadata_keeps_replicas_and_broker_racks() -> None:
    g = Group()
    g.subscribe("t")
    serve(g, racked_metadata())
    cluster = g.metadata.cluster
    assert cluster.racks == {1: "r1", 2: "r2", 3: "r3"}
    assert cluster.replica_racks(["t", "unknown"]) == {tp: frozenset({f"r{1 + tp.partition % 3}"}) for tp in T}


def test_metadata_without_broker_racks_has_no_replica_racks() -> None:
    g = Group()
    g.subscribe("t")
    serve(g, metadata_body({tp: (1, 0) for tp in T}))
    assert g.metadata.cluster.replica_racks(["t"]) == {}


def test_member_sends_its_rack_in_the_subscription() -> None:
    g = Group()
    g.m.settings.client_rack = "r2"
    g.subscribe("t")
    g.find_coordinator()
    assert join_subscription(g.h.take("JoinGroup")).rack_id == "r2"


def test_member_without_rack_sends_none() -> None:
    g = Group()
    g.subscribe("t")
    g.find_coordinator()
    assert join_subscription(g.h.take("JoinGroup")).rack_id is None


def test_leader_assigns_by_replica_racks() -> None:
    """Three members in racks r1, r2, r3: each gets the two partitions whose replica is in its
    rack (range without racks would give m-1 t-0/t-1, m-2 t-2/t-3, m-3 t-4/t-5)."""
    g = Group()
    g.m.settings.client_rack = "r1"
    g.subscribe("t")
    g.find_coordinator()
    members: list[tuple[str, str | None, bytes]] = [
        (f"m-{n}", None, encode_subscription(Subscription(["t"], rack_id=f"r{n}"))) for n in (1, 2, 3)]
    g.h.take("JoinGroup").respond(join_response(member_id="m-1", leader="m-1", members=members))
    assert g.m.state is S.SYNCING
    serve(g, racked_metadata())
    body = g.h.take("SyncGroup").body()
    assignments = {a["member_id"]: set(decode_assignment(a["assignment"]).partitions) for a in body["assignments"]}
    assert assignments == {"m-1": {T[0], T[3]}, "m-2": {T[1], T[4]}, "m-3": {T[2], T[5]}}


def serve(g: Group, body: dict[str, Any]) -> None:
    """Answer the metadata manager's next request with ``body``."""
    due = g.metadata.next_deadline(g.now)
    if g.now < due < float("inf"):
        g.h.advance(due - g.now)
    requests = g.metadata.poll(g.now)
    assert len(requests) == 1, requests
    Sent(requests[0], g.clock, 12).respond(body)
