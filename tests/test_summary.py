"""A report in one line (``repr``) and one table (``Report.summary()``), on OPT-125M."""

from __future__ import annotations

from .conftest import report


def test_repr_is_one_line_with_the_seeds_counts() -> None:
    text = repr(report("opt-125m", "amp-fp32"))
    assert "\n" not in text and len(text) < 200  # was 418,492 characters
    assert text.startswith("<Report opt-125m amp-fp32: 542 graph nodes, ")
    assert "194 casts, 24 promotions" in text and ", 0 disagreements>" in text


def test_summary_is_a_row_per_leaf_module_call_then_the_totals() -> None:
    r = report("opt-125m", "amp-fp32")
    lines = r.summary().splitlines()
    assert lines[2].split() == [
        "Module",
        "call",
        "Class",
        "In",
        "Out",
        "Ops",
        "Casts",
        "Promotions",
    ]
    rows = lines[4 : 4 + len(r.modules)]
    assert [row.split()[0] for row in rows] == [m.path for m in r.modules]
    q_proj = next(
        row.split() for row in rows if row.startswith("model.decoder.layers.0.self_attn.q_proj ")
    )
    assert q_proj[1:] == ["Linear", "float32", "bfloat16", "1", "3", "0"]  # input, weight, bias
    assert lines[-2] == "194 casts inserted by autocast, 24 promotions, 0 nodes that raise"
    assert repr(r.summary()) == str(r.summary())  # a notebook shows the table, not a quoted str
