"""The package's layers (docs/architecture.md, "Layers"): every import, lazy and type-only ones included, points
down (or to a neighbour in its own layer), and no two modules import each other at run time, directly or through
others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "inferscale"

# Module (or package) -> layer; the longest matching prefix wins. Keep in step with docs/architecture.md.
LAYERS: dict[str, int] = {
    "inferscale.errors": 0,
    "inferscale.atomic": 0,
    "inferscale.storable": 0,
    "inferscale.json_text": 0,
    "inferscale.scope": 0,
    "inferscale.filters": 0,
    "inferscale.conversation": 0,
    "inferscale.error_codes": 0,
    "inferscale.memory_ids": 0,
    "inferscale.formats": 0,
    "inferscale.validation_text": 0,
    "inferscale.terminal_text": 0,
    "inferscale.model_load": 0,
    "inferscale.http_retry": 0,
    "inferscale.devices": 0,
    "inferscale.worker_threads": 0,
    "inferscale.control_tokens": 0,
    "inferscale.kept_search": 0,
    "inferscale.kv": 1,
    "inferscale.config": 2,
    "inferscale.mem0_config": 2,
    "inferscale.models": 3,
    "inferscale.storage": 3,
    "inferscale.retrieval": 3,
    "inferscale.memory": 3,
    "inferscale.engines": 4,
    "inferscale.fact_kv": 5,
    "inferscale.encoding_layout": 5,
    "inferscale.chains": 5,
    "inferscale.new_memories": 5,
    "inferscale.steps": 5,
    "inferscale.derived": 5,
    "inferscale.encode_queue": 5,
    "inferscale.reconcile": 5,
    "inferscale.kv_prepare": 5,
    "inferscale.kv_prune": 5,
    "inferscale.arguments": 6,
    "inferscale.mem0_import": 6,
    "inferscale.mem0_history": 6,
    "inferscale.write_back": 6,
    "inferscale.chat_request": 6,
    "inferscale.results": 6,
    "inferscale.types": 6,
    "inferscale.client_core": 6,
    "inferscale.client": 6,
    "inferscale.async_client": 6,
    "inferscale.remote": 6,
    "inferscale": 6,  # the package's own __init__: the public names
    "inferscale.server": 7,
    "inferscale.bench": 7,
    "inferscale.eval": 7,
    "inferscale.demo": 7,
    "inferscale.cli": 7,
    "inferscale.cli_options": 7,
    "inferscale.commands": 7,
    "inferscale.apps_extra": 7,
    "inferscale.serve_cli": 7,
}

# The resource layer's packages are peers that do not import each other, except these (source, target) pairs; in
# every other layer, modules may use their neighbours.
PEER_LAYER = 3
SIDEWAYS = {("inferscale.retrieval", "inferscale.models")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(nodes: list[ast.stmt], typing_only: bool, out: dict[str, set[str]]) -> None:
    """Collect imported inferscale modules into ``out["run"]`` or, under ``if TYPE_CHECKING:``, ``out["typing"]``."""
    for node in nodes:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            _targets(node.body, True, out)
            _targets(node.orelse, typing_only, out)
            continue
        for child in ast.walk(node):
            names: list[str] = []
            if isinstance(child, ast.ImportFrom) and child.level:
                raise AssertionError(f"relative import at line {child.lineno}: write it absolute, for this check")
            if isinstance(child, ast.ImportFrom) and child.module:
                names = [child.module]
            elif isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            out["typing" if typing_only else "run"].update(n for n in names if n.startswith("inferscale"))


def _imports(runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> the inferscale modules it imports anywhere in its code (function bodies included); with
    ``runtime_only``, leaving out imports made only for type checking."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found: dict[str, set[str]] = {"run": set(), "typing": set()}
        _targets(ast.parse(path.read_text(encoding="utf-8")).body, False, found)
        graph[_module_name(path)] = found["run"] if runtime_only else found["run"] | found["typing"]
    return graph


def _owner(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def test_every_module_has_a_layer() -> None:
    unmapped = [m for m in _imports() if _owner(m) == "inferscale" and m != "inferscale"]
    assert unmapped == [], f"add these modules to LAYERS and to docs/architecture.md: {unmapped}"


def test_imports_never_point_up_or_across_peers() -> None:
    wrong: list[str] = []
    for module, targets in _imports().items():
        source = _owner(module)
        if source == "inferscale":
            continue  # the package root re-exports the public names of every layer, lazily
        for target in targets:
            owner = _owner(target)
            if owner == source:
                continue
            up = LAYERS[owner] > LAYERS[source]
            across = LAYERS[owner] == LAYERS[source] == PEER_LAYER and (source, owner) not in SIDEWAYS
            if up or across:
                wrong.append(f"{module} (layer {LAYERS[source]}) imports {target} (layer {LAYERS[owner]})")
    assert wrong == []


def test_no_import_cycle_between_modules() -> None:
    graph = _imports(runtime_only=True)
    modules = set(graph)
    # An import of a package names its __init__ module; drop edges into a module's own package root (the
    # re-exports a package's __init__ makes of its submodules are not a cycle of code).
    edges = {m: {t for t in ts if t in modules and not m.startswith(t + ".")} for m, ts in graph.items()}
    edges = {m: {t for t in ts if t != m} for m, ts in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
