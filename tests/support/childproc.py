"""Run Python code in a child process under an address-space limit.

A decoder that asks for gigabytes, or a library whose allocator aborts the
process when an allocation fails (SIGABRT), must fail the test, not take the
test runner down with it: the code runs in a fresh interpreter whose
``RLIMIT_AS`` is set (after its imports) and the parent looks at how it ended.

The child gets ``tests/`` on ``sys.path`` (so ``support.*`` imports work) and
the parent's environment plus ``extra_env``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent

#: The default limit: generous for a decoder working on fetch-sized data, far below gigabytes.
DEFAULT_LIMIT = 1 << 30

_PRELUDE = """\
import json, resource, sys
sys.path.insert(0, {tests!r})
"""

_LIMIT = """\
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
def emit(obj):
    sys.stdout.write("\\n@@RESULT@@" + json.dumps(obj) + "\\n")
    sys.stdout.flush()
"""


@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    result: Any  # what the child passed to emit(), None if it never did

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            return signal.Signals(-self.returncode).name
        return None

    def describe(self) -> str:
        how = f"killed by {self.signal_name}" if self.signal_name else f"exit code {self.returncode}"
        return f"child {how}\n--- stderr (tail) ---\n{self.stderr[-3000:]}"


def run_limited(
    setup: str,
    body: str,
    *,
    limit: int = DEFAULT_LIMIT,
    timeout: float = 120.0,
    extra_env: dict[str, str] | None = None,
) -> ChildResult:
    """Run ``setup`` (imports, unlimited), then ``body`` under ``RLIMIT_AS = limit``.

    ``body`` reports with ``emit(json_able)``; the last one emitted is ``result``.
    """
    code = (
        _PRELUDE.format(tests=str(TESTS))
        + textwrap.dedent(setup)
        + "\n"
        + _LIMIT.format(limit=int(limit))
        + textwrap.dedent(body)
    )
    env = dict(os.environ)
    env.update(extra_env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            result = json.loads(line[len("@@RESULT@@") :])
    return ChildResult(proc.returncode, proc.stdout, proc.stderr, result)
