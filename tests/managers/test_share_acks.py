"""The share consumer's acknowledgement ledger: runs of offsets, checked against a map of offset to
type (the last word wins) over random sequences, and the runs it sends."""

from __future__ import annotations

import random

import pytest

from asyncconsumer.managers.share_acks import GAP, AckLedger
from asyncconsumer.structs import AcknowledgeType

ACCEPT, RELEASE, REJECT, RENEW = (int(k) for k in (
    AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT, AcknowledgeType.RENEW))


def runs_of(model: dict[int, int]) -> list[tuple[int, int, int]]:
    """The model's maximal runs of consecutive offsets with one type (what the ledger must send)."""
    out: list[tuple[int, int, int]] = []
    for offset in sorted(model):
        kind = model[offset]
        if out and out[-1][1] + 1 == offset and out[-1][2] == kind:
            out[-1] = (out[-1][0], offset, kind)
        else:
            out.append((offset, offset, kind))
    return out


def check(ledger: AckLedger, model: dict[int, int]) -> None:
    assert ledger.runs() == runs_of(model)
    assert len(ledger) == len(model) and bool(ledger) == bool(model)
    assert ledger.acknowledged() == tuple(sorted(o for o, k in model.items() if k != GAP))
    assert ledger.acknowledged_count() == sum(1 for k in model.values() if k != GAP)
    for kind in (GAP, ACCEPT, RELEASE, REJECT, RENEW):
        assert ledger.has(kind) == (kind in model.values())


def test_a_polls_records_are_one_run_and_one_batch() -> None:
    ledger = AckLedger()
    ledger.add_all(list(range(100, 600)), ACCEPT)
    ledger.add_all(list(range(600, 1100)), ACCEPT)  # the next poll's: the same run, extended
    assert ledger.runs() == [(100, 1099, ACCEPT)] and len(ledger) == 1000
    assert ledger.batches() == [{"first_offset": 100, "last_offset": 1099, "acknowledge_types": [ACCEPT]}]


def test_holes_and_types_split_the_runs() -> None:
    ledger = AckLedger()
    for offset, kind in [(5, ACCEPT), (6, ACCEPT), (7, RELEASE), (9, ACCEPT), (8, RELEASE)]:
        ledger.add(offset, kind)
    assert ledger.batches() == [
        {"first_offset": 5, "last_offset": 6, "acknowledge_types": [ACCEPT]},
        {"first_offset": 7, "last_offset": 8, "acknowledge_types": [RELEASE]},
        {"first_offset": 9, "last_offset": 9, "acknowledge_types": [ACCEPT]},
    ]
    ledger = AckLedger()
    ledger.add_all([1, 2, 4], ACCEPT)
    assert ledger.runs() == [(1, 2, ACCEPT), (4, 4, ACCEPT)]
    assert AckLedger().batches() == []


def test_a_gap_behind_records_already_acknowledged_cuts_nothing_but_its_offset() -> None:
    ledger = AckLedger()
    ledger.add_all([10, 12], ACCEPT)
    ledger.add(11, GAP)  # out of order: between the two
    assert ledger.runs() == [(10, 10, ACCEPT), (11, 11, GAP), (12, 12, ACCEPT)]
    assert ledger.acknowledged() == (10, 12) and ledger.acknowledged_count() == 2 and len(ledger) == 3


def test_an_offset_acknowledged_again_takes_its_last_type() -> None:
    ledger = AckLedger()
    ledger.add_range(0, 9, ACCEPT)
    ledger.add_range(3, 5, REJECT)  # cuts the run in three
    assert ledger.runs() == [(0, 2, ACCEPT), (3, 5, REJECT), (6, 9, ACCEPT)] and len(ledger) == 10
    ledger.add_range(0, 9, RELEASE)  # covers every run
    assert ledger.runs() == [(0, 9, RELEASE)] and len(ledger) == 10


def test_runs_stay_whole_whatever_the_order() -> None:
    """Offsets acknowledged backwards, or every other one first, end as one run: the ledger never
    holds more runs than the wire will carry batches."""
    backwards, halves = AckLedger(), AckLedger()
    for offset in range(999, -1, -1):
        backwards.add(offset, ACCEPT)
    halves.add_all(list(range(0, 1000, 2)), ACCEPT)
    assert len(halves.runs()) == 500
    halves.add_all(list(range(1, 1000, 2)), ACCEPT)
    assert backwards.runs() == halves.runs() == [(0, 999, ACCEPT)]


@pytest.mark.parametrize("seed", range(40))
def test_the_ledger_agrees_with_a_map_of_offset_to_type(seed: int) -> None:
    rng = random.Random(seed)
    ledger, model = AckLedger(), {}
    kinds = [GAP, ACCEPT, RELEASE, REJECT, RENEW]
    span = rng.choice([8, 40, 400])
    for _ in range(rng.randrange(1, 60)):
        kind = rng.choice(kinds)
        step = rng.randrange(4)
        if step == 0:
            offset = rng.randrange(span)
            ledger.add(offset, kind)
            model[offset] = kind
        elif step == 1:
            first = rng.randrange(span)
            last = first + rng.randrange(span // 4 + 1)
            ledger.add_range(first, last, kind)
            model.update(dict.fromkeys(range(first, last + 1), kind))
        elif step == 2:  # a poll's records: ascending, consecutive or with holes
            first = rng.randrange(span)
            offsets = [o for o in range(first, first + rng.randrange(1, 30)) if rng.random() > 0.1] or [first]
            ledger.add_all(offsets, kind)
            model.update(dict.fromkeys(offsets, kind))
        else:  # in any order, repeats allowed
            offsets = [rng.randrange(span) for _ in range(rng.randrange(1, 10))]
            ledger.add_all(offsets, kind)
            model.update(dict.fromkeys(offsets, kind))
        check(ledger, model)
