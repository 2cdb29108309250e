"""Accessible SVG: a title and a description that screen readers announce.

Graphviz writes ``<title>`` elements for the graph and each box (the DOT names), but nothing that
says what the figure *shows*. :func:`accessible` gives the root ``<svg>`` the ARIA role of an
image, named by a ``<title>`` and described by a ``<desc>`` written as its first children (the
pattern the SVG accessibility guidelines recommend). It is a pure text transformation:
deterministic, idempotent, and torch-free.

>>> svg = '<?xml version="1.0"?>\\n<svg width="8pt" height="8pt">\\n<g id="graph0"></g>\\n</svg>\\n'
>>> print(accessible(svg, "opt-125m — amp-fp32", "Dtype flow of <opt-125m>."))
<?xml version="1.0"?>
<svg role="img" aria-labelledby="ampgraph-title ampgraph-desc" width="8pt" height="8pt">
<title id="ampgraph-title">opt-125m — amp-fp32</title>
<desc id="ampgraph-desc">Dtype flow of &lt;opt-125m&gt;.</desc>
<g id="graph0"></g>
</svg>
<BLANKLINE>
"""

from __future__ import annotations

import re
from html import escape
from typing import Final

from ampgraph.errors import RenderError

#: The ids of the accessible name and description; no box id looks like them.
TITLE_ID: Final = "ampgraph-title"
DESC_ID: Final = "ampgraph-desc"

_SVG_OPEN: Final = re.compile(r"<svg\b([^>]*)>")

#: Characters XML 1.0 cannot hold, even as references: the C0 controls but tab, newline and
#: carriage return (as their control pictures, U+2400 + code), and U+FFFE, U+FFFF.
_NOT_XML: Final = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)} | {
    0xFFFE: 0xFFFD,
    0xFFFF: 0xFFFD,
}
#: :data:`_NOT_XML` and tab, newline and carriage return too.
_CONTROLS: Final = _NOT_XML | {c: 0x2400 + c for c in (0x09, 0x0A, 0x0D)}


def xml_chars(text: str, *, breaks: bool = True) -> str:
    """``text`` with the characters XML cannot hold shown as control pictures (``\\x1b`` as
    ``␛``): a module name may hold any, and one in a label, an id or a tooltip would make
    Graphviz refuse the label, or write an SVG no XML parser reads.

    ``breaks=False`` shows tab, newline and carriage return as pictures too, for a name on one
    line: Graphviz refuses an HTML-like label's text made of them alone, and writes them into
    ids as they are, where XML reads them as spaces.

    >>> xml_chars("a\\x1b[31m\\x00b\\nc"), xml_chars("a\\nb", breaks=False)
    ('a␛[31m␀b\\nc', 'a␊b')
    """
    return text.translate(_NOT_XML if breaks else _CONTROLS)


def accessible(svg: str, title: str, description: str) -> str:
    """``svg`` with a root title and description for screen readers (see the module doc).

    Applying it twice gives the same text as once; the figure itself is unchanged.
    """
    match = _SVG_OPEN.search(svg)
    if match is None:
        raise RenderError("Graphviz's output has no <svg> element")
    if f'id="{TITLE_ID}"' in svg:
        return svg
    attrs = match.group(1)
    opening = f'<svg role="img" aria-labelledby="{TITLE_ID} {DESC_ID}"{attrs}>'
    head = (
        f'\n<title id="{TITLE_ID}">{escape(xml_chars(title), quote=False)}</title>'
        f'\n<desc id="{DESC_ID}">{escape(xml_chars(description), quote=False)}</desc>'
    )
    return svg[: match.start()] + opening + head + svg[match.end() :]


def accessible_bytes(svg: bytes, title: str, description: str) -> bytes:
    """:func:`accessible` for the bytes ``dot -Tsvg`` writes (UTF-8)."""
    return accessible(svg.decode("utf-8"), title, description).encode("utf-8")
