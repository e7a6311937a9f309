"""What a request manager is, and what it hands to the network client: an unsent request.

The body is built only once the connection's negotiated version is known
(``build(version)``), so managers stay sans-I/O and version-agnostic until the
last moment; the response comes back through ``on_response(now, version, body)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Body = dict[str, Any]


@dataclass(slots=True, eq=False)
class UnsentRequest:
    api: str
    build: Callable[[int], Body]
    on_response: Callable[[float, int, Body], None]
    on_error: Callable[[float, BaseException], None]
    #: Broker to send to; ``None`` means "any broker" (least loaded).
    node_id: int | None = None
    min_version: int = 0
    max_version: int | None = None
    #: Extra time on top of ``request_timeout_ms`` (Fetch waits on the broker).
    extra_timeout_ms: int = 0


class RequestManager(Protocol):
    """A sans-I/O request manager, as the background loop (engine/loop.py) drives it: each turn it
    takes the manager's new requests and sleeps no longer than the manager's next deadline."""

    def poll(self, now: float) -> list[UnsentRequest]:
        """Requests to send now (the manager keeps track of what it has in flight)."""
        ...

    def next_deadline(self, now: float) -> float:
        """When the manager next has something to do without a response (``inf``: nothing)."""
        ...


class HoldsWaiters(Protocol):
    """A manager that application calls wait on: ``fail_all`` completes every waiter with ``error``
    (the consumer closed or its loop failed)."""

    def fail_all(self, error: BaseException) -> None: ...
