"""``ampgraph audit``'s findings, those of identical layers folded: what every audit format lays out.

Torch-free. The findings themselves are :mod:`ampgraph.review.findings`' (re-exported here, the
module callers import). Repeated layers fold (:mod:`ampgraph.review.fold`): OPT-125M's 97 findings
are nine entries, eight of them ``model.decoder.layers.0-11 ×12``. The formats are
:mod:`ampgraph.formats`' (``audit_text``, ``audit_markdown``, ``audit_json``, ``audit_sarif``):
text and Markdown show each folded entry once, JSON keeps every finding and adds the groups
(:func:`finding_groups`), SARIF keeps one result per finding with its group in ``properties``.

>>> from ampgraph.report.records import Cast, NodeRecord, Report
>>> def layer(i, linear):
...     return NodeRecord(linear, "aten.linear.default", "op", module=f"layers.{i}.fc",
...                       policy="lower_precision_fp", casts=[Cast("x", "float32", "bfloat16")],
...                       outputs=["bfloat16"], shapes=[[4, 8]])
>>> setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
>>> x = NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[4, 8]])
>>> report = Report("demo", setting, {}, {}, [x, layer(0, "linear"), layer(1, "linear_1")], [])
>>> [(e.group.label, e.count) for e in folded(report)]
[('layers.0-1', 2)]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from ampgraph.report.records import Report
from ampgraph.review.findings import (
    FLOATING,
    ITEMSIZE,
    KINDS,
    SEVERITIES,
    Finding,
    at_or_above,
    audit,
    fmt_bytes,
    summary,
    where,
)  # fmt: skip
from ampgraph.review.fold import Fold, Names, fold


def folded(report: Report, findings: Sequence[Finding] | None = None) -> list[Fold[Finding]]:
    """The findings, those of identical layers as one entry each (:func:`ampgraph.review.fold.fold`).

    Two layers' findings are the same when everything but the layer is: kind, op, module below the
    layer, bytes, details, source line, and the texts with the layer's path and node names taken
    out.
    """
    findings = audit(report) if findings is None else findings
    names = Names(report.nodes)

    def key(f: Finding, layer: str) -> Hashable:
        # The message names the node's op and module first (``where``): op and module are in the
        # key, so that part is set aside before node names are looked for (layer 0's node
        # ``linear`` is also the op's name, ``linear in ...``).
        message = f.message.replace(where(f.op, f.module), "\x00W\x00")
        source = None if f.source is None else (f.source.get("file"), f.source.get("line"))
        return (
            f.kind, f.severity, f.op, names.key(f.module, layer), names.node(f.node, layer),
            f.bytes, source, names.key(message, layer), names.key(f.suggestion, layer),
            names.key(f.details, layer),
        )  # fmt: skip

    return fold(findings, lambda f: f.module, key)


def finding_groups(report: Report, findings: Sequence[Finding]) -> tuple[list[dict[str, Any]],
                                                                  dict[int, int]]:  # fmt: skip
    """The folded groups as plain data, each with the positions of its findings, and each
    grouped finding's group number (by the finding's position)."""
    position = {id(f): i for i, f in enumerate(findings)}
    groups: list[dict[str, Any]] = []
    of: dict[int, int] = {}
    for e in folded(report, findings):
        if e.group is None:
            continue
        members = [position[id(f)] for f in e.items]
        groups.append({"id": len(groups), **e.group.to_dict(), "kind": e.first.kind,
                       "module": e.group.shown(e.first.module), "findings": members})  # fmt: skip
        of.update((m, len(groups) - 1) for m in members)
    return groups, of


__all__ = [
    "FLOATING", "ITEMSIZE", "KINDS", "SEVERITIES", "Finding", "at_or_above", "audit",
    "finding_groups", "fmt_bytes", "folded", "summary", "where",
]  # fmt: skip
