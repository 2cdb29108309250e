"""The dispatcher check of a whole report: every node (:mod:`ampgraph.annotate.check`), then the
module view's calls (:mod:`ampgraph.pipeline.calls`) against what each leaf module's hook saw
while the graph was traced in the setting.

The node check belongs to the annotate stage; the module view is built here, in the pipeline,
from the annotated nodes, so its check lives beside it rather than pulling the annotate stage
up into the pipeline.
"""

from __future__ import annotations

from typing import Any

from ampgraph.annotate.check import check_nodes
from ampgraph.capture.module_io import HOOK_DTYPES
from ampgraph.capture.trace import EXPORT_RETYPED, IN_SETTING, Capture
from ampgraph.pipeline.calls import indexed_module_calls
from ampgraph.report.records import NodeRecord


def check(
    capture: Capture,
    records: list[NodeRecord],
    oracle: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Fill ``record.check`` for every node, compare the module view's calls with their hooks,
    and return the summary for the report (:func:`ampgraph.annotate.check.check`'s, with the
    calls' disagreements counted in).
    """
    summary, differs = check_nodes(capture, records, oracle)
    if not differs:  # where the trace's dtypes differ from the kernels', so may its hooks'
        check_module_calls(capture, records, summary)
    return summary


def check_module_calls(
    capture: Capture, records: list[NodeRecord], summary: dict[str, Any]
) -> None:
    """Compare each leaf call's predicted hook line with what its hook saw while tracing.

    The module view says which graph node a call received and returned (``in``/``out``); the
    nodes' dtypes can all be right while a call is given the wrong node (an MoE expert's
    activation attributed the routing indices). In a trace made in the setting, the hooks saw
    the dispatcher's own dtypes: a call whose predicted ``in`` or ``out`` differs is a
    disagreement, counted once at the call's first node (where the report shows it). Only a
    prediction that runs to its end is compared: past a predicted error or an op not analysed,
    the hooks that ran are not the ones the prediction prints.

    >>> summary = {"disagreements": 0}
    >>> from ampgraph.settings import Setting
    >>> from torch import fx
    >>> cap = Capture("m", Setting.parse("fp32"), fx.GraphModule({}, fx.Graph()), "meta", {}, {})
    >>> check_module_calls(cap, [], summary); summary
    {'disagreements': 0}
    """
    if capture.graph_of is not None:
        return  # traced in another setting: its hooks saw that setting's dtypes
    raised = capture.raised_in_setting or {}
    if capture.method == EXPORT_RETYPED and raised.get("seen") is not None:
        # Traced again with fp32 parameters where the setting's own trace raised: the calls
        # before the raise are compared with what their hooks saw in that trace.
        _compare_calls(capture, records, summary, raised["seen"])
        return
    if capture.method not in IN_SETTING:
        return
    seen = capture.graph_module.meta.get(HOOK_DTYPES)
    if seen is None or any(r.error or r.skipped or r.not_analysed for r in records):
        return
    _compare_calls(capture, records, summary, seen)


def _compare_calls(
    capture: Capture, records: list[NodeRecord], summary: dict[str, Any],
    seen: dict[str, list[Any]],
) -> None:  # fmt: skip
    """Each call's predicted hook line against ``seen`` (path -> per call, the hook's in and out
    dtypes; an ``out`` of None where the call raised, then only ``in`` is compared)."""
    by_name = {r.name: r for r in records}
    calls = indexed_module_calls(records, capture.modules, capture.module_io, capture.call_order)
    for (path, index), call in calls:
        of_path = seen.get(path, [])
        if index >= len(of_path):
            continue
        hook_in, hook_out = of_path[index]
        if hook_out is None and capture.method == EXPORT_RETYPED:
            hook_out = call.out_dtype  # the call the trace raised in: its input alone was seen
        wrong = [
            f"{side}={_torch_name(predicted)} where its hook saw {_torch_name(saw)}"
            for side, predicted, saw in (
                ("in", call.in_dtype, hook_in),
                ("out", call.out_dtype, hook_out),
            )
            if predicted != saw
        ]
        rec = by_name.get(call.nodes[0]) if call.nodes else None
        if not wrong:
            continue
        # Counted once: at the call's first node unless counted there already; a call without
        # nodes is counted and said in the summary only.
        if rec is None or (rec.check or {}).get("agree") is not False:
            summary["disagreements"] += 1
        note = (
            f"the module view prints [{path}] (call {index}) with {'; '.join(wrong)} "
            "when traced in this setting"
        )
        summary.setdefault("module_disagreements", []).append(note)
        if rec is not None:
            rec.check = {**(rec.check or {}), "agree": False, "note": note}


def _torch_name(dtype: str | None) -> str:
    return f"torch.{dtype}" if dtype else "None"


__all__ = ["check", "check_module_calls"]
