"""The zoo's generic tester (scripts/zoo_generic.py, issue 42): the rules by which it shrinks a
config's fields together and builds the inputs a forward requires, each on a real transformers
config class and a real forward (a type these rules made build: the config's own validator and
the model's own code are the oracles).
"""

from __future__ import annotations

import pytest

from .conftest import ROOT, load_file

pytest.importorskip("transformers", reason="needs transformers")

GENERIC = load_file(ROOT / "scripts" / "zoo_generic.py")


def test_keys_tied_to_a_width_follow_it() -> None:
    """A width under another name whose default is a shrunk width's (a flow head's
    ``condition_dim``, a vision tower's ``out_hidden_size``) is shrunk with it, across
    sub-configs: the configs' own validators require them equal."""
    config, _ = GENERIC.generic("gradium_phonon_tts")
    assert config.flow_head_config.condition_dim == config.hidden_size == 32
    config, _ = GENERIC.generic("granite_docling")
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 32


def test_as_many_key_value_heads_as_heads_stays_so() -> None:
    """ESMC's attention has no grouped-query form: its validator requires as many key/value
    heads as heads, which the shrunk config keeps; a grouped one stays grouped."""
    config, _ = GENERIC.generic("esmc")
    assert config.num_key_value_heads == config.num_attention_heads == 4
    out = GENERIC.shrink({"num_attention_heads": 32, "num_key_value_heads": 8}, {})
    assert out["num_key_value_heads"] == 2


def test_per_layer_fields_follow_the_depth_keeping_each_kind() -> None:
    """Per-layer lists keep one layer of each kind (a sliding and a full attention), a per-layer
    dict keeps the layers that remain, a list as long as another depth (GPT-Neo's
    ``attention_layers`` beside ``num_layers``) follows it; a per-stage list of numbers does not."""
    from transformers import Gemma3TextConfig, GPTNeoConfig

    out = GENERIC.shrink(Gemma3TextConfig().to_dict(), {})
    assert out["num_hidden_layers"] == 2
    assert sorted(out["layer_types"]) == ["full_attention", "sliding_attention"]
    out = GENERIC.shrink(GPTNeoConfig().to_dict(), {})
    assert len(out["attention_layers"]) == out["num_layers"] == 2
    stages = {"num_layers": 4, "depths": [2, 2, 6, 2], "num_heads": [4, 8, 16, 32]}
    assert GENERIC.shrink(stages, {})["num_heads"] == [1, 2, 4, 8]
    layers = {"num_hidden_layers": 30, "per_layer_config": {"01": {"head_dim": 512}, "05": {}}}
    assert GENERIC.shrink(layers, {})["per_layer_config"] == {"01": {"head_dim": 512}}
    config, _ = GENERIC.generic("gemma4")  # its validator requires keys below the depth
    assert config.text_config.num_hidden_layers == 2


def test_mrope_section_sums_to_the_shrunk_rotary_half() -> None:
    """GLM-4V's text model takes a missing ``mrope_section`` as [8, 12, 12] (a full-size head):
    the shrunk config sets one that sums to its own rotary half, and the forward runs."""
    config, _ = GENERIC.generic("glm4v_text")
    head = config.hidden_size // config.num_attention_heads
    factor = config.rope_parameters.get("partial_rotary_factor", 1.0)
    assert sum(config.rope_parameters["mrope_section"]) == int(head * factor) // 2


def test_a_packed_patch_encoder_gets_patches_and_their_grid() -> None:
    """A qwen-VL-style vision encoder (``forward(hidden_states, grid_thw)``) gets one image's
    flattened patches, as many as its grid says, each as wide as its patch embedding's input."""
    config, inputs = GENERIC.generic("glm4v_vision")
    (t, h, w), = inputs["grid_thw"].tolist()
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    assert tuple(inputs["hidden_states"].shape) == (t * h * w, patch)
    assert h % config.spatial_merge_size == 0 and w % config.spatial_merge_size == 0


def test_a_required_mask_of_the_main_input_is_built() -> None:
    """A forward that requires its main input's mask (``input_features_mask``) gets one as long
    as the main input."""
    _, inputs = GENERIC.generic("audioflamingo3_encoder")
    mask = inputs["input_features_mask"]
    assert tuple(mask.shape) == tuple(inputs["input_features"].shape[:2])


def test_an_expert_width_has_16_byte_strides() -> None:
    """A mixture of experts' widths are multiples of 16 bytes (grouped_mm's rule in a plain
    run), where a dense model keeps the testers' 37."""
    moe = GENERIC.shrink({"num_experts": 64, "moe_intermediate_size": 1408}, {})
    assert moe["moe_intermediate_size"] * 4 % 16 == 0
    assert GENERIC.shrink({"intermediate_size": 3072}, {})["intermediate_size"] == 37


def test_a_forecaster_gets_a_horizon_and_its_history() -> None:
    """A time-series model has no default horizon (``prediction_length``): the shrunk config sets
    one, and the inputs are a history as long as its context and largest lag, with the time
    features and the future values its forward requires."""
    config, inputs = GENERIC.generic("autoformer")
    assert config.prediction_length == 4 and config.label_length <= config.context_length
    past = inputs["past_values"].shape[1]
    assert past == config.context_length + max(config.lags_sequence)
    assert tuple(inputs["future_values"].shape) == (2, config.prediction_length)


def test_a_disabled_part_stays_disabled() -> None:
    """A width a config sets to 0 (GLM-5's DSA layers have no rotary dimensions, which its
    validator requires) is not shrunk to a tester's size."""
    assert GENERIC.shrink({"qk_rope_head_dim": 0, "head_dim": 128}, {}) == {
        "qk_rope_head_dim": 0, "head_dim": 8}
    config, _ = GENERIC.generic("glm5_next_text")
    assert config.num_hidden_layers == 2


def test_packed_patches_under_other_names() -> None:
    """A packed-patch vision encoder names its merge and temporal patch otherwise (Muse Spark's
    ``merge_size``, ``patch_temporal``), its grid otherwise, or convolves each patch as an image
    (Kimi-K2.5): the patches are as wide as its embedding reads, and a multimodal model's
    ``image_grid_thw`` beside ``input_ids`` does not make it an encoder of patches."""
    config, inputs = GENERIC.generic("muse_spark_vision")
    temporal, patch = config.patch_temporal, config.patch_size
    assert inputs["pixel_values"].shape[1] == 3 * temporal * patch * patch  # RGB
    assert inputs["grid_thw"].tolist() == [[1, 2 * config.merge_size, 2 * config.merge_size]]
    config, inputs = GENERIC.generic("kimi_k25_vision")
    assert inputs["pixel_values"].dim() == 4 and inputs["pixel_values"].shape[-1] == 14
    _, inputs = GENERIC.generic("muse_spark")
    assert "input_ids" in inputs and "image_grid_thw" not in inputs


def test_a_depthwise_convolution_keeps_one_group_per_channel() -> None:
    """Mimi's upsampling convolution has as many groups as channels (``upsample_groups`` 512,
    its width): the groups follow the shrunk width, or the channels do not divide."""
    config, _ = GENERIC.generic("mimi")
    assert config.upsample_groups == config.hidden_size == 32
    assert GENERIC.shrink({"hidden_size": 512, "num_groups": 512}, {})["num_groups"] == 1


def test_blocks_per_layer_follow_the_depth() -> None:
    """Muse Spark's audio tower has per-layer patch sizes, widths and block counts, which its
    validator requires as long as the layers; audio in whole frames of 96 samples."""
    out = GENERIC.shrink({"num_hidden_layers": 4, "depths": [2, 2, 6, 2],
                          "patch_sizes": [4, 2, 2, 2]}, {})  # fmt: skip
    assert out["depths"] == [1, 1] and out["patch_sizes"] == [4, 2]
    config, inputs = GENERIC.generic("muse_spark_audio")
    assert len(config.depths) == config.num_hidden_layers == 2
    assert inputs["input_values"].shape[-1] % 96 == 0


def test_features_as_wide_as_the_first_linear_reads_them() -> None:
    """Speech encoders that read frames stacked into one feature vector (Granite Speech 5's 4 mel
    frames, Fun-ASR's 7) get features that wide, their mask as long as the frames."""
    config, inputs = GENERIC.generic("granite_speech5_encoder")
    assert inputs["input_features"].shape[-1] == 4 * config.num_mel_bins
    config, inputs = GENERIC.generic("fun_asr_nano_encoder")
    features = inputs["input_features"]
    assert features.shape[-1] == config.num_stacked_frames * config.num_mel_bins
    assert tuple(inputs["input_features_mask"].shape) == tuple(features.shape[:2])


def test_a_hashed_ngram_vocabulary_is_shrunk() -> None:
    """blt's hashed n-gram tables (500,002 rows for each of six n-gram sizes by default) were
    96 M of the generic config's 96.1 M parameters, a 384 MB fp32 table that a plain run
    allocates too: shrunk as blt's own tester shrinks it, the model is tiny and runs."""
    config, _ = GENERIC.generic("blt")
    assert config.encoder_hash_byte_group_vocab == 64
    from transformers import AutoModel

    model = AutoModel.from_config(config)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
