"""Loopback ports for the test servers (``KafkaBroker``, ``KafkaCluster``, ``ContainerBroker``,
``EmbeddedBroker``, ``SchemaRegistry``), drawn so that two processes on one machine never take the
same one.

A port found free by binding it is free only until somebody binds it, and a broker binds its ports
seconds after they are drawn (a JVM starts, a node restarts on the ports it had).  Meanwhile two
pytest-xdist workers drawing at once, or any process's outgoing connection, can take it, and a node
of one cluster then meets another cluster on its peer's port (``INCONSISTENT_CLUSTER_ID``), or a
client finds a stranger at an address that should be dead.  So:

- ports are drawn at random *below* the kernel's ephemeral range (Linux:
  ``/proc/sys/net/ipv4/ip_local_port_range``), where neither ``bind(port 0)`` nor ``connect()``
  takes theirs;
- each drawn port is *leased*: an ``flock`` on a file named after it, in a directory of the user's
  under the system's temporary directory, held until :meth:`PortLease.release` or the process's
  exit (the kernel drops the lock then, so a crashed test leaks no port: only its empty file
  stays, for the next taker of the port to remove).  A port somebody else
  holds, or one that does not bind (somebody listens), is passed over.

Where there is no ``fcntl`` (Windows), ports are drawn by binding port 0, unleased.

A server of your own that tests start beside the brokers can lease its ports the same way::

    from asyncconsumer.testing.ports import lease_ports

    with lease_ports(1) as lease:
        (port,) = lease.ports
        ...                                     # start the server on 127.0.0.1:port, stop it
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import socket
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOOPBACK = "127.0.0.1"
#: The lowest port drawn: below it live the well-known services' ports (5432, 8080, 9092, ...).
FLOOR = 20000
#: Where the kernel's ephemeral range starts when it cannot be read (Linux's default).
EPHEMERAL_START = 32768


def drawing_range() -> range:
    """The ports leases are drawn from: :data:`FLOOR` up to the kernel's ephemeral range; above it
    when the ephemeral range starts too low to leave room below (a few thousand ports)."""
    start, end = EPHEMERAL_START, 60999
    with contextlib.suppress(OSError, ValueError):
        start, end = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    if start - FLOOR >= 2000:
        return range(FLOOR, start)
    return range(end + 1, 65536)


def lease_directory() -> Path:
    """This user's directory of lease files (each an empty file named after its port)."""
    return Path(tempfile.gettempdir()) / f"asyncconsumer-ports-{os.getuid() if hasattr(os, 'getuid') else 0}"


class PortLease:
    """Ports held for this process until :meth:`release` (or its exit); ``with`` releases them."""

    def __init__(self, ports: list[int], held: list[tuple[Path, int]]) -> None:
        self.ports = ports
        self._held = held

    def __repr__(self) -> str:
        return f"PortLease({self.ports}{'' if self._held or not self.ports else ', released'})"

    def release(self) -> None:
        """Give the ports back (safe to call twice).  The file goes before its lock, so a process
        that opened it meanwhile finds its lock on a file no longer there and draws again."""
        held, self._held = self._held, []
        for path, fd in held:
            _let_go(path, fd)

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _let_go(path: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)


def _hold(directory: Path, port: int) -> int | None:
    """An fd locking ``port``'s lease file, or None when somebody (this process too) holds it."""
    assert fcntl is not None
    path = directory / str(port)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The holder before us may have removed the file between our open and our lock: the lock
        # is then on a file nobody else will find, and the name may already be somebody else's.
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:  # BlockingIOError: held; FileNotFoundError: removed after the lock
        pass
    os.close(fd)
    return None


def port_free(port: int) -> bool:
    """Whether ``port`` binds on loopback now, as a broker's listener would (SO_REUSEADDR: a port
    in TIME_WAIT is free to a listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _unleased(count: int) -> PortLease:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):  # bound together, so no two are the same
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOOPBACK, 0))
        return PortLease([int(s.getsockname()[1]) for s in sockets], [])
    finally:
        for sock in sockets:
            sock.close()


def _from_random_start(ports: range) -> Iterator[int]:
    """Every port of ``ports`` once, from a random one on, wrapping round: two processes start
    drawing at different places, and the leases settle any overlap.  (Shuffling the whole range
    cost 20 ms a lease, for the handful of ports it takes.)"""
    start = random.SystemRandom().randrange(len(ports))
    return itertools.chain(ports[start:], ports[:start])


def lease_ports(count: int, *, candidates: Iterable[int] | None = None) -> PortLease:
    """``count`` distinct loopback ports that bind now and that no other lease holds, each held
    until the lease is released.  ``candidates``: the ports to try, in order (tests); by default
    :func:`drawing_range`'s, from a random one on.  :class:`OSError` when too few of them are free."""
    if fcntl is None:  # pragma: no cover - Windows
        return _unleased(count)
    directory = lease_directory()
    directory.mkdir(mode=0o700, exist_ok=True)
    ports: list[int] = []
    held: list[tuple[Path, int]] = []
    try:
        for port in candidates if candidates is not None else _from_random_start(drawing_range()):
            if len(ports) == count:
                break
            fd = _hold(directory, port)
            if fd is None:
                continue
            if not port_free(port):
                _let_go(directory / str(port), fd)
                continue
            ports.append(port)
            held.append((directory / str(port), fd))
        if len(ports) < count:
            raise OSError(f"no {count} free loopback ports to lease (found {len(ports)})")
    except BaseException:
        PortLease(ports, held).release()
        raise
    return PortLease(ports, held)
