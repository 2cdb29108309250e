#!/usr/bin/env python3
"""The interactive page's speed (issue 45): Llama-3-70B's bundled shape, every node, in a real
headless Chromium opened from a file, as a reader would.

The report is a training step in two settings (``ampgraph table llama-3-70b -s amp-fp32 -s
amp-half --pass train --format json``: the forward, its backward and the gradients, tens of
thousands of nodes), or ``--report FILE``. The page is written with
:func:`ampgraph.render.html.html_page` and opened ``--runs`` times in a fresh tab; each run
measures:

* ``first paint``: from the navigation's start (the file read, the JSON parsed, the tree built)
  to the first frame drawn;
* ``expand a layer``: a click's work on a folded layer (``model.layers.17``), and the time to
  the frame that shows it;
* ``unfold all``: every group open, every node a row, and to the frame;
* ``redraw, unfolded``: one redraw of the view with everything unfolded (what a pan or a zoom
  costs);
* ``search``: typing a query that matches every layer's MLP down-projection, and to the frame
  with the list.

Medians in milliseconds, with the budgets (:data:`BUDGETS_MS`) printed PASS or FAIL.

    python bench/page_bench.py
    python bench/page_bench.py --report /tmp/l70.json --runs 5 --json bench/results/page.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from ampgraph.cli.reports import load_reports  # noqa: E402
from ampgraph.render.html import html_page  # noqa: E402
from tests.browser import Browser  # noqa: E402

#: A reader's budgets: the page usable within 3 s; a click's and a key's own work within 100 ms
#: (what feels immediate), and the frame that shows it within 200 ms on this shared machine.
BUDGETS_MS = {"first paint": 3000, "expand a layer": 100, "expand, to the frame": 200,
              "redraw, unfolded": 100, "search": 100, "search, to the frame": 200}  # fmt: skip

#: One step's own work (its handler: the layout, the list), then up to the frame after it is
#: drawn (the browser's style, layout and raster too: software raster in headless Chromium).
AFTER_FRAME = """(async () => {{
  const t = performance.now(); {step}; const work = performance.now() - t;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return [work, performance.now() - t]; }})()"""

SEARCH = """const s = document.getElementById('search'); s.value = 'mlp.down_proj';
  s.dispatchEvent(new Event('input'))"""


def report_file(given: Path | None) -> Path:
    if given is not None:
        return given
    out = Path(tempfile.mkdtemp()) / "llama-3-70b-train.json"
    cmd = [sys.executable, "-m", "ampgraph", "table", "llama-3-70b", "-s", "amp-fp32",
           "-s", "amp-half", "--pass", "train", "--format", "json"]  # fmt: skip
    with out.open("w") as fh:
        subprocess.run(cmd, stdout=fh, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return out


def one_run(browser: Browser, url: str) -> dict[str, float]:
    browser.open(url)
    deadline = time.monotonic() + 60
    while not browser.evaluate("!!(window.ampgraph && window.ampgraph.firstPaint)"):
        if time.monotonic() > deadline:
            raise RuntimeError("the page never painted")
        time.sleep(0.02)
    first = browser.evaluate("window.ampgraph.firstPaint")
    expand = browser.evaluate(AFTER_FRAME.format(step="window.ampgraph.open('model.layers.17')"))
    unfold = browser.evaluate(AFTER_FRAME.format(step="window.ampgraph.unfoldAll()"))
    rows = browser.evaluate("window.ampgraph.rows()")
    browser.evaluate(AFTER_FRAME.format(step="window.ampgraph.open('model.layers.40')"))
    frame = browser.evaluate("window.ampgraph.paintMs")
    search = browser.evaluate(AFTER_FRAME.format(step=SEARCH))
    found = browser.evaluate("document.getElementById('count').textContent")
    return {"first paint": first, "expand a layer": expand[0], "expand, to the frame": expand[1],
            "unfold all": unfold[0], "unfold all, to the frame": unfold[1],
            "redraw, unfolded": frame, "search": search[0], "search, to the frame": search[1],
            "rows": rows, "found": found}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="A saved report (default: analyse now).")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    args = parser.parse_args()
    reports = load_reports([report_file(args.report)])
    nodes = len(reports[0].nodes) + len(reports[0].backward.nodes if reports[0].backward else [])
    started = time.perf_counter()
    page = html_page(reports)
    written = time.perf_counter() - started
    path = Path(tempfile.mkdtemp()) / "page.html"
    path.write_text(page, encoding="utf-8")
    with Browser() as browser:
        runs = [one_run(browser, path.as_uri()) for _ in range(args.runs)]
    figures = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "found"}
    print(f"{reports[0].model}: {len(reports)} settings, {nodes} nodes each, page "
          f"{len(page.encode()) / 2**20:.1f} MiB written in {written:.2f} s; "
          f"{figures['rows']:.0f} rows unfolded; search: {runs[0]['found']}")  # fmt: skip
    verdicts = {}
    for name, value in figures.items():
        if name == "rows":
            continue
        budget = BUDGETS_MS.get(name)
        verdict = "" if budget is None else ("PASS" if value <= budget else "FAIL")
        verdicts[name] = verdict
        print(f"  {name:<26} {value:8.1f} ms  {f'(<= {budget} ms) {verdict}' if budget else ''}")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": platform.node(), "cpus": os.cpu_count(), "model": reports[0].model,
            "settings": len(reports), "nodes": nodes, "page_bytes": len(page.encode()),
            "page_write_s": written, "median_ms": figures, "verdicts": verdicts, "runs": runs,
        }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
