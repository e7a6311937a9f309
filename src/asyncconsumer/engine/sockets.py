"""Plaintext TCP to a broker on the socket itself: a fetch response is read in one piece, into its buffer.

anyio's TCP streams hand out what they receive as new ``bytes`` objects, a piece at a time.  On
asyncio each ``receive`` also resumes and pauses the transport (two ``epoll_ctl`` calls) and takes
turns of the event loop to read the socket and to wake the reader.  A fetch response of a few MiB
from a broker still sending it arrived in hundreds of such pieces, each then copied into the
response's frame buffer (engine/buffers.py): work that both ``batches()`` and ``arrow_batches()``
pay, in proportion to the bytes fetched.

:class:`SocketStream` is the socket, non-blocking, driven by ``anyio.wait_writable`` and, for
reading, ``anyio.wait_readable``, except on asyncio's own selector loop, which keeps watching the
socket from one wait of the reader to the next (``add_reader`` once, not an ``epoll_ctl`` pair per
response, which cost ~20 µs of each response's way to the application).
:meth:`SocketStream.receive_exactly_into` fills a frame's buffer: each ``recv_into`` copies what
the kernel holds straight into the buffer, and the reader waits for more until it is full. (The
socket's receive low-water mark, ``SO_RCVLOWAT``, set to the bytes still missing would wake the
reader once a frame instead of once a piece, but on Linux it held a broker's sending up for
milliseconds at a time: a backlog of 1 KiB records read at half the rate.) Small frames and frame
headers are read ahead in chunks of up to 64 KiB (:meth:`SocketStream.receive`).

Where the loop is asyncio's own, its readiness callback reads the socket for a waiting reader:
between frames (:meth:`SocketStream.receive_fed`) it hands the bytes to the reader's ``feed``,
which delivers every whole frame in them at once, so a small response (a caught-up consumer's
fetch answer) reaches its request in the turn the loop sees it, without the reader task waking for
it (a turn of the event loop, a future and the task's coroutines: about an eighth of a fetch round
trip's instructions); and it reads each piece of a large frame into the frame's buffer
(:meth:`SocketStream.receive_exactly_into`), so the reader wakes once, with the frame whole, not
once a piece.

Checkpoints follow anyio's streams: a call is a cancellation point *before* it takes or sends
anything, and lets other tasks run.  Two calls can lose bytes when cancelled part way, and both
then leave a stream the caller must close: :meth:`receive_exactly_into` (the bytes already read)
and :meth:`send` (half a frame sent: :meth:`send` closes the socket itself, since nothing after
it could be framed).  The connection closes its stream whenever its reader stops anyway.

TLS connections keep anyio's TLS stream, whose TLS layer owns the socket's bytes.

:func:`connect` resolves the host (an IP address is taken as it is, without the resolver:
``anyio.getaddrinfo`` on asyncio asks a worker thread even for one, which cost the first
connection of a process about 1 ms of CPU time) and tries its addresses in the resolver's
order, starting the next attempt when any attempt still running fails or after
:data:`NEXT_ADDRESS_AFTER` seconds without an answer, and keeps the first to connect (as anyio's
``connect_tcp`` does, RFC 6555; RFC 8305 section 5: a failed attempt starts the next at once,
whichever attempt it was).  The caller's set-up timeout bounds the whole attempt.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import math
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
from anyio import notify_closing, wait_readable, wait_writable

from .._runtime import current_async_library

_sniffio_local: Any
try:  # anyio asks sniffio where it is installed, and sniffio finds no task in a loop's callback
    from sniffio import thread_local as _sniffio_local
except ImportError:  # pragma: no cover - anyio then asks asyncio for the running loop
    _sniffio_local = None

__all__ = ["NEXT_ADDRESS_AFTER", "SocketStream", "connect"]

_In = TypeVar("_In")
_Got = TypeVar("_Got", bytes, int)

#: Seconds :func:`connect` waits for an address to answer before it also tries the next one.
NEXT_ADDRESS_AFTER = 0.25

class SocketStream(anyio.abc.ByteStream):
    """A connected TCP socket as an anyio byte stream, plus :meth:`receive_exactly_into`.

    One task may receive and one may send at a time (the connection's reader, and senders under its
    send lock).  Errors are anyio's: ``EndOfStream`` when the broker closed its side,
    ``BrokenResourceError`` (from the ``OSError``) when the connection broke, ``ClosedResourceError``
    once :meth:`aclose` was called, also in a task waiting to read or write then.
    """

    __slots__ = ("_closed", "_loop", "_on_readable", "_sock", "_stale", "_waiter", "_watching")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False
        #: asyncio's selector loop, which watches the socket for the reader (None: anyio's ``wait_readable``).
        self._loop = _asyncio_loop()
        #: The reader's wait for the socket to be readable, while it waits (asyncio).
        self._waiter: asyncio.Future[None] | None = None
        #: The loop watches the socket (``add_reader``) and calls :meth:`_readable`.
        self._watching = False
        #: The loop's next report may predate the woken reader's read (see :meth:`_readable`).
        self._stale = False
        #: While the reader waits: the read the readiness callback makes for it, True when the
        #: reader is to go on (:meth:`receive_fed`, :meth:`receive_exactly_into`); None: just wake it.
        self._on_readable: Callable[[], bool] | None = None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` bytes, at least one, as soon as the kernel holds any."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        data = self._read_now(self._sock.recv, max_bytes)
        if data is not None:
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return data
        return await self._receive_when_readable(max_bytes)

    async def receive_ready(self, max_bytes: int = 65536) -> bytes:
        """:meth:`receive` for a reader whose cancellation closes the stream anyway (the connection's
        reader): it reads first and waits only when the kernel holds nothing, so the usual case, a
        reader waiting for the next response, has no checkpoint before its wait (which is the
        cancellation point).  Bytes that were already there are taken before a cancellation is
        seen, and are lost with it: close the stream."""
        data = self._read_now(self._sock.recv, max_bytes)
        if data is not None:
            await anyio.lowlevel.checkpoint()
            return data
        return await self._receive_when_readable(max_bytes)

    @property
    def feeds(self) -> bool:
        """:meth:`receive_fed` applies: asyncio's own selector loop runs the stream's readiness callback."""
        return self._loop is not None

    async def receive_fed(self, feed: Callable[[bytes], bool], max_bytes: int = 65536) -> None:
        """Hand what arrives to ``feed`` (up to ``max_bytes`` a read), which returns False when it
        kept bytes for the caller to go on with; only where :attr:`feeds`.

        What the kernel holds now is read and fed from the caller's task, and the call returns
        (the caller looks at what ``feed`` kept).  Otherwise the caller waits, and the loop's
        readiness callback reads the socket and calls ``feed`` itself, until ``feed`` keeps bytes:
        a response that arrives whole is handed on in the turn the loop sees it, without waking
        the caller (a turn of the event loop and the caller's task).  ``feed`` runs in no task
        there: it must not await or use a cancel scope.  What ``feed`` raises, and the stream's
        own errors, are raised here.  Cancelled while it waits, nothing is lost: bytes are read
        only into ``feed``."""
        data = self._read_now(self._sock.recv, max_bytes)
        if data is not None:
            feed(data)  # whatever it kept: the caller looks, after the checkpoint
            await anyio.lowlevel.checkpoint()
            return
        await self._wait_reading(functools.partial(self._feed_once, feed, max_bytes))

    async def _receive_when_readable(self, max_bytes: int) -> bytes:
        """The kernel held nothing: wait until it holds a byte (or the stream ends), then read."""
        while True:
            await self._wait_readable()
            data = self._read_now(self._sock.recv, max_bytes)
            if data is not None:
                return data

    async def _wait_readable(self) -> None:
        """Until the socket is readable.  asyncio's own selector loop keeps watching the socket
        from one wait to the next; elsewhere anyio's ``wait_readable``, which adds the socket to
        the loop's ``epoll`` set and removes it again for every wait (two ``epoll_ctl`` calls and
        a handle, ~20 µs on a response's way to the application).  The watch ends when the socket
        is readable and nobody waits (level-triggered, it would be reported every turn), or with
        the stream.  A wake may still find nothing to read: the callers read and wait again then."""
        loop = self._loop
        if loop is None:
            await wait_readable(self._sock)
            return
        self._check_open()
        waiter = self._waiter = loop.create_future()
        if not self._watching:
            loop.add_reader(self._sock.fileno(), self._readable)
            self._watching = True
        try:
            await waiter
        finally:
            self._waiter = None

    def _readable(self) -> None:
        """The loop saw the socket readable: wake the reader, or first read for it (its
        ``_on_readable``, which says whether to wake it); stop watching if none waits.

        The report after a wake is passed over: the loop polls before it runs the woken reader, so
        that report was made before the reader read what woke it, and would wake its next wait
        for nothing (a turn and a read).  If the socket is still readable, level-triggered, the
        loop reports it again at its next poll."""
        if self._stale:
            self._stale = False
            return
        waiter = self._waiter
        if waiter is None:
            self._unwatch()
        elif not waiter.done():
            read = self._on_readable
            if read is not None:
                try:
                    if not read():
                        return  # the reader waits on
                except Exception as exc:  # the stream's errors, or the feed's: the reader's
                    if not waiter.done():
                        waiter.set_exception(exc)
                    return
                if waiter.done():  # what the feed delivered closed the stream, or cancelled the reader
                    return
            waiter.set_result(None)
            self._stale = True

    async def _wait_reading(self, read: Callable[[], bool]) -> None:
        """:meth:`_wait_readable` on asyncio's selector loop, the loop's readiness callback calling
        ``read()`` for the reader each time until it returns True (or raises)."""
        self._on_readable = read
        try:
            await self._wait_readable()
        finally:
            self._on_readable = None

    def _feed_once(self, feed: Callable[[bytes], bool], max_bytes: int) -> bool:
        """:meth:`receive_fed`'s read in the readiness callback: True when ``feed`` kept bytes."""
        data = self._read_now(self._sock.recv, max_bytes)
        if data is None:
            return False
        if _sniffio_local is None:
            return not feed(data)
        library, _sniffio_local.name = _sniffio_local.name, "asyncio"
        try:
            return not feed(data)
        finally:
            _sniffio_local.name = library

    def _fill_once(self, buffer: memoryview, filled: list[int]) -> bool:
        """:meth:`receive_exactly_into`'s read in the readiness callback: True when ``buffer`` is full."""
        filled[0] += self._read_now(self._sock.recv_into, buffer[filled[0] :]) or 0
        return filled[0] >= len(buffer)

    def _unwatch(self) -> None:
        if self._watching and self._loop is not None:
            self._watching = False
            self._loop.remove_reader(self._sock.fileno())

    async def receive_exactly_into(self, buffer: memoryview) -> None:
        """Fill all of ``buffer``: what the kernel holds now, then each piece as it arrives, read
        straight into the buffer.  ``EndOfStream`` if the connection ends first.  Cancelled part
        way, the bytes already read are gone: close the stream."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        filled, size, waited = 0, len(buffer), False
        while filled < size:
            filled += self._read_now(self._sock.recv_into, buffer[filled:]) or 0
            if filled < size:
                waited = True
                if self._loop is None:
                    await self._wait_readable()
                    continue
                # asyncio's loop reads each piece from its readiness callback: the reader wakes once, full
                progress = [filled]
                await self._wait_reading(functools.partial(self._fill_once, buffer, progress))
                filled = progress[0]
        if not waited:
            await anyio.lowlevel.cancel_shielded_checkpoint()

    def _read_now(self, read: Callable[[_In], _Got], arg: _In) -> _Got | None:
        """What one read of the socket gives without waiting (``recv`` or ``recv_into`` of a
        non-empty buffer); None when the kernel holds nothing yet."""
        self._check_open()
        try:
            got = read(arg)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        if not got:  # 0 bytes from a read that asked for some: the broker closed its side
            raise anyio.EndOfStream
        return got

    async def send(self, item: bytes | bytearray | memoryview) -> None:
        """Send all of ``item``, waiting while the kernel's send buffer is full."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        view = memoryview(item).cast("B")
        total = len(view)
        try:
            while view:
                self._check_open()
                rest = self._send_some(view)
                if len(rest) == len(view):  # the send buffer is full
                    await wait_writable(self._sock)
                view = rest
        except BaseException:
            if 0 < len(view) < total:  # half a frame went out: nothing after it could be framed
                self._close()
            raise
        await anyio.lowlevel.cancel_shielded_checkpoint()

    def send_nowait(self, item: bytes | bytearray | memoryview) -> memoryview:
        """Send what the kernel's send buffer takes of ``item`` now, without waiting; returns the
        rest (empty when all of it went out), which the caller must :meth:`send` before anything
        else, or close the stream.  Not a checkpoint: a request goes out from the task that makes
        it (the background loop), without a task of its own (engine/connection.py)."""
        self._check_open()
        return self._send_some(memoryview(item).cast("B"))

    def _send_some(self, view: memoryview) -> memoryview:
        """What the kernel's send buffer does not take of ``view`` now (all of it when full)."""
        try:
            return view[self._sock.send(view) :]
        except BlockingIOError:
            return view
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        self._check_open()
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._close()
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        sock = self._sock  # addresses as anyio gives them: (host, port), for IPv6 too
        return {
            anyio.abc.SocketAttribute.family: lambda: sock.family,
            anyio.abc.SocketAttribute.local_address: lambda: sock.getsockname()[:2],
            anyio.abc.SocketAttribute.local_port: lambda: sock.getsockname()[1],
            anyio.abc.SocketAttribute.remote_address: lambda: sock.getpeername()[:2],
            anyio.abc.SocketAttribute.remote_port: lambda: sock.getpeername()[1],
            anyio.abc.SocketAttribute.raw_socket: lambda: sock,
        }

    @property
    def closed(self) -> bool:
        """Closed: by :meth:`aclose`, or by a :meth:`send` cancelled half way through a frame."""
        return self._closed

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._unwatch()  # before the socket closes: its descriptor may be reused at once
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(anyio.ClosedResourceError())
            notify_closing(self._sock)  # a task waiting to read or write gets ClosedResourceError
            self._sock.close()

    def _check_open(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running loop if it is asyncio's own selector loop, whose order :meth:`SocketStream._readable`
    relies on (it polls, then runs what the last turn scheduled, then the poll's callbacks); None on
    trio, uvloop, Windows' proactor loop or outside a loop (anyio's ``wait_readable`` then)."""
    if current_async_library() != "asyncio":
        return None
    loop = asyncio.get_running_loop()
    return loop if isinstance(loop, asyncio.SelectorEventLoop) else None


async def connect(host: str, port: int) -> SocketStream:
    """A :class:`SocketStream` to ``host:port`` (see the module's docstring for the order of attempts).

    Raises the ``OSError`` of the only address, or one naming every address's failure.
    """
    addresses = _numeric(host, port)
    if addresses is None:
        addresses = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return await connect_any([(family, kind, proto, address) for family, kind, proto, _, address in addresses])


def _numeric(host: str, port: int) -> list[tuple[Any, ...]] | None:
    """``host`` as an IPv4 or IPv6 address, the way ``getaddrinfo`` gives it (``AI_NUMERICHOST``:
    no resolver, nothing that blocks); None for a host name."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None


async def connect_any(addresses: list[tuple[int, int, int, Any]]) -> SocketStream:
    """Connect to the first of ``addresses`` (``(family, type, proto, sockaddr)``) that answers, trying
    the next one when an attempt still running fails (the newest or an earlier one still waiting)
    or the newest has not answered within :data:`NEXT_ADDRESS_AFTER` seconds.  An address whose
    socket cannot even be made (a family the host does not have) fails like one that refuses."""
    if not addresses:
        raise OSError(errno.EADDRNOTAVAIL, "the host name resolved to no address")
    connected: list[socket.socket] = []
    failures: list[tuple[Any, OSError]] = []
    # One item per failed attempt, whichever it was; each wait for the next address takes one.
    failed, failure = anyio.create_memory_object_stream[None](math.inf)

    async def attempt(family: int, kind: int, proto: int, address: Any) -> None:
        sock: socket.socket | None = None
        try:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.connect(address)
            except BlockingIOError:
                await wait_writable(sock)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, os.strerror(error)) from None
        except OSError as exc:
            if sock is not None:
                sock.close()
            failures.append((address, exc))
            failed.send_nowait(None)
            return
        except BaseException:  # cancelled: another address answered first
            if sock is not None:
                sock.close()
            raise
        if connected:  # answered in the same turn as the winner
            sock.close()
            return
        connected.append(sock)
        group.cancel_scope.cancel()

    try:
        with failed, failure:
            async with anyio.create_task_group() as group:
                for family, kind, proto, address in addresses:
                    group.start_soon(attempt, family, kind, proto, address)
                    with anyio.move_on_after(NEXT_ADDRESS_AFTER):
                        await failure.receive()
    except BaseException:  # the caller's timeout or cancellation as an address answered: not kept
        for sock in connected:
            sock.close()
        raise
    if connected:
        return SocketStream(connected[0])
    if len(failures) == 1:
        raise failures[0][1]
    raise OSError(
        failures[-1][1].errno,
        "; ".join(f"{_describe(address)}: {exc.strerror or exc}" for address, exc in failures),
    )


def _describe(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
