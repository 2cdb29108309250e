"""The zoo's repairs of a tester's config or inputs (scripts/zoo_repair.py, issue 42): each
mechanism a plain fp32 run raises with, on a real tiny transformers model built as the zoo
builds it, the repair changing a copy of the config or inputs, and the plain run of the repaired
model passing; then the zoo's record of a type whose own tester needs one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import ROOT, load_file

transformers = pytest.importorskip("transformers", reason="needs transformers")

ZOO = load_file(ROOT / "scripts" / "zoo.py")
REPAIR = load_file(ROOT / "scripts" / "zoo_repair.py")

IDS = {"input_ids": torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))}
SMALL = {"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2}  # fmt: skip


def _raised(model_type: str, config: Any, inputs: dict[str, Any]) -> tuple[str | None, Any]:
    """The plain run's error of ``model_type`` built from ``config`` as the zoo builds it."""
    model = ZOO.build(model_type, *ZOO.copies(config, inputs))
    return ZOO.plain_run(model), model


def _repaired(model_type: str, config: Any, inputs: dict[str, Any], mechanism: str) -> Any:
    """The repair of a model that raises with ``mechanism``, checked to pass its plain run and
    to leave the tester's own config and inputs as they were."""
    raised, model = _raised(model_type, config, inputs)
    if raised is None and mechanism == REPAIR.REPAIRS[0][0]:
        pytest.skip("this transformers and torch take no grouped_mm on the CPU")
    assert raised is not None and mechanism in raised, raised
    before = config.to_dict(), {k: v.shape for k, v in inputs.items()}
    fixed = REPAIR.repair(config, inputs, raised, model)
    assert fixed is not None
    assert (config.to_dict(), {k: v.shape for k, v in inputs.items()}) == before
    assert _raised(model_type, fixed[0], fixed[1])[0] is None
    return fixed


def test_an_expert_width_off_16_bytes_is_rounded_up_to_8_elements() -> None:
    """transformers' causal LM tester's intermediate_size=37: fp32 expert rows of 148 bytes,
    which grouped_mm refuses; 40 (80 bytes in bf16) it takes."""
    config = transformers.MixtralConfig(**SMALL, intermediate_size=37, num_local_experts=4)
    config, _, what = _repaired("mixtral", config, IDS, REPAIR.REPAIRS[0][0])
    assert config.intermediate_size == 40
    assert what == "intermediate_size 37 -> 40 (grouped_mm's 16-byte strides)"


def test_a_width_that_is_no_expert_width_stays() -> None:
    """Only the experts' widths move: a dense MLP's odd width beside them is not theirs."""
    config = transformers.Qwen2MoeConfig(
        **SMALL, intermediate_size=36, moe_intermediate_size=37,
        shared_expert_intermediate_size=36, num_experts=4)  # fmt: skip
    config, _, what = _repaired("qwen2_moe", config, IDS, REPAIR.REPAIRS[0][0])
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size) == (40, 36)
    assert what.startswith("moe_intermediate_size 37 -> 40")


HYBRIDS = {
    # the attention layers' indices (bamba), a period and offset (jamba), a repeated block
    # pattern (recurrent_gemma), a list of kinds (granitemoehybrid)
    "bamba": lambda: transformers.BambaConfig(**SMALL, intermediate_size=48, mamba_n_heads=4,
                                              mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8,
                                              mamba_chunk_size=4),
    "jamba": lambda: transformers.JambaConfig(**SMALL, intermediate_size=48, num_experts=2,
                                              mamba_d_state=8, mamba_dt_rank=4),
    "recurrent_gemma": lambda: transformers.RecurrentGemmaConfig(
        **{k: v for k, v in SMALL.items() if k != "num_key_value_heads"}, intermediate_size=48,
        lru_width=32, block_types=["recurrent", "recurrent", "attention"]),
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
        **SMALL, intermediate_size=48, shared_intermediate_size=48, num_local_experts=2,
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4),
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_a_hybrid_with_no_attention_layer_gets_one(model_type: str) -> None:
    """The tiny depth cuts the layer pattern before its first attention layer, and the hybrid
    cache's ``get_seq_length`` needs one: the last layer is made attention."""
    config = HYBRIDS[model_type]()
    assert not REPAIR.has_attention(config)
    config, _, what = _repaired(model_type, config, IDS, REPAIR.REPAIRS[1][0])
    assert REPAIR.has_attention(config)
    assert what.endswith("(a hybrid cache with no attention layer)")


def test_repairs_follow_one_another_each_mechanism_once() -> None:
    """jamba from the causal LM tester: no attention layer, then, with one, its experts'
    widths; the record names both, and the builder's model runs."""
    config = transformers.JambaConfig(**SMALL, intermediate_size=37, num_experts=2,
                                      mamba_d_state=8, mamba_dt_rank=4)  # fmt: skip
    raised, model = _raised("jamba", config, IDS)
    record, make = ZOO.repaired_builder("jamba", config, IDS, raised, model)
    if record is not None and "plain_run_after" not in record and ";" not in record["what"]:
        pytest.skip("this transformers and torch take no grouped_mm on the CPU")
    assert record["plain_run_before"] == raised and "plain_run_after" not in record
    attention, widths = record["what"].split("; ")
    assert attention.startswith("attn_layer_period set") and widths.startswith(
        "intermediate_size 37 -> 40")
    assert ZOO.plain_run(make()) is None


def test_the_mel_length_the_model_asks_for() -> None:
    config = transformers.WhisperConfig(
        vocab_size=99, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_mel_bins=8,
        max_source_positions=20, max_target_positions=20, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)  # fmt: skip
    inputs = {"input_features": torch.randn(2, 8, 24), "decoder_input_ids": IDS["input_ids"][:, :3]}
    _, inputs, what = _repaired("whisper", config, inputs, REPAIR.REPAIRS[2][0])
    assert inputs["input_features"].shape == (2, 8, 40)
    assert what == "input_features frames 24 -> 40 (the mel length the model asks for)"


def test_a_language_set() -> None:
    config = transformers.XmodConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=37,
                                     languages=["de_DE", "en_XX"])  # fmt: skip
    config, _, what = _repaired("xmod", config, IDS, REPAIR.REPAIRS[3][0])
    assert config.default_language == "de_DE"


def test_a_sub_config_left_at_the_default_width_the_model_mirrors() -> None:
    """DbrxConfig copies ``d_model`` into ``ffn_config`` before ``hidden_size`` (its alias) is
    set: the router and experts are the default 2048 wide beside 32-wide hidden states."""
    config = transformers.DbrxConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        attn_config={"kv_n_heads": 2, "rope_theta": 10000, "clip_qkv": 8},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2})  # fmt: skip
    config, _, what = _repaired("dbrx", config, IDS, REPAIR.REPAIRS[4][0])
    assert config.ffn_config.hidden_size == 32
    assert what.startswith("ffn_config.hidden_size 2048 -> 32")


def test_a_config_asking_for_16_bit_parameters_builds_fp32_ones() -> None:
    """llama4's tester sets ``torch_dtype=torch.bfloat16``: its fp32 inputs meet bf16 weights at
    the first Linear (here a Llama fed fp32 embeddings)."""
    config = transformers.LlamaConfig(**SMALL, intermediate_size=37, dtype="bfloat16")
    inputs = {"inputs_embeds": torch.randn(2, 7, 32)}
    config, _, what = _repaired("llama", config, inputs, REPAIR.REPAIRS[5][0])
    assert what == "dtype bfloat16 -> float32 (a tester's config asking for 16-bit parameters)"


def test_no_repair_for_an_error_no_mechanism_names_or_nothing_to_change() -> None:
    config = transformers.LlamaConfig(**SMALL, intermediate_size=37)
    assert REPAIR.repair(config, IDS, "RuntimeError: size mismatch", None) is None
    # the mel error, with no input features to pad
    assert REPAIR.repair(config, IDS, "expects the mel input features to be of length 40",
                         None) is None  # fmt: skip


OWN = '''import torch
from transformers import MixtralConfig


class MixtralModelTester:
    def __init__(self, parent):
        pass

    def prepare_config_and_inputs_for_common(self):
        config = MixtralConfig(vocab_size=99, hidden_size=32, intermediate_size=37,
                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                               num_local_experts=4)
        return config, {"input_ids": torch.randint(0, 99, (2, 7))}
'''
DRIVER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
import zoo
zoo.use_tests(Path({tests!r}))
print(json.dumps(zoo.run_one("mixtral", Path({tests!r}), ["amp-fp32 bf16"])))
"""


def test_the_record_of_a_repaired_tester(tmp_path: Path) -> None:
    """A type whose own tester's model raises in a plain run: run_one repairs it, runs the
    cells on the repaired model, and the record says what was repaired (tester and repair),
    so the page shows it; the repaired mixtral is exact."""
    tests = tmp_path / "tests"
    (tests / "models" / "mixtral").mkdir(parents=True)
    for init in (tests, tests / "models", tests / "models" / "mixtral"):
        (init / "__init__.py").write_text("")
    (tests / "models" / "mixtral" / "test_modeling_mixtral.py").write_text(OWN)
    driver = DRIVER.format(scripts=str(ROOT / "scripts"), tests=str(tests))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                          env=env, timeout=300, check=True)  # fmt: skip
    rec = json.loads(done.stdout.splitlines()[-1])
    if "repair" not in rec:
        pytest.skip("this transformers and torch take no grouped_mm on the CPU")
    what = "intermediate_size 37 -> 40 (grouped_mm's 16-byte strides)"
    raised = "RuntimeError: strides should be multiple of 16 bytes"
    assert rec["repair"] == {"what": what, "plain_run_before": raised}
    assert rec["tester"] == f"tests/models/mixtral/test_modeling_mixtral.py, repaired: {what}"
    assert ZOO.status(rec) == "exact"
    page = load_file(ROOT / "scripts" / "zoo_page.py")
    assert page.repaired(rec)
    assert f"| mixtral | {raised} | {what} | exact |" in page._repairs({"mixtral": rec})
