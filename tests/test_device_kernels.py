"""Kernel rules of one device (issue 33): the dtypes a kernel has there, CUDA's normalisation
rules, and torchvision's autocast wrappers (``ampgraph.annotate.device_kernels``).

On the CPU every rule is proven against the real kernel: each entry of the coverage table runs
for real in fp32 (it runs) and in the dtype the table says the kernel lacks (it raises the
table's message), and a model's prediction is the real run's error. CUDA's rules are read from
ATen's CUDA sources and tested here on fake CUDA tensors for the messages those sources print;
the ones a GPU showed (issue 33's H200) are asserted word for word.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import analyze
from ampgraph.annotate.device_kernels import (
    DEVICE_CHECKS,
    coverage_table,
    coverage_tables,
    cuda_batch_norm_elementwise,
    cuda_group_norm,
    dispatcher_refusal,
    no_device_kernel,
)
from ampgraph.annotate.replay import fake_mode
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.settings import Setting

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NAMES = {BF16: "BFloat16", F16: "Half"}
aten = torch.ops.aten


def _build(value: Any, dtype: torch.dtype) -> Any:
    """An argument of the table's ``call``, a real CPU tensor (floating ones in ``dtype``)."""
    if isinstance(value, list):
        return [_build(v, dtype) for v in value]
    if isinstance(value, dict) and "tensor" in value:
        want = getattr(torch, value["dtype"])
        if want.is_floating_point:
            return torch.randn(value["tensor"]).abs().add(0.5).to(dtype)
        if want == torch.bool:
            return torch.ones(value["tensor"], dtype=torch.bool)
        return torch.zeros(value["tensor"], dtype=want)
    if isinstance(value, dict) and set(value) == {"dtype"}:
        return getattr(torch, value["dtype"])
    if isinstance(value, dict):
        return {k: _build(v, dtype) for k, v in value.items()}
    return value


def _run(op: Any, call: list[Any], dtype: torch.dtype) -> str | None:
    torch.manual_seed(0)
    args, kwargs = _build(call, dtype)
    try:
        op(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        return str(exc).strip().splitlines()[0]
    return None


CPU_ENTRIES = sorted(coverage_table()["cpu"].items())


@pytest.mark.parametrize("name,entry", CPU_ENTRIES, ids=[n for n, _e in CPU_ENTRIES])
def test_cpu_coverage_entry_is_the_real_kernels_error(name: str, entry: dict[str, Any]) -> None:
    """Each overload the table says lacks a 16-bit dtype on the CPU runs for real in fp32, raises
    the table's message in that dtype, and the strict mode raises the same on fake tensors."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    op = getattr(getattr(aten, base), overload or "default")
    assert _run(op, entry["call"], F32) is None
    check = DEVICE_CHECKS[("cpu", op)]
    for dtype_name, message in entry["dtypes"].items():
        dtype = getattr(torch, dtype_name)
        real = _run(op, entry["call"], dtype)
        assert real == message.replace("{dtype}", NAMES[dtype]), (name, dtype)
        args, _kwargs = _build(entry["call"], dtype)
        assert check(tuple(args)) == real


def _mixed(value: Any, state: dict[str, bool]) -> Any:
    """The call's tensors, the first floating one 16-bit and the other floating ones fp32."""
    if isinstance(value, list):
        return [_mixed(v, state) for v in value]
    if isinstance(value, dict) and "tensor" in value and getattr(torch, value["dtype"]).is_floating_point:
        dtype, state["first"] = (state["low"] if state["first"] else F32), False
        return torch.randn(value["tensor"]).abs().add(0.5).to(dtype)
    if isinstance(value, dict) and "tensor" in value:
        return _build(value, F32)
    return _build(value, F32) if isinstance(value, dict) else value


@pytest.mark.parametrize("name,entry", CPU_ENTRIES, ids=[n for n, _e in CPU_ENTRIES])
def test_cpu_coverage_check_on_mixed_inputs_is_the_real_kernel(name: str, entry: dict[str, Any]) -> None:
    """A 16-bit first input beside fp32 ones: where the real kernel raises the table's error (it
    switches on its first input) the check raises it; where the real kernel runs (it computes in
    the common dtype) or raises another error first (a check of mixed inputs, not the kernel's
    dtypes), the check says nothing."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    op = getattr(getattr(aten, base), overload or "default")
    low = getattr(torch, sorted(entry["dtypes"])[0])
    args, kwargs = _mixed(entry["call"], {"first": True, "low": low})
    try:
        op(*args, **kwargs)
        real = None
    except Exception as exc:  # noqa: BLE001 - compared below
        real = str(exc).strip().splitlines()[0]
    message = entry["dtypes"][sorted(entry["dtypes"])[0]].replace("{dtype}", NAMES[low])
    predicted = DEVICE_CHECKS[("cpu", op)](tuple(args))
    assert predicted == (real if real == message else None), (name, real, predicted)


def test_the_installed_torch_has_a_coverage_table() -> None:
    """A new torch needs its own table (``scripts/kernel_coverage.py``): OpInfo's lists and the
    kernels change between releases (OpInfo gives CUDA's FFTs bf16 from 2.14 on)."""
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    tables = coverage_tables()
    assert version in tables
    assert coverage_table("1.0") == {"cpu": {}, "cuda": {}}
    newest = max(tables, key=lambda v: tuple(map(int, v.split("."))))
    assert coverage_table("99.0") is tables[newest]


class Pdist(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pdist(x)


def _errors(module: nn.Module, setting: Setting, x: torch.Tensor) -> list[str]:
    report = analyze(module, setting, args=(x,))
    return [r.error for r in report.nodes if r.error]


def test_pdist_on_16_bit_input_raises_on_each_device_as_its_kernel() -> None:
    """``torch.pdist`` of a bf16 input: the CPU's real kernel's error on the CPU, the wording
    the H200 showed on CUDA; before, both predicted a bf16 result."""
    x = torch.randn(4, 8)
    cpu = Setting.parse("autocast=off,params=bfloat16,inputs=bfloat16", device_type="cpu")
    try:
        torch.pdist(x.to(BF16))
    except RuntimeError as exc:
        real = str(exc).splitlines()[0]
    assert _errors(Pdist(), cpu, x) == [real] == ["\"pdist\" not implemented for 'BFloat16'"]
    cuda = Setting.parse("autocast=off,params=bfloat16,inputs=bfloat16", device_type="cuda")
    assert _errors(Pdist(), cuda, x) == ["\"pdist_cuda\" not implemented for 'BFloat16'"]


def test_cdist_past_25_rows_takes_matrix_products_on_the_real_cpu_kernel() -> None:
    """``_cdist_forward`` with p=2 and more than 25 rows never reaches the kernel that lacks
    bf16 (``cdist_impl``): the real call runs, and so does the prediction, on both devices."""
    x = torch.randn(30, 5, dtype=BF16)
    assert aten._cdist_forward(x, x, 2.0, None).dtype == BF16
    small = torch.randn(5, 5, dtype=BF16)
    for device, word in (("cpu", "cdist"), ("cuda", "cdist_cuda")):
        check = DEVICE_CHECKS[(device, aten._cdist_forward.default)]
        assert check((x, x, 2.0, None)) is None
        assert check((small, small, 2.0, None)) == f"\"{word}\" not implemented for 'BFloat16'"
    with pytest.raises(RuntimeError, match='"cdist" not implemented'):
        aten._cdist_forward(small, small, 2.0, None)


# -- CUDA normalisations -------------------------------------------------------------------------
def _fake(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="cuda")


def _cuda_outcome(fn: Any, *specs: tuple[tuple[int, ...], torch.dtype]) -> str:
    with fake_mode(), StrictDtypeMode("cuda"):
        tensors = [_fake(shape, dtype) for shape, dtype in specs]
        try:
            out = fn(*tensors)
        except RuntimeError as exc:
            return str(exc).splitlines()[0]
    return f"ok {out.dtype}"


X4, C = (2, 4, 5, 5), (4,)


@pytest.mark.parametrize(
    "x,w,b,want",
    [
        # batch_norm_elemt_cuda_template: the parameters read as acc_type (mixed) or the input's type
        (F32, BF16, BF16, "Expected weight to have type Float but got BFloat16"),
        (F16, BF16, BF16, "Expected weight to have type Float but got BFloat16"),
        (BF16, F32, F32, "ok torch.bfloat16"),
        (BF16, BF16, F32, "Expected bias to have type BFloat16 but got Float"),
        (BF16, BF16, BF16, "ok torch.bfloat16"),
    ],
)
def test_cuda_batch_norm_contiguous_rule(x: Any, w: Any, b: Any, want: str) -> None:
    for training in (False, True):
        got = _cuda_outcome(
            lambda x_, w_, b_: F.batch_norm(x_, w_.clone(), w_.clone(), w_, b_, training=training),
            (X4, x), (C, w), (C, b),
        )
        assert got == want


def test_cuda_batch_norm_2d_input_takes_the_channels_last_kernel() -> None:
    """A 2-D input (``BatchNorm1d`` after a ``Linear``) has stride 1 on its channels: the
    channels-last kernel reads the parameters with ``const_data_ptr``."""
    got = _cuda_outcome(lambda x, w: F.batch_norm(x, w.clone(), w.clone(), w, w), ((8, 4), F32), (C, BF16))
    assert got == "expected scalar type Float but found BFloat16"
    assert cuda_batch_norm_elementwise(torch.empty(8, 4, dtype=BF16), torch.empty(4), torch.empty(4)) is None
    # A non-contiguous input takes the General kernel, a TensorIterator that casts.
    strided = torch.empty(2, 4, 5, 10)[..., ::2]
    assert cuda_batch_norm_elementwise(strided, torch.empty(4, dtype=BF16), None) is None


def test_cuda_fp16_batch_norm_takes_cudnn_and_its_checks() -> None:
    """fp16 and fp32 mixes go to cuDNN (``_batch_norm_impl_index``), whose ``checkAllSameType``
    refuses an fp32 input beside fp16 weights and takes an fp16 input with fp32 ones."""
    bn = lambda x, w, b: F.batch_norm(x, w.clone(), w.clone(), w, b)  # noqa: E731
    assert _cuda_outcome(bn, (X4, F32), (C, F16), (C, F16)) == (
        "Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 "
        "'weight'; but type torch.cuda.FloatTensor does not equal torch.cuda.HalfTensor (while "
        "checking arguments for cudnn_batch_norm)"
    )
    assert _cuda_outcome(bn, (X4, F16), (C, F32), (C, F32)) == "ok torch.float16"


def test_cuda_instance_norm_is_batch_norm_underneath() -> None:
    got = _cuda_outcome(lambda x, w: F.instance_norm(x, None, None, w, w), (X4, F32), (C, BF16))
    assert got == "Expected weight to have type Float but got BFloat16"


@pytest.mark.parametrize(
    "x,w,shape,want",
    [
        (F32, BF16, X4, "mixed dtype (CPU): expect parameter to have scalar type of Float"),
        (BF16, F32, X4, "expected scalar type BFloat16 but found Float"),  # fp32 mean read as T
        (F32, F32, X4, "ok torch.float32"),
        (BF16, BF16, X4, "ok torch.bfloat16"),
    ],
)
def test_cuda_group_norm_rule(x: Any, w: Any, shape: Any, want: str) -> None:
    assert _cuda_outcome(lambda x_, w_: F.group_norm(x_, 2, w_, w_), (shape, x), (C, w)) == want


def test_cuda_group_norm_unmixed_bias_of_another_dtype() -> None:
    x, w, b = torch.empty(X4, dtype=BF16), torch.empty(4, dtype=BF16), torch.empty(4)
    assert cuda_group_norm((x, w, b, 2, 4, 25, 2, 1e-5)) == "expected scalar type BFloat16 but found Float"
    x1 = torch.empty(2, 4, 1, 1, dtype=BF16)  # H*W == 1: GroupNorm1dForward's TensorIterator
    assert cuda_group_norm((x1, w, b, 2, 4, 1, 2, 1e-5)) == "Found dtype Float but expected BFloat16"
    assert cuda_group_norm((x1, w, b, 0, 4, 1, 2, 1e-5)) is None  # N == 0 returns first


def test_cuda_layer_norm_reads_its_parameters_as_the_input() -> None:
    """``LayerNormKernelImplInternal<T>`` reads gamma and beta as T; the H200's message."""
    got = _cuda_outcome(lambda x, w: F.layer_norm(x, (4,), w, w), ((2, 4), F32), (C, BF16))
    assert got == "expected scalar type Float but found BFloat16"


def test_cuda_layer_norm_rule_without_rows() -> None:
    """The rule itself (older torch releases' fake kernels lack it): no rows, no read."""
    from ampgraph.annotate.device_kernels import cuda_layer_norm

    w = torch.empty(4, dtype=BF16)
    assert cuda_layer_norm((torch.empty(2, 4), [4], w, w)) == "expected scalar type Float but found BFloat16"
    assert cuda_layer_norm((torch.empty(0, 4), [4], w, w)) is None
    assert cuda_layer_norm((torch.empty(2, 4, dtype=BF16), [4], w, None)) is None


class GroupThenBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gn, self.bn = nn.GroupNorm(2, 4), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.gn(x))


def test_group_norm_then_batch_norm_under_cuda_autocast_raises_at_the_batch_norm() -> None:
    """Issue 33's H200 case: GroupNorm (autocast's fp32 list) hands BatchNorm an fp32 input
    beside bf16 parameters."""
    report = analyze(GroupThenBatch().eval(), "amp-half", args=(torch.randn(2, 4, 5, 5),))
    failing = [r for r in report.nodes if r.error]
    assert [r.op for r in failing] == ["aten.batch_norm.default"]
    assert failing[0].error == "Expected weight to have type Float but got BFloat16"


def test_group_norm_then_batch_norm_on_the_cpu_is_the_real_run() -> None:
    """The CPU counterpart, against the real CPU kernels under CPU autocast."""
    model, x = GroupThenBatch().eval(), torch.randn(2, 4, 5, 5)
    setting = Setting.parse("amp-half", device_type="cpu")
    real = None
    try:
        with torch.autocast("cpu", dtype=BF16):
            GroupThenBatch().eval().to(BF16)(x)
    except RuntimeError as exc:
        real = str(exc).splitlines()[0]
    # Here the CPU's own mixed check raises (mixed_dtypes.h), with the CPU's words.
    assert real == "mixed dtype (CPU): expect parameter to have scalar type of Float"
    assert _errors(model, setting, x) == [real]


# -- torchvision's autocast wrappers -------------------------------------------------------------
TV_OPS = ["roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool", "deform_conv2d"]


class TvCall(nn.Module):
    """One torchvision op on the input, its boxes (and a deformable kernel) buffers in fp32."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.register_buffer("rois", torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]]))
        self.register_buffer("offset", torch.zeros(1, 18, 6, 6))
        self.register_buffer("mask", torch.zeros(1, 1))  # unused (use_mask=False), as torchvision's
        self.register_buffer("bias", torch.zeros(4))
        self.weight = nn.Parameter(torch.randn(4, 4, 3, 3))

    def extra(self) -> tuple[Any, ...]:
        return {
            "roi_align": (self.rois, 1.0, 2, 2, -1, False),
            "roi_pool": (self.rois, 1.0, 2, 2),
            "ps_roi_align": (self.rois, 1.0, 2, 2, -1),
            "ps_roi_pool": (self.rois, 1.0, 2, 2),
            # (input, weight, offset, mask, bias, stride, pad, dilation, groups, use_mask)
            "deform_conv2d": (self.weight, self.offset, self.mask, self.bias,
                              1, 1, 0, 0, 1, 1, 1, 1, False),
        }[self.op]  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        return getattr(torch.ops.torchvision, self.op)(x, *self.extra())


@pytest.mark.parametrize("op", TV_OPS)
def test_torchvision_autocast_wrappers_return_the_inputs_dtype(op: str) -> None:
    """The CUDA autocast wrapper's own code (``torchvision/_autograd_registrations.py``), run on
    CPU tensors with the CPU kernels inside, returns every output in the input's dtype (the
    index outputs of ``roi_pool`` and the ``ps_`` ops too); ampgraph predicts the same dtypes under
    CUDA autocast (the H200 saw it for the first three)."""
    pytest.importorskip("torchvision.ops")
    # torchvision 0.29 writes these wrappers in Python; 0.25 and 0.26 (torch 2.10, 2.11) in
    # C++ (csrc/ops/autocast/), which this test cannot call on CPU tensors: skipped there.
    reg = pytest.importorskip("torchvision._autograd_registrations")

    module, x = TvCall(op), torch.randn(1, 4, 8, 8, dtype=BF16)
    out = getattr(reg, f"_autocast_{op}")(x, *module.extra())
    real = [str(t.dtype).removeprefix("torch.") for t in (out if isinstance(out, tuple) else (out,))]
    assert real == ["bfloat16"] * len(real)
    report = analyze(module, "amp-fp32", args=(x,))
    node = next(r for r in report.nodes if r.op.startswith(f"torchvision.{op}"))
    assert node.policy == "fp32_output_as_input"
    assert node.outputs == real


class _Dispatched(TorchDispatchMode):
    """Every op that reaches the dispatcher while it lasts."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_dispatchers_refusal_is_built_from_its_table_without_running_the_op() -> None:
    """``aten::mm.dtype`` has no CPU kernel: the message is the real dispatcher's, word for word,
    and building it dispatches nothing (a call to get it crashed the process once)."""
    mm_dtype = torch.ops.aten.mm.dtype
    assert no_device_kernel("cpu", mm_dtype)
    with _Dispatched() as dispatched:
        built = dispatcher_refusal(mm_dtype, "cpu")
    assert dispatched.ops == []
    one = torch.zeros(1, 1, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError) as real:  # NotImplementedError where torch says so
        mm_dtype(one, one, torch.float32)
    assert built == str(real.value)
