"""Small models and compact report fixtures for the renderer's tests."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from ampgraph.report.records import NodeRecord, Report

_DEFAULTS = {
    f.name: (f.default_factory() if callable(f.default_factory) else f.default)  # type: ignore[misc]
    for f in fields(NodeRecord)
    if f.name not in ("name", "op", "kind")
}


def compact_report_json(report: Report) -> str:
    """The report as compact JSON with only what diagrams read. Left out: fields at their
    defaults, the annotator's reasons (except a region's, which says what the region does),
    agreeing check results, ``module_call`` (the module records carry the calls) and the
    ``autocast`` flag outside region bodies. ``Report.from_json`` reads it back."""
    data = report.to_dict()
    nodes = []
    for node in data["nodes"]:
        keep: dict[str, Any] = {}
        for key, value in node.items():
            if key == "reason" and node["kind"] != "region":
                continue
            if key == "check" and (value is None or value.get("agree", True)):
                continue
            if key == "module_call" or (key == "autocast" and node.get("region") is None):
                continue
            if key in _DEFAULTS and value == _DEFAULTS[key]:
                continue
            keep[key] = value
        nodes.append(keep)
    data["nodes"] = nodes
    return json.dumps(data, separators=(",", ":"), sort_keys=False) + "\n"
