"""The kernel rules an H100 showed (issue 33), and the CPU side of each where the CPU shares it.

CUDA rules cannot run here: each is checked as ampgraph predicts the call on fake CUDA tensors
(``fake_session``, as ``scripts/gpu_survey.py`` replays it) against what the H100 ran, read from
its record (``docs/verification/h100-2026-11-26/survey-first-b97ead5.json``, ``record["ops"]["parting"]``: torch
2.11.0+cu130), by the call's own line there. Rules the CPU shares are proven on the real CPU
kernels, every dtype mix.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ampgraph.annotate.device_kernels import DEVICE_CHECKS, coverage_table, iterator_dtype
from ampgraph.annotate.replay import fake_session
from ampgraph.compat import torch_release
from ampgraph.settings import Setting

from .conftest import ROOT

aten = torch.ops.aten
F32, BF16, F16, I32, I64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64
BOOL = torch.bool
SHORT = {F32: "f32", BF16: "bf16", F16: "f16"}
#: The H100's records: the first survey (``h100-2026-11-26/survey-first-b97ead5.json``, ampgraph
#: b97ead5) and the second, of the ops these rules touch (``cuda-survey-rules.json``, ampgraph 55161eb, where only
#: ``index_put`` with integer indices still parted).
RECORDS = [
    json.loads((ROOT / "docs" / "verification" / name).read_text())
    for name in ("h100-2026-11-26/survey-first-b97ead5.json", "cuda-survey-rules.json")
]
H100 = {(e["op"], e["call"]): e for record in RECORDS for e in record["ops"]["parting"]}


def _describe(fn: Callable[[], Any]) -> str:
    """A call's outcome as the survey writes it: ``-> bf16`` or ``raises `message```."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lu_solve's deprecation
            out = fn()
    except Exception as exc:  # noqa: BLE001 - the error is the outcome
        lines = str(exc).strip().splitlines()
        return f"raises `{(lines[0] if lines else type(exc).__name__)[:200]}`"
    leaves = out if isinstance(out, tuple) else (out,)
    return "-> " + ", ".join(SHORT.get(t.dtype, str(t.dtype)) for t in leaves)


def _values(specs: tuple[Any, ...], device: str) -> list[Any]:
    """``(shape, dtype)`` -> a tensor of ``device`` (int tensors zero, masks true), else as is."""
    out = []
    for s in specs:
        if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], torch.dtype):
            shape, dtype = s
            if dtype.is_floating_point:
                out.append(torch.rand(shape, device=device).add(0.5).to(dtype))
            else:
                out.append(torch.ones(shape, dtype=dtype, device=device) if dtype == BOOL
                           else torch.zeros(shape, dtype=dtype, device=device))  # fmt: skip
        else:
            out.append(s)
    return out


def predicted(device: str, fn: Callable[..., Any], specs: tuple[Any, ...]) -> str:
    """ampgraph's prediction: the call on fake tensors of ``device`` in ``fake_session``."""
    with fake_session(Setting.parse("fp32", device_type=device)):
        return _describe(lambda: fn(*_values(specs, device)))


def real_cpu(fn: Callable[..., Any], specs: tuple[Any, ...]) -> str:
    return _describe(lambda: fn(*_values(specs, "cpu")))


def _index_put(x: torch.Tensor, mask: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return x.index_put((mask,), v, accumulate=True)


def _grid(align: bool, padding: str = "zeros") -> Callable[..., torch.Tensor]:
    return lambda x, g: F.grid_sample(x, g, mode="bilinear", padding_mode=padding,
                                      align_corners=align)  # fmt: skip


POLYNOMIALS = [f"special.{n}" for n in (
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
    "laguerre_polynomial_l", "legendre_polynomial_p", "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
)]  # fmt: skip


def _torch_fn(name: str) -> Callable[..., Any]:
    fn: Any = torch
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


#: (the record's op, the record's call, the function, its arguments as (shape, dtype) specs).
CASES: list[tuple[str, str, Callable[..., Any], tuple[Any, ...]]] = [
    # strict, coverage over-applied: a pointwise kernel computes in the promoted dtype.
    ("special.zeta", "special.zeta(bf16[], f32[])", torch.special.zeta, (((), BF16), ((), F32))),
    ("igamma", "igamma(bf16[], f32[])", torch.igamma, (((), BF16), ((), F32))),
    ("igammac", "igammac(f16[5, 1], f32[5])", torch.igammac, (((5, 1), F16), ((5,), F32))),
    *[(n, f"{n}(bf16[], f32[])", _torch_fn(n), (((), BF16), ((), F32))) for n in POLYNOMIALS],
    # strict, coverage over-applied: empty inputs return before the kernel.
    (
        "lu_solve",
        "lu_solve(bf16[3, 0], bf16[3, 3], int32[3])",
        torch.lu_solve,
        (((3, 0), BF16), ((3, 3), BF16), ((3,), I32)),
    ),
    (
        "lu_solve",
        "lu_solve(f16[0, 3, 4], f16[0, 3, 3], int32[0, 3])",
        torch.lu_solve,
        (((0, 3, 4), F16), ((0, 3, 3), F16), ((0, 3), I32)),
    ),
    (
        "linalg.solve",
        "linalg.solve(bf16[0, 5, 5], bf16[0, 5])",
        torch.linalg.solve,
        (((0, 5, 5), BF16), ((0, 5), BF16)),
    ),
    (
        "linalg.solve_ex",
        "linalg.solve_ex(f16[0, 5, 5], f16[0, 5])",
        torch.linalg.solve_ex,
        (((0, 5, 5), F16), ((0, 5), F16)),
    ),
    # strict, other.
    (
        "addmv",
        "addmv(bf16[5], f32[5, 10], f32[10], beta=1, alpha=1)",
        torch.addmv,
        (((5,), BF16), ((5, 10), F32), ((10,), F32)),
    ),
    (
        "addmv",
        "addmv(f32[5], f16[5, 10], f16[10], beta=1, alpha=1)",
        torch.addmv,
        (((5,), F32), ((5, 10), F16), ((10,), F16)),
    ),
    # (the second survey's record: CUDA's sort kernel reads the destination as the value's type)
    (
        "index_put",
        "index_put(bf16[5, 5], (int64[2],), f32[2, 5], accumulate=True)",
        _index_put,
        (((5, 5), BF16), ((2,), I64), ((2, 5), F32)),
    ),
    (
        "index_put",
        "index_put(f32[5, 5], (int64[2],), f16[2, 5], accumulate=True)",
        _index_put,
        (((5, 5), F32), ((2,), I64), ((2, 5), F16)),
    ),
    # lenient: CUDA's own checks.
    (
        "addbmm",
        "addbmm(bf16[5, 10], f32[5, 5, 5], f32[5, 5, 10], beta=1, alpha=1)",
        torch.addbmm,
        (((5, 10), BF16), ((5, 5, 5), F32), ((5, 5, 10), F32)),
    ),
    (
        "addbmm",
        "addbmm(f32[1], bf16[5, 5, 5], f32[5, 5, 10], beta=1, alpha=1)",
        torch.addbmm,
        (((1,), F32), ((5, 5, 5), BF16), ((5, 5, 10), F32)),
    ),
    (
        "bmm",
        "bmm(bf16[10, 5, 10], f32[10, 10, 5])",
        torch.bmm,
        (((10, 5, 10), BF16), ((10, 10, 5), F32)),
    ),
    (
        "bmm",
        "bmm(f32[10, 5, 10], f16[10, 10, 5])",
        torch.bmm,
        (((10, 5, 10), F32), ((10, 10, 5), F16)),
    ),
    (
        "cdist",
        "cdist(f32[5, 5, 2], bf16[5, 6, 2], 0, use_mm_for_euclid_dist)",
        lambda a, b: torch.cdist(a, b, 0, "use_mm_for_euclid_dist"),
        (((5, 5, 2), F32), ((5, 6, 2), BF16)),
    ),
    ("cross", "cross(bf16[5, 3], f32[5, 3])", torch.cross, (((5, 3), BF16), ((5, 3), F32))),
    (
        "linalg.cross",
        "linalg.cross(f32[5, 3, 5], f16[5, 3, 5], dim=1)",
        lambda a, b: torch.linalg.cross(a, b, dim=1),
        (((5, 3, 5), F32), ((5, 3, 5), F16)),
    ),
    (
        "_softmax_backward_data",
        "_softmax_backward_data(bf16[5], f32[5], 0, torch.float32)",
        aten._softmax_backward_data,
        (((5,), BF16), ((5,), F32), 0, F32),
    ),
    (
        "_softmax_backward_data",
        "_softmax_backward_data(f32[5, 5], bf16[5, 5], 0, torch.float32)",
        aten._softmax_backward_data,
        (((5, 5), F32), ((5, 5), BF16), 0, F32),
    ),
    (
        "_softmax_backward_data",
        "_softmax_backward_data(f16[5], f16[5], 0, torch.float32)",
        aten._softmax_backward_data,
        (((5,), F16), ((5,), F16), 0, F32),
    ),
    (
        "einsum",
        "einsum([bf16[2, 3], f32[1, 3]], ij,kj->ik)",
        lambda a, b: torch.einsum("ij,kj->ik", a, b),
        (((2, 3), BF16), ((1, 3), F32)),
    ),
    (
        "einsum",
        "einsum([f32[1, 2, 3], f16[1, 3, 4]], aij,ajk->aik)",
        lambda a, b: torch.einsum("aij,ajk->aik", a, b),
        (((1, 2, 3), F32), ((1, 3, 4), F16)),
    ),
    (
        "nn.functional.grid_sample",
        (
            "nn.functional.grid_sample(bf16[2, 3, 5, 5], f32[2, 5, 5, 2], "
            "mode=bilinear, padding_mode=zeros, align_corners=False)"
        ),
        _grid(False),
        (((2, 3, 5, 5), BF16), ((2, 5, 5, 2), F32)),
    ),
    (
        "nn.functional.grid_sample",
        (
            "nn.functional.grid_sample(f16[2, 3, 5, 5], f32[2, 5, 5, 2], "
            "mode=bilinear, padding_mode=zeros, align_corners=True)"
        ),
        _grid(True),
        (((2, 3, 5, 5), F16), ((2, 5, 5, 2), F32)),
    ),
    (
        "nn.functional.grid_sample",
        (
            "nn.functional.grid_sample(f32[2, 3, 5, 5], f16[2, 5, 5, 2], "
            "mode=bilinear, padding_mode=border, align_corners=True)"
        ),
        _grid(True, "border"),
        (((2, 3, 5, 5), F32), ((2, 5, 5, 2), F16)),
    ),
    (
        "grid_sampler_2d",
        "grid_sampler_2d(bf16[2, 3, 5, 20], f32[2, 13, 10, 2], 0, 0, False)",
        torch.grid_sampler_2d,
        (((2, 3, 5, 20), BF16), ((2, 13, 10, 2), F32), 0, 0, False),
    ),
    (
        "grid_sampler_3d",
        "grid_sampler_3d(f32[1, 1, 2, 2, 2], f16[1, 1, 1, 1, 3], 0, 0, False)",
        torch.grid_sampler_3d,
        (((1, 1, 2, 2, 2), F32), ((1, 1, 1, 1, 3), F16), 0, 0, False),
    ),
    (
        "nn.functional.nll_loss",
        "nn.functional.nll_loss(bf16[2, 3], int64[2], weight=f32[3], reduction=none)",
        lambda x, t, w: F.nll_loss(x, t, weight=w, reduction="none"),
        (((2, 3), BF16), ((2,), I64), ((3,), F32)),
    ),
    (
        "nn.functional.nll_loss",
        "nn.functional.nll_loss(f32[2, 3], int64[2], ignore_index=1, reduction=none, weight=f16[3])",
        lambda x, t, w: F.nll_loss(x, t, ignore_index=1, reduction="none", weight=w),
        (((2, 3), F32), ((2,), I64), ((3,), F16)),
    ),
    # dtype: the target's dtype wins.
    (
        "nn.functional.binary_cross_entropy_with_logits",
        "nn.functional.binary_cross_entropy_with_logits(f32[5, 5], bf16[5, 5])",
        F.binary_cross_entropy_with_logits,
        (((5, 5), F32), ((5, 5), BF16)),
    ),
]


@pytest.mark.parametrize("op,call,fn,specs", CASES, ids=[c[1] for c in CASES])
def test_fake_cuda_prediction_is_what_the_h100_ran(op: str, call: str, fn: Any, specs: Any) -> None:
    """Each call where the H100's kernel and ampgraph parted: ampgraph now predicts the H100's
    outcome (its dtype, or its error word for word)."""
    if op == "addmv" and torch_release() >= (2, 12):
        pytest.skip("from torch 2.12 on addmv's meta function refuses the mix on every device")
    real = H100[(op, call)]["real"]
    assert predicted("cuda", fn, specs) == real


def test_addmv_on_the_installed_torch_is_the_real_cpu_kernel() -> None:
    """addmv's dtype rule is torch's, not a device's: every mix of the three, real CPU kernel
    against the prediction on fake CPU tensors (2.10, 2.11 copy ``self`` into ``vec``'s dtype
    and read ``vec`` as ``mat``; 2.12 on refuse any mix)."""
    for dtypes in [(a, b, c) for a in (BF16, F32) for b in (BF16, F32) for c in (BF16, F32)]:
        specs = (((5,), dtypes[0]), ((5, 10), dtypes[1]), ((10,), dtypes[2]))
        assert predicted("cpu", torch.addmv, specs) == real_cpu(torch.addmv, specs), dtypes
        mv = (((5, 10), dtypes[1]), ((10,), dtypes[2]))
        assert predicted("cpu", torch.mv, mv) == real_cpu(torch.mv, mv), dtypes


def _binary_pointwise_entries() -> list[str]:
    names = []
    for name in coverage_table()["cpu"]:
        base, _, overload = name.removeprefix("aten::").partition(".")
        op = getattr(getattr(aten, base), overload or "default")
        if torch.Tag.pointwise in op.tags and len(op._schema.arguments) == 2:
            names.append(name)
    return sorted(names)


SHAPES = [((), ()), ((5,), ()), ((), (5,)), ((5,), (5,))]


@pytest.mark.parametrize("name", _binary_pointwise_entries())
def test_cpu_pointwise_coverage_follows_the_promoted_dtype(name: str) -> None:
    """A binary pointwise op with no 16-bit CPU kernel, every shape (zero-dimensional or not)
    and dtype mix: the coverage check raises exactly where the real CPU kernel does."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    op = getattr(getattr(aten, base), overload or "default")
    check = DEVICE_CHECKS[("cpu", op)]
    for (sa, sb), (da, db) in [(s, d) for s in SHAPES
                               for d in ((BF16, F32), (F32, BF16), (F16, F32), (BF16, BF16))]:  # fmt: skip
        a, b = torch.rand(sa).add(0.5).to(da), torch.rand(sb).add(0.5).to(db)
        try:
            op(a, b)
            real = None
        except RuntimeError as exc:
            real = str(exc).splitlines()[0]
        assert check((a, b)) == real, (name, sa, sb, da, db)


def test_iterator_dtype_is_result_type() -> None:
    for sa, sb in SHAPES:
        for da, db in ((BF16, F32), (F32, F16), (F16, BF16)):
            a, b = torch.empty(sa, dtype=da), torch.empty(sb, dtype=db)
            assert iterator_dtype([a, b]) == torch.result_type(a, b)


EMPTY_CPU: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
    (torch.linalg.solve, (((0, 5, 5), BF16), ((0, 5), BF16))),
    (torch.linalg.solve_ex, (((0, 5, 5), F16), ((0, 5), F16))),
    (torch.linalg.solve, (((2, 5, 5), BF16), ((2, 5), BF16))),  # not empty: the kernel raises
    (torch.lu_solve, (((3, 0), BF16), ((3, 3), BF16), ((3,), I32))),
    (torch.lu_solve, (((0, 3, 4), F16), ((0, 3, 3), F16), ((0, 3), I32))),
]


@pytest.mark.parametrize("fn,specs", EMPTY_CPU)
def test_empty_solves_return_before_the_kernel_on_the_cpu(fn: Any, specs: Any) -> None:
    assert predicted("cpu", fn, specs) == real_cpu(fn, specs)


def test_index_put_of_one_cpu_value_under_a_mask_is_a_masked_fill_on_every_device() -> None:
    """``canDispatchToMaskedFill``: a one-element CPU value under one boolean mask, without
    ``accumulate``, takes any dtype (real CPU kernel); a value of several elements does not."""
    for value in (((), F32), ((1,), F32), ((5,), F32)):
        specs = (((5, 5), BF16), ((5,), BOOL), value)

        def fn(x: torch.Tensor, mask: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return x.index_put((mask,), v)

        assert predicted("cpu", fn, specs) == real_cpu(fn, specs), value


def test_cuda_index_put_accumulate_launches_nothing_for_an_empty_index() -> None:
    """The sort kernel is not launched where nothing is indexed (so OpInfo's all-false mask ran
    on the H100, ``index_put(bf16[5, 5], (bool[5],), f32[5], accumulate=True) -> bf16`` in
    ``h100-2026-11-26/survey-first-b97ead5.json``); a mask's contents are data, so a mask is taken to select something."""
    line = H100[("index_put", "index_put(bf16[5, 5], (bool[5],), f32[5], accumulate=True)")]
    assert line["real"] == "-> bf16"
    empty = (((5, 5), BF16), ((0,), I64), ((0, 5), F32))
    assert predicted("cuda", _index_put, empty) == "-> bf16"
    mask = (((5, 5), BF16), ((5,), BOOL), ((5,), F32))
    assert (
        predicted("cuda", _index_put, mask)
        == "raises `expected scalar type Float but found BFloat16`"
    )


def test_index_put_accumulate_of_another_dtype_raises_on_the_cpu() -> None:
    specs = (((5, 5), BF16), ((5,), BOOL), ((5,), F32))
    assert predicted("cpu", _index_put, specs) == real_cpu(_index_put, specs)
    assert real_cpu(_index_put, specs).startswith("raises `Index put requires")


@pytest.mark.parametrize("pos_weight", [False, True])
@pytest.mark.parametrize("dtypes", [(F32, BF16), (BF16, F32), (F32, F16), (F16, F16)])
def test_bce_with_logits_is_the_real_cpu_kernels_dtype(dtypes: Any, pos_weight: bool) -> None:
    """``(1 - target).mul_(input)...``: the target's dtype, on every device's kernel."""
    specs: tuple[Any, ...] = (((4, 5), dtypes[0]), ((4, 5), dtypes[1]))
    if pos_weight:
        specs = (*specs, ((5,), F32))

    def fn(x: torch.Tensor, t: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(x, t, pos_weight=w[0] if w else None)

    assert predicted("cpu", fn, specs) == real_cpu(fn, specs)


EUCLIDEAN = [
    ((5, 5), (6, 5)),
    ((2, 5, 5), (2, 6, 5)),
    ((2, 30, 5), (2, 30, 5)),
    ((3, 40, 3), (3, 2, 3)),
]


@pytest.mark.parametrize("shapes", EUCLIDEAN)
def test_cdist_by_matrix_products_of_two_dtypes_is_the_real_cpu_kernel(shapes: Any) -> None:
    """``cdist`` p=2 by matrix products (``_euclidean_dist``): ``mm`` for 2-D inputs, ``bmm`` on
    the path its shapes take for batches, every dtype mix, against the real CPU kernel."""

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist")

    for da, db in ((F32, BF16), (BF16, F32), (F16, F32), (BF16, F16)):
        specs = ((shapes[0], da), (shapes[1], db))
        assert predicted("cpu", fn, specs) == real_cpu(fn, specs), (shapes, da, db)


def test_cdist_by_matrix_products_on_fake_cuda_takes_cudas_mm_and_bmm_wording() -> None:
    """On CUDA the same products raise ``mm``'s and ``bmm``'s CUDA messages (not yet seen on a
    GPU for ``cdist``: ``--ops cdist`` or a model would show it)."""

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist")

    two = predicted("cuda", fn, (((5, 5), F32), ((6, 5), BF16)))
    assert (
        two
        == "raises `expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16`"
    )
    three = predicted("cuda", fn, (((2, 5, 5), F32), ((2, 6, 5), BF16)))
    assert three == "raises `expected scalar type Float but found BFloat16`"


class _MaskScalar(torch.nn.Module):
    """``h.index_put((mask,), torch.tensor(1.0))`` on a 16-bit ``h``: the survey's case
    ``index-put-mask-scalar``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x.to(self.lin.weight.dtype))
        return h.index_put((h[:, 0] > 0,), torch.tensor(1.0))


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_a_cpu_constant_the_forward_makes_stays_on_the_cpu(device_type: str) -> None:
    """The one-element value is made on the CPU in the forward and stays there on a GPU, so
    index_put takes the masked fill and runs (the H100's latest survey, case
    index-put-mask-scalar in ``half``: the replay had put the lifted constant on the GPU and
    raised the dtype check). The real CPU kernel runs it too."""
    from ampgraph import analyze
    from ampgraph.settings import Setting

    module = _MaskScalar()
    real = module.to(BF16)(torch.randn(4, 8))
    report = analyze(_MaskScalar(), Setting.parse("half", device_type=device_type),
                     args=(torch.randn(4, 8),))  # fmt: skip
    node = next(r for r in report.nodes if r.op == "aten.index_put.default")
    assert (node.error, node.outputs) == (None, [str(real.dtype).removeprefix("torch.")])
