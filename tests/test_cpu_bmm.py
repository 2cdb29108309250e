"""CPU ``bmm``/``baddbmm``/``F.linear`` of two dtypes: the strict prediction raises what the
real CPU kernel raises, on each of the kernel's paths (:mod:`ampgraph.annotate.cpu_bmm`).

A bias-free ``nn.Linear`` on a 3-D input whose leading dimensions do not fold into a matrix (a
slice of a ``cat``, under ``no_grad``) reaches ``bmm``; a large enough one splits into one
``addmm`` per item and raises "m1 and m2", a small one the naive kernel's "expected scalar
type". Each case runs the real kernel and the prediction (fake tensors, strict mode) side by side.
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
from ampgraph.annotate.replay import fake_mode
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify import verify

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
aten = torch.ops.aten


def _x(shape: tuple[int, ...], layout: str, dtype: torch.dtype) -> torch.Tensor:
    """An input of ``shape``: contiguous, a slice of a cat along the last or the row dimension
    (the rows' slice cannot fold), or a transposed view."""
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype)
    if layout == "cat_last":
        return torch.cat([torch.randn(shape, dtype=dtype)] * 2, dim=-1)[..., : shape[-1]]
    if layout == "cat_rows":
        return torch.cat([torch.randn(shape, dtype=dtype)] * 2, dim=-2)[..., : shape[-2], :]
    return torch.randn((*shape[:-2], shape[-1], shape[-2]), dtype=dtype).transpose(-1, -2)


LAYOUTS = ("contiguous", "cat_last", "cat_rows", "transposed")
#: rows x features -> out: below 400 multiply-adds per item (naive kernel) and above (split/gemm).
SIZES = {"small": (3, 8, 5), "large": (24, 16, 8)}


def _linear(dims: int, layout: str, size: str, bias: bool, grad: bool,
            a: torch.dtype, b: torch.dtype) -> Callable[[], Any]:  # fmt: skip
    rows, k, n = SIZES[size]
    shape = {2: (rows, k), 3: (2, rows, k), 4: (2, 2, rows, k)}[dims]

    def run() -> Any:
        x = _x(shape, layout, a)
        w = torch.randn(n, k, dtype=b, requires_grad=True)
        bias_t = torch.randn(n, dtype=b, requires_grad=True) if bias else None
        with torch.set_grad_enabled(grad):
            return F.linear(x, w, bias_t)

    return run


def _bmm(layout: str, size: str, a: torch.dtype, b: torch.dtype, add: bool) -> Callable[[], Any]:
    rows, k, n = SIZES[size]

    def run() -> Any:
        b1 = _x((2, rows, k), layout, a)
        b2 = torch.randn(2, k, n, dtype=b)
        return aten.baddbmm(torch.randn(2, rows, n, dtype=a), b1, b2) if add else aten.bmm(b1, b2)

    return run


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        out = fn()
    except RuntimeError as exc:
        return "error: " + str(exc).splitlines()[0]
    return f"ok {out.dtype}"


def _compare(fn: Callable[[], Any]) -> tuple[str, str]:
    torch.manual_seed(0)
    real = _outcome(fn)
    with fake_mode(), StrictDtypeMode("cpu"):
        predicted = _outcome(fn)
    return real, predicted


def _assert_same(real: str, predicted: str, case: Any) -> None:
    if real.startswith("ok"):
        assert predicted.startswith("ok"), (case, predicted)
    else:
        assert predicted == real, case


PAIRS = [(F32, BF16), (F32, F16), (BF16, F32), (F16, F32)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dims", [2, 3, 4])
def test_linear_error_follows_the_real_cpu_kernels_path(dims: int, bias: bool) -> None:
    """Contiguous or not, folded or not, with grad or without: the real kernel's message."""
    for layout, size, grad, (a, b) in itertools.product(LAYOUTS, SIZES, (False, True), PAIRS):
        case = (dims, bias, layout, size, grad, a, b)
        _assert_same(*_compare(_linear(dims, layout, size, bias, grad, a, b)), case)


@pytest.mark.parametrize("add", [False, True])
def test_bmm_error_follows_the_real_cpu_kernels_path(add: bool) -> None:
    """Naive kernel, MKL's gemm (fp32/fp64 results), split per item (16-bit results or items
    neither contiguous nor transposed)."""
    pairs = [*PAIRS, (F64, F32), (F32, F64), (BF16, F16)]
    for layout, size, (a, b) in itertools.product(LAYOUTS, SIZES, pairs):
        case = (add, layout, size, a, b)
        _assert_same(*_compare(_bmm(layout, size, a, b, add)), case)


def test_informer_value_projection_reaches_the_split_path() -> None:
    """The case found on Informer: a bias-free bf16 Linear on an fp32 slice of a cat that cannot
    fold (``no_grad``), large enough to split: "m1 and m2", as the real kernel says."""
    real, predicted = _compare(_linear(3, "cat_rows", "large", False, False, F32, BF16))
    assert real.startswith("error: expected m1 and m2")
    assert predicted == real


class SliceOfCat(nn.Module):
    """Informer's value embedding in small: a bias-free Linear on rows sliced from a cat, a
    3-D input whose leading dimensions do not fold into a matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([x, x], dim=1)[:, : x.shape[1]])


@pytest.mark.parametrize("frozen", [False, True])
def test_linear_error_follows_whether_the_weight_requires_grad(frozen: bool) -> None:
    """A weight that requires grad makes ``matmul`` fold into ``mm`` ("m1 and m2"), under
    ``inference_mode`` too; a frozen one leaves the small ``bmm``'s naive kernel ("expected
    scalar type"). The prediction and ``verify`` (graph and hooks) follow the real run's."""
    module = SliceOfCat().eval().requires_grad_(not frozen)
    x = torch.randn(2, 3, 4)
    real = _outcome(lambda: module.to(BF16)(x))  # a real run, as a user makes it
    module.float()
    expected = "expected scalar type" if frozen else "expected m1 and m2"
    assert real.startswith(f"error: {expected}")
    setting = Setting.parse("half", device_type="cpu")
    report = analyze(module, setting, args=(x,))
    assert ["error: " + r.error for r in report.nodes if r.error] == [real]
    result = verify(ModelInputs("slice_of_cat", module, (x,), {}), setting)
    assert result.ok, result.disagreements
