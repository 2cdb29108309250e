"""Which convolution backend the CPU at hand takes, as ATen decides it: oneDNN or the slow kernels.

The CPU's ``aten.convolution`` picks its backend in ``_select_conv_backend``
(``aten/src/ATen/native/Convolution.cpp``), and each backend checks dtypes its own way: oneDNN
refuses a weight or a bias of another dtype than the input's, the slow kernels read the weight
as the input's type and take most biases. For an fp32 input the choice is by shapes and thread
count (``ConvParams::use_mkldnn``); for a 16-bit one it is by the machine: oneDNN takes a bf16
input where ``mkldnn_bf16_device_check()`` holds (AVX-512 BW/VL/DQ or AVX-NE-CONVERT) and an
fp16 one where ``mkldnn_fp16_device_check()`` holds (AVX512-FP16 or AVX-NE-CONVERT: an Intel
Xeon of the Sapphire Rapids class, not an AMD EPYC of Zen 4). torch says what this machine does:
``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` and ``_is_mkldnn_fp16_supported()`` are those
two functions. A prediction for the CPU is a prediction for this CPU, and says so where it
matters (:func:`note_for`: a report's ``capture.cpu_kernels``).

Tests make either machine with :func:`assumed` (a context manager), and compare with the real
kernels of the machine they run on; ``ONEDNN_MAX_CPU_ISA=AVX2`` in a child process makes a CPU
with AVX-512 take the slow kernels for bf16 too, which proves that branch on real kernels.

>>> import torch
>>> with assumed(OneDnn(enabled=True, bf16=True, fp16=False)):
...     takes_low_precision(torch.bfloat16), takes_low_precision(torch.float16)
(True, False)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch


class OneDnn(NamedTuple):
    """What oneDNN does for CPU convolutions here: in use at all, and for bf16 and fp16 inputs."""

    enabled: bool
    bf16: bool
    fp16: bool


def _probe(name: str) -> bool:
    """``torch.ops.mkldnn.<name>()``, False where this torch has no such op."""
    try:
        return bool(getattr(torch.ops.mkldnn, name)())
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def _machine() -> tuple[bool, bool, bool]:
    """(built with oneDNN, its bf16 device check, its fp16 device check): fixed per process."""
    built = torch.backends.mkldnn.is_available()
    return built, built and _probe("_is_mkldnn_bf16_supported"), built and _probe(
        "_is_mkldnn_fp16_supported"
    )


#: An assumed machine in force (tests), else None for the machine at hand. A context variable,
#: not a module list: an analysis in another thread predicts for the machine it is told of.
_ASSUMED: contextvars.ContextVar[OneDnn | None] = contextvars.ContextVar(
    "ampgraph_assumed_onednn", default=None
)


def onednn() -> OneDnn:
    """oneDNN on this machine now (``torch.backends.mkldnn.enabled`` is read each time, since
    ``torch.backends.mkldnn.flags(enabled=False)`` turns it off for a while)."""
    assumed_now = _ASSUMED.get()
    if assumed_now is not None:
        return assumed_now
    built, bf16, fp16 = _machine()
    return OneDnn(enabled=built and bool(torch.backends.mkldnn.enabled), bf16=bf16, fp16=fp16)


@contextlib.contextmanager
def assumed(support: OneDnn) -> Iterator[OneDnn]:
    """Predict for a machine whose oneDNN does ``support`` while the block lasts."""
    token = _ASSUMED.set(support)
    try:
        yield support
    finally:
        _ASSUMED.reset(token)


def takes_low_precision(dtype: torch.dtype) -> bool:
    """Whether a CPU convolution of a ``dtype`` input goes to oneDNN whatever its shape
    (``use_mkldnn``'s first branch; transposed ones with a big output padding excepted)."""
    support = onednn()
    if not support.enabled:
        return False
    return (dtype == torch.bfloat16 and support.bf16) or (dtype == torch.float16 and support.fp16)


def describe() -> str:
    """One line: the backend this machine's CPU convolutions take for 16-bit inputs.

    >>> with assumed(OneDnn(enabled=True, bf16=True, fp16=True)):
    ...     describe()
    'CPU convolutions: oneDNN for bf16 and fp16 inputs on this machine'
    """
    support = onednn()
    low = [n for n, on in (("bf16", support.bf16), ("fp16", support.fp16)) if on]
    if not support.enabled or not low:
        return "CPU convolutions: the slow kernels for bf16 and fp16 inputs on this machine"
    slow = [n for n in ("bf16", "fp16") if n not in low]
    tail = f", the slow kernels for {slow[0]}" if slow else ""
    return f"CPU convolutions: oneDNN for {' and '.join(low)} inputs{tail} on this machine"


#: The ops whose CPU kernels pick their backend in ``_select_conv_backend``.
_CONVOLUTIONS = ("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose",
                 "aten.convolution.", "aten._convolution.")  # fmt: skip


def note_for(nodes: Iterable[tuple[str, Iterable[str | None]]]) -> str | None:
    """:func:`describe`, where it matters to a CPU prediction: a convolution among ``nodes``
    (each its op and the dtypes it sees, its inputs' and its casts') with a 16-bit dtype.

    >>> with assumed(OneDnn(enabled=True, bf16=True, fp16=False)):
    ...     note_for([("aten.conv2d.default", ["float16"])])
    'CPU convolutions: oneDNN for bf16 inputs, the slow kernels for fp16 on this machine'
    >>> note_for([("aten.conv2d.default", ["float32"]), ("aten.add.Tensor", ["bfloat16"])]) is None
    True
    """
    for op, dtypes in nodes:
        if op.startswith(_CONVOLUTIONS) and {"bfloat16", "float16"} & set(dtypes):
            return describe()
    return None


__all__ = ["OneDnn", "assumed", "describe", "note_for", "onednn", "takes_low_precision"]
