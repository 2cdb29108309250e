"""Text output of reports: the seed notebook's hook lines, a Markdown table, check summaries.

Torch-free: everything here reads :class:`~ampgraph.report.records.Report` records. (File formats,
SVG, PNG, PDF and Graphviz source, are the renderer's: :data:`ampgraph.render.FORMATS`.)

>>> from ampgraph.report.records import ModuleCall
>>> call = ModuleCall("fc1", "torch.nn.Linear", ["Linear", "Module"], "fc1", "float32", "bfloat16", [])
>>> print(call.hook_line())
[fc1] in=torch.float32 -> out=torch.bfloat16
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ampgraph.policy import CATEGORY_LABEL
from ampgraph.report.escape import code_span, escape_text
from ampgraph.report.printed import printed_calls
from ampgraph.report.records import NodeRecord, Report
from ampgraph.review.fold import Names, fold
from ampgraph.settings import caption, short_dtype


def _casts_text(recs: Iterable[NodeRecord]) -> str:
    casts = [c for r in recs for c in r.casts]
    return ", ".join(
        f"{c.node} {short_dtype(c.from_dtype)}→{short_dtype(c.to_dtype)}" for c in casts
    )


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
        f"({caption(setting)})"
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


def check_record(report: Report) -> dict[str, object]:
    """The dispatcher check of one report as plain data (``ampgraph check --format json``).

    >>> r = Report("m", {"name": "fp32"}, {}, {}, [], [], check={"compared": 3, "disagreements": 0})
    >>> check_record(r)["setting"], check_record(r)["disagreements"]
    ('fp32', [])
    """
    return {
        "model": report.model,
        "setting": report.setting.get("name"),
        "check": report.check,
        "disagreements": [
            {
                "node": rec.name,
                "op": rec.op,
                "module": rec.module,
                "outputs": rec.outputs,
                "error": rec.error,
                "check": rec.check,
            }
            for rec in report.disagreements
        ],
    }


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
