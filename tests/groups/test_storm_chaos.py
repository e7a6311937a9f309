"""A group member reads while a chaos proxy cuts and stalls its connections every 1-2 seconds.

Everything between the consumer and the broker goes through the proxy: the broker advertises the
proxy's address.  Tansu through the ``proxied_broker`` fixture; Apache Kafka through a private
single-node broker whose PLAINTEXT listener advertises the proxy (``advertise_plaintext``: the
proxy learns the broker's port before the broker starts).  Counted: records lost (must be none)
and read twice (none, unless the member's session expired and its partitions were *lost*: then
only records of those), cuts and stalls.  The chaos strikes at least :data:`FAULTS` times while the
member reads and stops after :data:`MAX_FAULTS`; the read then finishes.  Quiet spells longer than
``quiet_partition_warning_s`` must each be named by a WARNING (no silent stall).
``ASYNCCONSUMER_CPU_PRESSURE=N`` reads under N busy processes: two cores loaded that way read
30,000 records through 35 strikes in over two minutes, where a quiet machine needs well under one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from support.broker import backend_names_from_env
from support.consumers import LostRecorder
from support.pressure import cpu_pressure
from support.producer import create_topic
from support.producer import produce as _produce
from support.proxy import ChaosProxy

from asyncconsumer import Consumer
from asyncconsumer.testing import KafkaBroker, KafkaNode

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Proxied:
    def __init__(self, proxy: ChaosProxy, direct: str) -> None:
        self.proxy = proxy
        self.direct = direct

    @property
    def bootstrap(self) -> str:
        return self.proxy.address


@contextlib.asynccontextmanager
async def kafka_behind_proxy() -> AsyncIterator[Proxied]:
    async with ChaosProxy("127.0.0.1", 9) as proxy:  # pointed at the broker before it starts

        def advertise(node: KafkaNode) -> str:
            proxy.retarget("127.0.0.1", node.ports.plaintext)
            return proxy.address

        broker = KafkaBroker(listeners=("PLAINTEXT",), advertise_plaintext=advertise)
        await anyio.to_thread.run_sync(broker.start)
        try:
            yield Proxied(proxy, broker.direct_bootstrap)
        finally:
            await anyio.to_thread.run_sync(broker.stop)


@contextlib.asynccontextmanager
async def tansu_behind_proxy(proxied_broker: Any) -> AsyncIterator[Proxied]:
    async with proxied_broker() as pb:
        yield Proxied(pb.proxy, pb.direct_bootstrap)


#: Faults the chaos strikes while the member reads (the read waits for them), and at most.
FAULTS = 5
MAX_FAULTS = 20
#: How long the read may take in all (the chaos included); a stuck read fails here.
READ_LIMIT = 200


@pytest.mark.parametrize("broker", ["tansu", "kafka"])
async def test_cuts_and_stalls_every_second_or_two_lose_nothing(
    broker: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    if broker not in backend_names_from_env():
        pytest.skip(f"ASYNCCONSUMER_TEST_BROKER leaves {broker} out")
    behind = (kafka_behind_proxy() if broker == "kafka"
              else tansu_behind_proxy(request.getfixturevalue("proxied_broker")))
    rng = random.Random(int(os.environ.get("ASYNCCONSUMER_CHAOS_SEED", "14")))
    async with behind as pb:
        topic = await anyio.to_thread.run_sync(create_topic, pb.bootstrap, f"chaos-{rng.getrandbits(32):08x}", 3)
        total = 30_000
        records = ((i % 3, None, b"%d" % i) for i in range(total))
        await anyio.to_thread.run_sync(functools.partial(
            _produce, pb.bootstrap, topic, records, client_config={"batch.num.messages": 500}))
        seen: list[int] = []
        arrivals: list[float] = []
        paced: list[tuple[float, float]] = []  # the reader waiting for the chaos to catch up
        cuts = stalls = 0
        recorder = LostRecorder()
        async with Consumer(
            bootstrap_servers=pb.bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
            session_timeout_ms=6000, heartbeat_interval_ms=500, fetch_max_wait_ms=100,
            max_partition_fetch_bytes=16384, reconnect_backoff_ms=20, retry_backoff_ms=50,
            request_timeout_ms=3000, auto_commit_interval_ms=500,
        ) as c:
            c.subscribe([topic], listener=recorder)
            quiet_bound = c.config.quiet_partition_warning_s
            with cpu_pressure(), anyio.move_on_after(READ_LIMIT):
                async with anyio.create_task_group() as tg:

                    started = anyio.Event()
                    struck = anyio.Event()  # set at each fault (and then replaced)

                    async def chaos() -> None:
                        nonlocal cuts, stalls, struck
                        # From the first records on: a cut during the first JoinGroup, which Tansu
                        # holds for session_timeout_ms / 2, would only start the join again.
                        await started.wait()
                        while cuts + stalls < MAX_FAULTS:
                            await anyio.sleep(rng.uniform(1.0, 2.0))
                            if rng.random() < 0.75:
                                await pb.proxy.drop_all(reset=rng.random() < 0.5)
                                cuts += 1
                            else:
                                pb.proxy.blackhole = True  # a hung peer: nothing answers for a while
                                await anyio.sleep(rng.uniform(0.5, 1.5))
                                pb.proxy.blackhole = False
                                await pb.proxy.drop_all()  # the hung connections are given up
                                stalls += 1
                            struck.set()
                            struck = anyio.Event()

                    tg.start_soon(chaos)
                    async for record in c:
                        seen.append(int(record.value))
                        arrivals.append(time.monotonic())
                        if len(seen) == 500:
                            started.set()
                        if len(seen) % 100 == 0:
                            # The read keeps pace with the chaos, however fast the machine: by each
                            # sixth of the records one more fault has struck, five before the last
                            # sixth is read.
                            needed = min(FAULTS, len(seen) * (FAULTS + 1) // total)
                            waited = time.monotonic()
                            while cuts + stalls < needed:
                                await struck.wait()
                            paced.append((waited, time.monotonic()))
                            await anyio.sleep(0.01)
                        if len(set(seen)) == total:
                            break
                    tg.cancel_scope.cancel()
            pb.proxy.blackhole = False
    counts = Counter(seen)
    lost = total - len(counts)
    twice = {v for v, n in counts.items() if n > 1}
    lost_partitions = {tp.partition for kind, tps in recorder.events if kind == "lost" for tp in tps}
    gaps = sorted((b - a, a - arrivals[0]) for a, b in itertools.pairwise(arrivals))[-3:]
    named = [r for r in caplog.records if r.levelno == logging.WARNING and r.getMessage().startswith(
        "no records fetched for ")]
    figures = (f"{broker}: {total} records, {cuts} cuts, {stalls} stalls: {lost} lost, {len(twice)} read twice, "
               f"partitions lost {sorted(lost_partitions)}, read in {arrivals[-1] - arrivals[0]:.0f} s; longest "
               f"gaps between reads {', '.join(f'{g:.1f} s at {at:.1f} s' for g, at in gaps)}; "
               f"{len(named)} quiet-partition warnings")
    print(figures)
    assert lost == 0, figures
    assert cuts + stalls >= FAULTS, figures  # the chaos struck while the member read
    # One member: a cut or stall repeats nothing, unless its session expired (partitions lost).
    assert all(v % 3 in lost_partitions for v in twice), figures
    # No silent stall: a gap between reads longer than the bound had a WARNING naming it.
    to_monotonic = time.monotonic() - time.time()
    warned = [r.created + to_monotonic for r in named]

    def quiet(a: float, b: float) -> float:  # the gap, less the reader's own waits for the chaos
        return b - a - sum(max(0.0, min(y, b) - max(x, a)) for x, y in paced)

    silent = [(quiet(a, b), a - arrivals[0]) for a, b in itertools.pairwise(arrivals)
              if quiet(a, b) > quiet_bound + 1 and not any(a <= t <= b for t in warned)]
    assert not silent, f"gaps between reads past {quiet_bound:.1f} s with no WARNING: {silent[:5]}; {figures}"
