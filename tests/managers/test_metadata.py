"""MetadataManager: when it asks, what it asks for, and what it makes of the answers."""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.errors import KafkaConnectionError, TopicAuthorizationFailedError, UnknownTopicOrPartitionError
from asyncconsumer.managers.metadata import Cluster, MetadataManager, PartitionInfo
from asyncconsumer.structs import TopicPartition

from .scripted import Scripted, metadata_body, topic_id

MAX_AGE = 300.0
BACKOFF = 0.5


class Topics:
    """A mutable topics-of-interest callback."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.asked = 0

    def __call__(self) -> frozenset[str]:
        self.asked += 1
        return frozenset(self.names)


def make(*topics: str) -> tuple[MetadataManager, Scripted, Topics, list[Cluster]]:
    interest = Topics(*topics)
    updates: list[Cluster] = []
    manager = MetadataManager(max_age=MAX_AGE, retry_backoff=BACKOFF, topics_of_interest=interest,
                              on_update=updates.append)
    return manager, Scripted(manager), interest, updates


LEADERS = {TopicPartition("a", 0): (1, 7), TopicPartition("a", 1): (2, 3), TopicPartition("b", 0): (1, 0)}


def test_first_poll_asks_for_topics_of_interest() -> None:
    _manager, h, _, _ = make("b", "a")
    request = h.take("Metadata")
    body = request.body()
    assert [t["name"] for t in body["topics"]] == ["a", "b"]
    assert body["allow_auto_topic_creation"] is False
    assert request.node_id is None  # any broker
    h.assert_idle()  # one in flight at a time


def test_bootstrap_request_without_topics_of_interest() -> None:
    manager, h, _, _ = make()
    request = h.take("Metadata")
    assert request.body()["topics"] == []  # brokers only, not "all topics"
    request.respond(metadata_body({}, brokers=[0, 1]))
    assert set(manager.cluster.brokers) == {0, 1}
    h.assert_idle()  # nothing to refresh until topics of interest appear


def test_response_parses_brokers_leaders_epochs_and_topic_ids() -> None:
    manager, h, _, updates = make("a", "b")
    h.take("Metadata").respond(metadata_body(LEADERS, brokers=[1, 2, 3]))
    cluster = manager.cluster
    assert cluster.brokers == {1: ("broker1", 9093), 2: ("broker2", 9094), 3: ("broker3", 9095)}
    assert cluster.leader(TopicPartition("a", 0)) == PartitionInfo(1, 7)
    assert cluster.leader(TopicPartition("a", 1)) == PartitionInfo(2, 3)
    assert cluster.leader(TopicPartition("a", 5)) is None
    assert cluster.topics["b"].topic_id == topic_id("b")
    assert cluster.topic_name(topic_id("a")) == "a"
    assert updates == [cluster]
    assert manager.version == 1
    assert manager.last_error is None


def test_partition_without_leader_has_no_leader() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body({TopicPartition("a", 0): (-1, 4)}, brokers=[0]))
    assert 0 in manager.cluster.topics["a"].partitions
    assert manager.cluster.leader(TopicPartition("a", 0)) is None


def test_refresh_after_max_age() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS))
    start = h.now
    assert manager.next_deadline(h.now) == start + MAX_AGE
    h.advance(MAX_AGE - 0.001)
    h.assert_idle()
    h.advance(0.001)
    request = h.take("Metadata")
    assert [t["name"] for t in request.body()["topics"]] == ["a"]


def test_request_update_triggers_a_new_request() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS))
    h.advance(1.0)
    h.assert_idle()
    manager.request_update()
    assert manager.next_deadline(h.now) == h.now
    h.take("Metadata").respond(metadata_body(LEADERS))
    assert manager.version == 2
    h.assert_idle()


def test_request_update_while_in_flight_sends_again_after_the_response() -> None:
    manager, h, _, _ = make("a")
    first = h.take("Metadata")
    manager.request_update()
    h.assert_idle()  # still one at a time
    first.respond(metadata_body(LEADERS))
    # The in-flight answer may predate whatever prompted the update: ask again.
    h.take("Metadata").respond(metadata_body(LEADERS))
    assert manager.version == 2
    h.assert_idle()


def test_leaders_asked_for_while_a_refresh_naming_the_topic_is_in_flight_wait_for_its_answer() -> None:
    manager, h, interest, _ = make("a")
    first = h.take("Metadata")
    manager.request_leaders("a")  # every turn until the answer: a reset right after assign()
    manager.request_leaders("a")
    h.assert_idle()
    first.respond(metadata_body(LEADERS))
    h.assert_idle()  # that answer named "a": nothing more to ask
    # A topic the refresh in flight does not name is asked for after it.
    interest.names.add("b")
    second = h.take("Metadata")
    manager.request_leaders("c")
    second.respond(metadata_body(LEADERS))
    h.take("Metadata").respond(metadata_body(LEADERS))
    h.assert_idle()


def test_requested_refreshes_wait_the_backoff_after_each_answer() -> None:
    # A partition that has no leader in any answer (its topic was deleted) asks for a refresh on
    # every loop turn: that must make one request per retry_backoff_ms, not one per round trip.
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body({}, topic_errors={"a": 3}))
    sent = []
    for _ in range(40):
        manager.request_update()
        for request in h.sent("Metadata"):
            request.respond(metadata_body({}, topic_errors={"a": 3}))
            sent.append(h.now)
        manager.request_update()
        if sent and sent[-1] == h.now:
            assert manager.next_deadline(h.now) == h.now + BACKOFF  # the loop sleeps until then
        h.advance(BACKOFF / 4)
    # 40 turns over 5 backoffs: the first refresh asked for goes at once, then one per backoff.
    start = sent[0]
    assert sent == [start + i * BACKOFF for i in range(10)]


def test_new_topics_of_interest_do_not_wait_the_backoff() -> None:
    _manager, h, interest, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS))
    interest.names.add("c")
    assert [t["name"] for t in h.take("Metadata").body()["topics"]] == ["a", "c"]


def test_topics_of_interest_change_triggers_a_request() -> None:
    _manager, h, interest, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS))
    interest.names.add("c")
    request = h.take("Metadata")
    assert [t["name"] for t in request.body()["topics"]] == ["a", "c"]


def test_error_sets_retry_backoff() -> None:
    manager, h, _, updates = make("a")
    h.take("Metadata").fail(KafkaConnectionError("boom"))
    assert isinstance(manager.last_error, KafkaConnectionError)
    failed_at = h.now
    assert manager.next_deadline(h.now) == failed_at + BACKOFF
    h.advance(BACKOFF - 0.001)
    h.assert_idle()
    h.advance(0.001)
    h.take("Metadata").respond(metadata_body(LEADERS))
    assert manager.last_error is None
    assert len(updates) == 1


def test_non_kafka_error_is_wrapped() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").fail(OSError("socket gone"))
    assert "socket gone" in str(manager.last_error)


def test_topic_errors_are_recorded() -> None:
    manager, h, _, _ = make("a", "missing", "secret", "creating")
    h.take("Metadata").respond(metadata_body(
        {TopicPartition("a", 0): (1, 0)},
        topic_errors={"missing": 3, "secret": 29, "creating": 5},
    ))
    errors = manager.cluster.topic_errors
    assert isinstance(errors["missing"], UnknownTopicOrPartitionError)
    assert isinstance(errors["secret"], TopicAuthorizationFailedError)
    assert "missing" in str(errors["missing"])
    # LEADER_NOT_AVAILABLE (a topic being created) is transient: not a topic error, not a topic either.
    assert "creating" not in errors
    assert set(manager.cluster.topics) == {"a"}


def test_missing_partitions_are_the_ones_the_broker_says_do_not_exist() -> None:
    manager, h, _, _ = make("a", "gone", "secret", "later")
    h.take("Metadata").respond(metadata_body(LEADERS, topic_errors={"gone": 3, "secret": 29}))
    cluster = manager.cluster
    assert cluster.topic_missing("gone") and cluster.missing(TopicPartition("gone", 0))
    assert not cluster.missing(TopicPartition("a", 1))
    assert cluster.missing(TopicPartition("a", 2))  # "a" has two partitions
    assert not cluster.topic_missing("secret")  # may not be read: it exists all the same
    assert not cluster.missing(TopicPartition("later", 0))  # not in this answer: nothing known


def test_topic_error_clears_when_the_topic_appears() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body({}, topic_errors={"a": 3}))
    assert "a" in manager.cluster.topic_errors
    manager.request_update()
    h.take("Metadata").respond(metadata_body(LEADERS))
    assert manager.cluster.topic_errors == {}
    assert "a" in manager.cluster.topics


def test_a_missing_topic_of_interest_is_asked_for_again_soon_then_less_often() -> None:
    """A topic created after subscribe() is seen within about a second, not after max_age: the
    manager asks again after the backoff, doubling it up to a second, and goes back to max_age
    once the topic exists."""
    manager = MetadataManager(max_age=MAX_AGE, retry_backoff=0.1, topics_of_interest=Topics("a", "later"),
                              on_update=lambda cluster: None)
    h = Scripted(manager)
    waits = []
    for _ in range(6):
        h.take("Metadata").respond(metadata_body(LEADERS, topic_errors={"later": 3}))
        answered = h.now
        waits.append(round(manager.next_deadline(h.now) - answered, 3))
        h.advance(waits[-1])
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    h.take("Metadata").respond(metadata_body({**LEADERS, TopicPartition("later", 0): (1, 0)}))
    assert manager.next_deadline(h.now) == h.now + MAX_AGE
    assert "later" in manager.cluster.topics


def test_a_pattern_subscription_does_not_ask_again_for_topics_it_does_not_name() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS, topic_errors={"other": 3}))
    assert manager.next_deadline(h.now) == h.now + MAX_AGE


def test_fetch_all_topics_resolves_waiter() -> None:
    manager, h, _, _ = make("a")
    h.take("Metadata").respond(metadata_body({TopicPartition("a", 0): (1, 0)}))
    waiter = manager.fetch_all_topics()
    assert manager.next_deadline(h.now) == h.now
    request = h.take("Metadata")
    assert request.body()["topics"] is None  # null: every topic
    assert not waiter.done()
    request.respond(metadata_body(LEADERS))
    assert waiter.done()
    snapshot = waiter.result()
    assert set(snapshot.topics) == {"a", "b"}
    # Our own view gets the interesting topics' fresh data only.
    assert set(manager.cluster.topics) == {"a"}
    assert manager.cluster.leader(TopicPartition("a", 1)) == PartitionInfo(2, 3)


def test_next_answer_is_the_first_steps_brokers_only_request_and_waits_out_a_failure() -> None:
    """A client's first step waits for the brokers to answer: the regular request, naming no topic
    while none is of interest (not every topic: a large cluster's would be megabytes)."""
    manager, h, _, _ = make()
    waiter = manager.next_answer()
    request = h.take("Metadata")
    assert request.body()["topics"] == []
    request.fail(KafkaConnectionError("down"))
    assert not waiter.done()
    h.advance(BACKOFF)
    h.take("Metadata").respond(metadata_body({}, brokers=[0, 1]))
    assert set(waiter.result().brokers) == {0, 1}
    later = manager.next_answer()  # asked again: a refresh goes out after the backoff
    manager.fail_all(KafkaConnectionError("gone"))
    with pytest.raises(KafkaConnectionError, match="gone"):
        later.result()


def test_fetch_all_topics_waiters_share_one_request_and_retry_after_error() -> None:
    manager, h, _, _ = make()
    h.take("Metadata").respond(metadata_body({}, brokers=[0]))
    w1, w2 = manager.fetch_all_topics(), manager.fetch_all_topics()
    h.take("Metadata").fail(KafkaConnectionError("down"))
    assert not w1.done()
    h.assert_idle()
    h.advance(BACKOFF)
    h.take("Metadata").respond(metadata_body(LEADERS))
    assert w1.result() is w2.result()
    assert set(w1.result().topics) == {"a", "b"}


def test_no_busy_deadline_when_nothing_can_be_sent() -> None:
    manager, h, interest, _ = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS))
    interest.names.clear()  # e.g. every partition unassigned
    h.assert_idle()
    assert manager.next_deadline(h.now) > h.now


def test_a_turn_asks_for_the_topics_of_interest_once() -> None:
    """The loop's turn polls and then asks for the next deadline at the same time: the deadline
    reads what the poll found; asked at any other time, it asks for the topics again."""
    manager, h, interest, _ = make()
    h.take("Metadata").respond(metadata_body({}, brokers=[0]))
    h.advance(1.0)
    asked = interest.asked
    assert manager.poll(h.now) == []
    assert manager.next_deadline(h.now) == float("inf")  # no topics, brokers known: nothing to ask
    assert interest.asked == asked + 1
    interest.names.add("c")  # a subscription between turns (its event wakes the loop)
    answered = h.now - 1.0
    assert manager.next_deadline(h.now + 0.01) == answered + MAX_AGE  # topics to refresh now
    assert interest.asked == asked + 2
    assert [t["name"] for t in h.take("Metadata").body()["topics"]] == ["c"]


@pytest.mark.parametrize("version", range(4, 13))
def test_request_and_response_encode_from_v4(version: int) -> None:
    # v1-v3 cannot say allow_auto_topic_creation=False; every broker with Fetch v4 has Metadata v4.
    manager, h, _, _ = make("a")
    request = h.take("Metadata").at(version)
    assert [t["name"] for t in request.body()["topics"]] == ["a"]
    request.respond(metadata_body(LEADERS))
    assert manager.cluster.leader(TopicPartition("a", 1)) == PartitionInfo(2, 3 if version >= 7 else -1)


# -- leader epochs never go back (KIP-320) ----------------------------------------------------------


def refresh(manager: MetadataManager, h: Scripted, leaders: dict[TopicPartition, tuple[int, int]],
            **kwargs: Any) -> None:
    manager.request_update()
    h.advance(BACKOFF)  # a refresh asked for right after another waits the backoff
    h.take("Metadata").respond(metadata_body(leaders, **kwargs))


def test_stale_leader_epoch_is_ignored() -> None:
    manager, h, _, _ = make("a")
    a0, a1 = TopicPartition("a", 0), TopicPartition("a", 1)
    h.take("Metadata").respond(metadata_body(LEADERS))
    # A broker that has not caught up: a0 with an older epoch (and its old leader); a1 moved on.
    refresh(manager, h, {a0: (2, 6), a1: (1, 4)}, brokers=[1, 2])
    assert manager.cluster.leader(a0) == PartitionInfo(1, 7)
    assert manager.cluster.leader(a1) == PartitionInfo(1, 4)
    refresh(manager, h, {a0: (2, 8), a1: (1, 4)}, brokers=[1, 2])
    assert manager.cluster.leader(a0) == PartitionInfo(2, 8)


def test_recreated_topic_starts_its_epochs_afresh() -> None:
    manager, h, _, _ = make("a")
    a0 = TopicPartition("a", 0)
    h.take("Metadata").respond(metadata_body({a0: (1, 7)}))
    refresh(manager, h, {a0: (1, 0)}, topic_ids={"a": b"\x01" * 16})
    assert manager.cluster.leader(a0) == PartitionInfo(1, 0)


def test_unknown_epoch_is_not_compared() -> None:
    manager, h, _, _ = make("a")
    a0 = TopicPartition("a", 0)
    h.take("Metadata").respond(metadata_body({a0: (1, 7)}))
    refresh(manager, h, {a0: (2, -1)}, brokers=[1, 2])  # a broker without epochs in Metadata
    assert manager.cluster.leader(a0) == PartitionInfo(2, -1)


def test_an_answer_naming_no_broker_is_ignored_and_asked_again_after_the_backoff() -> None:
    """A broker starting up, or shutting down (fenced), may answer with no live broker: nothing is
    taken from it (brokers, leaders, waiters), and the refresh goes again after the backoff."""
    manager, h, _, updates = make("a")
    h.take("Metadata").respond(metadata_body(LEADERS, brokers=[1, 2]))
    before = manager.cluster
    manager.request_update()
    h.advance(BACKOFF)
    h.take("Metadata").respond(metadata_body({}, brokers=[]))
    assert manager.cluster is before and updates == [before]
    assert "named no broker" in str(manager.last_error)
    assert manager.next_deadline(h.now) == h.now + BACKOFF
    waiter = manager.fetch_all_topics()  # Consumer.topics(): the same rule
    h.assert_idle()
    h.advance(BACKOFF)
    h.poll()
    regular, everything = sorted(h.take_all("Metadata"), key=lambda r: r.body()["topics"] is None)
    everything.respond(metadata_body({}, brokers=[]))
    assert not waiter.done()
    regular.respond(metadata_body(LEADERS, brokers=[1, 2]))
    assert manager.last_error is None and len(updates) == 2
    h.advance(BACKOFF)
    h.take("Metadata").respond(metadata_body(LEADERS, brokers=[1, 2]))
    assert waiter.done() and set(waiter.result().brokers) == {1, 2}
