"""Reading large response frames: pooled frame buffers (engine/buffers.py) against a new one per frame.

In process, on loopback: a task sends ``--frames`` Kafka-framed responses of ``--frame-mib`` MiB
(random bytes) over TCP, and a ``BrokerConnection`` reads them with its own read path, keeping a
view into the last ``--hold`` frames as the fetch buffer keeps responses it has not read yet.
Each round reads once with a pool of ``fetch_buffer_bytes`` (64 MiB) and once with a pool of no
bytes (a new buffer per frame, as before the pool); the rounds alternate.  It reports the CPU
time of the process (the sending task included, the same for both) and its page faults.

``python -m benchmarks.frames [--rounds N]`` prints a table.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import time

import anyio
import anyio.abc

from asyncconsumer.engine.buffers import BufferPool
from asyncconsumer.engine.connection import BrokerConnection
from asyncconsumer.engine.sockets import connect


async def read_once(frame: bytes, frames: int, hold: int, pool_bytes: int) -> tuple[float, int, BufferPool]:
    """CPU seconds and page faults of reading ``frames`` copies of ``frame``, and the pool used."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def send(stream: anyio.abc.SocketStream) -> None:
        for _ in range(frames):
            await stream.send(frame)
        await stream.aclose()

    pool = BufferPool(pool_bytes)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, send)
        stream = await connect("127.0.0.1", port)  # as a plaintext BrokerConnection opens it
        conn = BrokerConnection(1, "127.0.0.1", port, client_id="bench", request_timeout=10, setup_timeout=10,
                                ssl_context=None, frames=pool)
        held: collections.deque[memoryview] = collections.deque(maxlen=hold)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu = time.process_time()
        for _ in range(frames):
            size = int.from_bytes(await conn._read_exactly(stream, 4), "big")
            held.append(memoryview(await conn._read_exactly(stream, size))[100:200])
        cpu = time.process_time() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        held.clear()
        await stream.aclose()
        tg.cancel_scope.cancel()
    return cpu, faults, pool


async def main(args: argparse.Namespace) -> None:
    size = int(args.frame_mib * (1 << 20))
    frame = size.to_bytes(4, "big") + os.urandom(size)
    runs: dict[str, list[tuple[float, int]]] = {"pooled": [], "new buffer per frame": []}
    reuse = ""
    for _ in range(args.rounds):
        for name, pool_bytes in (("pooled", 64 << 20), ("new buffer per frame", 0)):
            cpu, faults, pool = await read_once(frame, args.frames, args.hold, pool_bytes)
            runs[name].append((cpu, faults))
            if pool_bytes:
                reuse = f"{pool.allocated} allocated, {pool.reused} used again"
    mib = args.frames * size / (1 << 20)
    print(f"{args.frames} frames of {args.frame_mib} MiB ({mib:.0f} MiB), {args.hold} held, "
          f"{args.rounds} rounds, medians; pooled buffers: {reuse}\n")
    print("| frame buffers | CPU s | MiB per CPU s | page faults |")
    print("|---|---:|---:|---:|")
    for name, values in runs.items():
        cpu = statistics.median(c for c, _ in values)
        median_faults = statistics.median(f for _, f in values)
        print(f"| {name} | {cpu:.3f} | {mib / cpu:,.0f} | {median_faults:,.0f} |")


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--frame-mib", type=float, default=4.0)
    parser.add_argument("--hold", type=int, default=4)
    anyio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
