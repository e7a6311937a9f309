"""Proves the test infrastructure itself works: broker, producer helpers, proxy, TLS broker."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from confluent_kafka import Producer
from support.broker import (
    FEATURES,
    BrokerBackend,
    TLSBroker,
    start_tansu,
)
from support.certs import generate_certs
from support.producer import COMPRESSION_TYPES, consume, create_topic
from support.proxy import ChaosProxy

# ----------------------------------------------------------------------------- helpers


def _api_versions_request(correlation_id: int = 7) -> bytes:
    client_id = b"infra-test"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


async def _read_kafka_response(stream: anyio.abc.ByteStream) -> bytes:
    buf = b""
    while len(buf) < 4:
        buf += await stream.receive()
    (size,) = struct.unpack(">i", buf[:4])
    while len(buf) < 4 + size:
        buf += await stream.receive()
    return buf[4 : 4 + size]


@contextlib.asynccontextmanager
async def _server(handler: Callable[[anyio.abc.SocketStream], Any]) -> AsyncIterator[int]:
    """A throw-away TCP server on 127.0.0.1; yields its port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()
    await listener.aclose()


async def _echo(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                await stream.send(await stream.receive())


async def _read_until_closed(stream: anyio.abc.ByteStream, limit: float = 5.0) -> tuple[bytes, str]:
    data = b""
    with anyio.fail_after(limit):
        try:
            while True:
                data += await stream.receive()
        except anyio.EndOfStream:
            return data, "eof"
        except (anyio.BrokenResourceError, OSError):
            return data, "reset"


# ----------------------------------------------------------------------------- broker + producer


def test_backend_contract(kafka_backend: BrokerBackend, bootstrap: str) -> None:
    assert bootstrap == kafka_backend.bootstrap
    host, _, port = bootstrap.rpartition(":")
    assert host in ("127.0.0.1", "localhost") and int(port) > 0
    assert kafka_backend.name in ("tansu", "kafka")
    for feature in FEATURES:
        assert isinstance(kafka_backend.supports(feature), bool)
    with pytest.raises(ValueError):
        kafka_backend.supports("no-such-feature")
    if kafka_backend.name == "tansu":
        assert not kafka_backend.supports("transactions")
        assert not kafka_backend.supports("kip848")
        assert not kafka_backend.supports("sasl")


def test_topic_create_produce_and_read_back(
    new_topic: Callable[..., str], produce: Callable[..., list[tuple[int, int]]], bootstrap: str
) -> None:
    topic = new_topic(3)
    records = [(i % 3, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x"), ("n", None)]) for i in range(30)]
    delivered = produce(topic, records)
    assert len(delivered) == 30
    assert [p for p, _ in delivered] == [i % 3 for i in range(30)]
    for part in range(3):
        assert [o for p, o in delivered if p == part] == list(range(10))

    got = consume(bootstrap, topic, 30)
    by_partition: dict[int, list[bytes]] = {}
    for msg in got:
        by_partition.setdefault(msg.partition(), []).append(msg.value())
        assert msg.headers() == [("h", b"x"), ("n", None)]
    assert by_partition[1] == [f"v{i}".encode() for i in range(1, 30, 3)]


def test_new_topic_options(new_topic: Callable[..., str], produce: Callable[..., Any]) -> None:
    name = new_topic(2, name=f"explicit-{id(object())}", config={"cleanup.policy": "compact"})
    assert name.startswith("explicit-")
    # generator input, partitioner-chosen partitions (a compacted topic needs keys: Kafka refuses
    # keyless records there with INVALID_RECORD)
    delivered = produce(name, ((None, f"k{i}".encode(), f"value-{i}".encode()) for i in range(20)))
    assert len(delivered) == 20 and {p for p, _ in delivered} <= {0, 1}


@pytest.mark.parametrize("compression", COMPRESSION_TYPES)
def test_compressed_batches(
    compression: str, new_topic: Callable[..., str], produce: Callable[..., Any], bootstrap: str
) -> None:
    topic = new_topic()
    payload = [(0, None, b"abc" * 100 + bytes([i]), None, 1_700_000_000_000 + i) for i in range(200)]
    delivered = produce(topic, payload, compression=compression)
    assert [o for _, o in delivered] == list(range(200))
    got = consume(bootstrap, topic, 200)
    assert [m.value() for m in got] == [v for _, _, v, _, _ in payload]
    assert got[5].timestamp()[1] == 1_700_000_000_005


def test_tansu_is_stopped_by_pid(tmp_path: Path) -> None:
    broker = start_tansu(tmp_path)
    try:
        assert broker.alive()
        create_topic(broker.bootstrap, "private", 1)  # a private broker: fixed names are fine
    finally:
        broker.stop()
    assert broker.proc.returncode is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", broker.port), timeout=1).close()


# ----------------------------------------------------------------------------- proxy


@pytest.mark.anyio
async def test_proxy_forwards_and_drops(proxy_factory: Callable[..., ChaosProxy]) -> None:
    async with _server(_echo) as port, proxy_factory("127.0.0.1", port) as proxy:
        assert proxy.address == f"127.0.0.1:{proxy.port}"
        c1 = await anyio.connect_tcp("127.0.0.1", proxy.port)
        c2 = await anyio.connect_tcp("127.0.0.1", proxy.port)
        for c in (c1, c2):
            await c.send(b"ping")
            assert await c.receive() == b"ping"
        assert proxy.connections_accepted == 2
        assert proxy.active_connections == 2
        assert await proxy.drop_all() == 2
        assert proxy.active_connections == 0
        for c in (c1, c2):
            data, how = await _read_until_closed(c)
            assert data == b"" and how == "eof"
            await c.aclose()

        # new connections still work after a drop
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c3:
            await c3.send(b"again")
            assert await c3.receive() == b"again"
        assert proxy.connections_accepted == 3


@pytest.mark.anyio
async def test_proxy_reset(proxy_factory: Callable[..., ChaosProxy]) -> None:
    async with _server(_echo) as port, proxy_factory("127.0.0.1", port) as proxy:
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            await c.send(b"x")
            assert await c.receive() == b"x"
            await proxy.drop_all(reset=True)
            _, how = await _read_until_closed(c)
            assert how == "reset"


@pytest.mark.anyio
async def test_proxy_drop_after_bytes(proxy_factory: Callable[..., ChaosProxy]) -> None:
    blob = bytes(range(256)) * 40

    async def talker(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await stream.send(blob)
                await anyio.sleep(5)

    async with _server(talker) as port, proxy_factory("127.0.0.1", port) as proxy:
        proxy.drop_after_bytes(1000, connections=1)
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            data, how = await _read_until_closed(c)
        assert data == blob[:1000] and how == "eof"
        assert proxy.connections_dropped == 1
        # only one connection was affected
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            got = b""
            with anyio.fail_after(5):
                while len(got) < len(blob):
                    got += await c.receive()
        assert got == blob


@pytest.mark.anyio
async def test_proxy_blackhole_and_refuse(proxy_factory: Callable[..., ChaosProxy]) -> None:
    async with _server(_echo) as port, proxy_factory("127.0.0.1", port) as proxy:
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            proxy.blackhole = True
            await c.send(b"lost")
            with anyio.move_on_after(0.3) as scope:
                await c.receive()
            assert scope.cancelled_caught
            proxy.blackhole = False
            await c.send(b"found")
            assert await c.receive() == b"found"

        proxy.refuse_new = True
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            data, _ = await _read_until_closed(c)
            assert data == b""
        with anyio.fail_after(5):
            await proxy.wait_for_connections(2)


@pytest.mark.anyio
async def test_proxy_to_broker(proxy_factory: Callable[..., ChaosProxy], bootstrap: str) -> None:
    host, _, port = bootstrap.rpartition(":")
    async with proxy_factory(host, port) as proxy:
        async with await anyio.connect_tcp("127.0.0.1", proxy.port) as c:
            await c.send(_api_versions_request(41))
            response = await _read_kafka_response(c)
        correlation_id, error_code = struct.unpack(">ih", response[:6])
        assert (correlation_id, error_code) == (41, 0)
        assert proxy.bytes_to_client == len(response) + 4


@pytest.mark.anyio
async def test_proxied_broker_routes_everything(proxied_broker: Callable[..., Any]) -> None:
    async with proxied_broker() as pb:
        topic = await anyio.to_thread.run_sync(pb.new_topic, 2)
        first = await anyio.to_thread.run_sync(pb.produce, topic, [(0, None, b"a"), (1, None, b"b")])
        assert sorted(first) == [(0, 0), (1, 0)]
        seen = pb.proxy.connections_accepted
        assert seen >= 1 and pb.proxy.bytes_to_server > 0
        assert await pb.proxy.drop_all() >= 0
        again = await anyio.to_thread.run_sync(pb.produce, topic, [(0, None, b"c")])
        assert again == [(0, 1)]
        assert pb.proxy.connections_accepted > seen


# ----------------------------------------------------------------------------- TLS


def test_certs_are_valid_for_loopback(tmp_path: Path) -> None:
    material = generate_certs(tmp_path)
    server_ctx = material.server_context()
    client_ctx = material.client_context()
    assert client_ctx.check_hostname and client_ctx.verify_mode == ssl.CERT_REQUIRED
    # in-memory handshake against both the IP and the DNS name
    for name in ("127.0.0.1", "localhost"):
        c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
        server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
        done = {"c": False, "s": False}
        for _ in range(10):
            for key, obj, out_bio, peer_in in (("c", client, c_out, s_in), ("s", server, s_out, c_in)):
                if not done[key]:
                    try:
                        obj.do_handshake()
                        done[key] = True
                    except ssl.SSLWantReadError:
                        pass
                peer_in.write(out_bio.read())
            if all(done.values()):
                break
        assert all(done.values()), name


def test_tls_broker_plain_ssl_handshake(tls_broker: TLSBroker) -> None:
    host, _, port = tls_broker.bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with tls_broker.ssl_context.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            tls.sendall(_api_versions_request(99))
            head = tls.recv(4)
            (size,) = struct.unpack(">i", head)
            body = b""
            while len(body) < size:
                body += tls.recv(size - len(body))
            assert struct.unpack(">ih", body[:6]) == (99, 0)


def test_tls_broker_rejects_untrusted_clients(tls_broker: TLSBroker, tmp_path: Path) -> None:
    other_ca = generate_certs(tmp_path).client_context()
    host, _, port = tls_broker.bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            other_ca.wrap_socket(raw, server_hostname=host)


def test_tls_broker_with_confluent_ssl(tls_broker: TLSBroker) -> None:
    topic = f"infra-tls-{uuid.uuid4().hex[:12]}"  # the TLS broker is shared by the whole session
    create_topic(tls_broker.bootstrap, topic, 1, client_config=tls_broker.confluent_config)
    producer = Producer({**tls_broker.confluent_config, "log_level": 3})
    delivered: list[Any] = []
    producer.produce(topic, b"secret", on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(10) == 0
    assert delivered == [(None, 0)]
    got = consume(tls_broker.bootstrap, topic, 1, client_config=tls_broker.confluent_config)
    assert got[0].value() == b"secret"


@pytest.mark.anyio
async def test_tls_broker_from_anyio(tls_broker: TLSBroker) -> None:
    host, _, port = tls_broker.bootstrap.rpartition(":")
    async with await anyio.connect_tcp(
        host, int(port), tls=True, ssl_context=tls_broker.ssl_context, tls_standard_compatible=False
    ) as stream:
        await stream.send(_api_versions_request(5))
        response = await _read_kafka_response(stream)
    assert struct.unpack(">ih", response[:6]) == (5, 0)


def test_a_delivery_report_without_an_offset_is_matched_by_partition_and_value() -> None:
    # librdkafka reports a retried batch the broker already had (DUPLICATE_SEQUENCE_NUMBER) as
    # delivered with no offset: the record still counts as read, and as produced, when a record of
    # that partition and value was read (support/cluster.py).
    from support.cluster import undelivered, unread

    delivered = [(0, 5, b"1"), (0, None, b"2"), (1, None, b"3")]
    seen = {(0, 5, b"1"), (0, 6, b"2")}
    assert unread(delivered, seen) == {(1, None, b"3")}
    assert unread(delivered, seen | {(1, 9, b"3")}) == set()
    assert unread(delivered, {(1, 6, b"2")}) == {(0, 5, b"1"), (0, None, b"2"), (1, None, b"3")}  # other partition
    assert undelivered(seen | {(1, 9, b"3"), (1, 10, b"4")}, delivered) == {(1, 10, b"4")}


def test_cpu_pressure_starts_busy_processes_and_stops_them_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    from support.pressure import cpu_pressure

    monkeypatch.setenv("ASYNCCONSUMER_CPU_PRESSURE", "2")
    with cpu_pressure() as pids:
        assert len(pids) == 2
        time.sleep(0.3)
        for pid in pids:
            os.kill(pid, 0)  # alive
            with open(f"/proc/{pid}/stat") as stat:
                assert stat.read().split()[2] in "RS"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    monkeypatch.setenv("ASYNCCONSUMER_CPU_PRESSURE", "-1")
    with pytest.raises(ValueError, match="ASYNCCONSUMER_CPU_PRESSURE"), cpu_pressure():
        pass
