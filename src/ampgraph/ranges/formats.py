"""A ranges result as a person reads it (the table and summary, Markdown) or a program does (JSON).

Torch-free. The text is one screen: a line per setting saying whether it fits and, where not, the
first node that does not and why; then the findings of severity warning or more, identical
messages of repeated layers counted once; then the tightest headroom per setting.

>>> from ampgraph.ranges.data import RangesResult, SettingRanges
>>> r = RangesResult("m", "seeded random weights (seed 0)", 0, {"name": "fp32"}, [],
...                  [SettingRanges({"name": "amp-fp32"}, "autocast bf16, parameters fp32")])
>>> print(text(r).splitlines()[3])
  amp-fp32 fits              -  autocast bf16, parameters fp32
"""

from __future__ import annotations

import json
import re
from collections import Counter

from ampgraph.ranges.data import (
    LIMITS,
    LossScale,
    RangeFinding,
    RangesResult,
    SettingRanges,
)
from ampgraph.settings import short_dtype

#: Findings listed per setting in the text format before "... and N more".
SHOWN = 8


def _layerless(message: str) -> str:
    """A message with layer numbers and node suffixes folded, to count repeats of one finding."""
    return re.sub(r"_\d+\b", "_N", re.sub(r"\.\d+\.", ".N.", message))


def _status(s: SettingRanges) -> str:
    if s.ok:
        return "fits"
    return "OVERFLOWS" if any(f.severity == "error" for f in s.findings) else "fits"


def _precision_line(result: RangesResult) -> str | None:
    dtypes = sorted(
        {str(s.setting.get("amp_dtype")) for s in result.settings if s.setting.get("autocast")}
        | {str(s.setting.get("param_dtype")) for s in result.settings}
    )
    parts = [
        f"{short_dtype(d)} keeps {LIMITS[d].bits} significant bits (rounding error up to "
        f"{LIMITS[d].eps / 2:.3%})"
        for d in dtypes
        if d in ("float16", "bfloat16")
    ]
    return "precision: " + "; ".join(parts) if parts else None


def _grouped(findings: list[RangeFinding]) -> list[tuple[RangeFinding, int]]:
    counts: Counter[str] = Counter()
    first: dict[str, RangeFinding] = {}
    for f in findings:
        key = _layerless(f.message)
        counts[key] += 1
        first.setdefault(key, f)
    return [(first[k], counts[k]) for k in first]


def _room(s: SettingRanges) -> str:
    least = s.min_headroom()
    return f"{least[1]:+.1f}" if least is not None else "-"


def _train_lines(result: RangesResult) -> list[str]:
    """``--pass train``: the loss, and each setting's fp16 loss scale in a line."""
    from ampgraph.ranges.gradients import describe

    if result.pass_ != "train" or result.loss is None:
        return []
    loss = result.loss
    which = f"the output {loss['output']!r}" if loss["output"] else "the model's output"
    value = loss["value"] if isinstance(loss["value"], str) else f"{loss['value']:.4g}"
    lines = ["", f"gradients: loss = {loss['expression']} of {which} = {value} in the fp32 run; "
             f"{len(result.parameter_gradients)} parameter gradients"]  # fmt: skip
    width = max([len(s.name) for s in result.settings] + [10])
    for name, scale in _scales(result):
        first, *rest = describe(scale)
        lines += [f"  {name:<{width}}  {first}", *(f"  {'':<{width}}  {r}" for r in rest)]
    return lines


def _scales(result: RangesResult) -> list[tuple[str, LossScale]]:
    """Each setting's fp16 loss scale, then the one were every gradient fp16 ("all fp16")."""
    named = [(s.name, s.loss_scale) for s in result.settings] + [("all fp16", result.loss_scale)]
    return [(n, scale) for n, scale in named if scale is not None]


def text(result: RangesResult) -> str:
    """The table and summary: one screen."""
    width = max([len(s.name) for s in result.settings] + [7])
    lines = [
        f"{result.model}: value ranges of one fp32 run on the CPU ({result.weights})",
        "",
        f"  {'setting':<{width}} {'verdict':<10}{'headroom':>9}  dtypes",
    ]
    for s in result.settings:
        lines.append(f"  {s.name:<{width}} {_status(s):<10}{_room(s):>9}  {s.caption}")
        if s.first is not None:
            lines.append(f"  {'':<{width}} first: {s.first.message}")
    lines.append(
        "headroom: decades from the largest 16-bit value to its dtype's largest finite number "
        "(negative: overflow)"
    )
    lines += _train_lines(result)
    for s in result.settings:
        rest = [f for f in s.findings if f.severity != "note" and f is not s.first]
        if not rest:
            continue
        lines += ["", f"# {s.name}: {len(rest)} more finding{'s' * (len(rest) != 1)}"]
        groups = _grouped(rest)
        for f, n in groups[:SHOWN]:
            times = f" (x{n})" if n > 1 else ""
            lines.append(f"  {f.severity:<8}{f.message}{times}")
        if len(groups) > SHOWN:
            lines.append(f"  ... and {len(groups) - SHOWN} more (--format json)")
    if result.reference_findings:
        lines.append("")
    lines += [f"fp32 run: {f.message}" for f in result.reference_findings]
    notes = [(s.name, sum(f.severity == "note" for f in s.findings)) for s in result.settings]
    if any(n for _, n in notes):
        counts = ", ".join(f"{name} {n}" for name, n in notes if n)
        lines += ["", f"notes (values that lose bits as subnormals or flush to zero): {counts} "
                      "(--format json lists them)"]  # fmt: skip
    precision = _precision_line(result)
    if precision:
        lines += ["", precision]
    return "\n".join(lines).rstrip() + "\n"


def to_json(result: RangesResult) -> str:
    """The versioned JSON record (schema ``ampgraph.ranges``, documented in docs/schema.md)."""
    return json.dumps(result.to_dict(), indent=1, allow_nan=False)


def diff_view(result: RangesResult, fmt: str) -> str:
    """``--diff``: the first two settings' differing verdicts as text, or the JSON record with a
    ``diff`` object (:mod:`ampgraph.ranges.setting_diff`)."""
    from ampgraph.ranges import setting_diff as diff

    a, b = result.settings[:2]
    rows = diff.diff(a, b)
    if fmt == "text":
        return diff.text(a, b, rows)
    return json.dumps({**result.to_dict(), "diff": diff.to_dict(a, b, rows)}, indent=1,
                      allow_nan=False)  # fmt: skip


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def markdown(result: RangesResult) -> str:
    """A Markdown table per result (a pull-request comment), then the findings."""
    lines = [
        f"### Value ranges: `{_cell(result.model)}`",
        "",
        f"One fp32 run on the CPU, {_cell(result.weights)}.",
        "",
        "| setting | verdict | first node that does not fit |",
        "|---|---|---|",
    ]
    for s in result.settings:
        first = _cell(s.first.message) if s.first else ""
        lines.append(f"| `{_cell(s.name)}` ({_cell(s.caption)}) | {_status(s)} | {first} |")
    shown = [(s, f) for s in result.settings for f in s.findings if f.severity != "note"]
    if shown:
        lines += ["", "| setting | severity | finding |", "|---|---|---|"]
        for s, f in shown[: SHOWN * 4]:
            lines.append(f"| `{_cell(s.name)}` | {f.severity} | {_cell(f.message)} |")
    for f in result.reference_findings:
        lines += ["", f"- fp32 run: {_cell(f.message)}"]
    train = _train_lines(result)
    if train:  # --pass train: the loss and each setting's fp16 loss scale, as a list
        from ampgraph.ranges.gradients import describe

        lines += ["", f"- {_cell(train[1])}"] + [
            f"  - `{_cell(name)}`: {_cell('; '.join(describe(scale)))}"
            for name, scale in _scales(result)
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def sarif(result: RangesResult) -> str:
    """SARIF 2.1.0 for code scanning, as ``ampgraph audit --format sarif``: one run, a rule per
    kind, a result per finding of severity warning or error (each setting's, and the fp32
    run's), located at the module and node, and at the model's file where it names one."""
    from ampgraph.ranges.data import KINDS
    from ampgraph.review.audit import artifact_uri, model_file
    from ampgraph.version import __version__

    artifact = model_file(result.model)
    results = []
    pairs = [(s.name, f) for s in result.settings for f in s.findings]
    pairs += [("fp32 run", f) for f in result.reference_findings]
    for name, f in pairs:
        if f.severity == "note":
            continue
        logical = {"fullyQualifiedName": f"{f.module or '<top>'}/{f.node}", "kind": "member"}
        location: dict[str, object] = {"logicalLocations": [logical]}
        if artifact:
            location["physicalLocation"] = {
                "artifactLocation": {"uri": artifact_uri(artifact)}, "region": {"startLine": 1},
            }  # fmt: skip
        results.append({
            "ruleId": f.kind, "level": f.severity, "message": {"text": f"[{name}] {f.message}"},
            "locations": [location],
            "partialFingerprints": {"ampgraph/v1": f"{result.model}:{name}:{f.kind}:{f.node}"},
        })  # fmt: skip
    rules = [
        {"id": kind, "name": kind.title().replace("-", ""), "shortDescription": {"text": title},
         "defaultConfiguration": {"level": level},
         "helpUri": "https://github.com/ampgraph/ampgraph/blob/main/docs/ranges.md"}
        for kind, (level, title) in KINDS.items()
    ]  # fmt: skip
    return json.dumps({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{"tool": {"driver": {"name": "ampgraph ranges", "version": __version__,
                                      "rules": rules}}, "results": results}],
    }, indent=1)  # fmt: skip


__all__ = ["diff_view", "markdown", "sarif", "text", "to_json"]
