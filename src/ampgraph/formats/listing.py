"""What the commands list as plain lines: the files a command wrote, the bundled models
(``ampgraph models``), the cache (``ampgraph cache info``, ``clear``) and a written baseline.

Each writer returns the text as printed, its line ends included.

>>> from pathlib import Path
>>> paths_text([Path("out/a.svg"), Path("out/a.dot")])
'out/a.svg\\nout/a.dot\\n'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the records these lists are made of
    from ampgraph.model.build import CatalogueEntry
    from ampgraph.report.records import Report


def _lines(lines: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def paths_text(paths: Sequence[Path | str]) -> str:
    """The files a command wrote (``render``'s diagrams), one path a line."""
    return _lines([str(p) for p in paths])


def overlays_text(paths: Sequence[Path | str]) -> str:
    """``ranges --overlay``'s files, after the ranges' text: ``overlay: PATH`` a line."""
    return _lines([f"overlay: {p}" for p in paths])


def overlays_note(paths: Sequence[Path | str]) -> str | None:
    """The same lines on standard error, beside a format a program reads: its standard output
    stays that format alone.

    >>> print(overlays_note(["o/ranges.html"]))
    overlay: o/ranges.html
    >>> overlays_note([]) is None
    True
    """
    return overlays_text(paths).removesuffix("\n") or None


def models_text(entries: Sequence[CatalogueEntry], *, default: str) -> str:
    """``ampgraph models``: a line per bundled model, ``default`` marked, under a header.

    >>> from types import SimpleNamespace as NS
    >>> entry = NS(name="m", architecture="M", layers="2", params_text="1.0K", origin="x")
    >>> print(models_text([entry], default="m").splitlines()[1])
    m                  M                                 2    1.0K  x (default)
    """
    lines = [f"{'name':<18} {'architecture':<28} {'layers':>6} {'params':>7}  origin"]
    for entry in entries:
        mark = " (default)" if entry.name == default else ""
        lines.append(f"{entry.name:<18} {entry.architecture:<28} {entry.layers:>6} "
                     f"{entry.params_text:>7}  {entry.origin}{mark}")  # fmt: skip
    return _lines(lines)


def cache_info_text(
    size: tuple[Path, int, int], *, limit: int, source: str, note: str | None
) -> str:
    """``ampgraph cache info``: where the cache is, its entries and bytes, its bound (``limit``
    bytes, set by ``source``), and the disk's ``note`` where there is one.

    >>> print(cache_info_text((Path("/c"), 1, 2_000_000), limit=512_000_000, source="default",
    ...                       note=None), end="")
    /c: 1 entry, 2.0 MB of at most 512.0 MB (default)
    """
    root, entries, used = size
    lines = [f"{root}: {entries} entr{'y' if entries == 1 else 'ies'}, {used / 1e6:.1f} MB "
             f"of at most {limit / 1e6:.1f} MB ({source})"]  # fmt: skip
    return _lines(lines + ([note] if note else []))


def cache_clear_text(removed: tuple[int, int], *, folder: Path) -> str:
    """``ampgraph cache clear``: how many files of how many bytes went from ``folder``.

    >>> cache_clear_text((1, 1_500_000), folder=Path("/c"))
    'removed 1 file (1.5 MB) from /c\\n'
    """
    files, freed = removed
    return (f"removed {files} file{'s' if files != 1 else ''} ({freed / 1e6:.1f} MB) "
            f"from {folder}\n")  # fmt: skip


def baseline_written_text(report: Report, *, file: Path | str) -> str:
    """``ampgraph baseline write``: the file, and whose flow it holds (how many nodes, which
    model in which setting)."""
    return f"{file}: {len(report.nodes)} graph nodes of {report.model} {report.setting['name']}\n"


__all__ = [
    "baseline_written_text",
    "cache_clear_text",
    "cache_info_text",
    "models_text",
    "overlays_note",
    "overlays_text",
    "paths_text",
]
