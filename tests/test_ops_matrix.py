"""A slice of scripts/ops_matrix.py (docs/ops-matrix.md) in the suite: odd ops against both
oracles, and the inexact ``half`` cells flagged by the check rather than passed."""

from __future__ import annotations

import pytest

from .conftest import ROOT, load_file


@pytest.mark.parametrize(
    ("name", "flagged"),
    # rfft and prelu in half were flagged (2 and 4 cells) until a raising setting was traced on
    # past the raise in its own dtypes (issue 25): every cell now agrees with both oracles.
    [("sdpa", 0), ("cdist", 0), ("multihead_attention", 0), ("rfft", 0), ("prelu", 0)],
)
def test_odd_op_agrees_or_is_flagged(name: str, flagged: int) -> None:
    row = load_file(ROOT / "scripts" / "ops_matrix.py").run_op(name)
    assert row.failures == []
    assert row.cells == 16 and row.agree == 16 - flagged and row.flagged == flagged
    assert row.compared > 0
