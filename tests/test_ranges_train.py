"""``ampgraph ranges --pass train`` (gradients and the fp16 loss scale) and ``--diff``.

Each prediction is checked against the real thing on the CPU: the fp32 gradients against eager
autograd; each gradient overflow against a real fp16 backward (fp16 parameters, and CPU autocast
fp16), inf exactly where predicted and nowhere else; the loss scale against real fp16 backwards
at that scale (finite) and at twice it (inf).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph.cli import main
from ampgraph.model.build import ModelInputs
from ampgraph.ranges import RangesResult, value_ranges
from ampgraph.ranges.setting_diff import diff

FP16_SETTINGS = ("half", "amp-fp32")
BF16 = "autocast=on,dtype=bf16,params=fp32"


class GradBlowup(nn.Module):
    """The forward fits fp16 (fc2's output is 8 * 2e4 * 4e-3 = 640); the backward does not: the
    gradient into fc1's output is 4 * 2e4 = 8e4, fc1's weight and bias gradients 2 * 8e4."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x.to(self.fc1.weight.dtype)))


def grad_blowup() -> tuple[nn.Module, torch.Tensor]:
    """The factory ``--module tests/test_ranges_train.py:grad_blowup`` names."""
    m = GradBlowup()
    with torch.no_grad():
        m.fc1.weight.fill_(1e-3)
        m.fc1.bias.zero_()
        m.fc2.weight.fill_(2e4)
        m.fc2.bias.zero_()
    return m, torch.ones(2, 4)


@functools.cache
def _result() -> RangesResult:
    m, x = grad_blowup()
    return value_ranges(ModelInputs("grad_blowup", m, (x,)), [*FP16_SETTINGS, BF16],
                        device_type="cpu", amp_dtype="fp16", pass_="train")  # fmt: skip


def _real_backward(setting: str, scale: float = 1.0) -> tuple[dict[str, bool], bool]:
    """A real backward on the CPU in ``setting``: which parameter gradients hold an inf, and
    whether the gradient into fc1's output does."""
    m, x = grad_blowup()
    m = copy.deepcopy(m)
    if setting == "half":
        m = m.half()
    seen: dict[str, bool] = {}

    def hook(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
        out.register_hook(lambda g: seen.update(fc1=bool(g.isinf().any())))

    m.fc1.register_forward_hook(hook)
    dtype = {"half": None, "amp-fp32": torch.float16, BF16: torch.bfloat16}[setting]
    with torch.autocast("cpu", dtype=dtype or torch.float16, enabled=dtype is not None):
        out = m(x)
    (out.float().sum() * scale).backward()
    grads = {n: bool(p.grad.isinf().any()) for n, p in m.named_parameters()}
    return grads, seen["fc1"]


def _overflowing(result: RangesResult, index: int) -> set[str]:
    return {
        f.reference or f.node for f in result.settings[index].findings
        if f.kind == "gradient-overflow"
    }  # fmt: skip


def test_fp32_gradients_are_eager_autograds() -> None:
    m, x = grad_blowup()
    m.train()
    m(x).float().sum().backward()
    measured = _result().parameter_gradients
    for name, p in m.named_parameters():
        g = p.grad.abs()
        assert measured[name].max_abs == pytest.approx(float(g.max()), rel=1e-6)
        assert measured[name].min_nonzero == pytest.approx(float(g[g > 0].min()), rel=1e-6)
    fc1 = next(n for n in _result().nodes if n.module == "fc1" and n.op.startswith("aten.linear"))
    assert fc1.gradients is not None and fc1.gradients[0] is not None
    assert fc1.gradients[0].max_abs == pytest.approx(8e4)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_gradient_overflow_where_a_real_backward_has_inf(index: int) -> None:
    setting = [*FP16_SETTINGS, BF16][index]
    grads, fc1_inf = _real_backward(setting)
    predicted = _overflowing(_result(), index)
    fc1 = next(n.name for n in _result().nodes if n.module == "fc1" and n.op.startswith("aten."))
    assert (fc1 in predicted) == fc1_inf
    if setting == "half":  # parameter gradients are fp16 there: each judged on its own
        assert predicted - {fc1} == {n for n, inf in grads.items() if inf}
    elif setting == BF16:
        assert not predicted and not any(grads.values()) and not fc1_inf
    else:  # fp32 gradients, computed in fp16 for autocast's weight copies first
        assert predicted - {fc1} == {"fc1.weight", "fc1.bias"}
        assert grads["fc1.weight"] and not grads["fc2.weight"]
    assert _result().settings[index].ok == (setting == BF16)


@pytest.mark.parametrize("index", [0, 1])
def test_loss_scale_is_the_largest_that_stays_finite(index: int) -> None:
    scale = _result().settings[index].loss_scale
    assert scale is not None and scale.log2 == -2 and scale.max_abs == pytest.approx(1.6e5)
    assert scale.init_overflows and scale.halvings == 18
    setting = FP16_SETTINGS[index]
    grads, fc1_inf = _real_backward(setting, math.ldexp(1.0, scale.log2))
    assert not any(grads.values()) and not fc1_inf
    grads, fc1_inf = _real_backward(setting, math.ldexp(1.0, scale.log2 + 1))
    assert any(grads.values())
    assert _result().settings[2].loss_scale is not None
    assert _result().settings[2].loss_scale.log2 is None  # no fp16 gradient in bf16 autocast


def test_diff_names_the_values_judged_differently() -> None:
    half, bf16 = _result().settings[0], _result().settings[2]
    rows = diff(half, bf16)
    assert {r.value for r in rows} == _overflowing(_result(), 0)
    assert all(r.a and not r.b and r.severity == "error" for r in rows)
    assert diff(half, half) == []


def test_cli_pass_train_and_diff() -> None:
    args = ["ranges", "--module", "tests/test_ranges_train.py:grad_blowup", "--device", "cpu",
            "--amp-dtype", "fp16", "-s", "half", "-s", BF16, "--pass", "train"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "loss scale <= 2**-2 keeps the fp16 gradients finite" in out.output
    assert "GradScaler's init 2**16 overflows at step 1: 18 halvings" in out.output
    data = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    assert data["pass"] == "train" and data["loss_scale"]["log2"] == -2
    assert data["settings"][0]["loss_scale"]["halvings"] == 18
    assert data["parameter_gradients"]["fc1.weight"]["max_abs"] == pytest.approx(1.6e5)
    md = CliRunner().invoke(main, [*args, "--format", "markdown"]).output
    assert "- `half`: loss scale <= 2**-2 keeps the fp16 gradients finite" in md
    shown = CliRunner().invoke(main, [*args, "--diff"])
    assert shown.exit_code == 0 and "3 values judged differently" in shown.output
    record = json.loads(CliRunner().invoke(main, [*args, "--diff", "--format", "json"]).output)
    assert {r["value"] for r in record["diff"]["rows"]} >= {"fc1.weight", "fc1.bias"}
    usage = CliRunner().invoke(main, [*args[:-4], "--diff"])  # one setting
    assert usage.exit_code == 2 and "--diff compares two settings" in usage.output
    assert CliRunner().invoke(main, [*args[:-2], "--loss", "0"]).exit_code == 2


def _saved_files(tmp_path: Path) -> tuple[Path, Path]:
    """A ranges run and a report of ``grad_blowup`` in ``half`` (fp16), as the CLI saves them."""
    args = ["--module", "tests/test_ranges_train.py:grad_blowup", "--device", "cpu",
            "--amp-dtype", "fp16", "-s", "half"]  # fmt: skip
    ranges, report = tmp_path / "ranges.json", tmp_path / "report.json"
    out = CliRunner().invoke(main, ["ranges", *args, "--pass", "train", "--format", "json"])
    ranges.write_text(out.output)
    report.write_text(CliRunner().invoke(main, ["table", *args, "--format", "json"]).output)
    return ranges, report


def test_audit_kinds_are_ranges_kinds() -> None:
    from ampgraph.ranges.data import KINDS
    from ampgraph.review.audit_ranges import SEVERITY

    assert set(SEVERITY) == set(KINDS)
    assert [SEVERITY[k][0] for k in ("overflow", "flush-to-zero", "subnormal")] == [
        "error", "warning", "note"
    ]  # fmt: skip


def test_audit_ranges_adds_the_range_findings(tmp_path: Path) -> None:
    ranges, report = _saved_files(tmp_path)
    base = ["audit", "--report", str(report), "--ranges", str(ranges)]
    out = CliRunner().invoke(main, base)
    assert out.exit_code == 0, out.output
    assert "findings: 3 range-gradient-overflow" in out.output
    assert CliRunner().invoke(main, [*base, "--fail-on", "error"]).exit_code == 1
    data = json.loads(CliRunner().invoke(main, [*base, "--format", "json"]).output)
    kinds = [f["kind"] for f in data["audits"][0]["findings"]]
    assert kinds.count("range-gradient-overflow") == 3
    sarif = json.loads(CliRunner().invoke(main, [*base, "--format", "sarif"]).output)
    run = sarif["runs"][0]
    assert {r["ruleId"] for r in run["results"]} == {"range-gradient-overflow"}
    assert "range-gradient-overflow" in {r["id"] for r in run["tool"]["driver"]["rules"]}
    # Torch-free, as the audit of saved reports is: torch cannot even be imported here.
    code = ("import sys; sys.modules['torch'] = None; from ampgraph.cli import main; "
            f"main({base!r})")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "findings: 3 range-gradient-overflow" in done.stdout


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="ampgraph.report"), "schema is 'ampgraph.report'"),
        (lambda d: d["settings"][0]["findings"][0].update(node=3),
         "settings[0].findings[0].node is an int, not a string"),
        (lambda d: d["settings"][0]["findings"][0].update(kind="boom"), "'boom' is no kind"),
        (lambda d: d["settings"][0]["setting"].update(name="amp-half"), "is not among the audited"),
    ],
)  # fmt: skip
def test_audit_ranges_refuses_a_wrong_file_in_one_line(
    tmp_path: Path, change: Any, message: str
) -> None:
    ranges, report = _saved_files(tmp_path)
    data = json.loads(ranges.read_text())
    change(data)
    ranges.write_text(json.dumps(data))
    out = CliRunner().invoke(main, ["audit", "--report", str(report), "--ranges", str(ranges)])
    assert out.exit_code == 1 and message in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1
