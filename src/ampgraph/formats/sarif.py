"""The SARIF 2.1.0 format, for GitHub code scanning: an audit's findings (:func:`audit_sarif`)
and a value-ranges run's (:func:`ranges_sarif`), each one run with a rule per kind and a result
per finding, located at the module and node and, where known, at a file of the model's code.
Torch-free.

>>> model_file("models/mine.py:build"), artifact_uri("models/my model.py")
('models/mine.py', 'models/my%20model.py')
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ampgraph.report.records import Report
from ampgraph.review.audit import KINDS, Finding, audit, finding_groups
from ampgraph.version import __version__

if TYPE_CHECKING:  # annotations only: the ranges package imports torch
    from ampgraph.ranges.data import RangesResult


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


def audit_sarif(
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
    indices, and the module as text shows it. ``findings`` as :func:`audit_json`'s.
    """
    from ampgraph.review.audit_ranges import SEVERITY

    results = []
    for n, report in enumerate(reports):
        artifact = uri(report.model)
        found = audit(report) if findings is None else list(findings[n])
        groups, of = finding_groups(report, found)
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


def ranges_sarif(result: RangesResult) -> str:
    """SARIF 2.1.0 for code scanning, as ``ampgraph audit --format sarif``: one run, a rule per
    kind, a result per finding of severity warning or error (each setting's, and the fp32
    run's), located at the module and node, and at the model's file where it names one."""
    from ampgraph.ranges.data import KINDS

    artifact = model_file(result.model)
    results = []
    pairs = [(s.name, f) for s in result.settings for f in s.findings]
    pairs += [("fp32 run", f) for f in result.reference_findings]
    for name, f in pairs:
        if f.severity == "note":
            continue
        logical = {"fullyQualifiedName": f"{f.module or '<top>'}/{f.node}", "kind": "member"}
        location: dict[str, object] = {"logicalLocations": [logical]}
        if artifact:
            location["physicalLocation"] = {
                "artifactLocation": {"uri": artifact_uri(artifact)}, "region": {"startLine": 1},
            }  # fmt: skip
        results.append({
            "ruleId": f.kind, "level": f.severity, "message": {"text": f"[{name}] {f.message}"},
            "locations": [location],
            "partialFingerprints": {"ampgraph/v1": f"{result.model}:{name}:{f.kind}:{f.node}"},
        })  # fmt: skip
    rules = [
        {"id": kind, "name": kind.title().replace("-", ""), "shortDescription": {"text": title},
         "defaultConfiguration": {"level": level},
         "helpUri": "https://github.com/ampgraph/ampgraph/blob/main/docs/ranges.md"}
        for kind, (level, title) in KINDS.items()
    ]  # fmt: skip
    return json.dumps({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{"tool": {"driver": {"name": "ampgraph ranges", "version": __version__,
                                      "rules": rules}}, "results": results}],
    }, indent=1)  # fmt: skip



def unplaced_warning(
    reports: Sequence[Report], findings: Sequence[Sequence[Finding]]
) -> str | None:
    """The line for standard error beside an audit's SARIF where some results point into no file:
    valid SARIF, but GitHub shows only results that do; None where every result has a file.

    >>> unplaced_warning([Report("m", {}, {}, {}, [], [])], [[]]) is None
    True
    """
    unplaced = sorted({
        r.model for r, found in zip(reports, findings, strict=True)
        if model_file(r.model) is None and any(f.source is None for f in found)
    })  # fmt: skip
    if not unplaced:
        return None
    return (f"warning: {', '.join(unplaced)}: some results have no source line and the model "
            "names no file of model code, so they have logical locations only (see "
            "docs/audit.md)")  # fmt: skip

__all__ = [
    "SARIF_SCHEMA",
    "artifact_uri",
    "audit_sarif",
    "model_file",
    "ranges_sarif",
    "unplaced_warning",
]
