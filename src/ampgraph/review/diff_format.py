"""``ampgraph diff``'s output: who is compared, the totals, then the changes, those of identical
layers folded into one entry (``model.decoder.layers.0-11.fc1 ×12``).

Torch-free. The changes are :mod:`ampgraph.review.diff`'s (which re-exports these formats); the
folding is :mod:`ampgraph.review.fold`'s, with each side's node names taken out of the layers
(``linear_6`` of layer 1 is layer 0's ``linear``). Text and Markdown show each folded change once,
in its first layer's words; JSON keeps every change and adds the groups.

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

import json
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ampgraph.report.escape import code_span, escape_text
from ampgraph.review.findings import fmt_bytes
from ampgraph.review.fold import Fold, Names, fold
from ampgraph.settings import caption

if TYPE_CHECKING:  # diff imports this module to re-export it: no import back at run time
    from ampgraph.review.diff import NodeChange, ReportDiff

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


def _summary_line(d: ReportDiff) -> str:
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


def _totals_line(d: ReportDiff) -> str | None:
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


def folded(d: ReportDiff) -> list[Fold[NodeChange]]:
    """The changes, those of identical layers as one entry each (:func:`ampgraph.review.fold.fold`):
    two layers' changes are the same when all but the layer is (kind, op, module below the layer,
    each field's text), each side's node names taken out with that side's :class:`Names`."""
    empty = Names([])

    def key(c: NodeChange, layer: str) -> Hashable:
        na, nb = (d.names.get((side, c.section), empty) for side in ("a", "b"))
        detail = (nb if c.change == "added" else na).key(c.detail, layer)
        fields = tuple((f.field, na.key(f.before, layer), nb.key(f.after, layer)) for f in c.fields)
        return (
            c.change, c.section, c.op, na.key(c.module, layer), na.node(c.a, layer),
            nb.node(c.b, layer), fields, nb.key(c.casts_added, layer),
            na.key(c.casts_removed, layer), detail,
        )  # fmt: skip

    return fold(d.changes, lambda c: c.module, key)


def _head(entry: Fold[NodeChange]) -> str:
    c = entry.first
    if entry.group is not None:
        head = f"{entry.group.shown(c.module)} ×{entry.count}"
    else:
        head = c.module or ("graph inputs" if c.op == "placeholder" else "top level")
    return head if c.section == "forward" else f"{c.section}: {head}"


def _grouped(d: ReportDiff) -> list[tuple[str, list[Fold[NodeChange]]]]:
    groups: dict[str, list[Fold[NodeChange]]] = {}
    for entry in folded(d):
        groups.setdefault(_head(entry), []).append(entry)
    return list(groups.items())


def _entry_text(entry: Fold[NodeChange]) -> str:
    """What changed, after the name and op: the first layer's words, the layer as the range."""
    text = change_line(entry.first).split(": ", 1)[1]
    return entry.group.shown_text(text) if entry.group is not None else text


def _entry_name(entry: Fold[NodeChange]) -> str:
    if entry.group is None:
        return entry.first.name
    return f"{entry.first.name} … {entry.items[-1].name}"


def _inputs_alike(entries: Sequence[Fold[NodeChange]]) -> list[Fold[NodeChange] | tuple[list[NodeChange], str]]:  # fmt: skip
    """``entries`` with the graph inputs that change alike (same fields, no casts) gathered into
    one ``(changes, text)`` entry where there are :data:`FOLD_INPUTS_FROM` or more of them."""
    alike: dict[str, list[NodeChange]] = {}
    for e in entries:
        if e.first.op == "placeholder" and e.first.change == "changed" and e.group is None:
            alike.setdefault(_entry_text(e), []).append(e.first)
    out: list[Fold[NodeChange] | tuple[list[NodeChange], str]] = []
    for e in entries:
        text = _entry_text(e) if e.first.op == "placeholder" and e.group is None else ""
        group = alike.get(text, [])
        if e.first.change != "changed" or len(group) < FOLD_INPUTS_FROM:
            out.append(e)
        elif group[0] is e.first:
            out.append((group, text))
    return out


def _fold_name(group: Sequence[NodeChange]) -> str:
    return f"{len(group)} graph inputs ({group[0].name} … {group[-1].name})"


def _listed(d: ReportDiff) -> list[tuple[str, Fold[NodeChange] | tuple[list[NodeChange], str]]]:
    return [(head, e) for head, entries in _grouped(d) for e in _inputs_alike(entries)]


def _largest(d: ReportDiff) -> str | None:
    """The layer groups and alike graph inputs that hold the most changes, largest first."""
    sizes: dict[str, list[int]] = {}  # what -> [changes each, layers]
    for _, e in _listed(d):
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
    lines = [f"A: {describe(d.a)}", f"B: {describe(d.b)}", _summary_line(d)]
    if not d.equal:
        lines += [x for x in (_totals_line(d), _largest(d)) if x]
    lines += [f"note: {n}" for n in d.notes]
    if d.changes:
        lines.append("")
    for head, entries in _grouped(d):
        lines.append(head)
        for entry in _inputs_alike(entries):
            if isinstance(entry, tuple):
                group, text = entry
                lines.append(f"  ~ {_fold_name(group)} placeholder: {text}")
            else:
                line = change_line(entry.first).split(" ", 2)
                lines.append(f"  {line[0]} {_entry_name(entry)} {entry.first.op}: "
                             f"{_entry_text(entry)}")  # fmt: skip
    return "\n".join(lines)


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
    summary = [x for x in (_totals_line(d), _largest(d)) if x]
    rows += [f"- {escape_text(x)}" for x in summary] + ([""] if summary else [])
    rows += [f"> {escape_text(n, line_start=True)}" for n in d.notes] + ([""] if d.notes else [])
    groups = _grouped(d)
    rows += [
        (
            f"<details><summary>{len(d.changes)} changes in {len(groups)} module"
            f"{'s' if len(groups) != 1 else ''}</summary>"
        ),
        "",
        "| module | node | op | change |",
        "|---|---|---|---|",
    ]
    listed = _listed(d)
    for head, entry in listed[:limit]:
        if isinstance(entry, tuple):
            group, text = entry
            rows.append(
                f"| {code_span(head)} | {escape_text(_fold_name(group))} | `placeholder` "
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
            f"| {escape_text(mark + _entry_text(entry))} |"
        )
    if len(listed) > limit:
        rows += ["", f"… and {len(listed) - limit} more: `ampgraph diff` (text or JSON) lists all."]
    rows += ["", "</details>"]
    return "\n".join(rows)


def diff_json(d: ReportDiff) -> str:
    """The diff as JSON (schema ``ampgraph.diff``): both sides, the counts, every change, and
    ``groups``: the changes of identical layers that text and Markdown fold, each with its layers
    and its changes' positions (a grouped change's ``group`` is its number; null otherwise).

    >>> from ampgraph.review.diff import ReportDiff
    >>> json.loads(diff_json(ReportDiff({}, {})))["equal"]
    True
    """
    data = d.to_dict()
    position = {id(c): i for i, c in enumerate(d.changes)}
    groups: list[dict[str, Any]] = []
    for e in folded(d):
        if e.group is None:
            continue
        members = [position[id(c)] for c in e.items]
        groups.append({"id": len(groups), **e.group.to_dict(), "module": e.group.shown(
            e.first.module), "changes": members})  # fmt: skip
        for m in members:
            data["changes"][m]["group"] = len(groups) - 1
    for change in data["changes"]:
        change.setdefault("group", None)
    data["groups"] = groups
    return json.dumps(data, indent=1)


FORMATS = {"text": diff_text, "markdown": diff_markdown, "json": diff_json}

__all__ = [
    "FOLD_INPUTS_FROM", "FORMATS", "change_line", "describe", "diff_json", "diff_markdown",
    "diff_text", "folded",
]  # fmt: skip
