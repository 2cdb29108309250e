"""Model text in every output format (issue "Safe in a pull request").

A module's name is any string ``nn.Module.add_module`` accepts and a class's any string ``type()``
does; each format escapes them for its own syntax. Markdown (``table``, ``check``, ``audit``,
``diff``, the training tables) parses into the tables plain names give, each name shown literally
in its own cell, with no link and no HTML; Graphviz source lays out into an SVG that XML reads,
every box with the id its name gives; SARIF's artifact locations are URI references; JSON
round-trips.

Two models are analysed once: one whose names are plain tokens, and one whose names are the
defects the issue lists. Hypothesis renames the tokens in the plain model's records to hostile
names, which costs no analysis, and the plain report's output is the oracle: the hostile report's
must parse into the same tokens, with the names put in where the tokens were.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from torch import nn

from ampgraph.cli import main
from ampgraph.formats.json import audit_json, diff_json
from ampgraph.formats.markdown import (
    audit_markdown,
    check_markdown,
    diff_markdown,
    markdown_table,
    markdown_train,
)
from ampgraph.formats.sarif import artifact_uri
from ampgraph.formats.sarif import audit_sarif as sarif
from ampgraph.pipeline.stages import analyze, analyze_group
from ampgraph.render.dot import to_dot
from ampgraph.render.graph import build_graph
from ampgraph.render.overview import overview_dot
from ampgraph.render.tooltips import node_tooltip
from ampgraph.report.records import Report
from ampgraph.review.diff import diff_reports

# -- the models ------------------------------------------------------------------------------------

#: The plain model's names: no token is part of another, and none is made of digits (numbered
#: names are layers, which the formats group).
TOKENS: dict[str, str] = {
    "zero": "zqzero", "one": "zqone", "two": "zqtwo", "layers": "zqlist", "cls": "Zqcls",
    "model": "Zqmodel",
}  # fmt: skip
#: The defects the issue lists: a pipe and a newline (a table row), a colon (a DOT port), a
#: Markdown link, a trailing backslash (a DOT string's closing quote), a quote, ``#``, ``%``,
#: spaces at the ends and a backtick run (a code span), HTML as a class's name.
FIXED: dict[str, str] = {
    "zero": "a|b\nc:d", "one": "[x](javascript:alert(1))", "two": "tail\\",
    "layers": ' q"t #h %p ``s` ', "cls": "<script>alert(1)</script>", "model": "M|`x`\\",
}  # fmt: skip


class _Block(nn.Module):
    """One named child, then an autocast-disabled region: a frame in the diagram and an
    fp32-island finding, both named after the block."""

    def __init__(self, child: str, cls: type[nn.Linear]) -> None:
        super().__init__()
        self.add_module(child, cls(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (inner,) = self._modules.values()
        h = inner(x)
        with torch.autocast("cuda", enabled=False):
            return h.float().softmax(-1)


class _Root(nn.Module):
    """A Linear and a residual add (a promotion under autocast), a block, two identical layers in
    a list (drawn once in the diagram): each named by ``names``."""

    def __init__(self, names: dict[str, str], cls: type[nn.Linear]) -> None:
        super().__init__()
        self.add_module(names["zero"], cls(4, 4))
        self.add_module(names["one"], _Block(names["two"], cls))
        self.add_module(names["layers"], nn.ModuleList([cls(4, 4), cls(4, 4)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zero, one, layers = self._modules.values()
        x = one(x + zero(x))
        for layer in layers:  # type: ignore[union-attr]
            x = layer(x)
        return x


def build(names: dict[str, str]) -> nn.Module:
    """The model with ``names``: its class and its Linears' class are named too."""
    cls = type(names["cls"], (nn.Linear,), {})
    return type(names["model"], (_Root,), {})(names, cls)


def with_check(report: Report) -> Report:
    """``report`` as if the dispatcher had checked it and disagreed at its first Linear: the
    check's formats print node and module names in their disagreement lines."""
    data = report.to_dict()
    linear = next(n for n in data["nodes"] if n["op"] == "aten.linear.default")
    linear["check"] = {"agree": False, "dispatcher": {"outputs": ["float32"]}}
    data["check"] = {"oracle": "dispatcher", "nodes": len(data["nodes"]), "compared": 5,
                     "disagreements": 1}  # fmt: skip
    return Report.from_dict(data)


def analysed(names: dict[str, str]) -> dict[str, Report]:
    """fp32 and amp-fp32 forward passes (amp-fp32 with a check), an amp-fp32 training step."""
    args = (torch.randn(2, 4),)
    fp32, amp = analyze_group(build(names), ["fp32", "amp-fp32"], args=args, check=False)
    train = analyze(build(names), "amp-fp32", args=args, check=False, pass_="train")
    return {"fp32": fp32, "amp": with_check(amp), "train": train}


@functools.cache
def plain_reports() -> dict[str, Report]:
    """The plain model's reports, analysed once; Hypothesis's tests call this rather than take a
    fixture, whose records it would print in full with a failure."""
    return analysed(TOKENS)


@pytest.fixture(scope="module")
def plain() -> dict[str, Report]:
    return plain_reports()


@pytest.fixture(scope="module")
def hostile() -> dict[str, Report]:
    reports = analysed(FIXED)
    assert reports["amp"].model == FIXED["model"]  # the names reached the records as they are
    assert {c.path for c in reports["amp"].modules} >= {FIXED["zero"], f"{FIXED['one']}.tail\\"}
    return reports


_TOKEN_RE = re.compile("|".join(map(re.escape, TOKENS.values())))


def renamer(names: dict[str, str]) -> Callable[[str], str]:
    """A function putting ``names`` where the tokens are, in one pass (a name may hold a token)."""
    by_token = {TOKENS[key]: name for key, name in names.items()}
    return lambda text: _TOKEN_RE.sub(lambda m: by_token[m.group()], text)


def renamed(report: Report, names: dict[str, str]) -> Report:
    """``report`` with the tokens renamed in every string of its records (node names too)."""
    rename = renamer(names)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return rename(value)
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        return value

    return Report.from_dict(walk(report.to_dict()))


# -- what the formats must give --------------------------------------------------------------------

MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
# Every link is a link here: markdown-it drops javascript: ones, which other renderers may not.
MD.validateLink = lambda url: True  # type: ignore[method-assign]


def shown(text: str) -> str:
    """A name as it reads once rendered: control characters as their control pictures."""
    return "".join(
        chr(0x2400 + ord(c)) if ord(c) < 0x20 else "\u2421" if c == "\x7f" else c for c in text
    )


def parsed(text: str) -> Iterator[tuple[str, str]]:
    """Block tokens and inline children, each as ``(type, content)`` (blocks but HTML: no
    content)."""
    for token in MD.parse(text):
        if token.type == "inline":
            yield from ((child.type, child.content) for child in token.children or [])
        else:
            yield token.type, token.content if token.type.startswith("html") else ""


def assert_same_markdown(
    hostile: str, plain: str, rename: Callable[[str], str], *, texts: bool = True
) -> None:
    """``hostile`` parses into ``plain``'s tokens (the same tables, rows and cells, the same
    emphasis and code spans, no link, no HTML of its own), each code span and (``texts``) each
    text ``plain``'s with the names put in and shown literally."""
    got, want = list(parsed(hostile)), list(parsed(plain))
    assert [kind for kind, _ in got] == [kind for kind, _ in want], hostile
    for (kind, content), (_, plain_content) in zip(got, want):
        assert kind not in ("link_open", "image", "html_inline"), hostile
        if kind == "code_inline" or (kind == "text" and texts):
            assert content == shown(rename(plain_content)), hostile
        elif kind == "html_block":
            assert content == plain_content, hostile  # the format's own (diff's <details>)
    # Line by line, as GitHub splits a table row: a cell per pipe with no backslash before it.
    lines, plain_lines = hostile.split("\n"), plain.split("\n")  # not splitlines: U+2028
    assert len(lines) == len(plain_lines), hostile
    for line, plain_line in zip(lines, plain_lines):
        if plain_line.startswith("|"):
            assert len(_CELL_BORDER.findall(line)) == len(_CELL_BORDER.findall(plain_line)), line


_CELL_BORDER = re.compile(r"(?<!\\)\|")


def markdown_outputs(reports: dict[str, Report]) -> dict[str, str]:
    """Every Markdown format, of one model's reports."""
    return {
        "table": markdown_table(reports["amp"]),
        "check": check_markdown([reports["amp"], reports["fp32"]]),
        "audit": audit_markdown(reports["amp"]),
        "diff": diff_markdown(diff_reports(reports["fp32"], reports["amp"])),
        "train": markdown_train(reports["train"]),
    }


def table_cells(markdown: str) -> list[list[tuple[str, str]]]:
    """The rows of every table: per cell, its children's types (``+``-joined) and text."""
    out: list[list[tuple[str, str]]] = []
    inside = False
    for token in MD.parse(markdown):
        if token.type in ("table_open", "table_close"):
            inside = token.type == "table_open"
        elif inside and token.type == "tr_open":
            out.append([])
        elif inside and token.type == "inline":
            children = token.children or []
            out[-1].append(("+".join(c.type for c in children),
                            "".join(c.content for c in children)))  # fmt: skip
    return out


SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is missing")


def lay_out(source: str) -> ET.Element:
    """``dot -Tsvg`` of ``source``: it must parse without a word on stderr (a ``:`` read as a
    port warns), and give XML."""
    proc = subprocess.run(
        ["dot", "-Tsvg"], input=source.encode(), capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr.decode()
    return ET.fromstring(proc.stdout)


def svg_nodes(svg: ET.Element) -> dict[str, ET.Element]:
    """The boxes of an SVG by id; an id ``nodeN`` is Graphviz's own, for a node the source never
    declared (an edge's end split at a ``:``, say)."""
    nodes = {g.get("id", ""): g for g in svg.iter(f"{SVG}g") if g.get("class") == "node"}
    assert not [i for i in nodes if re.fullmatch(r"node\d+", i)], sorted(nodes)
    return nodes


def in_svg(text: str, *, breaks: bool) -> str:
    """An id (``breaks=False``) or a tooltip as XML reads it back from the SVG: the characters
    XML cannot hold as control pictures (an id's line breaks and tabs too), a tooltip's tab a
    space (XML reads attribute values so); Graphviz writes a space after a space as U+00A0, so
    both sides compare with U+00A0 read as a space."""
    keep = "\t\n\r" if breaks else ""
    pictured = "".join(chr(0x2400 + ord(c)) if ord(c) < 0x20 and c not in keep else c
                       for c in text)  # fmt: skip
    return pictured.replace("\t", " ").replace("\xa0", " ")


def assert_diagram(report: Report, view: str, fold: bool, pass_: str = "forward") -> None:
    """The report's diagram lays out, every box with its id and its full tooltip."""
    svg = lay_out(to_dot(report, view=view, fold=fold, pass_=pass_))
    boxes = {in_svg(i, breaks=True): box for i, box in svg_nodes(svg).items()}
    graph = build_graph(report, view=view, fold=fold, pass_=pass_)
    for node, data in graph.nodes(data=True):
        link = boxes[in_svg(data["id"], breaks=False)].find(f"{SVG}g/{SVG}a")
        assert link is not None
        tooltip = in_svg(link.get(f"{XLINK}title", ""), breaks=True)
        want = in_svg(node_tooltip(graph, node), breaks=True)
        # Graphviz 2.43 expands a tooltip's escapes twice, so a doubled backslash before N is
        # the node's name again; the source says one backslash (ids, read once, show it so).
        assert tooltip == want or "\\" in want


#: RFC 3986's URI reference, without a fragment: unreserved and sub-delimiter characters, ``:``,
#: ``@``, ``/`` and ``?``, and ``%`` only before two hex digits.
URI_REFERENCE = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")


def assert_uri_reference(uri: str, path: str) -> None:
    """``uri`` is a URI reference that names ``path``: a relative one (no ``:`` in its first
    segment, which would read as a scheme), or a ``file://`` URI for an absolute path."""
    assert URI_REFERENCE.fullmatch(uri), uri
    if Path(path).is_absolute():
        assert uri.startswith("file:///") and unquote(urlparse(uri).path) == Path(path).as_posix()
    else:
        assert ":" not in uri.split("/")[0] and unquote(uri) == Path(path).as_posix(), uri


# -- Hypothesis: hostile names ---------------------------------------------------------------------

PIECES = [
    "|", "\n", "\r", "\r\n", "\t", "\x00", "\x1b[31m", "\x7f", "`", "``", "```",
    "<script>alert(1)</script>", "[x](javascript:alert(1))", "![i](x)", "<http://x>", "\\", '"',
    "'", "#", "%", "%zz", " ", "  ", "*", "**", "_", "~~", "$", "@", "&amp;", "&#32;", "<", ">",
    "://", "www.", "- ", "1. ", "> ", "=", ":", "\\N", "\\l", "{", "}", "é", "名", "\u2028",
    "\u00a0", "\u2003", "😀", "\ufeff",
]  # fmt: skip
_CHARS = st.characters(exclude_categories=("Cs",), exclude_characters=".")
NAME = st.lists(st.sampled_from(PIECES) | st.text(_CHARS, min_size=1, max_size=3),
                min_size=1, max_size=4).map("".join)  # fmt: skip


def _add_module_accepts(name: str) -> bool:
    try:
        nn.Module().add_module(name, nn.Identity())
    except (KeyError, TypeError):
        return False
    return True


MODULE_NAME = NAME.filter(
    lambda n: _add_module_accepts(n) and not re.fullmatch(r"\d+", n) and not n.isdigit()
)
#: type() refuses NUL; the table shows a class's name after its last '.' (its qualname's tail).
CLASS_NAME = NAME.filter(lambda n: "\x00" not in n and "." not in n)
#: A report's model is a name on one line (a saved report with another is refused as damaged).
MODEL_NAME = CLASS_NAME.filter(str.isprintable)
NAMES = st.fixed_dictionaries({
    "zero": MODULE_NAME, "one": MODULE_NAME, "two": MODULE_NAME, "layers": MODULE_NAME,
    "cls": CLASS_NAME, "model": MODEL_NAME,
})  # fmt: skip

FAST = settings(
    max_examples=40,
    deadline=None,  # a loaded 2-core machine must not make it flaky
    derandomize=True,  # a failure in CI reproduces
    suppress_health_check=[HealthCheck.too_slow],
)
#: Each example runs dot three times.
SLOW = settings(FAST, max_examples=12)


def distinct(plain: dict[str, Report], names: dict[str, str]) -> dict[str, Report]:
    """The plain reports renamed, where the names keep every node and module apart."""
    assume(len(set(names.values())) == len(names))
    reports = {key: renamed(report, names) for key, report in plain.items()}
    for key, report in reports.items():
        assume(len({n.name for n in report.nodes}) == len(plain[key].nodes))
    return reports


@FAST
@given(names=NAMES)
def test_markdown_keeps_its_tables_with_any_names(names: dict[str, str]) -> None:
    reports = distinct(plain_reports(), names)
    want = markdown_outputs(plain_reports())
    for fmt, text in markdown_outputs(reports).items():
        assert_same_markdown(text, want[fmt], renamer(names))


@needs_dot
@SLOW
@given(names=NAMES)
def test_dot_lays_out_with_any_names(names: dict[str, str]) -> None:
    reports = distinct(plain_reports(), names)
    assert_diagram(reports["amp"], "modules", True)
    assert_diagram(reports["amp"], "ops", False)
    svg_nodes(lay_out(overview_dot([reports["fp32"], reports["amp"]])))


SEGMENT = st.lists(st.sampled_from([" ", "#", "%", "%41", "?", ":", "@", "[", "]", "\\", "'",
                                    "é", "名", "~", "+", "=", "&", ";"])
                   | st.text(st.characters(exclude_categories=("Cs",),
                                           exclude_characters="/\x00"),
                             min_size=1, max_size=3),
                   min_size=1, max_size=4).map("".join)  # fmt: skip
PATH = st.tuples(st.booleans(), st.lists(SEGMENT.filter(lambda s: s not in (".", "..")),
                                         min_size=1, max_size=3)).map(
    lambda t: ("/" if t[0] else "") + "/".join(t[1])
)  # fmt: skip


@FAST
@given(names=NAMES, path=PATH)
def test_sarif_uris_are_uri_references(names: dict[str, str], path: str) -> None:
    plain = plain_reports()
    report = renamed(plain["amp"], names)
    for rec in report.nodes:
        rec.source = {"file": path, "line": 3}
    doc = json.loads(sarif([report]))
    from_model = json.loads(sarif([renamed(plain["amp"], names)], uri=lambda _model: path))
    for results in (doc["runs"][0]["results"], from_model["runs"][0]["results"]):
        assert results
        for result in results:
            location = result["locations"][0]
            uri = location["physicalLocation"]["artifactLocation"]["uri"]
            assert_uri_reference(uri, path)
    names_in = {r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"]
                for r in doc["runs"][0]["results"]}  # fmt: skip
    assert f"{names['zero']}/linear" in names_in  # JSON strings hold any name


@FAST
@given(names=NAMES)
def test_json_round_trips_with_any_names(names: dict[str, str]) -> None:
    reports = distinct(plain_reports(), names)
    for report in reports.values():
        assert Report.from_json(report.to_json()).to_dict() == report.to_dict()
    findings = json.loads(audit_json([reports["amp"]]))["audits"][0]["findings"]
    assert names["zero"] in {f["module"] for f in findings}
    changes = json.loads(diff_json(diff_reports(reports["fp32"], reports["amp"])))["changes"]
    assert f"{names['one']}.{names['two']}" in {c["module"] for c in changes}


# -- the defects, one by one, on a model analysed with them ----------------------------------------


def test_the_fixed_names_give_the_plain_structure(
    plain: dict[str, Report], hostile: dict[str, Report]
) -> None:
    want = markdown_outputs(plain)
    for fmt, text in markdown_outputs(hostile).items():
        # Texts name graph nodes too, which torch.export names after the modules, made
        # identifiers (p_a_b_c_d_weight): not the renamed tokens' names.
        assert_same_markdown(text, want[fmt], renamer(FIXED), texts=False)


def test_a_pipe_or_a_newline_stays_in_its_cell(hostile: dict[str, Report]) -> None:
    rows = table_cells(markdown_table(hostile["amp"]))
    assert all(len(row) == 6 for row in rows)
    assert ("code_inline", "a|b␊c:d") in [row[0] for row in rows]
    assert rows[1][2:4] == [("text", "fp32"), ("text", "bf16")]  # the next cells are their own
    audit_rows = table_cells(audit_markdown(hostile["amp"]))
    assert all(len(row) == 6 for row in audit_rows)
    assert any("linear in a|b␊c:d" in row[4][1] for row in audit_rows)


def test_a_markdown_link_is_text(hostile: dict[str, Report]) -> None:
    for fmt, text in markdown_outputs(hostile).items():
        kinds = {kind for kind, _ in parsed(text)}
        assert "link_open" not in kinds, fmt
        if fmt != "check":  # which names only the node that disagrees, in another module
            assert "[x](javascript:alert(1))" in "".join(c for _, c in parsed(text)), fmt


def test_html_as_a_class_name_is_text(hostile: dict[str, Report]) -> None:
    text = markdown_table(hostile["amp"])
    assert not {kind for kind, _ in parsed(text)} & {"html_inline", "html_block"}
    assert [row[1] for row in table_cells(text)[1:]] == [("text", FIXED["cls"])] * 4
    assert "\\<script>alert(1)\\</script>" in text


def test_a_backtick_run_stays_in_its_code_span(hostile: dict[str, Report]) -> None:
    first = [row[0] for row in table_cells(markdown_table(hostile["amp"]))]
    assert ("code_inline", f"{FIXED['layers']}.0") in first
    memory = [row[0] for row in table_cells(markdown_train(hostile["train"]))]
    assert ("code_inline", f"{FIXED['layers']}.1") in memory


def test_the_check_names_nodes_and_modules_as_text(hostile: dict[str, Report]) -> None:
    text = check_markdown([hostile["amp"]])
    assert table_cells(text)[1][0] == ("code_inline", FIXED["model"])
    items = [c for kind, c in parsed(text) if kind == "text" and "predicted" in c]
    assert len(items) == 1 and "(aten.linear.default, a|b␊c:d)" in items[0]


@needs_dot
def test_a_trailing_backslash_or_a_colon_in_dot(hostile: dict[str, Report]) -> None:
    source = to_dot(hostile["amp"])
    assert '"module/[x](javascript:alert(1)).tail\\\\"' in source  # the backslash doubled
    for view, fold in (("modules", True), ("modules", False), ("ops", True)):
        assert_diagram(hostile["amp"], view, fold)
    svg_nodes(lay_out(overview_dot([hostile["fp32"], hostile["amp"]])))
    assert_diagram(hostile["train"], "modules", True, pass_="backward")


def test_a_sarif_uri_is_percent_encoded(hostile: dict[str, Report]) -> None:
    assert artifact_uri("my models/a #1 100%.py") == "my%20models/a%20%231%20100%25.py"
    assert artifact_uri("c:d/x.py") == "c%3Ad/x.py"  # not the scheme c:
    assert artifact_uri("/tmp/a b#.py") == "file:///tmp/a%20b%23.py"
    report = Report.from_dict(hostile["amp"].to_dict())  # a copy: the fixture's is shared
    for rec in report.nodes:
        rec.source = {"file": "my models/a #1 100%.py", "line": 7}
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in json.loads(sarif([report]))["runs"][0]["results"]}  # fmt: skip
    assert uris == {"my%20models/a%20%231%20100%25.py"}


def test_the_commands_write_escaped_text(hostile: dict[str, Report], tmp_path: Path) -> None:
    """From saved reports, as a pull request's workflow runs them: no torch, exit 0."""
    fp32, amp = tmp_path / "fp32.json", tmp_path / "amp.json"
    fp32.write_text(hostile["fp32"].to_json())
    amp.write_text(hostile["amp"].to_json())
    runner = CliRunner()
    audit_md = runner.invoke(main, ["audit", "--report", str(amp), "--format", "markdown"])
    assert audit_md.exit_code == 0, audit_md.output
    assert audit_md.stdout.rstrip("\n") == audit_markdown(hostile["amp"])
    diff_md = runner.invoke(main, ["diff", str(fp32), str(amp), "--format", "markdown"])
    assert diff_md.exit_code == 1 and "Error" not in diff_md.output  # 1: the flows differ
    assert "`a\\|b␊c:d`" in diff_md.stdout
    out = tmp_path / "out"
    dot = runner.invoke(main, ["render", "--report", str(amp), "--format", "dot", "-o", str(out)])
    assert dot.exit_code == 0, dot.output
    (written,) = out.glob("*.dot")
    if shutil.which("dot"):
        svg_nodes(lay_out(written.read_text(encoding="utf-8")))


#: What a terminal acts on (issue 35): an OSC 8 link, a screen clear and a C1 CSI in names.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
OSC = {
    **TOKENS, "zero": "\x1b]8;;http://evil\x07click\x1b]8;;\x07", "two": "\x1b[2J\x9b31m",
    "cls": "Lin\x1b]0;title\x07",
}  # fmt: skip


@FAST
@given(names=NAMES)
def test_text_output_never_carries_terminal_controls(names: dict[str, str]) -> None:
    """``audit`` and ``diff`` text and ``summary()`` show a name's escape sequences as
    ``\\xNN``: a module named with an OSC 8 link or a screen clear is text, never run."""
    import tempfile

    reports = distinct(plain_reports(), names)
    with tempfile.TemporaryDirectory() as folder:
        fp32, amp = Path(folder) / "fp32.json", Path(folder) / "amp.json"
        fp32.write_text(reports["fp32"].to_json())
        amp.write_text(reports["amp"].to_json())
        runner = CliRunner()
        for args in (["audit", "--report", str(amp)], ["diff", str(fp32), str(amp)]):
            result = runner.invoke(main, args)
            assert result.exit_code in (0, 1) and "Traceback" not in result.output
            assert not _TERMINAL_CONTROLS.search(result.stdout), args[0]
    for report in reports.values():
        assert not _TERMINAL_CONTROLS.search(repr(report) + report.summary())


def test_table_shows_escape_sequences_in_names(tmp_path: Path, monkeypatch) -> None:
    """``table`` of a model whose module and class names hold terminal escapes, through the
    CLI as a user runs it: the names are there, shown as ``\\xNN``."""
    factory = tmp_path / "osc_model.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n"
        "    m = nn.Sequential()\n"
        f"    m.add_module({OSC['zero']!r}, type({OSC['cls']!r}, (nn.Linear,), {{}})(4, 4))\n"
        f"    m.add_module({OSC['two']!r}, nn.ReLU())\n"
        "    return m, torch.randn(2, 4)\n"
    )
    monkeypatch.setenv("AMPGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(
        main, ["table", "--module", f"{factory}:build", "-s", "amp-fp32", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert not _TERMINAL_CONTROLS.search(result.stdout)
    assert "\\x1b]8;;http://evil\\x07click" in result.stdout
