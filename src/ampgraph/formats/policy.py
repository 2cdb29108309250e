"""The autocast op reference (``ampgraph policy``) and the table changes between torch releases
(``ampgraph policy --since``) as text, Markdown and JSON (schema ``ampgraph.policy``).

Torch-free: they read the plain records :mod:`ampgraph.docs.reference` reads from the dispatcher.

>>> from ampgraph.docs.reference import TableChange
>>> print(changes_text([TableChange("2.9", "cpu", "fp32", "aten::x", "added")], since="2.8",
...                    complete=True))  # doctest: +ELLIPSIS
autocast list changes after torch 2.8 (tables for torch ...):
  2.9 cpu fp32: aten::x added
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from ampgraph import policy as P

if TYPE_CHECKING:  # annotations only: the reference's records
    from ampgraph.docs.reference import DeviceReference, OpEntry, OpReference, TableChange


def _label(category: str) -> str:
    return P.CATEGORY_LABEL.get(category, category)


def _ordered(entries: list[OpEntry]) -> dict[str, list[OpEntry]]:
    groups: dict[str, list[OpEntry]] = {c: [] for c in P.CATEGORIES}
    for e in entries:
        groups.setdefault(e.category, []).append(e)
    return {c: es for c, es in groups.items() if es}


def _short(op: str) -> str:
    return op.removeprefix("aten::")


def _header(ref: OpReference) -> str:
    libs = "".join(f", {name} {version}" for name, version in ref.libraries.items())
    return (
        f"autocast op reference: torch {ref.torch}{libs}; ampgraph's tables are for torch "
        f"{ref.tables_release}"
    )


def _device_line(d: DeviceReference) -> str:
    if not d.entries:
        return f"{d.device_type} ({d.key}): no op has an autocast kernel in this build"
    tables = (
        f"{len(d.differences)} difference{'s' if len(d.differences) != 1 else ''} from "
        f"ampgraph's tables, read from {P.table_source(d.device_type)}"
        if d.has_tables
        else f"ampgraph has no {d.device_type} tables"
    )
    opaque = f", {len(d.opaque)} opaque to ampgraph" if d.opaque else ""
    return (
        f"{d.device_type} ({d.key}): {len(d.entries)} ops with an autocast kernel; {tables}{opaque}"
    )


def to_text(ref: OpReference) -> str:
    """The reference as plain text: per device type, the ops of each category, then differences."""
    lines = [_header(ref)]
    for d in ref.devices:
        lines += ["", _device_line(d)]
        for category, entries in _ordered(d.entries).items():
            names = ", ".join(
                _short(e.op) + (f" (to {e.cast_to})" if e.cast_to else "") for e in entries
            )
            lines += textwrap.wrap(
                f"{_label(category)} ({len(entries)}): {names}", 100,
                initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False,
            )  # fmt: skip
        sources: dict[str, list[str]] = {}
        for e in d.entries:
            if not e.op.startswith("aten::"):
                sources.setdefault(e.source, []).append(e.op)
        for source, ops in sources.items():
            lines += textwrap.wrap(
                f"rule of {', '.join(ops)}: {source}", 100,
                initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False,
            )  # fmt: skip
        for x in d.differences:
            lines.append(f"  difference: {x.op}: {x.kind}: {x.detail}")
    return "\n".join(lines)


#: What each category does to a call, for the Markdown page's legend.
CATEGORY_MEANING: dict[str, str] = {
    P.LOWER_PRECISION_FP: "eligible floating inputs are cast to autocast's 16-bit dtype",
    P.FP32: "eligible floating inputs are cast to fp32",
    P.FP32_SET_OPT_DTYPE: "called with `dtype=torch.float32` unless the call sets a dtype",
    P.FP32_APPEND_DTYPE: "redispatched to the overload that takes a dtype, with fp32",
    P.PROMOTE: "floating inputs are cast to the widest floating dtype among them",
    P.BANNED: "raises under autocast",
    P.FP16: "floating inputs are cast to fp16, whatever autocast's dtype (cuDNN's RNN wrapper)",
    P.FP32_OUTPUT_AS_INPUT: "runs in fp32, outputs cast back to the first input's dtype",
    P.CAST_INPUTS: "`register_autocast`: floating inputs cast to the registered dtype",
    P.OPAQUE: "a kernel whose rule ampgraph does not know: not analysed at its node",
}


def to_markdown(ref: OpReference) -> str:
    """The reference as Markdown, one table per device type (for a documentation page)."""
    libs = "".join(f", {name} {version}" for name, version in ref.libraries.items())
    lines = [
        "# Autocast op reference",
        "",
        (
            f"Read from the dispatcher of torch {ref.torch}{libs} by `ampgraph policy --format "
            f"markdown`; ampgraph's bundled tables are for torch {ref.tables_release}. Ops "
            "without an autocast kernel run in their inputs' dtype, and mixed inputs follow type "
            "promotion."
        ),
        "",
        "| category | what autocast does |",
        "|---|---|",
        *(f"| {_label(c)} | {CATEGORY_MEANING[c]} |" for c in P.CATEGORIES),
    ]
    for d in ref.devices:
        lines += [
            "",
            f"## {d.device_type} (`{d.key}`)",
            "",
            _device_line(d).partition(": ")[2] + ".",
        ]
        if not d.entries:
            continue
        lines += ["", "| op | category | rule from |", "|---|---|---|"]
        for category, entries in _ordered(d.entries).items():
            for e in entries:
                label = _label(category) + (f" → {e.cast_to}" if e.cast_to else "")
                lines.append(f"| `{_short(e.op)}` | {label} | {e.source} |")
        if d.differences:
            lines += ["", "Differences from ampgraph's tables:", ""]
            lines += [f"* `{x.op}`: {x.kind}: {x.detail}" for x in d.differences]
    return "\n".join(lines)


def to_json(ref: OpReference) -> str:
    """The reference as JSON (schema ``ampgraph.policy``, version 1)."""
    return json.dumps(ref.to_dict(), indent=1)


def _changes_note(since: str, complete: bool) -> str:
    return (
        ""
        if complete
        else f"ampgraph's table history reaches back to torch {P.HISTORY_FROM}: changes between "
        f"{since} and {P.HISTORY_FROM} are not recorded"
    )


def _changes_head(since: str) -> str:
    return f"autocast list changes after torch {since} (tables for torch {P.TABLE_TORCH_VERSION})"


def changes_json(changes: Sequence[TableChange], *, since: str, complete: bool) -> str:
    """``ampgraph policy --since --format json``: the changes after ``since``; ``complete``
    False where the history does not reach back to it."""
    data = {"since": since, "tables_release": P.TABLE_TORCH_VERSION, "complete": complete}
    return json.dumps({**data, "changes": [asdict(c) for c in changes]}, indent=1)


def changes_markdown(changes: Sequence[TableChange], *, since: str, complete: bool) -> str:
    """``ampgraph policy --since --format markdown``: a table of the changes after ``since``."""
    head, note = _changes_head(since), _changes_note(since, complete)
    lines = [f"# {head[0].upper()}{head[1:]}", ""]
    if note:
        lines += [f"> {note}.", ""]
    lines += ["| release | device | category | op | change |", "|---|---|---|---|---|"]
    lines += [
        f"| {c.release} | {c.device_type} | {_label(c.category)} | `{c.op}` | {c.change} |"
        for c in changes
    ]
    return "\n".join(lines)


def changes_text(changes: Sequence[TableChange], *, since: str, complete: bool) -> str:
    """``ampgraph policy --since``: a line per change after ``since``, a note where the history
    stops short of it."""
    note = _changes_note(since, complete)
    lines = [_changes_head(since) + ":"]
    lines += [f"  {c.release} {c.device_type} {_label(c.category)}: {c.op} {c.change}"
              for c in changes] or ["  none"]  # fmt: skip
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


__all__ = [
    "CATEGORY_MEANING",
    "changes_json",
    "changes_markdown",
    "changes_text",
    "to_json",
    "to_markdown",
    "to_text",
]
