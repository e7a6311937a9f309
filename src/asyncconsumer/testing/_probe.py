"""A blocking, dependency-free readiness probe: does a broker at host:port answer Metadata?

Used by the test brokers while they start.  It speaks the protocol through the package's own
codec (ApiVersions v0, then Metadata v1 for no topics), so it needs no other Kafka client.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

from ..protocol import api

_SIZE = struct.Struct(">i")


def _read_frame(sock: socket.socket) -> bytes:
    header = _recv_exact(sock, 4)
    (size,) = _SIZE.unpack(header)
    return _recv_exact(sock, size)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def metadata_brokers(host: str, port: int, *, timeout: float = 2.0) -> set[tuple[int, str, int]]:
    """The ``(node_id, host, port)`` of every broker the answer lists; raises ``OSError`` or
    ``ConnectionError`` when the broker does not answer, ``ValueError`` on an error code."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(api.encode_request("ApiVersions", 0, {}, correlation_id=1, client_id="asyncconsumer-probe"))
        versions = api.decode_response("ApiVersions", 0, _read_frame(sock))
        if versions["error_code"]:
            raise ValueError(f"ApiVersions error code {versions['error_code']}")
        request = api.encode_request("Metadata", 1, {"topics": []}, correlation_id=2, client_id="asyncconsumer-probe")
        sock.sendall(request)
        metadata = api.decode_response("Metadata", 1, _read_frame(sock))
        return {(b["node_id"], b["host"], b["port"]) for b in metadata["brokers"]}


def wait_for_metadata(
    host: str,
    port: int,
    *,
    timeout: float,
    alive: object = None,
    expect_nodes: int = 1,
) -> float:
    """Poll until the broker answers Metadata listing ``expect_nodes`` brokers; returns the seconds
    it took.  ``alive`` (a callable) is asked between attempts; when it returns a message, waiting
    stops with ``RuntimeError(message)``.  Raises ``TimeoutError`` naming the last failure."""

    def attempt(budget: float) -> str | None:
        try:
            brokers = metadata_brokers(host, port, timeout=budget)
        except (OSError, ConnectionError, ValueError, api.ProtocolDecodeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if len(brokers) >= expect_nodes else f"metadata lists {len(brokers)} of {expect_nodes} brokers"

    return _poll(attempt, timeout, alive, f"{host}:{port} did not answer Metadata")


def wait_for_port(host: str, port: int, *, timeout: float, alive: object = None) -> float:
    """Poll until ``host:port`` accepts a TCP connection (a KRaft controller's listener, which
    answers no Metadata); returns the seconds it took.  ``alive`` as for :func:`wait_for_metadata`."""

    def attempt(budget: float) -> str | None:
        try:
            with socket.create_connection((host, port), timeout=budget):
                return None
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"

    return _poll(attempt, timeout, alive, f"{host}:{port} did not accept a connection")


def _poll(attempt: Callable[[float], str | None], timeout: float, alive: object, failure: str) -> float:
    """Call ``attempt(seconds it may take)`` until it returns None (ready) instead of what went
    wrong, for at most ``timeout`` seconds."""
    start = time.monotonic()
    deadline = start + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if callable(alive):
            gone = alive()
            if gone:
                raise RuntimeError(str(gone))
        problem = attempt(min(2.0, max(0.1, deadline - time.monotonic())))
        if problem is None:
            return time.monotonic() - start
        last = problem
        time.sleep(0.05)
    raise TimeoutError(f"{failure} within {timeout:.0f}s ({last})")
