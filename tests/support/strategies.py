"""Hypothesis strategies for records and batches, shared by the decoder property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from asyncconsumer.protocol.record_writer import Record

nullable_bytes = st.none() | st.binary(max_size=300)
header = st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=40))
record = st.builds(
    Record,
    key=nullable_bytes,
    value=st.none() | st.binary(max_size=1500),
    headers=st.lists(header, max_size=4).map(tuple),
    timestamp_delta=st.integers(-(2**40), 2**40),
)


@st.composite
def records_with_deltas(draw: st.DrawFn) -> tuple[list[Record], list[int]]:
    """Up to 12 records and their offset deltas: increasing, first 0, with gaps (as compaction leaves)."""
    recs = draw(st.lists(record, max_size=12))
    gaps = draw(st.lists(st.integers(1, 300), min_size=len(recs), max_size=len(recs)))
    return recs, [sum(gaps[: i + 1]) - gaps[0] for i in range(len(recs))]
