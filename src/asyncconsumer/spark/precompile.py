"""Bytecode for PySpark's own zip files, so each new Python process Spark starts imports it faster.

    python -m asyncconsumer.spark.precompile [SPARK_HOME]

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j zip at the front of the
``PYTHONPATH`` of every Python process it starts (each executor's Python daemon; on the driver the
processes that plan Python data sources, and a new one for each streaming query).  Those zips
ship only ``.py`` files, and Python cannot cache the bytecode of a module imported from a zip, so
each such process compiles the PySpark modules it imports again: about 1 s of CPU on the
benchmark machine (docs/spark.md), paid before any data source, this one included, runs a line.

:func:`precompile_pyspark` rewrites each zip with every original entry unchanged plus a ``.pyc``
beside each ``.py`` outside ``tests`` packages (PySpark's own test suites, never imported by
Spark's processes, are 70% of pyspark.zip's modules), compiled by the running interpreter
as *checked* hash-based bytecode: Python's zip importer uses a ``.pyc`` only when its recorded hash
matches its ``.py``, and ignores one made by another Python version (it compiles the source then,
as before).  So the rewritten zip imports exactly the same code, under any Python; run it again
after upgrading Python or PySpark.  The zip is replaced atomically (a new file renamed over the old
one, same permissions); reinstalling PySpark restores the original.  This changes files of the
PySpark installation: run it where you install PySpark (an image build, a cluster bootstrap
script), with the Python the workers use.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import marshal
import os
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrecompiledZip", "is_precompiled", "main", "precompile_pyspark", "precompile_zip", "zips_deferred"]


@dataclass(frozen=True, slots=True)
class PrecompiledZip:
    """What :func:`precompile_zip` did to one zip."""

    #: The zip file (rewritten in place when ``compiled`` > 0).
    path: Path
    #: ``.py`` entries given a ``.pyc`` by this run.
    compiled: int
    #: ``.py`` entries whose ``.pyc`` for this Python, matching their source, was there already.
    current: int


def _find_spark_home() -> Path:
    """``$SPARK_HOME``, else the installed ``pyspark`` package (a pip-installed PySpark's home)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("no SPARK_HOME is set and pyspark is not installed: pass the Spark home directory")
    return Path(spec.origin).parent


def _pyspark_zip(spark_home: str | os.PathLike[str] | None) -> Path:
    """``<spark_home>/python/lib/pyspark.zip``, ``spark_home`` defaulting as for
    :func:`precompile_pyspark` (:class:`FileNotFoundError` when there is none to default to)."""
    home = Path(spark_home) if spark_home is not None else _find_spark_home()
    return home / "python" / "lib" / "pyspark.zip"


#: A ``.pyc``'s flags word (PEP 552): hash-based (bit 0), checked against its source (bit 1).
_CHECKED_HASH = (0b11).to_bytes(4, "little")


def _header(source: bytes) -> bytes:
    """The 16-byte header of this Python's checked hash-based bytecode of ``source`` (PEP 552)."""
    return importlib.util.MAGIC_NUMBER + _CHECKED_HASH + importlib.util.source_hash(source)


def precompile_zip(path: str | os.PathLike[str], skip: Callable[[str], bool] | None = None) -> PrecompiledZip:
    """Give every ``.py`` in the zip at ``path`` a checked hash-based ``.pyc`` (see the module docs).

    A ``.py`` that does not compile gets no ``.pyc`` (Python reports its error on import, as
    before).  ``skip(name)`` true for a ``.py`` entry: it gets no ``.pyc``, and one it has is
    dropped.  Nothing is written when no ``.pyc`` is missing, out of date or to be dropped.
    """
    path = Path(path).resolve()  # a symlinked zip: its target is rewritten, the link stays
    with zipfile.ZipFile(path) as zin:
        infos = zin.infolist()
        names = {info.filename for info in infos}
        skipped = {n for n in names if n.endswith(".py") and skip is not None and skip(n)}
        dropped = [n for n in skipped if n + "c" in names]
        sources = {
            info.filename: zin.read(info)
            for info in infos
            if info.filename.endswith(".py") and info.filename not in skipped
        }
        current: dict[str, bytes] = {}  # .py entry -> its .pyc, already this Python's bytecode of it
        for name, source in sources.items():
            if name + "c" in names and (old := zin.read(name + "c"))[:16] == _header(source):
                current[name] = old
        fresh: dict[str, bytes] = {}
        for name, source in sources.items():
            if name not in current:
                with contextlib.suppress(SyntaxError, ValueError), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the source's own SyntaxWarnings: Python's to report on import
                    code = compile(source, str(path / name), "exec", dont_inherit=True)
                    fresh[name] = _header(source) + marshal.dumps(code)
        if not fresh and not dropped:
            return PrecompiledZip(path, 0, len(current))
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zout:
                zout.comment = zin.comment
                for info in infos:
                    if info.filename.endswith(".pyc") and (
                        info.filename[:-1] in sources or info.filename[:-1] in skipped
                    ):
                        continue  # written below, next to its source, or dropped
                    zout.writestr(info, zin.read(info))
                    bytecode = fresh.get(info.filename, current.get(info.filename))
                    if bytecode is not None:
                        pyc_info = zipfile.ZipInfo(info.filename + "c", info.date_time)
                        pyc_info.compress_type = info.compress_type
                        pyc_info.external_attr = info.external_attr
                        zout.writestr(pyc_info, bytecode)
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return PrecompiledZip(path, len(fresh), len(current))


def precompile_pyspark(spark_home: str | os.PathLike[str] | None = None) -> list[PrecompiledZip]:
    """Precompile every zip in ``<spark_home>/python/lib`` (``pyspark.zip``, the py4j zip).

    ``spark_home`` defaults to ``$SPARK_HOME``, else the installed ``pyspark`` package.  Raises
    :class:`FileNotFoundError` when that directory has no ``python/lib/*.zip``, and
    :class:`zipfile.BadZipFile` for a file there that is not a zip (the zips before it are done).
    """
    home = Path(spark_home) if spark_home is not None else _find_spark_home()
    zips = sorted((home / "python" / "lib").glob("*.zip"))
    if not zips:
        raise FileNotFoundError(f"no zip files in {home / 'python' / 'lib'}: is {home} a Spark home?")
    return [precompile_zip(z, skip=_is_test_module) for z in zips]


def _is_test_module(name: str) -> bool:
    """A module of a ``tests`` package (PySpark's own test suites: 840 of pyspark.zip's 1,198 modules).

    Spark's processes never import them, and each entry costs: Python 3.11 and 3.12 re-read a zip's
    whole directory once per package imported from it whenever ``importlib.invalidate_caches()``
    runs, as PySpark's does in every new Python process (CPython gh-103200).
    """
    return "tests" in name.split("/")[:-1]


def is_precompiled(spark_home: str | os.PathLike[str] | None = None) -> bool | None:
    """Whether ``<spark_home>/python/lib/pyspark.zip`` holds the running Python's current bytecode
    of PySpark (judged by ``pyspark/__init__.py`` and its ``.pyc``); None when there is no such zip
    or it cannot be read.

    ``spark_home`` defaults as for :func:`precompile_pyspark`.
    """
    try:
        with zipfile.ZipFile(_pyspark_zip(spark_home)) as z:
            source = z.read("pyspark/__init__.py")
            try:
                bytecode = z.read("pyspark/__init__.pyc")
            except KeyError:
                return False
            return bytecode[:16] == _header(source)
    except Exception:  # a probe: a zip it cannot read (damaged, unsupported compression) is "cannot tell"
        return None


def zips_deferred(spark_home: str | os.PathLike[str] | None = None) -> bool:
    """Whether the asyncconsumer source's Python processes, started with this Python's
    ``sys.path``, import PySpark from its installed package rather than from
    ``<spark_home>/python/lib/pyspark.zip`` (``register(spark)``'s ``prefer_installed_pyspark``:
    the zip is the installed ``pyspark`` package's own, with its ``version.py``); False when there
    is no such zip.

    ``spark_home`` defaults as for :func:`precompile_pyspark`.
    """
    from ._startup.sitecustomize import defer_spark_zips

    try:
        zip_path = str(_pyspark_zip(spark_home))
    except FileNotFoundError:
        return False
    if not os.path.isfile(zip_path):
        return False
    return zip_path in defer_spark_zips([zip_path, *(p for p in sys.path if p != zip_path)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asyncconsumer.spark.precompile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("spark_home", nargs="?", help="default: $SPARK_HOME, else the installed pyspark package")
    args = parser.parse_args(argv)
    try:
        results = precompile_pyspark(args.spark_home)
    except (OSError, zipfile.BadZipFile) as exc:
        print(f"precompile: {exc}", file=sys.stderr)
        return 1
    for r in results:
        print(f"{r.path}: {r.compiled} modules compiled, {r.current} already current ({sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
