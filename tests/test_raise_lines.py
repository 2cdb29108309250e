"""Issue 42, mechanism 2: the module lines before a raise come from the setting's own run.

``F.binary_cross_entropy`` raises under CUDA autocast whatever its inputs' dtypes ("unsafe to
autocast"). The lines before it were reported from a trace with fp32 parameters, so
``fc(x.to(self.fc.weight.dtype))`` showed ``in=torch.float32`` in ``amp-half``, where a real run
has ``in=torch.bfloat16``, and the check passed it. The forward is now traced in its setting on
past the op autocast refuses (autocast off for that one call, the op kept as the model called it),
and where a graph still has to be traced again with fp32 parameters, the check compares the lines
before the raise with what their hooks saw in the setting's own trace.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ampgraph.capture.trace as trace_module
from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

UNSAFE = "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast."


class CastThenBce(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = self.fc(x.to(self.fc.weight.dtype))
        return F.binary_cross_entropy(torch.sigmoid(y), target)


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("cast-then-bce", CastThenBce().eval(), (torch.randn(2, 8), torch.rand(2, 8)))


@pytest.mark.parametrize("name", ["amp-half", "amp-fp32"])
@pytest.mark.parametrize("amp_dtype", ["bfloat16", "float16"])
def test_the_lines_before_the_raise_are_the_settings_own(name: str, amp_dtype: str) -> None:
    setting = Setting.parse(name, amp_dtype=amp_dtype)
    report = analyze(_model(), setting)
    assert report.capture["method"] == "make-fx"  # traced in the setting, not retyped
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    # The eager model's own hooks in the setting (fake CUDA tensors, real autocast kernels).
    assert lines == eager_hook_lines(_model(), setting)
    fc_in = amp_dtype if name == "amp-half" else "float32"
    assert lines == [
        f"[fc] in=torch.{fc_in} -> out=torch.{amp_dtype}",
        f"[(top level)] in=None -> error: {UNSAFE}",
    ]
    assert [r.op for r in report.nodes if r.error] == ["aten.binary_cross_entropy.default"]


@pytest.mark.parametrize("name", ["half", "amp-half"])
def test_the_cpu_run_agrees(name: str) -> None:
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_the_check_fails_a_line_before_the_raise_from_another_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the trace cannot get past the raise, the graph is traced with fp32 parameters and
    its ``fc`` line says fp32: the check compares it with the setting's own trace and fails it."""

    def cannot(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("not past it")

    monkeypatch.setattr(trace_module, "_trace_past_raise", cannot)
    report = analyze(_model(), "amp-half")
    assert report.capture["method"] == "export-retyped"
    assert hook_lines(report)[0] == "[fc] in=torch.float32 -> out=torch.bfloat16"  # the wrong line
    assert report.check is not None and report.check["disagreements"] >= 1
    assert any(
        "[fc] (call 0) with in=torch.float32 where its hook saw torch.bfloat16" in note
        for note in report.check.get("module_disagreements", [])
    )
