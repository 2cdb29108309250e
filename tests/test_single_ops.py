"""The seed notebook's single-op experiments (000) and seed 001's cast counts, as tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import Setting, analyze

DEVICES = ["cuda", "cpu"]


def _setting(name: str, device: str, amp: str = "bf16") -> Setting:
    return Setting.parse(name, device_type=device, amp_dtype=amp)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_linear_fed_fp32_without_autocast_is_an_error_at_that_node(device: str) -> None:
    """Seed In [9]: 'mat1 and mat2 must have the same dtype, but got Float and BFloat16'."""
    rep = analyze(nn.Linear(2, 2), _setting("half", device), args=(torch.randn(2, 2),))
    node = rep.node("linear")
    assert node.error == "mat1 and mat2 must have the same dtype, but got Float and BFloat16"
    assert node.outputs == []
    assert rep.node("output").skipped == "linear"
    assert rep.check["disagreements"] == 0  # the dispatcher raises the same error


def test_cpu_error_message_is_the_real_kernels() -> None:
    """The strict-dtype messages are read off real kernels: compare with a real CPU run."""
    with pytest.raises(RuntimeError) as real:
        nn.functional.linear(torch.randn(2, 2), torch.randn(2, 2, dtype=torch.bfloat16),
                             torch.randn(2, dtype=torch.bfloat16))  # fmt: skip
    rep = analyze(nn.Linear(2, 2), _setting("half", "cpu"), args=(torch.randn(2, 2),))
    assert rep.node("linear").error == str(real.value)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_linear_fed_fp32_works_under_autocast(device: str) -> None:
    """Seed In [10]: SUCCESS under autocast."""
    rep = analyze(nn.Linear(2, 2), _setting("amp-half", device), args=(torch.randn(2, 2),))
    node = rep.node("linear")
    assert node.error is None and node.outputs == ["bfloat16"]
    assert [c.node for c in node.casts] == ["input"]  # only the fp32 input needs a cast


class Loss(nn.Module):
    def forward(self, pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        return nn.MSELoss()(pred, gt)


@pytest.mark.parametrize("device", DEVICES)
def test_mse_loss(device: str) -> None:
    """Seed In [12]: bf16 without autocast, fp32 with it."""
    args = (torch.randn(2, 2, dtype=torch.bfloat16), torch.randn(2, 2, dtype=torch.bfloat16))
    off = analyze(Loss(), _setting("half", device), args=args)
    on = analyze(Loss(), _setting("amp-half", device), args=args)
    assert off.node("mse_loss").outputs == ["bfloat16"]
    assert on.node("mse_loss").outputs == ["float32"] and on.node("mse_loss").policy == "fp32"


class Unary(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("autocast", ["half", "amp-half"])
def test_relu_passes_its_dtype_through(dtype: torch.dtype, autocast: str) -> None:
    """Seed In [13]: no policy for ReLU: whatever goes in comes out."""
    rep = analyze(Unary(nn.ReLU()), autocast, args=(torch.randn(2, 2, dtype=dtype),))
    assert rep.node("relu").policy is None
    assert rep.node("relu").outputs == [str(dtype).removeprefix("torch.")]


@pytest.mark.parametrize(
    ("dtype", "autocast", "expected"),
    [
        (torch.bfloat16, "half", "bfloat16"),
        (torch.float32, "half", "float32"),
        (torch.bfloat16, "amp-half", "float32"),
        (torch.float32, "amp-half", "float32"),
    ],
)
def test_softmax(dtype: torch.dtype, autocast: str, expected: str) -> None:
    """Seed In [14]: FP32 policy for Softmax under autocast."""
    rep = analyze(Unary(nn.Softmax(dim=-1)), autocast, args=(torch.randn(2, 2, dtype=dtype),))
    assert rep.node("softmax").outputs == [expected]


class Reductions(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.max(), x.min(), x.sum(), x.mean(), x.prod(), x.exp(), x.log()


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_and_pointwise(device: str) -> None:
    """Seed In [22]: max/min bf16, sum fp32, mean bf16, prod fp32, exp/log fp32 (CUDA)."""
    rep = analyze(Reductions(), _setting("amp-half", device),
                  args=(torch.randn(2, 20000, dtype=torch.bfloat16),))  # fmt: skip
    got = {n.op.split(".")[1]: n.out_dtype for n in rep.nodes if n.op.startswith("aten.")}
    if device == "cuda":
        assert got == {"max": "bfloat16", "min": "bfloat16", "sum": "float32",
                       "mean": "bfloat16", "prod": "float32", "exp": "float32", "log": "float32"}  # fmt: skip
    else:
        # CPU autocast has no fp32 entry for sum, exp or log; prod is in its fp32 list.
        assert got == {"max": "bfloat16", "min": "bfloat16", "sum": "bfloat16",
                       "mean": "bfloat16", "prod": "float32", "exp": "bfloat16", "log": "bfloat16"}  # fmt: skip
    assert rep.check["disagreements"] == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("input_dtype", "n_casts"), [(torch.float32, 3), (torch.float16, 2)])
def test_seed_001_linear_cast_count(device: str, input_dtype: torch.dtype, n_casts: int) -> None:
    """Seed 001: under fp16 autocast a Linear fed fp32 casts input, weight and bias; fed fp16
    it casts only the parameters ("the second approach works and avoids one cast")."""
    rep = analyze(nn.Linear(16, 16), _setting("amp-fp32", device, "fp16"),
                  args=(torch.randn(1, 16, dtype=input_dtype),))  # fmt: skip
    casts = rep.node("linear").casts
    assert len(casts) == n_casts
    assert all(c.to_dtype == "float16" for c in casts)
    assert {c.node for c in casts} >= {"p_weight", "p_bias"}
