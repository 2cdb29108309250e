"""Autocast inside composite ops that have no policy of their own, at any depth.

An op without a policy that decomposes above autocast (a CompositeImplicitAutograd kernel) is
not autocast's to leave alone: autocast falls through to the decomposition with autocast still
on, and the ops inside get their own policies. :class:`Decomposed` traces that decomposition and
annotates it; :class:`InnerAutocast` applies the policies to the decomposed ops as they run,
where the decomposition cannot be traced.

>>> is_composite(torch.ops.aten.einsum.default), is_composite(torch.ops.aten.bmm.default)
(True, False)
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph import policy as P
from ampgraph.annotate.replay import Failed
from ampgraph.capture import driverless
from ampgraph.report.records import Cast, NodeRecord
from ampgraph.torchutil import device_type_of


class AutocastAnnotator(Protocol):
    """What autocast inside a composite needs of the annotator that meets it
    (:class:`ampgraph.annotate.annotator.AutocastAnnotator`, which uses this module): the
    policy at an op, applying it, and a child annotator for a decomposition."""

    state: Any  # the annotator's AutocastState: which devices autocast is on for, in what dtype
    prefix: str
    records: list[NodeRecord]
    outer_names: dict[str, str]
    inner_applied: dict[str, list[tuple[str, str]]]

    def child(self, gm: fx.GraphModule, prefix: str) -> AutocastAnnotator: ...

    def run(self, *args: Any) -> Any: ...

    def trace_decomposition(self, trace: Any) -> fx.GraphModule: ...

    def producer_label(self, n: fx.Node | None, t: torch.Tensor, unknown: str) -> str: ...

    def policy_at(
        self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, str]: ...

    def apply_policy(
        self,
        op: torch._ops.OpOverload,
        category: str | None,
        device_type: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        n: fx.Node | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast], Any, str]: ...


def is_composite(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` decomposes above autocast (a CompositeImplicitAutograd kernel)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


class Decomposed:
    """Autocast inside a CompositeImplicitAutograd op without a policy, at any depth.

    Autocast falls through such an op to its decomposition with autocast still on, and each op
    the decomposition calls is dispatched from the top again, so autocast's lists apply to it;
    if that op is itself a composite without a policy, the same happens one level further down
    (CUDA ``cross_entropy_loss`` -> ``log_softmax`` in fp32 and ``nll_loss_nd`` -> ``nll_loss``).
    ``make_fx(pre_dispatch=True)`` with the op's own decomposition records those calls at the
    level autocast sees them; a child annotator then annotates that little graph, recursing
    where it meets another such composite.
    """

    def __init__(self, annotator: AutocastAnnotator, n: fx.Node, op: torch._ops.OpOverload):
        self.annotator = annotator
        self.node = n
        self.op = op
        self.casts: list[Cast] = []
        self.applied: list[tuple[str, str]] = []

    def call(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``op`` as autocast would, filling ``applied`` and ``casts``."""
        from torch.fx.experimental.proxy_tensor import make_fx

        leaves, spec = pytree.tree_flatten((args, kwargs))
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        tensors = [leaves[i] for i in where]
        key = (
            self.op,
            tuple((t.dtype, device_type_of(t)) for t in tensors),
            # The other arguments choose the decomposition: F.pad's "constant" mode has no
            # policy inside, its "reflect" mode is reflection_pad1d, fp32 in CPU autocast.
            tuple(repr(leaf) for i, leaf in enumerate(leaves) if i not in set(where)),
            tuple(sorted(self.annotator.state.states.items())),
        )
        # (op, tensor signature, other arguments, autocast state) whose decomposition reaches no
        # autocast policy, remembered with the tables in use (a what-if's, tests' deliberately
        # wrong ones), not in the module: it goes when they do.
        no_policy_inside = P.tables_memo()
        if key in no_policy_inside:
            return op(*args, **kwargs)

        def call_op(*ts: torch.Tensor) -> Any:
            filled = list(leaves)
            for i, t in zip(where, ts):
                filled[i] = t
            a, k = pytree.tree_unflatten(filled, spec)
            return self.op(*a, **k)

        def cpp_decomposition(*a: Any, **k: Any) -> Any:
            # The C++ kernel a real run takes: op.decompose() would prefer a Python decomposition
            # registered for tracing (upsample_bilinear2d.vec has one) whose ops differ.
            return self.op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *a, **k)

        # A composite that asks the GPU driver first (cuDNN RNNs) decomposes by its stand-in.
        table = {self.op: driverless.decomposition(self.op) or cpp_decomposition}
        try:
            gm = self.annotator.trace_decomposition(
                lambda: make_fx(call_op, pre_dispatch=True, decomposition_table=table)(*tensors)
            )
        except Exception:  # noqa: BLE001 - not traceable this way: autocast as one level sees it
            fallback = InnerAutocast(self.annotator)
            value = fallback.call(op, args, kwargs)
            self.applied, self.casts = fallback.applied, fallback.casts
            if not self.applied:
                no_policy_inside.add(key)
            return value
        parent = self.annotator
        child = parent.child(gm, f"{parent.prefix}{self.node.name}.")
        placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
        child.outer_names = {
            p.name: parent.producer_label(self.node, t, "?") for p, t in zip(placeholders, tensors)
        }
        value = child.run(*tensors)
        if isinstance(value, Failed):
            raise RuntimeError(value.message)  # noqa: TRY004 - the inner op's own error
        for rec in child.records:
            if rec.policy is not None:
                name = rec.op.split(".")[1]
                # A composite inside: name the path down to the ops autocast applies to.
                nested = child.inner_applied.get(rec.name, [(None, rec.policy)])
                self.applied += [
                    (f"{name} → {path}" if path else name, cat) for path, cat in nested
                ]
            self.casts += rec.casts
        if not self.applied:
            no_policy_inside.add(key)
        return value


class InnerAutocast(TorchDispatchMode):
    """Autocast inside a composite op that has no policy of its own.

    Autocast only skips its own key while it runs a policy's wrapper. An op without a policy
    falls through to its CompositeImplicitAutograd decomposition with autocast still on, so the
    ops it decomposes into get their policies (CPU ``einsum`` -> ``bmm`` in 16 bits;
    ``cross_entropy_loss`` -> ``log_softmax`` in fp32 on CUDA). A dispatch mode sees exactly those
    decomposed ops, after the composite has been expanded; ops handled here are not expanded
    further, as autocast's wrappers exclude autocast for what they call.
    """

    def __init__(self, annotator: AutocastAnnotator) -> None:
        super().__init__()
        self.annotator = annotator
        self.casts: list[Cast] = []
        self.applied: list[tuple[str, str]] = []

    def call(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``op`` with this mode on, filling ``applied`` and ``casts``."""
        with self:
            return op(*args, **kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload):
            category, device_type = self.annotator.policy_at(func, tuple(args), kwargs)
            if category is not None:
                args, kwargs, casts, op, _why = self.annotator.apply_policy(
                    func, category, device_type, tuple(args), kwargs, None
                )
                self.casts += casts
                self.applied.append((func._schema.name.removeprefix("aten::"), category))
                return op(*args, **kwargs)
        return func(*args, **kwargs)


__all__ = ["Decomposed", "InnerAutocast", "is_composite"]
