"""Inductor's own plan for a captured graph: lowering, fusion and code generation on fake tensors.

The graph a capture traced (export's ATen graph, ops as called, before autocast) goes through
``torch._inductor.compile_fx.compile_fx`` under the setting's autocast, exactly as
``torch.compile`` hands a graph to Inductor: AOT autograd applies autocast's casts and
Inductor's decompositions, the post-grad passes run, ``GraphLowering`` lowers every node to
Inductor IR and the ``Scheduler`` fuses them; each kernel's source is generated (which decides
the buffers a kernel keeps in registers). It stops there, before the wrapper's source and before
any kernel is compiled (``GraphLowering.compile_to_module`` is where a C++ compiler would start),
so no compiler and no real data are needed. What Inductor decided is then read off its objects:
which FX value became a stored buffer, which was inlined into a consumer's loop, which kernel
each lies in. Inductor's nodes carry ``from_node`` provenance back to the captured graph, so every
answer is given under the captured node's name and module path.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> from ampgraph.capture.trace import capture
>>> from ampgraph.settings import Setting
>>> class M(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.f = torch.nn.Linear(8, 8)
...     def forward(self, x):
...         y = self.f(x)
...         return torch.nn.functional.gelu(y) * 1.7 + y
>>> c = capture(ModelInputs("m", M().eval(), (torch.randn(4, 8),)), Setting.parse("amp-fp32", device_type="cpu"))
>>> [n.name for n in plan(c).dropped()]
['gelu', 'mul']
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import fx

from ampgraph.capture.trace import Capture
from ampgraph.compiled.flow import (
    LOW_PRECISION,
    CompiledCast,
    CompiledFlow,
    CompiledNode,
    Kernel,
)
from ampgraph.errors import AmpgraphError
from ampgraph.torchutil import dtype_name, quiet_library_imports

#: Inductor's backend for each device: Triton plans only where a GPU answers its questions.
BACKENDS = {"cpu": "cpp", "cuda": "triton"}


class CompiledPlanError(AmpgraphError):
    """Inductor could not plan this graph (the message says where)."""


def options(emulate_precision_casts: bool) -> dict[str, Any]:
    """The Inductor options a plan is made (and a real compile must run) under.

    >>> options(True)["emulate_precision_casts"]
    True
    """
    from torch._inductor import config

    return {
        "emulate_precision_casts": emulate_precision_casts,
        "emulate_precision_casts_on_saved_tensors":
            config.emulate_precision_casts_on_saved_tensors,
        "max_fusion_size": config.max_fusion_size,
        "realize_opcount_threshold": config.realize_opcount_threshold,
        "freezing": config.freezing,
    }  # fmt: skip


@contextlib.contextmanager
def inductor_setting(capture: Capture, emulate_precision_casts: bool) -> Iterator[None]:
    """Inductor's options and the setting's autocast, as ``torch.compile`` would run in them."""
    from torch._inductor import config

    s = capture.setting
    no_gpu = s.device_type == "cuda" and not torch.cuda.is_available()
    if s.device_type not in BACKENDS or no_gpu:
        raise CompiledPlanError(
            f"the compiled analysis plans Inductor's C++ backend (device cpu); {s.name} runs on "
            f"{s.device_type}, whose Triton backend needs a GPU to plan: use a cpu setting"
        )
    amp = torch.autocast(s.device_type, getattr(torch, s.amp_dtype), enabled=s.autocast)
    # The analysis cache is ampgraph's; Inductor's own FX cache would skip the lowering.
    with config.patch(emulate_precision_casts=emulate_precision_casts, fx_graph_cache=False), amp:
        with quiet_library_imports():
            yield


class Planned(Exception):
    """Raised from ``compile_to_module`` once the plan is made: nothing is compiled after it."""


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Any, dict[fx.Node, Any]]]]:
    """Patch Inductor so that each graph it lowers is recorded (its ``GraphLowering`` and every
    FX node's lowered value, appended to the yielded list) and nothing is compiled: the source is
    generated, then :class:`Planned` is raised where a C++ compiler would start."""
    from torch._inductor.graph import GraphLowering

    made: list[tuple[Any, dict[fx.Node, Any]]] = []
    values: dict[fx.Node, Any] = {}
    run_node = GraphLowering.run_node

    def record(self: Any, n: fx.Node) -> Any:
        out = run_node(self, n)
        values[n] = out  # the Interpreter frees env entries; IR boxes are realised in place
        return out

    def stop(self: Any) -> None:
        # GraphLowering.codegen up to the kernels' source: generating a kernel decides which of
        # its buffers stay in registers (Kernel.remove_kernel_local_buffers), so that runs; the
        # wrapper's source (memory planning, the call function), which only reads that
        # decision, and every compiler are skipped (bench/compiled_bench.py measures the cost).
        self.init_wrapper_code()
        self._update_scheduler()
        self.wrapper_code.push_codegened_graph(self)
        self.scheduler.codegen()
        self.wrapper_code.pop_codegened_graph()
        made.append((self, dict(values)))
        values.clear()
        raise Planned

    with mock.patch.object(GraphLowering, "run_node", record), \
            mock.patch.object(GraphLowering, "compile_to_module", stop):  # fmt: skip
        yield made


@contextlib.contextmanager
def replacements() -> Iterator[list[tuple[list[fx.Node], list[fx.Node]]]]:
    """Record each pattern replacement Inductor makes (its ``ReplacementPatternEntry``, which
    every ``Match.replace_by_example`` goes through): the matched nodes and the nodes put in their
    place. A replacement of several nodes gives its new nodes no ``from_node`` (only its output
    inherits the match's output's), so a matched node folded into the new math, such as the
    scale of ``softmax(x * s)`` (``joint_graph.mul_softmax_pattern``), is known only from here."""
    from torch._inductor.pattern_matcher import ReplacementPatternEntry

    made: list[tuple[list[fx.Node], list[fx.Node]]] = []
    replace = ReplacementPatternEntry.replace_with_graph

    def record(match: Any, *args: Any, **kwargs: Any) -> list[fx.Node]:
        added = replace(match, *args, **kwargs)
        made.append((list(match.nodes), list(added)))
        return added

    with mock.patch.object(ReplacementPatternEntry, "replace_with_graph", staticmethod(record)):
        yield made


def _lower(
    capture: Capture, emulate: bool, gm: fx.GraphModule, inputs: list[Any]
) -> tuple[Any, dict[fx.Node, Any], list[tuple[list[fx.Node], list[fx.Node]]]]:
    """Run Inductor on ``gm`` up to generated source; the GraphLowering, every node's lowered
    value and the pattern replacements made on the way (:func:`replacements`)."""
    from torch._inductor import compile_fx

    with inductor_setting(capture, emulate), recording() as made, replacements() as replaced:
        try:
            compile_fx.compile_fx(gm, inputs)
        except Exception as exc:  # noqa: BLE001 - Inductor wraps ours in InductorError
            if not made:
                raise CompiledPlanError(f"Inductor could not lower the graph: {exc}") from exc
    return (*made[0], replaced)


def _root_name(node: fx.Node, names: set[str]) -> str | None:
    """The captured node a lowered node comes from (its ``from_node`` chain's first in ``names``)."""
    stack = list(node.meta.get("from_node") or ())
    while stack:
        source = stack.pop(0)
        if source.name in names and source.graph_id is not None:
            last = source
            while last.from_node:
                last = last.from_node[0]
            return last.name if last.name in names else source.name
        stack.extend(source.from_node or ())
    return None


def _storage(value: Any) -> Any:
    """The buffer or unrealised loop body behind a lowered value (through views and boxes)."""
    from torch._inductor import ir

    seen = 0
    while seen < 64:
        seen += 1
        if isinstance(value, (ir.TensorBox, ir.StorageBox, ir.BaseView)) or (
            isinstance(value, ir.MutableBox)
        ):
            value = value.data
            continue
        return value
    return value


def _emulated(n: fx.Node) -> bool:
    """Whether Inductor rounds ``n``'s value in registers: ``emulate_precision_casts`` marks the
    node (``low_precision_pointwise_barrier``), and the lowering rounds only a 16-bit output
    (``torch._inductor.lowering.make_pointwise``): an fp32 value marked there is not rounded."""
    val = n.meta.get("val")
    return bool(n.meta.get("low_precision_pointwise_barrier")) and (
        isinstance(val, torch.Tensor) and dtype_name(val.dtype) in LOW_PRECISION
    )


def _fate(value: Any, removed: set[str], barrier: bool) -> tuple[str, str | None]:
    """Where Inductor keeps a lowered value: (fate, buffer name)."""
    from torch._inductor import ir

    data = _storage(value)
    if isinstance(data, ir.Buffer) and not isinstance(data, ir.InputBuffer):
        name = data.get_name()
        if name in removed:
            return ("emulated" if barrier else "in-register"), None
        if isinstance(data, (ir.ExternKernel, ir.MultiOutput)):
            return "extern", name
        return "stored", name
    if isinstance(data, ir.InputBuffer):
        return "stored", data.get_name()
    return ("emulated" if barrier else "in-register"), None


#: Ops whose output is a view of their input, or exactly one of their input's values (a gather,
#: a copy, a selection): eager rounds nothing there, so fusing them drops nothing.
_EXACT = frozenset({
    "reshape", "flatten", "unflatten", "contiguous", "view_as", "expand_as", "alias", "detach",
    "lift_fresh_copy", "clone", "copy", "embedding", "index", "index_select", "gather", "cat",
    "stack", "constant_pad_nd", "pad", "where", "relu", "abs", "neg", "maximum", "minimum",
    "max", "min", "amax", "amin", "repeat", "roll", "flip", "tril", "triu", "zeros", "ones",
    "zeros_like", "ones_like", "new_zeros", "new_ones",
})  # fmt: skip


def computes(node: fx.Node) -> bool:
    """Whether a captured node computes a value eager must round (not a view of its input, not
    a gather, copy or selection of its input's values).

    >>> computes(fx.Graph().call_function(torch.ops.aten.transpose.int, ()))
    False
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return not (target.is_view or target._schema.name.split("::")[-1] in _EXACT)


def _kernel_kind(node: Any) -> str:
    if node.is_extern():
        return "extern"
    if node.is_template():
        return "template"
    if type(node).__name__ == "NopKernelSchedulerNode":
        return "nop"
    return "reduction" if node.is_reduction() else "pointwise"


def _kernels(
    graph: Any, owner: dict[fx.Node, str], rank: dict[str, int]
) -> tuple[list[Kernel], dict[Any, str]]:
    """Inductor's scheduled kernels, and which kernel each lowered FX node is computed in."""
    from torch._inductor import ir

    kernels, where = [], {}
    for snode in graph.scheduler.nodes:
        origins: list[fx.Node] = []
        for inner in snode.get_nodes():
            if inner.node is not None:
                origins.extend(inner.node.get_origins())
        for o in origins:
            where.setdefault(o, snode.get_name())
        for b in snode.get_outputs():
            where[b.get_name()] = snode.get_name()
        names = sorted({owner[o] for o in origins if o in owner}, key=rank.__getitem__)
        stores = tuple(
            (b.get_name(), dtype_name(b.node.get_layout().dtype))
            for b in snode.get_outputs()
            # a MultiOutput holder has no dtype of its own (its parts are buffers of their own);
            # a mutation writes into another buffer and allocates none. A piece of a `cat`
            # computed straight into its slice of the output (ConcatKernel.realize_into: a
            # NonOwningLayout) is a store in that dtype all the same: it is kept.
            if b.get_name() not in graph.removed_buffers
            and not isinstance(b.node, ir.MutationOutput)
            and not isinstance(b.node.layout, (ir.MultiOutputLayout, ir.NoneLayout,
                                               ir.MutationLayoutSHOULDREMOVE))
            and type(b.node).__name__ != "TMADescriptor"  # a NonOwningLayout that stores nothing
        )  # fmt: skip
        call = getattr(snode.node, "python_kernel_name", None) if snode.is_extern() else None
        kernels.append(Kernel(snode.get_name(), _kernel_kind(snode),
                              tuple(names), stores, call))  # fmt: skip
    return kernels, where


def plan(capture: Capture, *, emulate_precision_casts: bool = False) -> CompiledFlow:
    """Inductor's plan for ``capture``'s graph in its setting (see the module's docstring); a
    graph with ``torch.compiler.disable`` regions is planned as Dynamo splits it
    (:mod:`ampgraph.compiled.breaks`)."""
    from ampgraph.compiled import breaks

    def plan_one(capture: Capture, gm: fx.GraphModule, inputs: list[Any]) -> CompiledFlow:
        graph, values, replaced = _lower(capture, emulate_precision_casts, gm, inputs)
        names = {n.name for n in gm.graph.nodes if n.op == "call_function"}
        owner = {n: r for n in values if (r := _root_name(n, names)) is not None}
        return build_flow(gm, graph, values, owner, capture, emulate_precision_casts, replaced)

    gm = capture.graph_module
    if breaks.has_breaks(gm):
        base = CompiledFlow(capture.model_name, capture.setting.name, torch.__version__,
                            BACKENDS[capture.setting.device_type], options(emulate_precision_casts))  # fmt: skip
        return breaks.plan_with_breaks(capture, base, plan_one, _eager_nodes)
    return plan_one(capture, gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"])


def build_flow(
    gm: fx.GraphModule, graph: Any, values: dict[fx.Node, Any], owner: dict[fx.Node, str],
    capture: Capture, emulate_precision_casts: bool,
    replaced: list[tuple[list[fx.Node], list[fx.Node]]] | None = None,
) -> CompiledFlow:  # fmt: skip
    """The flow of ``gm``'s nodes from a lowering (``graph``, each lowered FX node's value) and
    ``owner``, the ``gm`` node each lowered node computes part of (the last one gives its value).
    ``gm`` is the captured graph for a forward plan, the lowered graph itself for a backward.
    ``replaced``: Inductor's pattern replacements (:func:`replacements`); a node one folds away
    is placed in the kernel that computes the replacement (:func:`_absorbed`)."""
    names = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    modules = _module_paths(gm)
    rank = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    kernels, where = _kernels(graph, owner, rank)
    removed = set(graph.removed_buffers)
    last: dict[str, fx.Node] = {}
    for n in values:  # graph order: a captured node's value is its last lowered node's
        if n in owner and isinstance(n.meta.get("val"), torch.Tensor):
            last[owner[n]] = n
    nodes = []
    for node in (n for n in gm.graph.nodes if n.name in last):
        n = last[node.name]
        fate, buf = _fate(values[n], removed, _emulated(n))
        # a stored value's kernel is the one that writes it; an inlined one's, its first reader
        kernel = where.get(buf) if buf else where.get(n)
        nodes.append(CompiledNode(node.name, modules.get(node.name, ""),
                                  dtype_name(n.meta["val"].dtype), fate, kernel, buf,
                                  computes(node)))  # fmt: skip
    folded = _absorbed(gm, set(last), replaced or [], values, where, names)
    nodes += [CompiledNode(node.name, modules.get(node.name, ""),
                           dtype_name(node.meta["val"].dtype), "in-register", k, None,
                           computes(node), folded=True) for node, k in folded]  # fmt: skip
    nodes = _mark_unrounded_reads(gm, nodes)
    casts = [_cast(n, owner[n], values[n], removed, where) for n in values
             if n in owner and n.target is torch.ops.prims.convert_element_type.default]  # fmt: skip
    unmapped = sorted(names - set(last) - {node.name for node, _ in folded})
    return CompiledFlow(capture.model_name, capture.setting.name, torch.__version__,
                        BACKENDS[capture.setting.device_type], options(emulate_precision_casts),
                        nodes, casts, kernels, unmapped)  # fmt: skip


def _absorbed(
    gm: fx.GraphModule, mapped: set[str], replaced: list[tuple[list[fx.Node], list[fx.Node]]],
    values: dict[fx.Node, Any], where: dict[Any, str], names: set[str],
) -> list[tuple[fx.Node, str]]:
    """The captured nodes with no lowered value that a pattern replacement matched, each with the
    kernel computing the replacement's last lowered node: their math is folded into that kernel's
    registers (never stored; ``emulate_precision_casts`` marks lowered nodes, and the value eager
    rounds is no node of the rewritten graph, so it is not rounded either). A node no recorded
    replacement explains stays unmapped."""
    order = {n: i for i, n in enumerate(values)}
    kernel_of: dict[str, str] = {}
    for matched, added in replaced:
        lowered = sorted((n for n in added if n in order and n in where), key=order.__getitem__)
        if not lowered:
            continue
        for m in matched:
            root = _root_name(m, names)
            if root is not None and root not in mapped:
                kernel_of.setdefault(root, where[lowered[-1]])
    return [(n, kernel_of[n.name]) for n in gm.graph.nodes
            if n.name in kernel_of and isinstance(n.meta.get("val"), torch.Tensor)]  # fmt: skip


def _eager_nodes(members: list[fx.Node]) -> list[CompiledNode]:
    """The records of a ``torch.compiler.disable`` region's nodes: run eagerly, as eager rounds."""
    paths = _module_paths(members[0].graph.owning_module)
    return [CompiledNode(n.name, paths.get(n.name, ""), dtype_name(n.meta["val"].dtype), "eager",
                         computes=computes(n))
            for n in members
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]  # fmt: skip


def _mark_unrounded_reads(gm: fx.GraphModule, nodes: list[CompiledNode]) -> list[CompiledNode]:
    """Set ``read_unrounded``: whether a computing consumer reads the kept-in-fp32 value, through
    views and exact copies that are themselves never stored (a stored one rounds it first)."""
    by_name = {n.name: n for n in nodes}
    memo: dict[str, bool] = {}

    def reaches(node: fx.Node) -> bool:
        if node.name not in memo:
            memo[node.name] = False  # a cycle cannot occur in a DAG; this only guards recursion
            for user in node.users:
                r = by_name.get(user.name)
                if r is None or r.fate == "extern" or (r.fate == "stored" and not r.computes):
                    # the graph's output; an extern kernel, which reads a buffer stored in the
                    # value's dtype; a view or copy stored as it is: rounded there, as in eager
                    continue
                if r.computes or r.dtype not in LOW_PRECISION or reaches(user):
                    memo[node.name] = True
                    break
        return memo[node.name]

    return [replace(n, read_unrounded=reaches(node)) if n.name in by_name else n
            for node in gm.graph.nodes if (n := by_name.get(node.name)) is not None]  # fmt: skip


def _cast(n: fx.Node, owner: str, value: Any, removed: set[str], where: dict) -> CompiledCast:
    source = n.args[0].meta["val"].dtype if isinstance(n.args[0], fx.Node) else None
    fate, _ = _fate(value, removed, _emulated(n))
    return CompiledCast(n.name, owner, dtype_name(source) if source else "?",
                        dtype_name(n.meta["val"].dtype), fate, where.get(n))  # fmt: skip


def _module_paths(gm: fx.GraphModule) -> dict[str, str]:
    """Each captured node's innermost module path (``nn_module_stack``), as the diagrams name it."""
    paths = {}
    for n in gm.graph.nodes:
        # a backward node carries the module stack of the forward op it differentiates
        stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack") or {}
        paths[n.name] = list(stack.values())[-1][0] if stack else ""
    return paths
