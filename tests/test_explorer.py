"""ampgraph in Google's Model Explorer (``ai-edge-model-explorer``, the ``explorer`` extra): the
graph JSON and node-data overlays that ``render --format explorer`` writes read into Model
Explorer's own record classes, and a running ``model-explorer`` server on localhost, opened in
headless Chromium, shows them: from the files, and from the adapter extension analysing a
``module:factory`` spec itself. The model has a module named as HTML, which must stay text."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ampgraph.explorer import parse_spec
from ampgraph.pipeline.stages import analyze
from ampgraph.render import render_files
from ampgraph.render.page_data import node_records
from ampgraph.report.records import Report

from .browser import Browser

model_explorer = pytest.importorskip("model_explorer", reason="pip install 'ampgraph[explorer]'")

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = '<img src=x onerror="pwned=1">'


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module(HOSTILE, nn.Linear(4, 4))
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self._modules[HOSTILE](x)
        for layer in self.layers:
            h = layer(h)
        return h.sum()


def hostile() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model and its inputs: the ``module:factory`` spec the adapter test analyses."""
    return _Model(), (torch.randn(3, 4),)


@functools.cache
def reports() -> list[Report]:
    return [analyze(_Model(), s, args=(torch.randn(3, 4),), check=False, pass_="train")
            for s in ("amp-fp32", "fp32")]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return render_files(reports(), tmp_path_factory.mktemp("me"), formats=("explorer",))


def test_the_files_are_model_explorers_own_records(files: list[Path]) -> None:
    import json

    from model_explorer import graph_builder, node_data_builder

    graph, *overlays = files
    collection = json.loads(graph.read_text())
    assert [g["id"] for g in collection["graphs"]] == ["amp-fp32", "fp32"]
    amp = reports()[0]
    nodes = collection["graphs"][0]["nodes"]
    assert [n["id"] for n in nodes] == [r["name"] for r in node_records(amp)]
    for node in nodes:  # every field is one of GraphNode's, every edge an IncomingEdge
        graph_builder.GraphNode(**node)
        for edge in node["incomingEdges"]:
            graph_builder.IncomingEdge(**edge)
    linear = next(r for r in amp.nodes if r.module == HOSTILE and r.op == "aten.linear.default")
    node = next(n for n in nodes if n["id"] == linear.name)
    attrs = {a["key"]: a["value"] for a in node["attrs"]}
    assert node["namespace"] == HOSTILE  # the module path, as Model Explorer's namespace
    assert attrs["policy"] == "lower_precision_fp" and attrs["why"] == linear.reason
    assert node["outputsMetadata"][0]["attrs"] == [
        {"key": "dtype", "value": "bfloat16"}, {"key": "shape", "value": str(linear.shapes[0])}
    ]  # fmt: skip
    assert [p.name.rsplit("-", 1)[1] for p in overlays] == [
        "dtype.json", "policy.json", "casts.json", "gradient.json"
    ]  # fmt: skip
    for path in overlays:
        for data in json.loads(path.read_text()).values():
            node_data_builder.GraphNodeData(**data)
    dtype = json.loads(overlays[0].read_text())["amp-fp32"]["results"]
    assert dtype[linear.name] == {"value": 3}  # bf16's code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def explorer(*args: str) -> Iterator[str]:
    """A ``model-explorer`` server on a free local port; yields the URL it prints."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    exe = Path(sys.executable).with_name("model-explorer")
    proc = subprocess.Popen(
        [str(exe), *args, "--no_open_in_browser", f"--port={_free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("http://"):
                break
        else:
            pytest.fail("model-explorer stopped before it served")
        yield line.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def shown(browser: Browser, url: str, *want: str, seconds: float = 120) -> str:
    """The page's text once it holds all of ``want`` (Model Explorer lays the graph out in a
    worker and reads each overlay by a request of its own)."""
    browser.open(url)
    deadline = time.monotonic() + seconds
    while True:
        text = browser.evaluate("document.body.innerText")
        if all(w in text for w in want) or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


def test_model_explorer_shows_the_files_with_their_overlays(
    browser: Browser, files: list[Path], tmp_path: Path
) -> None:
    graph, *overlays = files
    count = len(node_records(reports()[0]))
    with explorer(str(graph), "--node_data_paths=" + ",".join(map(str, overlays[:2]))) as url:
        text = shown(browser, url, f"{count} nodes", "ampgraph dtype", "ampgraph policy", HOSTILE)
        browser.screenshot(tmp_path / "explorer-files.png")
    assert f"{count} nodes" in text  # the graph drawn, every node of the setting
    assert "ampgraph dtype" in text and "ampgraph policy" in text  # the overlays, applied
    # The root-level table names the top groups: the hostile module among them, as text.
    assert HOSTILE in text
    assert browser.evaluate("typeof pwned === 'undefined'")
    drawn = browser.evaluate("document.querySelectorAll('canvas').length")
    assert drawn > 0


def test_the_adapter_analyses_a_spec_and_opens_it(browser: Browser, tmp_path: Path) -> None:
    spec = "tests.test_explorer:hostile@amp-fp32+fp32.ampgraph"
    forward = analyze(*hostile()[:1], "amp-fp32", args=hostile()[1], check=False)
    count = len(node_records(forward))  # the forward pass, the adapter's default
    with explorer("--extensions=ampgraph.explorer", spec) as url:
        text = shown(browser, url, f"{count} nodes", seconds=240)
        browser.screenshot(tmp_path / "explorer-adapter.png")
    assert f"{count} nodes" in text, text[:2000]
    assert "amp-fp32" in text
    assert browser.evaluate("typeof pwned === 'undefined'")


def test_a_spec_names_a_model_and_its_settings() -> None:
    here = str(ROOT / "tests" / "test_explorer.py")
    assert parse_spec(f"{here}:hostile@fp32.ampgraph") == (f"{here}:hostile", ["fp32"])
    assert parse_spec(str(ROOT / "opt-125m.ampgraph")) == ("opt-125m", None)
    with pytest.raises(Exception, match="must end in .ampgraph"):
        parse_spec(str(ROOT / "opt-125m.json"))
