"""Rate-limited warnings: a condition that repeats (a broker that keeps failing) is logged once per
interval per key, and the next message says how many were left out meanwhile.

The loggers are one hierarchy under ``asyncconsumer`` (docs/metrics.md#logging): ``.consumer``,
``.engine``, ``.network``, ``.connection``, ``.fetch``, ``.offsets``, ``.validation``, ``.metadata``,
``.coordinator``, ``.membership``, ``.commit``, ``.spark``, ``.share``, ``.decoder``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

#: How often one repeated warning is logged at most, in seconds.
WARNING_INTERVAL = 60.0


class RateLimitedWarnings:
    """``warning(key, msg, *args)`` (or ``error``): logged at most once per ``interval`` seconds for
    each ``key``."""

    def __init__(self, logger: logging.Logger, interval: float = WARNING_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        #: key -> (when last logged, how many left out since)
        self._last: dict[Hashable, tuple[float, int]] = {}

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        """Log unless this key was logged less than ``interval`` ago; True when logged."""
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: Hashable, msg: str, *args: object) -> bool:
        """As :meth:`warning`, at ERROR level."""
        return self.log(logging.ERROR, key, msg, *args)

    def log(self, level: int, key: Hashable, msg: str, *args: object) -> bool:
        """Log at ``level`` unless this key was logged less than ``interval`` ago; True when logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            msg += " (%d more like it in the last %.0fs not logged)"
            args = (*args, last[1], now - last[0])
        self._last[key] = (now, 0)
        self._logger.log(level, msg, *args)
        return True


__all__ = ["WARNING_INTERVAL", "RateLimitedWarnings"]
