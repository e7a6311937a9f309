"""Java-style properties for the command-line tool: ``--consumer-property k=v``, ``--command-config FILE``.

Kafka's tools take the Java client's dotted names; :func:`asyncconsumer.config.from_properties`
maps them onto :class:`~asyncconsumer.ConsumerOptions`.  This module reads ``.properties`` files
and turns ``sasl.jaas.config`` (PLAIN and SCRAM login modules) into a username and password.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import ConfigError

_JAAS_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)
_JAAS_OPTION = re.compile(r'\s*([A-Za-z_][\w.]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


def parse_pairs(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """``["a.b=1", "c=x=y"]`` -> ``{"a.b": "1", "c": "x=y"}``; a pair without ``=`` is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{flag} expects NAME=VALUE, got {pair!r}")
        result[name.strip()] = value
    return result


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


def parse_jaas(config: str) -> tuple[str, str]:
    """The username and password of a PLAIN or SCRAM ``sasl.jaas.config`` line."""
    text = config.strip().rstrip(";").strip()
    module, _, rest = text.partition(" ")
    if module not in _JAAS_MODULES:
        raise ConfigError(
            f"sasl.jaas.config: login module {module!r} is not supported (PlainLoginModule or ScramLoginModule)"
        )
    rest = rest.strip()
    flag, _, rest = rest.partition(" ")
    if flag not in ("required", "requisite", "sufficient", "optional"):
        raise ConfigError(f"sasl.jaas.config: expected a control flag such as 'required' after {module}")
    options: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _JAAS_OPTION.match(rest, position)
        if match is None:
            if rest[position:].strip():
                raise ConfigError(f"sasl.jaas.config: cannot read the options near {rest[position:][:30]!r}")
            break
        quoted, bare = match.group(2), match.group(3)
        options[match.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        position = match.end()
    if "username" not in options or "password" not in options:
        raise ConfigError('sasl.jaas.config needs username="..." and password="..."')
    return options["username"], options["password"]


def consumer_properties(*sources: Mapping[str, str]) -> dict[str, str]:
    """Merge property sources (later ones win) and resolve ``sasl.jaas.config``."""
    merged: dict[str, str] = {}
    for source in sources:
        merged.update(source)
    jaas = merged.pop("sasl.jaas.config", None)
    if jaas is not None:
        username, password = parse_jaas(jaas)
        merged.setdefault("sasl.username", username)
        merged.setdefault("sasl.password", password)
    return merged
