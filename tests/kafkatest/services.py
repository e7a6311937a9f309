"""kafkatest's services, local: N processes of one verifiable tool, their events read live.

A service starts its members (kafkatest's "nodes", numbered from 1) as child processes, each
with a reader thread that parses the member's stdout line by line and hands every JSON event to
the service under the service's lock, where the member's handler (``handlers.py``) and the
service-wide bookkeeping check it at once.  The first failed check stops that member's
bookkeeping (its output is still drained) and is raised by the scenario's next wait, with the
member's recent events; kafkatest's worker thread stops the same way, but its test only fails
at the next timeout.

Members are stopped by their own pid: SIGTERM for a clean stop (the member must report
``shutdown_complete`` and exit), SIGKILL for a hard one.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

from .clients import JAVA, Client, Tool
from .handlers import (
    ConsumerHandler,
    ConsumerState,
    ShareConsumerHandler,
    ShareConsumerState,
    TopicPartition,
    handler_kind,
)

#: Events kept per member for failure reports.
TRACE_LENGTH = 400


class ScenarioFailure(AssertionError):
    """A scenario's check failed: an invariant at an event, or a wait that timed out."""


@dataclass(frozen=True)
class EventError:
    """A member's event that failed a check."""

    member: str
    event: Mapping[str, Any]
    error: BaseException
    trace: str


class Member:
    """One process of a service, restartable; ``idx`` counts from 1, as kafkatest's nodes do."""

    def __init__(self, service: Service, idx: int) -> None:
        self.service = service
        self.idx = idx
        self.process: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None
        self.started_at = time.monotonic()
        #: (seconds since the scenario began, line) of this member's output, newest last.
        self.trace: collections.deque[tuple[float, str]] = collections.deque(maxlen=TRACE_LENGTH)
        self.exit_codes: list[int] = []
        #: Set by the first failed check: later events are traced but no longer booked.
        self.failed = False
        self.group_instance_id: str | None = None
        self.launches = 0
        #: Whether the current process printed ``startup_complete`` (it may be dead again since).
        self.reported_startup = False

    def __repr__(self) -> str:
        return f"{self.service.name}-{self.idx}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exited(self) -> bool:
        """Launched, and its last process has exited with its output all read and booked."""
        return self.process is not None and len(self.exit_codes) == self.launches

    def launch(self, command: list[str], env: Mapping[str, str], directory: Path) -> None:
        if self.running:
            raise RuntimeError(f"{self} is still running (pid {self.pid})")
        if self.reader is not None:
            self.reader.join()  # the last process's output is fully read before the next one's
        self.launches += 1
        self.reported_startup = False
        shown = command[command.index("-cp") + 2:] if "-cp" in command else command  # no JVM options
        self.note(f"(driver) start #{self.launches}: {' '.join(shown)}")
        with open(directory / f"{self}.stderr", "ab") as stderr:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=dict(env),
                cwd=directory,
            )
        self.process = process
        assert process.stdout is not None
        self.reader = threading.Thread(target=self._read, args=(process, process.stdout), name=repr(self), daemon=True)
        self.reader.start()

    def note(self, text: str) -> None:
        """Keep a line of the member's story: in the trace, and in ``<member>.stdout`` beside its logs
        (every line, with the seconds since the scenario began: kafkatest's stdout capture)."""
        at = time.monotonic() - self.service.scenario.began
        self.trace.append((at, text))
        with open(self.service.directory / f"{self}.stdout", "a") as out:
            out.write(f"{at:9.3f}  {text}\n")

    def _read(self, process: subprocess.Popen[bytes], stdout: IO[bytes]) -> None:
        for raw in stdout:
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            try:
                event = json.loads(text)
            except ValueError:
                self.note(f"(not JSON, ignored) {text}")
                continue
            self.note(text)
            if isinstance(event, dict) and event.get("name") == "startup_complete":
                self.reported_startup = True
            self.service.deliver(self, event)
        code = process.wait()
        self.exit_codes.append(code)
        self.note(f"(driver) exited with {code}")
        self.service.notify()

    def signal(self, signum: signal.Signals) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            self.note(f"(driver) {signum.name} to pid {process.pid}")
            os.kill(process.pid, signum)

    def wait(self, timeout: float) -> bool:
        """Until the process has exited and its output is read; False on timeout."""
        if self.reader is None:
            return True
        self.reader.join(timeout)
        return not self.reader.is_alive()

    def format_trace(self, last: int = 40) -> str:
        lines = list(self.trace)[-last:]
        return "\n".join(f"    {self}  {at:8.3f}s  {text}" for at, text in lines) or f"    {self}  (no output)"


class Service:
    """The members of one tool; subclasses book the events (``dispatch``)."""

    tool: Tool
    name: str
    stop_timeout_sec: float = 30.0

    def __init__(self, scenario: Scenario, num_nodes: int, client: Client, *, stop_timeout_sec: float | None = None
                 ) -> None:
        self.scenario = scenario
        self.client = client
        self.lock = threading.RLock()
        self.nodes = [Member(self, idx) for idx in range(1, num_nodes + 1)]
        self.errors: list[EventError] = []
        if stop_timeout_sec is not None:
            self.stop_timeout_sec = stop_timeout_sec
        self.directory = scenario.directory / self.name
        self.directory.mkdir(parents=True, exist_ok=True)
        scenario.services.append(self)

    # -- subclass hooks -----------------------------------------------------------------------------

    #: Event name -> (the member handler's method, then the service's own), by name; either may be
    #: None.  Other events are ignored (kafkatest logs them at debug level).
    routes: ClassVar[Mapping[str, tuple[str | None, str | None]]] = {}

    def args(self, node: Member) -> list[str]:
        raise NotImplementedError

    def handler(self, node: Member) -> Any:
        """The member's handler (kafkatest's per-node event handler), if the service keeps one."""
        return None

    def dispatch(self, node: Member, event: Mapping[str, Any]) -> None:
        handler_method, service_method = self.routes.get(event["name"], (None, None))
        if handler_method is not None:
            getattr(self.handler(node), handler_method)(event)
        if service_method is not None:
            getattr(self, service_method)(event, node)

    def before_start(self, node: Member) -> None:
        """The member's bookkeeping for a new process (kafkatest's ``_worker`` prologue)."""

    def handle_kill(self, node: Member, clean_shutdown: bool) -> None:
        """Bookkeeping after a signal (a SIGKILLed member is dead at once)."""

    # -- members --------------------------------------------------------------------------------------

    def command(self, node: Member) -> list[str]:
        return self.client.command(self.tool, self.args(node), log_file=self.directory / f"{node}.log")

    def start(self) -> None:
        for node in self.nodes:
            self.start_node(node)

    def start_node(self, node: Member) -> None:
        self.client.check(self.tool)
        with self.lock:
            self.before_start(node)
        node.launch(self.command(node), self.client.environment(log_dir=self.directory), self.directory)

    def kill_node(self, node: Member, clean_shutdown: bool = True) -> None:
        node.signal(signal.SIGTERM if clean_shutdown else signal.SIGKILL)
        with self.lock:
            self.handle_kill(node, clean_shutdown)
        self.notify()

    def stop_node(self, node: Member, clean_shutdown: bool = True) -> None:
        self.kill_node(node, clean_shutdown)
        stopped = node.wait(self.scenario.timeout(self.stop_timeout_sec))
        self.raise_errors()
        if not stopped:
            raise ScenarioFailure(
                f"Node {node}: did not stop within the specified timeout of {self.stop_timeout_sec} seconds\n"
                + node.format_trace()
            )

    def stop_all(self) -> None:
        for node in self.nodes:
            self.stop_node(node)

    def cleanup(self) -> None:
        """SIGKILL whatever still runs (a failed scenario's members) and wait for their readers."""
        for node in self.nodes:
            node.signal(signal.SIGKILL)
        for node in self.nodes:
            node.wait(30)

    # -- events ---------------------------------------------------------------------------------------

    def deliver(self, node: Member, event: Any) -> None:
        with self.lock:
            if node.failed:
                return
            try:
                if not isinstance(event, dict) or "name" not in event:
                    raise KeyError(f"an event without a name: {event!r}")
                self.dispatch(node, event)
            except Exception as exc:  # a failed check; kafkatest's worker thread dies of it
                node.failed = True
                self.errors.append(EventError(repr(node), event, exc, node.format_trace()))
        self.notify()

    def notify(self) -> None:
        self.scenario.wake()

    def raise_errors(self) -> None:
        with self.lock:
            if not self.errors:
                return
            first = self.errors[0]
        raise ScenarioFailure(
            f"{first.member}: {type(first.error).__name__}: {first.error}\n  at event {json.dumps(first.event)}\n"
            f"  {first.member}'s output (newest last):\n{first.trace}\n  {self.name} now:\n{self.describe()}\n"
            f"  logs: {self.directory}"
        ) from first.error

    def describe(self) -> str:
        """One line per member for failure reports."""
        return "\n".join(f"  {node}: pid {node.pid} running={node.running} exits={node.exit_codes}"
                         for node in self.nodes)


class Scenario:
    """What one test runs: its cluster, its services, its waits and its figures."""

    def __init__(self, cluster: Any, directory: Path, *, timeout_scale: float = 1.0) -> None:
        self.cluster = cluster
        self.directory = directory
        self.timeout_scale = timeout_scale
        self.services: list[Service] = []
        self.began = time.monotonic()
        self.figures: dict[str, Any] = {}
        #: Brokers sent a signal (``cluster.signal_broker``): waited for at the end.
        self.brokers_signalled: list[Any] = []
        self._wake = threading.Condition()

    def timeout(self, seconds: float) -> float:
        return seconds * self.timeout_scale

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def raise_errors(self) -> None:
        for service in self.services:
            service.raise_errors()

    def wait_until(self, condition: Callable[[], bool], timeout_sec: float, err_msg: str | Callable[[], str],
                   *, backoff_sec: float = 0.1, needs: Service | None = None) -> float:
        """ducktape's ``wait_until``, ended at once by a failed check in any service; returns the
        seconds it took.  ``timeout_sec`` is kafkatest's figure, scaled by ``timeout_scale``.

        ``needs``: a service whose members must run for ``condition`` to become true (consumption
        needs the consumers).  Members are started only by the scenario's own thread, which is
        here, so once every member of it has exited the wait cannot succeed: it fails at once with
        ducktape's verdict instead of after the whole timeout."""
        start = time.monotonic()
        deadline = start + self.timeout(timeout_sec)
        while True:
            self.raise_errors()
            # Read before the condition: an exit is booked after the member's last event, so the
            # condition then sees every event of the members found stopped.
            stopped = needs is not None and all(node.exited for node in needs.nodes)
            if condition():
                return time.monotonic() - start
            now = time.monotonic()
            if now >= deadline or stopped:
                message = err_msg() if callable(err_msg) else err_msg
                why = f"every {needs.name} member has exited, " if stopped and needs is not None else ""
                raise ScenarioFailure(f"{message} ({why}waited {now - start:.1f}s)\n{self.diagnostics()}")
            with self._wake:
                self._wake.wait(min(backoff_sec, deadline - now))

    def diagnostics(self, trace_lines: int = 15) -> str:
        parts = [f"logs: {self.directory}"]
        for service in self.services:
            parts.append(f"{service.name}:\n{service.describe()}")
            for node in service.nodes:
                parts.append(node.format_trace(trace_lines))
        return "\n".join(parts)

    def close(self) -> None:
        for service in self.services:
            service.cleanup()
        for node in self.brokers_signalled:
            node.stop()  # until it has exited (SIGKILL after 30 s), so that it can start again


# ---------------------------------------------------------------------------------------- consumer


class VerifiableConsumer(Service):
    """kafkatest's ``VerifiableConsumer`` service (kafkatest's services/verifiable_consumer.py): per-member handlers,
    plus the group-wide positions and commits, checked at every event."""

    tool: Tool = "consumer"
    name = "consumer"

    def __init__(
        self,
        scenario: Scenario,
        num_nodes: int,
        topic: str,
        group_id: str,
        *,
        client: Client = JAVA,
        name: str = "consumer",
        static_membership: bool = False,
        max_messages: int = -1,
        enable_autocommit: bool = False,
        assignment_strategy: str | None = None,
        group_protocol: str | None = None,
        group_remote_assignor: str | None = None,
        stop_timeout_sec: float = 30,
        on_record_consumed: Callable[[Mapping[str, Any], Member], None] | None = None,
        reset_policy: str = "earliest",
        verify_offsets: bool = True,
        close_timeout_sec: float = 15,
        prop_file: str = "",
    ) -> None:
        self.name = name
        super().__init__(scenario, num_nodes, client, stop_timeout_sec=stop_timeout_sec)
        self.topic = topic
        self.group_id = group_id
        self.static_membership = static_membership
        self.max_messages = max_messages
        self.enable_autocommit = enable_autocommit
        self.assignment_strategy = assignment_strategy
        self.group_protocol = group_protocol
        self.group_remote_assignor = group_remote_assignor
        self.on_record_consumed = on_record_consumed
        self.reset_policy = reset_policy
        self.verify_offsets = verify_offsets
        self.close_timeout_sec = close_timeout_sec
        self.prop_file = prop_file
        self.kind = handler_kind(group_protocol, assignment_strategy)
        self.handlers: dict[int, ConsumerHandler] = {}
        self.global_position: dict[TopicPartition, int] = {}
        self.global_committed: dict[TopicPartition, int] = {}
        #: "Expected next consumed offset ..." warnings (kafkatest only logs them).
        self.position_warnings: list[str] = []

    def is_consumer_group_protocol_enabled(self) -> bool:
        return self.group_protocol is not None and self.group_protocol.lower() == "consumer"

    def before_start(self, node: Member) -> None:
        old = self.handlers.get(node.idx)
        self.handlers[node.idx] = old.restarted() if old else ConsumerHandler(node.idx, self.kind, self.verify_offsets)
        if self.static_membership:
            node.group_instance_id = f"{self.group_id}-instance-{node.idx}"
        (self.directory / f"{self.name}.properties").write_text(self.prop_file)

    def args(self, node: Member) -> list[str]:
        args: list[str] = []
        if self.on_record_consumed is not None:
            args.append("--verbose")
        if node.group_instance_id is not None:
            args += ["--group-instance-id", node.group_instance_id]
        if self.is_consumer_group_protocol_enabled():
            args += ["--group-protocol", "consumer"]
            if self.group_remote_assignor:
                args += ["--group-remote-assignor", self.group_remote_assignor]
        elif self.assignment_strategy:
            args += ["--assignment-strategy", self.assignment_strategy]
        if self.enable_autocommit:
            args.append("--enable-autocommit")
        args += ["--bootstrap-server", self.scenario.cluster.bootstrap, "--reset-policy", self.reset_policy,
                 "--group-id", self.group_id, "--topic", self.topic]
        if self.max_messages > 0:
            args += ["--max-messages", str(self.max_messages)]
        if self.close_timeout_sec >= 0 and self.client.supports(self.tool, "--close-timeout"):
            args += ["--close-timeout", str(int(self.close_timeout_sec * 1000))]
        args += ["--command-config", str(self.directory / f"{self.name}.properties")]
        return args

    routes: ClassVar[Mapping[str, tuple[str | None, str | None]]] = {
        "startup_complete": ("handle_startup_complete", None),
        "shutdown_complete": ("handle_shutdown_complete", None),
        "partitions_assigned": ("handle_partitions_assigned", None),
        "partitions_revoked": ("handle_partitions_revoked", None),
        "records_consumed": ("handle_records_consumed", "_update_global_position"),
        "offsets_committed": ("handle_offsets_committed", "_update_global_committed"),
        "record_data": (None, "_record_data"),
    }

    def handler(self, node: Member) -> ConsumerHandler:
        return self.handlers[node.idx]

    def _record_data(self, event: Mapping[str, Any], node: Member) -> None:
        if self.on_record_consumed is not None:
            self.on_record_consumed(event, node)

    def handle_kill(self, node: Member, clean_shutdown: bool) -> None:
        if node.idx in self.handlers:
            self.handlers[node.idx].handle_kill_process(clean_shutdown)

    def _update_global_position(self, event: Mapping[str, Any], node: Member) -> None:
        for entry in event["partitions"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            committed = self.global_committed.get(tp)
            if committed is not None and committed > entry["minOffset"]:
                message = (f"Consumed position {entry['minOffset']} is behind the current committed offset "
                           f"{committed} for partition {tp}")
                assert not self.verify_offsets, message
            position = self.global_position.get(tp)
            if position is not None and position != entry["minOffset"]:
                self.position_warnings.append(f"Expected next consumed offset of {position} for partition {tp}, "
                                              f"but instead saw {entry['minOffset']}")
            self.global_position[tp] = entry["maxOffset"] + 1

    def _update_global_committed(self, event: Mapping[str, Any], node: Member) -> None:
        if not event["success"]:
            return
        for entry in event["offsets"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            position = self.global_position[tp]
            assert position >= entry["offset"], (
                f"Committed offset {entry['offset']} for partition {tp} is ahead of the current position {position}"
            )
            self.global_committed[tp] = entry["offset"]

    # -- queries (kafkatest's names) --------------------------------------------------------------------

    def _handlers(self) -> list[tuple[Member, ConsumerHandler]]:
        return [(node, self.handlers[node.idx]) for node in self.nodes if node.idx in self.handlers]

    def _nodes_where(self, test: Callable[[ConsumerHandler], bool]) -> list[Member]:
        with self.lock:
            return [node for node, handler in self._handlers() if test(handler)]

    def current_assignment(self) -> dict[Member, list[TopicPartition]]:
        with self.lock:
            return {node: list(handler.assignment) for node, handler in self._handlers()}

    def current_position(self, tp: TopicPartition) -> int | None:
        with self.lock:
            return self.global_position.get(tp)

    def last_commit(self, tp: TopicPartition) -> int | None:
        with self.lock:
            return self.global_committed.get(tp)

    def owner(self, tp: TopicPartition) -> Member | None:
        with self.lock:
            for node, handler in self._handlers():
                if tp in handler.assignment:
                    return node
            return None

    def total_consumed(self) -> int:
        with self.lock:
            return sum(handler.total_consumed for _, handler in self._handlers())

    def num_rebalances(self) -> int:
        with self.lock:
            return max((handler.assigned_count for _, handler in self._handlers()), default=0)

    def num_revokes_for_alive(self, keep_alive: int = 1) -> int:
        with self.lock:
            return max((h.revoked_count for _, h in self._handlers() if h.idx <= keep_alive), default=0)

    def joined_nodes(self) -> list[Member]:
        return self._nodes_where(lambda h: h.state is ConsumerState.JOINED)

    def rebalancing_nodes(self) -> list[Member]:
        return self._nodes_where(lambda h: h.state is ConsumerState.REBALANCING)

    def dead_nodes(self) -> list[Member]:
        return self._nodes_where(lambda h: h.state is ConsumerState.DEAD)

    def alive_nodes(self) -> list[Member]:
        return self._nodes_where(lambda h: h.state is not ConsumerState.DEAD)

    started_nodes = alive_nodes

    def shutdown_complete_nodes(self) -> list[Member]:
        return self._nodes_where(lambda h: h.shutdown_complete)

    def describe(self) -> str:
        with self.lock:
            lines = []
            for node in self.nodes:
                handler = self.handlers.get(node.idx)
                if handler is None:
                    lines.append(f"  {node}: never started")
                    continue
                lines.append(
                    f"  {node}: {handler.state.name} assigned={handler.assigned_count} revoked={handler.revoked_count} "
                    f"assignment={[tp.partition for tp in handler.assignment]} consumed={handler.total_consumed} "
                    f"pid={node.pid} running={node.running} exits={node.exit_codes}"
                )
            lines.append(f"  position={dict(self.global_position)} committed={dict(self.global_committed)}")
            return "\n".join(lines)

    def start(self, timeout_sec: float = 120) -> None:
        """Start every member, then wait until each reported ``startup_complete``.  kafkatest waits for
        every handler to be not Dead, which a member fenced right after its start (the conflicting
        static members) may already be again; the wait here is for the event itself."""
        super().start()
        self.scenario.wait_until(
            lambda: all(node.reported_startup for node in self.nodes), timeout_sec,
            f"Verifiable consumer didn't finish startup in {timeout_sec} seconds",
        )


# ---------------------------------------------------------------------------------- share consumer


class VerifiableShareConsumer(Service):
    """kafkatest's ``VerifiableShareConsumer`` service: counts, no per-event checks."""

    tool: Tool = "share-consumer"
    name = "share_consumer"

    def __init__(
        self,
        scenario: Scenario,
        num_nodes: int,
        topic: str,
        group_id: str,
        *,
        client: Client = JAVA,
        max_messages: int = -1,
        acknowledgement_mode: str = "auto",
        stop_timeout_sec: float = 60,
        ack_pattern: list[str] | None = None,
    ) -> None:
        super().__init__(scenario, num_nodes, client, stop_timeout_sec=stop_timeout_sec)
        self.topic = topic
        self.group_id = group_id
        self.max_messages = max_messages
        self.acknowledgement_mode = acknowledgement_mode
        self.ack_pattern = ack_pattern
        self.handlers: dict[int, ShareConsumerHandler] = {}
        self.total_records_consumed = 0
        self.total_records_acknowledged = 0
        self.total_records_acknowledged_failed = 0
        self.consumed_records_offsets: set[str] = set()
        self.acknowledged_records_offsets: set[str] = set()

    def before_start(self, node: Member) -> None:
        self.handlers.setdefault(node.idx, ShareConsumerHandler(node.idx))
        (self.directory / f"{self.name}.properties").write_text("")

    def args(self, node: Member) -> list[str]:
        args = ["--acknowledgement-mode", self.acknowledgement_mode]
        if self.ack_pattern:
            args += ["--ack-pattern", ",".join(self.ack_pattern)]
        args += ["--bootstrap-server", self.scenario.cluster.bootstrap, "--group-id", self.group_id,
                 "--topic", self.topic]
        if self.max_messages > 0:
            args += ["--max-messages", str(self.max_messages)]
        args += ["--command-config", str(self.directory / f"{self.name}.properties")]
        return args

    routes: ClassVar[Mapping[str, tuple[str | None, str | None]]] = {
        "startup_complete": ("handle_startup_complete", None),
        "shutdown_complete": ("handle_shutdown_complete", None),
        "records_consumed": ("handle_records_consumed", "_update_global_consumed"),
        "offsets_acknowledged": ("handle_offsets_acknowledged", "_update_global_acknowledged"),
    }

    def handler(self, node: Member) -> ShareConsumerHandler:
        return self.handlers[node.idx]

    def _update_global_consumed(self, event: Mapping[str, Any], node: Member) -> None:
        self.total_records_consumed += event["count"]
        self.consumed_records_offsets |= _offset_keys(event)

    def _update_global_acknowledged(self, event: Mapping[str, Any], node: Member) -> None:
        if event["success"]:
            self.total_records_acknowledged += event["count"]
            self.acknowledged_records_offsets |= _offset_keys(event)
        else:
            self.total_records_acknowledged_failed += event["count"]

    def handle_kill(self, node: Member, clean_shutdown: bool) -> None:
        if node.idx in self.handlers:
            self.handlers[node.idx].handle_kill_process(clean_shutdown)

    def total_consumed(self) -> int:
        with self.lock:
            return self.total_records_consumed

    def total_consumed_by(self, node: Member) -> int:
        with self.lock:
            handler = self.handlers.get(node.idx)
            return handler.total_consumed if handler else 0

    def total_unique_consumed(self) -> int:
        with self.lock:
            return len(self.consumed_records_offsets)

    def total_unique_acknowledged(self) -> int:
        with self.lock:
            return len(self.acknowledged_records_offsets)

    def total_acknowledged(self) -> int:
        with self.lock:
            return self.total_records_acknowledged + self.total_records_acknowledged_failed

    def total_acknowledged_successfully(self) -> int:
        with self.lock:
            return self.total_records_acknowledged

    def per_node(self) -> dict[Member, ShareConsumerHandler]:
        with self.lock:
            return {node: self.handlers[node.idx] for node in self.nodes if node.idx in self.handlers}

    def dead_nodes(self) -> list[Member]:
        with self.lock:
            return [n for n in self.nodes if n.idx in self.handlers
                    and self.handlers[n.idx].state is ShareConsumerState.DEAD]

    def alive_nodes(self) -> list[Member]:
        with self.lock:
            return [n for n in self.nodes if n.idx in self.handlers
                    and self.handlers[n.idx].state is ShareConsumerState.STARTED]

    def describe(self) -> str:
        with self.lock:
            lines = [
                f"  {node}: {h.state.name} consumed={h.total_consumed} acked={h.total_acknowledged_successfully} "
                f"failed={h.total_acknowledged_failed} pid={node.pid} running={node.running} exits={node.exit_codes}"
                for node, h in ((n, self.handlers[n.idx]) for n in self.nodes if n.idx in self.handlers)
            ]
            lines.append(f"  unique consumed={len(self.consumed_records_offsets)} "
                         f"unique acknowledged={len(self.acknowledged_records_offsets)}")
            return "\n".join(lines)


# ---------------------------------------------------------------------------------------- producer


class VerifiableProducer(Service):
    """Kafka's ``VerifiableProducer`` (always the Java tool), one member: what was acked."""

    tool: Tool = "producer"
    name = "producer"

    def __init__(self, scenario: Scenario, topic: str, *, max_messages: int = -1, throughput: int = 100000,
                 request_timeout_sec: int = 30, stop_timeout_sec: float = 150) -> None:
        super().__init__(scenario, 1, JAVA, stop_timeout_sec=stop_timeout_sec)
        self.topic = topic
        self.max_messages = max_messages
        self.throughput = throughput
        self.request_timeout_sec = request_timeout_sec
        self.acked_values: list[int] = []
        self.not_acked_values: list[int] = []
        self.last_acked_offsets: dict[TopicPartition, int] = {}
        self.shutdowns = 0

    def before_start(self, node: Member) -> None:
        (self.directory / "producer.properties").write_text(f"request.timeout.ms={self.request_timeout_sec * 1000}\n")

    def args(self, node: Member) -> list[str]:
        args = ["--topic", self.topic, "--bootstrap-server", self.scenario.cluster.bootstrap]
        if self.max_messages > 0:
            args += ["--max-messages", str(self.max_messages)]
        if self.throughput > 0:
            args += ["--throughput", str(self.throughput)]
        return [*args, "--command-config", str(self.directory / "producer.properties")]

    routes: ClassVar[Mapping[str, tuple[str | None, str | None]]] = {
        "producer_send_success": (None, "_acked"),
        "producer_send_error": (None, "_not_acked"),
        "shutdown_complete": (None, "_shutdown_complete"),
    }

    def _acked(self, event: Mapping[str, Any], node: Member) -> None:
        self.acked_values.append(int(event["value"]))  # kafkatest's is_int validator
        self.last_acked_offsets[TopicPartition(event["topic"], event["partition"])] = event["offset"]

    def _not_acked(self, event: Mapping[str, Any], node: Member) -> None:
        self.not_acked_values.append(int(event["value"]))

    def _shutdown_complete(self, event: Mapping[str, Any], node: Member) -> None:
        self.shutdowns += 1
        if self.shutdowns > 1:
            raise RuntimeError(f"{node}: a second shutdown_complete")

    @property
    def num_acked(self) -> int:
        with self.lock:
            return len(self.acked_values)

    def start(self, timeout_sec: float = 120) -> None:
        """Start the producer and wait for its ``startup_complete``: kafkatest does not wait here, so its
        first ``await_produced_messages`` (10 s) includes the JVM's start, which on two busy cores
        can take that long by itself."""
        super().start()
        self.scenario.wait_until(lambda: self.nodes[0].reported_startup, timeout_sec,
                                 f"Verifiable producer didn't finish startup in {timeout_sec} seconds")

    def stop(self) -> None:
        self.stop_all()

    def describe(self) -> str:
        with self.lock:
            return (f"  acked={len(self.acked_values)} not acked={len(self.not_acked_values)} "
                    f"last acked offsets={dict(self.last_acked_offsets)}\n" + super().describe())


def _offset_keys(event: Mapping[str, Any]) -> set[str]:
    """kafkatest's ``"<topic>-<partition>-<offset>"`` key of every offset a share event lists."""
    return {f"{p['topic']}-{p['partition']}-{offset}" for p in event["partitions"] for offset in p["offsets"]}
