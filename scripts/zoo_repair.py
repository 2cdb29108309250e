"""Repairs of a tester's tiny config or inputs where the model raises in a plain fp32 run (issue
42): the tester's config, not a capture, is what fails, so ampgraph was never tried on the type.

Each repair answers one mechanism, recognised by the plain run's error, and changes the config or
the inputs the way transformers' own tests would make them run; the zoo rebuilds the model from
them, keeps the repair only where the plain run then passes, and the record says what was
repaired (:func:`repair`). A repair never touches a model's code, and none runs where the plain
run did not raise with its mechanism.

- **grouped_mm's 16-byte strides.** transformers 5 runs a mixture of experts through
  ``torch.nn.functional.grouped_mm`` (on the CPU too, for torch > 2.10), whose kernels refuse a
  matrix whose row stride is not a multiple of 16 bytes, as the CUDA kernels do. The tests' tiny
  expert width (``intermediate_size=37``) gives fp32 rows of 148 bytes: the width is rounded up
  to a multiple of 8 elements (16 bytes in bf16 and fp16, the half setting's parameters).
- **a hybrid with no attention layer.** The tiny config's two layers are both recurrent (the
  layer pattern puts its first attention layer further down), and the hybrid cache's
  ``get_seq_length`` needs one: the last layer is made an attention layer, through whichever
  pattern field the config has.
- **the mel length the model asks for.** Whisper's encoder checks the mel frames against its
  positions: the input features are zero-padded (or cut) to the length its error names.
- **a language set.** X-MOD's adapters are chosen by language: the config's default language is
  its first one, as ``set_default_language`` would make it.
- **a mirrored width.** A sub-config that mirrors the model's width but holds the config
  class's default one (dbrx's ``ffn_config``): the model's width.
- **fp32 parameters.** A tester's config that asks for bf16 parameters (llama4's) meets its own
  fp32 inputs: the config's dtype is fp32, from which every setting of the zoo starts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

#: Elements a grouped_mm stride is rounded up to: 16 bytes in the 16-bit dtypes (4 would do for
#: fp32, the half setting's bf16 and fp16 parameters need 8).
STRIDE_ELEMENTS = 8


def round_up(value: int, to: int = STRIDE_ELEMENTS) -> int:
    """``value`` rounded up to a multiple of ``to``.

    >>> round_up(37), round_up(40), round_up(1)
    (40, 40, 8)
    """
    return -(-value // to) * to


def configs(config: Any) -> dict[str, Any]:
    """``config`` and its sub-configs that are set (a text config inside a multimodal one), by
    the path a record names them with.

    >>> from transformers import LlamaConfig
    >>> list(configs(LlamaConfig()))
    ['']
    """
    found = {"": config}
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            found[key] = sub
    return found


def expert_widths(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Round every size of ``config`` that is an expert matrix's width and not a multiple of
    :data:`STRIDE_ELEMENTS` up to one: the widths are read off the model's 3-D (stacked experts)
    parameters, and a concatenated gate and up projection (twice the width) counts too."""
    widths = set()
    for param in model.module.parameters():
        if param.dim() == 3:
            dims = param.shape[1:]
            # a width itself, or half a concatenated gate and up projection's
            widths |= {d for d in dims} | {d // 2 for d in dims if d % 2 == 0}
    changed = []
    for path, sub in configs(config).items():
        for key, value in sorted(vars(sub).items()):
            sized = "size" in key or "dim" in key
            if type(value) is int and sized and value in widths and value % STRIDE_ELEMENTS:
                setattr(sub, key, round_up(value))
                changed.append(f"{path + '.' if path else ''}{key} {value} -> {round_up(value)}")
    return ", ".join(changed) or None


def _layer_types(config: Any, n: int) -> None:
    config.layer_types = [*config.layer_types[: n - 1], "full_attention"]


def _attn_layer_indices(config: Any, n: int) -> None:
    config.attn_layer_indices = [n - 1]


def _attn_layer_period(config: Any, n: int) -> None:
    config.attn_layer_period, config.attn_layer_offset = n, n - 1


def _block_types(config: Any, n: int) -> None:
    config.block_types = [*config.block_types[: n - 1], "attention"]


#: The layer-pattern fields of transformers' hybrids, each with how it makes the last of ``n``
#: layers attention: a list of kinds (bailing_hybrid, granitemoehybrid, lfm3), the indices of the
#: attention layers (bamba), a period and offset (jamba), a repeated block pattern
#: (recurrent_gemma).
PATTERNS: tuple[tuple[str, Callable[[Any, int], None]], ...] = (
    ("layer_types", _layer_types),
    ("attn_layer_indices", _attn_layer_indices),
    ("attn_layer_period", _attn_layer_period),
    ("block_types", _block_types),
)


def has_attention(config: Any) -> bool:
    """Whether ``config``'s layer kinds (``layer_types``, which every hybrid maps its own pattern
    to) hold an attention layer.

    >>> from transformers import JambaConfig
    >>> has_attention(JambaConfig(num_hidden_layers=2)), has_attention(JambaConfig())
    (False, True)
    """
    kinds = getattr(config, "layer_types", None) or []
    return any(k.endswith("attention") and k != "linear_attention" for k in kinds)


def one_attention_layer(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Make the last layer of a hybrid ``config`` with no attention layer an attention layer,
    through the first pattern field (:data:`PATTERNS`) that has one: ``config`` is changed where
    one does, and what was set is returned."""
    n = config.num_hidden_layers
    for field, make in PATTERNS:
        if getattr(config, field, None) is None and field != "attn_layer_indices":
            continue
        trial = copy.deepcopy(config)
        try:
            make(trial, n)
        except (AttributeError, TypeError):  # a field the config derives (a property)
            continue
        if has_attention(trial):
            make(config, n)
            return f"{field} set: layer_types {list(config.layer_types)!r}"
    return None


def mel_length(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Zero-pad (or cut) the input features' frames to the length the model's error names."""
    import torch

    found = re.search(r"of length (\d+)", error)
    features = inputs.get("input_features")
    if found is None or not isinstance(features, torch.Tensor):
        return None
    want, have = int(found.group(1)), features.shape[-1]
    inputs["input_features"] = torch.nn.functional.pad(features, (0, want - have))
    return f"input_features frames {have} -> {want}"


def default_language(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Set ``config``'s default language to its first language."""
    languages = list(getattr(config, "languages", None) or [])
    if not languages:
        return None
    config.default_language = languages[0]
    return f"default_language {languages[0]!r}"


def fp32_parameters(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Build the model's parameters in fp32 where the tester's config asks for another dtype
    (llama4's tester sets ``torch_dtype=torch.bfloat16`` on its configs, and its fp32 pixels
    meet bf16 weights): every setting of the zoo starts from fp32 parameters, as a training
    run's master weights are."""
    import torch

    floats = [p for p in model.module.parameters() if p.is_floating_point()]
    if all(p.dtype == torch.float32 for p in floats):
        return None
    changed = []
    for path, sub in configs(config).items():
        dtype = getattr(sub, "dtype", None)
        if dtype is not None and str(dtype).removeprefix("torch.") != "float32":
            sub.dtype = torch.float32
            name = str(dtype).removeprefix("torch.")
            changed.append(f"{path + '.' if path else ''}dtype {name} -> float32")
    return ", ".join(changed) or None


def mirrored_width(config: Any, inputs: dict[str, Any], error: str, model: Any) -> str | None:
    """Give a sub-config that mirrors the model's width the model's width, where it holds the
    width of the config class's defaults instead: ``DbrxConfig`` copies ``d_model`` into its
    ``ffn_config`` before the tester's ``hidden_size`` (an alias of ``d_model``) is set, so the
    experts and router are 2048 wide beside 32-wide hidden states."""
    width = getattr(config, "hidden_size", None)
    try:
        default = getattr(type(config)(), "hidden_size", None)
    except Exception:  # noqa: BLE001 - a config class with no defaults has none to mirror
        return None
    changed = []
    for path, sub in configs(config).items():
        if path and width != default and getattr(sub, "hidden_size", None) == default:
            sub.hidden_size = width
            changed.append(f"{path}.hidden_size {default} -> {width}")
    return ", ".join(changed) or None


Repair = Callable[[Any, dict[str, Any], str, Any], "str | None"]

#: Each mechanism: what the plain run's error says, its name on the page, and its repair.
REPAIRS: tuple[tuple[str, str, Repair], ...] = (
    ("strides should be multiple of 16 bytes", "grouped_mm's 16-byte strides", expert_widths),
    ("can only be called on Attention layers", "a hybrid cache with no attention layer",
     one_attention_layer),
    ("expects the mel input features to be of length", "the mel length the model asks for",
     mel_length),
    ("Input language unknown", "no language set", default_language),
    ("shapes cannot be multiplied", "a sub-config left at the default width the model mirrors",
     mirrored_width),
    ("to have the same dtype", "a tester's config asking for 16-bit parameters",
     fp32_parameters),
)  # fmt: skip


def repair(
    config: Any, inputs: dict[str, Any], error: str, model: Any
) -> tuple[Any, dict[str, Any], str] | None:
    """Copies of ``config`` and ``inputs`` repaired for the mechanism the plain run's ``error``
    names, with what was repaired; None where no repair knows the error or where the one that
    does finds nothing to change. ``model`` is the model built from them.

    >>> repair(None, {}, "RuntimeError: something else", None) is None
    True
    """
    for key, mechanism, fix in REPAIRS:
        if key in error:
            config, inputs = copy.deepcopy(config), copy.deepcopy(inputs)
            what = fix(config, inputs, error, model)
            return None if what is None else (config, inputs, f"{what} ({mechanism})")
    return None
