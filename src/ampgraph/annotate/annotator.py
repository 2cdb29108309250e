"""Annotate: what autocast does at every node, from ampgraph's own policy tables.

:class:`AutocastAnnotator` is an ``fx.Interpreter`` pass in the spirit of ``ShapeProp``. It replays
the captured graph on fake tensors with autocast *off*, and at each op applies what the tables in
:mod:`ampgraph.policy` say autocast does there, exactly as ``autocast_mode.h`` does it:

* ``lower_precision_fp`` / ``fp32``: cast every eligible tensor argument (floating point, not fp64,
  on the autocast device) that is not already in the target dtype;
* ``fp32_set_opt_dtype``: if the first argument is eligible and the call sets no ``dtype=``, call
  with ``dtype=torch.float32``; otherwise run as called;
* ``fp32_append_dtype``: redispatch to the overload that takes a dtype, with fp32 (or the first
  argument's own dtype when it is not eligible);
* ``promote``: cast every eligible argument to the widest floating dtype among them;
* ops without a policy run as called, and mixed inputs follow ordinary type promotion.

What dtype the op then returns comes from running it on fake tensors, not from rules written here.
The annotator never reads what the dispatcher's autocast produced, so the check in
:mod:`ampgraph.annotate.check` that compares the two proves something.

>>> import torch
>>> from ampgraph import analyze
>>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),), check=False)
>>> report.node("linear").casts[0].to_dtype
'bfloat16'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import in_analysis_environment
from ampgraph import policy as P
from ampgraph.annotate import hops
from ampgraph.annotate.composite import Decomposed, InnerAutocast, is_composite
from ampgraph.annotate.reasons import casts_said, no_policy_reason, opaque_reason
from ampgraph.annotate.replay import (
    Failed,
    FakeReplay,
    dtype_names,
    fake_session,
    is_getitem,
    not_analysable,
    op_name,
    shape_lists,
)
from ampgraph.capture.regions import region_args
from ampgraph.capture.sources import source_of
from ampgraph.capture.trace import Capture
from ampgraph.policy import rules
from ampgraph.policy.kernels import python_kernel
from ampgraph.report.records import Cast, NodeRecord
from ampgraph.settings import Setting, short_dtype
from ampgraph.torchutil import (
    autocast_state,
    device_type_of,
    dtype_name,
    tensor_leaves,
    torch_dtype,
)


class AutocastState:
    """Autocast as the annotator models it: per device type, enabled or not and the 16-bit dtype."""

    def __init__(self, states: dict[str, tuple[bool, torch.dtype]]) -> None:
        self.states = states

    @classmethod
    def of(cls, setting: Setting) -> AutocastState:
        states = {d: (False, torch.bfloat16) for d in ("cpu", "cuda")}
        states[setting.device_type] = (setting.autocast, torch_dtype(setting.amp_dtype))
        return cls(states)

    def with_region(self, device_type: str, enabled: bool, dtype: torch.dtype) -> AutocastState:
        states = dict(self.states)
        states[device_type] = (enabled, dtype)
        return AutocastState(states)


class AutocastAnnotator(FakeReplay):
    """Replay a captured graph and record, per node, the policy, casts and dtypes that result."""

    def __init__(
        self,
        capture: Capture,
        gm: fx.GraphModule | None = None,
        state: AutocastState | None = None,
        records: list[NodeRecord] | None = None,
        prefix: str = "",
        region: str | None = None,
    ) -> None:
        super().__init__(gm if gm is not None else capture.graph_module, capture.setting, prefix)
        self.capture = capture
        self.state = state if state is not None else AutocastState.of(capture.setting)
        self.records: list[NodeRecord] = records if records is not None else []
        self.region = region
        self.trace_time = set(capture.trace_time_dtype_nodes)
        self._pending: dict[str, Any] = {}
        #: For each composite node: the ops inside it that autocast applies to, at any depth,
        #: as (``"nll_loss_nd → nll_loss"``, category).
        self.inner_applied: dict[str, list[tuple[str, str]]] = {}

    # -- records ----------------------------------------------------------------------------------
    def _record(self, n: fx.Node, **fields: Any) -> NodeRecord:
        stack_meta = n.meta.get("nn_module_stack") or {}
        stack = [path for path, _type in stack_meta.values()]
        call = next(reversed(stack_meta)) if stack_meta else None
        inputs = []
        for arg in n.all_input_nodes:
            if arg.op == "get_attr":
                continue
            inputs.append({"node": self.qualified(arg), "dtype": self._dtype_of(arg)})
        fields.setdefault("kind", "op")
        rec = NodeRecord(
            name=self.qualified(n),
            op=op_name(n.target) if n.op == "call_function" else n.op,
            module=stack[-1] if stack else None,
            module_call=call,
            stack=stack,
            region=self.region,
            autocast=self.state.states[self.setting.device_type][0],
            inputs=inputs,
            trace_time_dtype=n.name in self.trace_time,
            source=source_of(n.meta.get("stack_trace")),
            **fields,
        )
        self.records.append(rec)
        return rec

    def _dtype_of(self, node: fx.Node) -> str | None:
        value = self.env.get(node)
        leaves = tensor_leaves(value)
        return dtype_name(leaves[0].dtype) if leaves else None

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        pending = self._pending.pop(n.name, {})
        if not failure.analysed:
            pending["reason"] = f"not analysed: {not_analysable(failure.message)}"
            self._record(n, not_analysed=failure.message, **pending)
            return
        self._record(n, error=failure.message, **pending)

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        if n.op == "output" and self.prefix:
            return  # a region body's output: the region node itself is recorded as skipped
        extra = {} if failure.analysed else {"not_analysed": f"depends on {failure.node}"}
        self._record(
            n,
            kind="output" if n.op == "output" else "op",
            skipped=failure.node,
            reason=f"not run: input from failed {failure.node}"
            if failure.analysed
            else f"not analysed: depends on {failure.node}, which could not be analysed here",
            **extra,
        )

    # -- fx.Interpreter ---------------------------------------------------------------------------
    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "placeholder":
            self._record_placeholder(n, value)
        elif n.op == "output" and not self.prefix and not isinstance(value, Failed):
            self._record(n, kind="output", outputs=dtype_names(value), reason="graph output")
        if self.records and self.records[-1].name == self.qualified(n):
            # Shapes let the audit count bytes (cast, widened); the value is at hand only here.
            self.records[-1].shapes = shape_lists(value)
        return value

    def _record_placeholder(self, n: fx.Node, value: Any) -> None:
        if n.name in self.outer_names:
            return  # a region body's operand: recorded where it was produced
        kind, target = self.capture.input_kinds.get(n.name, ("input", n.name))
        what = {"parameter": "parameter", "buffer": "buffer", "constant": "constant"}.get(
            kind, "model input"
        )
        self._record(
            n,
            kind=kind,
            target=target,
            outputs=dtype_names(value),
            reason=f"{what} {target} in {short_dtype(_first(dtype_names(value)))}",
        )

    def execute(self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if n.op != "call_function":
            return super().execute(n, args, kwargs)
        target = n.target
        if hops.is_flex_attention(target):
            value, fields = hops.flex_attention(self, n, args, lambda a: super(
                AutocastAnnotator, self).execute(n, a, kwargs))  # fmt: skip
            self._record(n, outputs=dtype_names(value), **fields)
            return value
        if not isinstance(target, torch._ops.OpOverload):
            value = super().execute(n, args, kwargs)
            reason = "selects one output" if is_getitem(target) else "Python-level op"
            self._record(n, outputs=dtype_names(value), reason=reason)
            return value
        category, device_type = self.policy_at(target, args, kwargs)
        self._pending[n.name] = {"policy": category}
        call_args, call_kwargs, casts, op, reason = self.apply_policy(
            target, category, device_type, args, kwargs, n
        )
        self._pending[n.name]["casts"] = casts
        self._pending[n.name]["reason"] = reason
        if category == P.OPAQUE:
            self._pending[n.name]["not_analysed"] = opaque_reason(target, device_type)
        inner: InnerAutocast | Decomposed | None = None
        if category is None and self._autocast_on(args, kwargs):
            inner = Decomposed(self, n, target) if is_composite(target) else InnerAutocast(self)
        if inner is None:
            value = op(*call_args, **call_kwargs)
        else:
            value = inner.call(op, call_args, call_kwargs)
            if inner.applied:
                self.inner_applied[self.qualified(n)] = inner.applied
                category = inner.applied[0][1]
                self._pending[n.name].update(
                    policy=category,
                    casts=inner.casts,
                    reason=f"no autocast policy for {target._schema.name.removeprefix('aten::')}"
                    f"; inside it autocast applies to "
                    + ", ".join(
                        f"{op_name} ({P.CATEGORY_LABEL[cat]})" for op_name, cat in inner.applied
                    ),
                )
                opaque = [name for name, cat in inner.applied if cat == P.OPAQUE]
                if opaque:
                    self._pending[n.name]["not_analysed"] = (
                        f"opaque autocast kernel inside it ({', '.join(opaque)}): its dtypes "
                        "are what that kernel returned, not a prediction"
                    )
        pending = self._pending.pop(n.name)
        outputs = dtype_names(value)
        if isinstance(inner, InnerAutocast) and not inner.applied and target.namespace != "aten":
            cast_inside = self._cast_inside(target, call_args, call_kwargs, outputs)
            if cast_inside is not None:
                pending.update(not_analysed=cast_inside, reason=f"not analysed: {cast_inside}")
        promotion = _promotion(call_args, call_kwargs, outputs) if category is None else None
        if promotion is not None and target.namespace == "aten":  # a custom op's is its own
            pending["reason"] = (
                f"no autocast policy; type promotion widens "
                f"{' + '.join(short_dtype(d) for d in promotion['inputs'])} -> "
                f"{short_dtype(promotion['to'])}"
            )
        self._record(n, outputs=outputs, promotion=promotion, **pending)
        return value

    def _cast_inside(
        self,
        op: torch._ops.OpOverload,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        outputs: list[str | None],
    ) -> str | None:
        """Why a custom op's dtypes are no prediction, or None: its real kernel, a Python body
        run with autocast still enabled (the op has no autocast kernel), returns other dtypes
        than its ``register_fake``, which fake tensors run with autocast off, says.

        The body runs here on the fake tensors with autocast enabled as at this node, through
        the dispatcher's own autocast kernels, as :data:`~ampgraph.policy.OPAQUE` kernels do: a
        second opinion on user code, honouring the body's own ``torch.autocast`` blocks. A
        body fake tensors cannot run (a Triton launch, ``.item()``, NumPy) leaves the fake's
        word standing. Not in a subclass that traces itself (the joint annotator): the body's
        ops would land in its trace.
        """
        if type(self).trace_decomposition is not AutocastAnnotator.trace_decomposition:
            return None
        device_type = self.setting.device_type
        body = python_kernel(device_type, op.name())
        enabled, lower = self.state.states.get(device_type, (False, None))
        if body is None or not enabled or lower is None:
            return None
        try:
            with autocast_state(device_type, True, lower):
                got = dtype_names(body(*args, **kwargs))
        except Exception:  # noqa: BLE001 - any failure of user code means: no second opinion
            return None
        if got == outputs:
            return None
        return (
            f"{op.name()} has no autocast kernel, so on a real run its Python kernel runs with "
            f"autocast on, and returns {', '.join(short_dtype(d) for d in got)}, where its "
            f"register_fake (run with autocast off) returns "
            f"{', '.join(short_dtype(d) for d in outputs)}: the dtypes here are the fake's, "
            "not a prediction"
        )

    def _autocast_on(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        devices = {device_type_of(t) for t in tensor_leaves((args, kwargs))}
        return any(self.state.states.get(d, (False, None))[0] for d in devices)

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        region = region_args(n, args)
        state = self.state
        if region.is_autocast:
            assert region.device_type is not None and region.dtype is not None
            state = self.state.with_region(region.device_type, region.enabled, region.dtype)
            reason = (
                f"autocast {'enabled' if region.enabled else 'disabled'} on {region.device_type}"
                + (f" in {short_dtype(dtype_name(region.dtype))}" if region.enabled else "")
                + " inside this region"
            )
        else:
            reason = "grad mode changes inside this region; autocast as around it"
        child = type(self)(  # a subclass's children are of its kind (backward's meta replay)
            self.capture,
            gm=region.body,
            state=state,
            records=self.records,
            prefix=f"{self.prefix}{n.name}.",
            region=f"{self.prefix}{n.name}" if region.is_autocast else self.region,
        )
        rec = self._record(n, kind="region" if region.is_autocast else "op", reason=reason)
        value = self.run_body(child, region.body, region.operands, n)
        if isinstance(value, Failed):
            rec.skipped = value.node  # the body's failing node carries the error
        rec.outputs = dtype_names(value)
        return value

    def child(self, gm: fx.GraphModule, prefix: str) -> AutocastAnnotator:
        """An annotator of a small graph met inside one of this one's nodes (a composite op's
        decomposition): the same capture, autocast state and region, records of its own."""
        return type(self)(
            self.capture, gm=gm, state=self.state, records=[], prefix=prefix, region=self.region
        )

    def trace_decomposition(self, trace: Any) -> fx.GraphModule:
        """Run ``trace()``, which traces a composite op's decomposition into a small graph.

        A hook for subclasses that are themselves being traced (:mod:`ampgraph.train.backward`): the
        small graph must be made outside their own trace.
        """
        return trace()

    # -- policy -------------------------------------------------------------------------------------
    def policy_at(
        self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, str]:
        """The category that applies at ``op``, and the device: the op's entry for the device
        autocast is enabled on (None where no entry applies)."""
        tensors = tensor_leaves((args, kwargs))
        devices = [device_type_of(t) for t in tensors] or [self.setting.device_type]
        for device_type in dict.fromkeys(devices):
            enabled, _dtype = self.state.states.get(device_type, (False, torch.bfloat16))
            if not enabled:
                continue
            category = P.lookup(device_type, op._schema.name, op._overloadname)
            if (
                category is None
                and not P.decided(device_type, op._schema.name, op._overloadname)
                and P.has_autocast_kernel(device_type, op.name())
            ):
                category = P.OPAQUE  # a kernel is there, but not one ampgraph knows
            if category is not None:
                return category, device_type
        return None, self.setting.device_type

    def apply_policy(
        self,
        op: torch._ops.OpOverload,
        category: str | None,
        device_type: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        n: fx.Node | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast], Any, str]:
        """What autocast does at ``op`` in ``category``: the arguments it calls with, the casts
        it makes, the callable that runs, and why (the record's reason)."""
        name = op._schema.name.removeprefix("aten::")
        if category is None:
            enabled = self.state.states[self.setting.device_type][0]
            return args, kwargs, [], op, no_policy_reason(op, enabled, self.setting.device_type)
        lower = self.state.states[device_type][1]
        if category == P.BANNED:
            raise RuntimeError(P.BANNED_MESSAGE)
        if category == P.OPAQUE:
            # No rule to apply, so nothing to predict: the kernel itself runs (autocast on for
            # it alone), and the node is marked not analysed, its dtypes an observation that
            # the check does not count. What follows is predicted from them as usual.
            def run_kernel(*a: Any, **k: Any) -> Any:
                with autocast_state(device_type, True, lower):
                    return op(*a, **k)

            return args, kwargs, [], run_kernel, f"not analysed: {opaque_reason(op, device_type)}"
        if category == P.CAST_INPUTS:
            return self._library_casts(op, device_type, args, kwargs, n)
        if category == P.FP32_OUTPUT_AS_INPUT:
            return self._fp32_and_back(op, device_type, args, kwargs, n)
        if category in (P.LOWER_PRECISION_FP, P.FP16, P.FP32, P.PROMOTE):
            if category == P.LOWER_PRECISION_FP:
                to = lower
            elif category == P.FP16:
                to = torch.float16
            elif category == P.FP32:
                to = torch.float32
            else:
                to = rules.promote_type(op, args, kwargs, lower, device_type)
            unknown = f"({name} input)"
            new_args, new_kwargs, casts = self._cast_all(args, kwargs, to, device_type, n, unknown)
            verb = {P.PROMOTE: "promotes to"}.get(category, "runs")
            why = f"autocast {verb} {name} in {short_dtype(dtype_name(to))}: {casts_said(casts)}"
            return new_args, new_kwargs, casts, op, why
        if category == P.FP32_SET_OPT_DTYPE:
            if not rules.is_eligible(rules.first_argument(args, kwargs), device_type):
                return args, kwargs, [], op, f"{name}: first input not eligible, runs as called"
            current = rules.given_dtype(op, args, kwargs)
            if current is not None:
                why = f"{name} already sets dtype={current}: autocast leaves it"
                return args, kwargs, [], op, why
            why = f"autocast asks {name} for an fp32 result (dtype=fp32)"
            called = rules.set_opt_dtype(op, args, kwargs, device_type)
            assert called is not None  # eligible, and no dtype given
            return called[0], called[1], [], op, why
        # fp32_append_dtype: redispatch to the overload with an explicit dtype.
        target, redispatch, new_kwargs = rules.append_dtype(op, args, kwargs, device_type)
        why = (
            f"autocast calls {redispatch} with dtype={short_dtype(dtype_name(new_kwargs['dtype']))}"
        )
        return args, new_kwargs, [], target, why

    def _library_casts(
        self,
        op: torch._ops.OpOverload,
        device_type: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        n: fx.Node | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast], Any, str]:
        """``register_autocast``'s kernel: the floating inputs cast, then autocast off."""
        name = op._schema.name.removeprefix("aten::")
        rule = P.library_rule(device_type, op.name())
        assert rule is not None and rule.cast_to is not None
        to = torch_dtype(rule.cast_to)
        new_args, new_kwargs, casts = self._cast_all(
            args, kwargs, to, device_type, n, f"({name} input)"
        )
        why = (
            f"register_autocast's kernel runs {op.name()} with autocast off after casting its "
            f"floating inputs to {short_dtype(rule.cast_to)}: {casts_said(casts)}"
        )
        return new_args, new_kwargs, casts, op, why

    def _fp32_and_back(
        self,
        op: torch._ops.OpOverload,
        device_type: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        n: fx.Node | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast], Any, str]:
        """torchvision's autocast wrappers: the op in fp32, its outputs cast back to the first
        input's dtype."""
        name = op._schema.name.removeprefix("aten::")
        first = next((t for t in tensor_leaves((args, kwargs))), None)
        back = first.dtype if first is not None else torch.float32
        # torchvision's _autocast_cast casts every floating, not fp64, tensor: whatever its
        # device, unlike autocast's own is_eligible.
        new_args, new_kwargs, casts = self._cast_all(
            args, kwargs, torch.float32, device_type, n, f"({name} input)", any_device=True
        )

        def run_and_cast_back(*a: Any, **k: Any) -> Any:
            out = op(*a, **k)
            return pytree.tree_map_only(
                torch.Tensor, lambda t: torch.ops.aten._to_copy.default(t, dtype=back), out
            )

        why = (
            f"{op.name()}'s autocast wrapper runs it in fp32 and returns "
            f"{short_dtype(dtype_name(back))}" + (f": {casts_said(casts)}" if casts else "")
        )
        return new_args, new_kwargs, casts, run_and_cast_back, why

    def producer_label(self, n: fx.Node | None, t: torch.Tensor, unknown: str) -> str:
        """The qualified name of the input node of ``n`` that produced tensor ``t``."""
        for a in n.all_input_nodes if n is not None else []:
            value = self.env.get(a)
            if value is t:
                return self.qualified(a)
        for a in n.all_input_nodes if n is not None else []:
            value = self.env.get(a)
            if isinstance(value, (list, tuple)) and any(v is t for v in value):
                return self.qualified(a)
        return unknown

    def _cast_all(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        to: torch.dtype,
        device_type: str,
        n: fx.Node | None,
        unknown: str = "?",
        any_device: bool = False,
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast]]:
        """Cast every eligible tensor argument not already in ``to`` (:meth:`cast_tensor`), as
        autocast's wrappers do; returns the new arguments and the casts, in argument order.

        ``any_device`` judges each tensor's eligibility on its own device (torchvision's
        ``_autocast_cast``) rather than on ``device_type`` (autocast's ``is_eligible``).
        """
        casts: list[Cast] = []

        def cast(t: torch.Tensor) -> torch.Tensor:
            eligible = rules.is_eligible(t, device_type if not any_device else device_type_of(t))
            if not eligible or t.dtype == to:
                return t
            label = self.producer_label(n, t, unknown)
            casts.append(Cast(label, dtype_name(t.dtype), dtype_name(to)))
            return self.cast_tensor(t, to, device_type)

        # autocast's wrappers cast their arguments in a C++ pack expansion, which GCC (torch's
        # Linux wheels) evaluates right to left: where autograd records the casts (the joint
        # trace of a training step), their autograd nodes get their sequence numbers in that
        # order, and the backward runs them by it. On fake tensors alone the order is moot.
        leaves, spec = pytree.tree_flatten((args, kwargs))
        cast_leaves = [cast(leaf) if isinstance(leaf, torch.Tensor) else leaf
                       for leaf in reversed(leaves)][::-1]  # fmt: skip
        casts.reverse()
        new_args, new_kwargs = pytree.tree_unflatten(cast_leaves, spec)
        return tuple(new_args), dict(new_kwargs), casts

    def cast_tensor(self, t: torch.Tensor, to: torch.dtype, device_type: str) -> torch.Tensor:
        """One cast autocast makes, ``t`` to ``to``: a hook for the joint trace's annotator
        (:class:`ampgraph.train.joint_annotator.JointAnnotator`), which marks the cast in its
        graph and caches a parameter's as autocast's ``cached_cast`` does."""
        return torch.ops.aten._to_copy.default(t, dtype=to)


def _first(items: list[str | None]) -> str | None:
    return items[0] if items else None


def _promotion(
    args: tuple[Any, ...], kwargs: dict[str, Any], outputs: list[str | None]
) -> dict[str, Any] | None:
    """Ordinary type promotion: floating inputs of different dtypes, result in the widest."""
    floats = [t for t in tensor_leaves((args, kwargs)) if t.is_floating_point()]
    kinds = list(dict.fromkeys(dtype_name(t.dtype) for t in floats))
    out = outputs[0] if outputs else None
    if len(kinds) < 2 or out is None or out not in kinds:
        return None
    return {"inputs": [dtype_name(t.dtype) for t in floats], "to": out}


@in_analysis_environment
def annotate(capture: Capture) -> list[NodeRecord]:
    """Annotate every node of a capture; returns the node records in execution order."""
    annotator = AutocastAnnotator(capture)
    with fake_session(capture.setting, capture.unbacked_values):
        annotator.run_graph()
    return annotator.records


# Keep autocast_state importable from here for notebooks that model a region by hand.
__all__ = ["AutocastAnnotator", "AutocastState", "annotate", "autocast_state"]
