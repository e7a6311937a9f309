"""SASL through the whole client against a scripted broker (Tansu cannot do SASL).

The broker here speaks the real wire protocol (our codec) and plays a real SCRAM
server with stored keys, so the consumer's handshake is checked end to end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from asyncconsumer import Consumer
from asyncconsumer.errors import AuthenticationError
from asyncconsumer.protocol import api
from engine.test_sasl import ScramServer

pytestmark = pytest.mark.anyio

VERSIONS = {"ApiVersions": (0, 3), "Metadata": (1, 12), "SaslHandshake": (0, 1), "SaslAuthenticate": (0, 2)}


@asynccontextmanager
async def scram_broker(
    username: str, password: str, *, session_lifetime_ms: int = 0
) -> AsyncIterator[tuple[str, list[str]]]:
    """With ``session_lifetime_ms`` it acts as Kafka with ``connections.max.reauth.ms``: a request
    after the session's end, or any other request during a login, closes the connection."""
    log: list[str] = []
    connections: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        server = ScramServer("sha256", username, password)
        authenticated = False
        logging_in = False
        session_ends = float("inf")
        connections.append(1)
        buffered = b""
        async with stream:
            while True:
                while len(buffered) < 4 or len(buffered) < 4 + int.from_bytes(buffered[:4], "big"):
                    try:
                        buffered += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                size = int.from_bytes(buffered[:4], "big")
                frame, buffered = buffered[4 : 4 + size], buffered[4 + size :]
                key, version, correlation_id = api.peek_request_header(frame)
                name = api.API_NAMES[key]
                _, body = api.decode_request(name, version, frame)
                log.append(name)
                if authenticated and anyio.current_time() > session_ends:
                    log.append("closed: session expired")
                    return
                if logging_in and name not in ("SaslHandshake", "SaslAuthenticate"):
                    log.append(f"closed: {name} during a login")
                    return
                if name == "ApiVersions":
                    reply = {"error_code": 0, "api_keys": [
                        {"api_key": api.API_KEYS[n], "min_version": lo, "max_version": hi}
                        for n, (lo, hi) in VERSIONS.items()]}
                elif name == "SaslHandshake":
                    server = ScramServer("sha256", username, password)
                    logging_in = True
                    ok = body["mechanism"] == "SCRAM-SHA-256"
                    reply = {"error_code": 0 if ok else 33, "mechanisms": ["SCRAM-SHA-256"]}
                elif name == "SaslAuthenticate":
                    if not hasattr(server, "nonce"):
                        reply = {"error_code": 0, "auth_bytes": server.first(body["auth_bytes"])}
                    else:
                        final = server.final(body["auth_bytes"])
                        authenticated = final is not None
                        logging_in = False
                        if session_lifetime_ms:
                            session_ends = anyio.current_time() + session_lifetime_ms / 1000
                        reply = {"error_code": 0 if final else 58, "auth_bytes": final or b"",
                                 "error_message": None if final else "Authentication failed: invalid credentials",
                                 "session_lifetime_ms": session_lifetime_ms}
                elif name == "Metadata" and authenticated:
                    reply = {"brokers": [{"node_id": 1, "host": "127.0.0.1", "port": port}], "topics": [
                        {"error_code": 0, "name": "secured", "partitions": [
                            {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 0}]}]}
                else:
                    return  # a real broker drops unauthenticated clients
                await stream.send(api.encode_response(name, version, reply, correlation_id=correlation_id))

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield f"127.0.0.1:{port}", log
            log.append(f"connections: {len(connections)}")
        finally:
            tg.cancel_scope.cancel()


def sasl_consumer(bootstrap: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Consumer[bytes, bytes]:
    return Consumer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                    sasl_plain_username="alice", sasl_plain_password=password, request_timeout_ms=5000)


async def test_scram_sha256_login_then_requests_work() -> None:
    async with scram_broker("alice", "s3cret") as (bootstrap, log):
        async with sasl_consumer(bootstrap, "s3cret") as c:
            assert await c.topics() == {"secured"}
        assert log[:4] == ["ApiVersions", "SaslHandshake", "SaslAuthenticate", "SaslAuthenticate"]


async def test_wrong_password_is_a_typed_error_at_start() -> None:
    async with scram_broker("alice", "s3cret") as (bootstrap, _):
        with anyio.fail_after(10), pytest.raises(AuthenticationError, match="invalid credentials"):
            async with sasl_consumer(bootstrap, "wrong"):
                pass


async def test_mechanism_the_broker_does_not_enable() -> None:
    async with scram_broker("alice", "s3cret") as (bootstrap, _):
        with anyio.fail_after(10), pytest.raises(AuthenticationError, match="SCRAM-SHA-256"):
            async with sasl_consumer(bootstrap, "s3cret", mechanism="PLAIN"):
                pass


async def test_reauthentication_keeps_the_connection() -> None:
    """KIP-368 against the scripted broker: concurrent requests across several session lifetimes,
    none sent in the middle of a login, on the one connection the consumer opened."""
    async with scram_broker("alice", "s3cret", session_lifetime_ms=1500) as (bootstrap, log):
        async with sasl_consumer(bootstrap, "s3cret") as c:
            await c.topics()
            assert c._engine is not None
            opened = c._engine.network.connections_opened  # the bootstrap and node 1
            with anyio.fail_after(20):
                end = anyio.current_time() + 5
                while anyio.current_time() < end:
                    async with anyio.create_task_group() as tg:
                        for _ in range(3):
                            tg.start_soon(c.topics)
                    await anyio.sleep(0.05)
            assert c._engine.network.connections_opened == opened
    assert not [entry for entry in log if entry.startswith("closed")], log
    assert log[-1] == f"connections: {opened}"
    # The initial login and at least two re-authentications (1.5 s sessions for 5 s).
    assert log.count("SaslHandshake") >= 3
