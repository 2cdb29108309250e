"""The joint trace's annotator and dispatch modes: the forward replayed so autograd records it.

:class:`JointAnnotator` is the annotator (:class:`~ampgraph.annotate.annotator.AutocastAnnotator`)
on the trace device, every cast an explicit ``aten._to_copy`` that autograd records; the dispatch
modes around it note the copies of parameters (:class:`ParameterCopies`), give the CPU's
mixed-type normalisations their real dtypes (:class:`CpuMixedNorms`) and apply autocast to the
backward's ops where it runs inside the context (:class:`BackwardAutocast`).

>>> import torch
>>> w = torch.ones(2)
>>> with ParameterCopies({w.untyped_storage()._cdata}) as copies:
...     _ = w.to(torch.bfloat16)
>>> len(copies.storages)
1
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx.experimental import proxy_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.annotate.annotator import AutocastAnnotator
from ampgraph.annotate.composite import InnerAutocast
from ampgraph.annotate.kernel_dtypes import RealCpuDtypes, retyped
from ampgraph.capture.regions import WRAP_WITH_SET_GRAD_ENABLED
from ampgraph.report.records import Cast
from ampgraph.torchutil import dtype_name, tensor_leaves
from ampgraph.train.joint_state import (
    AUTOCAST_CAST,
    FORWARD,
    TraceState,
    active_state,
    trace_device,
)


class JointAnnotator(AutocastAnnotator):
    """The annotator, replayed so that autograd records it: on the trace device, casts as
    explicit ``_to_copy`` calls (cached for parameters as autocast caches them), grad-mode
    regions honoured, every node's joint-graph nodes and autograd nodes attributed to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.device = torch.device(trace_device(self.setting))

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        state = active_state()
        state.enter((FORWARD, self.qualified(n)))
        try:
            return super().run_node(n)
        finally:
            state.exit()

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        if n.target is WRAP_WITH_SET_GRAD_ENABLED:
            with torch.set_grad_enabled(bool(args[0])):  # no_grad inside a forward: no backward
                return super().run_region(n, args)
        return super().run_region(n, args)

    def trace_decomposition(self, trace: Any) -> fx.GraphModule:
        # Traced apart from the joint graph: neither recorded in it nor seen by autograd.
        with (
            proxy_tensor.disable_proxy_modes_tracing(),
            torch.no_grad(),
            torch.autograd.graph.disable_saved_tensors_hooks("ampgraph: a side trace"),
        ):
            return trace()

    def cast_tensor(self, t: torch.Tensor, to: torch.dtype, device_type: str) -> torch.Tensor:
        state = active_state()
        lower = self.state.states[device_type][1]
        # autocast_mode.cpp cached_cast: fp32 leaves that require grad, cast to the lower
        # precision dtype, are cast once per autocast context and the copy reused.
        cacheable = (
            to == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
            and not t._is_view()
        )  # fmt: skip
        key = (id(t), to)
        if cacheable and key in state.cast_cache:
            return state.cast_cache[key]
        out = _explicit_cast(state, t, to)
        if cacheable:
            state.cast_cache[key] = out
        return out


def _explicit_cast(state: TraceState, t: torch.Tensor, to: torch.dtype) -> torch.Tensor:
    out = torch.ops.aten._to_copy.default(t, dtype=to)
    node = state.node_of(out)
    if node is not None:
        node.meta[AUTOCAST_CAST] = True
    return out


class ParameterCopies(TorchDispatchMode):
    """Note the storage of every dtype conversion of a parameter or buffer (autocast's 16-bit
    copies of weights, a model's own ``weight.to(dtype)``): memory that exists only while it is
    needed, unlike the parameter's. The copies are kept alive so no other tensor reuses their
    storage while the step runs. :mod:`ampgraph.verify.training` watches the real step with it too.
    """

    def __init__(self, sources: set[int]) -> None:
        super().__init__()
        self.sources = sources
        self.storages: set[int] = set()
        self.keep: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(out, torch.Tensor)
            and args[0].untyped_storage()._cdata in self.sources
        ):
            self.storages.add(out.untyped_storage()._cdata)
            self.keep.append(out)
        return out


class CpuMixedNorms(RealCpuDtypes):
    """Give the CPU's mixed-type normalisations the dtypes the real kernels return, in the
    joint graph too (:mod:`ampgraph.annotate.kernel_dtypes`): what is saved, and what the backward
    computes from it, is as on the CPU."""

    def retype(self, out: Any, dtypes: dict[int, torch.dtype]) -> tuple[Any, ...]:
        state = active_state()
        # The nodes' values are snapshots, as make_fx's own: a node holding a gradient itself
        # would keep the engine from stealing it into .grad, and add a copy a real step lacks.
        with proxy_tensor.disable_proxy_modes_tracing():
            fixed = retyped(out, dtypes)
            for old, new in zip(out, fixed):
                if new is old:
                    continue
                slot = proxy_tensor.get_proxy_slot(old, state.tracer, None)
                if slot is not None:
                    proxy_tensor.set_proxy_slot(new, state.tracer, slot)
                    slot.proxy.node.meta["val"] = proxy_tensor.extract_val(new)
            node = state.node_of(out[0])
            if node is not None and node.args:
                node.args[0].meta["val"] = proxy_tensor.extract_val(fixed)
        return fixed


class BackwardAutocast(InnerAutocast):
    """Autocast on the backward's ops, for ``loss.backward()`` called inside the context.

    A dispatch mode sees each op a backward formula calls, as autocast does, and applies the
    policy tables to it; its casts are explicit ``_to_copy`` nodes, marked, and the op's node
    records its policy and casts.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        category, device_type = self.annotator.policy_at(func, tuple(args), kwargs)
        if category is None:
            return func(*args, **kwargs)
        state = active_state()
        sources = {id(t): state.node_of(t) for t in tensor_leaves((args, kwargs))}
        before = len(state.graph.nodes)
        call_args, call_kwargs, casts, op, _why = self.annotator.apply_policy(
            func, category, device_type, tuple(args), kwargs, None
        )
        for node in state.new_nodes(before):
            node.meta[AUTOCAST_CAST] = True
        for c, t in zip(casts, _cast_sources(args, kwargs, casts)):
            source = sources.get(id(t)) if t is not None else None
            c.node = source.name if source is not None else "?"
        start = len(state.graph.nodes)
        out = op(*call_args, **call_kwargs)
        for node in state.new_nodes(start):
            node.meta["ampgraph_policy"] = category
            node.meta["ampgraph_casts"] = casts
        return out


def _cast_sources(
    args: Any, kwargs: dict[str, Any], casts: list[Cast]
) -> list[torch.Tensor | None]:
    """The tensors ``casts`` were made of, in order (the eligible ones of another dtype)."""
    tensors = [t for t in tensor_leaves((args, kwargs)) if t.is_floating_point()]
    out: list[torch.Tensor | None] = []
    i = 0
    for c in casts:
        while i < len(tensors) and dtype_name(tensors[i].dtype) != c.from_dtype:
            i += 1
        out.append(tensors[i] if i < len(tensors) else None)
        i += 1
    return out


__all__ = ["BackwardAutocast", "CpuMixedNorms", "JointAnnotator", "ParameterCopies"]
