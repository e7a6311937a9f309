"""The body of ``asyncconsumer broker``: a local broker for trying things, in the foreground.

It starts Apache Kafka (:class:`~asyncconsumer.testing.KafkaBroker`, one KRaft node with a
PLAINTEXT listener, from Kafka's jars) where Java 17 or newer is found, else the embedded Tansu
broker (:class:`~asyncconsumer.testing.EmbeddedBroker`), and says which one and, for Tansu, what
it lacks.  It listens on ``127.0.0.1``: on port 9092 unless that is taken (then on a free port, and
it says so) or ``--port`` names another; ``--port`` with a taken port is an error.  A free port is
one the broker leases below the kernel's ephemeral range (``asyncconsumer.testing.ports``), so no
outgoing connection can take it before the broker binds it.  Topics named
with ``--topic NAME[:PARTITIONS]`` are created before the address is printed.  Ctrl-C or SIGTERM
stops the broker process by its pid and removes its files (Tansu keeps its data in memory).

``--listener SSL|SASL_PLAINTEXT|SASL_SSL`` (Apache Kafka only) adds that listener on a free port,
for trying a secured connection: TLS with a throw-away CA, SASL with PLAIN and SCRAM for the users
of ``--user NAME:PASSWORD`` (else one user, ``client``, with a random password).  No password is
printed: each listener's client settings, the password among them, go to a Java properties file
readable by the owner only (``--command-config`` of our tools and of Kafka's own 4.x tools),
whose path is printed; it goes with the broker's other files.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import IO, Protocol

import anyio

from ..config import SecurityProtocol as Listener
from ..testing import EmbeddedBroker, EmbeddedBrokerError, JavaNotFoundError, KafkaBroker, KafkaDownloadError
from ..testing.kafka import MIN_JAVA, find_java, kafka_libs
from ..testing.ports import port_free
from ._client import ProduceClient

DEFAULT_PORT = 9092
LOOPBACK = "127.0.0.1"
#: The listeners ``--listener`` may add (PLAINTEXT is always there).
SECURED_LISTENERS: tuple[Listener, ...] = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The SASL user when no ``--user`` is given (its password is random, written to the properties file).
DEFAULT_USER = "client"
#: The mechanism the properties files name (the broker takes PLAIN and SCRAM-SHA-256/512 alike).
SASL_MECHANISM = "SCRAM-SHA-512"

#: What the embedded broker lacks, as ``asyncconsumer broker`` says it (docs/testing.md has the list).
TANSU_LACKS = (
    "It is not Apache Kafka: no transactions, KIP-848 or share groups, no SASL, offsets_for_times() "
    "answers 0, and a consumer group's join waits session_timeout_ms / 2 (22.5 s by default; "
    "session_timeout_ms=6000 makes it 3 s)."
)


class BrokerCommandError(Exception):
    """Why no broker could be started (one line for the user)."""


class _Running(Protocol):
    @property
    def bootstrap(self) -> str: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int

    @classmethod
    def parse(cls, text: str) -> TopicSpec:
        name, sep, count = text.rpartition(":")
        if not sep:
            name, count = text, "1"
        if not name or not count.isdigit() or int(count) < 1:
            raise ValueError(f"{text!r} is not NAME or NAME:PARTITIONS (partitions a number >= 1)")
        return cls(name, int(count))


#: What a ``--user`` name may hold: the broker's PLAIN user list (a JAAS line) takes it unquoted.
_USER_NAME = re.compile(r"[A-Za-z0-9._@+-]+")
#: And a password: printable ASCII (Kafka's tools read a properties file as ISO-8859-1), without
#: what the JAAS lines and the storage tool's SCRAM credential list (``[name=...,password=...]``)
#: cannot carry.
_PASSWORD = re.compile(r"[\x21-\x7e]+")
_NOT_IN_PASSWORD = frozenset("\"',=[\\]")


def parse_user(text: str) -> tuple[str, str]:
    """``NAME:PASSWORD`` (the password may hold colons); the error never repeats ``text``."""
    name, sep, password = text.partition(":")
    if not sep or not name or not password:
        raise ValueError("a user is NAME:PASSWORD, both not empty")
    if not _USER_NAME.fullmatch(name):
        raise ValueError("a user's name may hold letters, digits and . _ @ + - only")
    if not _PASSWORD.fullmatch(password) or not _NOT_IN_PASSWORD.isdisjoint(password):
        raise ValueError("a user's password may hold printable ASCII only, without spaces, quotes, backslashes "
                         "or any of , = [ ]")
    return name, password


def choose_port(port: int | None) -> int | None:
    """``port`` if given (taken: an error); else 9092 if it is free.  None: a free port, which the
    broker leases itself (``--port 0``, or 9092 taken)."""
    if port is not None:
        if port and not port_free(port):
            raise BrokerCommandError(f"port {port} on {LOOPBACK} is in use (another broker?): choose another --port")
        return port or None
    return DEFAULT_PORT if port_free(DEFAULT_PORT) else None


class _Stop(Exception):
    """Raised in the main thread by SIGINT/SIGTERM."""


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():  # tests calling serve() from a thread
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _start_kafka(
    port: int | None, err: IO[str], listeners: Sequence[Listener] = (), users: dict[str, str] | None = None
) -> tuple[_Running, str]:
    broker = KafkaBroker(listeners=("PLAINTEXT", *listeners), port=port, heap_mb=512, users=users)
    kafka_libs(broker.version, progress=err)  # the first start downloads the jars, saying so on err
    # The JVM takes a while and prints nothing meanwhile: say so before, not only after.
    where = f"{LOOPBACK}:{port}" if port else f"a free port of {LOOPBACK}"
    err.write(f"Starting Apache Kafka {broker.version} on {where} (a JVM: 15 to 40 s, "
              "longer on a busy machine) ...\n")
    err.flush()
    broker.start()
    files = broker.node.directory.parent
    return broker, f"Apache Kafka {broker.version} (one KRaft node; its files, in {files}, are removed when it stops)"


def _start_embedded(port: int | None, why: str | None) -> tuple[_Running, str]:
    """The embedded broker; ``why``: why not Apache Kafka (None: it was asked for)."""
    try:
        broker = EmbeddedBroker(port=port).start()
    except EmbeddedBrokerError as exc:
        if why is None:
            raise BrokerCommandError(str(exc)) from None
        raise BrokerCommandError(f"no broker can start here: {why}, and {exc}") from None
    reason = f" ({why})" if why else ""
    return broker, f"the embedded Tansu broker, data in memory{reason}.\n{TANSU_LACKS}"


def start(
    kind: str, port: int | None, err: IO[str], listeners: Sequence[Listener] = (), users: dict[str, str] | None = None
) -> tuple[_Running, str]:
    """Start the broker ``kind`` asks for ("auto", "kafka", "embedded") on ``port`` (None: a free one it
    leases), with the secured ``listeners`` too (Apache Kafka only); returns it and its description.
    Progress (a download, a slow start) goes to ``err``."""
    if listeners and kind == "embedded":
        raise BrokerCommandError("--listener needs Apache Kafka: the embedded broker has a PLAINTEXT listener only")
    if any(name in ("SSL", "SASL_SSL") for name in listeners) and importlib.util.find_spec("cryptography") is None:
        raise BrokerCommandError(
            "the SSL and SASL_SSL listeners need throw-away certificates, made with the 'cryptography' package: "
            "pip install cryptography (or try --listener SASL_PLAINTEXT)")
    if kind == "embedded":
        return _start_embedded(port, None)
    try:
        find_java()
        return _start_kafka(port, err, listeners, users)
    except (JavaNotFoundError, KafkaDownloadError) as exc:
        if kind == "kafka" or listeners:
            raise BrokerCommandError(str(exc)) from None
        if isinstance(exc, JavaNotFoundError):
            detail = " ".join(str(exc).split(". ")[0].split())
            why = f"Apache Kafka needs Java {MIN_JAVA} or newer: {detail}"
        else:
            why = f"Apache Kafka's jars could not be downloaded: {' '.join(str(exc).split())}"
        return _start_embedded(port, why)


async def create_topics(bootstrap: str, topics: Sequence[TopicSpec]) -> list[tuple[TopicSpec, bool]]:
    results = []
    async with ProduceClient(bootstrap) as client:
        for spec in topics:
            results.append((spec, await client.create_topic(spec.name, spec.partitions)))
    return results


def client_properties(broker: KafkaBroker, listener: Listener, user: str) -> str:
    """A Java properties file's text: the client settings for ``listener`` (SASL as ``user``)."""
    lines = [f"# {listener} listener of the local broker ('asyncconsumer broker'); holds a password if SASL",
             f"bootstrap.servers={broker.bootstrap_for(listener)}", f"security.protocol={listener}"]
    if listener in ("SSL", "SASL_SSL"):
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={broker.ca_file}"]
    if listener in ("SASL_PLAINTEXT", "SASL_SSL"):
        lines += [f"sasl.mechanism={SASL_MECHANISM}",
                  "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                  f'username="{user}" password="{broker.users[user]}";']
    return "\n".join(lines) + "\n"


def write_client_properties(broker: KafkaBroker, listeners: Sequence[Listener], out: IO[str]) -> None:
    """Each secured listener's address and the file of its client settings (owner-only), printed."""
    user = next(iter(broker.users))
    for listener in listeners:
        path = broker.node.directory.parent / f"client-{listener.lower().replace('_', '-')}.properties"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(client_properties(broker, listener, user))
        who = f" as {user} ({SASL_MECHANISM})" if listener.startswith("SASL") else ""
        out.write(f"{listener} listener: {broker.bootstrap_for(listener)}; client settings{who} in {path}\n")


def serve(
    kind: str,
    port: int | None,
    topics: Sequence[TopicSpec],
    out: IO[str],
    err: IO[str],
    listeners: Sequence[Listener] = (),
    users: Sequence[tuple[str, str]] = (),
) -> int:
    """Start, create the topics, print the address, and run until SIGINT/SIGTERM; 0 when stopped so."""
    broker: _Running | None = None
    asked = tuple(dict.fromkeys(listeners))
    sasl = any(name.startswith("SASL") for name in asked)
    if users and not sasl:
        raise BrokerCommandError("--user is for a SASL listener: add --listener SASL_PLAINTEXT or SASL_SSL")
    # The broker's SASL users: those given, else one with a random password (None: no SASL listener).
    sasl_users = (dict(users) or {DEFAULT_USER: secrets.token_urlsafe(18)}) if sasl else None
    with _stop_on_signals():
        try:
            chosen = choose_port(port)
            broker, description = start(kind, chosen, err, asked, sasl_users)
            if port is None and chosen is None:
                listening = broker.bootstrap.rpartition(":")[2]
                err.write(f"Port {DEFAULT_PORT} is in use (another broker?): listening on port {listening} instead.\n")
            for spec, created in anyio.run(create_topics, broker.bootstrap, topics):
                state = "created" if created else "exists already"
                out.write(f"Topic {spec.name}: {state} ({spec.partitions} partition(s) asked for)\n")
            out.write(f"Started {description}\n")
            out.write(f"Bootstrap server: {broker.bootstrap}\n")
            if asked and isinstance(broker, KafkaBroker):
                write_client_properties(broker, asked, out)
            out.write("Stop it with Ctrl-C.\n")
            out.flush()
            while True:
                died = _exited(broker)
                if died is not None:
                    raise BrokerCommandError(died)
                time.sleep(0.5)
        except _Stop:
            err.write("Stopping the broker.\n")
            return 0
        finally:
            if broker is not None:
                with _ignoring_signals():
                    broker.stop()


@contextmanager
def _ignoring_signals() -> Iterator[None]:
    """A second Ctrl-C while the broker stops does not leave it running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exited(broker: _Running) -> str | None:
    if isinstance(broker, KafkaBroker):
        return broker.node.exited()
    if isinstance(broker, EmbeddedBroker) and not broker.alive:
        return "the embedded broker exited"
    return None
