"""A slice of scripts/vision_matrix.py (docs/vision-models.md) in the suite: four models
nobody here wrote, eight analyses each, against the dispatcher and the eager model's hooks."""

from __future__ import annotations

import pytest

from .conftest import ROOT, load_file

pytest.importorskip("torchvision", reason="needs torchvision")
pytest.importorskip("timm", reason="needs timm")


@pytest.mark.slow
# The detector branches on data after NMS: traced along the data path, the eager hooks given the
# same sizes (about 4 minutes on one core).
# regnet_y_400mf: one of the further models (docs/vision-models-further.md), built on the CPU.
@pytest.mark.parametrize(
    "name",
    [
        "mobilenet_v3_small",
        "timm/resnet18d",
        "fasterrcnn_mobilenet_v3_large_320_fpn",
        "regnet_y_400mf",
    ],
)
def test_vision_model_agrees_with_both_oracles(name: str) -> None:
    row = load_file(ROOT / "scripts" / "vision_matrix.py").run_model(name)
    assert len(row.cells) == 8
    for key, cell in row.cells.items():
        assert cell.failure is None, (key, cell.failure)
        assert cell.disagreements == 0 and cell.compared > 0, key
        assert cell.hooks_agree == cell.hooks > 0, (key, cell.first_difference)
