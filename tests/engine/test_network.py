"""The network layer (BrokerConnection, NetworkClient) against small scripted servers on 127.0.0.1.

``scripted_broker`` speaks the Kafka framing with the real codec and answers each request
through a test-supplied function, so pipelining, correlation ids, timeouts, version
negotiation and bad frames are shown on real sockets, on asyncio and trio.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import pytest
from support.broker import free_port

from asyncconsumer import Consumer
from asyncconsumer.config import build_config
from asyncconsumer.engine.connection import MAX_FRAME_BYTES, BrokerConnection, Spawn, frame_limit
from asyncconsumer.engine.network import NetworkClient, reconnect_delay
from asyncconsumer.errors import KafkaConnectionError, KafkaTimeoutError, ProtocolError, UnsupportedVersionError
from asyncconsumer.managers.requests import UnsentRequest
from asyncconsumer.managers.waiter import Waiter
from asyncconsumer.protocol import api

pytestmark = pytest.mark.anyio

Body = dict[str, Any]
HOST = "127.0.0.1"
OURS = api.SUPPORTED_VERSIONS


@dataclass
class Received:
    api: str
    version: int
    correlation_id: int
    body: Body
    connection: int  # 1 for the first connection the server accepted, and so on


@dataclass
class Server:
    """What a scripted broker saw; ``answer`` returns the bytes to send back (None: stay silent)."""

    port: int
    answer: Callable[[Server, Received], bytes | None]
    versions: dict[str, tuple[int, int]]
    received: list[Received] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    closed_by_client: int = 0
    client_closed: anyio.Event = field(default_factory=anyio.Event)
    #: Replaces the ApiVersions answer built from ``versions``.
    versions_reply: Callable[[Received], bytes] | None = None
    #: Send answers this many bytes at a time (0: in one write).
    piece: int = 0

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def seen(self, name: str) -> list[Received]:
        return [r for r in self.received if r.api == name]


def reply(request: Received, body: Body) -> bytes:
    return api.encode_response(request.api, request.version, body, correlation_id=request.correlation_id)


def api_versions(request: Received, versions: dict[str, tuple[int, int]]) -> bytes:
    keys = [{"api_key": api.API_KEYS[n], "min_version": lo, "max_version": hi} for n, (lo, hi) in versions.items()]
    return reply(request, {"error_code": 0, "api_keys": keys})


def metadata(request: Received, padding: int = 0) -> bytes:
    """A Metadata answer whose cluster id names the topics asked for (so a caller knows it is its own)."""
    tag = ",".join(t["name"] for t in request.body["topics"] or []) or f"c{request.correlation_id}"
    return reply(request, {"brokers": [], "cluster_id": tag + "." * padding, "controller_id": -1, "topics": []})


def answer_all(server: Server, request: Received) -> bytes | None:
    return metadata(request)


@asynccontextmanager
async def scripted_broker(
    answer: Callable[[Server, Received], bytes | None] = answer_all,
    versions: dict[str, tuple[int, int]] | None = None,
) -> AsyncIterator[Server]:
    """A Kafka-framed server: ApiVersions is answered from ``versions``, the rest by ``answer``."""
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    server = Server(
        listener.extra(anyio.abc.SocketAttribute.local_port),
        answer,
        versions if versions is not None else {"ApiVersions": OURS["ApiVersions"], "Metadata": OURS["Metadata"]},
    )

    async def serve(stream: anyio.abc.SocketStream) -> None:
        server.accepted.append(time.monotonic())
        number = len(server.accepted)
        buffered = bytearray()
        async with stream:
            while True:
                try:
                    buffered += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    server.closed_by_client += 1
                    server.client_closed.set()
                    return
                while len(buffered) >= 4 and len(buffered) >= 4 + int.from_bytes(buffered[:4], "big"):
                    size = int.from_bytes(buffered[:4], "big")
                    frame = bytes(buffered[4 : 4 + size])
                    del buffered[: 4 + size]
                    key, version, correlation_id = api.peek_request_header(frame)
                    name = api.API_NAMES[key]
                    body = api.decode_request(name, version, frame)[1]
                    request = Received(name, version, correlation_id, body, number)
                    server.received.append(request)
                    if name != "ApiVersions":
                        out = answer(server, request) or b""
                    elif server.versions_reply is not None:
                        out = server.versions_reply(request)
                    else:
                        out = api_versions(request, server.versions)
                    if not server.piece:
                        if out:
                            await stream.send(out)
                        continue
                    for start in range(0, len(out), server.piece):
                        await stream.send(out[start : start + server.piece])
                        await anyio.sleep(0.002)  # separate reads on the client side

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def spawner(tg: anyio.abc.TaskGroup) -> Spawn:
    def spawn(func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        tg.start_soon(func, *args)

    return spawn


def connection(port: int, *, request_timeout: float = 10.0) -> BrokerConnection:
    return BrokerConnection(
        -1, HOST, port, client_id="test-network", request_timeout=request_timeout, setup_timeout=5.0, ssl_context=None
    )


async def get_metadata(conn: BrokerConnection, out: dict[int, Body | BaseException], key: int) -> None:
    """Ask for topic ``t<key>``; ``out[key]`` is the response or the error."""
    body = {"topics": [{"name": f"t{key}"}]}
    try:
        out[key] = await conn.request_version("Metadata", conn.choose_version("Metadata"), body)
    except Exception as exc:
        out[key] = exc


async def metadata_at_once(conn: BrokerConnection, count: int, within: float) -> dict[int, Body | BaseException]:
    """Ask for topics ``t0`` .. ``t<count-1>`` at once; each key maps to its response or error."""
    out: dict[int, Body | BaseException] = {}
    with anyio.fail_after(within):
        async with anyio.create_task_group() as requests:
            for i in range(count):
                requests.start_soon(get_metadata, conn, out, i)
    return out


def tags(out: dict[int, Body | BaseException]) -> dict[int, str]:
    return {key: body["cluster_id"] if isinstance(body, dict) else repr(body) for key, body in out.items()}


class Client:
    """A NetworkClient plus a waiter for each request it sends; ``spawned`` names the tasks it started."""

    def __init__(self, tg: anyio.abc.TaskGroup, **options: Any) -> None:
        self.waiters: dict[UnsentRequest, Waiter[tuple[int, Body | None, BaseException | None]]] = {}
        self.spawned: list[str] = []
        start = spawner(tg)

        def spawn(func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
            self.spawned.append(func.__name__)
            start(func, *args)

        self.network = NetworkClient(build_config(options), spawn, self._done)

    def _done(self, request: UnsentRequest, version: int, body: Body | None, error: BaseException | None) -> None:
        self.waiters[request].set_result((version, body, error))

    async def metadata(self, node_id: int | None = None) -> tuple[int, Body | None, BaseException | None]:
        return await self.wait(self.send_metadata(node_id=node_id))

    def send_metadata(self, topics: list[str] | None = None, **options: Any) -> Waiter[Any]:
        """Send a Metadata request for ``topics`` now; the waiter gets (version, body, error)."""
        body = {"topics": [{"name": t} for t in topics or []]}
        request = UnsentRequest("Metadata", lambda version: body, lambda *a: None, lambda *a: None, **options)
        waiter = self.waiters[request] = Waiter()
        self.network.send(request)
        return waiter

    async def wait(self, waiter: Waiter[Any]) -> tuple[int, Body | None, BaseException | None]:
        with anyio.fail_after(10):
            result: tuple[int, Body | None, BaseException | None] = await waiter.wait()
            return result


# -- pipelining and the read path ----------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    count = 40
    held: list[Received] = []

    def answer(server: Server, request: Received) -> bytes | None:
        # Nothing is answered until every request is in flight; then all answers go out in one
        # write (many frames in one read), one of them larger than the client's read chunk.
        held.append(request)
        if len(held) < count:
            return None
        return b"".join(metadata(r, padding=(3 << 19) if i == 7 else 0) for i, r in enumerate(held))

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        conn = connection(server.port)
        await conn.open(spawner(tg))
        out = await metadata_at_once(conn, count, within=10)
        assert {r.connection for r in server.received} == {1}
        ids = [r.correlation_id for r in held]
        assert ids == sorted(set(ids))  # distinct, and in the order they were sent
        # Each caller got the answer to its own request.
        big = held[7].body["topics"][0]["name"]
        assert tags(out) == {i: f"t{i}" + "." * (3 << 19 if f"t{i}" == big else 0) for i in range(count)}
        assert conn.connected and conn.in_flight == 0
        await conn.aclose()


async def test_buffers_dribbled_a_few_bytes_at_a_time_are_reassembled() -> None:
    held: list[Received] = []

    def answer(server: Server, request: Received) -> bytes | None:
        held.append(request)
        return b"".join(metadata(r) for r in held) if len(held) == 3 else None

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        conn = connection(server.port)
        await conn.open(spawner(tg))
        server.piece = 5  # size prefixes and bodies split across reads
        out = await metadata_at_once(conn, 3, within=10)
        assert tags(out) == {i: f"t{i}" for i in range(3)}
        assert conn.connected
        await conn.aclose()


# -- correlation ids and timeouts ----------------------------------------------------------------


async def test_unknown_correlation_id_closes_the_connection_and_fails_every_pending_request() -> None:
    def answer(server: Server, request: Received) -> bytes | None:
        if len(server.seen("Metadata")) < 3:
            return None
        return api.encode_response("Metadata", request.version, {"brokers": [], "topics": []}, correlation_id=999)

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        conn = connection(server.port)
        await conn.open(spawner(tg))
        out = await metadata_at_once(conn, 3, within=5)
        assert len(out) == 3
        for error in out.values():
            assert isinstance(error, ProtocolError)
            assert f"unexpected correlation id 999 from {server.address}" in str(error)
        assert not conn.connected and conn.in_flight == 0
        with pytest.raises(ProtocolError):
            await conn.request_version("Metadata", 1, {"topics": []})
        with anyio.fail_after(5):
            await server.client_closed.wait()


async def test_request_timeout_fails_the_request_and_the_connection_is_replaced() -> None:
    def answer(server: Server, request: Received) -> bytes | None:
        return None if request.connection == 1 else metadata(request)  # the first connection hangs

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address, request_timeout_ms=300)
        started = time.monotonic()
        _, body, error = await client.metadata()
        assert isinstance(error, KafkaTimeoutError) and body is None
        assert f"Metadata request to {server.address} timed out" in str(error)
        assert 0.25 < time.monotonic() - started < 3
        _, body, error = await client.metadata()
        assert error is None and body is not None
        assert [r.connection for r in server.seen("Metadata")] == [1, 2]
        assert server.closed_by_client >= 1  # the timed-out connection was closed, not reused
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_a_request_sent_without_a_task_times_out_on_a_connection_that_stops_answering() -> None:
    # The second request finds the connection open and goes out from the caller (send_nowait):
    # the connection's watchdog ends it at its deadline, as request_version does its own.
    def answer(server: Server, request: Received) -> bytes | None:
        return None if request.connection == 1 and len(server.seen("Metadata")) > 1 else metadata(request)

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address, request_timeout_ms=1000)
        assert (await client.metadata())[2] is None
        started = time.monotonic()
        _, body, error = await client.metadata()
        assert isinstance(error, KafkaTimeoutError) and body is None
        assert f"Metadata request to {server.address} timed out after 1.0s" in str(error)
        assert 0.95 < time.monotonic() - started < 8
        assert client.spawned.count("_run") == 1 and "_watchdog" in client.spawned  # sent without a task
        _, body, error = await client.metadata()
        assert error is None and body is not None
        assert [r.connection for r in server.seen("Metadata")] == [1, 1, 2]
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_the_watchdog_wakes_for_a_request_due_before_the_ones_it_waits_on() -> None:
    # A long poll (10 s more) and then a plain request, both unanswered: the plain one times the
    # connection out at the request timeout, and the long poll with it.
    def answer(server: Server, request: Received) -> bytes | None:
        return metadata(request) if len(server.seen("Metadata")) == 1 else None

    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address, request_timeout_ms=1000)
        assert (await client.metadata())[2] is None
        started = time.monotonic()
        long_poll = client.send_metadata(["long"], extra_timeout_ms=30_000)
        await anyio.sleep(0.05)  # the watchdog is asleep until the long poll's deadline
        plain = client.send_metadata(["plain"])
        _, _, error = await client.wait(plain)
        assert isinstance(error, KafkaTimeoutError) and "timed out after 1.0s" in str(error)
        assert (await client.wait(long_poll))[2] is error  # the connection closed with it
        assert time.monotonic() - started < 10
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_a_request_larger_than_the_socket_buffer_is_finished_before_the_next_one_goes_out() -> None:
    # The kernel takes part of a 4 MB request at once (its send buffer is at most 4 MiB by
    # default): a task sends the rest, and the request made right after it waits for the send
    # lock (interleaved frames would be garbage here).
    def answer(server: Server, request: Received) -> bytes | None:
        topics = request.body["topics"] or []
        return reply(request, {"brokers": [], "cluster_id": f"{len(topics)}", "controller_id": -1, "topics": []})

    big = [f"{i:08d}" + "t" * 92 for i in range(40_000)]
    async with scripted_broker(answer) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address)
        assert (await client.metadata())[2] is None
        first, second = client.send_metadata(big), client.send_metadata(["small"])
        _, body, error = await client.wait(first)
        assert error is None and body is not None and body["cluster_id"] == "40000"
        _, body, error = await client.wait(second)
        assert error is None and body is not None and body["cluster_id"] == "1"
        assert [len(r.body["topics"] or []) for r in server.seen("Metadata")] == [0, 40_000, 1]
        assert {r.connection for r in server.received} == {1}
        assert "_send_rest" in client.spawned
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_a_failing_request_observer_ends_a_request_sent_without_a_task_with_its_error() -> None:
    async with scripted_broker() as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address)
        assert (await client.metadata())[2] is None  # connected; the observer sees Metadata from now on
        client.network.latency["Metadata"] = client.network.latency["Fetch"]

        def observer(api: str, seconds: float, error: BaseException | None) -> None:
            raise RuntimeError("observer bug")

        client.network.observe_request = observer
        _, body, error = await client.metadata()
        assert body is None and isinstance(error, RuntimeError) and "observer bug" in str(error)
        client.network.observe_request = None
        assert (await client.metadata())[2] is None  # the connection is still good
        assert [r.connection for r in server.seen("Metadata")] == [1, 1, 1]
        await client.network.aclose()
        tg.cancel_scope.cancel()


# -- reconnect backoff ---------------------------------------------------------------------------


def test_reconnect_delay_doubles_with_bounded_jitter_and_is_capped() -> None:
    base, cap = 0.05, 1.0
    exact = [reconnect_delay(n, base, cap, lambda lo, hi: 1.0) for n in range(7)]
    assert exact == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # The extremes of the jitter, and the cap: never above it, but still spread out at it.
    assert reconnect_delay(2, base, cap, lambda lo, hi: lo) == pytest.approx(0.16)
    assert reconnect_delay(2, base, cap, lambda lo, hi: hi) == pytest.approx(0.24)
    assert reconnect_delay(5, base, cap, lambda lo, hi: hi) == cap
    assert reconnect_delay(10_000, base, cap, lambda lo, hi: hi) == cap
    assert reconnect_delay(10_000, base, cap, lambda lo, hi: lo) == pytest.approx(0.8)
    rng = random.Random(1234)
    for failures in range(10):
        nominal = min(cap, base * 2**failures)
        draws = [reconnect_delay(failures, base, cap, rng.uniform) for _ in range(500)]
        assert all(0.8 * nominal - 1e-9 <= d <= min(cap, 1.2 * nominal) for d in draws)
        assert max(draws) - min(draws) > 0.15 * nominal  # jittered, not one value
        assert sorted(draws)[250] == pytest.approx(nominal, rel=0.1)  # centred on the nominal delay


async def test_network_client_waits_longer_after_each_failed_connection() -> None:
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    accepted: list[float] = []

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        accepted.append(time.monotonic())
        await stream.aclose()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        client = Client(tg, bootstrap_servers=f"{HOST}:{port}", reconnect_backoff_ms=40, reconnect_backoff_max_ms=160)
        for _ in range(5):
            _, _, error = await client.metadata()
            assert isinstance(error, KafkaConnectionError)
        gaps = [b - a for a, b in itertools.pairwise(accepted)]
        assert len(gaps) == 4
        # 40, 80, 160, 160 ms, each less up to 20% jitter (lower bounds only: a busy machine is slow).
        for gap, nominal in zip(gaps, [0.04, 0.08, 0.16, 0.16], strict=True):
            assert gap >= 0.8 * nominal - 0.005, gaps
        assert sum(gaps) < 5
        await client.network.aclose()
        tg.cancel_scope.cancel()


# -- bootstrap servers ---------------------------------------------------------------------------


async def test_dead_first_bootstrap_server_is_skipped(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    dead = f"{HOST}:{free_port()}"
    started = time.monotonic()
    async with Consumer(bootstrap_servers=f"{dead},{bootstrap}", request_timeout_ms=10000) as consumer:
        assert await consumer.partitions_for_topic(topic, timeout=10) == {0, 1}
    assert time.monotonic() - started < 8


# -- version negotiation -------------------------------------------------------------------------


async def test_the_highest_version_both_sides_support_is_used() -> None:
    narrow = {"ApiVersions": (0, 3), "Metadata": (1, 5)}
    async with scripted_broker(versions=narrow) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address)
        version, body, error = await client.metadata()
        assert error is None and body is not None
        assert version == 5 and [r.version for r in server.seen("Metadata")] == [5]
        assert [r.version for r in server.seen("ApiVersions")] == [3]
        await client.network.aclose()
        tg.cancel_scope.cancel()
    above = {"ApiVersions": (0, 3), "Metadata": (OURS["Metadata"][1] - 1, OURS["Metadata"][1] + 5)}
    async with scripted_broker(versions=above) as server, anyio.create_task_group() as tg:
        conn = connection(server.port)
        await conn.open(spawner(tg))
        assert conn.choose_version("Metadata") == OURS["Metadata"][1]
        assert conn.choose_version("Metadata", max_version=OURS["Metadata"][1] - 1) == OURS["Metadata"][1] - 1
        await conn.aclose()


async def test_disjoint_or_missing_version_ranges_raise_unsupported_version_naming_the_api() -> None:
    high = OURS["Metadata"][1]
    disjoint = {"ApiVersions": (0, 3), "Metadata": (high + 1, high + 3)}
    async with scripted_broker(versions=disjoint) as server, anyio.create_task_group() as tg:
        client = Client(tg, bootstrap_servers=server.address)
        _, body, error = await client.metadata()
        assert isinstance(error, UnsupportedVersionError) and body is None
        assert f"no common Metadata version: broker {server.address} (Apache Kafka 3.5 or older) supports " \
               f"{high + 1}-{high + 3}" in str(error)
        assert not server.seen("Metadata")  # nothing was sent at a version the broker cannot read
        conn = connection(server.port)
        await conn.open(spawner(tg))
        with pytest.raises(UnsupportedVersionError, match=rf"broker {server.address} does not support Fetch \(API key "
                           r"1\): its ApiVersions answer lists no such API \(Apache Kafka 3.5 or older\)"):
            conn.choose_version("Fetch")
        await conn.aclose()
        await client.network.aclose()
        tg.cancel_scope.cancel()


async def test_api_versions_falls_back_to_v0_for_an_older_broker() -> None:
    old = {"ApiVersions": (0, 2), "Metadata": (0, 7)}

    async with scripted_broker(versions=old) as server, anyio.create_task_group() as tg:
        # An old broker answers an ApiVersions version it does not know with UNSUPPORTED_VERSION
        # in a v0 body; the client must ask again at v0.
        plain = server.versions

        def versions_reply(request: Received) -> bytes:
            if request.version > 2:
                keys = [{"api_key": api.API_KEYS["ApiVersions"], "min_version": 0, "max_version": 2}]
                return api.encode_response(
                    "ApiVersions",
                    0,
                    {"error_code": UnsupportedVersionError.code, "api_keys": keys},
                    correlation_id=request.correlation_id,
                )
            return api_versions(request, plain)

        server.versions_reply = versions_reply
        conn = connection(server.port)
        await conn.open(spawner(tg))
        assert [r.version for r in server.seen("ApiVersions")] == [3, 0]
        assert conn.choose_version("Metadata") == 7
        response = await conn.request_version("Metadata", 7, {"topics": []})
        assert response["cluster_id"] == f"c{server.seen('Metadata')[0].correlation_id}"
        await conn.aclose()


# -- frames that are not Kafka -------------------------------------------------------------------


@asynccontextmanager
async def not_kafka(answer: bytes) -> AsyncIterator[int]:
    """A listener that replies ``answer`` to the first bytes it gets and then keeps the connection open."""
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(answer)
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield listener.extra(anyio.abc.SocketAttribute.local_port)
        finally:
            tg.cancel_scope.cancel()


HTTP_REPLY = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x32"  # a TLS 1.2 record: fatal alert, decode_error


@pytest.mark.parametrize(
    ("reply_bytes", "size", "looks"),
    [(HTTP_REPLY, 0x48545450, "looks like text"), (TLS_ALERT, 0x15030300, "looks like a TLS record")],
    ids=["http", "tls"],
)
async def test_a_non_kafka_listener_fails_fast_with_a_clear_error(reply_bytes: bytes, size: int, looks: str) -> None:
    async with not_kafka(reply_bytes) as port, anyio.create_task_group() as tg:
        conn = connection(port, request_timeout=20.0)
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(ProtocolError) as caught:
            await conn.open(spawner(tg))
        assert time.monotonic() - started < 2
        message = str(caught.value)
        assert f"{size} (limit {MAX_FRAME_BYTES}) from {HOST}:{port}" in message
        assert looks in message
        assert "is this a Kafka listener? (TLS/SASL port mismatch?)" in message
        assert not conn.connected
        tg.cancel_scope.cancel()


async def test_a_peer_that_hangs_up_on_api_versions_gets_the_same_hint() -> None:
    # What a TLS listener (OpenSSL) does with plaintext: read it, close without a word.
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        conn = connection(listener.extra(anyio.abc.SocketAttribute.local_port))
        with anyio.fail_after(5), pytest.raises(KafkaConnectionError) as caught:
            await conn.open(spawner(tg))
        expected = ("closed: EOF before answering ApiVersions: a TLS listener hangs up on plaintext (TLS/SASL port "
                    "mismatch?), and so does a proxy or load balancer in front of a broker that is down")
        assert expected in str(caught.value)
        tg.cancel_scope.cancel()


async def test_consumer_on_an_http_port_reports_the_frame_error() -> None:
    async with not_kafka(HTTP_REPLY) as port:
        started = time.monotonic()
        with pytest.raises(KafkaConnectionError, match="is this a Kafka listener"):
            async with Consumer(bootstrap_servers=f"{HOST}:{port}", request_timeout_ms=30_000):
                pass
        # Retrying cannot help: the consumer says so at once, not after request_timeout_ms.
        assert time.monotonic() - started < 2


def test_frame_limit_grows_with_fetch_max_bytes_and_stays_below_a_tls_record() -> None:
    assert frame_limit(52428800) == MAX_FRAME_BYTES < 0x14030000
    assert frame_limit(1 << 30) > 1 << 30


class _Chunks:
    """A byte stream that delivers fixed chunks (what one socket read returns)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return self.chunks.pop(0)


async def test_small_frames_are_copied_large_ones_are_views_of_their_chunk() -> None:
    from asyncconsumer.engine.connection import BrokerConnection

    conn = BrokerConnection(1, HOST, 1, client_id="t", request_timeout=1, setup_timeout=1, ssl_context=None)
    chunk = b"s" * 100 + b"L" * 900_000 + b"x" * 100_000
    stream = _Chunks(chunk, b"y" * 200_000)
    small = await conn._read_exactly(stream, 100)  # type: ignore[arg-type]
    large = await conn._read_exactly(stream, 900_000)  # type: ignore[arg-type]
    spanning = await conn._read_exactly(stream, 150_000)  # type: ignore[arg-type]
    # A view would keep the whole 1 MB chunk alive for 100 bytes that the fetch buffer counts as 100.
    assert isinstance(small, bytearray) and bytes(small) == b"s" * 100
    assert isinstance(large, memoryview) and large.obj is chunk and bytes(large) == b"L" * 900_000
    assert bytes(spanning) == b"x" * 100_000 + b"y" * 50_000  # across two reads: assembled once


async def test_bytes_fed_between_frames_deliver_every_whole_frame_and_keep_the_rest() -> None:
    """``_take_frames`` (what the socket's readiness callback feeds, engine/sockets.py): each whole
    response goes to its request at once, a part of one stays for the reader to finish."""
    conn = BrokerConnection(1, HOST, 1, client_id="t", request_timeout=1, setup_timeout=1, ssl_context=None)
    waiters: dict[int, Waiter[Any]] = {}
    for correlation_id in (1, 2, 3, 4):
        waiters[correlation_id] = Waiter()
        conn._pending[correlation_id] = ("Heartbeat", 4, waiters[correlation_id])
    frames = {cid: api.encode_response("Heartbeat", 4, {"error_code": cid}, correlation_id=cid) for cid in (1, 2, 3, 4)}

    assert conn._take_frames(frames[1]) is True  # one whole frame: nothing kept
    assert waiters[1].result()["error_code"] == 1 and conn._pos >= len(conn._chunk)
    assert conn._take_frames(frames[2] + frames[3][:2]) is False  # not even the rest's size
    assert waiters[2].result()["error_code"] == 2 and not waiters[3].done()
    assert bytes(conn._chunk[conn._pos :]) == frames[3][:2]
    conn._chunk, conn._pos = memoryview(b""), 0
    assert conn._take_frames(frames[3] + frames[4][:-1]) is False  # the size, not all the frame
    assert waiters[3].result()["error_code"] == 3 and not waiters[4].done()
    assert bytes(conn._chunk[conn._pos :]) == frames[4][:-1]
    with pytest.raises(ProtocolError, match="bad response frame size"):
        conn._take_frames(b"HTTP/1.1 400 Bad Request")


async def test_large_frames_spanning_reads_reuse_a_pooled_buffer_once_released() -> None:
    from asyncconsumer.engine.buffers import BufferPool

    pool = BufferPool(8 << 20)
    conn = BrokerConnection(1, HOST, 1, client_id="t", request_timeout=1, setup_timeout=1, ssl_context=None,
                            frames=pool)
    size = 600_000
    reads = [bytes([65 + i]) * 300_000 for i in range(6)]  # three frames, each across two reads
    stream = _Chunks(*reads)
    first = await conn._read_exactly(stream, size)  # type: ignore[arg-type]
    assert isinstance(first, memoryview) and bytes(first) == b"A" * 300_000 + b"B" * 300_000
    backing = id(first.obj)  # not the object: a reference would keep the buffer busy
    kept = first[10:20]  # a fetch still being read points into the first frame
    second = await conn._read_exactly(stream, size)  # type: ignore[arg-type]
    assert isinstance(second, memoryview) and id(second.obj) != backing
    assert bytes(second) == b"C" * 300_000 + b"D" * 300_000
    backings = {backing, id(second.obj)}
    del first, kept, second
    third = await conn._read_exactly(stream, size)  # type: ignore[arg-type]
    assert isinstance(third, memoryview) and id(third.obj) in backings
    assert bytes(third) == b"E" * 300_000 + b"F" * 300_000  # the old contents overwritten
    assert (pool.allocated, pool.reused) == (2, 1)


async def test_a_tls_handshake_cut_off_is_worth_retrying_a_bad_certificate_is_not(tls_broker: Any) -> None:
    """A peer hanging up mid-handshake (a broker restarting) is a retriable connection error; a
    certificate the client does not trust is an AuthenticationError, which retrying cannot fix."""
    import ssl

    from asyncconsumer.errors import AuthenticationError

    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        await stream.aclose()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        conn = BrokerConnection(-1, HOST, port, client_id="t", request_timeout=5, setup_timeout=5,
                                ssl_context=ssl.create_default_context())
        with anyio.fail_after(5), pytest.raises(KafkaConnectionError) as caught:
            await conn.open(spawner(tg))
        assert caught.value.retriable
        tg.cancel_scope.cancel()

    host, _, tls_port = tls_broker.bootstrap.rpartition(":")
    untrusting = BrokerConnection(-1, host, int(tls_port), client_id="t", request_timeout=5, setup_timeout=5,
                                  ssl_context=ssl.create_default_context())  # no CA for the test certificate
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(5), pytest.raises(AuthenticationError, match="TLS handshake") as failed:
            await untrusting.open(spawner(tg))
        assert not failed.value.retriable
