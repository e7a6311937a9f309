"""Columnar decoding of batches written by librdkafka (confluent-kafka), without a real broker.

The record sets come from librdkafka's mock cluster through the hand-rolled Fetch of
test_records_interop.py; every column builder in use must give the records librdkafka was handed,
and the same as the row path.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncconsumer.protocol.records import iter_batches
from protocol.test_columnar import BUILDERS, assert_match, walk_columns, walk_rows
from protocol.test_records_interop import (
    MESSAGES,
    TOPIC,
    mock_cluster,
    produce_messages,
    produce_transactions,
    read_log,
)

__all__ = ["mock_cluster"]  # the fixture, imported for pytest

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _record_set(addr: tuple[str, int]) -> bytes:
    """The partition's whole log as one record set (the mock writes markers with a zero CRC)."""
    return b"".join(bytes(batch.data) for batch in read_log(addr, check_crcs=False))


@pytest.mark.parametrize("max_records", [7, 1000])
@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_batches_as_columns(mock_cluster: tuple[Any, tuple[str, int]], codec: str,
                                       max_records: int) -> None:
    _, addr = mock_cluster
    produce_messages(addr, codec)
    data = _record_set(addr)
    rows, rows_error = walk_rows(data, 1 << 30, 3)
    [flat] = rows
    assert rows_error is None
    assert [(r.key, r.value, list(r.headers)) for r in flat] == MESSAGES[3:]
    for builder in BUILDERS:
        chunks, error = walk_columns(builder, data, max_records, 3)
        assert error is None
        at = 0
        for columns in chunks:
            assert_match(columns, flat[at : at + columns.count])
            at += columns.count
        assert at == len(flat)


def test_librdkafka_transactions_as_columns(mock_cluster: tuple[Any, tuple[str, int]]) -> None:
    _, addr = mock_cluster
    produce_transactions(addr)
    data = _record_set(addr)
    # Offsets: 0-4 committed, 5 marker, 6-10 aborted, 11 marker, 12-16 committed, 17 marker.  The mock
    # sends no AbortedTransactions list and writes markers with a zero CRC: build the list a real
    # broker would send, and leave CRC checks off.
    pid = next(iter_batches(data, topic=TOPIC, partition=0, check_crcs=False)).producer_id
    for aborted in (None, [(pid, 6)]):
        [flat], _ = walk_rows(data, 1 << 30, 0, check_crcs=False, aborted=aborted)
        kept = [b"commit-%d" % i for i in (0, 1, 2, 3, 4, 20, 21, 22, 23, 24)]
        assert [r.value for r in flat] == (kept if aborted else kept[:5] + [b"abort-%d" % i for i in range(10, 15)]
                                           + kept[5:])
        for builder in BUILDERS:
            [columns], error = walk_columns(builder, data, 1 << 30, 0, check_crcs=False, aborted=aborted)
            assert error is None
            assert_match(columns, flat)
