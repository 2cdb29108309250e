"""The Sphinx extension, built for real: ``sphinx-build`` on small projects in a temporary folder.

Most figures come from a saved report (``:report:``), which needs no torch, so these builds take
a few seconds; one test analyses a model through the cache. The site's own build and the browser
checks are in ``test_docs_site.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is missing")

DATA = Path(__file__).parent / "data"
SRC = Path(__file__).parent.parent / "src"

CONF = 'extensions = ["ampgraph.sphinx", "myst_parser"]\nhtml_theme = "basic"\n'

RST = """\
Figures
=======

.. toctree::

   markdown

.. ampgraph::
   :report: report.json
   :caption: OPT-125M, *amp-fp32*
   :name: fig-opt
   :align: center

.. ampgraph::
   :report: report.json
   :theme: dark
   :alt: the dark one
"""

MYST = """\
# From Markdown

```{ampgraph}
:report: report.json
:view: ops
:theme: light
```
"""


def make_project(folder: Path, pages: dict[str, str], conf: str = CONF) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conf.py").write_text(conf)
    shutil.copy(DATA / "opt-125m-amp-fp32.json", folder / "report.json")
    for name, text in pages.items():
        (folder / name).write_text(text)
    return folder


def build(
    src: Path,
    out: Path,
    *extra: str,
    builder: str = "html",
    cache: Path | None = None,
    quiet: bool = True,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    if cache is not None:
        env["AMPGRAPH_CACHE_DIR"] = str(cache)
    # --no-color: CI runners may force colour on, and the tests read the warnings' text.
    flags = ["--no-color", *(["-q"] if quiet else [])]
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", builder, *flags, *extra, str(src), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def objects(html: str) -> list[tuple[str, str]]:
    """(wrapper classes, SVG path) of each embedded figure, in page order."""
    return re.findall(r'<div class="([^"]*)"><object data="([^"]+)" type="image/svg\+xml"', html)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sphinx")
    src = make_project(root / "src", {"index.rst": RST, "markdown.md": MYST})
    proc = build(src, root / "out", "-W")
    assert proc.returncode == 0, proc.stderr
    return root


def test_auto_theme_draws_light_and_dark_with_theme_classes(built: Path) -> None:
    html = (built / "out" / "index.html").read_text()
    figures = objects(html)
    assert [classes for classes, _ in figures] == [
        "ampgraph ampgraph-light only-light",
        "ampgraph ampgraph-dark only-dark",
        "ampgraph ampgraph-dark",  # :theme: dark -- one figure, always shown
    ]
    light, dark, _ = (built / "out" / path for _, path in figures)
    assert 'fill="#ffffff"' in light.read_text() and 'fill="#0d1117"' in dark.read_text()
    # Caption, name and alignment, as for a figure; alt text and ARIA label on the object.
    assert re.search(r'<figure class="align-center" id="fig-opt">', html)
    assert '<figcaption>\n<p><span class="caption-text">OPT-125M, <em>amp-fp32</em>' in html
    assert 'aria-label="the dark one"' in html
    assert "_static/ampgraph.css" in html and (built / "out/_static/ampgraph.css").exists()


def test_every_figure_opens_full_size(built: Path) -> None:
    """A column scales a wide diagram down until its labels are unreadable: each figure links
    to its own SVG, which a browser shows at its natural size."""
    html = (built / "out" / "index.html").read_text()
    links = re.findall(r'<a class="ampgraph-full" href="([^"]+)" target="_blank"', html)
    assert links == [path for _, path in objects(html)]
    assert all((built / "out" / link).is_file() for link in links)


def test_myst_markdown_draws_too(built: Path) -> None:
    (figure,) = objects((built / "out" / "markdown.html").read_text())
    svg = (built / "out" / figure[1]).read_text()
    assert figure[0] == "ampgraph ampgraph-light"
    assert "op view (every ATen node)" in svg


def test_svg_files_are_accessible_and_carry_tooltips(built: Path) -> None:
    svgs = sorted((built / "out" / "_images").glob("ampgraph-*.svg"))
    # light, dark, ops view: the `:theme: dark` figure is the same drawing as the auto one, one file
    assert len(svgs) == 3
    for path in svgs:
        root = ET.fromstring(path.read_bytes())
        assert root.get("role") == "img"
        assert root[0].tag.endswith("title") and root[1].tag.endswith("desc")
        assert path.read_text().count("xlink:title=") > 10


def test_rebuilds_write_identical_files(built: Path) -> None:
    again = build(built / "src", built / "again")
    assert again.returncode == 0, again.stderr
    first = {p.name: p.read_bytes() for p in (built / "out" / "_images").iterdir()}
    second = {p.name: p.read_bytes() for p in (built / "again" / "_images").iterdir()}
    assert first == second
    # An incremental build of an unchanged project re-reads and rewrites nothing.
    mtimes = {p: p.stat().st_mtime_ns for p in (built / "out" / "_images").iterdir()}
    quiet = build(built / "src", built / "out", quiet=False)
    assert "0 added, 0 changed, 0 removed" in quiet.stdout
    assert {p: p.stat().st_mtime_ns for p in (built / "out" / "_images").iterdir()} == mtimes


def test_parallel_build_gives_the_same_site(built: Path) -> None:
    parallel = build(built / "src", built / "parallel", "-j", "2", "-W")
    assert parallel.returncode == 0, parallel.stderr
    for name in ("index.html", "markdown.html"):
        assert objects((built / "parallel" / name).read_text()) == objects(
            (built / "out" / name).read_text()
        )


def test_a_model_that_fails_is_one_warning_not_a_crash(tmp_path: Path) -> None:
    page = (
        "Broken\n======\n\n.. ampgraph:: no-such-model\n\n.. ampgraph::\n   :report: report.json\n"
    )
    src = make_project(tmp_path / "src", {"index.rst": page})
    proc = build(src, tmp_path / "out", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1
    assert re.match(
        r".*index\.rst:4: WARNING: ampgraph could not draw no-such-model: unknown model "
        r"'no-such-model': use a bundled name .*\[ampgraph\.analysis\]$",
        warnings[0],
    )
    assert "Traceback" not in proc.stderr
    assert len(objects((tmp_path / "out" / "index.html").read_text())) == 2  # the other figure
    # Under -W the warning fails the build, as any warning does.
    assert build(src, tmp_path / "strict", "-W", cache=tmp_path / "cache").returncode != 0


def test_print_formats_get_the_light_figure_only(built: Path) -> None:
    text = build(built / "src", built / "text", builder="text")
    assert text.returncode == 0, text.stderr
    page = re.sub(r"\s+", " ", (built / "text" / "index.txt").read_text())
    # The auto figure's light half; neither its dark half nor the :theme: dark figure.
    assert page.count("[graph:") == 1
    assert "[graph: opt-125m — amp-fp32: autocast cuda bf16, parameters fp32" in page
    assert "the dark one" not in page


@pytest.mark.slow
def test_a_model_is_analysed_once_then_read_from_the_cache(tmp_path: Path) -> None:
    page = "Model\n=====\n\n.. ampgraph:: llama-tiny\n   :setting: amp-fp32\n   :no-check:\n"
    src = make_project(tmp_path / "src", {"index.rst": page})
    cache = tmp_path / "cache"
    first = build(src, tmp_path / "out", "-W", cache=cache)
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in cache.rglob("*.json"))
    assert len(entries) == 1
    (light, _dark) = objects((tmp_path / "out" / "index.html").read_text())
    svg = (tmp_path / "out" / light[1]).read_text()
    assert "llama-tiny — amp-fp32" in svg and 'id="module/model.layers.0.self_attn.q_proj"' in svg
    # A fresh build (-E: every page re-read) draws the same figure from the cache.
    second = build(src, tmp_path / "again", "-E", "-W", cache=cache)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "again" / light[1]).read_text() == svg
    assert sorted(p.name for p in cache.rglob("*.json")) == entries


def test_pass_backward_draws_the_backward_of_a_saved_report(tmp_path: Path) -> None:
    """``:pass: backward`` draws the gradients and the saved-memory panel (issue 12)."""
    from tests.test_render_backward import small_backward_report

    page = "Backward\n========\n\n.. ampgraph::\n   :report: backward.json\n   :pass: backward\n"
    src = make_project(tmp_path / "src", {"index.rst": page})
    (src / "backward.json").write_text(small_backward_report().to_json(), encoding="utf-8")
    proc = build(src, tmp_path / "out", "-W")
    assert proc.returncode == 0, proc.stderr
    found = objects((tmp_path / "out" / "index.html").read_text())
    assert len(found) == 2  # light and dark
    svg = (tmp_path / "out" / found[0][1]).read_text()
    assert "backward of 2" in svg and "saved for backward" in svg and 'id="input/loss"' in svg


# -- :recipe: a framework's precision flag, read as --recipe reads it (issue 26) ----------------


def test_recipe_picks_its_setting_and_describes_what_it_runs(tmp_path: Path) -> None:
    """``:recipe:`` goes through :func:`ampgraph.recipes.parse_recipe`, as ``--recipe`` does:
    the figure is the recipe's setting, and ``:describe:`` puts the recipe's lines under it, in
    one block with the figure (so a grid of two keeps each text under its own figure)."""
    from ampgraph.recipes import parse_recipe

    recipe = parse_recipe("lightning:bf16-mixed")
    page = (
        "Recipe\n======\n\n.. ampgraph::\n   :report: report.json\n"
        "   :recipe: lightning:bf16-mixed\n   :describe:\n   :caption: Lightning\n"
    )
    src = make_project(tmp_path / "src", {"index.rst": page})
    proc = build(src, tmp_path / "out", "-W")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "out" / "index.html").read_text()
    assert recipe.setting.name == "amp-fp32" and len(objects(html)) == 2  # light and dark
    described = html.index('<div class="ampgraph-described docutils container">')
    figure, text = html.index("<figure", described), html.index("ampgraph-recipe", described)
    assert figure < text
    first = recipe.describe().splitlines()[0].replace("->", "-&gt;")
    assert first in html and "proved: ran Trainer" in html


def test_a_deepspeed_config_is_read_next_to_the_document(tmp_path: Path) -> None:
    """``deepspeed:ds.json`` is found relative to the document, as a config model is, and the
    description names it as the document does, not by the build machine's folders."""
    import json

    from ampgraph.recipes import parse_recipe

    src = make_project(tmp_path / "src", {"index.rst": "Top\n===\n\n.. toctree::\n\n   sub/page\n"})
    (src / "sub").mkdir()
    (src / "sub" / "ds.json").write_text(json.dumps({"bf16": {"enabled": True}}))
    # A saved report in the setting the config maps to (the drawing is not what is tested).
    report = json.loads((src / "report.json").read_text())
    report["setting"] = parse_recipe("deepspeed:bf16").setting.to_dict()
    (src / "sub" / "report.json").write_text(json.dumps(report))
    page = "# DeepSpeed\n\n```{ampgraph}\n:report: report.json\n:recipe: deepspeed:ds.json\n:describe:\n```\n"
    (src / "sub" / "page.md").write_text(page)
    proc = build(src, tmp_path / "out", "-W")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "out" / "sub" / "page.html").read_text()
    assert len(objects(html)) == 2
    assert "recipe deepspeed:ds.json on cuda -&gt; setting half" in html
    assert str(src) not in html


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (":recipe: nonsense:x", "malformed recipe 'nonsense:x': write FAMILY:VALUE"),
        (":recipe: hf:bf16\n   :setting: amp-fp32", "give :setting: or :recipe:, not both"),
        (":recipe: hf:bf16\n   :amp-dtype: fp16", "a recipe fixes its 16-bit dtype"),
        (":describe:", ":describe: describes a :recipe:"),
        (":recipe: deepspeed:missing.json", "cannot read the DeepSpeed config missing.json"),
    ],
)
def test_a_wrong_recipe_is_one_warning(tmp_path: Path, options: str, says: str) -> None:
    page = f"Recipe\n======\n\n.. ampgraph::\n   :report: report.json\n   {options}\n"
    src = make_project(tmp_path / "src", {"index.rst": page})
    proc = build(src, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert "ampgraph could not draw" in warning and says in warning, warning
    assert objects((tmp_path / "out" / "index.html").read_text()) == []


BLOCK = """\
import torch
from torch import nn


def tiny():
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.LayerNorm(8)), torch.zeros(2, 3, dtype=torch.long)
"""


@pytest.mark.slow
def test_a_factory_next_to_the_document_under_two_recipes(tmp_path: Path) -> None:
    """``block.py:tiny`` is found relative to the document, its figure is titled as the
    document writes it, and two recipes draw two settings (the docs' recipe pages)."""
    from ampgraph.recipes import parse_recipe

    src = make_project(tmp_path / "src", {"index.rst": "Top\n===\n\n.. toctree::\n\n   sub/page\n"})
    (src / "sub").mkdir()
    (src / "sub" / "block.py").write_text(BLOCK)
    pair = "fsdp2:param_dtype=bf16,reduce_dtype=fp32", "accelerate:bf16"
    page = "# Pair\n\n" + "".join(
        f"```{{ampgraph}} block.py:tiny\n:recipe: {r}\n:no-check:\n```\n\n" for r in pair
    )
    (src / "sub" / "page.md").write_text(page)
    proc = build(src, tmp_path / "out", "-W", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    figures = objects((tmp_path / "out" / "sub" / "page.html").read_text())
    assert len(figures) == 4  # two recipes, light and dark
    svgs = [(tmp_path / "out" / "sub" / path).resolve().read_text() for _, path in figures[::2]]
    for recipe, svg in zip(pair, svgs, strict=True):
        name = parse_recipe(recipe).setting.name
        assert f"block.py:tiny — {name}" in svg, name
        assert str(src) not in svg
    assert "bf16 → bf16" in svgs[0] and "fp32 → bf16" in svgs[1]  # the Linear, in each


def test_device_takes_every_device_the_command_line_takes(tmp_path: Path) -> None:
    """``:device: mps`` as ``--device mps``: on a torch built without it, the prediction from
    MPS's lists, captioned with the device (the directive once took cuda and cpu only)."""
    page = (
        "Device\n======\n\n.. ampgraph:: llama-tiny\n   :setting: amp-fp32\n"
        "   :device: mps\n   :no-check:\n   :theme: light\n"
    )
    src = make_project(tmp_path / "src", {"index.rst": page})
    proc = build(src, tmp_path / "out", "-W", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    ((_, svg),) = objects((tmp_path / "out" / "index.html").read_text())
    assert "autocast mps bf16" in (tmp_path / "out" / svg).read_text()
