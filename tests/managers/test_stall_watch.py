"""StallWatch: a partition the consumer should be reading and is not is named in one WARNING, with
its broker and the reason, once it has been quiet for longer than the bound (scripted fetches, a
fake clock)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from asyncconsumer.errors import KafkaConnectionError, NotLeaderOrFollowerError
from asyncconsumer.managers.stall_watch import StallWatch
from asyncconsumer.managers.subscription import PartitionPhase
from asyncconsumer.structs import TopicPartition

from .test_fetch import T0, T1, T2, Setup, data, records, respond

QUIET = 6.0


class Watched(Setup):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.coordinator = "group coordinator not known yet; last error: None"
        self.watch = StallWatch(
            self.subs, self.fetcher, self.buffer, quiet_after=QUIET,
            describe_node=lambda node: f"broker {node} at 127.0.0.1:{9000 + node} (not connected)",
            describe_coordinator=lambda: self.coordinator,
            leader_of=lambda tp: self.leaders[tp][0] if tp in self.leaders else None,
        )

    def start(self, offsets: dict[TopicPartition, int]) -> None:
        super().start(offsets)
        self.watch.check(self.clock.now)  # the loop checks every turn: it sees the assignment at once

    def check_after(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.watch.check(self.clock.now)


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="asyncconsumer.fetch")
    return caplog


def test_a_partition_answered_in_time_is_never_named(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.start({T0: 0})
    for i in range(20):
        sent = s.fetch()
        s.check_after(QUIET - 0.5)  # each fetch answered just inside the bound
        respond(sent, {T0: data(T0, high_watermark=i)})
        s.watch.check(s.clock.now)
    assert log.messages == []


def test_a_fetch_in_flight_past_the_bound_is_named_once_with_its_broker(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.start({T0: 0})
    sent = s.fetch()  # to T0's leader, broker 1
    s.check_after(QUIET - 0.1)
    assert log.messages == []
    s.check_after(0.5)  # checks run at most every half second
    assert log.messages == [
        "no records fetched for t-0 for 6.4s (broker 1 at 127.0.0.1:9001 (not connected)): "
        "a fetch has been in flight for 6.4s"
    ]
    for _ in range(10):  # once per quiet spell
        s.check_after(1.0)
    assert len(log.messages) == 1
    respond(sent, {T0: data(T0, high_watermark=0)})
    s.check_after(0.5)
    assert log.messages[1] == "t-0 fetched again after 16.4s"


def test_a_partition_failing_again_and_again_is_named_with_the_error(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.start({T0: 0})
    for _ in range(8):
        respond(s.fetch(), {T0: data(T0, error_code=NotLeaderOrFollowerError.code)})
        s.check_after(1.0)
    assert len(log.messages) == 1
    assert log.messages[0].startswith("no records fetched for t-0 for 7.0s (broker 1 at 127.0.0.1:9001")
    assert "NOT_LEADER_OR_FOLLOWER" in log.messages[0]


def test_a_lost_connection_backing_off_is_named(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.start({T0: 0})
    s.fetch().fail(KafkaConnectionError("connection to 127.0.0.1:9001 closed: EOF"))
    s.check_after(QUIET + 0.1)
    assert log.messages == [
        "no records fetched for t-0 for 6.1s (broker 1 at 127.0.0.1:9001 (not connected)): "
        "no fetch answered (last error: connection to 127.0.0.1:9001 closed: EOF)"
    ]


def test_a_position_lookup_is_named_with_the_coordinator(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.subs.has_group = True
    s.subs.assign([T0])
    s.watch.check(s.clock.now)
    assert s.subs.get(T0).phase is PartitionPhase.AWAIT_COMMITTED  # type: ignore[union-attr]
    s.coordinator = "group coordinator not known yet; last error: COORDINATOR_NOT_AVAILABLE"
    s.check_after(QUIET + 1)
    assert log.messages == [
        "no records fetched for t-0 for 7.0s (no broker yet): waiting for its committed offset from the group "
        "coordinator (group coordinator not known yet; last error: COORDINATOR_NOT_AVAILABLE)"
    ]


def test_partitions_the_application_holds_are_not_quiet(log: pytest.LogCaptureFixture) -> None:
    """Paused, or with their share buffered (the application has not taken it): the consumer is not
    expected to fetch them, however long that lasts; once it is, the clock starts then."""
    s = Watched(buffer_bytes=4096)
    s.start({T0: 0, T1: 0})
    s.subs.get(T1).pause()  # type: ignore[union-attr]
    respond(s.fetch(), {T0: data(T0, records(0, 400), high_watermark=400)})
    assert s.buffer.buffered_bytes(T0) >= s.fetcher.read_ahead_bytes()
    held_then_let_go(s, log, lambda: setattr(s.subs.partitions[T1], "paused", False), "t-1 for 6.5s (broker 2")


def held_then_let_go(s: Watched, log: pytest.LogCaptureFixture, let_go: Callable[[], None], named: str) -> None:
    """A partition held for 30 s is not quiet; once ``let_go`` the clock starts, and the WARNING
    names it (``named``: what follows "no records fetched for ") after the bound."""
    for _ in range(30):
        s.check_after(1.0)
    assert log.messages == []
    let_go()
    s.check_after(QUIET - 0.5)
    assert log.messages == []
    s.check_after(1.0)
    assert len(log.messages) == 1 and log.messages[0].startswith(f"no records fetched for {named}")


def test_a_partition_at_its_fetch_limit_is_not_quiet(log: pytest.LogCaptureFixture) -> None:
    """``Consumer.fetch_until()``: once a fetch reached the limit, the consumer is not expected to
    fetch the partition however long the application takes with what it has; raised, the clock
    starts then."""
    s = Watched()
    s.start({T0: 0})
    s.subs.get(T0).fetch_until(2)  # type: ignore[union-attr]
    respond(s.fetch(), {T0: data(T0, records(0, 3), high_watermark=400)})
    held_then_let_go(s, log, lambda: setattr(s.subs.partitions[T0], "fetch_end", None), "t-0 for 6.5s (broker 1")


def test_one_warning_per_broker_and_unassigned_partitions_are_forgotten(log: pytest.LogCaptureFixture) -> None:
    s = Watched()
    s.start({T0: 0, TopicPartition("t", 2): 0})  # both on broker 1
    s.fetch()
    s.check_after(QUIET + 0.5)
    assert len(log.messages) == 1 and log.messages[0].startswith("no records fetched for t-0, t-2 for 6.5s (broker 1")
    s.subs.assign([])
    s.check_after(1.0)
    assert s.watch.warned == {} and s.fetcher.answered == {} and len(log.messages) == 1


def test_a_partition_swapped_for_another_is_forgotten(log: pytest.LogCaptureFixture) -> None:
    """As many partitions assigned as before, one of them new: what was kept for the one that went
    is dropped all the same."""
    s = Watched()
    s.start({T0: 0, T2: 0})
    respond(s.fetch(), {T0: data(T0, high_watermark=0), T2: data(T2, high_watermark=0)})
    s.check_after(QUIET + 0.5)
    assert set(s.watch.warned) == {T0, T2} and set(s.fetcher.answered) == {T0, T2}
    s.subs.assign([T0, T1])
    s.check_after(1.0)
    assert set(s.watch.warned) == {T0} and T2 not in s.fetcher.answered


def test_a_full_buffer_holds_a_partition_with_any_records_in_it(log: pytest.LogCaptureFixture) -> None:
    """With the buffer full, a partition with records buffered is not fetched, however few it has
    (less than its share): it is not quiet until the application makes room."""
    s = Watched(buffer_bytes=4096)
    s.start({T0: 0, T2: 0})
    respond(s.fetch(), {T0: data(T0, records(0, 1), high_watermark=400),
                        T2: data(T2, records(0, 400), high_watermark=400)})
    assert s.buffer.full and 0 < s.buffer.buffered_bytes(T0) < s.fetcher.read_ahead_bytes()
    held_then_let_go(s, log, lambda: s.buffer.drop(lambda f: False), "t-0, t-2 for 6.5s (broker 1")
