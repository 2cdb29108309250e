"""The text format of the diffs (the text format's second module, :mod:`ampgraph.formats.text`
being the first): ``ampgraph diff``'s and ``baseline check``'s (:func:`diff_text`: who is
compared, the totals, then the changes, those of identical layers folded into one entry,
``model.decoder.layers.0-11.fc1 ×12``) and ``ampgraph ranges --diff``'s
(:func:`ranges_diff_text`).

Torch-free. The changes are :mod:`ampgraph.review.diff`'s; the folding is
:func:`ampgraph.review.diff.folded`'s, with each side's node names taken out of the layers
(``linear_6`` of layer 1 is layer 0's ``linear``). Text and Markdown
(:func:`ampgraph.formats.markdown.diff_markdown`, which reads this module's lines) show each
folded change once, in its first layer's words; JSON keeps every change and adds the groups.

>>> from ampgraph.review.diff import diff_reports
>>> from ampgraph.report.records import NodeRecord, Report
>>> def rep(dtype):
...     nodes = [NodeRecord(f"relu_{i}", "aten.relu", "op", module=f"layers.{i}", outputs=[dtype])
...              for i in range(3)]
...     return Report("m", {"name": "fp32"}, {}, {}, nodes, [])
>>> print("\\n".join(diff_text(diff_reports(rep("float32"), rep("bfloat16"))).splitlines()[-2:]))
layers.0-2 ×3
  ~ relu_0 … relu_2 aten.relu: outputs fp32 → bf16
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ampgraph.review.audit import fmt_bytes
from ampgraph.review.diff import NodeChange, ReportDiff
from ampgraph.review.diff import folded as folded_changes
from ampgraph.review.fold import Fold
from ampgraph.settings import caption

if TYPE_CHECKING:  # annotations only: the ranges package imports torch
    from ampgraph.ranges.data import RangeFinding, RangesResult, SettingRanges
    from ampgraph.ranges.setting_diff import DiffRow


#: Graph inputs that change alike are listed as one line from this many on: a change of the
#: parameter dtype changes every parameter the same way, and 196 lines of it bury the ops.
FOLD_INPUTS_FROM: Final = 4
#: How many of the largest groups of changes the summary names.
LARGEST: Final = 3


def describe(side: dict[str, Any]) -> str:
    """One side of a diff in a few words: ``opt-125m amp-fp32 (autocast cuda bf16, ...)``.

    >>> describe({"model": "m", "setting": {"name": "fp32", "device_type": "cuda",
    ...           "autocast": False, "amp_dtype": "bfloat16", "param_dtype": "float32"}})
    'm fp32 (no autocast, parameters fp32)'
    >>> describe({"model": "m", "tables": "2.11", "setting": {"name": "amp-fp32",
    ...           "device_type": "cuda", "autocast": True, "amp_dtype": "bfloat16",
    ...           "param_dtype": "float32"}})
    "m amp-fp32 (autocast cuda bf16, parameters fp32, torch 2.11's lists)"
    """
    s = side.get("setting") or {}
    extra = "" if side.get("pass", "forward") == "forward" else f", {side['pass']} pass"
    if side.get("tables"):  # set where the two sides' policy tables differ
        extra += f", torch {side['tables']}'s lists"
    return f"{side.get('model')} {s.get('name')} ({caption(s)}{extra})"


def diff_summary_line(d: ReportDiff) -> str:
    c = d.counts()
    if d.equal:
        return f"no changes in the dtype flow ({d.b.get('nodes')} graph nodes)"
    parts = [f"{c['changed']} changed", f"{c['added']} added", f"{c['removed']} removed"]
    labels = {"policy": ("policy", "policies"), "inputs": ("input dtype", "input dtypes"),
              "outputs": ("output dtype", "output dtypes"),
              "promotion": ("promotion", "promotions"), "error": ("error", "errors")}  # fmt: skip
    what = [f"{c[f]} {label[c[f] != 1]}" for f, label in labels.items() if c[f]]
    casts = f"casts +{c['casts_added']} −{c['casts_removed']}"
    return f"{d.a.get('nodes')} → {d.b.get('nodes')} graph nodes: {', '.join(parts)}; " + ", ".join(
        [*what, casts]
    )


def change_line(change: NodeChange) -> str:
    """One change as a line: ``~ linear aten.linear.default: outputs fp32 → bf16; ...``.

    >>> from ampgraph.review.diff import FieldChange, NodeChange
    >>> print(change_line(NodeChange("changed", "forward", "fc", "aten.relu", "r", "r",
    ...                              (FieldChange("outputs", "fp32", "bf16"),))))
    ~ r aten.relu: outputs fp32 → bf16
    """
    if change.change != "changed":
        mark = "+" if change.change == "added" else "-"
        return f"{mark} {change.name} {change.op}: {change.detail}"
    parts = []
    for f in change.fields:
        if f.field == "casts":
            if change.casts_added:
                parts.append("casts added " + ", ".join(change.casts_added))
            if change.casts_removed:
                parts.append("casts removed " + ", ".join(change.casts_removed))
        else:
            parts.append(f"{f.field} {f.before} → {f.after}")
    return f"~ {change.name} {change.op}: {'; '.join(parts)}"


def diff_totals_line(d: ReportDiff) -> str | None:
    """Autocast's casts and the promotions per forward, A → B, with their bytes."""
    ta, tb = d.a.get("totals"), d.b.get("totals")
    if not ta or not tb:
        return None

    def side(t: dict[str, Any], key: str) -> str:
        # A baseline keeps no shapes: its bytes are unknown, and "? B" would read as a bug.
        count, size = t[key]["count"], t[key]["bytes"]
        return str(count) if size is None else f"{count} ({fmt_bytes(size)})"

    return (
        f"autocast casts per forward {side(ta, 'casts')} → {side(tb, 'casts')}; promotions "
        f"{side(ta, 'promotions')} → {side(tb, 'promotions')}"
    )


def change_head(entry: Fold[NodeChange]) -> str:
    c = entry.first
    if entry.group is not None:
        head = f"{entry.group.shown(c.module)} ×{entry.count}"
    else:
        head = c.module or ("graph inputs" if c.op == "placeholder" else "top level")
    return head if c.section == "forward" else f"{c.section}: {head}"


def grouped_changes(d: ReportDiff) -> list[tuple[str, list[Fold[NodeChange]]]]:
    groups: dict[str, list[Fold[NodeChange]]] = {}
    for entry in folded_changes(d):
        groups.setdefault(change_head(entry), []).append(entry)
    return list(groups.items())


def change_text(entry: Fold[NodeChange]) -> str:
    """What changed, after the name and op: the first layer's words, the layer as the range."""
    text = change_line(entry.first).split(": ", 1)[1]
    return entry.group.shown_text(text) if entry.group is not None else text


def change_name(entry: Fold[NodeChange]) -> str:
    if entry.group is None:
        return entry.first.name
    return f"{entry.first.name} … {entry.items[-1].name}"


def inputs_alike(entries: Sequence[Fold[NodeChange]]) -> list[Fold[NodeChange] | tuple[list[NodeChange], str]]:  # fmt: skip
    """``entries`` with the graph inputs that change alike (same fields, no casts) gathered into
    one ``(changes, text)`` entry where there are :data:`FOLD_INPUTS_FROM` or more of them."""
    alike: dict[str, list[NodeChange]] = {}
    for e in entries:
        if e.first.op == "placeholder" and e.first.change == "changed" and e.group is None:
            alike.setdefault(change_text(e), []).append(e.first)
    out: list[Fold[NodeChange] | tuple[list[NodeChange], str]] = []
    for e in entries:
        text = change_text(e) if e.first.op == "placeholder" and e.group is None else ""
        group = alike.get(text, [])
        if e.first.change != "changed" or len(group) < FOLD_INPUTS_FROM:
            out.append(e)
        elif group[0] is e.first:
            out.append((group, text))
    return out


def inputs_name(group: Sequence[NodeChange]) -> str:
    return f"{len(group)} graph inputs ({group[0].name} … {group[-1].name})"


def listed_changes(
    d: ReportDiff,
) -> list[tuple[str, Fold[NodeChange] | tuple[list[NodeChange], str]]]:
    return [(head, e) for head, entries in grouped_changes(d) for e in inputs_alike(entries)]


def largest_changes(d: ReportDiff) -> str | None:
    """The layer groups and alike graph inputs that hold the most changes, largest first."""
    sizes: dict[str, list[int]] = {}  # what -> [changes each, layers]
    for _, e in listed_changes(d):
        if isinstance(e, tuple):
            sizes[f"{len(e[0])} graph inputs alike"] = [len(e[0]), 1]
        elif e.group is not None:
            sizes.setdefault(f"{e.group.label} ×{e.count}", [0, e.count])[0] += 1
    if not sizes:
        return None
    top = sorted(sizes.items(), key=lambda kv: kv[1][0] * kv[1][1], reverse=True)[:LARGEST]
    return "most changes: " + "; ".join(
        what if n == 1 else f"{what}, {each} changes each ({each * n})"
        for what, (each, n) in top
    )  # fmt: skip


def diff_text(d: ReportDiff) -> str:
    """The diff as plain text: who is compared, the summary (counts, casts and promotions with
    their bytes, where the changes are), then the changes by module.

    The changes of identical layers are one entry under ``<layers> ×N`` (the first layer's node
    names, the first and last layer's node), graph inputs that change alike (every parameter when
    the parameter dtype changes) one line; ``--format json`` lists each.
    """
    lines = [f"A: {describe(d.a)}", f"B: {describe(d.b)}", diff_summary_line(d)]
    if not d.equal:
        lines += [x for x in (diff_totals_line(d), largest_changes(d)) if x]
    lines += [f"note: {n}" for n in d.notes]
    if d.changes:
        lines.append("")
    for head, entries in grouped_changes(d):
        lines.append(head)
        for entry in inputs_alike(entries):
            if isinstance(entry, tuple):
                group, text = entry
                lines.append(f"  ~ {inputs_name(group)} placeholder: {text}")
            else:
                line = change_line(entry.first).split(" ", 2)
                lines.append(f"  {line[0]} {change_name(entry)} {entry.first.op}: "
                             f"{change_text(entry)}")  # fmt: skip
    return "\n".join(lines)


#: Rows the ranges' setting diff shows before "... and N more (--format json)": one screen.
DIFF_ROWS_SHOWN = 15


def _verdicts(findings: list[RangeFinding]) -> str:
    if not findings:
        return "fits"
    f = findings[0]
    more = f" (+{len(findings) - 1})" if len(findings) > 1 else ""
    return f"{f.kind} in {f.dtype.replace('float', 'fp').replace('bfp', 'bf')}{more}"


def _row_label(row: DiffRow) -> str:
    """``linear_3 (model.fc2)``; a parameter's name says its module already."""
    if row.module and not row.value.startswith(row.module):
        return f"{row.value} ({row.module})"
    return row.value


def setting_diff_text(a: SettingRanges, b: SettingRanges, rows: list[DiffRow]) -> str:
    """One screen: a line per value judged differently, and the first finding's message."""
    count = f"{len(rows)} value{'s' * (len(rows) != 1)} judged differently"
    lines = [f"A: {a.name} ({a.caption})", f"B: {b.name} ({b.caption})", count]
    if not rows:
        return "\n".join(lines) + "\n"
    names = [_row_label(r) for r in rows[:DIFF_ROWS_SHOWN]]
    width = min(40, max(len(n) for n in names))
    lines += ["", f"  {'value':<{width}}  {'A':<28}  B"]
    for r, name in zip(rows[:DIFF_ROWS_SHOWN], names):
        lines.append(f"  {name:<{width}}  {_verdicts(r.a):<28}  {_verdicts(r.b)}")
        first = (r.a or r.b)[0]
        lines.append(f"  {'':<{width}}  {first.message}")
    if len(rows) > DIFF_ROWS_SHOWN:
        lines.append(f"  ... and {len(rows) - DIFF_ROWS_SHOWN} more (--format json)")
    return "\n".join(lines) + "\n"


def ranges_diff_text(result: RangesResult) -> str:
    """``ampgraph ranges --diff``: the first two settings' differing verdicts, one screen."""
    from ampgraph.ranges import setting_diff

    a, b = result.settings[:2]
    return setting_diff_text(a, b, setting_diff.diff(a, b))


__all__ = [
    "DIFF_ROWS_SHOWN",
    "FOLD_INPUTS_FROM",
    "LARGEST",
    "change_head",
    "change_line",
    "change_name",
    "change_text",
    "describe",
    "diff_summary_line",
    "diff_text",
    "diff_totals_line",
    "grouped_changes",
    "inputs_alike",
    "inputs_name",
    "largest_changes",
    "listed_changes",
    "ranges_diff_text",
    "setting_diff_text",
]
