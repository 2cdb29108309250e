"""``ampgraph audit``: every finding kind on a module made for it, exact figures on OPT-125M and
llama-tiny, the output formats and bad input."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph import Setting, analyze
from ampgraph.cli import main
from ampgraph.formats.markdown import audit_markdown as markdown
from ampgraph.formats.sarif import audit_sarif as sarif
from ampgraph.report.records import Report
from ampgraph.review.audit import (
    KINDS,
    SEVERITIES,
    Finding,
    at_or_above,
    audit,
    summary,
)
from tests.conftest import report as bundled_report


def setting(name: str, amp: str = "bf16") -> Setting:
    return Setting.parse(name, device_type="cuda", amp_dtype=amp)


def kinds(report: Report) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in audit(report):
        out.setdefault(f.kind, []).append(f)
    return out


class Residual(nn.Module):
    """seed 001 in small: a Linear under autocast, and the residual add that promotes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class Island(nn.Module):
    """Seed 002's fp32 wrapper: autocast disabled around a matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        with torch.autocast("cuda", enabled=False):
            island = h.float().t() @ h.float()
        return self.head(island)


@torch.library.custom_op("ampgraph_audit::mix", mutates_args=())
def _mix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w.to(x.dtype)


@_mix.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Custom(nn.Module):
    """A custom op with no autocast rule, fed an fp32 input and a Linear's bf16 output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ampgraph_audit.mix(x, self.fc(x))


class Flash(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)[0]


class Sensitive(nn.Module):
    """What CUDA autocast's fp32 list protects: LayerNorm, softmax, exp, sum."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        return h.softmax(-1) + h.exp().sum(-1, keepdim=True)


@functools.cache
def residual(input_dtype: torch.dtype = torch.float32) -> Report:
    return analyze(Residual(), setting("amp-fp32"), args=(torch.randn(4, 8, dtype=input_dtype),))


@functools.cache
def sensitive(amp: str) -> Report:
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    return analyze(Sensitive(), setting("half", amp), args=(torch.randn(4, 8, dtype=dtype),))


def test_promotion_and_casts_with_their_bytes() -> None:
    found = kinds(residual())
    (prom,) = found["promotion"]
    assert (prom.node, prom.severity) == ("add", "note")
    assert prom.bytes == 4 * 8 * 4  # the fp32 result of a 4x8 add
    assert prom.details["extra_bytes"] == 4 * 8 * 2  # versus keeping it in bf16
    (cast,) = found["autocast-cast"]
    assert cast.details["weights"] == 2 and cast.details["activations"] == 1
    assert cast.details["weights_bytes"] == (8 * 8 + 8) * 2
    assert cast.details["activations_bytes"] == 4 * 8 * 2
    assert cast.bytes == (8 * 8 + 8 + 4 * 8) * 2
    assert "an input passed in bf16 removes 1 cast" in cast.suggestion


def test_a_16bit_input_saves_one_cast_per_linear() -> None:
    """Seed 001: pre-casting the input removes exactly the casts audit said it would."""
    before, after = summary(residual())["casts"], summary(residual(torch.bfloat16))["casts"]
    assert before["from_inputs"] == 1
    assert after["count"] == before["count"] - before["from_inputs"]
    assert after["weights"] == before["weights"]


def test_fp32_island_and_its_border_casts() -> None:
    rep = analyze(Island(), setting("amp-fp32"), args=(torch.randn(4, 8),))
    (island,) = kinds(rep)["fp32-island"]
    region = next(n for n in rep.nodes if n.kind == "region")
    assert island.node == region.name
    body = [n for n in rep.nodes if n.region == region.name]
    assert island.details["ops"] == sum(n.kind == "op" for n in body)
    # Entering: h (bf16 from proj) converted to fp32 by the body's .float().
    assert island.details["entry"] and all(
        rep.node(name).inputs[0]["dtype"] == "bfloat16" for name in island.details["entry"]
    )
    # Leaving: head's autocast cast of the fp32 matmul result back to bf16 (8x8).
    (exit_cast,) = island.details["exit"]
    assert (exit_cast["from"], exit_cast["to"]) == ("float32", "bfloat16")
    head = next(n for n in rep.nodes if n.module == "head" and n.op == "aten.linear.default")
    assert exit_cast["op"] == head.name


def test_custom_op_fed_mixed_dtypes() -> None:
    rep = analyze(Custom(), setting("amp-fp32"), args=(torch.randn(4, 8),))
    found = kinds(rep)
    # Inside autocast, the finding is that the op has no autocast rule (issue 26), said once.
    (mixed,) = found["no-autocast-rule"]
    assert "mixed-dtypes" not in found
    assert mixed.severity == "warning" and mixed.op == "ampgraph_audit.mix.default"
    assert "bf16 mixed with fp32" in mixed.message
    assert "promotion" not in found  # a custom op's dtypes are its own, not type promotion


def test_dtype_error_carries_torchs_message() -> None:
    rep = analyze(nn.Linear(2, 2), setting("half"), args=(torch.randn(2, 2),))
    (err,) = kinds(rep)["dtype-error"]
    assert err.severity == "error"
    assert "mat1 and mat2 must have the same dtype, but got Float and BFloat16" in err.message


def test_16bit_only_kernel_fed_fp32() -> None:
    rep = analyze(Flash(), setting("fp32"), args=(torch.randn(1, 2, 4, 8),))
    (f,) = kinds(rep)["fp32-into-16bit-only"]
    assert f.severity == "error"


def test_sensitive_ops_in_bf16() -> None:
    found = kinds(sensitive("bf16"))
    ops = sorted(f.op.split(".")[1] for f in found["sensitive-16bit"])
    assert ops == ["exp", "layer_norm", "softmax", "sum"]
    assert "fp16-range" not in found
    ln = next(f for f in found["sensitive-16bit"] if "layer_norm" in f.op)
    assert ln.module == "ln" and ln.bytes == 4 * 8 * 2


def test_fp16_range_risks_where_the_setting_is_fp16() -> None:
    found = kinds(sensitive("fp16"))
    assert sorted(f.op.split(".")[1] for f in found["fp16-range"]) == ["exp", "sum"]
    assert sorted(f.op.split(".")[1] for f in found["sensitive-16bit"]) == [
        "layer_norm",
        "softmax",
    ]


def test_no_finding_is_hard_coded_every_kind_has_a_severity() -> None:
    assert {level for level, _title in KINDS.values()} <= set(SEVERITIES)
    findings = audit(residual())
    assert at_or_above(findings, "note") == findings and at_or_above(findings, "warning") == []


def test_opt_125m_amp_fp32_exact_figures() -> None:
    """The issue's 24 promotions and 194 casts, and their bytes from OPT-125M's shapes."""
    s = summary(bundled_report("opt-125m", "amp-fp32"))
    seq, hidden, ffn, vocab, layers = 8, 768, 3072, 50272, 12
    assert s["promotions"] == {"count": 2 * layers, "bytes": 2 * layers * seq * hidden * 4}
    per_layer = 4 * (hidden * hidden + hidden) + (ffn * hidden + ffn) + (hidden * ffn + hidden)
    assert s["casts"] == {
        "count": 194,
        # q, k, v, out_proj, fc1, fc2: weight and bias; lm_head: its (tied) weight only
        "weights": 6 * 2 * layers + 1,
        "weights_bytes": (per_layer * layers + vocab * hidden) * 2,
        # q, k, v and fc1 read an fp32 LayerNorm output; lm_head the final one
        "activations": 4 * layers + 1,
        "activations_bytes": (4 * layers + 1) * seq * hidden * 2,
        "bytes": (per_layer * layers + vocab * hidden + (4 * layers + 1) * seq * hidden) * 2,
        "from_inputs": 0,
    }
    assert s["findings"] == {"autocast-cast": 73, "promotion": 24}


def test_opt_125m_half_has_its_layer_norms_in_bf16() -> None:
    found = kinds(bundled_report("opt-125m", "half"))
    assert set(found) == {"sensitive-16bit"}
    assert len(found["sensitive-16bit"]) == 2 * 12 + 1


def test_llama_tiny_amp_fp32() -> None:
    rep = bundled_report("llama-tiny", "amp-fp32")
    s = summary(rep)
    assert s["promotions"]["count"] == sum(n.promotion is not None for n in rep.nodes) == 12
    assert s["casts"]["count"] == sum(len(n.casts) for n in rep.nodes) == 30
    assert s["promotions"]["bytes"] == 73_728
    # The rotary embedding multiplies bf16 q/k by fp32 cos/sin: promotions in self_attn too.
    modules = {f.module for f in audit(rep) if f.kind == "promotion"}
    assert any(m and m.endswith("self_attn") for m in modules)


def test_reports_without_shapes_give_unknown_bytes_not_wrong_ones() -> None:
    old = dataclasses.replace(
        residual(), nodes=[dataclasses.replace(n, shapes=None) for n in residual().nodes]
    )
    s = summary(Report.from_json(old.to_json()))
    assert s["casts"]["count"] == 3 and s["casts"]["bytes"] is None


def test_sarif_is_structurally_2_1_0(tmp_path: Path) -> None:
    rep = dataclasses.replace(residual(), model="models/mine.py:build")
    doc = json.loads(sarif([rep]))
    assert doc["version"] == "2.1.0" and "sarif-2.1.0" in doc["$schema"]
    (run,) = doc["runs"]
    assert run["tool"]["driver"]["name"] == "ampgraph"
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == set(KINDS)
    assert len(run["results"]) == len(audit(rep))
    for result in run["results"]:
        assert result["ruleId"] in KINDS and result["level"] in SEVERITIES
        assert result["message"]["text"]
        (loc,) = result["locations"]
        assert loc["physicalLocation"]["artifactLocation"]["uri"] == "models/mine.py"
        assert loc["logicalLocations"][0]["fullyQualifiedName"]
    # A bundled model has no file: logical locations only (documented in docs/audit.md).
    bundled = json.loads(sarif([residual()]))["runs"][0]["results"]
    assert all("physicalLocation" not in r["locations"][0] for r in bundled)


def test_markdown_table_rows_match_the_findings() -> None:
    text = markdown(residual())
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(audit(residual()))  # the header and a row per finding


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "r.json"
    path.write_text(residual().to_json())
    return path


def test_cli_audits_a_saved_report(saved: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["audit", "--report", str(saved)])
    assert out.exit_code == 0, out.output
    assert "promotion" in out.output and "autocast casts: 3" in out.output
    as_json = json.loads(runner.invoke(main, ["audit", "--report", str(saved), "--format",
                                              "json"]).output)  # fmt: skip
    assert as_json["schema"] == "ampgraph.audit"
    assert len(as_json["audits"][0]["findings"]) == len(audit(residual()))
    sarif_out = runner.invoke(main, ["audit", "--report", str(saved), "--format", "sarif"])
    assert json.loads(sarif_out.stdout)["version"] == "2.1.0"
    assert "logical locations only" in sarif_out.stderr  # Residual names no file
    md = runner.invoke(main, ["audit", "--report", str(saved), "--format", "markdown"])
    assert md.output.startswith("### ampgraph audit:")


def test_cli_fail_on(saved: Path) -> None:
    runner = CliRunner()
    base = ["audit", "--report", str(saved)]
    assert runner.invoke(main, [*base, "--fail-on", "warning"]).exit_code == 0
    failed = runner.invoke(main, [*base, "--fail-on", "note"])
    assert failed.exit_code == 1
    assert failed.output.splitlines()[-1] == "Error: 2 findings at or above note"


def test_cli_bad_input_is_one_line(tmp_path: Path, saved: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["audit", "--report", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    garbage = tmp_path / "g.json"
    garbage.write_text("[]")
    bad = runner.invoke(main, ["audit", "--report", str(garbage)])
    assert bad.exit_code == 2 and bad.output.strip().splitlines()[-1].startswith("Error:")
    both = runner.invoke(main, ["audit", "--report", str(saved), "-s", "half"])
    assert both.exit_code == 2 and "exclude each other" in both.output
    wrong = runner.invoke(main, ["audit", "--report", str(saved), "--fail-on", "fatal"])
    assert wrong.exit_code == 2


# -- source lines --------------------------------------------------------------------------------


class Sourced(nn.Module):
    """A Linear whose bf16 output meets an fp32 residual: a cast and a promotion to place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # the line of the linear's cast
        return x + h  # the line of the promotion


def _line(text: str) -> int:
    """The line of this file that holds ``text`` (the test's expectations, not hard-coded)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_findings_carry_the_line_of_the_model_code_that_made_them() -> None:
    plain = analyze(Sourced(), "amp-fp32", args=(torch.randn(2, 8),), check=False)
    assert all(n.source is None for n in plain.nodes)  # by default no stack traces are kept
    r = analyze(Sourced(), "amp-fp32", args=(torch.randn(2, 8),), check=False, sources=True)
    here = Path(__file__).resolve().relative_to(Path.cwd()).as_posix()
    # The linear's frame is torch's Linear.forward; the model's code is the call of self.fc.
    assert r.node("linear").source == {"file": here, "line": _line("h = self.fc(x)  # the")}
    assert r.node("add").source == {"file": here, "line": _line("return x + h  # the")}
    assert r.node("x").source is None  # a graph input was made by no line
    found = {f.kind: f.source for f in audit(r)}
    assert found == {"autocast-cast": r.node("linear").source, "promotion": r.node("add").source}
    # SARIF's physical locations: the path relative to the working directory, with the line.
    doc = json.loads(sarif([r]))
    regions = {res["ruleId"]: res["locations"][0]["physicalLocation"]
               for res in doc["runs"][0]["results"]}  # fmt: skip
    assert regions["promotion"] == {
        "artifactLocation": {"uri": here},
        "region": {"startLine": _line("return x + h  # the")},
    }
    # The report keeps them through JSON (a saved report's audit still has them).
    again = Report.from_dict(json.loads(r.to_json()))
    assert again.node("add").source == r.node("add").source
    assert "source" not in plain.node("add").to_dict()  # reports without them read as before


def test_source_lines_are_part_of_the_cache_key() -> None:
    from ampgraph.pipeline.run import report_keys

    s = [Setting.parse("amp-fp32")]
    plain = report_keys("opt-125m", s, seq_len=8, check=False)
    sourced = report_keys("opt-125m", s, seq_len=8, check=False, options={"sources": True})
    assert plain != sourced


@pytest.mark.slow
def test_opt_sarif_points_into_transformers_modelling_code() -> None:
    result = CliRunner().invoke(
        main, ["--no-cache", "audit", "-s", "amp-fp32", "--no-check", "--format", "sarif"]
    )
    assert result.exit_code == 0, result.output
    assert "logical locations only" not in result.stderr  # every result has a line now
    results = json.loads(result.stdout)["runs"][0]["results"]
    assert len(results) == 24 + 73  # 24 promotions, 73 ops whose inputs autocast casts
    import transformers.models.opt.modeling_opt as opt

    modelling = Path(opt.__file__).resolve()
    lines = modelling.read_text().splitlines()
    for res in results:
        where = res["locations"][0]["physicalLocation"]
        assert where["artifactLocation"]["uri"] == modelling.as_uri()
        assert 1 <= where["region"]["startLine"] <= len(lines)
    q_proj = next(r for r in results
                  if r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"]
                  == "model.decoder.layers.0.self_attn.q_proj/linear")  # fmt: skip
    line = q_proj["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert "self.q_proj(hidden_states)" in lines[line - 1]
