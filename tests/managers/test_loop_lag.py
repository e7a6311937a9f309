"""LoopLagWatch: the event loop blocked for ``loop_lag_warning_ms`` or longer is counted and named in a
WARNING with how long, the deadline it put at risk and what to do (a fake clock, no event loop); the
deadlines each loop gives it (the consumer's, classic and KIP-848, and the share consumer's)."""

from __future__ import annotations

import logging
import re

import pytest

from asyncconsumer.config import build_config
from asyncconsumer.engine.loop import Engine
from asyncconsumer.engine.share_loop import ShareEngine
from asyncconsumer.managers.loop_lag import Deadline, LoopLagWatch

from .scripted import FakeClock

LOG = logging.getLogger("test.loop_lag")
GROUP = [
    Deadline("request_timeout_ms=30000", 30.0, "a request fails"),
    Deadline("heartbeat_interval_ms=3000", 3.0, "no heartbeat was sent meanwhile"),
    Deadline("session_timeout_ms=10000", 10.0, "the coordinator drops the member"),
]


class Loop:
    """What LoopCore does with the watch, on a fake clock: before each wait it says when it means to
    run again; the next turn says when it did."""

    def __init__(self, watch: LoopLagWatch) -> None:
        self.watch = watch
        self.clock = FakeClock()

    def sleep(self, planned: float, actual: float) -> None:
        self.watch.due = self.clock.now + planned
        self.watch.ran(self.clock.advance(actual))


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOG.name)
    return caplog


def watched(warn_after: float | None = 1.0, deadlines: list[Deadline] = GROUP) -> Loop:
    return Loop(LoopLagWatch(warn_after=warn_after, deadlines=lambda: deadlines, log=LOG))


def test_a_loop_that_runs_when_it_meant_to_or_earlier_has_no_lag(log: pytest.LogCaptureFixture) -> None:
    loop = watched()
    for _ in range(100):
        loop.sleep(1.0, 0.3)  # woken early by an event
        loop.sleep(0.5, 0.5)  # its deadline, on time
        loop.sleep(0.0, 0.0)  # a yield, run again at once
    assert (loop.watch.lag, loop.watch.max_lag, loop.watch.blocks) == (0.0, 0.0, 0)
    assert log.messages == []


def test_small_lags_are_measured_and_not_warned_about(log: pytest.LogCaptureFixture) -> None:
    loop = watched()
    loop.sleep(0.5, 0.75)
    assert loop.watch.lag == pytest.approx(0.25)
    loop.sleep(0.0, 0.9)
    loop.sleep(0.2, 0.2)
    assert loop.watch.lag == 0.0 and loop.watch.max_lag == pytest.approx(0.9) and loop.watch.blocks == 0
    assert log.messages == []


def test_a_block_past_the_session_timeout_names_it_the_heartbeats_and_what_to_do(
    log: pytest.LogCaptureFixture,
) -> None:
    loop = watched()
    loop.sleep(0.5, 12.8)  # the application slept 12.3 s past the loop's next deadline
    assert loop.watch.lag == pytest.approx(12.3) and loop.watch.blocks == 1
    assert loop.watch.blocked_seconds == pytest.approx(12.3)
    [record] = log.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "the event loop was blocked for 12.3s, past session_timeout_ms=10000 (the coordinator drops the member) "
        "and heartbeat_interval_ms=3000; 41% of request_timeout_ms=30000 (a request fails); something on the "
        "event loop did not yield for that long (a synchronous call, time.sleep, CPU-bound work in the "
        "application)")
    assert "await anyio.to_thread.run_sync(fn, *args)" in record.getMessage()


def test_a_block_short_of_every_deadline_says_how_much_of_the_nearest_it_used(log: pytest.LogCaptureFixture) -> None:
    loop = watched()
    loop.sleep(0.0, 1.2)
    assert re.match(r"the event loop was blocked for 1\.2s, 40% of heartbeat_interval_ms=3000 \(no heartbeat was sent "
                    r"meanwhile\); something on the event loop", log.messages[0])


def test_repeated_blocks_are_named_once_a_minute_a_worse_one_at_once(log: pytest.LogCaptureFixture) -> None:
    loop = watched()
    loop.sleep(0.0, 4.0)  # past the heartbeat interval: named
    for _ in range(5):
        loop.sleep(0.0, 4.0)  # the same again within the minute: counted, not named
        loop.sleep(1.0, 1.0)
    assert len(log.messages) == 1 and loop.watch.blocks == 6
    loop.sleep(0.0, 11.0)  # past the session timeout: named at once
    assert len(log.messages) == 2 and "past session_timeout_ms=10000" in log.messages[1]
    loop.clock.advance(60)
    loop.sleep(0.0, 4.0)  # the heartbeat block a minute later: named, with the ones left out
    assert len(log.messages) == 3 and log.messages[2].endswith("(5 more like it in the last 100s not logged)")
    assert loop.watch.blocks == 8 and loop.watch.max_lag == pytest.approx(11.0)


def test_none_measures_the_lag_and_neither_counts_nor_warns(log: pytest.LogCaptureFixture) -> None:
    loop = watched(warn_after=None)
    loop.sleep(0.0, 60.0)
    assert loop.watch.lag == loop.watch.max_lag == pytest.approx(60.0)
    assert (loop.watch.blocks, loop.watch.blocked_seconds) == (0, 0.0) and log.messages == []
    with pytest.raises(ValueError, match="warn_after"):
        LoopLagWatch(warn_after=0.0, deadlines=list, log=LOG)


# -- the deadlines each loop gives it ---------------------------------------------------------------


def block(engine: Engine | ShareEngine, seconds: float, caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    engine.loop_lag.due = 0.0
    engine.loop_lag.ran(seconds)
    [message] = [r.getMessage() for r in caplog.records if "event loop was blocked" in r.getMessage()]
    return message


def test_the_consumers_deadlines_are_its_requests_and_while_subscribed_its_groups(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    options = {"group_id": "g", "session_timeout_ms": 10000, "heartbeat_interval_ms": 2000,
               "max_poll_interval_ms": 20000, "request_timeout_ms": 30000}
    engine = Engine(build_config(options))
    assert block(engine, 2.5, caplog).startswith(
        "the event loop was blocked for 2.5s, 8% of request_timeout_ms=30000 (a fetch, commit or other request in "
        "flight fails after that long and its connection is closed)")
    assert engine.membership is not None
    engine.membership.subscribe(frozenset({"t"}), None)
    message = block(engine, 12.0, caplog)
    assert message.startswith(
        "the event loop was blocked for 12.0s, past session_timeout_ms=10000 (the group coordinator drops a member "
        "it hears no heartbeat from for that long: this member rejoins, and its partitions may have moved to another "
        "member meanwhile) and heartbeat_interval_ms=2000; 60% of max_poll_interval_ms=20000 (a member whose "
        "application does not poll for that long leaves the group); something on the event loop")
    assert "past max_poll_interval_ms=20000" in block(engine, 25.0, caplog)

    kip848 = Engine(build_config({**options, "group_protocol": "consumer"}))
    assert kip848.membership is not None
    kip848.membership.subscribe(frozenset({"t"}), None)
    message = block(kip848, 3.0, caplog)
    assert message.startswith(
        "the event loop was blocked for 3.0s, past the group's heartbeat interval of 2000 ms (no heartbeat was sent "
        "meanwhile); 15% of max_poll_interval_ms=20000")
    assert "past the group's session timeout, group.consumer.session.timeout.ms on the broker, 45000 ms by default " \
        "(the group coordinator drops a member" in block(kip848, 46.0, caplog)


def test_the_share_consumers_deadlines_are_its_heartbeats_and_the_acquisition_lock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    engine = ShareEngine(build_config({"group_id": "workers"}), max_records=50)
    assert block(engine, 1.5, caplog).startswith("the event loop was blocked for 1.5s, 5% of request_timeout_ms=30000")
    engine.membership.epoch = 1  # a member (what a ShareGroupHeartbeat answer makes it)
    engine.membership.heartbeat_interval = 5.0
    engine.fetcher.lock_timeout = 15.0  # what ShareFetch answers announce
    message = block(engine, 20.0, caplog)
    assert message.startswith(
        "the event loop was blocked for 20.0s, past the acquisition lock of 15000 ms, the group's "
        "share.record.lock.duration.ms (records acquired and not acknowledged by then go back to the broker, which "
        "delivers them again) and the share group's heartbeat interval of 5000 ms; 67% of request_timeout_ms=30000")
    assert "past the share group's session timeout, group.share.session.timeout.ms on the broker" in block(
        engine, 50.0, caplog)
