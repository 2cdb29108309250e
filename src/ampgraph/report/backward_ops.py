"""What a training step's backward did, read from its records: which ops compute, which cast,
which run in 16 bits, where each gradient comes from, the order and depth of its modules.

Torch-free: everything here reads the ``backward`` section of a
:class:`~ampgraph.report.records.Report` (``ampgraph table --pass backward|train``); the formats
(:func:`ampgraph.formats.text.backward_lines`, :func:`ampgraph.formats.markdown.markdown_train`)
lay it out.

>>> from ampgraph.report.records import Backward, Gradient, NodeRecord
>>> bw = Backward(
...     loss={"output": "0", "expression": "output.float().sum()", "dtype": "bfloat16"},
...     autocast=False,
...     nodes=[NodeRecord("mm", "aten.mm.default", "op", module="fc", forward="linear",
...                       inputs=[{"node": "a", "dtype": "bfloat16"}], outputs=["bfloat16"]),
...            NodeRecord("_to_copy", "aten._to_copy.default", "op", module="fc", forward="linear",
...                       inputs=[{"node": "mm", "dtype": "bfloat16"}], outputs=["float32"])],
...     gradients=[Gradient("fc.weight", "float32", "float32", [4, 4], "_to_copy")],
...     saved=[],
... )
>>> [r.name for r in sixteen_bit_ops(bw)], dict(cast_pairs(bw))
(['mm'], {('bfloat16', 'float32'): 1})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ampgraph.report.records import Backward, Gradient, NodeRecord, Report
from ampgraph.settings import short_dtype

#: Ops that compute nothing (views, aliases, Python's getitem): left out of op counts.
NO_COMPUTE = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
    "slice", "select", "alias", "detach", "as_strided", "reshape", "split", "split_with_sizes",
    "unbind", "narrow", "diagonal", "unflatten", "flatten", "chunk", "getitem",
})  # fmt: skip
SIXTEEN_BITS = ("bfloat16", "float16")
CAST_OP = "aten._to_copy.default"


def base_name(op: str) -> str:
    """``aten.mm.default`` -> ``mm``.

    >>> base_name("aten.native_layer_norm_backward.default"), base_name("getitem")
    ('native_layer_norm_backward', 'getitem')
    """
    parts = op.split(".")
    return parts[1] if len(parts) == 3 else op


def computes(rec: NodeRecord) -> bool:
    """Whether a backward record is an op that computes (not a view, alias or getitem)."""
    return rec.kind == "op" and base_name(rec.op) not in NO_COMPUTE


def is_cast(rec: NodeRecord) -> bool:
    """A dtype-changing ``_to_copy`` in the backward (a gradient cast back, say)."""
    return (
        rec.op == CAST_OP and bool(rec.inputs) and bool(rec.outputs)
        and rec.inputs[0]["dtype"] != rec.outputs[0]
    )  # fmt: skip


def sixteen_bit_ops(bw: Backward) -> list[NodeRecord]:
    """Backward ops that compute in 16 bits (their first output is bf16 or fp16; casts aside)."""
    return [r for r in bw.nodes if computes(r) and r.op != CAST_OP and r.out_dtype in SIXTEEN_BITS]


def cast_pairs(bw: Backward) -> Counter[tuple[str, str]]:
    """(from, to) of every cast in the backward: ``_to_copy`` nodes and autocast's casts."""
    out: Counter[tuple[str, str]] = Counter()
    for r in bw.nodes:
        if r.kind != "op":
            continue  # the loss's own forward (its .float())
        if is_cast(r):
            out[(r.inputs[0]["dtype"], r.outputs[0])] += 1
        for c in r.casts:
            out[(c.from_dtype, c.to_dtype)] += 1
    return out


def gradient_origin(bw: Backward, grad: Gradient) -> str:
    """How a gradient got its dtype: ``cast from bf16`` or ``computed in fp32``."""
    by_name = {r.name: r for r in bw.nodes}
    rec = by_name.get(grad.node or "")
    seen = 0
    while rec is not None and seen < 8:
        if is_cast(rec):
            return f"cast from {short_dtype(rec.inputs[0]['dtype'])}"
        if computes(rec) and base_name(rec.op) not in ("clone", "copy", "new_empty_strided"):
            break
        rec = by_name.get(rec.inputs[0]["node"]) if rec.inputs else None
        seen += 1
    return f"computed in {short_dtype(grad.dtype)}"


def module_order(report: Report, bw: Backward) -> list[str]:
    """Leaf modules in the order their backward runs (the reverse of the forward's)."""
    seen: dict[str, None] = {}
    for rec in bw.nodes:
        if rec.module is not None and rec.kind == "op":
            seen.setdefault(rec.module, None)
    return list(seen)


def sixteen_bit_ops_of(recs: Sequence[NodeRecord]) -> list[NodeRecord]:
    return [r for r in recs if computes(r) and r.op != CAST_OP and r.out_dtype in SIXTEEN_BITS]


def layer_depth(bw: Backward) -> int | None:
    """The depth at which module paths reach numbered layers (``model.decoder.layers.3``)."""
    for t in bw.saved:
        if not t.module:
            continue
        parts = t.module.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                return sum(1 for p in parts[:i] if not p.isdigit())
    return 1


__all__ = [
    "CAST_OP",
    "NO_COMPUTE",
    "SIXTEEN_BITS",
    "base_name",
    "cast_pairs",
    "computes",
    "gradient_origin",
    "is_cast",
    "layer_depth",
    "module_order",
    "sixteen_bit_ops",
    "sixteen_bit_ops_of",
]
