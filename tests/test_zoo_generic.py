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


def test_required_arguments_are_built_from_their_names() -> None:
    """A forward's required arguments beyond the main input, from their names: a padding of the
    main input and a frequency class (TimesFM), a second text's ids beside an image whose
    query outputs take placeholder tokens at the start of the text (InstructBLIP, whose config
    has no placeholder until given one), flat patches placed by (x, y) positions (Gemma 4)."""
    _, inputs = GENERIC.generic("timesfm")
    assert inputs["past_values_padding"].shape == inputs["past_values"].shape[:2]
    assert inputs["freq"].shape == (2, 1)
    config, inputs = GENERIC.generic("instructblip")
    queries = config.num_query_tokens
    assert inputs["qformer_input_ids"].shape == (2, 7)
    assert (inputs["input_ids"][:, :queries] == config.image_token_id).all()
    assert not (inputs["input_ids"][:, queries:] == config.image_token_id).any()
    _, inputs = GENERIC.generic("gemma4_vision")
    assert inputs["pixel_position_ids"].shape == (2, 16, 2)
    assert inputs["pixel_values"].shape[:2] == (2, 16)


def test_float_inputs_as_the_first_layers_read_them() -> None:
    """A float input whose layout only the model knows is given as its first layer reads it:
    audio as one channel for a codec's encoder, latents as wide as its decoder's first
    convolution, embeddings as wide as the first linear."""
    _, inputs = GENERIC.generic("vibevoice_acoustic_tokenizer_encoder")
    assert inputs["hidden_states"].shape[:2] == (2, 1)
    config, inputs = GENERIC.generic("mimi_decoder")
    assert inputs["latents"].ndim == 3 and inputs["latents"].shape[0] == 2
    _, inputs = GENERIC.generic("nemotron3_5_transcribe_word_timestamp")
    assert inputs["inputs_embeds"].shape[:2] == (2, 7)


def test_a_video_model_gets_frames() -> None:
    """A video model's pixels are ``(batch, frames, channels, height, width)``, as many frames
    as its config's ``num_frames``."""
    config, inputs = GENERIC.generic("vivit")
    assert inputs["pixel_values"].shape[:3] == (2, config.num_frames, config.num_channels)
    config, inputs = GENERIC.generic("videoprism_vision_model")
    assert inputs["pixel_values_videos"].ndim == 5


def test_size_relations_the_defaults_held_are_kept() -> None:
    """Sizes a config's defaults tie together stay tied once shrunk: Mamba-2's heads span its
    expanded width, SqueezeBERT's grouped feed-forward divides into its groups, Molmo 2's
    feature layers index the shrunk vision tower, BridgeTower's link heads are 64 wide, SAM 2's
    Hiera stages start at its width, TextNet's stem feeds its first stage."""
    config, _ = GENERIC.generic("mamba2")
    assert config.num_heads * config.head_dim == config.hidden_size * config.expand
    config, _ = GENERIC.generic("squeezebert")
    assert config.intermediate_size % config.intermediate_groups == 0
    config, _ = GENERIC.generic("molmo2")
    layers = config.adapter_config.vision_feature_layer
    assert all(-config.vision_config.num_hidden_layers <= i < 0 for i in layers)
    config, _ = GENERIC.generic("bridgetower")
    assert config.hidden_size // 64 >= 1
    config, _ = GENERIC.generic("sam2_hiera_det_model")
    assert config.embed_dim_per_stage[0] == config.hidden_size == 32
    config, _ = GENERIC.generic("textnet")
    assert config.stem_out_channels == config.hidden_sizes[0]


def test_a_base_model_of_a_sub_config_or_unresolved_by_auto_model() -> None:
    """MusicGen's base model is its decoder, built from the decoder's sub-config, with a row of
    ids per codebook; Evolla's mapping lists a config it does not resolve: the base class is
    built directly."""
    config, inputs = GENERIC.generic("musicgen")
    assert type(config).__name__ == "MusicgenDecoderConfig"
    assert inputs["input_ids"].shape[0] == 2 * config.num_codebooks
    config, _ = GENERIC.generic("evolla")
    assert type(config).__name__ == "EvollaConfig"


def test_series_and_feature_windows_a_config_fixes() -> None:
    """A forecaster of several channels takes its context as ``(batch, context, channels)``
    (PatchTST); a windowed speech encoder whole windows of ``2 x n_window`` frames, its mask over
    them (Qwen3-ASR); a tower sized for 128 mel bins gets them (Gemma 4's audio)."""
    config, inputs = GENERIC.generic("patchtst")
    assert inputs["past_values"].shape[1:] == (config.context_length, config.num_input_channels)
    config, inputs = GENERIC.generic("qwen3_asr_encoder")
    assert inputs["input_features"].shape[-1] % (2 * config.n_window) == 0
    assert inputs["input_features_mask"].shape[-1] == inputs["input_features"].shape[-1]
    _, inputs = GENERIC.generic("gemma4_audio")
    assert inputs["input_features"].shape[-1] == 128


def test_flat_patches_with_their_layout_and_a_videos_placeholders() -> None:
    """An encoder of flat patches gets ``channels x patch x patch``-wide patches with the layout
    its forward takes beside them (SigLIP 2's grid shape and patch mask); a video's frames each
    take an image's placeholder tokens (InstructBLIP-Video's video token, given one)."""
    config, inputs = GENERIC.generic("siglip2")
    patch = config.vision_config.patch_size
    assert inputs["pixel_values"].shape == (2, 16, config.vision_config.num_channels * patch**2)
    assert inputs["spatial_shapes"].tolist() == [[4, 4], [4, 4]]
    config, inputs = GENERIC.generic("instructblipvideo")
    frames = inputs["pixel_values"].shape[1]
    tokens = (inputs["input_ids"] == config.video_token_id).sum(1)
    assert inputs["pixel_values"].ndim == 5 and (tokens == frames * config.num_query_tokens).all()


def test_rotary_parameters_for_each_layer_kind() -> None:
    """A config whose defaults give no rotary parameters for its layer kinds (Cohere Compass)
    gets the default rotary embedding for each kind: its rotary module reads one per kind."""
    config, _ = GENERIC.generic("cohere_compass_text")
    assert set(config.rope_parameters) == set(config.layer_types)
