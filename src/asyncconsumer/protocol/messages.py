"""Build ``construct`` structures for Kafka messages from the generated schema literals.

``struct_for(name, version)`` returns one :class:`MessageStruct` per schema and
version, built on first use and cached.  A ``MessageStruct`` parses straight
into plain dicts: every field the schema knows appears in the result, with
its default when the version (or a missing tagged field) does not carry it.
"""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Callable, Mapping
from typing import Any

from ._schemas import SCHEMAS
from .primitives import (
    BOOL,
    DECODE_ERRORS,
    ENCODE_ERRORS,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT16,
    UINT32,
    UUID,
    Array,
    Bytes,
    Fixed,
    FrameReader,
    NullableStruct,
    ProtocolDecodeError,
    ProtocolEncodeError,
    Records,
    String,
    _Base,
    read_uvarint,
    skip,
    write_uvarint,
)

Field = dict[str, Any]
VersionRange = tuple[int, int | None] | None

_FIXED: dict[str, Any] = {
    "bool": BOOL,
    "int8": INT8,
    "int16": INT16,
    "uint16": UINT16,
    "int32": INT32,
    "uint32": UINT32,
    "int64": INT64,
    "float64": FLOAT64,
    "uuid": UUID,
}


class _LocatedDecodeError(ProtocolDecodeError):
    """Already names the failing field; enclosing structs pass it through unchanged."""


class _LocatedEncodeError(ProtocolEncodeError):
    """Already names the failing field; enclosing structs pass it through unchanged."""


def in_range(versions: VersionRange, version: int) -> bool:
    return versions is not None and versions[0] <= version and (versions[1] is None or version <= versions[1])


def schema(name: str) -> dict[str, Any]:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ProtocolEncodeError(f"unknown message {name!r}") from None


class FixedRun:
    """Consecutive fixed-width number fields of a struct, packed and unpacked by one ``struct``
    (a Fetch request's six, a partition's five in a Fetch response): one call for the run, not
    three a field.  A value that does not pack, or a frame too short for the run, takes the
    fields one by one, whose own errors name the field."""

    __slots__ = ("defaults", "fields", "keys", "pack", "size", "unpack_from")

    def __init__(self, fields: list[tuple[str, Any, Any]]) -> None:
        self.fields = fields
        self.keys = tuple(key for key, _, _ in fields)
        self.defaults = tuple(default for _, _, default in fields)
        packer = struct.Struct(">" + "".join(sub.code for _, sub, _ in fields))
        self.pack, self.unpack_from, self.size = packer.pack, packer.unpack_from, packer.size


def _runs(positional: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """``positional`` with each run of two or more fixed-width numbers as one step ``("", FixedRun, None)``."""
    steps: list[tuple[str, Any, Any]] = []
    run: list[tuple[str, Any, Any]] = []
    for item in [*positional, None]:
        if item is not None and type(item[1]) is Fixed:
            run.append(item)
            continue
        steps.extend([("", FixedRun(run), None)] if len(run) > 1 else run)
        run = []
        if item is not None:
            steps.append(item)
    return steps


def is_flexible(name: str, version: int) -> bool:
    return in_range(schema(name)["flexible_versions"], version)


def default_value(field: Field) -> Any:
    """A fresh default for ``field`` (new list/dict each call, so callers may mutate it)."""
    default = field["default"]
    if default is None:
        return None
    if field["type"].startswith("[]"):
        return []
    if "fields" in field:
        return {f["key"]: default_value(f) for f in field["fields"]}
    return default


def default_factory(field: Field) -> Callable[[], Any]:
    """A maker of :func:`default_value`'s fresh defaults for ``field``, with the field's schema
    walked once: a struct's immutable defaults are copied from a template, its lists and structs
    made by their own makers (a decoded message fills such defaults for every absent field)."""
    default = field["default"]
    if default is None:
        return type(None)
    if field["type"].startswith("[]"):
        return list
    if "fields" not in field:
        return functools.partial(_same, default)
    template = {f["key"]: default_value(f) for f in field["fields"]}
    fresh = [(f["key"], default_factory(f)) for f in field["fields"] if isinstance(template[f["key"]], (list, dict))]
    if not fresh:
        return template.copy

    def make() -> dict[str, Any]:
        value = template.copy()
        for key, factory in fresh:
            value[key] = factory()
        return value

    return make


def _same(value: Any) -> Any:
    return value


def is_default(field: Field, value: Any) -> bool:
    """Whether ``value`` equals the field's default; a partial struct dict is compared field by field."""
    default = field["default"]
    if value is None or default is None:
        return value is default
    if field["type"].startswith("[]"):
        return len(value) == 0
    if "fields" in field:
        return all(is_default(f, value[f["key"]]) for f in field["fields"] if f["key"] in value)
    if field["type"] in ("bytes", "uuid"):
        value = bytes(getattr(value, "bytes", value))
    return bool(value == default)


class MessageStruct(_Base):
    """A Kafka struct (message body, header, array element or nested struct) for one version.

    Parses to a plain ``dict`` keyed by snake_case field names and builds from
    any ``Mapping`` (missing keys take their defaults).
    """

    def __init__(self, fields: tuple[Field, ...], version: int, flexible: bool, where: str) -> None:
        super().__init__()
        self.version = version
        self.flexible = flexible
        self.where = where
        self.all_keys = frozenset(f["key"] for f in fields)
        # Template holds the immutable defaults; `fill` makes fresh lists/dicts for
        # fields the wire may not carry (absent in this version, or tagged).
        self.template: dict[str, Any] = {}
        self.fill: list[tuple[str, Callable[[], Any]]] = []
        self.positional: list[tuple[str, Any, Any]] = []
        self.tagged: dict[int, tuple[str, Any]] = {}
        self.tagged_out: list[tuple[int, str, Any, Field]] = []
        self.absent: list[Field] = []
        for f in fields:
            key = f["key"]
            mutable = f["default"] is not None and ("fields" in f or f["type"].startswith("[]"))
            self.template[key] = None if mutable else f["default"]
            present = in_range(f["versions"], version)
            tagged = present and f["tag"] is not None and in_range(f["tagged_versions"], version)
            if mutable and not (present and not tagged):
                self.fill.append((key, default_factory(f)))
            if not present:
                self.absent.append(f)
                continue
            flex = in_range(f["flexible_versions"], version) if "flexible_versions" in f else flexible
            sub = field_construct(f, version, flex, f"{where}{key}")
            if tagged:
                if not flexible:
                    raise ProtocolEncodeError(f"{where}{key}: tagged field in a non-flexible version")
                self.tagged[f["tag"]] = (key, sub)
                self.tagged_out.append((f["tag"], key, sub, f))
            else:
                self.positional.append((key, sub, f["default"]))
        self.tagged_out.sort(key=lambda item: item[0])
        #: ``positional`` as the codec walks it, runs of fixed-width numbers taken at once.
        self.steps = _runs(self.positional)
        self._program: Program | None = None

    def program(self) -> Program:
        """This struct as the compiled codec walks it (speedups/codec.c ``decode_message`` and
        ``encode_message``): ``(template, steps, tagged, fill, keys, absent)``: the defaults every
        result starts from, the positional fields as ``(key, node, default)`` in wire order, the
        tagged ones as ``{tag: (key, node)}`` (None in a version that is not flexible), ``fill`` as
        :meth:`_parse` uses it, every key the struct knows, and the fields this version lacks as
        ``(key, ignorable, default)``: a body may carry one if it is ignorable or at that default
        (``_build`` drops it; the compiled encoder compares only ints, strings and empty arrays,
        and leaves any other value to ``_build``).  A node is ``(op, flags, sub)``: an ``OP_*``,
        ``F_FLEXIBLE | F_NULLABLE``, and an array's element node or a struct's program.  Made on
        first use and kept."""
        if self._program is None:
            steps = tuple((key, _node(sub), default) for key, sub, default in self.positional)
            tagged = {tag: (key, _node(sub)) for tag, (key, sub) in self.tagged.items()} if self.flexible else None
            absent = tuple((f["key"], bool(f["ignorable"]), f["default"]) for f in self.absent)
            self._program = (self.template, steps, tagged, tuple(self.fill), self.all_keys, absent)
        return self._program

    def _parse(self, stream: Any, context: Any, path: Any) -> dict[str, Any]:
        result = self.template.copy()
        key = ""
        seen: set[str] | tuple[()] = ()
        try:
            for key, sub, _default in self.steps:
                if type(sub) is FixedRun:
                    if type(stream) is FrameReader:
                        pos = stream.pos
                        end = pos + sub.size
                        if end <= stream.end:
                            stream.pos = end
                            result.update(zip(sub.keys, sub.unpack_from(stream.view, pos), strict=True))
                            continue
                    for key, field, _default in sub.fields:  # too short: the field that is missing says so
                        result[key] = field._parse(stream, context, path)
                    continue
                result[key] = sub._parse(stream, context, path)
            if self.flexible:
                key = "<tagged fields>"
                seen = self._parse_tagged(stream, context, path, result)
        except _LocatedDecodeError:
            raise
        except DECODE_ERRORS as exc:
            raise _LocatedDecodeError(f"{self.where}{key}: {exc}") from None
        for key, factory in self.fill:
            if key not in seen:
                result[key] = factory()
        return result

    def _parse_tagged(self, stream: Any, context: Any, path: Any, result: dict[str, Any]) -> set[str]:
        seen: set[str] = set()
        for _ in range(read_uvarint(stream)):
            tag = read_uvarint(stream)
            size = read_uvarint(stream)
            known = self.tagged.get(tag)
            if known is None:
                skip(stream, size)  # unknown tags are how new fields appear without a version bump
                continue
            key, sub = known
            start = stream.tell()
            result[key] = sub._parse(stream, context, path)
            used = stream.tell() - start
            if used > size:
                raise ProtocolDecodeError(f"tagged field {tag} overran its size {size}")
            skip(stream, size - used)
            seen.add(key)
        return seen

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> Any:
        if type(obj) is not dict and not isinstance(obj, Mapping):  # (the ABC check is a Python call)
            raise _LocatedEncodeError(f"{self.where or 'body'}: expected a mapping, got {type(obj).__name__}")
        if not self.all_keys.issuperset(obj):
            unknown = sorted(set(obj) - self.all_keys)
            raise _LocatedEncodeError(f"{self.where}: unknown field(s) {unknown}")
        for f in self.absent:
            key = f["key"]
            if key in obj and not f["ignorable"] and not is_default(f, obj[key]):
                raise _LocatedEncodeError(
                    f"{self.where}{key} ({f['name']}) does not exist in version {self.version} and is "
                    f"not ignorable, but has non-default value {obj[key]!r}"
                )
        key = ""
        try:
            for key, sub, default in self.steps:
                if type(sub) is FixedRun:
                    try:
                        data = sub.pack(*map(obj.get, sub.keys, sub.defaults))
                    except struct.error:  # field by field: the one that does not pack raises, named
                        for key, field, default in sub.fields:
                            field._build(obj.get(key, default), stream, context, path)
                        raise  # pragma: no cover  (unreachable: one of them raised)
                    stream.write(data)
                    continue
                sub._build(obj.get(key, default), stream, context, path)
            if self.flexible:
                entries: list[tuple[int, bytes]] = []
                for tag, key, sub, f in self.tagged_out:
                    if key in obj and not is_default(f, obj[key]):
                        buf = io.BytesIO()
                        sub._build(obj[key], buf, context, path)
                        entries.append((tag, buf.getvalue()))
                write_uvarint(stream, len(entries))
                for tag, data in entries:
                    write_uvarint(stream, tag)
                    write_uvarint(stream, len(data))
                    stream.write(data)
        except _LocatedEncodeError:
            raise
        except ENCODE_ERRORS as exc:
            raise _LocatedEncodeError(f"{self.where}{key}: {exc}") from None
        return obj


# The compiled codec's ops and flags (speedups/codec.c has the same numbers; the tests of
# tests/protocol/test_codec_compiled.py fail on any mismatch).
OP_BOOL, OP_INT8, OP_INT16, OP_INT32, OP_INT64, OP_UINT16, OP_UINT32, OP_FLOAT64, OP_UUID = range(9)
OP_STRING, OP_BYTES, OP_RECORDS, OP_ARRAY, OP_STRUCT, OP_NULLABLE_STRUCT = range(9, 15)
F_FLEXIBLE, F_NULLABLE = 1, 2
_FIXED_OPS = {"b": OP_INT8, "h": OP_INT16, "l": OP_INT32, "q": OP_INT64, "H": OP_UINT16, "L": OP_UINT32,
              "d": OP_FLOAT64}
_LENGTH_OPS = {String: OP_STRING, Bytes: OP_BYTES, Records: OP_RECORDS}
#: A struct's program and a field's node (:meth:`MessageStruct.program`).
Program = tuple[dict[str, Any], tuple[tuple[str, Any, Any], ...], dict[int, tuple[str, Any]] | None,
                tuple[tuple[str, Callable[[], Any]], ...], frozenset[str], tuple[tuple[str, bool, Any], ...]]
Node = tuple[int, int, Any]


def _node(sub: Any) -> Node:
    """The compiled codec's node for one field's construct (``MessageStruct.program``)."""
    kind = type(sub)
    if sub is BOOL:
        return (OP_BOOL, 0, None)
    if sub is UUID:
        return (OP_UUID, 0, None)
    if kind is Fixed:
        return (_FIXED_OPS[sub.code], 0, None)
    if kind is MessageStruct:
        return (OP_STRUCT, 0, sub.program())
    if kind is NullableStruct:
        return (OP_NULLABLE_STRUCT, 0, sub.subcon.program())
    flags = (F_FLEXIBLE if sub.flexible else 0) | (F_NULLABLE if sub.nullable else 0)
    if kind is Array:
        return (OP_ARRAY, flags, _node(sub.subcon))
    return (_LENGTH_OPS[kind], flags, None)


def field_construct(field: Field, version: int, flexible: bool, where: str) -> Any:
    """The construct for one field's value in ``version``."""
    ftype: str = field["type"]
    nullable = in_range(field["nullable_versions"], version)
    if ftype.startswith("[]"):
        elem = ftype[2:]
        if "fields" in field:
            sub: Any = MessageStruct(field["fields"], version, flexible, f"{where}[].")
        else:
            sub = _scalar(elem, flexible, False)
        return Array(sub, flexible, nullable)
    if "fields" in field:
        struct = MessageStruct(field["fields"], version, flexible, f"{where}.")
        return NullableStruct(struct) if nullable else struct
    return _scalar(ftype, flexible, nullable)


def _scalar(ftype: str, flexible: bool, nullable: bool) -> Any:
    if ftype == "string":
        return String(flexible, nullable)
    if ftype == "bytes":
        return Bytes(flexible, nullable)
    if ftype == "records":
        return Records(flexible, nullable)
    try:
        return _FIXED[ftype]
    except KeyError:
        raise ProtocolEncodeError(f"unsupported field type {ftype!r}") from None


@functools.cache
def struct_for(name: str, version: int) -> MessageStruct:
    """The cached top-level struct for schema ``name`` (e.g. ``"FetchResponse"``) at ``version``."""
    s = schema(name)
    lo, hi = s["valid_versions"]
    if not lo <= version <= hi:
        raise ProtocolEncodeError(f"{name} has no version {version} (valid: {lo}-{hi})")
    return MessageStruct(s["fields"], version, in_range(s["flexible_versions"], version), "")
