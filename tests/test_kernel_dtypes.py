"""The real CPU kernels' output dtypes where the fake kernels part (``ampgraph.annotate.kernel_dtypes``).

Every op of the table runs for real on the CPU, with every input dtype and every parameter dtype
(mixed or not, and none), and on fake tensors under :class:`RealCpuDtypes`: the dtypes of every
output must be the real kernel's. Then a model nobody tuned for (a GroupNorm after a
convolution) is analysed in a training step on the CPU and proven against the dispatcher and a
real step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph.formats.verify import disagreement_lines
from ampgraph import analyze
from ampgraph.annotate.kernel_dtypes import CPU_MIXED, RealCpuDtypes
from ampgraph.model.build import ModelInputs
from ampgraph.verify.training import verify_train

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

aten = torch.ops.aten
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _stats(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.rand(shape) + 0.5


#: op -> f(input dtype, parameter dtype or None): its arguments, real CPU tensors.
ARGS: dict[Any, Callable[[torch.dtype, torch.dtype | None], tuple[Any, ...]]] = {
    aten.native_layer_norm.default: lambda x, w: (
        torch.randn(4, 8, dtype=x), [8], _p(8, w), _p(8, w), 1e-5),
    aten.native_group_norm.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), 2, 8, 9, 2, 1e-5),
    aten.native_batch_norm.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _p(8, w), _p(8, w), True, 0.1, 1e-5),
    aten._native_batch_norm_legit.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _stats((8,)), _stats((8,)), True,
        0.1, 1e-5),
    aten._native_batch_norm_legit.no_stats: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), True, 0.1, 1e-5),
    aten._native_batch_norm_legit_no_training.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _stats((8,)), _stats((8,)), 0.1,
        1e-5),
    aten._native_batch_norm_legit_functional.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _stats((8,)), _stats((8,)), True,
        0.1, 1e-5),
    aten._batch_norm_with_update.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _stats((8,)), _stats((8,)), 0.1,
        1e-5),
    aten._batch_norm_no_update.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), _stats((8,)), _stats((8,)), 0.1,
        1e-5),
    aten.native_group_norm_backward.default: lambda x, w: (
        torch.randn(2, 8, 3, 3, dtype=x), torch.randn(2, 8, 3, 3, dtype=x),
        *_group_stats(x, w), _p(8, w), 2, 8, 9, 2, [True, w is not None, w is not None]),
}  # fmt: skip


#: Ops whose fake kernel raises a TypeError without a weight (it picks a backend with one), where
#: the real CPU kernel runs: not a dtype, and not this table's.
NEEDS_WEIGHT_WHEN_FAKE = {aten._batch_norm_with_update.default, aten._batch_norm_no_update.default}


def _p(n: int, dtype: torch.dtype | None) -> torch.Tensor | None:
    return None if dtype is None else torch.rand(n, dtype=dtype) + 0.5


def _group_stats(x: torch.dtype, w: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and rstd the forward gives (fp32 for a mixed input, else the input's dtype)."""
    _, mean, rstd = aten.native_group_norm(
        torch.randn(2, 8, 3, 3, dtype=x), _p(8, w), _p(8, w), 2, 8, 9, 2, 1e-5
    )
    return mean, rstd


def _dtypes(out: Any) -> list[torch.dtype | None]:
    return [t.dtype if isinstance(t, torch.Tensor) else None for t in out]


def test_every_op_of_the_table_has_a_case() -> None:
    assert set(ARGS) == set(CPU_MIXED)


@pytest.mark.parametrize("op", list(ARGS), ids=str)
def test_fake_tensors_get_the_real_cpu_kernels_dtypes(op: Any) -> None:
    compared = 0
    for x in (BF16, F16, F32):
        for w in (F32, BF16, F16, None):
            try:
                args = ARGS[op](x, w)
                real = _dtypes(op(*args))
            except (RuntimeError, TypeError):
                continue  # a dtype error (ampgraph.strict's to predict), or no such call
            if w is None and op in NEEDS_WEIGHT_WHEN_FAKE:
                continue
            mode = FakeTensorMode()
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            with mode, RealCpuDtypes():
                fake = _dtypes(op(*fake_args))
            assert fake == real, (op, x, w)
            compared += 1
    assert compared >= 3  # at least: bf16 and fp16 mixed with fp32 parameters, fp32 alone


class ConvGroupNorm(nn.Module):
    """A bf16 convolution into an fp32 GroupNorm: CPU autocast has no entry for group_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(self.conv(x)).relu()


def test_a_group_norms_training_step_on_the_cpu_is_the_real_one() -> None:
    """Its statistics are saved in fp32 and its input's gradient is bf16, as a real step has
    them; before, the trace said fp32 for that gradient and the check flagged the statistics."""
    m = ModelInputs("conv-gn", ConvGroupNorm(), (torch.randn(2, 3, 8, 8),))
    report = analyze(m, "autocast=on,device=cpu", pass_="train")
    bw = report.backward
    assert bw is not None and bw.check is not None
    assert bw.check["disagreements"] == 0, bw.disagreements[:3]
    (back,) = [n for n in bw.nodes if n.op == "aten.native_group_norm_backward.default"]
    assert back.outputs == ["bfloat16", "float32", "float32"]
    stats = [t for t in bw.saved if t.module == "gn" and t.shape == [2, 2]]
    assert [t.dtype for t in stats] == ["float32", "float32"]
    real = verify_train(m, "autocast=on,device=cpu")
    assert real.ok, disagreement_lines(real)[:5]
