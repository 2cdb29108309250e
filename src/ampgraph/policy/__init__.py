"""Autocast policy tables, as data.

Transcribed from PyTorch's ``aten/src/ATen/autocast_mode.h`` (the ``AT_FORALL_*`` op lists that the
CUDA autocast key registers) and ``autocast_mode.cpp`` (the separate ``AutocastCPU`` lists), for the
torch release named in :data:`TABLE_TORCH_VERSION`. An entry is ``op`` for the default overload or
``op.overload`` for another one, exactly as the C++ ``KERNEL(op)`` / ``KERNEL(op, overload)``
registrations spell them; overloads that are not listed have no autocast kernel and fall through.

The tables are the annotator's only source of autocast knowledge. They are proven, not trusted:
``tests/test_policy.py`` compares the set of ops here with the ops that carry an Autocast kernel in
the installed dispatcher, and ``ampgraph check`` compares every annotated node with the dispatcher's
own autocast kernels.

The category names live in :mod:`ampgraph.policy.categories` and the installed dispatcher's
kernel queries (:func:`has_autocast_kernel`, :func:`library_rule`) in
:mod:`ampgraph.policy.kernels`; both are read from here as before.

>>> lookup("cuda", "aten::layer_norm", "")
'fp32'
>>> lookup("cpu", "aten::layer_norm", "") is None
True
"""

# The package re-exports its submodules' names: ampgraph.policy.lookup, ...library_rule, ...
# ruff: noqa: F401
from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Iterator, Mapping
from importlib import metadata
from dataclasses import dataclass, field
from typing import Any, Final

from ampgraph.policy.categories import (
    BANNED,
    CAST_INPUTS,
    CATEGORIES,
    CATEGORY_LABEL,
    FP16,
    FP32,
    FP32_APPEND_DTYPE,
    FP32_OUTPUT_AS_INPUT,
    FP32_SET_OPT_DTYPE,
    LOWER_PRECISION_FP,
    OPAQUE,
    PROMOTE,
)
from ampgraph.policy.kernels import (
    AUTOCAST_KEYS,
    LIBRARY_KERNEL_SOURCES,
    LIBRARY_KERNELS,
    KernelRule,
    autocast_device_types,
    autocast_key,
    has_autocast_kernel,
    kernel_site,
    library_rule,
    registrations_changed,
)

#: The torch release these lists were read from (major.minor).
TABLE_TORCH_VERSION: Final = "2.14"

# AT_FORALL_LOWER_PRECISION_FP, plus the two cudnn convolutions that autocast_mode.cpp
# registers for CUDA alone.
_CUDA_LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip

# AT_FORALL_FP32, plus linalg_matrix_sqrth (new in 2.14, registered for every backend).
_CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "linalg_matrix_sqrth",
)  # fmt: skip

_CUDA_FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip

# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE: these redispatch to the overload that takes a dtype.
_CUDA_FP32_APPEND_DTYPE = ("norm.Scalar", "norm.ScalarOpt_dim")

_CUDA_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip

_CPU_LOWER_PRECISION_FP = (
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "bmm",
    "mm", "linalg_vecdot", "baddbmm", "addmm", "_addmm_activation", "addbmm", "linear",
    "_convolution.deprecated", "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "prelu", "scaled_dot_product_attention",
    "_native_multi_head_attention",
)  # fmt: skip

# AutocastCPU fp32 list as registered in 2.14 (aten::qr and aten::cholesky are gone from it).
_CPU_FP32 = (
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "prod.dim_int",
    "quantile", "quantile.scalar", "nanquantile", "nanquantile.scalar", "stft", "stft.center",
    "cdist", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d", "trace",
    "view_as_complex", "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve", "orgqr",
    "ormqr", "pinverse", "max_pool3d", "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss",
    "l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "ctc_loss.IntList", "ctc_loss.Tensor", "kl_div",
    "multilabel_margin_loss", "binary_cross_entropy_with_logits", "fft_fft", "fft_ifft",
    "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2",
    "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft", "linalg_cond",
    "linalg_cond.p_str", "linalg_matrix_rank", "linalg_matrix_rank.tol_tensor",
    "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.atol_rtol_float", "linalg_solve",
    "linalg_cholesky", "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
    "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve",
    "fake_quantize_per_tensor_affine", "geqrf", "_lu_with_info", "svd",
    "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d", "adaptive_max_pool3d",
    "multilabel_margin_loss_forward", "linalg_qr", "linalg_cholesky_ex", "linalg_svd",
    "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex", "linalg_matrix_sqrth",
)  # fmt: skip

_CPU_PROMOTE = ("stack", "cat", "index_copy")

#: device type -> category -> ``op[.overload]`` names. The data everything else reads.
TABLES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "cuda": {
        LOWER_PRECISION_FP: _CUDA_LOWER_PRECISION_FP,
        FP32: _CUDA_FP32,
        FP32_SET_OPT_DTYPE: _CUDA_FP32_SET_OPT_DTYPE,
        FP32_APPEND_DTYPE: _CUDA_FP32_APPEND_DTYPE,
        PROMOTE: _CUDA_PROMOTE,
        # autocast_mode.cpp registers binary_cross_entropy_banned, which raises, for CUDA.
        BANNED: ("binary_cross_entropy",),
        # AutocastRNN.cpp's _cudnn_rnn_cast_reflatten, registered for CUDA with cuDNN.
        FP16: ("_cudnn_rnn",),
    },
    "cpu": {
        LOWER_PRECISION_FP: _CPU_LOWER_PRECISION_FP,
        FP32: _CPU_FP32,
        FP32_SET_OPT_DTYPE: (),
        FP32_APPEND_DTYPE: (),
        PROMOTE: _CPU_PROMOTE,
        BANNED: (),
        FP16: (),
    },
}

# AutocastXPU (autocast_mode.cpp): the same AT_FORALL_* macros as CUDA, so CUDA's lists without
# what autocast_mode.cpp and AutocastRNN.cpp register for CUDA alone (the cuDNN kernels) and
# without linalg_matrix_sqrth, which 2.14 registers for CUDA and CPU only.
_NOT_ON_XPU = ("cudnn_convolution", "cudnn_convolution_transpose", "_cudnn_rnn",
               "linalg_matrix_sqrth")  # fmt: skip

# AutocastMPS (autocast_mode.cpp): lists of its own. Its reductions and softmaxes are registered
# as fp32 (inputs cast), not fp32_set_opt_dtype (dtype=float32 added) as on CUDA.
_MPS_LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "_mps_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
    "scaled_dot_product_attention",
)  # fmt: skip

_MPS_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "batch_norm", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip

#: The lists of the device types beyond CUDA and CPU, as torch :data:`TABLE_TORCH_VERSION`
#: registers them (tests/test_devices.py proves them against its dispatcher and kernels). There
#: is no history of them: :func:`tables_for` gives them for that release only.
DEVICE_TABLES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "xpu": {
        category: tuple(e for e in entries if e not in _NOT_ON_XPU)
        for category, entries in TABLES["cuda"].items()
    },
    "mps": {
        LOWER_PRECISION_FP: _MPS_LOWER_PRECISION_FP,
        FP32: _MPS_FP32,
        FP32_SET_OPT_DTYPE: (),
        FP32_APPEND_DTYPE: (),
        PROMOTE: tuple(e for e in _CUDA_PROMOTE if e != "vdot"),  # CUDA's, vdot not
        BANNED: (),
        FP16: (),
    },
}

#: Where each device type's lists were read from: what ``ampgraph policy`` labels them with.
TABLE_SOURCES: Final[dict[str, str]] = {
    "cuda": "aten/src/ATen/autocast_mode.h and autocast_mode.cpp (AutocastCUDA)",
    "cpu": "aten/src/ATen/autocast_mode.cpp (AutocastCPU)",
    "xpu": "aten/src/ATen/autocast_mode.cpp (AutocastXPU: CUDA's AT_FORALL lists, no cuDNN)",
    "mps": "aten/src/ATen/autocast_mode.cpp (AutocastMPS: lists of its own)",
}


def table_source(device_type: str) -> str | None:
    """Where ampgraph's lists for ``device_type`` come from, with the torch release; None for a
    device type it has none for (their kernels are opaque to it).

    >>> table_source("mps")
    'aten/src/ATen/autocast_mode.cpp (AutocastMPS: lists of its own), torch 2.14'
    >>> table_source("hpu") is None
    True
    """
    if device_type not in TABLE_SOURCES:
        return None
    return f"{TABLE_SOURCES[device_type]}, torch {TABLE_TORCH_VERSION}"


#: How the lists changed, newest release first: (release, device type, category, entry, change).
#: For an older installed torch the changes of every newer release are undone, so the tables match
#: the dispatcher of the torch that runs (tests/test_policy.py proves it for the one installed, and
#: proves every release back to :data:`HISTORY_FROM` against the dump of its own dispatcher in
#: tests/data/policy/). ``scripts/policy_history.py`` dumps a release and prints its rows. No row
#: is older than 2.12: torch 2.6 to 2.11 register the same lists (their dumps are identical).
TABLE_HISTORY: Final[tuple[tuple[str, str, str, str, str], ...]] = (
    ("2.14", "cuda", FP32, "linalg_matrix_sqrth", "added"),
    ("2.14", "cpu", FP32, "linalg_matrix_sqrth", "added"),
    ("2.14", "cpu", FP32, "cholesky", "removed"),
    ("2.14", "cpu", FP32, "qr", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "cumprod.dimname", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "cumsum.dimname", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "log_softmax.Dimname", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "prod.dim_Dimname", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "softmax.Dimname", "removed"),
    ("2.13", "cuda", FP32_SET_OPT_DTYPE, "sum.dim_DimnameList", "removed"),
    ("2.13", "cuda", FP32_APPEND_DTYPE, "norm.names_ScalarOpt_dim", "removed"),
    ("2.13", "cpu", FP32, "prod.dim_Dimname", "removed"),
    ("2.13", "cpu", PROMOTE, "index_copy.dimname", "removed"),
    ("2.12", "cuda", FP32, "rms_norm", "added"),
)

#: Entries a CPU-only build (``2.13.0+cpu``) does not register in any release: AutocastRNN.cpp
#: registers ``_cudnn_rnn`` for CUDA only where torch was built with cuDNN.
CUDNN_ONLY: Final[tuple[tuple[str, str, str], ...]] = (("cuda", FP16, "_cudnn_rnn"),)

#: The oldest release whose lists :func:`tables_for` reproduces: the history above reaches back
#: to it (tests/test_policy.py proves each release from 2.6 on against its dispatcher's dump).
HISTORY_FROM: Final = "2.6"


def _release(version: str) -> tuple[int, int]:
    major, _, rest = version.partition(".")
    minor = "".join(ch for ch in rest.partition(".")[0] if ch.isdigit())
    return int(major), int(minor or 0)


def tables_for(version: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """The lists as torch ``version`` (``"2.13.0+cpu"``, ``"2.14"``) registers them.

    Reproduces every release from :data:`HISTORY_FROM` on; a CPU-only build (``+cpu``) lacks
    the cuDNN kernels (:data:`CUDNN_ONLY`).

    >>> "qr" in tables_for("2.13.0")["cpu"][FP32], "qr" in tables_for("2.14.1")["cpu"][FP32]
    (True, False)
    >>> "rms_norm" in tables_for("2.11.0")["cuda"][FP32], "rms_norm" in tables_for("2.12")["cuda"][FP32]
    (False, True)
    >>> "_cudnn_rnn" in tables_for("2.13.0+cpu")["cuda"][FP16]
    False
    """
    out = {device: {cat: list(entries) for cat, entries in table.items()}
           for device, table in TABLES.items()}  # fmt: skip
    for release, device, category, entry, change in TABLE_HISTORY:
        if _release(version) >= _release(release):
            continue
        entries = out[device][category]
        if change == "added":
            entries.remove(entry)
        else:
            entries.append(entry)
    if version.partition("+")[2] == "cpu":
        for device, category, entry in CUDNN_ONLY:
            out[device][category].remove(entry)
    if _release(version) == _release(TABLE_TORCH_VERSION):
        out.update({device: {cat: list(entries) for cat, entries in table.items()}
                    for device, table in DEVICE_TABLES.items()})  # fmt: skip
    return {device: {cat: tuple(e) for cat, e in table.items()} for device, table in out.items()}


def release_name(version: str) -> str:
    """``version`` as a release whose lists :func:`tables_for` reproduces (``"2.11.0"`` ->
    ``"2.11"``); :class:`ValueError` in one line for one it does not.

    >>> release_name("2.12.1")
    '2.12'
    >>> release_name("2.5")
    Traceback (most recent call last):
    ...
    ValueError: ampgraph's tables reach back to torch 2.6 and up to 2.14, not 2.5
    """
    try:
        release = _release(version)
    except ValueError:
        raise ValueError(f"{version!r} is no torch release: give one such as 2.11") from None
    if not _release(HISTORY_FROM) <= release <= _release(TABLE_TORCH_VERSION):
        raise ValueError(
            f"ampgraph's tables reach back to torch {HISTORY_FROM} and up to "
            f"{TABLE_TORCH_VERSION}, not {version}"
        )
    return "{}.{}".format(*release)


def installed_torch() -> str:
    """The installed torch's version, read from its metadata (this module never imports torch)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return TABLE_TORCH_VERSION


#: For fp32_append_dtype: the overload each wrapped overload redispatches to, with a dtype added.
APPEND_DTYPE_REDISPATCH: Final[dict[str, str]] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

BANNED_MESSAGE: Final = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


#: The tables for the torch that is installed: what lookups read.
ACTIVE_TABLES: Final = tables_for(installed_torch())
#: The release whose lists those are (reports record it as ``versions.policy_tables``).
ACTIVE_RELEASE: Final = "{}.{}".format(
    *min(_release(installed_torch()), _release(TABLE_TORCH_VERSION))
)


#: What a table says about one entry: a category, or None for "no policy" (an entry another
#: release's lists or a what-if move took off every list).
Tables = Mapping[str, Mapping[str, tuple[str, ...]]]


def _index(
    tables: Tables = ACTIVE_TABLES, known: Tables | None = None
) -> dict[tuple[str, str], str | None]:
    """(device type, entry) -> category for every entry of ``tables``; entries that ``known``
    lists and ``tables`` does not map to None: their absence is a decision, not ignorance."""
    index: dict[tuple[str, str], str | None] = {}
    for device_type, table in (known or {}).items():
        for entries in table.values():
            index.update(((device_type, entry), None) for entry in entries)
    for device_type, table in tables.items():
        for category, entries in table.items():
            for entry in entries:
                index[(device_type, entry)] = category
    return index


@dataclass(frozen=True)
class _InUse:
    """The tables :func:`lookup` reads, indexed; the release reports record; a number no other
    tables ever had in this process (unlike ``id(index)``, it needs no index kept alive after
    use); and what the annotation learnt under these tables (:func:`tables_memo`), which goes
    when they do, so repeated what-ifs keep nothing of the tables they read."""

    index: dict[tuple[str, str], str | None]
    release: str
    key: int
    memo: set[Any] = field(default_factory=set, compare=False, repr=False)


#: The tables the analysis running in this thread (or asyncio task) reads: the installed
#: torch's, unless :func:`tables_in_use` says else. A context variable, not a module global an
#: analysis rebinds: analyses in two threads each read their own, and nothing outlives the block.
_IN_USE: contextvars.ContextVar[_InUse] = contextvars.ContextVar(
    "ampgraph_policy_tables", default=_InUse(_index(), ACTIVE_RELEASE, 0)
)
#: Where the numbers of :attr:`_InUse.key` come from (``next`` is atomic under the GIL).
_KEYS = itertools.count(1)


def tables_key() -> int:
    """A number that names the tables :func:`lookup` reads now, never reused for other tables.

    >>> before = tables_key()
    >>> with tables_in_use(tables_for("2.11"), "2.11"):
    ...     tables_key() != before
    True
    >>> tables_key() == before
    True
    """
    return _IN_USE.get().key


def tables_memo() -> set[Any]:
    """What the annotation remembers of the tables :func:`lookup` reads now (composite ops whose
    decomposition reaches no policy: :mod:`ampgraph.annotate.composite`): kept with the tables,
    so it lives while they are in use (the installed torch's: the process) and no longer.

    >>> with tables_in_use(tables_for("2.11"), "2.11"):
    ...     tables_memo().add("seen")
    ...     "seen" in tables_memo()
    True
    >>> "seen" in tables_memo()
    False
    """
    return _IN_USE.get().memo


def release_in_use() -> str:
    """The torch release whose lists :func:`lookup` reads now (reports record it).

    >>> release_in_use() == ACTIVE_RELEASE
    True
    """
    return _IN_USE.get().release


@contextlib.contextmanager
def tables_in_use(tables: Tables, release: str) -> Iterator[None]:
    """Read ``tables`` (another release's, :func:`tables_for`; or moved ones, :func:`moved`)
    instead of the installed torch's while it lasts; ``release`` is what reports record.

    An entry the installed torch lists and ``tables`` does not has no policy: the annotator does
    not mistake the installed dispatcher's kernel for it for an unknown one (:func:`decided`).

    >>> with tables_in_use(tables_for("2.11"), "2.11"):
    ...     lookup("cuda", "aten::rms_norm", ""), release_in_use()
    (None, '2.11')
    >>> lookup("cuda", "aten::rms_norm", "")
    'fp32'
    """
    token = _IN_USE.set(_InUse(_index(tables, ACTIVE_TABLES), release, next(_KEYS)))
    try:
        yield
    finally:
        _IN_USE.reset(token)


def current_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    """The lists :func:`lookup` reads now, as tables (what :func:`moved` moves entries in).

    >>> "layer_norm" in current_tables()["cuda"][FP32]
    True
    """
    out: dict[str, dict[str, list[str]]] = {}
    for (device_type, entry), category in _IN_USE.get().index.items():
        if category is not None:
            out.setdefault(device_type, {}).setdefault(category, []).append(entry)
    return {d: {c: tuple(e) for c, e in table.items()} for d, table in out.items()}


#: Where :func:`moved` can put an entry: the lists whose rule a preview can apply to any op, and
#: none (off every list).
MOVE_TARGETS: Final = (LOWER_PRECISION_FP, FP32, FP32_SET_OPT_DTYPE, PROMOTE, "none")


def moved(
    tables: Tables, device_type: str, moves: Mapping[str, str]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """``tables`` with each entry of ``moves`` (``{"softmax.int": "lower_precision_fp"}``) taken
    off ``device_type``'s lists and put on the one it names (``"none"``: on none).

    >>> t = moved(TABLES, "cuda", {"softmax.int": LOWER_PRECISION_FP, "layer_norm": "none"})
    >>> "softmax.int" in t["cuda"][LOWER_PRECISION_FP], "softmax.int" in t["cuda"][FP32_SET_OPT_DTYPE]
    (True, False)
    >>> any("layer_norm" in entries for entries in t["cuda"].values())
    False
    """
    out = {device: {cat: list(entries) for cat, entries in table.items()}
           for device, table in tables.items()}  # fmt: skip
    lists = out.setdefault(device_type, {})
    for entry, target in moves.items():
        if target not in MOVE_TARGETS:
            raise ValueError(f"cannot move {entry} to {target!r}: use one of {MOVE_TARGETS}")
        for entries in lists.values():
            while entry in entries:
                entries.remove(entry)
        if target != "none":
            lists.setdefault(target, []).append(entry)
    return {device: {cat: tuple(e) for cat, e in table.items()} for device, table in out.items()}


def entry_name(schema_name: str, overload: str) -> str:
    """``("aten::softmax", "int")`` -> ``"softmax.int"``; the default overload has no suffix."""
    op = schema_name.removeprefix("aten::")
    return f"{op}.{overload}" if overload and overload != "default" else op


def lookup(device_type: str, schema_name: str, overload: str) -> str | None:
    """The autocast category of one op overload on one device type, or None when it has none.

    ATen ops read the tables. Ops of other libraries have a category only where the installed
    dispatcher has an autocast kernel for them (:func:`library_rule`): the rule of a wrapper
    ampgraph knows, ``register_autocast``'s, or :data:`OPAQUE`; a what-if move of such an op
    (``ns::op`` in :func:`moved`'s tables) comes first.

    >>> lookup("cuda", "aten::softmax", "int"), lookup("cuda", "aten::relu", "")
    ('fp32_set_opt_dtype', None)
    """
    if not schema_name.startswith("aten::"):
        name = f"{schema_name}.{overload}" if overload and overload != "default" else schema_name
        index = _IN_USE.get().index
        if (device_type, name) in index:
            return index[(device_type, name)]
        rule = library_rule(device_type, name)
        return rule.category if rule is not None else None
    return _IN_USE.get().index.get((device_type, entry_name(schema_name, overload)))


def decided(device_type: str, schema_name: str, overload: str) -> bool:
    """Whether the lists in use decide the op themselves, no policy included: False only for an
    op they do not mention, whose autocast kernel (if the dispatcher has one) is then unknown.

    >>> decided("cuda", "aten::linear", ""), decided("cuda", "aten::relu", "")
    (True, False)
    """
    name = (
        entry_name(schema_name, overload)
        if schema_name.startswith("aten::")
        else (f"{schema_name}.{overload}" if overload and overload != "default" else schema_name)
    )
    return (device_type, name) in _IN_USE.get().index


def autocast_kernels(device_type: str) -> dict[str, str]:
    """Every op with an autocast kernel for ``device_type`` in the installed dispatcher.

    The value is the category ampgraph applies: its table's for ATen ops (an ATen op with a kernel
    but no entry is :data:`OPAQUE`: the tables are out of date), :func:`library_rule`'s for any
    other op (a known library wrapper, ``register_autocast``, or :data:`OPAQUE`).
    :mod:`ampgraph.docs.reference` builds the ``ampgraph policy`` reference from it.

    >>> autocast_kernels("cuda")["aten::layer_norm"]
    'fp32'
    """
    import torch

    key = autocast_key(device_type)
    if key is None:
        return {}
    out: dict[str, str] = {}
    index = _IN_USE.get().index
    entries = registered_entries(device_type) if device_type in ACTIVE_TABLES else set()
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            continue
        base, _, overload = name.partition(".")
        if base.startswith("aten::"):
            entry = entry_name(base, overload)
            out[name] = index.get((device_type, entry), OPAQUE) if entry in entries else OPAQUE
        else:
            rule = library_rule(device_type, name)
            out[name] = rule.category if rule is not None else OPAQUE
    return out


def registered_entries(device_type: str) -> set[str]:
    """Every ``op[.overload]`` the table gives a policy for on ``device_type``."""
    return {entry for entries in ACTIVE_TABLES.get(device_type, {}).values() for entry in entries}
