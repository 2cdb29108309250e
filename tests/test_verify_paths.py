"""verify never cries wolf on a data path (issue 33): sizes from values, and sizes no run decides.

A graph traced along a data path (``export-data-path``) holds the draft run's decisions as runtime
assertions. Where verify's own random values decide one of them the other way, the real run
leaves the captured path there: the nodes and module lines after it are *not comparable*, with
why, never disagreements (torchvision's Faster R-CNN: 94 RPN boxes in the draft run, none in
verify's). A node ampgraph honestly could not analyse is *not analysed*, counted apart.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph.formats.verify import disagreement_lines, note_lines, summary_line
from ampgraph.cli import main
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify import verify, verify_record
from tests.test_data_dependent import DelayWeights


class KeepAll(nn.Module):
    """A size from a threshold on values feeding later ops, and a branch on it.

    The draft run's buffers are absolute values (:func:`ampgraph.capture.draft_export.draft_values`),
    so in fp32 every column is kept there and the graph is the ``head(keep)`` path. Off that path
    a real ``head(keep)`` raises (fewer columns into an 8-wide Linear): a path the model does not
    take then. The threshold is the activations' precision: a 16-bit run keeps fewer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        keep = h[:, self.scale >= 4 * torch.finfo(h.dtype).eps]
        if keep.shape[1] == h.shape[1]:
            return self.head(keep)
        return self.head(h) * keep.sum()


def keep_all() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("keep-all", KeepAll(), (torch.randn(4, 8),))


def cpu(name: str) -> Setting:
    return Setting.parse(name, device_type="cpu")


def test_verify_runs_on_the_draft_runs_values_and_compares_in_full() -> None:
    """Seed 0 is the draft run's values: the real run keeps every column, as the capture's
    draft run did, and stays on the captured path (verify's own random buffer, half negative,
    would leave it)."""
    result = verify(keep_all(), cpu("fp32"))
    assert result.report is not None and result.report.capture["method"] == "export-data-path"
    assert result.ok, disagreement_lines(result)
    assert result.nodes.not_comparable == 0 and not result.nodes.why
    assert result.nodes.agree == result.nodes.total > 0
    assert (result.modules.agree, result.modules.total) == (2, 2)


@pytest.mark.parametrize(("name", "seed"), [("fp32", 1), ("amp-fp32", 0)])
def test_a_real_run_off_the_captured_path_is_not_comparable_never_a_disagreement(
    name: str, seed: int
) -> None:
    """Another seed's values (fp32), or the setting's own precision on the draft's values
    (amp-fp32: a bf16 threshold keeps fewer): the real run leaves the captured path."""
    result = verify(keep_all(), cpu(name), random_seed=seed)
    assert result.ok, disagreement_lines(result)
    # The real run's branch differs: the nodes past the assertion are set apart, with why.
    assert result.nodes.not_comparable > 0 and result.nodes.agree == result.nodes.total > 0
    (why,) = result.nodes.why
    assert "leaves the captured path" in why and "in the capture's draft run" in why
    # [fc] ran before the branch and is compared; [head] runs on the other path.
    assert (result.modules.agree, result.modules.total, result.modules.not_comparable) == (1, 1, 1)
    assert "not comparable), " in summary_line(result)
    assert note_lines(result)[0].startswith("  nodes not comparable: the real run leaves")
    entry = json.loads(json.dumps(verify_record([result])))["results"][0]
    assert entry["ok"] is True and entry["agreement"]["nodes"]["not_comparable"] > 0


class KeepInRegion(KeepAll):
    """:class:`KeepAll`'s branch inside an autocast-disabled region (seed 002's fp32 wrapper)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        with torch.autocast("cpu", enabled=False):
            keep = h[:, self.scale >= 4 * torch.finfo(h.dtype).eps]
            y = keep.float() * 2 if keep.shape[1] == h.shape[1] else h.float()
        return self.head(y)


def test_a_branch_decided_otherwise_inside_a_region_sets_the_region_apart_too() -> None:
    """The assertion fails in the region's body: the region node itself, and all after it, are
    past that branch (never "not run" against a predicted dtype)."""
    torch.manual_seed(0)
    model = ModelInputs("keep-in-region", KeepInRegion(), (torch.randn(4, 8),))
    result = verify(model, cpu("amp-fp32"))
    assert result.ok, disagreement_lines(result)
    assert result.nodes.not_comparable > 0
    (why,) = result.nodes.why
    assert "leaves the captured path at " in why and "._assert_scalar" in why  # in the body


def test_nodes_not_analysed_are_counted_apart_not_as_disagreements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A size no run decides (the capture cut at it, as Faster R-CNN's unhinted ``Eq(u2, 0)``):
    the nodes from the cut on are no prediction, and the module lines a real run prints after
    it are not analysed either. torch's guess that the data's index may be negative is kept,
    as test_data_dependent's cut does: the real index decides it where ampgraph follows it."""
    from ampgraph.capture import draft_export, guesses

    monkeypatch.setattr(draft_export, "_real_checks_without_guards", contextlib.nullcontext)
    monkeypatch.setattr(guesses, "decided_by_real_values", lambda *args: False)
    torch.manual_seed(0)
    model = ModelInputs("delays", DelayWeights(), (torch.randn(2, 8, 8),))
    result = verify(model, cpu("amp-fp32"))
    assert result.report is not None and result.report.capture["method"] == "draft-export"
    assert result.ok, disagreement_lines(result)
    assert result.nodes.not_analysed > 0 and result.nodes.agree == result.nodes.total > 0
    # [v] is compared; [out], which the real run prints past the cut, is not analysed.
    assert (result.modules.agree, result.modules.total, result.modules.not_analysed) == (1, 1, 1)
    line = summary_line(result)
    assert "not analysed)" in line and line.endswith("; 0 disagreements")


class Mix(nn.Module):
    """A leaf whose first op takes a value from before the cut, and whose output one after."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * self.w + b


class PerClass(nn.Module):
    """A loop over the classes the data holds, as torchvision's ``batched_nms`` loops over
    ``torch.unique(idxs)``: how many there are is a size only the data decides
    (``Eq(u0, 0)``), which the capture follows on the example's real values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.mix = Mix()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        labels = (h[:, 0] > 0).long()
        out = torch.zeros_like(h)
        for c in torch.unique(labels):
            out = out + h * (labels == c).unsqueeze(-1)
        return self.mix(h, out)


@pytest.mark.parametrize("name", ["fp32", "amp-fp32"])
def test_a_call_past_a_data_dependent_size_is_followed_on_real_values(name: str) -> None:
    """The classes' count is a size only the data decides (``Eq(u0, 0)``): the capture follows it
    on the example's real values, as the real run computes it, so [mix] and every node past the
    loop are predicted and agree (they were "not analysed" before values were followed)."""
    torch.manual_seed(0)
    result = verify(ModelInputs("per-class", PerClass(), (torch.randn(4, 8),)), cpu(name))
    assert result.report is not None
    assert not any(r.not_analysed for r in result.report.nodes)
    assert result.ok, disagreement_lines(result)
    assert result.nodes.not_analysed == 0 and result.nodes.agree == result.nodes.total > 0
    assert (result.modules.agree, result.modules.total, result.modules.not_analysed) == (2, 2, 0)


def test_cli_verify_prints_why_nodes_were_not_compared() -> None:
    result = CliRunner().invoke(
        main, ["verify", "tests.test_verify_paths:keep_all", "--device", "cpu", "-s", "amp-fp32"]
    )
    assert result.exit_code == 0, result.output
    assert "not comparable), " in result.output
    assert "  nodes not comparable: the real run leaves the captured path at " in result.output


class Shifted(nn.Module):
    """A tensor the forward makes from Python data (torchvision's image mean, its anchors)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - torch.as_tensor([0.485, 0.456]))


def test_a_constant_made_in_the_forward_keeps_its_real_value() -> None:
    """The graph lifts it as a constant traced under fake tensors: verify gives it its real
    value, never random ones (a detector's anchors decide how many boxes survive)."""
    from ampgraph.capture.trace import capture
    from ampgraph.verify.tensors import graph_inputs

    torch.manual_seed(0)
    model = ModelInputs("shifted", Shifted(), (torch.randn(3, 2),))
    cap = capture(model, cpu("fp32"))
    gen = torch.Generator().manual_seed(0)
    device = torch.device("cpu")
    values = graph_inputs(cap, model, model.args, {}, device, gen)
    placeholders = [p.name for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    constants = [v for p, v in zip(placeholders, values) if cap.input_kinds[p][0] == "constant"]
    assert len(constants) == 1
    assert torch.equal(constants[0], torch.as_tensor([0.485, 0.456]))
