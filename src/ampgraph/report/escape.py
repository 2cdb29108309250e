"""Model text escaped for Markdown and terminals: every Markdown output (``table``, ``check``, ``audit``, ``diff``,
``baseline check``, the training tables) writes module and class names through this module.

A module name is any string ``nn.Module.add_module`` accepts and a class name any string
``type()`` does: a ``|`` or a newline in one would end a table cell or row, ``[x](javascript:..)``
would be a live link in a pull-request comment, ``<script>`` raw HTML, and a backtick would end
the code span the name was put in. Two forms, both safe inside a GitHub table cell:

* :func:`code_span`: the text shown literally in a code span, for names;
* :func:`escape_text`: the text shown literally as ordinary text, for messages that mention names.

Both show control characters (newline, carriage return, tab, ...) as their Unicode control
pictures (``␊``, ``␍``, ``␉``): a line break would end the table row, and an invisible
character would hide what a name really is. Torch-free.

>>> print(f"| {code_span('a|b')} | {escape_text('[x](javascript:alert(1))')} |")
| `a\\|b` | \\[x\\](javascript:alert(1)) |
"""

from __future__ import annotations

import re
from typing import Final

#: C0 control characters and DEL, each shown as its control picture (U+2400 + code, U+2421).
_CONTROLS: Final = {c: chr(0x2400 + c) for c in range(0x20)} | {0x7F: "\u2421"}

#: ASCII characters that start Markdown inline syntax in CommonMark or on GitHub, escaped with a
#: backslash (CommonMark's escape for any ASCII punctuation): ``\\`` escapes, `````` code,
#: ``*`` and ``_`` emphasis, ``[``/``]`` links and images, ``<`` HTML and autolinks, ``&``
#: entities, ``|`` table cells, ``~`` strikethrough, ``$`` GitHub's math. ``>``, ``(``, ``#`` and
#: the rest do nothing inside a line once these are escaped, so they stay as they are (and the
#: ``->`` in messages stays readable).
_ACTIVE: Final = frozenset("\\`*[]<&|~$")


def visible(text: str) -> str:
    """``text`` with its control characters as control pictures, so it stays on one line.

    >>> visible("a\\nb\\rc\\td")
    'a␊b␍c␉d'
    """
    return text.translate(_CONTROLS)


#: What a terminal acts on in text output: C0 controls but newline and tab, DEL, and the C1
#: controls (U+009B is CSI to a UTF-8 xterm), which an OSC 8 link or a screen clear in a module
#: name would use.
_TERMINAL: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal(text: str) -> str:
    r"""``text`` for a terminal: every control character a terminal would act on (an escape
    sequence in a module name) shown as ``\xNN``; newlines and tabs kept, the text's own layout.

    >>> terminal("a\x1b]8;;http://x\x07b\nc")
    'a\\x1b]8;;http://x\\x07b\nc'
    """
    return _TERMINAL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def code_span(text: str, *, table: bool = True) -> str:
    """A code span that shows ``text`` literally (control characters as pictures).

    The fence is one backtick longer than the longest run of backticks inside, and the content is
    padded with a space where it starts or ends with a backtick or with spaces (CommonMark strips
    one space from each end of such a span). In a table (``table=True``, the default) each ``|``
    is written ``\\|``: GitHub splits a row into cells before it reads code spans, and takes the
    backslash back off. Outside a table the backslash would show, so ``table=False`` leaves pipes.

    >>> code_span("fc1"), code_span("a`b"), code_span("`x"), code_span("a|b", table=False)
    ('`fc1`', '``a`b``', '`` `x ``', '`a|b`')
    """
    content = visible(text)
    if table:
        content = content.replace("|", "\\|")
    if not content:
        return "` `"  # an empty span is no span: two backticks would show as themselves
    runs = re.findall(r"`+", content)
    fence = "`" * (max(map(len, runs), default=0) + 1)
    pad = (
        content[0] == "`"
        or content[-1] == "`"
        or (content[0] == " " and content[-1] == " " and content.strip(" ") != "")
    )
    return f"{fence} {content} {fence}" if pad else f"{fence}{content}{fence}"


def _underscore(match: re.Match[str]) -> str:
    """An ``_`` between two letters or digits cannot start or end emphasis (``p_fc_weight``):
    left as it is, so names stay readable in the source; any other is escaped."""
    text, at = match.string, match.start()
    inside = 0 < at < len(text) - 1 and text[at - 1].isalnum() and text[at + 1].isalnum()
    return "_" if inside else "\\_"


def escape_text(text: str, *, line_start: bool = False) -> str:
    """``text`` shown literally as ordinary Markdown text, inside a line or a table cell.

    No link, image, HTML, emphasis, code span or cell break can come out of it: the characters
    that would start one are backslash-escaped, control characters are pictures, and ``://`` and
    ``www.`` are broken up so GitHub does not turn a bare URL into a link. Whitespace at either
    end is written as character references: a table cell or a paragraph would drop it, and a
    name's ``**`` around it would stop being bold. Text that starts a line (``line_start=True``)
    could also start a block there (a heading, a quote, a list item, a rule): the mark that
    would start one is escaped too.

    >>> escape_text("<script>alert(1)</script> a | b")
    '\\\\<script>alert(1)\\\\</script> a \\\\| b'
    >>> escape_text("p_fc_weight *bold* _it_ http://x")
    'p_fc_weight \\\\*bold\\\\* \\\\_it\\\\_ http\\\\://x'
    >>> escape_text("# x", line_start=True), escape_text("1. x", line_start=True), escape_text(" x")
    ('\\\\# x', '1\\\\. x', '&#32;x')
    """
    out = "".join("\\" + c if c in _ACTIVE else c for c in visible(text))
    out = re.sub("_", _underscore, out)
    out = out.replace("://", "\\://")
    out = re.sub(r"(?i)(www)\.", r"\1\\.", out)
    core = out.lstrip()
    lead = out[: len(out) - len(core)]
    trail = core[len(core.rstrip()) :]
    core = core[: len(core) - len(trail)]
    if line_start and not lead:
        core = re.sub(r"^([#>+=-]|\d+(?=[.)]))", _mark, core)
    return _references(lead) + core + _references(trail)


def _references(text: str) -> str:
    """``text`` as numeric character references (``&#32;``), which Markdown shows as is."""
    return "".join(f"&#{ord(c)};" for c in text)


def _mark(match: re.Match[str]) -> str:
    """A block's mark at the start of a line, escaped: ``\\#``; ``1\\.`` for a list number."""
    mark = match.group(1)
    return mark + "\\" if mark[0].isdigit() else "\\" + mark


__all__ = ["code_span", "escape_text", "visible"]
