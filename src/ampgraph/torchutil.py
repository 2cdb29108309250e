"""Torch helpers every stage shares: dtype names, autocast state without a GPU, fake tensors.

One home for the small pieces of torch plumbing the capture, the annotator, the dispatcher check,
verify and the eager-hook oracle all need, so none of them imports another for them.

>>> torch_dtype("bfloat16"), dtype_name(torch.float16)
(torch.bfloat16, 'float16')
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"not a torch dtype: {name}")
    return dtype


#: c10::ScalarType's names, as ``TORCH_CHECK`` prints a tensor's ``scalar_type()``.
_SCALAR_TYPE = {
    torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half",
    torch.float64: "Double", torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool",
}  # fmt: skip


def scalar_type_name(t: torch.Tensor) -> str:
    """``t``'s dtype as a kernel's error message names it (c10::ScalarType).

    >>> scalar_type_name(torch.empty(1, dtype=torch.bfloat16))
    'BFloat16'
    """
    return _SCALAR_TYPE.get(t.dtype, str(t.dtype))


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the spelling reports and renderers use."""
    return str(dtype).removeprefix("torch.")


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors among the leaves of a node's value (a tensor, or tuples and lists of them).

    >>> len(tensor_leaves((torch.empty(1), 3, [torch.empty(2)])))
    2
    """
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def device_type_of(t: torch.Tensor) -> str:
    """The device type autocast would see for ``t``: a meta tensor stands in for CUDA, where a
    CPU-only torch cannot make fake CUDA tensors (``annotate.replay.replay_device``).

    >>> device_type_of(torch.empty(1, device="meta"))
    'cuda'
    """
    kind = t.device.type
    return "cuda" if kind == "meta" else kind


def traced_node(t: torch.Tensor, tracer: Any = None) -> fx.Node | None:
    """The graph node ``make_fx``'s ``tracer`` (default: the current trace's) tracks for ``t``,
    or None where it tracks none (``torch.vmap``'s batched view of a traced tensor, a real tensor
    the model holds) or nothing is being traced.

    Looked up with a default, never through the error torch raises without one: that error's
    message formats ``t`` while the trace is running, and formatting a tensor reads its elements
    (``item()``), which the trace records as graph nodes on ``t`` lifted as a constant. Inside
    ``torch.vmap`` (transformers builds attention masks with it) that constant is a batched
    tensor of a vmap level that is gone once the forward returns: no real run can read it.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> held, seen = torch.ones(1), []                  # held: a real tensor, made before
    >>> def f(x):
    ...     seen.append((traced_node(x), traced_node(held)))
    ...     return x + 1
    >>> gm = make_fx(f)(torch.ones(2))
    >>> seen, len(gm.graph.nodes)                     # looking ``held`` up traced nothing
    ([(x_1, None)], 3)
    >>> traced_node(held) is None                     # no trace running
    True
    """
    from torch.fx.experimental import proxy_tensor

    if tracer is None:
        tracer = getattr(proxy_tensor.get_proxy_mode(), "tracer", None)
    if tracer is None:
        return None
    slot = proxy_tensor.get_proxy_slot(t, tracer, None)
    return slot.proxy.node if slot is not None else None


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
    conversions = _conversions_of_fakes()
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
        with conversions:
            yield
    finally:
        for mod, store, name, tensor in saved:
            getattr(mod, store)[name] = tensor
        for mod, name, value in attributes:
            vars(mod)[name] = value


@contextlib.contextmanager
def _conversions_of_fakes() -> Iterator[None]:
    """Let model code convert a module whose parameters are fake (``self.classifier =
    self.classifier.to(self.dtype)`` in SwitchTransformers' router forward) as a real run does.

    ``Module._apply`` swaps a fake parameter for its converted copy in place
    (``torch.utils.swap_tensors``), which a fake tensor refuses (``_apply(): Couldn't swap
    Linear.weight``: its mode keeps weak references to it), and the whole capture was lost. A
    real run changes the parameter's data and keeps going; here the module gets a new parameter
    holding the converted value (what ``Module._apply`` does with
    ``torch.__future__.set_overwrite_module_params_on_conversion(True)``), which a tracer records
    as the conversion it is, and :func:`swapped_tensors` restores the original on exit.

    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> lin = nn.Linear(2, 2)
    >>> with FakeTensorMode() as mode:
    ...     with swapped_tensors(lin, lambda t: mode.from_tensor(t).to(torch.bfloat16)):
    ...         lin.to(torch.float32).weight.dtype
    torch.float32
    >>> lin.weight.dtype, type(lin.weight).__name__
    (torch.float32, 'Parameter')
    """
    original = nn.Module._apply

    def _apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        from torch._subclasses.fake_tensor import FakeTensor

        fakes = any(isinstance(p, FakeTensor) for p in self._parameters.values())
        if not fakes:
            return original(self, fn, recurse)
        if recurse:
            for child in self.children():
                child._apply(fn)
        for key, param in self._parameters.items():
            if param is not None:
                with torch.no_grad():
                    applied = fn(param)
                self._parameters[key] = nn.Parameter(applied, requires_grad=param.requires_grad)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    nn.Module._apply = _apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = original  # type: ignore[method-assign]


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


#: Lines torch logs while libraries import that say nothing about the user's model, by logger:
#: torchao 0.18's enums registered as pytree constants (torch 2.14 deprecates that), and the CUDA
#: build's "No CUDA runtime is found" where Inductor imports ``cpp_extension`` on a machine
#: without a GPU (the compiled analysis plans the CPU backend, which needs none).
_NOTICES = {
    "torch.utils._pytree": "is an Enum subclass and is now natively supported",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


class _Notice(logging.Filter):
    """Drops the records of one logger whose message holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def quiet_library_imports() -> Iterator[None]:
    """Keep torch's notices that say nothing about the model (:data:`_NOTICES`) off stderr while
    model code or Inductor imports libraries (transformers imports torchao where it is installed;
    Inductor imports ``cpp_extension``): they would reach every command's output. Only those
    lines are dropped, and only inside the block: each logger is left as it was found.

    >>> import logging
    >>> log = logging.getLogger("torch.utils._pytree")
    >>> with quiet_library_imports():
    ...     len(log.filters)
    1
    >>> len(log.filters)
    0
    """
    added = [(logging.getLogger(name), _Notice(text)) for name, text in _NOTICES.items()]
    for log, notice in added:
        log.addFilter(notice)
    try:
        yield
    finally:
        for log, notice in added:
            log.removeFilter(notice)


def dropping_notice(logger_name: str, text: str) -> Callable[[], None]:
    """Drop the records of ``logger_name`` whose message holds ``text`` until the returned undo
    is called (for :mod:`ampgraph.capture.environment`, which applies its changes and undoes
    them in steps); the logger is otherwise left as it was.

    >>> import logging
    >>> undo = dropping_notice("torch.fx.experimental.symbolic_shapes", "evaluate_expr")
    >>> len(logging.getLogger("torch.fx.experimental.symbolic_shapes").filters)
    1
    >>> undo(); len(logging.getLogger("torch.fx.experimental.symbolic_shapes").filters)
    0
    """
    log, notice = logging.getLogger(logger_name), _Notice(text)
    log.addFilter(notice)
    return functools.partial(log.removeFilter, notice)


#: The GPU that fake CUDA tensors stand for, where model code asks the device what it is: a
#: bf16-capable Hopper (compute capability 9.0), so code that picks a kernel by capability
#: (transformers' MoE experts take ``torch._grouped_mm`` from 8.0 on) follows a current GPU's path.
VIRTUAL_GPU_NAME = "NVIDIA H100 80GB HBM3"
VIRTUAL_GPU_CAPABILITY = (9, 0)


class VirtualGpuProperties:
    """What ``torch.cuda.get_device_properties`` returns for :data:`VIRTUAL_GPU_NAME` (the fields
    model code reads; an H100 SXM's figures).

    >>> VirtualGpuProperties().major, VirtualGpuProperties().name
    (9, 'NVIDIA H100 80GB HBM3')
    """

    name = VIRTUAL_GPU_NAME
    major, minor = VIRTUAL_GPU_CAPABILITY
    total_memory = 80 * 1024**3
    multi_processor_count = 132
    warp_size = 32
    is_integrated = 0
    is_multi_gpu_board = 0
    max_threads_per_multi_processor = 2048
    L2_cache_size = 50 * 1024**2
    gcnArchName = "NVIDIA H100 80GB HBM3"

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor})"


#: The grad mode a forward pass runs in, as the report names it: inference (the seed notebook,
#: users' inference and ``verify``'s real run: ``torch.inference_mode()``) or a training step's.
INFERENCE = "inference"
GRAD_ON = "grad"


def grad_mode_name(training: bool) -> str:
    """The name of the grad mode :func:`forward_grad_mode` sets (``"inference"`` or ``"grad"``).

    >>> grad_mode_name(False), grad_mode_name(True)
    ('inference', 'grad')
    """
    return GRAD_ON if training else INFERENCE


@contextlib.contextmanager
def forward_grad_mode(training: bool) -> Iterator[None]:
    """The grad mode a real forward runs in, whatever the caller's: ``torch.inference_mode()``
    for inference (the seed notebook's, users' and ``verify``'s real run), grad on for a
    training step. A trace or a run on fake tensors takes :func:`traced_grad_mode` instead.

    >>> with forward_grad_mode(False):
    ...     torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    (False, True)
    >>> with torch.inference_mode(), forward_grad_mode(True):
    ...     torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    (True, False)
    """
    if not training:
        with torch.inference_mode():
            yield
        return
    # enable_grad alone leaves a caller's inference_mode on (no autograd graph is recorded).
    with torch.inference_mode(False), torch.enable_grad():
        yield


@contextlib.contextmanager
def traced_grad_mode(training: bool) -> Iterator[None]:
    """:func:`forward_grad_mode` as model code reads it, for a trace or a run on fake tensors.

    Model code branches on the grad mode (an MoE router's ``if not torch.is_grad_enabled():``
    fast path), so a forward is traced in the mode a real run of its pass has. Under a real
    ``inference_mode`` the tracers record composite ops whole and run them with autocast's
    keys excluded (an ``einsum`` under CPU autocast records fp32 where a real run gives bf16),
    so inference is traced under ``no_grad``, which reads the same for ``is_grad_enabled()``,
    and the model's own ``torch.is_inference_mode_enabled()`` reads answer True, as in a real
    inference run; torch's own machinery reads the trace's real mode.

    >>> with torch.inference_mode(), traced_grad_mode(False):
    ...     torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    (False, True)
    >>> with traced_grad_mode(True):
    ...     torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    (True, False)
    """
    if training:
        with forward_grad_mode(True):
            yield
        return
    real = torch.is_inference_mode_enabled

    def is_inference_mode_enabled() -> bool:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return real() if caller.partition(".")[0] == "torch" else True

    torch.is_inference_mode_enabled = is_inference_mode_enabled
    try:
        with torch.inference_mode(False), torch.no_grad():
            yield
    finally:
        torch.is_inference_mode_enabled = real


@contextlib.contextmanager
def simulated_cuda_amp(device_type: str) -> Iterator[None]:
    """Let model code that asks the GPU what it is get the answers of a bf16-capable GPU.

    Without a GPU, ``torch.autocast("cuda")`` disables itself at construction, so a traced
    ``with torch.autocast("cuda", dtype=torch.float16):`` region would be recorded as disabled;
    and ``torch.cuda.get_device_capability()`` asks the driver, so a forward that picks its kernel
    by capability raised "Found no NVIDIA driver" in the trace and in the eager oracle alike. The
    fake CUDA tensors being traced stand for such a GPU (:data:`VIRTUAL_GPU_NAME`), so its
    availability and capability queries answer as it would. ``torch.cuda.is_available()`` is left
    alone: code that takes it as leave to launch work on the device would need the driver.

    >>> with simulated_cuda_amp("cuda"):
    ...     torch.cuda.get_device_capability("cuda"), torch.cuda.is_bf16_supported()
    ((9, 0), True)
    """
    if device_type != "cuda":
        yield
        return
    from unittest import mock

    import torch.cuda.amp.common as amp_common

    def capability(device: Any = None) -> tuple[int, int]:
        return VIRTUAL_GPU_CAPABILITY

    def properties(device: Any = None) -> VirtualGpuProperties:
        return VirtualGpuProperties()

    def name(device: Any = None) -> str:
        return VIRTUAL_GPU_NAME

    with contextlib.ExitStack() as stack:
        for module, attr, value in (
            (amp_common, "amp_definitely_not_available", lambda: False),
            (torch.cuda, "is_bf16_supported", lambda *a, **k: True),
            (torch.cuda, "get_device_capability", capability),
            (torch.cuda, "get_device_properties", properties),
            (torch.cuda, "get_device_name", name),
        ):
            stack.enter_context(mock.patch.object(module, attr, value))
        yield


def can_trace_fake(device_type: str) -> bool:
    """Whether this torch build can trace with fake tensors on ``device_type``."""
    return device_type == "cpu" or torch.backends.cuda.is_built()


def fake_device_built(device_type: str) -> bool:
    """Whether this torch is built with ``device_type``'s backend, so that its fake tensors take
    views and autograd, as a trace needs. Without XPU or MPS compiled in, fake ``xpu``/``mps``
    tensors still run those devices' autocast kernels, but no model can be traced on them.

    >>> fake_device_built("cuda"), fake_device_built("cpu")
    (True, True)
    """
    built = {"xpu": lambda: torch.xpu._is_compiled(), "mps": torch.backends.mps.is_built}
    return device_type not in built or bool(built[device_type]())


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

    from ampgraph.compat import unbacked_value_setter

    setter = unbacked_value_setter()  # renamed in torch 2.11 (ampgraph.compat)
    original = ShapeEnv.create_unbacked_symint

    def create(self: ShapeEnv, *args: Any, **kwargs: Any) -> torch.SymInt:
        symbol = original(self, *args, **kwargs)
        value = values.get(str(symbol.node.expr))
        if value is not None:
            getattr(self, setter)(symbol.node.expr, value)
        return symbol

    original_bool = ShapeEnv.create_unbacked_symbool

    def create_bool(self: ShapeEnv) -> torch.SymBool:
        # ``bool(x.all())``: the truth value is ``Eq(u0, 1)`` on a symbol given the same way.
        truth = original_bool(self)
        symbol = truth.node.expr.args[0]
        value = values.get(str(symbol))
        if value is not None:
            getattr(self, setter)(symbol, value)
        return truth

    original_float = ShapeEnv.create_unbacked_symfloat

    def create_float(self: ShapeEnv) -> torch.SymFloat:  # ``x.max().item()``
        number = original_float(self)
        value = values.get(str(number.node.expr))
        if value is not None:
            getattr(self, setter)(number.node.expr, value)
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
    "GRAD_ON",
    "INFERENCE",
    "scalar_type_name",
    "forward_grad_mode",
    "grad_mode_name",
    "traced_grad_mode",
    "VIRTUAL_GPU_CAPABILITY",
    "VIRTUAL_GPU_NAME",
    "VirtualGpuProperties",
    "autocast_state",
    "can_trace_fake",
    "device_type_of",
    "dtype_name",
    "fake_device_built",
    "fake_mode",
    "quiet_logging",
    "silenced",
    "simulated_cuda_amp",
    "swapped_tensors",
    "tensor_leaves",
    "torch_dtype",
    "traced_node",
    "unbacked_values",
]
