"""Deprecated: ``PartitionStream`` is ``asyncconsumer.PartitionStream``.

``from asyncconsumer.streams import PartitionStream`` still works and emits a
``DeprecationWarning`` naming the replacement; this module goes in a later minor
release (docs/api-stability.md).  The streams live in app/streams.py.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app.streams import PartitionStream

__all__ = ["PartitionStream"]


def __getattr__(name: str) -> Any:
    if name != "PartitionStream":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "asyncconsumer.streams is deprecated: use asyncconsumer.PartitionStream "
        "(from asyncconsumer import PartitionStream)",
        DeprecationWarning,
        stacklevel=2,
    )
    from .app.streams import PartitionStream

    return PartitionStream
