"""One local SparkSession for the whole test run (starting Spark costs 5-20 s).

The broker fixtures (``bootstrap``, ``new_topic``, ``produce``) come from ``tests/conftest.py``.
Run only these tests with ``pytest -m spark``, or leave them out with ``-m "not spark"``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2", reason="the spark extra is not installed: pip install -e '.[spark]'")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Spark's Python workers must run this interpreter (the one with asyncconsumer installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    from asyncconsumer.spark import register

    work = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("asyncconsumer-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.local.dir", str(work / "local"))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
