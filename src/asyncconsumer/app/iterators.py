"""The async iterators the consumer's read APIs return (``batches()``, ``arrow_batches()``,
``partitions()``): each step is one call of a step function (a poll, bracketed by the consumer's
``acquire()``/``release()``), and ``aclose()`` runs an optional cleanup.  And what ``async for``
over the consumer itself hands records out with: ``ready``, the awaitable ``Consumer.__anext__``
returns for a record it already holds, and with the C extension ``RecordStream`` (that step in C,
reading the collector's ``FastPath``) and ``ChunkBase`` (the fields of a chunk of records)."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from ..protocol import records

T = TypeVar("T")


async def ready_py(value: T) -> T:
    """An awaitable whose value is ``value``: the pure-Python twin of the compiled ``ready``."""
    return value


#: ``ready(value)``: an awaitable already complete, ``await ready(x)`` is ``x``.  The compiled one
#: (``asyncconsumer._speedups.ready``, used with the compiled decoder) is no coroutine: no frame, no
#: suspension, so ``async for`` pays no coroutine per buffered record; ``ready_py`` otherwise.
_speedups: Any = importlib.import_module("asyncconsumer._speedups") if records.DECODER == "c" else None
ready: Callable[[Any], Awaitable[Any]] = cast("Callable[[Any], Awaitable[Any]]", getattr(_speedups, "ready", ready_py))

#: ``RecordStream(fast_path, fallback)``, what ``async for record in consumer`` iterates when the
#: compiled decoder is in use, the consumer has no deserializers and the default
#: ``acquire()``/``release()``: ``Consumer.__anext__``'s common case (a record of the first chunk,
#: not its last, the chunk live, no other poll, the engine running) in C, reading what
#: ``fast_path``, the collector's ``app.collector.FastPath``, holds; everything else is
#: ``fallback()``, the consumer's bound ``__anext__``, which stays the reference.  Like it, the
#: stream reads the chunks' fields (``ChunkBase``) and their partitions' ``PartitionState``
#: (``epoch``, ``paused``, ``revoking``), and writes the state's ``consumed``.  None without the
#: extension.
RecordStream: Any = getattr(_speedups, "RecordStream", None)
#: The base of ``app.collector.Chunk``: the compiled ``ChunkBase`` (its fields as a C struct, which
#: ``RecordStream`` reads directly) with the extension, else ``object``.
ChunkBase: type = getattr(_speedups, "ChunkBase", object)


class Steps(Generic[T]):
    """``async for item in Steps(step)``: each item is ``await step()``; ``step`` ends the iteration
    by raising ``StopAsyncIteration``."""

    __slots__ = ("_on_close", "_step")

    def __init__(self, step: Callable[[], Awaitable[T]], on_close: Callable[[], None] | None = None) -> None:
        self._step = step
        self._on_close = on_close

    def __aiter__(self) -> Steps[T]:
        return self

    async def __anext__(self) -> T:
        return await self._step()

    async def aclose(self) -> None:
        if self._on_close is not None:
            self._on_close()
