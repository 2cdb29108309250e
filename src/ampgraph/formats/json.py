"""The JSON formats: what a command writes for a program, each a versioned schema
(docs/schema.md): the dispatcher check's record (:func:`check_record`), an audit
(:func:`audit_json`, schema ``ampgraph.audit``), a value-ranges run (:func:`ranges_json`,
:func:`ranges_diff_json`, schema ``ampgraph.ranges``) and a diff (:func:`diff_json`, schema
``ampgraph.diff``), and a baseline's file (:func:`baseline_file`, schema
``ampgraph.baseline``). A report's own JSON is :meth:`ampgraph.report.records.Report.to_json`.
Torch-free.

>>> from ampgraph.review.diff import ReportDiff
>>> json.loads(diff_json(ReportDiff({}, {})))["changes"]
[]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ampgraph.report.records import Report
from ampgraph.review.audit import Finding, audit, finding_groups, summary
from ampgraph.review.diff import ReportDiff
from ampgraph.review.diff import folded as folded_changes

if TYPE_CHECKING:  # annotations only: the ranges package imports torch
    from ampgraph.ranges.data import RangesResult


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


def audit_json(
    reports: Sequence[Report], findings: Sequence[Sequence[Finding]] | None = None
) -> str:
    """JSON (schema ``ampgraph.audit`` version 1): per report its model, setting, totals, every
    finding, and ``groups``: the findings of identical layers that text and Markdown fold, each
    with its layers and its findings' positions (a grouped finding's ``group`` is its number;
    null for one that is not). ``findings``: each report's, where not :func:`audit`'s alone
    (``--ranges`` adds a ranges run's)."""
    audits = []
    for n, r in enumerate(reports):
        fs = audit(r) if findings is None else list(findings[n])
        groups, of = finding_groups(r, fs)
        audits.append({
            "model": r.model, "setting": r.setting, "summary": summary(r, fs),
            "findings": [{**f.to_dict(), "group": of.get(i)} for i, f in enumerate(fs)],
            "groups": groups,
        })  # fmt: skip
    return json.dumps({"schema": "ampgraph.audit", "version": 1, "audits": audits}, indent=1)


def ranges_json(result: RangesResult) -> str:
    """The versioned JSON record (schema ``ampgraph.ranges``, documented in docs/schema.md)."""
    return json.dumps(result.to_dict(), indent=1, allow_nan=False)


def ranges_diff_json(result: RangesResult) -> str:
    """``ampgraph ranges --diff --format json``: the JSON record with a ``diff`` object, the
    first two settings' differing verdicts (:mod:`ampgraph.ranges.setting_diff`)."""
    from ampgraph.ranges import setting_diff

    a, b = result.settings[:2]
    rows = setting_diff.diff(a, b)
    return json.dumps({**result.to_dict(), "diff": setting_diff.to_dict(a, b, rows)}, indent=1,
                      allow_nan=False)  # fmt: skip


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
    for e in folded_changes(d):
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


def baseline_file(record: dict[str, Any]) -> str:
    """A baseline's record (:func:`ampgraph.review.baseline.baseline_record`), as ``ampgraph
    baseline write`` writes it: JSON for git, a header field a line, then one line per node, so
    that one changed op is one changed line in review; its line end included.

    >>> from ampgraph.review.baseline import baseline_record
    >>> r = Report("m", {"name": "fp32"}, {}, {}, [], [])
    >>> print(baseline_file(baseline_record(r)).splitlines()[1])
     "schema": "ampgraph.baseline",
    """
    head = {k: v for k, v in record.items() if k != "nodes"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    nodes = [f" {json.dumps(n)}" for n in record["nodes"]]
    lines += [' "nodes": ['] + [",\n".join(nodes)] * bool(nodes) + [" ]", "}"]
    return "\n".join(lines) + "\n"


__all__ = [
    "audit_json",
    "baseline_file",
    "check_record",
    "diff_json",
    "ranges_diff_json",
    "ranges_json",
]
