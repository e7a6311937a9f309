"""Leased loopback ports (``asyncconsumer.testing.ports``): what the test brokers listen on, drawn
so that no two leases, in this process or another, hold the same port."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncconsumer.testing import ports as ports_module
from asyncconsumer.testing.kafka import KafkaCluster
from asyncconsumer.testing.ports import drawing_range, lease_ports

pytestmark = pytest.mark.skipif(ports_module.fcntl is None, reason="leases need fcntl (POSIX)")


def _free(count: int) -> list[int]:
    """``count`` ports of the drawing range that nobody holds now (taken and given back)."""
    with lease_ports(count) as lease:
        return list(lease.ports)


def test_ports_are_drawn_below_the_ephemeral_range() -> None:
    ports = drawing_range()
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert len(ports) >= 2000
    assert ports.stop <= low or ports.start > high
    lease = lease_ports(20)
    try:
        assert len(set(lease.ports)) == 20 and all(port in ports for port in lease.ports)
    finally:
        lease.release()


def test_a_held_port_goes_to_no_other_lease_until_released() -> None:
    first, second, third = _free(3)
    held = lease_ports(1, candidates=[first])
    try:
        other = lease_ports(2, candidates=[first, second, third])
        assert other.ports == [second, third]
        other.release()
        with pytest.raises(OSError, match="no 1 free loopback ports"):
            lease_ports(1, candidates=[first])
    finally:
        held.release()
    with lease_ports(1, candidates=[first]) as again:
        assert again.ports == [first]


def test_a_port_somebody_listens_on_is_passed_over() -> None:
    busy, free = _free(2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", busy))
        listener.listen()
        with lease_ports(1, candidates=[busy, free]) as lease:
            assert lease.ports == [free]


def test_another_process_holds_its_lease_until_it_exits() -> None:
    ports = _free(2)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from asyncconsumer.testing.ports import lease_ports
            lease = lease_ports(2, candidates={ports!r})
            print(lease.ports, flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == str(ports)
        with pytest.raises(OSError):
            lease_ports(1, candidates=ports)
    finally:
        holder.kill()  # no release: the kernel drops the lock with the process
        holder.wait(timeout=30)
    with lease_ports(2, candidates=ports) as lease:
        assert lease.ports == ports


def test_a_cluster_holds_every_port_it_drew_until_it_stops() -> None:
    """A node that restarts, or moves away, leaves its ports leased: nobody is drawn onto them
    while the cluster runs (a client that knew a moved node's old address finds nobody there)."""
    cluster = KafkaCluster(brokers=1)
    first = cluster.lease_ports(3)
    moved = cluster.lease_ports(3)
    assert not set(first) & set(moved)
    with pytest.raises(OSError):
        lease_ports(1, candidates=first + moved)
    cluster.stop()
    with lease_ports(6, candidates=first + moved) as lease:
        assert sorted(lease.ports) == sorted(first + moved)


@pytest.mark.parametrize("service", ["EmbeddedBroker", "SchemaRegistry"])
def test_the_embedded_broker_and_the_registry_hold_the_port_they_drew_until_they_stop(service: str) -> None:
    """Their default port is leased as the Kafka brokers' are (below the ephemeral range, where no
    outgoing connection takes it between the draw and the bind); a port given is the caller's."""
    from asyncconsumer import testing

    server = getattr(testing, service)()
    assert server.port in drawing_range()
    with pytest.raises(OSError):
        lease_ports(1, candidates=[server.port])
    server.stop()  # never started: stopping gives the port back all the same
    with lease_ports(1, candidates=[server.port]) as lease:
        assert lease.ports == [server.port]
        given = getattr(testing, service)(port=server.port)  # the caller's port: no lease of its own
        given.stop()
