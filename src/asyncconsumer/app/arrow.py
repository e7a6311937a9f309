"""``Consumer.arrow_batches()``: a partition's fetched records as ``pyarrow.RecordBatch``, no rows.

The columnar twin of ``batches()``: a poll (rebalance callbacks, background errors, the wait for
data) as ``Collector.take`` runs it, then one partition's completed fetch is read with
``CompletedFetch.take_columns`` (protocol/columnar.py: decoded batch by batch straight into
Arrow-ready buffers) and wrapped by ``to_arrow``.  Positions move as with ``getmany()``: past
the records handed out, and past the transaction markers, aborted batches and compaction gaps a
fetch ends with; everything handed out is consumed (``commit()`` covers it).  Deserializers are
not applied: the columns hold the raw bytes.

A column decoder (``key_format=`` / ``value_format=``, a :class:`ColumnDecoder` such as
``asyncconsumer.schema_registry.AvroColumns``) replaces the raw ``key`` or ``value`` column by a
typed one.  It may await (a registry lookup), so the batch is decoded after the poll, and only then
handed out: when a record does not decode, the records before it are handed out (decoded) and the
position is set back to it, so the next call raises its ``RecordError`` (the position stays at the
record: ``seek`` past it, to ``skip_to``, to go on); any other failure of the decoder (a registry
that is down) sets the position back to the batch's first record and raises.  Nothing is lost.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..errors import PyArrowMissingError, RecordError, clear_frame_locals
from ..protocol.columnar import to_arrow
from .collector import refetch_bad_batch

if TYPE_CHECKING:
    from ..engine.loop import Engine
    from ..managers.subscription import PartitionState
    from ..protocol.columnar import Columns
    from ..structs import TopicPartition
    from .collector import Collector

__all__ = [
    "ARROW_BATCH_RECORDS",
    "ColumnContext",
    "ColumnDecoder",
    "PyArrowMissingError",
    "check_column_decoder",
    "require_pyarrow",
    "take_arrow_batch",
]

#: The most records in one ``arrow_batches()`` / ``arrow_batch()`` batch when ``max_records`` is
#: not given: a columnar batch's size (Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``), not
#: ``max_poll_records`` (500, a row API's): Arrow's cost is per batch, so 500-record batches took
#: 2.4x the CPU time a record of 10,000-record ones (docs/arrow.md).  A batch is also bounded by
#: the fetched data it is decoded from (``max_partition_fetch_bytes``).
ARROW_BATCH_RECORDS = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnContext:
    """Which column a :class:`ColumnDecoder` decodes: the batch's partition, ``"key"`` or
    ``"value"``, and the records' ``offsets`` (the batch's ``offset`` column, a pyarrow
    ``Int64Array``, row for row), to name a record that does not decode."""

    topic: str
    partition: int
    field: Literal["key", "value"]
    offsets: Any


class ColumnDecoder(Protocol):
    """What ``arrow_batches(key_format=..., value_format=...)`` takes: an object that turns a raw
    binary column (nulls for null keys and tombstones) into a typed Arrow array of the same length
    (``asyncconsumer.schema_registry.AvroColumns`` is one).

    For a record that does not decode it raises a ``RecordError`` (such as the registry's
    ``SerializationError``) whose ``offset`` names it; the records before it must decode.  Any
    other exception means the batch as a whole could not be decoded.  The array's type should be
    the same for every batch (Spark checks it)."""

    async def decode_column(self, column: Any, context: ColumnContext) -> Any: ...


def check_column_decoder(value: Any, name: str) -> ColumnDecoder | None:
    """``value`` if it is None or has an async ``decode_column``; else a ``TypeError`` naming ``name``."""
    if value is not None and not callable(getattr(value, "decode_column", None)):
        raise TypeError(
            f"{name}: expected a column decoder (an object with an async decode_column(column, context), "
            f"such as asyncconsumer.schema_registry.AvroColumns), got {type(value).__name__}"
        )
    return value  # type: ignore[no-any-return]


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
    key_format: ColumnDecoder | None = None,
    value_format: ColumnDecoder | None = None,
) -> Any:
    """One poll: up to ``limit`` records of one partition as a ``pyarrow.RecordBatch``; None when
    ``timeout`` seconds (None: no limit) pass with nothing to hand out.  With a ``key_format`` or
    ``value_format``, that column is decoded before the batch is handed out."""
    formats = {name: f for name, f in (("key", key_format), ("value", value_format)) if f is not None}
    if not formats:
        return await collector.poll_for(
            engine, timeout, lambda: _collect(collector, engine, only, limit, include_headers)
        )
    taken = await collector.poll_for(
        engine, timeout, lambda: _collect(collector, engine, only, limit, include_headers, hand_out=False)
    )
    if taken is None:
        return None
    tp, state, batch = taken
    try:
        decoded = await _decode_columns(batch, tp, formats)
    except RecordError as exc:
        first = int(batch.column(_OFFSET)[0].as_py())
        if exc.offset <= first or exc.offset > state.position:
            _give_back(engine, tp, state, first)
            if exc.offset >= first and exc.skip_to < 0:
                exc.skip_to = exc.offset + 1
            raise
        # the records before the bad one are handed out; the next call stops at it
        bad = exc.offset
        _give_back(engine, tp, state, bad)
        head = batch.slice(0, _rows_before(batch, bad))
        try:
            decoded = await _decode_columns(head, tp, formats)
        except BaseException:
            _give_back(engine, tp, state, first)
            raise
    except BaseException:
        _give_back(engine, tp, state, int(batch.column(_OFFSET)[0].as_py()))
        raise
    state.handed_out(state.position)
    collector.handed(tp, decoded.num_rows)
    return decoded


#: The ``offset`` column of ``protocol.columnar.arrow_schema()``.
_OFFSET = 4
_COLUMN = {"key": 0, "value": 1}


async def _decode_columns(batch: Any, tp: TopicPartition, formats: dict[str, ColumnDecoder]) -> Any:
    """``batch`` with its ``key``/``value`` columns decoded by ``formats``."""
    pa = require_pyarrow()
    offsets = batch.column(_OFFSET)
    for name, decoder in formats.items():
        index = _COLUMN[name]
        context = ColumnContext(tp.topic, tp.partition, "key" if name == "key" else "value", offsets)
        column = await decoder.decode_column(batch.column(index), context)
        if len(column) != batch.num_rows:
            raise ValueError(f"{name}_format returned {len(column)} values for {batch.num_rows} records")
        batch = batch.set_column(index, pa.field(name, column.type), column)
    return batch


def _rows_before(batch: Any, offset: int) -> int:
    """How many of ``batch``'s records come before ``offset``."""
    import bisect

    return bisect.bisect_left(batch.column(_OFFSET).to_pylist(), offset)


def _give_back(engine: Engine, tp: TopicPartition, state: PartitionState, offset: int) -> None:
    """Records from ``offset`` on were taken but not handed out: fetch them again from there."""
    state.rewind(offset)
    engine.buffer.drop(functools.partial(_other_partition, tp))
    engine.wake()


def _collect(
    collector: Collector[Any, Any],
    engine: Engine,
    only: set[TopicPartition] | None,
    limit: int,
    include_headers: bool,
    *,
    hand_out: bool = True,
) -> Any:
    """The collector's fetch walk read as columns: the first partition with records, as one batch
    (with ``hand_out=False``: ``(partition, its state, the batch)``, not yet handed out)."""
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
    if not hand_out:
        return tp, state, batch
    state.handed_out(state.position)  # everything taken is handed out (getmany()'s semantics)
    collector.handed(tp, batch.num_rows)
    return batch


def _other_partition(tp: TopicPartition, fetch: Any) -> bool:
    return bool(fetch.tp != tp)


def columns_first_offset(columns: Any) -> int:
    """The offset of the first record of ``columns`` (a ``protocol.columnar.Columns``)."""
    view = memoryview(columns.buffers.offsets).cast("B").cast("q")
    return int(view[columns.first])
