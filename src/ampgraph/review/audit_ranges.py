"""``ampgraph audit --ranges RANGES.json``: a saved ranges run's findings among the audit's.

Torch-free, as the audit of saved reports is. :func:`load_ranges` reads a file that
``ampgraph ranges --format json`` wrote (schema ``ampgraph.ranges`` version 1) through the
project's one file reader (:func:`ampgraph.report.reading.read_text`: regular files only,
bounded), checks it field by field (one line naming the first field that is wrong), and turns
each finding into an audit :class:`~ampgraph.review.findings.Finding` of kind ``range-KIND``.
Severities in the audit: a value that becomes inf or makes a kernel raise is an error, one that
becomes zero a warning, one that loses bits as a subnormal a note (:data:`SEVERITY`).
:func:`attach` gives each audited report the findings of the same model and setting.

>>> import json, tempfile, pathlib
>>> setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
...            "amp_dtype": "float16", "param_dtype": "float32"}
>>> finding = {"kind": "overflow", "node": "linear_1", "op": "aten.linear.default",
...            "module": "fc2", "dtype": "float16", "message": "linear in fc2 (linear_1): ..."}
>>> doc = {"schema": "ampgraph.ranges", "version": 1, "model": "m", "reference_findings": [],
...        "settings": [{"setting": setting, "findings": [finding]}]}
>>> path = pathlib.Path(tempfile.mkdtemp()) / "r.json"
>>> _ = path.write_text(json.dumps(doc))
>>> saved = load_ranges(path)
>>> [(f.kind, f.severity, f.node) for f in saved.settings[0][1]]
[('range-overflow', 'error', 'linear_1')]
>>> _ = path.write_text(json.dumps({**doc, "version": 2}))
>>> load_ranges(path)                                        # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ampgraph.review.audit_ranges.RangesFileError: ...r.json: version is 2; this ampgraph reads ...
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampgraph.errors import AmpgraphError
from ampgraph.report.records import Report
from ampgraph.review.findings import Finding

#: Each kind ``ampgraph ranges`` writes -> its severity in the audit, and one-line title (for
#: SARIF's rules). ``tests/test_ranges_train.py`` checks these are exactly ranges' kinds.
SEVERITY: dict[str, tuple[str, str]] = {
    "overflow": ("error", "Values above the dtype's largest finite number become inf"),
    "cast-overflow": ("error", "A cast to a 16-bit dtype turns values into inf"),
    "constant-raises": ("error", "A constant does not fit the dtype: the kernel raises"),
    "constant-overflow": ("error", "A constant does not fit the dtype: it becomes inf"),
    "gradient-overflow": ("error", "Gradients above their dtype's largest finite number"),
    "reference-nonfinite": ("error", "inf or NaN already in the fp32 run"),
    "flush-to-zero": ("warning", "Non-zero values that become zero in the dtype"),
    "gradient-flush-to-zero": ("warning", "Non-zero gradients that become zero in the dtype"),
    "scaled-underflow": ("warning", "Gradients that still flush to zero at the fp16 loss scale"),
    "reference-underflow": ("warning", "Values that underflow to zero already in fp32"),
    "subnormal": ("note", "Values below the smallest normal number lose significant bits"),
}
SUGGESTION = {
    "error": "keep it in fp32, use bf16, or scale it down (see ampgraph ranges, docs/ranges.md)",
    "warning": "keep it in fp32 or scale it up (a loss scale for gradients; docs/ranges.md)",
    "note": "fine where a few bits of small values do not matter (docs/ranges.md)",
}
#: The setting fields that say two records are about the same setting.
SAME_SETTING = ("name", "device_type", "autocast", "amp_dtype", "param_dtype")


class RangesFileError(AmpgraphError):
    """A ``--ranges`` file that is not a ranges run ampgraph can read, or about another model."""


@dataclass
class SavedRanges:
    """A ranges file's model and, per setting, its findings as audit findings."""

    path: Path
    model: str
    settings: list[tuple[dict[str, Any], list[Finding]]] = field(default_factory=list)


_NAMES = {str: "a string", dict: "an object", list: "a list"}


def _need(value: Any, kind: type | tuple[type, ...], where: str, path: Path) -> Any:
    """``value`` if it is a ``kind``, else one line naming the field, what it is and should be."""
    if not isinstance(value, kind):
        want = _NAMES[kind] if isinstance(kind, type) else "a string or null"
        name = type(value).__name__
        article = "an" if name[0] in "aeiou" else "a"
        got = "missing or null" if value is None else f"{article} {name}"
        raise RangesFileError(f"{path}: {where} is {got}, not {want}")
    return value


def _finding(data: Any, where: str, path: Path) -> Finding:
    data = _need(data, dict, where, path)
    kind = _need(data.get("kind"), str, f"{where}.kind", path)
    if kind not in SEVERITY:
        raise RangesFileError(f"{path}: {where}.kind {kind!r} is no kind ampgraph ranges writes")
    text = {k: _need(data.get(k), str, f"{where}.{k}", path) for k in ("node", "op", "message")}
    module = _need(data.get("module"), (str, type(None)), f"{where}.module", path)
    dtype = _need(data.get("dtype"), str, f"{where}.dtype", path)
    return Finding(
        kind=f"range-{kind}", severity=SEVERITY[kind][0], node=text["node"], op=text["op"],
        module=module, message=text["message"], suggestion=SUGGESTION[SEVERITY[kind][0]],
        details={"dtype": dtype, "ranges_kind": kind},
    )  # fmt: skip


def load_ranges(path: Path | str) -> SavedRanges:
    """A ranges file read and checked: one :class:`RangesFileError` line for what is wrong."""
    from ampgraph.report.reading import read_text

    path = Path(path)
    try:
        data = json.loads(read_text(path, "ranges file"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise RangesFileError(f"{path}: not JSON ({str(exc).splitlines()[0]})") from None
    data = _need(data, dict, "the file", path)
    if data.get("schema") != "ampgraph.ranges":
        raise RangesFileError(f"{path}: schema is {data.get('schema')!r}, not 'ampgraph.ranges' "
                              "(write it with ampgraph ranges --format json)")  # fmt: skip
    if data.get("version") != 1:
        raise RangesFileError(f"{path}: version is {data.get('version')!r}; this ampgraph reads "
                              "version 1 (write it again with this ampgraph)")  # fmt: skip
    out = SavedRanges(path, _need(data.get("model"), str, "model", path))
    common = [
        _finding(f, f"reference_findings[{i}]", path)
        for i, f in enumerate(_need(data.get("reference_findings", []), list,
                                    "reference_findings", path))
    ]  # fmt: skip
    for i, s in enumerate(_need(data.get("settings"), list, "settings", path)):
        s = _need(s, dict, f"settings[{i}]", path)
        setting = _need(s.get("setting"), dict, f"settings[{i}].setting", path)
        _need(setting.get("name"), str, f"settings[{i}].setting.name", path)
        found = _need(s.get("findings"), list, f"settings[{i}].findings", path)
        out.settings.append((setting, common + [
            _finding(f, f"settings[{i}].findings[{j}]", path) for j, f in enumerate(found)
        ]))  # fmt: skip
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in SAME_SETTING)


def attach(reports: Sequence[Report], saved: Sequence[SavedRanges]) -> list[list[Finding]]:
    """Per report, the range findings of the same model and setting. Every setting of every file
    must match an audited report: one line naming the first that does not (and how to audit it).
    """
    extra: list[list[Finding]] = [[] for _ in reports]
    for ranges in saved:
        for setting, found in ranges.settings:
            hits = [i for i, r in enumerate(reports)
                    if r.model == ranges.model and _same(r.setting, setting)]  # fmt: skip
            if not hits:
                audited = ", ".join(sorted({f"{r.model} {r.setting.get('name')}"
                                            for r in reports})) or "none"  # fmt: skip
                raise RangesFileError(
                    f"{ranges.path}: {ranges.model}'s setting {setting.get('name')} "
                    f"({setting.get('device_type')}, amp {setting.get('amp_dtype')}, parameters "
                    f"{setting.get('param_dtype')}) is not among the audited ({audited}): audit "
                    "that model and setting (-s, --device, --amp-dtype) or its saved report"
                )
            for i in hits:
                extra[i] += found
    return extra


__all__ = ["SEVERITY", "RangesFileError", "SavedRanges", "attach", "load_ranges"]
