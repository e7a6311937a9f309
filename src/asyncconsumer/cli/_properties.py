"""Java-style properties for the command-line tool: ``--consumer-property k=v``, ``--command-config FILE``.

Kafka's tools take the Java client's dotted names; :func:`asyncconsumer.config.from_properties`
maps them onto :class:`~asyncconsumer.ConsumerOptions` (``sasl.jaas.config`` included).  This module
reads ``.properties`` files and ``NAME=VALUE`` flags.  No message here shows a value: a property
may hold a password.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import ConfigError


def parse_pairs(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """``["a.b=1", "c=x=y"]`` -> ``{"a.b": "1", "c": "x=y"}``; a pair without ``=`` is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:  # not the text itself: it may be a secret property with a mistyped separator
            raise ConfigError(f"{flag} expects NAME=VALUE, got {_described(pair)} without '='")
        if not name.strip():
            raise ConfigError(f"{flag} expects NAME=VALUE, got no NAME before the '='")
        result[name.strip()] = value
    return result


def _described(pair: str) -> str:
    """A ``NAME=VALUE`` flag without its ``=`` as an error shows it: a leading property name
    (``a.b.c``), and only the length of the rest, which may be a password."""
    name = re.match(r"[a-z][a-z0-9]*(?:\.[a-z0-9]+)+", pair)
    if name is None:
        return f"{len(pair)} characters"
    more = len(pair) - name.end()
    return f"{name.group(0)!r}" + (f" and {more} more characters" if more else "")


def read_properties_file(path: Path) -> dict[str, str]:
    """Read a Java ``.properties`` file: ``key=value`` or ``key: value`` lines, ``#``/``!`` comments,
    backslash line continuations."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    result: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"((?:[^=:\s\\]|\\.)+)\s*[=:\s]\s*(.*)$", logical)
        if match is None:
            result[logical.strip()] = ""
        else:
            result[match.group(1).replace("\\", "")] = match.group(2).strip()
        logical = ""
    return result


def consumer_properties(*sources: Mapping[str, str]) -> dict[str, str]:
    """Merge property sources (later ones win).  ``sasl.jaas.config`` stays as it is: ``from_properties``
    reads it (every login module it knows, and without showing the password in its errors)."""
    merged: dict[str, str] = {}
    for source in sources:
        merged.update(source)
    return merged
