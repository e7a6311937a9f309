"""The fetch sender: builds Fetch requests and files responses in the buffer.

One fetch in flight per broker.  A partition is fetched when its position is
known, it is not paused, its fetch offset is below its ``fetch_until()`` limit
(if it has one), and it has less than its share of the buffer
buffered (``fetch_buffer_bytes`` split between the assigned partitions, at
least ``max_partition_fetch_bytes``).  While the whole buffer is full (it
counts the response frames it holds, managers/fetch_buffer.py) only the
partitions with nothing buffered are fetched: the application may be waiting
for one of them alone (``getmany(tp)``, the others paused) while the others'
records hold the buffer, and a partition that has records to read is fetched
again once the frames they are in are gone.  So while the application works
through buffered data the next chunk is already on its way, memory stays
bounded however slow the application is (by the buffer, plus one fetch of each
partition that has nothing in it), and a slow application gets responses of
every partition at once, whose frames the next responses use again.

A fetch naming only partitions at the end of their logs is parked by the
broker for up to ``fetch_max_wait_ms``, and with one fetch per broker the
partitions still being read could not be fetched meanwhile.  So while some
partition of that broker has its share buffered, such a fetch is held back
(for at most ``fetch_max_wait_ms``) and goes out with the next fetch of the
busy ones, which the broker answers at once.

A completed fetch leaving the buffer wakes the loop only when a fetch may follow
(``may_fetch_after_release``): not while its partition or its broker has a fetch
out, nor while a hold stands (it counts its busy partitions, ``_Hold``: one read
out, at the end of its log too, joins the held ones while another is still
busy).  So reading a backlog over many partitions does not turn the loop for
each of them.

What to fetch costs what changed: a walk over every partition finds the ones to fetch, by node
(``_Plan``), and the next turns use it again while nothing it looked at moved (the subscription's
``changes`` and ``moves``, the cluster snapshot, the read replicas chosen) and no backoff or choice
of replica ends; each turn leaves out of it what is in flight or has its share of the buffer.
While nothing is left out, each node's fetch is a copy of its last one, with the partitions a
response named since looked at again: only ``fetched()`` moves a fetch offset without moving the
counts.  ``tests/managers/test_fetch_plan.py`` checks it against a walk a turn.

Incremental fetch sessions (KIP-227): after a full fetch the broker remembers
the partitions; later requests name only partitions whose fetch offset moved,
and list the ones to forget.

Fetching from followers (KIP-392): with ``client_rack`` set, a leader running a rack-aware
replica selector answers with a ``preferred_read_replica``; the partition is then fetched from
that replica until ``metadata_max_age_ms`` has passed or a fetch from it fails in any way (a lost
connection, a partition error, an offset the follower does not have yet): then from the leader
again, which may name a replica anew.  A named replica missing from the cluster metadata (a
broker just back) is fetched from once the metadata, refreshed at once, lists it; the leader
serves meanwhile.  Which broker served how many fetches is counted in ``responses_by_node``.

Log truncation (KIP-320): a partition whose position the current leader epoch
has not vouched for is left to the position validator (managers/validation.py)
and not fetched.  Fetch v12+ sends the epoch of the last fetched batch
(``last_fetched_epoch``); a ``diverging_epoch`` in the answer goes to the
validator as if it had asked.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ..errors import FETCH_SESSION_CODES, REFRESH_METADATA_CODES, KafkaError, OffsetOutOfRangeError, error_for_code
from ..protocol.compression import DEFAULT_MAX_SIZE
from ..protocol.records import scan_batches
from ..structs import TopicPartition, by_topic
from .fetch_buffer import CompletedFetch, FetchBuffer
from .metadata import ZERO_UUID, MetadataManager, PartitionInfo
from .requests import Body, UnsentRequest
from .subscription import PartitionPhase, PartitionState, SubscriptionState

log = logging.getLogger("asyncconsumer.fetch")

#: (state, offset checked, epoch, its end offset, leader epoch asked under): a diverging epoch.
DivergenceHandler = Callable[[PartitionState, int, int, int, int], None]


#: What a fetch asks of one partition, and the broker's session remembers, compared as a tuple:
#: ``(fetch_offset, leader_epoch, topic_id, last_fetched_epoch, state_epoch)``, read by the
#: indexes below.  The last is not sent: the partition state's ``epoch`` when the fetch was built
#: (a seek or reset moves it, and the answer to the old position is then stale); a partition whose
#: epoch moved is named again, as one whose offset moved.  A plain tuple: a fetch makes one for
#: each partition it covers, and a ``NamedTuple`` costs several times as much to make.
SessionPartition = tuple[int, int, bytes, int, int]
FETCH_OFFSET: Final = 0
LEADER_EPOCH: Final = 1
TOPIC_ID: Final = 2
LAST_FETCHED_EPOCH: Final = 3
STATE_EPOCH: Final = 4


@dataclass(slots=True)
class FetchSession:
    """KIP-227 session state for one broker."""

    session_id: int = 0
    epoch: int = 0
    #: What the broker remembers per partition: what we last sent for it.
    partitions: dict[TopicPartition, SessionPartition] = field(default_factory=dict)

    def reset(self) -> None:
        self.session_id, self.epoch = 0, 0
        self.partitions = {}  # a new dict: the one it held may be a request's (``_update_session``)


@dataclass(slots=True, eq=False)
class _Plan:
    """The partitions a walk found fetchable, grouped by the node each is fetched from, and what
    that walk depended on.  While none of it moves (see ``SubscriptionState.moves``), each node's
    next fetch asks for the same partitions (less what the turn leaves out), and only a response
    moves their fetch offsets.  A
    partition without a leader, or a read replica the metadata does not list yet, has the walk ask
    for metadata: its answer is a new ``Cluster``, so the partitions are walked again then (and the
    metadata manager asks again by itself when a request fails)."""

    changes: int
    moves: int
    #: ``FetchManager._preferred_moves``: the read replicas the leaders named.
    preferred_moves: int
    cluster: object
    #: The earliest backoff or read replica's choice that ends: the partitions are walked again then.
    until: float
    by_node: dict[int, list[tuple[PartitionState, PartitionInfo]]]
    #: Partition -> its node, made when first asked.
    _nodes: dict[TopicPartition, int] | None = None

    def node_of(self, tp: TopicPartition) -> int | None:
        """The node ``tp`` is fetched from in this plan (None: it is not fetched)."""
        nodes = self._nodes
        if nodes is None:
            nodes = self._nodes = {state.tp: node for node, picked in self.by_node.items() for state, _ in picked}
        return nodes.get(tp)


@dataclass(slots=True, eq=False)
class _Hold:
    """A node's fetch of caught-up partitions, held back while some of its partitions have their
    share of the buffer (``busy``: how many are left; a partition stops being busy only when its
    own records leave the buffer, or when the buffer stops being full, which wakes the loop)."""

    since: float
    busy: int


class _AnswerTimes:
    """When each partition last had a fetch answered without an error for it: what the stall watch
    reads, a few times a second, while a consumer with many partitions gets hundreds of answers a
    second that each cover every partition it asked for (an incremental answer leaves out the ones
    with no news: they count as answered).

    So an answer is kept whole, per node, as (when, what was asked, the partitions it did not
    answer: an error, or a position that moved since), and written out only when read, or when the
    node's next answer does not cover it: the next answer to a request built from the last one (the
    same partitions) that leaves no partition unanswered that the last one answered replaces it,
    any other answer has it written out first.  Answers are written out oldest first (every one up
    to the one written), so every partition's time only moves forward."""

    __slots__ = ("_kept", "_times")

    def __init__(self) -> None:
        self._times: dict[TopicPartition, float] = {}
        self._kept: dict[int, tuple[float, dict[TopicPartition, SessionPartition], set[TopicPartition]]] = {}

    def note(
        self,
        node: int,
        when: float,
        asked: dict[TopicPartition, SessionPartition],
        unanswered: set[TopicPartition],
        built_from: dict[TopicPartition, SessionPartition] | None,
    ) -> None:
        """``node`` answered a request of ``asked`` (``built_from``: the request it was copied
        from, which asked for the same partitions) at ``when``, but for ``unanswered``."""
        kept = self._kept.get(node)
        if kept is not None and not (kept[1] is built_from and unanswered <= kept[2]):
            self._write_out(kept[0])  # not every partition it answered is answered again
        self._kept[node] = (when, asked, unanswered)

    def _write_out(self, until: float) -> None:
        """Every answer kept from ``until`` or before, oldest first."""
        for node, (when, asked, unanswered) in sorted(self._kept.items(), key=lambda item: item[1][0]):
            if when > until:
                break
            del self._kept[node]
            fresh = dict.fromkeys(asked, when)  # copies the keys' hashes
            for tp in unanswered:
                del fresh[tp]
            self._times.update(fresh)

    def times(self) -> dict[TopicPartition, float]:
        """Partition -> when (a live dict: the stall watch drops partitions no longer assigned)."""
        if self._kept:
            self._write_out(math.inf)
        return self._times


class FetchManager:
    def __init__(
        self,
        subscriptions: SubscriptionState,
        metadata: MetadataManager,
        buffer: FetchBuffer,
        *,
        fetch_min_bytes: int,
        fetch_max_bytes: int,
        fetch_max_wait_ms: int,
        max_partition_fetch_bytes: int,
        read_committed: bool,
        check_crcs: bool,
        retry_backoff: float,
        client_rack: str,
        report_error: Callable[[KafkaError], None],
        on_diverging_epoch: DivergenceHandler,
        use_sessions: bool = True,
        max_decompressed: int = DEFAULT_MAX_SIZE,
        preferred_replica_ttl: float = 300.0,
    ) -> None:
        self._subscriptions = subscriptions
        self._max_decompressed = max_decompressed
        self._metadata = metadata
        self._buffer = buffer
        self._min_bytes = fetch_min_bytes
        self._max_bytes = fetch_max_bytes
        self._max_wait_ms = fetch_max_wait_ms
        self._partition_max_bytes = max_partition_fetch_bytes
        self._read_committed = read_committed
        self._check_crcs = check_crcs
        self._retry_backoff = retry_backoff
        self._rack = client_rack
        self._report_error = report_error
        self._on_diverging_epoch = on_diverging_epoch
        self._use_sessions = use_sessions
        #: Node -> the partitions its fetch in flight asks for (one fetch per node).
        self._in_flight: dict[int, dict[TopicPartition, SessionPartition]] = {}
        self._sessions: dict[int, FetchSession] = defaultdict(FetchSession)
        #: Nodes whose fetch of caught-up partitions is held back; the busy partitions holding each.
        self._holds: dict[int, _Hold] = {}
        self._held_by: dict[TopicPartition, int] = {}
        #: The last walk's plan; per node, its last request if that asked for all of a plan's
        #: partitions (the plan, what it asked, whether every topic id was known: also what its
        #: fetch in flight was built from); the partitions named by responses since (their entries
        #: may have moved).
        self._plan: _Plan | None = None
        self._last: dict[int, tuple[_Plan, dict[TopicPartition, SessionPartition], bool]] = {}
        self._advanced: dict[TopicPartition, None] = {}
        #: Requests whose responses arrived with data (for tests and metrics).
        self.responses = 0
        #: The same, per broker that served them (fetching from followers shows here).
        self.responses_by_node: dict[int, int] = defaultdict(int)
        #: Fetch requests sent, failed, and the record bytes their responses carried (metrics).
        self.requests = 0
        self.errors = 0
        self.response_bytes = 0
        self.response_bytes_max = 0
        #: KIP-392: partition -> (the replica the leader named, until when it is used).
        self._preferred: dict[TopicPartition, tuple[int, float]] = {}
        #: Moves on each change of ``_preferred`` (what a plan was made under).
        self._preferred_moves = 0
        self._preferred_ttl = preferred_replica_ttl
        #: When each partition last had a fetch answered without an error for it (an incremental
        #: response that leaves it out, having nothing new, counts), and why the last one failed:
        #: what the stall watch (managers/stall_watch.py) reports.
        self._answers = _AnswerTimes()
        self.last_errors: dict[TopicPartition, BaseException] = {}
        #: Node -> when its fetch in flight was sent.
        self.in_flight_since: dict[int, float] = {}
        #: Whether a broker was seen letting an aborted transaction through (read_committed; said once).
        self.unfiltered_aborts_seen = False

    @property
    def answered(self) -> dict[TopicPartition, float]:
        """Partition -> when a fetch last answered it without an error (the stall watch's)."""
        return self._answers.times()

    def next_deadline(self, now: float) -> float:
        deadline = self._subscriptions.next_retry(now)
        # The plan's end too: a release's wake is judged by the plan (may_fetch_after_release).
        plan = self._plan
        if plan is not None and plan.until < deadline:
            deadline = plan.until
        if self._holds:
            wait = self._max_wait_ms / 1000
            deadline = min(deadline, *(hold.since + wait for hold in self._holds.values()))
        return deadline

    def may_fetch_after_release(self, tp: TopicPartition, was_full: bool) -> bool:
        """Whether a completed fetch of ``tp`` leaving the buffer (``was_full``: the buffer was
        full before) may let :meth:`poll` send something it would not have sent before: a full
        buffer has room now, or ``tp`` may be fetched again.

        Not while a fetch of ``tp`` is in flight: :meth:`poll` skips ``tp`` until its response,
        whose arrival wakes the loop anyway, and a partition in flight never holds its node back.
        Reading a response's partitions one by one then wakes the loop not at all instead of once
        a partition.  Nor while ``tp``'s broker has its fetch in flight (it gets no other till
        that answer), nor while the hold of ``tp``'s node stands: ``tp``, caught up, joins the
        held partitions, and another of the node's partitions is still busy (reading a backlog
        over many partitions, once each has been fetched to its end)."""
        if was_full and not self._buffer.full:
            return True  # room: partitions with records buffered may be fetched again
        in_flight = self._in_flight
        if any(tp in wanted for wanted in in_flight.values()):
            return False
        plan = self._plan
        if plan is None or not self._plan_current(plan):
            return True  # the next turn walks again: the holds and the plan's nodes are the last turn's
        node = self._held_by.get(tp)
        if node is not None:
            return not self._still_held(tp, node)
        return not in_flight or plan.node_of(tp) not in in_flight

    def _plan_current(self, plan: _Plan) -> bool:
        """The counts, the cluster and the read replicas ``plan`` was made under have not moved (its
        ``until`` aside): the next turn uses it again."""
        subscriptions = self._subscriptions
        return (
            plan.changes == subscriptions.changes
            and plan.moves == subscriptions.moves
            and plan.cluster is self._metadata.cluster
            and plan.preferred_moves == self._preferred_moves
        )

    def _still_held(self, tp: TopicPartition, node: int) -> bool:
        """Whether ``node``'s hold stands with (some of) busy ``tp``'s records gone from the buffer,
        the plan as the turn that held it saw it."""
        buffer = self._buffer
        left = buffer.buffered_bytes(tp)
        if left and (buffer.full or left >= self.read_ahead_bytes()):
            return True  # still busy
        state = self._subscriptions.partitions.get(tp)
        if state is None or not self._caught_up([(state, None)]):
            return False  # it has records to fetch: a held fetch goes out with it
        del self._held_by[tp]
        hold = self._holds[node]
        hold.busy -= 1
        return hold.busy > 0

    def read_ahead_bytes(self) -> int:
        """How much one partition may have buffered and still be fetched."""
        share = self._buffer.max_bytes // max(1, len(self._subscriptions.partitions))
        return max(self._partition_max_bytes, share)

    def poll(self, now: float) -> list[UnsentRequest]:
        buffer = self._buffer
        share = self.read_ahead_bytes()
        buffered_by_tp = buffer.bytes_by_partition or None
        plan = self._plan
        if plan is None or now >= plan.until or not self._plan_current(plan):
            plan = self._walk(now)
        elif (
            not buffer.full
            and (buffered_by_tp is None or max(buffered_by_tp.values()) < share)
            and all(self._built_from(node) is plan for node in self._in_flight)
        ):
            # Nothing the walk looked at moved: every node not waiting for its fetch is asked for
            # the same partitions as last time, and only those a response moved need a look.
            requests = []
            for node, picked in plan.by_node.items():
                if node not in self._in_flight:
                    requests.append(self._request(node, picked, plan))
                    self.in_flight_since[node] = now
            if self._holds:  # nothing is held while nothing is busy (no new dicts each fetch)
                self._holds, self._held_by = {}, {}
            return requests
        return self._requests(now, plan, share, buffered_by_tp)

    def _built_from(self, node: int) -> _Plan | None:
        """The plan ``node``'s last request asked for all the partitions of (None: some were left
        out, or it was not built from a plan)."""
        last = self._last.get(node)
        return last[0] if last is not None else None

    def _walk(self, now: float) -> _Plan:
        """Every partition looked at: which may be fetched, and from where (the plan, kept for the
        next turns while nothing it looked at moves)."""
        subscriptions = self._subscriptions
        cluster = self._metadata.cluster
        leaders = cluster.leaders
        by_node: dict[int, list[tuple[PartitionState, PartitionInfo]]] = {}
        preferred = bool(self._preferred)
        last_node = -1
        picked: list[tuple[PartitionState, PartitionInfo]] = []
        for state in subscriptions.fetchable(now):
            tp = state.tp
            leader = leaders.get(tp)
            if leader is None:
                self._metadata.request_leaders(tp.topic)
                continue
            node = self._read_replica(tp, leader.leader, now) if preferred else leader.leader
            if state.validated_for != leader.leader_epoch and state.needs_validation(leader.leader_epoch):
                continue  # the position validator checks it against this leader first
            if node != last_node:  # partitions come mostly leader by leader
                last_node = node
                picked = by_node.setdefault(node, [])
            picked.append((state, leader))
        until = subscriptions.next_retry(now)
        if self._preferred:  # the plan lasts while every choice of replica does
            until = min(until, *(ends for _, ends in self._preferred.values()))
        plan = self._plan = _Plan(
            subscriptions.changes, subscriptions.moves, self._preferred_moves, cluster, until, by_node
        )
        self._advanced.clear()  # every node's next request compares all its partitions again
        return plan

    def _requests(
        self, now: float, plan: _Plan, share: int, buffered_by_tp: Mapping[TopicPartition, int] | None
    ) -> list[UnsentRequest]:
        """The plan's fetches, but for what this turn leaves out: nodes whose fetch is out,
        partitions in flight at another node, and partitions with their share of the buffer."""
        full = self._buffer.full  # then only partitions with nothing buffered are fetched
        # Empty sets and maps are not asked (asking hashes the TopicPartition, ~60 ns): a caught-up
        # consumer has nothing in flight when it builds a fetch and nothing buffered.
        nodes_in_flight = self._in_flight
        in_flight: Container[TopicPartition] | None = None
        if len(nodes_in_flight) == 1:
            in_flight = next(iter(nodes_in_flight.values()))
        elif nodes_in_flight:
            in_flight = set().union(*nodes_in_flight.values())
        requests = []
        holds: dict[int, _Hold] = {}
        held_by: dict[TopicPartition, int] = {}
        for node, planned in plan.by_node.items():
            if node in nodes_in_flight:
                continue  # that node's one fetch is out: nothing goes to it this turn
            states = planned
            if in_flight is not None or buffered_by_tp is not None:
                states = []
                busy = []  # partitions whose buffered records are still being read
                for entry in planned:
                    tp = entry[0].tp
                    if in_flight is not None and tp in in_flight:
                        continue  # in flight at another node (its leader moved since)
                    if buffered_by_tp is not None:
                        buffered = buffered_by_tp.get(tp, 0)
                        if buffered >= share or (full and buffered):
                            busy.append(tp)
                            continue
                    states.append(entry)
                if not states:
                    continue
                if busy:
                    hold = self._holds.get(node)
                    since = now if hold is None else hold.since
                    if now < since + self._max_wait_ms / 1000 and self._caught_up(states):
                        holds[node] = _Hold(since, len(busy))
                        held_by.update(dict.fromkeys(busy, node))
                        continue
                if len(states) == len(planned):
                    states = planned
            requests.append(self._request(node, states, plan if states is planned else None))
            self.in_flight_since[node] = now
        self._holds, self._held_by = holds, held_by
        return requests

    def node_for(self, tp: TopicPartition, now: float) -> int | None:
        """The broker ``tp`` is fetched from (its leader, or the replica the leader named), if known."""
        leader = self._metadata.cluster.leader(tp)
        if leader is None:
            return None
        preferred = self._preferred.get(tp)
        if preferred is not None and now < preferred[1] and preferred[0] in self._metadata.cluster.brokers:
            return preferred[0]
        return leader.leader

    def _read_replica(self, tp: TopicPartition, leader: int, now: float) -> int:
        """The leader, or the replica it named for us while that choice is fresh and in the cluster."""
        preferred = self._preferred.get(tp)
        if preferred is None:
            return leader
        node, until = preferred
        if now >= until:
            del self._preferred[tp]
            self._preferred_moves += 1
            return leader
        if node not in self._metadata.cluster.brokers:
            self._metadata.request_update()  # a broker back since the last metadata: learn its address
            return leader
        return node

    def _unlisted_abort(self, node: int, tp: TopicPartition, producer_id: int, marker_offset: int) -> None:
        """``node``'s answer for ``tp`` held records of an aborted transaction that it did not name
        as aborted (they were handed out; its ABORT marker at ``marker_offset`` came after them):
        the broker does not filter aborted transactions, so read_committed cannot hold on it."""
        if self.unfiltered_aborts_seen:
            return
        self.unfiltered_aborts_seen = True
        address = self._metadata.cluster.brokers.get(node)
        broker = f"node {node} ({address[0]}:{address[1]})" if address else f"node {node}"
        log.warning(
            "isolation_level='read_committed' does not hold on %s: it answered a fetch of %s with records "
            "of producer %d's aborted transaction (its ABORT marker is at offset %d) without naming that "
            "transaction as aborted, so they were handed out as committed.  This broker does not filter "
            "aborted transactions: read_committed readers get their records too",
            broker, tp, producer_id, marker_offset,
        )

    def _from_follower(self, tp: TopicPartition, node: int) -> bool:
        """``tp`` was fetched from ``node`` as its preferred read replica: forget that choice."""
        preferred = self._preferred.get(tp)
        if preferred is None or preferred[0] != node:
            return False
        del self._preferred[tp]
        self._preferred_moves += 1
        log.debug("fetching %s from the leader again (a fetch from replica %s failed)", tp, node)
        return True

    def _caught_up(self, picked: Iterable[tuple[PartitionState, object]]) -> bool:
        """Every one at the end of the log as of the last response: a fetch would wait for new
        records.  (One call for them all: a backlog over many partitions asks each turn.)"""
        committed = self._read_committed
        for state, _ in picked:
            end = state.high_watermark
            if committed and state.last_stable_offset >= 0:
                end = state.last_stable_offset
            if not 0 <= end <= state.fetch_offset:
                return False
        return True

    def _compare(
        self, session: FetchSession, picked: list[tuple[PartitionState, PartitionInfo]]
    ) -> tuple[dict[TopicPartition, SessionPartition], list[TopicPartition], bool, bool, bool]:
        """What a request of ``picked`` asks of each partition, and against the broker's session:
        (wanted, changed, forgets, reset, have_ids: every partition's topic id is known).

        One walk over the partitions: what the request asks of each (``wanted``, as the broker's
        session remembers it, and ``changed``: the ones an incremental fetch names), and whether the
        session must start again (``reset``): a partition unassigned and assigned again with no
        request in between (a new state, no high watermark yet) is still in the broker's session,
        unchanged; an incremental response leaves out a partition with no news, so the new state
        would never learn its high watermark.  A full fetch answers for every partition.  Each
        partition's key is hashed as few times as may be (a ``TopicPartition`` hashes anew each
        time): the dict built here is copied from, not asked, further on."""
        topics = self._metadata.cluster.topics
        wanted: dict[TopicPartition, SessionPartition] = {}
        changed: list[TopicPartition] = []
        remembered = session.partitions
        known = remembered.get
        kept = 0  # partitions of this request the session remembers: if fewer than it holds, some go
        reset = False
        have_ids = True
        topic_name = ""
        topic_id = ZERO_UUID
        for state, leader in picked:
            tp = state.tp
            if tp.topic != topic_name:  # partitions come mostly topic by topic
                topic_name = tp.topic
                topic = topics.get(topic_name)
                topic_id = topic.topic_id if topic else ZERO_UUID
                if topic_id == ZERO_UUID:
                    have_ids = False
            fetched_epoch = state.fetched_epoch
            entry = wanted[tp] = (
                state.fetch_offset,
                leader.leader_epoch,
                topic_id,
                -1 if fetched_epoch is None else fetched_epoch,
                state.epoch,
            )
            before = known(tp)
            if before is not None:
                kept += 1
                if before != entry:
                    changed.append(tp)
            else:
                changed.append(tp)
            if state.fetch_session is not session:
                if before is not None and state.high_watermark < 0:
                    reset = True
                state.fetch_session = session
        advanced = self._advanced
        if advanced:  # looked at now: not again by the node's next request
            for tp in [tp for tp in advanced if tp in wanted]:
                del advanced[tp]
        return wanted, changed, kept < len(remembered), reset, have_ids

    def _moved_since(
        self, before: dict[TopicPartition, SessionPartition], session: FetchSession
    ) -> tuple[dict[TopicPartition, SessionPartition], list[TopicPartition]]:
        """The node's last request, ``before``, asked for the same partitions under the same plan:
        only the ones a response named since (``_advanced``) may have moved.  (wanted, changed),
        as :meth:`_compare` would find them."""
        wanted = before.copy()
        changed: list[TopicPartition] = []
        advanced = self._advanced
        if advanced:
            partitions = self._subscriptions.partitions
            for tp in [tp for tp in advanced if tp in before]:
                del advanced[tp]
                state = partitions[tp]
                was = before[tp]
                fetched_epoch = state.fetched_epoch
                entry = (
                    state.fetch_offset,
                    was[LEADER_EPOCH],
                    was[TOPIC_ID],
                    -1 if fetched_epoch is None else fetched_epoch,
                    state.epoch,
                )
                if entry != was:
                    wanted[tp] = entry
                    changed.append(tp)
        if session.partitions is not before:  # no session (it started again): all of them
            changed = list(wanted)
        return wanted, changed

    def _request(
        self, node: int, picked: list[tuple[PartitionState, PartitionInfo]], plan: _Plan | None
    ) -> UnsentRequest:
        """A fetch of ``picked`` from ``node``; ``plan``: they are all its partitions in that plan."""
        cluster = self._metadata.cluster
        session = self._sessions[node]
        last = self._last.pop(node, None)
        if (
            plan is not None
            and last is not None
            and last[0] is plan
            and (session.partitions is last[1] or not (session.session_id or session.partitions))
        ):
            built_from: dict[TopicPartition, SessionPartition] | None = last[1]
            wanted, changed = self._moved_since(last[1], session)
            have_ids, forgets, reset = last[2], False, False
        else:
            built_from = None
            wanted, changed, forgets, reset, have_ids = self._compare(session, picked)
        if plan is not None:
            self._last[node] = (plan, wanted, have_ids)
        self.requests += 1
        self._in_flight[node] = wanted
        assignment_id = self._subscriptions.assignment_id
        if reset and session.session_id:
            session.reset()
            forgets = False
        if have_ids and forgets:  # partitions to forget: their ids too
            have_ids = all(e[TOPIC_ID] != ZERO_UUID for tp, e in session.partitions.items() if tp not in wanted)
        # What ``changed`` and ``forgets`` were worked out against: nothing else changes the session
        # before this request is built (one fetch a broker; only its answer moves the session on).
        compared = (session.session_id, session.epoch)
        sent: dict[str, object] = {"full": True}

        def partition_entry(tp: TopicPartition, version: int) -> dict[str, object]:
            entry = wanted[tp]
            return {
                "partition": tp.partition,
                "current_leader_epoch": entry[LEADER_EPOCH],
                "fetch_offset": entry[FETCH_OFFSET],
                "last_fetched_epoch": entry[LAST_FETCHED_EPOCH] if version >= 12 else -1,
                "log_start_offset": -1,
                "partition_max_bytes": self._partition_max_bytes,
            }

        def topic_key(tp: TopicPartition, version: int) -> dict[str, object]:
            if version >= 13:
                known = wanted.get(tp) or session.partitions[tp]
                return {"topic_id": known[TOPIC_ID]}
            return {"topic": tp.topic}

        def build(version: int) -> Body:
            full = not (self._use_sessions and version >= 7 and session.session_id)
            if full:
                to_send = list(wanted)
                forgotten: list[TopicPartition] = []
            else:
                # Re-send a partition when anything the broker remembers for it changed (offset, epoch).
                assert (session.session_id, session.epoch) == compared, "the fetch session moved on"
                to_send = changed
                forgotten = [tp for tp in session.partitions if tp not in wanted] if forgets else []
            sent["full"] = full
            sent["forgotten"] = forgotten
            sent["named"] = to_send
            sent["version"] = version
            topics = by_topic(to_send) if to_send else {}  # a caught-up incremental fetch names none
            gone = by_topic(forgotten) if forgotten else {}
            session_wanted = self._use_sessions and version >= 7
            return {  # replica_id: the codec's default, -1 (a consumer)
                "max_wait_ms": self._max_wait_ms,
                "min_bytes": self._min_bytes,
                "max_bytes": self._max_bytes,
                "isolation_level": int(self._read_committed),
                "session_id": session.session_id if not full else 0,
                "session_epoch": (session.epoch if not full else 0) if session_wanted else -1,
                "topics": [
                    {**topic_key(tps[0], version), "partitions": [partition_entry(tp, version) for tp in tps]}
                    for tps in topics.values()
                ],
                "forgotten_topics_data": [
                    {**topic_key(tps[0], version), "partitions": [tp.partition for tp in tps]} for tps in gone.values()
                ],
                "rack_id": self._rack,
            }

        def finish() -> None:
            if self._in_flight.get(node) is wanted:
                del self._in_flight[node]
            self.in_flight_since.pop(node, None)

        def on_response(now: float, version: int, body: Body) -> None:
            finish()
            code = body["error_code"]
            if code in FETCH_SESSION_CODES:
                log.debug("fetch session with node %s reset: %s", node, error_for_code(code))
                session.reset()
                return
            if code:
                self.errors += 1
                session.reset()  # any top-level error ends the session, as in the Java client
                for tp in wanted:
                    self._from_follower(tp, node)
                self._fail_partitions(now, wanted, error_for_code(code, f"Fetch from node {node}"))
                return
            self._update_session(session, body, sent, wanted)
            if self._subscriptions.assignment_id != assignment_id and not self._still_assigned(wanted):
                return
            self.responses += 1
            self.responses_by_node[node] += 1
            before = self.response_bytes
            unanswered: set[TopicPartition] = set()
            advanced = self._advanced
            for topic in body["responses"]:
                name = topic["topic"] if version < 13 else cluster.topic_name(topic["topic_id"])
                if name is None:
                    self._metadata.request_update()
                    continue
                for p in topic["partitions"]:
                    tp = TopicPartition(name, p["partition_index"])
                    sent_as = wanted.get(tp)
                    if sent_as is not None:
                        advanced[tp] = None
                        if not self._handle_partition(now, tp, sent_as, p, node):
                            unanswered.add(tp)
            # An incremental response leaves out the partitions with no news: they count as answered.
            self._answers.note(node, now, wanted, unanswered, built_from)
            size = self.response_bytes - before
            if size > self.response_bytes_max:
                self.response_bytes_max = size

        def on_error(now: float, error: BaseException) -> None:
            finish()
            self.errors += 1
            session.reset()
            log.debug("fetch from node %s failed: %s", node, error)
            self._metadata.request_update()
            for tp in wanted:
                self.last_errors[tp] = error
                self._from_follower(tp, node)
                state = self._subscriptions.get(tp)
                if state is not None:
                    state.retry_at = now + self._retry_backoff
            if not (isinstance(error, KafkaError) and error.retriable):
                self._report_error(error if isinstance(error, KafkaError) else KafkaError(repr(error)))

        max_version = None if have_ids else 12
        return UnsentRequest(
            "Fetch",
            build,
            on_response,
            on_error,
            node_id=node,
            min_version=4,
            max_version=max_version,
            extra_timeout_ms=self._max_wait_ms,
        )

    def _still_assigned(self, wanted: dict[TopicPartition, SessionPartition]) -> bool:
        return any(tp in self._subscriptions.partitions for tp in wanted)

    def _update_session(
        self,
        session: FetchSession,
        body: Body,
        sent: dict[str, object],
        entries: dict[TopicPartition, SessionPartition],
    ) -> None:
        if not self._use_sessions or int(str(sent.get("version", 0))) < 7:
            return
        if body["session_id"] == 0:
            session.reset()
            return
        # What the broker now remembers is what was sent, whatever changed here since: after a full
        # fetch every partition's entry, after an incremental one the entries it named (the others
        # were the same) without the ones it forgot: ``entries`` either way.  The request's own dict
        # (nothing writes to it once built): a node's next request that finds it here knows the
        # session holds what that request asked.
        if sent["full"]:
            session.session_id = body["session_id"]
        session.partitions = entries
        session.epoch = session.epoch + 1 if not sent["full"] else 1
        # Offsets that move on with this response are sent again next time (they differ).

    def _fail_partitions(self, now: float, wanted: dict[TopicPartition, SessionPartition], error: KafkaError) -> None:
        self._metadata.request_update()
        for tp in wanted:
            self.last_errors[tp] = error
            state = self._subscriptions.get(tp)
            if state is not None:
                state.retry_at = now + self._retry_backoff
        if not error.retriable:
            self._report_error(error)

    def _handle_partition(
        self, now: float, tp: TopicPartition, sent: SessionPartition, p: Body, node: int = -1
    ) -> bool:
        """Files one partition's answer; whether it counts as answered (for the stall watch): the
        request still stands for it, and no error."""
        state = self._subscriptions.get(tp)
        fetch_offset, epoch = sent[FETCH_OFFSET], sent[STATE_EPOCH]
        if state is None or state.epoch != epoch or state.fetch_offset != fetch_offset:
            return False  # seeked, reset or unassigned since the request went out
        if state.phase is not PartitionPhase.FETCHING:
            return False  # awaiting validation since: this data may be from a diverged log
        self._file_partition(now, tp, state, sent, p, node)
        return not p["error_code"]

    def _file_partition(
        self, now: float, tp: TopicPartition, state: PartitionState, sent: SessionPartition, p: Body, node: int
    ) -> None:
        fetch_offset, leader_epoch, epoch = sent[FETCH_OFFSET], sent[LEADER_EPOCH], sent[STATE_EPOCH]
        code = p["error_code"]
        if code:
            self.last_errors[tp] = error_for_code(code, f"fetching {tp} from node {node}")
        if code and self._from_follower(tp, node):
            # Whatever went wrong at the follower (it may not have the offset yet: it lags the
            # leader), the leader is asked next, and decides about resets and errors.
            state.retry_at = now + self._retry_backoff
            self._metadata.request_update()
            return
        replica = p.get("preferred_read_replica", -1)
        if code == 0 and replica is not None and replica >= 0 and replica != node:
            log.debug("fetching %s from replica %s (named by node %s)", tp, replica, node)
            self._preferred[tp] = (replica, now + self._preferred_ttl)
            self._preferred_moves += 1
        diverging = p.get("diverging_epoch") or {}
        if code == 0 and diverging.get("epoch", -1) >= 0:
            self._on_diverging_epoch(state, fetch_offset, diverging["epoch"], diverging["end_offset"], leader_epoch)
        elif code == 0:
            state.validated_for = leader_epoch  # the leader served this position: it is consistent
            state.high_watermark = p["high_watermark"]
            state.last_stable_offset = p["last_stable_offset"]
            state.log_start_offset = p["log_start_offset"]
            records = p["records"]
            if records is None or len(records) == 0:
                return
            self.response_bytes += len(records)
            view = records if isinstance(records, memoryview) else memoryview(records)
            next_offset, complete, epochs = scan_batches(view)
            if next_offset < 0:
                return
            aborted = unlisted = None
            if self._read_committed:
                aborted = [(a["producer_id"], a["first_offset"]) for a in (p["aborted_transactions"] or [])]
                if not self.unfiltered_aborts_seen:
                    unlisted = functools.partial(self._unlisted_abort, node, tp)
            self._buffer.add(
                CompletedFetch(
                    tp,
                    epoch,
                    fetch_offset,
                    view[:complete],
                    next_offset,
                    check_crcs=self._check_crcs,
                    aborted=aborted,
                    max_decompressed=self._max_decompressed,
                    on_unlisted_abort=unlisted,
                )
            )
            state.fetched(next_offset)
            state.note_fetched_epochs(epochs)
        elif code == OffsetOutOfRangeError.code:
            if state.reset_to is None and self._subscriptions.default_reset == "none":
                state.retry_at = float("inf")
                self._report_error(
                    OffsetOutOfRangeError(
                        f"fetch offset {fetch_offset} is out of range for {tp} and auto_offset_reset='none'"
                    )
                )
            else:
                log.info(
                    "fetch offset %d out of range for %s; resetting to %s",
                    fetch_offset,
                    tp,
                    self._subscriptions.default_reset,
                )
                self._subscriptions.request_reset(tp)
        elif code in REFRESH_METADATA_CODES:
            self._metadata.request_update()
            state.retry_at = now + self._retry_backoff
        else:
            state.retry_at = now + self._retry_backoff
            self._report_error(error_for_code(code, f"fetching {tp}"))
