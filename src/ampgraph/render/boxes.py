"""What each drawn box holds: its attributes from the report's records, and which free ops the
module view draws.

Parameters and buffers are never drawn as nodes; the casts autocast applies to them are written in
the box of the op that casts them (``casts weight, bias: fp32→bf16``).

This module is torch-free.

>>> op_parts("aten.add.Tensor"), short_class("torch.nn.modules.linear.Linear")
(('add', 'Tensor'), 'Linear')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ampgraph.policy import lookup
from ampgraph.render.style import is_floating

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import ModuleCall, NodeRecord, Report


#: Free ops drawn in the module view whenever a floating value goes in.
ATTENTION_OPS: Final = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "softmax", "_softmax", "log_softmax", "_log_softmax",
})  # fmt: skip


MATMUL_OPS: Final = frozenset({
    "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "linear", "conv1d", "conv2d",
    "conv3d", "convolution", "_convolution",
})  # fmt: skip


#: Explicit casts: drawn when they change the dtype (a no-op ``.float()`` on fp32 is collapsed).
CAST_OPS: Final = frozenset({"to", "_to_copy", "type_as", "convert_element_type", "_to_dtype"})


#: Binary arithmetic: drawn when two activations meet (residual adds, gates), where mixed dtypes
#: promote; a multiply by a constant or a parameter is collapsed.
BINARY_OPS: Final = frozenset({"add", "sub", "mul", "div", "add_", "mul_"})


#: How the free ops read in a box title.
OP_TITLE: Final[dict[str, str]] = {
    "scaled_dot_product_attention": "attention (SDPA)",
    "_scaled_dot_product_flash_attention": "attention (flash)",
    "_scaled_dot_product_efficient_attention": "attention (efficient)",
    "_scaled_dot_product_cudnn_attention": "attention (cuDNN)",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "_to_copy": "cast",
    "to": "cast",
    "type_as": "cast",
    "convert_element_type": "cast",
}


#: Argument names for the activations an op's casts mention (``casts q, k: fp32→bf16``).
ARG_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "scaled_dot_product_attention": ("q", "k", "v", "mask"),
    "_scaled_dot_product_flash_attention": ("q", "k", "v"),
    "_scaled_dot_product_efficient_attention": ("q", "k", "v", "bias"),
    "matmul": ("a", "b"),
    "mm": ("a", "b"),
    "bmm": ("a", "b"),
    "baddbmm": ("input", "a", "b"),
    "addmm": ("bias", "a", "b"),
    "einsum": ("a", "b", "c"),
}


#: Policy precedence for a box holding several ops (a leaf module that runs more than one).
POLICY_PRECEDENCE: Final = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned",
)  # fmt: skip


def op_parts(op: str) -> tuple[str, str]:
    """Short op name and overload: ``"aten.add.Tensor"`` -> ``("add", "Tensor")``.

    >>> op_parts("aten.scaled_dot_product_attention.default")
    ('scaled_dot_product_attention', 'default')
    >>> op_parts("getitem")
    ('getitem', '')
    """
    parts = op.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "higher_order", "quantized", "_ops"):
        return parts[1], ".".join(parts[2:])
    return parts[-1], ""


def short_class(type_name: str) -> str:
    """``"torch.nn.modules.linear.Linear"`` -> ``"Linear"``."""
    return type_name.rsplit(".", 1)[-1]


def relative_path(path: str | None, base: str | None) -> str:
    """``path`` relative to ``base`` (a folded layer), or ``path`` when it is not below ``base``.

    >>> relative_path("model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0")
    'self_attn.q_proj'
    >>> relative_path("model.decoder.layers.0", "model.decoder.layers.0")
    ''
    """
    if not path:
        return ""
    if base:
        if path == base:
            return ""
        if path.startswith(base + "."):
            return path[len(base) + 1 :]
    return path


def short_param_name(target: str | None, module: str | None, fallback: str) -> str:
    """A parameter's name relative to the module that uses it: ``...fc1.weight`` -> ``weight``."""
    if not target:
        return fallback
    if module and target.startswith(module + "."):
        return target[len(module) + 1 :]
    return target.rsplit(".", 1)[-1]


def dominant_policy(policies: Iterable[str | None]) -> str | None:
    """The policy a box shows when its ops have several (lower precision wins over fp32...)."""
    present = {p for p in policies if p}
    return next((p for p in POLICY_PRECEDENCE if p in present), None)


@dataclass
class Context:
    """Lookups shared by the builders."""

    report: Report
    records: dict[str, NodeRecord]
    device_type: str

    @classmethod
    def of(cls, report: Report) -> Context:
        return cls(
            report=report,
            records={r.name: r for r in report.nodes},
            device_type=str(report.setting.get("device_type", "cuda")),
        )

    def is_source(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is None or rec.is_source

    def disagrees(self, rec: NodeRecord) -> bool:
        return rec.check is not None and not rec.check.get("agree", True)


def _cast_names(ctx: Context, rec: NodeRecord, module: str | None) -> list[tuple[str, str, str]]:
    """Each cast of ``rec`` as (short name, from, to): activations first, then parameters.

    Parameters go by their name in the module (``weight``); an activation is ``x``, or, where
    several activations meet, by its role in the op (``q``, ``k``) or position (``x1``, ``x2``).
    """
    if not rec.casts:
        return []
    short, _ = op_parts(rec.op)
    roles = ARG_NAMES.get(short, ())
    activations = [i["node"] for i in rec.inputs if not ctx.is_source(i["node"])]
    positions = {i["node"]: k for k, i in enumerate(rec.inputs)}
    acts, params = [], []
    for cast in rec.casts:
        producer = ctx.records.get(cast.node)
        if producer is not None and producer.is_source:
            name = short_param_name(producer.target, module, cast.node)
            params.append((name, cast.from_dtype, cast.to_dtype))
            continue
        if len(activations) <= 1 or cast.node not in activations:
            name = "x"
        elif positions[cast.node] < len(roles):
            name = roles[positions[cast.node]]
        else:
            name = f"x{activations.index(cast.node) + 1}"
        acts.append((name, cast.from_dtype, cast.to_dtype))
    return acts + params


def dedupe(items: Iterable[Any]) -> tuple[Any, ...]:
    """The items in first-seen order, each once.

    >>> dedupe(["b", "a", "b"])
    ('b', 'a')
    """
    return tuple(dict.fromkeys(items))


def _base_attrs(rec: NodeRecord, order: float) -> dict[str, Any]:
    return {
        "order": order,
        "stack": tuple(rec.stack),
        "path": rec.module,
        "region": rec.region,
        "members": (rec.name,),
        "ops": (rec.op,),
        "policy": None,
        "in_dtypes": (),
        "out_dtype": rec.out_dtype,
        "casts": (),
        "promotion": None,
        "disagree": False,
        "error": rec.error,
        "residual": False,
        "op": None,
        "cls": "",
        "region_enabled": None,
        "layers": (),
        "differs": (),  # labels of neighbouring layers in which this box differs (folding)
    }


def module_attrs(ctx: Context, call: ModuleCall, order: int) -> dict[str, Any]:
    """A module box's attributes: the call's dtypes, and its ops' policy, casts and promotion."""
    members = [ctx.records[n] for n in call.nodes if n in ctx.records]
    first = members[0]
    attrs = _base_attrs(first, order)
    casts = [c for m in members for c in _cast_names(ctx, m, call.path)]
    promotions = [m.promotion for m in members if m.promotion]
    attrs.update(
        kind="module",
        path=call.path,
        # torch.export names a call "L__self__<path>[@n]"; the prefix says nothing to a reader.
        call=call.call.removeprefix("L__self__") or call.path,
        module_type=call.type,
        cls=short_class(call.type),
        members=tuple(call.nodes),
        ops=dedupe(m.op for m in members),
        policy=dominant_policy(m.policy for m in members),
        in_dtypes=(call.in_dtype,),
        out_dtype=call.out_dtype,
        casts=dedupe(casts),
        promotion=_promotion_attr(promotions[0]) if promotions else None,
        disagree=any(ctx.disagrees(m) for m in members),
        error=next((m.error for m in members if m.error), None),
        region=first.region,
    )
    return attrs


def _promotion_attr(promotion: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    return (tuple(promotion.get("inputs", ())), str(promotion.get("to")))


def op_attrs(ctx: Context, rec: NodeRecord, order: int) -> dict[str, Any]:
    """A free op's box attributes: its activations' dtypes (parameters are cast, not drawn)."""
    attrs = _base_attrs(rec, order)
    short, _ = op_parts(rec.op)
    ins = tuple(i["dtype"] for i in rec.inputs if not ctx.is_source(i["node"]))
    changes = short in CAST_OPS and rec.out_dtype not in [i["dtype"] for i in rec.inputs[:1]]
    attrs.update(
        kind="op",
        op=short,
        # A .to() that keeps the dtype is no cast; only the op view draws it, under its own name.
        cls=OP_TITLE.get(short, short) if short not in CAST_OPS or changes else short,
        policy=rec.policy,
        in_dtypes=ins,
        casts=dedupe(_cast_names(ctx, rec, rec.module)),
        promotion=_promotion_attr(rec.promotion) if rec.promotion else None,
        disagree=ctx.disagrees(rec),
    )
    return attrs


def region_attrs(
    ctx: Context, rec: NodeRecord, body: Sequence[NodeRecord], order: float
) -> dict[str, Any]:
    """An autocast region's output box: whether its body runs with autocast on or off."""
    attrs = _base_attrs(rec, order)
    if body:
        enabled: bool | None = body[0].autocast
    else:  # an empty body: only the annotator's reason says what the region does
        enabled = "enabled" in rec.reason
    attrs.update(kind="region", op="region", cls="region output", region_enabled=enabled)
    return attrs


def io_attrs(rec: NodeRecord, order: int) -> dict[str, Any]:
    """A model input's or output's box attributes."""
    attrs = _base_attrs(rec, order)
    attrs.update(kind=rec.kind, cls=rec.target or rec.name)
    if rec.kind == "output":
        attrs["in_dtypes"] = tuple(i["dtype"] for i in rec.inputs)
    return attrs


def draws_free_op(ctx: Context, rec: NodeRecord) -> bool:
    """Whether the module view draws a free op (one outside every leaf-module call).

    The test reads only op names, dtypes and the policy tables -- not whether autocast is on --
    so the four settings of a model draw the same boxes and compare side by side.
    """
    if rec.kind == "region":
        return True
    if rec.error or ctx.disagrees(rec) or rec.promotion:
        return True
    short, overload = op_parts(rec.op)
    in_dtypes = [i["dtype"] for i in rec.inputs]
    floating_in = any(is_floating(d) for d in in_dtypes)
    if short in ATTENTION_OPS or short in MATMUL_OPS:
        return floating_in
    if short in CAST_OPS:
        src = in_dtypes[0] if in_dtypes else None
        dst = rec.out_dtype
        return src != dst and (is_floating(src) or is_floating(dst))
    if short in BINARY_OPS:
        activations = [
            i for i in rec.inputs if not ctx.is_source(i["node"]) and is_floating(i["dtype"])
        ]
        return len(activations) >= 2
    category = lookup(ctx.device_type, f"aten::{short}", "" if overload == "default" else overload)
    return category is not None and floating_in


def node_id(kind: str, name: str) -> str:
    """The graph node standing for record ``name`` as a box of ``kind``.

    >>> node_id("op", "add_3")
    'op/add_3'
    """
    # No ':' in ids: Graphviz reads "a:b" in an edge as node a, port b.
    return f"{kind}/{name}"


def region_body(report: Report) -> dict[str, list[NodeRecord]]:
    """Each autocast region's records (its body), by the region's node name."""
    body: dict[str, list[NodeRecord]] = {}
    for rec in report.nodes:
        if rec.region is not None:
            body.setdefault(rec.region, []).append(rec)
    return body


def region_sinks(body: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Body records whose value leaves the region: those no other record of the body consumes."""
    names = {r.name for r in body}
    consumed = {i["node"] for r in body for i in r.inputs if i["node"] in names}
    # A nested region's body has its own sinks; the nested region node stands for them.
    return [r for r in body if r.name not in consumed and r.region == body[0].region]
