"""The overview's grid, checked on the laid-out SVG: the cells' frames line up in rows and
columns, neighbours keep apart, titles sit inside their frames, columns are in order.

Issue 24: the bottom row sat ~30 px left of the top row and its cells touched.
"""

from __future__ import annotations

import copy
import html
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from ampgraph.render import overview_diagram
from ampgraph.render.files import lay_out
from ampgraph.report.records import Report

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")

FIXTURE = Path(__file__).parent / "data" / "opt-125m-amp-fp32.json"
SEED = (("fp32", "amp-fp32"), ("half", "amp-half"))
#: How far apart, in points, two edges that should line up may be.
TOLERANCE = 1.0


class Frame(NamedTuple):
    """A cell's frame in SVG coordinates, and where its title's lines start."""

    left: float
    top: float
    right: float
    bottom: float
    title_x: list[float]


_CELL = re.compile(r'<g id="([^"]+)/cell" class="cluster">(.*?)</g>\n</g>', re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def cell_frames(svg: str) -> dict[str, Frame]:
    """Each overview cell's frame (the path or polygon dot draws it with), by setting name."""
    frames = {}
    for name, body in _CELL.findall(svg):
        shape = re.search(r'<(?:path[^>]* d|polygon[^>]* points)="([^"]+)"', body)
        assert shape, f"no frame drawn for cell {name}"
        numbers = [float(n) for n in _NUMBER.findall(shape.group(1))]
        xs, ys = numbers[0::2], numbers[1::2]
        starts = [float(x) for x in re.findall(r'<text text-anchor="start" x="([^"]+)"', body)]
        frames[html.unescape(name)] = Frame(min(xs), min(ys), max(xs), max(ys), starts)
    return frames


def check_grid(frames: dict[str, Frame]) -> None:
    """The seed's 2x2 grid: exact rows and columns, gaps between, titles inside, in order."""
    assert set(frames) == {n for row in SEED for n in row}
    for row in SEED:
        a, b = frames[row[0]], frames[row[1]]
        assert abs(a.top - b.top) <= TOLERANCE, f"row {row} tops differ: {a.top} vs {b.top}"
        assert abs(a.bottom - b.bottom) <= TOLERANCE, f"row {row} bottoms differ"
        assert b.left - a.right > 10, f"row {row}: cells touch or overlap ({a.right}, {b.left})"
    for col in zip(*SEED):
        a, b = frames[col[0]], frames[col[1]]
        assert abs(a.left - b.left) <= TOLERANCE, f"column {col} left edges: {a.left} vs {b.left}"
        assert abs(a.right - b.right) <= TOLERANCE, f"column {col} right edges differ"
        assert b.top - a.bottom > 10, f"column {col}: cells touch or overlap"
    # Autocast off on the left, fp32 parameters on top.
    assert frames["fp32"].right < frames["amp-fp32"].left
    assert frames["fp32"].bottom < frames["half"].top
    for name, frame in frames.items():
        assert frame.title_x, f"cell {name} has no title"
        for x in frame.title_x:  # titles are centred: as far in on the right as on the left
            assert x - frame.left >= 8, f"cell {name}'s title runs into its frame"


def seed_svg(reports: list[Report]) -> str:
    return lay_out(overview_diagram(reports), "svg").decode("utf-8")


def test_opt_overview_is_an_exact_grid() -> None:
    base = Report.from_json(FIXTURE.read_text())
    reports = []
    for name in ("fp32", "half", "amp-fp32", "amp-half"):
        report = copy.deepcopy(base)
        report.setting = {**report.setting, "name": name}
        reports.append(report)
    check_grid(cell_frames(seed_svg(reports)))


def test_cells_of_different_sizes_make_an_exact_grid() -> None:
    """A small model whose four cells differ (the 16-bit run fails in one layer): the issue's
    case, where a narrower cell below a wider one was drawn off its column."""
    torch = pytest.importorskip("torch")
    from ampgraph import analyze

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.norm(self.fc(x))

    class TwoBlocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    reports = [
        analyze(TwoBlocks(), name, args=(torch.randn(2, 8),))
        for name in ("fp32", "amp-fp32", "half", "amp-half")
    ]
    frames = cell_frames(seed_svg(reports))
    check_grid(frames)
    widths = {round(f.right - f.left) for f in frames.values()}
    assert len(widths) == 2  # a column's cells are as wide as its widest


def test_check_grid_catches_an_offset_row() -> None:
    """The check itself: a bottom row shifted left, as in the issue, fails it."""
    good = {
        "fp32": Frame(8, 0, 300, 400, [40]),
        "amp-fp32": Frame(330, 0, 700, 400, [350]),
        "half": Frame(8, 430, 300, 900, [40]),
        "amp-half": Frame(330, 430, 700, 900, [350]),
    }
    check_grid(good)
    shifted = {**good, "half": Frame(-22, 430, 270, 900, [10])}
    with pytest.raises(AssertionError, match="left edges"):
        check_grid(shifted)
    touching = {**good, "amp-half": Frame(300, 430, 700, 900, [350])}
    with pytest.raises(AssertionError, match="touch"):
        check_grid(touching)
