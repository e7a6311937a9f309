"""A fault-injecting TCP proxy written with anyio (runs under asyncio and trio).

Usage::

    async with ChaosProxy("127.0.0.1", broker_port) as proxy:
        client = connect(proxy.address)           # "127.0.0.1:P"
        await proxy.drop_all()                    # cut every live connection (FIN, or RST with reset=True)
        proxy.drop_after_bytes(100, connections=1)  # next connection dies after 100 bytes server->client
        proxy.blackhole = True                    # swallow traffic in both directions (a hung peer)
        proxy.refuse_new = True                   # accept, then close at once

With ``server_ssl_context`` the proxy terminates TLS on the client side and speaks plain TCP to
the target (that is how the TLS test broker is built, see ``support.broker``).

Note on Kafka: a client only bootstraps through this address; afterwards it connects to whatever
the broker *advertises*.  To route all traffic through the proxy, start a broker whose advertised
listener is the proxy's address (``support.broker.start_tansu(advertised_port=proxy.port)``, or the
``proxied_broker`` fixture).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from types import TracebackType

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSStream

__all__ = ["ChaosProxy"]

_CHUNK = 65536
_STREAM_ERRORS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _abortive_close(stream: anyio.abc.SocketStream) -> None:
    """Arrange for close() to send RST instead of FIN."""
    with contextlib.suppress(OSError, TypeError, KeyError):
        raw = stream.extra(SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Link:
    """One proxied client connection."""

    __slots__ = ("closed", "limit", "reset", "scope")

    def __init__(self, limit: int | None) -> None:
        self.scope = anyio.CancelScope()
        self.closed = anyio.Event()
        self.limit = limit  # remaining server->client bytes before the cut (None = unlimited)
        self.reset = False

    def drop(self, *, reset: bool) -> None:
        self.reset = self.reset or reset
        self.scope.cancel()


class ChaosProxy:
    """TCP proxy on the loopback interface that can drop, truncate, stall or refuse connections."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        server_ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self._server_ssl_context = server_ssl_context
        self._connect_timeout = connect_timeout
        self._links: set[_Link] = set()
        self._drop_after: int | None = None
        self._drop_after_budget: int | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._port: int | None = None
        self._accepted = anyio.Event()

        #: accepted connections closed immediately
        self.refuse_new = False
        #: all data read from either side is discarded (the peer looks hung)
        self.blackhole = False
        self.connections_accepted = 0
        self.connections_dropped = 0
        self.bytes_to_client = 0
        self.bytes_to_server = 0

    # ------------------------------------------------------------------ properties
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy is not running")
        return self._port

    @property
    def host(self) -> str:
        return self.listen_host

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"`` -- usable as a bootstrap server string."""
        return f"{self.listen_host}:{self.port}"

    @property
    def active_connections(self) -> int:
        return len(self._links)

    # ------------------------------------------------------------------ controls
    def retarget(self, host: str, port: int) -> None:
        """Forward connections accepted from now on to another address."""
        self.target_host, self.target_port = host, port

    def drop_after_bytes(self, n: int | None, *, connections: int | None = None) -> None:
        """Cut future connections after *n* bytes of server->client data.

        ``connections`` limits how many new connections are affected (``None``: all of them until
        ``drop_after_bytes(None)`` switches it off).  Live connections are not affected.
        """
        if n is not None and n < 0:
            raise ValueError("n must be >= 0")
        self._drop_after = n
        self._drop_after_budget = connections

    async def drop_all(self, *, reset: bool = False) -> int:
        """Close every live connection (both sides); with ``reset=True`` send RST instead of FIN.

        Returns how many connections were dropped, once they are all fully closed.
        """
        links = list(self._links)
        for link in links:
            link.drop(reset=reset)
        self.connections_dropped += len(links)
        with anyio.fail_after(10):
            for link in links:
                await link.closed.wait()
        return len(links)

    async def wait_for_connections(self, n: int) -> None:
        """Wait until at least *n* connections have been accepted in total (wrap in ``fail_after``)."""
        while self.connections_accepted < n:
            await self._accepted.wait()

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> ChaosProxy:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            listener = await anyio.create_tcp_listener(
                local_host=self.listen_host, local_port=self._listen_port, reuse_port=False
            )
            stack.push_async_callback(listener.aclose)
            self._port = int(listener.extra(SocketAttribute.local_port))
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # runs before the task group exits
            tg.start_soon(listener.serve, self._handle, tg)
            self._tg = tg
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is not None:
            for link in list(self._links):
                link.drop(reset=False)
            await stack.__aexit__(exc_type, exc, tb)
        self._tg = None
        return None

    async def aclose(self) -> None:
        await self.__aexit__(None, None, None)

    # ------------------------------------------------------------------ internals
    def _take_limit(self) -> int | None:
        if self._drop_after is None:
            return None
        limit = self._drop_after
        if self._drop_after_budget is not None:
            self._drop_after_budget -= 1
            if self._drop_after_budget <= 0:
                self._drop_after = None
                self._drop_after_budget = None
        return limit

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.connections_accepted += 1
        accepted, self._accepted = self._accepted, anyio.Event()
        accepted.set()
        link = _Link(self._take_limit())
        try:
            async with client:
                if self.refuse_new:
                    self.connections_dropped += 1
                    return
                with link.scope:
                    self._links.add(link)
                    downstream: anyio.abc.ByteStream = client
                    if self._server_ssl_context is not None:
                        try:
                            with anyio.fail_after(self._connect_timeout):
                                downstream = await TLSStream.wrap(
                                    client,
                                    server_side=True,
                                    ssl_context=self._server_ssl_context,
                                    standard_compatible=False,
                                )
                        except (*_STREAM_ERRORS, TimeoutError):
                            return
                    try:
                        with anyio.fail_after(self._connect_timeout):
                            upstream = await anyio.connect_tcp(self.target_host, self.target_port)
                    except (OSError, TimeoutError):
                        return
                    try:
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._pump, downstream, upstream, link, False)
                            tg.start_soon(self._pump, upstream, downstream, link, True)
                    finally:
                        if link.reset:
                            _abortive_close(upstream)
                        with anyio.CancelScope(shield=True):
                            await upstream.aclose()
                if link.reset:
                    _abortive_close(client)
        finally:
            self._links.discard(link)
            link.closed.set()

    async def _pump(
        self,
        src: anyio.abc.ByteStream,
        dst: anyio.abc.ByteStream,
        link: _Link,
        to_client: bool,
    ) -> None:
        try:
            while True:
                data = await src.receive(_CHUNK)
                if self.blackhole:
                    continue
                cut = False
                if to_client and link.limit is not None:
                    if len(data) >= link.limit:
                        data = data[: link.limit]
                        cut = True
                    link.limit -= len(data)
                if data:
                    await dst.send(data)
                    if to_client:
                        self.bytes_to_client += len(data)
                    else:
                        self.bytes_to_server += len(data)
                if cut:
                    self.connections_dropped += 1
                    return
        except _STREAM_ERRORS:
            return
        finally:
            link.scope.cancel()
