"""Kernel rules that belong to one device: the dtypes a kernel has there, and the CUDA
normalisation kernels' own mixed-dtype rules.

A rule of one device is no evidence for another. The CPU's ``pdist`` and CUDA's ``pdist_cuda``
both lack bf16, with different messages; CUDA's batch norm refuses an fp32 input beside bf16
weights (``Expected weight to have type Float but got BFloat16``, seen on an H200) where the CPU
kernel says ``mixed dtype (CPU): ...``. Fake tensors type all of these as if they ran.

:data:`DEVICE_CHECKS` is the table, ``(device type, op) -> check``, consulted by
:class:`~ampgraph.annotate.strict.StrictDtypeMode` after its own checks:

* **Coverage**: the overloads with no bf16 or fp16 kernel on a device, from the table
  ``scripts/kernel_coverage.py`` writes (``ampgraph/policy/kernel_coverage.json``):
  PyTorch's OpInfo database mapped to the overloads its samples reach, CPU entries proven against
  the real CPU kernels. A kernel dispatches on its first floating input's dtype or on the common
  dtype of its inputs (the table says which, as a mixed call showed on the real CPU kernel): the
  check fires when that dtype is one the device lacks.
* **CUDA normalisations**, read from ATen's CUDA sources (``docs/fake-kernels.md`` names each
  line): ``native_batch_norm`` and its variants (``batch_norm_elementwise`` in
  ``cuda/Normalization.cu``), ``cudnn_batch_norm`` (``cudnn/BatchNorm.cpp``),
  ``native_group_norm`` (``group_norm.cpp``, then ``cuda/group_norm_kernel.cu``) and
  ``native_layer_norm`` (``cuda/layer_norm_kernel.cu``).

>>> import torch
>>> x, w = torch.empty(2, 4, 5, 5), torch.empty(4, dtype=torch.bfloat16)
>>> DEVICE_CHECKS[("cuda", torch.ops.aten.native_batch_norm.default)]((x, w, w, w, w, False, 0.1, 1e-5))
'Expected weight to have type Float but got BFloat16'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ampgraph.annotate.kernel_dtypes import _NAMES, _read_as
from ampgraph.compat import torch_minor

aten = torch.ops.aten

Check = Callable[[tuple[Any, ...]], str | None]

_LOW = (torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
#: Written by ``scripts/kernel_coverage.py``: ``{"tables": {torch major.minor: {device:
#: {overload: {"dtypes": {dtype: message}, "opinfo": [...], "call": ...}}}}, "made": ...}``.
COVERAGE_FILE = Path(__file__).resolve().parent.parent / "policy" / "kernel_coverage.json"


@functools.cache
def coverage_tables() -> dict[str, dict[str, dict[str, Any]]]:
    """Every torch version's coverage table, as ``scripts/kernel_coverage.py`` wrote them."""
    tables: dict[str, dict[str, dict[str, Any]]] = json.loads(COVERAGE_FILE.read_text())["tables"]
    return tables


def _name(t: torch.Tensor | torch.dtype) -> str:
    dtype = t if isinstance(t, torch.dtype) else t.dtype
    return _NAMES.get(dtype, str(dtype))


def _tensor(v: Any) -> torch.Tensor | None:
    return v if isinstance(v, torch.Tensor) else None


def _acc(dtype: torch.dtype) -> torch.dtype:
    """``at::acc_type<scalar_t, /*is_cuda=*/true>``: fp32 for every float type but fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# -- coverage: the dtypes a kernel has on a device ----------------------------------------------
def coverage_table(version: str | None = None) -> dict[str, dict[str, Any]]:
    """The coverage table of a torch version (``"2.14"``; the installed one by default): the
    newest table not newer than it, or an empty one before every table.

    >>> "aten::_pdist_forward" in coverage_table("2.14")["cpu"]
    True
    """
    if version is None:
        version = torch_minor()

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split(".") if p.isdigit())

    tables = coverage_tables()
    older = [v for v in tables if key(v) <= key(version)]
    return tables[max(older, key=key)] if older else {"cpu": {}, "cuda": {}}


def _euclidean_cdist(args: tuple[Any, ...]) -> bool:
    """``_cdist_forward`` computes p=2 distances with matrix products, which take every float
    dtype, when ``compute_mode`` asks or, by default, past 25 rows (``cdist_impl`` in
    ``Distance.cpp``): no kernel dispatches on the dtype then."""
    x1, x2, p = args[:3]
    mode = args[3] if len(args) > 3 else None
    rows = max(x1.shape[-2], x2.shape[-2])
    return bool(p == 2 and (mode == 1 or (mode in (None, 0) and rows > 25)))


def _empty_solve(args: tuple[Any, ...]) -> bool:
    """``_linalg_solve_ex`` of an empty ``A``: ``linalg_lu_factor_ex_out`` returns before its
    kernel when ``A.numel() == 0``, and ``linalg_lu_solve_out`` when the result is empty
    (``BatchLinearAlgebra.cpp``, every device: the CPU kernel returns bf16, as an H100 did)."""
    return int(args[0].numel()) == 0


def _empty_lu_solve(args: tuple[Any, ...]) -> bool:
    """``linalg_lu_solve`` with an empty result (``B`` empty, or a batch of none): it returns
    before its kernel (``BatchLinearAlgebra.cpp``, every device)."""
    lu, b = args[0], args[2]
    try:
        batch = torch.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    except RuntimeError:
        return False  # a shape error comes first
    return any(int(s) == 0 for s in (*batch, *b.shape[-2:]))


#: Overload -> when its kernel is not reached at all (the coverage check then does not apply).
_BYPASSES: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    "aten::_cdist_forward": _euclidean_cdist,
    "aten::_linalg_solve_ex": _empty_solve,
    "aten::linalg_lu_solve": _empty_lu_solve,
}


def iterator_dtype(tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The dtype a ``TensorIterator`` computes in, for its floating inputs: their promoted type,
    where zero-dimensional tensors count only if no input has dimensions (``result_type``'s
    rule: ``zeta(bf16[5], f32[])`` computes in bf16, ``zeta(bf16[], f32[])`` in fp32).

    >>> iterator_dtype([torch.empty(5, dtype=torch.bfloat16), torch.empty(())])
    torch.bfloat16
    """
    return _promoted([t for t in tensors if t.dim() > 0] or tensors)


def _promoted(tensors: list[torch.Tensor]) -> torch.dtype | None:
    if not tensors:
        return None
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors))


def _coverage_check(
    dtypes: dict[str, str], dispatch: str = "first", bypass: Callable[..., bool] | None = None
) -> Check:
    lacking = {getattr(torch, name): message for name, message in dtypes.items()}

    def check(args: tuple[Any, ...]) -> str | None:
        if bypass is not None and bypass(args):
            return None
        # AT_DISPATCH switches on the first floating input's dtype where the table says a mixed
        # call showed it; a pointwise op computes in its TensorIterator's common dtype
        # ("promoted"); otherwise the check fires only where every floating input is of the
        # dtype (a mixed call computes in another, or meets a mixing check first).
        floats = [t for t in pytree.tree_leaves(args)
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]  # fmt: skip
        if dispatch == "promoted":
            dtype = iterator_dtype(floats)
        else:
            ranked = floats[:1] if dispatch == "first" else floats
            dtype = _promoted(ranked)
        if dtype is None:
            return None
        message = lacking.get(dtype)
        return message.replace("{dtype}", _name(dtype)) if message is not None else None

    return check


def _overload(name: str) -> Any:
    """``aten::_pdist_forward`` -> ``aten._pdist_forward.default`` (None if not in this torch)."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    packet = getattr(aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def dispatch_of(op: Any, entry: dict[str, Any]) -> str:
    """How an overload's kernel picks the dtype it computes in: ``"promoted"`` for a pointwise op
    (``Tag.pointwise`` in ``native_functions.yaml``: a ``TensorIterator`` kernel, on every
    device), else the table's word (``"first"`` where the table has none). A table written
    before this rule says ``"first"`` for ``special_zeta`` (its mixed call paired a
    bf16[10, 5] with an fp32 zero-dimensional tensor: bf16 either way), and an H100 ran
    ``zeta(bf16[], f32[])`` in fp32, as the CPU does."""
    if torch.Tag.pointwise in getattr(op, "tags", ()):
        return "promoted"
    dispatch: str = entry.get("dispatch") or "first"
    return dispatch


def coverage_checks(table: dict[str, dict[str, Any]]) -> dict[tuple[str, Any], Check]:
    """(device type, op) -> check, for every entry of a coverage table this torch has."""
    checks: dict[tuple[str, Any], Check] = {}
    for device, entries in table.items():
        for name, entry in entries.items():
            op = _overload(name)
            if op is not None:
                checks[(device, op)] = _coverage_check(
                    entry["dtypes"], dispatch_of(op, entry), _BYPASSES.get(name)
                )
    return checks


# -- CUDA batch norm -----------------------------------------------------------------------------
def _use_32bit_indexing(t: torch.Tensor) -> bool:
    """``canUse32BitIndexMath``: the largest offset fits an int32 (unknown sizes: assume so)."""
    try:
        offset = sum((int(s) - 1) * int(st) for s, st in zip(t.shape, t.stride(), strict=True))
        return int(t.numel()) <= _INT32_MAX and offset <= _INT32_MAX
    except (TypeError, RuntimeError, ValueError):  # symbolic sizes
        return True


def _bn_impl(x: torch.Tensor) -> str:
    """``batch_norm_choose_impl`` in ``cuda/Normalization.cu``."""
    if not _use_32bit_indexing(x):
        return "general"
    if x.is_contiguous():
        return "channels_last" if x.dim() > 1 and x.stride(1) == 1 else "contiguous"
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "general"


def cuda_batch_norm_elementwise(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> str | None:
    """``batch_norm_elementwise`` (``cuda/Normalization.cu``), the last step of every CUDA
    native batch norm. *Contiguous*: the parameters are "mixed" when the first given differs
    from the input (``is_mixed_type``); then both are read as fp32 (``acc_type``), otherwise as
    the input's type, by ``packed_accessor_or_dummy`` ("Expected weight to have type ...").
    *Channels last* (``batch_norm_elemt_channels_last_cuda_template``): the same choice, read
    with ``const_data_ptr``. *General* (non-contiguous, 64-bit indexing): a ``TensorIterator``
    that casts, no error."""
    impl = _bn_impl(x)
    params = (("weight", weight), ("bias", bias))
    first = next((t for _n, t in params if t is not None), None)
    mixed = first is not None and first.dtype != x.dtype
    stat = _acc(x.dtype) if mixed else x.dtype
    if impl == "contiguous":
        for name, t in params:
            if t is not None and t.dtype != stat:
                return f"Expected {name} to have type {_name(stat)} but got {_name(t)}"
        return None
    if impl == "channels_last" and all(t is None or t.is_contiguous() for _n, t in params):
        # Not mixed: the weight is the input's type (a checked TORCH_CHECK), the shift is read.
        return _read_as(stat, weight, bias)
    return None


def _bn_native(x_index: int = 0, weight_index: int = 1, bias_index: int = 2) -> Check:
    """CUDA ``native_batch_norm``, ``_native_batch_norm_legit`` (and ``.no_stats``,
    ``_no_training``, ``_functional``): ``batch_norm_cuda`` -> ``batch_norm_cuda_out``, whose
    statistics kernels cast (``TensorIterator``), then :func:`cuda_batch_norm_elementwise`."""

    def check(args: tuple[Any, ...]) -> str | None:
        x = args[x_index]
        weight = _tensor(args[weight_index]) if len(args) > weight_index else None
        bias = _tensor(args[bias_index]) if len(args) > bias_index else None
        return cuda_batch_norm_elementwise(x, weight, bias)

    return check


def _type_string(t: torch.Tensor) -> str:
    """``Tensor::toString()`` of a CUDA tensor (the legacy name where one exists)."""
    legacy = {torch.float32: "Float", torch.float16: "Half", torch.float64: "Double"}
    return (f"torch.cuda.{legacy[t.dtype]}Tensor" if t.dtype in legacy
            else f"CUDA{_name(t)}Type")  # fmt: skip


def cuda_cudnn_batch_norm(args: tuple[Any, ...]) -> str | None:
    """``cudnn_batch_norm`` (``cudnn/BatchNorm.cpp``): an fp16 input wants fp32 weights
    (``checkScalarType``), any other the input's type (``checkAllSameType``); then the weight,
    bias and running statistics must share one type. Autograd's ``_batch_norm_impl_index``
    sends here only inputs and weights that are not bf16, so the mixes it sees are fp16's."""
    x, weight, bias = args[:3]
    stats = [_tensor(args[i]) if len(args) > i else None for i in (3, 4)]
    where = "(while checking arguments for cudnn_batch_norm)"
    if x.dtype == torch.float16:
        if weight.dtype != torch.float32:
            return (
                "Expected tensor for argument #2 'weight' to have scalar type Float; but got "
                f"{_type_string(weight)} instead {where}"
            )
    elif weight.dtype != x.dtype:
        return _same_type(("input", 1, x), ("weight", 2, weight), where)
    named = [("weight", 2, weight), ("bias", 3, _tensor(bias)),
             ("running_mean", 4, stats[0]), ("running_var", 5, stats[1])]  # fmt: skip
    for other in named[1:]:
        if other[2] is not None and other[2].dtype != weight.dtype:
            return _same_type(named[0], other, where)
    return None


def _same_type(a: tuple[str, int, Any], b: tuple[str, int, Any], where: str) -> str:
    """``checkSameType`` (``TensorUtils.cpp``)."""
    return (
        f"Expected tensor for argument #{a[1]} '{a[0]}' to have the same type as tensor for "
        f"argument #{b[1]} '{b[0]}'; but type {_type_string(a[2])} does not equal "
        f"{_type_string(b[2])} {where}"
    )


def _bn_with_update(args: tuple[Any, ...]) -> str | None:
    """CUDA ``_batch_norm_with_update``: ``_select_batch_norm_backend`` sends cuDNN's mixes (no
    bf16, an fp16 input only with fp32 weights, weight and bias given, 3-D or more, eps at least
    cuDNN's minimum) to :func:`cuda_cudnn_batch_norm`, the rest to the native kernels."""
    x, weight, bias = args[0], _tensor(args[1]), _tensor(args[2])
    eps = args[6] if len(args) > 6 else 1e-5
    cudnn = (
        weight is not None and bias is not None and x.dim() >= 3
        and torch.backends.cudnn.enabled and torch.backends.cudnn.is_available()
        and torch.bfloat16 not in (x.dtype, weight.dtype)
        and (x.dtype != torch.float16 or weight.dtype == torch.float32)
        and eps >= 1e-5
    )  # fmt: skip
    return cuda_cudnn_batch_norm(args) if cudnn else cuda_batch_norm_elementwise(x, weight, bias)


# -- CUDA layer norm ----------------------------------------------------------------------------
def cuda_layer_norm(args: tuple[Any, ...]) -> str | None:
    """CUDA ``native_layer_norm``: ``LayerNormKernelImplInternal<T>`` (``cuda/layer_norm_kernel.cu``)
    reads gamma, then beta, as the input's type T, unless there are no rows (M == 0). torch 2.14's
    own reference checks the same (``_check_native_layer_norm_cuda_param_dtype`` in
    ``torch/_refs/__init__.py``); older releases' fake kernels did not."""
    x, shape, weight, bias = args[0], args[1], _tensor(args[2]), _tensor(args[3])
    rows = 1
    for size in x.shape[: x.dim() - len(shape)]:
        rows *= size
    return None if rows == 0 else _read_as(x.dtype, weight, bias)


# -- CUDA group norm -----------------------------------------------------------------------------
def cuda_group_norm(args: tuple[Any, ...]) -> str | None:
    """CUDA ``native_group_norm``. ``group_norm.cpp`` (every device) first: the parameters are
    mixed when the first given differs from X, and must then be fp32 beside a 16-bit X
    (``check_mixed_data_type``, whose messages say "(CPU)" on CUDA too); the statistics are then
    fp32. ``GroupNormKernelImplInternal<T>`` (``cuda/group_norm_kernel.cu``) reads the statistics
    as X's type first, so that mixed case raises there; otherwise gamma and beta are read as X's
    type, by a ``TensorIterator`` of one dtype where H*W is 1 ("Found dtype ..."), by
    ``const_data_ptr`` elsewhere."""
    x, gamma, beta = args[0], _tensor(args[1]), _tensor(args[2])
    n, hxw = args[3], args[5]
    given = [t for t in (gamma, beta) if t is not None]
    if given and given[0].dtype != x.dtype:
        if any(t.dtype != torch.float32 for t in given):
            return "mixed dtype (CPU): expect parameter to have scalar type of Float"
        if x.dtype not in _LOW:
            return "mixed dtype (CPU): all inputs must share same datatype."
        # The fp32 statistics, read as X's type.
        return None if n == 0 else f"expected scalar type {_name(x)} but found Float"
    if n == 0 or not given:
        return None
    if hxw == 1:
        wrong = next((t for t in given if t.dtype != x.dtype), None)
        return f"Found dtype {_name(wrong)} but expected {_name(x)}" if wrong is not None else None
    return _read_as(x.dtype, gamma, beta)


#: (device type, op) -> a check that returns the device's real kernel's error, or None.
DEVICE_CHECKS: dict[tuple[str, Any], Check] = {
    **coverage_checks(coverage_table()),
    ("cuda", aten.native_batch_norm.default): _bn_native(),
    ("cuda", aten._native_batch_norm_legit.default): _bn_native(),
    ("cuda", aten._native_batch_norm_legit.no_stats): _bn_native(),
    ("cuda", aten._native_batch_norm_legit_no_training.default): _bn_native(),
    ("cuda", aten._native_batch_norm_legit_functional.default): _bn_native(),
    ("cuda", aten._batch_norm_with_update.default): _bn_with_update,
    ("cuda", aten.cudnn_batch_norm.default): cuda_cudnn_batch_norm,
    ("cuda", aten.native_group_norm.default): cuda_group_norm,
    ("cuda", aten.native_layer_norm.default): cuda_layer_norm,
}


#: The dispatch key of each device's own kernels.
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


@functools.lru_cache(maxsize=None)
def no_device_kernel(device_type: str, func: Any) -> bool:
    """Whether ``func`` has no kernel for the device at all, which a fake tensor's meta kernel
    runs regardless: ``torch.mm(..., out_dtype=torch.float32)`` (``aten::mm.dtype``, an MoE
    router's inference fast path) exists on CUDA only, and raises on the CPU.

    >>> mm_dtype = torch.ops.aten.mm.dtype
    >>> no_device_kernel("cpu", mm_dtype), no_device_kernel("cuda", mm_dtype)
    (True, False)
    """
    key = _BACKEND_KEYS.get(device_type)
    if key is None or func.namespace != "aten":
        return False
    # The computed table: a composite or fallthrough kernel counts as the device's own.
    return not torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), key)


#: The dispatcher's refusal of a call no kernel takes, word for word as ``OperatorEntry::
#: reportError`` (``aten/src/ATen/core/dispatch/OperatorEntry.cpp``) writes it: the same text from
#: torch 1.x to 2.14, around the two lists the registration table gives.
_REFUSAL = (
    "Could not run '{name}' with arguments from the '{key}' backend. This could be because the "
    "operator doesn't exist for this backend, or was omitted during the selective/custom build "
    "process (if using custom build). If you are a Facebook employee using PyTorch on mobile, "
    "please visit https://fburl.com/ptmfixes for possible resolutions. '{name}' is only "
    "available for these backends: [{keys}].\n\n{table}"
)


def dispatcher_refusal(func: Any, device_type: str) -> str:
    """The real dispatcher's own message for a call of ``func`` on ``device_type``, which has no
    kernel for it (:func:`no_device_kernel`), built from the operator's computed dispatch table
    (``torch._C._dispatch_dump_table``: every key with a kernel, and where it was registered) as
    the dispatcher builds it, without running the op: a call made to get the message ran real
    kernels on made-up tensors, and one of the fake-kernel survey's ops died of a floating point
    exception on zero-size ones, taking the process with it.

    >>> refusal = dispatcher_refusal(torch.ops.aten.mm.dtype, "cpu")
    >>> print(refusal.split(" This")[0])
    Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend.
    >>> "CUDA: registered at " in refusal
    True
    """
    name = func.name()
    table = torch._C._dispatch_dump_table(name)
    # listAllDispatchKeys(): the keys of the computed table, in its order.
    keys = [line.split(":", 1)[0] for line in table.splitlines() if ":" in line]
    key = _BACKEND_KEYS.get(device_type, device_type.upper())
    return _REFUSAL.format(name=name, key=key, keys=", ".join(keys), table=table)


__all__ = [
    "dispatcher_refusal",
    "no_device_kernel",
    "DEVICE_CHECKS",
    "coverage_checks",
    "coverage_table",
    "cuda_batch_norm_elementwise",
    "cuda_cudnn_batch_norm",
    "cuda_group_norm",
    "cuda_layer_norm",
]
