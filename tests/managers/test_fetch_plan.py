"""The fetch manager's plan: a fetch that walks only what changed asks exactly what a full walk would.

Two fetch managers live through the same random history (records arriving, partitions failing,
seeks, pauses, limits, rewinds, leaders moving or unknown, read replicas named and given up,
assignments changing, metadata requests lost, time passing, the buffer filling and emptying,
sessions lost): one keeps its plan from turn to turn, the other walks every partition every turn
(its plan dropped before each poll).  Every turn both must send the same requests and ask for
metadata as often, and they must report the same answer times to the stall watch.

The planned twin turns as the engine's loop does, when woken: by an answer, by the application's
changes, by a deadline of its managers, or by a completed fetch leaving the buffer
when ``may_fetch_after_release`` says a fetch may follow.  The walking twin turns every step, so
in a step that woke nothing it must find nothing to send either.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from asyncconsumer.managers.fetch import FetchManager
from asyncconsumer.structs import TopicPartition

from .scripted import Sent, fetch_body, fetch_partition, load_metadata, metadata_body
from .test_fetch import MAX_WAIT_MS, Setup, records

TPS = [TopicPartition(t, p) for t in ("t", "u") for p in range(4)]
NOT_LEADER = 6
FETCH_SESSION_ID_NOT_FOUND = 70


class EagerAnswers:
    """The answer times written at each answer (what the fetch manager keeps until read)."""

    def __init__(self) -> None:
        self._times: dict[TopicPartition, float] = {}

    def note(self, node: int, when: float, asked: dict[TopicPartition, Any], unanswered: set[TopicPartition],
             built_from: object) -> None:
        for tp in asked:
            if tp not in unanswered:
                self._times[tp] = when

    def times(self) -> dict[TopicPartition, float]:
        return self._times


def walking(fetcher: FetchManager) -> None:
    """Make ``fetcher`` walk every partition each turn (no plan kept from the turn before), and
    write its answer times at once."""
    fetcher._answers = EagerAnswers()  # type: ignore[assignment]
    poll = fetcher.poll

    def poll_walking(now: float) -> list[Any]:
        fetcher._plan = None
        return poll(now)

    fetcher.poll = poll_walking  # type: ignore[method-assign]


def request_of(sent: Sent) -> tuple[Any, ...]:
    """What a request asks, in an order-free form (the plan may name partitions in another order)."""
    body = sent.body()
    topics = {
        (str(t.get("topic_id", t.get("topic"))), p["partition"], p["fetch_offset"], p["current_leader_epoch"],
         p["last_fetched_epoch"])
        for t in body["topics"] for p in t["partitions"]
    }
    gone = {(str(t.get("topic_id", t.get("topic"))), p) for t in body["forgotten_topics_data"] for p in t["partitions"]}
    return sent.node_id, sent.version, body["session_id"], body["session_epoch"], sorted(topics), sorted(gone)


def settle(s: Setup, lost: list[bool]) -> int:
    """One loop turn, the metadata and position validations it asks for answered at once (the
    leaders as they are, or a metadata request lost where ``lost`` says; no log truncated).
    Returns how many metadata requests were sent."""
    asked = 0
    for fail in lost:
        s.h.poll()
        for sent in s.h.take_all("Metadata"):
            asked += 1
            if fail:
                sent.fail(ConnectionError("lost"))
            else:
                sent.respond(metadata_body(s.leaders))
        for sent in s.h.take_all("OffsetForLeaderEpoch"):
            sent.respond({"topics": [
                {"topic": t["topic"], "partitions": [
                    {"error_code": 0, "partition": p["partition"], "leader_epoch": p["leader_epoch"],
                     "end_offset": 1 << 30} for p in t["partitions"]]}
                for t in sent.body()["topics"]]})
    assert all(p.api == "Fetch" for p in s.h.pending), s.h.pending
    return asked


class Twins:
    def __init__(self, rng: random.Random, buffer_bytes: int, versions: dict[str, int] | None,
                 reading: float = 0.0, nodes: int = 2, partition_max: int | None = None) -> None:
        self.rng = rng
        self.reading = reading  # the chance that a step only reads from the buffer (a backlog)
        leaders = {tp: (1 + tp.partition % nodes, 3) for tp in TPS}
        self.leaders = dict(leaders)  # each partition's leader, also while the metadata lists none
        self.planned = Setup(leaders=leaders, buffer_bytes=buffer_bytes, versions=versions)
        self.walking = Setup(leaders=leaders, buffer_bytes=buffer_bytes, versions=versions)
        walking(self.walking.fetcher)
        for s in self.both:
            s.fetcher._preferred_ttl = 1.0  # read replicas chosen for a second: their choices end too
            if partition_max is not None:  # a partition's least share of the buffer
                s.fetcher._partition_max_bytes = partition_max
        self.pending: list[tuple[Sent, Sent]] = []
        for s in self.both:
            s.start({tp: 0 for tp in TPS[:6]})
        self.end: dict[TopicPartition, int] = dict.fromkeys(TPS, 0)  # the log's end, per partition
        #: Whether the planned twin's loop was woken since its last turn; its managers' next deadline.
        self.woken = True
        self.deadline = 0.0
        #: Releases since the last turn that did not wake the loop for their node's hold; the quiet
        #: turns checked after such releases (the wakes not made would have sent nothing).
        self.held_releases = 0
        self.quiet_turns = 0
        fetcher = self.planned.fetcher
        may_fetch = fetcher.may_fetch_after_release

        def noted(tp: TopicPartition, was_full: bool) -> bool:
            held = tp in fetcher._held_by
            wake = may_fetch(tp, was_full)
            self.held_releases += held and not wake
            return wake

        fetcher.may_fetch_after_release = noted  # type: ignore[method-assign]

    @property
    def both(self) -> tuple[Setup, Setup]:
        return self.planned, self.walking

    def turn(self) -> None:
        planned, walking = self.both
        lost = [self.rng.random() < 0.2 for _ in range(3)]
        if not self.woken and planned.clock.now < self.deadline:
            # Nothing woke the planned twin's loop since its last turn (releases said no fetch may
            # follow): it sleeps.  The walking twin turns anyway, and must find nothing to do.
            self.quiet_turns += self.held_releases > 0
            self.held_releases = 0
            assert settle(walking, lost) == 0
            assert walking.h.take_all("Fetch") == [], "a release that did not wake the loop let a fetch go"
            return
        asked = settle(planned, lost)
        assert asked == settle(walking, lost)  # the same metadata asked for
        # The requests sent this turn (those still in flight were taken from the harness before).
        mine = sorted(planned.h.take_all("Fetch"), key=lambda s: s.node_id or 0)
        theirs = sorted(walking.h.take_all("Fetch"), key=lambda s: s.node_id or 0)
        assert [request_of(s) for s in mine] == [request_of(s) for s in theirs]
        self.woken = False
        self.held_releases = 0
        now = planned.clock.now
        self.deadline = min(m.next_deadline(now) for m in (planned.metadata, planned.validator, planned.fetcher))
        self.pending += list(zip(mine, theirs, strict=True))
        if self.rng.random() < 0.1:  # reading them writes out the answers kept (see _AnswerTimes)
            assert self.planned.fetcher.answered == self.walking.fetcher.answered
        for tp, state in self.planned.subs.partitions.items():
            other = self.walking.subs.partitions[tp]
            assert (state.fetch_offset, state.epoch, state.paused) == (other.fetch_offset, other.epoch, other.paused)

    def answer(self) -> None:
        """Answer some of the fetches in flight: records for some partitions, errors for a few."""
        rng = self.rng
        keep = []
        for mine, theirs in self.pending:
            if rng.random() < (0.5 if self.reading else 0.2):
                keep.append((mine, theirs))
                continue
            self.woken = True  # an answer wakes the loop
            roll = rng.random()
            if roll < 0.05:
                for s in (mine, theirs):
                    s.respond(fetch_body(s.version, {}, session_id=0, error_code=FETCH_SESSION_ID_NOT_FOUND))
                continue
            if roll < 0.08:
                for s in (mine, theirs):
                    s.fail(ConnectionError("lost"))
                continue
            asked = [tp for tp in self.planned.subs.partitions if self._asked(mine, tp)]
            parts: dict[TopicPartition, dict[str, Any]] = {}
            for tp in asked:
                pick = rng.random()
                offset = self.planned.subs.partitions[tp].fetch_offset
                if pick < 0.3 or (self.reading and pick < 0.8):  # a backlog: records in most answers
                    count = rng.randint(1, 3)
                    self.end[tp] = max(self.end[tp], offset + count)
                    parts[tp] = fetch_partition(tp.partition, records=records(offset, count),
                                                high_watermark=self.end[tp])
                elif pick < 0.35:
                    parts[tp] = fetch_partition(tp.partition, records=None, error_code=NOT_LEADER)
                elif pick < 0.45:
                    parts[tp] = fetch_partition(tp.partition, records=b"", high_watermark=self.end[tp])
                elif pick < 0.5:  # KIP-392: read from the other broker (now and then one not known)
                    parts[tp] = fetch_partition(tp.partition, records=b"", high_watermark=self.end[tp])
                    parts[tp]["preferred_read_replica"] = 9 if pick < 0.455 else 3 - (mine.node_id or 1)
            for s in (mine, theirs):
                s.respond(fetch_body(s.version, parts, session_id=7))
        self.pending = keep

    def _asked(self, sent: Sent, tp: TopicPartition) -> bool:
        return tp in self.planned.fetcher._in_flight.get(sent.node_id or 0, {})

    def step(self) -> None:
        rng = self.rng
        reading = rng.random() < self.reading  # a backlog: reads, one partition at a time
        roll = 0.65 if reading else rng.random()
        tp = rng.choice(TPS)
        offset, limit = rng.randint(0, self.end[tp]), rng.randint(0, 3)
        count = 1 if reading else rng.randint(1, 3)
        other_node = rng.random() < 0.5
        if roll >= 0.35 and not 0.62 <= roll < 0.70:
            self.woken = True  # the application's changes wake the loop (releases: see below)
        for s in self.both:
            state = s.subs.partitions.get(tp)
            if roll < 0.35:
                pass  # only answers and time
            elif roll < 0.45 and state is not None:
                s.subs.seek(tp, offset)
            elif roll < 0.55 and state is not None:
                state.resume() if state.paused else state.pause()
            elif roll < 0.62 and state is not None:
                state.fetch_until(None if state.fetch_end is not None else state.fetch_offset + limit)
            elif roll < 0.70:
                for fetch in s.buffer.fetches()[:count]:
                    s.buffer.remove(fetch)
            elif roll < 0.76 and tp in s.leaders:
                node, epoch = s.leaders[tp]
                s.leaders[tp] = self.leaders[tp] = (3 - node if other_node else node, epoch + 1)
                load_metadata(s.metadata, s.clock, s.leaders)
            elif roll < 0.80:
                assigned = [t for t in TPS if t in s.subs.partitions]
                gone = state is not None and len(assigned) > 1
                wanted = [t for t in assigned if t != tp] if gone else [*assigned, tp]
                s.subs.assign(wanted)
                if state is None:
                    s.subs.seek(tp, 0)
            elif roll < 0.85 and state is not None and state.has_position:
                state.rewind(min(offset, state.fetch_offset))
            elif roll < 0.88:  # the metadata loses the partition's leader, or finds it again
                if tp in s.leaders:
                    del s.leaders[tp]
                else:
                    s.leaders[tp] = self.leaders[tp]
                load_metadata(s.metadata, s.clock, s.leaders)
        if any(wake for _, wake in self.planned.released):
            self.woken = True
        self.planned.released.clear()
        if rng.random() < 0.3:
            delay = rng.choice([0.01, 0.13, 0.6])
            for s in self.both:
                s.clock.advance(delay)
        self.answer()
        self.turn()


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("buffer_bytes", [700, 1 << 20])
@pytest.mark.parametrize("version", [None, 12])
def test_a_plan_kept_between_turns_asks_what_a_walk_would(seed: int, buffer_bytes: int, version: int | None) -> None:
    history(seed, buffer_bytes, {"Fetch": version} if version else None)


def history(seed: int, buffer_bytes: int, versions: dict[str, int] | None, **backlog: Any) -> Twins:
    twins = Twins(random.Random(seed), buffer_bytes, versions, **backlog)
    twins.turn()
    for _ in range(150):
        twins.step()
    assert twins.planned.fetcher.answered == twins.walking.fetcher.answered
    return twins


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_backlog_read_wakes_the_loop_only_when_a_fetch_may_follow(nodes: int) -> None:
    """Histories where most steps read one partition's records from a small buffer, records come in
    most answers, and a few answers' records are a partition's share of the buffer: the holds, and
    the releases that do not wake the loop for them (the twins then compared in the steps after)."""
    quiet = [history(seed, 700, None, reading=0.6, nodes=nodes, partition_max=100).quiet_turns
             for seed in range(40)]
    assert sum(quiet) >= 40, quiet


class CountedWalks:
    """Counts the fetch manager's walks over the partitions (its calls of ``fetchable``)."""

    def __init__(self, s: Setup) -> None:
        self.count = 0
        fetchable = s.subs.fetchable

        def counted(now: float) -> list[Any]:
            self.count += 1
            return fetchable(now)

        s.subs.fetchable = counted  # type: ignore[method-assign]


def test_a_caught_up_consumer_walks_its_partitions_only_when_something_moved() -> None:
    tps = [TopicPartition("t", p) for p in range(50)]
    s = Setup(leaders={tp: (1, 3) for tp in tps})
    s.start(dict.fromkeys(tps, 0))
    walks = CountedWalks(s)
    sent = s.fetch()
    sent.respond(fetch_body(sent.version, {tp: fetch_partition(tp.partition, high_watermark=0) for tp in tps},
                            session_id=7))
    for offset in range(4):  # a record for one partition each time: the same plan
        if offset == 2:  # after the first answer (the epochs vouched for, a batch's epoch seen)
            assert walks.count == 3
        sent = s.fetch()
        respond_with = {tps[7]: fetch_partition(7, records=records(offset, 1), high_watermark=offset + 1)}
        sent.respond(fetch_body(sent.version, respond_with, session_id=7))
        s.buffer.remove(s.buffer.fetches()[0])
    assert walks.count == 3
    sent = s.fetch()
    assert {p["partition"]: p["fetch_offset"] for t in sent.body()["topics"] for p in t["partitions"]} == {7: 4}
    sent.respond(fetch_body(sent.version, {}, session_id=7))
    s.subs.partitions[tps[3]].pause()  # a move: walked again, and the paused partition forgotten
    sent = s.fetch()
    assert walks.count == 4
    assert [p for t in sent.body()["forgotten_topics_data"] for p in t["partitions"]] == [3]


def test_a_consumer_with_records_waiting_in_the_buffer_walks_only_when_something_moved() -> None:
    """Records buffered for one partition (a backlog being read): each turn leaves that partition out
    of the plan's fetch, and nothing is walked again while the plan holds."""
    tps = [TopicPartition("t", p) for p in range(50)]
    s = Setup(leaders={tp: (1, 3) for tp in tps}, buffer_bytes=1 << 17)  # a share of 4 KiB each
    s.start(dict.fromkeys(tps, 0))
    walks = CountedWalks(s)
    sent = s.fetch()
    backlog = records(0, 600)  # more than the partition's share (max_partition_fetch_bytes)
    sent.respond(fetch_body(sent.version, {tp: fetch_partition(tp.partition, high_watermark=0) for tp in tps}
                            | {tps[7]: fetch_partition(7, records=backlog, high_watermark=1000)}, session_id=7))
    assert s.buffer.bytes_by_partition[tps[7]] >= s.fetcher.read_ahead_bytes()
    before = walks.count
    for turn in range(5):
        if turn == 2:  # after the first answers (the epochs vouched for, the batches' epochs seen)
            assert walks.count == before + 2
            before = walks.count
        s.h.assert_idle("Fetch")  # the others are caught up: held for fetch_max_wait_ms
        s.h.advance(MAX_WAIT_MS / 1000)
        sent = s.fetch()
        assert tps[7] not in {TopicPartition("t", p["partition"]) for t in sent.body()["topics"]
                              for p in t["partitions"]}
        sent.respond(fetch_body(sent.version, {tps[3]: fetch_partition(3, records=records(turn, 1),
                                                                       high_watermark=turn + 1)}, session_id=7))
        s.buffer.remove(next(f for f in s.buffer.fetches() if f.tp == tps[3]))
    assert walks.count == before
    s.buffer.remove(s.buffer.fetches()[0])  # the backlog's records taken: fetched again, same plan
    sent = s.fetch()
    assert {p["partition"]: p["fetch_offset"] for t in sent.body()["topics"] for p in t["partitions"]} == {
        3: 5, 7: 600}  # what moved since each was last asked
    assert walks.count == before
