"""Issue 42: three capture mechanisms the zoo left open, each on a small module made to show it.

* A forward that returns an object holding no tensor which fx cannot put into the output node
  (nemotron_h's hybrid cache, whose attention-free layers are transformers' ``DummyLayer``): a
  real run returns it; the capture failed at the very end, the whole model lost.
* ``aten.pad`` by a width computed from a data-dependent size (GLM-5-Next's indexer pads its
  selected indices to a fixed width): the trace computes the output's size through torch's
  Python kernels (``(16*u0 + 15) + (2063 - 16*u0)`` is 2063), the replays' C++ kernel refused the
  symbolic width ("SymIntArrayRef expected to contain only concrete integers").
* A forward that builds a module and calls it (BigBird's first forward on a short sequence
  switches block-sparse attention to full, a new attention with its own Dropout): the zoo's eager
  hooks ran after the capture, on the model the capture's forward had switched, and printed a
  line the capture's forward, like any first forward, has not got.
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

SETTINGS = ["fp32", "half", "amp-half", "amp-fp32"]


class _Empty:
    """A cache entry of a layer that keeps nothing (transformers' ``DummyLayer``)."""

    def __init__(self) -> None:
        self.is_initialized, self.keys = True, None


class _Kept:
    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys


class _Cache:
    def __init__(self, layers: list[object]) -> None:
        self.layers = layers


class HybridCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        h = self.fc(x.to(self.fc.weight.dtype))
        return {"out": h, "cache": _Cache([_Empty(), _Kept(h * 2)])}


@pytest.mark.parametrize("name", SETTINGS)
def test_an_output_holding_no_tensor_is_named_not_lost(name: str) -> None:
    torch.manual_seed(0)
    model = ModelInputs("hybrid", HybridCache().eval(), (torch.randn(2, 4),))
    setting = Setting.parse(name)
    report = analyze(model, setting)  # before: make_fx could not trace 'hybrid'
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    assert verify(model, Setting.parse(name, device_type="cpu")).ok


def test_the_output_node_says_what_the_object_was() -> None:
    from ampgraph.capture.trace import capture

    torch.manual_seed(0)
    model = ModelInputs("hybrid", HybridCache().eval(), (torch.randn(2, 4),))
    cap = capture(model, Setting.parse("amp-fp32"))
    output = next(n for n in cap.graph_module.graph.nodes if n.op == "output")
    said = [a for a in output.args[0] if isinstance(a, str)]
    assert said == ["_Empty: no tensor (a real run returns the object; nothing to analyse)"]
    assert "cache.layers.1.keys" in cap.output_paths


class PadToWidth(nn.Module):
    """Rows picked by the data, padded to a fixed count (GLM-5-Next's indexer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        kept = h[x[:, 0] > 0]
        return self.out(F.pad(kept, (0, 0, 0, 8 - kept.shape[0]), value=-1.0))


@pytest.mark.parametrize("name", SETTINGS)
def test_a_pad_by_a_data_dependent_width_is_followed(name: str) -> None:
    torch.manual_seed(0)
    model = ModelInputs("pad", PadToWidth().eval(), (torch.randn(6, 4),))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert not [n.error for n in report.nodes if n.error]  # before: the pad failed, 3 nodes on
    assert report.check is not None and report.check["disagreements"] == 0
    pad = next(n for n in report.nodes if n.op == "aten.pad.default")
    assert pad.outputs == [pad.inputs[0]["dtype"]]  # runs in its input's dtype
    assert hook_lines(report) == eager_hook_lines(model, setting)
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


class Sparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Full(Sparse):
    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(x).softmax(-1))


class Switching(nn.Module):
    """A first forward that swaps its attention for another kind, keeping the projection and
    adding a Dropout (BigBird's ``set_attention_type("original_full")``), and calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Sparse()
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(self.attn) is Sparse:
            full = Full().eval()
            full.proj = self.attn.proj
            self.attn = full
        return self.out(self.attn(x.to(self.out.weight.dtype)))


def _switching() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("switching", Switching().eval(), (torch.randn(2, 4),))


def test_a_forward_that_rebuilds_the_model_leaves_it_as_it_was() -> None:
    """The capture's forward switched the model; the eager hooks run after it took the second
    forward's path and printed the new Dropout, which no first forward (the capture's, a real
    run's with hooks registered before it) prints. The model is now left as it was."""
    model = _switching()
    setting = Setting.parse("amp-fp32")
    ours = hook_lines(analyze(model, setting))
    assert type(model.module.attn) is Sparse  # before: Full, built by the capture's forward
    assert eager_hook_lines(model, setting) == ours == eager_hook_lines(_switching(), setting)
    switched = _switching()
    switched.module(*switched.args)  # a second forward's hooks see the Dropout
    after = eager_hook_lines(switched, setting)
    assert len(after) == len(ours) + 1 and "[attn.dropout]" in after[1]
    result = verify(_switching(), Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


def test_the_zoo_runs_the_eager_hooks_on_a_fresh_model() -> None:
    harness = load_file(ROOT / "scripts" / "zoo.py")
    cell = harness._check(_switching(), "amp-fp32", "bf16", _switching())
    assert cell["agrees"] and cell["hooks"][0] == cell["hooks"][1] == 2
