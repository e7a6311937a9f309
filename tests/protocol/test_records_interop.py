"""Read batches written by librdkafka (confluent-kafka), without a real broker.

librdkafka's built-in mock cluster (``test.mock.num.brokers``) stores produced
batches as the producer wrote them; a hand-rolled Fetch v4 request over a
plain socket gets the raw bytes back for the reader under test.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from asyncconsumer.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    AbortedTransactionFilter,
    RecordBatch,
    control_record_type,
    decode_batch,
    iter_batches,
    next_offset_after,
)

ck = pytest.importorskip("confluent_kafka")

TOPIC = "interop"
QUIET = {"log_level": 0}  # the mock cluster logs a notice on start


def _recv(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("mock broker closed the connection")
        out += chunk
    return bytes(out)


def fetch_v4(addr: tuple[str, int], offset: int, isolation: int = 0) -> tuple[int, bytes, int, int]:
    """One Fetch v4 for partition 0; returns (high watermark, response, records start, end)."""
    topic = TOPIC.encode()
    body = struct.pack(">iiiib", -1, 100, 1, 8 << 20, isolation)
    body += struct.pack(">ih", 1, len(topic)) + topic + struct.pack(">iiqi", 1, 0, offset, 8 << 20)
    request = struct.pack(">hhih", 1, 4, 1, 4) + b"test" + body
    with socket.create_connection(addr, timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv(sock, 4))
        resp = _recv(sock, size)
    # correlation id, throttle, [topics] count, topic name
    pos = 8
    assert struct.unpack_from(">i", resp, pos)[0] == 1
    pos += 4
    pos += 2 + struct.unpack_from(">h", resp, pos)[0]
    pos += 4  # partitions count (1)
    _, error, high_watermark, _lso = struct.unpack_from(">ihqq", resp, pos)
    assert error == 0
    pos += 22
    (n_aborted,) = struct.unpack_from(">i", resp, pos)
    pos += 4 + 16 * max(n_aborted, 0)
    (n_records,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    return high_watermark, resp, pos, pos + max(n_records, 0)


def read_log(addr: tuple[str, int], *, check_crcs: bool = True) -> Iterator[RecordBatch]:
    """Every batch of the partition, fetching from each batch's next offset."""
    position, high_watermark = 0, 1
    for _ in range(1000):
        if position >= high_watermark:
            return
        high_watermark, resp, start, end = fetch_v4(addr, position)
        for batch in iter_batches(
            resp, topic=TOPIC, partition=0, check_crcs=check_crcs, start=start, end=end
        ):
            # The mock writes transaction markers with a zero CRC; check the rest.
            if not check_crcs and not batch.is_control:
                list(iter_batches(batch.data, topic=TOPIC, partition=0))
            yield batch
            position = next_offset_after(batch)
    raise AssertionError("fetch loop did not reach the high watermark")


@pytest.fixture
def mock_cluster() -> Iterator[tuple[Any, tuple[str, int]]]:
    admin_producer = ck.Producer({"test.mock.num.brokers": 1, **QUIET})
    broker = next(iter(admin_producer.list_topics(timeout=10).brokers.values()))
    yield admin_producer, (broker.host, broker.port)
    admin_producer.flush(10)


# librdkafka sends a batch uncompressed when compressing does not shrink it, and where it splits
# the records into batches depends on timing.  The "pad" header makes every record, so every
# batch, shrink under each codec, so that each batch is written with the codec asked for.
MESSAGES = [
    (
        b"k%d" % i if i % 3 else None,
        b"value-%d-" % i * (i % 7) if i % 5 else None,
        [("h", b"%d" % i), ("n", None), ("pad", b"p" * 200)],
    )
    for i in range(40)
]


def produce_messages(addr: tuple[str, int], codec: str) -> None:
    """MESSAGES at timestamps 1_000_000 + i, in at least two batches."""
    producer = ck.Producer(
        {"bootstrap.servers": f"{addr[0]}:{addr[1]}", "compression.codec": codec, "linger.ms": 20, **QUIET}
    )
    for i, (key, value, headers) in enumerate(MESSAGES):
        producer.produce(TOPIC, key=key, value=value, headers=headers, partition=0, timestamp=1_000_000 + i)
        if i == 19:
            producer.flush(10)  # at least two batches
    producer.flush(10)


def produce_transactions(addr: tuple[str, int]) -> None:
    """Three transactions of five records: committed, aborted, committed (values b"<outcome>-<n>")."""
    producer = ck.Producer(
        {"bootstrap.servers": f"{addr[0]}:{addr[1]}", "transactional.id": "tx-1", "linger.ms": 5, **QUIET}
    )
    producer.init_transactions(10)
    for txn, outcome in enumerate(["commit", "abort", "commit"]):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(TOPIC, value=b"%s-%d" % (outcome.encode(), txn * 10 + i), partition=0)
        producer.flush(10)  # so aborted data reaches the log before the marker
        if outcome == "abort":
            producer.abort_transaction(10)
        else:
            producer.commit_transaction(10)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_codecs(mock_cluster: tuple[Any, tuple[str, int]], codec: str) -> None:
    _, addr = mock_cluster
    produce_messages(addr, codec)
    batches = list(read_log(addr))
    assert len(batches) >= 2
    codec_id = ["none", "gzip", "snappy", "lz4", "zstd"].index(codec)
    assert {b.compression for b in batches} == {codec_id}
    out = [r for b in batches for r in decode_batch(b, TOPIC, 0)]
    assert [r.offset for r in out] == list(range(len(MESSAGES)))
    assert [(r.key, r.value, list(r.headers)) for r in out] == MESSAGES
    assert [r.timestamp for r in out] == [1_000_000 + i for i in range(len(MESSAGES))]


def test_librdkafka_transactions(mock_cluster: tuple[Any, tuple[str, int]]) -> None:
    _, addr = mock_cluster
    produce_transactions(addr)
    batches = list(read_log(addr, check_crcs=False))
    markers = [(b.base_offset, control_record_type(b)) for b in batches if b.is_control]
    assert [kind for _, kind in markers] == [CONTROL_COMMIT, CONTROL_ABORT, CONTROL_COMMIT]
    assert all(decode_batch(b, TOPIC, 0) == [] for b in batches if b.is_control)
    # The mock broker sends no AbortedTransactions list; build the one a real broker would.
    pid = batches[0].producer_id
    aborted_first = markers[0][0] + 1
    flt = AbortedTransactionFilter([(pid, aborted_first)])
    kept = [r.value for b in batches if not flt.should_skip(b) for r in decode_batch(b, TOPIC, 0)]
    assert kept == [b"commit-%d" % i for i in (0, 1, 2, 3, 4, 20, 21, 22, 23, 24)]
    assert next_offset_after(batches[-1]) == 18  # 15 records + 3 markers


def test_librdkafka_message_format_v0(mock_cluster: tuple[Any, tuple[str, int]]) -> None:
    _, addr = mock_cluster
    producer = ck.Producer(
        {
            "bootstrap.servers": f"{addr[0]}:{addr[1]}",
            "api.version.request": False,
            "broker.version.fallback": "0.9.0",
            **QUIET,
        }
    )
    for i in range(5):
        producer.produce(TOPIC, key=b"k%d" % i, value=b"v%d" % i, partition=0)
    producer.flush(10)
    del producer
    batches = list(read_log(addr))
    assert {b.magic for b in batches} == {0}
    out = [r for b in batches for r in decode_batch(b, TOPIC, 0)]
    assert [(r.offset, r.key, r.value, r.timestamp) for r in out] == [
        (i, b"k%d" % i, b"v%d" % i, -1) for i in range(5)
    ]
