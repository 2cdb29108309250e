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

Fake kernels decide dtypes but do not always validate them: many meta functions accept mixed
dtypes that the real kernels reject. :class:`~ampgraph.annotate.strict.StrictDtypeMode` adds those checks
with torch's own messages (:data:`ampgraph.annotate.strict.STRICT_CHECKS`), so a bf16 ``Linear`` fed fp32
fails here as it does on a device.
"""

from __future__ import annotations

import contextvars
import operator
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from ampgraph.annotate.kernel_dtypes import RealCpuDtypes
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.capture.driverless import cudnn_rnn_stand_ins
from ampgraph.capture.environment import analysis_environment
from ampgraph.capture.grad_params import requires_grad
from ampgraph.capture.regions import REGION_OPS
from ampgraph.errors import first_line
from ampgraph.settings import Setting
from ampgraph.torchutil import can_trace_fake, dtype_name, fake_mode, silenced, torch_dtype

#: What a C++ kernel says of a size given as a symbolic expression (a data-dependent size's).
CONCRETE_ONLY = "expected to contain only concrete integers"
#: What a C++ kernel's meta function says where it asks for a data-dependent size as a number
#: (``aten.pad`` of a boolean-mask selection, VITS's spline: ``F.pad(x[mask], (1, 0))``).
SPECIALIZED_ONLY = "Could not extract specialized integer from data-dependent expression"
#: What C++ kernels say of a data-dependent size that torch's Python kernels compute as an
#: expression, as the capture's trace (``make_fx``, the Python dispatcher) did.
PYTHON_KERNELS_FOLLOW = (CONCRETE_ONLY, SPECIALIZED_ONLY)


def python_kernels_follow(message: str) -> bool:
    """Whether an op failed only because its C++ kernel takes a data-dependent size as a
    number, where torch's Python kernels (which the capture traced through) take it as an
    expression.

    >>> python_kernels_follow("Could not extract specialized integer from data-dependent "
    ...                       "expression u1 (unhinted: u1)")
    True
    >>> python_kernels_follow("Could not guard on data-dependent expression u0 > 0")
    False
    """
    return any(text in message for text in PYTHON_KERNELS_FOLLOW)
ASSERT_OPS = {"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range"}


@dataclass(frozen=True)
class Failed:
    """The value of a node that raised, or that depends on one that did."""

    node: str
    message: str
    #: False when the op could not run here (no GPU driver, a size only data can decide): no
    #: finding about the model (:func:`not_analysable` says why).
    analysed: bool = True


#: What CUDA kernels say when they need a driver even on fake tensors (DESIGN.md fact 13).
DRIVER_ERRORS = ("Found no NVIDIA driver", "CUDA driver version is insufficient")
#: What fake tensors say when a size or a branch depends on values they do not have.
DATA_DEPENDENT_ERRORS = (
    "Could not guard on data-dependent expression",
    "from data-dependent expression",  # "Could not extract specialized integer from ..."
    "data-dependent output",
)


def needs_driver(message: str) -> bool:
    """Whether an op failed only because this machine has no GPU driver."""
    return any(text in message for text in DRIVER_ERRORS)


def not_analysable(message: str) -> str | None:
    """Why an op's failure here says nothing about the model, or None when it is a finding.

    >>> not_analysable("mat1 and mat2 must have the same dtype") is None
    True
    """
    if needs_driver(message):
        return "this CUDA kernel needs a GPU driver even on fake tensors, and this machine has none"
    if any(text in message for text in DATA_DEPENDENT_ERRORS):
        return "a size or branch here depends on data values, which fake tensors do not have"
    return None


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


def shape_lists(value: Any) -> list[list[int] | None] | None:
    """The shape of every leaf of a node's value, like :func:`dtype_names` (None for a leaf that
    is not a tensor, or whose size is symbolic); None for a node that failed.

    >>> shape_lists((torch.empty(2, 3), 3))
    [[2, 3], None]
    """
    if isinstance(value, Failed):
        return None
    if value is None:
        return []

    def shape(v: Any) -> list[int] | None:
        if not isinstance(v, torch.Tensor):
            return None
        try:
            return [int(d) for d in v.shape]
        except Exception:  # noqa: BLE001 - an unbacked symbolic size has no number to give
            return None

    return [shape(v) for v in pytree.tree_leaves(value)]


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
    tensor's device as CUDA (:func:`ampgraph.torchutil.device_type_of`); only the dispatcher check needs the real
    CUDA kernels, and it says so where they are missing.

    >>> replay_device("cpu")
    'cpu'
    """
    return device_type if can_trace_fake(device_type) else "meta"


def placeholder_value(
    node: fx.Node, device: str, grad: bool = False, keep_cpu: bool = False
) -> Any:
    """A fresh fake tensor shaped (and strided) like the placeholder's recorded value, on
    ``device`` (with ``keep_cpu``, a value recorded on the CPU stays there); with ``grad``,
    requiring grad where the model's parameter does, as ``matmul``'s folding reads it
    (:mod:`ampgraph.capture.grad_params`)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        where = "cpu" if keep_cpu and val.device.type == "cpu" else device
        t = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=where)
        return t.requires_grad_() if grad and requires_grad(node) and t.is_floating_point() else t
    return val


def _is_constant(node: fx.Node) -> bool:
    """A tensor constant export lifted into a placeholder (``c_lifted_tensor_0``)."""
    return node.name.startswith("c_")


def _recorded_on(node: fx.Node) -> str | None:
    val = node.meta.get("val")
    return val.device.type if isinstance(val, torch.Tensor) else None


@contextmanager
def fake_session(
    setting: Setting, unbacked: dict[str, int | float] | None = None
) -> Iterator[FakeTensorMode]:
    """Fake tensors, strict dtype checks, the real CPU kernels' dtypes where the fake ones part
    (:mod:`ampgraph.annotate.kernel_dtypes`), and autocast off on every device until told otherwise.

    ``unbacked``: a capture's values of its data-dependent sizes (``Capture.unbacked_values``),
    given to the sizes the replay makes at the same nodes (:func:`_give_sizes`): a size computed
    from data (FastSpeech2's durations, predicted from values; a vision grid's counts) is then a
    number in every guard on it (``Eq(Max(1, u1), 1)`` in a norm's check), as in a real run,
    not a guard the replay cannot decide."""
    from ampgraph.torchutil import autocast_state

    with ExitStack() as stack:
        # A kernel that raises is the finding; fake_tensor's own log of it is noise on stderr.
        stack.enter_context(silenced("torch._subclasses.fake_tensor"))
        stack.enter_context(analysis_environment())  # re-entrant: a no-op inside an analysis
        mode = stack.enter_context(fake_mode())
        token = _SIZES.set(unbacked or {})
        stack.callback(_SIZES.reset, token)
        stack.enter_context(StrictDtypeMode(setting.device_type))
        if setting.device_type == "cpu":  # a dispatch mode costs every op: only where it acts
            stack.enter_context(RealCpuDtypes())
        # cuDNN RNNs ask the driver before they compute: stand-ins that follow the GPU's path.
        stack.enter_context(cudnn_rnn_stand_ins(replay_device(setting.device_type)))
        for device in ("cpu", "cuda"):
            stack.enter_context(autocast_state(device, False, torch.get_autocast_dtype(device)))
        yield mode


def _holds_device(value: Any) -> bool:
    """Whether a ``torch.device`` is in ``value`` or in the lists, tuples and dicts it holds."""
    if isinstance(value, torch.device):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_device(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_device(v) for v in value.values())
    return False


#: The capture's values of its data-dependent sizes, by symbol name, while a replay runs in
#: :func:`fake_session` (a context variable: a replay in another thread has its own).
_SIZES: contextvars.ContextVar[dict[str, int | float]] = contextvars.ContextVar(
    "ampgraph_replay_sizes", default={}
)


def _give_sizes(out: Any, recorded: Any, sizes: dict[str, int | float]) -> None:
    """Each data-dependent size the replay made at a node (a fresh ``u0``) given the value the
    capture had for the size it recorded there: by node, not by name, since the replay numbers
    its sizes as it meets them."""
    import sympy

    from ampgraph.compat import unbacked_value_setter

    pairs = zip(pytree.tree_leaves(out), pytree.tree_leaves(recorded))
    for new, old in pairs:
        if not (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)):
            continue
        env = getattr(getattr(new, "fake_mode", None), "shape_env", None)
        for size, was in zip(new.shape, old.shape) if new.dim() == old.dim() else ():
            if env is None or not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                continue
            expr = was.node.expr if isinstance(was, torch.SymInt) else None
            value = None if expr is None else sympy.sympify(expr.xreplace(
                {s: sympy.sympify(sizes[str(s)]) for s in expr.free_symbols if str(s) in sizes}
            ))
            if value is not None and value.is_number:
                getattr(env, unbacked_value_setter())(size.node.expr, int(value))


class FakeReplay(fx.Interpreter):
    """Base interpreter: fake placeholders, error propagation, autocast regions.

    The annotator (:class:`ampgraph.annotate.annotator.AutocastAnnotator`), the dispatcher oracle
    (:class:`ampgraph.annotate.check.DispatcherOracle`) and verify's real execution
    (:class:`ampgraph.verify.execution.RealExecution`) replay a captured graph this way; they
    differ only in the override points below. The call tree, in the manner of
    ``torch.fx.Interpreter``'s own docstring::

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
            out = self.execute(n, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the op's own error is the finding: record it
            message = first_line(exc)
            if python_kernels_follow(message):
                return self._through_python_kernels(n, args, kwargs)
            value = Failed(self.qualified(n), message, analysed=not_analysable(message) is None)
            self.on_error(n, value)
            return value
        if sizes := _SIZES.get():
            _give_sizes(out, n.meta.get("val"), sizes)
        return out

    def _through_python_kernels(
        self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``n`` run as the trace ran it, through torch's Python kernels: its sizes are
        expressions of a data-dependent size (GLM-5-Next's indexer pads to a fixed width, ``pad
        = 2063 - (16*u0 + 15)``), or a data-dependent size itself (VITS pads a boolean-mask
        selection), which the C++ kernel (``aten.pad``'s) takes only as numbers; the Python one
        computes the output's size from them (``2063``, ``u1 + 1``), as the trace did."""
        from torch._dispatch.python import enable_python_dispatcher

        try:
            with enable_python_dispatcher():
                return self.execute(n, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the op's own error is the finding: record it
            message = first_line(exc)
            value = Failed(self.qualified(n), message, analysed=not_analysable(message) is None)
            self.on_error(n, value)
            return value

    def run_graph(self) -> Any:
        """Run the whole graph on fresh fake placeholders (call inside :func:`fake_session`)."""
        placeholders = [p for p in self.graph.nodes if p.op == "placeholder"]
        device = replay_device(self.setting.device_type)
        # A constant the forward made on the CPU (a lifted ``torch.tensor(1.0)``, ``c_*``) stays
        # there in a real run on a GPU, and an op's CPU-only paths (index_put's masked fill of a
        # one-element CPU value) are taken: so in the replay, where the graph was traced on the
        # setting's device. A graph traced on the CPU (draft export) recorded its inputs there
        # too: everything is retargeted.
        on_device = not any(
            _recorded_on(p) == "cpu" for p in placeholders if not _is_constant(p)
        )
        values = [
            placeholder_value(p, device, grad=True, keep_cpu=on_device and _is_constant(p))
            for p in placeholders
        ]
        # Grad off, as inference runs; parameters still require grad, as there. no_grad rather
        # than the capture's inference_mode: the graph is ATen ops, no model code that could
        # read is_inference_mode_enabled() (its branches were taken when it was traced, in
        # the pass's own mode), and is_grad_enabled() reads the same under both.
        with torch.no_grad():
            return self.run(*values)

    def _retarget_devices(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # Most nodes name no device: a plain scan finds that for a fraction of what pytree's
        # rebuild of every node's arguments cost (13% of a training step's check).
        if not _holds_device(args) and not _holds_device(kwargs):
            return args, kwargs

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


def is_getitem(target: Any) -> bool:
    return target is operator.getitem


__all__ = [
    "CONCRETE_ONLY",
    "PYTHON_KERNELS_FOLLOW",
    "SPECIALIZED_ONLY",
    "Failed",
    "FakeReplay",
    "StrictDtypeMode",
    "fake_session",
    "op_name",
    "python_kernels_follow",
    "torch_dtype",
]
