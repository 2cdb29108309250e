"""verify never reports a disagreement where the prediction and the real run agree (issue 33).

Two false alarms seen on the first real GPU (docs/verification/gpu-2026-11-26.md): a cast made
inside a composite op (CUDA ``cross_entropy_loss``'s ``log_softmax`` result handed to ``nll_loss``)
and modules listed after a real raise. Each is proved on the real CPU kernels where the CPU does
the same, and on the matching logic with the GPU's own strings where only CUDA does.

And one the transformers zoo showed (issue 42): a forward that registers hooks on its first call
and sets a field saying so (transformers' output capturing) called "not deterministic", because
the capture put the field back and left the hooks, and verify's real call registered them twice.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampgraph.formats.verify import counts, disagreement_lines, summary_line
from ampgraph.capture.trace import capture
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_capture
from ampgraph.report.records import Cast, NodeRecord, Report
from ampgraph.settings import Setting
from ampgraph.verify import VerifyResult, verify
from ampgraph.verify.cast_log import INTERNAL
from ampgraph.verify.compare import compare_modules, compare_nodes
from ampgraph.verify.execution import Observed, run_graph
from ampgraph.verify.hooks import HookCall
from ampgraph.verify.tensors import graph_inputs, real_inputs


class Einsum(nn.Module):
    """CPU autocast has no policy for einsum: its decomposition's bmm runs in 16 bits, and the
    cast of the transposed fp32 operand happens inside einsum, on a tensor einsum made."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bij,bjk->bik", self.lin(x), x.transpose(1, 2))


class RaiseThenRelu(nn.Module):
    """Seed 000's 16-bit Linear fed fp32 (raises in ``half``), then a ReLU on the fp32 input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8).to(torch.bfloat16)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).float() + self.relu(x)


class CrossEntropy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.lin(x), y)


def cpu(name: str) -> Setting:
    return Setting.parse(name, device_type="cpu")


def summary(result: VerifyResult) -> str:
    return "\n".join([summary_line(result), *disagreement_lines(result)])


# -- casts inside a composite op -----------------------------------------------------------------
def test_a_cast_inside_a_composite_op_matches_the_real_internal_cast_on_cpu() -> None:
    torch.manual_seed(0)
    model = ModelInputs("einsum", Einsum(), (torch.randn(2, 3, 8),))
    setting = cpu("amp-fp32")
    # What the real CPU run logs at the einsum node: the cast of a tensor einsum made itself.
    cap = capture(model, setting)
    report = analyze_capture(cap, check=False)
    gen = torch.Generator().manual_seed(0)
    args, kwargs = real_inputs(model, torch.device("cpu"), gen)
    values = graph_inputs(cap, model, args, kwargs, torch.device("cpu"), gen)
    observed = run_graph(cap, report.nodes, values, torch.device("cpu"))
    einsum = next(r for r in report.nodes if r.op == "aten.einsum.default")
    assert observed[einsum.name].casts == [(INTERNAL, "float32", "bfloat16")]
    inputs = {i["node"] for i in einsum.inputs}
    assert [c.node for c in einsum.casts] and all(c.node not in inputs for c in einsum.casts)
    # ... and verify counts it as the predicted cast.
    result = verify(model, setting)
    assert result.ok, summary(result)
    assert result.casts.agree == result.casts.total == 4  # linear's 3, einsum's inner one


def _node(casts: list[Cast]) -> NodeRecord:
    return NodeRecord(
        "cross_entropy_loss", "aten.cross_entropy_loss.default", "op",
        inputs=[{"node": "linear", "dtype": "bfloat16"}, {"node": "y", "dtype": "int64"}],
        casts=casts, outputs=["float32"],
    )  # fmt: skip


def test_the_gpus_cross_entropy_cast_is_one_cast_inside_the_loss() -> None:
    """The strings of the GPU record: predicted ``cross_entropy_loss.log_softmax bf16->fp32``,
    observed ``(internal) bf16->fp32`` -- the same cast, inside the same op."""
    inner = [Cast("cross_entropy_loss.log_softmax", "bfloat16", "float32")]
    seen = Observed(["float32"], casts=[(INTERNAL, "bfloat16", "float32")], checked_casts=True)
    nodes, casts, found = compare_nodes([_node(inner)], {"cross_entropy_loss": seen})
    assert (counts(nodes), counts(casts), found) == ("1/1", "1/1", [])


def test_casts_inside_a_composite_still_catch_a_wrong_prediction() -> None:
    inner = [Cast("cross_entropy_loss.log_softmax", "bfloat16", "float32")]
    for wrong in (
        [(INTERNAL, "float16", "float32")],  # another cast inside
        [("linear", "bfloat16", "float32")],  # the loss's input cast, not an inner one
        [],  # no cast at all
        [(INTERNAL, "bfloat16", "float32")] * 2,  # one too many
    ):
        seen = Observed(["float32"], casts=wrong, checked_casts=True)
        _nodes, _casts, found = compare_nodes([_node(inner)], {"cross_entropy_loss": seen})
        assert [d.kind for d in found] == ["cast"], wrong
    # An input's cast predicted as one inside is wrong too.
    seen = Observed(["float32"], casts=[(INTERNAL, "bfloat16", "float32")], checked_casts=True)
    outer = [Cast("linear", "bfloat16", "float32")]
    assert compare_nodes([_node(outer)], {"cross_entropy_loss": seen})[2]


def test_cuda_cross_entropy_is_predicted_as_a_cast_inside_the_loss() -> None:
    """ampgraph's CUDA prediction (fake tensors) names the cast as the GPU test above has it."""
    torch.manual_seed(0)
    model = ModelInputs("ce", CrossEntropy(), (torch.randn(4, 8), torch.tensor([0, 1, 2, 3])))
    report = analyze_capture(capture(model, Setting.parse("amp-fp32")), check=False)
    loss = next(r for r in report.nodes if r.op == "aten.cross_entropy_loss.default")
    assert [(c.node, c.from_dtype, c.to_dtype) for c in loss.casts] == [
        (f"{loss.name}.log_softmax", "bfloat16", "float32")
    ]


# -- modules after a real raise ------------------------------------------------------------------
def test_modules_after_a_real_raise_are_not_run_on_both_sides() -> None:
    torch.manual_seed(0)
    model = ModelInputs("raise-relu", RaiseThenRelu(), (torch.randn(2, 8),))
    result = verify(model, cpu("half"))
    assert result.ok, summary(result)
    assert len(result.eager_hooks) == 1 and result.eager_hooks[0].startswith(
        "[lin] in=torch.float32 -> error: mat1 and mat2 must have the same dtype"
    )
    assert counts(result.modules) == "2/2"  # lin's error, and relu not run on both sides
    # The ReLU does run in the graph (it does not depend on the Linear): the node check sees it.
    assert result.nodes.agree == result.nodes.total


def _report(calls: list[tuple[str, str | None]]) -> Report:
    """A report whose leaf calls are ``(path, error)``: each call one node."""
    from ampgraph.report.records import ModuleCall

    setting = {"name": "half", "device_type": "cpu", "autocast": False,
               "amp_dtype": "bfloat16", "param_dtype": "bfloat16"}  # fmt: skip
    nodes = [NodeRecord(p, "aten.relu.default", "op", module=p, error=e,
                        outputs=[] if e else ["float32"]) for p, e in calls]  # fmt: skip
    modules = [ModuleCall(p, "torch.nn.ReLU", ["ReLU"], p, "float32", None if e else "float32",
                          [p]) for p, e in calls]  # fmt: skip
    return Report("m", setting, {}, {}, nodes, modules)


def test_a_call_predicted_not_run_that_really_ran_is_a_disagreement() -> None:
    report = _report([("a", "boom"), ("b", None)])
    raised = HookCall("a", "ReLU", "float32", error="boom")
    agreement, found = compare_modules(report, [raised])
    assert (counts(agreement), found) == ("2/2", [])
    ran_on = [HookCall(p, "ReLU", "float32", "float32") for p in ("a", "b")]
    agreement, found = compare_modules(report, ran_on)
    assert [(d.node, d.predicted) for d in found] == [
        ("a", "[a] in=torch.float32 -> error: boom"),
        ("b", "not run (the forward raised before it)"),
    ]
    assert counts(agreement) == "0/2"


# -- a library autocast kernel's cast back -------------------------------------------------------
def test_a_library_wrappers_cast_back_is_the_ops_own_on_cpu() -> None:
    """torchvision's roi_align wrapper runs in fp32 and casts its output back to the input's
    dtype, inside the call: part of the op, not a cast autocast made of its inputs."""
    ops = pytest.importorskip("torchvision.ops")

    class Roi(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
            return ops.roi_align(self.conv(x), boxes, output_size=2)

    torch.manual_seed(0)
    boxes = torch.tensor([[0, 0.0, 0.0, 4.0, 4.0], [0, 1.0, 1.0, 6.0, 6.0]])
    model = ModelInputs("roi", Roi(), (torch.randn(1, 3, 8, 8), boxes))
    result = verify(model, cpu("amp-fp32"))
    assert result.ok, summary(result)
    assert result.report is not None
    roi = next(r for r in result.report.nodes if r.op == "torchvision.roi_align.default")
    assert roi.outputs == ["bfloat16"] and [c.to_dtype for c in roi.casts] == ["float32"]


# -- hooks a forward registers on its first call -------------------------------------------------
class LazyHooks(nn.Module):
    """transformers' output capturing, in small: the first forward that asks for hidden states
    registers a forward hook on each layer and sets a field saying so; the hooks collect every
    layer's output, keeping only the selected one (``output_hidden_states=-1``) and None for the
    others, as ``install_output_capuring_hook`` does, and the forward reads the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 4)
        self.states: list[torch.Tensor | None] = []

    def _collect(self, mod: nn.Module, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        self.states.append(out if len(self.states) == len(self.layers) - 1 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "_hooks_installed", False):
            for layer in self.layers:
                layer.register_forward_hook(self._collect)
            self._hooks_installed = True
        self.states.clear()
        for layer in self.layers:
            x = layer(x)
        return self.head(self.states[-1][:, 0:4].repeat(1, 2))  # a hook twice: states[-1] None


def test_hooks_a_forward_registers_on_its_first_call_are_registered_once() -> None:
    """The capture put the module's fields back as they were (BigBird's switched attention), the
    field saying the hooks were registered among them, but left the hooks: the real call
    registered them again, each layer's output was collected twice, and the forward read None
    (pe_audio, pe_video, aria: "not deterministic ... 'NoneType' object is not subscriptable")."""
    torch.manual_seed(0)
    module = LazyHooks().eval()
    model = ModelInputs("lazy-hooks", module, (torch.randn(2, 8),))
    result = verify(model, cpu("amp-fp32"))
    assert result.ok, summary(result)
    assert counts(result.modules) == "3/3" and result.nodes.agree == result.nodes.total
    # verify's real call registered them, as a user's first call does: once on each layer.
    assert [len(layer._forward_hooks) for layer in module.layers] == [1, 1]
    # Each capture leaves the module as it was, no hook, no field, so the next setting's capture
    # of the same module traces a first call too (it failed whole on the doubled hooks).
    fresh = ModelInputs("lazy-hooks", LazyHooks().eval(), (torch.randn(2, 8),))
    for name in ("fp32", "amp-fp32"):
        report = analyze_capture(capture(fresh, cpu(name)), check=False)
        assert report.nodes[-1].outputs == ["float32" if name == "fp32" else "bfloat16"]
        assert not hasattr(fresh.module, "_hooks_installed")
        assert [len(layer._forward_hooks) for layer in fresh.module.layers] == [0, 0]


class _Memo(nn.Module):
    """Embeds each distinct ids once and keeps the embedding (OmDet-Turbo's cache of class
    embeddings, keyed by the ids' values): a second call skips the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.proj = nn.Linear(8, 8)
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        key = tuple(ids.flatten().tolist())
        if key not in self.cache:
            self.cache[key] = self.emb(ids)
        return self.proj(self.cache[key])


def test_a_module_that_keeps_state_across_calls_is_run_as_on_its_first_call() -> None:
    """The eager run sees the module as no call has left it: the capture traced a first call
    (the embedding runs), and so does the real run, whose hooks then list the embedding too,
    where a run after the capture's call took the cached branch and missed it."""
    model = ModelInputs("memo", _Memo(), (torch.tensor([[1, 2, 3]]),))
    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bf16")
    result = verify(model, setting, device="cpu")
    assert disagreement_lines(result) == []
    assert any(line.startswith("[emb]") for line in result.eager_hooks)


class _FrozenConfig(dict):
    """A config that refuses writes once built, as diffusers' ``FrozenDict`` (every diffusers
    model keeps its config in one): ``update``, ``pop``, ``setdefault`` and item writes raise."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise Exception(f"You cannot use ``update`` on a {type(self).__name__} instance.")

    update = pop = setdefault = __setitem__ = __delitem__ = _refuse  # type: ignore[assignment]


class _Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._internal_dict = _FrozenConfig(width=8, scale=2.0)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self._internal_dict["scale"]


def test_a_module_whose_config_refuses_writes_is_analysed() -> None:
    """The capture puts back what a forward changed in a module's containers, and no forward
    changed a frozen config: it is left alone, where writing it back raised and made every
    diffusers model not analysable."""
    model = ModelInputs("frozen", _Configured(), (torch.randn(2, 8),))
    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bf16")
    result = verify(model, setting, device="cpu")
    assert result.ok and disagreement_lines(result) == []
    assert any(line.startswith("[proj]") for line in result.eager_hooks)
