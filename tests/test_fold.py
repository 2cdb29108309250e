"""Repeated layers folded in audit, diff and check output: OPT-125M on one screen, JSON and SARIF
keeping every occurrence, a last layer that differs, layers that repeat with gaps."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from ampgraph.cli import main
from ampgraph.formats.diff_text import diff_text
from ampgraph.formats.json import audit_json as to_json
from ampgraph.formats.json import diff_json
from ampgraph.formats.sarif import audit_sarif as sarif
from ampgraph.formats.text import audit_text as text
from ampgraph.formats.text import disagreement_lines
from ampgraph.report.records import Report
from ampgraph.review.audit import audit
from ampgraph.review.diff import diff_reports
from ampgraph.review.fold import Group, fold, indices_label
from tests.conftest import report as bundled_report

OPT_LAYERS = "model.decoder.layers"


@pytest.fixture(scope="module")
def opt() -> Report:
    return bundled_report("opt-125m", "amp-fp32")


def edited(report: Report, layers: set[int]) -> Report:
    """``report`` with the bias cast of fc2 dropped in ``layers``: those layers differ."""
    data = report.to_dict()
    for node in data["nodes"]:
        if node["module"] in {f"{OPT_LAYERS}.{i}.fc2" for i in layers}:
            node["casts"] = node["casts"][:1]
    return Report.from_dict(data)


def test_opt_audit_fits_one_screen_and_keeps_its_totals() -> None:
    """The issue's command, as a newcomer runs it (with source lines): at most 60 lines, still
    24 promotions and 194 casts, the layers as one entry each."""
    out = CliRunner().invoke(main, ["audit", "opt-125m", "-s", "amp-fp32"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert len(lines) <= 60
    assert lines[1].startswith("promotions: 24, ") and lines[2].startswith("autocast casts: 194, ")
    folded = [line for line in lines if f"{OPT_LAYERS}.0-11 ×12 (" in line]
    # Per layer: q, k, v, out_proj, fc1, fc2 casts and the two residual adds.
    assert Counter(line.split()[1] for line in folded) == {"autocast-cast": 6, "promotion": 2}
    assert not any(f"{OPT_LAYERS}.5." in line for line in lines)  # no layer listed alone
    assert sum(line.startswith("note ") for line in lines) == 9  # 8 folded + lm_head


def test_json_keeps_every_finding_and_adds_the_groups(opt: Report) -> None:
    (doc,) = json.loads(to_json([opt]))["audits"]
    findings, groups = doc["findings"], doc["groups"]
    assert [{k: v for k, v in f.items() if k != "group"} for f in findings] == [
        f.to_dict() for f in audit(opt)
    ]
    assert len(findings) == 97 and len(groups) == 8
    for g in groups:
        assert (g["layers"], g["count"], g["indices"]) == (f"{OPT_LAYERS}.0-11", 12, [*range(12)])
        assert [findings[i]["module"].split(".")[3] for i in g["findings"]] == [
            str(i) for i in range(12)
        ]
        assert all(findings[i]["group"] == g["id"] for i in g["findings"])
        assert len({findings[i]["kind"] for i in g["findings"]}) == 1
    assert [f["module"] for f in findings if f["group"] is None] == ["lm_head"]


def test_sarif_keeps_one_result_per_finding_with_its_group(opt: Report) -> None:
    results = json.loads(sarif([opt]))["runs"][0]["results"]
    assert len(results) == 97
    grouped = [r for r in results if "properties" in r]
    assert len(grouped) == 96
    assert {r["properties"]["group"]["layers"] for r in grouped} == {f"{OPT_LAYERS}.0-11"}
    assert {r["properties"]["group"]["count"] for r in grouped} == {12}
    names = {r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] for r in results}
    assert len(names) == 97  # each location once


def test_a_last_layer_that_differs_breaks_the_run(opt: Report) -> None:
    out = text(edited(opt, {11}))
    assert f"{OPT_LAYERS}.0-10 ×11 (" in out and f"{OPT_LAYERS}.0-11" not in out
    # Layer 11 is listed alone, each of its eight findings, in its own words.
    alone = [line for line in out.splitlines() if f"in {OPT_LAYERS}.11" in line]
    assert len(alone) == 8
    assert "autocast casts 1 tensor to bf16 before linear in model.decoder.layers.11.fc2" in out


def test_layers_alike_with_gaps_are_a_set_not_a_range(opt: Report) -> None:
    odd = {1, 3, 5, 7, 9, 11}
    out = text(edited(opt, odd))
    assert f"{OPT_LAYERS}.{{0,2,4,6,8,10}} ×6 (" in out
    assert f"{OPT_LAYERS}.{{1,3,5,7,9,11}} ×6 (" in out
    assert f"{OPT_LAYERS}.0-" not in out and f"{OPT_LAYERS}.1-" not in out
    assert len(out.splitlines()) <= 60


def test_indices_and_items_fold_by_identity() -> None:
    assert indices_label([3, 4, 5]) == "3-5" and indices_label([0, 2]) == "{0,2}"
    assert Group("", (0, 1)).label == "0-1"  # a top-level list
    items = [(f"b.{i}.fc", "x" if i % 2 else "y") for i in range(5)]
    entries = fold(items, lambda i: i[0], lambda i, layer: i[1])
    assert [(e.group.label if e.group else None, e.count) for e in entries] == [
        ("b.{0,2,4}", 3),
        ("b.{1,3}", 2),
    ]


def test_opt_diff_folds_and_json_keeps_every_change() -> None:
    a, b = bundled_report("opt-125m", "fp32"), bundled_report("opt-125m", "amp-fp32")
    d = diff_reports(a, b)
    lines = diff_text(d).splitlines()
    assert len(lines) <= 60
    assert lines[3] == (
        "autocast casts per forward 0 (0 B) → 194 (247,855,104 B (247.9 MB)); promotions 0 (0 B) "
        "→ 24 (589,824 B (589.8 kB))"
    )
    assert f"{OPT_LAYERS}.0-11 ×12" in lines
    assert (
        "  ~ add_2 … add_24 aten.add.Tensor: inputs fp32, fp32 → fp32, bf16; promotion none → "
        "fp32 + bf16 → fp32"
    ) in lines
    doc = json.loads(diff_json(d))
    # 300 in the layers, the final norm, lm_head, the output, the position cumsum, and the sum
    # transformers checks the all-ones mask with (fast_all), as a real run does: on fp32's list.
    assert len(doc["changes"]) == d.counts()["changed"] == 305
    grouped = [c for c in doc["changes"] if c["group"] is not None]
    assert len(grouped) == 12 * len(doc["groups"]) == 300
    assert {g["layers"] for g in doc["groups"]} == {f"{OPT_LAYERS}.0-11"}


def test_check_disagreements_fold_and_are_counted_first(opt: Report) -> None:
    data = opt.to_dict()
    wrong = {"agree": False, "dispatcher": {"outputs": ["float32"]}}
    for node in data["nodes"]:
        if node["op"] == "aten.relu.default":
            node["check"] = wrong
    lines = disagreement_lines(Report.from_dict(data))
    assert lines == [
        "  12 disagreements: 12 aten.relu.default",
        (
            "  relu … relu_11 (aten.relu.default, model.decoder.layers.0-11.activation_fn ×12): "
            "predicted bf16, dispatcher fp32"
        ),
    ]
