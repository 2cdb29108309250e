"""Sphinx configuration of ampgraph's documentation site (``make docs``).

Built from the sources in this repository: the pages in this folder (MyST Markdown), the CLI
reference from the click commands (sphinx-click), the API reference from docstrings (autodoc),
the op reference from ``ampgraph policy`` and the gallery from the bundled models, each figure
drawn during the build by ampgraph's own directive (:mod:`ampgraph.docs.directive`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# Document this checkout's code, also when another ampgraph is installed.
sys.path.insert(0, str(ROOT / "src"))

import ampgraph

project = "ampgraph"
author = "the ampgraph authors"
copyright = "the ampgraph authors"
release = version = ampgraph.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "ampgraph.sphinx",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# autocast-ops.md is the committed output of `ampgraph policy --format markdown` for readers of
# the repository; the site draws ops.md from the installed torch instead.
exclude_patterns = ["_build", "figures", "verification/*-record-*", "README.md", "autocast-ops.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"ampgraph {release}"
html_theme_options = {"navigation_with_keys": True}
# Builds are reproducible: no build date in the footer, no "last updated" stamps.
html_last_updated_fmt = None
html_show_sphinx = False
html_static_path = ["_static"]
html_css_files = ["tables.css"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

# The figures: the dispatcher check runs (each caption says so), workers as many as cores.
ampgraph_check = True


# -- pages generated from the code -----------------------------------------------------------

GENERATED = DOCS / "_generated"


def write_if_changed(path: Path, text: str) -> None:
    """Leave unchanged pages untouched, so an incremental build re-reads nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def gallery_pages() -> None:
    """One page per bundled model (``ampgraph models``), each with its four-setting figure."""
    from ampgraph.model.build import DEFAULT_MODEL, catalogue

    folder = GENERATED / "gallery"
    wanted = set()
    for entry in catalogue():
        wanted.add(f"{entry.name}.md")
        default = " (the default model)" if entry.name == DEFAULT_MODEL else ""
        write_if_changed(
            folder / f"{entry.name}.md",
            f"# {entry.name}\n\n"
            f"`{entry.architecture}`, {entry.layers} layers, {entry.params_text} parameters, "
            f"shaped like {entry.origin}{default}. Built from its bundled config on the meta "
            "device: no download, no weights.\n\n"
            f"```{{ampgraph}} {entry.name}\n"
            f":caption: {entry.name} in the seed's four settings (autocast off / on × "
            "parameters fp32 / bf16, CUDA policy). Hover a box for its full record.\n"
            f":name: gallery-{entry.name}\n"
            ":interactive: link\n"
            "```\n\n"
            f"Draw it yourself: `ampgraph render {entry.name}` (one SVG per setting and this "
            f"overview), or `ampgraph table {entry.name} -s amp-fp32` for the hook lines. "
            "*Open interactive* under the figure opens every node of the four settings in one "
            f"page ([exploring a big model](../../explore.md)); `ampgraph render {entry.name} "
            "--format html` writes it.\n",
        )
    for stale in folder.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()


OPS_INTRO = """Every op with an autocast policy in the installed torch, per device type, as
`ampgraph policy --format markdown` prints it while this site builds: read from the dispatcher's
own registrations and compared with ampgraph's bundled tables (a difference is listed, never
hidden). PyTorch's published "Autocast Op Reference" lags the code (it omits
`scaled_dot_product_attention`, `einsum`, the upsampling ops, `logsumexp` and more); this page
cannot, because it is generated from the dispatcher of the torch the site was built with."""


def policy_page() -> None:
    """The op reference: ``ampgraph policy --format markdown`` for the installed torch."""
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run(
        [sys.executable, "-m", "ampgraph", "policy", "--format", "markdown"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ampgraph policy failed: {proc.stderr.strip().splitlines()[-1:]}")
    # The page is the command's output, with why it exists after the title.
    title, _, rest = proc.stdout.partition("\n")
    body = f"{title}\n\n{OPS_INTRO}\n{rest}"
    write_if_changed(GENERATED / "policy.md", body)


def report_example() -> None:
    """An ``ampgraph.report`` to show on the schema page: ``nn.Linear(16, 16)`` in amp-fp32,
    analysed now, its node records cut to the one that casts."""
    import json

    import torch

    from ampgraph import analyze

    report = analyze(torch.nn.Linear(16, 16), "amp-fp32", args=(torch.randn(1, 16),))
    data = report.to_dict()
    data["nodes"] = [n for n in data["nodes"] if n["casts"]]
    write_if_changed(GENERATED / "report-example.json", json.dumps(data, indent=1) + "\n")


gallery_pages()
policy_page()
report_example()


# -- the CLI reference: click's help, read as reStructuredText ----------------------------------

#: ``--option`` in prose (with an ``=value``): an inline literal, so that Sphinx's smart quotes
#: do not turn its two hyphens into an en dash and readers see what they type.
CLI_OPTION = re.compile(r"(?<![\w`-])(--[a-z][\w-]*(?:=[^\s)\]'\",;]+)?)")


def cli_lines(lines: list[str]) -> None:
    """Rewrite a command's help (sphinx-click's lines, in place) for reading as a reference.

    click's ``\\b`` blocks arrive as reST line blocks (``| ...``). One headed ``Examples:``
    becomes that heading and a ``console`` code block, as a terminal shows them; other line
    blocks stay line blocks. Options named in prose become inline literals (:data:`CLI_OPTION`).
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "| Examples:":
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            i += 1
            while i < len(lines) and lines[i].lstrip().startswith("| "):
                block.append(lines[i].lstrip()[2:])
                i += 1
            out += [f"{indent}Examples:", "", f"{indent}.. code-block:: console", ""]
            out += [f"{indent}   {example}" for example in block]
            out.append("")
            continue
        if not line.lstrip().startswith(".. "):
            line = CLI_OPTION.sub(r"``\1``", line)
        out.append(line)
        i += 1
    lines[:] = out


def setup(app: Any) -> None:
    for event in ("description", "options", "arguments", "epilog"):
        app.connect(f"sphinx-click-process-{event}", lambda _app, _ctx, lines: cli_lines(lines))
