"""One member of a storm (``tests/groups/test_storm_processes.py``), run in its own process.

``python storm_member.py CONFIG_JSON``: joins the group, reads ``topic`` with one read API
(``async for``, ``getmany``, ``batches`` or ``partitions``) on asyncio or trio, and appends
``partition offset time`` to ``out`` once each record is processed (line-buffered, so a SIGKILL
loses nothing written).  When the file ``stop`` appears it leaves gracefully: ``close()`` is
called from another task while the reader is busy, and the reader finishes what it holds.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import anyio

from asyncconsumer import Consumer
from asyncconsumer.errors import ConsumerClosedError


async def main(cfg: dict[str, Any], out: TextIO) -> None:
    delay = float(cfg["delay"])

    async def process(partition: int, offset: int) -> None:
        await anyio.sleep(delay)  # the work
        out.write(f"{partition} {offset} {time.time():.6f}\n")

    async with Consumer(bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"],
                        auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
                        fetch_max_wait_ms=100, retry_backoff_ms=50, request_timeout_ms=10000,
                        max_poll_records=50, auto_commit_interval_ms=1000) as c:
        c.subscribe([cfg["topic"]])
        api = cfg["api"]

        async def read() -> None:
            if api == "async for":
                async for r in c:
                    await process(r.partition, r.offset)
            elif api == "batches":
                async for batch in c.batches():
                    for r in batch:
                        await process(r.partition, r.offset)
            elif api == "getmany":
                while True:
                    try:
                        got = await c.getmany(timeout=0.2)
                    except ConsumerClosedError:
                        return
                    for records in got.values():
                        for r in records:
                            await process(r.partition, r.offset)
            else:
                async with anyio.create_task_group() as streams:

                    async def work(stream: Any) -> None:
                        async for r in stream:
                            await process(r.partition, r.offset)

                    async for _, stream in c.partitions(buffer_records=50):
                        streams.start_soon(work, stream)

        async def watch() -> None:
            leader_mark = anyio.Path(cfg["leader"])
            while not await anyio.Path(cfg["stop"]).exists():
                membership = c._engine.membership if c._engine is not None else None
                leads = membership is not None and bool(membership.member_id) and getattr(
                    membership, "leader_id", "") == membership.member_id
                if leads != await leader_mark.exists():
                    await (leader_mark.touch() if leads else leader_mark.unlink(missing_ok=True))
                await anyio.sleep(0.05)
            await c.close()  # a graceful leave while the reader is busy

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await read()
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    with open(config["out"], "a", buffering=1) as output:  # line-buffered: a SIGKILL loses no line
        anyio.run(main, config, output, backend=config["backend"])
