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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .options import SourceOptionError, SourceOptions, parse_options
from .source import (
    AsyncConsumerDataSource,
    DataLossError,
    KafkaBatchReader,
    KafkaStreamReader,
    offsets_behind_latest,
    register,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def run_pipeline(
    bootstrap: str,
    topic: str,
    output_dir: str,
    *,
    progress: Callable[[str], None] = print,
    spark: SparkSession | None = None,
    master: str = "local[*]",
    kafka_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The example pipeline (read ``topic``, aggregate per key per minute, write Parquet); see ``__main__``."""
    from .__main__ import run_pipeline as _run_pipeline

    return _run_pipeline(
        bootstrap, topic, output_dir, progress=progress, spark=spark, master=master, kafka_options=kafka_options
    )
