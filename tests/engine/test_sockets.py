"""engine/sockets.py: the plaintext socket stream and its connect, over real loopback TCP, on asyncio and trio.

The peer is a plain anyio listener in the test, so each test can send a frame in pieces, stall,
close half way or not read at all; the consumer's own use of the stream runs in every broker test.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from asyncconsumer.engine import sockets
from asyncconsumer.engine.sockets import SocketStream, connect, connect_any

pytestmark = pytest.mark.anyio

Peer = Callable[[anyio.abc.SocketStream], Awaitable[None]]


@asynccontextmanager
async def peer(serve: Peer, receive_buffer: int = 0) -> AsyncIterator[tuple[str, int]]:
    """A listener on loopback that hands each connection to ``serve``; yields its address.
    ``receive_buffer``: a fixed SO_RCVBUF for its connections instead of the kernel's autotuning."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    if receive_buffer:
        raw = listener.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def handle(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            await serve(conn)

    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        yield "127.0.0.1", port
        group.cancel_scope.cancel()


def payload(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the stream's waits for the socket to be readable."""
    counted: list[int] = []
    wait = SocketStream._wait_readable

    async def counting(self: SocketStream) -> None:
        counted.append(1)
        await wait(self)

    monkeypatch.setattr(SocketStream, "_wait_readable", counting)
    return counted


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the stream's reads that got bytes (in the reader's task or the loop's callback)."""
    counted: list[int] = []
    read_now = SocketStream._read_now

    def counting(self: SocketStream, read: Any, arg: Any) -> Any:
        got = read_now(self, read, arg)
        if got is not None:
            counted.append(got if isinstance(got, int) else len(got))
        return got

    monkeypatch.setattr(SocketStream, "_read_now", counting)
    return counted


def count_watches(calls: list[str], monkeypatch: pytest.MonkeyPatch) -> asyncio.AbstractEventLoop:
    """Record the running asyncio loop's ``add_reader``/``remove_reader`` calls in ``calls``."""
    loop = asyncio.get_running_loop()
    for name in ("add_reader", "remove_reader"):
        method = getattr(loop, name)

        def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls.append(_name)
            return _method(*args)

        monkeypatch.setattr(loop, name, counted)
    return loop


async def test_a_frame_sent_in_pieces_is_read_whole_as_the_pieces_arrive(
    wakes: list[int], reads: list[int], anyio_backend_name: str
) -> None:
    """Each piece is read into the frame's buffer as it arrives: the socket's receive low-water mark
    stays at one byte (raised to the bytes still missing, it held Apache Kafka's sending up for
    milliseconds at a time on Linux).  On asyncio the loop's readiness callback reads them, and
    the reader is woken once, with the frame whole."""
    data = payload(2 << 20)

    async def send_in_pieces(conn: anyio.abc.SocketStream) -> None:
        for i in range(0, len(data), len(data) // 16):
            await conn.send(data[i : i + len(data) // 16])
            await anyio.sleep(0.01)
        await anyio.sleep(5)

    async with peer(send_in_pieces) as (host, port):
        stream = await connect(host, port)
        async with stream:
            buffer = bytearray(len(data))
            with anyio.fail_after(10):
                await stream.receive_exactly_into(memoryview(buffer))
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            if sys.platform == "linux":
                assert raw.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    assert buffer == data
    assert len(reads) > 2, f"read in {len(reads)} times for a frame sent in 16 pieces 10 ms apart"
    if anyio_backend_name == "asyncio":
        assert len(wakes) == 1


async def test_the_connection_ending_half_way_through_a_frame_is_end_of_stream() -> None:
    async def send_some_and_close(conn: anyio.abc.SocketStream) -> None:
        await conn.send(b"x" * 1000)

    async with peer(send_some_and_close) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
                # 4 KiB more is asked for than ever comes: the close must wake the reader
                await stream.receive_exactly_into(memoryview(bytearray(5000)))


async def test_receive_reads_ahead_what_arrived_and_ends_at_the_close() -> None:
    async def send_and_close(conn: anyio.abc.SocketStream) -> None:
        await conn.send(b"abc")
        await anyio.sleep(0.05)
        await conn.send(b"defg")

    async with peer(send_and_close) as (host, port):
        async with await connect(host, port) as stream:
            got = b""
            with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
                while True:
                    got += await stream.receive(2)
    assert got == b"abcdefg"


async def test_receive_ready_takes_what_is_there_and_waits_once_otherwise(wakes: list[int]) -> None:
    go = anyio.Event()

    async def send_twice(conn: anyio.abc.SocketStream) -> None:
        await conn.send(b"abc")
        await go.wait()
        await conn.send(b"defg")

    async with peer(send_twice) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.fail_after(10):
                assert await stream.receive_ready(10) == b"abc"
                wakes.clear()
                with anyio.move_on_after(0.1) as scope:  # nothing there: it waits, and is cancelled there
                    await stream.receive_ready(10)
                assert scope.cancelled_caught and len(wakes) == 1
                go.set()
                assert await stream.receive_ready(10) == b"defg"  # nothing was lost to the cancellation
                with pytest.raises(anyio.EndOfStream):
                    await stream.receive_ready(10)


def answer_each(delay: float) -> Peer:
    """A peer that answers each one-byte request ``delay`` seconds later, as a broker answers a
    consumer's fetch (long enough for the reader to be waiting when the answer comes, even on a
    loaded machine)."""

    async def serve(conn: anyio.abc.SocketStream) -> None:
        while await conn.receive(1):
            await anyio.sleep(delay)
            await conn.send(b"answer")

    return serve


async def ask(stream: SocketStream, times: int) -> None:
    """Request and take the answer, ``times`` times in turn."""
    for _ in range(times):
        await stream.send(b"?")
        assert await stream.receive_ready(100) == b"answer"


async def test_each_response_wakes_the_reader_once(wakes: list[int]) -> None:
    """Request and response in turn, as a consumer and its broker: one wait per response, none
    woken for nothing (on asyncio the loop's report after a wake predates the reader's read)."""
    async with peer(answer_each(0.02)) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.fail_after(10):
                await ask(stream, 10)
    assert len(wakes) <= 10  # one each (fewer only if a stalled reader found the answer there already)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio: anyio's wait_readable, as before
async def test_asyncio_watches_the_socket_from_one_wait_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``add_reader`` for many waits; the watch ends when the socket is readable and nobody
    waits (it would be reported every turn), and with the stream."""
    watches: list[str] = []
    async with peer(answer_each(0.05)) as (host, port):
        stream = await connect(host, port)
        loop = count_watches(watches, monkeypatch)
        fd = stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
        with anyio.fail_after(10):
            await ask(stream, 5)
            assert watches == ["add_reader"]
            await stream.send(b"?")  # the answer comes while nobody waits: the watch ends
            await anyio.sleep(0.3)
            assert watches == ["add_reader", "remove_reader"]
            assert await stream.receive_ready(100) == b"answer"  # read at once, no wait
            await ask(stream, 1)  # waits: watched again
            assert watches == ["add_reader", "remove_reader", "add_reader"]
        await stream.aclose()
        assert watches[-1] == "remove_reader"
        assert not loop.remove_reader(fd)  # nothing left watching the closed socket's descriptor


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
async def test_uvloop_waits_as_anyio_does(monkeypatch: pytest.MonkeyPatch, wakes: list[int]) -> None:
    """The watch relies on the order of asyncio's own loop (it polls, runs what the last turn
    scheduled, then the poll's callbacks): uvloop waits through anyio's ``wait_readable``, which
    watches the socket for one wait at a time."""
    watches: list[str] = []
    async with peer(answer_each(0.02)) as (host, port):
        async with await connect(host, port) as stream:
            count_watches(watches, monkeypatch)
            with anyio.fail_after(10):
                await ask(stream, 3)
            assert 1 <= len(wakes) <= 3
            assert watches == ["add_reader", "remove_reader"] * len(wakes)  # a pair for every wait


class Feed:
    """A ``receive_fed`` consumer: keeps what it is given, with whether a task ran it; keeps
    (returns False for) whatever ends in ``b"+"``, raises on ``b"!"``, and uses anyio in between
    (which must work in the loop's callback as in a task)."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, bool]] = []
        self.arrived = anyio.Event()

    def __call__(self, data: bytes) -> bool:
        assert anyio.current_time() > 0 and not anyio.Event().is_set()
        if data.endswith(b"!"):
            raise ValueError("feed refused")
        self.got.append((bytes(data), asyncio.current_task() is not None))
        self.arrived.set()
        self.arrived = anyio.Event()
        return not data.endswith(b"+")


@contextmanager
def plain_asyncio() -> Iterator[None]:
    """As under ``asyncio.run()``, not ``anyio.run()``: sniffio (which anyio asks, where it is
    installed) has no library set in the context, only the running task to go by; in a loop's
    callback there is none.  (Entered in the test's own task: its tasks copy its context.)"""
    try:
        import sniffio
    except ImportError:
        yield
        return
    token = sniffio.current_async_library_cvar.set(None)
    try:
        yield
    finally:
        sniffio.current_async_library_cvar.reset(token)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio and uvloop: no feeding (feeds is False)
async def test_receive_fed_hands_on_whole_answers_from_the_loop_without_waking_the_reader(wakes: list[int]) -> None:
    """While the reader waits, the loop's readiness callback reads and feeds each answer; the
    reader wakes only for bytes the feed keeps."""
    with plain_asyncio():
        await _fed_from_the_loop(wakes)


async def _fed_from_the_loop(wakes: list[int]) -> None:
    async with peer(echo_each) as (host, port):
        async with await connect(host, port) as stream:
            assert stream.feeds
            feed = Feed()
            async with anyio.create_task_group() as group:
                with anyio.fail_after(10):
                    reader = anyio.Event()

                    async def read() -> None:
                        await stream.receive_fed(feed)
                        reader.set()

                    group.start_soon(read)
                    for answer in (b"a", b"b", b"c"):
                        arrived = feed.arrived
                        await stream.send(answer)
                        await arrived.wait()
                    assert feed.got == [(b"a", False), (b"b", False), (b"c", False)]  # in no task: the callback
                    assert len(wakes) == 1 and not reader.is_set()
                    await stream.send(b"d+")
                    await reader.wait()
                    assert feed.got[-1] == (b"d+", False) and len(wakes) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_receive_fed_feeds_what_is_there_from_the_task_and_returns(wakes: list[int]) -> None:
    async with peer(echo_each) as (host, port):
        async with await connect(host, port) as stream:
            feed = Feed()
            with anyio.fail_after(10):
                await stream.send(b"here")
                await until_readable(stream)
                await stream.receive_fed(feed)  # returns after a read in the task, kept or not
            assert feed.got == [(b"here", True)] and not wakes


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_receive_fed_raises_what_the_feed_raises_and_the_end_of_stream() -> None:
    async with peer(echo_each) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(stream.send, b"bad!", name="sends once the reader waits")
                    with pytest.raises(ValueError, match="feed refused"):
                        await stream.receive_fed(Feed())
                await stream.send(b"close")
                with pytest.raises(anyio.EndOfStream):
                    while True:
                        await stream.receive_fed(Feed())


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_receive_fed_cancelled_while_waiting_loses_no_bytes() -> None:
    async with peer(echo_each) as (host, port):
        async with await connect(host, port) as stream:
            feed = Feed()
            with anyio.move_on_after(0.1) as scope:
                await stream.receive_fed(feed)
            assert scope.cancelled_caught and not feed.got
            await stream.send(b"later")
            with anyio.fail_after(10):
                await until_readable(stream)
                assert await stream.receive(100) == b"later"  # nobody fed it: still in the socket


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("ending", ["cancel", "close"])
async def test_a_feed_that_cancels_its_reader_or_closes_the_stream_ends_the_wait_quietly(
    ending: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a feed delivers may end the reader (a response's handler closing the connection): the
    callback then leaves the reader's wait alone (completing it again would raise in the loop)."""

    async def send_later(conn: anyio.abc.SocketStream) -> None:
        await anyio.sleep(0.1)
        await conn.send(b"x")
        await anyio.sleep(5)

    ended: list[BaseException | None] = []
    async with peer(send_later) as (host, port):
        async with await connect(host, port) as stream:
            scope = anyio.CancelScope()

            def feed(data: bytes) -> bool:
                if ending == "cancel":
                    scope.cancel()
                else:
                    stream._close()
                return False  # "bytes kept": the reader would be woken

            with anyio.fail_after(10), scope:
                try:
                    await stream.receive_fed(feed)
                    ended.append(None)
                except anyio.ClosedResourceError as exc:
                    ended.append(exc)
            await anyio.sleep(0.05)  # any late callback has run
    if ending == "cancel":
        assert scope.cancel_called and not ended  # the cancellation came through
    else:
        assert len(ended) == 1 and isinstance(ended[0], anyio.ClosedResourceError)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def echo_each(conn: anyio.abc.SocketStream) -> None:
    """A peer that sends back each piece it receives, and closes when it receives ``close``."""
    while (data := await conn.receive()) != b"close":
        await conn.send(data)


async def until_readable(stream: SocketStream) -> None:
    """Until the kernel holds bytes for ``stream`` (looked at without reading them)."""
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    for _ in range(1000):
        try:
            if raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            pass
        await anyio.sleep(0.01)
    raise AssertionError("nothing arrived in 10 s")


async def test_closing_wakes_a_reader_waiting_for_the_rest_of_a_frame() -> None:
    async def stall(conn: anyio.abc.SocketStream) -> None:
        await conn.send(b"x" * 10)
        await anyio.sleep(30)

    async with peer(stall) as (host, port):
        stream = await connect(host, port)
        outcome: list[BaseException] = []

        async def read() -> None:
            try:
                await stream.receive_exactly_into(memoryview(bytearray(100)))
            except BaseException as exc:
                outcome.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(read)
                await anyio.sleep(0.1)
                await stream.aclose()
    assert len(outcome) == 1 and isinstance(outcome[0], anyio.ClosedResourceError)
    with pytest.raises(anyio.ClosedResourceError):
        await stream.receive()


async def test_a_receive_cancelled_while_waiting_loses_no_bytes() -> None:
    go = anyio.Event()

    async def send_later(conn: anyio.abc.SocketStream) -> None:
        await go.wait()
        await conn.send(b"0123456789")
        await anyio.sleep(5)

    async with peer(send_later) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.move_on_after(0.1) as scope:
                await stream.receive_exactly_into(memoryview(bytearray(10)))
            assert scope.cancelled_caught
            go.set()
            buffer = bytearray(10)
            with anyio.fail_after(10):
                await stream.receive_exactly_into(memoryview(buffer))
    assert buffer == b"0123456789"


async def test_send_waits_for_room_and_sends_everything() -> None:
    data = payload(8 << 20)
    received = hashlib.sha256()
    done = anyio.Event()

    async def read_slowly(conn: anyio.abc.SocketStream) -> None:
        count = 0
        while count < len(data):
            chunk = await conn.receive(256 << 10)
            received.update(chunk)
            count += len(chunk)
            await anyio.sleep(0.001)
        done.set()

    async with peer(read_slowly) as (host, port):
        async with await connect(host, port) as stream:
            with anyio.fail_after(30):
                await stream.send(data)
                await done.wait()
    assert received.digest() == hashlib.sha256(data).digest()


async def test_a_send_cancelled_half_way_closes_the_stream() -> None:
    async def never_read(conn: anyio.abc.SocketStream) -> None:
        await anyio.sleep(30)

    async with peer(never_read, receive_buffer=64 << 10) as (host, port):
        async with await connect(host, port) as stream:
            # Small fixed buffers: a host whose loopback autotuning takes hundreds of MiB (seen in CI)
            # would otherwise take the whole send before the deadline.
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
            with anyio.move_on_after(0.3) as scope:
                await stream.send(b"x" * (256 << 20))  # more than the kernel's buffers take
            assert scope.cancelled_caught
            with pytest.raises(anyio.ClosedResourceError):  # what follows could not be framed
                await stream.send(b"next request")


async def test_connect_refused_raises_the_os_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ConnectionRefusedError):
            await connect("127.0.0.1", port)


@contextmanager
def silent_address() -> Iterator[tuple[str, int]]:
    """A loopback address that takes no connection and does not refuse: a listener whose accept
    queue is full, so further connection attempts get no answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(address)
            except BlockingIOError:
                pass
            fillers.append(filler)
        yield address
    finally:
        for s in (*fillers, listener):
            s.close()


async def hold(conn: anyio.abc.SocketStream) -> None:
    await anyio.sleep(5)


INET = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)


async def test_connect_tries_the_next_address_when_one_does_not_answer() -> None:
    with silent_address() as silent:
        async with peer(hold) as (host, port):
            with anyio.fail_after(5):
                stream = await connect_any([(*INET, silent), (*INET, (host, port))])
            async with stream:
                assert stream.extra(anyio.abc.SocketAttribute.remote_address) == (host, port)


async def test_an_earlier_attempt_failing_starts_the_next_address_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three addresses: one that refuses, but only once the second is being tried; one that never
    # answers; one that accepts.  The second starts when the first has not answered in time; the
    # first's failure then starts the third at once, though the second still waits (RFC 8305).
    # Once the first is under way the wait for an answer is made 30 s, so a connect that waited
    # for the second (the newest) to fail or time out would not be done within 5 s.
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))  # bound, not listening: refused
        second_tried = anyio.Event()
        tried: list[socket.socket] = []
        wait_writable = sockets.wait_writable

        async def in_order(sock: socket.socket) -> None:
            tried.append(sock)
            if len(tried) == 1:  # the refusing address: its answer is read after the next starts
                monkeypatch.setattr(sockets, "NEXT_ADDRESS_AFTER", 30.0)
                await second_tried.wait()
            elif len(tried) == 2:
                second_tried.set()
            await wait_writable(sock)

        monkeypatch.setattr(sockets, "NEXT_ADDRESS_AFTER", 0.05)
        monkeypatch.setattr(sockets, "wait_writable", in_order)
        with silent_address() as silent:
            async with peer(hold) as (host, port):
                with anyio.fail_after(5):
                    stream = await connect_any(
                        [(*INET, refusing.getsockname()), (*INET, silent), (*INET, (host, port))]
                    )
                async with stream:
                    assert stream.extra(anyio.abc.SocketAttribute.remote_address) == (host, port)
        assert len(tried) == 3


async def test_an_address_whose_socket_cannot_be_made_fails_like_a_refusal() -> None:
    # As on a host without IPv6 whose name resolves to ::1 first: socket() itself raises.
    unmakeable = (socket.AF_UNIX, socket.SOCK_STREAM, socket.IPPROTO_TCP, "/nowhere")
    async with peer(hold) as (host, port):
        with anyio.fail_after(5):
            stream = await connect_any([unmakeable, (*INET, (host, port))])
        async with stream:
            assert stream.extra(anyio.abc.SocketAttribute.remote_port) == port
    with pytest.raises(OSError) as caught:  # alone: its own OSError, not an exception group
        await connect_any([unmakeable])
    assert not isinstance(caught.value, BaseExceptionGroup)


async def test_connect_names_every_address_that_failed() -> None:
    closed = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed.append(sock.getsockname())
    with pytest.raises(OSError) as caught:
        await connect_any([(*INET, closed[0]), (*INET, closed[1])])
    for host, port in closed:
        assert f"{host}:{port}" in str(caught.value)


async def test_connect_with_no_address_says_so() -> None:
    with pytest.raises(OSError, match="no address"):
        await connect_any([])


async def test_connect_to_an_ip_address_asks_no_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_resolver(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"resolver asked for {args}")

    async def hello(conn: anyio.abc.SocketStream) -> None:
        await conn.send(b"hi")

    host = "127.0.0.1"
    listener = await anyio.create_tcp_listener(local_host=host)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, hello)
        monkeypatch.setattr(sockets.anyio, "getaddrinfo", no_resolver)
        stream = await connect(host, port)
        async with stream:
            assert await stream.receive() == b"hi"
        with pytest.raises(AssertionError, match="resolver asked"):
            await connect("localhost", port)  # a name still goes to the resolver
        group.cancel_scope.cancel()


async def test_connect_to_an_unknown_host_raises_the_resolver_error() -> None:
    with pytest.raises(socket.gaierror):
        await connect("no-such-host.invalid", 9092)


async def test_stream_reports_its_socket() -> None:
    async with peer(hold) as (host, port):
        async with await connect(host, port) as stream:
            assert isinstance(stream, SocketStream)
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            assert raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert stream.extra(anyio.abc.SocketAttribute.remote_address) == (host, port)
            assert stream.extra(anyio.abc.SocketAttribute.remote_port) == port
            assert stream.extra(anyio.abc.SocketAttribute.local_port) == raw.getsockname()[1]
            assert not stream.closed
        assert stream.closed
