"""Judge the fp32 run's gradients against each setting's gradient dtypes, and the loss scale.

Torch-free. A setting's train report says each parameter gradient's dtype
(``report.backward.gradients``); the gradient flowing into a forward node's output has that
output's dtype (autograd's engine casts each gradient to its tensor's dtype), so a 16-bit
activation has a 16-bit gradient. Each is judged unscaled, as the forward's values are
(``gradient-overflow``, ``gradient-flush-to-zero``), and the setting's fp16 gradients give the
loss scale that keeps them finite (:func:`loss_scale`), with those that still flush to zero at it
(``scaled-underflow``).

>>> from ampgraph.ranges.data import ValueRange
>>> s = loss_scale([("fc1.weight", ValueRange("float32", 8, max_abs=8.0e4, min_nonzero=1e-6))])
>>> s.log2, s.init_overflows, s.halvings, s.underflow
(-1, True, 17, [])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ampgraph.ranges.data import LIMITS, LossScale, NodeRange, RangeFinding, ValueRange
from ampgraph.ranges.judge import NARROW, pair_nodes
from ampgraph.report.records import NodeRecord, Report
from ampgraph.settings import short_dtype

FP16 = LIMITS["float16"]


def loss_scale(gradients: Sequence[tuple[str, ValueRange]]) -> LossScale:
    """The largest power of two S with ``max|grad| * S <= 65504`` over ``gradients`` (name,
    range) taken as fp16, and which of them still flush to zero in fp16 at S.

    >>> loss_scale([("g", ValueRange("float32", 2, max_abs=1.0, min_nonzero=2.0**-45))]).log2
    15
    >>> loss_scale([("g", ValueRange("float32", 2, max_abs=1.0, min_nonzero=2.0**-45))]).underflow
    ['g']
    """
    live = [(n, g) for n, g in gradients if g.max_abs is not None]
    out = LossScale(judged=len(gradients))
    if not live:
        return out
    out.node, top = max(((n, float(g.max_abs or 0.0)) for n, g in live), key=lambda p: p[1])
    out.max_abs = top
    k = math.floor(math.log2(FP16.max / top))
    while top * math.ldexp(1.0, k) > FP16.max:  # log2's rounding, at an exact power of two
        k -= 1
    while top * math.ldexp(1.0, k + 1) <= FP16.max:
        k += 1
    out.log2 = k
    out.underflow = [
        n for n, g in live
        if g.min_nonzero is not None and FP16.flushes(g.min_nonzero * math.ldexp(1.0, k))
    ]  # fmt: skip
    return out


def _finding(kind: str, where: str, rec: NodeRecord | None, dtype: str, value: float,
             limit: float, text: str, reference: str | None) -> RangeFinding:  # fmt: skip
    if rec is not None:
        return RangeFinding(kind, rec.name, rec.op, rec.module, dtype, value, limit, text,
                            reference=reference)  # fmt: skip
    module = where.rsplit(".", 1)[0] if "." in where else None  # a parameter's module
    return RangeFinding(kind, where, "parameter", module, dtype, value, limit, text,
                        reference=reference)  # fmt: skip


def _judge_one(where: str, rec: NodeRecord | None, dtype: str, g: ValueRange,
               reference: str | None) -> list[RangeFinding]:  # fmt: skip
    lim, short = LIMITS[dtype], short_dtype(dtype)
    found = []
    if g.max_abs is not None and lim.overflows(g.max_abs):
        fix = (
            "it needs a loss scale below 1 (GradScaler backs off to one), or bf16"
            if dtype == "float16"
            else "keep it in fp32"
        )
        text = (f"gradient of {where}: max {g.max_abs:.3g} > {short}'s {lim.max:,.6g} unscaled; "
                f"{fix}")  # fmt: skip
        found.append(_finding("gradient-overflow", where, rec, dtype, g.max_abs, lim.max, text,
                              reference))  # fmt: skip
    if g.min_nonzero is not None and lim.flushes(g.min_nonzero):
        text = (f"gradient of {where}: min non-zero {g.min_nonzero:.3g} becomes 0 in {short} "
                "unscaled")  # fmt: skip
        found.append(_finding("gradient-flush-to-zero", where, rec, dtype, g.min_nonzero,
                              lim.subnormal, text, reference))  # fmt: skip
    return found


def _where(rec: NodeRecord) -> str:
    op = rec.op.removeprefix("aten.").split(".")[0]
    return f"{op} in {rec.module} ({rec.name})" if rec.module else f"{op} ({rec.name})"


def _source_gradient(
    src: NodeRecord, pairs: Mapping[str, str], ranges: Mapping[str, NodeRange],
    parameters: Mapping[str, ValueRange],
) -> ValueRange | None:  # fmt: skip
    if src.kind == "parameter":
        return parameters.get(src.target or "")
    ref = ranges.get(pairs.get(src.name, ""))
    return ref.gradients[0] if ref is not None and ref.gradients else None


#: An fp16 gradient: its label (what the text names), range, node record and reference value.
Fp16 = tuple[str, ValueRange, NodeRecord | None, str | None]


def _judge_casts(
    report: Report, pairs: Mapping[str, str], ranges: Mapping[str, NodeRange],
    parameters: Mapping[str, ValueRange], findings: list[RangeFinding],
) -> list[Fp16]:  # fmt: skip
    """The gradients of autocast's 16-bit copies (of a weight, of an fp32 activation): autograd
    computes them in 16 bits, then casts them back. Each is the gradient of what it casts where
    the copy is that value's only use (a weight used once, as most are)."""
    by_name = {r.name: r for r in report.nodes}
    fp16: list[Fp16] = []
    for rec in report.nodes:
        for cast in rec.casts:
            src = by_name.get(cast.node)
            if src is None or cast.to_dtype not in NARROW or cast.from_dtype in NARROW:
                continue
            g = _source_gradient(src, pairs, ranges, parameters)
            if g is None:
                continue
            label = str(src.target) if src.kind == "parameter" else _where(src)
            where = f"{label}'s {short_dtype(cast.to_dtype)} copy for {_where(rec)}"
            reference = src.target if src.kind == "parameter" else pairs.get(src.name)
            findings += _judge_one(where, rec, cast.to_dtype, g, reference)
            if cast.to_dtype == "float16":
                fp16.append((f"{label} (fp16 copy)", g, rec, reference))
    return fp16


def judge_gradients(
    report: Report,
    ref_nodes: Sequence[NodeRecord],
    ranges: Mapping[str, NodeRange],
    parameters: Mapping[str, ValueRange],
) -> tuple[list[RangeFinding], LossScale | None]:
    """``report``'s (a train report's) gradients judged in their dtypes, and its fp16 loss scale
    (None where the report has no backward or it was skipped)."""
    if report.backward is None or report.backward.skipped:
        return [], None
    pairs = pair_nodes(ref_nodes, report.nodes)
    findings: list[RangeFinding] = []
    fp16: list[Fp16] = []
    for rec in report.nodes:
        ref = ranges.get(pairs.get(rec.name, ""))
        if ref is None or not ref.gradients:
            continue
        for dtype, g in zip(rec.outputs, ref.gradients):
            if g is None or dtype not in NARROW:
                continue
            findings += _judge_one(_where(rec), rec, dtype, g, ref.name)
            if dtype == "float16":
                fp16.append((_where(rec), g, rec, ref.name))
    fp16 += _judge_casts(report, pairs, ranges, parameters, findings)
    for grad in report.backward.gradients:
        g = parameters.get(grad.parameter)
        if g is None or grad.dtype not in NARROW:
            continue
        findings += _judge_one(grad.parameter, None, grad.dtype, g, grad.parameter)
        if grad.dtype == "float16":
            fp16.append((grad.parameter, g, None, grad.parameter))
    scale = loss_scale([(label, g) for label, g, _r, _ref in fp16])
    entries = {label: (g, rec, ref) for label, g, rec, ref in fp16}
    for label in scale.underflow:
        g, rec, ref = entries[label]
        low = float(g.min_nonzero or 0.0)
        text = (f"gradient of {label}: min non-zero {low:.3g} is {low * (scale.scale or 1.0):.3g} "
                f"at the loss scale 2**{scale.log2}: still 0 in fp16")  # fmt: skip
        findings.append(_finding("scaled-underflow", label, rec, "float16", low, FP16.subnormal,
                                 text, ref))  # fmt: skip
    return findings, scale


def describe(scale: LossScale) -> list[str]:
    """The loss scale in short lines, as the text format prints them.

    >>> from ampgraph.ranges.data import LossScale
    >>> print("\\n".join(describe(LossScale(3, 8.0e4, "fc1.weight", -1))))
    loss scale <= 2**-1 keeps the fp16 gradients finite (max 8e+04 at fc1.weight)
    GradScaler's init 2**16 overflows at step 1: 17 halvings (skipped steps) before a finite one
    """
    if scale.log2 is None:
        return [f"no non-zero fp16 gradient ({scale.judged} judged): no loss scale needed"]
    lines = [
        f"loss scale <= 2**{scale.log2} keeps the fp16 gradients finite (max "
        f"{scale.max_abs:.3g} at {scale.node})",
        f"GradScaler's init 2**16 overflows at step 1: {scale.halvings} halvings (skipped steps) "
        "before a finite one" if scale.init_overflows else "GradScaler's init 2**16 fits",
    ]  # fmt: skip
    if scale.underflow:
        shown = ", ".join(scale.underflow[:2]) + (", ..." if len(scale.underflow) > 2 else "")
        lines.append(f"at 2**{scale.log2}, {len(scale.underflow)} still flush to 0: {shown}")
    return lines


__all__ = ["describe", "judge_gradients", "loss_scale"]
