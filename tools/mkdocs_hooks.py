"""MkDocs hooks (mkdocs.yml ``hooks:``): the docs site takes the version and the changelog from
their one source each.

- ``{{ asyncconsumer_version }}`` in a page becomes the package's version, read from
  ``src/asyncconsumer/_version.py`` (the site's name carries it too);
- ``docs/changelog.md`` shows ``CHANGELOG.md`` from the repository's root, with its links to
  ``docs/`` pages made relative to the site;
- in a table row, ``\\|`` inside a code span becomes ``|``: GitHub's tables need the backslash
  there (a bare pipe would end the cell), Python-Markdown's keep it literally (a pipe inside a code
  span does not end a cell there).
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKEN = "{{ asyncconsumer_version }}"


def package_version(root: pathlib.Path = ROOT) -> str:
    """``__version__`` from ``_version.py``, read without importing the package."""
    tree = ast.parse((root / "src" / "asyncconsumer" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise LookupError("no __version__ in src/asyncconsumer/_version.py")


def changelog_page(root: pathlib.Path = ROOT) -> str:
    """CHANGELOG.md as a page of the site (its ``docs/x.md`` links become ``x.md``)."""
    return (root / "CHANGELOG.md").read_text().replace("](docs/", "](")


_CODE_SPAN = re.compile(r"`[^`\n]*`")


def unescape_table_pipes(markdown: str) -> str:
    """``\\|`` inside the code spans of table rows (lines that start with ``|``) as ``|``."""

    def row(line: str) -> str:
        if not line.lstrip().startswith("|"):
            return line
        return _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)

    return "\n".join(row(line) for line in markdown.split("\n"))


def on_config(config: Any) -> Any:
    config["site_name"] = f"asyncconsumer {package_version()}"
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "changelog.md":
        markdown = changelog_page()
    return unescape_table_pipes(markdown.replace(TOKEN, package_version()))
