"""The clients under test: one command line per implementation of Kafka's verifiable tools.

A client is anything that takes the flags of Kafka's ``VerifiableConsumer`` (or
``VerifiableShareConsumer``) and prints their JSON events on stdout, one per line
(docs/kafkatest.md).  Three are known:

- ``java``: Kafka's own tools, run from the jars ``asyncconsumer.testing.kafka.kafka_libs()``
  downloads (the same release as the test brokers).  They calibrate the driver: a scenario that
  Java fails is a driver bug.
- ``asyncconsumer-asyncio`` and ``asyncconsumer-trio``: ``python -m asyncconsumer
  verifiable-consumer <the same flags> --runtime asyncio|trio``.

The producer is always Kafka's own ``VerifiableProducer`` (an independent client writes the data).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from asyncconsumer.testing.kafka import find_java, kafka_libs

Tool = Literal["consumer", "share-consumer", "producer"]

#: Kafka's classes for each tool (org.apache.kafka.tools).
JAVA_CLASSES: dict[Tool, str] = {
    "consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "share-consumer": "org.apache.kafka.tools.VerifiableShareConsumer",
    "producer": "org.apache.kafka.tools.VerifiableProducer",
}
#: asyncconsumer's subcommand for each tool it implements.
SUBCOMMANDS: dict[Tool, str] = {"consumer": "verifiable-consumer", "share-consumer": "verifiable-share-consumer"}
#: Heap of each tool's JVM (kafka-run-class.sh gives them 512 MB; 256 is plenty for these topics and
#: leaves room for nine JVMs on the test machine).
JAVA_HEAP_MB = 256

#: Log4j 2 for the Java tools: everything at ``kafkatest.log.level`` to the file named by the
#: ``kafkatest.log.file`` system property, nothing to stdout (stdout carries only the JSON events).
LOG4J2 = """\
status = error
name = kafkatest-client
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafkatest.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ${sys:kafkatest.log.level:-INFO}
rootLogger.appenderRef.file.ref = FILE
"""


#: A source tree (its ``src`` directory) to run the asyncconsumer clients from instead of the installed
#: package, for instance another branch's worktree: ``KAFKATEST_ASYNCCONSUMER_SRC=/path/to/src``.
#: Only the client processes use it; the driver and the brokers stay this checkout's.
SOURCE_ENV = "KAFKATEST_ASYNCCONSUMER_SRC"


def _asyncconsumer_environment() -> dict[str, str]:
    env = dict(os.environ)
    source = env.get(SOURCE_ENV)
    if source:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    return env


class ClientUnavailable(RuntimeError):
    """The client cannot run the tool (asyncconsumer without the subcommand, say); the message says why."""


@dataclass(frozen=True)
class Client:
    """One implementation of the verifiable tools; ``name`` is its test id."""

    name: str
    #: ``"java"`` or ``"asyncconsumer"``.
    kind: Literal["java", "asyncconsumer"]
    #: The anyio backend of an asyncconsumer client (``--runtime``).
    runtime: str | None = None

    def __str__(self) -> str:
        return self.name

    def command(self, tool: Tool, args: list[str], *, log_file: Path, log_level: str = "INFO") -> list[str]:
        """The command line running ``tool`` with ``args`` (the flags of Kafka's tool)."""
        if self.kind == "java" or tool == "producer":
            return java_command(JAVA_CLASSES[tool], args, log_file=log_file, log_level=log_level)
        assert self.runtime is not None
        return [sys.executable, "-m", "asyncconsumer", SUBCOMMANDS[tool], *args, "--runtime", self.runtime]

    def environment(self, *, log_dir: Path) -> dict[str, str]:
        """The environment kafkatest gives a client: ``LOG_DIR`` (and empty ``KAFKA_OPTS``)."""
        env = _asyncconsumer_environment() if self.kind == "asyncconsumer" else dict(os.environ)
        env.update(LOG_DIR=str(log_dir), KAFKA_OPTS="")
        return env

    def check(self, tool: Tool) -> None:
        """Raise :class:`ClientUnavailable` if this client cannot run ``tool``."""
        if self.kind == "asyncconsumer":
            _check_subcommand(SUBCOMMANDS[tool])

    def supports(self, tool: Tool, flag: str) -> bool:
        """Whether ``tool``'s usage lists ``flag`` (``--close-timeout`` is new in Kafka 4.4's tools)."""
        return flag in _usage(self, tool)


JAVA = Client("java", "java")
ASYNCCONSUMER_ASYNCIO = Client("asyncconsumer-asyncio", "asyncconsumer", "asyncio")
ASYNCCONSUMER_TRIO = Client("asyncconsumer-trio", "asyncconsumer", "trio")
CLIENTS: dict[str, Client] = {c.name: c for c in (JAVA, ASYNCCONSUMER_ASYNCIO, ASYNCCONSUMER_TRIO)}


def java_command(main_class: str, args: list[str], *, log_file: Path | None, log_level: str = "INFO") -> list[str]:
    """``java ... main_class args`` from Kafka's jars; its log goes to ``log_file`` (a
    ``log4j2.properties`` is written beside it), or to Log4j's default (errors on stderr) if None."""
    java, _ = find_java()
    logging: list[str] = []
    if log_file is not None:
        config = log_file.parent / "log4j2.properties"
        if not config.exists():
            config.write_text(LOG4J2)
        logging = [f"-Dlog4j2.configurationFile={config}", f"-Dkafkatest.log.file={log_file}",
                   f"-Dkafkatest.log.level={log_level}"]
    return [
        java, f"-Xmx{JAVA_HEAP_MB}m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true", *logging, "-cp", str(kafka_libs() / "*"), main_class, *args,
    ]


def _check_subcommand(subcommand: str) -> None:
    problem = _subcommand_problem(subcommand)
    if problem:
        raise ClientUnavailable(problem)


@functools.cache
def _subcommand_problem(subcommand: str) -> str:
    """Why ``python -m asyncconsumer <subcommand>`` cannot run ("" if it can); asked once per run."""
    command = [sys.executable, "-m", "asyncconsumer", subcommand, "--help"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                                env=_asyncconsumer_environment())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{' '.join(command[1:])}` could not run: {exc}"
    if "--bootstrap-server" not in result.stdout:  # the usage, on stdout (Kafka's tools exit 1 after -h)
        said = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return (f"asyncconsumer has no working `{subcommand}` command: `python -m asyncconsumer {subcommand} --help` "
                f"exited {result.returncode}: {' | '.join(said)}")
    return ""


@functools.cache
def _usage(client: Client, tool: Tool) -> str:
    """The tool's help text (Kafka's tools print it for no arguments; asyncconsumer's for --help)."""
    if client.kind == "java" or tool == "producer":
        command = java_command(JAVA_CLASSES[tool], [], log_file=None)
    else:
        client.check(tool)
        command = [sys.executable, "-m", "asyncconsumer", SUBCOMMANDS[tool], "--help"]
    env = _asyncconsumer_environment() if client.kind == "asyncconsumer" else None
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    return result.stdout + result.stderr
