"""The Java client's classic assignors (``kafka-clients`` of the reference release) as a reference:
``JavaAssignors.java`` beside this file, compiled with ``javac`` against the jars
``asyncconsumer.testing`` downloads for its brokers, runs scenarios given as JSON lines.

    with JavaAssignors() as java:
        java.assign("range", {"t": [["a"], ["b"]]}, {"m1": {"topics": ["t"], "rack": "a"}})
        # -> {"m1": {TopicPartition("t", 0)}, ...}

Needs a JDK (``javac``); :func:`javac` says which, or None.  The compiled class is kept in the
package's cache directory (beside the jars), so only the first run pays for ``javac``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

from asyncconsumer.structs import TopicPartition
from asyncconsumer.testing.kafka import KAFKA_VERSION, cache_dir, find_java, kafka_libs

SOURCE = Path(__file__).with_name("JavaAssignors.java")


def javac() -> str | None:
    """The ``javac`` next to the ``java`` the brokers run with, else the one on PATH, else None."""
    try:
        java, _ = find_java()
    except Exception:
        return None
    beside = Path(java).with_name("javac")
    return str(beside) if beside.exists() else shutil.which("javac")


def compiled(libs: Path) -> Path:
    """The directory holding ``JavaAssignors.class``, compiled for this source and release if needed."""
    digest = hashlib.sha256(SOURCE.read_bytes() + KAFKA_VERSION.encode()).hexdigest()[:16]
    target = cache_dir() / f"java-assignors-{digest}"
    if not (target / "JavaAssignors.class").exists():
        compiler = javac()
        if compiler is None:
            raise RuntimeError("javac not found: the Java assignor reference needs a JDK")
        scratch = target.with_name(f"{target.name}.{id(target)}.tmp")
        scratch.mkdir(parents=True, exist_ok=True)
        subprocess.run([compiler, "-nowarn", "-d", str(scratch), "-cp", f"{libs}/*", str(SOURCE)],
                       check=True, capture_output=True, timeout=300)
        try:
            scratch.rename(target)
        except OSError:  # another process compiled it meanwhile
            shutil.rmtree(scratch, ignore_errors=True)
    return target


class JavaAssignors:
    """One JVM answering assignment scenarios, one line each (a JVM start is ~1 s: share it)."""

    def __init__(self) -> None:
        libs = kafka_libs()
        self._classpath = f"{compiled(libs)}:{libs}/*"
        java, _ = find_java()
        self._proc = subprocess.Popen(
            [java, "-Xmx256m", "-cp", self._classpath, "-Dlog4j2.level=OFF", "JavaAssignors"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    def assign(self, assignor: str, topics: dict[str, list[list[str | None]]],
               members: dict[str, dict[str, Any]]) -> dict[str, set[TopicPartition]]:
        """Java's assignment for one scenario (see ``JavaAssignors.java`` for the format)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"assignor": assignor, "topics": topics, "members": members}) + "\n")
        self._proc.stdin.flush()
        answer = json.loads(self._proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"Java's {assignor} assignor failed: {answer['error']}")
        return {member: {TopicPartition(t, p) for t, p in parts} for member, parts in answer.items()}

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> JavaAssignors:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
