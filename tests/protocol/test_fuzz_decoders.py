"""Fault suite, decoder part: mutated batches through both record decoders (and the row reads'
compiled walk, ``CompletedFetch.take`` with ``decode_next``, and the share consumer's
``decode_record_set``) and the decompressors.

The mutations and the checks are in tests/support/fuzz.py.  Each run happens in a child process
under ``RLIMIT_AS = 1 GiB`` (tests/support/childproc.py), so a decoder that aborts the process
(SIGABRT from an allocator, a segfault in the C extension) or allocates without bound fails the
test instead of the test runner; the child records the case it is on, and the failure names it
(``fuzz.case(seed, index)`` rebuilds it).

The same cases also go through both column builders (the compiled ``ColumnBuilder`` and the
reference ``PyColumnBuilder``, behind ``ColumnReader``): byte-identical buffers or the same error.

Fixed seed, bounded time: by default ``CASES`` decoder cases, ``DECOMPRESSOR_CASES``
decompressor cases and ``COLUMN_CASES`` column cases, each run stopping early at its time
budget (so the whole module stays under a minute on a slow CI machine).
``ASYNCCONSUMER_FUZZ_SEED``, ``ASYNCCONSUMER_FUZZ_CASES`` and ``ASYNCCONSUMER_FUZZ_SECONDS``
run other seeds or longer, locally.  The figures of a run
are in docs/fault-suite.md.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from support import fuzz
from support.childproc import run_limited

from asyncconsumer.errors import RecordError
from asyncconsumer.protocol import records

SEED = int(os.environ.get("ASYNCCONSUMER_FUZZ_SEED", "14"))
CASES = int(os.environ.get("ASYNCCONSUMER_FUZZ_CASES", "60000"))
DECOMPRESSOR_CASES = CASES // 2
COLUMN_CASES = CASES // 3
#: The decoder run's time budget; the decompressor run gets a third of it, the column run 45 %.
SECONDS = float(os.environ.get("ASYNCCONSUMER_FUZZ_SECONDS", "18"))
#: The least number of cases a run must get through in its time budget (a run that does
#: nearly nothing proves nothing).
MIN_CASES = min(2000, CASES // 2)

_SETUP = """
import os, time
from support import fuzz
kind, seed, stop, seconds, progress_path, inject = {args!r}
fuzz.corpus()  # built before the memory limit, like the imports
progress_fd = os.open(progress_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
def progress(index):
    os.pwrite(progress_fd, b"%12d\\n" % index, 0)
decs = None
if inject == "abort-at-5":
    def aborting(batch, topic, partition, _n=[0]):
        _n[0] += 1
        if _n[0] > 5:
            os.abort()
        return fuzz.decode_batch_py(batch, topic, partition)
    decs = [("python", fuzz.decode_batch_py), ("aborting", aborting)]
"""
_BODY = """
deadline = time.monotonic() + seconds
if kind == "decoders":
    emit(fuzz.run(seed, 0, stop, deadline, progress, decs))
elif kind == "columns":
    emit(fuzz.run_columns(seed, 0, stop, deadline, progress))
else:
    emit(fuzz.run_decompressors(seed, 0, stop, deadline, progress))
"""


def _fuzz_in_child(kind: str, stop: int, seconds: float, inject: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        child = run_limited(
            _SETUP.format(args=(kind, SEED, stop, seconds, str(progress), inject)),
            _BODY,
            timeout=seconds + 60,
        )
        last = progress.read_text().strip() if progress.exists() else ""
    if child.returncode != 0 or child.result is None:
        where = "before the first case"
        if last:
            index = int(last)
            if kind in ("decoders", "columns"):
                item, mutation, data = fuzz.case(SEED, index)
                where = f"on case {index} of seed {SEED}: {item} mutated by {mutation}, {len(data)} bytes"
            else:
                codec, mutation, data, _ = fuzz.decompressor_case(SEED, index)
                where = f"on decompressor case {index} of seed {SEED}: codec {codec}, {mutation}"
        return {"crashed": f"{child.describe()}\n{where}", "last": last}
    result: dict[str, Any] = child.result
    return result


def _check(result: dict[str, Any]) -> None:
    assert "crashed" not in result, result["crashed"]
    assert not result["failures"], "\n".join(map(repr, result["failures"]))
    assert result["outcomes"].get("untyped", 0) == 0
    assert result["outcomes"].get("disagree", 0) == 0
    assert result["cases"] >= MIN_CASES, f"only {result['cases']} cases ran in {result['seconds']} s"


def test_both_decoders_agree_on_mutated_batches() -> None:
    result = _fuzz_in_child("decoders", CASES, SECONDS)
    print(f"\nfuzz decoders seed={SEED}: {result}")
    _check(result)
    if records.DECODER == "c":
        assert result["decoders"] == ["python", "c", "c-walk", "share-read"]
    # the mutations reach every outcome: decoded records and every typed error
    for outcome in ("decoded", "CorruptRecordError", "UnsupportedMagicError", "UnsupportedCodecError"):
        assert result["outcomes"].get(outcome, 0) > 0, outcome


def test_decompressors_stay_bounded_and_typed_on_mutated_payloads() -> None:
    result = _fuzz_in_child("decompressors", DECOMPRESSOR_CASES, SECONDS / 3)
    print(f"\nfuzz decompressors seed={SEED}: {result}")
    _check(result)
    assert result["outcomes"].get("past-limit", 0) == 0
    assert result["outcomes"].get("decompressed", 0) > 0
    assert result["outcomes"].get("CorruptRecordError", 0) > 0


def test_both_column_builders_agree_on_mutated_batches() -> None:
    from asyncconsumer.protocol import columnar

    result = _fuzz_in_child("columns", COLUMN_CASES, SECONDS * 0.45)
    print(f"\nfuzz column builders seed={SEED}: {result}")
    _check(result)
    if columnar.COLUMN_DECODER == "c":
        assert result["builders"] == ["python", "c"]
    for outcome in ("decoded", "CorruptRecordError", "UnsupportedMagicError", "UnsupportedCodecError"):
        assert result["outcomes"].get(outcome, 0) > 0, outcome


# ------------------------------------------------------------------ the harness itself


def test_every_mutation_gets_past_the_crc_check() -> None:
    items = fuzz.corpus()
    crc_errors = 0
    for index in range(2000):
        _, _, data = fuzz.case(SEED, index, items)
        try:
            for _ in records.iter_batches(data, topic="t", partition=0):
                pass
        except RecordError as exc:
            crc_errors += "CRC" in str(exc)
    assert crc_errors == 0


def test_cases_are_reproducible() -> None:
    assert fuzz.case(SEED, 123) == fuzz.case(SEED, 123)
    assert fuzz.case(SEED, 123) != fuzz.case(SEED, 124)
    assert fuzz.decompressor_case(SEED, 7) == fuzz.decompressor_case(SEED, 7)


def test_the_harness_reports_an_untyped_error_and_a_disagreement() -> None:
    import time

    def untyped(batch: Any, topic: str, partition: int) -> Any:
        out = fuzz.decode_batch_py(batch, topic, partition)
        if len(out) == 3:
            raise ValueError("three")
        return out

    def drops_one(batch: Any, topic: str, partition: int) -> Any:
        return fuzz.decode_batch_py(batch, topic, partition)[:-1]

    result = fuzz.run(SEED, 0, 300, time.monotonic() + 30, decs=[("python", fuzz.decode_batch_py), ("u", untyped)])
    assert result["outcomes"]["untyped"] > 0
    assert "ValueError: three" in repr(result["failures"][0])
    result = fuzz.run(SEED, 0, 300, time.monotonic() + 30, decs=[("python", fuzz.decode_batch_py), ("d", drops_one)])
    assert result["outcomes"]["disagree"] > 0


def test_the_harness_names_the_case_that_killed_the_child() -> None:
    result = _fuzz_in_child("decoders", 1000, 20, inject="abort-at-5")
    assert "crashed" in result
    assert "SIGABRT" in result["crashed"] and f"of seed {SEED}" in result["crashed"]


@pytest.mark.parametrize("index", [0, 1])
def test_a_case_decodes_the_same_in_process(index: int) -> None:
    # the in-process path the child uses, on two cases (bytes and memoryview buffers)
    import time

    result = fuzz.run(SEED, index, index + 1, time.monotonic() + 10)
    assert result["cases"] == 1 and not result["failures"]
