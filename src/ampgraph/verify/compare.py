"""Compare the prediction with what real execution did: node outcomes, casts, hook lines."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence

from ampgraph.report.records import NodeRecord, Report
from ampgraph.report.text import call_error
from ampgraph.settings import short_dtype
from ampgraph.verify.casts import cast_text
from ampgraph.verify.eager import HookCall
from ampgraph.verify.execution import Observed
from ampgraph.verify.results import Agreement, Disagreement


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


def compare_nodes(
    records: Sequence[NodeRecord], observed: dict[str, Observed]
) -> tuple[Agreement, Agreement, list[Disagreement]]:
    """Node outcomes and casts, prediction against real execution."""
    nodes_agree = nodes_total = casts_agree = casts_total = 0
    found: list[Disagreement] = []
    for rec in records:
        if rec.is_placeholder:
            continue  # placeholders are made from their own annotation: nothing to prove
        obs = observed.get(rec.name)
        nodes_total += 1
        predicted, seen = _predicted_text(rec), _observed_text(obs)
        if (
            obs is not None
            # A node ampgraph did not analyse is no prediction: it never counts as agreeing.
            and rec.not_analysed is None
            and (rec.error or None) == obs.error
            and (rec.skipped or None) == (obs.skipped or None)
            and (rec.error or rec.skipped or rec.outputs == obs.outputs)
        ):
            nodes_agree += 1
        else:
            found.append(Disagreement("node", rec.name, rec.op, predicted, seen, rec.module))
        if obs is None or not obs.checked_casts or rec.kind != "op":
            continue
        want = Counter((c.node, c.from_dtype, c.to_dtype) for c in rec.casts)
        got = Counter(obs.casts)
        both = sum((want & got).values())
        casts_agree += both
        casts_total += sum((want | got).values())
        if want != got:
            found.append(
                Disagreement(
                    "cast",
                    rec.name,
                    rec.op,
                    cast_text([(c.node, c.from_dtype, c.to_dtype) for c in rec.casts]),
                    cast_text(obs.casts),
                    rec.module,
                )
            )
    return Agreement(nodes_agree, nodes_total), Agreement(casts_agree, casts_total), found


def compare_modules(
    report: Report, hooks: Sequence[HookCall]
) -> tuple[Agreement, list[Disagreement]]:
    """The annotation's module view against the eager hooks, call by call in order."""
    predicted = list(report.modules)
    seen = list(hooks)
    eager_failed = any(h.error for h in hooks)
    found: list[Disagreement] = []
    agree = 0
    matcher = difflib.SequenceMatcher(
        a=[c.path for c in predicted], b=[h.path for h in seen], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for call, hook in zip(predicted[i1:i2], seen[j1:j2]):
                error = call_error(report, call)
                want = (call.in_dtype, None if error else call.out_dtype, error)
                got = (hook.in_dtype, None if hook.error else hook.out_dtype, hook.error)
                if want == got:
                    agree += 1
                else:
                    text = (
                        call.hook_line()
                        if not error
                        else (f"[{call.path}] in=torch.{call.in_dtype} -> error: {error}")
                    )
                    found.append(Disagreement(
                        "module", call.path, call.type.rsplit(".", 1)[-1],
                        text, hook.hook_line(),
                    ))  # fmt: skip
            continue
        for call in predicted[i1:i2]:
            if eager_failed and all(report.node(name).skipped for name in call.nodes):
                agree += 1  # downstream of the error: not run in the graph nor in eager mode
                continue
            found.append(Disagreement(
                "module", call.path, call.type.rsplit(".", 1)[-1], call.hook_line(),
                "no such call in the eager run",
            ))  # fmt: skip
        for hook in seen[j1:j2]:
            found.append(Disagreement(
                "module", hook.path, hook.type, "no such call in the annotation", hook.hook_line(),
            ))  # fmt: skip
    total = agree + len(found)
    return Agreement(agree, total), found


__all__ = ["compare_modules", "compare_nodes"]
