"""Decompression is bounded: a batch never makes the process allocate more than it may hold.

Issue 14, item 2: a small batch with a valid CRC whose snappy header declares 4 GiB made the
consumer ask for 4 GiB, and under a memory limit the allocator inside the snappy library
aborted the process (SIGABRT).  Every case here runs in a child process under
``RLIMIT_AS = 1 GiB`` (tests/support/childproc.py), decodes the batch with both record
decoders (the compiled one when built, and the pure-Python one), and must end in a
``CorruptRecordError`` naming the partition and the batch's base offset, and saying the
batch is larger than it may hold.

* declared sizes (snappy's varint, a xerial chunk, LZ4 and zstd frame content sizes) past the
  bound are refused before anything is allocated;
* frames that declare a small size and hold 600 MiB stop at the declared size;
* bombs that declare nothing (concatenated gzip members, LZ4 and zstd frames without content
  size, many xerial chunks) stop at the bound, with the peak memory of the child bounded too;
* payloads up to the bound still decode, and the bound follows the fetch limits
  (``ConsumerConfig.batch_decompress_limit``, ``max_batch_decompressed_bytes``).
"""

from __future__ import annotations

import pytest
from support.bombs import bomb, declaring
from support.childproc import run_limited

from asyncconsumer import ConsumerConfig
from asyncconsumer.config import build_config
from asyncconsumer.engine.loop import Engine
from asyncconsumer.engine.share_loop import ShareEngine
from asyncconsumer.errors import ConfigError, CorruptRecordError
from asyncconsumer.protocol.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    DEFAULT_MAX_SIZE,
    decompress,
)
from asyncconsumer.protocol.record_writer import build_batch, build_legacy_message_set
from asyncconsumer.protocol.records import decode_batch_py, iter_batches

CODEC_IDS = {"gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY, "xerial": CODEC_SNAPPY, "lz4": CODEC_LZ4, "zstd": CODEC_ZSTD}
BASE_OFFSET = 1000
PARTITION = 3
MiB = 1 << 20

# The child: builds the batch (before the memory limit), then decodes it with every decoder.
_SETUP = """
import os
from support.bombs import bomb, declaring, lying
from asyncconsumer.protocol import records
from asyncconsumer.protocol.record_writer import build_batch
codec, kind, size, codec_id, limit = {args!r}
PARTITION = {partition}
if kind == "declaring":
    payload = declaring(codec, size)
elif kind == "lying":
    payload = lying(codec, 16, size)
else:
    payload = bomb(codec, size)
batch = build_batch([(b"k", b"v")], base_offset={base}, compression=codec_id, raw_records=payload)
decoders = [("python", records.decode_batch_py)]
if records.DECODER == "c":
    decoders.append(("c", records.decode_batch))
"""
_BODY = """
out = {}
for name, decode in decoders:
    kw = {} if limit is None else {"max_decompressed": limit}
    try:
        (b,) = records.iter_batches(batch, topic="t", partition=PARTITION, **kw)
        recs = decode(b, "t", PARTITION)
        out[name] = {"records": len(recs)}
    except BaseException as exc:
        out[name] = {"error": type(exc).__name__, "message": str(exc),
                     "offset": getattr(exc, "offset", None), "partition": getattr(exc, "partition", None)}
# the peak RSS of this process image (ru_maxrss would include the parent's peak from before exec)
with open("/proc/self/status") as status:
    out["maxrss_kib"] = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
emit(out)
"""


def _decode_in_child(codec: str, kind: str, size: int, limit: int | None) -> dict[str, dict[str, object]]:
    setup = _SETUP.format(args=(codec, kind, size, CODEC_IDS[codec], limit), base=BASE_OFFSET, partition=PARTITION)
    child = run_limited(setup, _BODY)
    assert child.returncode == 0 and child.result is not None, child.describe()
    result: dict[str, dict[str, object]] = child.result
    return result


def _assert_refused(result: dict[str, dict[str, object]]) -> None:
    decoders = [k for k in result if k != "maxrss_kib"]
    assert "python" in decoders
    for name in decoders:
        outcome = result[name]
        assert outcome.get("error") == "DecompressionLimitError", (name, outcome)  # a CorruptRecordError
        assert outcome["offset"] == BASE_OFFSET and outcome["partition"] == PARTITION, (name, outcome)
        message = str(outcome["message"])
        assert "may hold" in message and "MemoryError" not in message, (name, message)


@pytest.mark.parametrize("codec", ["snappy", "xerial", "lz4", "zstd"])
@pytest.mark.parametrize("size", [4 * 1024 * MiB - 1, 300 * MiB])
def test_a_declared_size_past_the_bound_is_refused_before_allocating(codec: str, size: int) -> None:
    # 4 GiB - 1 is the largest size snappy's 32-bit header can declare; 300 MiB is past the
    # default bound (200 MiB) yet allocatable under the child's 1 GiB limit, so only a
    # check of the declared size (not the allocator failing) can refuse it.
    result = _decode_in_child(codec, "declaring", size, None)
    _assert_refused(result)
    assert "more than the 209715200 bytes" in str(result["python"]["message"])
    assert int(result["maxrss_kib"]) < 200 * 1024  # nothing near the declared size was touched


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_frame_holding_more_than_it_declares_stops_at_the_declared_size(codec: str) -> None:
    # 16 bytes declared, 600 MiB of zeros inside: lz4's one-shot decoder sized its buffer by the
    # header and then kept growing it to the end of the data
    result = _decode_in_child(codec, "lying", 600 * MiB, None)
    decoders = [k for k in result if k != "maxrss_kib"]
    for name in decoders:
        outcome = result[name]
        assert outcome.get("error") == "CorruptRecordError", (name, outcome)
        assert outcome["offset"] == BASE_OFFSET and outcome["partition"] == PARTITION, (name, outcome)
        if codec == "lz4":  # refused for what it is, not when growing the buffer fails
            assert "declares 16 bytes but holds more" in str(outcome["message"]), outcome
    assert int(result["maxrss_kib"]) < 200 * 1024, result["maxrss_kib"]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_bomb_stops_at_the_default_bound(codec: str) -> None:
    # 1 GiB + 64 MiB of zeros in concatenated members/frames that declare no size: more than
    # the child may allocate at all.
    result = _decode_in_child(codec, "bomb", 1088 * MiB, None)
    _assert_refused(result)
    # the default bound is 200 MiB; the output collected stops there (plus one unit in flight)
    assert int(result["maxrss_kib"]) < 600 * 1024, result["maxrss_kib"]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "xerial"])
def test_a_bomb_stops_at_a_smaller_bound(codec: str) -> None:
    result = _decode_in_child(codec, "bomb", 256 * MiB if codec != "xerial" else 8 * MiB, 4 * MiB)
    _assert_refused(result)
    assert "more than the 4194304 bytes" in str(result["python"]["message"])


@pytest.mark.parametrize("codec", ["gzip", "xerial", "lz4", "zstd"])
def test_the_bound_is_inclusive(codec: str) -> None:
    # exactly max_size bytes decode; one more is refused (the zero bytes are not valid
    # records, so this calls the decompressor directly)
    payload = bomb(codec, 2 * MiB, unit=1 * MiB) if codec != "xerial" else bomb(codec, 2 * MiB)
    assert len(decompress(CODEC_IDS[codec], payload, max_size=2 * MiB)) == 2 * MiB
    with pytest.raises(CorruptRecordError, match="may hold"):
        decompress(CODEC_IDS[codec], payload, max_size=2 * MiB - 1)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "xerial", "lz4", "zstd"])
def test_a_batch_within_the_bound_decodes(codec: str) -> None:
    records_in = [(f"k{i}".encode(), bytes(1000)) for i in range(100)]
    batch = build_batch(
        records_in, base_offset=BASE_OFFSET, compression=CODEC_IDS[codec], snappy_xerial=codec == "xerial"
    )
    (b,) = iter_batches(batch, topic="t", partition=PARTITION, max_decompressed=200_000)
    assert [(r.key, r.value) for r in decode_batch_py(b, "t", PARTITION)] == records_in
    (b,) = iter_batches(batch, topic="t", partition=PARTITION, max_decompressed=90_000)
    with pytest.raises(CorruptRecordError, match="may hold") as info:
        decode_batch_py(b, "t", PARTITION)
    assert info.value.offset == BASE_OFFSET


def test_a_snappy_header_longer_than_the_block_can_encode_is_corrupt() -> None:
    # 22 x 5 bytes is more than any 5-byte snappy block can expand to: refused without trying
    with pytest.raises(CorruptRecordError, match="more than snappy can encode"):
        decompress(CODEC_SNAPPY, declaring("snappy", 1000), max_size=DEFAULT_MAX_SIZE)


def test_legacy_wrapper_messages_are_bounded_too() -> None:
    messages = [(None, bytes(100_000)) for _ in range(3)]
    wrapper = build_legacy_message_set(messages, magic=1, base_offset=BASE_OFFSET, compression=CODEC_GZIP)
    (b,) = iter_batches(wrapper, topic="t", partition=PARTITION)
    assert len(decode_batch_py(b, "t", PARTITION)) == 3
    (b,) = iter_batches(wrapper, topic="t", partition=PARTITION, max_decompressed=250_000)
    with pytest.raises(CorruptRecordError, match="may hold") as info:
        decode_batch_py(b, "t", PARTITION)
    assert info.value.partition == PARTITION and info.value.offset == b.base_offset


def test_the_bound_follows_the_fetch_limits() -> None:
    assert ConsumerConfig().batch_decompress_limit == DEFAULT_MAX_SIZE == 200 * MiB
    assert build_config({"fetch_max_bytes": 100 * MiB}).batch_decompress_limit == 400 * MiB
    assert (
        build_config({"max_partition_fetch_bytes": 80 * MiB, "fetch_buffer_bytes": 80 * MiB}).batch_decompress_limit
        == 320 * MiB
    )
    # small fetch sizes do not shrink it under 64 MiB: a broker hands out a whole batch anyway
    assert build_config({"fetch_max_bytes": 1024}).batch_decompress_limit == 64 * MiB
    assert build_config({"max_batch_decompressed_bytes": 5 * MiB}).batch_decompress_limit == 5 * MiB
    with pytest.raises(ConfigError, match="max_batch_decompressed_bytes"):
        build_config({"max_batch_decompressed_bytes": 0})
    with pytest.raises(ConfigError, match="max_batch_decompressed_bytes"):
        build_config({"max_batch_decompressed_bytes": "1"})


def test_the_consumer_hands_its_bound_to_the_fetcher() -> None:
    engine = Engine(build_config({"max_batch_decompressed_bytes": 5 * MiB}))
    assert engine.fetcher._max_decompressed == 5 * MiB
    assert Engine(ConsumerConfig()).fetcher._max_decompressed == DEFAULT_MAX_SIZE


def test_the_share_consumer_hands_its_bound_to_its_fetcher() -> None:
    config = build_config({"group_id": "workers", "max_batch_decompressed_bytes": 5 * MiB})
    assert ShareEngine(config, max_records=50).fetcher._max_decompressed == 5 * MiB
