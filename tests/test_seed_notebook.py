"""The seed notebook's hook printouts for OPT-125M, reproduced without a GPU or weights."""

from __future__ import annotations

import pytest

from ampgraph.report.printed import SEED_WATCH, hook_lines

from .conftest import seed_hook_blocks

SETTINGS = ["fp32", "half", "amp-half", "amp-fp32"]


def test_seed_file_has_the_four_settings() -> None:
    blocks = seed_hook_blocks()
    assert sorted(blocks) == sorted(SETTINGS)
    # Each block runs to layers.1.self_attn.k_proj, its last line cut short by the notebook.
    assert all(13 <= len(lines) <= 14 for lines in blocks.values())


@pytest.mark.parametrize("setting", SETTINGS)
def test_table_reproduces_seed_lines(opt_report, setting: str) -> None:
    seed = seed_hook_blocks()[setting]
    ours = hook_lines(opt_report(setting), SEED_WATCH)
    complete, cut = seed[:-1], seed[-1]
    assert ours[: len(complete)] == complete
    # The notebook's output was cut mid-line: its last line is a prefix of ours.
    assert ours[len(complete)].startswith(cut)


def test_all_leaf_modules_are_listed_in_execution_order(opt_report) -> None:
    calls = opt_report("amp-fp32").modules
    paths = [c.path for c in calls]
    assert paths[:2] == ["model.decoder.embed_tokens", "model.decoder.embed_positions"]
    # ReLU is a leaf module too; the seed's WATCH tuple left it out.
    assert "model.decoder.layers.0.activation_fn" in paths
    assert paths[-2:] == ["model.decoder.final_layer_norm", "lm_head"]
    assert len(calls) == 2 + 12 * 9 + 2


def test_residual_adds_promote_when_parameters_are_fp32(opt_report) -> None:
    """Seed In [8]: 'the residual sum runs in FP32 even though one input is in BF16'."""
    promoted = [n for n in opt_report("amp-fp32").nodes if n.promotion]
    adds = [n for n in promoted if n.op == "aten.add.Tensor"]
    assert len(adds) == 24  # two residual adds in each of the 12 layers
    assert all(sorted(n.promotion["inputs"]) == ["bfloat16", "float32"] for n in adds)
    assert all(n.promotion["to"] == "float32" for n in adds)
    assert "type promotion widens" in adds[0].reason


def test_no_promotion_with_16bit_parameters(opt_report) -> None:
    """Seed In [7]: with bf16 parameters the residual adds stay bf16 + bf16 -> bf16."""
    assert not [n for n in opt_report("amp-half").nodes if n.promotion]


def test_linear_weight_casts_are_recorded(opt_report) -> None:
    rep = opt_report("amp-fp32")
    fc1 = next(c for c in rep.modules if c.path == "model.decoder.layers.0.fc1")
    (linear,) = [rep.node(n) for n in fc1.nodes if rep.node(n).op == "aten.linear.default"]
    assert linear.policy == "lower_precision_fp"
    assert [(c.from_dtype, c.to_dtype) for c in linear.casts] == [("float32", "bfloat16")] * 3
    assert [c.node for c in linear.casts][1:] == [
        "p_model_decoder_layers_0_fc1_weight",
        "p_model_decoder_layers_0_fc1_bias",
    ]
