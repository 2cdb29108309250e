"""Which leaf-module calls a real run prints: the hook view of a report, as data.

A forward that raises stops there: the hook lines (:func:`hook_lines`, the seed notebook's),
the dispatcher check's hold to a raise (:func:`ampgraph.annotate.check.hold_to_the_raise`) and
verify's comparison with a real run (:mod:`ampgraph.verify.compare`) all read the same calls,
each with its error, from here.

>>> SEED_WATCH
('Linear', 'LayerNorm', 'Embedding')
"""

from __future__ import annotations

from collections.abc import Sequence

from ampgraph.report.records import ModuleCall, NodeRecord, Report

#: The seed notebook's WATCH tuple: what its hooks printed.
SEED_WATCH = ("Linear", "LayerNorm", "Embedding")


def select_calls(report: Report, only: Sequence[str] | None = None) -> list[ModuleCall]:
    """Leaf-module calls, optionally only those that are instances of the named classes.

    ``only`` matches class names anywhere in the module's class hierarchy, like ``isinstance``:
    ``Embedding`` selects OPT's ``OPTLearnedPositionalEmbedding`` too.
    """
    if not only:
        return list(report.modules)
    wanted = set(only)
    return [c for c in report.modules if wanted & set(c.bases)]


def call_error(report: Report, call: ModuleCall) -> str | None:
    """The error of the first node of a module call that raised, or None: the hook's view.

    A node ampgraph could not run here (a kernel that needs a GPU driver) reads
    ``not analysed: ...``: the forward cannot be followed past it, and it is no prediction. A node
    that ran without being analysed (an opaque autocast kernel) has dtypes, and does not stop it.
    """
    for name in call.nodes:
        if (stop := _stop(report.node(name))) is not None:
            return stop
    return None


def _stop(rec: NodeRecord) -> str | None:
    """Where the forward stops at ``rec``: its error, or ``not analysed: ...`` for a node that
    could not run here (a size no run decides, a kernel that needs a driver)."""
    if rec.error:
        return rec.error
    if rec.not_analysed is not None and rec.skipped is None and not rec.outputs:
        return f"not analysed: {rec.not_analysed}"
    return None


def _not_run(report: Report, call: ModuleCall) -> bool:
    """The forward stopped before this call: an earlier node raised."""
    if not call.nodes:  # a call that ran no op: it ran if what it returned was computed
        return call.out_dtype is None and call.returns_tensor
    return all(report.node(name).skipped for name in call.nodes)


def _raised_outside_calls(report: Report) -> int | None:
    """The position in the graph of the first node outside every leaf call that raises (an
    ``index_add_`` of 16-bit expert outputs into an fp32 buffer, in the forward's own loop), or
    None."""
    in_calls = {name for call in report.modules for name in call.nodes}
    return next(
        (i for i, rec in enumerate(report.nodes) if rec.name not in in_calls and rec.error), None
    )


def _after(order: dict[str, int], call: ModuleCall, raised: int | None) -> bool:
    """Whether ``call`` comes after the forward raised outside every call (``order``: each
    node's position in the graph): a real run stops at the raise, also before a call that does
    not depend on the raising op's output (the next expert of a loop), which the graph's
    downstream skipping does not reach."""
    if raised is None or not call.nodes:
        return False
    return order[call.nodes[0]] > raised


def printed_calls(
    report: Report, only: Sequence[str] | None = None
) -> list[tuple[ModuleCall, str | None]]:
    """The calls whose hooks a real run prints, each with its error: none after the first error.

    A forward that raises stops there: the failing call's line is the last one, and no hook of a
    later call fires.
    """
    out: list[tuple[ModuleCall, str | None]] = []
    raised = _raised_outside_calls(report)
    order = {rec.name: i for i, rec in enumerate(report.nodes)} if raised is not None else {}
    for call in select_calls(report, only):
        error = call_error(report, call)
        if error is None and (_not_run(report, call) or _after(order, call, raised)):
            break
        out.append((call, error))
        if error is not None:
            break
    return out


def hook_lines(report: Report, only: Sequence[str] | None = None) -> list[str]:
    """One seed-notebook hook line per leaf-module call, in execution order."""
    lines = []
    for call, error in printed_calls(report, only):
        # The hook's own spelling: a first input that is no tensor reads None, not torch.None.
        head = f"[{call.path}] in={'torch.' + call.in_dtype if call.in_dtype else 'None'} -> "
        if error and error.startswith("not analysed: "):
            lines.append(head + error)
        elif error:
            lines.append(f"{head}error: {error}")
        else:
            lines.append(call.hook_line())
    if only is None and not any(error for _call, error in printed_calls(report)):
        # An op outside every leaf call that raises (F.binary_cross_entropy in the forward
        # itself), or that no run here could follow (a size only data decides, where the capture
        # cut the graph): the eager hooks print it at the top level (:mod:`ampgraph.verify.hooks`),
        # "not analysed" where it is no finding; the listing never just ends there.
        in_calls = {name for call in report.modules for name in call.nodes}
        stops = (_stop(r) for r in report.nodes if r.name not in in_calls)
        stop = next((s for s in stops if s is not None), None)
        if stop is not None:
            tail = stop if stop.startswith("not analysed: ") else f"error: {stop}"
            lines.append(f"[(top level)] in=None -> {tail}")
    return lines


__all__ = ["SEED_WATCH", "call_error", "hook_lines", "printed_calls", "select_calls"]
