"""The package's shape: no import circles among ampgraph's modules, torch where it belongs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "ampgraph"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> nx.DiGraph:
    """Every import between ampgraph's modules, at the top of a file or inside a function (a
    late import is a dependency too); imports under ``if TYPE_CHECKING:`` never run and do not
    count."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from ampgraph import policy`` imports the submodule; ``from ampgraph import
                # __version__`` the package itself.
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            if _type_checking_only(node, parents):
                continue
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def test_the_import_graph_is_read_whole() -> None:
    graph = import_graph()
    # Spot checks that the walk sees top-level, late and submodule imports.
    assert graph.has_edge("ampgraph.pipeline.stages", "ampgraph.capture.trace")
    assert graph.has_edge("ampgraph.pipeline.run", "ampgraph.pipeline.stages")  # a late import
    assert graph.has_edge("ampgraph.annotate.annotator", "ampgraph.policy.rules")
    assert len(graph) > 30


def test_no_import_circles() -> None:
    cycles = sorted(nx.simple_cycles(import_graph()), key=len)
    assert not cycles, "import circles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:5])


def test_torch_helpers_have_one_home() -> None:
    """torch_dtype, dtype_name, autocast_state, ... are defined in torchutil and nowhere else."""
    helpers = {"torch_dtype", "dtype_name", "autocast_state", "can_trace_fake", "swapped_tensors"}
    defined: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in helpers:
                defined.setdefault(node.name, []).append(_module_name(path))
    assert defined == {h: ["ampgraph.torchutil"] for h in helpers}


def test_the_loader_and_the_shared_autocast_rules_stay_where_they_belong() -> None:
    graph = import_graph()
    # The loader builds models; tracing them is the analysis's choice.
    assert not nx.has_path(graph, "ampgraph.model.build", "ampgraph.capture.tracers")
    # The dispatcher check shares nothing with the annotator's reading of the policy.
    assert not nx.has_path(graph, "ampgraph.annotate.check", "ampgraph.policy.rules")
    assert not nx.has_path(graph, "ampgraph.annotate.check", "ampgraph.annotate.annotator")


def test_torch_free_modules_import_no_torch() -> None:
    """The CLI, the cache, the pipeline and the renderer start without torch (a warm run)."""
    code = (
        "import sys, ampgraph.cli, ampgraph.pipeline.run, ampgraph.pipeline.cache, ampgraph.render, "
        "ampgraph.report.text, ampgraph.model.specs, ampgraph.policy, ampgraph.review.audit; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_the_public_surface_is_what_dir_lists_and_every_name_resolves() -> None:
    """``dir(ampgraph)`` showed ``Any``, ``TYPE_CHECKING`` and ``annotations``, not ``analyze``."""
    import ampgraph

    assert dir(ampgraph) == sorted([*ampgraph.__all__, "__version__"])
    assert {"analyze", "analyze_spec", "Report", "Setting"} <= set(dir(ampgraph))
    assert all(getattr(ampgraph, name) is not None for name in ampgraph.__all__)
