"""What the interactive views show of a report, as plain JSON-ready data: one record per node
with its annotation in words a reader needs (op, policy and why, dtypes in and out, the casts
and their bytes, promotion, check, gradient dtype, headroom), and where it sits in the module
tree. The HTML page (:mod:`ampgraph.render.html`) and the Model Explorer files
(:mod:`ampgraph.render.explorer`) both read it, so the two say the same thing.

Torch-free, like the rest of the renderer: it reads :class:`~ampgraph.report.records.Report`.

>>> from ampgraph.report.records import Cast, NodeRecord, Report
>>> x = NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[2, 4]])
>>> mm = NodeRecord("mm", "aten.mm.default", "op", module="fc", inputs=[{"node": "x",
...     "dtype": "float32"}], policy="lower_precision_fp", casts=[Cast("x", "float32",
...     "bfloat16")], outputs=["bfloat16"], shapes=[[2, 4]], reason="mm: lower precision")
>>> r = Report("m", {"name": "amp-fp32"}, {}, {}, [x, mm], [])
>>> node_records(r)[1]["casts"]
[{'node': 'x', 'from': 'float32', 'to': 'bfloat16', 'bytes': 16}]
>>> node_records(r)[1]["group"], node_records(r)[0]["group"]
('fc', '')
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import TYPE_CHECKING, Any

from ampgraph.render.style import POLICY_STYLE_KEY
from ampgraph.review.findings import ITEMSIZE

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads
    from ampgraph.report.records import NodeRecord, Report


def group_of(rec: NodeRecord) -> str:
    """The module path a node is shown in: its module, a parameter's or buffer's owner (from
    its target, ``fc.weight`` -> ``fc``), or ``""`` (the model's top) for inputs and outputs.

    >>> from ampgraph.report.records import NodeRecord
    >>> group_of(NodeRecord("p", "placeholder", "parameter", target="a.b.weight"))
    'a.b'
    """
    if rec.module:
        return rec.module
    if rec.kind in ("parameter", "buffer") and rec.target and "." in rec.target:
        return rec.target.rsplit(".", 1)[0]
    return ""


def _numel(rec: NodeRecord | None) -> int | None:
    if rec is None or not rec.shapes or rec.shapes[0] is None:
        return None
    return prod(rec.shapes[0])


def _cast(by_name: Mapping[str, NodeRecord], node: str, src: str, dst: str) -> dict[str, Any]:
    """A cast with the bytes of the tensor it writes (None where the shape is not known)."""
    numel = _numel(by_name.get(node))
    size = None if numel is None or dst not in ITEMSIZE else numel * ITEMSIZE[dst]
    return {"node": node, "from": src, "to": dst, "bytes": size}


def _gradients(report: Report) -> dict[str, list[str]]:
    """Forward node -> the dtypes its backward produces (a parameter's: its gradient's)."""
    grads: dict[str, list[str]] = {}
    if report.backward is None:
        return grads
    for rec in report.backward.nodes:
        if rec.forward:
            seen = grads.setdefault(rec.forward, [])
            seen.extend(d for d in rec.outputs if d and d not in seen)
    by_target = {r.target: r.name for r in report.nodes if r.kind == "parameter"}
    for grad in report.backward.gradients:
        name = grad.node if grad.node in {r.name for r in report.nodes} else by_target.get(
            grad.parameter
        )
        if name and grad.dtype:
            grads[name] = [grad.dtype]
    return grads


def _record(
    rec: NodeRecord, by_name: Mapping[str, NodeRecord], group: str, name: str
) -> dict[str, Any]:
    check = rec.check or {}
    return {
        "name": name,
        "op": rec.op,
        "kind": rec.kind,
        "module": rec.module,
        "group": group,
        "target": rec.target,
        "policy": rec.policy,
        "style": POLICY_STYLE_KEY.get(rec.policy, "none"),
        "reason": rec.reason,
        "region": rec.region,
        "inputs": [[i.get("node"), i.get("dtype")] for i in rec.inputs],
        "outputs": list(rec.outputs),
        "shapes": rec.shapes,
        "casts": [_cast(by_name, c.node, c.from_dtype, c.to_dtype) for c in rec.casts],
        "promotion": rec.promotion,
        "error": rec.error or rec.not_analysed,
        "agree": check.get("agree"),
    }


#: Where a backward node is shown: under ``backward``, in the module of its forward node.
BACKWARD = "backward"


def _backward_records(report: Report) -> list[dict[str, Any]]:
    """The backward's nodes (the loss first), named ``backward:NAME`` (the joint graph's names
    may repeat a forward one), each in the mirror of its forward node's module, with its inputs
    pointing at the forward nodes they read (``from``) or at backward nodes."""
    assert report.backward is not None
    forward = {r.name: r for r in report.nodes}
    by_name = {r.name: r for r in report.backward.nodes}
    out = []
    for rec in report.backward.nodes:
        owner = forward.get(rec.forward or "")
        group = BACKWARD + (f".{group_of(owner)}" if owner and group_of(owner) else "")
        record = _record(rec, by_name, group, f"{BACKWARD}:{rec.name}")
        record["inputs"] = [
            [i["from"] if i.get("from") else f"{BACKWARD}:{i.get('node')}", i.get("dtype")]
            for i in rec.inputs
        ]
        for cast in record["casts"]:
            if cast["node"] in by_name:
                cast["node"] = f"{BACKWARD}:{cast['node']}"
        record["forward"] = rec.forward
        out.append(record)
    return out


def node_records(
    report: Report, headroom: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """Every node of ``report`` as a plain record: the forward's in execution order, each with
    the dtypes its backward produces (``gradient``) and, where ``headroom`` (node -> decades
    below the dtype's largest value, from ``ranges``) is given, its headroom; then the
    backward's nodes, where the report has a backward pass."""
    by_name = {r.name: r for r in report.nodes}
    grads = _gradients(report)
    out = []
    for rec in report.nodes:
        record = _record(rec, by_name, group_of(rec), rec.name)
        record["gradient"] = grads.get(rec.name)
        record["headroom"] = None if headroom is None else headroom.get(rec.name)
        out.append(record)
    if report.backward is not None and report.backward.nodes:
        out.extend(_backward_records(report))
    for record in out:
        record["sig"] = signature(record)
    return out


def signature(record: Mapping[str, Any]) -> str:
    """What must stay equal for a node to be "the same" in two settings: policy, casts, output
    dtypes and promotion (the annotation, not its wording). The page compares these strings
    between the setting shown and the one it is compared with.

    >>> signature({"policy": None, "casts": [], "outputs": ["float32"], "promotion": None})
    'None|[]|float32|None'
    """
    casts = [(c["node"], c["from"], c["to"]) for c in record["casts"]]
    return f"{record['policy']}|{casts}|{','.join(map(str, record['outputs']))}|{record['promotion']}"

