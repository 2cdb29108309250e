"""Trace-time reads: what a model's Python code learned from the setting while it was traced.

A graph captured in one setting serves another setting exactly when tracing in the other would
have recorded the same graph. Tracing runs the model's Python code once, and that code sees the
setting in only two ways: the dtypes of tensors (``q.dtype``, ``x.is_floating_point()``, a cast
that is a no-op in one setting and not in the other, ``x.to(other)`` whose dtype is fixed from
``other``) and the autocast state (``torch.get_autocast_dtype("cuda")``, ``torch.is_autocast_enabled()``).
Everything else it reads (shapes, devices, the parameters' dtypes within one parameter dtype) is the
same in settings that share a parameter dtype and a device type.

:class:`TraceReads` is a ``TorchFunctionMode`` that logs every such read during a capture, with the
graph node whose dtype was read. :func:`why_not_shared` then proves or refutes, for another setting, that
every read would have given the same answer there: the dtype of each node read comes from the
annotation in that setting (which the dispatcher check independently proves), the autocast
state from evaluating the same query in that setting's state. If every read agrees, the Python
code takes the same path and records the same ops with the same constants, so the graph is the one
a fresh capture would give (tested node for node on every bundled model,
``tests/test_reuse.py`` and ``scripts/reuse_matrix.py``). Any read it cannot account for -- a
tensor that is no graph node, an autocast query inside an autocast region of the model -- refutes.

>>> import torch
>>> from ampgraph import analyze, Setting
>>> from ampgraph.pipeline.stages import analyze_group
>>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
>>> fp32, amp = analyze_group(m, [Setting.parse("fp32"), Setting.parse("amp-fp32")],
...                           args=(torch.randn(1, 4),), check=False)
>>> amp.capture["graph_of"]
'fp32'
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ampgraph.report.records import NodeRecord
from ampgraph.settings import Setting
from ampgraph.torchutil import traced_node

#: Tensor attributes and methods whose answer does not depend on the dtype or the memory layout:
#: reading them is no read of the setting. Anything else a model reads off a tensor without
#: tracing it counts as a read of its dtype (or of its layout, :data:`LAYOUT_READS`).
DTYPE_FREE = frozenset({
    "shape", "size", "dim", "ndim", "ndimension", "numel", "nelement", "__len__", "device",
    "get_device", "is_cuda", "is_cpu", "is_meta", "layout", "requires_grad", "is_leaf",
    "grad_fn", "grad", "names", "is_sparse", "is_quantized", "is_mkldnn", "is_nested",
    "is_inference", "_version", "__hash__", "retains_grad", "output_nr", "is_xpu", "is_mps",
})  # fmt: skip

#: Calls whose answer depends on the strides, which can depend on the dtype: a fake CUDA
#: ``scaled_dot_product_attention`` picks its kernel, and so its output's layout, by dtype.
#: ``contiguous()`` returns its input when it is contiguous already.
LAYOUT_READS = frozenset({"contiguous", "is_contiguous", "stride", "storage_offset", "_is_view"})

#: Calls that may return their input as it is for reasons that are neither dtype nor layout
#: (dropout in eval mode or with p=0).
ALIAS_FREE = frozenset({"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})

#: Calls that return their input unchanged when it already has the dtype asked for: whether they
#: do (and so which graph node later uses of the value refer to) depends on the input's dtype, and
#: ``x.to(other)`` fixes ``other``'s dtype in the graph without a Python-level read.
CASTS = frozenset({
    "to", "type_as", "type", "float", "half", "bfloat16", "double", "int", "long", "short",
    "bool", "char", "byte", "cfloat", "cdouble", "as_tensor", "asarray",
})  # fmt: skip

#: Autocast-state queries model code may make (those this torch has).
_QUERIES = (
    "is_autocast_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype",
    "get_autocast_cpu_dtype", "is_autocast_cpu_enabled", "get_autocast_ipu_dtype",
    "is_autocast_ipu_enabled", "get_autocast_xla_dtype", "is_autocast_xla_enabled",
)  # fmt: skip
AUTOCAST_QUERIES = tuple(name for name in _QUERIES if hasattr(torch, name))


@dataclass(frozen=True)
class Read:
    """One thing the traced code learned from the setting.

    ``kind`` is ``"dtype"`` (the dtype of graph node ``node`` was ``value``) or ``"autocast"``
    (``query(*args)`` returned ``value``); ``what`` says how, for the reason a reuse is refused.
    """

    kind: str
    what: str
    value: str
    node: str | None = None
    query: str | None = None
    args: tuple[Any, ...] = ()


def _name_of(func: Any) -> str:
    """``Tensor.dtype.__get__`` -> ``"dtype"``; ``Tensor.to`` -> ``"to"``; ``torch.add`` -> ``"add"``."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", None) == "__get__" and owner is not None:
        return str(getattr(owner, "__name__", "?"))
    return str(getattr(func, "__name__", func))


def _is_python_function(func: Any) -> bool:
    """A torch function written in Python (``F.multi_head_attention_forward``): the calls it makes
    are seen one by one, so its own result is not a read."""
    return hasattr(func, "__code__")


class TraceReads(TorchFunctionMode):
    """Log the reads of the setting that the traced code makes (see the module docstring).

    Use around a capture; :attr:`reads` then holds :class:`Read` records in the order they were
    made, with trace-time graph nodes (``fx.Node``) where :meth:`resolved` has not yet named them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str, str, fx.Node | None, str | None, tuple[Any, ...]]] = []
        #: Autocast regions the traced code is inside (``with torch.autocast(...)``).
        self.depth = 0
        self.unaccounted: list[str] = []
        #: Python-level torch functions being run with this mode on the stack.
        self._inside: list[Any] = []
        #: Trace on past the first op that raises (see :meth:`_call`); what it raised, if any.
        self.past_raise = False
        self.raised: str | None = None

    def clear(self) -> None:
        """Forget what was read (a trace that failed and is traced again)."""
        self.reads.clear()
        self.unaccounted.clear()
        self.depth = 0
        self.raised = None

    def _call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``func(*args, **kwargs)``; where that raises a kernel's error (the model's own dtype
        error, in its setting), call it again on its floating inputs made fp32 by
        :data:`PAST_RAISE` casts, which :func:`drop_past_raise` takes out of the graph after the
        trace: the graph then holds the op as the model called it, where a real run raises, and
        everything the code read up to there is the setting's own."""
        graph = getattr(self._tracer(), "graph", None)
        last = graph._root.prev if graph is not None else None  # fx's own list
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if type(exc) not in (RuntimeError, NotImplementedError):
                raise
            # The node the tracer made for the call that raised, before its kernel ran.
            _erase_unused_since(graph, last)
            if self.raised is None:
                self.raised = f"{_name_of(func)}(): {str(exc).strip().splitlines()[0]}"
                # What the code reads after the raise follows the casts, not the setting.
                self.unaccounted.append(f"a trace past the raise in {_name_of(func)}()")

            def cast(t: Any) -> Any:
                floating = isinstance(t, torch.Tensor) and t.is_floating_point()
                if floating and t.dtype != torch.float64:
                    return past_raise_op()(t, torch.float32)
                return t

            args, kwargs = pytree.tree_map(cast, (args, kwargs))
            cast_done = graph._root.prev if graph is not None else None
            # fp32 inputs get past a dtype error; an op autocast refuses whatever the dtypes
            # (``binary_cross_entropy``'s "unsafe to autocast") gets past with autocast off
            # for that one call. Neither is recorded: the graph holds the op as the model
            # called it, and a replay in the setting raises there, as a real run does.
            for state in (contextlib.nullcontext, _autocast_off):
                try:
                    with state():
                        return func(*args, **kwargs)
                except Exception:  # noqa: BLE001 - not past it: the first error is the finding
                    _erase_unused_since(graph, cast_done)
            raise exc from None

    # -- dtype reads ----------------------------------------------------------------------------
    @staticmethod
    def _tracer() -> Any:
        from torch.fx.experimental import proxy_tensor

        mode = proxy_tensor.get_proxy_mode()
        return getattr(mode, "tracer", None)

    def _node(self, tracer: Any, t: torch.Tensor) -> fx.Node | None:
        # None for a tensor the trace does not track, found without formatting it (traced_node).
        return traced_node(t, tracer)

    def _log_dtypes(
        self,
        tracer: Any,
        what: str,
        tensors: Sequence[torch.Tensor] | Sequence[tuple[torch.Tensor, fx.Node | None]],
    ) -> None:
        """Log a read of each tensor's dtype (given alone, or with its node as it was)."""
        for item in tensors:
            t, node = item if isinstance(item, tuple) else (item, self._node(tracer, item))
            with torch._C.DisableTorchFunction():
                dtype = str(t.dtype).removeprefix("torch.")
            self.reads.append(("dtype", what, dtype, node, None, ()))

    def _log_layouts(self, tracer: Any, what: str, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            with torch._C.DisableTorchFunction():
                layout = layout_of(t)
            self.reads.append(("layout", what, layout, self._node(tracer, t), None, ()))

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        tracer = self._tracer()
        if tracer is None:  # not tracing (export's own set-up): nothing of the model's code
            return func(*args, **kwargs)
        if _is_python_function(func) and self._inside[-1:] != [func]:
            if not hasattr(torch.overrides, "redispatch_function"):
                self.unaccounted.append(f"{_name_of(func)}(), which this torch cannot see into")
                return func(*args, **kwargs)
            # Stay on the stack for the calls made inside (the mode is popped while it handles
            # one), so a dtype read inside F.multi_head_attention_forward is seen too. A method
            # that ends in its C implementation (Tensor.unflatten -> super().unflatten) comes back
            # here with the same function: that call is the C one, handled below.
            self._inside.append(func)
            try:
                with self:
                    return torch.overrides.redispatch_function(func, types, args, kwargs)
            finally:
                self._inside.pop()
        name = _name_of(func)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors:
            return func(*args, **kwargs)
        if name in CASTS:
            self._log_dtypes(tracer, f"{name}()", tensors)
            return func(*args, **kwargs)
        if name in LAYOUT_READS:
            self._log_layouts(tracer, f"{name}()", tensors[:1])
            return func(*args, **kwargs)
        # Which nodes the inputs are, before an op that returns its input rebinds them.
        before = [(t, self._node(tracer, t)) for t in tensors]
        out = self._call(func, args, kwargs) if self.past_raise else func(*args, **kwargs)
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs:
            if name not in DTYPE_FREE:
                self._log_dtypes(tracer, name if name == "dtype" else f"{name}()", before)
        elif (
            not name.endswith("_")
            and name not in ALIAS_FREE
            and any(o is t for o in outputs for t in tensors)
        ):
            # An op that returned its input as it is: later uses refer to another node, and
            # whether it does can depend on the dtype.
            self._log_dtypes(tracer, f"{name}() returning its input", before)
        return out

    # -- autocast reads -------------------------------------------------------------------------
    @contextlib.contextmanager
    def autocast_queries(self) -> Iterator[None]:
        """Log the autocast-state queries made while tracing (they are no torch functions)."""
        from unittest import mock

        from torch.amp import autocast_mode

        enter = autocast_mode.autocast.__enter__.__code__
        exit_ = autocast_mode.autocast.__exit__.__code__
        init = autocast_mode.autocast.__init__.__code__
        real_set = torch.set_autocast_enabled

        def logged(query: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def read(*args: Any) -> Any:
                value = real(*args)
                if self._tracer() is None:
                    return value
                caller = sys._getframe(1)
                if caller.f_code is enter:
                    # Saving the state to restore at exit: restoring leaves every setting as it
                    # was, whatever was saved. The region itself starts here.
                    if query == "is_autocast_enabled":
                        self.depth += 1
                    return value
                if caller.f_code is init and (
                    query == "is_autocast_cache_enabled" or not caller.f_locals.get("enabled", True)
                ):
                    # The default dtype of a region that disables autocast is never used to cast;
                    # nested regions' reads are refuted below.
                    return value
                if self.depth:
                    self.unaccounted.append(f"torch.{query}() inside an autocast region")
                    return value
                self.reads.append(("autocast", f"torch.{query}()", repr(value), None, query, args))
                return value

            return read

        def set_enabled(*args: Any) -> Any:
            if sys._getframe(1).f_code is exit_ and self._tracer() is not None:
                self.depth = max(0, self.depth - 1)
            return real_set(*args)

        patches = [
            mock.patch.object(torch, q, logged(q, getattr(torch, q))) for q in AUTOCAST_QUERIES
        ]
        patches.append(mock.patch.object(torch, "set_autocast_enabled", set_enabled))
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            yield

    # -- after the capture ----------------------------------------------------------------------
    def resolved(self, gm: fx.GraphModule) -> list[Read]:
        """The reads with each trace-time node named as the annotation names it (None where it is
        no node of the final graph: such a read refutes every reuse)."""
        names = record_names(gm)
        traced_placeholders: list[fx.Node] = []
        out = []
        for kind, what, value, node, query, args in self.reads:
            name = None
            if node is not None:
                if node.op == "placeholder":
                    if not traced_placeholders:
                        traced_placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
                    index = traced_placeholders.index(node)
                    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
                    name = placeholders[index].name if index < len(placeholders) else None
                else:
                    name = names.get((node.name, str(node.target)))
            out.append(Read(kind, what, value, name, query, args))
        for reason in self.unaccounted:
            out.append(Read("unaccounted", reason, ""))
        return out


_PAST_RAISE: list[Any] = []


def _erase_unused_since(graph: fx.Graph | None, last: fx.Node | None) -> None:
    """Erase the nodes a failed call left after ``last`` (none of them has a user yet)."""
    while graph is not None and graph._root.prev is not last:
        node = graph._root.prev
        if node.users:
            break
        graph.erase_node(node)


@contextlib.contextmanager
def _autocast_off() -> Iterator[None]:
    """Autocast off on every device for one call (state only: nothing a tracer records)."""
    from ampgraph.torchutil import autocast_state

    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            stack.enter_context(autocast_state(device, False, torch.get_autocast_dtype(device)))
        yield


def past_raise_op() -> Any:
    """``ampgraph::past_raise(x, dtype)``: ``x`` cast to ``dtype``, the cast a trace past a raise
    adds (:meth:`TraceReads._call`) and :func:`drop_past_raise` takes out again; defined once."""
    if not _PAST_RAISE:

        @torch.library.custom_op("ampgraph::past_raise", mutates_args=())
        def past_raise(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return x.to(dtype, copy=True)

        @past_raise.register_fake
        def _(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty_like(x, dtype=dtype)

        _PAST_RAISE.append(torch.ops.ampgraph.past_raise.default)
    return _PAST_RAISE[0]


def drop_past_raise(gm: fx.GraphModule) -> int:
    """Take the casts a trace past a raise added out of ``gm``; how many there were.

    >>> import torch
    >>> g = fx.Graph()
    >>> x = g.placeholder("x")
    >>> y = g.call_function(past_raise_op(), (x, torch.float32))
    >>> _ = g.output(g.call_function(torch.ops.aten.relu.default, (y,)))
    >>> gm = fx.GraphModule(torch.nn.Module(), g)
    >>> drop_past_raise(gm), [n.op for n in gm.graph.nodes]
    (1, ['placeholder', 'call_function', 'output'])
    """
    if not _PAST_RAISE:
        return 0
    dropped = 0
    # A raise inside a region (custom_fwd's autocast-off body, a ``wrap_with_autocast``
    # submodule) leaves its casts in that body's graph, not the top one.
    for sub in gm.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        here = 0
        for node in list(sub.graph.nodes):
            if node.op == "call_function" and node.target is _PAST_RAISE[0]:
                node.replace_all_uses_with(node.args[0])
                sub.graph.erase_node(node)
                here += 1
        if here:
            sub.recompile()
            dropped += here
    return dropped


def layout_of(t: torch.Tensor) -> str:
    """What a layout read can see of a tensor: its strides and storage offset."""
    return f"{tuple(int(s) for s in t.stride())}+{int(t.storage_offset())}"


def record_names(gm: fx.GraphModule, prefix: str = "") -> dict[tuple[str, str], str | None]:
    """(node name, target) -> the name the annotator gives the node (``wrap_with_autocast_1.mul``
    inside a region body); None where two nodes share a key."""
    from ampgraph.capture.regions import REGION_OPS

    names: dict[tuple[str, str], str | None] = {}
    for n in gm.graph.nodes:
        key = (n.name, str(n.target))
        names[key] = None if key in names else f"{prefix}{n.name}"
        if n.op == "call_function" and n.target in REGION_OPS:
            body_arg = n.args[REGION_OPS[n.target]]
            body = getattr(gm, body_arg.target, None) if isinstance(body_arg, fx.Node) else None
            if isinstance(body, fx.GraphModule):
                for k, v in record_names(body, f"{prefix}{n.name}.").items():
                    names[k] = None if k in names else v
    return names


@contextlib.contextmanager
def capture_state(setting: Setting) -> Iterator[None]:
    """The autocast state a capture in ``setting`` traces under (:func:`ampgraph.capture.trace.capture`)."""
    from ampgraph.torchutil import autocast_state, torch_dtype

    if setting.autocast:
        with autocast_state(setting.device_type, True, torch_dtype(setting.amp_dtype)):
            yield
    else:
        yield


def why_not_shared(
    reads: Sequence[Read],
    setting: Setting,
    records: Sequence[NodeRecord],
    layouts: dict[str, str] | None = None,
) -> str | None:
    """None if a graph traced with ``reads`` is the graph a capture in ``setting`` would give,
    judged from ``records``, its annotation in ``setting`` (and ``layouts``, the strides of the
    values whose layout was read); else why not, in one line.

    >>> from ampgraph.report.records import NodeRecord
    >>> rec = NodeRecord(name="linear", op="aten.linear.default", kind="op", outputs=["bfloat16"])
    >>> why_not_shared([Read("dtype", "dtype", "float32", "linear")], Setting.parse("amp-fp32"), [rec])
    'dtype at linear read float32 when traced; it is bfloat16 in amp-fp32'
    """
    dtypes = {r.name: r.outputs for r in records}
    layouts = layouts or {}
    for read in reads:
        if read.kind == "unaccounted":
            return f"the traced code read {read.what}"
        if read.kind == "layout":
            now = layouts.get(read.node or "")
            if read.node is None or now != read.value:
                return (
                    f"{read.what} at {read.node} read strides {read.value} when traced; "
                    f"{now or 'not known'} in {setting.name}"
                )
        elif read.kind == "dtype":
            if read.node is None:
                return f"{read.what} read a tensor that is no node of the graph"
            outputs = dtypes.get(read.node)
            now = outputs[0] if outputs and len(outputs) == 1 else None
            if now != read.value:
                return (
                    f"{read.what} at {read.node} read {read.value} when traced; it is "
                    f"{now or 'not known'} in {setting.name}"
                )
        else:
            with capture_state(setting):
                value = repr(getattr(torch, read.query or "")(*read.args))
            if value != read.value:
                return f"{read.what} returned {read.value} when traced; {value} in {setting.name}"
    return None


def annotation_difference(shared: Any, fresh: Any) -> str | None:
    """None if two reports (:class:`~ampgraph.report.records.Report`) annotate node for node alike:
    every node record (name, op, module, policy, inputs, casts, outputs, promotion, reason,
    error, ...) and every module call; else the first difference, in one line. Of the check only
    the dispatcher's verdict is compared: what torch.export recorded while tracing is there only
    for a graph traced in its own setting.
    """

    def rows(report: Any) -> list[dict[str, Any]]:
        out = []
        for rec in report.nodes:
            row = rec.to_dict()
            check = row.pop("check", None) or {}
            row["check"] = {k: v for k, v in check.items() if k in ("dispatcher", "agree")}
            out.append(row)
        return out

    a, b = rows(shared), rows(fresh)
    if len(a) != len(b):
        return f"{len(a)} nodes, a fresh capture {len(b)}"
    for x, y in zip(a, b):
        if x != y:
            field = next(k for k in {**x, **y} if x.get(k) != y.get(k))
            return f"node {x['name']}: {field} {x.get(field)!r}, fresh {y.get(field)!r}"
    ma = [m.to_dict() for m in shared.modules]
    mb = [m.to_dict() for m in fresh.modules]
    if ma != mb:
        first = next((i for i, (x, y) in enumerate(zip(ma, mb)) if x != y), min(len(ma), len(mb)))
        return f"module call {first} differs"
    return None


__all__ = [
    "Read",
    "TraceReads",
    "annotation_difference",
    "drop_past_raise",
    "past_raise_op",
    "why_not_shared",
]
