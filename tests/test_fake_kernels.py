"""A quick slice of scripts/fake_kernel_survey.py (docs/fake-kernels.md): the ops whose fake
kernels parted from the real CPU kernels on mixed dtypes and that ampgraph now follows.

The oracle is always the real CPU kernel: each call runs for real, then on fake CPU tensors as
ampgraph replays it (``StrictDtypeMode``, ``RealCpuDtypes``, the replaced meta kernels); the two
must raise the same first line, or both run with the same output dtypes.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import ampgraph.capture.meta_kernels  # noqa: F401 - the replaced meta kernels, as in a capture
from ampgraph.annotate.kernel_dtypes import RealCpuDtypes
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.torchutil import fake_mode

from .conftest import ROOT, load_file

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

aten = torch.ops.aten
F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
FLOATS = (F32, BF16, F16)

#: OpInfo names (``op_db``) whose fake kernels parted from the real ones before issue 25, and
#: backward kernels the survey probes by name.
FIXED = [
    "addr",
    "complex",
    "polar",
    "heaviside",
    "_softmax_backward_data",
    "_batch_norm_with_update",
    "index_reduce.mean",
    "index_reduce.amax",
    "_unsafe_masked_index_put_accumulate",
    "put",
    "nn.functional.soft_margin_loss",
    "nn.functional.huber_loss",
    "nn.functional.conv_transpose2d",
    "nn.functional.conv3d",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
    # Backward kernels op_db does not list; the survey probes them too.
    "threshold_backward",
    "mse_loss_backward",
    "glu_backward",
    "nll_loss_backward",
    "native_group_norm_backward",
    "native_batch_norm_backward",
]


def _survey() -> Any:
    return load_file(ROOT / "scripts" / "fake_kernel_survey.py")


@pytest.mark.parametrize("name", FIXED)
def test_survey_slice_agrees_with_the_real_cpu_kernel(name: str) -> None:
    """Every mixed-dtype variant of a few OpInfo samples: the same outcome as the real kernel,
    and where it raises, the same message."""
    rows, _ = _survey().survey([name])
    variants = [v for row in rows for v in row.variants]
    assert variants, name
    for v in variants:
        assert v.kind(v.ampgraph) == "agrees", (v.call, v.real, v.ampgraph)
        if v.real.error is not None:
            assert v.ampgraph.error == v.real.error, v.call


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        out = fn()
    except (RuntimeError, ValueError) as exc:
        return "error: " + str(exc).splitlines()[0]
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return "ok " + ",".join(str(t.dtype) for t in leaves if isinstance(t, torch.Tensor))


def _agree(args: tuple[Any, ...], call: Callable[..., Any]) -> tuple[str, str]:
    """The real CPU kernel's outcome on ``args``, and ampgraph's on fake copies of them."""
    real = _outcome(lambda: call(*args))
    with fake_mode() as mode:
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with StrictDtypeMode("cpu"), RealCpuDtypes():
            predicted = _outcome(lambda: call(*fakes))
    return real, predicted


@pytest.mark.parametrize("op", [torch.complex, torch.polar])
def test_complex_and_polar_every_dtype_pair(op: Callable[..., Any]) -> None:
    for a, b in itertools.product((*FLOATS, F64), repeat=2):
        real, predicted = _agree((torch.rand(3, dtype=a), torch.rand(3, dtype=b)), op)
        assert predicted == real, (a, b)


@pytest.mark.parametrize(
    "op", [aten._softmax_backward_data.default, aten._log_softmax_backward_data.default]
)
def test_softmax_backward_every_dtype_triple(op: Any) -> None:
    """``grad_output``, ``output`` and ``input_dtype``: the CPU kernel returns the grad's dtype
    and refuses an fp32 grad with ``input_dtype=torch.half``."""
    for g, o, i in itertools.product(FLOATS, repeat=3):
        args = (torch.randn(3, 4, dtype=g), torch.randn(3, 4, dtype=o), 1, i)
        real, predicted = _agree(args, op)
        assert predicted == real, (g, o, i)


@pytest.mark.parametrize("mask", [*FLOATS, torch.bool, None])
def test_cpu_flash_attention_every_dtype_triple(mask: torch.dtype | None) -> None:
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    for q, k, v in itertools.product(FLOATS, repeat=3):
        args = (
            torch.randn(1, 2, 3, 8, dtype=q),
            torch.randn(1, 2, 4, 8, dtype=k),
            torch.randn(1, 2, 4, 8, dtype=v),
            None if mask is None else torch.ones(3, 4).to(mask),
        )
        real, predicted = _agree(args, lambda q_, k_, v_, m_: op(q_, k_, v_, attn_mask=m_))
        assert predicted == real, (q, k, v, mask)


@pytest.mark.parametrize(
    "case",
    [
        lambda a, b: torch.heaviside(torch.randn(4, dtype=a), torch.randn(4, dtype=b)),
        lambda a, b: torch.index_reduce(
            torch.randn(4, 3, dtype=a), 0, torch.tensor([0, 2]), torch.randn(2, 3, dtype=b), "amax"
        ),
        lambda a, b: torch.put(
            torch.randn(3, 3, dtype=a), torch.tensor([0, 4]), torch.randn(2, dtype=b)
        ),
        lambda a, b: aten._unsafe_masked_index_put_accumulate(
            torch.randn(4, 4, dtype=a),
            torch.ones(2, 2, dtype=torch.bool),
            [torch.tensor([[0], [1]]), torch.tensor([[0, 1]])],
            torch.randn(2, 2, dtype=b),
        ),
        lambda a, b: torch.addr(
            torch.randn((), dtype=a), torch.randn(3, dtype=b), torch.randn(2, dtype=b)
        ),
        lambda a, b: F.huber_loss(torch.randn(4, dtype=a), torch.randn(4, dtype=b)),
        lambda a, b: F.soft_margin_loss(torch.randn(4, dtype=a), torch.randn(4, dtype=b)),
        lambda a, b: F.soft_margin_loss(
            torch.randn(4, dtype=a), torch.randn(4, dtype=b), reduction="none"
        ),
    ],
    ids=[
        "heaviside",
        "index_reduce",
        "put",
        "masked_index_put",
        "addr",
        "huber_loss",
        "soft_margin_loss",
        "soft_margin_loss_none",
    ],
)
def test_mixed_pair_every_dtype_pair(case: Callable[[Any, Any], Any]) -> None:
    """Every pair of floating dtypes; the calls build their tensors under the fake mode too."""
    for a, b in itertools.product(FLOATS, repeat=2):
        torch.manual_seed(0)
        call = functools.partial(case, a, b)
        real = _outcome(call)
        with fake_mode(), StrictDtypeMode("cpu"), RealCpuDtypes():
            predicted = _outcome(call)
        assert predicted == real, (a, b)


def _conv_configs(count: int) -> list[tuple[Any, ...]]:
    """Random convolutions: 1-3 spatial dims, transposed or not, strides, dilations, groups,
    batch sizes and kernel sizes either side of oneDNN's thresholds."""
    rng = random.Random(0)
    configs = []
    for _ in range(count):
        nd, transposed = rng.choice([1, 2, 3]), rng.random() < 0.5
        n, groups, k, size = rng.choice([1, 2, 17]), rng.choice([1, 2]), rng.choice([1, 3, 5]), rng.choice([4, 8])  # fmt: skip
        stride, dilation = [rng.choice([1, 2])] * nd, [rng.choice([1, 1, 2])] * nd
        out_pad = [rng.choice([0, 1])] * nd if transposed else [0] * nd
        if transposed and any(o >= max(s, d) for o, s, d in zip(out_pad, stride, dilation)):
            out_pad = [0] * nd
        c = o = 2 * groups
        w_shape = ((c, o // groups) if transposed else (o, c // groups)) + (k,) * nd
        x_shape = (n, c) + (size,) * nd
        try:  # a shape the kernel takes in fp32 (no output too small)
            aten.convolution(torch.empty(x_shape), torch.empty(w_shape), None, stride, [0] * nd,
                             dilation, transposed, out_pad, groups)  # fmt: skip
        except RuntimeError:
            continue
        configs.append((x_shape, w_shape, stride, dilation, transposed, out_pad, groups))
    return configs


CONV_DTYPES = [(F32, F32, BF16), (F32, F32, F16), (BF16, BF16, F32), (F16, F16, F32),
               (F32, BF16, F32), (F16, F32, F16)]  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "b_dtype"),
    CONV_DTYPES,
    ids=["-".join(str(d).removeprefix("torch.") for d in c) for c in CONV_DTYPES],
)
def test_cpu_convolution_bias_and_weight_follow_the_backend(
    threads: int, x_dtype: torch.dtype, w_dtype: torch.dtype, b_dtype: torch.dtype
) -> None:
    """``aten.convolution`` on the CPU: oneDNN or a slow kernel, picked by shape, dtype, thread
    count and the machine (:mod:`ampgraph.annotate.cpu_backend`: oneDNN takes 16-bit inputs only
    on CPUs with the instructions for them), each with its own dtype checks (a bias of another
    dtype runs on most slow kernels). Depends on the CPU: the oracle is this CPU's real kernel;
    ``tests/test_cpu_backend.py`` runs it again with oneDNN held to AVX2."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for x_shape, w_shape, stride, dilation, transposed, out_pad, groups in _conv_configs(60):
            out_channels = w_shape[1] * groups if transposed else w_shape[0]
            args = (
                torch.randn(x_shape, dtype=x_dtype),
                torch.randn(w_shape, dtype=w_dtype),
                torch.randn(out_channels, dtype=b_dtype),
                stride, [0] * len(stride), dilation, transposed, out_pad, groups,
            )  # fmt: skip
            real, predicted = _agree(args, aten.convolution)
            assert predicted == real, (x_shape, w_shape, stride, dilation, transposed, groups)
    finally:
        torch.set_num_threads(previous)


def _lng(grad: Any, x: Any, stats: Any, w: Any) -> tuple[Any, ...]:
    return (torch.randn(2, 8, dtype=grad), torch.randn(2, 8, dtype=x), [8],
            torch.randn(2, 1, dtype=stats), torch.randn(2, 1, dtype=stats),
            torch.randn(8, dtype=w), torch.randn(8, dtype=w), [True, True, True])  # fmt: skip


def _gng(dy: Any, x: Any, stats: Any, gamma: Any) -> tuple[Any, ...]:
    r = torch.randn
    return (r(2, 4, 3, dtype=dy), r(2, 4, 3, dtype=x), r(2, 2, dtype=stats),
            r(2, 2, dtype=stats), r(4, dtype=gamma), 2, 4, 3, 2, [True] * 3)  # fmt: skip


def _bng(grad: Any, x: Any, weight: Any, saved: Any) -> tuple[Any, ...]:
    r = torch.randn
    return (r(2, 4, 3, dtype=grad), r(2, 4, 3, dtype=x), r(4, dtype=weight), r(4), r(4).abs(),
            r(4, dtype=saved), r(4, dtype=saved).abs(), True, 1e-5, [True] * 3)  # fmt: skip


#: CPU backward kernels a training step's joint trace replays: name -> (op, args from three
#: floating dtypes).
BACKWARDS: dict[str, tuple[Any, Callable[[Any, Any, Any], tuple[Any, ...]]]] = {
    "glu_backward": (
        aten.glu_backward.default,
        lambda a, b, c: (torch.randn(2, 2, dtype=a), torch.randn(2, 4, dtype=b), -1),
    ),
    "log_sigmoid_backward": (
        aten.log_sigmoid_backward.default,
        lambda a, b, c: (torch.randn(4, dtype=a), torch.randn(4, dtype=b), torch.randn(4, dtype=c)),
    ),
    "nll_loss_backward": (
        aten.nll_loss_backward.default,
        lambda a, b, c: (
            torch.randn((), dtype=a),
            torch.randn(3, 5, dtype=b),
            torch.zeros(3, dtype=torch.long),
            torch.randn(5, dtype=c),
            1,
            -100,
            torch.randn((), dtype=b),
        ),
    ),
    "nll_loss_backward_total_weight": (
        aten.nll_loss_backward.default,
        lambda a, b, c: (
            torch.randn((), dtype=a),
            torch.randn(3, 5, dtype=b),
            torch.zeros(3, dtype=torch.long),
            None,
            1,
            -100,
            torch.randn((), dtype=c),
        ),
    ),
    "nll_loss2d_backward": (
        aten.nll_loss2d_backward.default,
        lambda a, b, c: (
            torch.randn((), dtype=a),
            torch.randn(3, 5, 2, 2, dtype=b),
            torch.zeros(3, 2, 2, dtype=torch.long),
            torch.randn(5, dtype=c),
            1,
            -100,
            torch.randn((), dtype=b),
        ),
    ),
    "group_norm_backward": (
        aten.native_group_norm_backward.default,
        lambda a, b, c: _gng(a, a, b, c),
    ),
    "group_norm_backward_dy": (
        aten.native_group_norm_backward.default,
        lambda a, b, c: _gng(a, b, F32, c),
    ),
    "batch_norm_backward": (
        aten.native_batch_norm_backward.default,
        lambda a, b, c: _bng(a, a, b, c),
    ),
    "batch_norm_backward_grad": (
        aten.native_batch_norm_backward.default,
        lambda a, b, c: _bng(a, b, F32, c),
    ),
    "layer_norm_backward": (
        aten.native_layer_norm_backward.default,
        lambda a, b, c: _lng(a, a, b, c),
    ),
    "layer_norm_backward_grad": (
        aten.native_layer_norm_backward.default,
        lambda a, b, c: _lng(a, b, F32, c),
    ),
}


@pytest.mark.parametrize("case", sorted(BACKWARDS))
def test_cpu_backward_every_dtype_triple(case: str) -> None:
    op, make = BACKWARDS[case]
    for a, b, c in itertools.product(FLOATS, repeat=3):
        real, predicted = _agree(make(a, b, c), op)
        assert predicted == real, (a, b, c)
