"""No silent stalls, the event loop's side: a blocked loop is named in a WARNING with what it risked.

The consumer's background loop (heartbeats, fetches, commits) is a task on the application's own
event loop: that is the design, and it means that application code which does not yield (a
synchronous call in the ``async for`` body, ``time.sleep``, CPU-bound work) stops it too.  Nothing
fails at the time; seconds later the group coordinator drops the member (no heartbeat for
``session_timeout_ms``), a request times out, or a share group's records go back to the broker, and
nothing in the log pointed at the cause.

The loop knows when it means to run next: each turn it sleeps until the earliest deadline of its
managers (at most a second), or yields and expects to run again at once.  It tells the watch
(:attr:`LoopLagWatch.due`), and at the start of the next turn reports when it did run
(:meth:`LoopLagWatch.ran`): the difference is the *lag*, how late the loop was.  A turn woken early
by an event counts as on time.  That is a subtraction and a comparison a turn, so the watch is on by
default.

A lag of ``warn_after`` or more (``ConsumerConfig.loop_lag_warning_ms``, 1 s by default) is a
*block*: counted, and named in one WARNING that says how long the loop was blocked, which deadline
that put at risk and what to do.  The deadlines come from the loop (:class:`Deadline`: the option,
its length, what happens past it), asked only when there is a block: the session timeout and the
heartbeat interval of a group member, ``max_poll_interval_ms``, a share group's acquisition lock,
``request_timeout_ms``.  The WARNING names those the block outlasted, the worst first, and how much
of the next one it used.  It is rate-limited per worst deadline (``_logging.RateLimitedWarnings``):
a block that outlasts a longer deadline than the last one is named at once, the same again at most
once a minute.  Sans-I/O: the caller passes the times; the gauges (:attr:`lag`, :attr:`max_lag`,
:attr:`blocks`, :attr:`blocked_seconds`) are read by ``Consumer.metrics()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._logging import RateLimitedWarnings

#: What to do about it, in every WARNING.
ADVICE = (
    "something on the event loop did not yield for that long (a synchronous call, time.sleep, CPU-bound work "
    "in the application), so the consumer's background loop (heartbeats, fetches, commits) could not run: "
    "run blocking work in a thread (await anyio.to_thread.run_sync(fn, *args); asyncio: asyncio.to_thread) "
    "or make it async"
)


@dataclass(frozen=True, slots=True)
class Deadline:
    """A deadline a blocked loop puts at risk."""

    #: The option or setting, as the WARNING names it (``"session_timeout_ms=45000"``).
    name: str
    #: Its length in seconds.
    seconds: float
    #: What happens when the loop is blocked for longer.
    consequence: str


class LoopLagWatch:
    __slots__ = ("_deadlines", "_now", "_warnings", "block_at", "blocked_seconds", "blocks", "due", "lag", "max_lag")

    def __init__(
        self,
        *,
        warn_after: float | None,
        deadlines: Callable[[], Sequence[Deadline]],
        log: logging.Logger,
    ) -> None:
        if warn_after is not None and not warn_after > 0:
            raise ValueError(f"warn_after must be > 0 or None, got {warn_after!r}")
        #: The lag that is a block (counted, warned about); ``inf``: none is.
        self.block_at = warn_after if warn_after is not None else float("inf")
        self._deadlines = deadlines
        self._now = 0.0
        self._warnings = RateLimitedWarnings(log, clock=lambda: self._now)
        #: When the loop means to run next (set by the loop before it sleeps or yields).
        self.due = float("inf")
        #: How late the loop's latest turn was, in seconds (0: on time, or woken early).
        self.lag = 0.0
        #: The largest lag so far.
        self.max_lag = 0.0
        #: Lags of ``block_at`` or more, and their total in seconds.
        self.blocks = 0
        self.blocked_seconds = 0.0

    def ran(self, now: float) -> None:
        """The loop runs a turn at ``now``; it meant to at :attr:`due` at the latest."""
        lag = now - self.due
        if lag <= 0.0:
            self.lag = 0.0
            return
        self.lag = lag
        if lag > self.max_lag:
            self.max_lag = lag
        if lag >= self.block_at:
            self._blocked(lag, now)

    def _blocked(self, lag: float, now: float) -> None:
        self.blocks += 1
        self.blocked_seconds += lag
        self._now = now
        outlasted, ahead = at_risk(lag, self._deadlines())
        self._warnings.warning(outlasted[0].name if outlasted else None,
                               "the event loop was blocked for %.1fs%s; %s", lag, describe(lag, outlasted, ahead),
                               ADVICE)


def at_risk(lag: float, deadlines: Sequence[Deadline]) -> tuple[list[Deadline], Deadline | None]:
    """The deadlines a block of ``lag`` seconds outlasted (the longest first), and the shortest it
    did not."""
    outlasted = sorted((d for d in deadlines if lag >= d.seconds), key=lambda d: d.seconds, reverse=True)
    ahead = min((d for d in deadlines if lag < d.seconds), key=lambda d: d.seconds, default=None)
    return outlasted, ahead


def describe(lag: float, outlasted: Sequence[Deadline], ahead: Deadline | None) -> str:
    """``", past X (what happens) and Y; 40% of Z (what happens past it)"``."""
    parts = []
    if outlasted:
        worst, *others = outlasted
        also = "".join(f" and {d.name}" for d in others)
        parts.append(f", past {worst.name} ({worst.consequence}){also}")
    if ahead is not None:
        parts.append(f"{';' if outlasted else ','} {lag / ahead.seconds:.0%} of {ahead.name} ({ahead.consequence})")
    return "".join(parts)


__all__ = ["ADVICE", "Deadline", "LoopLagWatch", "at_risk", "describe"]
