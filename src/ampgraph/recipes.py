"""Recipes: the precision flags of Trainer, Accelerate, Lightning, FSDP and DeepSpeed as settings.

People do not write ``autocast=on,params=fp32``; they write ``Trainer(bf16=True)``,
``precision="bf16-mixed"`` or ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``. A recipe
is that flag, spelled ``FAMILY:VALUE``, and :func:`parse_recipe` says what it really runs: the
:class:`~ampgraph.settings.Setting` of its forward, which ampgraph analyses (autocast, its
device and dtype, the parameters' dtype, and what the recipe does around them: floating inputs
cast before the forward, buffers kept in their own dtype, floating outputs cast after it), and
what training keeps: the dtype of ``.grad``, of the gradient reduction and of the weights and
gradients the optimizer steps.

The families and their values:

* ``hf:`` (the ``Trainer``): ``bf16``, ``fp16``, ``fp32``.
* ``accelerate:`` (``mixed_precision=``): ``bf16``, ``fp16``, ``no``.
* ``lightning:`` and ``fabric:``: ``32-true``, ``16-mixed``, ``bf16-mixed``, ``16-true``,
  ``bf16-true`` (``64-true`` is refused: no setting has fp64 parameters).
* ``fsdp2:``: ``MixedPrecisionPolicy``'s fields, ``param_dtype=bf16,reduce_dtype=fp32``.
* ``fsdp1:``: ``MixedPrecision``'s fields, ``param_dtype=bf16,buffer_dtype=bf16``.
* ``deepspeed:``: a ds_config JSON file, or ``bf16`` / ``fp16``.

Where a recipe depends on the device it does so here too: ``accelerate:fp16`` on the CPU runs
plain fp32 (Accelerate enables fp16 autocast only off the CPU), and Lightning turns
``16-mixed`` into ``bf16-mixed`` on the CPU. Each mapping was proved by running the framework's
own code path on the CPU (``tests/test_recipes.py``, ``tests/test_recipes_exact.py``), except
DeepSpeed's, read from its source (``Recipe.proved`` says which). Torch-free, as settings are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampgraph import deepspeed_config
from ampgraph.errors import SettingError, clip
from ampgraph.settings import Setting, canonical_dtype, check_device_type, short_dtype

#: The devices whose recipes are modelled: each framework's CPU rules are read from its source,
#: and XPU's and MPS's (Accelerate's fp16 on MPS, ...) are not.
RECIPE_DEVICE_TYPES = ("cuda", "cpu")

FAMILIES: dict[str, str] = {
    "hf": "hf",
    "trainer": "hf",
    "transformers": "hf",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pl": "lightning",
    "fabric": "fabric",
    "fsdp2": "fsdp2",
    "fully_shard": "fsdp2",
    "fsdp1": "fsdp1",
    "fsdp": "fsdp1",
    "deepspeed": "deepspeed",
    "ds": "deepspeed",
}
#: One example per family, for messages and ``--help``.
EXAMPLES = (
    "hf:bf16",
    "accelerate:fp16",
    "lightning:bf16-mixed",
    "fabric:bf16-true",
    "fsdp2:param_dtype=bf16,reduce_dtype=fp32",
    "fsdp1:param_dtype=bf16",
    "deepspeed:ds_config.json",
)
LIGHTNING_PRECISIONS: dict[str, str] = {
    "32-true": "32-true",
    "32": "32-true",
    "16-mixed": "16-mixed",
    "16": "16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-true": "16-true",
    "bf16-true": "bf16-true",
    "64-true": "64-true",
    "64": "64-true",
}
#: ``fsdp2:`` keys: ``MixedPrecisionPolicy``'s field names, and the short forms.
FSDP2_KEYS: dict[str, str] = {
    "param_dtype": "param_dtype",
    "param": "param_dtype",
    "reduce_dtype": "reduce_dtype",
    "reduce": "reduce_dtype",
    "output_dtype": "output_dtype",
    "output": "output_dtype",
    "cast_forward_inputs": "cast_forward_inputs",
}
#: ``fsdp1:`` keys: ``MixedPrecision``'s field names, and the short forms.
FSDP1_KEYS: dict[str, str] = {
    "param_dtype": "param_dtype",
    "param": "param_dtype",
    "reduce_dtype": "reduce_dtype",
    "reduce": "reduce_dtype",
    "buffer_dtype": "buffer_dtype",
    "buffer": "buffer_dtype",
    "keep_low_precision_grads": "keep_low_precision_grads",
    "cast_forward_inputs": "cast_forward_inputs",
    "cast_root_forward_inputs": "cast_root_forward_inputs",
}
FP32 = "float32"


@dataclass(frozen=True)
class Recipe:
    """What a framework's precision flag runs: a setting, and what a setting does not hold.

    Dtypes are torch's names (``"bfloat16"``); ``None`` means "no such step".

    >>> r = parse_recipe("fsdp2:param_dtype=bf16,reduce_dtype=fp32", device_type="cpu")
    >>> r.setting.name, r.input_cast, r.master_dtype, r.reduce_dtype
    ('half,inputs=bf16,buffers=fp32', 'bfloat16', 'float32', 'float32')
    >>> parse_recipe("hf:bf16").setting.name
    'amp-fp32,outputs=fp32'
    """

    spelling: str
    family: str
    #: The forward as the recipe runs it, input, buffer and output dtypes included.
    setting: Setting
    #: Tensors the forward creates with the default dtype are made in this one.
    default_dtype: str | None = None
    #: The dtype of each parameter's ``.grad`` the user reads after backward. The backward itself
    #: makes gradients in the setting's parameter dtype (``Report.backward``); FSDP casts them.
    grad_dtype: str = FP32
    #: The dtype gradients are all-reduced or reduce-scattered in across data-parallel ranks.
    reduce_dtype: str = FP32
    #: The weights the optimizer updates, and the gradients it reads.
    master_dtype: str = FP32
    optimizer_grad_dtype: str = FP32
    #: A gradient scaler (dynamic loss scaling) runs: fp16 gradients.
    loss_scaling: bool = False
    notes: tuple[str, ...] = ()
    #: How the mapping was established: a test that runs the framework, or its source.
    proved: str = ""

    @property
    def input_cast(self) -> str | None:
        """The dtype floating inputs are cast to before the forward (None: none are)."""
        return self.setting.input_dtype

    @property
    def output_dtype(self) -> str | None:
        """The dtype floating outputs are cast to after the forward (None: none are)."""
        return self.setting.output_dtype

    @property
    def buffers_kept(self) -> bool:
        """Whether floating buffers keep a dtype other than the parameters'."""
        return self.setting.buffer_dtype is not None

    def gaps(self) -> list[str]:
        """What this recipe runs that the analysis does not model (empty: nothing), and why.

        Input casts, buffers kept in their dtype and output casts are part of the setting and
        analysed; what is left is said here.

        >>> parse_recipe("accelerate:bf16").gaps()
        []
        >>> parse_recipe("fsdp2:param_dtype=bf16").gaps()[0].split(";")[0]
        'each fully_shard module casts its own floating inputs'
        >>> parse_recipe("lightning:bf16-true").gaps()[0].split(" (")[0]
        'tensors the forward creates with the default dtype are bf16'
        """
        out = []
        if self.family == "fsdp2" and self.input_cast:
            out.append(
                "each fully_shard module casts its own floating inputs; the analysis casts the "
                "root's, as one fully_shard on the whole model does: a nested one whose inputs "
                f"are not {short_dtype(self.input_cast)} (after an fp32 buffer) casts them there"
            )
        if self.default_dtype:
            out.append(
                f"tensors the forward creates with the default dtype are "
                f"{short_dtype(self.default_dtype)} (torch.set_default_dtype around the forward); "
                "the analysis makes them fp32: the graph records a factory call such as "
                "torch.zeros(n) without its dtype, and the stages that replay it run under "
                "torch's default"
            )
        return out

    def describe(self) -> str:
        """A few lines saying what the recipe runs, as ``ampgraph --recipe`` prints them.

        >>> print(parse_recipe("lightning:16-mixed", device_type="cpu").describe())
        ... # doctest: +ELLIPSIS
        recipe lightning:16-mixed on cpu -> setting amp-fp32 (autocast cpu bf16, parameters fp32)
          backward: fp32 gradients, reduced in fp32, .grad fp32; optimizer: fp32 weights, fp32 gradients
          note: Lightning runs 16-mixed as bf16-mixed on the CPU (it warns)
          note: autocast runs with cache_enabled=False
          proved: ran Trainer(...
        """
        s = self.setting
        lines = [
            f"recipe {self.spelling} on {s.device_type} -> setting {s.name} ({s.title})",
        ]
        lines += [f"  not analysed: {gap}" for gap in self.gaps()]
        scaler = ", with a loss scaler" if self.loss_scaling else ""
        lines.append(
            f"  backward: {short_dtype(s.param_dtype)} gradients, reduced in "
            f"{short_dtype(self.reduce_dtype)}, .grad {short_dtype(self.grad_dtype)}; optimizer: "
            f"{short_dtype(self.master_dtype)} weights, {short_dtype(self.optimizer_grad_dtype)} "
            f"gradients{scaler}"
        )
        lines += [f"  note: {note}" for note in self.notes]
        if self.proved:
            lines.append(f"  proved: {self.proved}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (the setting as :meth:`Setting.to_dict` writes it)."""
        return {
            "spelling": self.spelling,
            "family": self.family,
            "setting": self.setting.to_dict(),
            "input_cast": self.input_cast,
            "output_dtype": self.output_dtype,
            "buffers_kept": self.buffers_kept,
            "default_dtype": self.default_dtype,
            "grad_dtype": self.grad_dtype,
            "reduce_dtype": self.reduce_dtype,
            "master_dtype": self.master_dtype,
            "optimizer_grad_dtype": self.optimizer_grad_dtype,
            "loss_scaling": self.loss_scaling,
            "gaps": self.gaps(),
            "notes": list(self.notes),
            "proved": self.proved,
        }


def _setting(
    device: str,
    autocast: bool,
    dtype: str,
    params: str = FP32,
    *,
    inputs: str | None = None,
    buffers: str | None = None,
    outputs: str | None = None,
) -> Setting:
    return Setting(
        device_type=device,
        autocast=autocast,
        amp_dtype=dtype,
        param_dtype=params,
        input_dtype=inputs,
        buffer_dtype=buffers,
        output_dtype=outputs,
    )


_RAN = "ran {what} on the CPU (tests/test_recipes*.py)"


def _hf(family: str, value: str, device: str) -> Recipe:
    names = {"bf16": "bf16", "fp16": "fp16", "no": "no", "fp32": "no", "32": "no"}
    key = value.lower()
    if key not in names:
        flag = "mixed_precision=" if family == "accelerate" else "Trainer("
        raise SettingError(
            f"unknown {family} precision {clip(value)}: write {family}:bf16, {family}:fp16 or "
            f"{family}:no (as {flag}...)"
            + (" (fp8 needs a GPU kernel library ampgraph does not model)" if key == "fp8" else "")
        )
    mode = names[key]
    what = (
        "Trainer(TrainingArguments(use_cpu=True, ...))"
        if family == "hf"
        else ("Accelerator(cpu=True, mixed_precision=...).prepare(model)")
    )
    spelling = f"{family}:{mode}"
    proved = _RAN.format(what=what)
    if mode == "no" or (mode == "fp16" and device == "cpu"):
        notes: tuple[str, ...] = ()
        if mode == "fp16":
            notes = (
                "Accelerate enables fp16 autocast only off the CPU: on the CPU fp16 runs fp32",
            )
        return Recipe(
            spelling, family, _setting(device, False, "bfloat16"), notes=notes, proved=proved
        )
    dtype = "bfloat16" if mode == "bf16" else "float16"
    return Recipe(
        spelling,
        family,
        _setting(device, True, dtype, outputs=FP32),
        loss_scaling=mode == "fp16",
        notes=("the model's forward is wrapped in autocast and convert_outputs_to_fp32",),
        proved=proved,
    )


def _lightning(family: str, value: str, device: str) -> Recipe:
    key = value.lower()
    if key not in LIGHTNING_PRECISIONS:
        raise SettingError(
            f"unknown Lightning precision {clip(value)}: write {family}: with one of "
            "32-true, 16-mixed, bf16-mixed, 16-true, bf16-true"
        )
    precision = LIGHTNING_PRECISIONS[key]
    spelling = f"{family}:{precision}"
    what = (
        "Trainer(accelerator='cpu', precision=...).fit"
        if family == "lightning"
        else ("Fabric(accelerator='cpu', precision=...).setup")
    )
    proved = _RAN.format(what=what)
    if precision == "64-true":
        raise SettingError(
            f"{spelling} runs the model in float64, which no ampgraph setting expresses "
            "(parameters are fp32, bf16 or fp16): analyse it as lightning:32-true"
        )
    if precision == "32-true":
        return Recipe(spelling, family, _setting(device, False, "bfloat16"), proved=proved)
    notes: list[str] = []
    if precision == "16-mixed" and device == "cpu":
        notes.append("Lightning runs 16-mixed as bf16-mixed on the CPU (it warns)")
        precision = "bf16-mixed"
    dtype = "bfloat16" if precision.startswith("bf16") else "float16"
    if precision.endswith("-mixed"):
        fabric = family == "fabric"
        return Recipe(
            spelling,
            family,
            # Fabric's MixedPrecision converts inputs to the autocast dtype and outputs back;
            # the Trainer's plugin does neither.
            _setting(
                device,
                True,
                dtype,
                inputs=dtype if fabric else None,
                outputs=FP32 if fabric else None,
            ),
            loss_scaling=dtype == "float16",
            notes=(
                *notes,
                "autocast runs with cache_enabled=False"
                if not fabric
                else "Fabric casts floating inputs to the autocast dtype and outputs to fp32",
            ),
            proved=proved,
        )
    return Recipe(
        spelling,
        family,
        # module.to(dtype) converts buffers with the parameters (half.py's convert_module).
        _setting(
            device,
            False,
            dtype,
            dtype,
            inputs=dtype,
            outputs=FP32 if family == "fabric" else None,
        ),
        default_dtype=dtype,
        grad_dtype=dtype,
        reduce_dtype=dtype,
        master_dtype=dtype,
        optimizer_grad_dtype=dtype,
        notes=("module.to(dtype): parameters and buffers; the optimizer keeps no fp32 copy",),
        proved=proved,
    )


def _fields(family: str, value: str, keys: dict[str, str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, val = part.partition("=")
        name = keys.get(key.strip().lower())
        if not sep or name is None:
            raise SettingError(
                f"malformed {family} recipe {clip(value)}: write key=value pairs of "
                f"{', '.join(sorted(set(keys.values())))}, e.g. {family}:param_dtype=bf16"
            )
        if name in fields:
            raise SettingError(f"{family} recipe {clip(value)} gives {name} twice: give it once")
        if not val.strip():
            # An unset shell variable ($DTYPE) leaves "param_dtype=": not fp32, a mistake.
            raise SettingError(
                f"{family} recipe {clip(value)} gives {name} no value: write {name}=bf16 (or "
                f"{name}=none to leave it unset)"
            )
        fields[name] = val.strip()
    return fields


def _dtype(value: str | None) -> str | None:
    if value is None or value.lower() in ("none", ""):
        return None
    return canonical_dtype(value)


def _flag(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() in ("true", "1", "on", "yes"):
        return True
    if value.lower() in ("false", "0", "off", "no"):
        return False
    raise SettingError(f"{name} must be true or false, not {clip(value)}")


def _fsdp(family: str, value: str, device: str) -> Recipe:
    fields = _fields(family, value, FSDP2_KEYS if family == "fsdp2" else FSDP1_KEYS)
    param = _dtype(fields.get("param_dtype"))
    reduce = _dtype(fields.get("reduce_dtype"))
    # Both versions: a reduce_dtype left out reduces in param_dtype (fp32 when that is out too).
    reduce = reduce or param or FP32
    params = param or FP32
    amp = params if params != FP32 else "bfloat16"
    if family == "fsdp2":
        casts = _flag("cast_forward_inputs", fields.get("cast_forward_inputs"), True)
        return Recipe(
            _spelling(family, fields),
            family,
            # fully_shard manages parameters only: buffers keep the dtype the model has.
            _setting(
                device,
                False,
                amp,
                params,
                inputs=param if casts else None,
                buffers=FP32,
                outputs=_dtype(fields.get("output_dtype")),
            ),
            grad_dtype=FP32,
            reduce_dtype=reduce,
            notes=(
                (
                    "parameters are all-gathered in param_dtype for the forward; the sharded "
                    "fp32 parameters are the optimizer's, and gradients are cast back to fp32"
                ),
            ),
            proved=_RAN.format(what="fully_shard(model, mp_policy=...) on a 1-process gloo group"),
        )
    buffer = _dtype(fields.get("buffer_dtype"))
    low_grads = _flag("keep_low_precision_grads", fields.get("keep_low_precision_grads"), False)
    root = _flag("cast_root_forward_inputs", fields.get("cast_root_forward_inputs"), True)
    every = _flag("cast_forward_inputs", fields.get("cast_forward_inputs"), False)
    inputs = param if (root or every) else None
    return Recipe(
        _spelling(family, fields),
        family,
        # buffer_dtype None: _cast_buffers_to_dtype_and_device leaves each buffer's dtype.
        _setting(device, False, amp, params, inputs=inputs, buffers=buffer or FP32),
        grad_dtype=params if low_grads else FP32,
        reduce_dtype=reduce,
        optimizer_grad_dtype=params if low_grads else FP32,
        notes=(
            ("buffers are cast to buffer_dtype " + short_dtype(buffer))
            if buffer not in (None, params)
            else "parameters are cast to param_dtype for the forward; the flat fp32 parameter "
            "is the optimizer's",
        ),
        proved=_RAN.format(what="FullyShardedDataParallel(model, mixed_precision=...) on gloo"),
    )


def _spelling(family: str, fields: dict[str, str]) -> str:
    return f"{family}:" + ",".join(f"{k}={v}" for k, v in fields.items())


def _deepspeed(value: str, device: str) -> Recipe:
    if value.lower() in ("bf16", "fp16", "fp32"):
        config: dict[str, Any] = {value.lower(): {"enabled": True}} if value != "fp32" else {}
        source = value.lower()
    else:
        path = Path(value).expanduser()
        config, source = deepspeed_config.load(path, clip(value)), str(path)
    return _deepspeed_config(deepspeed_config.precision(config, source), source, device)


def _deepspeed_config(facts: deepspeed_config.Precision, source: str, device: str) -> Recipe:
    spelling = f"deepspeed:{source}"
    proved = (
        "read from DeepSpeed 0.19's runtime/engine.py, config.py and precision_config.py (not "
        "run here)"
    )
    if not (facts.bf16 or facts.fp16):
        return Recipe(spelling, "deepspeed", _setting(device, False, "bfloat16"), proved=proved)
    dtype = "bfloat16" if facts.bf16 else "float16"
    return Recipe(
        spelling,
        "deepspeed",
        _setting(
            device,
            False,
            dtype,
            dtype,
            inputs=dtype if facts.auto_cast else None,
            buffers=facts.buffer_dtype or FP32,
        ),
        grad_dtype=dtype,
        reduce_dtype=facts.communication_dtype or dtype,
        master_dtype=dtype if facts.master_low else FP32,
        optimizer_grad_dtype=facts.grad_accum_dtype or dtype,
        loss_scaling=facts.fp16,
        notes=(
            (
                "the engine casts parameters (not buffers, unless data_types.buffer_dtype) to "
                f"{short_dtype(dtype)}; the optimizer keeps fp32 master weights"
            ),
        ),
        proved=proved,
    )


def parse_recipe(text: str, *, device_type: str = "cuda") -> Recipe:
    """Parse ``FAMILY:VALUE`` (``lightning:bf16-mixed``) into the :class:`Recipe` it runs.

    ``device_type`` is where the recipe runs (``cuda`` or ``cpu``), as ``--device`` gives it:
    some recipes run differently on the CPU.

    >>> parse_recipe("accelerate:fp16", device_type="cpu").setting.name
    'fp32'
    >>> parse_recipe("accelerate:fp16", device_type="cuda").setting.title
    'autocast cuda fp16, parameters fp32, outputs cast to fp32'
    >>> parse_recipe("lightning:bf16-true").setting.name
    'half,inputs=bf16'
    """
    if not isinstance(text, str):
        raise SettingError(f"a recipe is text such as 'hf:bf16', not {type(text).__name__}")
    if device_type not in RECIPE_DEVICE_TYPES:
        check_device_type(device_type)  # an unknown or plugin device says so first
        raise SettingError(
            f"recipes are modelled on cuda and cpu, not {device_type}: give the setting "
            f"itself (--setting amp-half --device {device_type})"
        )
    family, sep, value = text.strip().partition(":")
    key = family.strip().lower()
    if key == "torchao":
        # FP8 converts the model's Linears, which no setting expresses: its own commands.
        raise SettingError(
            f"{clip(text)} converts Linears to FP8, which a setting does not express: run "
            f"ampgraph fp8 --recipe {clip(text)} (the graph) or ampgraph fp8-ranges (survival)"
        )
    if not sep or key not in FAMILIES or not value.strip():
        raise SettingError(
            f"malformed recipe {clip(text)}: write FAMILY:VALUE, e.g. {', '.join(EXAMPLES[:5])}"
        )
    family, value = FAMILIES[key], value.strip()
    if family in ("hf", "accelerate"):
        return _hf(family, value, device_type)
    if family in ("lightning", "fabric"):
        return _lightning(family, value, device_type)
    if family in ("fsdp2", "fsdp1"):
        return _fsdp(family, value, device_type)
    return _deepspeed(value, device_type)


def cast_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], recipe: Recipe
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs as the recipe hands them to the forward: floating tensors cast.

    The analysis casts them itself (the setting's ``input_dtype``); this is for running the
    model as the recipe does, beside it. Imports torch (this module otherwise does not).

    >>> import torch
    >>> a, k = cast_inputs((torch.ones(2), torch.ones(2, dtype=torch.int64)), {},
    ...                    parse_recipe("fsdp2:param_dtype=bf16"))
    >>> [t.dtype for t in a]
    [torch.bfloat16, torch.int64]
    """
    from ampgraph.capture.casts import cast_floating

    return cast_floating((args, kwargs), recipe.input_cast)  # type: ignore[no-any-return]
