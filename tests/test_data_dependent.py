"""Forwards that branch on data values (issue 10 class 7, issue 11 item 3).

Fake tensors have no values, so ``torch.export`` cannot decide ``if keep.numel() == 0``. ampgraph
finds the path that seeded random values take (``draft-export``), traces the forward in its setting
along it (``export-data-path``), says so, and is checked against the dispatcher, the eager hooks
given the same sizes, and a real CPU run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines


class KeepPositive(nn.Module):
    """A detector's shape of problem: filter by value, then branch on whether anything is left."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        keep = y[y > 0]
        if keep.numel() == 0:
            return self.head(x)
        return self.head(y) * keep.sum()


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("keep", KeepPositive(), (torch.randn(4, 8),))


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
def test_a_branch_on_data_is_traced_along_one_path_and_checked(name: str) -> None:
    model, setting = _model(), Setting.parse(name)
    report = analyze(model, setting)
    # Traced in its setting along the data path (the half setting's dtype error is the
    # annotator's finding at its node: export's fake linear does not raise it).
    assert report.capture["method"] == "export-data-path"
    assert isinstance(report.capture["data_dependent"], list)
    assert report.check is not None and report.check["disagreements"] == 0
    ours = hook_lines(report)
    eager = eager_hook_lines(model, setting)
    if name == "half":  # fp32 input, bf16 weights: both stop at fc, as a GPU does
        assert ours == eager and "error: mat1 and mat2" in ours[0]
        return
    # The eager oracle on fake tensors stops where the forward branches on data; up to there
    # the two agree, and it says the rest could not be followed, never that the model raised.
    assert eager[-1].startswith("[(top level)] in=None -> not analysed: ")
    assert ours[: len(eager) - 1] == eager[:-1] and len(ours) == len(eager)


def test_the_path_traced_agrees_with_a_real_cpu_run() -> None:
    from ampgraph.verify import verify

    for name in ("fp32", "amp-fp32", "amp-half"):
        result = verify(_model(), Setting.parse(name, device_type="cpu"))
        assert result.ok, result.disagreements


class Anchors(nn.Module):
    """torchvision's AnchorGenerator in small: takes a list, keeps a plain tensor attribute that
    its forward moves to the feature maps' dtype (a dtype read at trace time)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.arange(4.0)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        self.cell = self.cell.to(dtype=features[0].dtype, device=features[0].device)
        return [self.cell]


class Detect(nn.Module):
    """Captured parts before and after a branch on how many rows ``nonzero`` keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.anchors = Anchors()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        keep = (y[:, 0] > 0).nonzero().squeeze(1)
        if keep.numel() == 0:
            return self.head(x)
        return self.head(y[keep]) + self.anchors([y])[0]


def _detect() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("detect", Detect(), (torch.randn(16, 8),))


#: Each setting's hook lines, along the path where rows are kept (bf16 autocast on CUDA).
DETECT_LINES = {
    "fp32": [
        "[stem] in=torch.float32 -> out=torch.float32",
        "[head] in=torch.float32 -> out=torch.float32",
        "[anchors] in=None -> out=torch.float32",
    ],
    "amp-fp32": [
        "[stem] in=torch.float32 -> out=torch.bfloat16",
        "[head] in=torch.bfloat16 -> out=torch.bfloat16",
        # The anchors follow the feature maps' dtype: bf16, as a trace in the setting reads it.
        "[anchors] in=None -> out=torch.bfloat16",
    ],
    "amp-half": [
        "[stem] in=torch.float32 -> out=torch.bfloat16",
        "[head] in=torch.bfloat16 -> out=torch.bfloat16",
        "[anchors] in=None -> out=torch.bfloat16",
    ],
    "half": [
        (
            "[stem] in=torch.float32 -> error: mat1 and mat2 must have the same dtype, but got "
            "Float and BFloat16"
        ),
    ],
}


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
def test_a_branch_on_a_size_is_traced_in_its_setting_along_the_data_path(name: str) -> None:
    model, setting = _detect(), Setting.parse(name)
    cell = model.module.anchors.cell
    report = analyze(model, setting)
    assert report.capture["method"] == "export-data-path"
    values = report.capture["unbacked_values"]
    assert values and all(v > 0 for v in values.values())
    assert any("keep.numel() == 0" in line and "decided False" in line
               for line in report.capture["data_dependent"])  # fmt: skip
    assert report.check is not None and report.check["disagreements"] == 0
    assert report.check["compared"] > 0 and not report.check.get("not_analysed")
    assert hook_lines(report) == DETECT_LINES[name]
    # The eager model, given the sizes the capture found, takes the same path: line for line.
    assert eager_hook_lines(model, setting, values) == DETECT_LINES[name]
    # Without them its fake run cannot decide the branch, and says so.
    if name != "half":
        assert eager_hook_lines(model, setting)[-1].startswith(
            "[(top level)] in=None -> not analysed: Could not guard on data-dependent"
        )
    assert model.module.anchors.cell is cell  # the module's own attribute is left as it was


class TopQueries(nn.Module):
    """Attention that keeps the top-k queries by a score computed from the data, k itself a
    count of the data (issue 33): every size past the choice is the data's."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x), self.k(x)
        score = q.abs().sum(-1)
        n = int((score > score.mean()).sum(-1).max())
        top = score.topk(n, dim=-1).indices
        kept = torch.gather(q, 1, top.unsqueeze(-1).expand(-1, -1, q.shape[-1]))
        return self.out(torch.softmax(kept @ k.transpose(1, 2), -1) @ k)


class AutoCorrelation(nn.Module):
    """Autoformer's auto-correlation in small: how many delays, and which, come from the data;
    a Python loop runs once per delay."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        score = (q * k).sum(-1).mean(0)
        top_k = int((score > score.mean()).sum()) + 1
        weights, delays = torch.topk(score, top_k)
        weights = torch.softmax(weights, -1)
        agg = torch.zeros_like(v)
        for i in range(top_k):
            agg = agg + torch.roll(v, -int(delays[i]), dims=1) * weights[i]
        return self.out(agg)


class DelayWeights(nn.Module):
    """Autoformer's training-time delay aggregation in small: weights read at the delays the
    data picks (a view at a data-dependent offset), then rolled by them."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.v(x)
        mean_value = v.mean(-1)
        index = torch.topk(mean_value.mean(0), 2, dim=-1)[1]
        weights = torch.stack([mean_value[:, index[i]] for i in range(2)], dim=-1)
        agg = sum(torch.roll(v, -int(index[i]), 1) * weights[:, i, None, None] for i in range(2))
        return self.out(agg)


@pytest.mark.parametrize("cls", [TopQueries, AutoCorrelation, DelayWeights])
@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_sizes_computed_from_values_are_followed_as_a_real_cpu_run_follows_them(
    cls: type[nn.Module], name: str
) -> None:
    from ampgraph.verify import verify

    torch.manual_seed(0)
    model = ModelInputs(cls.__name__, cls(), (torch.randn(2, 8, 8),))
    report = analyze(model, name)
    assert report.capture["method"] in ("export-data-path", "draft-export")
    assert report.capture["data_dependent"] and report.capture["unbacked_values"]
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    if name == "half":  # fp32 input, bf16 weights: the first Linear raises, as on a GPU
        assert len(lines) == 1 and "error: mat1 and mat2" in lines[0]
    else:
        assert lines[-1].startswith("[out] ") and "error" not in "".join(lines)
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_a_size_no_run_decides_ends_the_graph_there_not_the_whole_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where even the trace on real values cannot decide a size (draft export's own check of a
    data-dependent offset, without the leniency ampgraph gives it, and with torch's guess that
    the data's index may be negative, which the real index decides where ampgraph follows it:
    capture/guesses.py), the model is analysed up to there and the node says why it is not
    analysed: never a lost model."""
    import contextlib

    from ampgraph.capture import draft_export, guesses

    monkeypatch.setattr(draft_export, "_real_checks_without_guards", contextlib.nullcontext)
    monkeypatch.setattr(guesses, "decided_by_real_values", lambda *args: False)
    torch.manual_seed(0)
    model = ModelInputs("delays", DelayWeights(), (torch.randn(2, 8, 8),))
    report = analyze(model, "amp-fp32")
    assert report.capture["method"] == "draft-export"
    last = report.capture["data_dependent"][-1]
    assert last.endswith("not followed, the forward is analysed up to here")
    # A real run goes on past the cut ([out] runs): the listing says where it stops following,
    # as "not analysed" at the top level (the cut is outside every leaf call), never an error,
    # and never just ends; the eager oracle on fake tensors stops there and says the same.
    ours = hook_lines(report)
    eager = eager_hook_lines(model, Setting.parse("amp-fp32"))
    top = "[(top level)] in=None -> not analysed: "
    assert ours[:-1] == eager[:-1] == ["[v] in=torch.float32 -> out=torch.bfloat16"]
    assert ours[-1].startswith(top) and "data-dependent" in ours[-1]
    assert eager[-1].startswith(top) and "data-dependent" in eager[-1]
    cut = [n for n in report.nodes if n.op == "ampgraph.raises.default"]
    assert len(cut) == 1 and "data-dependent" in (cut[0].not_analysed or "")
    assert report.check is not None and report.check["disagreements"] == 0


class HashGate(nn.Module):
    """blt's entropy patcher in small: a large hash table, then a truth value read from the data
    (as ``Categorical`` checks its logits), which only a run on real values decides."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(4099, 257)
        self.fc = nn.Linear(257, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.table(ids)
        if bool((self.fc(h) > 0).all()):
            return self.fc(h).sum()
        return self.fc(h * 2)


def _real_copies(weight: torch.Tensor, *ours: torch.Tensor) -> set[int]:
    """The storages of real tensors shaped like ``weight`` that hold bytes, other than its own
    and ``ours``: the copies a run on real values made of it and left, alive or in garbage
    cycles."""
    import gc

    own = {t.untyped_storage().data_ptr() for t in (weight, *ours)}
    return {
        t.untyped_storage().data_ptr() for t in gc.get_objects()
        if type(t) in (torch.Tensor, nn.Parameter) and t.shape == weight.shape
        and t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() not in own
    }  # fmt: skip


@pytest.mark.parametrize("name", ["amp-fp32", "half"])
def test_a_capture_on_real_values_frees_them_as_it_returns(name: str) -> None:
    """The draft run's real weights (and torch's copies of them on its fake tensors) are freed
    when the capture returns, as a real run's are, not left to a collection that may never come
    (the zoo's blt held four 384 MB copies per capture and ran out of heap); the caller's own
    weights and inputs are untouched."""
    import gc

    torch.manual_seed(0)
    gate = HashGate().eval()
    ids = torch.randint(0, 4099, (2, 5))
    weight, given = gate.table.weight.detach().clone(), ids.clone()
    model = ModelInputs("gate", gate, (ids,))
    gc.collect()
    gc.disable()  # a copy in a reference cycle counts: only a full collection would free it
    try:
        report = analyze(model, name)
        copies = _real_copies(gate.table.weight, weight)
    finally:
        gc.enable()
    assert report.capture["method"] in ("export-data-path", "draft-export")
    assert report.capture["data_dependent"]
    assert copies == set()
    assert torch.equal(gate.table.weight, weight) and torch.equal(ids, given)
    assert report.check is not None and report.check["disagreements"] == 0


class FailingGate(HashGate):
    """HashGate whose forward fails after it used the table: a draft run that raises."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.table(ids)
        if bool((self.fc(h) > 0).all()):
            return h.sum()
        raise ValueError("no path for these values")


def test_a_failed_capture_on_real_values_frees_them_and_patches_nothing() -> None:
    """A draft run that raises frees its real values too, torch's copies on the fake tensors of
    the mode export made inside included (found from the forward's own inputs); and no torch
    class is patched to find them: ``FakeTensorMode.__init__`` is torch's own throughout, so a
    mode another thread makes meanwhile is neither recorded nor emptied."""
    import gc

    from torch._subclasses.fake_tensor import FakeTensorMode

    from ampgraph.capture.draft_export import _draft_export

    init = FakeTensorMode.__init__
    seen: list[object] = []

    class Watching(FailingGate):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            seen.append(FakeTensorMode.__init__)
            return super().forward(ids)

    torch.manual_seed(0)
    gate = Watching().eval()
    ids = torch.randint(0, 4099, (2, 5))
    weight = gate.table.weight.detach().clone()
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(ValueError, match="no path"):
            _draft_export(ModelInputs("gate", gate, (ids,)))
        copies = _real_copies(gate.table.weight, weight)
    finally:
        gc.enable()
    assert seen and all(f is init for f in seen)
    assert copies == set()
    assert torch.equal(gate.table.weight, weight)
