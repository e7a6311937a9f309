"""Run ``asyncconsumer verifiable-consumer`` (or Java's VerifiableConsumer) as a process and read its
JSON events as they come, the way kafkatest's services do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

Event = dict[str, Any]


class Tool:
    """A running verifiable tool: its stdout parsed line by line into :attr:`events` (lines that are
    not JSON go to :attr:`other_lines`), its stderr kept whole."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.command = list(command)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, encoding="utf-8", env={**os.environ, **(env or {})},
        )
        self.events: list[Event] = []
        self.raw_lines: list[str] = []
        self.other_lines: list[str] = []
        self._stderr: list[str] = []
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self._changed:
                self.raw_lines.append(line)
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.other_lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def names(self) -> list[str]:
        with self._changed:
            return [e["name"] for e in self.events]

    def wait_for(
        self, predicate: Callable[[Event], bool], timeout: float = 60.0, what: str = "an event", start: int = 0
    ) -> Event:
        """The first event from index ``start`` on that satisfies ``predicate``; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events[start:]:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    raise AssertionError(f"no {what} within {timeout}s; events: {self.names()}\n{self.describe()}")
                self._changed.wait(min(left, 0.5))

    def wait_for_name(self, name: str, timeout: float = 60.0, start: int = 0) -> Event:
        """The first ``name`` event at index ``start`` or later."""
        return self.wait_for(lambda event: event["name"] == name, timeout, name, start)

    def count(self, name: str) -> int:
        return self.names().count(name)

    def signal(self, signum: int = signal.SIGTERM) -> float:
        """Send ``signum``; returns when (monotonic)."""
        self.proc.send_signal(signum)
        return time.monotonic()

    def wait(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s\n{self.describe()}") from None
        for thread in self._threads:
            thread.join(10)
        return code

    def stop(self) -> None:
        """Kill it if it still runs (test clean-up)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for thread in self._threads:
            thread.join(10)

    def describe(self) -> str:
        return f"command: {' '.join(self.command)}\n--- stderr (tail) ---\n{self.stderr[-3000:]}"

    def __enter__(self) -> Tool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ours(tool: str, *args: str) -> list[str]:
    """The command line of asyncconsumer's ``tool`` (``verifiable-consumer``, ...)."""
    return [sys.executable, "-m", "asyncconsumer", tool, *args]


def run(command: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )


def events_of(command: Sequence[str], timeout: float = 120.0) -> tuple[list[Event], str]:
    """Run a tool to its end (status 0): its events (every stdout line must be one) and its stdout."""
    result = run(command, timeout)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stderr[-3000:]}"
    return [json.loads(line) for line in result.stdout.splitlines()], result.stdout


def key_shape(value: Any) -> Any:
    """An event's keys in order, recursively (lists by their first element): its shape, not its values."""
    if isinstance(value, dict):
        return tuple((key, key_shape(item)) for key, item in value.items())
    if isinstance(value, list):
        return ("list", key_shape(value[0])) if value else ("list",)
    return type(value).__name__


def per_partition_runs(events: Sequence[Event]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """``records_consumed``'s (minOffset, maxOffset) per partition, in order."""
    runs: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for event in events:
        if event["name"] == "records_consumed":
            for p in event["partitions"]:
                runs.setdefault((p["topic"], p["partition"]), []).append((p["minOffset"], p["maxOffset"]))
    return runs


def assert_contiguous(runs: list[tuple[int, int]], start: int = 0) -> int:
    """Each run starts right after the previous one (kafkatest's check); returns the next offset."""
    expected = start
    for low, high in runs:
        assert low == expected, f"a batch starts at {low}, the one before ended at {expected - 1}: {runs}"
        assert high >= low, runs
        expected = high + 1
    return expected


__all__ = ["Event", "Tool", "assert_contiguous", "events_of", "key_shape", "ours", "per_partition_runs", "run"]
