"""``Consumer.arrow_batches()``: a partition's fetched records as ``pyarrow.RecordBatch``, no rows.

The columnar twin of ``batches()``: a poll (rebalance callbacks, background errors, the wait for
data) as ``Collector.take`` runs it, then one partition's completed fetch is read with
``CompletedFetch.take_columns`` (protocol/columnar.py: decoded batch by batch straight into
Arrow-ready buffers) and wrapped by ``to_arrow``.  Positions move as with ``getmany()``: past
the records handed out, and past the transaction markers, aborted batches and compaction gaps a
fetch ends with; everything handed out is consumed (``commit()`` covers it).  Deserializers are
not applied: the columns hold the raw bytes.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from ..errors import PyArrowMissingError, RecordError, clear_frame_locals
from ..protocol.columnar import to_arrow
from .collector import refetch_bad_batch

if TYPE_CHECKING:
    from ..engine.loop import Engine
    from ..managers.subscription import PartitionState
    from ..protocol.columnar import Columns
    from ..structs import TopicPartition
    from .collector import Collector

__all__ = ["ARROW_BATCH_RECORDS", "PyArrowMissingError", "require_pyarrow", "take_arrow_batch"]

#: The most records in one ``arrow_batches()`` / ``arrow_batch()`` batch when ``max_records`` is
#: not given: a columnar batch's size (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``), not
#: ``max_poll_records`` (500, a row API's): Arrow's cost is per batch, so 500-record batches took
#: 2.4x the CPU time a record of 10,000-record ones (docs/arrow.md).  A batch is also bounded by
#: the fetched data it is decoded from (``max_partition_fetch_bytes``).
ARROW_BATCH_RECORDS = 10_000


def require_pyarrow() -> Any:
    """The ``pyarrow`` module, or :class:`PyArrowMissingError` naming the extra to install."""
    try:
        return importlib.import_module("pyarrow")
    except ImportError as exc:
        raise PyArrowMissingError(
            f"Consumer.arrow_batches() needs pyarrow, which is not installed ({exc}); "
            "install it with: pip install 'asyncconsumer[arrow]'"
        ) from exc


async def take_arrow_batch(
    collector: Collector[Any, Any],
    engine: Engine,
    limit: int,
    timeout: float | None,
    *,
    only: set[TopicPartition] | None = None,
    include_headers: bool = True,
) -> Any:
    """One poll: up to ``limit`` records of one partition as a ``pyarrow.RecordBatch``; None when
    ``timeout`` seconds (None: no limit) pass with nothing to hand out."""
    return await collector.poll_for(engine, timeout, lambda: _collect(collector, engine, only, limit, include_headers))


def _collect(
    collector: Collector[Any, Any], engine: Engine, only: set[TopicPartition] | None, limit: int, include_headers: bool
) -> Any:
    """The collector's fetch walk read as columns: the first partition with records, as one batch."""
    taken: tuple[TopicPartition, PartitionState, Columns] | None = None
    for fetch, state in collector.fetch_walk(engine, only):
        if taken is not None:
            break  # after the walk's bookkeeping for the fetch read: one partition per batch
        pool = collector.column_buffers
        try:
            columns = fetch.take_columns(
                limit, state.position, include_headers=include_headers, allocate=pool.take, min_allocate=pool.min_bytes
            )
        except RecordError as exc:
            refetch_bad_batch(engine, fetch, state, exc)
            engine.wake()
            raise
        last = columns.last_offset
        if last is not None:
            state.taken(last + 1)
            taken = fetch.tp, state, columns
    if taken is None:
        return None
    tp, state, columns = taken
    try:
        batch = to_arrow(columns, tp.topic, tp.partition)
    except RecordError as exc:
        first = columns_first_offset(columns)
        del taken, columns  # the application may keep the error, and this frame with it: not the block
        clear_frame_locals(exc)
        state.rewind(first)
        engine.buffer.drop(functools.partial(_other_partition, tp))
        engine.wake()
        raise
    state.handed_out(state.position)  # everything taken is handed out (getmany()'s semantics)
    collector.handed(tp, batch.num_rows)
    return batch


def _other_partition(tp: TopicPartition, fetch: Any) -> bool:
    return bool(fetch.tp != tp)


def columns_first_offset(columns: Any) -> int:
    """The offset of the first record of ``columns`` (a ``protocol.columnar.Columns``)."""
    view = memoryview(columns.buffers.offsets).cast("B").cast("q")
    return int(view[columns.first])
