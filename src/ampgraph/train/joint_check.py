"""Check the backward: replay the joint graph against the dispatcher, as the forward check does.

The joint graph (:mod:`ampgraph.train.backward`) was traced on meta tensors (CUDA settings) or fake CPU
tensors, and where backward runs inside the autocast context, with ampgraph's own tables applied
to the backward's ops. The oracle replays it on fake tensors of the setting's device with the
real dispatcher: the forward and the loss as traced (their casts are the forward annotation's,
which the forward check proves), the backward with autocast as the step runs it, really enabled
when backward runs inside the context. There the casts ampgraph's tables inserted are skipped
(each passes its input through) and the real autocast kernels decide what to cast. Every loss
and backward node's dtypes are compared with the traced ones.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from ampgraph.annotate.check import dispatcher_unavailable
from ampgraph.annotate.replay import Failed, FakeReplay, dtype_names, fake_session
from ampgraph.report.records import Backward
from ampgraph.torchutil import autocast_state, torch_dtype
from ampgraph.train.backward import AUTOCAST_CAST, BACKWARD, LOSS, OWNER, JointTrace

ORACLE = "dispatcher (the joint graph on fake tensors, real autocast kernels in the backward)"


class JointOracle(FakeReplay):
    """Replay a joint graph; the backward under the real autocast where it runs inside it."""

    def __init__(self, trace: JointTrace) -> None:
        super().__init__(trace.graph_module, trace.capture.setting)
        self.autocast = trace.backward_autocast
        self.results: dict[str, dict[str, Any]] = {}

    def execute(self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        phase = n.meta.get(OWNER, ("forward", None))[0]
        if self.autocast and phase == BACKWARD and n.meta.get(AUTOCAST_CAST):
            return args[0]  # ampgraph's cast: the real autocast kernel of the consumer decides
        if not (self.autocast and phase == BACKWARD):
            return super().execute(n, args, kwargs)
        setting = self.setting
        with autocast_state(setting.device_type, True, torch_dtype(setting.amp_dtype)):
            return super().execute(n, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function" and not isinstance(value, Failed):
            self.results[n.name] = {"outputs": dtype_names(value)}
        return value

    def on_error(self, n: fx.Node, failure: Failed) -> None:
        self.results[n.name] = {"error": failure.message}

    def on_skipped(self, n: fx.Node, failure: Failed) -> None:
        self.results[n.name] = {"skipped": failure.node}


def check_backward(trace: JointTrace, backward: Backward) -> dict[str, Any]:
    """Fill ``check`` on every loss and backward record; return the summary (also stored)."""
    unavailable = dispatcher_unavailable(trace.capture.setting.device_type)
    if unavailable is not None:
        backward.check = {"oracle": ORACLE, "unavailable": unavailable}
        return backward.check
    oracle = JointOracle(trace)
    with fake_session(trace.capture.setting):
        oracle.run_graph()
    compared = disagreements = 0
    phases = {
        n.name: n.meta.get(OWNER, ("forward", None))[0] for n in trace.graph_module.graph.nodes
    }
    for rec in backward.nodes:
        if phases.get(rec.name) not in (LOSS, BACKWARD):
            continue
        truth = oracle.results.get(rec.name, {"not_analysed": "the replay did not reach it"})
        compared += 1
        agree = truth == {"outputs": rec.outputs}
        disagreements += not agree
        rec.check = {"dispatcher": truth, "agree": agree}
    backward.check = {"oracle": ORACLE, "nodes": len(backward.nodes), "compared": compared,
                      "disagreements": disagreements}  # fmt: skip
    return backward.check


__all__ = ["JointOracle", "check_backward"]
