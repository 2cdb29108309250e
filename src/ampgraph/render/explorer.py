"""Google's Model Explorer (``pip install ai-edge-model-explorer``) files of reports: the graph,
and the node-data overlays that colour it.

* :func:`explorer_graphs`: a graph collection in Model Explorer's graph JSON (its
  ``graph_builder.py``): one graph per setting, each node with its module path as namespace
  (``model/layers/17/mlp``, so layers fold into groups a click opens), the backward's nodes
  under ``backward/...``, the annotation as attributes (op, policy, why, dtypes in and out,
  casts with bytes, promotion, check, gradient dtype) and each output's dtype and shape as
  output metadata.
* :func:`node_data`: one overlay (its ``node_data_builder.py``: ``{graph id: {results,
  thresholds}}``) per :data:`OVERLAYS` entry; values are numbers, coloured by thresholds, so a
  legend in the file says what each colour is: ``dtype`` and ``gradient`` (the dtype codes of
  :data:`DTYPE_CODES`), ``policy`` (:data:`POLICY_CODES`), ``casts`` (MiB autocast writes
  before the op), ``headroom`` (decades below the dtype's largest value, from ``ranges``).

``model-explorer graph.json --node_data_paths=dtype.json,policy.json`` opens them as they are.
Torch-free: it reads the records :mod:`ampgraph.render.page_data` makes of a report.

>>> from ampgraph.report.records import NodeRecord, Report
>>> x = NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[2, 4]])
>>> r = Report("m", {"name": "amp-fp32"}, {}, {}, [x], [])
>>> graph = explorer_graphs([r])["graphs"][0]
>>> graph["id"], graph["nodes"][0]["outputsMetadata"][0]["attrs"]
('amp-fp32', [{'key': 'dtype', 'value': 'float32'}, {'key': 'shape', 'value': '[2, 4]'}])
>>> node_data([r], "dtype")["amp-fp32"]["results"]
{'x': {'value': 4}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ampgraph.errors import RenderError
from ampgraph.render.page_data import node_records
from ampgraph.render.style import HEADROOM_BANDS, OKABE_ITO, POLICY_STYLE_KEY

if TYPE_CHECKING:
    from ampgraph.report.records import Report

#: A dtype as a number Model Explorer can colour: (code, dtypes, colour), widest last.
DTYPE_CODES: Final = (
    (1, ("bool", "uint8", "int8", "int16", "int32", "int64"), "#9DA5AE"),
    (2, ("float16",), OKABE_ITO["reddish_purple"]),
    (3, ("bfloat16",), OKABE_ITO["orange"]),
    (4, ("float32",), OKABE_ITO["blue"]),
    (5, ("float64",), OKABE_ITO["bluish_green"]),
)
#: A policy's style (:data:`~ampgraph.render.style.POLICY_STYLE_KEY`) as a number and colour.
POLICY_CODES: Final = (
    (1, "lower_precision_fp", OKABE_ITO["orange"]),
    (2, "fp32", OKABE_ITO["blue"]),
    (3, "promote", OKABE_ITO["bluish_green"]),
    (4, "banned", "#555555"),
    (5, "none", "#D0D7DE"),
)
OVERLAYS: Final = ("dtype", "policy", "casts", "headroom", "gradient")

_CODE_OF_DTYPE = {d: code for code, dtypes, _ in DTYPE_CODES for d in dtypes}
_CODE_OF_POLICY = {name: code for code, name, _ in POLICY_CODES}


def namespace(group: str) -> str:
    """A module path as Model Explorer's namespace: ``model.layers.17`` -> ``model/layers/17``."""
    return group.replace("/", "\u2215").replace(".", "/")


def _attrs(n: Mapping[str, Any], types: Mapping[str, str]) -> list[dict[str, str]]:
    casts = "; ".join(
        f"{c['node']}: {c['from']} -> {c['to']}"
        + ("" if c["bytes"] is None else f" ({c['bytes']} bytes)")
        for c in n["casts"]
    )
    pairs = [
        ("op", n["op"]), ("node", n["name"]), ("kind", n["kind"]),
        ("module", n["module"] or n["group"]), ("module type", types.get(n["module"] or "")),
        ("policy", n["policy"] or "none"), ("why", n["reason"]),
        ("dtypes in", ", ".join(f"{src}: {d}" for src, d in n["inputs"])),
        ("dtypes out", ", ".join(map(str, n["outputs"]))), ("casts", casts),
        ("promotion", n["promotion"] and f"{' + '.join(n['promotion']['inputs'])} -> "
                                          f"{n['promotion']['to']}"),
        ("check", None if n["agree"] is None else "agrees" if n["agree"] else "DISAGREES"),
        ("gradient dtype", n.get("gradient") and ", ".join(n["gradient"])),
        ("headroom (decades)", n.get("headroom") is not None and f"{n['headroom']:+.2f}"),
        ("backward of", n.get("forward")),
    ]  # fmt: skip
    return [{"key": k, "value": str(v)} for k, v in pairs if v]


def _node(n: Mapping[str, Any], known: set[str], types: Mapping[str, str]) -> dict[str, Any]:
    shapes = n["shapes"] or []
    return {
        "id": n["name"],
        # A parameter is named by its attribute (``weight``): placeholders all look alike.
        "label": n["op"].removeprefix("aten.").removesuffix(".default")
        if n["kind"] == "op"
        else (n["target"] or n["name"]).rsplit(".", 1)[-1],
        "namespace": namespace(n["group"]),
        "attrs": _attrs(n, types),
        "incomingEdges": [
            {"sourceNodeId": src, "sourceNodeOutputId": "0", "targetNodeInputId": str(k)}
            for k, (src, _dtype) in enumerate(n["inputs"])
            if src in known
        ],
        "outputsMetadata": [
            {"id": str(k), "attrs": [{"key": "dtype", "value": str(d)}]
             + ([{"key": "shape", "value": str(shapes[k])}]
                if k < len(shapes) and shapes[k] is not None else [])}
            for k, d in enumerate(n["outputs"])
        ],  # fmt: skip
    }


def _graph_ids(reports: Sequence[Report]) -> list[str]:
    ids = [str(r.setting.get("name", f"setting {k + 1}")) for k, r in enumerate(reports)]
    if len(set(ids)) < len(ids):  # two models in one setting: say which is which
        ids = [f"{r.model} {i}" for r, i in zip(reports, ids, strict=True)]
    return ids


def explorer_graphs(reports: Sequence[Report], label: str | None = None) -> dict[str, Any]:
    """The reports as one Model Explorer graph collection, a graph per setting."""
    if not reports:
        raise RenderError("nothing to render: no reports were given")
    graphs = []
    for gid, report in zip(_graph_ids(reports), reports, strict=True):
        types = {call.path: call.type for call in report.modules}
        records = node_records(report)
        known = {n["name"] for n in records}
        graphs.append({"id": gid, "nodes": [_node(n, known, types) for n in records]})
    models = ", ".join(dict.fromkeys(r.model for r in reports))
    return {"label": label or f"{models} (ampgraph)", "graphs": graphs}


def _value(overlay: str, n: Mapping[str, Any]) -> float | None:
    if overlay == "dtype":
        return _CODE_OF_DTYPE.get(n["outputs"][0]) if n["outputs"] else None
    if overlay == "policy":
        return _CODE_OF_POLICY[POLICY_STYLE_KEY.get(n["policy"], "none")]
    if overlay == "casts":
        return round(sum(c["bytes"] or 0 for c in n["casts"]) / 2**20, 3) if n["casts"] else None
    if overlay == "headroom":
        return n.get("headroom")
    grads = n.get("gradient")
    return _CODE_OF_DTYPE.get(grads[0]) if grads else None


def _thresholds(overlay: str) -> list[dict[str, Any]]:
    if overlay in ("dtype", "gradient"):
        return [{"value": code, "bgColor": colour} for code, _, colour in DTYPE_CODES]
    if overlay == "policy":
        return [{"value": code, "bgColor": colour} for code, _, colour in POLICY_CODES]
    if overlay == "headroom":
        return [{"value": bound if bound != float("inf") else 1e9, "bgColor": fill}
                for bound, _, _, fill in HEADROOM_BANDS]  # fmt: skip
    return []


def node_data(
    reports: Sequence[Report],
    overlay: str,
    headroom: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """One overlay of every setting's graph, in Model Explorer's node-data format."""
    if overlay not in OVERLAYS:
        raise RenderError(f"unknown overlay {overlay!r}: use one of {', '.join(OVERLAYS)}")
    out: dict[str, Any] = {}
    for gid, report in zip(_graph_ids(reports), reports, strict=True):
        rooms = None if headroom is None else headroom.get(str(report.setting.get("name")))
        results = {}
        for n in node_records(report, rooms):
            value = _value(overlay, n)
            if value is not None:
                results[n["name"]] = {"value": value}
        data: dict[str, Any] = {"name": f"ampgraph {overlay}", "results": results}
        if overlay == "casts":  # MiB cast: pale to vermillion
            data["gradient"] = [{"stop": 0, "bgColor": "#FFF3E0"},
                                {"stop": 1, "bgColor": OKABE_ITO["vermillion"]}]  # fmt: skip
        else:
            data["thresholds"] = _thresholds(overlay)
        out[gid] = data
    return out
