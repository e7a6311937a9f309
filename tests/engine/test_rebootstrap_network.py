"""The network client's side of rebootstrap (KIP-899, KIP-1102, KIP-1242), against the scripted
brokers of ``test_network.py`` on real sockets: which brokers count as out of reach, what a
rebootstrap forgets, and ApiVersions v5's cluster and node check."""

from __future__ import annotations

import anyio
import pytest

from asyncconsumer.engine.connection import BrokerConnection, MisroutedConnection
from asyncconsumer.errors import KafkaConnectionError, RebootstrapRequiredError, UnsupportedVersionError
from asyncconsumer.protocol import api
from engine.test_network import HOST, Client, Received, Server, api_versions, reply, scripted_broker, spawner

pytestmark = pytest.mark.anyio

V5 = {"ApiVersions": (0, 5), "Metadata": (0, 13)}


def checking(cluster: str, node: int) -> object:
    """An ApiVersions answer as Apache Kafka 4.4's: REBOOTSTRAP_REQUIRED when a v5 request names
    another cluster or node."""

    def versions_reply(request: Received) -> bytes:
        body = request.body
        if request.version >= 5 and body.get("cluster_id") is not None and (
                body["cluster_id"] != cluster or body["node_id"] != node):
            return reply(request, {"error_code": RebootstrapRequiredError.code, "api_keys": []})
        return api_versions(request, V5)

    return versions_reply


def to(server: Server, node_id: int, expect: tuple[str, int] | None) -> BrokerConnection:
    return BrokerConnection(node_id, HOST, server.port, client_id="t", request_timeout=5.0, setup_timeout=5.0,
                            ssl_context=None, expect=expect)


async def test_a_connection_meant_for_a_node_asks_the_broker_to_check_it() -> None:
    async with scripted_broker(versions=V5) as server, anyio.create_task_group() as tg:
        server.versions_reply = checking("cluster-a", 1)  # type: ignore[assignment]
        right = to(server, 1, ("cluster-a", 1))
        await right.open(spawner(tg))
        sent = server.seen("ApiVersions")[-1]
        assert (sent.version, sent.body["cluster_id"], sent.body["node_id"]) == (5, "cluster-a", 1)
        assert sent.body["client_software_name"] == "asyncconsumer"
        await right.aclose()
        for expect in (("cluster-b", 1), ("cluster-a", 2)):  # another cluster, another node
            with pytest.raises(MisroutedConnection, match=rf"is not broker {expect[1]} of cluster {expect[0]}"):
                await to(server, expect[1], expect).open(spawner(tg))
        plain = to(server, -1, None)  # a bootstrap server: anything there is right; v3 as before
        await plain.open(spawner(tg))
        assert server.seen("ApiVersions")[-1].version == 3
        await plain.aclose()
        tg.cancel_scope.cancel()


async def test_a_broker_older_than_v5_is_asked_again_in_v3() -> None:
    async with scripted_broker(versions={"ApiVersions": (0, 3), "Metadata": (0, 12)}) as server, \
            anyio.create_task_group() as tg:

        def versions_reply(request: Received) -> bytes:
            if request.version > 3:
                keys = [{"api_key": api.API_KEYS["ApiVersions"], "min_version": 0, "max_version": 3}]
                return api.encode_response("ApiVersions", 0, {"error_code": UnsupportedVersionError.code,
                                                               "api_keys": keys}, correlation_id=request.correlation_id)
            return api_versions(request, server.versions)

        server.versions_reply = versions_reply
        conn = to(server, 1, ("cluster-a", 1))
        await conn.open(spawner(tg))
        assert [r.version for r in server.seen("ApiVersions")] == [5, 3]
        assert server.seen("ApiVersions")[-1].body["client_software_name"] == "asyncconsumer"
        await conn.aclose()
        tg.cancel_scope.cancel()


async def test_the_network_client_checks_known_brokers_once_it_knows_the_cluster() -> None:
    """No check before the cluster id is known and a broker said it knows ApiVersions v5; then a
    broker that is not the node meant is refused and a rebootstrap is asked for, once."""
    async with scripted_broker(versions=V5) as server, anyio.create_task_group() as tg:
        server.versions_reply = checking("cluster-a", 7)  # type: ignore[assignment]
        client = Client(tg, bootstrap_servers=server.address)
        _, body, error = await client.metadata()  # to the bootstrap server: v3, no check
        assert error is None and body is not None
        network = client.network
        network.update_brokers({1: (HOST, server.port)}, "cluster-a")  # the metadata says broker 1 is here
        _, _, error = await client.metadata(node_id=1)
        assert isinstance(error, KafkaConnectionError) and "is not broker 1 of cluster cluster-a" in str(error)
        assert network.rebootstrap_requested() is True
        assert network.rebootstrap_requested() is False  # taken once
        network.update_brokers({7: (HOST, server.port)}, "cluster-a")
        _, _, error = await client.metadata(node_id=7)
        assert error is None
        assert server.seen("ApiVersions")[-1].body["node_id"] == 7
        await network.aclose()
        tg.cancel_scope.cancel()


async def test_with_none_no_check_is_asked_for() -> None:
    async with scripted_broker(versions=V5) as server, anyio.create_task_group() as tg:
        server.versions_reply = checking("cluster-a", 7)  # type: ignore[assignment]
        client = Client(tg, bootstrap_servers=server.address, metadata_recovery_strategy="none")
        await client.metadata()
        client.network.update_brokers({1: (HOST, server.port)}, "cluster-a")
        _, _, error = await client.metadata(node_id=1)
        assert error is None  # as the Java client: metadata.cluster.check needs rebootstrap
        assert server.seen("ApiVersions")[-1].version == 3
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_known_brokers_out_of_reach_and_what_a_rebootstrap_forgets() -> None:
    async with scripted_broker(versions=V5) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address, reconnect_backoff_ms=5000,
                        reconnect_backoff_max_ms=5000)
        network = client.network
        assert not network.known_brokers_unavailable()  # nothing known yet: the bootstrap servers are tried
        await client.metadata()
        dead = server.port + 1 if server.port < 65535 else server.port - 1
        network.update_brokers({1: (HOST, server.port), 2: (HOST, dead)})
        assert not network.known_brokers_unavailable()  # 1 can be tried, 2 too
        _, _, error = await client.metadata(node_id=2)
        assert isinstance(error, KafkaConnectionError)  # 2 now waits out its backoff
        assert not network.known_brokers_unavailable()  # 1 may still be tried
        await client.metadata(node_id=1)
        assert network.connections_open == 2  # the bootstrap server's and broker 1's
        network.update_brokers({2: (HOST, dead)})
        assert network.known_brokers_unavailable()  # the only known broker is in backoff
        network.update_brokers({1: (HOST, server.port), 2: (HOST, dead)})
        network.rebootstrap("a test")
        await anyio.sleep(0.05)
        assert network.connections_open == 0  # known brokers' and the bootstrap server's connections closed
        assert not network.known_brokers_unavailable()  # nothing known: back to the bootstrap servers
        assert network.least_loaded_node() < 0
        assert network.rebootstraps == 1
        await network.aclose()
        tg.cancel_scope.cancel()
