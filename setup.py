"""Build hook for the optional C record decoder; all metadata lives in pyproject.toml.

``asyncconsumer._speedups`` (one module from the C files of speedups/, see speedups.h there) is
compiled by every normal build (``pip install .``, ``pip install -e .``, ``python -m build``;
MANIFEST.in puts speedups/ in every sdist).  It is optional: without a C compiler
the build warns and goes on, and the package uses its pure-Python decoder.
``ASYNCCONSUMER_NO_EXTENSION=1`` skips the extension at build time (and, at
import time, makes an installed extension unused).
"""

from __future__ import annotations

import os

from setuptools import Extension, setup


def _disabled() -> bool:
    return os.environ.get("ASYNCCONSUMER_NO_EXTENSION", "").strip().lower() not in ("", "0", "false", "no")


ext_modules = []
if not _disabled():
    ext_modules.append(
        Extension(
            "asyncconsumer._speedups",
            sources=[f"speedups/{name}.c" for name in ("module", "records", "columns", "arrow", "crc32c", "ready", "fields", "codec")],
            depends=["speedups/speedups.h"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
