"""Logging: one hierarchy under ``asyncconsumer``, no prints in the library, repeated warnings rate-limited."""

from __future__ import annotations

import ast
import logging
import re

import pytest
from support.paths import ROOT

from asyncconsumer._logging import RateLimitedWarnings

SRC = ROOT / "src/asyncconsumer"
DOCS = ROOT / "docs/metrics.md"


def test_a_repeated_warning_is_logged_once_per_interval_then_says_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    warnings = RateLimitedWarnings(logging.getLogger("asyncconsumer.test"), interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="asyncconsumer.test"):
        assert warnings.warning("b1", "broker %s down", 1)
        for _ in range(5):
            now[0] += 10
            assert not warnings.warning("b1", "broker %s down", 1)
        assert warnings.warning("b2", "broker %s down", 2)  # another key is its own
        now[0] = 61
        assert warnings.warning("b1", "broker %s down", 1)
        now[0] = 200
        assert warnings.warning("b1", "broker %s down", 1)
    assert [r.getMessage() for r in caplog.records] == [
        "broker 1 down",
        "broker 2 down",
        "broker 1 down (5 more like it in the last 61s not logged)",
        "broker 1 down",
    ]


def _logger_names() -> dict[str, str]:
    names = {}
    for path in SRC.rglob("*.py"):
        for match in re.finditer(r'logging\.getLogger\("([^"]+)"\)', path.read_text()):
            names[match.group(1)] = str(path.relative_to(SRC))
    return names


def test_every_logger_is_under_asyncconsumer_and_documented() -> None:
    names = _logger_names()
    assert names, "no loggers found"
    documented = DOCS.read_text()
    for name, where in names.items():
        # the root of the hierarchy itself is only set (the CLI's -v), never logged to
        inside = name == "asyncconsumer" or name.startswith("asyncconsumer.")
        assert inside, f"{where}: logger {name!r} outside the hierarchy"
        assert f"`{name}`" in documented, f"{name} ({where}) is not in docs/metrics.md"


def test_no_print_in_the_library() -> None:
    # asyncconsumer.testing prints download and build progress to a stream it is given; demo and
    # spark/precompile are commands.
    allowed = {"demo.py", "testing/_java.py", "testing/schema_registry.py", "spark/__main__.py", "spark/precompile.py",
               "__main__.py", "cli.py"}
    offenders = []
    for path in SRC.rglob("*.py"):
        if str(path.relative_to(SRC)) in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []
