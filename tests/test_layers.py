"""The house rules, checked on the source of src/asyncconsumer (docs/architecture.md).

The layer rule, on the import graph:

    base (errors, structs, listener, _args)  <  protocol  <  managers (+ assignors)
        <  engine (+ config)  <  app (app/, consumer, the package)
        <  integrations (spark, testing, demo, cli, schema_registry)

A module may import its own layer and the layers below, never one above, and
no modules import each other (directly or round a loop), except the generated
error classes and ``errors``.  Every import counts, also one inside a function
or under ``TYPE_CHECKING``: hiding an import does not change the design.

The integrations (``spark``, ``cli``, ``testing``, ``demo``, ``schema_registry``) are the package's
first users: they use only public names, the package's or a documented module's, never a name
private to another package (``_version``, ``Consumer._next_arrow_batch``).

Errors are named, not numbered: no request manager compares a broker error code with a number of
its own (it uses the generated sets, ``errors.COORDINATOR_CODES`` ..., or a class's ``code``).
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable, Mapping

import pytest

from asyncconsumer import errors

SRC = pathlib.Path(__file__).parent.parent / "src" / "asyncconsumer"
LAYERS = ("base", "protocol", "managers", "engine", "app", "integrations")
#: The first component under ``asyncconsumer`` -> its layer ("" is the package itself).
PLACES = {
    "_version": "base", "errors": "base", "_broker_errors": "base", "structs": "base", "listener": "base",
    "_args": "base", "metrics": "base", "_logging": "base", "_runtime": "base", "java_properties": "base",
    "tls_stores": "base",
    "protocol": "protocol",
    "managers": "managers", "assignors": "managers",
    "engine": "engine", "config": "engine", "oauth": "engine",
    "app": "app", "consumer": "app", "share": "app", "streams": "app", "": "app", "otel": "app",
    "prometheus": "app",
    "spark": "integrations", "testing": "integrations", "demo": "integrations", "cli": "integrations",
    "__main__": "integrations", "schema_registry": "integrations",
}
#: The one cycle allowed: errors.py re-exports the generated classes, which subclass its base class.
ALLOWED_CYCLES = [frozenset({"asyncconsumer.errors", "asyncconsumer._broker_errors"})]


def layer(module: str) -> int:
    head = module.split(".")[1] if "." in module else ""
    assert head in PLACES, f"{module} is in no layer: add it to PLACES in tests/test_layers.py"
    return LAYERS.index(PLACES[head])


def source_modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """module name -> (file, is a package)."""
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the asyncconsumer modules it imports (the longest existing name of each import)."""
    modules = source_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        here = module.split(".") if package else module.split(".")[:-1]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names if alias.name.startswith("asyncconsumer"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: "." is this package, ".." its parent, ...
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                if not base.startswith("asyncconsumer"):
                    continue
                # "from package import name" reads the package's namespace, so it depends on the
                # package's __init__ (a module imported by that __init__ closes a loop), and on the
                # module when the name is one.
                targets.add(resolve(base))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        targets.add(sub)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def upward_imports(graph: Mapping[str, set[str]], layer_of: Callable[[str], int]) -> list[str]:
    return sorted(
        f"{src} ({LAYERS[layer_of(src)]}) imports {dst} ({LAYERS[layer_of(dst)]})"
        for src, targets in graph.items()
        for dst in targets
        if layer_of(dst) > layer_of(src)
    )


def cycles(graph: Mapping[str, set[str]], allowed: list[frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), less the allowed ones."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 and frozenset(component) not in allowed:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# -- the checker can fail --------------------------------------------------------------------------


def fake_layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_checker_finds_an_upward_import() -> None:
    graph = {"managers.fetch": {"engine.loop", "protocol.records"}, "engine.loop": {"managers.fetch"}}
    assert upward_imports(graph, fake_layer) == ["managers.fetch (managers) imports engine.loop (engine)"]


def test_checker_finds_cycles_but_not_the_allowed_one() -> None:
    graph = {
        "a": {"b"}, "b": {"c"}, "c": {"a"},  # a loop of three
        "errors": {"generated"}, "generated": {"errors"},  # allowed
        "d": {"a"},
    }
    assert cycles(graph, [frozenset({"errors", "generated"})]) == [["a", "b", "c"]]
    assert cycles(graph, []) == [["a", "b", "c"], ["errors", "generated"]]


def test_from_a_package_import_depends_on_the_package() -> None:
    """``from . import _probe`` in testing/kafka.py read testing/__init__.py, which imports kafka.py:
    a loop, although the name it took is a module of its own."""
    graph = import_graph()
    assert "asyncconsumer.testing" in graph["asyncconsumer.testing.pytest_plugin"]  # from . import KafkaBroker
    assert "asyncconsumer.engine" in graph["asyncconsumer.engine.core"]  # from . import sasl
    assert "asyncconsumer.engine.sasl" in graph["asyncconsumer.engine.core"]


def test_the_graph_sees_hidden_imports() -> None:
    """An import inside a function counts: a real edge of this package, checked in the graph."""
    graph = import_graph()
    assert "asyncconsumer.spark.source" in graph["asyncconsumer.spark.pipeline"]  # imported inside run_pipeline()
    assert "asyncconsumer.managers.fetch_buffer" in graph["asyncconsumer.app.collector"]


# -- the package -----------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    for module in source_modules():
        layer(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(import_graph(), layer) == []


def test_no_import_cycles_but_the_generated_errors() -> None:
    assert cycles(import_graph(), ALLOWED_CYCLES) == []


@pytest.mark.parametrize("allowed", ALLOWED_CYCLES)
def test_the_allowed_cycle_is_still_there(allowed: frozenset[str]) -> None:
    """An exception nobody needs any more goes."""
    graph = import_graph()
    assert any(set(c) == allowed for c in cycles(graph, []))


# -- errors are named, not numbered ------------------------------------------------------------------

#: Kafka's names of the error codes (``UNKNOWN_MEMBER_ID``, ...): a constant by such a name is a copy.
ERROR_NAMES = frozenset(cls.error_name for cls in errors.ALL_BROKER_ERRORS)


def _literal_ints(node: ast.expr) -> list[int]:
    """The integers of ``node`` if it is an integer literal or a literal collection of them
    (``25``, ``-1``, ``(22, 25)``, ``{14, 15}``, ``frozenset({14, 15})``), else none."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return [i for arg in node.args for i in _literal_ints(arg)]
    if isinstance(node, ast.Tuple | ast.Set | ast.List):
        return [i for element in node.elts for i in _literal_ints(element)]
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return []
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def error_code_literals(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` holds a broker error code as a number: compared with something named
    ``*code*`` (0, no error, is fine), or bound to a name Kafka gives an error code or to a
    ``*_CODES`` set."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any("code" in ast.unparse(o).lower() for o in operands) and any(
                i != 0 for o in operands for i in _literal_ints(o)
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = [t.id for t in targets if isinstance(t, ast.Name)]
            if any(n in ERROR_NAMES or n.endswith("_CODES") for n in named) and _literal_ints(node.value):
                found.append((node.lineno, ast.unparse(node)))
    return [f"{filename}:{line}: {text}" for line, text in sorted(found)]


def test_checker_finds_error_codes_as_numbers() -> None:
    source = """
UNKNOWN_MEMBER_ID = 25
COORDINATOR_CODES = frozenset({14, 15, 16})
if code == 27 or body["error_code"] in (3, 5) or getattr(e, "code", None) in {122, 123}:
    pass
if code == -1:
    pass
"""
    assert [line.split(":")[1] for line in error_code_literals(source)] == ["2", "3", "4", "4", "4", "6"]


def test_checker_passes_names_and_other_numbers() -> None:
    source = """
GAP, ACCEPT, RELEASE = 0, 1, 2
LEAVE_EPOCH = -1
if code == 0 or code in COORDINATOR_CODES or code == UnknownMemberIdError.code:
    pass
if epoch == 25 or kind in (1, 2):
    pass
"""
    assert error_code_literals(source) == []


def test_no_manager_numbers_an_error_code() -> None:
    found = [
        hit
        for path in sorted((SRC / "managers").rglob("*.py"))
        for hit in error_code_literals(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert found == []


# -- the integrations use public names only -----------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(module: str, source: str, package: bool = False) -> list[str]:
    """The names ``module`` takes that are private to another package: an import of a private
    module or name from outside its own package, or an attribute ``_name`` of anything but
    ``self``/``cls`` (whose class it cannot know)."""
    parts = module.split(".")
    here = parts if package else parts[:-1]
    own = ".".join(parts[:2])  # asyncconsumer.spark, asyncconsumer.cli, ...
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            if isinstance(node, ast.Import):
                imported = [(alias.name, "") for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                imported = [(base, alias.name) for alias in node.names]
            for target, name in imported:
                if not target.startswith("asyncconsumer") or target == own or target.startswith(own + "."):
                    continue
                if any(_private(p) for p in target.split(".")) or _private(name):
                    found.append((node.lineno, ast.unparse(node)))
    return [f"{module}:{line}: {text}" for line, text in sorted(found)]


def test_checker_finds_a_reach_into_private_names() -> None:
    source = """
from .._version import __version__
from ..consumer import Consumer, _check_partitions
from ._format import TextFormat
import asyncconsumer._args
batch = await self._consumer._next_arrow_batch()
self._started = True
"""
    found = private_reaches("asyncconsumer.cli.run", source)
    assert [line.split(":")[1] for line in found] == ["2", "3", "5", "6"]


def test_the_integrations_use_public_names_only() -> None:
    found = [
        hit
        for module, (path, package) in source_modules().items()
        if module != "asyncconsumer" and PLACES[module.split(".")[1]] == "integrations"
        for hit in private_reaches(module, path.read_text(), package)
    ]
    assert found == []
