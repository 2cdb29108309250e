"""Check: compare every annotated node with the dispatcher's own autocast kernels.

The oracle replays the same graph on fake tensors with autocast really enabled (the thread-local
state the C++ autocast keys read, so CUDA's kernels run without a GPU), and records the dtype each
node returns. Nothing of the annotator is used: where the two disagree, ampgraph's tables or its
reading of them are wrong, and the node is reported.

Where the graph was captured in the setting itself (``Capture.method`` ``make-fx`` or
``export``), the dtypes the trace recorded (``node.meta["val"]``) are a second, independent oracle
for the top-level nodes, and the dtypes the leaf modules' hooks saw while it traced one for the
module view (the hook lines): which node a call received is ampgraph's attribution, which every
node's dtype being right does not prove (:func:`ampgraph.pipeline.call_check.check_module_calls`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import fx

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.annotate.replay import (
    Failed,
    FakeReplay,
    dtype_names,
    fake_session,
    not_analysable,
)
from ampgraph.capture.regions import region_args
from ampgraph.capture.trace import IN_SETTING, Capture
from ampgraph.report.records import NodeRecord, Report
from ampgraph.torchutil import (
    autocast_state,
    can_trace_fake,
    dtype_name,
    tensor_leaves,
    torch_dtype,
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
        self.results[self.qualified(n)] = {"error": failure.message, **_unchecked(failure)}

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        self.results[self.qualified(n)] = {"skipped": failure.node, **_unchecked(failure)}

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


def _unchecked(failure: Failed) -> dict[str, str]:
    """Why the replay's ``failure`` says nothing about the node (no GPU driver, a size only data
    decides), as an entry the check reads; empty for a failure that is a finding."""
    why = not_analysable(failure.message)
    return {} if why is None else {"unchecked": why}


def dispatcher_unavailable(device_type: str) -> str | None:
    """Why this torch cannot check ``device_type``'s annotations, or None when it can.

    A CPU-only build of torch has no CUDA autocast kernels and cannot make fake CUDA tensors:
    ampgraph still annotates from its tables (on meta tensors), but there is nothing to check the
    annotations against. Saying so beats comparing with kernels that never ran.

    >>> dispatcher_unavailable("cpu") is None
    True
    """
    if can_trace_fake(device_type):
        return None
    return (
        f"torch {torch.__version__} is a CPU-only build without CUDA's autocast kernels, so "
        "--device cuda annotations cannot be checked here: install the CUDA build "
        "(pip install torch==2.14.1; no GPU needed) or check with --device cpu"
    )


@in_analysis_environment
def dispatcher_results(capture: Capture) -> dict[str, dict[str, Any]]:
    """What the real autocast kernels return at every node, by qualified node name."""
    oracle = DispatcherOracle(capture)
    setting = capture.setting
    with (
        fake_session(setting, capture.unbacked_values),
        autocast_state(setting.device_type, setting.autocast, torch_dtype(setting.amp_dtype)),
    ):
        oracle.run_graph()
    return oracle.results


def trace_results(capture: Capture) -> dict[str, list[str | None]]:
    """The dtypes the trace recorded in the setting (top-level nodes only): make_fx and export
    trace on fake tensors under the setting's autocast, so they are the dispatcher's too."""
    if capture.method not in IN_SETTING or capture.graph_of is not None:
        return {}  # traced in another setting: what it recorded is that setting's
    out: dict[str, list[str | None]] = {}
    for node in capture.graph_module.graph.nodes:
        if node.op != "call_function" or "val" not in node.meta:
            continue
        leaves = tensor_leaves(node.meta["val"]) if node.meta["val"] is not None else []
        if isinstance(node.meta["val"], torch.Tensor) or leaves:
            out[node.name] = [dtype_name(t.dtype) for t in leaves]
    return out


@in_analysis_environment
def check(
    capture: Capture,
    records: list[NodeRecord],
    oracle: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Fill ``record.check`` for every node and return the summary for the report (the nodes
    only: :func:`ampgraph.pipeline.call_check.check` adds the module view's calls).

    ``oracle`` is :func:`dispatcher_results` of the capture, when it was computed elsewhere (in
    parallel with the annotation, say).
    """
    return check_nodes(capture, records, oracle)[0]


@in_analysis_environment
def check_nodes(
    capture: Capture,
    records: list[NodeRecord],
    oracle: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], set[str]]:
    """:func:`check`'s summary, and the nodes whose export-traced dtypes differ from the
    kernels' (where they do, the hooks that saw the trace may differ too)."""
    if oracle is None:
        oracle = dispatcher_results(capture)
    traced = trace_results(capture)
    targets = {n.name: n.target for n in capture.graph_module.graph.nodes}
    # Nodes whose export-traced dtypes differ from the kernels', for telling a difference that
    # starts at a node from one it inherits from its inputs.
    differs: set[str] = set()
    compared = 0
    disagreements = 0
    not_analysed = 0
    for rec in records:
        if rec.kind in ("parameter", "buffer", "constant", "input"):
            continue
        if rec.not_analysed is not None and not _tables_lack(rec):
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
        predicted = _outcome(rec)
        observed = _outcome_from(truth)
        if "unchecked" in truth and predicted != observed:
            # The replay could not run this node here, for a reason that is not the model's
            # (fake tensors lack a value a size needs): nothing to compare, said, never a pass
            # and never a disagreement.
            not_analysed += 1
            rec.check = {"not_analysed": f"the dispatcher replay could not run it: "
                                         f"{truth['unchecked']}", "agree": None}  # fmt: skip
            continue
        compared += 1
        agree = predicted == observed
        result: dict[str, Any] = {"dispatcher": observed, "agree": agree}
        if rec.name in traced and "outputs" in truth:
            result["export"] = traced[rec.name]
            tensor_outputs = [d for d in truth["outputs"] if d is not None]
            if traced[rec.name] != tensor_outputs:
                differs.add(rec.name)
                note = _export_difference(
                    rec, targets.get(rec.name), capture.setting.device_type, differs
                )
                if note is None:
                    # Two runs of the same autocast kernels that disagree, for no reason known:
                    # a finding, counted.
                    agree = result["agree"] = False
                    note = "unexplained: torch.export and the kernels ran the same autocast"
                result["note"] = (
                    f"torch.export traced {traced[rec.name]} here, the kernels return "
                    f"{tensor_outputs}: {note}"
                )
        if _tables_lack(rec):
            # ATen's kernel ran because ampgraph's tables had no rule for it: whatever dtype it
            # gave, that is a finding about the tables, as the check exists to make.
            agree = result["agree"] = False
            result["not_analysed"] = rec.not_analysed
            result["note"] = "ampgraph's policy tables lack this op's autocast kernel"
        if not agree:
            disagreements += 1
        rec.check = result
    summary = {"oracle": ORACLE, "nodes": len(records), "compared": compared,
               "disagreements": disagreements}  # fmt: skip
    if not_analysed:
        summary["not_analysed"] = not_analysed
    return summary, differs


def hold_to_the_raise(report: Report) -> None:
    """Count a prediction that runs past where the forward raised in its setting.

    A forward that raised when traced in its setting was traced again with fp32 parameters and
    replayed in the setting (``export-retyped``). Where the model reads a dtype while tracing
    (``x.to(self.weight.dtype)``), the replayed graph holds fp32's, and may run on without the
    error the real forward raises. The trace that raised is the dispatcher's own word: the real
    forward raises within the leaf calls that had begun by then. A prediction with no error, or
    whose hook lines run past those calls, contradicts it, and is a disagreement at the call that
    was open when it raised (else at the first node the prediction runs past it), never a pass;
    so is an error predicted before that point on a dtype read while tracing
    (:func:`_hold_to_the_raise_site`).
    """
    raised = report.capture.get("raised_in_setting")
    if raised is None or report.check is None:
        return
    from ampgraph.report.printed import printed_calls

    printed = printed_calls(report)
    first_error = next((r for r in report.nodes if r.error), None)
    if first_error is not None and len(printed) <= raised["calls_begun"]:
        _hold_to_the_raise_site(raised, report, first_error)
        return
    nodes = _raising_call(raised, report)
    if not nodes and len(printed) > raised["calls_begun"]:
        nodes = printed[raised["calls_begun"]][0].nodes
    if not nodes:
        nodes = [r.name for r in report.nodes if r.kind == "op"][:1]
    if not nodes:
        return
    rec = report.node(nodes[0])
    _count_once(report, rec)
    rec.check = {
        **(rec.check or {}),
        "dispatcher": {"error": raised["error"]},
        "agree": False,
        "note": (
            "the forward raised here when traced in this setting; the prediction, replayed on a "
            "graph traced with fp32 parameters, runs on: a dtype the model reads while tracing "
            f"({', '.join(report.capture.get('trace_time_dtype_nodes') or []) or 'unknown'}) "
            "is fp32's there"
        ),
    }


def _raising_call(raised: dict[str, Any], report: Report) -> list[str]:
    """The nodes of the leaf call that was open when the traced forward raised (none if none)."""
    if raised.get("call") is None:
        return []
    path, index = raised["call"]
    of_path = [m for m in report.modules if m.path == path]
    return of_path[index].nodes if index < len(of_path) else []


def _count_once(report: Report, rec: NodeRecord) -> None:
    """Count ``rec`` as disagreeing, unless the check counted it already."""
    assert report.check is not None
    if (rec.check or {}).get("agree") is not False:
        report.check["disagreements"] = report.check.get("disagreements", 0) + 1


def _hold_to_the_raise_site(raised: dict[str, Any], report: Report, first: NodeRecord) -> None:
    """A predicted error elsewhere than where the traced forward raised, on values that come
    from a dtype read while tracing with fp32 parameters, is that read's, not the model's.

    A prediction may rightly raise before the traced forward did: real kernels check dtypes the
    fake ones skip (:mod:`ampgraph.annotate.strict`). But where the raising node's inputs descend from a
    dtype read at trace time (``x.to(self.weight.dtype)`` holding fp32), the forward traced in
    the setting ran that node on the setting's dtypes, and the error is the retyped graph's.
    """
    read_at_trace_time = set(report.capture.get("trace_time_dtype_nodes") or [])
    if not read_at_trace_time:
        return
    if first.name in _raising_call(raised, report):
        return  # raised where the traced forward raised
    by_name = {r.name: r for r in report.nodes}
    seen: set[str] = set()
    todo = [i["node"] for i in first.inputs]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        todo += [i["node"] for i in by_name[name].inputs]
    reads = sorted(seen & read_at_trace_time)
    if not reads:
        return
    _count_once(report, first)
    first.check = {
        **(first.check or {}),
        # What the dispatcher did with this node: ran it, in the trace made in the setting.
        "dispatcher": {"ran_in_setting": True},
        "agree": False,
        "note": (
            "this error comes from the graph traced with fp32 parameters, whose dtypes read "
            f"while tracing ({', '.join(reads)}) are fp32's; the forward traced in this setting "
            f"raised later ({raised['error']})"
        ),
    }


def _tables_lack(rec: NodeRecord) -> bool:
    """An ATen op that ran its autocast kernel unanalysed: the tables are out of date."""
    from ampgraph.policy import OPAQUE

    return rec.not_analysed is not None and rec.policy == OPAQUE and rec.op.startswith("aten.")


def _export_difference(
    rec: NodeRecord, target: Any, device_type: str, differs: set[str]
) -> str | None:
    """Why torch.export's traced dtypes at ``rec`` differ from the kernels', or None if unknown.

    ``torch.export`` traces with the Python dispatcher, which runs the Python decomposition some
    CompositeImplicitAutograd ops register for tracing (``py_impl``) instead of their C++ kernel.
    For an op without an autocast kernel of its own that matters: the C++ decomposition of
    ``upsample_bilinear2d.vec`` calls ``upsample_bilinear2d``, which autocast runs in fp32, while
    the Python one (``torch._decomp``) computes the interpolation from elementwise ops that
    autocast leaves in bf16. A real run takes the C++ path, as the replay and the eager hooks do;
    the trace's dtype is an artefact of tracing, and its consumers inherit it.
    """
    inherited = [i["node"] for i in rec.inputs if i["node"] in differs]
    if inherited:
        return f"inherited from {', '.join(inherited)}, whose traced dtype differs"
    if not isinstance(target, torch._ops.OpOverload):
        return None
    python_decomposition = torch._C.DispatchKey.CompositeImplicitAutograd in target.py_kernels
    from ampgraph.policy import has_autocast_kernel

    if python_decomposition and not has_autocast_kernel(device_type, target.name()):
        return (
            f"torch.export traced {target.name()} through its Python decomposition (a py_impl "
            "for tracing), which skips the ops autocast covers in its C++ decomposition; a real "
            "run takes the C++ one, as the replay does"
        )
    return None


def _outcome(rec: NodeRecord) -> dict[str, Any]:
    if rec.error:
        return {"error": rec.error}
    if rec.skipped:
        return {"skipped": rec.skipped}
    return {"outputs": rec.outputs}


def _outcome_from(truth: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in truth.items() if k != "unchecked"}
