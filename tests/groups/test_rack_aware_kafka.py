"""Rack-aware classic assignment (KIP-881) in a mixed group on Apache Kafka: two asyncconsumer members
and a Java member (Kafka's VerifiableConsumer), each with a ``client_rack``, on a three-node
cluster with ``broker.rack`` a/b/c and a topic whose partitions have one replica each, in turn on
the three racks (see ``support/rack_group.py``).

For each assignor Java and we share (``range``, ``cooperative-sticky``, ``sticky``) and either side
leading the group: every member ends with exactly the partitions of its own rack, each partition
owned once, every record read, and the group then stays put (no rebalance storm).  Without rack
awareness ``range`` hands out contiguous ranges by member id and a leader of ours ignoring the
Java member's rack (or a member of ours not sending its own) breaks the alignment.

The whole matrix is ``long`` (a cluster of its own); ``tests/resilience/test_failover.py`` runs a
representative pair on the cluster it already has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rack_group import check_rack_aligned_group

from asyncconsumer.testing import KafkaCluster

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm, pytest.mark.long,
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # about the group's assignment, not the event loop: one backend


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster(3, racks=("a", "b", "c")) as kafka:
        yield kafka


@pytest.mark.parametrize("java_leads", [False, True], ids=["our-leader", "java-leader"])
@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky", "sticky"])
async def test_mixed_group_is_rack_aligned(cluster: KafkaCluster, tmp_path: Path, assignor: str,
                                           java_leads: bool) -> None:
    await check_rack_aligned_group(cluster, tmp_path, assignor=assignor, java_leads=java_leads)
