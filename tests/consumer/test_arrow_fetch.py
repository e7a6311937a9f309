"""``CompletedFetch.take_columns``: the row walk's records and errors, as columns; and the two walks
taking turns on one completed fetch (scripted record sets, no broker)."""

from __future__ import annotations

from typing import Any

import pytest
from protocol.test_columnar import PART, TOPIC, WALKS, Error, assert_chunks_match, walk, walk_rows

from asyncconsumer.managers.fetch_buffer import CompletedFetch
from asyncconsumer.structs import TopicPartition

ABORTED = {"transactions": [(7, 0), (7, 6)]}  # (producer id, first offset) of both aborted transactions


def fetch_of(data: bytes, start: int, aborted: list[tuple[int, int]] | None) -> CompletedFetch:
    return CompletedFetch(TopicPartition(TOPIC, PART), 0, start, memoryview(data), -1, check_crcs=True,
                          aborted=aborted)


@pytest.mark.parametrize("name", sorted(WALKS))
@pytest.mark.parametrize("max_records", [1, 3, 1000])
@pytest.mark.parametrize("read_committed", [False, True])
def test_take_columns_is_the_row_walk(name: str, max_records: int, read_committed: bool) -> None:
    aborted = ABORTED.get(name, []) if read_committed else None
    rows, rows_error = walk_rows(WALKS[name], max_records, 0, aborted=aborted)
    fetch = fetch_of(WALKS[name], 0, aborted)
    chunks, error = walk(fetch.take_columns, lambda c: c.count, lambda c: c.last_offset, max_records, 0)
    assert error == rows_error
    assert fetch.exhausted
    assert_chunks_match(chunks, [r for chunk in rows for r in chunk], max_records)


def test_read_committed_drops_the_aborted_transaction() -> None:
    fetch = fetch_of(WALKS["transactions"], 0, ABORTED["transactions"])
    chunks, error = walk(fetch.take_columns, lambda c: c.count, lambda c: c.last_offset, 1000, 0)
    assert error is None
    offsets = [o for c in chunks for o in memoryview(c.buffers.offsets).cast("q")[c.first : c.first + c.count]]
    assert offsets == [2, 4]  # producer 7's records (0, 1, 6, 7) were aborted


@pytest.mark.parametrize("name", ["transactions", *sorted(n for n in WALKS if n.startswith("codec"))])
def test_the_walks_take_turns(name: str) -> None:
    """take and take_columns alternating on one fetch hand out each record once, in order."""
    rows, _ = walk_rows(WALKS[name], 1 << 30, 0)
    expected = [r.offset for chunk in rows for r in chunk]
    fetch = fetch_of(WALKS[name], 0, None)
    position, got, turn = 0, [], 0
    error: Error | None = None
    for _ in range(10_000):
        taken: Any
        if turn % 2:
            taken = fetch.take_columns(2, position)
            offsets = list(memoryview(taken.buffers.offsets).cast("q")[taken.first : taken.first + taken.count])
        else:
            taken = fetch.take(3, position)
            offsets = [r.offset for r in taken]
        turn += 1
        if not offsets and fetch.exhausted:
            break
        got += offsets
        if offsets:
            position = offsets[-1] + 1
    assert error is None
    assert got == expected
