"""The autocast op reference of the installed torch, read from its dispatcher (``ampgraph policy``).

PyTorch's published "Autocast Op Reference" lags the code (DESIGN.md fact 7). This one is read
from the dispatcher of the torch that runs: for every device type with an autocast dispatch key
(CUDA, CPU, XPU, MPS, ...), every op that has an autocast kernel, with the category ampgraph
applies to it and where that rule comes from, compared with ampgraph's bundled tables
(:mod:`ampgraph.policy`). Nothing is hidden: an ATen op with a kernel the tables lack, a table
entry the dispatcher has no kernel for, or a library's wrapper registered elsewhere than where
ampgraph read its rule is a *difference*; a kernel whose rule ampgraph cannot know (a device
type it has no tables for, a library's arbitrary kernel) is listed as *opaque*, which is what
the annotator says at such a node.

:func:`op_reference` imports torch; the formatting functions read only the plain records, so a
saved JSON reference can be rendered anywhere.

>>> ref = op_reference(["cuda"])
>>> entry = ref.device("cuda").entry("aten::layer_norm")
>>> entry.category, entry.source
('fp32', 'ATen (autocast_mode.cpp)')
>>> ref.device("cuda").differences
[]
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ampgraph import policy as P
from ampgraph.errors import AmpgraphError

SCHEMA = "ampgraph.policy"
SCHEMA_VERSION = 1

#: Where the rules of ATen's own autocast kernels come from.
ATEN_SOURCE = "ATen (autocast_mode.cpp)"

#: Libraries whose autocast kernels ampgraph knows: imported, where installed, so that their
#: kernels are registered before the dispatcher is read.
KNOWN_LIBRARIES = ("torchvision",)


@dataclass(frozen=True)
class OpEntry:
    """One op with an autocast kernel on one device type."""

    #: The dispatcher's name: ``aten::softmax.int``, ``torchvision::roi_align``.
    op: str
    #: One of :data:`ampgraph.policy.CATEGORIES` (:data:`~ampgraph.policy.OPAQUE` when unknown).
    category: str
    #: Where the rule comes from, or why it is not known.
    source: str
    #: For ``cast_inputs`` (``register_autocast``): the dtype floating inputs are cast to.
    cast_to: str | None = None


@dataclass(frozen=True)
class Difference:
    """A place where ampgraph's bundled tables and the installed dispatcher do not say the same."""

    op: str
    #: ``missing from the tables`` | ``no kernel registered`` | ``library rule``
    kind: str
    detail: str


@dataclass
class DeviceReference:
    """The reference for one device type."""

    device_type: str
    key: str
    #: Whether ampgraph bundles policy tables for this device type.
    has_tables: bool
    entries: list[OpEntry] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)

    def entry(self, op: str) -> OpEntry:
        """The entry of ``op`` (``aten::linear``, or ``linear``); ``KeyError`` without one."""
        name = op if "::" in op else f"aten::{op}"
        for e in self.entries:
            if e.op == name:
                return e
        raise KeyError(op)

    @property
    def opaque(self) -> list[OpEntry]:
        """Kernels whose rule ampgraph does not know: the annotator says so at their nodes."""
        return [e for e in self.entries if e.category == P.OPAQUE]


@dataclass
class OpReference:
    """Every autocast kernel of the installed torch, per device type."""

    torch: str
    tables_release: str
    libraries: dict[str, str]
    devices: list[DeviceReference]

    def device(self, device_type: str) -> DeviceReference:
        for d in self.devices:
            if d.device_type == device_type:
                return d
        raise KeyError(device_type)

    @property
    def differences(self) -> int:
        """How many differences between the bundled tables and the dispatcher, all devices."""
        return sum(len(d.differences) for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpReference:
        devices = [
            DeviceReference(
                device_type=d["device_type"],
                key=d["key"],
                has_tables=d["has_tables"],
                entries=[OpEntry(**e) for e in d["entries"]],
                differences=[Difference(**x) for x in d["differences"]],
            )
            for d in data["devices"]
        ]
        return cls(data["torch"], data["tables_release"], data["libraries"], devices)


def _device_reference(device_type: str, key: str) -> DeviceReference:
    import torch

    has_tables = device_type in P.ACTIVE_TABLES
    ref = DeviceReference(device_type, key, has_tables)
    table = P.registered_entries(device_type)
    seen: set[str] = set()
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            continue
        base, _, overload = name.partition(".")
        if not base.startswith("aten::"):
            rule = P.library_rule(device_type, name)
            assert rule is not None  # it has a kernel
            ref.entries.append(OpEntry(name, rule.category, rule.source, rule.cast_to))
            devices, _category = P.LIBRARY_KERNELS.get(base, ((), ""))
            if base in P.LIBRARY_KERNELS and rule.category == P.OPAQUE:
                ref.differences.append(Difference(name, "library rule", rule.source))
            elif base in P.LIBRARY_KERNELS and device_type not in devices:
                ref.differences.append(Difference(
                    name, "library rule",
                    f"a kernel is registered for {device_type}; ampgraph's rule lists "
                    f"{', '.join(devices)} only",
                ))  # fmt: skip
            continue
        entry = P.entry_name(base, overload)
        seen.add(entry)
        if entry in table:
            category = P.lookup(device_type, base, overload)
            assert category is not None
            ref.entries.append(OpEntry(name, category, ATEN_SOURCE))
        elif has_tables:
            why = f"not in ampgraph's {device_type} table for torch {P.ACTIVE_RELEASE}"
            ref.entries.append(OpEntry(name, P.OPAQUE, why))
            ref.differences.append(Difference(name, "missing from the tables", why))
        else:
            why = f"ampgraph has no {device_type} tables"
            ref.entries.append(OpEntry(name, P.OPAQUE, why))
    for entry in sorted(table - seen):
        op, _, overload = entry.partition(".")
        category = P.lookup(device_type, f"aten::{op}", overload)
        ref.differences.append(Difference(
            f"aten::{entry}", "no kernel registered",
            f"ampgraph's {device_type} table lists it as {category}; this torch registers no "
            f"{key} kernel for it",
        ))  # fmt: skip
    return ref


def op_reference(
    device_types: Sequence[str] | None = None, *, libraries: Sequence[str] = KNOWN_LIBRARIES
) -> OpReference:
    """Read the autocast op reference from the installed dispatcher.

    ``device_types`` defaults to every device type with an autocast dispatch key
    (:func:`ampgraph.policy.autocast_device_types`). ``libraries`` are imported first where
    installed, so that the autocast kernels they register are seen; a library given that is not
    installed is an error.

    >>> ref = op_reference(["cpu"])
    >>> ref.device("cpu").entry("aten::cat").category
    'promote'
    """
    import importlib

    import torch

    available = P.autocast_device_types()
    wanted = list(device_types) if device_types else available
    unknown = [d for d in wanted if d not in available]
    if unknown:
        raise AmpgraphError(
            f"no autocast dispatch key for {', '.join(unknown)} in torch {torch.__version__}: "
            f"choose from {', '.join(available)}"
        )
    loaded: dict[str, str] = {}
    for name in libraries:
        try:
            module = importlib.import_module(name)
        except ImportError:
            if name in KNOWN_LIBRARIES:
                continue  # not installed: it registers nothing
            raise AmpgraphError(
                f"cannot import {name!r} to read its autocast kernels: is it installed?"
            ) from None
        loaded[name] = str(getattr(module, "__version__", "?"))
    devices = []
    for device_type in wanted:
        key = P.autocast_key(device_type)
        assert key is not None
        devices.append(_device_reference(device_type, key))
    return OpReference(torch.__version__, P.ACTIVE_RELEASE, loaded, devices)


@dataclass(frozen=True)
class TableChange:
    """One change to the autocast lists between two torch releases."""

    release: str
    device_type: str
    category: str
    op: str
    change: str  # added | removed


def table_changes(since: str) -> tuple[list[TableChange], bool]:
    """What changed in the autocast lists after torch ``since`` (``"2.13"``), newest first, from
    :data:`ampgraph.policy.TABLE_HISTORY`; and whether the history reaches back that far.

    >>> changes, complete = table_changes("2.13")
    >>> complete, [(c.op, c.change) for c in changes if c.device_type == "cpu"]
    (True, [('linalg_matrix_sqrth', 'added'), ('cholesky', 'removed'), ('qr', 'removed')])
    """
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?([+.a-z0-9]*)", since):
        raise AmpgraphError(f"{since!r} is not a torch release: give one such as 2.13 or 2.13.0")
    start = P._release(since)
    changes = [
        TableChange(release, device, category, op, change)
        for release, device, category, op, change in P.TABLE_HISTORY
        if P._release(release) > start
    ]
    return changes, start >= P._release(P.HISTORY_FROM)


# -- formatting (no torch) -----------------------------------------------------------------------


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


def changes_text(since: str, fmt: str = "text") -> str:
    """``ampgraph policy --since``: the changes after ``since``, in ``text|markdown|json``."""
    changes, complete = table_changes(since)
    note = (
        ""
        if complete
        else f"ampgraph's table history reaches back to torch {P.HISTORY_FROM}: changes between "
        f"{since} and {P.HISTORY_FROM} are not recorded"
    )
    if fmt == "json":
        data = {"since": since, "tables_release": P.TABLE_TORCH_VERSION, "complete": complete}
        return json.dumps({**data, "changes": [asdict(c) for c in changes]}, indent=1)
    head = f"autocast list changes after torch {since} (tables for torch {P.TABLE_TORCH_VERSION})"
    if fmt == "markdown":
        lines = [f"# {head[0].upper()}{head[1:]}", ""]
        if note:
            lines += [f"> {note}.", ""]
        lines += ["| release | device | category | op | change |", "|---|---|---|---|---|"]
        lines += [
            f"| {c.release} | {c.device_type} | {_label(c.category)} | `{c.op}` | {c.change} |"
            for c in changes
        ]
        return "\n".join(lines)
    lines = [head + ":"]
    lines += [f"  {c.release} {c.device_type} {_label(c.category)}: {c.op} {c.change}"
              for c in changes] or ["  none"]  # fmt: skip
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


FORMATS = {"text": to_text, "markdown": to_markdown, "json": to_json}

__all__ = [
    "DeviceReference",
    "Difference",
    "OpEntry",
    "OpReference",
    "TableChange",
    "changes_text",
    "op_reference",
    "table_changes",
    "to_json",
    "to_markdown",
    "to_text",
]
