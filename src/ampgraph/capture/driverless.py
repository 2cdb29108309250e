"""CUDA kernels that need a GPU driver even on fake tensors, made to run on fake ones.

Some CUDA code paths ask the driver for something before any tensor is touched (DESIGN.md fact
13), so on a machine without a GPU they raise "Found no NVIDIA driver" or "CUDA driver version is
insufficient" even on fake tensors -- which says nothing about the model. Here they get
shape-and-dtype stand-ins that follow the real code path, so the annotator, the dispatcher check
and the eager-hook oracle all see what a GPU does:

* **Meta kernels** (:func:`install`, inside an analysis only): the fused RNN cells ``_thnn_fused_gru_cell``
  (``nn.GRUCell``) and cuDNN's grid sampler (``F.grid_sample``, RAFT) have none, so fake tensors
  ran the real CUDA kernel.
* **cuDNN RNNs** (:func:`cudnn_rnn_stand_ins`, only while fake tensors run): the composite
  ``lstm``/``gru``/``rnn_tanh``/``rnn_relu`` kernels of ``aten/src/ATen/native/RNN.cpp`` send
  CUDA inputs to ``cudnn/RNN.cpp``'s ``_cudnn_impl``, which asks cuDNN for the weight layout
  (``try_get_weight_buf``) before it calls ``aten::_cudnn_rnn``. The stand-in makes the same
  ``_cudnn_rnn`` call without that query (``weight_buf`` is an optimisation, not a dtype), so
  ``_cudnn_rnn``'s own meta kernel and -- under autocast -- its real autocast kernel run.

``_cudnn_rnn``'s autocast kernel (``aten/src/ATen/cudnn/AutocastRNN.cpp``,
``_cudnn_rnn_cast_reflatten``) casts to **fp16 whatever autocast's dtype is**: an ``nn.LSTM``
under ``torch.autocast("cuda", dtype=torch.bfloat16)`` returns fp16. Its first step, copying the
weights into an fp16 buffer laid out by cuDNN, is the one that needs the driver; the stand-in
does that cast itself (the same dtypes) and leaves the rest of the wrapper -- the casts of
input, ``hx`` and ``cx``, which decide the output dtype -- to the real kernel.

>>> uses_cudnn(torch.empty(2, 3))   # a CPU tensor takes RNN.cpp's native path
False
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ampgraph.capture import driverless_29
from ampgraph.capture.scoped_library import ScopedLibrary

aten = torch.ops.aten

#: cudnnRNNMode_t, as ``_cudnn_rnn``'s ``mode`` argument takes it.
CUDNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
#: What RNN.cpp's ``use_cudnn`` accepts. bf16 needs compute capability 8.0 or newer
#: (``supportsBFloat16RNNWithCuDNN``): ampgraph models a bf16-capable GPU throughout.
CUDNN_RNN_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def install() -> Callable[[], None]:
    """Meta kernels for the CUDA ops that have none and so ran their CUDA kernel on fake tensors,
    until the returned function runs (:mod:`ampgraph.capture.environment` calls both).

    Outputs are allocated as ``aten/src/ATen/native/cuda/RNN.cu`` (``hy = empty_like(hx)``, a
    workspace in the gates' options) and ``cudnn/GridSampler.cpp`` (the input's options) do.
    """
    lib = ScopedLibrary("aten")  # destroyed by the undo

    def has_meta(name: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta")

    def gru_cell(ig, hg, hx, ib=None, hb=None):  # type: ignore[no-untyped-def]
        return hx.new_empty(hx.shape), ig.new_empty((hx.shape[0], 5 * hx.shape[1]))

    def grid_sampler(x, grid):  # type: ignore[no-untyped-def]
        return x.new_empty((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]))

    kernels: tuple[tuple[str, Callable[..., Any]], ...] = (
        ("_thnn_fused_gru_cell", gru_cell),
        ("cudnn_grid_sampler", grid_sampler),
        *_CUDNN_META,
    )
    try:
        for name, kernel in kernels:
            if not has_meta(name.partition(".")[0]):
                # Refused over a Python kernel torch does not give back (capture/scoped_library).
                lib.impl(name, kernel, "Meta", restorable_only=True)
    except BaseException:
        lib.destroy()
        raise
    return lib.destroy


def _same_type(op: str, *tensors: torch.Tensor | None) -> None:
    """cuDNN's ``checkAllSameType`` (``cudnn/ConvShared.cpp``): its message is not written here,
    so a mismatch is reported as what it is on this machine, a check only a GPU runs."""
    dtypes = [t.dtype for t in tensors if t is not None]
    if len(set(dtypes)) > 1:
        raise RuntimeError(
            f"{op} checks that its tensors share one dtype ({', '.join(map(str, dtypes))}) in "
            f"cuDNN itself: Found no NVIDIA driver on this machine to run that check"
        )


def _conv(x: torch.Tensor, w: torch.Tensor, stride: Any, padding: Any, dilation: Any,
          groups: int, transposed: bool = False, output_padding: Any = None) -> torch.Tensor:  # fmt: skip
    """The output of a cuDNN convolution: ``convolution``'s shape, the input's dtype (cuDNN
    allocates it with ``input->options()``)."""
    output_padding = output_padding if output_padding is not None else [0] * len(stride)
    out = aten.convolution.default(
        x, w.to(x.dtype), None, stride, padding, dilation, transposed, output_padding, groups
    )
    return out.to(x.dtype)


def _cudnn_convolution(x, w, padding, stride, dilation, groups, *_flags):  # type: ignore[no-untyped-def]
    _same_type("cudnn_convolution", x, w)
    return _conv(x, w, stride, padding, dilation, groups)


def _cudnn_convolution_transpose(x, w, padding, output_padding, stride, dilation, groups, *_flags):  # type: ignore[no-untyped-def]
    _same_type("cudnn_convolution_transpose", x, w)
    return _conv(x, w, stride, padding, dilation, groups, True, output_padding)


def _cudnn_convolution_relu(x, w, bias, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
    _same_type("cudnn_convolution_relu", x, w, bias)
    return _conv(x, w, stride, padding, dilation, groups)


def _cudnn_convolution_add_relu(x, w, z, alpha, bias, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
    _same_type("cudnn_convolution_add_relu", x, w, z, bias)
    return _conv(x, w, stride, padding, dilation, groups)


def _cudnn_affine_grid_generator(theta, n, c, h, w):  # type: ignore[no-untyped-def]
    """``cudnn/AffineGridGenerator.cpp``: an ``{N, H, W, 2}`` grid in ``theta``'s options."""
    return theta.new_empty((n, h, w, 2))


def _cudnn_ctc_loss(log_probs, targets, input_lengths, target_lengths, *_rest):  # type: ignore[no-untyped-def]
    """``cudnn/LossCTC.cpp``: costs ``{batch}`` and a gradient like ``log_probs``, in its options
    (cuDNN takes fp32 log-probabilities only; ``ctc_loss`` sends nothing else there)."""
    if log_probs.dtype != torch.float32:
        _same_type("_cudnn_ctc_loss", log_probs, log_probs.new_empty((), dtype=torch.float32))
    return log_probs.new_empty((log_probs.shape[1],)), log_probs.new_empty(log_probs.shape)


#: cuDNN ops that have no meta kernel, so fake tensors ran their CUDA kernel, which asks the driver
#: first: a model that calls them directly (``torch.cudnn_convolution``) stopped the capture.
_CUDNN_META: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("cudnn_convolution", _cudnn_convolution),
    ("cudnn_convolution_transpose", _cudnn_convolution_transpose),
    ("cudnn_convolution_relu", _cudnn_convolution_relu),
    ("cudnn_convolution_add_relu", _cudnn_convolution_add_relu),
    ("cudnn_affine_grid_generator", _cudnn_affine_grid_generator),
    ("_cudnn_ctc_loss", _cudnn_ctc_loss),
    ("_cudnn_ctc_loss.Tensor", _cudnn_ctc_loss),
)


def uses_cudnn(t: torch.Tensor) -> bool:
    """RNN.cpp's ``use_cudnn``: whether a GPU runs an RNN on this input with cuDNN.

    A meta tensor stands for a CUDA one (a CPU-only torch replays CUDA settings on meta).
    """
    return (
        t.device.type in ("cuda", "meta")
        and torch.backends.cudnn.enabled
        and t.dtype in CUDNN_RNN_DTYPES
        and t.numel() != 0
    )


def _autocast_weights(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """What ``_cudnn_rnn_cast_reflatten`` does to the weights first: an fp16 copy, when the first
    weight is eligible (floating, on CUDA, not fp64) and not fp16 already. Only under CUDA
    autocast (the wrapper runs only then); the copy into cuDNN's layout is what needs a driver."""
    first = weights[0]
    if not (
        torch.is_autocast_enabled("cuda")
        and first.device.type == "cuda"
        and first.is_floating_point()
        and first.dtype not in (torch.float64, torch.float16)
    ):
        return weights
    return [w.to(torch.float16) for w in weights]


def _cudnn_rnn(
    kind: str,
    x: torch.Tensor,
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    params: list[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, ...]:
    """cudnn/RNN.cpp ``_cudnn_impl`` for an unpacked input, minus ``try_get_weight_buf``."""
    hidden_size, proj_size = hx.shape[2], 0
    if cx is not None and cx.shape[2] != hx.shape[2]:  # an LSTM with projections
        hidden_size, proj_size = cx.shape[2], hx.shape[2]
    stride0 = (4 if has_biases else 2) + (1 if proj_size else 0)
    out = aten._cudnn_rnn.default(
        x, _autocast_weights(list(params)), stride0, None, hx, cx, CUDNN_MODES[kind],
        hidden_size, proj_size, num_layers, batch_first, dropout, train, bidirectional, [], None,
    )  # fmt: skip
    return out[:3] if cx is not None else out[:2]


def _stand_in(op: torch._ops.OpOverload, kind: str) -> Callable[..., Any]:
    def composite(*args: Any, **kwargs: Any) -> Any:
        # Anything RNN.cpp would not send to cuDNN takes the real composite, as on a GPU.
        return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)

    def kernel(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):  # type: ignore[no-untyped-def]
        if not uses_cudnn(x):
            return composite(
                x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
            )
        h, c = (hx[0], hx[1]) if kind == "lstm" else (hx, None)
        return _cudnn_rnn(
            kind, x, h, c, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first,
        )  # fmt: skip

    kernel.__name__ = f"cudnn_{kind}_stand_in"
    return kernel


#: op -> the stand-in for its CUDA path. Packed sequences (``lstm.data``) are not covered: their
#: ``batch_sizes`` are values a fake tensor does not have; such nodes stay "not analysed".
STAND_INS: dict[torch._ops.OpOverload, Callable[..., Any]] = {
    op: _stand_in(op, kind)
    for op, kind in (
        (aten.lstm.input, "lstm"),
        (aten.gru.input, "gru"),
        (aten.rnn_tanh.input, "rnn_tanh"),
        (aten.rnn_relu.input, "rnn_relu"),
    )
}


@contextmanager
def cudnn_rnn_stand_ins(device: str) -> Iterator[None]:
    """While fake tensors on ``device`` run, route CUDA RNNs to :data:`STAND_INS`.

    The composites run at the Autograd key, above every dispatch mode, so the stand-ins are
    registered there (``AutogradCUDA``; ``AutogradMeta`` too where meta tensors stand for CUDA)
    for the duration only: a real GPU run outside this context is never affected.
    """
    keys = {"cuda": ("AutogradCUDA",), "meta": ("AutogradCUDA", "AutogradMeta")}.get(device, ())
    if not keys:
        yield
        return
    lib = ScopedLibrary("aten")  # destroyed on exit
    try:
        for op, kernel in STAND_INS.items():
            for key in keys:
                name = op._schema.name.removeprefix("aten::")
                lib.impl(f"{name}.{op._overloadname}", kernel, key, restorable_only=True)
        yield
    finally:
        lib.destroy()


def decomposition(op: torch._ops.OpOverload) -> Callable[..., Any] | None:
    """The stand-in for ``op``'s CUDA composite, for tracers that call composites directly."""
    return STAND_INS.get(op) or driverless_29.STAND_INS.get(op)


__all__ = [
    "CUDNN_MODES", "STAND_INS", "cudnn_rnn_stand_ins", "decomposition", "install", "uses_cudnn",
]
