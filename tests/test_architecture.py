"""The package's shape: imports that point one way (down the layers below), no import circles
among ampgraph's modules, torch where it belongs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "ampgraph"

#: The layers, bottom first (docs/how-it-works.md shows them): a module imports its own package
#: (a top-level module: itself) and lower layers only, never a layer above it or beside it.
#: A name is a subpackage or a top-level module of ``ampgraph``; ``ampgraph`` is the package root.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "compat", "version"),  # foundation: imports nothing of ampgraph
    ("settings", "torchutil"),  # foundation: what a run is in, torch helpers
    ("report", "arguments"),  # the result as plain data (records, reading, files, summary,
    # validate, saved memory, what the backward did); the Python API's arguments, checked once
    ("model",),  # what to analyse: specs, building on meta
    ("policy",),  # autocast's tables as data, read by every stage after it
    ("capture",),  # model -> graph
    ("annotate",),  # graph -> annotated nodes (their reasons' words), the dispatcher check
    ("train",),  # the backward pass and its check
    ("compiled",),  # what torch.compile (Inductor) runs: its plan, the generated code
    ("pipeline",),  # one call over the stages above, the cache, workers
    # against real execution (the training step's too): analyses through pipeline; torchao's
    # FP8 recipes (which Linears convert, the traced FP8 graph, its proof on the real kernels)
    ("verify", "fp8"),
    ("ranges", "review"),  # value ranges; what a reviewer reads (audit, diff, baseline, ...)
    ("render",),  # records -> Graphviz, torch-free
    ("deepspeed_config",),
    ("recipes",),  # a framework's precision flag
    ("docs", "notebook"),  # the Sphinx directive, Jupyter's display
    # text, Markdown, JSON, SARIF, one module per format, and the registry every command looks
    # its output up in (which names the renderer's files and the op reference's formats too)
    ("formats",),
    ("sphinx", "cli", "explorer"),  # the extension's name, the command line, Model Explorer's
    ("__main__", "ampgraph"),  # ``python -m ampgraph``, the public surface
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` lies in the body of an ``if TYPE_CHECKING:`` (never run); its ``else``
    runs, and an import inside a function anywhere else is a dependency like any other."""
    while node in parents:
        parent = parents[node]
        if (
            isinstance(parent, ast.If)
            and "TYPE_CHECKING" in ast.unparse(parent.test)
            and node in parent.body
        ):
            return True
        node = parent
    return False


def import_graph(type_checking: bool = False) -> nx.DiGraph:
    """Every import between ampgraph's modules, at the top of a file or inside a function (a
    late import is a dependency too); imports under ``if TYPE_CHECKING:`` never run and count
    only with ``type_checking`` (the shape of the code, not what a run loads)."""
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
            if not type_checking and _type_checking_only(node, parents):
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
    """No circle of any kind: one under ``if TYPE_CHECKING:`` is two modules that each need the
    other to be understood, whatever a run loads."""
    cycles = sorted(nx.simple_cycles(import_graph(type_checking=True)), key=len)
    assert not cycles, "import circles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:5])


def _layer_unit(module: str) -> str:
    """The name :data:`LAYERS` knows ``module`` by: its subpackage, its top-level module, or
    ``ampgraph`` for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: nx.DiGraph) -> list[str]:
    """Every import of ``graph`` that goes to a layer above its module's, or beside it (another
    package of the same layer): ``a -> b (layer i -> j)``."""
    layer = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    wrong = []
    for source, target in sorted(graph.edges):
        unit, other = _layer_unit(source), _layer_unit(target)
        if unit != other and layer[other] >= layer[unit]:
            wrong.append(f"{source} -> {target} (layer {layer[unit]} -> {layer[other]})")
    return wrong


def test_every_module_has_a_layer() -> None:
    units = {_layer_unit(m) for m in import_graph()}
    known = {unit for units in LAYERS for unit in units}
    assert units - known == set(), "add these to LAYERS"
    assert sum(len(units) for units in LAYERS) == len(known)  # each named once


def test_imports_point_down_the_layers() -> None:
    """Each stage knows nothing of the stages after it (:data:`LAYERS`): no upward import, late
    or under ``if TYPE_CHECKING:``."""
    assert upward_imports(import_graph(type_checking=True)) == []


def test_an_upward_import_is_caught() -> None:
    """The check fails on a planted upward import (the records reading the renderer) and on
    one beside (a package of the same layer)."""
    graph = import_graph(type_checking=True)
    graph.add_edge("ampgraph.report.records", "ampgraph.render.graph")
    graph.add_edge("ampgraph.review.diff", "ampgraph.ranges.data")
    assert upward_imports(graph) == [
        "ampgraph.report.records -> ampgraph.render.graph (layer 2 -> 12)",
        "ampgraph.review.diff -> ampgraph.ranges.data (layer 11 -> 11)",
    ]


def test_late_imports_count_and_type_checking_ones_do_not() -> None:
    tree = ast.parse(
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    import c\n"
    )
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    imports = {n.names[0].name: n for n in ast.walk(tree) if isinstance(n, ast.Import)}
    assert [_type_checking_only(imports[m], parents) for m in "abc"] == [True, False, False]


def test_the_records_do_not_draw_themselves() -> None:
    """A report is plain data: the notebook display (:mod:`ampgraph.notebook`) draws it, so the
    records, read by every stage, never import the renderer, not even late."""
    graph = import_graph()
    assert not nx.has_path(graph, "ampgraph.report.records", "ampgraph.render")
    assert graph.has_edge("ampgraph.notebook", "ampgraph.render")  # the late import is seen


def test_a_running_ipython_shows_reports_as_diagrams_and_import_stays_cheap() -> None:
    """``import ampgraph`` in a notebook registers the SVG display of reports with IPython's
    formatter, without importing the renderer, Graphviz or torch until a report is shown."""
    code = (
        "import sys, types\n"
        "shown = {}\n"
        "class Formatter:\n"
        "    def for_type(self, kind, show): shown[kind] = show\n"
        "formatters = {'image/svg+xml': Formatter()}\n"
        "shell = types.SimpleNamespace(\n"
        "    display_formatter=types.SimpleNamespace(formatters=formatters))\n"
        "ipython = types.ModuleType('IPython')\n"
        "ipython.get_ipython = lambda: shell\n"
        "sys.modules['IPython'] = ipython\n"
        "import ampgraph\n"
        "from ampgraph.notebook import report_svg\n"
        "print(shown == {ampgraph.Report: report_svg},\n"
        "      [m for m in ('ampgraph.render', 'graphviz', 'torch') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True []"


def test_no_module_is_over_600_lines() -> None:
    """Every module of the package fits in 600 lines: a longer one holds more than one job."""
    lengths = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {path: n for path, n in lengths.items() if n > 600} == {}


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
    # The words of a record's reason sit below the annotator that picks them, never above it.
    assert graph.has_edge("ampgraph.annotate.annotator", "ampgraph.annotate.reasons")
    assert not nx.has_path(graph, "ampgraph.annotate.reasons", "ampgraph.annotate.annotator")


def test_torch_free_modules_import_no_torch() -> None:
    """The CLI, the cache, the pipeline and the renderer start without torch (a warm run)."""
    code = (
        "import sys, ampgraph.cli, ampgraph.pipeline.run, ampgraph.pipeline.cache, ampgraph.render, "
        "ampgraph.formats, ampgraph.model.specs, ampgraph.policy, ampgraph.review.audit; print('torch' in sys.modules)"
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


def test_the_api_page_follows_the_public_surface() -> None:
    """docs/api.md lists every name of ``ampgraph.__all__`` with the module that defines it."""
    import ampgraph

    page = (PACKAGE.parent.parent / "docs" / "api.md").read_text()
    table = {
        line.split("|")[1].strip().strip("`")
        for line in page.splitlines()
        if line.startswith("| `")
    }
    assert table == set(ampgraph.__all__)
    for name in ampgraph.__all__:
        obj = getattr(ampgraph, name)
        assert f"{obj.__module__}.{name}" in page, name


def test_only_compat_tests_torch_versions() -> None:
    """``compat.py`` promises that no stage tests torch versions itself: each version-dependent
    behaviour is one named function there (``addmv_meta_checks_dtypes``, ``torch_minor``, ...)."""
    tests = ("torch_release()", "version_tuple(", "__version__.split", "TorchVersion(")
    found = {
        str(path.relative_to(PACKAGE.parent)): [t for t in tests if t in path.read_text()]
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "compat.py"
    }
    assert {path: hits for path, hits in found.items() if hits} == {}
