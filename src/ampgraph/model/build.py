"""Model specs: what to analyse, built on the meta device so that no weights are ever needed.

A spec is one of

* a bundled name (``opt-125m``, the default; ``ampgraph models`` lists them all, see
  :func:`catalogue`): a Hugging Face ``config.json`` shipped in ``ampgraph/model/configs``, or a
  Python-built model such as torchvision's ResNet-18 where torchvision is installed;
* a path to any Hugging Face ``config.json``, or a local Hugging Face model folder holding one
  (offline: only the config is read, weights are never opened);
* ``package.module:factory`` (or ``path/to/file.py:factory``) for any ``nn.Module``. The factory
  takes no arguments and returns ``(module, example_inputs)``, ``(module, args, kwargs)`` or a
  :class:`ModelInputs`. ``example_inputs`` is a tensor, a tuple/list of positional arguments or a
  dict of keyword arguments; only their shapes and dtypes matter (meta tensors are fine).

The CLI's ``--config``, ``--model-dir`` and ``--module`` say which kind a spec is; the positional
``MODEL`` is recognised by its form (:class:`~ampgraph.model.specs.ModelSpec`).

Hugging Face models get synthesised token ids (no tokenizer) shaped like a tokenizer's output, as
in the seed notebook: ``input_ids`` and an ``attention_mask`` of ones, both int64, plus what the
architecture needs (BERT's ``token_type_ids``, T5's ``decoder_input_ids``; see
:data:`ARCHITECTURES`).

>>> m = load_model("opt-125m", seq_len=8)
>>> type(m.module).__name__, m.kwargs["input_ids"].shape
('OPTForCausalLM', torch.Size([1, 8]))
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampgraph.errors import ModelSpecError, clip, first_line
from ampgraph.model.specs import ModelSpec, bundled_key, resolve_config, spec_kind
from ampgraph.model.usercode import ModelExited
from ampgraph.torchutil import quiet_library_imports

DEFAULT_MODEL = "opt-125m"


@dataclass
class ModelInputs:
    """A module and the example inputs that one forward call takes: what the loader returns.

    How it is traced is the analysis's choice (``tracer=`` of :func:`ampgraph.analyze`, see
    :mod:`ampgraph.capture.tracers`), not the model's.
    """

    name: str
    module: nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: How the capture traces the module in each setting: ``make-fx`` (the default) or
    #: ``export`` (``--tracer export``), set by :func:`ampgraph.pipeline.stages.trace`.
    engine: str = "make-fx"


# -- Hugging Face architectures: how to build and feed each model type (data, not branches) ------


@dataclass(frozen=True)
class Architecture:
    """How to build one Hugging Face ``model_type`` and which synthesised inputs it takes.

    ``auto_class`` is the ``transformers`` Auto class used when the config's ``architectures``
    does not name a class that transformers exports; ``inputs`` are keys of :data:`TOKEN_INPUTS`.
    """

    auto_class: str = "AutoModelForCausalLM"
    inputs: tuple[str, ...] = ("input_ids", "attention_mask")


#: Model types that are not causal LMs, or that need more than token ids and a mask.
ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("AutoModelForMaskedLM", ("input_ids", "attention_mask", "token_type_ids")),
    "roberta": Architecture("AutoModelForMaskedLM"),
    "distilbert": Architecture("AutoModelForMaskedLM"),
    "t5": Architecture(
        "AutoModelForSeq2SeqLM", ("input_ids", "attention_mask", "decoder_input_ids")
    ),
    "bart": Architecture(
        "AutoModelForSeq2SeqLM", ("input_ids", "attention_mask", "decoder_input_ids")
    ),
}
CAUSAL_LM = Architecture()


def _token_ids(vocab: int, batch: int, seq_len: int) -> torch.Tensor:
    # Ids 1..vocab-1: never 0, which is the pad token of several vocabularies.
    ids = (torch.arange(batch * seq_len, dtype=torch.int64) % max(vocab - 1, 1)) + 1
    return ids.reshape(batch, seq_len)


def _decoder_ids(vocab: int, batch: int, seq_len: int) -> torch.Tensor:
    # A decoder fed its start token (0 for T5 and BART-likes) followed by ordinary ids.
    ids = _token_ids(vocab, batch, seq_len)
    ids[:, 0] = 0
    return ids


#: Synthesised tokenizer outputs, by input name: (vocab, batch, seq_len) -> int64 tensor.
TOKEN_INPUTS: dict[str, Callable[[int, int, int], torch.Tensor]] = {
    "input_ids": _token_ids,
    "attention_mask": lambda v, b, n: torch.ones(b, n, dtype=torch.int64),
    "token_type_ids": lambda v, b, n: torch.zeros(b, n, dtype=torch.int64),
    "decoder_input_ids": _decoder_ids,
}


def token_inputs(
    vocab_size: int,
    seq_len: int,
    batch: int = 1,
    names: tuple[str, ...] = CAUSAL_LM.inputs,
) -> dict[str, torch.Tensor]:
    """Synthesised tokenizer output: ``input_ids``, an all-ones ``attention_mask``, ... (int64).

    >>> {k: tuple(v.shape) for k, v in token_inputs(100, 4).items()}
    {'input_ids': (1, 4), 'attention_mask': (1, 4)}
    """
    if seq_len < 1:
        raise ModelSpecError(f"--seq-len must be at least 1, not {seq_len}")
    return {name: TOKEN_INPUTS[name](vocab_size, batch, seq_len) for name in names}


# -- reading configs -------------------------------------------------------------------------------


def _configs() -> Any:
    return resources.files("ampgraph.model.configs")


def _bundled_config(name: str) -> dict[str, Any] | None:
    entry = _configs() / f"{name}.json"
    return json.loads(entry.read_text()) if entry.is_file() else None


# -- building --------------------------------------------------------------------------------------


def architecture_for(model_type: str) -> Architecture:
    """How a Hugging Face ``model_type`` is built and fed (causal LM unless listed).

    >>> architecture_for("t5").auto_class, architecture_for("llama").auto_class
    ('AutoModelForSeq2SeqLM', 'AutoModelForCausalLM')
    """
    return ARCHITECTURES.get(model_type, CAUSAL_LM)


def build_hf_model(config_dict: dict[str, Any]) -> nn.Module:
    """Instantiate a Hugging Face model from a config dict on the meta device (no weights).

    The class is the config's ``architectures[0]`` where transformers exports it, else the
    :class:`Architecture`'s Auto class. The module is put in eval mode, as the seed notebook does
    before its forward passes.

    >>> m = build_hf_model({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2})
    >>> type(m).__name__, m.lm_head.weight.device.type
    ('GPT2LMHeadModel', 'meta')
    """
    with quiet_library_imports():  # the model's modelling code imports torchao where installed
        return _build_hf_model(config_dict)


def _build_hf_model(config_dict: dict[str, Any]) -> nn.Module:
    import transformers
    from transformers import AutoConfig

    data = {k: v for k, v in config_dict.items() if not k.startswith("_")}
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ModelSpecError("the config has no 'model_type': is it a Hugging Face config.json?")
    if "auto_map" in data:
        # Remote code: ampgraph never runs code that comes with a model folder.
        data.pop("auto_map")
    try:
        config = AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # noqa: BLE001 - transformers' validation raises many types
        text = str(exc)
        if isinstance(exc, KeyError) or "Unrecognized model" in text:
            # "Unrecognized model identifier: x. Should contain one of <200 names>": first sentence.
            reason = first_line(exc).split(". ")[0][:120]
            raise ModelSpecError(
                f"transformers {transformers.__version__} does not know model_type "
                f"{model_type!r} ({reason}); upgrade transformers or use --module "
                "package.module:factory"
            ) from None
        # Validators say what is wrong on their last line ("The hidden size (-4) is not a
        # multiple of the number of attention heads (32).").
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        reason = (lines[-1] if lines else type(exc).__name__)[:160]
        raise ModelSpecError(f"invalid {model_type} config: {reason}") from None
    _check_sizes(config)
    architectures = getattr(config, "architectures", None)
    named = architectures[0] if isinstance(architectures, list) and architectures else None
    model_class = getattr(transformers, named, None) if isinstance(named, str) else None
    auto = getattr(transformers, architecture_for(model_type).auto_class)
    with torch.device("meta"):
        try:
            model = model_class(config) if model_class is not None else auto.from_config(config)
        except Exception as exc:  # noqa: BLE001 - a config transformers accepts but cannot build
            reason = first_line(exc, default="")
            raise ModelSpecError(
                f"cannot build a {model_type!r} model from this config "
                f"({type(exc).__name__}: {reason[:120]}); fix the config or use --module"
            ) from None
    return model.eval()


#: Config sizes that must be at least 1 where a config has them (0 builds a model that runs
#: nothing, which would be analysed "successfully").
_POSITIVE_SIZES = (
    "vocab_size", "num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers",
    "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "intermediate_size",
)  # fmt: skip
_LAYER_SIZES = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")
#: More layers than any published model has (Llama-3.1-405B has 126): an analysis would run for
#: a long time and take gigabytes (about 75 graph nodes and 0.8 MB per layer).
MAX_LAYERS = 1024


def _check_sizes(config: Any) -> None:
    for attr in _POSITIVE_SIZES:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ModelSpecError(f"the config's {attr} is {value}: a model needs at least 1")


def check_work(config: dict[str, Any], *, force: bool = False) -> None:
    """Refuse a config beyond any real model before the work starts, unless ``force``.

    >>> check_work({"num_hidden_layers": 100_000})
    Traceback (most recent call last):
    ...
    ampgraph.errors.ModelSpecError: the config has 100000 layers, more than any published model (1024 at most here): an analysis would take hours and about 80 GB; pass --force to analyse it anyway
    """
    sizes = [config.get(a) for a in _LAYER_SIZES]
    layers = max((v for v in sizes if isinstance(v, int)), default=0)
    if layers > MAX_LAYERS and not force:
        raise ModelSpecError(
            f"the config has {layers} layers, more than any published model ({MAX_LAYERS} at "
            f"most here): an analysis would take hours and about {layers * 0.8 / 1000:.0f} GB; "
            "pass --force to analyse it anyway"
        )


def hf_model_inputs(name: str, model: nn.Module, seq_len: int) -> ModelInputs:
    """Pair a built Hugging Face model with synthesised inputs for one forward call."""
    config = model.config
    positions = next(
        (getattr(config, a) for a in ("max_position_embeddings", "n_positions")
         if isinstance(getattr(config, a, None), int)),
        None,
    )  # fmt: skip
    if positions is not None and seq_len > positions and config.model_type != "t5":
        raise ModelSpecError(
            f"--seq-len {seq_len} is longer than {name}'s {positions} positions: a real run "
            f"would fail; use --seq-len {positions} or less"
        )
    arch = architecture_for(str(getattr(config, "model_type", "")))
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    kwargs: dict[str, Any] = dict(token_inputs(vocab, seq_len, names=arch.inputs))
    if "use_cache" in inspect.signature(model.forward).parameters:
        # Without it the output holds a DynamicCache, which torch.export cannot return.
        kwargs["use_cache"] = False
    return ModelInputs(name, model, (), kwargs)


def _split_example(spec: str, made: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    example = made[1] if len(made) > 1 else ()
    if len(made) == 3:
        if not isinstance(made[2], dict):
            raise ModelSpecError(f"factory {spec!r}: the third item (kwargs) must be a dict")
        args = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        return args, dict(made[2])
    if isinstance(example, dict):
        return (), dict(example)
    return (tuple(example) if isinstance(example, (tuple, list)) else (example,)), {}


def _import_factory(spec: str) -> Callable[[], Any]:
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ModelSpecError(f"malformed factory {spec!r}: use package.module:factory")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ModelSpecError(f"factory file {module_name!r} does not exist")
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules.setdefault(path.stem, module)
            with quiet_library_imports():
                loader_spec.loader.exec_module(module)
        else:
            # The console script's sys.path lacks the working folder; `python -m` has it.
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.append(str(Path.cwd()))
            with quiet_library_imports():
                module = importlib.import_module(module_name)
    except (ModelSpecError, ModelExited):  # already the one line to show
        raise
    except SystemExit as exc:  # a module that exits on import
        raise ModelSpecError(f"importing {spec!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, the module's own error
        raise ModelSpecError(
            f"cannot import {spec!r}: {type(exc).__name__}: {exc} "
            "(is it installed, or on PYTHONPATH?)"
        ) from None
    # The module imported: a missing name is a typo in the spec, not a missing installation.
    factory = getattr(module, attr, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)  # fmt: skip
        offer = f"; it defines {', '.join(public[:12])}" if public else ""
        raise ModelSpecError(f"{module_name} has no {attr!r}{offer}: use {module_name}:NAME")
    return factory  # type: ignore[no-any-return]


def _load_factory(spec: str, seq_len: int = 8) -> ModelInputs:
    factory = _import_factory(spec)
    try:
        made = factory()
    except ModelExited:  # os._exit in the factory (ampgraph.model.usercode): already the one line
        raise
    except SystemExit as exc:  # sys.exit() in user code must not end ampgraph silently
        raise ModelSpecError(
            f"factory {spec!r} called sys.exit({exc.code!r}): a factory must return "
            "(module, example_inputs)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a user factory may raise anything: one line
        raise ModelSpecError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(made, ModelInputs):
        return made
    if isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        args, kwargs = _split_example(spec, made)
        return ModelInputs(spec, _in_eval_mode(spec, made[0]), args, kwargs)
    raise ModelSpecError(
        f"factory {spec!r} must return (module, example_inputs), (module, args, kwargs) or "
        f"ampgraph.ModelInputs, not {type(made).__name__}"
    )


def _in_eval_mode(spec: str, module: nn.Module) -> nn.Module:
    """``module.eval()``: one line, not a traceback, for a module nested too deep to walk.

    ``eval`` recurses once per level of submodules (as does every walk of the module tree after
    it), so a module nested deeper than Python's recursion limit (``nn.Sequential`` inside
    ``nn.Sequential`` 2,000 times) raises RecursionError here, the first walk.
    """
    try:
        return module.eval()
    except RecursionError:
        raise ModelSpecError(
            f"factory {spec!r} returned a module nested too deep: its submodules are more levels "
            f"deep than Python's recursion limit ({sys.getrecursionlimit()}) lets ampgraph walk; "
            "nest its layers less (an nn.Sequential of them, not one inside another)"
        ) from None


# -- bundled Python-built models (need an optional package) ------------------------------------------


@dataclass(frozen=True)
class BundledFactory:
    """A bundled model built by Python code rather than a config, and what it needs installed."""

    factory: str
    requires: str
    origin: str


def torchvision_resnet18() -> tuple[nn.Module, torch.Tensor]:
    """torchvision's ResNet-18 on meta, fed one 224x224 RGB image (needs torchvision)."""
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.resnet18(weights=None)
    return model, torch.empty(1, 3, 224, 224)


BUNDLED_FACTORIES: dict[str, BundledFactory] = {
    "resnet18": BundledFactory(
        "ampgraph.model.build:torchvision_resnet18", "torchvision", "torchvision.models.resnet18"
    ),
}


def _available(entry: BundledFactory) -> bool:
    return importlib.util.find_spec(entry.requires) is not None


# -- the catalogue -----------------------------------------------------------------------------------


def bundled_models() -> dict[str, str]:
    """Bundled model names and the model each is shaped like (its origin), by name.

    Python-built entries are listed only where the package they need is installed.

    >>> bundled_models()["opt-125m"]
    'facebook/opt-125m'
    """
    out: dict[str, str] = {}
    for entry in _configs().iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            out[entry.name.removesuffix(".json")] = str(data.get("_name_or_path", ""))
    for name, made in BUNDLED_FACTORIES.items():
        if _available(made):
            out[name] = made.origin
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class CatalogueEntry:
    """One bundled model as ``ampgraph models`` lists it."""

    name: str
    architecture: str
    layers: str
    params: int
    origin: str

    @property
    def params_text(self) -> str:
        """``124.4M``, ``70.6B``: parameter count as people quote it."""
        for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if self.params >= scale:
                return f"{self.params / scale:.1f}{unit}"
        return str(self.params)


def count_parameters(module: nn.Module) -> int:
    """Parameters of a module, each tied tensor once (works on meta: only shapes are read).

    >>> count_parameters(nn.Linear(4, 2))
    10
    """
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _layers(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    if config is None:
        return "-"
    layers = getattr(config, "num_hidden_layers", None)
    decoder = getattr(config, "num_decoder_layers", None)
    if getattr(config, "is_encoder_decoder", False) and decoder is not None:
        return f"{layers}+{decoder}"
    return str(layers) if layers is not None else "-"


def catalogue() -> list[CatalogueEntry]:
    """Every bundled model, built on meta to count its parameters (a few seconds in all).

    >>> [e for e in catalogue() if e.name == "gpt2"][0].params_text   # doctest: +SKIP
    '124.4M'
    """
    out = []
    for name, origin in bundled_models().items():
        model = load_model(name).module
        out.append(
            CatalogueEntry(
                name, type(model).__name__, _layers(model), count_parameters(model), origin
            )
        )
    return out


# -- load_model --------------------------------------------------------------------------------------


def _load_bundled(name: str, seq_len: int) -> ModelInputs:
    key = bundled_key(name)
    if key in BUNDLED_FACTORIES:
        made = BUNDLED_FACTORIES[key]
        if not _available(made):
            raise ModelSpecError(
                f"bundled model {key!r} needs {made.requires}: pip install {made.requires}"
            )
        loaded = _load_factory(made.factory, seq_len)
        return ModelInputs(key, loaded.module, loaded.args, loaded.kwargs)
    names = ", ".join(bundled_models())
    raise ModelSpecError(
        f"unknown model {clip(name)}: use a bundled name ({names}), a path to a config.json, "
        "a model folder, or package.module:factory"
    )


def _load_code(spec: str, seq_len: int) -> ModelInputs:
    """A spec that is not a config (:func:`~ampgraph.model.specs.resolve_config` said so)."""
    if spec_kind(spec) == "module" or (":" in spec and bundled_key(spec) not in BUNDLED_FACTORIES):
        return _load_factory(str(spec), seq_len)
    return _load_bundled(str(spec), seq_len)


def load_model(spec: str = DEFAULT_MODEL, *, seq_len: int = 8, force: bool = False) -> ModelInputs:
    """Build the model a spec names, with example inputs, on the meta device.

    ``spec`` is a bundled name (see :func:`bundled_models`), a ``config.json`` path or a model
    folder holding one, or ``package.module:factory``; a :class:`~ampgraph.model.specs.ModelSpec` says
    which. The model is only built: which tracer turns it into a graph is the analysis's choice
    (:func:`ampgraph.analyze`'s ``tracer``). A config beyond any published model
    (:data:`MAX_LAYERS`) is refused unless ``force``.

    >>> m = load_model("llama-tiny", seq_len=4)
    >>> type(m.module).__name__, sorted(m.kwargs)
    ('LlamaForCausalLM', ['attention_mask', 'input_ids', 'use_cache'])
    """
    import ampgraph.arguments as arguments

    seq_len = arguments.integer("seq_len", seq_len, minimum=1)
    if not isinstance(spec, str):  # a ModelSpec is a str
        from ampgraph.errors import ArgumentError

        raise ArgumentError(f"load_model() takes a model spec such as 'llama-tiny', not "
                            f"{type(spec).__name__}")  # fmt: skip
    source = resolve_config(spec)
    if source is not None:
        config = source.parse()
        check_work(config, force=force)
        return hf_model_inputs(source.name, build_hf_model(config), seq_len)
    return _load_code(spec, seq_len)


__all__ = [
    "ARCHITECTURES",
    "BUNDLED_FACTORIES",
    "Architecture",
    "CatalogueEntry",
    "ModelInputs",
    "ModelSpec",
    "build_hf_model",
    "bundled_models",
    "catalogue",
    "count_parameters",
    "load_model",
    "token_inputs",
]
