"""Python scalars that overflow the tensor's dtype raise in the real kernels (issue 33, item 2).

``F.pad(x_bf16, (1, 1), value=torch.finfo(torch.float32).min)`` raises ``value cannot be
converted to type c10::BFloat16 without overflow`` on a CPU and on a GPU; fake kernels run it.
Every case runs on real CPU tensors and on fake ones under the strict mode: the same first line
of the error, or both run with the same dtypes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph import analyze
from ampgraph.annotate.replay import fake_mode
from ampgraph.annotate.scalars import C10_TYPES, SCALAR_CHECKS, overflows
from ampgraph.annotate.strict import STRICT_CHECKS, StrictDtypeMode
from ampgraph.settings import Setting

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

aten = torch.ops.aten
F32_MIN = torch.finfo(torch.float32).min
#: Values either side of each type's range, and the ones that always convert (inf, NaN).
VALUES = [
    0, 1, -1, 127, 128, -129, 255, 256, -256, 32768, 65504, 65505, 2**31, -(2**31) - 1,
    2**63 - 1, -(2**63), 0.5, -1.0, 255.0, 256.0, 65504.0, 65505.0, 65520.0, 1e5, 2.0**63,
    torch.finfo(torch.bfloat16).max, 3.39e38, F32_MIN, -F32_MIN, 1e39, -1e39, 1e308,
    math.inf, -math.inf, math.nan,
]  # fmt: skip


def _outcome(call: Callable[[], Any]) -> str:
    try:
        out = call()
    except (RuntimeError, ValueError) as exc:
        return "error: " + str(exc).splitlines()[0]
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return "ok " + ",".join(str(t.dtype) for t in leaves if isinstance(t, torch.Tensor))


def _real_and_predicted(call: Callable[[], Any], device: str = "cpu") -> tuple[str, str]:
    """The real CPU kernel's outcome, and the strict fake replay's (tensors made inside)."""
    real = _outcome(call)
    with fake_mode(), StrictDtypeMode(device):
        predicted = _outcome(call)
    return real, predicted


@pytest.mark.parametrize("dtype", sorted(C10_TYPES, key=str), ids=str)
def test_the_range_rule_is_the_kernels(dtype: torch.dtype) -> None:
    """``fill_`` of every value: ``overflows`` and the real kernel say the same, in its words."""
    for value in VALUES:
        real, predicted = _real_and_predicted(lambda: torch.zeros(2, dtype=dtype).fill_(value))
        assert predicted == real, (dtype, value)
        assert overflows(value, dtype) == real.startswith("error"), (dtype, value)


def _mask(x: torch.Tensor) -> torch.Tensor:
    return torch.ones(x.shape, dtype=torch.bool)


#: name -> f(x, v): an op given tensor x and Python scalar v where it converts v to x's dtype.
OP_CASES: dict[str, Callable[[torch.Tensor, Any], Any]] = {
    "pad": lambda x, v: F.pad(x, (1, 1), value=v),
    "pad_2d": lambda x, v: F.pad(x, (1, 1, 1, 1), mode="constant", value=v),
    "fill_": lambda x, v: x.clone().fill_(v),
    "full": lambda x, v: torch.full((2,), v, dtype=x.dtype),
    "full_like": lambda x, v: torch.full_like(x, v),
    "new_full": lambda x, v: x.new_full((2,), v),
    "masked_fill": lambda x, v: x.masked_fill(_mask(x), v),
    "masked_fill_": lambda x, v: x.clone().masked_fill_(_mask(x), v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([0]), v),
    "scatter": lambda x, v: x.scatter(0, torch.zeros(1, 4, dtype=torch.long), v),
    "clamp_min": lambda x, v: x.clamp(min=v),
    "clamp_max": lambda x, v: x.clamp(max=v),
    "clamp_min_op": lambda x, v: torch.clamp_min(x, v),
    "clamp_max_op": lambda x, v: torch.clamp_max(x, v),
    "threshold_value": lambda x, v: F.threshold(x, 0.0, v),
    "threshold": lambda x, v: F.threshold(x, v, 0.0),
    "hardtanh": lambda x, v: F.hardtanh(x, v, 1e40),
    "hardshrink": lambda x, v: F.hardshrink(x, abs(v) if not math.isnan(v) else v),
    "pow": lambda x, v: x**v,
    "add_alpha": lambda x, v: torch.add(x, x, alpha=v),
    "sub_alpha": lambda x, v: torch.sub(x, x, alpha=v),
    "linspace": lambda x, v: torch.linspace(v, 0, 3, dtype=x.dtype),
    "leaky_relu": lambda x, v: F.leaky_relu(x, v),
    "softplus": lambda x, v: F.softplus(x, beta=v),
    "celu": lambda x, v: F.celu(x, alpha=v),
    "addcmul": lambda x, v: torch.addcmul(x, x, x, value=v),
    "addcdiv": lambda x, v: torch.addcdiv(x, x, x.abs() + 1, value=v),
    "elu": lambda x, v: F.elu(x, alpha=v),
    # Ops that take such a value without converting it to the tensor's type: no error to add.
    "add": lambda x, v: x + v,
    "mul": lambda x, v: x * v,
    "nan_to_num": lambda x, v: torch.nan_to_num(x, neginf=v),
}
#: ``where`` converts its scalar unchecked for a 16-bit tensor, checked for fp32 (where ampgraph
#: does not model it yet): proven where it adds no error.
WHERE_VALUES = [F32_MIN, -65505.0, -math.inf, 1.0]
OP_VALUES = [F32_MIN, -65505.0, 1e39, -math.inf, 1.0]


def test_where_adds_no_error() -> None:
    for dtype, value in itertools.product((torch.bfloat16, torch.float16), WHERE_VALUES):
        real, predicted = _real_and_predicted(
            lambda: (lambda x: torch.where(x > 0, x, value))(torch.randn(4, 4, dtype=dtype))
        )
        assert predicted == real == f"ok {dtype}", (dtype, value)


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_each_op_is_the_real_cpu_kernels_outcome(case: str) -> None:
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    for dtype, value in itertools.product(dtypes, OP_VALUES):
        torch.manual_seed(0)
        call = OP_CASES[case]
        real, predicted = _real_and_predicted(lambda: call(torch.randn(4, 4, dtype=dtype), value))
        assert predicted == real, (case, dtype, value)


def test_finfo_fp32_min_overflows_bf16_and_fp16_but_not_fp32() -> None:
    """bf16 has fp32's exponent but a shorter mantissa: its largest value (3.3895e38) is below
    fp32's (3.4028e38), so fp32's lowest does not fit."""
    real = {d: _outcome(lambda d=d: F.pad(torch.zeros(2, dtype=d), (1, 1), value=F32_MIN))
            for d in (torch.bfloat16, torch.float16, torch.float32)}  # fmt: skip
    assert real == {
        torch.bfloat16: "error: value cannot be converted to type c10::BFloat16 without overflow",
        torch.float16: "error: value cannot be converted to type c10::Half without overflow",
        torch.float32: "ok torch.float32",
    }


def test_cuda_checks_are_the_device_generic_ones() -> None:
    """On CUDA only the ops whose value reaches ``fill_`` or ``masked_fill`` (their CUDA kernels
    convert it as the CPU's do), with the same function as the CPU's; F.pad on fake CUDA
    tensors raises what the H200 raised (DESIGN.md fact 18)."""
    for (device, op), check in SCALAR_CHECKS.items():
        if device == "cuda":
            assert SCALAR_CHECKS[("cpu", op)] is check
            assert STRICT_CHECKS[("cuda", op)] is check
    with fake_mode(), StrictDtypeMode("cuda"):
        x = torch.zeros(2, 4, dtype=torch.bfloat16, device="cuda")
        got = _outcome(lambda: F.pad(x, (1, 1), value=F32_MIN))
    assert got == "error: value cannot be converted to type c10::BFloat16 without overflow"


class PadMask(nn.Module):
    """Attention-style code that pads its mask with fp32's lowest whatever the mask's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x.to(self.proj.weight.dtype))
        return F.pad(y, (1, 1), value=torch.finfo(torch.float32).min).float()


@pytest.mark.parametrize("setting", ["fp32", "half", "amp-fp32", "amp-half"])
def test_the_annotation_raises_where_the_real_run_raises(setting: str) -> None:
    parsed = Setting.parse(setting, device_type="cpu")
    model, x = PadMask().eval(), torch.randn(2, 4)
    torch.manual_seed(0)
    amp, params = getattr(torch, parsed.amp_dtype), getattr(torch, parsed.param_dtype)
    with torch.autocast("cpu", dtype=amp, enabled=parsed.autocast):
        real = _outcome(lambda: PadMask().to(params).eval()(x))
    report = analyze(model, parsed, args=(x,))
    errors = [r.error for r in report.nodes if r.error]
    assert errors == ([real.removeprefix("error: ")] if real.startswith("error") else [])
    assert report.check is not None and report.check["disagreements"] == 0


@pytest.mark.parametrize(("setting", "amp"), [("half", "bfloat16"), ("amp-fp32", "float16")])
def test_verify_agrees_with_the_real_run(setting: str, amp: str) -> None:
    """``ampgraph verify --device cpu``'s gate on the padded mask: the real run raises at the
    pad, and the prediction says so, node by node and module by module."""
    from ampgraph.model.build import ModelInputs
    from ampgraph.verify import verify

    model = ModelInputs("pad-mask", PadMask().eval(), (torch.randn(2, 4),))
    result = verify(model, Setting.parse(setting, device_type="cpu", amp_dtype=amp))
    assert result.ok, result
    assert result.nodes.agree == result.nodes.total > 0
