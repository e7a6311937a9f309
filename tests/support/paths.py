"""Where things are, for tests in any folder under ``tests/``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

#: The repository's root (``docs/``, ``examples/``, ``src/``, ``tools/`` ...).
ROOT = Path(__file__).resolve().parents[2]
#: ``tests/``.
TESTS = ROOT / "tests"
#: ``tests/support/``: the helpers, and the scripts tests run in processes of their own.
SUPPORT = TESTS / "support"


def tool(name: str) -> ModuleType:
    """``tools/NAME.py`` (a generator the tests hold the checked-in output to), loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
