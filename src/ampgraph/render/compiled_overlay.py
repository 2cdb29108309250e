"""The compiled overlay: a report's ops drawn with the kernels Inductor fuses them into.

``render --compile inductor`` draws one figure per setting: every op of the report a box (its op,
module path and output dtype), edges coloured by dtype as in the other diagrams, and each kernel
of Inductor's plan (:class:`~ampgraph.compiled.flow.CompiledFlow`) a frame captioned with its
kind and name (``op4 · pointwise``), where its ops are one piece of the graph (a kernel fused from
ops far apart, as Inductor's horizontal fusion makes, is named in its boxes instead: one frame
around them would span the figure). An op whose eager 16-bit rounding the compiled program drops
has a thick dashed vermillion border, and its outgoing edges say ``fp32 in kernel`` where eager
passes a 16-bit value; a value rounded in registers (``emulate_precision_casts``) is marked
``rounded in kernel``. A legend says so. Torch-free: it reads the two records only.

>>> from ampgraph.compiled.flow import CompiledFlow, CompiledNode, Kernel
>>> from ampgraph.report.records import NodeRecord, Report
>>> r = Report("m", {"name": "amp-fp32", "device_type": "cpu", "autocast": True,
...     "amp_dtype": "bfloat16", "param_dtype": "float32"}, {}, {}, [
...     NodeRecord("gelu", "aten.gelu.default", "op", outputs=["bfloat16"])], [])
>>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {"emulate_precision_casts": False},
...     [CompiledNode("gelu", "", "bfloat16", "in-register", "op4")],
...     kernels=[Kernel("op4", "pointwise", ("gelu",), ())])
>>> "cluster_kernel_op4" in compiled_dot(r, f)
True
"""

from __future__ import annotations

import graphviz

from ampgraph.compiled.flow import CompiledFlow, CompiledNode
from ampgraph.render.emit import new_digraph
from ampgraph.render.labels import dot_name, dot_string, font, html_text
from ampgraph.render.style import THEMES, Theme, dtype_family
from ampgraph.report.records import NodeRecord, Report
from ampgraph.settings import Setting

#: The mark of a dropped rounding (the palette's vermillion, as promotions are drawn).
DROPPED = "#D55E00"
KERNEL_FILL = {"light": "#F4F4F4", "dark": "#2A2A2A"}


def _connected(nodes: list[NodeRecord]) -> bool:
    """Whether ``nodes`` are one piece through the edges among them: a kernel Inductor fused
    from ops far apart in the graph (horizontal fusion of the same op in several layers) would
    pull them into one frame across the whole figure, so it is named in its boxes instead.

    >>> _connected([NodeRecord("a", "x", "op"), NodeRecord("b", "y", "op", inputs=[{"node": "a"}])])
    True
    """
    parent = {n.name: n.name for n in nodes}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for n in nodes:
        for i in n.inputs:
            if i.get("node") in parent:
                parent[root(i["node"])] = root(n.name)
    return len({root(n.name) for n in nodes}) <= 1


def _box(
    node: NodeRecord, fate: CompiledNode | None, theme: Theme, framed: bool = True
) -> dict[str, str]:
    """A node's box: op and module, output dtype, its compiled fate (and its kernel, where the
    kernel has no frame)."""
    op = node.op.removeprefix("aten.").split(".")[0] if node.kind == "op" else node.kind
    lines = [f"<B>{html_text(node.name)}</B> {font(html_text(op), colour=theme.muted)}"]
    if node.module:
        lines.append(font(html_text(node.module), colour=theme.muted))
    out = node.out_dtype or "-"
    what = fate.fate if fate is not None else ("" if node.kind != "op" else "not in the plan")
    if fate is not None and fate.drops_rounding:
        what = f"fp32 in {fate.kernel} (eager rounds)"
    elif fate is not None and fate.kernel and not framed:
        what += f" in {fate.kernel}"
    lines.append(html_text(out + (f" · {what}" if what else "")))
    attrs = {"label": "<" + "<BR/>".join(lines) + ">", "shape": "box", "style": "rounded",
             "color": theme.muted, "fontcolor": theme.text,
             "tooltip": dot_string(f"{node.name} ({node.op}) {node.module or ''}: {what}")}  # fmt: skip
    if fate is not None and fate.drops_rounding:
        attrs.update(color=DROPPED, penwidth="2.6", style="rounded,dashed")
    elif fate is not None and fate.fate == "emulated" and fate.dtype in ("bfloat16", "float16"):
        attrs.update(color=DROPPED, penwidth="1.4", style="rounded,dotted")
    return attrs


def _edge(src: NodeRecord, fate: CompiledNode | None, theme: Theme) -> dict[str, str]:
    dtype = src.out_dtype
    style = theme.edges[dtype_family(dtype)]
    attrs = {"color": style.colour, "penwidth": str(style.penwidth), "style": style.style}
    if fate is not None and fate.drops_rounding:
        attrs.update(color=DROPPED, style="dashed", fontcolor=DROPPED, fontsize="9",
                     label=dot_string(f"{dtype_family(dtype)} dropped: fp32 in kernel"))  # fmt: skip
    return attrs


def _legend(dot: graphviz.Digraph, theme: Theme) -> None:
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", fontcolor=theme.muted, color=theme.muted, style="dashed",
                 fontsize="10")
        leg.attr("node", fontsize="9")
        leg.node("legend_kernel", label="a frame: one kernel Inductor runs (its kind and name)",
                 shape="box", style="filled", fillcolor=KERNEL_FILL[theme.name],
                 color=theme.muted, fontcolor=theme.text)  # fmt: skip
        leg.node("legend_dropped", label="eager rounds to 16 bits here; compiled keeps fp32",
                 shape="box", style="rounded,dashed", color=DROPPED, penwidth="2.6",
                 fontcolor=theme.text)  # fmt: skip
        leg.node("legend_named", label="op · kernel: a kernel of ops far apart in the graph "
                 "(horizontal fusion), named in its boxes, not framed", shape="box",
                 style="rounded", color=theme.muted, fontcolor=theme.text)  # fmt: skip
        leg.edge("legend_kernel", "legend_dropped", style="invis")
        leg.edge("legend_dropped", "legend_named", style="invis")


def compiled_dot(report: Report, flow: CompiledFlow, theme: str = "light") -> str:
    """Graphviz source of ``report``'s ops framed by ``flow``'s kernels (see the module)."""
    th = THEMES[theme]
    title = f"{report.model}: {Setting.from_dict(report.setting).title} under torch.compile"
    opts = ", ".join(f"{k}={v}" for k, v in flow.options.items() if k.startswith("emulate"))
    subtitle = (f"torch {flow.torch_version}, Inductor {flow.backend} backend ({opts}): "
                f"{len(flow.kernels)} kernels, {len(flow.dropped())} eager rounding(s) dropped")  # fmt: skip
    dot = new_digraph(f"{report.model}-compiled", title, subtitle, th)
    fates = {n.name: n for n in flow.nodes}
    shown = [n for n in report.nodes if n.kind in ("op", "input", "output", "region")]
    by_name = {n.name: n for n in shown}
    members: dict[str, list[NodeRecord]] = {}
    for n in shown:
        fate = fates.get(n.name)
        members.setdefault(fate.kernel if fate and fate.kernel else "", []).append(n)
    kinds = {k.name: k.kind for k in flow.kernels}
    for kernel, nodes in members.items():
        if kernel and _connected(nodes):
            with dot.subgraph(name=dot_name(f"cluster_kernel_{kernel}")) as sub:
                sub.attr(label=f"{kernel} · {kinds.get(kernel, '?')}", style="filled,rounded",
                         fillcolor=KERNEL_FILL[theme], color=th.muted, fontcolor=th.muted,
                         labeljust="l", fontsize="9")  # fmt: skip
                for n in nodes:
                    sub.node(dot_name(n.name), **_box(n, fates.get(n.name), th))
            continue
        for n in nodes:
            dot.node(dot_name(n.name), **_box(n, fates.get(n.name), th, framed=not kernel))
    for n in shown:
        for i in n.inputs:
            src = i.get("node")
            if src in by_name:
                dot.edge(dot_name(src), dot_name(n.name), **_edge(by_name[src], fates.get(src), th))
    _legend(dot, th)
    return dot.source
