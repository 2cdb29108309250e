"""torchao's MXFP8 training of dense Linears (MXFP8TrainingOpConfig on nn.Linear: F.linear runs
its mx_mm): the traced forward and backward against a real CPU run of the converted model
(torchao's emulated kernel), the survival of every operand against torchao's to_mx on the same
tensors, and the scale nodes of a Linear's FP8 backward counted by hand."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchao")

from ampgraph.errors import SettingError  # noqa: E402
from ampgraph.fp8.graph import trace_fp8  # noqa: E402
from ampgraph.fp8.proof import prove_gemms, real_gemms  # noqa: E402
from ampgraph.fp8.recipes import convert, parse_fp8_recipe  # noqa: E402
from ampgraph.model.build import ModelInputs  # noqa: E402
from tests.test_fp8_moe import _example, mx_survival_proved  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MX = "torchao:mxfp8_rceil,kernel=emulated"


def _outlier() -> ModelInputs:
    return _example("fp8_outlier")


def test_dense_mx_train_graph_equals_a_real_emulated_cpu_run() -> None:
    model = _outlier()
    graph = trace_fp8(model, parse_fp8_recipe(MX), train=True)
    proof = prove_gemms(graph, model, dict(model.module.state_dict()), train=True)
    assert proof.ok, proof.first_difference()
    # Five Linears: each forward GEMM and the backward's grad_input and grad_weight GEMMs run on
    # operands quantized to e4m3 with one E8M0 scale per 32 values, dequantized to fp32 (the
    # dtype of what came in: mx_mm runs under autocast's dispatch, which never sees its mm).
    forward, backward = graph.gemms("forward"), graph.gemms("backward")
    assert len(forward) == 5 and len(backward) == 10
    assert {g.role for g in forward + backward} == {"gemm-mx-emulated"}
    assert {g.scaling for g in forward + backward} == {("e4m3 mx-1x32", "e4m3 mx-1x32")}
    assert {g.dtype_in for g in forward + backward} == {("fp32", "fp32")}
    # to_mx is in the graph: its block amax, the E8M0 (power-of-two) scale, the e4m3 cast.
    e8m0 = [n for n in graph.nodes if n.dtype_out == "e8m0"]
    assert e8m0 and {n.role for n in e8m0} == {"scale"}
    assert sum(n.role == "cast-fp8" for n in graph.nodes) == 5 * 6  # six to_mx per Linear
    assert {p.converted for p in graph.plans} == {True}
    assert all("drops the bias" in p.reason for p in graph.plans)


def test_torchao_drops_the_bias_as_the_plan_says() -> None:
    """The plan's claim, on torchao's real conversion: its linear override calls mx_mm on the
    input and the weight only, so the output has no bias and the bias gets no gradient."""
    model = _outlier()
    net = convert(model.module, parse_fp8_recipe(MX))
    head = net.head
    x = torch.randn(32, 64)
    out = head(x)
    out.sum().backward()
    assert head.weight.grad is not None and head.bias.grad is None
    nobias = nn.Linear(64, 32, bias=False)
    nobias.weight = nn.Parameter(model.module.head.weight.detach().clone())
    same = convert(nobias, parse_fp8_recipe(MX))(x)
    assert torch.equal(out, same)


def test_dense_mx_wgrad_with_hp_and_failures() -> None:
    model = _outlier()
    hp = parse_fp8_recipe("torchao:mxfp8_rceil_wgrad_with_hp,kernel=emulated")
    graph = trace_fp8(model, hp, train=True)
    proof = prove_gemms(graph, model, dict(model.module.state_dict()), train=True)
    assert proof.ok, proof.first_difference()
    roles = Counter(g.role for g in graph.gemms("backward"))
    assert roles == {"gemm-mx-emulated": 5, "gemm-fp32": 5}  # grad_weight in high precision
    with pytest.raises(SettingError, match="needs triton"):
        trace_fp8(model, parse_fp8_recipe("torchao:mxfp8_rceil"))
    short = ModelInputs("mlp", model.module, (torch.randn(40, 64),))  # 40 tokens
    trace_fp8(short, parse_fp8_recipe(MX))  # the forward blocks run along K
    with pytest.raises(SettingError, match="multiple of 32"):
        trace_fp8(short, parse_fp8_recipe(MX), train=True)  # grad_weight's along the tokens
    plans = trace_fp8(ModelInputs("m", nn.Sequential(nn.Linear(64, 10)), (torch.randn(32, 64),)),
                      parse_fp8_recipe(MX)).plans
    assert [(p.converted, p.reason) for p in plans] == [
        (False, "N=10 is not a multiple of 32 (one MX block along N for grad_input)")]


def test_bf16_input_meets_fp32_weight_as_the_real_kernel_does() -> None:
    """Under bf16 autocast a Linear fed bf16 (here after a bf16 matmul) dequantizes its input
    to bf16 and its fp32 weight to fp32: predicted a mixed GEMM, and the real run raises."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.matmul(x, x.t()) @ x)  # autocast runs matmul in bf16

    torch.manual_seed(0)
    model = ModelInputs("net", Net(), (torch.randn(32, 64),))
    graph = trace_fp8(model, parse_fp8_recipe(MX))
    assert [g.role for g in graph.gemms()][-1] == "gemm-mixed"
    real = real_gemms(model, parse_fp8_recipe(MX), dict(model.module.state_dict()))
    assert real[-1] == ("raised", ("mixed operand dtypes",), "-")
    assert prove_gemms(graph, model, dict(model.module.state_dict())).ok


@pytest.mark.parametrize("name,count", [("mxfp8_rceil", 30), ("mxfp8_rceil_wgrad_with_hp", 20)])
def test_dense_mx_survival_equals_torchaos_real_mx_conversion(name: str, count: int) -> None:
    """Each Linear's operands, forward and backward, in blocks of 32 along each GEMM's
    reduction (K, N, then the tokens): the predicted counts equal torchao's to_mx's."""
    _, pairs = mx_survival_proved(_outlier(), name, count)
    # The outlier channel flushes values to zero even one block at a time, in fc2's input.
    worst = pairs[0][0]
    assert worst.module == "blocks.0.fc2" and worst.survival.zeros > 0


def test_tensorwise_backward_scales_counted_by_hand() -> None:
    """A Linear's backward under torchao's tensorwise recipe: ``matmul_with_hp_or_float8_args
    .backward`` casts four tensors (grad_output twice, the weight, the input), each by
    ``hp_tensor_to_float8_dynamic``: ``max(abs(x))``, to float64, clamp, ``448 / amax``
    (reciprocal, mul), to float32; and ``_scaled_mm`` takes each scale's reciprocal. Eight
    scale nodes a cast, nothing else of the backward."""
    model = ModelInputs("one", nn.Sequential(nn.Linear(64, 64)), (torch.randn(32, 64),))
    graph = trace_fp8(model, parse_fp8_recipe("torchao:tensorwise"), train=True)
    ops = Counter(n.op for n in graph.nodes if n.role == "scale" and n.phase == "backward")
    assert ops == {"abs": 4, "max": 4, "_to_copy": 8, "clamp": 4, "reciprocal": 8, "mul": 4}
    forward = Counter(n.op for n in graph.nodes if n.role == "scale" and n.phase == "forward")
    assert forward == {k: v // 2 for k, v in ops.items()}
    # Each cast is scaled (mul) and clamped before it: two scaling nodes for each.
    scaling = Counter(n.op for n in graph.nodes if n.role == "scaling")
    assert scaling["mul"] == scaling["clamp"] == 6


def test_cli_dense_mx_train_check() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ampgraph", "fp8", "--module",
         str(ROOT / "examples/fp8_outlier.py") + ":build", "--recipe", MX, "--pass", "train",
         "--check"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "on MXFP8 dequantized to fp32 (e4m3 mx-1x32/e4m3 mx-1x32, emulated)" in run.stdout
    assert "check: all 15 GEMMs agree with a real CPU run" in run.stdout


def test_rowwise_backward_gemms_are_scaled_per_row() -> None:
    """torchao's rowwise backward GEMMs (no fast accumulation) pass ``_scaled_mm`` ones and
    multiply the output by the row and column scales after: their scaling is per row, as the
    recipe's config says, and the four casts' scales are each computed from their own amax."""
    model = ModelInputs("one", nn.Sequential(nn.Linear(64, 64)), (torch.randn(32, 64),))
    graph = trace_fp8(model, parse_fp8_recipe("torchao:rowwise"), train=True)
    assert {g.scaling for g in graph.gemms()} == {("rowwise", "rowwise")}
    amax = Counter(n.phase for n in graph.nodes if n.role == "scale" and n.op == "amax")
    assert amax == {"forward": 2, "backward": 4}
