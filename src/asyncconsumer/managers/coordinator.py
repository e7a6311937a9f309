"""Finds the group coordinator (FindCoordinator) and forgets it on errors.

The coordinator gets its own connection id (``COORDINATOR_NODE_BASE - id``),
as in the Java client, so group traffic never queues behind a long fetch on
the same socket.

An answer that retrying cannot fix (GROUP_AUTHORIZATION_FAILED, INVALID_GROUP_ID:
a non-retriable broker error) goes to ``on_fatal`` each time, as the Java client
raises ``GroupAuthorizationException`` from every ``poll()``/``commitSync()``/
``committed()`` meanwhile; the lookup is still tried again, less and less often
(up to once a second), so an ACL granted later is picked up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import BrokerResponseError, KafkaError, error_for_code
from .requests import Body, UnsentRequest

log = logging.getLogger("asyncconsumer.coordinator")

COORDINATOR_NODE_BASE = 2**31 - 1
#: The longest pause between lookups that keep failing for good (seconds).
FATAL_RETRY_MAX = 1.0


class CoordinatorManager:
    def __init__(
        self,
        group_id: str,
        *,
        retry_backoff: float,
        register_node: Callable[[int, str, int], None],
        on_fatal: Callable[[KafkaError], None] | None = None,
    ) -> None:
        self.group_id = group_id
        self._on_fatal = on_fatal
        self._fatal_streak = 0
        self.node_id: int | None = None
        self._retry_backoff = retry_backoff
        self._register_node = register_node
        self._in_flight = False
        self._retry_at = 0.0
        self.last_error: KafkaError | None = None

    def mark_unknown(self, now: float, reason: object = "") -> None:
        if self.node_id is not None:
            log.info("group coordinator for %r lost (%s); rediscovering", self.group_id, reason)
        self.node_id = None

    def next_deadline(self, now: float) -> float:
        if self.node_id is not None or self._in_flight:
            return float("inf")
        return max(now, self._retry_at)

    def poll(self, now: float) -> list[UnsentRequest]:
        if self.node_id is not None or self._in_flight or now < self._retry_at:
            return []
        self._in_flight = True

        def build(version: int) -> Body:
            if version >= 4:
                return {"key_type": 0, "coordinator_keys": [self.group_id]}
            return {"key": self.group_id, "key_type": 0}

        return [UnsentRequest("FindCoordinator", build, self._on_response, self._on_error)]

    def _on_response(self, now: float, version: int, body: Body) -> None:
        self._in_flight = False
        entry = body["coordinators"][0] if version >= 4 else body
        if entry["error_code"]:
            self._on_error(now, error_for_code(entry["error_code"], entry.get("error_message")))
            return
        self.node_id = COORDINATOR_NODE_BASE - entry["node_id"]
        self._register_node(self.node_id, entry["host"], entry["port"])
        self.last_error = None
        self._fatal_streak = 0
        log.debug(
            "group %r coordinator is node %s at %s:%s", self.group_id, entry["node_id"], entry["host"], entry["port"]
        )

    def _on_error(self, now: float, error: BaseException) -> None:
        self._in_flight = False
        self._retry_at = now + self._retry_backoff
        self.last_error = error if isinstance(error, KafkaError) else KafkaError(repr(error))
        log.debug("FindCoordinator for %r failed: %s", self.group_id, error)
        if isinstance(error, BrokerResponseError) and not error.retriable and self._on_fatal is not None:
            self._retry_at = now + min(max(self._retry_backoff, FATAL_RETRY_MAX),
                                       self._retry_backoff * 2 ** min(self._fatal_streak, 16))
            self._fatal_streak += 1
            self._on_fatal(error)
