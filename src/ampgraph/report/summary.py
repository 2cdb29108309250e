"""A report in one line and in one table: what ``repr(report)`` and ``report.summary()`` show.

A :class:`~ampgraph.report.records.Report` holds every node record (OPT-125M's is 400 kB of dataclass
reprs); a person at a prompt wants the counts, then the per-module view torchinfo's ``summary()``
made familiar. Torch-free: it reads only the records.

>>> from ampgraph.report.records import ModuleCall, NodeRecord, Report
>>> lin = NodeRecord("linear", "aten.linear.default", "op", module="fc", outputs=["bfloat16"])
>>> r = Report("m", {"name": "amp-fp32"}, {}, {}, [lin],
...            [ModuleCall("fc", "torch.nn.Linear", ["Linear"], "fc", "float32", "bfloat16",
...                        ["linear"])])
>>> one_line(r)
'<Report m amp-fp32: 1 graph node, 1 module call, 0 casts, 0 promotions, not checked>'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ampgraph.settings import caption


# What the summary reads of a report, as protocols: the records module shows a report through
# this one (``repr``, ``Report.summary``), so this one names no class of it, not even for types.
class _Node(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def casts(self) -> Sequence[Any]: ...
    @property
    def promotion(self) -> Any: ...


class _Call(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def in_dtype(self) -> str | None: ...
    @property
    def out_dtype(self) -> str | None: ...
    @property
    def nodes(self) -> Sequence[str]: ...


class ReportView(Protocol):
    """A :class:`ampgraph.report.records.Report`, as far as the summary reads it."""

    @property
    def model(self) -> str: ...
    @property
    def setting(self) -> dict[str, Any]: ...
    @property
    def nodes(self) -> Sequence[_Node]: ...
    @property
    def modules(self) -> Sequence[_Call]: ...
    @property
    def check(self) -> dict[str, Any] | None: ...
    @property
    def errors(self) -> Sequence[Any]: ...


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _check_words(report: ReportView) -> str:
    """What the dispatcher check compared: the nodes it could run (ops and outputs), not the
    graph's inputs, so fewer than the graph nodes."""
    from ampgraph.report.validate import is_report_check

    c = report.check
    if c is None:
        return "not checked"
    if not is_report_check(c):  # a Report built by hand with a damaged block: never a crash
        return "a damaged check"
    return (f"{_count(c.get('compared', 0), 'node')} compared with the dispatcher, "
            f"{_count(c.get('disagreements', 0), 'disagreement')}")  # fmt: skip


def _shown(text: str) -> str:
    """A name on one line of a terminal: line breaks as control pictures, escape sequences (an
    OSC 8 link in a module name) shown as ``\\xNN``, never run."""
    from ampgraph.report.escape import terminal, visible

    return terminal(visible(text))


def one_line(report: ReportView) -> str:
    """``repr(report)``: the model, the setting and the counts, in one line."""
    casts = sum(len(n.casts) for n in report.nodes)
    promotions = sum(1 for n in report.nodes if n.promotion)
    return (
        f"<Report {_shown(report.model)} {_shown(str(report.setting.get('name', '?')))}: "
        f"{_count(len(report.nodes), 'graph node')}, {_count(len(report.modules), 'module call')}, "
        f"{_count(casts, 'cast')}, {_count(promotions, 'promotion')}, {_check_words(report)}>"
    )


class Summary(str):
    """The table :func:`table` returns: a ``str`` that a notebook shows as the table itself."""

    def __repr__(self) -> str:
        return str(self)


def table(report: ReportView) -> Summary:
    """A torchinfo-style table: one row per leaf-module call (its class, the dtype in and out,
    its graph's ops, the casts autocast inserts and the promotions), then the totals.

    >>> from ampgraph.report.records import ModuleCall, NodeRecord, Report
    >>> lin = NodeRecord("linear", "aten.linear.default", "op", module="fc", outputs=["bfloat16"])
    >>> r = Report("m", {"name": "amp-fp32"}, {}, {}, [lin],
    ...            [ModuleCall("fc", "torch.nn.Linear", ["Linear"], "fc", "float32", "bfloat16",
    ...                        ["linear"])])
    >>> print(table(r).splitlines()[4])
    fc           Linear  float32  bfloat16    1      0           0
    """
    by_name = {n.name: n for n in report.nodes}
    head = ("Module call", "Class", "In", "Out", "Ops", "Casts", "Promotions")
    rows = []
    for call in report.modules:
        nodes = [by_name[name] for name in call.nodes if name in by_name]
        rows.append((
            _shown(call.path), _shown(call.type.rsplit(".", 1)[-1]), call.in_dtype or "-",
            call.out_dtype or "-",
            str(sum(1 for n in nodes if n.kind == "op")), str(sum(len(n.casts) for n in nodes)),
            str(sum(1 for n in nodes if n.promotion)),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = {4, 5, 6}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    rule_width = len(line(head))
    casts = sum(len(n.casts) for n in report.nodes)
    promotions = sum(1 for n in report.nodes if n.promotion)
    ops = sum(1 for n in report.nodes if n.kind == "op")
    setting = report.setting
    title = _shown(f"{report.model} {setting.get('name', '?')}")
    if "device_type" in setting:
        title += f" ({caption(setting)})"
    out = [title, "=" * rule_width, line(head), "-" * rule_width]
    out += [line(r) for r in rows]
    out += [
        "=" * rule_width,
        (
            f"{_count(len(report.nodes), 'graph node')} ({_count(ops, 'op')}), "
            f"{_count(len(report.modules), 'leaf-module call')}"
        ),
        (
            f"{_count(casts, 'cast')} inserted by autocast, {_count(promotions, 'promotion')}, "
            f"{_count(len(report.errors), 'node')} that raise"
        ),
        f"check: {_check_words(report)}",
    ]
    return Summary("\n".join(out))


__all__ = ["Summary", "one_line", "table"]
