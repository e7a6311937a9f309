"""``python -m benchmarks.arrow_read --read``: each reader, on asyncio and on uvloop, reads every record.

Not a performance test (no threshold on speed): the reader subprocess the benchmark runs for each
round must read exactly the topic's records through the API it names and report positive times,
on both event loops, so the benchmark's table compares readers that did the same work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
from support.paths import ROOT

PARTITIONS = 2
RECORDS = 3_000


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> str:
    from support.producer import create_topic

    from asyncconsumer.testing.producer import produce

    name = create_topic(bootstrap, f"arrow-read-{uuid.uuid4().hex[:12]}", PARTITIONS)
    produce(bootstrap, name, [(i % PARTITIONS, b"k%d" % i, b"v" * 100, None) for i in range(RECORDS)])
    return name


def read(
    bootstrap: str, topic: str, reader: str, loop: str, count: int = RECORDS, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.arrow_read", "--read", reader, bootstrap, topic, str(PARTITIONS),
               str(count), "--loop", loop, *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("reader", ["arrow", "batches"])
def test_reader_reads_every_record_on_its_loop(bootstrap: str, topic: str, reader: str, loop: str) -> None:
    got = read(bootstrap, topic, reader, loop)
    assert got["records"] == RECORDS
    assert got["seconds"] > 0 and got["cpu"] > 0
    assert got["loop"] == loop


def test_reader_stops_at_the_count_it_is_given(bootstrap: str, topic: str) -> None:
    # max_records=10_000 hands out whole batches, so a smaller count still reads at least that many
    got = read(bootstrap, topic, "arrow", "asyncio", count=10)
    assert 10 <= got["records"] <= RECORDS


@pytest.mark.parametrize("reader", ["arrow", "batches"])
def test_reader_takes_the_batch_size_and_fetch_size_it_is_given(bootstrap: str, topic: str, reader: str) -> None:
    # batches of at most 7 records: the reader passes 10 within its second or third batch
    got = read(bootstrap, topic, reader, "asyncio", count=10,
               extra=("--max-records", "7", "--max-partition-fetch-bytes", "4096"))
    assert 10 <= got["records"] <= 16


def test_unknown_loop_is_refused(bootstrap: str, topic: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.arrow_read", "--read", "arrow", bootstrap, topic, "1", "1", "--loop", "x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "invalid choice: 'x'" in done.stderr



def test_paired_ratios_are_taken_round_by_round() -> None:
    from benchmarks.arrow_read import _paired

    # Round by round: 30/10, 40/20, 90/30; the medians alone (40 / 20) would say 2.00x.
    assert _paired([30.0, 40.0, 90.0], [10.0, 20.0, 30.0]) == "3.00x (2.00-3.00)"
    assert _paired([1.0], []) == "-"
