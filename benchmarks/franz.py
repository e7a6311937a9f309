"""The franz-go row: a small Go program (benchmarks/go/franz) reading with ``kgo``'s defaults.

franz-go is a pure-Go Kafka client; its reader here is built from the repository's own source
(``main.go``, with ``go.mod``/``go.sum`` pinning franz-go and its dependencies) by the machine's Go
toolchain and the Go module proxy, once per source version, into the user cache directory
(``<cache>/bench-franz-<hash>/franz``, the cache of ``asyncconsumer.testing``'s jars).  Where the
build cannot run (no ``go``, no module proxy, an older toolchain than go.mod asks for) the row is
left out and the report says why.

It reads as the Python readers do (benchmarks/clients.py): every partition assigned from the
beginning, no consumer group, every record touched (key and value lengths added up), wall time
from creating the client to the last record.  Like ConsumerPerformance's detailed stats
(benchmarks/steady.py), it also reports the records/s of every interval of at least 500 ms from
its first record on, and its **warm** rate, the median of its last three intervals: what a
long-running franz-go consumer reads once its buffers and connections are up (Go has no JIT, so
this is mostly the start-up left out).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .datasets import Dataset

CLIENT = "franz-go"
LABEL = "franz-go (Go, `kgo` defaults)"
WARM_LABEL = "franz-go, warm (last 3 intervals)"
SOURCE = Path(__file__).resolve().parent / "go" / "franz"
_FILES = ("main.go", "go.mod", "go.sum")
_built: dict[Path, str | None] = {}


def _target() -> Path:
    from asyncconsumer.testing.kafka import cache_dir

    digest = hashlib.sha256(b"".join((SOURCE / name).read_bytes() for name in _FILES)).hexdigest()[:12]
    return cache_dir() / f"bench-franz-{digest}" / "franz"


def build() -> tuple[Path | None, str | None]:
    """The built reader, building it first if its source changed: (path, None), or (None, why not)."""
    target = _target()
    if target in _built:
        why = _built[target]
        return (None, why) if why else (target, None)
    why = None
    go = shutil.which("go")
    if go is None:
        why = "franz-go skipped: no Go toolchain (`go`) on PATH to build benchmarks/go/franz"
    elif not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        try:
            proc = subprocess.run([go, "build", "-o", str(partial), "."], cwd=SOURCE, env=env,
                                  capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            why = "franz-go skipped: `go build` of benchmarks/go/franz took over 600 s"
        else:
            if proc.returncode != 0:
                tail = " ".join(proc.stderr.strip().splitlines()[-3:])
                why = f"franz-go skipped: `go build` of benchmarks/go/franz failed: {tail[-300:]}"
            else:
                partial.replace(target)
    _built[target] = why
    return (None, why) if why else (target, None)


def missing() -> str | None:
    """Why the franz-go row cannot run here, or None (builds the reader if needed)."""
    return build()[1]


def version() -> str:
    path, _ = build()
    if path is None:
        return "franz-go"
    out = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True, timeout=30, check=False)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "dep" and parts[1] == "github.com/twmb/franz-go":
            return f"franz-go {parts[2]}"
    return "franz-go"


def command(mode: str, *args: str) -> list[str]:
    """The reader's command line (``mode``: "read" or "latency")."""
    path, why = build()
    if path is None:
        raise RuntimeError(why)
    return [str(path), mode, *args]


def run(bootstrap: str, dataset: Dataset, timeout: float, count: int | None = None) -> dict[str, Any]:
    """One read of ``dataset`` by franz-go; a result like the Python readers' (and its intervals)."""
    want = count or dataset.records
    result: dict[str, Any] = {"client": CLIENT, "topic": dataset.topic, "expected": want, "first_record_s": None,
                              "error": missing()}
    if result["error"]:
        return result
    args = ("--bootstrap", bootstrap, "--topic", dataset.topic, "--partitions", str(dataset.partitions),
            "--count", str(want), "--timeout", str(timeout))
    try:
        proc = subprocess.run(command("read", *args), capture_output=True, text=True, timeout=timeout + 30,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        result["error"] = f"timed out after {timeout + 30:.0f}s"
        return result
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    stderr = proc.stderr
    if not lines:
        result["error"] = f"exit {proc.returncode}, no result; stderr: {stderr.strip()[-400:]}"
        return result
    result.update(json.loads(lines[-1]))
    return result
