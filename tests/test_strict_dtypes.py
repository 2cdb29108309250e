"""Dtype errors the real kernels raise and fake kernels skip (issue 10, class 5).

On the CPU each case is run for real and the predicted message must equal the real kernel's; the
CUDA wording comes from the kernels' source and is compared with a GPU by ``pytest -m cuda``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.hooks import eager_hook_lines
from ampgraph.models import ModelInputs
from ampgraph.settings import Setting

F32, BF16 = torch.float32, torch.bfloat16

CASES = {
    "conv_input_fp32_weight_bf16": lambda: (nn.Conv2d(3, 4, 3, bias=False), F32, BF16),
    "conv_input_bf16_weight_fp32": lambda: (nn.Conv2d(3, 4, 3, bias=False), BF16, F32),
    "conv_bias": lambda: (nn.Conv2d(3, 4, 3), F32, BF16),
    "layer_norm": lambda: (nn.LayerNorm(8), F32, BF16),
    "group_norm": lambda: (nn.GroupNorm(2, 4), F32, BF16),
    "batch_norm": lambda: (nn.BatchNorm2d(4), F32, BF16),
}
SHAPES = {"layer_norm": (2, 8), "group_norm": (2, 4, 5, 5), "batch_norm": (2, 4, 5, 5)}


def _real_error(module: nn.Module, x: torch.Tensor) -> str | None:
    try:
        module(x)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_prediction_is_the_real_kernels_error(case: str) -> None:
    module, in_dtype, param_dtype = CASES[case]()
    module.eval()
    shape = SHAPES.get(case, (1, 3, 8, 8))
    x = torch.randn(shape, dtype=in_dtype)
    real = _real_error(module.to(param_dtype), x)
    assert real is not None  # every case raises on a real CPU
    setting = Setting.parse(f"autocast=off,params={param_dtype}".replace("torch.", ""),
                            device_type="cpu")  # fmt: skip
    report = analyze(module.float(), setting, args=(x,))
    errors = [r.error for r in report.nodes if r.error]
    assert errors == [real]


def test_half_resnet_block_fails_at_its_first_convolution_on_cuda() -> None:
    """The ``half`` setting of a conv net: fp32 images into bf16 weights fail at once on a GPU."""
    block = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU()).eval()
    report = analyze(block, "half", args=(torch.randn(1, 3, 16, 16),))
    failing = [r for r in report.nodes if r.error]
    assert [r.op for r in failing] == ["aten.conv2d.default"]
    assert failing[0].error == (
        "Input type (torch.cuda.FloatTensor) and weight type (CUDABFloat16Type) should be the same"
    )


def test_fake_eager_oracle_sees_identity_leaves() -> None:
    model = ModelInputs("seq", nn.Sequential(nn.Linear(4, 4), nn.Identity()), (torch.randn(2, 4),))
    assert eager_hook_lines(model, Setting.parse("amp-fp32")) == [
        "[0] in=torch.float32 -> out=torch.bfloat16",
        "[1] in=torch.bfloat16 -> out=torch.bfloat16",
    ]
