"""The names the C extension reads on the package's Python objects, checked against the classes.

speedups/module.c lists every attribute (or keyword) name the extension looks up, with the class it
looks it up on; speedups/ready.c lays out a chunk's fields (``ChunkBase``), which app/collector.py's
``Chunk`` uses.  A rename on the Python side would otherwise show only as a failure in builds with
the extension; these tests read the C sources, so they fail in every build, the pure-Python one
included.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import types

import pytest
from support.paths import ROOT

SPEEDUPS = ROOT / "speedups"

#: ``{&s_magic, "magic", "asyncconsumer.protocol.records:RecordBatch"},`` in module.c's table.
ENTRY = re.compile(r'\{&s_\w+, "(\w+)", "([\w.]+):(\w+)(\(\))?"\}')
#: Names given to the C API as string literals, outside the table.
LITERAL = re.compile(r'Py\w*(?:AttrString|InternFromString)\([^")]*"(\w+)"')


def table() -> list[tuple[str, str, str, bool]]:
    """module.c's table: (name, module, class, is a constructor keyword)."""
    source = (SPEEDUPS / "module.c").read_text()
    body = source[source.index("python_names[] = {"):]
    body = body[: body.index("};")]
    return [(m[1], m[2], m[3], bool(m[4])) for m in ENTRY.finditer(body)]


def chunk_members() -> list[str]:
    """The members of ``ChunkBase`` in ready.c's ``chunk_members[]``."""
    source = (SPEEDUPS / "ready.c").read_text()
    body = source[source.index("chunk_members[] = {"):]
    body = body[: body.index("};")]
    return re.findall(r'\{"(\w+)", T_\w+, offsetof\(ChunkBase, \1\)', body)


def assigned_on_self(cls: type, name: str) -> bool:
    """``self.<name> = ...`` in a method of ``cls`` or of a class it inherits from."""
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # builtins
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                for part in ast.walk(target):
                    if (isinstance(part, ast.Attribute) and part.attr == name and isinstance(part.value, ast.Name)
                            and part.value.id == "self"):
                        return True
    return False


def test_the_table_lists_what_the_extension_reads() -> None:
    entries = table()
    assert len(entries) >= 20, "module.c's python_names[] was not read"
    names = {name for name, *_ in entries}
    for path in sorted(SPEEDUPS.glob("*.c")):
        for literal in LITERAL.findall(path.read_text()):
            # Python's own names (``__doc__``) are no class of ours to rename.
            assert literal in names or (literal.startswith("__") and literal.endswith("__")), (
                f"{path.name} reads {literal!r}: add it to module.c's python_names[] with its class")
    interned = set(re.findall(r"\bs_(\w+)\b", (SPEEDUPS / "speedups.h").read_text()))
    listed = set(re.findall(r"\{&s_(\w+),", (SPEEDUPS / "module.c").read_text()))
    assert interned == listed, "every interned name (speedups.h) is in module.c's table, and only those"


def test_the_compiled_module_exports_the_same_table() -> None:
    try:
        speedups = importlib.import_module("asyncconsumer._speedups")
    except ImportError:
        pytest.skip("asyncconsumer._speedups is not built: the sources are checked by the other tests")
    exported = [(owner, name) for owner, name in speedups.PYTHON_NAMES]
    assert exported == [(f"{module}:{cls}{'()' if keyword else ''}", name) for name, module, cls, keyword in table()]


@pytest.mark.parametrize(("name", "module", "cls", "keyword"), table(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_name_the_extension_reads_is_the_classs_own(name: str, module: str, cls: str, keyword: bool) -> None:
    owner = getattr(importlib.import_module(module), cls)
    if keyword:
        assert name in inspect.signature(owner).parameters, f"{cls}() takes no keyword {name!r} (module.c reads it)"
    else:
        assert hasattr(owner, name) or assigned_on_self(owner, name), (
            f"{cls} has no attribute {name!r} (speedups/module.c reads it: rename it there too)")


def test_the_partition_state_fields_read_by_slot_are_slots() -> None:
    """RecordStream reads and writes these fields at their slots' offsets (ready.c's
    find_slots): each must stay a plain slot of PartitionState, not a property."""
    from asyncconsumer.managers.subscription import PartitionState

    for name, _, cls, _ in table():
        if cls == "PartitionState":
            assert isinstance(inspect.getattr_static(PartitionState, name), types.MemberDescriptorType), name


def test_a_chunks_fields_are_the_compiled_chunks_members() -> None:
    from asyncconsumer.app.collector import CHUNK_FIELDS, Chunk
    from asyncconsumer.app.iterators import ChunkBase

    assert sorted(chunk_members()) == sorted(CHUNK_FIELDS) == sorted(Chunk.__annotations__)
    if ChunkBase is not object:  # the extension is in use: Chunk's fields are ChunkBase's members
        members = [n for n, v in vars(ChunkBase).items() if isinstance(v, types.MemberDescriptorType)]
        assert sorted(members) == sorted(CHUNK_FIELDS) and Chunk.__slots__ == ()
