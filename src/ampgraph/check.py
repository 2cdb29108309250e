"""Check: compare every annotated node with the dispatcher's own autocast kernels.

The oracle replays the same graph on fake tensors with autocast really enabled (the thread-local
state the C++ autocast keys read, so CUDA's kernels run without a GPU), and records the dtype each
node returns. Nothing of the annotator is used: where the two disagree, ampgraph's tables or its
reading of them are wrong, and the node is reported.

Where the graph was captured in the setting itself (``Capture.method == "export"``), the dtypes
``torch.export`` recorded at trace time (``node.meta["val"]``) are a second, independent oracle
for the top-level nodes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import fx

from ampgraph.capture import EXPORT, Capture, autocast_state, dtype_name, torch_dtype
from ampgraph.records import NodeRecord
from ampgraph.replay import (
    Failed,
    FakeReplay,
    dtype_names,
    fake_session,
    region_args,
    tensor_leaves,
)

ORACLE = "dispatcher (real autocast kernels on fake tensors)"


class DispatcherOracle(FakeReplay):
    """Replay the graph under real autocast and remember what each node returned."""

    def __init__(
        self,
        capture: Capture,
        gm: fx.GraphModule | None = None,
        results: dict[str, dict[str, Any]] | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(gm if gm is not None else capture.graph_module, capture.setting, prefix)
        self.capture = capture
        self.results: dict[str, dict[str, Any]] = results if results is not None else {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op in ("call_function", "placeholder") and not isinstance(value, Failed):
            if not (n.op == "placeholder" and n.name in self.outer_names):
                self.results[self.qualified(n)] = {"outputs": dtype_names(value)}
        elif n.op == "output" and not self.prefix and not isinstance(value, Failed):
            self.results[self.qualified(n)] = {"outputs": dtype_names(value)}
        return value

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        self.results[self.qualified(n)] = {"error": failure.message}

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        self.results[self.qualified(n)] = {"skipped": failure.node}

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        region = region_args(n, args)
        child = DispatcherOracle(self.capture, region.body, self.results, f"{self.prefix}{n.name}.")
        scope = (
            autocast_state(region.device_type, region.enabled, region.dtype)
            if region.device_type is not None and region.dtype is not None
            else contextlib.nullcontext()
        )
        with scope:
            value = self.run_body(child, region.body, region.operands, n)
        self.results[self.qualified(n)] = (
            {"skipped": value.node}
            if isinstance(value, Failed)
            else {"outputs": dtype_names(value)}
        )
        return value


def dispatcher_unavailable(device_type: str) -> str | None:
    """Why this torch cannot check ``device_type``'s annotations, or None when it can.

    A CPU-only build of torch has no CUDA autocast kernels and cannot make fake CUDA tensors:
    ampgraph still annotates from its tables (on meta tensors), but there is nothing to check the
    annotations against. Saying so beats comparing with kernels that never ran.

    >>> dispatcher_unavailable("cpu") is None
    True
    """
    if device_type == "cpu" or torch.backends.cuda.is_built():
        return None
    return (
        f"torch {torch.__version__} is a CPU-only build without CUDA's autocast kernels, so "
        "--device cuda annotations cannot be checked here: install the CUDA build "
        "(pip install torch==2.14.1; no GPU needed) or check with --device cpu"
    )


def dispatcher_results(capture: Capture) -> dict[str, dict[str, Any]]:
    """What the real autocast kernels return at every node, by qualified node name."""
    oracle = DispatcherOracle(capture)
    setting = capture.setting
    with (
        fake_session(setting),
        autocast_state(setting.device_type, setting.autocast, torch_dtype(setting.amp_dtype)),
    ):
        oracle.run_graph()
    return oracle.results


def trace_results(capture: Capture) -> dict[str, list[str | None]]:
    """The dtypes torch.export recorded while tracing in the setting (top-level nodes only)."""
    if capture.method != EXPORT or capture.graph_of is not None:
        return {}  # traced in another setting: what it recorded is that setting's
    out: dict[str, list[str | None]] = {}
    for node in capture.graph_module.graph.nodes:
        if node.op != "call_function" or "val" not in node.meta:
            continue
        leaves = tensor_leaves(node.meta["val"]) if node.meta["val"] is not None else []
        if isinstance(node.meta["val"], torch.Tensor) or leaves:
            out[node.name] = [dtype_name(t.dtype) for t in leaves]
    return out


def check(
    capture: Capture,
    records: list[NodeRecord],
    oracle: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Fill ``record.check`` for every node and return the summary for the report.

    ``oracle`` is :func:`dispatcher_results` of the capture, when it was computed elsewhere (in
    parallel with the annotation, say).
    """
    if oracle is None:
        oracle = dispatcher_results(capture)
    traced = trace_results(capture)
    compared = 0
    disagreements = 0
    not_analysed = 0
    for rec in records:
        if rec.kind in ("parameter", "buffer", "constant", "input"):
            continue
        if rec.not_analysed is not None:
            # Said in the record and counted in the summary: never a silent agreement.
            not_analysed += 1
            rec.check = {"not_analysed": rec.not_analysed, "agree": None}
            continue
        truth = oracle.get(rec.name)
        if truth is None:
            if rec.kind != "op" or rec.error or rec.skipped:
                continue
            # The dispatcher never reached a node the annotation says ran: never silent.
            truth = {"not_analysed": "the dispatcher replay did not reach this node"}
        compared += 1
        predicted = _outcome(rec)
        observed = _outcome_from(truth)
        agree = predicted == observed
        result: dict[str, Any] = {"dispatcher": observed, "agree": agree}
        if rec.name in traced and "outputs" in truth:
            result["export"] = traced[rec.name]
            tensor_outputs = [d for d in truth["outputs"] if d is not None]
            if traced[rec.name] != tensor_outputs:
                # torch.export traces with the Python dispatcher, which decomposes some ops with
                # Python decompositions registered for tracing (upsample_bilinear2d.vec) instead
                # of the C++ kernel a real run takes, whose inner ops autocast covers. The replay
                # runs the real kernels, and the eager hooks (ampgraph.hooks) agree with it: so
                # this is said, never counted.
                result["note"] = (
                    f"torch.export's pre-dispatch trace recorded {traced[rec.name]} here; the "
                    f"dispatcher's kernels return {tensor_outputs}"
                )
        if not agree:
            disagreements += 1
        rec.check = result
    summary = {"oracle": ORACLE, "nodes": len(records), "compared": compared,
               "disagreements": disagreements}  # fmt: skip
    if not_analysed:
        summary["not_analysed"] = not_analysed
    return summary


def _outcome(rec: NodeRecord) -> dict[str, Any]:
    if rec.error:
        return {"error": rec.error}
    if rec.skipped:
        return {"skipped": rec.skipped}
    return {"outputs": rec.outputs}


def _outcome_from(truth: dict[str, Any]) -> dict[str, Any]:
    return dict(truth)
