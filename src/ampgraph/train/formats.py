"""Text renderings of a training step: backward lines, a Markdown table for a pull request.

Torch-free: everything here reads the ``backward`` section of a
:class:`~ampgraph.report.records.Report` (``ampgraph table --pass backward|train``).

>>> from ampgraph.report.records import Backward, Gradient, NodeRecord, Report, SavedTensor
>>> bw = Backward(
...     loss={"output": "0", "expression": "output.float().sum()", "dtype": "bfloat16"},
...     autocast=False,
...     nodes=[NodeRecord("mm", "aten.mm.default", "op", module="fc", forward="linear",
...                       inputs=[{"node": "a", "dtype": "bfloat16"}], outputs=["bfloat16"]),
...            NodeRecord("_to_copy", "aten._to_copy.default", "op", module="fc", forward="linear",
...                       inputs=[{"node": "mm", "dtype": "bfloat16"}], outputs=["float32"])],
...     gradients=[Gradient("fc.weight", "float32", "float32", [4, 4], "_to_copy")],
...     saved=[SavedTensor("linear", "fc", "bfloat16", [2, 4], 16, 0, 16, "activation")],
... )
>>> r = Report("mlp", {"name": "amp-fp32", "device_type": "cpu", "autocast": True,
...            "amp_dtype": "bfloat16", "param_dtype": "float32"}, {}, {}, [], [],
...            pass_="backward", backward=bw)
>>> for line in backward_lines(r):
...     print(line)
# backward of mlp amp-fp32: loss output.float().sum() of 0 (bf16); backward outside autocast
# gradients: 1 parameter, fp32 -> fp32 x1
# saved for backward: activations 16 B (bf16 16 B) in 1 tensor
[fc] backward: 16-bit ops mm; casts bf16->fp32; saved bf16 16 B; grads weight fp32 (cast from bf16)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ampgraph.report.escape import code_span, escape_text
from ampgraph.report.records import Backward, Gradient, NodeRecord, Report
from ampgraph.settings import caption, short_dtype
from ampgraph.train.memory import (
    ACTIVATION,
    PARAMETER_COPY,
    activation_bytes_by_dtype,
    by_module,
    human_bytes,
    total_bytes,
)

#: Ops that compute nothing (views, aliases, Python's getitem): left out of op counts.
NO_COMPUTE = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
    "slice", "select", "alias", "detach", "as_strided", "reshape", "split", "split_with_sizes",
    "unbind", "narrow", "diagonal", "unflatten", "flatten", "chunk", "getitem",
})  # fmt: skip
SIXTEEN_BITS = ("bfloat16", "float16")
CAST_OP = "aten._to_copy.default"


def base_name(op: str) -> str:
    """``aten.mm.default`` -> ``mm``.

    >>> base_name("aten.native_layer_norm_backward.default"), base_name("getitem")
    ('native_layer_norm_backward', 'getitem')
    """
    parts = op.split(".")
    return parts[1] if len(parts) == 3 else op


def computes(rec: NodeRecord) -> bool:
    """Whether a backward record is an op that computes (not a view, alias or getitem)."""
    return rec.kind == "op" and base_name(rec.op) not in NO_COMPUTE


def is_cast(rec: NodeRecord) -> bool:
    """A dtype-changing ``_to_copy`` in the backward (a gradient cast back, say)."""
    return (
        rec.op == CAST_OP and bool(rec.inputs) and bool(rec.outputs)
        and rec.inputs[0]["dtype"] != rec.outputs[0]
    )  # fmt: skip


def sixteen_bit_ops(bw: Backward) -> list[NodeRecord]:
    """Backward ops that compute in 16 bits (their first output is bf16 or fp16; casts aside)."""
    return [r for r in bw.nodes if computes(r) and r.op != CAST_OP and r.out_dtype in SIXTEEN_BITS]


def cast_pairs(bw: Backward) -> Counter[tuple[str, str]]:
    """(from, to) of every cast in the backward: ``_to_copy`` nodes and autocast's casts."""
    out: Counter[tuple[str, str]] = Counter()
    for r in bw.nodes:
        if r.kind != "op":
            continue  # the loss's own forward (its .float())
        if is_cast(r):
            out[(r.inputs[0]["dtype"], r.outputs[0])] += 1
        for c in r.casts:
            out[(c.from_dtype, c.to_dtype)] += 1
    return out


def gradient_origin(bw: Backward, grad: Gradient) -> str:
    """How a gradient got its dtype: ``cast from bf16`` or ``computed in fp32``."""
    by_name = {r.name: r for r in bw.nodes}
    rec = by_name.get(grad.node or "")
    seen = 0
    while rec is not None and seen < 8:
        if is_cast(rec):
            return f"cast from {short_dtype(rec.inputs[0]['dtype'])}"
        if computes(rec) and base_name(rec.op) not in ("clone", "copy", "new_empty_strided"):
            break
        rec = by_name.get(rec.inputs[0]["node"]) if rec.inputs else None
        seen += 1
    return f"computed in {short_dtype(grad.dtype)}"


def _dtype_bytes(by_dtype: dict[str, int]) -> str:
    return ", ".join(f"{short_dtype(d)} {human_bytes(b)}" for d, b in sorted(by_dtype.items()))


def summary_lines(report: Report) -> list[str]:
    """The three ``#`` lines above the backward lines: loss, gradients, saved memory."""
    bw = report.backward
    assert bw is not None
    where = "inside" if bw.autocast else "outside"
    loss = bw.loss
    head = (
        f"# backward of {report.model} {report.setting['name']}: loss {loss['expression']} of "
        f"{loss['output']} ({short_dtype(loss.get('dtype'))}); backward {where} autocast"
    )
    if bw.skipped:
        return [head, f"# not run: {bw.skipped}"]
    pairs = Counter((g.param_dtype, g.dtype) for g in bw.gradients)
    grads = ", ".join(
        f"{short_dtype(p)} -> {short_dtype(d) if d else 'no grad'} x{n}"
        for (p, d), n in sorted(pairs.items(), key=lambda kv: -kv[1])
    )
    n = len(bw.gradients)
    return [
        head,
        f"# gradients: {n} parameter{'s' if n != 1 else ''}, {grads}",
        (
            f"# saved for backward: {saved_text(bw)} in {len(bw.saved)} "
            f"tensor{'s' if len(bw.saved) != 1 else ''}"
        ),
    ]


def saved_text(bw: Backward) -> str:
    """``activations 16 B (bf16 16 B); parameter copies 32 B (bf16 32 B)``."""
    acts = activation_bytes_by_dtype(bw.saved, ACTIVATION)
    text = f"activations {human_bytes(total_bytes(bw.saved, ACTIVATION))}"
    if acts:
        text += f" ({_dtype_bytes(acts)})"
    copies = activation_bytes_by_dtype(bw.saved, PARAMETER_COPY)
    if copies:
        text += (f"; autocast's copies of parameters {human_bytes(sum(copies.values()))} "
                 f"({_dtype_bytes(copies)})")  # fmt: skip
    return text


def _module_order(report: Report, bw: Backward) -> list[str]:
    """Leaf modules in the order their backward runs (the reverse of the forward's)."""
    seen: dict[str, None] = {}
    for rec in bw.nodes:
        if rec.module is not None and rec.kind == "op":
            seen.setdefault(rec.module, None)
    return list(seen)


def backward_lines(report: Report, only: Sequence[str] | None = None) -> list[str]:
    """Summary lines, then one line per module whose backward computes, in backward order.

    ``only`` keeps modules whose class (any base) is named, as for the forward's hook lines.
    """
    bw = report.backward
    if bw is None:
        return []
    lines = summary_lines(report)
    if bw.skipped:
        return lines
    types = {c.path: set(c.bases) for c in report.modules}
    saved = by_module(bw.saved, kinds=ACTIVATION)
    copies = by_module(bw.saved, kinds=PARAMETER_COPY)
    grads: dict[str, list[Gradient]] = {}
    for g in bw.gradients:
        grads.setdefault(g.parameter.rpartition(".")[0], []).append(g)
    for module in _module_order(report, bw):
        if only and not (set(only) & types.get(module, set())):
            continue
        recs = [r for r in bw.nodes if r.module == module]
        low = Counter(base_name(r.op) for r in recs if r in sixteen_bit_ops_of(recs))
        casts = Counter()
        for r in recs:
            if is_cast(r):
                casts[(r.inputs[0]["dtype"], r.outputs[0])] += 1
            for c in r.casts:
                casts[(c.from_dtype, c.to_dtype)] += 1
        parts = []
        if low:
            parts.append("16-bit ops " + ", ".join(_counted(k, n) for k, n in low.items()))
        if casts:
            parts.append("casts " + ", ".join(
                _counted(f"{short_dtype(a)}->{short_dtype(b)}", n) for (a, b), n in casts.items()
            ))  # fmt: skip
        if module in saved:
            parts.append(f"saved {_dtype_bytes(saved[module])}")
        if module in copies:
            parts.append(f"saved parameter copies {_dtype_bytes(copies[module])}")
        mine = grads.get(module, [])
        if mine:
            parts.append("grads " + ", ".join(
                f"{g.parameter.rpartition('.')[2]} {short_dtype(g.dtype) if g.dtype else 'none'}"
                + (f" ({gradient_origin(bw, g)})" if gradient_origin(bw, g).startswith("cast")
                   else "")
                for g in mine
            ))  # fmt: skip
        if parts:
            lines.append(f"[{module or '(root)'}] backward: " + "; ".join(parts))
    return lines


def sixteen_bit_ops_of(recs: Sequence[NodeRecord]) -> list[NodeRecord]:
    return [r for r in recs if computes(r) and r.op != CAST_OP and r.out_dtype in SIXTEEN_BITS]


def _counted(name: str, n: int) -> str:
    return name if n == 1 else f"{name} x{n}"


def markdown_train(report: Report, depth: int | None = None) -> str:
    """The training step as Markdown for a pull request: summary, saved memory per layer and
    per dtype, gradient dtypes, backward casts and the backward's 16-bit ops.

    ``depth`` cuts module paths for the memory table (default: the deepest level holding
    numbered layers, ``model.decoder.layers.3``). The model's name and its module paths go
    through :mod:`ampgraph.report.escape`: a ``|`` or a newline in one cannot break a table.
    """
    bw = report.backward
    assert bw is not None
    setting = report.setting
    rows = [
        (
            f"**{escape_text(report.model)}**, training step, setting "
            f"{code_span(setting['name'], table=False)} ({caption(setting)}); loss "
            f"{code_span(str(bw.loss['expression']), table=False)} of "
            f"{code_span(str(bw.loss['output']), table=False)}; `loss.backward()` "
            f"{'inside' if bw.autocast else 'outside'} the autocast context"
        ),
        "",
    ]
    if bw.skipped:
        return "\n".join([*rows, f"No backward: {escape_text(bw.skipped)}."])
    memory = activation_bytes_by_dtype(bw.saved, ACTIVATION)
    dtypes = sorted(memory, key=lambda d: (d not in ("float32",), d))
    rows += [
        (
            f"Saved for backward: {saved_text(bw)}. Each storage counts once; saved parameters and "
            "inputs do not count (they are in memory anyway); autocast's 16-bit copies of parameters "
            "do (its cache keeps them for the backward)."
        ),
        "",
        "| module | "
        + " | ".join(f"activations {short_dtype(d)}" for d in dtypes)
        + " | parameter copies | total |",
        "|---|" + "---|" * (len(dtypes) + 2),
    ]
    cut = depth if depth is not None else _layer_depth(bw)
    per = by_module(bw.saved, cut, ACTIVATION)
    per_copy = by_module(bw.saved, cut, PARAMETER_COPY)
    for module in dict.fromkeys([*per, *per_copy]):
        row, copy = per.get(module, {}), sum(per_copy.get(module, {}).values())
        cells = [human_bytes(row[d]) if row.get(d) else "-" for d in dtypes]
        cells.append(human_bytes(copy) if copy else "-")
        total = human_bytes(sum(row.values()) + copy)
        rows.append(f"| {code_span(module)} | " + " | ".join(cells) + f" | {total} |")
    rows += ["", "| parameters | gradient | how | count |", "|---|---|---|---|"]
    how = Counter(
        (short_dtype(g.param_dtype), short_dtype(g.dtype) if g.dtype else "none",
         gradient_origin(bw, g) if g.dtype else "not used by the loss")
        for g in bw.gradients
    )  # fmt: skip
    for (p, d, origin), n in sorted(how.items(), key=lambda kv: -kv[1]):
        rows.append(f"| {p} | {d} | {origin} | {n} |")
    casts = cast_pairs(bw)
    low = Counter(base_name(r.op) for r in sixteen_bit_ops(bw))
    compute = sum(1 for r in bw.nodes if computes(r) and r.op != CAST_OP)
    rows += [
        "",
        f"Backward casts: {sum(casts.values())} ("
        + (", ".join(f"{short_dtype(a)}→{short_dtype(b)} ×{n}" for (a, b), n in casts.items())
           or "none")
        + f"). Backward ops in 16 bits: {sum(low.values())} of {compute} that compute ("
        + (", ".join(f"{k} ×{n}" for k, n in low.most_common()) or "none") + ").",
    ]  # fmt: skip
    if bw.check is not None and "compared" in bw.check:
        c = bw.check
        rows += ["", (f"Dispatcher check of the backward: {c['compared']} nodes compared, "
                     f"{c['disagreements']} disagreements.")]  # fmt: skip
    return "\n".join(rows)


def backward_check_lines(report: Report) -> list[str]:
    """The backward's dispatcher check: a summary line, then one line per disagreement."""
    bw = report.backward
    if bw is None:
        return []
    name = (
        f"{report.model} {report.setting['name']} backward ({report.setting['device_type']} "
        f"{short_dtype(report.setting['amp_dtype'])}"
        f"{', inside autocast' if bw.autocast else ''})"
    )
    if bw.skipped:
        return [f"{name}: not run: {bw.skipped}"]
    c = bw.check
    if c is None:
        return [f"{name}: not checked"]
    if "compared" not in c:
        return [f"{name}: not checked: {c.get('unavailable', 'no oracle')}"]
    n = c["disagreements"]
    lines = [(f"{name}: {c['compared']} nodes compared with the dispatcher, {n} "
             f"disagreement{'s' if n != 1 else ''}")]  # fmt: skip
    for rec in bw.disagreements:
        seen = (rec.check or {}).get("dispatcher", {})
        observed = (
            f"error: {seen['error']}" if "error" in seen
            else ", ".join(short_dtype(d) for d in seen.get("outputs", [])) or "-"
        )  # fmt: skip
        lines.append(
            f"  {rec.name} ({rec.op}, backward of {rec.forward or 'the loss'}): predicted "
            f"{', '.join(short_dtype(d) for d in rec.outputs) or '-'}, dispatcher {observed}"
        )
    return lines


def _layer_depth(bw: Backward) -> int | None:
    """The depth at which module paths reach numbered layers (``model.decoder.layers.3``)."""
    for t in bw.saved:
        if not t.module:
            continue
        parts = t.module.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                return sum(1 for p in parts[:i] if not p.isdigit())
    return 1


__all__ = [
    "backward_check_lines",
    "backward_lines",
    "cast_pairs",
    "gradient_origin",
    "markdown_train",
    "sixteen_bit_ops",
    "summary_lines",
]
