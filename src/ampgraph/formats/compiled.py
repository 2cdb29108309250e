"""The compiled dtype flow as text: a table per node, the eager-vs-compiled diff, audit findings;
and as JSON (``ampgraph compiled --view``: :func:`table_text`, :func:`diff_text`,
:func:`audit_text`, :func:`flow_json`).

>>> from ampgraph.compiled.flow import CompiledFlow, CompiledNode
>>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {"emulate_precision_casts": False},
...                  [CompiledNode("gelu", "mlp", "bfloat16", "in-register", "op4")])
>>> print(diff_lines(f)[1])
  gelu  (mlp)  bfloat16: eager rounds to bfloat16, compiled keeps fp32 in kernel op4
"""

from __future__ import annotations

import json

from ampgraph.compiled.flow import LOW_PRECISION, CompiledFlow

_FATE_WORDS = {
    "stored": "stored in a buffer",
    "extern": "written by an extern kernel",
    "in-register": "inside the kernel, never stored",
    "emulated": "rounded in the kernel (emulate_precision_casts)",
    "removed": "removed by a graph pass",
}


def header(flow: CompiledFlow) -> str:
    """What the answer is for: model, setting, torch release, backend and Inductor's options."""
    opts = ", ".join(f"{k}={v}" for k, v in flow.options.items())
    return (f"{flow.model} in {flow.setting} under torch.compile: torch {flow.torch_version}, "
            f"Inductor {flow.backend} backend ({opts})")  # fmt: skip


def table_lines(flow: CompiledFlow) -> list[str]:
    """One line per node: name, module, eager dtype, compiled fate, kernel."""
    width = max([len(n.name) for n in flow.nodes] + [4])
    lines = [header(flow), f"{'node':<{width}}  {'dtype':<9} {'kernel':<8} compiled  [module]"]
    for n in flow.nodes:
        mark = "  << fp32 in the kernel: eager's rounding dropped" if n.drops_rounding else ""
        mark = mark or ("  (a view or exact copy: no rounding)" if not n.computes else "")
        lines.append(f"{n.name:<{width}}  {n.dtype:<9} {n.kernel or '-':<8} "
                     f"{_FATE_WORDS[n.fate]}  [{n.module or '(top)'}]{mark}")  # fmt: skip
    lines.append(f"{len(flow.kernels)} kernels: " + ", ".join(
        f"{k.name} {k.kind}" + (f" {k.call}" if k.call else "") for k in flow.kernels))  # fmt: skip
    return lines


def diff_lines(flow: CompiledFlow) -> list[str]:
    """The rounding points where the compiled program differs from eager, by node and module."""
    dropped = flow.dropped()
    lines = [f"{len(dropped)} eager rounding point(s) the compiled program drops"]
    for n in dropped:
        lines.append(f"  {n.name}  ({n.module or 'top'})  {n.dtype}: eager rounds to {n.dtype}, "
                     f"compiled keeps fp32 in kernel {n.kernel}")  # fmt: skip
    removed = [c for c in flow.casts if c.fate in ("in-register", "removed")
               and c.target in LOW_PRECISION]  # fmt: skip
    if removed:
        lines.append(f"{len(removed)} cast(s) to 16 bits that fusion leaves unperformed: "
                     + ", ".join(f"{c.node} of {c.owner}" for c in removed))  # fmt: skip
    return lines


def audit_lines(flow: CompiledFlow) -> list[str]:
    """A finding per kernel whose compiled numerics differ from eager, with the two remedies."""
    lines = []
    for k in flow.kernels:
        nodes = [n for n in flow.nodes if n.kernel == k.name and n.drops_rounding]
        if not nodes:
            continue
        names = ", ".join(f"{n.name} ({n.module or 'top'})" for n in nodes)
        lines.append(
            f"warning: kernel {k.name} keeps {len(nodes)} {nodes[0].dtype} value(s) in fp32 that "
            f"eager rounds: {names}. Compiled output differs from eager by 16-bit roundings. "
            "For eager's numbers: torch._inductor.config.emulate_precision_casts = True (every "
            "fused kernel rounds as eager: extra casts in registers, no extra memory traffic), or "
            "an autocast barrier (end the autocast region, or .float()/.to() the value, before "
            "the op: forces a stored buffer, one more kernel and a round trip through memory)"
        )
    return lines or [f"no kernel drops an eager rounding ({header(flow)})"]


def table_text(flow: CompiledFlow) -> str:
    """``--view table``: :func:`table_lines` as text."""
    return "\n".join(table_lines(flow))


def diff_text(flow: CompiledFlow) -> str:
    """``--view diff``: :func:`diff_lines` as text."""
    return "\n".join(diff_lines(flow))


def audit_text(flow: CompiledFlow) -> str:
    """``--view audit``: :func:`audit_lines` as text."""
    return "\n".join(audit_lines(flow))


def flow_json(flow: CompiledFlow) -> str:
    """``--view json``: the flow's record."""
    return json.dumps(flow.to_dict(), indent=1)
