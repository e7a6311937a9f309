"""Generate src/asyncconsumer/protocol/_schemas.py from Kafka's JSON message definitions.

Usage: ``python tools/gen_protocol.py [SOURCE]``.  ``SOURCE`` is a ``kafka-clients`` jar of an
Apache Kafka release (its ``common/message/*.json`` are the release's definitions, copied there from
``clients/src/main/resources/common/message/``) or a directory of the JSON files.  By default: the
``kafka-clients`` jar of the reference release, ``asyncconsumer.testing.KAFKA_VERSION`` (4.4.0), from
the test broker's jar cache (downloaded once from Maven Central, SHA-256 checked).  Only the
messages in ``MESSAGES`` (what the client speaks, and what the tests' admin calls need) are read.
The output is committed, so the package never reads the JSON files at run time.

Each schema becomes a plain dict literal:

* ``valid_versions``: ``(lo, hi)``; version ranges are ``(lo, hi)`` with
  ``hi=None`` for "N+", or ``None`` for "none".
* ``flexible_versions``: message-level range.
* ``fields``: tuple of field dicts with ``name`` (JSON name), ``key``
  (snake_case dict key), ``type`` (JSON type, e.g. ``"int32"``, ``"[]string"``,
  ``"[]FetchTopic"``, ``"EpochEndOffset"``), ``versions``,
  ``nullable_versions``, ``tag``, ``tagged_versions``, ``ignorable``,
  ``default`` and, for struct types, the nested ``fields`` (``commonStructs``
  are inlined).  ``flexible_versions`` appears on a field only when the JSON
  overrides it.

Defaults are resolved to Python values: ints, bools, str, bytes, ``None`` for
"null"; ``()`` means "empty array" and ``{}`` means "a struct whose fields all
hold their defaults" (the runtime builds fresh objects from these).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import zipfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "asyncconsumer" / "protocol" / "_schemas.py"
#: The APIs whose request and response definitions are read.
_APIS = (
    "ApiVersions", "ConsumerGroupDescribe", "ConsumerGroupHeartbeat", "CreatePartitions", "CreateTopics",
    "DeleteTopics", "DescribeCluster", "DescribeShareGroupOffsets", "Fetch", "FindCoordinator",
    "GetTelemetrySubscriptions", "Heartbeat", "InitProducerId", "JoinGroup", "LeaveGroup", "ListOffsets",
    "Metadata", "OffsetCommit", "OffsetFetch", "OffsetForLeaderEpoch", "Produce", "PushTelemetry",
    "SaslAuthenticate", "SaslHandshake", "ShareAcknowledge", "ShareFetch", "ShareGroupDescribe",
    "ShareGroupHeartbeat", "SyncGroup",
)
#: The definitions read (file names without ``.json``).
MESSAGES = (
    *(f"{api}{kind}" for api in _APIS for kind in ("Request", "Response")),
    "RequestHeader", "ResponseHeader", "ConsumerProtocolAssignment", "ConsumerProtocolSubscription",
)

INT_TYPES = {"int8", "int16", "uint16", "int32", "uint32", "int64"}
PRIMITIVES = INT_TYPES | {"bool", "float64", "uuid", "string", "bytes", "records"}

VersionRange = tuple[int, int | None] | None


def strip_comments(text: str) -> str:
    """Drop ``//`` comments that sit outside JSON strings."""
    out: list[str] = []
    for line in text.splitlines():
        in_str = False
        escaped = False
        cut = len(line)
        for i, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def parse_range(text: str | None) -> VersionRange:
    if text is None or text == "none":
        return None
    text = text.strip()
    if text.endswith("+"):
        return (int(text[:-1]), None)
    if "-" in text:
        lo, hi = text.split("-")
        return (int(lo), int(hi))
    return (int(text), int(text))


def covers(outer: VersionRange, inner: VersionRange) -> bool:
    if inner is None:
        return True
    if outer is None or outer[0] > inner[0]:
        return False
    return outer[1] is None or (inner[1] is not None and inner[1] <= outer[1])


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def resolve_default(ftype: str, raw: Any, where: str) -> Any:
    if ftype.startswith("[]"):
        if raw is not None and raw != "null":
            raise ValueError(f"{where}: arrays only support a null default")
        return None if raw == "null" else ()
    if ftype not in PRIMITIVES:
        if raw is not None and raw != "null":
            raise ValueError(f"{where}: structs only support a null default")
        return None if raw == "null" else {}
    if raw == "null":
        return None
    if ftype in INT_TYPES:
        return 0 if raw is None else int(str(raw), 0)
    if ftype == "bool":
        return raw in (True, "true")
    if ftype == "float64":
        return 0.0 if raw is None else float(raw)
    if ftype == "string":
        return "" if raw is None else str(raw)
    if ftype == "bytes":
        return b""
    if ftype == "uuid":
        return bytes(16)
    if ftype == "records":
        return None  # Java's default for records is null
    raise ValueError(f"{where}: unhandled type {ftype}")


def convert_fields(fields: list[dict[str, Any]], common: dict[str, Any], where: str) -> tuple[Any, ...]:
    out: list[dict[str, Any]] = []
    keys: set[str] = set()
    for f in fields:
        name = f["name"]
        ftype = f["type"]
        here = f"{where}.{name}"
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        field: dict[str, Any] = {
            "name": name,
            "key": snake(name),
            "type": ftype,
            "versions": parse_range(f["versions"]),
            "nullable_versions": parse_range(f.get("nullableVersions")),
            "tag": f.get("tag"),
            "tagged_versions": parse_range(f.get("taggedVersions")),
            "ignorable": bool(f.get("ignorable", False)),
            "default": resolve_default(ftype, f.get("default"), here),
        }
        if "flexibleVersions" in f:
            field["flexible_versions"] = parse_range(f["flexibleVersions"])
        if elem not in PRIMITIVES:
            sub = f.get("fields")
            if sub is None:
                if elem not in common:
                    raise ValueError(f"{here}: unknown struct type {elem}")
                sub = common[elem]["fields"]
            field["fields"] = convert_fields(sub, common, here)
        elif "fields" in f:
            raise ValueError(f"{here}: primitive type with nested fields")
        if ftype == "records" and not covers(field["nullable_versions"], field["versions"]):
            field["default"] = b""  # Java's null default cannot be written where records are not nullable
        if field["default"] is None and not covers(field["nullable_versions"], field["versions"]):
            # The runtime relies on a null default being writable in every version of the field.
            raise ValueError(f"{here}: null default but not nullable in all versions")
        if field["key"] in keys:
            raise ValueError(f"{here}: duplicate key {field['key']}")
        keys.add(field["key"])
        out.append(field)
    return tuple(out)


def convert(doc: dict[str, Any]) -> dict[str, Any]:
    common = {c["name"]: c for c in doc.get("commonStructs", [])}
    valid = parse_range(doc["validVersions"])
    if valid is None or valid[1] is None:
        raise ValueError(f"{doc['name']}: validVersions must be a closed range")
    return {
        "name": doc["name"],
        "type": doc["type"],
        "api_key": doc.get("apiKey"),
        "valid_versions": valid,
        "flexible_versions": parse_range(doc["flexibleVersions"]),
        "latest_version_unstable": bool(doc.get("latestVersionUnstable", False)),
        "fields": convert_fields(doc["fields"], common, doc["name"]),
    }


def emit_fields(fields: tuple[dict[str, Any], ...], indent: int) -> list[str]:
    """One field per line (nested fields indented below it) keeps the module readable."""
    pad = " " * indent
    out: list[str] = []
    for f in fields:
        flat = ", ".join(f"{k!r}: {v!r}" for k, v in f.items() if k != "fields")
        if "fields" in f:
            out.append(f"{pad}{{{flat}, 'fields': (")
            out.extend(emit_fields(f["fields"], indent + 4))
            out.append(f"{pad})}},")
        else:
            out.append(f"{pad}{{{flat}}},")
    return out


def read_definitions(src: pathlib.Path) -> dict[str, str]:
    """name -> JSON text of each of ``MESSAGES``, from a ``kafka-clients`` jar or a directory."""
    if src.is_dir():
        return {name: (src / f"{name}.json").read_text(encoding="utf-8") for name in MESSAGES}
    with zipfile.ZipFile(src) as jar:
        return {name: jar.read(f"common/message/{name}.json").decode("utf-8") for name in MESSAGES}


def default_source() -> pathlib.Path:
    """The reference release's ``kafka-clients`` jar (the test broker's cache; downloaded if missing)."""
    from asyncconsumer.testing.kafka import KAFKA_VERSION, kafka_libs

    return kafka_libs() / f"kafka-clients-{KAFKA_VERSION}.jar"


def generate(src: pathlib.Path) -> str:
    schemas: dict[str, Any] = {}
    texts = read_definitions(src)
    for name in sorted(texts):
        doc = json.loads(strip_comments(texts[name]))
        schemas[doc["name"]] = convert(doc)
    lines = ["SCHEMAS: dict[str, dict[str, Any]] = {"]
    for name, schema in schemas.items():
        lines.append(f"    {name!r}: {{")
        for key, value in schema.items():
            if key == "fields":
                lines.append("        'fields': (")
                lines.extend(emit_fields(value, 12))
                lines.append("        ),")
            else:
                lines.append(f"        {key!r}: {value!r},")
        lines.append("    },")
    lines.append("}")
    return (
        '"""Generated by tools/gen_protocol.py from Apache Kafka\'s JSON message definitions.\n\n'
        "Do not edit; re-run the generator.  The format is described in its docstring.\n"
        '"""\n\n'
        "from typing import Any\n\n" + "\n".join(lines) + "\n"
    )


def main() -> None:
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default_source()
    OUT.write_text(generate(src), encoding="utf-8")
    print(f"wrote {OUT} from {src}")


if __name__ == "__main__":
    main()
