"""The package's layout is its architecture: each floor (subpackage) imports only the floors
its row of BOUNDARIES names and never the heavyweights it lists, and no module imports, when
it is imported, a module that imports it back, however far round."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedvls_flwr"

#: The floors in data-flow order; ``cli`` is the top: fedvls_flwr/__init__.py, __main__.py and cli.py.
FLOORS = ("config", "data", "models", "algorithms", "app", "ops", "experiments", "deploy", "cli")

#: A floor's ``never`` that admits no third-party package at all, only the standard library.
ANY_THIRD_PARTY = "any third-party package"
FLOWER_AND_RAY = ("flwr", "ray")
TORCH = ("torch", "torchvision")


class Rule(NamedTuple):
    may_import: tuple[str, ...]  #: the floors of fedvls_flwr it may import besides its own
    never: tuple[str, ...]  #: the third-party packages it must never import


#: floor -> what it may import. The same as each subpackage's __init__ docstring says.
BOUNDARIES: dict[str, Rule] = {
    # the ServerApp validates a run before any heavy import
    "config": Rule((), (ANY_THIRD_PARTY,)),
    # the core: runs, and is tested, without Flower or Ray
    "data": Rule(("config",), FLOWER_AND_RAY),
    "models": Rule(("config",), FLOWER_AND_RAY),
    "algorithms": Rule(("config", "data", "models"), FLOWER_AND_RAY),
    # the Flower side
    "app": Rule(("config", "data", "models", "algorithms"), ()),
    # operating Flower and Ray from outside the apps (the in-process engine drives app)
    "ops": Rule(("config", "app"), ()),
    # check's dry run builds the data, model and training parts; the rest reads run folders
    "experiments": Rule(("config", "data", "models", "algorithms", "app", "ops"), FLOWER_AND_RAY),
    # an operator's machine needs no torch
    "deploy": Rule(("config", "data", "app", "ops", "experiments"), TORCH),
    # the ``fedvls`` command dispatches to every floor's commands
    "cli": Rule(FLOORS[:-1], ()),
}

#: Modules whose rule is stricter than their floor's: ``fedvls report`` loads neither torch nor Flower.
STRICTER: dict[str, tuple[str, ...]] = {
    f"experiments.{name}": (*TORCH, *FLOWER_AND_RAY)
    for name in ("report", "runs", "tables", "plots", "diagnostics_table", "stages_table")
}

#: Import cycles between modules (top-level imports) the test tolerates, each as its modules in
#: import order; it fails on any other cycle, and on one of these that is gone. None.
KNOWN_CYCLES: list[tuple[str, ...]] = []


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _dotted(path: Path) -> str:
    """fedvls_flwr/app/server.py -> app.server; fedvls_flwr/data/__init__.py -> data."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_spec(dotted: str) -> bool:
    """A part's spec: ``algorithms/**/<module>_spec.py``, beside the implementation it declares."""
    return dotted.startswith("algorithms.") and dotted.endswith("_spec")


def _floor(dotted: str) -> str:
    """The floor a module belongs to: its subpackage's, but a part's spec belongs to config. The
    registry (config) lists the specs, and the ServerApp validates a run with them before torch
    is imported, so a spec keeps config's rule wherever it lives: the standard library and config
    only (specs import each other for a shared setting). The package that holds it must import
    nothing heavy in its ``__init__`` (the import-time check below sees it)."""
    if is_spec(dotted):
        return "config"
    first = dotted.split(".")[0]
    return first if first in FLOORS else "cli"


def _rule(dotted: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    rule = BOUNDARIES[_floor(dotted)]
    return rule.may_import, rule.never + STRICTER.get(dotted, ())


def _import_nodes(path: Path, *, top_level_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The module's import statements; ``top_level_only``: those that run when the module is
    imported (not inside a function, not under ``if TYPE_CHECKING:``)."""
    def walk(nodes: list[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            elif top_level_only and isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        yield from walk([c for c in children if isinstance(c, ast.AST)])
    tree = ast.parse(path.read_text())
    if top_level_only:
        yield from walk(list(tree.body))
    else:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(path: Path, *, top_level_only: bool = False) -> list[tuple[str, int]]:
    """(module, line) of every absolute import; ``from pkg import mod`` gives pkg.mod where that is a module."""
    out = []
    for node in _import_nodes(path, top_level_only=top_level_only):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
            continue
        if node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write fedvls_flwr.<floor>.<module>")
        assert node.module is not None
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            out.append((sub if sub in _PACKAGE_MODULES else node.module, node.lineno))
    return out


_PACKAGE_MODULES = {f"fedvls_flwr.{_dotted(p)}".rstrip(".") for p in _modules()} | {"fedvls_flwr"}


def _own(module: str) -> str | None:
    """fedvls_flwr.app.server -> app.server; None for any other package."""
    if module == "fedvls_flwr":
        return ""
    return module.removeprefix("fedvls_flwr.") if module.startswith("fedvls_flwr.") else None


def test_the_floors_form_a_stack():
    assert set(BOUNDARIES) == set(FLOORS)
    for floor, rule in BOUNDARIES.items():
        below = FLOORS[:FLOORS.index(floor)]
        assert set(rule.may_import) <= set(below), f"{floor} may import a floor above it: {set(rule.may_import) - set(below)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_import_keeps_to_its_floors_boundaries(path):
    dotted = _dotted(path)
    floor = _floor(dotted)
    may_import, never = _rule(dotted)
    where = f"{path.relative_to(PACKAGE.parent)}"
    for module, line in _imported(path):
        own = _own(module)
        if own is not None:
            target = _floor(own) if own else "cli"
            assert target == floor or target in may_import, (
                f"{where}:{line} imports {module}: {floor} may import only "
                f"{', '.join((floor, *may_import))} (tests/test_layout.py BOUNDARIES)")
            continue
        top = module.split(".")[0]
        third_party = top not in sys.stdlib_module_names
        assert top not in never and not (third_party and ANY_THIRD_PARTY in never), (
            f"{where}:{line} imports {module}: {dotted or 'fedvls_flwr'} must never import "
            f"{', '.join(never)} (tests/test_layout.py BOUNDARIES/STRICTER)")


#: What each promise of "never" covers at import time too: the modules of these groups, imported
#: one by one into a fresh interpreter, load none of the packages their rule bans.
_IMPORT_TIME = {
    "config": [_dotted(p) for p in _modules() if _floor(_dotted(p)) == "config"],
    "core": [_dotted(p) for p in _modules() if _floor(_dotted(p)) in ("data", "models", "algorithms")],
    "deploy": [_dotted(p) for p in _modules() if _floor(_dotted(p)) == "deploy"],
    "report": sorted(STRICTER),
}
_PROBE = """
import importlib, json, sys
found = {}
for name, never in json.loads(sys.argv[1]):
    before = set(sys.modules)
    importlib.import_module(name)
    loaded = {m.split(".")[0] for m in set(sys.modules) - before}
    stdlib = set(sys.stdlib_module_names) | {"fedvls_flwr"}
    bad = sorted(m for m in loaded if m in never or ("*" in never and m not in stdlib and not m.startswith("_")))
    if bad:
        found[name] = bad
print(json.dumps(found))
"""


@pytest.mark.parametrize("group", sorted(_IMPORT_TIME))
def test_no_module_loads_what_its_floor_must_never_import(group):
    todo = []
    for dotted in _IMPORT_TIME[group]:
        never = ["*" if n == ANY_THIRD_PARTY else n for n in _rule(dotted)[1]]
        todo.append((f"fedvls_flwr.{dotted}".rstrip("."), never))
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(todo)], capture_output=True, text=True,
                         cwd=PACKAGE.parent, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {}, f"importing these (or what they import) loads what their rule bans: {out.stdout}"


def _import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports when it is imported (top level, not TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in _modules():
        edges = {_own(m) for m, _ in _imported(path, top_level_only=True)}
        graph[_dotted(path)] = {e for e in edges if e}  # "" is the package's empty __init__
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """One cycle through each strongly connected component of more than one module (Tarjan),
    starting at its alphabetically first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> tuple[str, ...]:
    start = min(component)
    paths = [[start]]
    while paths:  # breadth first: the shortest way back to the start
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & component):
            if w == start:
                return tuple(path)
            if w not in path:
                paths.append([*path, w])
    raise AssertionError(f"no cycle in {component}")


def test_no_import_cycles_between_modules():
    def shown(cycle: tuple[str, ...]) -> str:
        return " -> ".join((*cycle, cycle[0]))

    found = _cycles(_import_graph())
    known = {frozenset(c) for c in KNOWN_CYCLES}
    new = [c for c in found if frozenset(c) not in known]
    gone = [c for c in KNOWN_CYCLES if frozenset(c) not in {frozenset(f) for f in found}]
    assert not new, "import cycles (top-level imports): " + "; ".join(map(shown, new))
    assert not gone, "these cycles are gone: delete them from KNOWN_CYCLES: " + "; ".join(map(shown, gone))


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [("a", "b", "c"), ("e",)]


def _floors_named(text: str) -> set[str]:
    return set(re.findall(r"``(\w+)(?:\.\w+)*``", text)) & set(FLOORS)


_SHOWN = {"flwr": "Flower", "ray": "Ray", "torch": "torch", "torchvision": "torch", ANY_THIRD_PARTY: "only the standard library"}


@pytest.mark.parametrize("floor", [f for f in FLOORS if (PACKAGE / f / "__init__.py").is_file()])
def test_every_subpackage_docstring_says_what_it_may_import_as_the_table_does(floor):
    """The docstring's "Imports ..." sentence names the floors of BOUNDARIES (before any "never"),
    and names the packages it must never import."""
    init = PACKAGE / floor / "__init__.py"
    doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
    assert "Imports " in doc, f"{init.relative_to(PACKAGE)}: the docstring must say what it may import"
    imports = doc[doc.index("Imports "):]
    allowed = re.split(r"\.(?: |$)", imports)[0].split("never")[0]  # the sentence, up to any "never"
    rule = BOUNDARIES[floor]
    assert _floors_named(allowed) == set(rule.may_import), (
        f"{init.relative_to(PACKAGE)} says it imports {sorted(_floors_named(allowed))}; "
        f"BOUNDARIES says {sorted(rule.may_import)}")
    for package in rule.never:
        assert _SHOWN[package] in imports, f"{init.relative_to(PACKAGE)} does not say it never imports {package}"
