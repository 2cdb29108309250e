"""The examples in examples/ run and show what they promise."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ROOT, load_file


def _load(name: str) -> ModuleType:
    return load_file(ROOT / "examples" / f"{name}.py")


def test_roipool_example_shows_the_fp32_island(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _load("roipool_fp32_island")
    args = ["--out", str(tmp_path)] if shutil.which("dot") else ["--no-render"]
    assert example.main(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # The wrapper takes bf16 features and hands fp32 on; autocast casts again after it.
    assert "[roi_pool] in=torch.bfloat16 -> out=torch.float32" in lines
    assert "[fc6] in=torch.float32 -> out=torch.bfloat16" in lines
    assert "  38 ops, autocast on in 0, 0 casts; outputs: fp32 x37, int64 x1" in lines
    # Without the wrapper the RoI interpolation weights are cast to bf16 at both matmuls.
    assert sum("fp32->bf16 out=bf16" in line for line in lines) == 2
    assert out.count("0 disagreements") == 2
    if shutil.which("dot"):
        (svg,) = tmp_path.glob("*.svg")
        assert "autocast disabled" in svg.read_text()
