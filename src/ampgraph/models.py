"""Model specs: what to analyse, built on the meta device so that no weights are ever needed.

A spec is a bundled config name (``opt-125m``, the default), a path to a Hugging Face
``config.json``, or ``package.module:factory`` for any ``nn.Module``. Building one returns a
:class:`ModelInputs`: the module plus the example inputs to trace it with. Hugging Face models get
synthesised token ids (no tokenizer) shaped like a tokenizer's output: ``input_ids`` and an
``attention_mask`` of ones, both int64, as in the seed notebook.

>>> m = load_model("opt-125m", seq_len=8)          # doctest: +SKIP
>>> type(m.module).__name__, m.kwargs["input_ids"].shape
('OPTForCausalLM', torch.Size([1, 8]))
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampgraph.errors import ModelSpecError

DEFAULT_MODEL = "opt-125m"


@dataclass
class ModelInputs:
    """A module and the example inputs that one forward call takes."""

    name: str
    module: nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def bundled_models() -> dict[str, str]:
    """Bundled config names and the Hugging Face model each is shaped like."""
    out: dict[str, str] = {}
    for entry in sorted(resources.files("ampgraph.configs").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            out[entry.name.removesuffix(".json")] = str(data.get("_name_or_path", ""))
    return out


def _read_config(spec: str) -> tuple[str, dict[str, Any]]:
    bundled = resources.files("ampgraph.configs") / f"{spec.lower()}.json"
    if bundled.is_file():
        return spec.lower(), json.loads(bundled.read_text())
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.name == "config.json":
        if not path.is_file():
            raise ModelSpecError(f"config file {str(path)!r} does not exist")
        try:
            return path.parent.name or path.stem, json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelSpecError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    names = ", ".join(bundled_models())
    raise ModelSpecError(
        f"unknown model {spec!r}: use a bundled name ({names}), a path to a config.json, "
        "or package.module:factory"
    )


def build_hf_model(config_dict: dict[str, Any]) -> nn.Module:
    """Instantiate a Hugging Face causal LM from a config dict on the meta device (no weights).

    The module is put in eval mode, as the seed notebook does before its forward passes.
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - transformers is a core dependency
        raise ModelSpecError(f"transformers is needed for this model: {exc}") from None
    data = {k: v for k, v in config_dict.items() if not k.startswith("_")}
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ModelSpecError("the config has no 'model_type': is it a Hugging Face config.json?")
    try:
        config = AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        raise ModelSpecError(
            f"transformers does not know model_type {model_type!r} ({exc}); "
            "upgrade transformers or use --module package.module:factory"
        ) from None
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError as exc:
            raise ModelSpecError(f"cannot build a causal LM from this config: {exc}") from None
    return model.eval()


def token_inputs(vocab_size: int, seq_len: int, batch: int = 1) -> dict[str, torch.Tensor]:
    """Synthesised tokenizer output: ``input_ids`` and an all-ones ``attention_mask``, int64."""
    if seq_len < 1:
        raise ModelSpecError(f"--seq-len must be at least 1, not {seq_len}")
    ids = (torch.arange(batch * seq_len, dtype=torch.int64) % max(vocab_size - 1, 1)) + 1
    return {
        "input_ids": ids.reshape(batch, seq_len),
        "attention_mask": torch.ones(batch, seq_len, dtype=torch.int64),
    }


def _load_factory(spec: str) -> ModelInputs:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"cannot import {spec!r}: {exc}") from None
    try:
        made = factory()
    except Exception as exc:  # a user factory may raise anything; report it in one line
        raise ModelSpecError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(made, ModelInputs):
        return made
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, example = made
        args = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        return ModelInputs(spec, module.eval(), args)
    raise ModelSpecError(
        f"factory {spec!r} must return (module, example_inputs) or ampgraph.ModelInputs, "
        f"not {type(made).__name__}"
    )


def load_model(spec: str = DEFAULT_MODEL, *, seq_len: int = 8) -> ModelInputs:
    """Build the model a spec names, with example inputs, on the meta device.

    ``spec`` is a bundled name (see :func:`bundled_models`), a ``config.json`` path or a model
    folder holding one, or ``package.module:factory``.
    """
    if ":" in spec and not Path(spec).exists():
        return _load_factory(spec)
    name, config = _read_config(spec)
    model = build_hf_model(config)
    vocab = int(getattr(model.config, "vocab_size", 2))
    kwargs: dict[str, Any] = {**token_inputs(vocab, seq_len), "use_cache": False}
    return ModelInputs(name, model, (), kwargs)
