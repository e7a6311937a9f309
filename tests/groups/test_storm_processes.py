"""A storm: group members in separate processes come and go, gracefully or by SIGKILL.

Members (``tests/support/storm_member.py``) read with every read API (``async for``,
``getmany``, ``batches``, ``partitions``) on asyncio and trio.  Every couple of seconds one
leaves — alternately a graceful ``close()`` while it is busy and a SIGKILL — and a new one joins.
Then the last members finish the topic.  Counted: records lost (never processed) and processed
twice.  No record may be lost; a record may be processed twice only when its earlier reader was
killed (its uncommitted window); after a graceful leave, never.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.paths import SUPPORT

MEMBER = SUPPORT / "storm_member.py"
APIS = ["async for", "getmany", "batches", "partitions"]
BACKENDS = ["asyncio", "trio"]


class Member:
    def __init__(self, index: int, tmp: Path, base: dict[str, Any]) -> None:
        self.name = f"m{index}"
        self.api = APIS[index % len(APIS)]
        self.backend = BACKENDS[(index // len(APIS)) % len(BACKENDS)]
        self.out = tmp / f"{self.name}.out"
        self.stop = tmp / f"{self.name}.stop"
        self.leader_mark = tmp / f"{self.name}.leader"  # present while the member leads the group
        self.killed = False
        cfg = {**base, "api": self.api, "backend": self.backend, "out": str(self.out), "stop": str(self.stop),
               "leader": str(self.leader_mark)}
        self.proc = subprocess.Popen([sys.executable, str(MEMBER), json.dumps(cfg)],
                                     stdout=subprocess.DEVNULL, stderr=(tmp / f"{self.name}.err").open("w"))

    def leave(self) -> None:
        self.stop.touch()

    def kill(self) -> None:
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)

    def reads(self) -> list[tuple[int, int, float]]:
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:  # a SIGKILL may cut the last line
                rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
        return rows


@pytest.mark.timeout(150)
def test_storm_of_members_leaving_and_killed_loses_nothing(
    kafka_backend: Any, bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any], tmp_path: Path
) -> None:
    # Tansu can go on naming a departed group leader (leader_handover): seen in CI, the members then
    # rejoined for two minutes with nobody computing the assignment. There the leader is never removed.
    spare_leader = not kafka_backend.supports("leader_handover")
    partitions, total = 6, 16_000
    topic = new_topic(partitions)
    produce(topic, ((i % partitions, None, b"%d" % i) for i in range(total)))
    base = {"bootstrap": bootstrap, "topic": topic, "group": f"g-{topic}", "delay": 0.002}
    rng = random.Random(14)
    members: list[Member] = []
    live: list[Member] = []

    def spawn() -> None:
        m = Member(len(members), tmp_path, base)
        members.append(m)
        live.append(m)

    def seen() -> set[tuple[int, int]]:
        return {(p, o) for m in members for p, o, _ in m.reads()}

    leaves = kills = 0
    try:
        for _ in range(4):
            spawn()
        deadline = time.monotonic() + 60
        while len(seen()) < 300 and time.monotonic() < deadline:  # the group is up and reading
            time.sleep(0.2)
        for event in range(6):  # the storm: one member goes every 2.5 s, a new one comes
            time.sleep(2.5)
            candidates = [m for m in live if not (spare_leader and m.leader_mark.exists())] or live
            reading = [m for m in candidates if m.reads()] or candidates  # one that holds partitions, if any
            victim = reading[rng.randrange(len(reading))]
            live.remove(victim)
            if event % 2 == 0:
                victim.leave()
                leaves += 1
            else:
                victim.kill()
                kills += 1
            spawn()
        while len(seen()) < total and time.monotonic() < deadline + 60:  # the last members finish
            time.sleep(0.3)
        time.sleep(1.0)  # anything read twice shows up
    finally:
        for m in live:
            m.leave()
        for m in members:
            try:
                m.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()
    failed = [m.name for m in members if not m.killed and m.proc.returncode != 0]
    assert not failed, "members exited with errors: " + "; ".join(
        f"{n}: {(tmp_path / f'{n}.err').read_text()[-2000:]}" for n in failed)

    reads: dict[tuple[int, int], list[tuple[float, Member]]] = defaultdict(list)
    for m in members:
        for p, o, t in m.reads():
            reads[(p, o)].append((t, m))
    lost = total - len(reads)
    twice = {k: sorted(v, key=lambda x: x[0]) for k, v in reads.items() if len(v) > 1}
    # A record read again is all right only when every earlier reader was killed before committing it.
    after_graceful = {k: [(m.name, m.api) for _, m in v[:-1] if not m.killed] for k, v in twice.items()}
    after_graceful = {k: v for k, v in after_graceful.items() if v}
    figures = (f"{total} records, {len(members)} members, {leaves} graceful leaves, {kills} SIGKILLs: "
               f"{lost} lost, {len(twice)} read twice ({len(twice) - len(after_graceful)} after a SIGKILL)")
    print(figures)
    (tmp_path / "figures.txt").write_text(figures)
    assert lost == 0, figures
    assert not after_graceful, f"{figures}; read twice after a graceful leave: {sorted(after_graceful.items())[:10]}"
    apis = {m.api for m in members if m.reads()}
    assert apis == set(APIS), f"every read API read records: {apis}"
