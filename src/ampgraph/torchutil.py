"""Torch helpers every stage shares: dtype names, autocast state without a GPU, fake tensors.

One home for the small pieces of torch plumbing the capture, the annotator, the dispatcher check,
verify and the eager-hook oracle all need, so none of them imports another for them.

>>> torch_dtype("bfloat16"), dtype_name(torch.float16)
(torch.bfloat16, 'float16')
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"not a torch dtype: {name}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the spelling reports and renderers use."""
    return str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def autocast_state(device_type: str, enabled: bool, dtype: torch.dtype) -> Iterator[None]:
    """Enable or disable autocast for a device type, with no GPU needed.

    ``torch.autocast("cuda")`` turns itself off when CUDA is unavailable; setting the thread-local
    state directly keeps the real CUDA autocast kernels in the dispatch path for fake tensors.
    """
    was_enabled = torch.is_autocast_enabled(device_type)
    was_dtype = torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, was_enabled)
        torch.set_autocast_dtype(device_type, was_dtype)
        if not torch.is_autocast_enabled(device_type):
            torch.clear_autocast_cache()


@contextlib.contextmanager
def swapped_tensors(module: nn.Module, make: Any) -> Iterator[None]:
    """Temporarily replace every parameter and buffer of ``module`` by ``make(tensor)``.

    Tied parameters (OPT's lm_head and embed_tokens) stay tied: each distinct tensor is made once.
    The originals come back on exit, so a user's module is left as it was. So do tensors a
    module keeps as plain attributes, which its forward may replace: torchvision's
    ``AnchorGenerator`` moves ``self.cell_anchors`` to each call's device and dtype, and a fake
    CUDA run left fake tensors there that broke the next capture.
    """
    made: dict[int, torch.Tensor] = {}
    saved: list[tuple[nn.Module, str, str, torch.Tensor]] = []
    attributes = [
        (mod, name, value)
        for mod in module.modules()
        for name, value in vars(mod).items()
        if _holds_tensors(value)
    ]
    try:
        for mod in module.modules():
            for store in ("_parameters", "_buffers"):
                table = getattr(mod, store)
                for name, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    if id(tensor) not in made:
                        new = make(tensor)
                        if isinstance(tensor, nn.Parameter):
                            new = nn.Parameter(new, requires_grad=tensor.requires_grad)
                        made[id(tensor)] = new
                    saved.append((mod, store, name, tensor))
                    table[name] = made[id(tensor)]
        yield
    finally:
        for mod, store, name, tensor in saved:
            getattr(mod, store)[name] = tensor
        for mod, name, value in attributes:
            vars(mod)[name] = value


def _holds_tensors(value: Any) -> bool:
    """A tensor, or a list or tuple of them (not a parameter or buffer: those live apart)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


@contextlib.contextmanager
def quiet_logging() -> Iterator[None]:
    """Silence torch's own logging while tracing: a failed export logs the whole graph, and
    ampgraph reports the failure in one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def simulated_cuda_amp(device_type: str) -> Iterator[None]:
    """Let ``torch.autocast("cuda", ...)`` in model code behave as on a bf16-capable GPU.

    Without a GPU, ``torch.autocast("cuda")`` disables itself at construction, so a traced
    ``with torch.autocast("cuda", dtype=torch.float16):`` region would be recorded as disabled.
    The fake CUDA tensors being traced stand for such a GPU, so its availability checks answer yes.
    """
    if device_type != "cuda":
        yield
        return
    from unittest import mock

    import torch.cuda.amp.common as amp_common

    with mock.patch.object(amp_common, "amp_definitely_not_available", return_value=False), \
            mock.patch.object(torch.cuda, "is_bf16_supported", return_value=True):  # fmt: skip
        yield


def can_trace_fake(device_type: str) -> bool:
    """Whether this torch build can trace with fake tensors on ``device_type``."""
    return device_type == "cpu" or torch.backends.cuda.is_built()


@contextlib.contextmanager
def silenced(logger_name: str) -> Iterator[None]:
    """Mute one logger for a while (torch's fake-tensor error log: the error is the finding)."""
    logger = logging.getLogger(logger_name)
    previous = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = previous


def fake_mode() -> FakeTensorMode:
    """Fake tensors that also take ops whose output shape depends on the data.

    A boolean-mask index (``y[y > 0]``), ``nonzero`` or ``unique`` has an output size no fake
    tensor can know; with a shape environment it gets an unbacked symbolic size (as torch.export
    gives it), and its dtype, which never depends on the size, is known as for any other op.
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


@contextlib.contextmanager
def unbacked_values(values: dict[str, int | float]) -> Iterator[None]:
    """Give each data-dependent size a tracer makes (``u0``, ``u1``, ...) the value in ``values``.

    The shape environment then decides a branch on such a size as those values decide it, and
    records the decision as a runtime assertion, as ``draft_export`` does with real tensors;
    here the tensors can stay fake, in any device and dtype.

    >>> with fake_mode() as mode, unbacked_values({"u0": 3}):
    ...     kept = mode.from_tensor(torch.ones(5)).nonzero()
    ...     print("empty" if kept.shape[0] == 0 else "kept")
    kept
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    original = ShapeEnv.create_unbacked_symint

    def create(self: ShapeEnv, *args: Any, **kwargs: Any) -> torch.SymInt:
        symbol = original(self, *args, **kwargs)
        value = values.get(str(symbol.node.expr))
        if value is not None:
            self.set_real_tensor_prop_unbacked_vals(symbol.node.expr, value)
        return symbol

    original_bool = ShapeEnv.create_unbacked_symbool

    def create_bool(self: ShapeEnv) -> torch.SymBool:
        # ``bool(x.all())``: the truth value is ``Eq(u0, 1)`` on a symbol given the same way.
        truth = original_bool(self)
        symbol = truth.node.expr.args[0]
        value = values.get(str(symbol))
        if value is not None:
            self.set_real_tensor_prop_unbacked_vals(symbol, value)
        return truth

    original_float = ShapeEnv.create_unbacked_symfloat

    def create_float(self: ShapeEnv) -> torch.SymFloat:  # ``x.max().item()``
        number = original_float(self)
        value = values.get(str(number.node.expr))
        if value is not None:
            self.set_real_tensor_prop_unbacked_vals(number.node.expr, value)
        return number

    ShapeEnv.create_unbacked_symint = create  # type: ignore[method-assign]
    ShapeEnv.create_unbacked_symbool = create_bool  # type: ignore[method-assign]
    ShapeEnv.create_unbacked_symfloat = create_float  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShapeEnv.create_unbacked_symint = original  # type: ignore[method-assign]
        ShapeEnv.create_unbacked_symbool = original_bool  # type: ignore[method-assign]
        ShapeEnv.create_unbacked_symfloat = original_float  # type: ignore[method-assign]


__all__ = [
    "autocast_state",
    "can_trace_fake",
    "dtype_name",
    "fake_mode",
    "quiet_logging",
    "silenced",
    "simulated_cuda_amp",
    "swapped_tensors",
    "torch_dtype",
    "unbacked_values",
]
