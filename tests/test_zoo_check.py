"""Issue 42: the zoo's check on sizes a real run computes from values, each on a small module.

* ``aten.pad`` of a boolean-mask selection (VITS's rational-quadratic spline pads
  ``x[inside_interval_mask]``): the trace computes the padded size as an expression of the
  data-dependent one through torch's Python kernels; the replays' and the eager hooks' C++ kernel
  asked for it as a number ("Could not extract specialized integer from data-dependent
  expression u1"), 29 nodes counted as disagreeing and the eager hooks stopped at top level.
* A slice bounded by a length computed from an integer mask (pe_audio_video aligns its video
  frames to the audio by ``hidden[:video_length]``): the capture follows the mask's values, but a
  slice's bound was not looked into, so the bound became a size with no value.
* The zoo's eager hooks ran on a fresh build from the tester, whose random inputs were not the
  captured ones: sizes computed from a mask's values then differ from the capture's (expand 10 ->
  5), and a forward that decides on a mask's values takes another path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

from .conftest import ROOT, load_file


class Spline(nn.Module):
    """The values inside an interval, padded by one bin (VITS's spline)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.out = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x.to(self.proj.weight.dtype))
        inside = h[(x >= -1) & (x <= 1)]  # a size only the values decide
        widths = F.pad(inside.unsqueeze(-1).expand(-1, 4), (1, 0), value=0.0)
        return self.out(widths)


@pytest.mark.parametrize("name", ["amp-fp32", "half"])
def test_a_pad_of_a_mask_selection_is_followed(name: str) -> None:
    torch.manual_seed(0)
    model = ModelInputs("spline", Spline().eval(), (torch.randn(3, 4),))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.check is not None
    assert report.check["disagreements"] == 0  # before: the pad and all after it, 3 nodes
    assert not [n.name for n in report.nodes if n.not_analysed]
    assert any(n.op == "aten.pad.default" and n.outputs for n in report.nodes)
    eager = eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    assert eager == hook_lines(report)  # before: "[(top level)] ... not analysed: ..."
    assert len(eager) == 2
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


class Align(nn.Module):
    """Each row's frames up to its length from the mask, stretched to the other mask's length
    (pe_audio_video's ``_align_video_hidden_state``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        out = h.new_zeros(h.shape)
        for i, (row, n, m) in enumerate(zip(h, mask.sum(-1), target.sum(-1))):
            kept = row[:n]
            if kept.numel() > 0 and m > 0:
                stretched = F.interpolate(kept[None].transpose(1, 2), size=m, mode="nearest")
                out[i, :m, :] = stretched.transpose(1, 2)[0]
        return self.norm(out)


def _align() -> ModelInputs:
    torch.manual_seed(0)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (2, 5, 1)])
    target = torch.tensor([[1] * n + [0] * (6 - n) for n in (3, 1, 4)])
    return ModelInputs("align", Align().eval(), (torch.randn(3, 6, 4), mask, target))


def test_a_slice_bounded_by_a_followed_length_is_followed() -> None:
    model = _align()
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    ours = hook_lines(report)
    assert ours[-1] == "[norm] in=torch.bfloat16 -> out=torch.float32"
    # Before: "[(top level)] in=None -> not analysed: Could not extract specialized integer".
    assert eager_hook_lines(model, setting) == ours
    result = verify(_align(), Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


class Masked(nn.Module):
    """A forward that drops an all-ones mask, as transformers does before its attention."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bias = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if bool(mask.all()):
            return h
        return h + self.bias(mask.to(x.dtype))


def test_the_check_runs_the_eager_hooks_on_the_captured_inputs() -> None:
    """The eager run's fresh model came from a tester that drew other random inputs; it now runs
    on the inputs the capture ran with, copied before the capture."""
    harness = load_file(ROOT / "scripts" / "matrix_harness.py")

    def masked(mask: list[int]) -> ModelInputs:
        torch.manual_seed(0)
        inputs = (torch.randn(2, 4), torch.tensor([mask] * 2))
        return ModelInputs("masked", Masked().eval(), inputs)

    cell = harness.compare(masked([1, 1, 1, 1]), "amp-fp32", "bf16", masked([1, 1, 0, 0]))
    assert cell.agrees, cell.first_difference  # before: the eager run printed [bias]
    assert cell.hooks == 1


def test_the_zoo_builds_the_same_inputs_every_time() -> None:
    """Testers draw inputs from Python's and their own ``global_rng``: seeded per build."""
    import random
    import sys
    import types

    zoo = load_file(ROOT / "scripts" / "zoo.py")
    common = types.ModuleType("tests.zoo_fake_common")
    common.global_rng = random.Random()  # type: ignore[attr-defined]
    sys.modules[common.__name__] = common
    try:
        draws = []
        for _ in range(2):
            zoo.seed_testers()
            draws.append((common.global_rng.random(), random.random(), torch.rand(1).item()))
        assert draws[0] == draws[1]
    finally:
        del sys.modules[common.__name__]
