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

import inspect
import re
from typing import Any

SOURCE = "generic tester (config defaults shrunk, inputs from the forward signature)"
BATCH, SEQ, VOCAB = 2, 7, 99
#: Scalar keys and the value a tester gives them (the shapes of ``BertModelTester`` and kin).
SMALL = {
    32: ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "hidden_dim",
         "word_embed_proj_dim", "projection_dim", "proj_dim", "embedding_size", "emb_dim",
         "d_embed", "text_embed_dim", "vision_embed_dim", "encoder_hidden_size",
         "proj_codevector_dim", "codevector_dim", "classifier_proj_size", "output_hidden_size",
         "projector_hidden_size", "hidden_channels", "kv_lora_rank", "q_lora_rank",
         "encoder_embed_dim", "decoder_embed_dim", "decoder_hidden_size"),
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
        "max_source_positions": 30, "max_target_positions": 40}  # fmt: skip
#: Keys a config derives from others (its ``__init__`` recomputes them from the shrunk ones).
DERIVED = ("out_features", "out_indices", "stage_names", "transformers_version")
#: Layer counts that are not the depth of a stack (they index a list that stays as it is).
NOT_DEPTH = ("num_feat_extract_layers", "num_adapter_layers")
LIST_WIDTH = ("hidden_sizes", "embed_dims", "dims", "channels", "conv_dim", "tdnn_dim",
              "embed_dim", "hidden_dims", "neck_hidden_sizes")  # fmt: skip
LIST_DEPTH = ("depths", "num_layers", "layers")


def _scalar(key: str, value: int) -> int:
    if key in ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"):
        return 1 if value == 1 else 2
    for small, keys in SMALL.items():
        if key in keys:
            return small
    if key in CAPS:
        return min(value, CAPS[key])
    if LAYERS.search(key) and key not in NOT_DEPTH:
        return min(value, 2)
    return value


def _list(key: str, value: list[Any]) -> list[Any]:
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    if key in LIST_WIDTH:  # channel widths: divided by one factor, so their ratios hold
        ratio = max(1, min(value) // 16)
        return [max(1, v // ratio) for v in value]
    if key in LIST_DEPTH:
        return [1] * len(value)
    if key in ("num_heads", "num_attention_heads", "attention_heads"):  # per stage
        return [max(1, v // min(value)) for v in value]
    if key == "mrope_section":  # must sum to half the (now 8) head dimension
        return ([2, 1, 1] + [0] * len(value))[: len(value)]
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


def shrink(d: dict[str, Any], ids: dict[int, int]) -> dict[str, Any]:
    """``d`` (a config's ``to_dict()``) shrunk, its sub-configs too; token ids past the new
    vocabulary mapped (consistently, through ``ids``) to distinct ones below it.

    >>> out = shrink({"hidden_size": 768, "num_hidden_layers": 12, "layer_types": ["a"] * 12,
    ...               "vocab_size": 32000, "pad_token_id": 31999}, {})
    >>> out["hidden_size"], out["num_hidden_layers"], out["layer_types"], out["pad_token_id"]
    (32, 2, ['a', 'a'], 98)
    """
    out: dict[str, Any] = {}
    layers = d.get("num_hidden_layers")
    for key, value in d.items():
        if key in DERIVED:
            continue
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value, ids)
        elif isinstance(value, bool):
            out[key] = value
        elif key.endswith(("_token_id", "_token_index")):
            out[key] = _token(value, ids)
        elif key == "vocab_size" and isinstance(value, int):
            out[key] = VOCAB
        elif isinstance(value, int):
            out[key] = _scalar(key, value)
        elif isinstance(value, list) and layers and len(value) == layers and key != "depths":
            out[key] = value[:2]  # per-layer lists (layer_types...) follow the layer count
        elif isinstance(value, list):
            out[key] = _list(key, value)
        elif isinstance(value, dict):
            out[key] = {k: _list(k, v) if isinstance(v, list) else v for k, v in value.items()}
        else:
            out[key] = value
    _image(out)
    return out


def _token(value: Any, ids: dict[int, int]) -> Any:
    if isinstance(value, list):
        return [_token(v, ids) for v in value]
    if isinstance(value, int) and value >= VOCAB:
        return ids.setdefault(value, VOCAB - 1 - len(ids))
    return value


def full_size(config: Any) -> bool:
    """Whether ``config`` is not a tiny one: a hidden width past 1024 or more than 8 layers (the
    causal LM tester sets ``hidden_size``..., which a config that names them otherwise, such as
    CodeGen's ``n_embd``, leaves at its full default).

    >>> from transformers import CodeGenConfig
    >>> full_size(CodeGenConfig()), full_size(CodeGenConfig(n_embd=32, n_layer=2))
    (True, False)
    """
    return _full(config.to_dict())


def _full(d: dict[str, Any]) -> bool:
    wide = any(isinstance(d.get(k), int) and d[k] > 1024 for k in SMALL[32])
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


def inputs_for(model: Any) -> list[dict[str, Any]]:
    """Forward calls' inputs for ``model``, from its signature and ``main_input_name``, in the
    order tried: the main input alone; with the other modality beside it (a dual encoder such as
    CLIP wants both); audio as one channel ``(batch, 1, samples)`` (a codec's convolutions);
    with ``use_cache=False`` (a hybrid cache that raises on a first call)."""
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
    }
    main = getattr(model, "main_input_name", "input_ids")
    main = main if main in params else next((k for k in makers if k in params), main)
    if main not in makers:
        raise LookupError(f"no generic input for main_input_name {main!r}")
    inputs = {main: makers[main]()}
    if "attention_mask" in params and main in ("input_ids", "input_values"):
        inputs["attention_mask"] = torch.ones(inputs[main].shape[:2], dtype=torch.long)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids[:, :5]
    tries = [inputs]
    other = {"input_ids": "pixel_values", "pixel_values": "input_ids"}.get(main)
    if other in params:
        tries.append({**inputs, other: makers[other]()})
    if main == "input_values":
        tries.append({main: inputs[main][:, None]})
    if "use_cache" in params:
        tries += [{**t, "use_cache": False} for t in list(tries)]
    return tries


def generic(model_type: str) -> tuple[Any, dict[str, Any]]:
    """``model_type``'s shrunk config and inputs, proven by one plain fp32 forward.

    >>> config, inputs = generic("albert")
    >>> config.hidden_size, sorted(inputs)
    (32, ['attention_mask', 'input_ids'])
    """
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    config = tiny_config(model_type)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
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
