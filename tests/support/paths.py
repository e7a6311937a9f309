"""Where things are, for tests in any folder under ``tests/``."""

from __future__ import annotations

from pathlib import Path

#: The repository's root (``docs/``, ``examples/``, ``src/``, ``tools/`` ...).
ROOT = Path(__file__).resolve().parents[2]
#: ``tests/``.
TESTS = ROOT / "tests"
#: ``tests/support/``: the helpers, and the scripts tests run in processes of their own.
SUPPORT = TESTS / "support"
