"""The zoo's generic tester: a tiny config and valid inputs for a transformers model type that has
no ``*ModelTester`` at hand (issue 42, docs/zoo.md).

The type's config class with its defaults shrunk the way transformers' testers shrink them
(hidden 32, 2 layers, 4 heads, intermediate 37, vocabulary 99, small images and patches, few
experts...), nested text/vision/audio sub-configs too; the inputs from the base model's forward
signature and ``main_input_name`` (``input_ids``, ``pixel_values``, ``input_values``,
``input_features``, ``decoder_input_ids`` for encoder-decoders, ``attention_mask``). One plain
fp32 forward proves the pair: a type it cannot build is "does not build (generic tester)", with
the error's class, never dropped.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the zoo's modules beside this file
import zoo_args  # noqa: E402

#: The mel bins of speech models' features beside the 80 a feature extractor defaults to.
MEL_BINS = 128
SOURCE = "generic tester (config defaults shrunk, inputs from the forward signature)"
BATCH, SEQ, VOCAB, SMALL_HEADS = 2, 7, 99, 4
#: Scalar keys and the value a tester gives them (the shapes of ``BertModelTester`` and kin).
#: The model's own width under its many names (what ``full_size`` measures)...
WIDTH = ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "hidden_dim",
         "word_embed_proj_dim", "embedding_size", "emb_dim", "d_embed", "text_embed_dim",
         "vision_embed_dim", "encoder_hidden_size", "encoder_embed_dim", "decoder_embed_dim",
         "decoder_hidden_size")  # fmt: skip
#: ...and inner widths shrunk the same, which a tiny model may keep large: low-rank projections
#: (DeepSeek's ``q_lora_rank`` of 1536 on a hidden size of 32 is a small model still).
INNER = ("projection_dim", "proj_dim", "proj_codevector_dim", "codevector_dim",
         "classifier_proj_size", "output_hidden_size", "projector_hidden_size", "hidden_channels",
         "kv_lora_rank", "q_lora_rank")  # fmt: skip
SMALL = {
    32: WIDTH + INNER,
    37: ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
         "moe_intermediate_size", "shared_expert_intermediate_size", "ff_dim", "mlp_dim",
         "intermediate_dim", "expert_intermediate_size", "decoder_intermediate_size"),
    4: ("rotary_dim", "num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
        "decoder_attention_heads", "num_heads", "attention_heads", "decoder_num_attention_heads"),
    8: ("head_dim", "attention_head_size", "d_kv", "kv_channels", "qk_rope_head_dim",
        "qk_nope_head_dim", "v_head_dim", "qk_head_dim"),
    16: ("num_conv_pos_embeddings", "relative_attention_num_buckets", "num_buckets"),
}  # fmt: skip
LAYERS = re.compile(r"^(num_|n_)?(hidden_|encoder_|decoder_)?(layers?|depth)$|_layers$")
CAPS = {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
        "num_experts_per_tok": 2, "moe_topk": 2, "n_shared_experts": 1, "n_group": 1,
        "topk_group": 1, "num_conv_pos_embedding_groups": 2, "max_position_embeddings": 512,
        "num_codevectors_per_group": 8, "num_groups": 1, "window_size": 2,
        "max_source_positions": 30, "max_target_positions": 40,
        # A hashed n-gram vocabulary, one table per n-gram size: blt's 500,002 rows for each of
        # six sizes are a 384 MB fp32 table, 96 M of a tiny model's 96.1 M parameters (its own
        # tester takes 64).
        "encoder_hash_byte_group_vocab": 64}  # fmt: skip
#: Expert counts: a config with more than one expert is a mixture of experts.
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
#: Keys a config derives from others (its ``__init__`` recomputes them from the shrunk ones).
DERIVED = ("out_features", "out_indices", "stage_names", "transformers_version")
#: Layer counts that are not the depth of a stack (they index a list that stays as it is).
NOT_DEPTH = ("num_feat_extract_layers", "num_adapter_layers")
LIST_WIDTH = ("hidden_sizes", "embed_dims", "dims", "channels", "conv_dim", "tdnn_dim",
              "embed_dim", "hidden_dims", "neck_hidden_sizes")  # fmt: skip
LIST_DEPTH = ("depths", "num_layers", "layers")


#: Heads of an attention that has as many key/value heads as query heads, when it does.
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
#: A key that names a width of another name (``codebook_dim``, ``out_hidden_size``,
#: ``condition_dim``...): one whose default is a shrunk width's default is tied to it (a config
#: validates ``codebook_dim == hidden_size``, a projector maps one model's width to another's).
DIM_LIKE = re.compile(r"dim|hidden|size|channels|features|width")
NOT_DIM = re.compile(r"vocab|position|image|patch|kernel|stride|window|chunk|length|bucket|"
                     r"sampl|rate|max_|num_|mel|group|batch|_len|frame|hop|fft|seq|codebook_size|"
                     r"cache|sliding|token|label|type|head|expert|layer|intermediate|ff")


#: Code that takes a multimodal rotary section absent from the config at a full-size default.
MROPE_DEFAULT = 'get("mrope_section", ['
#: Code that takes its heads as 64-channel slices of the width (BridgeTower's link tower).
WIDE_HEADS = "config.hidden_size // 64"
#: Code that takes a head size absent from the config as hidden // heads, and None as it is.
HEAD_DIM_DEFAULT = 'getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)'


def _scalar(key: str, value: int, d: dict[str, Any], widths: set[int]) -> int:
    if value <= 0:  # a part the config turns off (GLM-5's DSA layers: no rotary dims) stays off
        return value
    if key == "window_size" and "spatial_merge_size" in d:  # in pixels: a few merged patches
        return value
    if key in KV_HEADS:  # as many as the query heads stays so (a config may require it)
        heads = d.get("num_attention_heads", d.get("n_head"))
        return SMALL_HEADS if value == heads else 1 if value == 1 else 2
    if key in SMALL[37] and any(isinstance(d.get(k), int) and d[k] > 1 for k in EXPERTS):
        return 48  # an expert's width: grouped_mm wants 16-byte strides, which 37 floats miss
    for small, keys in SMALL.items():
        if key in keys:
            return small
    if key in CAPS:
        return min(value, CAPS[key])
    if LAYERS.search(key) and key not in NOT_DEPTH:
        return min(value, 2)
    if value in widths and DIM_LIKE.search(key) and not NOT_DIM.search(key):
        return 32  # a width under another name, tied to the shrunk one
    if value in widths and key.endswith("_groups"):
        return 32  # a depthwise convolution's groups, one per channel (Mimi's upsample_groups)
    return value


def _list(key: str, value: list[Any], widths: set[int] = frozenset()) -> list[Any]:
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    if key in LIST_WIDTH:  # channel widths: divided by one factor, so their ratios hold
        ratio = max(1, min(value) // 16)
        return [max(1, v // ratio) for v in value]
    if key in LIST_DEPTH:
        return [1] * len(value)
    if key in ("num_heads", "num_attention_heads", "attention_heads"):  # per stage
        return [max(1, v // min(value)) for v in value]
    if value[0] in widths and value[0] >= 32 and value[-1] not in widths and DIM_LIKE.search(key):
        # stage widths starting at the model's width (SAM 2's Hiera embed_dim_per_stage): the
        # first one is tied to the shrunk width, the others keep their ratios to it
        return [max(1, v * 32 // value[0]) for v in value]
    if value[-1] in widths and value[-1] >= 32 and DIM_LIKE.search(key):
        # stage widths ending at the model's width (EfficientLoFTR's out_features): the last
        # one is tied to the shrunk width, the others keep their ratios to it
        return [max(1, v * 32 // value[-1]) for v in value]
    return value


def _image(d: dict[str, Any]) -> None:
    """An image a few patches wide (a conv net's: 64 pixels, past its strides)."""
    patch = d.get("patch_size")
    patch = patch[0] if isinstance(patch, list) else patch
    side = max(4 * patch, 64) if isinstance(patch, int) and 0 < patch <= 32 else 64
    if isinstance(d.get("image_size"), int):
        d["image_size"] = side
    elif isinstance(d.get("image_size"), list) and len(d["image_size"]) == 2:
        d["image_size"] = [side, side]


def _per_layer(value: list[Any], layers: int) -> list[Any]:
    """A per-layer list cut to ``layers``, each kind of layer kept (``layer_types``
    ``[sliding x5, full, ...]`` -> ``[sliding, full]``: a model may require every kind it names,
    such as a rotary embedding per layer type)."""
    kinds = list(dict.fromkeys(map(repr, value)))
    if len(kinds) > layers:
        return value[:layers]
    firsts = [value[[repr(v) for v in value].index(k)] for k in kinds]
    return firsts + [value[0]] * (layers - len(firsts))


def _widths(d: dict[str, Any]) -> set[int]:
    """The defaults of every width :func:`shrink` sets to 32, in ``d`` and its sub-configs."""
    found = {v for k, v in d.items() if k in SMALL[32] and isinstance(v, int) and v > 32}
    for v in d.values():
        if isinstance(v, dict) and "model_type" in v:
            found |= _widths(v)
    return found


def shrink(
    d: dict[str, Any], ids: dict[int, int], widths: set[int] | None = None
) -> dict[str, Any]:
    """``d`` (a config's ``to_dict()``) shrunk, its sub-configs too; token ids past the new
    vocabulary mapped (consistently, through ``ids``) to distinct ones below it; keys tied to a
    width (equal to its default) following it; per-layer lists and dicts cut to the new depth.

    >>> out = shrink({"hidden_size": 768, "num_hidden_layers": 12, "layer_types": ["a"] * 12,
    ...               "vocab_size": 32000, "pad_token_id": 31999}, {})
    >>> out["hidden_size"], out["num_hidden_layers"], out["layer_types"], out["pad_token_id"]
    (32, 2, ['a', 'a'], 98)
    >>> out = shrink({"hidden_size": 512, "codebook_dim": 512, "num_attention_heads": 8,
    ...               "num_key_value_heads": 8, "num_hidden_layers": 4,
    ...               "layer_types": ["s", "s", "s", "f"], "per_layer_config": {"03": {}}}, {})
    >>> out["codebook_dim"], out["num_key_value_heads"], out["layer_types"], out["per_layer_config"]
    (32, 4, ['s', 'f'], {})
    """
    widths = _widths(d) if widths is None else widths
    counts = {v for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)
              and LAYERS.search(k) and k not in NOT_DEPTH and v > 2}  # fmt: skip
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key in DERIVED and not (key == "out_features" and _ints(value)):
            continue  # stage names, recomputed (a list of widths is not derived)
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value, ids, widths)
        elif isinstance(value, bool):
            out[key] = value
        elif key.endswith(("_token_id", "_token_index")):
            out[key] = _token(value, ids)
        elif key == "vocab_size" and isinstance(value, int):
            out[key] = VOCAB
        elif isinstance(value, int):
            out[key] = _scalar(key, value, d, widths)
        elif isinstance(value, list) and _per_layer_list(key, value, d, counts):
            out[key] = value[:2] if _ints(value) else _per_layer(value, 2)  # follow the depth
            out[key] = _list(key, out[key]) if key in LIST_DEPTH else out[key]  # one block each
        elif isinstance(value, list):
            out[key] = _list(key, value, widths)
        elif isinstance(value, dict) and "layer" in key and all(str(k).isdigit() for k in value):
            out[key] = {k: v for k, v in value.items() if int(k) < 2}  # per layer index
        elif isinstance(value, dict):
            out[key] = {k: _list(k, v) if isinstance(v, list) else v for k, v in value.items()}
        else:
            out[key] = value
    _image(out)
    _rope(out)
    zoo_args.image_token(out)
    zoo_args.invariants(d, out)
    if _reads(out.get("model_type"), WIDE_HEADS):  # heads of 64 channels: a width of 64, 1 head
        out.update({k: 64 for k in WIDTH if out.get(k) == 32})
    if "prediction_length" in out and out["prediction_length"] is None:
        out["prediction_length"] = 4  # a forecaster's horizon, which it has no default of
        context = out.get("context_length") or 4
        if isinstance(out.get("label_length"), int):  # the decoder's start, within the context
            out["label_length"] = min(out["label_length"], context)
    if out.get("head_dim", 0) is None and _reads(out.get("model_type"), HEAD_DIM_DEFAULT):
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]  # None is not absent
    return out


def _per_layer_list(key: str, value: list[Any], d: dict[str, Any], counts: set[int]) -> bool:
    """Whether ``value`` has one entry per layer: as long as ``num_hidden_layers``, or a list
    of layer kinds (not numbers: a per-stage list of heads is as long as a stage count) as long
    as another depth (GPT-Neo's ``attention_layers`` and ``num_layers``)."""
    if not value:
        return False
    if key in LIST_DEPTH:  # blocks per layer, as many as the layers (Muse Spark's depths)
        return len(value) == d.get("num_hidden_layers")
    return len(value) == d.get("num_hidden_layers") or (len(value) in counts and not _ints(value))


def _ints(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _rope(d: dict[str, Any]) -> None:
    """A multimodal rotary section (``mrope_section``: the rotary dimensions split among time,
    height and width) that sums to the shrunk head's rotary half, set where the model's code
    reads one it would otherwise take at its full-size default ([8, 12, 12])."""
    rope = d.get("rope_parameters")
    if not isinstance(rope, dict) or not _reads(d.get("model_type"), MROPE_DEFAULT):
        return
    heads = d.get("num_attention_heads") or SMALL_HEADS
    head = d.get("head_dim") or (d.get("hidden_size") or 32) // heads
    for params in [rope, *(v for v in rope.values() if isinstance(v, dict))]:
        if "rope_type" not in params:
            continue
        factor = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0
        half = int(head * factor) // 2
        params["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]


@functools.lru_cache
def _reads(model_type: Any, key: str) -> bool:
    """Whether ``model_type``'s modeling code names ``key``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return False
    module = sys.modules[CONFIG_MAPPING[model_type].__module__]
    config_file = Path(module.__file__)
    path = config_file.with_name(config_file.name.replace("configuration_", "modeling_"))
    return path.is_file() and key in path.read_text()


def _token(value: Any, ids: dict[int, int]) -> Any:
    if isinstance(value, list):
        return [_token(v, ids) for v in value]
    if isinstance(value, int) and value >= VOCAB:
        return ids.setdefault(value, VOCAB - 1 - len(ids))
    return value


def full_size(config: Any) -> bool:
    """Whether ``config`` is not a tiny one: the model's own width (:data:`WIDTH`) past 1024 or
    more than 8 layers. The causal LM tester sets ``hidden_size``, the layer count, heads and
    intermediate sizes, which a config that names them otherwise, such as CodeGen's ``n_embd``,
    leaves at its full default; what it leaves at default beside a tiny width (DeepSeek-V2's
    ``q_lora_rank`` of 1536, a low-rank projection of a 32-wide model) is not full size.

    >>> from transformers import CodeGenConfig, DeepseekV2Config
    >>> full_size(CodeGenConfig()), full_size(CodeGenConfig(n_embd=32, n_layer=2))
    (True, False)
    >>> full_size(DeepseekV2Config(hidden_size=32, num_hidden_layers=2, q_lora_rank=1536))
    False
    """
    return _full(config.to_dict())


def _full(d: dict[str, Any]) -> bool:
    wide = any(isinstance(d.get(k), int) and d[k] > 1024 for k in WIDTH)
    deep = any(isinstance(v, int) and not isinstance(v, bool) and v > 8
               for k, v in d.items() if LAYERS.search(k) and k not in NOT_DEPTH)  # fmt: skip
    subs = (v for v in d.values() if isinstance(v, dict) and "model_type" in v)
    return wide or deep or any(map(_full, subs))


def tiny_config(model_type: str) -> Any:
    """``model_type``'s config class, its defaults shrunk (:func:`shrink`)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    klass = CONFIG_MAPPING[model_type]
    small = shrink(klass().to_dict(), {})
    return klass.from_dict(small)


def _find(config: Any, key: str) -> Any:
    """``key``'s value in ``config`` or the first sub-config that has it."""
    if getattr(config, key, None) is not None:
        return getattr(config, key)
    for name in ("vision_config", "audio_config", "text_config", "encoder_config",
                 "backbone_config", "encoder", "decoder"):  # fmt: skip
        sub = getattr(config, name, None)
        if sub is not None and getattr(sub, key, None) is not None:
            return getattr(sub, key)
    return None


def _pixels(config: Any) -> Any:
    import torch

    side = _find(config, "image_size") or 64
    h, w = (side, side) if isinstance(side, int) else side[:2]
    return torch.rand(BATCH, _find(config, "num_channels") or 3, h, w)


def _features(config: Any) -> Any:
    import torch

    mels = _find(config, "num_mel_bins")
    if mels:  # whisper-like: (batch, mel bins, frames); a fixed-length encoder wants 2x its
        frames = 2 * (_find(config, "max_source_positions") or 30)  # positions
        return torch.rand(BATCH, mels, frames)
    width = (_find(config, "input_feat_per_channel") or _find(config, "feature_size") or 80) * (
        _find(config, "input_channels") or 1
    )
    return torch.rand(BATCH, 40, width)


def _patches(config: Any) -> tuple[Any, Any]:
    """A qwen-VL-style vision encoder's input: one image's flattened patches ``(t*h*w, channels
    * temporal patch * patch * patch)`` and its ``grid_thw`` ``[[t, h, w]]``, ``h`` and ``w``
    two spatial merges wide (the encoder merges ``m x m`` patches into one token)."""
    import torch

    merge = _first(config, MERGE) or 2
    merge = merge[0] if isinstance(merge, list) else merge  # Kimi's merge_kernel_size [2, 2]
    temporal = _first(config, TEMPORAL) or 1
    patch = _find(config, "patch_size") or 14
    channels = _find(config, "in_channels") or _find(config, "num_channels") or 3
    grid = torch.tensor([[1, 2 * merge, 2 * merge]])
    flat = torch.rand(4 * merge * merge, channels * temporal * patch * patch)
    return flat, grid


#: A packed-patch encoder's merge of ``m x m`` patches and temporal patch, under their names.
MERGE = ("spatial_merge_size", "merge_size", "merge_kernel_size")
TEMPORAL = ("temporal_patch_size", "patch_temporal")


def _first(config: Any, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` that ``config`` (or a sub-config) has."""
    return next((v for v in map(lambda k: _find(config, k), keys) if v is not None), None)


def _past(config: Any) -> Any:
    """A forecaster's history: ``(batch, context + the largest lag[, input size])``."""
    import torch

    context = _find(config, "context_length") or _find(config, "prediction_length") or 4
    length = context + max(_find(config, "lags_sequence") or [0])
    size = _find(config, "input_size") or 1
    return torch.rand(BATCH, length, *([size] if size > 1 else []))


def _required(
    params: Any, config: Any, inputs: dict[str, Any], main: str, ids: Any = None
) -> dict[str, Any]:
    """The arguments the forward requires beyond ``inputs``, built from the config and the main
    input's shape: a mask of the main input (``input_features_mask``...), layout boxes
    (``bbox``: ``(batch, seq, 4)`` corners, ordered), learned queries (``query_embeds``), the
    encoder output a cross-attention reads, a forecaster's time features and future values;
    any other required argument from its name (:func:`zoo_args.required`)."""
    import torch

    shape = inputs[main].shape
    out: dict[str, Any] = {}
    for name, p in params.items():
        if name in inputs or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if name == f"{main}_mask" or (name.endswith("_mask") and p.default is p.empty):
            out[name] = torch.ones(shape[:2], dtype=torch.long)
        elif name == "bbox":
            corners = torch.randint(0, 500, (*shape[:2], 2, (_find(config, "dim_bbox") or 4) // 2))
            out[name] = torch.cat([corners.min(2).values, corners.max(2).values + 1], dim=-1)
        elif name in ("past_time_features", "future_time_features"):
            length = shape[1] if name.startswith("past") else _find(config, "prediction_length")
            features = _find(config, "num_time_features")
            out[name] = torch.rand(shape[0], length, 1 if features is None else features)
        elif name == "future_values" and main == "past_values":  # the decoder's teacher values
            out[name] = torch.rand(shape[0], _find(config, "prediction_length"), *shape[2:])
        elif name == "encoder_hidden_states" and _find(config, "encoder_hidden_size"):
            # a cross-attending module (BLIP-2's Q-Former) reads another encoder's output
            width = _find(config, "encoder_hidden_size")
            out[name] = torch.rand(shape[0], SEQ, width)
        elif name == "query_embeds" and p.default is p.empty:
            queries = _find(config, "num_query_tokens") or 4
            out[name] = torch.rand(shape[0], queries, _find(config, "hidden_size") or 32)
        elif p.default is p.empty:
            value = zoo_args.required(name, {**inputs, **out}, main, ids)
            out.update({} if value is None else {name: value})
    return out


def _first_linear(model: Any) -> int | None:
    """The input width of ``model``'s first ``nn.Linear`` (in module order), if any."""
    from torch import nn

    first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    return None if first is None else first.in_features


def _layouts(
    floats: dict[str, list[Any]], params: Any, config: Any, inputs: dict[str, Any], main: str,
    ids: Any
) -> list[dict[str, Any]]:
    """``inputs`` with its float inputs in each other layout (:func:`zoo_args.layouts`), the
    arguments required beside them built again for each."""
    import itertools

    out = []
    for combo in list(itertools.product(*floats.values()))[1:]:
        tried = {**inputs, **dict(zip(floats, combo))}
        out.append({**tried, **_required(params, config, tried, main, ids)})
    return out


def _reshaped(model: Any, inputs: dict[str, Any], main: str, ids: Any) -> list[dict[str, Any]]:
    """``inputs`` with the main input in the other shapes a model of its kind may take: a row
    of ids per codebook, a series of channels, whole windows of features, audio as one channel
    or whole frames, features transposed, stacked or of 128 mel bins."""
    import torch

    config = model.config
    tries: list[dict[str, Any]] = []
    books = _find(config, "num_codebooks")
    if main == "input_ids" and isinstance(books, int) and books > 1:  # a row per codebook
        tries.append({k: v.repeat(books, 1) if v.shape == ids.shape else v  # (MusicGen)
                      for k, v in inputs.items()})  # fmt: skip
    if main == "past_values":  # a series of channels (PatchTST), as long as the context
        series = torch.rand(BATCH, _find(config, "context_length") or 4,
                            _find(config, "num_input_channels") or 1)  # fmt: skip
        tries.append({**inputs, main: series})
    window = _find(config, "n_window")
    if main == "input_features" and isinstance(window, int):  # whole windows of 2 x n_window
        frames = torch.rand(*inputs[main].shape[:2], 4 * window)  # its mask over the frames
        masks = {k: torch.ones(BATCH, 4 * window, dtype=torch.long) for k in inputs
                 if k.endswith("_mask")}  # fmt: skip
        tries.append({**inputs, main: frames, **masks})
    if main == "input_values":  # one channel; a length of whole frames of 96 samples and more
        tries += [{main: inputs[main][:, None]}, {**inputs, main: torch.rand(BATCH, 3840)}]
    if main == "input_features" and _find(config, "num_mel_bins"):  # (batch, frames, mel bins)
        tries.append({**inputs, main: inputs[main].transpose(1, 2)})
    if main == "input_features":  # frames stacked as the first linear reads them (Granite
        # Speech 5's 4 frames of mel bins, Fun-ASR's 7), or of 128 mel bins, the other common
        # count beside 80 (Gemma 4's audio tower sizes its projection for 128)
        for width in dict.fromkeys((_first_linear(model), MEL_BINS)):
            if width and width != inputs[main].shape[-1]:
                stacked = torch.rand(BATCH, 40, width)
                masks = {k: torch.ones(stacked.shape[:2], dtype=v.dtype) for k, v in inputs.items()
                         if k.endswith("_mask") and v.shape[:2] == inputs[main].shape[:2]}  # fmt: skip
                tries.append({**inputs, main: stacked, **masks})
    return tries


def inputs_for(model: Any) -> list[dict[str, Any]]:
    """Forward calls' inputs for ``model``, from its signature and ``main_input_name``, in the
    order tried: the main input alone (with what the forward requires beside it:
    :func:`_required`; a float input of the model's own layout in each layout its first layers
    read, :func:`zoo_args.layouts`); with the other modality beside it (a dual encoder such as
    CLIP wants both); images as a video of the config's frames; the main input reshaped
    (:func:`_reshaped`); packed patches flat or each an image; ids starting with an image's
    placeholder tokens where the call has an image (:func:`zoo_args.with_image_tokens`); with
    ``use_cache=False`` (a hybrid cache that raises on a first call)."""
    import torch

    config = model.config
    params = inspect.signature(model.forward).parameters
    vocab = min((_find(config, "vocab_size") or VOCAB), VOCAB) - 10  # clear of remapped ids
    ids = torch.randint(3, max(vocab, 4), (BATCH, SEQ))
    makers = {
        "input_ids": lambda: ids,
        "pixel_values": lambda: _pixels(config),
        "input_values": lambda: torch.rand(BATCH, 4000),
        "input_features": lambda: _features(config),
        "past_values": lambda: _past(config),
        "pixel_values_videos": lambda: zoo_args.video(config, _find, _pixels(config)),
    }
    grid_name = next((k for k in params if k.endswith("grid_thw")), None)
    first = next(iter(params))
    if grid_name and first != "input_ids":  # a vision encoder of packed patches (qwen-VL, GLM-4V)
        flat, grid = _patches(config)
        # flat rows of patches, or each patch as an image (Kimi-K2.5's patch embedding convolves)
        channels = _find(config, "in_channels") or _find(config, "num_channels") or 3
        side = _find(config, "patch_size") or 14
        square = flat.reshape(len(flat), channels, -1, side, side).squeeze(2)
        return [{first: flat, grid_name: grid}, {first: square, grid_name: grid}]
    main = zoo_args.main_of(params, getattr(model, "main_input_name", "input_ids"), makers)
    floats = zoo_args.layouts(model, params, main, makers)
    if main not in makers and not floats.get(main):
        raise LookupError(f"no generic input for main_input_name {main!r}")
    inputs = {main: makers[main]()} if main in makers else {}
    inputs.update({k: v[0] for k, v in floats.items()})
    inputs.update({k: make() for k, make in makers.items() if k not in inputs and k in params
                   and params[k].default is params[k].empty})  # fmt: skip - Xcodec2's features
    if "attention_mask" in params and main in ("input_ids", "input_values"):
        inputs["attention_mask"] = torch.ones(inputs[main].shape[:2], dtype=torch.long)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids[:, :5]
    inputs.update(zoo_args.flat_patches(model, params, inputs))
    inputs.update(_required(params, config, inputs, main, ids))
    tries = [inputs, *_layouts(floats, params, config, inputs, main, ids)]
    other = {"input_ids": "pixel_values", "pixel_values": "input_ids"}.get(main)
    if other in params:
        tries.append({**inputs, other: makers[other]()})
    if _find(config, "num_frames") or "Video" in type(model).__name__:  # images as a video
        tries += [{**t, k: zoo_args.video(config, _find, t[k])} for t in list(tries)
                  for k in ("pixel_values", "pixel_values_videos") if k in t]  # fmt: skip
    tries += _reshaped(model, inputs, main, ids)
    tries = [zoo_args.with_image_tokens(config, t, _find) for t in tries]
    if "use_cache" in params:
        tries += [{**t, "use_cache": False} for t in list(tries)]
    # each other modality the forward takes beside the main one (CLAP's audio beside its text;
    # PE's video beside its text), flat patches where their layout is an argument (SigLIP 2)
    others = [{**inputs, k: make()} for k, make in makers.items() if k in params and k != main]
    others = [{**t, **zoo_args.flat_patches(model, params, t)} for t in others]
    return tries + [zoo_args.with_image_tokens(config, t, _find) for t in others]


def generic(model_type: str) -> tuple[Any, dict[str, Any]]:
    """``model_type``'s shrunk config and inputs, proven by one plain fp32 forward.

    >>> config, inputs = generic("albert")
    >>> config.hidden_size, sorted(inputs)
    (32, ['attention_mask', 'input_ids'])
    """
    import torch

    torch.manual_seed(0)
    config = zoo_args.own_config(model_type, tiny_config(model_type))
    model = zoo_args.base_model(model_type, config).eval()
    torch.manual_seed(0)
    last: Exception | None = None
    for inputs in inputs_for(model):
        try:
            with torch.inference_mode():
                model(**inputs)
        except Exception as exc:  # noqa: BLE001 - the next try, else the last (fullest) one's
            last = exc
        else:
            return config, inputs
    raise last  # type: ignore[misc]
