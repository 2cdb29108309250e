"""Jupyter shows a :class:`~ampgraph.report.records.Report` as its module-view diagram.

The records stay free of the renderer: this module registers the diagram with IPython's SVG
formatter instead of giving ``Report`` a ``_repr_svg_`` method. ``import ampgraph`` calls
:func:`register` only where IPython is already running, so a script or the CLI never pays for
it; the renderer itself (and Graphviz's ``dot``) is reached only when a notebook shows a report.

>>> from ampgraph.report.records import Report
>>> class Formatter(dict):
...     def for_type(self, kind, show):
...         self[kind] = show
>>> class Shell:
...     class display_formatter:
...         formatters = {"image/svg+xml": Formatter()}
>>> register(Shell())
True
>>> Shell.display_formatter.formatters["image/svg+xml"][Report] is report_svg
True
"""

from __future__ import annotations

from typing import Any

from ampgraph.report.records import Report

SVG = "image/svg+xml"


def report_svg(report: Report) -> str | None:
    """The report's module-view diagram as SVG text, or None where it cannot be drawn (no
    ``dot`` installed): IPython then shows the text repr instead.

    >>> isinstance(report_svg(Report("m", {"name": "fp32"}, {}, {}, [], [])), (str, type(None)))
    True
    """
    from ampgraph.render import render_svg  # the renderer only when a notebook shows a report

    try:
        return render_svg(report)
    except Exception:  # noqa: BLE001 - no dot: let Jupyter fall back to the text repr
        return None


def register(shell: Any = None) -> bool:
    """Show reports as diagrams in ``shell`` (default: the running IPython); False without one.

    >>> register(None)  # no IPython running here
    False
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", {})
    if SVG not in formatters:
        return False
    formatters[SVG].for_type(Report, report_svg)
    return True


__all__ = ["register", "report_svg"]
