"""One self-contained interactive HTML page of one or more reports: the ``html`` format.

The page works offline from a file: its script and style are inside it (``page.js`` and
``page.css`` beside this module), and nothing is fetched. The reports travel as data in a
``<script type="application/json">`` element, with ``<``, ``>`` and ``&`` written as JSON
escapes so no module name can end the element, and the script builds the page with
``textContent`` only: a module named ``</script><img onerror=...>`` shows as that text.

What the page does (``page.js``): module groups folded as in the SVG (layers and leaf modules
shut, a click or Enter opens them), a layered layout of its own drawn on a canvas for only
what is in view (Llama-3-70B unfolded is tens of thousands of rows), pan and zoom, search by
module path, op or node name, a panel with a clicked node's annotation, settings switchable
with what differs from a chosen other setting highlighted, and keys for all of it.

Torch-free: it reads :class:`~ampgraph.report.records.Report` records.

>>> from ampgraph.report.records import NodeRecord, Report
>>> r = Report("m</script>", {"name": "amp-fp32"}, {}, {},
...     [NodeRecord("x", "placeholder", "input", outputs=["float32"])], [])
>>> page = html_page([r])
>>> page.startswith("<!DOCTYPE html>"), "m</script>" in page, "m\\\\u003c/script\\\\u003e" in page
(True, False, True)
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from ampgraph.errors import RenderError
from ampgraph.render.page_data import node_records
from ampgraph.render.style import DTYPE_FAMILY, THEMES
from ampgraph.settings import caption

if TYPE_CHECKING:
    from ampgraph.report.records import Report

#: Characters that must not appear raw inside a ``<script>`` element's JSON: ``<`` could start
#: ``</script>`` or ``<!--``; ``>`` and ``&`` for good measure; U+2028/9 end lines in old parsers.
_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                0x2028: "\\u2028", 0x2029: "\\u2029"}  # fmt: skip


def script_json(data: Any) -> str:
    """``data`` as JSON that is safe inside ``<script type="application/json">``.

    >>> script_json({"a": "</script>"})
    '{"a":"\\\\u003c/script\\\\u003e"}'
    """
    return json.dumps(data, separators=(",", ":"), allow_nan=False).translate(_SCRIPT_SAFE)


def _colours(theme: str) -> dict[str, Any]:
    style = THEMES[theme]
    return {
        "background": style.background,
        "text": style.text,
        "muted": style.muted,
        "families": DTYPE_FAMILY,
        "edges": {k: v.colour for k, v in style.edges.items()},
        "fills": {k: v.fill for k, v in style.policies.items()},
        "borders": {k: v.border for k, v in style.policies.items()},
        "promotion": style.promotion.border,
        "group": style.fold_fill,
        "groupBorder": style.fold_border,
    }


def page_data(
    reports: Sequence[Report],
    *,
    theme: str = "light",
    fold: bool = True,
    headroom: Mapping[str, Mapping[str, float]] | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """What the page's script reads: the settings' node records, module types, colours.

    ``fold``: layers and leaf modules start folded, as in the SVG; False opens every group.
    ``headroom`` maps a setting's name to its nodes' headroom in decades (``ranges``).
    """
    if not reports:
        raise RenderError("nothing to render: no reports were given")
    if theme not in THEMES:
        raise RenderError(f"unknown theme {theme!r}: use one of {', '.join(THEMES)}")
    types: dict[str, str] = {}
    for report in reports:
        for call in report.modules:
            types.setdefault(call.path, call.type)
    models = list(dict.fromkeys(r.model for r in reports))
    return {
        "title": title or f"{', '.join(models)}: autocast dtype flow",
        "theme": theme,
        "unfold": not fold,
        "colours": _colours(theme),
        "modules": types,
        "settings": [
            {
                "name": str(r.setting.get("name", f"setting {k + 1}")),
                "model": r.model,
                "caption": caption(r.setting),
                "pass": r.pass_,
                "nodes": node_records(
                    r, None if headroom is None else headroom.get(str(r.setting.get("name")))
                ),
            }
            for k, r in enumerate(reports)
        ],
    }


def _asset(name: str) -> str:
    return files("ampgraph.render").joinpath(name).read_text(encoding="utf-8")


def html_page(
    reports: Sequence[Report],
    *,
    theme: str = "light",
    fold: bool = True,
    headroom: Mapping[str, Mapping[str, float]] | None = None,
    title: str | None = None,
) -> str:
    """The interactive page of ``reports`` (one or several settings) as HTML text."""
    data = page_data(reports, theme=theme, fold=fold, headroom=headroom, title=title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        # Nothing may load from elsewhere: the page is for reading offline, and a name in the
        # data that got past the escaping still could not fetch anything.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{html.escape(data['title'])}</title>\n"
        f"<style>\n{_asset('page.css')}</style>\n</head>\n"
        f"<body class=\"theme-{theme}\">\n"
        "<noscript><p>This page needs JavaScript to draw the graph; the SVG diagrams "
        "(ampgraph render --format svg) show the same without it.</p></noscript>\n"
        f"<script type=\"application/json\" id=\"ampgraph-data\">{script_json(data)}</script>\n"
        f"<script>\n{_asset('page.js')}</script>\n</body>\n</html>\n"
    )
