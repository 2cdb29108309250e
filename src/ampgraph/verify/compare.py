"""Compare the prediction with what real execution did: node outcomes, casts, hook lines.

Casts are matched by what the kernel does. A cast autocast makes *inside* a composite op (CUDA's
``cross_entropy_loss`` hands ``nll_loss``, an fp32 op, the bf16 result of its own
``log_softmax``) has as its source a tensor made during the call: a real run logs it as
``(internal)``, and the annotation names the node inside the decomposition
(``cross_entropy_loss.log_softmax``) or the inner op's input (``(bmm input)``). Both are the same
cast at the same node, so a source that is none of the node's inputs is compared as internal
(:func:`cast_key`).

Some nodes are no comparison, and are counted apart from the agreement, never as disagreements:
*not analysed* where ampgraph honestly could not follow the forward (a size no run decides, a
kernel that needs a GPU driver; each node's record says why), *not comparable* where the real
run left the path the graph was captured along (:class:`~ampgraph.verify.execution.OffPath`).
A node ampgraph left unanalysed at an autocast kernel it cannot see into (an opaque one, or an
ATen op its tables lack) is a finding: a real run runs that kernel under autocast, and it stays
a disagreement.

Modules are compared as a real run prints them (:func:`~ampgraph.report.printed.printed_calls`,
what ``ampgraph table`` shows): a forward stops at its first error, so a call the prediction lists
after the call that raises is *not run* in the prediction as in the eager run.

>>> cast_key(("cross_entropy_loss.log_softmax", "bfloat16", "float32"), {"linear", "y"})
('(internal)', 'bfloat16', 'float32')
>>> cast_key(("linear", "bfloat16", "float32"), {"linear", "y"})
('linear', 'bfloat16', 'float32')
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ampgraph.annotate.check import _tables_lack
from ampgraph.policy import OPAQUE
from ampgraph.report.records import NodeRecord, Report
from ampgraph.report.printed import hook_lines, printed_calls
from ampgraph.settings import short_dtype
from ampgraph.verify.cast_log import INTERNAL, CastKey, cast_text, weights_as_one
from ampgraph.verify.eager import HookCall
from ampgraph.verify.execution import Observed
from ampgraph.verify.results import Agreement, Disagreement

#: The eager hooks' name for an error raised outside every leaf-module call.
TOP_LEVEL = "(top level)"


def _predicted_text(rec: NodeRecord) -> str:
    if rec.not_analysed is not None:
        return f"not analysed ({rec.not_analysed.partition(':')[0]})"
    if rec.error:
        return f"error: {rec.error}"
    if rec.skipped:
        return f"not run (input from failed {rec.skipped})"
    return ", ".join(short_dtype(d) for d in rec.outputs) or "-"


def _observed_text(obs: Observed | None) -> str:
    if obs is None:
        return "not run"
    if obs.error:
        return f"error: {obs.error}"
    if obs.skipped:
        return f"not run (input from failed {obs.skipped})"
    return ", ".join(short_dtype(d) for d in (obs.outputs or [])) or "-"


def cast_key(cast: CastKey, inputs: Collection[str]) -> CastKey:
    """A cast as the kernel makes it: its source one of the node's ``inputs``, or internal.

    A real run can name a cast's source only where it is an input of the node; a cast of a
    tensor made inside the op (a composite's intermediate) is ``(internal)`` there, however the
    annotation names it.
    """
    source, from_dtype, to_dtype = cast
    return (source if source in inputs else INTERNAL, from_dtype, to_dtype)


def no_prediction(rec: NodeRecord) -> bool:
    """ampgraph honestly did not analyse ``rec`` (the forward cannot be followed there): no
    prediction to prove or disprove. Not so at an autocast kernel ampgraph cannot see into (an
    opaque one, a library's or an ATen op its tables lack): a real run runs it under autocast,
    its casts unpredicted, and that gap is what verify is for: a finding, never set apart."""
    return rec.not_analysed is not None and rec.policy != OPAQUE and not _tables_lack(rec)


def _node_agrees(rec: NodeRecord, obs: Observed | None) -> bool:
    return (
        obs is not None
        # A node ampgraph did not analyse is no prediction: it never counts as agreeing.
        and rec.not_analysed is None
        and (rec.error or None) == obs.error
        and (rec.skipped or None) == (obs.skipped or None)
        and bool(rec.error or rec.skipped or rec.outputs == obs.outputs)
    )


def compare_nodes(
    records: Sequence[NodeRecord], observed: dict[str, Observed]
) -> tuple[Agreement, Agreement, list[Disagreement]]:
    """Node outcomes and casts, prediction against real execution.

    The nodes' :class:`Agreement` also counts those not analysed and those not comparable
    (with why), apart from its total.
    """
    nodes_agree = nodes_total = casts_agree = casts_total = 0
    found: list[Disagreement] = []
    apart: Counter[str] = Counter()
    why: dict[str, None] = {}
    for rec in records:
        if rec.is_placeholder:
            continue  # placeholders are made from their own annotation: nothing to prove
        obs = observed.get(rec.name)
        if obs is not None and obs.not_comparable is not None:
            apart["not_comparable"] += 1
            why.setdefault(obs.not_comparable)
            continue
        if no_prediction(rec):
            apart["not_analysed"] += 1
            continue
        nodes_total += 1
        if _node_agrees(rec, obs):
            nodes_agree += 1
        else:
            found.append(Disagreement(
                "node", rec.name, rec.op, _predicted_text(rec), _observed_text(obs), rec.module,
            ))  # fmt: skip
        if obs is None or not obs.checked_casts or rec.kind != "op":
            continue
        names = [str(i.get("node")) for i in rec.inputs]
        inputs = set(names)
        predicted = [(c.node, c.from_dtype, c.to_dtype) for c in rec.casts]
        said, seen = weights_as_one(rec.op, names, predicted, obs.casts)
        want = Counter(cast_key(c, inputs) for c in said)
        got = Counter(cast_key(c, inputs) for c in seen)
        casts_agree += sum((want & got).values())
        casts_total += sum((want | got).values())
        if want != got:
            found.append(Disagreement(
                "cast", rec.name, rec.op, cast_text(predicted), cast_text(obs.casts), rec.module,
            ))  # fmt: skip
    nodes = Agreement(nodes_agree, nodes_total, **apart, why=tuple(why))
    return nodes, Agreement(casts_agree, casts_total), found


@dataclass(frozen=True)
class _Line:
    """One hook line the prediction says a real run prints."""

    path: str
    type: str
    want: tuple[str | None, str | None, str | None]  # (in, out, error)
    text: str
    nodes: tuple[str, ...] = ()


#: How a hook line reads where ampgraph could not follow the forward (:func:`hook_lines`).
NOT_ANALYSED = "not analysed: "


def _predicted_lines(report: Report) -> tuple[list[_Line], bool]:
    """The hook lines of :func:`~ampgraph.report.printed.hook_lines`, with what each compares; and
    whether they end where ampgraph could not follow the forward outside every leaf call."""
    texts = hook_lines(report)
    lines = []
    for (call, error), text in zip(printed_calls(report), texts):
        want = (call.in_dtype, None if error else call.out_dtype, error)
        lines.append(_Line(call.path, call.type.rsplit(".", 1)[-1], want, text, tuple(call.nodes)))
    # An op outside every leaf call raised: the hooks' top level. One ampgraph could not follow
    # ("not analysed") is no prediction of what a real run prints.
    if len(texts) > len(lines) and " -> error: " in texts[-1]:
        error = texts[-1].partition(" -> error: ")[2]
        lines.append(_Line(TOP_LEVEL, "", (None, None, error), texts[-1]))
    return lines, len(texts) > len(lines) and f" -> {NOT_ANALYSED}" in texts[-1]


@dataclass(frozen=True)
class _Cut:
    """Where the module lines stop being comparable: the first line not compared, and why."""

    at: int
    kind: str  # "not_analysed" | "not_comparable"
    why: str | None = None


def _cut(
    report: Report,
    predicted: list[_Line],
    top_not_analysed: bool,
    observed: dict[str, Observed] | None,
) -> _Cut | None:
    """The first predicted line ampgraph did not analyse (it says so, or a node of its call ran
    no analysis: past a size no run decides), or that runs on a path the real run left (a node
    of its call is not comparable): from there on nothing is compared."""
    records = {r.name: r for r in report.nodes}
    for i, line in enumerate(predicted):
        off = [observed[n] for n in line.nodes if observed and n in observed]
        why = next((o.not_comparable for o in off if o.not_comparable is not None), None)
        if why is not None:
            return _Cut(i, "not_comparable", why)
        recs = [records[n] for n in line.nodes if n in records]
        unfollowed = any(no_prediction(rec) and not rec.outputs for rec in recs)
        if unfollowed or (line.want[2] or "").startswith(NOT_ANALYSED):
            return _Cut(i, "not_analysed")
    return _Cut(len(predicted), "not_analysed") if top_not_analysed else None


def compare_modules(
    report: Report, hooks: Sequence[HookCall], observed: dict[str, Observed] | None = None
) -> tuple[Agreement, list[Disagreement]]:
    """The annotation's hook lines against the eager hooks, call by call in order.

    A call the prediction lists after the forward's first error is not run, as in the eager run:
    it agrees if the eager run did not make it either. From a line ampgraph did not analyse, or
    one on a path the real run left (a node of its call not comparable in ``observed``), the
    lines of both runs are counted apart (:class:`Agreement`), never as disagreements.
    """
    predicted, top_not_analysed = _predicted_lines(report)
    cut = _cut(report, predicted, top_not_analysed, observed)
    head = predicted if cut is None else predicted[: cut.at]
    printed = {id(call) for call, _error in printed_calls(report)}
    not_run = Counter(c.path for c in report.modules if id(c) not in printed)
    seen = list(hooks)
    found: list[Disagreement] = []
    agree = 0
    matcher = difflib.SequenceMatcher(
        a=[c.path for c in head], b=[h.path for h in seen], autojunk=False
    )
    opcodes = matcher.get_opcodes()
    apart = 0
    if cut is not None:
        # Past the cut nothing is compared: the prediction's lines from it on, and the eager
        # lines after the last the prediction matched before it (not run there: not either).
        after = 0
        if opcodes and opcodes[-1][0] != "equal":
            tag, i1, i2, j1, j2 = opcodes[-1]
            opcodes[-1], after = (tag, i1, i2, j1, j1), j2 - j1
        apart = max(after, len(predicted) - cut.at)
        not_run.clear()
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            for line, hook in zip(head[i1:i2], seen[j1:j2]):
                got = (hook.in_dtype, None if hook.error else hook.out_dtype, hook.error)
                if line.want == got:
                    agree += 1
                else:
                    found.append(Disagreement(
                        "module", line.path, line.type, line.text, hook.hook_line(),
                    ))  # fmt: skip
            continue
        for line in head[i1:i2]:
            found.append(Disagreement(
                "module", line.path, line.type, line.text, "no such call in the eager run",
            ))  # fmt: skip
        for hook in seen[j1:j2]:
            if not_run[hook.path] > 0:
                not_run[hook.path] -= 1  # predicted not run, but it ran: one disagreement
                text = "not run (the forward raised before it)"
            else:
                text = "no such call in the annotation"
            found.append(Disagreement("module", hook.path, hook.type, text, hook.hook_line()))
    agree += sum(not_run.values())  # not run on both sides
    total = agree + len(found)
    if cut is None:
        return Agreement(agree, total), found
    why = (cut.why,) if cut.why else ()
    return Agreement(agree, total, **{cut.kind: apart}, why=why), found


__all__ = ["TOP_LEVEL", "cast_key", "compare_modules", "compare_nodes", "no_prediction"]
