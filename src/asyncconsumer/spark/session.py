"""A consumer kept on an event loop of its own, and the consumers the source makes.

Spark calls the source synchronously, from threads that have no event loop.  A
:class:`ConsumerSession` runs a :class:`~asyncconsumer.Consumer` on a daemon thread's event loop
(a blocking portal) and each call's work there, so the driver's planner and an executor's reads keep
their connections across calls.  :func:`source_consumer` is the consumer both roles start from (no
group, no offset reset, short fetch waits); :func:`timed` is the debug timing every call site logs.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from ..consumer import Consumer
from .options import SourceOptions

log = logging.getLogger("asyncconsumer.spark")

T = TypeVar("T")

#: The driver's and the executors' ``fetch.max.wait.ms`` at most (ms): an executor's range ends
#: below the end of the log, so it never wants a fetch to wait there.
_FETCH_WAIT_MS = 5


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Log ``what`` and its duration at DEBUG on ``asyncconsumer.spark`` (``timing: <what> <s>``).

    Where a streaming query's time goes (driver calls, each task's consumer start, first batch and
    read); nothing is measured unless DEBUG is on for the logger.
    """
    if not log.isEnabledFor(logging.DEBUG):
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        log.debug("timing: %s %.3f s", what, time.perf_counter() - began)


def source_consumer(options: SourceOptions, role: str, **settings: Any) -> Consumer[Any, Any]:
    """A consumer of the driver or an executor (``role``): no group, no offset reset, and fetches
    that wait at most ``_FETCH_WAIT_MS``.  Not 0: Tansu answers a Fetch that may not wait with no
    partition data (no high watermark)."""
    props = options.consumer_properties
    base: dict[str, Any] = {"auto_offset_reset": "none", "enable_auto_commit": False, "group_id": None}
    if "client.id" not in props:
        base["client_id"] = f"asyncconsumer-spark-{role}"
    base["fetch_max_wait_ms"] = min(_FETCH_WAIT_MS, int(props.get("fetch.max.wait.ms", "500")))
    return Consumer.from_properties(props, **{**base, **settings})


class ConsumerSession:
    """A consumer on an event loop of its own, kept across calls: the driver's offset planning for
    a whole streaming query, an executor's reads for the tasks of one Python worker.

    Spark calls a stream reader's driver methods (``initialOffset``, ``latestOffset``,
    ``partitions``, ``commit``) one after another in one long-lived Python worker, each one
    synchronously, and an executor's Python worker runs its tasks one after another.  Rather than
    a consumer per call (connections, ApiVersions and metadata every time), the session starts
    ``make()``'s consumer on an event loop of its own (a blocking portal thread) on first use and
    runs each call's work there.  Each driver lookup still asks Kafka afresh: ``partitions``/``topics``
    fetch new metadata every time, so new topics and partitions are seen.  A call that fails closes
    the session (the next one starts a new consumer: nothing half-done is kept); :meth:`close` ends
    it, and the stream reader's ``stop()`` calls that when the query stops.
    """

    def __init__(self, make: Callable[[], contextlib.AbstractAsyncContextManager[Consumer[Any, Any]]]) -> None:
        self._make = make
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._consumer: Consumer[Any, Any] | None = None
        #: Consumers started so far (one for a whole query unless a call failed).
        self.starts = 0

    @property
    def started(self) -> bool:
        """Whether the session's consumer is running now."""
        return self._consumer is not None

    def run(self, work: Callable[[Consumer[Any, Any]], Awaitable[T]]) -> T:
        """``work(consumer)`` on the session's event loop; its result, or its error (the session is closed then)."""
        if self._portal is None or self._consumer is None:
            self._start()
        assert self._portal is not None and self._consumer is not None
        try:
            return self._portal.call(work, self._consumer)
        except BaseException:
            self.close()
            raise

    @timed("consumer start (event loop, connection, metadata)")
    def _start(self) -> None:
        stack = contextlib.ExitStack()
        try:
            portal = stack.enter_context(_daemon_portal())
            consumer = stack.enter_context(portal.wrap_async_context_manager(self._make()))
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal, self._consumer = stack, portal, consumer
        self.starts += 1

    def close(self) -> None:
        """Close the consumer and stop its event loop; harmless when not started or closed already."""
        stack, self._stack, self._portal, self._consumer = self._stack, None, None, None
        if stack is None:
            return
        try:
            stack.close()
        except Exception as exc:  # closing must not fail the query's shutdown
            log.warning("asyncconsumer source: closing the driver's consumer failed: %s", exc)


@contextlib.contextmanager
def _daemon_portal() -> Iterator[BlockingPortal]:
    """A blocking portal whose event loop runs in a daemon thread: a session the query never stopped
    (Spark's worker exiting, a test dropping a reader) must not keep the interpreter from exiting,
    as ``start_blocking_portal``'s pool thread would."""
    handed: queue.Queue[BlockingPortal | BaseException] = queue.Queue(1)

    async def serve() -> None:
        async with BlockingPortal() as portal:
            handed.put(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:  # handed over when it failed before the portal existed
            if handed.empty():
                handed.put(exc)

    thread = threading.Thread(target=run, name="asyncconsumer-spark-driver", daemon=True)
    thread.start()
    got = handed.get()
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        got.call(got.stop)
        thread.join()
