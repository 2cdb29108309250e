"""The zoo's generic tester's arguments beyond the main input (issue 42, docs/zoo.md): the values a
base model's forward requires, built from the argument's name, the config and the model's first
layer, as :mod:`zoo_generic` builds the main input from ``main_input_name``.

A required argument that names token ids (``qformer_input_ids``, ``classes_input_ids``) gets ids;
one that names a padding of the main input (``past_values_padding``) gets none padded; a float
input whose layout only the model knows (``hidden_states``, ``latents``, ``action_embeds``,
``inputs_embeds``) is offered as the model's first layer reads it, ``(batch, seq, width of the
first linear)`` or ``(batch, channels of the first convolution, length)``, and the generic
tester keeps the first call that runs. A video is ``(batch, frames, channels, height, width)``.
"""

from __future__ import annotations

from typing import Any

BATCH, SEQ = 2, 7
#: Float inputs a forward may require whose layout is the model's own.
FLOAT_INPUTS = ("hidden_states", "latents", "inputs_embeds", "encoder_inputs_embeds")
#: Lengths a convolution's input is offered at: a few latent frames, or a stretch of audio in
#: whole frames of up to 3840 samples (a codec's hop).
CONV_LENGTHS = (8, 3840)


def first_layers(model: Any) -> tuple[int | None, int | None]:
    """The input width of ``model``'s first ``nn.Linear`` and the input channels of its first
    1-d convolution (in module order), each None where there is none.

    >>> from torch import nn
    >>> first_layers(nn.Sequential(nn.Conv1d(3, 4, 1), nn.Linear(5, 6)))
    (5, 3)
    """
    from torch import nn

    linear = next((m.in_features for m in model.modules() if isinstance(m, nn.Linear)), None)
    conv = next((m.in_channels for m in model.modules() if isinstance(m, nn.Conv1d)), None)
    return linear, conv


def float_inputs(model: Any) -> list[Any]:
    """A float input of a layout only the model knows, in each layout its first layers read.

    >>> from torch import nn
    >>> [tuple(t.shape) for t in float_inputs(nn.Sequential(nn.Conv1d(3, 4, 1)))]
    [(2, 3, 8), (2, 3, 3840)]
    """
    import torch

    linear, conv = first_layers(model)
    out = [torch.rand(BATCH, SEQ, linear)] if linear else []
    out += [torch.rand(BATCH, conv, n) for n in CONV_LENGTHS] if conv else []
    return out


def video(config: Any, find: Any, pixels: Any) -> Any:
    """A video of ``config``'s frame count (``num_frames``, else 2) of images like ``pixels``.

    >>> import torch
    >>> video(None, lambda c, k: {"num_frames": 3}.get(k), torch.rand(2, 3, 4, 4)).shape
    torch.Size([2, 3, 3, 4, 4])
    """
    frames = find(config, "num_frames") or 2
    return pixels[:, None].expand(-1, frames, *pixels.shape[1:]).contiguous()


def positions(patches: int) -> Any:
    """Patch positions ``(batch, patches, 2)`` as (x, y) on a square grid of ``patches``.

    >>> positions(4)[0].tolist()
    [[0, 0], [1, 0], [0, 1], [1, 1]]
    """
    import torch

    side = int(patches**0.5)
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    grid = torch.stack([x.flatten(), y.flatten()], dim=-1)
    return grid[None].expand(BATCH, -1, -1).contiguous()


def required(name: str, inputs: dict[str, Any], main: str, ids: Any) -> Any:
    """A value for the required argument ``name`` of a forward given ``inputs`` (its main input
    ``main``), or None where the name says nothing of it.

    >>> import torch
    >>> v = {"past_values": torch.rand(2, 5)}
    >>> required("past_values_padding", v, "past_values", None).shape
    torch.Size([2, 5])
    >>> required("qformer_input_ids", v, "past_values", torch.ones(2, 7)).shape
    torch.Size([2, 7])
    """
    import torch

    shape = inputs[main].shape
    if name.endswith("input_ids"):  # a second text (InstructBLIP's Q-Former prompt, OmDet's classes)
        return ids
    if name == f"{main}_padding":  # none of the main input padded (TimesFM's past values)
        return torch.zeros(shape[:2], dtype=torch.long)
    if name == "freq":  # a forecaster's frequency class, the first (TimesFM)
        return torch.zeros(shape[0], 1, dtype=torch.long)
    if name.endswith("_structure"):  # one class of the batch's texts per image (OmDet-Turbo)
        return torch.ones(shape[0], dtype=torch.long)
    if name.endswith("position_ids") and len(shape) == 3:  # flat patches' (x, y) on a grid
        return positions(shape[1])
    return None


def is_float_input(name: str) -> bool:
    """Whether ``name`` is a float input whose layout only the model knows.

    >>> is_float_input("action_embeds"), is_float_input("query_embeds"), is_float_input("input_ids")
    (True, False, False)
    """
    # learned queries are built from the config (zoo_generic._required)
    return name in FLOAT_INPUTS or (name.endswith("_embeds") and name != "query_embeds")


def main_of(params: Any, main: str, known: Any) -> str:
    """The forward's main input: ``main_input_name`` where the forward takes it, else the first
    input the generic tester makes (``known``) that it takes, else its first required float input
    (VibeVoice's tokenizers name ``input_values`` and take ``hidden_states``), else
    ``main_input_name`` still (a forward that takes it through ``**kwargs``).

    >>> import inspect
    >>> main_of(inspect.signature(lambda hidden_states, x=1: 0).parameters, "input_values", ())
    'hidden_states'
    """
    if main in params:
        return main
    given = next((k for k in known if k in params), None)
    if given is not None:
        return given
    floats = (k for k, p in params.items() if p.default is p.empty and is_float_input(k))
    return next(floats, main)


def layouts(model: Any, params: Any, main: str, known: Any) -> dict[str, list[Any]]:
    """Each float input the forward requires (the main one, where no maker ``known`` makes it)
    in every layout the model's first layers read (:func:`float_inputs`)."""
    names = [k for k, p in params.items() if is_float_input(k)
             and (p.default is p.empty or k == main) and k not in known]  # fmt: skip
    return {k: float_inputs(model) for k in names} if names else {}


#: The image placeholder token a query-token config that has none gets (BLIP-2's tester's
#: choice is its own; any id clear of the drawn ids and of the remapped special ones serves).
IMAGE_TOKEN = 89
#: The number of placeholder tokens an image takes, under its names.
IMAGE_TOKENS = ("num_query_tokens", "image_seq_length", "mm_tokens_per_image")


def image_token(d: dict[str, Any]) -> None:
    """A query-token config (BLIP-2, InstructBLIP) without an image placeholder token given one:
    its forward places the image's query outputs at that token in ``input_ids``.

    >>> d = {"num_query_tokens": 32, "image_token_index": None}
    >>> image_token(d); d["image_token_index"]
    89
    """
    for key in ("image_token_index", "video_token_index"):  # InstructBLIP-Video's is a video's
        if "num_query_tokens" in d and d.get(key, 0) is None:
            d[key] = IMAGE_TOKEN


def with_image_tokens(config: Any, inputs: dict[str, Any], find: Any) -> dict[str, Any]:
    """``inputs`` whose ``input_ids`` start with as many image placeholder tokens as an image
    takes, where the config has a placeholder and the call gives both ids and an image.

    >>> import torch
    >>> class C: image_token_id, num_query_tokens = 5, 2
    >>> out = with_image_tokens(C(), {"input_ids": torch.ones(1, 3, dtype=torch.long),
    ...                               "pixel_values": 0}, lambda c, k: getattr(c, k, None))
    >>> out["input_ids"].tolist()
    [[5, 5, 1, 1, 1]]
    """
    import torch

    pixels = next((v for k, v in inputs.items() if k.startswith("pixel_values")), None)
    video = getattr(pixels, "ndim", 0) == 5  # a video's frames each take the image's tokens
    token = find(config, "video_token_id") if video else None
    token = find(config, "image_token_id") if token is None else token
    count = next((find(config, k) for k in IMAGE_TOKENS if find(config, k)), None)
    if token is None or not count or "input_ids" not in inputs or pixels is None:
        return inputs
    count *= pixels.shape[1] if video else 1
    ids = inputs["input_ids"]
    tokens = torch.full((ids.shape[0], count), token, dtype=ids.dtype)
    out = {**inputs, "input_ids": torch.cat([tokens, ids], dim=1)}
    if "attention_mask" in inputs:  # the text's mask, as long as the text
        out["attention_mask"] = torch.ones(out["input_ids"].shape, dtype=torch.long)
    return out


#: Lists of stage widths (zoo_generic.LIST_WIDTH's, whose first value a stem's width may share).
LIST_WIDTHS = ("hidden_sizes", "embed_dims", "dims", "channels", "hidden_dims")


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def invariants(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Relations between sizes that held in the config's defaults ``d``, made to hold again in
    the shrunk ``out`` (a config validates them, or its layers assume them): a head as wide as
    its two rotary parts (``head_dim == qk_nope_head_dim + qk_rope_head_dim``, DOTS-3's sliding
    layers); a state-space model's heads spanning its expanded width (``hidden_size * expand ==
    num_heads * head_dim``, Mamba-2); grouped convolutions' widths divisible by their groups
    (SqueezeBERT's 4 groups of a 37-wide feed-forward); rotary parameters for each layer kind
    (none in Cohere Compass's defaults); layer indices past the new depth
    (``vision_feature_layer`` [24, 18]) counted from the top, their order kept.

    >>> d = {"hidden_size": 4096, "expand": 2, "num_heads": 128, "head_dim": 64}
    >>> out = {"hidden_size": 32, "expand": 2, "num_heads": 4, "head_dim": 8}
    >>> invariants(d, out); out["num_heads"]
    8
    >>> out = {"vision_feature_layer": [24, 18], "intermediate_size": 37}
    >>> invariants({"intermediate_groups": 4}, out); out["vision_feature_layer"], out["intermediate_size"]
    ([-1, -2], 48)
    """
    parts = ("qk_nope_head_dim", "qk_rope_head_dim")
    if all(isinstance(d.get(k), int) for k in ("head_dim", *parts)):
        if d["head_dim"] == d[parts[0]] + d[parts[1]]:
            out["head_dim"] = out[parts[0]] + out[parts[1]]
    keys = ("hidden_size", "expand", "num_heads", "head_dim")
    if all(isinstance(d.get(k), int) and d[k] > 0 for k in keys):
        if d["hidden_size"] * d["expand"] == d["num_heads"] * d["head_dim"]:
            out["num_heads"] = max(1, out["hidden_size"] * out["expand"] // out["head_dim"])
    if isinstance(d.get("intermediate_groups"), int) and d["intermediate_groups"] > 1:
        if out.get("intermediate_size") == 37:  # 48: divisible by 2, 4, 8 or 16 groups
            out["intermediate_size"] = 48
    kinds = out.get("layer_types")
    if out.get("rope_parameters") == {} and isinstance(kinds, list) and kinds:
        # rotary parameters per layer kind, none given (Cohere Compass's defaults): the default
        # rotary embedding for each kind, as a tester gives
        out["rope_parameters"] = {k: {"rope_type": "default", "rope_theta": 10000.0}
                                  for k in dict.fromkeys(kinds)}  # fmt: skip
    for key in LIST_WIDTHS:  # a stem's channels, tied to the first stage's (TextNet)
        if _ints(d.get(key)) and _ints(out.get(key)):
            first, shrunk = d[key][0], out[key][0]
            for k, v in d.items():
                if k.endswith("_channels") and v == first and out.get(k) == v:
                    out[k] = shrunk
    for key, value in out.items():
        if "feature_layer" in key and isinstance(value, list) and value and all(
            isinstance(v, int) and v >= 2 for v in value
        ):
            order = sorted(value, reverse=True)
            out[key] = [-1 - order.index(v) for v in value]


def base_class(model_type: str, config: Any) -> Any:
    """The base model class of ``model_type`` (of a type with two, the config's architecture),
    None where transformers lacks the class its mapping names.

    >>> from transformers import BertConfig
    >>> base_class("bert", BertConfig()).__name__
    'BertModel'
    """
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    names = MODEL_MAPPING_NAMES[model_type]
    names = (names,) if isinstance(names, str) else names
    chosen = [n for n in names if n in (getattr(config, "architectures", None) or ())]
    return getattr(transformers, (chosen or names)[0], None)


def own_config(model_type: str, config: Any) -> Any:
    """The config the base model class of ``model_type`` is built from: ``config``, or its
    sub-config of the class's config class where the type's config is a wrapper around it
    (``MusicgenModel`` is the decoder of a ``MusicgenConfig``, built from its ``decoder``).

    >>> from transformers import MusicgenConfig
    >>> type(own_config("musicgen", MusicgenConfig())).__name__
    'MusicgenDecoderConfig'
    """
    want = getattr(base_class(model_type, config), "config_class", None)
    if not isinstance(want, type) or isinstance(config, want):
        return config
    subs = (v for v in vars(config).values() if isinstance(v, want))
    return next(subs, config)


def base_model(model_type: str, config: Any) -> Any:
    """``model_type``'s base model built from ``config`` with eager attention: through
    ``AutoModel``, or, where its mapping does not know the config's class (a sub-config, see
    :func:`own_config`; EvOlla's config, which its mapping lists but does not resolve), from the
    type's base class itself."""
    from transformers import AutoModel

    try:
        return AutoModel.from_config(config, attn_implementation="eager")
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
    klass = base_class(model_type, config)
    if klass is None:  # a mapping that names a class its module lacks (voxtral_realtime_text)
        raise LookupError(f"transformers has no base class of {model_type}")
    return klass._from_config(config, attn_implementation="eager")


#: Patches a flat-patch encoder takes beside their layout: a 4 x 4 grid.
PATCHES = 16


def flat_patches(model: Any, params: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Images as flat patches ``(batch, 16, width of the first linear)``, a 4 x 4 grid, with the
    layout the forward takes beside them: their (x, y) positions (Gemma 4's
    ``pixel_position_ids``), or the grid's shape and a mask of the patches (SigLIP 2's
    ``spatial_shapes`` and ``pixel_attention_mask``); nothing where it takes no layout.

    >>> import inspect, torch
    >>> from torch import nn
    >>> m = nn.Linear(12, 4)
    >>> m.config = type("C", (), {"num_channels": 3, "patch_size": 2})()
    >>> params = inspect.signature(lambda pixel_values, spatial_shapes: 0).parameters
    >>> out = flat_patches(m, params, {"pixel_values": torch.rand(2, 3, 8, 8)})
    >>> tuple(out["pixel_values"].shape), out["spatial_shapes"].tolist()
    ((2, 16, 12), [[4, 4], [4, 4]])
    """
    import torch

    width = patch_width(model.config)
    if "pixel_values" not in inputs or not width:
        return {}
    flat = {"pixel_values": torch.rand(BATCH, PATCHES, width)}
    if "pixel_position_ids" in params:
        return {**flat, "pixel_position_ids": positions(PATCHES)}
    if "spatial_shapes" in params:
        side = int(PATCHES**0.5)
        shapes = torch.tensor([[side, side]] * BATCH)
        return {**flat, "spatial_shapes": shapes,
                "pixel_attention_mask": torch.ones(BATCH, PATCHES, dtype=torch.long)}  # fmt: skip
    return {}


def patch_width(config: Any) -> int | None:
    """A flat patch's width, ``channels x patch x patch``, from ``config`` or its vision
    sub-config; None where neither has a patch size.

    >>> patch_width(type("C", (), {"vision_config": type("V", (), {"patch_size": 16})()})())
    768
    """
    for c in (config, getattr(config, "vision_config", None)):
        patch = getattr(c, "patch_size", None)
        if isinstance(patch, int):
            return (getattr(c, "num_channels", None) or 3) * patch * patch
    return None
