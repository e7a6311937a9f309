"""A group member reads while a chaos proxy cuts and stalls its connections every 1-2 seconds.

Everything between the consumer and the broker goes through the proxy: the broker advertises the
proxy's address.  Tansu through the ``proxied_broker`` fixture; Apache Kafka through a private
single-node broker whose PLAINTEXT listener advertises the proxy (``advertise_plaintext``: the
proxy learns the broker's port before the broker starts).  Counted: records lost (must be none)
and read twice, cuts and stalls.  ``ASYNCCONSUMER_CPU_PRESSURE=N`` reads under N busy processes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from support.broker import backend_names_from_env
from support.pressure import cpu_pressure
from support.producer import create_topic
from support.producer import produce as _produce
from support.proxy import ChaosProxy

from asyncconsumer import Consumer
from asyncconsumer.testing import KafkaBroker, KafkaNode

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


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


#: Faults the chaos strikes while the member reads (the read waits for them).
FAULTS = 5


@pytest.mark.parametrize("broker", ["tansu", "kafka"])
async def test_cuts_and_stalls_every_second_or_two_lose_nothing(broker: str, request: pytest.FixtureRequest) -> None:
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
        cuts = stalls = 0
        async with Consumer(
            bootstrap_servers=pb.bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest",
            session_timeout_ms=6000, heartbeat_interval_ms=500, fetch_max_wait_ms=100,
            max_partition_fetch_bytes=16384, reconnect_backoff_ms=20, retry_backoff_ms=50,
            request_timeout_ms=3000, auto_commit_interval_ms=500,
        ) as c:
            c.subscribe([topic])
            with cpu_pressure(), anyio.move_on_after(120):
                async with anyio.create_task_group() as tg:

                    started = anyio.Event()
                    struck = anyio.Event()  # set at each fault (and then replaced)

                    async def chaos() -> None:
                        nonlocal cuts, stalls, struck
                        # From the first records on: a cut during the first JoinGroup, which Tansu
                        # holds for session_timeout_ms / 2, would only start the join again.
                        await started.wait()
                        while True:
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
                        if len(seen) == 500:
                            started.set()
                        if len(seen) % 100 == 0:
                            # The read keeps pace with the chaos, however fast the machine: by each
                            # sixth of the records one more fault has struck, five before the last
                            # sixth is read.
                            needed = min(FAULTS, len(seen) * (FAULTS + 1) // total)
                            while cuts + stalls < needed:
                                await struck.wait()
                            await anyio.sleep(0.01)
                        if len(set(seen)) == total:
                            break
                    tg.cancel_scope.cancel()
            pb.proxy.blackhole = False
    counts = Counter(seen)
    lost = total - len(counts)
    twice = sum(1 for v in counts.values() if v > 1)
    figures = f"{broker}: {total} records, {cuts} cuts, {stalls} stalls: {lost} lost, {twice} read twice"
    print(figures)
    assert lost == 0, figures
    assert cuts + stalls >= FAULTS, figures  # the chaos struck while the member read
    assert twice == 0, figures  # one member, no rebalance: a cut or stall repeats nothing
