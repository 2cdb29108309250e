"""A DeepSpeed ``ds_config`` read as DeepSpeed reads it: the precision facts, validated.

DeepSpeed loads the file with duplicate keys refused (``dict_raise_error_on_duplicate_keys`` in
``runtime/config_utils.py``) and validates the ``bf16`` / ``fp16`` sections with pydantic
(``runtime/precision_config.py``): a boolean field takes ``true``/``false``, ``0``/``1`` and the
strings pydantic v2 reads in lax mode (``"false"``, ``"off"``, ``"no"``, ``"f"``, ``"n"``, ``"0"``
and their true twins, any case); ``"false"`` is False, and NaN, ``null``, ``{}`` or ``2`` are
errors, not true. A field set to ``"auto"`` is dropped, so it keeps its default (the HF
integration fills ``enabled: "auto"`` from the Trainer's flags before DeepSpeed sees it, so
that one is refused here with what to write). The old ``bfloat16`` section is read where ``bf16``
is absent or null. Dtypes in ``data_types`` are ``DtypeEnum`` spellings (``"bf16"``,
``"torch.bfloat16"``, ...), ``communication_data_type`` one of ``fp16``/``bf16``/``fp32``.

Every refusal is one :class:`~ampgraph.errors.SettingError` line naming the config. What the
facts mean for the analysis is :mod:`ampgraph.recipes`' job. Torch-free; DeepSpeed and pydantic
are not needed (tests compare the boolean rule with pydantic itself where it is installed).

>>> facts = precision({"bf16": {"enabled": "true"}, "fp16": {"enabled": "off"}}, "ds.json")
>>> facts.bf16, facts.fp16, facts.buffer_dtype
(True, False, None)
>>> precision({"bf16": {"enabled": "maybe"}}, "ds.json")
Traceback (most recent call last):
...
ampgraph.errors.SettingError: ds.json: bf16.enabled is 'maybe', which DeepSpeed does not read as a boolean: write true or false
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampgraph.errors import FileReadError, SettingError, clip
from ampgraph.report.reading import CONFIG_LIMIT, read_text

#: pydantic v2's lax strings for a bool (``pydantic_core``'s ``str_as_bool``), compared lowercased.
FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})
TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
#: DeepSpeed's ``DtypeEnum`` spellings of the floating dtypes ampgraph models (exact, case and all).
DTYPE_SPELLINGS: dict[str, str] = {
    **dict.fromkeys(("torch.float16", "fp16", "float16", "half"), "float16"),
    **dict.fromkeys(("torch.float32", "fp32", "float32", "float"), "float32"),
    **dict.fromkeys(("torch.bfloat16", "bf16", "bfloat16"), "bfloat16"),
}
#: ``communication_data_type``'s values (lowercased first, as ``get_communication_data_type`` does).
COMM_SPELLINGS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: The boolean fields of DeepSpeed's precision sections (``DeepSpeedBF16Config``,
#: ``DeepSpeedFP16Config``): each validated, as pydantic validates it.
BOOL_FIELDS = {
    "bf16": ("enabled", "immediate_grad_update", "check_grad_overflow",
             "bf16_master_weights_and_grads", "bf16_optimizer_states"),
    "fp16": ("enabled", "auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads"),
}  # fmt: skip


@dataclass(frozen=True)
class Precision:
    """What a ds_config says about precision, each field as DeepSpeed reads it."""

    bf16: bool = False
    fp16: bool = False
    #: ``fp16.auto_cast``: floating inputs cast to fp16 before the forward.
    auto_cast: bool = False
    #: ``{bf16,fp16}_master_weights_and_grads`` of the enabled section.
    master_low: bool = False
    grad_accum_dtype: str | None = None
    buffer_dtype: str | None = None
    communication_dtype: str | None = None


def lax_bool(value: Any) -> bool | None:
    """``value`` as pydantic v2 reads a ``bool`` field in lax mode, or None where it refuses.

    >>> [lax_bool(v) for v in (True, 0, 1.0, "OFF", "yes", "false ", 2, None, float("nan"))]
    [True, False, True, False, True, None, None, None, None]
    """
    if type(value) is bool:
        return value
    if type(value) in (int, float) and value in (0, 1):
        return bool(value)
    if type(value) is str:
        lowered = value.lower()
        if lowered in FALSE_STRINGS:
            return False
        if lowered in TRUE_STRINGS:
            return True
    return None


def _refuse(source: str, what: str) -> SettingError:
    return SettingError(f"{source}: {what}")


def _section(config: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """A precision section as ``get_bfloat16_config`` / ``get_float16_config`` find it: the old
    ``bfloat16`` key where ``bf16`` is absent or null; ``"auto"`` fields dropped, as
    ``DeepSpeedConfigModel`` drops them (non-strict)."""
    name, section = key, config.get(key, {})
    if key == "bf16" and section is None:
        name, section = "bfloat16", config.get("bfloat16", {})
    if not isinstance(section, dict):
        raise _refuse(source, f"{name} is {clip(section, 60)}, not an object: DeepSpeed reads "
                      f'it as {{"enabled": true}} or {{"enabled": false}}')  # fmt: skip
    if section.get("enabled") == "auto":
        raise _refuse(source, f"{name}.enabled is 'auto', which the HF Trainer fills in from its "
                      "own flags: write true or false, or analyse the Trainer's flag "
                      f"(hf:{key})")  # fmt: skip
    values = {k: v for k, v in section.items() if v != "auto"}
    for field in BOOL_FIELDS[key]:
        if field in values and lax_bool(values[field]) is None:
            raise _refuse(source, f"{name}.{field} is {clip(values[field], 60)}, which DeepSpeed "
                          "does not read as a boolean: write true or false")  # fmt: skip
    return {k: lax_bool(v) if k in BOOL_FIELDS[key] else v for k, v in values.items()}


def _dtype(source: str, where: str, value: Any, spellings: dict[str, str]) -> str | None:
    if value is None:
        return None
    key = value.lower() if spellings is COMM_SPELLINGS and isinstance(value, str) else value
    if not isinstance(key, str) or key not in spellings:
        raise _refuse(source, f"{where} is {clip(value, 60)}, not a dtype DeepSpeed reads: write "
                      f"one of {', '.join(sorted(set(spellings)))}")  # fmt: skip
    return spellings[key]


def _object(config: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise _refuse(
            source, f"{key} is {clip(value, 60)}, not an object (DeepSpeed calls .get on it)"
        )
    return value


def precision(config: Any, source: str) -> Precision:
    """The precision facts of a parsed ds_config (a dict), or one :class:`SettingError` line.

    >>> precision({"bf16": None, "bfloat16": {"enabled": 1}}, "ds.json").bf16
    True
    >>> precision({"data_types": {"grad_accum_dtype": 32}}, "ds.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.SettingError: ds.json: data_types.grad_accum_dtype is 32, not a dtype ...
    """
    if not isinstance(config, dict):
        raise _refuse(source, f"a DeepSpeed config is a JSON object, not {type(config).__name__}")
    bf16, fp16 = _section(config, "bf16", source), _section(config, "fp16", source)
    autocast = _object(config, "torch_autocast", source)
    # get_torch_autocast_enabled takes the raw value: any truthy one enables it.
    if autocast.get("enabled"):
        raise _refuse(source, "torch_autocast runs autocast only inside its "
                      "lower_precision_safe_modules, which no ampgraph setting expresses: analyse "
                      "amp-fp32 for a model whose 16-bit ops are all in those modules")  # fmt: skip
    on16, onbf = bool(fp16.get("enabled")), bool(bf16.get("enabled"))
    if on16 and onbf:
        raise _refuse(source, "bf16 and fp16 are both enabled; DeepSpeed refuses that")
    types = _object(config, "data_types", source)
    dtypes = {
        k: _dtype(source, f"data_types.{k}", types.get(k), DTYPE_SPELLINGS)
        for k in ("grad_accum_dtype", "param_dtype", "buffer_dtype")
    }
    model = "float16" if on16 else "bfloat16" if onbf else "float32"
    if dtypes["param_dtype"] not in (None, model):
        raise _refuse(source, f"data_types.param_dtype {types['param_dtype']!r} conflicts with the "
                      "enabled precision mode, which DeepSpeed refuses: omit it or enable its "
                      "mode")  # fmt: skip
    section = fp16 if on16 else bf16
    return Precision(
        bf16=onbf,
        fp16=on16,
        auto_cast=on16 and bool(fp16.get("auto_cast")),
        master_low=bool(section.get(f"{'fp16' if on16 else 'bf16'}_master_weights_and_grads")),
        grad_accum_dtype=dtypes["grad_accum_dtype"],
        buffer_dtype=dtypes["buffer_dtype"],
        communication_dtype=_dtype(
            source, "communication_data_type", config.get("communication_data_type"), COMM_SPELLINGS
        ),
    )


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """DeepSpeed's ``dict_raise_error_on_duplicate_keys``: a key given twice is an error."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
        raise ValueError(f"it gives {', '.join(map(repr, twice))} twice, which DeepSpeed refuses")
    return found


def _constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which DeepSpeed refuses in every field it validates")


def load(path: Path, shown: str) -> dict[str, Any]:
    """The JSON object in the ds_config at ``path`` (``shown`` names it in errors), read by the
    one reader (:mod:`ampgraph.report.reading`), duplicate keys and NaN refused in one line."""
    try:
        text = read_text(path, "DeepSpeed config", limit=CONFIG_LIMIT)
    except FileReadError as exc:
        # Still a FileReadError: not a spelling mistake (exit 2) but a file to fix (exit 1).
        raise FileReadError(
            f"{exc} (or write deepspeed:bf16 / deepspeed:fp16)"
        ) from None
    try:
        config = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except RecursionError:
        raise SettingError(
            f"DeepSpeed config {shown}: it nests too deeply to be a config"
        ) from None
    except json.JSONDecodeError as exc:
        raise SettingError(
            f"DeepSpeed config {shown} is not JSON ({exc.msg}, line {exc.lineno}); ampgraph reads "
            "JSON, without the comments Hjson allows"
        ) from None
    except ValueError as exc:
        raise SettingError(f"DeepSpeed config {shown}: {exc}") from None
    if not isinstance(config, dict):
        raise SettingError(f"DeepSpeed config {shown} is not a JSON object")
    return config


__all__ = ["Precision", "lax_bool", "load", "precision"]
