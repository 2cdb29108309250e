"""``ampgraph audit``'s output: the totals first, then the findings with repeated layers folded.

Torch-free. The findings themselves are :mod:`ampgraph.review.findings`' (re-exported here, the
module callers import). Text and Markdown open with a few lines (promotions and casts with their
bytes, the count of each kind, the largest findings), then list each finding once per run of
identical layers (:mod:`ampgraph.review.fold`): OPT-125M's 97 findings are nine entries, eight of
them ``model.decoder.layers.0-11 ×12``. JSON keeps every finding and adds the groups; SARIF keeps
one result per finding (code scanning wants each location) with its group in ``properties``.

>>> from ampgraph.report.records import Cast, NodeRecord, Report
>>> def layer(i, linear):
...     return NodeRecord(linear, "aten.linear.default", "op", module=f"layers.{i}.fc",
...                       policy="lower_precision_fp", casts=[Cast("x", "float32", "bfloat16")],
...                       outputs=["bfloat16"], shapes=[[4, 8]])
>>> setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
>>> x = NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[4, 8]])
>>> report = Report("demo", setting, {}, {}, [x, layer(0, "linear"), layer(1, "linear_1")], [])
>>> print(text(report).splitlines()[-2])
note    autocast-cast        layers.0-1 ×2 (linear … linear_1): autocast casts 1 tensor to bf16 before linear in layers.0-1.fc: 0 weights 0 B, 1 activation 64 B; ×2: 128 B
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ampgraph.report.escape import code_span, escape_text
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
from ampgraph.settings import caption

#: How many of the largest findings (by bytes, all their layers together) the summary names.
LARGEST = 3


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


def _total(entry: Fold[Finding]) -> int | None:
    b = entry.first.bytes
    return None if b is None else b * entry.count


def _where_shown(entry: Fold[Finding]) -> str:
    """``linear in lm_head (linear_72)``; ``linear in model.decoder.layers.0-11.fc1 ×12``."""
    f = entry.first
    if entry.group is None:
        return f"{where(f.op, f.module)} ({f.node})"
    return f"{where(f.op, entry.group.shown(f.module))} ×{entry.count}"


def _largest(entries: Sequence[Fold[Finding]]) -> list[str]:
    """The :data:`LARGEST` entries of most bytes (all their layers together), largest first."""
    sized = sorted((e for e in entries if _total(e)), key=lambda e: _total(e) or 0, reverse=True)
    return [f"{fmt_bytes(_total(e))} {e.first.kind} {_where_shown(e)}" for e in sized[:LARGEST]]


def _names(entry: Fold[Finding]) -> str:
    """``linear_72``, or ``linear … linear_66`` for a folded entry (first and last layer's)."""
    if entry.group is None:
        return entry.first.node
    return f"{entry.first.node} … {entry.items[-1].node}"


def _message(entry: Fold[Finding]) -> str:
    f = entry.first
    if entry.group is None:
        return f.message
    total = _total(entry)
    tail = "" if total is None else f"; ×{entry.count}: {fmt_bytes(total)}"
    return entry.group.shown_text(f.message) + tail


def _title(report: Report) -> str:
    s = report.setting
    return f"{report.model}, setting {s['name']} ({caption(s)})"


def _summary_lines(
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


def text(report: Report, findings: Sequence[Finding] | None = None) -> str:
    """Plain text: a heading, the totals and the largest findings, then one line per finding (per
    run of identical layers) with its suggestion (and its source line, where the records know
    it) under it."""
    findings = audit(report) if findings is None else findings
    entries = folded(report, findings)
    lines = [f"# audit of {_title(report)}", *_summary_lines(report, findings, entries)]
    if report.capture.get("stand_in"):
        lines.insert(1, f"note: {report.capture['stand_in']}")
    largest = _largest(entries) if len(entries) > 1 else []
    lines += (
        ["largest findings, bytes per forward:", *(f"  {x}" for x in largest)] if largest else []
    )
    if entries:
        lines.append("")
    for e in entries:
        f, head = e.first, _names(e)
        if e.group is not None:
            head = f"{e.group.label} ×{e.count} ({head})"
        lines.append(f"{f.severity:<7} {f.kind:<20} {head}: {_message(e)}")
        lines.append(f"{'':<28} suggestion: {f.suggestion}")
        if f.source is not None:
            lines.append(f"{'':<28} at {f.source['file']}:{f.source['line']}")
    return "\n".join(lines)


def _groups(report: Report, findings: Sequence[Finding]) -> tuple[list[dict[str, Any]],
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


def to_json(
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
        groups, of = _groups(r, fs)
        audits.append({
            "model": r.model, "setting": r.setting, "summary": summary(r, fs),
            "findings": [{**f.to_dict(), "group": of.get(i)} for i, f in enumerate(fs)],
            "groups": groups,
        })  # fmt: skip
    return json.dumps({"schema": "ampgraph.audit", "version": 1, "audits": audits}, indent=1)


def _at(f: Finding) -> str:
    """`` at `modeling_opt.py:389` `` for a finding with a source line (the file's name only:
    the table stays narrow; text, JSON and SARIF give the path)."""
    if f.source is None:
        return ""
    place = f"{Path(f.source['file']).name}:{f.source['line']}"
    return f" at {code_span(place)}"


def markdown(report: Report, findings: Sequence[Finding] | None = None) -> str:
    """A Markdown section for a pull request: the totals, then a table of findings, a row per
    finding or per run of identical layers (``model.decoder.layers.0-11`` ×12).

    Module and node names, and the messages that mention them, are the model's text: they go
    through :mod:`ampgraph.report.escape`, so none of them can break the table or become a link.

    >>> from ampgraph.report.records import NodeRecord, Report
    >>> setting = {"name": "half", "device_type": "cuda", "autocast": False,
    ...            "amp_dtype": "bfloat16", "param_dtype": "bfloat16"}
    >>> ln = NodeRecord("layer_norm", "aten.layer_norm.default", "op", module="a|b",
    ...                 inputs=[{"node": "x", "dtype": "bfloat16"}], outputs=["bfloat16"])
    >>> print(markdown(Report("m", setting, {}, {}, [ln], [])).splitlines()[-1].split(" runs")[0])
    | warning | sensitive-16bit | `a\\|b` | `layer_norm` | layer_norm in a\\|b
    """
    findings = audit(report) if findings is None else findings
    entries = folded(report, findings)
    rows = [f"### ampgraph audit: {escape_text(_title(report))}", ""]
    rows += [f"- {escape_text(line)}" for line in _summary_lines(report, findings, entries)]
    largest = _largest(entries) if len(entries) > 1 else []
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
            f"| {f.severity} | {f.kind} | {module} | {node}{_at(f)} | {escape_text(_message(e))} "
            f"| {escape_text(f.suggestion)} |"
        )
    return "\n".join(rows)


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def model_file(model: str) -> str | None:
    """The file a model spec names (``path/model.py:factory``, ``config.json``), else None.

    >>> model_file("models/mine.py:build"), model_file("opt-125m")
    ('models/mine.py', None)
    """
    head = model if model.endswith((".py", ".json")) else model.rsplit(":", 1)[0]
    return head if head.endswith((".py", ".json")) else None


def artifact_uri(file: str) -> str:
    """A file as SARIF's ``artifactLocation.uri`` wants it: a URI reference (RFC 3986).

    A relative path is percent-encoded (a space, ``#``, ``%`` or ``:`` in a file or folder name
    would make it another URI or none), an absolute one becomes a ``file://`` URI.

    >>> artifact_uri("models/my model#2.py"), artifact_uri("/tmp/100%.py")
    ('models/my%20model%232.py', 'file:///tmp/100%25.py')
    """
    path = Path(file)
    return path.as_uri() if path.is_absolute() else quote(path.as_posix())


def _predicted(report: Report) -> str:
    """``, prediction for mps`` where the report is a stand-in's (xpu or mps on a torch built
    without them: traced on CUDA, annotated with the device's lists, not checked on it)."""
    if not report.capture.get("stand_in"):
        return ""
    return f", prediction for {report.setting.get('device_type', '?')}"


def sarif(
    reports: Sequence[Report],
    uri: Callable[[str], str | None] = model_file,
    findings: Sequence[Sequence[Finding]] | None = None,
) -> str:
    """SARIF 2.1.0 for GitHub code scanning: one run, a rule per kind, a result per finding.

    Each result names its module and node as logical locations, and a physical location where
    one is known: the finding's source line (the records' ``source``, the model's code that made
    the node: a path relative to the working directory where the file lies under it, else a
    ``file://`` URI); for records without source lines (a report saved by ``ampgraph table``)
    the model's own file (``--module path/model.py:factory``, a ``config.json``) at line 1.
    A finding of identical layers, which text folds into one entry, stays one result per layer,
    with ``properties.group``: the layers (``model.decoder.layers.0-11``), their count and
    indices, and the module as text shows it. ``findings`` as :func:`to_json`'s.
    """
    from ampgraph.review.audit_ranges import SEVERITY

    results = []
    for n, report in enumerate(reports):
        artifact = uri(report.model)
        found = audit(report) if findings is None else list(findings[n])
        groups, of = _groups(report, found)
        for i, f in enumerate(found):
            location: dict[str, Any] = {"logicalLocations": [
                {"fullyQualifiedName": f"{f.module or '<top>'}/{f.node}", "kind": "member"},
            ]}  # fmt: skip
            source = f.source or ({"file": artifact, "line": 1} if artifact else None)
            if source is not None:
                location["physicalLocation"] = {
                    "artifactLocation": {"uri": artifact_uri(str(source["file"]))},
                    "region": {"startLine": source["line"]},
                }
            result: dict[str, Any] = {
                "ruleId": f.kind,
                "level": f.severity,
                "message": {"text": f"[{report.setting['name']}{_predicted(report)}] "
                                    f"{f.message}. Suggestion: {f.suggestion}."},
                "locations": [location],
                "partialFingerprints": {
                    "ampgraph/v1": f"{report.model}:{report.setting['name']}:{f.kind}:{f.node}"},
            }  # fmt: skip
            if i in of:
                g = groups[of[i]]
                result["properties"] = {"group": {k: g[k] for k in (
                    "layers", "prefix", "indices", "count", "module")}}  # fmt: skip
            if report.capture.get("stand_in"):
                result.setdefault("properties", {})["prediction"] = report.capture["stand_in"]
            results.append(result)
    from ampgraph.version import __version__

    rules = [
        {"id": kind, "name": kind.title().replace("-", ""), "shortDescription": {"text": title},
         "defaultConfiguration": {"level": level},
         "helpUri": "https://github.com/ampgraph/ampgraph/blob/main/docs/audit.md"}
        for kind, (level, title) in [*KINDS.items(), *(
            (f"range-{k}", v) for k, v in SEVERITY.items() if findings is not None)]
    ]  # fmt: skip
    return json.dumps({
        "version": "2.1.0",
        "$schema": SARIF_SCHEMA,
        "runs": [{
            "tool": {"driver": {"name": "ampgraph", "version": __version__,
                                "informationUri": "https://github.com/ampgraph/ampgraph",
                                "rules": rules}},
            "results": results,
        }],
    }, indent=1)  # fmt: skip


__all__ = [
    "FLOATING", "ITEMSIZE", "KINDS", "SEVERITIES", "Finding", "artifact_uri", "at_or_above",
    "audit", "fmt_bytes", "folded", "markdown", "model_file", "sarif", "summary", "text",
    "to_json",
]  # fmt: skip
