"""The dtype errors real kernels raise and fake (meta) kernels skip, with the real messages.

Fake tensors decide dtypes with meta functions, and many of them do not validate dtypes the way
the real kernels do: a CUDA ``mm`` of an fp32 input and a bf16 weight runs on fake tensors and
raises on a GPU (``nn.Linear(..., bias=False)`` in the ``half`` setting), a CPU ``index_add``
of a bf16 source into an fp32 buffer runs on fake tensors and raises on a CPU (a scatter-style
pooling under autocast). :class:`StrictDtypeMode` raises those errors, with the real kernel's
message, before the fake kernel runs.

:data:`STRICT_CHECKS` is the table, ``(device type, op) -> check``. Each check says in its
docstring where PyTorch makes it. A check is registered for CUDA only where the source puts it
in code both devices run (a structured kernel's ``TORCH_META_FUNC``, a device-generic native
function, ``TensorIterator``) or in CUDA's own kernel; the CPU entries are proven against real
CPU kernels, every dtype pair, by ``tests/test_strict_dtypes.py`` and
``tests/test_fake_kernels.py`` (no false errors either). ``scripts/fake_kernel_survey.py`` looks
for the checks still missing over torch's OpInfo database (``docs/fake-kernels.md``). The
indexing checks are :mod:`ampgraph.annotate.index_checks`'s, the checks only CUDA's kernels make
:mod:`ampgraph.annotate.cuda_kernels`'s.

>>> import torch
>>> check = STRICT_CHECKS[("cuda", torch.ops.aten.mm.default)]
>>> check((torch.empty(2, 3), torch.empty(3, 4, dtype=torch.bfloat16)))
'expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.annotate import cpu_backend, cpu_bmm
from ampgraph.annotate.cuda_kernels import CUDA_CHECKS
from ampgraph.annotate.device_kernels import (
    DEVICE_CHECKS,
    dispatcher_refusal,
    no_device_kernel,
)
from ampgraph.annotate.index_checks import INDEX_CHECKS
from ampgraph.annotate.kernel_dtypes import CPU_NORM_BACKWARD_CHECKS, CPU_NORM_PARAMS
from ampgraph.annotate.library_checks import library_check
from ampgraph.annotate.scalars import KEYWORD_CHECKED, SCALAR_CHECKS
from ampgraph.compat import addmv_meta_checks_dtypes, guard_or_true
from ampgraph.torchutil import scalar_type_name as _st

aten = torch.ops.aten

Check = Callable[[tuple[Any, ...]], str | None]

# caffe2::TypeMeta names (how TORCH_CHECK prints a dtype(); a scalar_type() is
# torchutil.scalar_type_name's).
_TYPE_META = {
    torch.float32: "float", torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half",
    torch.float64: "double", torch.int64: "long int", torch.int32: "int", torch.bool: "bool",
}  # fmt: skip
# Tensor::toString(): the legacy type name where one exists, else backend + scalar type + "Type".
_LEGACY = {torch.float32: "FloatTensor", torch.float16: "HalfTensor", torch.float64: "DoubleTensor"}



def _tm(t: torch.Tensor) -> str:
    return _TYPE_META.get(t.dtype, str(t.dtype))


def _type_string(t: torch.Tensor, device_type: str) -> str:
    legacy = _LEGACY.get(t.dtype)
    if legacy is not None:
        return f"torch.cuda.{legacy}" if device_type == "cuda" else f"torch.{legacy}"
    return f"{device_type.upper()}{_st(t)}Type"


def _tensor(v: Any) -> torch.Tensor | None:
    return v if isinstance(v, torch.Tensor) else None


def _data_ptr(expected: torch.Tensor, found: torch.Tensor) -> str | None:
    """``Tensor::data_ptr<scalar_t>()`` on a tensor of another dtype (kernels that dispatch on
    one argument's type and read the others as that type)."""
    if found.dtype != expected.dtype:
        return f"expected scalar type {_st(expected)} but found {_st(found)}"
    return None


# -- the matmul family --------------------------------------------------------------------------
def _addmm(args: tuple[Any, ...]) -> str | None:
    """``ADDMM_META()`` in ``LinearAlgebra.cpp``, the structured meta function of ``addmm`` and
    ``_addmm_activation`` on every device (``F.linear`` with a bias on 2-D or contiguous 3-D
    input); ``addbmm``'s per-batch ``addmm_`` reaches it too, on the CPU and on CUDA (an H100's
    messages, ``docs/verification/cuda-survey.json``)."""
    self, mat1, mat2 = args[:3]
    if self.dtype != mat2.dtype:
        return f"self and mat2 must have the same dtype, but got {_st(self)} and {_st(mat2)}"
    if mat1.dtype != mat2.dtype:
        return f"mat1 and mat2 must have the same dtype, but got {_st(mat1)} and {_st(mat2)}"
    return None


def _mm(device_type: str) -> Check:
    """``mm`` (``F.linear`` without a bias, 2-D ``matmul``): ``addmm_impl_cpu_`` on the CPU
    ("m1 and m2"), ``addmm_out_cuda_impl`` in ``cuda/Blas.cpp`` on CUDA ("mat1 and mat2"); the
    structured meta function checks only shapes."""
    names = "m1 and m2" if device_type == "cpu" else "mat1 and mat2"

    def check(args: tuple[Any, ...]) -> str | None:
        a, b = args[:2]
        if a.dtype != b.dtype:
            return f"expected {names} to have the same dtype, but got: {_tm(a)} != {_tm(b)}"
        return None

    return check


def _bmm_cpu(args: tuple[Any, ...], split: str = "m1") -> str | None:
    """CPU ``bmm`` of two dtypes, by the path it takes (:func:`cpu_bmm.bmm_path`): the naive
    kernel reads the result and ``batch2`` as ``batch1``'s type, MKL's gemm ``batch1`` as the
    result's (``batch2``'s); split per item, ``addmm_impl_cpu_`` ("m1 and m2") for ``bmm``,
    ``addmm_``'s meta ("mat1 and mat2") for ``baddbmm``."""
    b1, b2 = args[:2]
    if b1.dtype == b2.dtype:
        return None
    path = cpu_bmm.bmm_path(b1, b2)
    if path == "naive":
        return _data_ptr(b1, b2)
    if path == "gemm":
        return _data_ptr(b2, b1)
    if path == "split":
        return _mm("cpu")(args) if split == "m1" else _addmm((b2, b1, b2))
    return None


def _baddbmm(device_type: str) -> Check:
    """``TORCH_META_FUNC(baddbmm)`` compares ``self`` with ``batch1`` on every device; the CPU
    kernel then takes ``bmm``'s paths."""

    def check(args: tuple[Any, ...]) -> str | None:
        self, b1, b2 = args[:3]
        if self.dtype != b1.dtype:
            return (
                f"Input dtypes must be the same, got: input {_tm(self)}, batch1: {_tm(b1)}, "
                f"batch2: {_tm(b2)}"
            )
        return _bmm_cpu((b1, b2), split="mat1") if device_type == "cpu" else None

    return check


def _addmv(args: tuple[Any, ...]) -> str | None:
    """``TORCH_META_FUNC(addmv)``, every device, from torch 2.12 on. Before, the meta function
    checks no dtype: the kernels (CPU ``addmv_out_cpu``, CUDA ``addmv_out_cuda``) copy ``self``
    into a result of ``vec``'s dtype, casting, then read ``vec`` as ``mat``'s type (2.11's real
    CPU kernel; an H100 on 2.11 ran ``addmv(bf16[5], f32[5, 10], f32[10])`` to fp32)."""
    self, mat, vec = args[:3]
    if not addmv_meta_checks_dtypes():
        return _data_ptr(mat, vec)
    if not (self.dtype == mat.dtype == vec.dtype):
        return (
            f"addmv input tensors must have the same dtype, but got {_st(self)}, {_st(mat)}, "
            f"and {_st(vec)}"
        )
    return None


def _mv(args: tuple[Any, ...]) -> str | None:
    """``mv`` is ``addmv_`` into a result made with ``vec``'s options (device-generic)."""
    mat, vec = args[:2]
    return _addmv((vec, mat, vec))


def _dot(args: tuple[Any, ...]) -> str | None:
    """``dot_check`` (CPU ``Blas.cpp``), shared by ``dot`` and ``vdot``."""
    a, b = args[:2]
    if a.dtype != b.dtype:
        return f"dot : expected both vectors to have same dtype, but found {_st(a)} and {_st(b)}"
    return None


# -- convolution --------------------------------------------------------------------------------
def _convolution(device_type: str) -> Check:
    """``aten.convolution``: the weight check and the bias check, as each device makes them.

    On CUDA the bias is compared with ``dtype().name()`` first, then cuDNN's
    ``check_input_same_type_as_parameters`` compares the weight (``Tensor::toString()``). On the
    CPU ``aten.convolution`` makes no check of its own (the bias check with ``dtype().name()`` is
    ``at::conv1d/2d/3d``'s, composite functions that run on fake tensors too): the backend it
    picks does. oneDNN (:func:`_cpu_onednn`) refuses a weight or a bias of another dtype; the slow
    kernels read the weight, and the 3-D transposed one the bias, as the input's type; the other
    slow kernels take any bias (``conv_transpose2d`` or ``conv2d(padding="same")`` of a small
    fp32 input with a bf16 bias return fp32).
    """

    def check(args: tuple[Any, ...]) -> str | None:
        x, weight, bias = args[:3]
        bias = _tensor(bias)
        if device_type == "cuda":
            if bias is not None and bias.dtype != x.dtype:
                return f"Input type ({_tm(x)}) and bias type ({_tm(bias)}) should be the same"
            return (
                None if weight.dtype == x.dtype else _onednn_or_cudnn(x, weight, "weight", "cuda")
            )
        onednn = _cpu_onednn(x, weight, *args[3:9])
        for name, param in (("weight", weight), ("bias", bias)):
            if param is None or param.dtype == x.dtype:
                continue
            if onednn:
                return _onednn_or_cudnn(x, param, name, "cpu")
            if name == "weight" or (args[6] and x.dim() == 5):  # slow_conv_transpose3d
                return _data_ptr(x, param)
        return None

    return check


def _cpu_onednn(
    x: torch.Tensor, weight: torch.Tensor, stride: Any, _padding: Any, dilation: Any,
    transposed: bool, output_padding: Any, groups: int,
) -> bool:  # fmt: skip
    """Whether the CPU's ``_select_conv_backend`` picks oneDNN (``ConvParams::use_mkldnn``): a
    16-bit input where this machine's oneDNN takes its dtype (:mod:`ampgraph.annotate.cpu_backend`:
    bf16 with AVX-512, fp16 with AVX512-FP16), an fp32 one by shape and thread count."""
    if not cpu_backend.onednn().enabled:
        return False
    if transposed and any(o >= s for o, s in zip(output_padding, stride, strict=False)):
        return False  # is_output_padding_big
    if x.dtype in (torch.bfloat16, torch.float16):
        return cpu_backend.takes_low_precision(x.dtype)
    if x.dtype != torch.float32:
        return False
    xs, ws = list(x.shape), list(weight.shape)
    if len(xs) == 3:  # 1-D: seen as 2-D with a height of 1
        xs, ws = [xs[0], xs[1], 1, xs[2]], [ws[0], ws[1], 1, ws[2]]
    strided, dilated = any(v != 1 for v in stride), any(v != 1 for v in dilation)
    # A size known only at run time (after nonzero) counts as large: no guard raises on it.
    big = guard_or_true
    worth = strided or dilated or big(xs[0] >= 16) or big(ws[-1] != 1) or big(ws[-2] != 1)
    faster = (
        groups > 1 or big(ws[-1] > 3 and ws[-2] > 3) or big(xs[0] > 1)
        or big(xs[0] * xs[1] * xs[2] * xs[3] > 20480)
    )  # fmt: skip
    return (worth or torch.get_num_threads() > 1) and faster


def _onednn_or_cudnn(x: torch.Tensor, other: torch.Tensor, name: str, device_type: str) -> str:
    """``check_input_same_type_as_parameters``: cuDNN's and (with its tail) oneDNN's."""
    message = (
        f"Input type ({_type_string(x, device_type)}) and {name} type "
        f"({_type_string(other, device_type)}) should be the same"
    )
    if device_type == "cpu":
        message += f" or input should be a MKLDNN tensor and {name} is a dense tensor"
    return message


# -- normalisations -----------------------------------------------------------------------------
#: The forward normalisations whose CPU kernels' dtype checks are written here (their indices
#: are :data:`~ampgraph.annotate.kernel_dtypes.CPU_NORM_PARAMS`'s).
_CHECKED_NORMS = (
    aten.native_layer_norm.default,
    aten.native_group_norm.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default,
    aten._batch_norm_with_update.default,
    aten._batch_norm_no_update.default,
)


def _cpu_norm(op: Any) -> Check:
    """CPU normalisations, ``mixed_dtypes.h``: the input is "mixed" with its parameters when the
    first defined parameter's dtype differs from it; then every parameter must be fp32 and the
    input 16-bit. Otherwise the kernel reads every parameter as the input's type. Where the
    input and the parameters are: :data:`~ampgraph.annotate.kernel_dtypes.CPU_NORM_PARAMS`."""
    x_index, param_indices = CPU_NORM_PARAMS[op]

    def check(args: tuple[Any, ...]) -> str | None:
        x = args[x_index]
        params = [_tensor(args[i]) if i < len(args) else None for i in param_indices]
        defined = [p for p in params if p is not None]
        if not defined:
            return None
        if defined[0].dtype != x.dtype:  # is_mixed_type
            if any(p.dtype != torch.float32 for p in defined):
                return "mixed dtype (CPU): expect parameter to have scalar type of Float"
            if x.dtype not in (torch.bfloat16, torch.float16):
                return "mixed dtype (CPU): all inputs must share same datatype."
            return None
        return next((m for p in defined if (m := _data_ptr(x, p))), None)

    return check


def _complex(args: tuple[Any, ...]) -> str | None:
    """``complex_check_floating`` then ``complex_check_dtype`` (``TensorFactories.cpp``),
    ``complex`` and ``polar`` on every device."""
    a, b = args[:2]
    if not {a.dtype, b.dtype} <= {torch.float16, torch.float32, torch.float64}:
        return (
            f"Expected both inputs to be Half, Float or Double tensors but got {_st(a)} and "
            f"{_st(b)}"
        )
    if a.dtype != b.dtype:
        return (
            f"Expected object of scalar type {_st(a)} but got scalar type {_st(b)} for second "
            "argument"
        )
    return None


def _heaviside(args: tuple[Any, ...]) -> str | None:
    """``TORCH_META_FUNC2(heaviside, Tensor)``, every device."""
    a, b = args[:2]
    if isinstance(b, torch.Tensor) and a.dtype != b.dtype:
        return "heaviside is not yet implemented for tensors with different dtypes."
    return None


def _softmax_backward_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``_softmax_backward_data``/``_log_softmax_backward_data``: the kernel, dispatched on
    ``grad_output``'s type, reads ``output`` and writes ``grad_input`` (which the structured meta
    function makes fp16 for an fp32 grad and ``input_dtype=torch.half``) as that type."""
    grad, output, _dim, input_dtype = args[:4]
    if grad.dtype == torch.float32 and input_dtype == torch.float16:  # grad_input, read first
        return "expected scalar type Float but found Half"
    return _data_ptr(grad, output)


def _sdpa_flash_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``_scaled_dot_product_flash_attention_for_cpu``: the kernel, dispatched on the query's
    type, reads the key and the value as that type; before that, its keyword-only ``attn_mask``
    must be the query's dtype or fp32 (the composite ``scaled_dot_product_attention`` makes a
    boolean mask additive first)."""
    q = args[0]
    mask = _tensor(args[-1].get("attn_mask")) if isinstance(args[-1], dict) else None
    if mask is not None and mask.dtype not in (q.dtype, torch.float32):  # checked first
        return (
            "scaled_dot_product_attention_flash_attention: Attention mask is the same data type "
            "as query"
        )
    return next((m for t in args[1:3] if (m := _data_ptr(q, t))), None)


def _lerp(args: tuple[Any, ...]) -> str | None:
    """``TORCH_META_FUNC(lerp_Scalar)`` / ``lerp_Tensor``, every device."""
    self, end = args[:2]
    weight = _tensor(args[2]) if len(args) > 2 else None
    for name, other in (("end", end), ("weight", weight)):
        if other is not None and other.dtype != self.dtype:
            return f"expected dtype {_tm(self)} for `{name}` but got dtype {_tm(other)}"
    return None


# -- losses, sampling, embedding bags ---------------------------------------------------------
def _binary_cross_entropy(args: tuple[Any, ...]) -> str | None:
    """``binary_cross_entropy`` builds a ``TensorIterator`` of input and target, which requires
    one dtype on every device (the weight multiplies afterwards)."""
    x, target = args[:2]
    if target.dtype != x.dtype:
        return f"Found dtype {_st(target)} but expected {_st(x)}"
    return None


def _nll_loss_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``nll_loss_forward``/``nll_loss2d_forward``: the weight is read as the input's type."""
    weight = _tensor(args[2]) if len(args) > 2 else None
    return _data_ptr(args[0], weight) if weight is not None else None


def _second_as_first_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU kernels that read their second tensor as the first's type: ``grid_sampler_2d/3d``
    (input, grid), ``_weight_norm_interface`` (v, g), ``linalg_cross``."""
    return _data_ptr(args[0], args[1])


def _cdist_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``_cdist_forward`` dispatches on ``x1`` (fp32 and fp64 only), then reads ``x2``."""
    x1, x2 = args[:2]
    if x1.dtype in (torch.bfloat16, torch.float16):
        return f"\"cdist\" not implemented for '{_st(x1)}'"
    return _data_ptr(x1, x2)


def _euclidean_dist(device_type: str) -> Check:
    """``_euclidean_dist`` (``Distance.cpp``, every device: ``cdist`` with p=2 by matrix products)
    pads ``x1`` and ``x2`` with their norms and ones, each in its own dtype, then computes
    ``x1_.matmul(x2_.mT)``: ``mm`` for 2-D inputs, ``bmm`` for batches, which on the CPU takes
    :func:`cpu_bmm.bmm_path`'s path for those shapes."""

    def check(args: tuple[Any, ...]) -> str | None:
        x1, x2 = args[:2]
        if x1.dtype == x2.dtype:
            return None
        if x1.dim() == 2:
            return _mm(device_type)((x1, x2))
        if device_type == "cuda":
            return _data_ptr(x1, x2)
        (batch, rows, m), cols = x1.shape, x2.shape[-2]
        b1 = torch.empty((batch, rows, m + 2), dtype=x1.dtype, device="meta")
        b2 = torch.empty((batch, cols, m + 2), dtype=x2.dtype, device="meta").mT
        return _bmm_cpu((b1, b2))

    return check


def _embedding_bag_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``_embedding_bag``: ``checkSameType`` of the weight and ``per_sample_weights``."""
    weight = args[0]
    psw = _tensor(args[6]) if len(args) > 6 else None
    if psw is not None and psw.dtype != weight.dtype:
        return (
            "Expected tensor for argument #1 'weight' to have the same type as tensor for "
            f"argument #1 'per_sample_weights'; but type {_type_string(weight, 'cpu')} does not "
            f"equal {_type_string(psw, 'cpu')} (while checking arguments for embedding_bag)"
        )
    return None


def _embedding_bag_cuda(args: tuple[Any, ...]) -> str | None:
    """CUDA ``_embedding_bag_cuda`` (``cuda/EmbeddingBag.cu``, also ``_embedding_bag_forward_only``'s)
    checks no dtype of ``per_sample_weights``: its sum/mean kernel, dispatched on the weight's
    type, reads them with ``const_data_ptr<scalar_t>()``. The max kernel does not read them."""
    weight = args[0]
    psw = _tensor(args[6]) if len(args) > 6 else None
    mode = args[4] if len(args) > 4 else 0
    if psw is None or mode == 2:
        return None
    return _data_ptr(weight, psw)


# -- backward kernels (CPU): what a joint trace of a training step replays ---------------------
def _same_as_self_cpu(grad_index: int, self_index: int, *more: int) -> Check:
    """CPU backward kernels built on a ``TensorIterator`` that wants one dtype
    (``glu_backward``, ``log_sigmoid_backward``): ``self`` sets it, the gradient is compared
    first, then the other inputs."""

    def check(args: tuple[Any, ...]) -> str | None:
        want = args[self_index]
        for i in (grad_index, *more):
            t = _tensor(args[i]) if i < len(args) else None
            if t is not None and t.dtype != want.dtype:
                return f"Found dtype {_st(t)} but expected {_st(want)}"
        return None

    return check


def _nll_loss_backward_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``nll_loss_backward``/``nll_loss2d_backward`` read the weight, the total weight and
    the gradient as ``self``'s type, in that order."""
    grad, self, _target, weight, _reduction, _ignore, total_weight = args[:7]
    for t in (_tensor(weight), total_weight, grad):
        if t is not None and (found := _data_ptr(self, t)):
            return found
    return None


def _both(op: Any, check: Check) -> dict[tuple[str, Any], Check]:
    return {("cpu", op): check, ("cuda", op): check}


#: (device type, op) -> a check that returns the real kernel's error message, or None if fine.
STRICT_CHECKS: dict[tuple[str, Any], Check] = {
    **_both(aten.addmm.default, _addmm),
    **_both(aten._addmm_activation.default, _addmm),
    **_both(aten.addbmm.default, _addmm),
    ("cpu", aten.mm.default): _mm("cpu"),
    ("cuda", aten.mm.default): _mm("cuda"),
    ("cpu", aten.bmm.default): _bmm_cpu,
    ("cpu", aten.baddbmm.default): _baddbmm("cpu"),
    ("cuda", aten.baddbmm.default): _baddbmm("cuda"),
    **_both(aten.addmv.default, _addmv),
    **_both(aten.mv.default, _mv),
    ("cpu", aten.dot.default): _dot,
    ("cpu", aten.vdot.default): _dot,
    ("cuda", aten.convolution.default): _convolution("cuda"),
    ("cpu", aten.convolution.default): _convolution("cpu"),
    **{("cpu", op): _cpu_norm(op) for op in _CHECKED_NORMS},
    # index_put and its kin: per device (ampgraph.annotate.index_checks).
    **INDEX_CHECKS,
    **_both(aten.complex.default, _complex),
    **_both(aten.polar.default, _complex),
    **_both(aten.heaviside.default, _heaviside),
    **_both(aten.heaviside_.default, _heaviside),
    ("cpu", aten._softmax_backward_data.default): _softmax_backward_cpu,
    ("cpu", aten._log_softmax_backward_data.default): _softmax_backward_cpu,
    ("cpu", aten._scaled_dot_product_flash_attention_for_cpu.default): _sdpa_flash_cpu,
    ("cpu", aten.glu_backward.default): _same_as_self_cpu(0, 1),
    ("cpu", aten.log_sigmoid_backward.default): _same_as_self_cpu(0, 1, 2),
    ("cpu", aten.nll_loss_backward.default): _nll_loss_backward_cpu,
    ("cpu", aten.nll_loss2d_backward.default): _nll_loss_backward_cpu,
    **{("cpu", op): check for op, check in CPU_NORM_BACKWARD_CHECKS.items()},
    **_both(aten.lerp.Scalar, _lerp),
    **_both(aten.lerp.Tensor, _lerp),
    **_both(aten.binary_cross_entropy.default, _binary_cross_entropy),
    ("cpu", aten.nll_loss_forward.default): _nll_loss_cpu,
    ("cpu", aten.nll_loss2d_forward.default): _nll_loss_cpu,
    ("cpu", aten.grid_sampler_2d.default): _second_as_first_cpu,
    ("cpu", aten.grid_sampler_3d.default): _second_as_first_cpu,
    ("cpu", aten._weight_norm_interface.default): _second_as_first_cpu,
    ("cpu", aten.linalg_cross.default): _second_as_first_cpu,
    ("cpu", aten._cdist_forward.default): _cdist_cpu,
    ("cpu", aten._euclidean_dist.default): _euclidean_dist("cpu"),
    ("cuda", aten._euclidean_dist.default): _euclidean_dist("cuda"),
    ("cpu", aten._embedding_bag.default): _embedding_bag_cpu,
    ("cpu", aten._embedding_bag_forward_only.default): _embedding_bag_cpu,
    ("cuda", aten._embedding_bag.default): _embedding_bag_cuda,
    ("cuda", aten._embedding_bag_forward_only.default): _embedding_bag_cuda,
    # Python scalars that overflow the tensor's dtype (ampgraph.annotate.scalars).
    **SCALAR_CHECKS,
    # CUDA's own kernels' checks (ampgraph.annotate.cuda_kernels).
    **CUDA_CHECKS,
}


#: Ops whose checks read a keyword-only argument (given a dict of them after the positionals).
_KEYWORD_CHECKED = (
    frozenset({aten._scaled_dot_product_flash_attention_for_cpu.default}) | KEYWORD_CHECKED
)


class StrictDtypeMode(TorchDispatchMode):
    """Raise the real kernels' dtype errors that the fake (meta) kernels do not raise."""

    #: A higher-order op (``flex_attention``) comes here whole, and runs as it is: its inner ops
    #: are its own implementation's, which the mode, popped for the call, does not check.
    supports_higher_order_operators = True

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if no_device_kernel(self.device_type, func):
            raise RuntimeError(dispatcher_refusal(func, self.device_type))
        check = STRICT_CHECKS.get((self.device_type, func))
        if check is not None:
            # The few checks of keyword-only arguments find them last, as a dict.
            message = check((*args, kwargs) if kwargs and func in _KEYWORD_CHECKED else tuple(args))
            if message is not None:
                raise RuntimeError(message)
        # Then the device's own rules: kernel coverage, CUDA's normalisations (device_kernels).
        own = DEVICE_CHECKS.get((self.device_type, func)) or library_check(self.device_type, func)
        if own is not None and (message := own(tuple(args))) is not None:
            raise RuntimeError(message)
        return func(*args, **(kwargs or {}))


__all__ = ["STRICT_CHECKS", "StrictDtypeMode"]
