"""Autocast kernels registered outside ATen's lists, and what the check does with what the
annotator cannot know (issue 10, items 2 and 6, and the rule against silent ``None`` dtypes).

Expectations come from the dispatcher check and the eager model's forward hooks on fake tensors
(:func:`ampgraph.verify.hooks.eager_hook_lines`), never from ampgraph's own output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph import analyze, policy
from ampgraph.docs import reference
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines


@torch.library.custom_op("ampgraph_kernels::scale", mutates_args=())
def _scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@_scale.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# A CUDA rule on the custom_op itself, a CPU one through torch.library on an op defined by hand.
torch.library.register_autocast("ampgraph_kernels::scale", "cuda", torch.float16)
_LIB = torch.library.Library("ampgraph_kernels2", "DEF")  # noqa: TOR901
_LIB.define("shift(Tensor x) -> Tensor")
_LIB.impl("shift", lambda x: x + 1, "CompositeExplicitAutograd")
torch.library.register_autocast("ampgraph_kernels2::shift", "cpu", torch.float16, lib=_LIB)


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ampgraph_kernels.scale(torch.ops.ampgraph_kernels2.shift(x), x)


class CustomKernels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = Scale()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale(self.fc(x)))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("name", ["fp32", "amp-half", "amp-fp32"])
def test_register_autocast_rules_are_applied(device: str, name: str) -> None:
    model = ModelInputs("custom", CustomKernels(), (torch.randn(2, 8),))
    setting = Setting.parse(name, device_type=device)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    scale = next(r for r in report.nodes if r.op == "ampgraph_kernels.scale.default")
    shift = next(r for r in report.nodes if r.op == "ampgraph_kernels2.shift.default")
    ruled = scale if device == "cuda" else shift
    if name == "fp32":
        assert ruled.policy is None
    else:
        assert ruled.policy == policy.CAST_INPUTS and ruled.outputs == ["float16"]
        assert {c.to_dtype for c in ruled.casts} == {"float16"} and ruled.casts
        assert "register_autocast" in ruled.reason


def test_a_raw_kernel_is_opaque_at_its_node_and_in_the_reference() -> None:
    lib = torch.library.Library("ampgraph_kernels3", "DEF")  # noqa: TOR901
    lib.define("halve(Tensor x) -> Tensor")
    lib.impl("halve", lambda x: x / 2, "CompositeExplicitAutograd")

    def autocast_halve(x: torch.Tensor) -> torch.Tensor:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet("AutocastCUDA")):
            return torch.ops.ampgraph_kernels3.halve(x.half())

    lib.impl("halve", autocast_halve, "AutocastCUDA")

    class Halve(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.head = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.ops.ampgraph_kernels3.halve(self.fc(x)) + x)

    model = ModelInputs("halve", Halve(), (torch.randn(2, 2),))
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    node = next(r for r in report.nodes if "halve" in r.op)
    # Said at the node, never predicted as if no kernel existed ("runs as called": bf16).
    assert node.policy == policy.OPAQUE and node.not_analysed is not None
    assert node.reason.startswith("not analysed: opaque autocast kernel")
    assert "registered at" in node.reason and __file__.rsplit("/", 1)[-1] in node.reason
    assert node.outputs == ["float16"] and node.check == {"not_analysed": node.not_analysed,
                                                           "agree": None}  # fmt: skip
    # Counted, never a silent agreement; what follows is predicted from it and checked.
    assert report.check["not_analysed"] == 1 and report.check["disagreements"] == 0
    assert report.node("add").outputs == ["float32"] and report.node("add").check["agree"]
    assert hook_lines(report) == eager_hook_lines(model, setting)
    opaque = reference.op_reference(["cuda"]).device("cuda").opaque
    assert "ampgraph_kernels3::halve" in [e.op for e in opaque]


class Resize(nn.Module):
    """Misc ops whose ``.vec`` overloads export traces through a Python decomposition."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        up = F.interpolate(y, scale_factor=2.0, mode="bilinear")
        near = F.interpolate(y, scale_factor=2.0, mode="nearest")
        cubic = F.interpolate(y, size=(8, 8), mode="bicubic", align_corners=False)
        return torch.cat([up + near, cubic], 1).sum(1)


@pytest.mark.parametrize("name", ["amp-fp32", "amp-half"])
def test_export_traced_dtypes_of_python_decompositions_are_explained(name: str) -> None:
    model = ModelInputs("resize", Resize(), (torch.randn(1, 3, 4, 4),))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    notes = {r.name: r.check["note"] for r in report.nodes if r.check and "note" in r.check}
    vec = [r for r in report.nodes if r.op.endswith(".vec")]
    assert len(vec) == 3
    for rec in vec:  # every .vec: traced in 16 bits by export, fp32 for real
        assert rec.outputs == ["float32"] and rec.check["export"] == ["bfloat16"]
        assert "Python decomposition" in notes[rec.name]
    assert notes["add"].endswith("inherited from upsample_bilinear2d, upsample_nearest2d, "
                                 "whose traced dtype differs")  # fmt: skip
    assert "inherited from add" in notes["cat"]


def test_an_unexplained_export_difference_is_a_disagreement() -> None:
    """The export-traced dtype is a second oracle: where it differs from the kernels with no
    reason ampgraph can name, the check fails rather than note it."""
    from ampgraph.annotate.check import check
    from ampgraph.capture.trace import capture

    model = ModelInputs("linear", nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    cap = capture(model, Setting.parse("amp-fp32"))
    node = next(n for n in cap.graph_module.graph.nodes if n.name == "relu")
    node.meta["val"] = node.meta["val"].to(torch.float16)  # what a drifted trace would record
    from ampgraph.annotate.annotator import annotate

    records = annotate(cap)
    summary = check(cap, records)
    relu = next(r for r in records if r.name == "relu")
    assert summary["disagreements"] == 1 and relu.check["agree"] is False
    assert "unexplained" in relu.check["note"]


@pytest.mark.parametrize(
    ("message", "counted"),
    [
        ("Could not extract specialized integer from data-dependent expression u0", "not_analysed"),
        ("mat1 and mat2 must have the same dtype", "disagreements"),
    ],
)
def test_a_replay_that_cannot_run_a_node_leaves_it_unchecked_not_disagreeing(
    message: str, counted: str
) -> None:
    """Where the dispatcher replay fails for a reason that is not the model's (a size only data
    decides), the node is counted as not analysed, with why; a failure that is a finding about
    the model still disagrees with an annotation that ran."""
    from ampgraph.annotate.annotator import annotate
    from ampgraph.annotate.check import DispatcherOracle, check, dispatcher_results
    from ampgraph.annotate.replay import Failed, not_analysable
    from ampgraph.capture.trace import capture

    model = ModelInputs("linear", nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    cap = capture(model, Setting.parse("amp-fp32"))
    records = annotate(cap)
    oracle = dispatcher_results(cap)
    relu = next(n for n in cap.graph_module.graph.nodes if n.name == "relu")
    failure = Failed("relu", message, analysed=not_analysable(message) is None)
    DispatcherOracle(cap, results=oracle).on_error(relu, failure)  # as the replay records it
    summary = check(cap, records, oracle)
    rec = next(r for r in records if r.name == "relu")
    other = {"not_analysed": "disagreements", "disagreements": "not_analysed"}[counted]
    assert summary[counted] == 1 and summary.get(other, 0) == 0
    if counted == "not_analysed":
        assert rec.check["agree"] is None and "depends on data values" in rec.check["not_analysed"]
    else:
        assert rec.check["agree"] is False and rec.check["dispatcher"] == {"error": message}


_DEEP = torch.library.Library("ampgraph_deep", "DEF")  # noqa: TOR901
for _name in ("level1", "level2", "level3"):
    _DEEP.define(f"{_name}(Tensor x) -> Tensor")
_DEEP.impl(
    "level3",
    lambda x: torch.log_softmax(x, -1) + torch.mm(x, x.t()).sum(-1, keepdim=True),
    "CompositeImplicitAutograd",
)
_DEEP.impl("level2", lambda x: torch.ops.ampgraph_deep.level3(x) * 2, "CompositeImplicitAutograd")
_DEEP.impl("level1", lambda x: torch.ops.ampgraph_deep.level2(x) - 1, "CompositeImplicitAutograd")


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.ops.ampgraph_deep.level1(self.fc(x)))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_policies_three_composites_down_are_applied(device: str) -> None:
    """level1 -> level2 -> level3 -> log_softmax, mm, sum: autocast reaches them all (CUDA:
    log_softmax and sum in fp32, mm in bf16; CPU: only mm has a policy)."""
    model = ModelInputs("deep", Deep(), (torch.randn(2, 8),))
    setting = Setting.parse("amp-fp32", device_type=device)
    report = analyze(model, setting)
    assert report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    level1 = next(r for r in report.nodes if r.op == "ampgraph_deep.level1.default")
    path = "level2 → level3 → "
    if device == "cuda":
        assert level1.outputs == ["float32"]
        for op in ("log_softmax (fp32 (output dtype))", "mm (lower precision)", "sum (fp32"):
            assert path + op in level1.reason
    else:
        assert level1.outputs == ["bfloat16"] and level1.reason.endswith(
            path + "mm (lower precision)"
        )


def test_verify_never_passes_a_node_it_could_not_analyse() -> None:
    """An opaque CPU kernel really runs in verify: the node, which ampgraph did not analyse, and
    the casts it makes, which no rule predicted, are disagreements, never a silent agreement."""
    from ampgraph.verify import verify

    lib = torch.library.Library("ampgraph_kernels4", "DEF")  # noqa: TOR901
    lib.define("halve(Tensor x) -> Tensor")
    lib.impl("halve", lambda x: x / 2, "CompositeExplicitAutograd")

    def autocast_halve(x: torch.Tensor) -> torch.Tensor:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet("AutocastCPU")):
            return torch.ops.ampgraph_kernels4.halve(x.half())

    lib.impl("halve", autocast_halve, "AutocastCPU")

    class Halve(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.ampgraph_kernels4.halve(self.fc(x)) + x

    model = ModelInputs("halve", Halve(), (torch.randn(2, 2),))
    setting = Setting.parse("amp-fp32", device_type="cpu")
    report = analyze(model, setting)
    assert report.check["not_analysed"] == 1
    result = verify(model, setting)
    assert not result.ok
    found = {(d.kind, d.node, d.predicted) for d in result.disagreements}
    assert found == {
        ("node", "halve", "not analysed (opaque autocast kernel)"),
        ("cast", "halve", "no casts"),
    }
