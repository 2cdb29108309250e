"""The forward analysed as users run it for inference, ``--pass train`` as they train (issues 33
and 42).

A forward that writes with ``out=`` into a tensor runs under ``torch.no_grad()`` (as the seed
notebook runs models) and raises with gradients on, where the parameters require grad
(``functions with out=... arguments don't support automatic differentiation``). The forward pass
is analysed as inference runs it; a training step, which raises there too, says so in one line.
Both are compared with the real CPU model.

Model code reads the grad mode (issue 42): an MoE router's inference fast path (transformers'
Kolibri1: ``torch.mm(h, w.t(), out_dtype=torch.float32)`` without gradients, ``F.linear`` on fp32
copies with them) and a module that returns ``y.double()`` only without gradients. The forward is
traced under ``torch.inference_mode()``, as the seed notebook, users and ``verify``'s real run run
it; ``--pass train`` with grad on; the report says which.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph import analyze
from ampgraph.errors import CaptureError
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.torchutil import autocast_state
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines


class OutInto(nn.Module):
    """A Linear's output scaled into a buffer of its own with ``out=``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        buf = torch.empty_like(h)
        torch.mul(h, 2.0, out=buf)
        return self.head(buf)


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("out-into", OutInto(), (torch.randn(2, 5, 8),))


def test_the_real_model_runs_only_without_gradients() -> None:
    """What the analysis must follow: the real CPU model, with and without gradients."""
    model = _model()
    with torch.no_grad():
        model.module(*model.args)
    with pytest.raises(RuntimeError, match=r"mul\(\): functions with out=\.\.\. arguments"):
        model.module(*model.args)


@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_the_forward_is_analysed_as_inference_runs_it(name: str) -> None:
    report = analyze(_model(), name)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    if name == "half":  # fp32 input, bf16 weights: the first Linear raises, as on a GPU
        assert len(lines) == 1 and "error: mat1 and mat2" in lines[0]
    else:
        out = "bfloat16" if name == "amp-fp32" else "float32"
        assert lines[-1] == f"[head] in=torch.{out} -> out=torch.{out}"
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_a_training_step_reports_the_real_error_in_one_line() -> None:
    with pytest.raises(CaptureError) as raised:
        analyze(_model(), "amp-fp32", pass_="train")
    message = str(raised.value)
    assert "\n" not in message
    assert "mul(): functions with out=... arguments don't support automatic" in message


class Router(nn.Module):
    """An MoE router with an inference fast path, as transformers' Kolibri1 has it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return torch.mm(h, self.weight.t(), out_dtype=torch.float32)
        return F.linear(h.float(), self.weight.float())


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.router = Router()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.router(self.proj(x))


class DoubleWithoutGrad(nn.Module):
    """Two lines: the output is fp64 only where grad is off."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y if torch.is_grad_enabled() else y.double()


def _routed() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("routed", Routed().eval(), (torch.randn(6, 8),))


def _double() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("double", DoubleWithoutGrad().eval(), (torch.randn(2, 8),))


def _real_router_dtype(grad: bool, amp_dtype: torch.dtype) -> torch.dtype:
    """The router's output dtype in a run of the model itself: fake CUDA tensors, the real CUDA
    autocast kernels (no GPU needed), in the grad mode asked for."""
    out: list[torch.dtype] = []
    model = Routed().eval()
    model.router.register_forward_hook(lambda _m, _i, o: out.append(o.dtype))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {n: mode.from_tensor(t).to("cuda") for n, t in model.named_parameters()}
        x = torch.empty(6, 8, device="cuda")
        grad_mode = torch.enable_grad() if grad else torch.inference_mode()
        with grad_mode, autocast_state("cuda", True, amp_dtype):
            torch.func.functional_call(model, fake, (x,))
    return out[0]


@pytest.mark.parametrize("amp_dtype", ["bfloat16", "float16"])
def test_a_router_fast_path_is_analysed_as_inference_takes_it(amp_dtype: str) -> None:
    dtype = getattr(torch, amp_dtype)
    # The mode decides the dtype in a real run: the test could fail either way.
    assert _real_router_dtype(grad=True, amp_dtype=dtype) == dtype
    assert _real_router_dtype(grad=False, amp_dtype=dtype) == torch.float32
    report = analyze(_routed(), Setting.parse("amp-fp32", amp_dtype=amp_dtype))
    assert report.capture["grad_mode"] == "inference"
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report)[-1] == f"[router] in=torch.{amp_dtype} -> out=torch.float32"


@pytest.mark.parametrize("name", ["fp32", "amp-fp32"])
def test_the_fast_path_raises_on_the_cpu_as_the_real_run_does(name: str) -> None:
    """``mm(..., out_dtype=)`` has no CPU kernel: the real CPU run raises, and so does the
    prediction (a fake tensor's meta kernel would have typed it fp32)."""
    with torch.inference_mode(), pytest.raises(NotImplementedError, match="'CPU' backend"):
        _routed().module(*_routed().args)
    result = verify(_routed(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements
    report = analyze(_routed(), Setting.parse(name, device_type="cpu"))
    assert "Could not run 'aten::mm.dtype'" in hook_lines(report)[-1]


@pytest.mark.parametrize("name", ["fp32", "amp-half", "amp-fp32"])
def test_a_cast_made_only_without_grad_is_in_the_graph(name: str) -> None:
    report = analyze(_double(), name)
    assert report.check is not None and report.check["disagreements"] == 0
    assert report.node("output").outputs == ["float64"]
    assert hook_lines(report) == eager_hook_lines(_double(), Setting.parse(name))
    result = verify(_double(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements
    with torch.inference_mode():  # the real model, as the seed notebook runs it
        assert _double().module(*_double().args).dtype == torch.float64


@pytest.mark.parametrize("caller", [torch.enable_grad, torch.no_grad, torch.inference_mode])
def test_the_callers_grad_mode_does_not_change_the_graph(caller: type) -> None:
    with caller():
        report = analyze(_double(), "amp-fp32")
    assert report.node("output").outputs == ["float64"]


def test_a_training_step_traces_the_forward_with_grad_on() -> None:
    report = analyze(_double(), "amp-fp32", pass_="train")
    assert report.capture["grad_mode"] == "grad"
    assert report.node("output").outputs == ["bfloat16"]  # no .double() with grad on


def test_kolibri1s_router_takes_its_inference_fast_path() -> None:
    """The transformers model type that has it, from a tiny config (its tests' sizes)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Kolibri1Config"):
        pytest.skip("this transformers has no Kolibri1")
    config = transformers.Kolibri1Config(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, moe_intermediate_size=16,
        num_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=32,
        sliding_window=8,
    )  # fmt: skip
    torch.manual_seed(0)
    ids = torch.ones(1, 5, dtype=torch.long)
    model = ModelInputs(
        "kolibri1", transformers.Kolibri1ForCausalLM(config).eval(), (),
        {"input_ids": ids, "use_cache": False},
    )  # fmt: skip
    setting = Setting.parse("amp-half")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    gates = [line for line in lines if ".mlp.gate]" in line]
    assert gates == [f"[model.layers.{i}.mlp.gate] in=torch.bfloat16 -> out=torch.float32"
                     for i in range(2)]  # fmt: skip
