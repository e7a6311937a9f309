"""Every code block of docs/getting-started.md runs as written, against the broker the page starts.

The page is read top to bottom and each fenced block is run by what it is:

- ``pip install ...``: the package is installed here already; the line must name this package.
- ``asyncconsumer broker ...``: started in the background, as written plus ``--kind`` (each kind
  once) and ``--port 0`` (a free port: 9092 may be taken on a shared machine); the address it
  prints replaces ``127.0.0.1:9092`` in every other block.
- any other shell block: run with bash; it must exit 0.
- a ``console`` block: a terminal session shown with its output (the web worker's endpoints asked
  with curl while it runs), not run here; tests/guides/test_examples.py runs that worker's code.
- a Python program (``asyncio.run(...)`` or ``trio.run(...)``): run as a script.  When a ``text``
  block follows it, that is its output: the program runs until it has printed as many lines
  (programs that read "for as long as the consumer runs" never end by themselves), is then stopped,
  and the lines must be the ones shown, in any order (two partitions are read side by side).
  Without one, it must end by itself with status 0.
- every other Python block is a snippet of the asyncio REPL (``python -m asyncio``: ``await`` at
  the top level), run in page order in one namespace, each within a few seconds.  A snippet whose
  top level is an ``async for`` over the consumer runs "for as long as the consumer runs": it is
  stopped after a few seconds, and anything it raised before counts.  A block defining an ASGI
  ``app`` (the web worker section) is then started and stopped with Starlette's TestClient.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT

pytestmark = pytest.mark.broker

PAGE = ROOT / "docs" / "getting-started.md"
ADDRESS = "127.0.0.1:9092"
#: Seconds a snippet may take (a loop over the consumer: how long it runs before it is stopped).
SNIPPET_SECONDS = 20.0
ENDLESS_SECONDS = 2.0


@dataclass
class Block:
    lang: str
    code: str
    line: int
    output: list[str] | None = None

    @property
    def kind(self) -> str:
        first = self.code.strip().split("\n", 1)[0]
        if self.lang == "console":
            return "shown"
        if self.lang == "sh":
            if first.startswith("pip install"):
                return "install"
            return "broker" if first.startswith("asyncconsumer broker") else "shell"
        if re.search(r"^(asyncio|trio)\.run\(", self.code, re.MULTILINE):
            return "program"
        return "snippet"


def page_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        lang, code = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        if lang == "text":
            assert blocks and blocks[-1].kind == "program", f"line {line}: an output block follows a program"
            blocks[-1].output = code.splitlines()
            continue
        assert lang in ("sh", "python", "console"), f"line {line}: a ```{lang} block (the test runs sh and python)"
        blocks.append(Block(lang, code, line))
    return blocks


@contextlib.contextmanager
def page_broker(block: Block, kind: str) -> Iterator[str]:
    args = shlex.split(block.code)
    # stderr with stdout, as a terminal shows them: progress comes before the address.
    proc = subprocess.Popen([*args, "--kind", kind, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, env=environment())
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Bootstrap server: "):
                break
        text = "".join(seen)
        match = re.search(r"^Bootstrap server: (\S+)$", text, re.MULTILINE)
        assert match, (text, proc.poll())
        # The JVM's start is slow and silent: the command says it began before the wait, not after.
        starting = text.find("Starting Apache Kafka ")
        assert (starting >= 0) == (kind == "kafka") and starting < text.index("Started "), text
        yield match.group(1)
        # Ctrl-C stops it cleanly and removes its data (Apache Kafka's directory; Tansu's is in memory).
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, proc.stdout.read()
        files = re.search(r"its files, in (\S+),", text)
        assert (files is not None) == (kind == "kafka"), text
        assert files is None or not Path(files.group(1)).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def environment() -> dict[str, str]:
    """The commands of this interpreter's environment first on PATH, output unbuffered."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1"}


def run_program(block: Block, code: str) -> None:
    if block.output is None:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env=environment())
        assert done.returncode == 0, f"line {block.line}: {done.stderr}"
        return
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environment())
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while len(printed) < len(block.output) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            printed.append(line.rstrip("\n"))
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert sorted(printed) == sorted(block.output), f"line {block.line}: printed {printed}; stderr: {err}"


def top_level_async_for(code: str) -> bool:
    tree = ast.parse(code)
    return any(isinstance(node, ast.AsyncFor) for node in tree.body)


async def run_snippets(snippets: list[tuple[Block, str]]) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        for block, code in snippets:
            before = namespace.get("app")
            compiled = compile(code, f"getting-started.md:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(compiled, namespace)
            if inspect.iscoroutine(result):
                endless = top_level_async_for(code)
                try:
                    await asyncio.wait_for(result, ENDLESS_SECONDS if endless else SNIPPET_SECONDS)
                except TimeoutError:
                    if not endless:
                        raise AssertionError(f"line {block.line}: the snippet did not finish") from None
            app = namespace.get("app")
            if app is not None and app is not before:
                await asyncio.to_thread(serve_briefly, app)
    finally:
        consumer = namespace.get("consumer")
        if consumer is not None:
            await consumer.close()


def serve_briefly(app: Any) -> None:
    from starlette.testclient import TestClient

    with TestClient(app):
        time.sleep(1.0)


def run_page(kind: str) -> None:
    blocks = page_blocks(PAGE.read_text())
    kinds = [b.kind for b in blocks]
    assert kinds[:4] == ["install", "broker", "shell", "program"], kinds  # install, broker, records, a consumer
    [broker_block] = [b for b in blocks if b.kind == "broker"]
    with page_broker(broker_block, kind) as bootstrap:
        snippets = []
        for block in blocks:
            code = block.code.replace(ADDRESS, bootstrap)
            if block.kind == "install":
                assert re.fullmatch(r"pip install asyncconsumer(\[[\w,]+\])?", code.strip()), code
            elif block.kind == "shell":
                done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60,
                                      env=environment())
                assert done.returncode == 0, f"line {block.line}: {done.stderr}"
            elif block.kind == "program":
                run_program(block, code)
            elif block.kind == "snippet":
                snippets.append((block, code))
        asyncio.run(run_snippets(snippets))


def test_the_page_runs_on_the_embedded_broker() -> None:
    run_page("embedded")


@pytest.mark.kafka_jvm
def test_the_page_runs_on_apache_kafka(apache_kafka: Any) -> None:
    """(``apache_kafka``: only where the suite runs Apache Kafka, so Java and the jars are there.)"""
    run_page("kafka")


def test_the_page_parser_sees_every_block() -> None:
    text = PAGE.read_text()
    fences = len(re.findall(r"^```", text, re.MULTILINE))
    blocks = page_blocks(text)
    outputs = sum(1 for b in blocks if b.output is not None)
    assert fences == 2 * (len(blocks) + outputs)
