"""The kafkatest driver itself (tests/kafkatest, docs/kafkatest.md), without a broker: its handlers
catch each broken invariant with kafkatest's message, its services read a client's output live and
end the scenario at the first failed check, and its CI subset names existing scenarios.

Scripted clients stand in for the verifiable consumer here: small Python programs printing the
events a broken (or a correct) client would print."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafkatest import report
from kafkatest.clients import Client, Tool
from kafkatest.handlers import (
    CONSUMER_PROTOCOL,
    EAGER,
    INCREMENTAL,
    ConsumerHandler,
    ConsumerState,
    TopicPartition,
    handler_kind,
)
from kafkatest.matrix import CI_SUBSET
from kafkatest.services import Scenario, ScenarioFailure, VerifiableConsumer
from support.paths import ROOT

TOPIC = "t"


def assigned(*partitions: int) -> dict[str, Any]:
    return {"name": "partitions_assigned", "partitions": [{"topic": TOPIC, "partition": p} for p in partitions]}


def revoked(*partitions: int) -> dict[str, Any]:
    return {"name": "partitions_revoked", "partitions": [{"topic": TOPIC, "partition": p} for p in partitions]}


def consumed(partition: int, first: int, last: int) -> dict[str, Any]:
    count = last - first + 1
    return {"name": "records_consumed", "count": count, "partitions": [
        {"topic": TOPIC, "partition": partition, "count": count, "minOffset": first, "maxOffset": last}]}


def committed(partition: int, offset: int) -> dict[str, Any]:
    return {"name": "offsets_committed", "success": True,
            "offsets": [{"topic": TOPIC, "partition": partition, "offset": offset}]}


def joined(kind: Any, *partitions: int) -> ConsumerHandler:
    handler = ConsumerHandler(1, kind)
    handler.handle_startup_complete()
    handler.handle_partitions_assigned(assigned(*partitions))
    return handler


# ------------------------------------------------------------------------------------------ handlers


def test_kafkatests_choice_of_handler() -> None:
    assert handler_kind("consumer", None) is CONSUMER_PROTOCOL
    assert handler_kind("CONSUMER", "x") is CONSUMER_PROTOCOL
    assert handler_kind("classic", "org.apache.kafka.clients.consumer.RangeAssignor") is EAGER
    assert handler_kind("classic", "org.apache.kafka.clients.consumer.CooperativeStickyAssignor") is INCREMENTAL
    assert handler_kind(None, None) is INCREMENTAL  # kafkatest's choice when no protocol is named


def test_records_before_the_first_assignment_are_refused() -> None:
    handler = ConsumerHandler(1, EAGER)
    handler.handle_startup_complete()
    with pytest.raises(AssertionError, match=r"only be received when joined \(current state: ConsumerState.STARTED"):
        handler.handle_records_consumed(consumed(0, 0, 9))


def test_eager_records_between_revocation_and_assignment_are_refused() -> None:
    handler = joined(EAGER, 0)
    handler.handle_records_consumed(consumed(0, 0, 9))
    handler.handle_partitions_revoked(revoked(0))
    assert handler.state is ConsumerState.REBALANCING and handler.assignment == [TopicPartition(TOPIC, 0)]
    with pytest.raises(AssertionError, match="REBALANCING"):
        handler.handle_records_consumed(consumed(0, 10, 12))
    handler.handle_partitions_assigned(assigned(1))  # replaces, does not add
    assert handler.assignment == [TopicPartition(TOPIC, 1)]


def test_a_gap_or_a_repeat_within_a_member_is_refused() -> None:
    handler = joined(EAGER, 0)
    handler.handle_records_consumed(consumed(0, 0, 9))
    with pytest.raises(AssertionError, match=r"unexpected offset \(10, 12\) for partition TopicPartition"):
        handler.handle_records_consumed(consumed(0, 12, 15))
    with pytest.raises(AssertionError, match=r"unexpected offset \(10, 5\)"):
        handler.handle_records_consumed(consumed(0, 5, 15))
    handler.handle_records_consumed(consumed(0, 10, 11))
    assert handler.position == {TopicPartition(TOPIC, 0): 12} and handler.total_consumed == 12


def test_after_a_revocation_a_member_may_start_anywhere() -> None:
    handler = joined(CONSUMER_PROTOCOL, 0, 1)
    handler.handle_records_consumed(consumed(0, 0, 9))
    handler.handle_partitions_revoked(revoked(1))
    assert handler.state is ConsumerState.JOINED  # KIP-848 members consume while reconciling
    handler.handle_records_consumed(consumed(0, 4, 9))  # positions forgotten: the service checks commits
    with pytest.raises(AssertionError, match=r"TopicPartition\(topic='t', partition=1\) which is not assigned"):
        handler.handle_records_consumed(consumed(1, 0, 0))


def test_commits_only_for_assigned_partitions_and_never_above_the_position() -> None:
    handler = joined(EAGER, 0)
    with pytest.raises(AssertionError, match="No previous position"):
        handler.handle_offsets_committed(committed(0, 0))
    handler.handle_records_consumed(consumed(0, 0, 9))
    with pytest.raises(AssertionError, match="committed offset 11 was greater than the current position 10"):
        handler.handle_offsets_committed(committed(0, 11))
    with pytest.raises(AssertionError, match="partition=3\\) not assigned"):
        handler.handle_offsets_committed(committed(3, 1))
    handler.handle_offsets_committed(committed(0, 10))
    handler.handle_offsets_committed({**committed(0, 99), "success": False})  # failed commits are only logged
    assert handler.committed == {TopicPartition(TOPIC, 0): 10}


def test_cooperative_members_revoke_only_what_they_own() -> None:
    handler = joined(INCREMENTAL, 0)
    handler.handle_partitions_assigned(assigned(1))
    assert handler.assignment == [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    handler.handle_partitions_revoked(revoked(0))
    assert handler.assignment == [TopicPartition(TOPIC, 1)] and handler.state is ConsumerState.REBALANCING
    with pytest.raises(AssertionError, match=r"cannot be revoked from .* as it was not previously assigned"):
        handler.handle_partitions_revoked(revoked(0))


def test_a_restarted_member_keeps_its_counts_and_a_killed_one_is_dead_at_once() -> None:
    handler = joined(EAGER, 0)
    handler.handle_records_consumed(consumed(0, 0, 4))
    handler.handle_shutdown_complete()
    again = handler.restarted()
    assert (again.assigned_count, again.total_consumed, again.shutdown_complete) == (1, 5, False)
    again.handle_startup_complete()
    again.handle_kill_process(clean_shutdown=True)
    states = [again.state]
    again.handle_kill_process(clean_shutdown=False)
    states.append(again.state)
    assert states == [ConsumerState.STARTED, ConsumerState.DEAD] and again.shutdown_complete


# ---------------------------------------------------------------------------- services and processes


@dataclass(frozen=True)
class FakeCluster:
    bootstrap: str = "127.0.0.1:9"


@dataclass(frozen=True)
class ScriptClient(Client):
    """A client whose command runs ``script`` (Python) with the tool's flags."""

    script: str = ""

    def command(self, tool: Tool, args: list[str], *, log_file: Path, log_level: str = "INFO") -> list[str]:
        return [sys.executable, "-c", self.script, *args]

    def check(self, tool: Tool) -> None:
        pass

    def supports(self, tool: Tool, flag: str) -> bool:
        return False


#: Prints the events of one member over ``events`` (a JSON list), then on SIGTERM a clean tail.
MEMBER = textwrap.dedent("""
    import json, signal, sys, time
    def emit(event):
        print(json.dumps(event), flush=True)
    def stop(*_):
        emit({"name": "shutdown_requested"})
        emit({"name": "partitions_revoked", "partitions": [{"topic": "t", "partition": 0}]})
        emit({"name": "shutdown_complete"})
        sys.exit(0)
    signal.signal(signal.SIGTERM, IGNORE_OR_STOP)
    print("a log line on stdout, not JSON", flush=True)
    for event in EVENTS:
        emit(event)
    while EXIT_CODE is None:
        time.sleep(0.1)
    sys.exit(EXIT_CODE)
""")


def scripted(events: list[dict[str, Any]], *, ignore_sigterm: bool = False, exit_code: int | None = None
             ) -> ScriptClient:
    """A member printing ``events``; then it waits for SIGTERM, or exits with ``exit_code`` unasked."""
    script = MEMBER.replace("EVENTS", repr(json.loads(json.dumps(events)))).replace(
        "IGNORE_OR_STOP", "signal.SIG_IGN" if ignore_sigterm else "stop").replace("EXIT_CODE", repr(exit_code))
    return ScriptClient("scripted", "java", script=script)


GOOD = [{"name": "startup_complete"}, assigned(0), consumed(0, 0, 9), committed(0, 10), consumed(0, 10, 19),
        committed(0, 20)]


def test_a_correct_member_is_followed_live_and_stops_on_sigterm(tmp_path: Path) -> None:
    scenario = Scenario(FakeCluster(), tmp_path)
    consumer = VerifiableConsumer(scenario, 1, TOPIC, "g", client=scripted(GOOD), group_protocol="classic",
                                  assignment_strategy="org.apache.kafka.clients.consumer.RangeAssignor")
    try:
        consumer.start(timeout_sec=60)
        scenario.wait_until(lambda: consumer.last_commit(TopicPartition(TOPIC, 0)) == 20, 30,
                            "the member's last commit never arrived")
        assert consumer.current_position(TopicPartition(TOPIC, 0)) == consumer.total_consumed() == 20
        assert (tmp_path / "consumer" / "consumer-1.stdout").read_text().count('"name": "records_consumed"') == 2
        consumer.stop_all()
        assert consumer.dead_nodes() == consumer.nodes and consumer.nodes[0].exit_codes == [0]
        assert consumer.handlers[1].revoked_count == 1 and consumer.handlers[1].shutdown_complete
        assert any("not JSON, ignored" in line for _, line in consumer.nodes[0].trace)
        command = " ".join(consumer.args(consumer.nodes[0]))
        assert "--assignment-strategy org.apache.kafka.clients.consumer.RangeAssignor" in command
        assert "--group-protocol" not in command and "--close-timeout" not in command
    finally:
        scenario.close()


def test_a_broken_invariant_ends_the_next_wait_with_the_event_and_the_trace(tmp_path: Path) -> None:
    scenario = Scenario(FakeCluster(), tmp_path)
    gap = [*GOOD, consumed(0, 25, 29)]
    consumer = VerifiableConsumer(scenario, 1, TOPIC, "g", client=scripted(gap), group_protocol="consumer")
    try:
        with pytest.raises(ScenarioFailure) as failure:  # at the start's wait already, or at the next
            consumer.start(timeout_sec=60)
            scenario.wait_until(lambda: False, 60, "never")
        message = str(failure.value)
        assert "consumer-1: AssertionError: Consumed from an unexpected offset (20, 25)" in message
        assert '"minOffset": 25' in message  # the event
        assert '"name":"partitions_assigned"' in message.replace(" ", "")  # the member's trace before it
    finally:
        scenario.close()


def test_a_wait_on_consumption_ends_at_once_when_every_consumer_has_exited(tmp_path: Path) -> None:
    scenario = Scenario(FakeCluster(), tmp_path)
    consumer = VerifiableConsumer(scenario, 1, TOPIC, "g", client=scripted(GOOD, exit_code=1),
                                  group_protocol="consumer")
    try:
        consumer.start(timeout_sec=60)
        # What the member printed before exiting still counts: this wait succeeds.
        scenario.wait_until(lambda: consumer.total_consumed() >= 20, 60, "the 20 records", needs=consumer)
        with pytest.raises(ScenarioFailure, match="every consumer member has exited") as failure:
            scenario.wait_until(lambda: consumer.total_consumed() >= 21, 600, "Timed out waiting for consumption",
                                needs=consumer)
        waited = float(str(failure.value).split("waited ")[1].split("s)")[0])
        assert waited < 30 and consumer.nodes[0].exit_codes == [1]
        assert str(failure.value).startswith("Timed out waiting for consumption")
    finally:
        scenario.close()


def test_consumption_below_the_groups_last_commit_is_refused(tmp_path: Path) -> None:
    scenario = Scenario(FakeCluster(), tmp_path)
    consumer = VerifiableConsumer(scenario, 2, TOPIC, "g", client=scripted(GOOD), group_protocol="consumer")
    first, second = consumer.nodes
    with consumer.lock:
        for node in (first, second):
            consumer.before_start(node)
            consumer.deliver(node, {"name": "startup_complete"})
        consumer.deliver(first, assigned(0))
        consumer.deliver(first, consumed(0, 0, 9))
        consumer.deliver(first, committed(0, 10))
        consumer.deliver(first, revoked(0))
        consumer.deliver(second, assigned(0))
        consumer.deliver(second, consumed(0, 5, 12))  # the group had committed 10
    with pytest.raises(ScenarioFailure, match="Consumed position 5 is behind the current committed offset 10"):
        scenario.raise_errors()


def test_a_member_that_ignores_sigterm_fails_the_stop(tmp_path: Path) -> None:
    scenario = Scenario(FakeCluster(), tmp_path)
    consumer = VerifiableConsumer(scenario, 1, TOPIC, "g", client=scripted(GOOD, ignore_sigterm=True),
                                  stop_timeout_sec=2)
    try:
        consumer.start(timeout_sec=60)
        with pytest.raises(ScenarioFailure, match="did not stop within the specified timeout of 2 seconds"):
            consumer.stop_node(consumer.nodes[0])
    finally:
        scenario.close()
    assert not consumer.nodes[0].running  # close() SIGKILLs what is left


# --------------------------------------------------------------------------------- CI subset, report


def test_every_ci_scenario_exists() -> None:
    root = ROOT
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/kafkatest", "-m", "kafkatest_ci", "--collect-only", "-q",
         "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=root, timeout=120, check=False)
    collected = [line for line in result.stdout.splitlines() if line.startswith("tests/kafkatest/")]
    wanted = sum(len(clients) for clients in CI_SUBSET.values())
    assert len(collected) == wanted, result.stdout[-2000:]


def test_the_report_has_a_row_per_variant_and_a_column_per_client() -> None:
    rows = [
        {"test": "tests/kafkatest/test_consumer.py::test_group_consumption[java-classic-batching]",
         "scenario": "test_group_consumption", "params": {"client": "java"}, "outcome": "passed", "seconds": 44.2,
         "figures": {"consumed": 20081, "rebalances": 3}},
        {"test": "tests/kafkatest/test_consumer.py::test_group_consumption[asyncconsumer-trio-classic-batching]",
         "scenario": "test_group_consumption", "params": {"client": "asyncconsumer-trio"}, "outcome": "failed",
         "seconds": 12.0, "figures": {}},
    ]
    lines = report.table(rows).splitlines()
    assert lines[0] == "### OffsetValidationTest (test_consumer.py)"
    assert lines[4:] == [
        "| group_consumption | classic-batching | pass · 20,081 rec · 3 reb · 44 s | not run | **FAILED** · 12 s |"]


def test_an_interrupted_scenario_is_not_recorded_as_passed() -> None:
    @dataclass
    class Report:
        outcome: str

        @property
        def passed(self) -> bool:
            return self.outcome == "passed"

    assert report.outcome(Report("passed"), None) == "interrupted"  # Ctrl-C during the scenario
    assert report.outcome(Report("passed"), Report("failed")) == "failed"
    assert report.outcome(Report("passed"), Report("passed")) == "passed"
    assert report.outcome(Report("failed"), None) == "failed"  # the fixture failed: no call
    assert report.outcome(None, None) == "interrupted"
