"""The package's layout is its architecture: each subpackage imports only the layers below it,
the core never imports Flower, and no module grows past what a reader holds in their head."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedvls_flwr"

#: Layers in data-flow order; a module may import its own layer and those listed before it.
LAYERS = ("config", "data", "models", "algorithms", "app", "ops", "experiments", "deploy", "cli")
#: Layers that must run without Flower installed (the core, tables and plots).
FLOWER_FREE = ("config", "data", "models", "algorithms")
#: Layers that must not load torch (validation before any heavy import; an operator's machine).
TORCH_FREE = ("config", "deploy")
MAX_LINES = 420


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1:
        return rel.stem if rel.stem in LAYERS else "cli"  # __init__/__main__/cli: the top
    return rel.parts[0]


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import in the module (also those inside functions), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write fedvls_flwr.<layer>.<module>")
    return out


def _target_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "fedvls_flwr":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "cli"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path):
    layer = _layer(path)
    for module, line in _imports(path):
        target = _target_layer(module)
        if target is not None:
            assert LAYERS.index(target) <= LAYERS.index(layer), (
                f"{path.relative_to(PACKAGE)}:{line} ({layer}) imports {module} ({target}), a layer above it"
            )
        if layer in FLOWER_FREE:
            assert module.split(".")[0] not in ("flwr", "ray"), f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        if layer in TORCH_FREE:
            assert module.split(".")[0] not in ("torch", "torchvision"), f"{path.relative_to(PACKAGE)}:{line} imports {module}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outgrows_a_readers_head(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines; split it by concern"


def test_every_subpackage_says_what_lives_there_and_what_it_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(PACKAGE)}: the docstring must say what it may import"


#: The benchmarks and scripts keep about the package's module size too (issue 32: bench_round.py had 764 lines).
MAX_SCRIPT_LINES = 450


@pytest.mark.parametrize("path", sorted([*PACKAGE.parent.glob("bench/*.py"), *PACKAGE.parent.glob("scripts/*.py")]),
                         ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_benchmark_or_script_outgrows_a_module(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_SCRIPT_LINES, f"{path.name}: {lines} lines > {MAX_SCRIPT_LINES}; split it by concern"
