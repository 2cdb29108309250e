"""A verification's text (``ampgraph verify``): the summary line of each result, a line per
disagreement, and why some items were not compared. The results are
:mod:`ampgraph.verify.results`' records; their JSON is their ``to_dict``.

>>> from ampgraph.verify.results import Agreement, Disagreement
>>> counts(Agreement(354, 354)), counts(Agreement(5, 5, not_analysed=2))
('354/354', '5/5 (2 not analysed)')
>>> print(disagreement_line(Disagreement("node", "linear", "aten.linear.default", "bf16",
...                                      "fp32", module="fc1")))
  node linear (aten.linear.default, fc1): predicted bf16, observed fp32
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampgraph.settings import short_dtype

if TYPE_CHECKING:  # annotations only: the verify package imports torch
    from ampgraph.verify.results import Agreement, Disagreement, Verification


def counts(a: Agreement) -> str:
    """``agree/total``, then `` (337 not analysed, 189 not comparable)`` where some were not
    compared."""
    parts = [
        f"{n} {what}"
        for n, what in ((a.not_analysed, "not analysed"), (a.not_comparable, "not comparable"))
        if n
    ]
    return f"{a.agree}/{a.total}" + (f" ({', '.join(parts)})" if parts else "")


def _what(result: Verification) -> str:
    """What was run, after the setting (``" train"``); empty for the forward."""
    if result.pass_ == "forward":
        return ""
    inside = getattr(result, "backward_autocast", False)  # a training step's
    return f" {result.pass_}" + (" backward in autocast" if inside else "")


def summary_line(result: Verification) -> str:
    """``opt-125m amp-fp32 (cpu bf16) on <device>: nodes 354/354, ... 0 disagreements``."""
    n = len(result.disagreements)
    agreed = ", ".join(f"{k.replace('_', ' ')} {counts(a)}" for k, a in result.agreement().items())
    s = result.setting
    return (
        f"{result.model} {s.name} ({s.device_type} {short_dtype(s.amp_dtype)}){_what(result)} "
        f"on {result.device_name}: {agreed} agree; {n} disagreement{'s' if n != 1 else ''}"
    )


def disagreement_line(d: Disagreement) -> str:
    """``  node linear (aten.linear.default, fc1): predicted bf16, observed fp32``."""
    where = f"{d.op}, {d.module}" if d.module else d.op
    return (f"  {d.kind} {d.node or '(root)'} ({where}): predicted {d.predicted}, "
            f"observed {d.observed}")  # fmt: skip


def disagreement_lines(result: Verification) -> list[str]:
    """A line per disagreement of ``result`` (:func:`disagreement_line`)."""
    return [disagreement_line(d) for d in result.disagreements]


def note_lines(result: Verification) -> list[str]:
    """Why some items were not compared, a line each (``  nodes not comparable: ...``)."""
    return [
        f"  {k.replace('_', ' ')} not comparable: {why}"
        for k, a in result.agreement().items()
        for why in a.why
    ]


def result_lines(result: Verification) -> list[str]:
    """Everything ``ampgraph verify`` prints of one result: its summary line, its disagreements,
    why some items were not compared."""
    return [summary_line(result), *disagreement_lines(result), *note_lines(result)]


__all__ = [
    "counts",
    "disagreement_line",
    "disagreement_lines",
    "note_lines",
    "result_lines",
    "summary_line",
]
