"""The package layers of docs/architecture.md, checked on every import of every module.

Walks the AST of each module (imports inside functions count too: a lazy import does not
make an upward dependency acceptable) and fails on an import that points up a layer, on
an import between two role packages, and on any import cycle between our modules.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coevo", "evidence", "proposer", "solver")

# (module prefix, layer); the longest matching prefix wins. Imports only point down
# (to a lower layer) or stay inside the same package.
LAYERS = [
    ("coevo.core", 0),  # config, shared types, GRPO math, io, answer scoring, stats
    ("evidence", 1), ("proposer", 1), ("solver", 1),  # role packages: import core only
    ("coevo.train", 2),  # policy, models, engines, checkpoint
    ("coevo.orchestrate", 3),  # actors, loop, stack, records, outputs
    ("coevo.evaluate", 4),  # eval harness and metrics, run inspection
    ("coevo", 5),  # thin command-line entry points: run, solve, eval, inspect
]
ROLES = {"evidence", "proposer", "solver"}


def layer_of(module: str) -> tuple[str, int]:
    """(layer name, rank) of a dotted module name."""
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return best, dict(LAYERS)[best]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Our modules that `path` imports anywhere in its body (module-level or nested)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod when that is a module of ours.
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def import_graph() -> nx.DiGraph:
    modules = our_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for dep in imported_modules(path, set(modules)):
            # A package's __init__ is imported on the way to any of its modules; not an edge.
            if dep != name and not name.startswith(dep + "."):
                graph.add_edge(name, dep)
    return graph


def layer_violations(graph: nx.DiGraph) -> list[str]:
    bad = []
    for src, dst in graph.edges:
        (src_layer, src_rank), (dst_layer, dst_rank) = layer_of(src), layer_of(dst)
        if dst_rank > src_rank:
            bad.append(f"{src} ({src_layer}) imports {dst} ({dst_layer}): upward")
        elif src_layer in ROLES and dst_layer in ROLES and src_layer != dst_layer:
            bad.append(f"{src} imports {dst}: role packages import only coevo.core")
    return sorted(bad)


def test_every_module_is_in_a_layer() -> None:
    assert our_modules(), "no modules found"
    for name in our_modules():
        assert layer_of(name)


def test_imports_only_point_down() -> None:
    assert layer_violations(import_graph()) == []


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"import cycles: {cycles}"


def test_the_train_layer_imports_no_role_package() -> None:
    """coevo.train serves every role alike: what it needs of a role's config is derived in coevo.core."""
    graph = import_graph()
    reaching = sorted(f"{src} imports {dst}" for src, dst in graph.edges
                      if layer_of(src)[0] == "coevo.train" and layer_of(dst)[0] in ROLES)
    assert reaching == []


def test_the_checker_catches_upward_and_cyclic_imports() -> None:
    graph = nx.DiGraph([("coevo.core.io", "coevo.train.policy"), ("solver.agent", "evidence.corpus"),
                        ("evidence.a", "evidence.b"), ("evidence.b", "evidence.a"), ("coevo.run", "coevo.core.io")])
    assert layer_violations(graph) == [
        "coevo.core.io (coevo.core) imports coevo.train.policy (coevo.train): upward",
        "solver.agent imports evidence.corpus: role packages import only coevo.core",
    ]
    assert len(list(nx.simple_cycles(graph))) == 1


@pytest.mark.parametrize("module, layer", [("coevo.core.grpo", "coevo.core"), ("coevo.run", "coevo"),
                                           ("coevo.train.engines.hf", "coevo.train"), ("solver.agent", "solver")])
def test_layer_of(module: str, layer: str) -> None:
    assert layer_of(module)[0] == layer


def test_every_module_has_its_line_in_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## Every module", 1)
    assert len(doc) == 2, "docs/architecture.md has no 'Every module' section"
    listed = {line.split("`")[1] for line in doc[1].splitlines() if line.startswith("| `")}
    modules = {str(p.relative_to(ROOT)) for pkg in ("coevo", "evidence", "proposer", "solver")
               for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - listed) == [], "modules without their line in docs/architecture.md"
    assert sorted(listed - modules) == [], "lines in docs/architecture.md for modules that do not exist"
