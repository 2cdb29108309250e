"""The text format: what a command prints for a person to read, one function per thing shown.

* a report's dispatcher check (:func:`check_summary`, :func:`disagreement_lines`) and its
  warnings (:func:`dtype_branches_warning`, :func:`data_dependent_warning`); the seed notebook's
  hook lines are report data (:func:`ampgraph.report.printed.hook_lines`);
* a training step (:func:`backward_lines`, :func:`backward_check_lines`);
* an audit (:func:`audit_text`);
* a value-ranges run (:func:`ranges_text`).

The diffs' text is :mod:`ampgraph.formats.diff_text`'s. Torch-free: everything here reads plain
records. (File formats, SVG, PNG, PDF and Graphviz source, are the renderer's:
:data:`ampgraph.render.FORMATS`.)

>>> from ampgraph.report.records import NodeRecord, Report
>>> print(check_summary(Report("m", {"name": "fp32"}, {}, {}, [], [])))
m fp32: not checked
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ampgraph.report.records import Backward, Gradient, NodeRecord, Report
from ampgraph.review.audit import Finding, audit, fmt_bytes, folded, summary, where
from ampgraph.review.fold import Fold, Names, fold
from ampgraph.settings import caption, short_dtype
from ampgraph.report.backward_ops import (
    base_name,
    gradient_origin,
    is_cast,
    module_order,
    sixteen_bit_ops_of,
)
from ampgraph.report.memory import (
    ACTIVATION,
    PARAMETER_COPY,
    activation_bytes_by_dtype,
    by_module,
    human_bytes,
    total_bytes,
)

if TYPE_CHECKING:  # annotations only: the ranges package imports torch
    from ampgraph.ranges.data import LossScale, RangeFinding, RangesResult, SettingRanges


#: What a report's ``capture["grad_mode"]`` means, as the headers say it.
_GRAD_MODES = {"inference": "inference (torch.inference_mode)", "grad": "grad on (a training step)"}


def grad_mode_words(report: Report) -> str | None:
    """The grad mode the forward was traced in, as a header says it; None for a report older
    than the field (it was traced with grad on).

    >>> grad_mode_words(Report("m", {}, {}, {"grad_mode": "inference"}, [], []))
    'inference (torch.inference_mode)'
    """
    mode = report.capture.get("grad_mode")
    return None if mode is None else _GRAD_MODES.get(mode, mode)


def check_summary(report: Report) -> str:
    """One line: how many nodes were compared with the dispatcher and how many disagree."""
    if report.check is None:
        return f"{report.model} {report.setting['name']}: not checked"
    c = report.check
    errors = len(report.errors)
    tail = f", {errors} node{'s' if errors != 1 else ''} raise" if errors else ""
    if c.get("not_analysed"):
        tail += f", {c['not_analysed']} not analysed (each node's record says why)"
    branches = (report.capture or {}).get("data_dependent")
    if branches is not None:
        tail += (
            f"; traced along the path seeded random values take through {len(branches)} "
            f"branch{'es' if len(branches) != 1 else ''} on data, whose other sides are not "
            "analysed"
        )
    return (
        f"{report.model} {report.setting['name']} ({report.setting['device_type']} "
        f"{short_dtype(report.setting['amp_dtype'])}): {c['compared']} nodes compared with the "
        f"dispatcher, {c['disagreements']} disagreement{'s' if c['disagreements'] != 1 else ''}"
        f"{tail}"
    )


def _disagreement_line(rec: NodeRecord) -> str:
    """What ampgraph predicted at one node and what the dispatcher did, after the node's name."""
    check = rec.check or {}
    predicted = (
        f"error: {rec.error}" if rec.error else ", ".join(short_dtype(d) for d in rec.outputs)
    )
    observed_d = check.get("dispatcher", {})
    observed = (
        f"error: {observed_d['error']}"
        if "error" in observed_d
        else "ran it, traced in this setting"
        if observed_d.get("ran_in_setting")
        else ", ".join(short_dtype(d) for d in observed_d.get("outputs", []))
    )
    extra = f"; export traced {check['export']}" if "export" in check else ""
    if "note" in check:
        extra = f"; {check['note']}"
    return f"predicted {predicted or '-'}, dispatcher {observed or '-'}{extra}"


def disagreement_lines(report: Report) -> list[str]:
    """The nodes whose annotation the dispatcher contradicts: a count per op first where there
    are several, then a line per node, one per run of identical layers (``layers.0-11 ×12``).

    >>> from ampgraph.report.records import NodeRecord
    >>> check = {"agree": False, "dispatcher": {"outputs": ["bfloat16"]}}
    >>> recs = [NodeRecord(f"relu_{i}", "aten.relu", "op", module=f"layers.{i}",
    ...                    outputs=["float32"], check=check) for i in range(3)]
    >>> r = Report("m", {"name": "fp32"}, {}, {}, recs, [], check={"compared": 3})
    >>> print("\\n".join(disagreement_lines(r)))
      3 disagreements: 3 aten.relu
      relu_0 … relu_2 (aten.relu, layers.0-2 ×3): predicted fp32, dispatcher bf16
    """
    recs = report.disagreements
    names = Names(report.nodes)
    entries = fold(recs, lambda r: r.module, lambda r, layer: (
        r.op, names.key(r.module, layer), names.node(r.name, layer),
        names.key(_disagreement_line(r), layer)))  # fmt: skip
    lines = []
    if len(entries) < len(recs) or len(recs) > 3:
        ops = Counter(r.op for r in recs)
        lines.append(f"  {len(recs)} disagreements: " + ", ".join(
            f"{n} {op}" for op, n in ops.most_common()))  # fmt: skip
    for e in entries:
        rec = e.first
        where, name = rec.module or "top level", rec.name
        if e.group is not None:
            where = f"{e.group.shown(rec.module)} ×{e.count}"
            name = f"{rec.name} … {e.items[-1].name}"
        text = _disagreement_line(rec)
        lines.append(f"  {name} ({rec.op}, {where}): "
                     f"{e.group.shown_text(text) if e.group else text}")  # fmt: skip
    return lines


def dtype_branches_warning(report: Report) -> str | None:
    """Where the tracer fixed a dtype-dependent branch once (hf-fx), as one warning; else None.

    >>> r = Report("m", {}, {}, {"method": "hf-fx+export", "dtype_branches": ["a", "b"]}, [], [])
    >>> dtype_branches_warning(r)[:52]
    'hf-fx+export took branches on dtypes once, in fp32 w'
    """
    branches = list((report.capture or {}).get("dtype_branches") or [])
    if not branches:
        return None
    where = ", ".join(branches[:3]) + (
        f" and {len(branches) - 3} more" if len(branches) > 3 else ""
    )
    return (
        f"{report.capture.get('method')} took branches on dtypes once, in fp32 without "
        f"autocast, in {len(branches)} module{'s' if len(branches) != 1 else ''} ({where}); in "
        "other settings a real run may take the other branch: --tracer export traces each setting"
    )


def data_dependent_warning(report: Report) -> str | None:
    """That a forward branching on data was traced along one path (draft export), or None.

    >>> r = Report("m", {}, {}, {"data_dependent": ["forward line 3: `if x.any():`"]}, [], [])
    >>> data_dependent_warning(r)[:60]
    'the forward branches on data values, which fake tensors do n'
    """
    branches = (report.capture or {}).get("data_dependent")
    if branches is None:
        return None
    where = "; ".join(branches[:2]) + (
        f"; and {len(branches) - 2} more" if len(branches) > 2 else ""
    )
    return (
        "the forward branches on data values, which fake tensors do not have: traced along the "
        "path seeded random weights and inputs take"
        + (f" ({where})" if where else "")
        + "; the other side of each branch is not analysed"
    )


# -- the training step ----------------------------------------------------------------------------
def _dtype_bytes(by_dtype: dict[str, int]) -> str:
    return ", ".join(f"{short_dtype(d)} {human_bytes(b)}" for d, b in sorted(by_dtype.items()))


def train_summary_lines(report: Report) -> list[str]:
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


def backward_lines(report: Report, only: Sequence[str] | None = None) -> list[str]:
    """Summary lines, then one line per module whose backward computes, in backward order.

    ``only`` keeps modules whose class (any base) is named, as for the forward's hook lines.

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
    bw = report.backward
    if bw is None:
        return []
    lines = train_summary_lines(report)
    if bw.skipped:
        return lines
    types = {c.path: set(c.bases) for c in report.modules}
    saved = by_module(bw.saved, kinds=ACTIVATION)
    copies = by_module(bw.saved, kinds=PARAMETER_COPY)
    grads: dict[str, list[Gradient]] = {}
    for g in bw.gradients:
        grads.setdefault(g.parameter.rpartition(".")[0], []).append(g)
    for module in module_order(report, bw):
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


def _counted(name: str, n: int) -> str:
    return name if n == 1 else f"{name} x{n}"


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


# -- the audit ------------------------------------------------------------------------------------
#: How many of the largest findings (by bytes, all their layers together) the summary names.
LARGEST = 3


def _total(entry: Fold[Finding]) -> int | None:
    b = entry.first.bytes
    return None if b is None else b * entry.count


def _where_shown(entry: Fold[Finding]) -> str:
    """``linear in lm_head (linear_72)``; ``linear in model.decoder.layers.0-11.fc1 ×12``."""
    f = entry.first
    if entry.group is None:
        return f"{where(f.op, f.module)} ({f.node})"
    return f"{where(f.op, entry.group.shown(f.module))} ×{entry.count}"


def largest_findings(entries: Sequence[Fold[Finding]]) -> list[str]:
    """The :data:`LARGEST` entries of most bytes (all their layers together), largest first."""
    sized = sorted((e for e in entries if _total(e)), key=lambda e: _total(e) or 0, reverse=True)
    return [f"{fmt_bytes(_total(e))} {e.first.kind} {_where_shown(e)}" for e in sized[:LARGEST]]


def _names(entry: Fold[Finding]) -> str:
    """``linear_72``, or ``linear … linear_66`` for a folded entry (first and last layer's)."""
    if entry.group is None:
        return entry.first.node
    return f"{entry.first.node} … {entry.items[-1].node}"


def finding_message(entry: Fold[Finding]) -> str:
    f = entry.first
    if entry.group is None:
        return f.message
    total = _total(entry)
    tail = "" if total is None else f"; ×{entry.count}: {fmt_bytes(total)}"
    return entry.group.shown_text(f.message) + tail


def audit_title(report: Report) -> str:
    s = report.setting
    return f"{report.model}, setting {s['name']} ({caption(s)})"


def audit_totals(
    report: Report, findings: Sequence[Finding], entries: Sequence[Fold[Finding]]
) -> list[str]:
    """The totals, and the count of each kind and of the entries listed."""
    s = summary(report, findings)
    c, p = s["casts"], s["promotions"]
    kinds = ", ".join(f"{n} {k}" for k, n in s["findings"].items()) or "none"
    folds = sum(e.group is not None for e in entries)
    listed = (
        f"; {len(entries)} entries below, {folds} of them identical layers folded "
        "(--format json lists each finding)" if folds else ""
    )  # fmt: skip
    lines = [
        f"promotions: {p['count']}, widened outputs {fmt_bytes(p['bytes'])} per forward",
        (
            f"autocast casts: {c['count']}, {fmt_bytes(c['bytes'])} per forward: {c['weights']} of "
            f"weights ({fmt_bytes(c['weights_bytes'])}; parameters kept in the dtype they are cast "
            f"to remove them), {c['activations']} of activations "
            f"({fmt_bytes(c['activations_bytes'])}; {c['from_inputs']} of the model's inputs, which "
            "an input passed in that dtype removes)"
        ),
        f"findings: {kinds}{listed}",
    ]
    return lines


def audit_text(report: Report, findings: Sequence[Finding] | None = None) -> str:
    """Plain text: a heading, the totals and the largest findings, then one line per finding (per
    run of identical layers) with its suggestion (and its source line, where the records know
    it) under it.

    >>> from ampgraph.report.records import Cast, NodeRecord, Report
    >>> def layer(i, linear):
    ...     return NodeRecord(linear, "aten.linear.default", "op", module=f"layers.{i}.fc",
    ...                       policy="lower_precision_fp", casts=[Cast("x", "float32", "bfloat16")],
    ...                       outputs=["bfloat16"], shapes=[[4, 8]])
    >>> setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
    ...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
    >>> x = NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[4, 8]])
    >>> report = Report("demo", setting, {}, {}, [x, layer(0, "linear"), layer(1, "linear_1")], [])
    >>> print(audit_text(report).splitlines()[-2])
    note    autocast-cast        layers.0-1 ×2 (linear … linear_1): autocast casts 1 tensor to bf16 before linear in layers.0-1.fc: 0 weights 0 B, 1 activation 64 B; ×2: 128 B
    """
    findings = audit(report) if findings is None else findings
    entries = folded(report, findings)
    lines = [f"# audit of {audit_title(report)}", *audit_totals(report, findings, entries)]
    if report.capture.get("stand_in"):
        lines.insert(1, f"note: {report.capture['stand_in']}")
    largest = largest_findings(entries) if len(entries) > 1 else []
    lines += (
        ["largest findings, bytes per forward:", *(f"  {x}" for x in largest)] if largest else []
    )
    if entries:
        lines.append("")
    for e in entries:
        f, head = e.first, _names(e)
        if e.group is not None:
            head = f"{e.group.label} ×{e.count} ({head})"
        lines.append(f"{f.severity:<7} {f.kind:<20} {head}: {finding_message(e)}")
        lines.append(f"{'':<28} suggestion: {f.suggestion}")
        if f.source is not None:
            lines.append(f"{'':<28} at {f.source['file']}:{f.source['line']}")
    return "\n".join(lines)


# -- value ranges ---------------------------------------------------------------------------------
#: Findings listed per setting in the text format before "... and N more".
SHOWN = 8


def _layerless(message: str) -> str:
    """A message with layer numbers and node suffixes folded, to count repeats of one finding."""
    return re.sub(r"_\d+\b", "_N", re.sub(r"\.\d+\.", ".N.", message))


def ranges_verdict(s: SettingRanges) -> str:
    if s.ok:
        return "fits"
    # Not ok without an error of its own: the fp32 run itself holds inf or NaN.
    return "OVERFLOWS" if any(f.severity == "error" for f in s.findings) else "NONFINITE"


def _precision_line(result: RangesResult) -> str | None:
    from ampgraph.ranges.data import LIMITS

    dtypes = sorted(
        {str(s.setting.get("amp_dtype")) for s in result.settings if s.setting.get("autocast")}
        | {str(s.setting.get("param_dtype")) for s in result.settings}
    )
    parts = [
        f"{short_dtype(d)} keeps {LIMITS[d].bits} significant bits (rounding error up to "
        f"{LIMITS[d].eps / 2:.3%})"
        for d in dtypes
        if d in ("float16", "bfloat16")
    ]
    return "precision: " + "; ".join(parts) if parts else None


def _grouped(findings: list[RangeFinding]) -> list[tuple[RangeFinding, int]]:
    counts: Counter[str] = Counter()
    first: dict[str, RangeFinding] = {}
    for f in findings:
        key = _layerless(f.message)
        counts[key] += 1
        first.setdefault(key, f)
    return [(first[k], counts[k]) for k in first]


def _room(s: SettingRanges) -> str:
    least = s.min_headroom()
    return f"{least[1]:+.1f}" if least is not None else "-"


def ranges_train_lines(result: RangesResult) -> list[str]:
    """``--pass train``: the loss, and each setting's fp16 loss scale in a line."""
    from ampgraph.ranges.gradients import describe

    if result.pass_ != "train" or result.loss is None:
        return []
    loss = result.loss
    which = f"the output {loss['output']!r}" if loss["output"] else "the model's output"
    value = loss["value"] if isinstance(loss["value"], str) else f"{loss['value']:.4g}"
    lines = ["", f"gradients: loss = {loss['expression']} of {which} = {value} in the fp32 run; "
             f"{len(result.parameter_gradients)} parameter gradients"]  # fmt: skip
    width = max([len(s.name) for s in result.settings] + [10])
    for name, scale in loss_scales(result):
        first, *rest = describe(scale)
        lines += [f"  {name:<{width}}  {first}", *(f"  {'':<{width}}  {r}" for r in rest)]
    return lines


def loss_scales(result: RangesResult) -> list[tuple[str, LossScale]]:
    """Each setting's fp16 loss scale, then the one were every gradient fp16 ("all fp16")."""
    named = [(s.name, s.loss_scale) for s in result.settings] + [("all fp16", result.loss_scale)]
    return [(n, scale) for n, scale in named if scale is not None]


def ranges_text(result: RangesResult) -> str:
    """The table and summary: one screen.

    >>> from ampgraph.ranges.data import RangesResult, SettingRanges
    >>> r = RangesResult("m", "seeded random weights (seed 0)", 0, {"name": "fp32"}, [],
    ...                  [SettingRanges({"name": "amp-fp32"}, "autocast bf16, parameters fp32")])
    >>> print(ranges_text(r).splitlines()[3])
      amp-fp32 fits              -  autocast bf16, parameters fp32
    """
    width = max([len(s.name) for s in result.settings] + [7])
    lines = [
        f"{result.model}: value ranges of one fp32 run on the CPU ({result.weights})",
        "",
        f"  {'setting':<{width}} {'verdict':<10}{'headroom':>9}  dtypes",
    ]
    for s in result.settings:
        lines.append(f"  {s.name:<{width}} {ranges_verdict(s):<10}{_room(s):>9}  {s.caption}")
        if s.first is not None:
            lines.append(f"  {'':<{width}} first: {s.first.message}")
    lines.append(
        "headroom: decades from the largest 16-bit value to its dtype's largest finite number "
        "(negative: overflow)"
    )
    lines += ranges_train_lines(result)
    for s in result.settings:
        rest = [f for f in s.findings if f.severity != "note" and f is not s.first]
        if not rest:
            continue
        lines += ["", f"# {s.name}: {len(rest)} more finding{'s' * (len(rest) != 1)}"]
        groups = _grouped(rest)
        for f, n in groups[:SHOWN]:
            times = f" (x{n})" if n > 1 else ""
            lines.append(f"  {f.severity:<8}{f.message}{times}")
        if len(groups) > SHOWN:
            lines.append(f"  ... and {len(groups) - SHOWN} more (--format json)")
    if result.reference_findings:
        lines.append("")
    lines += [f"fp32 run: {f.message}" for f in result.reference_findings]
    notes = [(s.name, sum(f.severity == "note" for f in s.findings)) for s in result.settings]
    if any(n for _, n in notes):
        counts = ", ".join(f"{name} {n}" for name, n in notes if n)
        lines += ["", f"notes (values that lose bits as subnormals or flush to zero): {counts} "
                      "(--format json lists them)"]  # fmt: skip
    precision = _precision_line(result)
    if precision:
        lines += ["", precision]
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "LARGEST",
    "SHOWN",
    "audit_text",
    "audit_title",
    "audit_totals",
    "backward_check_lines",
    "backward_lines",
    "check_summary",
    "data_dependent_warning",
    "disagreement_lines",
    "dtype_branches_warning",
    "finding_message",
    "grad_mode_words",
    "largest_findings",
    "loss_scales",
    "ranges_text",
    "ranges_train_lines",
    "ranges_verdict",
    "saved_text",
    "train_summary_lines",
]
