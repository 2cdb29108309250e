"""Dtype errors the real kernels raise and fake kernels skip (issue 10, class 5).

On the CPU every case is run for real and the prediction must be the real kernel's outcome: the
same first line of its error, or no error at all. CUDA's wording comes from the kernels' source
(``ampgraph.annotate.strict`` names where each check lives) and is compared with a GPU by ``pytest -m cuda``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph import analyze
from ampgraph.annotate.cuda_kernels import CUDA_CHECKS
from ampgraph.annotate.replay import fake_mode
from ampgraph.annotate.strict import STRICT_CHECKS, StrictDtypeMode
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16

CASES = {
    "conv_input_fp32_weight_bf16": lambda: (nn.Conv2d(3, 4, 3, bias=False), F32, BF16),
    "conv_input_bf16_weight_fp32": lambda: (nn.Conv2d(3, 4, 3, bias=False), BF16, F32),
    "conv_bias": lambda: (nn.Conv2d(3, 4, 3), F32, BF16),
    "layer_norm": lambda: (nn.LayerNorm(8), F32, BF16),
    "group_norm": lambda: (nn.GroupNorm(2, 4), F32, BF16),
    "batch_norm": lambda: (nn.BatchNorm2d(4), F32, BF16),
}
SHAPES = {"layer_norm": (2, 8), "group_norm": (2, 4, 5, 5), "batch_norm": (2, 4, 5, 5)}

aten = torch.ops.aten
LONG = torch.long


def _t(shape: tuple[int, ...], dtype: torch.dtype | None) -> torch.Tensor | None:
    return None if dtype is None else torch.randn(shape, dtype=dtype)


def _idx(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=LONG)


#: name -> f(a, b): each op fed tensors of dtypes a and b where it mixes them. Values never
#: matter; zero indices are in range. Every ATen op these reach is listed in OPS below.
OP_CASES: dict[str, Callable[[Any, Any], Any]] = {
    "mm": lambda a, b: aten.mm(_t((3, 4), a), _t((4, 5), b)),
    "linear": lambda a, b: F.linear(_t((3, 4), a), _t((5, 4), b)),
    "linear_bias": lambda a, b: F.linear(_t((3, 4), a), _t((5, 4), a), _t((5,), b)),
    "linear_3d": lambda a, b: F.linear(_t((2, 3, 4), a), _t((5, 4), b), _t((5,), b)),
    "matmul": lambda a, b: torch.matmul(_t((2, 3, 4), a), _t((4, 5), b)),
    "bmm": lambda a, b: aten.bmm(_t((2, 3, 4), a), _t((2, 4, 5), b)),
    "baddbmm": lambda a, b: aten.baddbmm(_t((2, 3, 5), a), _t((2, 3, 4), a), _t((2, 4, 5), b)),
    "baddbmm_self": lambda a, b: aten.baddbmm(_t((2, 3, 5), b), _t((2, 3, 4), a), _t((2, 4, 5), a)),
    "addbmm": lambda a, b: aten.addbmm(_t((3, 5), a), _t((2, 3, 4), a), _t((2, 4, 5), b)),
    "addmm": lambda a, b: aten.addmm(_t((5,), a), _t((3, 4), a), _t((4, 5), b)),
    "addmm_self": lambda a, b: aten.addmm(_t((5,), b), _t((3, 4), a), _t((4, 5), a)),
    "addmm_activation": lambda a, b: aten._addmm_activation(
        _t((5,), a), _t((3, 4), a), _t((4, 5), b)
    ),
    "addmv": lambda a, b: aten.addmv(_t((3,), a), _t((3, 4), a), _t((4,), b)),
    "addmv_self": lambda a, b: aten.addmv(_t((3,), b), _t((3, 4), a), _t((4,), a)),
    "mv": lambda a, b: aten.mv(_t((3, 4), a), _t((4,), b)),
    "dot": lambda a, b: aten.dot(_t((4,), a), _t((4,), b)),
    "vdot": lambda a, b: aten.vdot(_t((4,), a), _t((4,), b)),
    "einsum": lambda a, b: torch.einsum("bij,bjk->bik", _t((2, 3, 4), a), _t((2, 4, 5), b)),
    # The convolutions depend on the CPU (oneDNN takes 16-bit inputs only on some CPUs,
    # ampgraph.annotate.cpu_backend): like every case, checked against this CPU's real kernel.
    "conv2d": lambda a, b: F.conv2d(_t((1, 3, 8, 8), a), _t((4, 3, 3, 3), b)),
    "conv2d_bias": lambda a, b: F.conv2d(_t((1, 3, 8, 8), a), _t((4, 3, 3, 3), a), _t((4,), b)),
    "conv_transpose2d": lambda a, b: F.conv_transpose2d(_t((1, 3, 8, 8), a), _t((3, 4, 3, 3), b)),
    "conv1d": lambda a, b: F.conv1d(_t((1, 3, 8), a), _t((4, 3, 3), b)),
    "layer_norm": lambda a, b: F.layer_norm(_t((2, 8), a), (8,), _t((8,), b), _t((8,), b)),
    "layer_norm_bias": lambda a, b: F.layer_norm(_t((2, 8), a), (8,), _t((8,), a), _t((8,), b)),
    "layer_norm_bias_only": lambda a, b: F.layer_norm(_t((2, 8), a), (8,), None, _t((8,), b)),
    "group_norm": lambda a, b: F.group_norm(_t((2, 4, 5, 5), a), 2, _t((4,), b), _t((4,), b)),
    "group_norm_bias": lambda a, b: F.group_norm(_t((2, 4, 5, 5), a), 2, _t((4,), a), _t((4,), b)),
    "batch_norm": lambda a, b: F.batch_norm(
        _t((2, 4, 3, 3), a), _t((4,), b), _t((4,), b), _t((4,), b), _t((4,), b)
    ),
    "batch_norm_fp32_stats": lambda a, b: F.batch_norm(
        _t((2, 4, 3, 3), a), _t((4,), F32), _t((4,), F32), _t((4,), b), _t((4,), b)
    ),
    "batch_norm_stats": lambda a, b: F.batch_norm(
        _t((2, 4, 3, 3), a), _t((4,), b), _t((4,), a), _t((4,), a), _t((4,), a)
    ),
    "batch_norm_train": lambda a, b: F.batch_norm(
        _t((2, 4, 3, 3), a), _t((4,), b), _t((4,), b), _t((4,), b), _t((4,), b), True
    ),
    "instance_norm": lambda a, b: F.instance_norm(
        _t((2, 4, 5, 5), a), None, None, _t((4,), b), _t((4,), b)
    ),
    "index_put": lambda a, b: aten.index_put(_t((4, 4), a), [_idx(2)], _t((2, 4), b)),
    "setitem": lambda a, b: _t((4, 4), a).__setitem__(torch.tensor([0, 1]), _t((2, 4), b)),
    "index_add": lambda a, b: torch.index_add(_t((4, 4), a), 0, _idx(2), _t((2, 4), b)),
    "index_copy": lambda a, b: torch.index_copy(_t((4, 4), a), 0, _idx(2), _t((2, 4), b)),
    "masked_scatter": lambda a, b: torch.masked_scatter(
        _t((4, 4), a), torch.ones(4, 4, dtype=torch.bool), _t((4, 4), b)
    ),
    "lerp": lambda a, b: torch.lerp(_t((4,), a), _t((4,), b), 0.5),
    "lerp_weight": lambda a, b: torch.lerp(_t((4,), a), _t((4,), a), _t((4,), b)),
    "bce": lambda a, b: F.binary_cross_entropy(torch.rand(3, 5).to(a), torch.rand(3, 5).to(b)),
    "bce_weight": lambda a, b: F.binary_cross_entropy(
        torch.rand(3, 5).to(a), torch.rand(3, 5).to(a), weight=torch.rand(3, 5).to(b)
    ),
    "nll_loss": lambda a, b: F.nll_loss(_t((3, 5), a), _idx(3), weight=_t((5,), b)),
    "nll_loss2d": lambda a, b: F.nll_loss(_t((3, 5, 2, 2), a), _idx(3, 2, 2), weight=_t((5,), b)),
    "cross_entropy": lambda a, b: F.cross_entropy(_t((3, 5), a), _idx(3), weight=_t((5,), b)),
    "grid_sample": lambda a, b: F.grid_sample(
        _t((1, 3, 8, 8), a), _t((1, 4, 4, 2), b), align_corners=False
    ),
    "grid_sample_3d": lambda a, b: F.grid_sample(
        _t((1, 3, 4, 4, 4), a), _t((1, 2, 2, 2, 3), b), align_corners=False
    ),
    "weight_norm": lambda a, b: torch._weight_norm(_t((4, 3), a), _t((4, 1), b)),
    "cross": lambda a, b: torch.linalg.cross(_t((3, 3), a), _t((3, 3), b)),
    "cdist": lambda a, b: torch.cdist(_t((3, 5), a), _t((4, 5), b)),
    "embedding_bag": lambda a, b: F.embedding_bag(
        _idx(2, 3), _t((10, 4), a), per_sample_weights=_t((2, 3), b), mode="sum"
    ),
    # Ops whose fake kernels already agree: the mode must not add errors to them.
    "scatter_add": lambda a, b: torch.scatter_add(_t((4, 4), a), 0, _idx(2, 4), _t((2, 4), b)),
    "prelu": lambda a, b: F.prelu(_t((2, 4, 5), a), _t((4,), b)),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(
        _t((1, 2, 4, 8), a), _t((1, 2, 4, 8), b), _t((1, 2, 4, 8), a)
    ),
    "where": lambda a, b: torch.where(torch.ones(4, dtype=torch.bool), _t((4,), a), _t((4,), b)),
    "mse_loss": lambda a, b: F.mse_loss(_t((3, 5), a), _t((3, 5), b)),
    "embedding": lambda a, b: F.embedding(_idx(2), _t((10, 4), a)),
    "rms_norm": lambda a, b: F.rms_norm(_t((2, 8), a), (8,), _t((8,), b)),
    "tensordot": lambda a, b: torch.tensordot(_t((3, 4), a), _t((4, 5), b), dims=1),
}
PAIRS = [p for p in itertools.permutations((F32, BF16, F16), 2)] + [(BF16, BF16)]


def _outcome(fn: Callable[[Any, Any], Any], a: torch.dtype, b: torch.dtype) -> str:
    try:
        out = fn(a, b)
    except (RuntimeError, ValueError) as exc:
        return "error: " + str(exc).splitlines()[0]
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return "ok " + ",".join(str(t.dtype) for t in leaves if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_cpu_predictions_are_the_real_kernels_outcome(case: str) -> None:
    """Every dtype pair: a fake CPU run under StrictDtypeMode raises exactly what the real CPU
    kernel raises (same first line), and runs exactly where it runs."""
    for a, b in PAIRS:
        torch.manual_seed(0)
        real = _outcome(OP_CASES[case], a, b)
        with fake_mode(), StrictDtypeMode("cpu"):
            predicted = _outcome(OP_CASES[case], a, b)
        if real.startswith("ok"):
            assert predicted.startswith("ok"), (case, a, b, predicted)
        else:
            assert predicted == real, (case, a, b)


def test_every_cuda_check_is_proven_on_the_cpu_or_cuda_only() -> None:
    """A check registered for both devices is the same function (device-generic code), so the
    CPU comparison above proves its wording for CUDA too."""
    for (device, op), check in STRICT_CHECKS.items():
        if device == "cuda" and ("cpu", op) in STRICT_CHECKS:
            shared = STRICT_CHECKS[("cpu", op)] is check
            assert shared or op in (aten.mm.default, aten.baddbmm.default, aten.convolution.default, aten._embedding_bag.default, aten._embedding_bag_forward_only.default) or op in DEVICE_SPECIFIC  # fmt: skip


#: Checks whose CUDA kernel differs from the CPU's (issue 33, an H100's record):
#: ``ampgraph.annotate.cuda_kernels`` and the index_put paths of ``index_checks``.
DEVICE_SPECIFIC = {op for (device, op) in CUDA_CHECKS} | {
    aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default,
    aten._unsafe_masked_index_put_accumulate.default,
    aten._euclidean_dist.default,  # mm's and bmm's wording, per device
}


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
