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

:func:`op_reference` imports torch; its text, Markdown and JSON are :mod:`ampgraph.formats.policy`'s,
which read only the plain records, so a saved JSON reference can be shown anywhere.

>>> ref = op_reference(["cuda"])
>>> entry = ref.device("cuda").entry("aten::layer_norm")
>>> entry.category, entry.source
('fp32', 'ATen (autocast_mode.cpp)')
>>> ref.device("cuda").differences
[]
"""

from __future__ import annotations

import re
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


__all__ = [
    "DeviceReference",
    "Difference",
    "OpEntry",
    "OpReference",
    "TableChange",
    "op_reference",
    "table_changes",
]
