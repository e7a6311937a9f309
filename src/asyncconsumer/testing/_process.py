"""Child processes of the test brokers: dying with the process that started them."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable


def parent_death_signal() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` making the kernel SIGTERM a broker if the process that started it dies.

    libc is loaded here, in the parent, so the forked child makes one plain call.  The signal fires
    when the *thread* that forked exits, so it is armed only from the main thread (a broker started
    from a worker thread, for example through ``anyio.to_thread``, must not die with that worker).
    ``None`` elsewhere: the caller then relies on stopping the broker by its pid.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return arm
