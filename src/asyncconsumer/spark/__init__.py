"""A PySpark Kafka source backed by asyncconsumer (``pip install 'asyncconsumer[spark]'``).

    from asyncconsumer.spark import register

    register(spark)
    df = (spark.read.format("asyncconsumer")
          .option("kafka.bootstrap.servers", "host:9092")
          .option("subscribe", "events")
          .load())

Options and columns follow Spark's own Kafka source (see docs/spark.md); only the format name
changes.  Needs PySpark >= 4.2 (Python data sources with streaming admission control) and pyarrow.
"""

from __future__ import annotations

from .options import SourceOptionError, SourceOptions, parse_options
from .pipeline import run_pipeline
from .source import (
    AsyncConsumerDataSource,
    DataLossError,
    KafkaBatchReader,
    KafkaStreamReader,
    offsets_behind_latest,
    register,
)

__all__ = [
    "FORMAT",
    "AsyncConsumerDataSource",
    "DataLossError",
    "KafkaBatchReader",
    "KafkaStreamReader",
    "SourceOptionError",
    "SourceOptions",
    "offsets_behind_latest",
    "parse_options",
    "register",
    "run_pipeline",
]

#: The format name: ``spark.read.format(FORMAT)``.
FORMAT = AsyncConsumerDataSource.name()
