"""Cluster metadata: brokers, partition leaders and leader epochs, topic ids.

Refreshed when asked (a fetch or list-offsets saw NOT_LEADER_OR_FOLLOWER, a
leader epoch moved, a topic is unknown), when the topics of interest change,
and every ``metadata_max_age_ms``.  A refresh asked for right after the answer
to another asked-for refresh waits ``retry_backoff_ms`` from that answer (the
Java client backs off its metadata refreshes too): a partition that has no
leader in any answer (its topic was deleted, say) asks again after every
answer, and that must not become a storm of requests.  New topics of interest
are asked for at once.  A topic of interest the broker says does not exist is
asked for again ``retry_backoff_ms`` after the answer, then after twice that,
and so on up to :data:`MISSING_TOPIC_BACKOFF_MAX` (as the Java client asks again
at once on UNKNOWN_TOPIC_OR_PARTITION, within its backoff): a topic created
after ``subscribe()`` is seen within about a second, not ``metadata_max_age_ms``
later.  One-shot "all topics" lookups for ``Consumer.topics()``
share the same request path.

A broker that has not caught up may answer with a partition's leader epoch
older than one already seen; that partition keeps what we knew (as in the
Java client), so leaders and epochs never go back.  A changed topic id (the
topic was re-created) starts its epochs afresh.  An answer that names no broker
at all (a broker starting up, or shutting down and fenced) is no news: it is
ignored and asked again after the backoff, as in the Java client, so that it
never leaves the consumer with no broker but the bootstrap servers.

Rebootstrap (KIP-899, KIP-1102)
-------------------------------
Once it has metadata, the consumer asks only the brokers that metadata named.
If they were all replaced (new machines at new addresses while the consumer
was not looking), none of them will ever answer again.  So, with
``metadata_recovery_strategy="rebootstrap"`` (the default, as in the Java
client since 4.0), the manager decides to go back to ``bootstrap_servers``
when, a refresh being due,

- none of the known brokers can be reached (each is being connected to or
  waits out its reconnect backoff: ``BootstrapControl.known_brokers_unavailable``),
- or no metadata has come for ``metadata_recovery_rebootstrap_trigger_ms``
  since a refresh fell due (a known broker that accepts connections and never
  answers, say),
- or a broker answered REBOOTSTRAP_REQUIRED: Metadata v13's top-level error
  code, or ApiVersions v5's when the broker is not the node, or not in the
  cluster, the consumer meant to reach (KIP-1242; ``rebootstrap_requested``).

It then forgets the cluster (brokers, leaders: nothing stale is used), tells
the network client to drop the known brokers and their connections
(``BootstrapControl.rebootstrap``, which says so in a WARNING) and asks for
metadata at once, which goes to a bootstrap server, its name resolved again.
Answers to requests sent before are ignored.  With ``"none"`` it keeps asking
the brokers it knows, and says once, in a WARNING, that it will not go back.
The decision is here, sans-I/O, with the time passed in; the I/O is the
network client's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..errors import (
    AuthenticationError,
    KafkaError,
    RebootstrapRequiredError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from ..structs import TopicPartition
from .requests import Body, UnsentRequest
from .waiter import Waiter

log = logging.getLogger("asyncconsumer.metadata")

ZERO_UUID = bytes(16)


@dataclass(slots=True)
class PartitionInfo:
    leader: int
    leader_epoch: int


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: bytes
    is_internal: bool
    partitions: dict[int, PartitionInfo]
    #: Partition -> the broker ids of its replicas (every replica, in sync or not).
    replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class Cluster:
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    #: Topics the last response said do not exist (or we may not see), with the error.
    topic_errors: dict[str, KafkaError] = field(default_factory=dict)
    #: Broker id -> its ``broker.rack``, for the brokers that have one.
    racks: dict[int, str] = field(default_factory=dict)
    #: The cluster's id (Metadata v2+), None until known.
    cluster_id: str | None = None
    _leaders: dict[TopicPartition, PartitionInfo] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def leaders(self) -> dict[TopicPartition, PartitionInfo]:
        """Partition -> its leader, for every partition that has one: what the managers look up
        for each partition each turn (one ``get``).  Made at the first use; a ``Cluster`` is a
        snapshot, never changed once made (each metadata answer makes a new one)."""
        leaders = self._leaders
        if leaders is None:
            leaders = self._leaders = {
                TopicPartition(name, index): info
                for name, topic in self.topics.items()
                for index, info in topic.partitions.items()
                if info.leader >= 0
            }
        return leaders

    def leader(self, tp: TopicPartition) -> PartitionInfo | None:
        return self.leaders.get(tp)

    def topic_missing(self, topic: str) -> bool:
        """The last answer says the broker does not know ``topic`` (deleted, or not created yet)."""
        return isinstance(self.topic_errors.get(topic), UnknownTopicOrPartitionError)

    def missing(self, tp: TopicPartition) -> bool:
        """The last answer says ``tp`` does not exist: its topic is unknown or has no such partition."""
        topic = self.topics.get(tp.topic)
        return self.topic_missing(tp.topic) or (topic is not None and tp.partition not in topic.partitions)

    def replica_racks(self, topics: Iterable[str]) -> dict[TopicPartition, frozenset[str]]:
        """The racks of each partition's replicas, for the partitions of ``topics`` (the rack-aware
        assignors' input); empty when no broker has a rack."""
        if not self.racks:
            return {}
        racks = self.racks
        result: dict[TopicPartition, frozenset[str]] = {}
        for name in topics:
            topic = self.topics.get(name)
            if topic is not None:
                for index, replicas in topic.replicas.items():
                    result[TopicPartition(name, index)] = frozenset(racks[b] for b in replicas if b in racks)
        return result

    def topic_name(self, topic_id: bytes) -> str | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic.name
        return None


class MissingTopicWarnings:
    """Topics subscribed by name that the broker says do not exist: a WARNING for each, once (as the
    Java client logs UNKNOWN_TOPIC_OR_PARTITION for them), and again only if the topic appears and
    goes again.  Without it a member of a group subscribed to a misspelt topic gets no partitions
    and no records, without a word.  A pattern's topics are the ones that exist: nothing to warn of.
    """

    def __init__(self, who: str) -> None:
        self._who = who
        self._warned: frozenset[str] = frozenset()

    def check(self, cluster: Cluster, subscribed: Iterable[str]) -> None:
        missing = frozenset(t for t in subscribed if cluster.topic_missing(t))
        for topic in sorted(missing - self._warned):
            log.warning("%s: subscribed topic %r does not exist (UNKNOWN_TOPIC_OR_PARTITION); it gets no "
                        "partitions until it is created", self._who, topic)
        self._warned = missing


class BootstrapControl(Protocol):
    """What the manager asks of the network client to decide on a rebootstrap, and how it starts one."""

    def known_brokers_unavailable(self) -> bool:
        """Every broker of the last metadata is out of reach for now (none connected; each being
        connected to or waiting out its reconnect backoff)."""

    def rebootstrap_requested(self) -> bool:
        """A broker answered a connection's ApiVersions with REBOOTSTRAP_REQUIRED since the last
        call (KIP-1242): it is not the node, or not in the cluster, the consumer meant."""

    def rebootstrap(self, reason: str) -> None:
        """Forget the known brokers and their connections, say so (with ``reason``); the next
        requests go to ``bootstrap_servers``."""


RecoveryStrategy = Literal["rebootstrap", "none"]


#: The longest wait before a topic of interest that does not exist is asked for again (s): Java's
#: ``retry.backoff.max.ms`` default.
MISSING_TOPIC_BACKOFF_MAX = 1.0
#: Why a Metadata answer naming no broker was not taken (the manager's ``last_error`` until the next).
NO_BROKERS = "a Metadata answer named no broker (a broker starting up or shutting down): ignored, asking again"


class MetadataManager:
    def __init__(
        self,
        *,
        max_age: float,
        retry_backoff: float,
        topics_of_interest: Callable[[], frozenset[str]],
        on_update: Callable[[Cluster], None],
        want_all_topics: Callable[[], bool] = lambda: False,
        bootstrap: BootstrapControl | None = None,
        recovery_strategy: RecoveryStrategy = "rebootstrap",
        rebootstrap_trigger: float = 300.0,
    ) -> None:
        self._want_all = want_all_topics
        self.cluster = Cluster()
        self._max_age = max_age
        self._retry_backoff = retry_backoff
        self._topics_of_interest = topics_of_interest
        self._on_update = on_update
        self._requested = True
        self._new_topics = True  # the topics of interest changed: ask without waiting out the backoff
        #: The regular refresh in flight, or last answered, was sent because it was asked for.
        self._on_request = False
        self._in_flight = False
        self._last_refresh = float("-inf")
        self._retry_at = 0.0
        self._last_topics: frozenset[str] = frozenset()
        #: Topics of interest missing from the last answer: when to ask again, and the wait after that.
        self._missing_retry: float | None = None
        self._missing_backoff = 0.0
        self._last_want_all = False
        #: The last poll's time, and whether it found topics of interest (or all were wanted).
        self._polled_at = -math.inf
        self._interested = False
        self._all_topics_waiters: list[Waiter[Cluster]] = []
        self._answer_waiters: list[Waiter[Cluster]] = []  # next_answer()
        self._all_in_flight = False
        self.last_error: KafkaError | None = None
        #: Bumped on every response, so waiters know a refresh happened.
        self.version = 0
        # Rebootstrap (see the module docstring).  Without a ``bootstrap`` control there is nothing
        # to go back with: the manager never decides to.
        self._bootstrap = bootstrap
        self._recovery = recovery_strategy
        self._trigger = rebootstrap_trigger
        #: When a refresh fell due with no metadata since (None: metadata came since).
        self._attempt_started: float | None = None
        self._rebootstrap_required = False  # a Metadata answer said REBOOTSTRAP_REQUIRED
        self._epoch = 0  # bumped by a rebootstrap: answers to requests sent before it are dropped
        self._said_stuck = False  # "none": the warning that we will not go back, said once
        #: Rebootstraps so far.
        self.rebootstraps = 0

    def request_update(self) -> None:
        self._requested = True

    def request_leaders(self, topic: str) -> None:
        """A partition of ``topic`` has no known leader: :meth:`request_update`, unless the refresh
        in flight asks for ``topic`` already (its answer brings the leaders, or says why there are
        none).  A manager meets the unknown leader at every turn until that answer (a position reset
        right after ``assign()``), and each ask would have another refresh sent after it."""
        if not (self._in_flight and (self._last_want_all or topic in self._last_topics)):
            self._requested = True

    def fetch_all_topics(self) -> Waiter[Cluster]:
        waiter: Waiter[Cluster] = Waiter()
        self._all_topics_waiters.append(waiter)
        return waiter

    def next_answer(self) -> Waiter[Cluster]:
        """The cluster after the next Metadata answer of either kind, a regular refresh asked for
        now (a client's first step: the brokers answer, without the cost of every topic)."""
        waiter: Waiter[Cluster] = Waiter()
        self._answer_waiters.append(waiter)
        self.request_update()
        return waiter

    def fail_all(self, error: BaseException) -> None:
        waiters = self._all_topics_waiters + self._answer_waiters
        self._all_topics_waiters, self._answer_waiters = [], []
        for waiter in waiters:
            waiter.set_exception(error)

    def next_deadline(self, now: float) -> float:
        deadline = math.inf
        if self._all_topics_waiters and not self._all_in_flight:
            deadline = max(now, self._retry_at)
        if not self._in_flight and self._sendable(now):
            deadline = min(deadline, max(now, self._retry_at, self._due_at()))
        if self._attempt_started is not None and self._may_rebootstrap():
            deadline = min(deadline, max(now, self._attempt_started + self._trigger))
        return deadline

    def _sendable(self, now: float) -> bool:
        """A regular refresh has something to ask: topics of interest, every topic, or the brokers
        (none known yet).  Called with the ``now`` of the :meth:`poll` just before (the loop's
        turn), it reads what that poll found instead of asking for the topics again."""
        if now == self._polled_at:
            interested = self._interested
        else:
            interested = bool(self._topics_of_interest()) or self._want_all()
        return interested or not self.cluster.brokers

    def _due_at(self) -> float:
        """When the next regular refresh may go: at once for new topics (or the first one) and
        when asked for, but ``retry_backoff`` after the last answer if that too was asked for;
        else when the last answer is too old."""
        if self._new_topics or self._last_refresh == -math.inf:
            return -math.inf
        if self._requested:
            return self._last_refresh + self._retry_backoff if self._on_request else -math.inf
        if self._missing_retry is not None:
            return min(self._missing_retry, self._last_refresh + self._max_age)
        return self._last_refresh + self._max_age

    def poll(self, now: float) -> list[UnsentRequest]:
        topics = self._topics_of_interest()
        want_all = self._want_all()
        if topics != self._last_topics or want_all != self._last_want_all:
            self._requested = self._new_topics = True
        self._polled_at, self._interested = now, bool(topics) or want_all
        sendable = self._interested or not self.cluster.brokers
        due = sendable and not self._in_flight and now >= self._retry_at and now >= self._due_at()
        rebootstraps = self.rebootstraps
        self._check_recovery(now, due)
        if self.rebootstraps != rebootstraps:
            due = True  # back to bootstrap_servers: ask them at once
        requests = []
        if self._all_topics_waiters and not self._all_in_flight and now >= self._retry_at:
            self._all_in_flight = True
            requests.append(self._request(None, everything=True))
        if due:
            self._in_flight = True
            self._on_request = self._requested and not self._new_topics and now - self._last_refresh < self._max_age
            self._requested = self._new_topics = False
            self._last_topics, self._last_want_all = topics, want_all
            # A pattern subscription needs every topic: that is how new matching topics are found.
            requests.append(self._request(None if want_all else sorted(topics), everything=False))
        return requests

    # -- rebootstrap -------------------------------------------------------------------------------

    def _may_rebootstrap(self) -> bool:
        """There is metadata to give up on (and a network client to do it)."""
        return self._bootstrap is not None and bool(self.cluster.brokers)

    def _check_recovery(self, now: float, due: bool) -> None:
        """``due``: a regular refresh goes this turn (:meth:`poll`)."""
        if due and self._attempt_started is None:
            self._attempt_started = now
        if not self._may_rebootstrap():
            return
        assert self._bootstrap is not None
        reason = None
        if self._rebootstrap_required or self._bootstrap.rebootstrap_requested():
            reason = "a broker answered REBOOTSTRAP_REQUIRED"
        elif self._attempt_started is not None and now - self._attempt_started >= self._trigger:
            reason = (f"no metadata from any known broker for {now - self._attempt_started:.0f}s "
                      "(metadata_recovery_rebootstrap_trigger_ms)")
        elif due and self._bootstrap.known_brokers_unavailable():
            reason = "none of the known brokers can be reached"
        if reason is None:
            return
        self._rebootstrap_required = False
        if self._recovery == "rebootstrap":
            self._rebootstrap(now, reason)
        elif not self._said_stuck:
            self._said_stuck = True
            known = ", ".join(map(str, sorted(self.cluster.brokers)))
            log.warning("%s (brokers %s); metadata_recovery_strategy='none': not going back to bootstrap_servers, "
                        "retrying the known brokers", reason, known)

    def _rebootstrap(self, now: float, reason: str) -> None:
        assert self._bootstrap is not None
        self.rebootstraps += 1
        self._epoch += 1
        self._bootstrap.rebootstrap(reason)
        self.cluster = Cluster()
        self._in_flight = self._all_in_flight = False
        self._requested = self._new_topics = True
        self._retry_at = now
        self._attempt_started = now

    # -- requests and answers -----------------------------------------------------------------------

    def _request(self, topics: list[str] | None, *, everything: bool) -> UnsentRequest:
        epoch = self._epoch

        def build(version: int) -> Body:
            body: dict[str, Any] = {"allow_auto_topic_creation": False}
            body["topics"] = None if topics is None else [{"name": t, "topic_id": ZERO_UUID} for t in topics]
            return body

        def on_response(now: float, version: int, body: Body) -> None:
            if epoch != self._epoch:
                return  # sent to a broker given up on by a rebootstrap since
            code = body.get("error_code", 0)  # top-level, from v13
            if code:
                if code == RebootstrapRequiredError.code:
                    self._rebootstrap_required = True
                self._handle_error(now, error_for_code(code, "Metadata"), everything)
                return
            if not body["brokers"]:
                # A broker starting up, or shutting down, may know of no live broker (itself
                # fenced): that is no news of the cluster, and taking it as such would leave
                # nothing to send to but the bootstrap servers, whatever the recovery strategy.
                # Ignored and asked again after the backoff, as the Java client does.
                self._handle_error(now, KafkaError(NO_BROKERS), everything)
                return
            self._handle(now, body, everything)

        def on_error(now: float, error: BaseException) -> None:
            if epoch == self._epoch:
                self._handle_error(now, error, everything)

        return UnsentRequest("Metadata", build, on_response, on_error, min_version=1)

    def _handle(self, now: float, body: Body, everything: bool) -> None:
        brokers = {b["node_id"]: (b["host"], b["port"]) for b in body["brokers"]}
        racks = {b["node_id"]: b["rack"] for b in body["brokers"] if b.get("rack")}
        topics: dict[str, TopicInfo] = {}
        errors: dict[str, KafkaError] = {}
        for topic in body["topics"]:
            name = topic["name"]
            if topic["error_code"]:
                error = error_for_code(topic["error_code"], f"topic {name!r}")
                if isinstance(error, (UnknownTopicOrPartitionError, TopicAuthorizationFailedError)):
                    errors[name] = error
                continue
            partitions = {
                p["partition_index"]: PartitionInfo(p["leader_id"], p["leader_epoch"]) for p in topic["partitions"]
            }
            replicas = {p["partition_index"]: tuple(p["replica_nodes"]) for p in topic["partitions"]}
            topics[name] = TopicInfo(name, topic["topic_id"], topic["is_internal"], partitions, replicas)
        self._keep_newer_epochs(topics)
        if everything:
            self._all_in_flight = False
            snapshot = Cluster(brokers, topics, errors, racks, body.get("cluster_id"))
            waiters, self._all_topics_waiters = self._all_topics_waiters, []
            for waiter in waiters:
                waiter.set_result(snapshot)
            # Keep our own view of interesting topics fresh too.
            merged = dict(self.cluster.topics)
            merged.update({n: t for n, t in topics.items() if n in self._last_topics})
            topics, errors = merged, self.cluster.topic_errors
        else:
            self._in_flight = False
            self._last_refresh = now
            self._backoff_missing(now, errors)
        self.cluster = Cluster(brokers, topics, errors, racks, body.get("cluster_id"))
        self._attempt_started = None
        self._said_stuck = self._rebootstrap_required = False
        self.last_error = None
        self.version += 1
        self._on_update(self.cluster)
        if self._answer_waiters:
            waiters, self._answer_waiters = self._answer_waiters, []
            for waiter in waiters:
                waiter.set_result(self.cluster)

    def _backoff_missing(self, now: float, errors: dict[str, KafkaError]) -> None:
        """Topics of interest the answer says do not exist: ask again soon, each time waiting twice
        as long, up to :data:`MISSING_TOPIC_BACKOFF_MAX`; none missing: back to the regular age."""
        if any(isinstance(errors.get(t), UnknownTopicOrPartitionError) for t in self._last_topics):
            self._missing_backoff = min(max(self._missing_backoff * 2, self._retry_backoff),
                                        max(MISSING_TOPIC_BACKOFF_MAX, self._retry_backoff))
            self._missing_retry = now + self._missing_backoff
        else:
            self._missing_retry, self._missing_backoff = None, 0.0

    def _keep_newer_epochs(self, topics: dict[str, TopicInfo]) -> None:
        for name, topic in topics.items():
            known = self.cluster.topics.get(name)
            recreated = known is not None and ZERO_UUID not in (known.topic_id, topic.topic_id) and (
                known.topic_id != topic.topic_id
            )
            if known is None or recreated:
                continue
            for index, info in topic.partitions.items():
                old = known.partitions.get(index)
                if old is not None and 0 <= info.leader_epoch < old.leader_epoch:
                    log.debug("ignoring stale metadata for %s-%d: leader epoch %d < %d",
                              name, index, info.leader_epoch, old.leader_epoch)
                    topic.partitions[index] = old

    def _handle_error(self, now: float, error: BaseException, everything: bool) -> None:
        log.debug("metadata request failed: %s", error)
        self._retry_at = now + self._retry_backoff
        self.last_error = error if isinstance(error, KafkaError) else KafkaError(repr(error))
        if isinstance(error, AuthenticationError):
            self.fail_all(error)  # wrong credentials do not fix themselves: say so at once
        if everything:
            self._all_in_flight = False
        else:
            self._in_flight = False
            self._requested = True
