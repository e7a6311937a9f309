"""Ready to publish: one version everywhere, a changelog in Keep a Changelog's form, and a core that
imports with its declared dependencies alone.

The artifacts themselves (wheels, the sdist without a compiler) are built and installed outside the
checkout by ``./dev nox -s package`` (tools/package.py), which CI runs; the checks here run in the
checkout, in a second.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.paths import ROOT

import asyncconsumer
from asyncconsumer._runtime import current_async_library
from asyncconsumer.cli import main as cli_main
from asyncconsumer.protocol import records
from tools import mkdocs_hooks
from tools.smoke_install import NEEDS_EXTRA, module_names

CHANGELOG = ROOT / "CHANGELOG.md"
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def test_the_version_is_the_same_everywhere() -> None:
    version = asyncconsumer.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert importlib.metadata.version("asyncconsumer") == version, "reinstall: ./dev reinstalls on a version change"
    assert mkdocs_hooks.package_version() == version
    out = CliRunner().invoke(cli_main, ["--version"]).output.splitlines()
    assert out[0] == f"asyncconsumer {version}"
    assert out[1] == f"record decoder: {records.DECODER_DETAIL}"
    assert out[1].startswith("record decoder: compiled" if records.DECODER == "c" else "record decoder: pure Python")


def test_the_docs_site_takes_the_version_and_the_changelog_from_their_sources() -> None:
    class File:
        src_uri = "installing.md"

    class Page:
        file = File()

    assert mkdocs_hooks.on_page_markdown("v{{ asyncconsumer_version }}.", Page()) == f"v{asyncconsumer.__version__}."
    assert mkdocs_hooks.on_config({"site_name": "x"})["site_name"] == f"asyncconsumer {asyncconsumer.__version__}"
    Page.file.src_uri = "changelog.md"
    page = mkdocs_hooks.on_page_markdown("placeholder", Page())
    assert page.startswith("# Changelog") and f"## [{asyncconsumer.__version__}]" in page
    assert "](docs/" not in page and "](api-stability.md)" in page


def test_the_changelog_follows_keep_a_changelog_and_names_this_version() -> None:
    text = CHANGELOG.read_text()
    assert text.startswith("# Changelog\n")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[0] == "[Unreleased]"
    released = []
    for heading in headings[1:]:
        match = re.fullmatch(r"\[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})", heading)
        assert match, f"a release heading is '## [X.Y.Z] - YYYY-MM-DD': {heading!r}"
        released.append(tuple(int(part) for part in match.groups()[:3]))
    assert released, "no release in CHANGELOG.md"
    assert ".".join(map(str, released[0])) == asyncconsumer.__version__, "the newest release is not __version__"
    assert released == sorted(released, reverse=True)
    for section in re.findall(r"^### (.+)$", text, flags=re.M):
        assert section in SECTIONS, section


def declared_modules() -> set[str]:
    """Top-level modules of the distributions the core requires (no extra), transitively."""
    wanted, seen = ["asyncconsumer"], set()
    while wanted:
        name = canonicalize_name(wanted.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in importlib.metadata.requires(name) or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(canonicalize_name(d) in seen for d in dists)
    } | {"asyncconsumer"}


def import_with_only(modules: list[str], allowed: set[str]) -> subprocess.CompletedProcess[str]:
    """Import ``modules`` in a fresh interpreter where only the standard library and ``allowed``
    top-level packages can be imported."""
    script = textwrap.dedent(
        f"""
        import importlib, sys
        allowed = {sorted(allowed)!r}

        class Undeclared:
            def find_spec(self, name, path=None, target=None):
                top = name.partition(".")[0]
                if top not in allowed and top not in sys.stdlib_module_names:
                    raise ModuleNotFoundError(f"{{name}} is not a declared dependency", name=name)
                return None

        sys.meta_path.insert(0, Undeclared())
        for module in {modules!r}:
            importlib.import_module(module)
        """
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT / "tests")


def core_modules() -> list[str]:
    package = Path(asyncconsumer.__file__).parent
    return [name for name in module_names(package) if not name.startswith(NEEDS_EXTRA)]


def test_the_core_imports_with_its_declared_dependencies_alone() -> None:
    """What a clean `pip install asyncconsumer` gives: every module that needs no extra imports when
    only the standard library and the declared dependencies can be imported (sniffio, which anyio
    4.16 no longer installs, cannot)."""
    allowed = declared_modules()
    assert "anyio" in allowed and "construct" in allowed and "sniffio" not in allowed
    result = import_with_only(core_modules(), allowed)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_import_check_fails_on_an_undeclared_import() -> None:
    result = import_with_only(core_modules(), declared_modules() - {"construct"})
    assert result.returncode != 0 and "construct is not a declared dependency" in result.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_runtime_is_known_inside_each_event_loop(anyio_backend: str) -> None:
    assert current_async_library() == anyio_backend
    assert await anyio.to_thread.run_sync(current_async_library) is None


def test_no_runtime_outside_an_event_loop() -> None:
    assert current_async_library() is None


def test_the_docs_site_shows_a_pipe_where_github_needs_its_escape() -> None:
    """GitHub's tables need ``\\|`` inside a code span; the site shows ``|`` there and nowhere else."""
    page = "| `str \\| None` | a \\| b |\n`x \\| y` outside a table\n"
    assert mkdocs_hooks.unescape_table_pipes(page) == "| `str | None` | a \\| b |\n`x \\| y` outside a table\n"
