"""Saved-activation memory: what autograd keeps for backward, summed per module and per dtype.

Torch-free: it reads the :class:`~ampgraph.report.records.SavedTensor` records of a report, so tables and
diagrams can be made from a saved JSON report. Memory is counted once per storage (a tensor saved
by three ops, or a view of another saved tensor, costs its storage once), and only for what
exists because it is saved: ``activation`` (made by the forward) and ``parameter copy`` (the
16-bit copies autocast makes of fp32 parameters, kept for backward). Parameters, buffers and
inputs are alive anyway and are not counted.

>>> from ampgraph.report.records import SavedTensor
>>> saved = [
...     SavedTensor("ln", "layers.0.ln", "float32", [8, 768], 24576, 0, 24576, "activation"),
...     SavedTensor("fc1", "layers.0.fc1", "bfloat16", [8, 768], 12288, 1, 12288, "activation"),
...     SavedTensor("fc2", "layers.0.fc2", "bfloat16", [8, 768], 12288, 1, 12288, "activation"),
...     SavedTensor("fc2", "layers.0.fc2", "float32", [768], 3072, 2, 3072, "parameter"),
... ]
>>> activation_bytes_by_dtype(saved)
{'float32': 24576, 'bfloat16': 12288}
>>> by_module(saved, depth=1)
{'layers.0': {'float32': 24576, 'bfloat16': 12288}}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: the memory sums read records, never build them
    from ampgraph.report.records import SavedTensor

#: Kinds of saved tensor whose memory exists because autograd saved them.
COUNTED_KINDS = ("activation", "parameter copy")
ACTIVATION = ("activation",)
PARAMETER_COPY = ("parameter copy",)


def _counted(
    saved: Iterable[SavedTensor], kinds: Sequence[str] = COUNTED_KINDS
) -> list[SavedTensor]:
    """Each counted storage once, at the first tensor saved in it."""
    seen: set[int] = set()
    out = []
    for t in saved:
        if t.kind not in kinds or t.storage in seen:
            continue
        seen.add(t.storage)
        out.append(t)
    return out


def activation_bytes_by_dtype(
    saved: Sequence[SavedTensor], kinds: Sequence[str] = COUNTED_KINDS
) -> dict[str, int]:
    """Bytes kept alive for backward, per dtype (each storage once), of the given kinds."""
    out: dict[str, int] = {}
    for t in _counted(saved, kinds):
        out[t.dtype] = out.get(t.dtype, 0) + t.storage_bytes
    return out


def total_bytes(saved: Sequence[SavedTensor], kinds: Sequence[str] = COUNTED_KINDS) -> int:
    """All bytes kept alive for backward (each storage once), of the given kinds."""
    return sum(activation_bytes_by_dtype(saved, kinds).values())


def module_prefix(path: str | None, depth: int | None) -> str:
    """The first ``depth`` components of a module path that count (indices stay with their
    list: ``model.decoder.layers.3.fc1`` at depth 3 is ``model.decoder.layers.3``).

    >>> module_prefix("model.decoder.layers.3.fc1", 3), module_prefix(None, 2)
    ('model.decoder.layers.3', '(outside any module)')
    """
    if path is None:
        return "(outside any module)"
    if not path:
        return "(root)"
    if depth is None:
        return path
    parts = path.split(".")
    out: list[str] = []
    for part in parts:
        if part.isdigit() and out:
            out[-1] = f"{out[-1]}.{part}"
            continue
        if len(out) == depth:
            break
        out.append(part)
    return ".".join(out)


def by_module(
    saved: Sequence[SavedTensor],
    depth: int | None = None,
    kinds: Sequence[str] = COUNTED_KINDS,
) -> dict[str, dict[str, int]]:
    """Bytes kept alive for backward per module (its path cut to ``depth``), then per dtype.

    A storage is counted for the module whose op saved it first.
    """
    out: dict[str, dict[str, int]] = {}
    for t in _counted(saved, kinds):
        row = out.setdefault(module_prefix(t.module, depth), {})
        row[t.dtype] = row.get(t.dtype, 0) + t.storage_bytes
    return out


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``.

    >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 2**20)
    ('512 B', '1.5 KiB', '3.0 MiB')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


__all__ = [
    "ACTIVATION",
    "COUNTED_KINDS",
    "PARAMETER_COPY",
    "activation_bytes_by_dtype",
    "by_module",
    "human_bytes",
    "module_prefix",
    "total_bytes",
]
