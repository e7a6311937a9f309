"""Per-partition streams (``consumer.partitions()``): kept importable here; they live in app/streams.py."""

from .app.streams import PartitionStream

__all__ = ["PartitionStream"]
