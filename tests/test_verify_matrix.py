"""A slice of scripts/verify_matrix.py (docs/verification/cpu-families.md) in the suite: a family
model verified against real execution on this CPU (``ampgraph verify --device cpu``, issue 33).

What is compared is the real CPU kernels' output dtypes, the eager model's own hooks and the casts
autocast really makes, never ampgraph's own output: 0 disagreements, with something compared.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ROOT, load_file

pytest.importorskip("transformers", reason="needs transformers")


def _script() -> ModuleType:
    return load_file(ROOT / "scripts" / "verify_matrix.py")


def test_electra_verifies_on_the_cpu_under_autocast() -> None:
    """ELECTRA (encoder, padding mask) under bf16 CPU autocast over fp32 parameters: every node,
    hook line and cast as the real run does them."""
    script = _script()
    harness = load_file(ROOT / "scripts" / "matrix_harness.py")
    model = load_file(ROOT / "scripts" / "families_matrix.py").build("electra")
    record = harness.verify_cpu(model, "amp-fp32", "bf16")
    assert record.failure is None
    assert record.disagreements == 0, record.first
    assert record.nodes[1] > 0 and record.modules[1] > 0 and record.casts[1] > 0
    assert record.nodes[0] == record.nodes[1]
    assert record.modules[0] == record.modules[1] and record.casts[0] == record.casts[1]
    assert script.summary([]) == (0, 0, 0, 0)


def test_the_page_for_one_model(tmp_path: Path) -> None:
    """The script's page for the custom autograd Function, in the four settings with bf16 and
    with fp16 CPU autocast: each setting verified, 0 disagreements, exit status 0."""
    out = tmp_path / "cpu-families.md"
    assert _script().main(["-m", "custom-fwd", "--out", str(out)]) == 0
    page = out.read_text()
    assert "**0 disagreements**: 8 of 8 settings verified agree" in page
    rows = [line for line in page.splitlines() if "`custom-fwd`" in line]
    assert len(rows) == 2 and all(row.count("✓") == 4 for row in rows)
