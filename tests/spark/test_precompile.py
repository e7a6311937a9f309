"""``asyncconsumer.spark.precompile``: bytecode added to PySpark's zips, imported by Python's zip importer.

Each import is judged in a fresh isolated interpreter that looks in the zips first, as Spark's Python
processes do: the module's ``__file__`` says whether its ``.pyc`` or its ``.py`` was used.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from asyncconsumer.spark.precompile import is_precompiled, main, precompile_pyspark, precompile_zip


def write_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)


def entries(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def imported(path_entries: list[Path], statement: str) -> str:
    """What ``statement`` prints in a fresh interpreter (isolated: no environment) that looks in
    ``path_entries`` first, as Spark's Python processes look in its zips first."""
    first = f"import sys; sys.path[:0] = {[str(p) for p in path_entries]}; "
    done = subprocess.run([sys.executable, "-I", "-c", first + statement], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def package_zip(tmp_path: Path) -> Path:
    home = tmp_path / "home" / "python" / "lib"
    home.mkdir(parents=True)
    path = home / "pkg.zip"
    write_zip(
        path,
        {
            "pkg/__init__.py": b"from .mod import VALUE\n",
            "pkg/mod.py": b"VALUE = 1\n",
            "pkg/broken.py": b"def (:\n",
            "pkg/data.txt": b"not python",
        },
    )
    return path


def test_every_module_gets_a_pyc_that_the_zip_importer_uses(package_zip: Path) -> None:
    before = entries(package_zip)
    assert imported([package_zip], "import pkg, pkg.mod; print(pkg.mod.__file__, pkg.VALUE)").endswith("mod.py 1")

    result = precompile_zip(package_zip)

    assert (result.compiled, result.current) == (2, 0)  # broken.py gets none
    after = entries(package_zip)
    assert {n: after[n] for n in before} == before  # every original entry unchanged
    assert set(after) - set(before) == {"pkg/__init__.pyc", "pkg/mod.pyc"}
    assert after["pkg/mod.pyc"][:4] == importlib.util.MAGIC_NUMBER
    out = imported([package_zip], "import pkg, pkg.mod; print(pkg.__file__, pkg.mod.__file__, pkg.VALUE)")
    assert out == f"{package_zip}/pkg/__init__.pyc {package_zip}/pkg/mod.pyc 1"


def test_a_second_run_writes_nothing(package_zip: Path) -> None:
    precompile_zip(package_zip)
    written = package_zip.stat()

    result = precompile_zip(package_zip)

    assert (result.compiled, result.current) == (0, 2)
    assert package_zip.stat().st_mtime_ns == written.st_mtime_ns and package_zip.stat().st_ino == written.st_ino


def test_a_pyc_that_no_longer_matches_its_source_is_ignored_then_replaced(package_zip: Path) -> None:
    precompile_zip(package_zip)
    changed = entries(package_zip)
    changed["pkg/mod.py"] = b"VALUE = 2\n"  # the source changed, its .pyc did not
    write_zip(package_zip, changed)
    assert imported([package_zip], "import pkg.mod; print(pkg.mod.__file__, pkg.VALUE)").endswith("mod.py 2")

    result = precompile_zip(package_zip)

    assert (result.compiled, result.current) == (1, 1)
    assert imported([package_zip], "import pkg.mod; print(pkg.mod.__file__, pkg.VALUE)").endswith("mod.pyc 2")


def test_another_pythons_pyc_is_ignored_on_import_and_replaced(package_zip: Path) -> None:
    precompile_zip(package_zip)
    other = entries(package_zip)
    other["pkg/mod.pyc"] = b"\x00\x00\r\n" + other["pkg/mod.pyc"][4:]  # some other version's magic number
    write_zip(package_zip, other)
    assert imported([package_zip], "import pkg.mod; print(pkg.mod.__file__)").endswith("mod.py")

    assert precompile_zip(package_zip).compiled == 1
    assert imported([package_zip], "import pkg.mod; print(pkg.mod.__file__)").endswith("mod.pyc")


def test_the_zips_permissions_comment_and_symlink_are_kept(package_zip: Path) -> None:
    with zipfile.ZipFile(package_zip, "a") as z:
        z.comment = b"built by spark"
    package_zip.chmod(0o640)
    link = package_zip.with_name("link.zip")
    link.symlink_to(package_zip.name)

    assert precompile_zip(link).path == package_zip

    assert link.is_symlink() and "pkg/mod.pyc" in entries(link)
    assert stat.S_IMODE(package_zip.stat().st_mode) == 0o640
    assert zipfile.ZipFile(package_zip).comment == b"built by spark"
    assert sorted(p.name for p in package_zip.parent.iterdir()) == ["link.zip", "pkg.zip"]  # no temporary file


def test_a_directory_that_is_not_a_spark_home_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FileNotFoundError, match=f"no zip files in {tmp_path}/python/lib"):
        precompile_pyspark(tmp_path)
    assert main([str(tmp_path)]) == 1
    assert "is " + str(tmp_path) + " a Spark home?" in capsys.readouterr().err
    (tmp_path / "python" / "lib").mkdir(parents=True)
    (tmp_path / "python" / "lib" / "pyspark.zip").write_bytes(b"not a zip")
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == "precompile: File is not a zip file\n"


def test_pysparks_own_zips_import_from_bytecode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The installed PySpark's zips (copied): afterwards what a streaming query's Python process
    imports (PySpark's streaming source runner) comes from bytecode, and behaves the same."""
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    lib = Path(spec.origin).parent / "python" / "lib"
    home = tmp_path / "spark"
    shutil.copytree(lib, home / "python" / "lib")
    zips = sorted((home / "python" / "lib").glob("*.zip"))
    statement = (
        "import pyspark.sql.streaming.python_streaming_source_runner, pyspark, py4j; "
        "print(pyspark.__file__, py4j.__file__, pyspark.__version__)"
    )
    version = imported(zips, statement).split()[-1]

    assert main([str(home)]) == 0

    report = capsys.readouterr().out
    assert "pyspark.zip: " in report and "modules compiled, 0 already current" in report
    pyspark_file, py4j_file, again = imported(zips, statement).split()
    assert pyspark_file.endswith("pyspark.zip/pyspark/__init__.pyc") and py4j_file.endswith("/py4j/__init__.pyc")
    assert again == version


@pytest.fixture
def spark_home(tmp_path: Path) -> Path:
    """A Spark home whose ``pyspark.zip`` holds only sources, as Spark ships it."""
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    write_zip(lib / "pyspark.zip", {"pyspark/__init__.py": b"VERSION = 1\n", "pyspark/sql.py": b"X = 2\n"})
    return tmp_path / "spark"


def test_is_precompiled_tells_a_shipped_zip_from_a_precompiled_one(spark_home: Path, tmp_path: Path) -> None:
    assert is_precompiled(spark_home) is False
    precompile_pyspark(spark_home)
    assert is_precompiled(spark_home) is True
    # Another Python's bytecode (another magic number) is not this Python's.
    zip_path = spark_home / "python" / "lib" / "pyspark.zip"
    changed = entries(zip_path)
    changed["pyspark/__init__.pyc"] = b"\x00\x00\x0d\x0a" + changed["pyspark/__init__.pyc"][4:]
    write_zip(zip_path, changed)
    assert is_precompiled(spark_home) is False
    assert is_precompiled(tmp_path / "nowhere") is None
    # A zip it cannot read (here a damaged deflate stream: zlib.error) is "cannot tell", not an error.
    write_zip(zip_path, {"pyspark/__init__.py": b"VERSION = 1\n" * 100})
    with zipfile.ZipFile(zip_path) as z:
        info = z.getinfo("pyspark/__init__.py")
    damaged = bytearray(zip_path.read_bytes())
    data = info.header_offset + 30 + len(info.filename.encode())  # the local header has no extra field
    damaged[data : data + 4] = b"\xff\xff\xff\xff"
    zip_path.write_bytes(bytes(damaged))
    assert is_precompiled(spark_home) is None


def test_register_says_once_how_to_start_streaming_queries_faster(
    spark_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncconsumer.spark.source as source

    registered: list[type] = []

    class Registry:
        def register(self, cls: type) -> None:
            registered.append(cls)

    class Session:
        dataSource = Registry()

    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    monkeypatch.setattr(source, "_PRECOMPILE_CHECKED", False)
    caplog.set_level(logging.INFO, logger="asyncconsumer.spark")
    source.register(Session())  # type: ignore[arg-type]
    source.register(Session())  # type: ignore[arg-type]

    assert registered == [source.AsyncConsumerDataSource] * 2
    hints = [r.getMessage() for r in caplog.records if "asyncconsumer.spark.precompile" in r.getMessage()]
    assert len(hints) == 1 and "no bytecode for this Python" in hints[0]
    assert [r.levelno for r in caplog.records if "precompile" in r.getMessage()] == [logging.INFO]

    precompile_pyspark(spark_home)
    monkeypatch.setattr(source, "_PRECOMPILE_CHECKED", False)
    caplog.clear()
    source.register(Session())  # type: ignore[arg-type]
    assert not [r for r in caplog.records if "precompile" in r.getMessage()]


def test_pysparks_test_packages_get_no_bytecode(spark_home: Path) -> None:
    """Spark's processes never import PySpark's test suites; each entry only costs a zip directory
    re-read (Python 3.11/3.12's ``invalidate_caches()``), so they get no ``.pyc``, and one an earlier
    run gave them is dropped."""
    zip_path = spark_home / "python" / "lib" / "pyspark.zip"
    original = entries(zip_path)
    original["pyspark/sql/tests/test_x.py"] = b"Y = 3\n"
    original["pyspark/testing/utils.py"] = b"Z = 4\n"  # a package PySpark imports, not a test suite
    write_zip(zip_path, original)
    assert precompile_zip(zip_path).compiled == 4  # the generic function compiles every module
    assert "pyspark/sql/tests/test_x.pyc" in entries(zip_path)

    (result,) = precompile_pyspark(spark_home)

    after = entries(zip_path)
    assert result.compiled == 0 and result.current == 3
    assert "pyspark/sql/tests/test_x.pyc" not in after and after["pyspark/sql/tests/test_x.py"] == b"Y = 3\n"
    assert {"pyspark/__init__.pyc", "pyspark/sql.pyc", "pyspark/testing/utils.pyc"} <= set(after)
    assert is_precompiled(spark_home) is True
    assert precompile_pyspark(spark_home)[0] == result  # nothing left to do: not rewritten again
