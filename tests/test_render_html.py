"""The interactive page (``render --format html``) in a real headless Chromium, opened from a file
as a reader would: the graph is drawn, search finds a node, a click shows its annotation as the
report has it, settings switch with their differences marked, keys work, and a module named
``</script><img ...>`` shows as text and runs nothing."""

from __future__ import annotations

import functools
import re
import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph.cli import main
from ampgraph.pipeline.stages import analyze
from ampgraph.render import render_files
from ampgraph.render.html import html_page, script_json
from ampgraph.render.page_data import node_records, signature
from ampgraph.report.records import Report

from .browser import Browser

#: A module name that would end the data's script element and run code, were it pasted as HTML.
HOSTILE = '</script><img src=x onerror="pwned=1">'


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(HOSTILE, nn.Linear(4, 4))
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self._modules[HOSTILE](x)  # a residual add: bf16 + fp32 promotes under autocast
        for layer in self.layers:
            h = layer(h)
        return h.sum()


@functools.cache
def reports() -> tuple[Report, Report]:
    """amp-fp32 and fp32 training steps (gradient dtypes in the page) of the model above."""
    args = (torch.randn(3, 4),)
    amp = analyze(_Block(), "amp-fp32", args=args, check=False, pass_="train")
    fp32 = analyze(_Block(), "fp32", args=args, check=False, pass_="train")
    return amp, fp32


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page") / "page.html"
    path.write_text(html_page(list(reports())), encoding="utf-8")
    return path


def opened(browser: Browser, page: Path) -> None:
    browser.open(page.as_uri())
    deadline = time.monotonic() + 60  # a loaded machine's Chromium takes its time
    while not browser.evaluate("!!(window.ampgraph && window.ampgraph.firstPaint)"):
        assert time.monotonic() < deadline, "the page never painted"
        time.sleep(0.05)


def panel(browser: Browser) -> str:
    return browser.evaluate("document.getElementById('details').textContent")


def key(browser: Browser, name: str, text: str = "") -> None:
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", session=True, type=kind, key=name, text=text,
                     code=name, windowsVirtualKeyCode=13 if name == "Enter" else 0)  # fmt: skip


def click(browser: Browser, x: float, y: float) -> None:
    for kind in ("mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,
                     button="left", buttons=1, clickCount=1)  # fmt: skip


def test_the_data_cannot_end_its_script_element() -> None:
    text = html_page([reports()[0]])
    assert HOSTILE not in text and "</script><img" not in text
    data = text.split('id="ampgraph-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["settings"][0]["nodes"] == json.loads(script_json(
        node_records(reports()[0])))  # fmt: skip
    assert "http://" not in text and "https://" not in text  # nothing to fetch


def test_the_page_draws_the_graph_offline_and_runs_no_injected_code(
    browser: Browser, page: Path
) -> None:
    opened(browser, page)
    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert errors == []
    # Pixels that are not the background: boxes, labels and edges were drawn.
    inked = browser.evaluate("""(() => {
        const c = document.getElementById('graph'), d = c.getContext('2d')
          .getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let k = 0; k < d.length; k += 4) if (d[k] < 240 || d[k+2] < 240) n++;
        return n; })()""")
    assert inked > 5000
    assert browser.evaluate("performance.getEntriesByType('resource').length") == 0
    assert browser.evaluate("typeof pwned === 'undefined' && document.images.length === 0")


def test_search_finds_a_node_by_module_path_and_shows_it(browser: Browser, page: Path) -> None:
    opened(browser, page)
    browser.evaluate("document.getElementById('search').focus()")
    browser.send("Input.insertText", session=True, text="onerror")
    found = browser.evaluate("document.getElementById('results').innerText")
    amp = reports()[0]
    inside = [r for r in amp.nodes if r.module == HOSTILE or (r.target or "").startswith(HOSTILE)]
    assert amp.backward is not None  # and the backward of each, shown in the module's mirror
    behind = [r for r in amp.backward.nodes if r.forward in {n.name for n in inside}]
    assert found.count(HOSTILE) == len(inside) + len(behind) > 0  # as text, in every result
    key(browser, "Enter")
    shown = panel(browser)
    assert HOSTILE in shown and inside[0].name in shown
    assert browser.evaluate("typeof pwned === 'undefined' && document.images.length === 0")


def test_a_click_shows_the_nodes_annotation(browser: Browser, page: Path) -> None:
    opened(browser, page)
    amp = reports()[0]
    linear = next(r for r in amp.nodes if r.op == "aten.linear.default" and r.module == HOSTILE)
    browser.evaluate(f"window.ampgraph.open({json.dumps(HOSTILE)})")
    box = browser.evaluate(f"window.ampgraph.boxOf({json.dumps(linear.name)})")
    click(browser, box["x"], box["y"])
    shown = panel(browser)
    record = next(n for n in node_records(amp) if n["name"] == linear.name)
    assert record["policy"] == "lower_precision_fp" and record["policy"] in shown
    assert linear.reason in shown
    for cast in record["casts"]:  # each cast with the bytes its shape gives
        assert f"{cast['node']}: {cast['from']} → {cast['to']}, {cast['bytes']} B" in shown
    assert record["casts"] and all(c["bytes"] for c in record["casts"])
    # The dtypes the backward of this node produces, as the training step recorded them.
    assert amp.backward is not None
    grads = dict.fromkeys(d for r in amp.backward.nodes if r.forward == linear.name
                          for d in r.outputs if d)  # fmt: skip
    assert "bfloat16" in grads
    assert f"gradient dtype{', '.join(grads)}" in shown
    # The add that promotes is marked so in its annotation.
    add = next(r for r in amp.nodes if r.promotion)
    browser.evaluate("document.getElementById('search').value = ''")
    box = browser.evaluate(f"window.ampgraph.boxOf({json.dumps(add.name)})")
    click(browser, box["x"], box["y"])
    assert f"promotion{' + '.join(add.promotion['inputs'])} → {add.promotion['to']}" in panel(
        browser
    )


def test_settings_switch_with_their_differences_marked(browser: Browser, page: Path) -> None:
    opened(browser, page)
    amp, fp32 = reports()
    theirs = {r["name"]: signature(r) for r in node_records(fp32)}
    differ = [r for r in node_records(amp) if theirs.get(r["name"]) != signature(r)]
    assert browser.evaluate("window.ampgraph.changed()") == len(differ) > 0
    browser.evaluate("document.getElementById('graph').focus()")
    key(browser, "2", "2")  # the second setting, compared with itself: nothing differs
    assert browser.evaluate("document.getElementById('setting').value") == "1"
    assert browser.evaluate("window.ampgraph.changed()") == 0


def test_keys_move_and_unfold(browser: Browser, page: Path) -> None:
    opened(browser, page)
    browser.evaluate("document.getElementById('graph').focus()")
    before = browser.evaluate("window.ampgraph.rows()")
    for _ in range(before):  # down to the first folded group
        key(browser, "ArrowDown")
        at = browser.evaluate("window.ampgraph.selected()")
        if "group" in at and not at["open"]:
            break
    else:
        pytest.fail("no folded group to unfold")
    key(browser, "ArrowRight")
    assert browser.evaluate("window.ampgraph.rows()") > before
    key(browser, "ArrowLeft")
    assert browser.evaluate("window.ampgraph.rows()") == before


def test_render_writes_one_page_for_all_settings(tmp_path: Path) -> None:
    paths = render_files(list(reports()), tmp_path, formats=("html",))
    assert [p.suffix for p in paths] == [".html"]
    assert paths[0].read_text(encoding="utf-8") == html_page(list(reports()))
    report = tmp_path / "r.json"
    report.write_text(reports()[0].to_json(), encoding="utf-8")
    result = CliRunner().invoke(
        main, ["render", "--report", str(report), "--format", "html", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(".html")


# -- in the documentation: the directive's :interactive: -------------------------------------


DOC = """\
Figures
=======

.. ampgraph::
   :report: report.json
   :theme: light
   :interactive: embed

.. ampgraph::
   :report: report.json
   :interactive: link
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    from .test_sphinx import build, make_project

    root = tmp_path_factory.mktemp("site")
    src = make_project(root / "src", {"index.rst": DOC})
    proc = build(src, root / "out", "-W")
    assert proc.returncode == 0, proc.stderr
    return root / "out"


def test_the_directive_links_and_embeds_the_page(site: Path) -> None:
    html = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class="ampgraph-interactive" href="([^"]+)"', html)
    # One per figure: the embedded light one, and the linked light and dark ones (one page).
    assert len(links) == 3 and links[1] == links[2]
    assert html.count('<iframe src="') == 1
    for href in set(links):
        page = (site / href).read_text(encoding="utf-8")
        assert 'id="ampgraph-data"' in page and "opt-125m" in page


@pytest.mark.parametrize("scripts", [True, False])
def test_the_embedded_page_stands_in_for_the_svg_where_scripts_run(
    browser: Browser, site: Path, scripts: bool
) -> None:
    from .browser import serve

    with serve(site) as base:
        browser.send("Emulation.setScriptExecutionDisabled", session=True, value=not scripts)
        try:
            browser.open(f"{base}/index.html")
            state = browser.evaluate("""(() => {
                const d = document.querySelector('.ampgraph-page').parentNode;
                const shown = e => e.getClientRects().length > 0;
                return [shown(d.querySelector('iframe')), shown(d.querySelector('object'))]; })()""")
        finally:
            browser.send("Emulation.setScriptExecutionDisabled", session=True, value=False)
    assert state == ([True, False] if scripts else [False, True])


def test_a_click_shows_the_headroom_ranges_measured(browser: Browser, tmp_path: Path) -> None:
    """``ranges --overlay`` writes the page too: a node's annotation has its headroom."""
    from ampgraph.render.range_overlay import write_page

    from .test_ranges import _result

    result = _result("tower", ("amp-fp32",), "fp16")
    page = write_page(result, tmp_path)
    assert page.name == "tower-ranges.html"
    rooms = result.settings[0].headroom
    name, room = min(rooms.items(), key=lambda item: item[1])  # the one that overflows
    assert room < 0
    opened(browser, page)
    # Search for it, as a reader would (the first match in execution order is the node
    # itself: a longer name holding it, add_10 for add_1, comes later), and read its annotation.
    browser.evaluate("document.getElementById('search').focus()")
    browser.send("Input.insertText", session=True, text=name)
    key(browser, "Enter")
    shown = panel(browser)
    assert f"node{name}" in shown and f"value-range headroom{room:+.2f} decades" in shown
