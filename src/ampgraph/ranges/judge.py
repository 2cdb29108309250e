"""Judge the fp32 run's ranges against the dtypes a setting gives each node. Torch-free.

The reference run and a setting's analysis are two graphs (the setting's is traced in it, so a
recipe's casts or a dtype the model read at trace time may add nodes): :func:`pair_nodes` pairs
them as ``ampgraph diff`` does, graph inputs by kind and target and the rest by module and op, and
a cast node the reference lacks stands for the value it casts. Then, node by node in the
setting's order (:func:`judge_setting`):

* each 16-bit output whose largest magnitude rounds to inf there (``overflow``), whose smallest
  non-zero magnitude rounds to zero (``flush-to-zero``) or falls below the smallest normal number
  (``subnormal``, with the significant bits it keeps);
* each cast autocast makes to a 16-bit dtype, of a value that does not fit it (``cast-overflow``);
* each floating constant of a fill, mask or pad that does not fit the node's dtype: those kernels
  check the range and raise (``constant-raises``), others make it inf (``constant-overflow``).

>>> from ampgraph.report.records import NodeRecord, Report
>>> from ampgraph.ranges.data import NodeRange, ValueRange
>>> ref = [NodeRecord("fc", "aten.linear.default", "op", module="fc", outputs=["float32"])]
>>> ranges = {"fc": NodeRange("fc", "aten.linear.default", "op", "fc",
...                           [ValueRange("float32", 8, max_abs=1.3e5, min_nonzero=0.1)])}
>>> half = [NodeRecord("fc", "aten.linear.default", "op", module="fc", outputs=["float16"],
...                    policy="lower_precision_fp")]
>>> setting = {"name": "amp-fp32", "autocast": True, "amp_dtype": "float16",
...            "param_dtype": "float32", "device_type": "cuda"}
>>> verdict = judge_setting(Report("m", setting, {}, {}, half, []), ref, ranges, {})
>>> print(verdict.first.message.replace("; ", ";\\n"))
linear in fc (fc): max 1.3e+05 > fp16's 65,504;
autocast runs linear in fp16 because it is on the lower-precision list;
keep it in fp32 or use bf16
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from difflib import SequenceMatcher

from ampgraph.ranges.data import (
    LIMITS,
    NodeRange,
    RangeFinding,
    SettingRanges,
    ValueRange,
)
from ampgraph.report.records import PLACEHOLDER_KINDS, NodeRecord, Report
from ampgraph.settings import caption, short_dtype

#: 16-bit dtypes whose range is judged (fp32 and wider are the reference's own).
NARROW = ("float16", "bfloat16")
#: Ops that convert a value's dtype and nothing else: unpaired, they stand for their input.
CONVERSIONS = (
    "aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
    "aten._to_copy", "prims.convert_element_type.default",
)  # fmt: skip
#: Ops whose kernel checks a scalar against the output dtype and raises ("value cannot be
#: converted to type c10::Half without overflow"); other ops turn it into inf.
RANGE_CHECKED = (
    "aten.masked_fill", "aten.fill", "aten.full", "aten.full_like", "aten.new_full",
    "aten.constant_pad_nd", "aten.pad", "aten.clamp", "aten.clamp_min", "aten.clamp_max",
)  # fmt: skip
#: Ops that put a scalar argument into their output as it is (a mask value) without checking it:
#: it becomes inf. Other ops' numbers are sizes, dims and factors, whose effect the values show.
SCALAR_VALUES = ("aten.where", "aten.scalar_tensor", "aten.index_fill")


def _key(rec: NodeRecord) -> tuple[str, str]:
    return (rec.kind, rec.target or rec.name)


def pair_nodes(ref: Sequence[NodeRecord], other: Sequence[NodeRecord]) -> dict[str, str]:
    """Node name in ``other`` -> its counterpart's name in ``ref`` (the reference run's graph).

    >>> from ampgraph.report.records import NodeRecord as N
    >>> a = [N("relu", "aten.relu.default", "op", module="m")]
    >>> b = [N("_to_copy", "aten._to_copy.default", "op", module="m"),
    ...      N("relu_1", "aten.relu.default", "op", module="m")]
    >>> pair_nodes(a, b)
    {'relu_1': 'relu'}
    """
    pairs: dict[str, str] = {}
    by_key = {_key(r): r.name for r in ref if r.kind in PLACEHOLDER_KINDS}
    for rec in other:
        if rec.kind in PLACEHOLDER_KINDS and _key(rec) in by_key:
            pairs[rec.name] = by_key[_key(rec)]
    groups: dict[tuple[str | None, bool], tuple[list[NodeRecord], list[NodeRecord]]] = {}
    for side, nodes in enumerate((ref, other)):
        for rec in nodes:
            if rec.kind not in PLACEHOLDER_KINDS:
                groups.setdefault((rec.module, rec.kind == "output"), ([], []))[side].append(rec)
    for sa, sb in groups.values():
        matcher = SequenceMatcher(None, [r.op for r in sa], [r.op for r in sb], autojunk=False)
        for block in matcher.get_matching_blocks():
            for i in range(block.size):
                pairs[sb[block.b + i].name] = sa[block.a + i].name
    return pairs


def _what(rec: NodeRecord) -> str:
    """``linear in model.decoder.layers.7.fc2 (linear_45)``."""
    op = rec.op.removeprefix("aten.").split(".")[0]
    return f"{op} in {rec.module} ({rec.name})" if rec.module else f"{op} ({rec.name})"


def _why(rec: NodeRecord, dtype: str, setting: Mapping[str, object]) -> str:
    op = rec.op.removeprefix("aten.").split(".")[0]
    short = short_dtype(dtype)
    if rec.policy == "lower_precision_fp":
        return f"autocast runs {op} in {short} because it is on the lower-precision list"
    if rec.kind in ("parameter", "buffer"):
        return f"the parameters are {short}"
    if rec.policy is not None:  # another autocast policy that still gives 16 bits
        return f"autocast's {rec.policy} policy runs {op} in {short}"
    if not setting.get("autocast") and setting.get("param_dtype") == dtype:
        return f"no autocast: the parameters are {short} and {op} runs in its inputs' dtype"
    return f"{op} has no autocast policy and runs in its inputs' dtype, {short}"


def _advice(dtype: str, magnitude: float) -> str:
    if dtype == "float16" and not LIMITS["bfloat16"].overflows(magnitude):
        return "keep it in fp32 or use bf16"
    return "keep it in fp32"


def _value_findings(
    rec: NodeRecord, dtype: str, vr: ValueRange, setting: Mapping[str, object],
    producer: str | None = None,
) -> list[RangeFinding]:  # fmt: skip
    lim, short = LIMITS[dtype], short_dtype(dtype)
    found: list[RangeFinding] = []
    head = _what(rec) if producer is None else f"{_what(rec)}, its input {producer} cast to {short}"
    kind = "overflow" if producer is None else "cast-overflow"
    if vr.max_abs is not None and lim.overflows(vr.max_abs):
        text = (
            f"{head}: max {vr.max_abs:.3g} > {short}'s {lim.max:,.6g}; "
            f"{_why(rec, dtype, setting)}; {_advice(dtype, vr.max_abs)}"
        )
        found.append(RangeFinding(kind, rec.name, rec.op, rec.module, dtype, vr.max_abs, lim.max,
                                  text, producer))  # fmt: skip
    low = vr.min_nonzero
    if low is not None and lim.flushes(low):
        text = (
            f"{head}: min non-zero {low:.3g} < half {short}'s smallest subnormal "
            f"{lim.subnormal:.3g}: the smallest values become 0; {_why(rec, dtype, setting)}"
        )
        found.append(RangeFinding("flush-to-zero", rec.name, rec.op, rec.module, dtype, low,
                                  lim.subnormal, text, producer))  # fmt: skip
    elif low is not None and low < lim.tiny and producer is None:
        text = (
            f"{head}: min non-zero {low:.3g} < {short}'s smallest normal {lim.tiny:.3g}: "
            f"keeps {lim.bits_kept(low)} of {lim.bits} significant bits"
        )
        found.append(RangeFinding("subnormal", rec.name, rec.op, rec.module, dtype, low,
                                  lim.tiny, text))  # fmt: skip
    return found


def _predicted_raise(rec: NodeRecord, values: Sequence[float]) -> list[RangeFinding]:
    """The annotation already predicts the kernel's range check raising (its fake kernels check
    Python scalars as the real ones do): the same finding, with the constant and dtype named."""
    dtype = next((str(i.get("dtype")) for i in rec.inputs if i.get("dtype") in NARROW), None)
    if dtype is None:
        return []
    lim = LIMITS[dtype]
    c = next((v for v in values if math.isfinite(v) and abs(v) > lim.max), math.nan)
    text = (
        f"{_what(rec)}: constant {c:.4g} does not fit {short_dtype(dtype)} (max {lim.max:,.6g}): "
        f"the kernel raises '{rec.error}'; use torch.finfo(x.dtype).min or -inf for masks"
    )
    return [RangeFinding("constant-raises", rec.name, rec.op, rec.module, dtype, c, lim.max, text)]


def _constant_findings(rec: NodeRecord, values: Sequence[float]) -> list[RangeFinding]:
    if rec.error is not None:
        return _predicted_raise(rec, values) if "without overflow" in rec.error else []
    dtype = rec.out_dtype
    if dtype not in NARROW:
        return []
    lim, short = LIMITS[dtype], short_dtype(dtype)
    base = rec.op.rsplit(".", 1)[0]
    checked = base in RANGE_CHECKED
    if not checked and base not in SCALAR_VALUES:
        return []
    found = []
    for c in values:
        if not math.isfinite(c) or abs(c) <= lim.max or (not checked and not lim.overflows(abs(c))):
            continue
        kind = "constant-raises" if checked else "constant-overflow"
        effect = (
            f"the kernel raises 'value cannot be converted to type {short} without overflow'"
            if checked
            else "it becomes inf"
        )
        text = (
            f"{_what(rec)}: constant {c:.4g} does not fit {short} (max {lim.max:,.6g}): {effect}; "
            "use torch.finfo(x.dtype).min or -inf for masks"
        )
        found.append(RangeFinding(kind, rec.name, rec.op, rec.module, dtype, c, lim.max, text))
    return found


def _reference_of(
    rec: NodeRecord, pairs: Mapping[str, str], ranges: Mapping[str, NodeRange]
) -> NodeRange | None:
    name = pairs.get(rec.name)
    if name is None and rec.op in CONVERSIONS and rec.inputs:
        name = pairs.get(str(rec.inputs[0].get("node")))  # a cast stands for what it casts
    return ranges.get(name) if name is not None else None


def judge_setting(
    report: Report,
    ref_nodes: Sequence[NodeRecord],
    ranges: Mapping[str, NodeRange],
    constants: Mapping[str, Sequence[float]],
) -> SettingRanges:
    """The findings for ``report``'s setting, from the reference ranges of its paired nodes."""
    pairs = pair_nodes(ref_nodes, report.nodes)
    out = SettingRanges(report.setting, caption(report.setting))
    for rec in report.nodes:
        start = len(out.findings)
        out.findings += _constant_findings(rec, constants.get(rec.name, ()))
        ref = _reference_of(rec, pairs, ranges)
        _name_reference(out.findings[start:], ref.name if ref else pairs.get(rec.name))
        if ref is None:
            if rec.kind not in PLACEHOLDER_KINDS and rec.kind != "output":
                out.unpaired.append(rec.name)
            continue
        if ref.error is not None:
            continue
        out.judged += 1
        for dtype, vr in zip(rec.outputs, ref.outputs):
            if dtype in NARROW and vr is not None:
                out.findings += _value_findings(rec, dtype, vr, report.setting)
                room = LIMITS[dtype].headroom(vr.max_abs)
                if room is not None:
                    out.headroom[rec.name] = min(room, out.headroom.get(rec.name, math.inf))
        for cast in rec.casts:
            src = ranges.get(pairs.get(cast.node, ""))
            vr = src.outputs[0] if src is not None and src.outputs else None
            if cast.to_dtype in NARROW and cast.from_dtype not in NARROW and vr is not None:
                out.findings += _value_findings(
                    rec, cast.to_dtype, vr, report.setting, producer=cast.node
                )
        _name_reference(out.findings[start:], ref.name)
    return out


def _name_reference(findings: Sequence[RangeFinding], reference: str | None) -> None:
    """Each finding's reference-run node: what compares it with another setting's (``--diff``)."""
    for f in findings:
        if f.reference is None:
            f.reference = reference


def reference_findings(
    ref_nodes: Sequence[NodeRecord], ranges: Mapping[str, NodeRange]
) -> list[RangeFinding]:
    """What goes wrong in the fp32 run itself, where it starts: inf or NaN from finite inputs, and
    products that underflow to zero in fp32 (in every setting, then)."""
    found: list[RangeFinding] = []
    bad: set[str] = set()
    for rec in ref_nodes:
        rng = ranges.get(rec.name)
        if rng is None or rng.error is not None:
            continue
        outs = [o for o in rng.outputs if o is not None]
        nonfinite = [o for o in outs if o.infs or o.nans]
        inherited = any(str(i.get("node")) in bad for i in rec.inputs)
        if nonfinite:
            bad.add(rec.name)
            if not inherited:
                o = nonfinite[0]
                text = (
                    f"{_what(rec)}: {o.infs} inf and {o.nans} NaN of {o.numel} values already in "
                    "the fp32 run, from finite inputs: in every setting"
                    if rec.op != "placeholder"
                    else f"the {rec.kind} {rec.target or rec.name} ({rec.name}) holds {o.infs} "
                    f"inf and {o.nans} NaN of its {o.numel} values: the fp32 run is not finite "
                    "from its start, in every setting"
                )
                found.append(RangeFinding("reference-nonfinite", rec.name, rec.op, rec.module,
                                          o.dtype, float(o.infs + o.nans), 0.0, text))  # fmt: skip
        for o in outs:
            if o.underflowed:
                true = f"~1e{o.log10_true:.0f}" if o.log10_true is not None else "unknown"
                text = (
                    f"{_what(rec)}: {o.underflowed} value{'s' * (o.underflowed != 1)} underflow "
                    f"to 0 already in fp32 (true magnitude {true}): 0 in every setting; sum "
                    "logarithms instead of multiplying"
                )
                magnitude = float(o.log10_true or 0.0)
                found.append(RangeFinding("reference-underflow", rec.name, rec.op, rec.module,
                                          o.dtype, magnitude, 0.0, text))  # fmt: skip
    return found


__all__ = [
    "CONVERSIONS", "NARROW", "RANGE_CHECKED", "SCALAR_VALUES", "judge_setting", "pair_nodes",
    "reference_findings",
]  # fmt: skip
