"""MetadataManager's rebootstrap decision (KIP-899, KIP-1102), sans-I/O: scripted Metadata answers,
a fake clock and a fake network side (``BootstrapControl``)."""

from __future__ import annotations

import logging

import pytest

from asyncconsumer.errors import KafkaConnectionError, RebootstrapRequiredError
from asyncconsumer.managers.metadata import MetadataManager, RecoveryStrategy
from asyncconsumer.structs import TopicPartition

from .scripted import Scripted, metadata_body

MAX_AGE = 300.0
BACKOFF = 0.5
TRIGGER = 30.0
A0 = TopicPartition("a", 0)


class FakeNetwork:
    """The network client's side: whether the known brokers are out of reach, a REBOOTSTRAP_REQUIRED
    from an ApiVersions, and the rebootstraps it was told to do."""

    def __init__(self) -> None:
        self.unavailable = False
        self.requested = False
        self.reasons: list[str] = []

    def known_brokers_unavailable(self) -> bool:
        return self.unavailable

    def rebootstrap_requested(self) -> bool:
        requested, self.requested = self.requested, False
        return requested

    def rebootstrap(self, reason: str) -> None:
        self.reasons.append(reason)


def make(strategy: RecoveryStrategy = "rebootstrap") -> tuple[MetadataManager, Scripted, FakeNetwork]:
    network = FakeNetwork()
    manager = MetadataManager(max_age=MAX_AGE, retry_backoff=BACKOFF, topics_of_interest=lambda: {"a"},
                              on_update=lambda cluster: None, bootstrap=network, recovery_strategy=strategy,
                              rebootstrap_trigger=TRIGGER)
    return manager, Scripted(manager), network


def bootstrapped(strategy: RecoveryStrategy = "rebootstrap") -> tuple[MetadataManager, Scripted, FakeNetwork]:
    """Metadata from a bootstrap server: brokers 1 and 2, ``a-0`` led by 1."""
    manager, h, network = make(strategy)
    h.take("Metadata").respond(metadata_body({A0: (1, 3)}, brokers=[1, 2]))
    assert set(manager.cluster.brokers) == {1, 2}
    return manager, h, network


def test_known_brokers_unreachable_when_a_refresh_is_due_goes_back_to_bootstrap() -> None:
    manager, h, network = bootstrapped()
    network.unavailable = True
    h.assert_idle()  # unreachable, but no refresh due: nothing decided yet
    assert network.reasons == []
    manager.request_update()  # a fetch failed, say
    request = h.take("Metadata")  # asked for at once, for a bootstrap server
    assert network.reasons == ["none of the known brokers can be reached"]
    assert manager.cluster.brokers == {} and manager.cluster.leader(A0) is None  # nothing stale is used
    assert manager.rebootstraps == 1
    request.respond(metadata_body({A0: (7, 4)}, brokers=[7]))
    assert manager.cluster.brokers == {7: ("broker7", 9099)}
    assert manager.cluster.leader(A0) is not None and manager.cluster.leader(A0).leader == 7


def test_no_decision_before_the_first_metadata() -> None:
    """Not bootstrapped yet: the bootstrap servers are what is being tried anyway."""
    manager, h, network = make()
    network.unavailable = True
    request = h.take("Metadata")
    request.fail(KafkaConnectionError("refused"))
    h.advance(TRIGGER * 3)
    h.take("Metadata")
    assert network.reasons == [] and manager.rebootstraps == 0


def test_reachable_brokers_that_never_answer_trigger_after_the_trigger_time() -> None:
    """KIP-1102: a known broker accepts connections (so it is not "unavailable") but no metadata
    comes: after ``metadata_recovery_rebootstrap_trigger_ms`` since the refresh fell due."""
    manager, h, network = bootstrapped()
    manager.request_update()
    due = h.now
    stuck = h.take("Metadata")  # never answered: the broker hangs
    h.advance(TRIGGER - 1)
    h.assert_idle()
    assert network.reasons == []
    assert manager.next_deadline(h.now) == pytest.approx(due + TRIGGER)  # the loop wakes up for it
    h.advance(1)
    fresh = h.take("Metadata")  # at once, without waiting for the hung request
    assert len(network.reasons) == 1 and network.reasons[0].startswith("no metadata from any known broker for 30s")
    stuck.respond(metadata_body({A0: (1, 3)}, brokers=[1, 2]))  # late, from a broker given up on: ignored
    assert manager.cluster.brokers == {}
    fresh.respond(metadata_body({A0: (5, 4)}, brokers=[5]))
    assert set(manager.cluster.brokers) == {5}


def test_failed_refreshes_count_towards_the_trigger_and_metadata_resets_it() -> None:
    manager, h, network = bootstrapped()
    manager.request_update()
    for _ in range(3):  # refused, retried after the backoff: 10 s of failures
        h.take("Metadata").fail(KafkaConnectionError("refused"))
        h.advance(10 / 3)
    h.take("Metadata").respond(metadata_body({A0: (1, 3)}, brokers=[1, 2]))  # metadata: the count starts over
    manager.request_update()
    h.advance(BACKOFF)
    for _ in range(5):
        h.take("Metadata").fail(KafkaConnectionError("refused"))
        h.advance(5)
    assert network.reasons == []  # 25 s since it fell due again, not 35
    h.advance(6)
    h.take("Metadata")
    assert len(network.reasons) == 1


def test_a_metadata_answer_with_rebootstrap_required_goes_back_at_once() -> None:
    """Metadata v13's top-level error code (KIP-1102)."""
    manager, h, network = bootstrapped()
    manager.request_update()
    h.advance(BACKOFF)
    h.take("Metadata").respond({**metadata_body({}, brokers=[1]), "error_code": RebootstrapRequiredError.code})
    assert set(manager.cluster.brokers) == {1, 2}  # the answer carries no usable metadata
    h.take("Metadata")
    assert network.reasons == ["a broker answered REBOOTSTRAP_REQUIRED"]


def test_an_api_versions_rebootstrap_required_goes_back_at_once() -> None:
    """KIP-1242: a connection's ApiVersions refused (not the node or cluster meant)."""
    manager, h, network = bootstrapped()
    network.requested = True
    h.take("Metadata")
    assert network.reasons == ["a broker answered REBOOTSTRAP_REQUIRED"]
    assert manager.cluster.brokers == {}


def test_after_a_rebootstrap_no_other_until_metadata_comes() -> None:
    """The bootstrap servers are what is tried now: failing, they are retried (their names resolved
    again each time), not given up on again."""
    manager, h, network = bootstrapped()
    network.unavailable = True
    manager.request_update()
    h.take("Metadata").fail(KafkaConnectionError("refused"))
    for _ in range(10):
        h.advance(TRIGGER)
        h.take("Metadata").fail(KafkaConnectionError("refused"))
    assert manager.rebootstraps == 1


@pytest.mark.parametrize("cause", ["unreachable", "trigger", "required"])
def test_none_never_goes_back_and_says_so_once(cause: str, caplog: pytest.LogCaptureFixture) -> None:
    manager, h, network = bootstrapped("none")
    caplog.set_level(logging.WARNING, logger="asyncconsumer.metadata")
    network.unavailable = cause == "unreachable"
    network.requested = cause == "required"
    manager.request_update()
    for _ in range(4):
        request = h.take("Metadata")
        h.advance(TRIGGER if cause == "trigger" else BACKOFF)
        request.fail(KafkaConnectionError("refused"))
        h.advance(BACKOFF)
    assert network.reasons == [] and manager.rebootstraps == 0
    assert set(manager.cluster.brokers) == {1, 2}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "metadata_recovery_strategy='none': not going back to bootstrap_servers" in warnings[0]


def test_without_a_network_side_nothing_is_decided() -> None:
    manager = MetadataManager(max_age=MAX_AGE, retry_backoff=BACKOFF, topics_of_interest=lambda: {"a"},
                              on_update=lambda cluster: None)
    h = Scripted(manager)
    h.take("Metadata").respond(metadata_body({A0: (1, 3)}, brokers=[1]))
    manager.request_update()
    h.take("Metadata")
    h.advance(10 * MAX_AGE)
    h.assert_idle()
    assert manager.rebootstraps == 0
