"""CPU pressure made on purpose: busy loops of our own, started and stopped by their pids.

    with cpu_pressure():        # ASYNCCONSUMER_CPU_PRESSURE busy processes (default 0: none)
        ...

A consumer lives on machines busy with other work (containers sharing cores, noisy neighbours);
the chaos tests run under such pressure with ``ASYNCCONSUMER_CPU_PRESSURE=N`` (``./dev nox -s
chaos`` does it for several seeds).  Each busy process spins in Python at normal priority; it dies
with the test process (``PR_SET_PDEATHSIG``) and is killed by its pid on the way out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from asyncconsumer.testing._process import parent_death_signal

ENV = "ASYNCCONSUMER_CPU_PRESSURE"


def pressure_from_env() -> int:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0
    count = int(raw)
    if count < 0:
        raise ValueError(f"{ENV} must be a number of busy processes >= 0, not {raw!r}")
    return count


@contextlib.contextmanager
def cpu_pressure(processes: int | None = None) -> Iterator[list[int]]:
    """``processes`` busy loops (default: ``ASYNCCONSUMER_CPU_PRESSURE``) while the block runs;
    yields their pids."""
    count = pressure_from_env() if processes is None else processes
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                         preexec_fn=parent_death_signal())
        for _ in range(count)
    ]
    try:
        yield [p.pid for p in busy]
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
