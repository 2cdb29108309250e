"""Replaying a captured graph on fake tensors: what the annotator and the dispatcher check share.

:class:`FakeReplay` is an ``fx.Interpreter`` that

* materialises every placeholder as a fake tensor on the setting's device, from the placeholder's
  recorded shape and dtype (no model object and no memory needed),
* skips ``aten._assert_tensor_metadata`` (a trace-time check, not a computation) and rewrites baked
  ``device=`` arguments to the setting's device,
* keeps going past a failing node: the node's error is recorded and everything downstream of it is
  marked as skipped, so one bad op is reported where it happens,
* runs ``wrap_with_autocast`` regions (autocast disabled or re-typed inside a forward) through a
  hook that subclasses define.

Fake kernels decide dtypes but do not always validate them: the matmul family's meta functions
accept mixed dtypes that the real kernels reject. :class:`StrictDtypeMode` adds those checks with
torch's own messages (see ``STRICT_CHECKS``), so a bf16 ``Linear`` fed fp32 fails here as it does
on a device.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.capture import dtype_name, torch_dtype
from ampgraph.driverless import cudnn_rnn_stand_ins
from ampgraph.errors import first_line
from ampgraph.settings import Setting

WRAP_WITH_AUTOCAST = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
WRAP_WITH_SET_GRAD_ENABLED = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
#: Higher-order ops whose body is a submodule that ampgraph walks node by node. Index of the body.
REGION_OPS = {op: i for op, i in ((WRAP_WITH_AUTOCAST, 4), (WRAP_WITH_SET_GRAD_ENABLED, 1)) if op}
ASSERT_OPS = {"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range"}

# c10::ScalarType names (how TORCH_CHECK prints a dtype) and caffe2::TypeMeta names.
_SCALAR_TYPE = {
    torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half",
    torch.float64: "Double", torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool",
}  # fmt: skip
_TYPE_META = {
    torch.float32: "float", torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half",
    torch.float64: "double", torch.int64: "long int", torch.int32: "int", torch.bool: "bool",
}  # fmt: skip


def _st(t: torch.Tensor) -> str:
    return _SCALAR_TYPE.get(t.dtype, str(t.dtype))


def _addmm_check(args: tuple[Any, ...]) -> str | None:
    self, mat1, mat2 = args[:3]
    if self.dtype != mat2.dtype:
        return f"self and mat2 must have the same dtype, but got {_st(self)} and {_st(mat2)}"
    if mat1.dtype != mat2.dtype:
        return f"mat1 and mat2 must have the same dtype, but got {_st(mat1)} and {_st(mat2)}"
    return None


def _mm_check_cpu(args: tuple[Any, ...]) -> str | None:
    a, b = args[:2]
    if a.dtype != b.dtype:
        got = f"{_TYPE_META.get(a.dtype)} != {_TYPE_META.get(b.dtype)}"
        return f"expected m1 and m2 to have the same dtype, but got: {got}"
    return None


def _bmm_check_cpu(args: tuple[Any, ...]) -> str | None:
    a, b = args[:2]
    if a.dtype != b.dtype:
        return f"expected scalar type {_st(a)} but found {_st(b)}"
    return None


# Tensor::toString(): the legacy type name where one exists, else backend + scalar type + "Type".
_LEGACY = {torch.float32: "FloatTensor", torch.float16: "HalfTensor", torch.float64: "DoubleTensor"}


def _type_string(t: torch.Tensor, device_type: str) -> str:
    legacy = _LEGACY.get(t.dtype)
    if legacy is not None:
        return f"torch.cuda.{legacy}" if device_type == "cuda" else f"torch.{legacy}"
    return f"{device_type.upper()}{_st(t)}Type"


def _conv_check(device_type: str) -> Callable[[tuple[Any, ...]], str | None]:
    """``aten.convolution``: the bias check every backend makes first, then the weight check.

    Convolution.cpp compares the bias with ``dtype().name()`` before it picks a backend. The weight
    check is the backend's: cuDNN's ``check_input_same_type_as_parameters`` prints
    ``Tensor::toString()``; on the CPU an fp32 input reaches the slow path (``expected scalar
    type``) and a 16-bit one oneDNN's check (both read off real CPU kernels in the tests).
    """

    def check(args: tuple[Any, ...]) -> str | None:
        x, weight, bias = args[:3]
        if isinstance(bias, torch.Tensor) and bias.dtype != x.dtype:
            got = (_TYPE_META.get(x.dtype), _TYPE_META.get(bias.dtype))
            return f"Input type ({got[0]}) and bias type ({got[1]}) should be the same"
        if weight.dtype == x.dtype:
            return None
        if device_type == "cpu" and x.dtype == torch.float32:
            return f"expected scalar type {_st(x)} but found {_st(weight)}"
        message = (
            f"Input type ({_type_string(x, device_type)}) and weight type "
            f"({_type_string(weight, device_type)}) should be the same"
        )
        if device_type == "cpu":
            message += " or input should be a MKLDNN tensor and weight is a dense tensor"
        return message

    return check


def _cpu_norm_check(*param_indices: int) -> Callable[[tuple[Any, ...]], str | None]:
    """CPU normalisations (``mixed_dtypes.h``): parameters that differ from the input must be fp32.

    A 16-bit input may take fp32 weight and bias (mixed type); anything else that differs fails.
    """

    def check(args: tuple[Any, ...]) -> str | None:
        x = args[0]
        params = [args[i] for i in param_indices if i < len(args)]
        params = [p for p in params if isinstance(p, torch.Tensor)]
        if any(p.dtype != x.dtype for p in params) and any(
            p.dtype != torch.float32 for p in params
        ):
            return "mixed dtype (CPU): expect parameter to have scalar type of Float"
        return None

    return check


#: (device type, op) -> a check that returns the real kernel's error message, or None if fine.
#: The fake (meta) kernels skip these dtype checks. The CPU wording is read off real kernels
#: (tests/test_strict_dtypes.py runs them); CUDA's comes from the kernels' source.
STRICT_CHECKS: dict[tuple[str, Any], Callable[[tuple[Any, ...]], str | None]] = {
    ("cuda", torch.ops.aten.addmm.default): _addmm_check,
    ("cpu", torch.ops.aten.addmm.default): _addmm_check,
    ("cpu", torch.ops.aten.mm.default): _mm_check_cpu,
    ("cpu", torch.ops.aten.bmm.default): _bmm_check_cpu,
    ("cuda", torch.ops.aten.convolution.default): _conv_check("cuda"),
    ("cpu", torch.ops.aten.convolution.default): _conv_check("cpu"),
    ("cpu", torch.ops.aten.native_layer_norm.default): _cpu_norm_check(2, 3),
    ("cpu", torch.ops.aten.native_group_norm.default): _cpu_norm_check(1, 2),
    ("cpu", torch.ops.aten.native_batch_norm.default): _cpu_norm_check(1, 2),
    ("cpu", torch.ops.aten._native_batch_norm_legit_no_training.default): _cpu_norm_check(1, 2),
    ("cpu", torch.ops.aten._native_batch_norm_legit.default): _cpu_norm_check(1, 2),
}


class StrictDtypeMode(TorchDispatchMode):
    """Raise the real kernels' dtype errors that the fake (meta) kernels do not raise."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        check = STRICT_CHECKS.get((self.device_type, func))
        if check is not None:
            message = check(tuple(args))
            if message is not None:
                raise RuntimeError(message)
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Failed:
    """The value of a node that raised, or that depends on one that did."""

    node: str
    message: str
    #: False when the op could not run here for want of a GPU driver: no finding about the model.
    analysed: bool = True


#: What CUDA kernels say when they need a driver even on fake tensors (DESIGN.md fact 13).
DRIVER_ERRORS = ("Found no NVIDIA driver", "CUDA driver version is insufficient")


def needs_driver(message: str) -> bool:
    """Whether an op failed only because this machine has no GPU driver."""
    return any(text in message for text in DRIVER_ERRORS)


def op_name(target: Any) -> str:
    """A stable, readable name for a node's target: ``aten.linear.default``, ``getitem``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return getattr(target, "__name__", str(target))


def is_assert(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and (
        target._schema.name.removeprefix("aten::") in ASSERT_OPS
    )


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def dtype_names(value: Any) -> list[str | None]:
    """The dtype name of every leaf of a node's value (None for a leaf that is not a tensor);
    nothing for a node that returned nothing or failed.

    >>> dtype_names((torch.empty(1), 3))
    ['float32', None]
    """
    if value is None or isinstance(value, Failed):
        return []
    return [
        dtype_name(v.dtype) if isinstance(v, torch.Tensor) else None
        for v in pytree.tree_leaves(value)
    ]


def replay_device(device_type: str) -> str:
    """Where a setting's fake tensors live: on its device, or on ``meta`` for CUDA settings where
    this torch is a CPU-only build (it cannot make fake CUDA tensors). The annotator reads a meta
    tensor's device as CUDA (:func:`device_type_of`); only the dispatcher check needs the real
    CUDA kernels, and it says so where they are missing.

    >>> replay_device("cpu")
    'cpu'
    """
    if device_type == "cpu" or torch.backends.cuda.is_built():
        return device_type
    return "meta"


def device_type_of(t: torch.Tensor) -> str:
    """The device type autocast would see for ``t``: meta stands in for CUDA (see above)."""
    kind = t.device.type
    return "cuda" if kind == "meta" else kind


def placeholder_value(node: fx.Node, device: str) -> Any:
    """A fresh fake tensor shaped like the placeholder's recorded value, on ``device``."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return torch.empty(val.shape, dtype=val.dtype, device=device)
    return val


@contextmanager
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


@contextmanager
def fake_session(setting: Setting) -> Iterator[FakeTensorMode]:
    """Fake tensors, strict dtype checks, and autocast off on every device until told otherwise."""
    from ampgraph.capture import autocast_state

    with ExitStack() as stack:
        # A kernel that raises is the finding; fake_tensor's own log of it is noise on stderr.
        stack.enter_context(silenced("torch._subclasses.fake_tensor"))
        mode = stack.enter_context(fake_mode())
        stack.enter_context(StrictDtypeMode(setting.device_type))
        # cuDNN RNNs ask the driver before they compute: stand-ins that follow the GPU's path.
        stack.enter_context(cudnn_rnn_stand_ins(replay_device(setting.device_type)))
        for device in ("cpu", "cuda"):
            stack.enter_context(autocast_state(device, False, torch.get_autocast_dtype(device)))
        yield mode


class FakeReplay(fx.Interpreter):
    """Base interpreter: fake placeholders, error propagation, autocast regions.

    The annotator (:class:`ampgraph.annotate.AutocastAnnotator`), the dispatcher oracle
    (:class:`ampgraph.check.DispatcherOracle`) and verify's real execution all replay a captured
    graph this way; they differ only in the override points below. The call tree, in the manner
    of ``torch.fx.Interpreter``'s own docstring::

        run_graph()                     fresh fake placeholders, then fx.Interpreter.run
            + run_node(n)               per node
                + (placeholder, get_attr: fx.Interpreter's own)
                + an input is Failed?   -> on_skipped(n, failure)        [override]
                + an assert op?         -> skipped, returns None
                + a region op?          -> run_region(n, args)           [override]
                |                              + run_body(child, body, operands, n)
                + otherwise             -> execute(n, args, kwargs)      [override]
                    raises?             -> on_error(n, Failed(...))      [override]

    ``execute`` defaults to ``fx.Interpreter``'s ``call_function``/``call_method``/...; an op that
    raises becomes a :class:`Failed` value that flows to every node depending on it. A failure
    for want of a GPU driver is ``Failed(analysed=False)``: no finding about the model.
    """

    def __init__(self, gm: fx.GraphModule, setting: Setting, prefix: str = "") -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.setting = setting
        self.device = torch.device(replay_device(setting.device_type))
        self.prefix = prefix
        #: outer node names for a region body's placeholders (empty at top level).
        self.outer_names: dict[str, str] = {}

    # -- naming -----------------------------------------------------------------------------
    def qualified(self, node: fx.Node) -> str:
        if node.op == "placeholder" and node.name in self.outer_names:
            return self.outer_names[node.name]
        return f"{self.prefix}{node.name}"

    # -- fx.Interpreter hooks -----------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("placeholder", "get_attr"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        failed = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, Failed)]
        if failed:
            value: Any = failed[0]
            self.on_skipped(n, value)
            return value
        if n.op == "output":
            return super().run_node(n)
        if n.op == "call_function" and is_assert(n.target):
            return None
        args, kwargs = self._retarget_devices(args, kwargs)
        if n.op == "call_function" and n.target in REGION_OPS:
            return self.run_region(n, args)
        try:
            return self.execute(n, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the op's own error is the finding: record it
            message = first_line(exc)
            value = Failed(self.qualified(n), message, analysed=not needs_driver(message))
            self.on_error(n, value)
            return value

    def run_graph(self) -> Any:
        """Run the whole graph on fresh fake placeholders (call inside :func:`fake_session`)."""
        placeholders = [p for p in self.graph.nodes if p.op == "placeholder"]
        device = replay_device(self.setting.device_type)
        return self.run(*(placeholder_value(p, device) for p in placeholders))

    def _retarget_devices(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        def fix(v: Any) -> Any:
            return self.device if isinstance(v, torch.device) else v

        return pytree.tree_map_only(torch.device, fix, (args, kwargs))  # type: ignore[return-value]

    # -- what subclasses define -------------------------------------------------------------------
    def execute(self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self, n.op)(n.target, args, kwargs)

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        """Called when node ``n`` raised."""

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        """Called when node ``n`` was not run because an input failed."""

    # -- helpers ----------------------------------------------------------------------------------
    def run_body(
        self, interp: FakeReplay, body: fx.GraphModule, operands: tuple[Any, ...], n: fx.Node
    ) -> Any:
        """Run a region body with a child interpreter whose placeholders are ``n``'s operands."""
        placeholders = [p for p in body.graph.nodes if p.op == "placeholder"]
        operand_nodes = list(n.args[REGION_OPS[n.target] + 1 :])
        interp.outer_names = {
            p.name: self.qualified(a) if isinstance(a, fx.Node) else repr(a)
            for p, a in zip(placeholders, operand_nodes)
        }
        return interp.run(*operands)


@dataclass(frozen=True)
class Region:
    """A region body and what it changes: autocast for one device type, or nothing ampgraph
    tracks (``wrap_with_set_grad_enabled``: grad mode does not change dtypes)."""

    body: fx.GraphModule
    operands: tuple[Any, ...]
    device_type: str | None = None
    dtype: torch.dtype | None = None
    enabled: bool = True

    @property
    def is_autocast(self) -> bool:
        return self.device_type is not None


def region_args(n: fx.Node, args: tuple[Any, ...]) -> Region:
    """Unpack ``wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)``
    or ``wrap_with_set_grad_enabled(enabled, body, *operands)``."""
    if n.target is WRAP_WITH_AUTOCAST:
        device_type, dtype, enabled, _cache, body, *operands = args
        if dtype is None:
            dtype = torch.get_autocast_dtype(device_type)
        return Region(body, tuple(operands), str(device_type), dtype, bool(enabled))
    _grad, body, *operands = args
    return Region(body, tuple(operands))


def is_getitem(target: Any) -> bool:
    return target is operator.getitem


__all__ = [
    "Failed",
    "FakeReplay",
    "StrictDtypeMode",
    "fake_session",
    "op_name",
    "region_args",
    "tensor_leaves",
    "torch_dtype",
]
