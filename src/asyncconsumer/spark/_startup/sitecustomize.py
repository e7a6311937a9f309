"""Run by Python at the start of each process Spark starts for the asyncconsumer source.

:func:`asyncconsumer.spark.register` puts this file's directory on the ``PYTHONPATH`` of the
source's Python processes (and of no other).  Spark's own zips come before it there, but they hold
no ``sitecustomize``, so Python's ``site`` imports this module as ``sitecustomize`` before the
process runs anything else.

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of every
Python process it starts.  Python caches no bytecode for a module imported from a zip, so each new
process compiles the PySpark modules it imports: about 1 s of CPU, and each streaming query starts
one such process on the driver before its first micro-batch.  With PySpark installed by pip,
``$SPARK_HOME`` is the installed ``pyspark`` package itself: its zip holds the same modules as the
package directory it sits in, which has their bytecode.

What: :func:`defer_spark_zips` moves ``pyspark.zip`` to the end of ``sys.path`` when the rest of
the path gives the very ``pyspark`` package the zip sits in (``<package>/python/lib/pyspark.zip``)
with a byte-identical ``version.py``, and py4j's zip when the rest of the path gives ``py4j`` with
a byte-identical ``version.py``; otherwise it leaves the path as it is.  Modules that only the zip
has (PySpark's own test suites, ``pyspark.sql.streaming.benchmark``) are then not importable in
these processes, which never import them.  Then the ``sitecustomize`` that this one hides, if any,
runs as it would have, whatever happened before.

Standard library only, and nothing from asyncconsumer: this runs before PySpark is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zipimport
from importlib.machinery import PathFinder

#: Spark's zips, by file name: the top-level package each holds.
_ZIPS = {"pyspark.zip": "pyspark"}
#: py4j's zip is named after its version: ``py4j-0.10.9.9-src.zip``.
_PY4J_PREFIX, _PY4J_SUFFIX = "py4j-", "-src.zip"


def _package_of(entry: str) -> str | None:
    """The top-level package a ``sys.path`` entry holds, if it is one of Spark's zips."""
    name = os.path.basename(entry)
    if name.startswith(_PY4J_PREFIX) and name.endswith(_PY4J_SUFFIX):
        return "py4j"
    return _ZIPS.get(name)


def _same_installed(zip_path: str, package: str, rest: list[str]) -> bool:
    """Whether ``rest`` gives ``package`` as a directory whose ``version.py`` is the zip's, and for
    ``pyspark`` the directory the zip sits in (a pip install's ``python/lib/pyspark.zip``: a Spark
    distribution's zip, even of the same version, may hold a vendor's changes)."""
    try:
        spec = PathFinder.find_spec(package, rest)
        if spec is None or spec.origin is None or os.path.basename(spec.origin) != "__init__.py":
            return False
        directory = os.path.dirname(spec.origin)
        if package == "pyspark":
            own_zip = os.path.join(directory, "python", "lib", "pyspark.zip")
            if os.path.realpath(zip_path) != os.path.realpath(own_zip):
                return False
        with open(os.path.join(directory, "version.py"), "rb") as f:
            installed = f.read()
        in_zip = zipimport.zipimporter(zip_path).get_data(f"{package}/version.py")
    except Exception:  # a probe before anything else runs: whatever it cannot read stays where it is
        return False
    return installed == in_zip


def defer_spark_zips(path: list[str]) -> list[str]:
    """Move Spark's ``pyspark.zip`` and py4j zip to the end of ``path`` (``sys.path``) where the
    rest of ``path`` has the same package installed (see the module's docs); returns the entries
    moved."""
    zips = {entry: package for entry in path if (package := _package_of(entry)) is not None}
    rest = [entry for entry in path if entry not in zips]
    moved = [entry for entry, package in zips.items() if _same_installed(entry, package, rest)]
    for entry in moved:
        path.remove(entry)
        path.append(entry)
    return moved


def _run_hidden_sitecustomize() -> None:
    """Run the ``sitecustomize`` module that this one hides on ``sys.path``, if there is one, as
    ``sitecustomize``."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    with contextlib.suppress(Exception):  # never in the way of the start, nor of the hidden one
        defer_spark_zips(sys.path)
    _run_hidden_sitecustomize()
