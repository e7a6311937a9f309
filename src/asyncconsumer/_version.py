"""The package's version: the one place it is written.

The package metadata (pyproject.toml reads it), ``asyncconsumer.__version__``, ``asyncconsumer
--version`` and the docs site (docs/hooks.py) all take it from here; CHANGELOG.md's newest release
heading must match it (tests/guides/test_release.py).  Versions follow Semantic Versioning: see
docs/api-stability.md for what a release may change.
"""

__version__ = "0.1.0"
