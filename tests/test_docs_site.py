"""The documentation site, built and opened in a real headless Chromium, light and dark.

``make docs`` builds ``docs/_build/html`` with warnings as errors; the fixture here runs the same
build (incremental: after ``make docs`` it has nothing to do) and then looks at the gallery as
a reader's browser shows it: for every bundled model, the figure the page's colour scheme picks
is displayed (the other hidden), is painted (not blank), holds the boxes the analysis has, and
every box and edge has its tooltip. Screenshots are written to ``docs/_build/screenshots``.

Chromium comes from Debian's ``chromium`` package (``make test`` installs it when root); without
it these tests skip, unless ``AMPGRAPH_REQUIRE_BROWSER=1`` (set by ``make test``) makes that a
failure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .browser import Browser, serve

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HTML = DOCS / "_build" / "html"
SHOTS = DOCS / "_build" / "screenshots"

pytestmark = pytest.mark.slow

#: The pages of docs/recipes/, one per framework (docs/recipes.md's toctree).
RECIPE_FAMILIES = ("accelerate", "lightning", "fsdp2", "fsdp1", "deepspeed")

#: Everything the test wants to know about each figure on a page, from inside the browser.
INSPECT = r"""
(async () => {
  const XLINK = 'http://www.w3.org/1999/xlink';
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  const out = [];
  for (const div of document.querySelectorAll('div.ampgraph')) {
    const obj = div.querySelector('object');
    const rect = obj.getBoundingClientRect();
    const rec = {classes: div.className, shown: getComputedStyle(div).display !== 'none',
                 width: rect.width, height: rect.height, src: obj.data};
    out.push(rec);
    if (!rec.shown) continue;
    let svg = null;
    for (let i = 0; i < 400 && !svg; i++) {
      svg = obj.contentDocument && obj.contentDocument.querySelector('svg');
      if (!svg) await wait(50);
    }
    if (!svg) continue;
    const tip = (g) => { const a = g.querySelector('a'); return a ? a.getAttributeNS(XLINK, 'title') : null; };
    const boxes = [...svg.querySelectorAll('g.node')].filter(
      (g) => /^(?:[^/]+\/)?(?:module|op|region|input|output)\//.test(g.id) && !g.id.endsWith('/caption'));
    const edges = [...svg.querySelectorAll('g.edge')];
    rec.boxes = boxes.length;
    rec.boxTips = boxes.filter((g) => tip(g)).length;
    rec.edges = edges.length;
    rec.edgeTips = edges.filter((g) => tip(g)).length;
    rec.background = svg.querySelector('g.graph > polygon').getAttribute('fill');
    rec.title = (svg.querySelector(':scope > title') || {}).textContent;
    rec.desc = (svg.querySelector(':scope > desc') || {}).textContent;
    // Paint the SVG as the browser renders it and count the pixels that are not background.
    const img = new Image();
    img.src = obj.data;
    await img.decode();
    const scale = Math.min(1, 1600 / Math.max(img.naturalWidth, img.naturalHeight));
    const canvas = document.createElement('canvas');
    canvas.width = Math.max(1, Math.round(img.naturalWidth * scale));
    canvas.height = Math.max(1, Math.round(img.naturalHeight * scale));
    const ctx = canvas.getContext('2d');
    ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    const [r0, g0, b0] = [data[0], data[1], data[2]];
    let ink = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (Math.abs(data[i] - r0) + Math.abs(data[i + 1] - g0) + Math.abs(data[i + 2] - b0) > 60) ink++;
    }
    rec.ink = ink / (canvas.width * canvas.height);
  }
  return out;
})()
"""


@pytest.fixture(scope="module")
def site() -> Path:
    """The site, built as ``make docs`` builds it (an up-to-date build is a no-op)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-j", "auto", "-W", "--keep-going", "-q", "-b", "html",
         str(DOCS), str(HTML)],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return HTML


def gallery_models() -> list[str]:
    from ampgraph.model.build import catalogue

    return [entry.name for entry in catalogue()]


def expected_boxes(model: str) -> int:
    """How many boxes the model's four-setting overview draws: from the analysis itself."""
    from ampgraph.docs.directive import analysis_reports
    from ampgraph.render import build_graph

    reports = analysis_reports(
        model, [], device="cuda", amp_dtype="bf16", seq_len=8, check=True, workers=None
    )
    assert len(reports) == 4
    return sum(build_graph(r).number_of_nodes() for r in reports)


def look(browser: Browser, url: str, *, dark: bool, shot: str) -> list[dict[str, Any]]:
    browser.open(url, dark=dark)
    figures = browser.evaluate(INSPECT)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(SHOTS / f"{shot}-{'dark' if dark else 'light'}.png")
    return figures


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_gallery_figures_render_with_their_boxes_and_tooltips(
    site: Path, browser: Browser, dark: bool
) -> None:
    theme, background = ("dark", "#0d1117") if dark else ("light", "#ffffff")
    models = gallery_models()
    assert "opt-125m" in models and "llama-3-70b" in models
    with serve(site) as base:
        for model in models:
            figures = look(
                browser, f"{base}/_generated/gallery/{model}.html", dark=dark, shot=model
            )
            shown = [f for f in figures if f["shown"]]
            hidden = [f for f in figures if not f["shown"]]
            assert len(figures) == 2 and len(shown) == 1, (model, figures)
            (fig,) = shown
            assert f"ampgraph-{theme}" in fig["classes"] and f"only-{theme}" in fig["classes"]
            assert hidden[0]["width"] == 0
            assert fig["width"] > 300 and fig["height"] > 300, (model, fig)
            assert fig["background"] == background, (model, fig)
            assert fig["ink"] > 0.02, f"{model}: the {theme} figure is blank ({fig['ink']:.3f})"
            assert fig["boxes"] == expected_boxes(model), (model, fig)
            assert fig["boxTips"] == fig["boxes"] and fig["edgeTips"] == fig["edges"] > 0
            assert fig["title"].startswith(f"{model} — ")
            assert "Each box and edge has a tooltip" in fig["desc"]


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_guide_pages_show_one_figure_per_directive(
    site: Path, browser: Browser, dark: bool
) -> None:
    with serve(site) as base:
        pages = [("index", 1), ("reading-diagrams", 2), ("opt-125m-settings", 4)]
        # One page per recipe family: a small model under two recipes, side by side.
        pages += [(f"recipes/{family}", 2) for family in RECIPE_FAMILIES]
        for page, count in pages:
            figures = look(browser, f"{base}/{page}.html", dark=dark, shot=page.replace("/", "-"))
            shown = [f for f in figures if f["shown"]]
            assert len(figures) == 2 * count and len(shown) == count, (page, figures)
            assert all(f["ink"] > 0.02 and f["boxes"] > 5 for f in shown), (page, shown)


def test_reference_pages_are_generated(site: Path) -> None:
    cli = (site / "cli.html").read_text()
    for command in ("table", "check", "render", "verify", "models", "cache"):
        assert f'id="ampgraph-{command}"' in cli, command
    api = (site / "api.html").read_text()
    assert 'id="ampgraph.render.dot.to_dot"' in api and 'id="ampgraph.docs.directive.setup"' in api
    schema = (site / "schema.html").read_text()
    assert "lower_precision_fp" in schema and "aten.linear.default" in schema


#: What a reader of the CLI reference sees, from inside the browser.
CLI_TEXT = r"""
(() => ({
  text: document.querySelector('article').innerText,
  options: document.querySelectorAll('dl.std.option').length,
  examples: [...document.querySelectorAll('div.highlight-console pre')].map((p) => p.innerText),
}))()
"""


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_cli_reference_reads_as_a_reference(site: Path, browser: Browser, dark: bool) -> None:
    """sphinx-click's reStructuredText must be read as reStructuredText: inside a Markdown page
    its directives showed as raw text and ``--`` as an en dash."""
    with serve(site) as base:
        browser.open(f"{base}/cli.html", dark=dark)
        page = browser.evaluate(CLI_TEXT)
        SHOTS.mkdir(parents=True, exist_ok=True)
        browser.screenshot(SHOTS / f"cli-{'dark' if dark else 'light'}.png")
    for raw in (".. option::", ".. program::", ".. click::", "\n| "):
        assert raw not in page["text"], raw
    assert "\u2013only" not in page["text"] and "\u2013format" not in page["text"]
    assert page["options"] > 50  # every option a definition-list entry
    assert any("ampgraph table -s amp-fp32 --only Linear,LayerNorm,Embedding" in example
               for example in page["examples"])  # fmt: skip
