"""The source's Python processes import PySpark from its installed package, not from Spark's zip.

``register(spark)`` puts ``asyncconsumer/spark/_startup`` (a ``sitecustomize``) first on the
``PYTHONPATH`` of the source's Python processes only.  Judged three ways: the path logic on made-up
installations, fresh interpreters started the way Spark starts them (its zips first on
``PYTHONPATH``), and the processes of a real streaming query in the session's Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

from asyncconsumer.spark._startup.sitecustomize import defer_spark_zips
from asyncconsumer.spark.precompile import zips_deferred
from asyncconsumer.spark.worker import STARTUP_DIR, startup_pythonpath

pytestmark = pytest.mark.spark


def write_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


@pytest.fixture
def install(tmp_path: Path) -> dict[str, Path]:
    """A pip-style PySpark 9.9.9: ``site/pyspark`` with its ``python/lib`` zips (same modules, the
    zip's say so), and py4j 1.2.3 installed beside it."""
    site = tmp_path / "site"
    pkg = site / "pyspark"
    lib = pkg / "python" / "lib"
    lib.mkdir(parents=True)
    for name, text in {"__init__.py": "WHERE = 'package'\n", "version.py": "__version__ = '9.9.9'\n"}.items():
        (pkg / name).write_text(text)
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("WHERE = 'package'\n")
    (site / "py4j" / "version.py").write_text("__version__ = '1.2.3'\n")
    write_zip(
        lib / "pyspark.zip",
        {"pyspark/__init__.py": b"WHERE = 'zip'\n", "pyspark/version.py": b"__version__ = '9.9.9'\n"},
    )
    write_zip(
        lib / "py4j-1.2.3-src.zip",
        {"py4j/__init__.py": b"WHERE = 'zip'\n", "py4j/version.py": b"__version__ = '1.2.3'\n"},
    )
    return {"site": site, "pyspark.zip": lib / "pyspark.zip", "py4j.zip": lib / "py4j-1.2.3-src.zip"}


def test_the_zips_go_last_when_the_same_versions_are_installed(install: dict[str, Path]) -> None:
    zips = [str(install["pyspark.zip"]), str(install["py4j.zip"])]
    other = str(install["site"].parent / "other.zip")
    path = [*zips, other, "/jars/spark-core.jar", str(install["site"])]

    assert defer_spark_zips(path) == zips
    assert path == [other, "/jars/spark-core.jar", str(install["site"]), *zips]
    assert defer_spark_zips(path) == zips and path[-2:] == zips  # again: no change


def test_a_zip_stays_first_unless_its_package_is_installed_at_its_version(install: dict[str, Path]) -> None:
    zips = [str(install["pyspark.zip"]), str(install["py4j.zip"])]
    # Nothing else on the path has pyspark or py4j: the zips are all there is.
    assert defer_spark_zips(path := [*zips]) == [] and path == zips
    # Another version installed: its modules are not the zip's.
    (install["site"] / "pyspark" / "version.py").write_text("__version__ = '9.9.8'\n")
    path = [*zips, str(install["site"])]
    assert defer_spark_zips(path) == [zips[1]]
    assert path == [zips[0], str(install["site"]), zips[1]]
    # A module, not a package directory, of that name.
    (install["site"] / "py4j" / "__init__.py").unlink()
    (install["site"] / "py4j" / "version.py").unlink()
    (install["site"] / "py4j").rmdir()
    (install["site"] / "py4j.py").write_text("")
    assert defer_spark_zips(path := [*zips, str(install["site"])]) == []


def test_a_spark_distributions_zip_stays_first_even_with_the_same_version_installed(
    install: dict[str, Path], tmp_path: Path
) -> None:
    """A zip outside the installed package (``$SPARK_HOME`` a Spark distribution) may hold a
    vendor's changes under the same version: only py4j's, checked by its version, goes last."""
    lib = tmp_path / "opt-spark" / "python" / "lib"
    lib.mkdir(parents=True)
    for name in ("pyspark.zip", "py4j.zip"):
        (lib / install[name].name).write_bytes(install[name].read_bytes())
    zips = [str(lib / "pyspark.zip"), str(lib / install["py4j.zip"].name)]
    path = [*zips, str(install["site"])]
    assert defer_spark_zips(path) == [zips[1]]
    assert path == [zips[0], str(install["site"]), zips[1]]


def test_a_zip_it_cannot_read_stays_first(install: dict[str, Path]) -> None:
    install["pyspark.zip"].write_bytes(b"PK not a zip")
    path = [str(install["pyspark.zip"]), str(install["site"])]
    assert defer_spark_zips(path) == [] and path[0] == str(install["pyspark.zip"])


def started(pythonpath: list[Path | str], statement: str) -> str:
    """What ``statement`` prints in a new interpreter started as Spark starts its Python processes:
    ``PYTHONPATH`` (its zips first), site on (``sitecustomize`` runs), nothing else inherited."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    done = subprocess.run([sys.executable, "-c", statement], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_new_process_imports_the_installed_package_and_still_runs_the_hidden_sitecustomize(
    install: dict[str, Path], tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import os\nos.environ['HIDDEN_RAN'] = 'yes'\n")
    spark_paths: list[Path | str] = [install["pyspark.zip"], install["py4j.zip"]]
    statement = (
        "import os, sys, pyspark, py4j, sitecustomize; "
        "print(pyspark.WHERE, py4j.WHERE, os.environ.get('HIDDEN_RAN'), sitecustomize.__file__)"
    )

    # As Spark starts every Python process: its zips first.
    assert started([*spark_paths, hidden, install["site"]], statement).split()[:3] == ["zip", "zip", "yes"]
    # As it starts the source's: the startup directory next (register() puts it in the env's PYTHONPATH).
    where, where_py4j, ran, customize = started([*spark_paths, STARTUP_DIR, hidden, install["site"]], statement).split()
    assert (where, where_py4j, ran) == ("package", "package", "yes")
    assert customize == str(hidden / "sitecustomize.py")  # `import sitecustomize` is still the hidden one
    # No other sitecustomize, another installed version: nothing breaks, the zip stays first.
    (install["site"] / "pyspark" / "version.py").write_text("__version__ = '1.0.0'\n")
    assert started([*spark_paths, STARTUP_DIR, install["site"]], "import pyspark; print(pyspark.WHERE)") == "zip"


def test_zips_deferred_judges_the_drivers_path(install: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home = install["site"] / "pyspark"
    monkeypatch.setattr(sys, "path", [str(install["site"]), *sys.path])
    assert zips_deferred(home) is True
    (home / "version.py").write_text("__version__ = '1.0.0'\n")
    assert zips_deferred(home) is False
    assert zips_deferred(install["site"] / "nowhere") is False


def test_only_the_source_gets_the_startup_directory(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """register() sets it for the source's Python function alone: the session's environment, which
    every later Python UDF copies, is as before, whatever it held."""
    from pyspark.sql.datasource import DataSourceRegistration

    import asyncconsumer.spark.source as source

    environment = spark.sparkContext.environment
    seen: list[str | None] = []  # PYTHONPATH while PySpark wraps the source's class
    monkeypatch.setattr(
        DataSourceRegistration, "register", lambda self, cls: seen.append(environment.get("PYTHONPATH"))
    )
    assert "PYTHONPATH" not in environment
    source.register(spark)
    source.register(spark, prefer_installed_pyspark=False)
    assert seen == [STARTUP_DIR, None]
    assert "PYTHONPATH" not in environment
    environment["PYTHONPATH"] = "/mine"
    try:
        source.register(spark)
        assert seen[-1] == os.pathsep.join([STARTUP_DIR, "/mine"])
        assert environment["PYTHONPATH"] == "/mine"
    finally:
        del environment["PYTHONPATH"]


def where_pyspark_comes_from(spark: Any, tmp_path: Path, startup: bool) -> tuple[str, set[str]]:
    """Run an availableNow query of a data source that reports, from each of its Python processes,
    the file ``pyspark`` was imported from: the streaming source runner (in its offsets) and the
    executors' workers (in its rows).  Registered as ``register()`` registers this source when
    ``startup``, else as a plain ``spark.dataSource.register``."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    def origin() -> str:
        import pyspark

        return str(pyspark.__file__)

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, Any]:
            return {"at": 0, "runner": origin()}

        def latestOffset(self) -> dict[str, Any]:
            return {"at": 1, "runner": origin()}

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            return [InputPartition(i) for i in range(start["at"], end["at"])]

        def read(self, partition: InputPartition) -> Any:
            yield (origin(),)

    name = f"wherefrom_{uuid.uuid4().hex[:8]}"

    class WhereFrom(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return "origin string"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Reader()

    if startup:
        with startup_pythonpath(spark):
            spark.dataSource.register(WhereFrom)
    else:
        spark.dataSource.register(WhereFrom)
    query = (
        spark.readStream.format(name)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not end within 120 s"
        runner = json.loads(query.lastProgress["sources"][0]["endOffset"])["runner"]
        rows = {r.origin for r in spark.sql(f"SELECT origin FROM {name}").collect()}
    finally:
        query.stop()
    return runner, rows


def test_a_streaming_querys_python_processes_import_the_installed_pyspark(spark: Any, tmp_path: Path) -> None:
    import pyspark

    installed = str(pyspark.__file__)
    assert ".zip" not in installed, "this test needs pyspark installed as a package (pip)"
    zip_path = os.path.join(os.path.dirname(installed), "python", "lib", "pyspark.zip")
    assert os.path.isfile(zip_path), "this test needs a pip-installed PySpark (its python/lib/pyspark.zip)"

    runner, workers = where_pyspark_comes_from(spark, tmp_path, startup=True)
    assert runner == installed
    assert workers == {installed}
    # Without the startup directory, Spark's zip is first: what every other Python process gets.
    runner, workers = where_pyspark_comes_from(spark, tmp_path, startup=False)
    assert runner.startswith(zip_path + os.sep)
    assert all(w.startswith(zip_path + os.sep) for w in workers) and workers


def test_register_names_the_precompile_command_only_when_new_processes_would_compile_pyspark(
    install: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    import asyncconsumer.spark.source as source

    class Registry:
        def register(self, cls: type) -> None:
            pass

    class Context:
        environment: dict[str, str] = {}

    class Session:
        dataSource = Registry()
        sparkContext = Context()

    class ConnectSession:  # Spark Connect: no SparkContext, so no start-up directory either
        dataSource = Registry()

    monkeypatch.setenv("SPARK_HOME", str(install["site"] / "pyspark"))
    monkeypatch.setattr(sys, "path", [str(install["site"]), *sys.path])
    caplog.set_level(logging.INFO, logger="asyncconsumer.spark")

    def hinted(session: object = Session(), **options: bool) -> bool:
        monkeypatch.setattr(source, "_PRECOMPILE_CHECKED", False)
        caplog.clear()
        source.register(session, **options)  # type: ignore[arg-type]
        return any("asyncconsumer.spark.precompile" in r.getMessage() for r in caplog.records)

    assert not hinted()  # the zip has no bytecode, but the source's processes will not use it
    assert hinted(prefer_installed_pyspark=False)
    assert hinted(ConnectSession())
    (install["site"] / "pyspark" / "version.py").write_text("__version__ = '1.0.0'\n")
    assert hinted()  # another version installed: the zip is used, and compiled in each process
