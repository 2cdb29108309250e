"""The Markdown format: what a command writes for a pull request or a docs page.

One function per thing shown: a report's module calls (:func:`markdown_table`), the dispatcher
check (:func:`check_markdown`), a training step (:func:`markdown_train`), an audit
(:func:`audit_markdown`), a value-ranges run (:func:`ranges_markdown`) and a diff
(:func:`diff_markdown`). The model's own text (module, class and node names, messages that
mention them) goes through :mod:`ampgraph.report.escape`, so none of it can break a table or
become a link. The words are the text format's (:mod:`ampgraph.formats.text`,
:mod:`ampgraph.formats.diff_text`); torch-free.

>>> from ampgraph.report.records import Report
>>> print(check_markdown([Report("m", {"name": "fp32"}, {}, {}, [], [])]).splitlines()[0])
| model | setting | nodes compared | disagreements | nodes that raise | not analysed |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ampgraph.formats.diff_text import (
    change_text,
    describe,
    diff_totals_line,
    grouped_changes,
    inputs_name,
    largest_changes,
    listed_changes,
)
from ampgraph.formats.text import (
    SHOWN,
    audit_title,
    audit_totals,
    check_summary,
    disagreement_lines,
    finding_message,
    grad_mode_words,
    largest_findings,
    loss_scales,
    ranges_train_lines,
    ranges_verdict,
    saved_text,
)
from ampgraph.policy import CATEGORY_LABEL
from ampgraph.report.escape import code_span, escape_text
from ampgraph.report.printed import printed_calls
from ampgraph.report.records import NodeRecord, Report
from ampgraph.review.audit import Finding, audit, folded
from ampgraph.review.diff import ReportDiff
from ampgraph.settings import caption, short_dtype
from ampgraph.report.backward_ops import (
    CAST_OP,
    base_name,
    cast_pairs,
    computes,
    gradient_origin,
    layer_depth,
    sixteen_bit_ops,
)
from ampgraph.report.memory import (
    ACTIVATION,
    PARAMETER_COPY,
    activation_bytes_by_dtype,
    by_module,
    human_bytes,
)

if TYPE_CHECKING:  # annotations only: the ranges package imports torch
    from ampgraph.ranges.data import RangesResult


def _casts_text(recs: Iterable[NodeRecord]) -> str:
    casts = [c for r in recs for c in r.casts]
    return ", ".join(
        f"{c.node} {short_dtype(c.from_dtype)}→{short_dtype(c.to_dtype)}" for c in casts
    )


def _grad_mode_suffix(report: Report) -> str:
    words = grad_mode_words(report)
    return "" if words is None else f"; {words}"


def markdown_table(report: Report, only: Sequence[str] | None = None) -> str:
    """A Markdown table of the leaf-module calls, for pasting into a pull request.

    Module paths, class names and node names are the model's own text: they go through
    :mod:`ampgraph.report.escape`, so a ``|``, a newline or a link in one stays text in its cell.

    >>> from ampgraph.report.records import ModuleCall
    >>> setting = {"name": "fp32", "device_type": "cuda", "autocast": False,
    ...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
    >>> call = ModuleCall("a|b", "m.<i>", ["<i>"], "a|b", "float32", "float32", [])
    >>> print(markdown_table(Report("m", setting, {}, {}, [], [call])).splitlines()[-1])
    | `a\\|b` | \\<i> | fp32 | fp32 | none | - |
    """
    setting = report.setting
    head = (
        f"**{escape_text(report.model)}**, setting {code_span(setting['name'], table=False)} "
        f"({caption(setting)}{_grad_mode_suffix(report)})"
    )
    rows = [
        head,
        "",
        "| module | type | in | out | policy | autocast casts |",
        "|---|---|---|---|---|---|",
    ]
    for call, error in printed_calls(report, only):
        recs = [report.node(n) for n in call.nodes]
        policies = sorted({CATEGORY_LABEL[r.policy] for r in recs if r.policy})
        out = f"error: {error}" if error else short_dtype(call.out_dtype)
        rows.append(
            f"| {code_span(call.path)} | {escape_text(call.type.rsplit('.', 1)[-1])} "
            f"| {short_dtype(call.in_dtype)} | {escape_text(out)} "
            f"| {', '.join(policies) or 'none'} | {escape_text(_casts_text(recs)) or '-'} |"
        )
    if report.check is not None:
        rows += ["", escape_text(check_summary(report), line_start=True)]
    return "\n".join(rows)


def check_markdown(reports: Sequence[Report]) -> str:
    """The dispatcher check as a Markdown table, for a pull request (``check --format markdown``).

    >>> r = Report("m", {"name": "fp32"}, {}, {}, [], [], check={"compared": 3, "disagreements": 0})
    >>> print(check_markdown([r]).splitlines()[2])
    | `m` | fp32 | 3 | 0 | 0 | 0 |
    """
    rows = [
        "| model | setting | nodes compared | disagreements | nodes that raise | not analysed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    details: list[str] = []
    for report in reports:
        c = report.check or {}
        rows.append(
            f"| {code_span(report.model)} | {escape_text(str(report.setting.get('name')))} "
            f"| {c.get('compared', '-')} | {c.get('disagreements', '-')} | {len(report.errors)} "
            f"| {c.get('not_analysed', 0)} |"
        )
        # The lines name nodes and modules: the model's text, escaped as the table's is (after
        # their indent, which escape_text would keep as references).
        details += [
            f"- {escape_text(str(report.setting.get('name')), line_start=True)}:  "
            f"{escape_text(line.removeprefix('  '))}"
            for line in disagreement_lines(report)
        ]
    if details:
        rows += ["", "Disagreements:", "", *details]
    return "\n".join(rows)


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
    cut = depth if depth is not None else layer_depth(bw)
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


def _at(f: Finding) -> str:
    """`` at `modeling_opt.py:389` `` for a finding with a source line (the file's name only:
    the table stays narrow; text, JSON and SARIF give the path)."""
    if f.source is None:
        return ""
    place = f"{Path(f.source['file']).name}:{f.source['line']}"
    return f" at {code_span(place)}"


def audit_markdown(report: Report, findings: Sequence[Finding] | None = None) -> str:
    """A Markdown section for a pull request: the totals, then a table of findings, a row per
    finding or per run of identical layers (``model.decoder.layers.0-11`` ×12).

    Module and node names, and the messages that mention them, are the model's text: they go
    through :mod:`ampgraph.report.escape`, so none of them can break the table or become a link.

    >>> from ampgraph.report.records import NodeRecord, Report
    >>> setting = {"name": "half", "device_type": "cuda", "autocast": False,
    ...            "amp_dtype": "bfloat16", "param_dtype": "bfloat16"}
    >>> ln = NodeRecord("layer_norm", "aten.layer_norm.default", "op", module="a|b",
    ...                 inputs=[{"node": "x", "dtype": "bfloat16"}], outputs=["bfloat16"])
    >>> print(audit_markdown(Report("m", setting, {}, {}, [ln], [])).splitlines()[-1].split(" runs")[0])
    | warning | sensitive-16bit | `a\\|b` | `layer_norm` | layer_norm in a\\|b
    """
    findings = audit(report) if findings is None else findings
    entries = folded(report, findings)
    rows = [f"### ampgraph audit: {escape_text(audit_title(report))}", ""]
    rows += [f"- {escape_text(line)}" for line in audit_totals(report, findings, entries)]
    largest = largest_findings(entries) if len(entries) > 1 else []
    if largest:
        rows.append(f"- largest findings, bytes per forward: {escape_text('; '.join(largest))}")
    if entries:
        rows += ["", "| severity | kind | module | node | finding | suggestion |",
                 "|---|---|---|---|---|---|"]  # fmt: skip
    for e in entries:
        f = e.first
        module, node = code_span(f.module or "-"), code_span(f.node)
        if e.group is not None:
            module = f"{code_span(e.group.shown(f.module) or '-')} ×{e.count}"
            node = f"{node} … {code_span(e.items[-1].node)}"
        rows.append(
            f"| {f.severity} | {f.kind} | {module} | {node}{_at(f)} | {escape_text(finding_message(e))} "
            f"| {escape_text(f.suggestion)} |"
        )
    return "\n".join(rows)


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def ranges_markdown(result: RangesResult) -> str:
    """A Markdown table per result (a pull-request comment), then the findings."""
    lines = [
        f"### Value ranges: `{_cell(result.model)}`",
        "",
        f"One fp32 run on the CPU, {_cell(result.weights)}.",
        "",
        "| setting | verdict | first node that does not fit |",
        "|---|---|---|",
    ]
    for s in result.settings:
        first = _cell(s.first.message) if s.first else ""
        lines.append(f"| `{_cell(s.name)}` ({_cell(s.caption)}) | {ranges_verdict(s)} | {first} |")
    shown = [(s, f) for s in result.settings for f in s.findings if f.severity != "note"]
    if shown:
        lines += ["", "| setting | severity | finding |", "|---|---|---|"]
        for s, f in shown[: SHOWN * 4]:
            lines.append(f"| `{_cell(s.name)}` | {f.severity} | {_cell(f.message)} |")
    for f in result.reference_findings:
        lines += ["", f"- fp32 run: {_cell(f.message)}"]
    train = ranges_train_lines(result)
    if train:  # --pass train: the loss and each setting's fp16 loss scale, as a list
        from ampgraph.ranges.gradients import describe

        lines += ["", f"- {_cell(train[1])}"] + [
            f"  - `{_cell(name)}`: {_cell('; '.join(describe(scale)))}"
            for name, scale in loss_scales(result)
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def diff_markdown(d: ReportDiff, *, limit: int = 250) -> str:
    """The diff as a pull-request comment: a summary table, the changes collapsed per module.

    At most ``limit`` entries are listed (GitHub refuses comments over 65,536 characters); the
    summary table counts every change. The changes of identical layers are one row
    (``model.decoder.layers.0-11.fc1`` ×12). Module, node and op names and the changes' text are
    the model's: they go through :mod:`ampgraph.report.escape`, so none can break the table or
    become a link.

    >>> from ampgraph.review.diff import ReportDiff
    >>> print(diff_markdown(ReportDiff({"model": "m", "nodes": 3}, {"model": "m", "nodes": 3})))
    ... # doctest: +NORMALIZE_WHITESPACE
    ### ampgraph diff: no changes in the dtype flow
    <BLANKLINE>
    A: `m None (no autocast, parameters -)` → B: `m None (no autocast, parameters -)`, 3 graph nodes.
    """
    c = d.counts()
    if d.equal:
        return (
            "### ampgraph diff: no changes in the dtype flow\n\n"
            f"A: {code_span(describe(d.a), table=False)} → "
            f"B: {code_span(describe(d.b), table=False)}, {d.b.get('nodes')} graph nodes."
        )
    rows = [
        "### ampgraph diff: the dtype flow changes",
        "",
        f"A: {code_span(describe(d.a), table=False)}  ",
        f"B: {code_span(describe(d.b), table=False)}",
        "",
        (
            "| nodes changed | added | removed | policy | input dtypes | output dtypes "
            "| casts added | casts removed | promotions | errors |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        (
            f"| {c['changed']} | {c['added']} | {c['removed']} | {c['policy']} | {c['inputs']} "
            f"| {c['outputs']} | {c['casts_added']} | {c['casts_removed']} | {c['promotion']} "
            f"| {c['error']} |"
        ),
        "",
    ]
    summary = [x for x in (diff_totals_line(d), largest_changes(d)) if x]
    rows += [f"- {escape_text(x)}" for x in summary] + ([""] if summary else [])
    rows += [f"> {escape_text(n, line_start=True)}" for n in d.notes] + ([""] if d.notes else [])
    groups = grouped_changes(d)
    rows += [
        (
            f"<details><summary>{len(d.changes)} changes in {len(groups)} module"
            f"{'s' if len(groups) != 1 else ''}</summary>"
        ),
        "",
        "| module | node | op | change |",
        "|---|---|---|---|",
    ]
    listed = listed_changes(d)
    for head, entry in listed[:limit]:
        if isinstance(entry, tuple):
            group, text = entry
            rows.append(
                f"| {code_span(head)} | {escape_text(inputs_name(group))} | `placeholder` "
                f"| {escape_text(text)} |"
            )
            continue
        module = code_span(head)
        if entry.group is not None:
            module = f"{code_span(head.rsplit(' ×', 1)[0])} ×{entry.count}"
        node = code_span(entry.first.name)
        if entry.group is not None:
            node += f" … {code_span(entry.items[-1].name)}"
        mark = {"added": "added: ", "removed": "removed: "}.get(entry.first.change, "")
        rows.append(
            f"| {module} | {node} | {code_span(entry.first.op)} "
            f"| {escape_text(mark + change_text(entry))} |"
        )
    if len(listed) > limit:
        rows += ["", f"… and {len(listed) - limit} more: `ampgraph diff` (text or JSON) lists all."]
    rows += ["", "</details>"]
    return "\n".join(rows)


__all__ = [
    "audit_markdown",
    "check_markdown",
    "diff_markdown",
    "markdown_table",
    "markdown_train",
    "ranges_markdown",
]
