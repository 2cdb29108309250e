"""Reading records from a file safely: strict JSON and each field's check, torch-free.

:mod:`ampgraph.report.records` builds its records from what a user hands ampgraph (a saved
report, a baseline); everything here refuses a damaged value with one line (``ValueError``)
before any later stage meets it: NaN in the JSON, a dtype torch does not have, a string where a
list belongs. The checks are quick, since a cached report is read on every warm run.

>>> Checks({"name": STR, "outputs": is_dtypes}).malformed({"name": 3, "outputs": ["bfloat16"]})
['name']
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from typing import Any

from ampgraph.settings import AMP_DTYPES, DEVICE_TYPES, EXTRA_FIELDS

#: Every dtype name torch has, spelled as reports spell them (``str(torch.bfloat16)`` without
#: ``torch.``). Kept here, not read from torch, so that reading a report stays torch-free. A dtype
#: field holding anything else (a number, NaN, a typo) is a damaged file: refused in one line
#: rather than drawn as ``out=torch.nan`` or failing deep in a renderer. tests/test_data_files.py
#: checks that the installed torch has no dtype missing here.
DTYPE_NAMES: frozenset[str] = frozenset({
    "bool", "float64", "float32", "bfloat16", "float16", "complex128", "complex64", "complex32",
    "bcomplex32", "int64", "int32", "int16", "int8", "int1", "int2", "int3", "int4", "int5", "int6",
    "int7", "uint64", "uint32", "uint16", "uint8", "uint1", "uint2", "uint3", "uint4", "uint5",
    "uint6", "uint7", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2", "qint32", "qint8", "quint8", "quint4x2", "quint2x4",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
})  # fmt: skip


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (ampgraph writes no NaN or Infinity)")


def load_json(text: str | bytes) -> Any:
    """JSON as the standard defines it, for files a user hands ampgraph (reports, baselines).

    Python's :func:`json.loads` also reads ``NaN``, ``Infinity`` and ``-Infinity``, which no
    ampgraph file holds; they would pass as numbers and fail later, far from the file. Both
    they and a nesting too deep for the parser raise ``ValueError`` with one line.

    >>> load_json('{"out": NaN}')
    Traceback (most recent call last):
    ...
    ValueError: NaN is not a JSON value (ampgraph writes no NaN or Infinity)
    """
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("it nests too deeply to be an ampgraph file") from None


# -- what a record read from a file must hold: each field's check, by name ------------------------

#: A field's check: the exact types its value may have (JSON gives no subclasses; ``True`` must
#: not pass for an int), or a function for values with contents to look into. The tuples are
#: tested inline, without a call: a train report has tens of thousands of records to check.
Check = tuple[type, ...] | Callable[[Any], bool]

_NONE = type(None)
STR: tuple[type, ...] = (str,)
OPT_STR: tuple[type, ...] = (str, _NONE)
BOOL: tuple[type, ...] = (bool,)
OPT_DICT: tuple[type, ...] = (dict, _NONE)
#: What a list of dtypes may hold: names, or None (the set's test needs hashable items, so the
#: items' types are tested first).
_DTYPE_ITEM_TYPES = frozenset({str, _NONE})
_DTYPES_OR_NONE = DTYPE_NAMES | {None}
#: The counts of a check block.
_COUNTS = ("nodes", "compared", "disagreements")


def is_dtype(value: Any) -> bool:
    """A dtype name torch has (:data:`DTYPE_NAMES`).

    >>> is_dtype("bfloat16"), is_dtype("nan"), is_opt_dtype(None)
    (True, False, True)
    """
    return type(value) is str and value in DTYPE_NAMES


def is_opt_dtype(value: Any) -> bool:
    """A dtype name, or None (no tensor)."""
    return value is None or (type(value) is str and value in DTYPE_NAMES)


def is_size(value: Any) -> bool:
    """A dimension or a byte count: an int, not below 0, that an int64 holds."""
    return type(value) is int and 0 <= value <= MAX_NUMEL


def is_report_check(value: Any) -> bool:
    """A check block (the report's or the backward's): None, or an object whose counts are
    sizes and whose oracle is text, where present (other fields are ignored, as the schema
    says). Every count a diagram, ``repr`` or ``summary()`` prints comes from here: never
    "lots disagree".

    >>> is_report_check({"oracle": "o", "compared": 3}), is_report_check({"compared": "lots"})
    (True, False)
    """
    return value is None or (
        type(value) is dict
        and type(value.get("oracle", "")) is str
        and all(is_size(value[k]) for k in _COUNTS if k in value)
        and type(value.get("unavailable")) in OPT_STR
    )


def is_node_check(value: Any) -> bool:
    """A node's check: None, or an object whose ``agree`` is true, false or null and whose
    ``note`` is text, where present."""
    return value is None or (
        type(value) is dict
        and type(value.get("agree")) in (bool, _NONE)
        and type(value.get("note", "")) is str
    )


def is_versions(value: Any) -> bool:
    """``versions``: each package's version (and ``policy_tables``) as text, or null.

    >>> is_versions({"torch": "2.14", "policy_tables": [1]})
    False
    """
    return type(value) is dict and {*map(type, value.values())} <= {str, _NONE}


def is_strs(value: Any) -> bool:
    """A list of strings."""
    return type(value) is list and {*map(type, value)} <= {str}


def is_dtypes(value: Any) -> bool:
    """Output dtypes: each a dtype name, or None for a value that is not a tensor."""
    return (
        type(value) is list
        and {*map(type, value)} <= _DTYPE_ITEM_TYPES
        and _DTYPES_OR_NONE.issuperset(value)
    )


#: torch's sizes and element counts are int64: a shape past them is a damaged file, not a
#: tensor (``audit`` printed a 2e60-byte weight cast from one).
MAX_NUMEL = 2**63 - 1


def is_shape(value: Any) -> bool:
    """A shape: a list of sizes (:func:`is_size`) whose product torch could hold.

    >>> is_shape([2, 3]), is_shape([10**30]), is_shape([2**62, 4])
    (True, False, False)
    """
    return (
        type(value) is list
        and {*map(type, value)} <= {int}
        and min(value, default=0) >= 0
        and math.prod(value) <= MAX_NUMEL
    )


def is_shapes(value: Any) -> bool:
    """Each output's shape, or None (not a tensor, or a symbolic size); None for old reports."""
    return value is None or (type(value) is list and all(v is None or is_shape(v) for v in value))


def is_input(value: Any) -> bool:
    """``{"node", "dtype"}`` (and ``from``, where a view's producer is another node)."""
    return (
        type(value) is dict
        and type(value.get("node")) is str
        and is_opt_dtype(value.get("dtype"))
        and type(value.get("from")) in OPT_STR
    )


def is_inputs(value: Any) -> bool:
    """A node's inputs: a list of :func:`is_input` dicts."""
    return type(value) is list and all(map(is_input, value))


def is_promotion(value: Any) -> bool:
    """``{"inputs", "to"}``: the input dtypes ordinary type promotion widened, and to what."""
    return value is None or (
        type(value) is dict and is_dtypes(value.get("inputs", [])) and is_opt_dtype(value.get("to"))
    )


def is_source(value: Any) -> bool:
    """``{"file", "line"}``: what ``ampgraph audit`` prints as ``file:line``."""
    return value is None or (
        type(value) is dict and type(value.get("file")) is str and type(value.get("line")) is int
    )


def label(value: Any) -> str:
    """A value as an error message names it: quoted, on one line, not too long.

    >>> label("relu"), len(label("x" * 100))
    ("'relu'", 60)
    """
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class Checks:
    """Each field's check (:data:`Check`), by field name, and the quick test of them all.

    The quick test runs for every record read (a cached report is read on every warm run), so
    it compares the fields' types with their tuples in C (``map``) and calls functions only for
    the fields with contents; the fields that failed are looked for only when it fails.
    """

    def __init__(self, checks: dict[str, Check]) -> None:
        self.checks = checks
        typed = [(k, ok) for k, ok in checks.items() if isinstance(ok, tuple)]
        self._typed = tuple(k for k, _ in typed)
        self._types = tuple(ok for _, ok in typed)
        self._calls = tuple((k, ok) for k, ok in checks.items() if not isinstance(ok, tuple))

    def passes(self, values: dict[str, Any]) -> bool:
        """Whether every field of ``values`` (which has them all) passes its check."""
        kinds = map(type, map(values.__getitem__, self._typed))
        return all(map(operator.contains, self._types, kinds)) and all(
            ok(values[k]) for k, ok in self._calls
        )

    def malformed(self, values: dict[str, Any]) -> list[str]:
        """The fields whose value in ``values`` fails its check."""
        if self.passes(values):
            return []
        return [
            field
            for field, ok in self.checks.items()
            if not (type(values[field]) in ok if isinstance(ok, tuple) else ok(values[field]))
        ]


def refuse_malformed(record: Any, checks: Checks, what: str, name: str | None = None) -> None:
    """``ValueError`` naming every field of ``record`` that fails its check: ``{what}'x' has a
    malformed ...``, ``'x'`` being the value of the field ``name`` that names the record (quoted
    only on failure, for the same reason the checks are quick)."""
    values = vars(record)
    bad = checks.malformed(values)
    if bad:
        named = label(values[name]) if name is not None else ""
        raise ValueError(f"{what}{named} has a malformed {', '.join(bad)}")


_SETTING_FIELDS = ("name", "device_type", "autocast", "amp_dtype", "param_dtype")

_SETTING_CHECKS = Checks({
    "name": STR, "device_type": STR, "autocast": BOOL, "amp_dtype": is_dtype,
    "param_dtype": is_dtype,
})  # fmt: skip


def check_setting(setting: Any) -> dict[str, Any]:
    """``setting`` when it is a setting as reports hold it, else ``ValueError`` in one line.

    >>> check_setting({"name": "fp32", "device_type": "cuda", "autocast": "no",
    ...                "amp_dtype": "bf16", "param_dtype": "float32"})
    Traceback (most recent call last):
    ...
    ValueError: its setting has a malformed autocast, amp_dtype
    >>> check_setting({"name": "fp32", "device_type": "cuda", "autocast": False,
    ...                "amp_dtype": "bfloat16", "param_dtype": "float32", "input_dtype": 5})
    Traceback (most recent call last):
    ...
    ValueError: its setting has a malformed input_dtype
    """
    missing = [k for k in _SETTING_FIELDS if not isinstance(setting, dict) or k not in setting]
    if missing:
        raise ValueError(f"its setting lacks {', '.join(missing)}")
    bad = _SETTING_CHECKS.malformed(setting)
    if "device_type" not in bad and setting["device_type"] not in DEVICE_TYPES:
        bad.append("device_type")  # audit and diff name its autocast lists
    # A recipe's casts, only where set: None or a dtype a setting can hold (settings.py).
    bad += [k for k in EXTRA_FIELDS if setting.get(k) not in (None, "float32", *AMP_DTYPES)]
    if bad:
        raise ValueError(f"its setting has a malformed {', '.join(bad)}")
    return dict(setting)


def typed(data: dict[str, Any], key: str, kind: type) -> Any:
    """``data[key]`` where it is a ``kind``, else ``TypeError`` naming the key.

    >>> typed({"nodes": {}}, "nodes", list)
    Traceback (most recent call last):
    ...
    TypeError: 'nodes' should be a list, not dict
    """
    value = data[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key!r} should be a {kind.__name__}, not {type(value).__name__}")
    return value
