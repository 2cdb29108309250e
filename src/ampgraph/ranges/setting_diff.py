"""Two settings' verdicts side by side: the nodes where one's values fit and the other's do not.

Torch-free. Both settings are judged against the same fp32 run, so a finding's ``reference``
(the reference run's node it is paired with, or the parameter a gradient belongs to) says which
value it is about in either graph; :func:`diff` groups each setting's findings by it and keeps the
values whose verdicts differ (a kind in one setting and not the other, or another dtype).

>>> from ampgraph.ranges.data import RangeFinding, SettingRanges
>>> f = RangeFinding("overflow", "linear_1", "aten.linear.default", "fc2", "float16", 1e5,
...                  65504.0, "linear in fc2 (linear_1): max 1e+05 > fp16's 65,504; ...",
...                  reference="linear_1")
>>> a = SettingRanges({"name": "amp-fp32"}, "autocast cpu fp16", findings=[f])
>>> b = SettingRanges({"name": "amp-fp32"}, "autocast cpu bf16")
>>> rows = diff(a, b)
>>> [(r.value, r.a[0].kind if r.a else None, r.b) for r in rows]
[('linear_1', 'overflow', [])]


The text view is :func:`ampgraph.formats.diff_text.setting_diff_text`; :func:`to_dict` is the
JSON's ``diff`` object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampgraph.ranges.data import SEVERITIES, RangeFinding, SettingRanges

@dataclass
class DiffRow:
    """One value (a reference node, or a parameter's gradient) judged differently."""

    value: str
    module: str | None
    a: list[RangeFinding] = field(default_factory=list)
    b: list[RangeFinding] = field(default_factory=list)

    @property
    def severity(self) -> str:
        """The worse of the two sides' worst severities."""
        return max((f.severity for f in (*self.a, *self.b)), key=SEVERITIES.index)

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value, "module": self.module, "severity": self.severity,
            "a": [f.to_dict() for f in self.a], "b": [f.to_dict() for f in self.b],
        }  # fmt: skip


def _key(f: RangeFinding) -> str:
    return f.reference or f.node


def _verdict(findings: list[RangeFinding]) -> set[tuple[str, str]]:
    return {(f.kind, f.dtype) for f in findings}


def diff(a: SettingRanges, b: SettingRanges, *, notes: bool = False) -> list[DiffRow]:
    """The values whose findings differ between ``a`` and ``b``, worst first, then in ``a``'s
    order (``b``'s for values only ``b`` has findings at). Notes are left out unless ``notes``."""
    rows: dict[str, DiffRow] = {}
    for side, setting in (("a", a), ("b", b)):
        for f in setting.findings:
            if f.severity == "note" and not notes:
                continue
            row = rows.setdefault(_key(f), DiffRow(_key(f), f.module))
            getattr(row, side).append(f)
    differing = [r for r in rows.values() if _verdict(r.a) != _verdict(r.b)]
    return sorted(differing, key=lambda r: -SEVERITIES.index(r.severity))


def to_dict(a: SettingRanges, b: SettingRanges, rows: list[DiffRow]) -> dict[str, Any]:
    """The ``diff`` object of the JSON (docs/schema.md)."""
    return {"a": a.name, "b": b.name, "a_caption": a.caption, "b_caption": b.caption,
            "rows": [r.to_dict() for r in rows]}  # fmt: skip


__all__ = ["DiffRow", "diff", "to_dict"]
