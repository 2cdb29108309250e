"""What a ranges run measures and concludes, as plain data: torch-free and JSON-ready.

:class:`ValueRange` is one output of one node in the fp32 reference run (largest and smallest
non-zero magnitude, how many zeros, infs and NaNs); :class:`NodeRange` a node's outputs;
:class:`RangeFinding` one value that does not fit a setting's dtype there; :class:`SettingRanges`
the verdict for one setting; :class:`RangesResult` the whole answer. :data:`LIMITS` are the
floating dtypes' bounds as data (``tests/test_ranges.py`` proves them against ``torch.finfo`` and
real conversions), so judging, the formats and the diagrams need no torch.

>>> v = ValueRange("float32", numel=4, max_abs=1.3e5, min_nonzero=0.5, zeros=1)
>>> LIMITS["float16"].overflows(v.max_abs), LIMITS["bfloat16"].overflows(v.max_abs)
(True, False)
>>> round(LIMITS["float16"].headroom(v.max_abs), 2)       # decades left below fp16's maximum
-0.3
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ampgraph.errors import AmpgraphError
from ampgraph.report.records import Report

SCHEMA = "ampgraph.ranges"
SCHEMA_VERSION = 1

#: Severities, least first (as ``ampgraph audit``'s).
SEVERITIES = ("note", "warning", "error")

#: Finding kinds: severity and one-line title.
KINDS: dict[str, tuple[str, str]] = {
    "overflow": ("error", "Values above the dtype's largest finite number become inf"),
    "cast-overflow": ("error", "A cast to a 16-bit dtype turns values into inf"),
    "constant-raises": ("error", "A constant does not fit the dtype: the kernel raises"),
    "constant-overflow": ("error", "A constant does not fit the dtype: it becomes inf"),
    "flush-to-zero": ("note", "Non-zero values below half the smallest subnormal become zero"),
    "subnormal": ("note", "Values below the smallest normal number lose significant bits"),
    # An error, as in ``ampgraph audit``: inf or NaN in the fp32 run is in every setting too.
    "reference-nonfinite": ("error", "inf or NaN already in the fp32 run"),
    "reference-underflow": ("warning", "Values that underflow to zero already in fp32"),
    "gradient-overflow": ("error", "Gradients above their dtype's largest finite number"),
    "gradient-flush-to-zero": ("note", "Non-zero gradients that become zero in their dtype"),
    "scaled-underflow": ("warning", "Gradients that still flush to zero at the fp16 loss scale"),
}


class RangesError(AmpgraphError):
    """A ranges run that cannot start: weights too large for memory, or not the model's."""


@dataclass(frozen=True)
class Limits:
    """A floating dtype's bounds: what rounds to inf, to zero, and where precision thins out."""

    max: float  # largest finite value
    tiny: float  # smallest normal value
    subnormal: float  # smallest positive (subnormal) value
    eps: float  # the gap between 1 and the next value
    bits: int  # significant bits of a normal value (the stored ones and the implicit one)

    @property
    def overflow_at(self) -> float:
        """The smallest magnitude that rounds to inf (round to nearest even): max + half an ulp."""
        return self.max + math.ldexp(1.0, math.frexp(self.max)[1] - self.bits - 1)

    def overflows(self, magnitude: float | None) -> bool:
        return magnitude is not None and magnitude >= self.overflow_at

    def flushes(self, magnitude: float | None) -> bool:
        """Whether a non-zero magnitude rounds to zero (half the smallest subnormal, or less)."""
        return magnitude is not None and 0 < magnitude <= self.subnormal / 2

    def bits_kept(self, magnitude: float) -> int:
        """Significant bits a value keeps: all of them when normal, fewer in the subnormal range.

        >>> LIMITS["float16"].bits_kept(1.0), LIMITS["float16"].bits_kept(1e-7)
        (11, 1)
        """
        if magnitude >= self.tiny:
            return self.bits
        return max(0, math.floor(math.log2(magnitude / self.subnormal)) + 1)

    def headroom(self, magnitude: float | None) -> float | None:
        """Decades between the largest magnitude and the largest finite value (negative: over)."""
        if magnitude is None or magnitude <= 0:
            return None
        return math.log10(self.max / magnitude)


#: The floating dtypes a setting can put a value in. Proved against torch in the tests.
LIMITS: dict[str, Limits] = {
    "float16": Limits(65504.0, 2.0**-14, 2.0**-24, 2.0**-10, 11),
    "bfloat16": Limits(3.3895313892515355e38, 2.0**-126, 2.0**-133, 2.0**-7, 8),
    "float32": Limits(3.4028234663852886e38, 2.0**-126, 2.0**-149, 2.0**-23, 24),
    "float64": Limits(1.7976931348623157e308, 2.0**-1022, 2.0**-1074, 2.0**-52, 53),
}


def _num(value: float | None) -> float | str | None:
    """A float as JSON can hold it (inf and NaN as strings)."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _unnum(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass
class ValueRange:
    """One floating output of one node, in the fp32 run: the magnitudes and the special values.

    ``max_abs`` and ``min_nonzero`` are over the finite values (None where there are none);
    ``underflowed`` counts zeros that fp32 itself made of non-zero results (a product of many
    small factors), whose true magnitude is about ``10 ** log10_true``.
    """

    dtype: str
    numel: int
    max_abs: float | None = None
    min_nonzero: float | None = None
    zeros: int = 0
    infs: int = 0
    nans: int = 0
    #: Magnitudes of 1e38 or more: sentinels such as ``finfo(float32).min`` masks, left out of
    #: ``max_abs`` (each setting's own constants are checked instead).
    extremes: int = 0
    underflowed: int = 0
    log10_true: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log10_true"] = _num(self.log10_true)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValueRange:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("max_abs", "min_nonzero", "log10_true"):
            known[key] = _unnum(known.get(key))
        return cls(**known)


@dataclass
class NodeRange:
    """A node of the reference graph and the range of each of its outputs (None: not floating)."""

    name: str
    op: str
    kind: str
    module: str | None
    outputs: list[ValueRange | None] = field(default_factory=list)
    error: str | None = None
    #: ``--pass train``: the gradient flowing into each output (None: none reaches it).
    gradients: list[ValueRange | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "op": self.op, "kind": self.kind, "module": self.module,
            "outputs": [o.to_dict() if o is not None else None for o in self.outputs],
            "error": self.error,
        }  # fmt: skip
        if self.gradients is not None:
            data["gradients"] = [g.to_dict() if g is not None else None for g in self.gradients]
        return data


@dataclass
class RangeFinding:
    """One value that does not fit the dtype a setting gives it, at one node."""

    kind: str
    node: str
    op: str
    module: str | None
    dtype: str
    value: float
    limit: float
    message: str
    #: The node whose value is cast (``cast-overflow``), or None.
    producer: str | None = None
    #: The reference run's node this one is paired with (what ``--diff`` compares by), or None.
    reference: str | None = None

    @property
    def severity(self) -> str:
        return KINDS[self.kind][0]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity
        data["value"] = _num(self.value)
        return data


@dataclass
class LossScale:
    """The loss scale that keeps a set of fp16 gradients finite, and what it costs.

    ``scale`` is ``2 ** log2``: the largest power of two S with ``max_abs * S <= 65504`` (None
    where no gradient is non-zero). ``torch.amp.GradScaler`` starts at ``2 ** 16`` and halves the
    scale at each step whose gradients hold an inf (skipping that step): ``halvings`` such steps
    before the first finite one. ``underflow`` names the gradients whose smallest non-zero
    magnitude still rounds to zero in fp16 at S (``min_nonzero * S <= 2 ** -25``).
    """

    judged: int  # fp16 gradients looked at
    max_abs: float | None = None
    node: str | None = None  # the gradient that sets the scale
    log2: int | None = None
    underflow: list[str] = field(default_factory=list)

    @property
    def scale(self) -> float | None:
        return None if self.log2 is None else math.ldexp(1.0, self.log2)

    @property
    def init_overflows(self) -> bool:
        """Whether GradScaler's default first scale, 2**16, overflows at the first step."""
        return self.log2 is not None and self.log2 < GRADSCALER_INIT_LOG2

    @property
    def halvings(self) -> int:
        return max(0, GRADSCALER_INIT_LOG2 - self.log2) if self.log2 is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged, "max_abs": self.max_abs, "node": self.node,
            "log2": self.log2, "scale": self.scale, "gradscaler_init_overflows":
            self.init_overflows, "halvings": self.halvings, "underflow": self.underflow,
        }  # fmt: skip


#: ``torch.amp.GradScaler``'s default ``init_scale`` is ``2.0 ** 16``.
GRADSCALER_INIT_LOG2 = 16


@dataclass
class SettingRanges:
    """The verdict for one setting: its findings in graph order, and every node's headroom."""

    setting: dict[str, Any]
    caption: str
    findings: list[RangeFinding] = field(default_factory=list)
    #: Node name (this setting's graph) -> decades below its dtype's maximum (16-bit outputs).
    headroom: dict[str, float] = field(default_factory=dict)
    #: Nodes that compute and had a reference value to judge / had none (unpaired).
    judged: int = 0
    unpaired: list[str] = field(default_factory=list)
    #: ``--pass train``: the loss scale that keeps this setting's fp16 gradients finite.
    loss_scale: LossScale | None = None
    #: The fp32 run's own errors (inf or NaN there), which every setting has too; they are
    #: written once, as the result's ``reference_findings``.
    inherited: list[RangeFinding] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return str(self.setting.get("name", "?"))

    @property
    def first(self) -> RangeFinding | None:
        """The first finding of severity error, in the setting's execution order; else the fp32
        run's own first error (a setting cannot fit where the reference is not finite)."""
        own = next((f for f in self.findings if f.severity == "error"), None)
        return own or next((f for f in self.inherited if f.severity == "error"), None)

    @property
    def ok(self) -> bool:
        return self.first is None

    def min_headroom(self) -> tuple[str, float] | None:
        if not self.headroom:
            return None
        node = min(self.headroom, key=lambda k: self.headroom[k])
        return node, self.headroom[node]

    def to_dict(self) -> dict[str, Any]:
        least = self.min_headroom()
        return {
            "setting": self.setting,
            "caption": self.caption,
            "ok": self.ok,
            "first": self.first.to_dict() if self.first else None,
            "findings": [f.to_dict() for f in self.findings],
            "judged": self.judged,
            "unpaired": self.unpaired,
            "least_headroom": {"node": least[0], "decades": round(least[1], 3)} if least else None,
            "headroom": {k: round(v, 3) for k, v in self.headroom.items()},
            "loss_scale": self.loss_scale.to_dict() if self.loss_scale is not None else None,
        }


@dataclass
class RangesResult:
    """The whole answer of a ranges run."""

    model: str
    weights: str  # where the weights came from, in words
    seed: int
    reference: dict[str, Any]  # the reference setting (fp32, no autocast)
    nodes: list[NodeRange]
    settings: list[SettingRanges]
    #: Findings of the fp32 run itself (inf, NaN, fp32 underflow): in every setting.
    reference_findings: list[RangeFinding] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: Each setting's analysis, in the order of ``settings`` (for the overlay; not in the JSON).
    reports: list[Report] = field(default_factory=list, repr=False)
    #: ``forward``, or ``train``: the gradients of the train pass's loss were measured too.
    pass_: str = "forward"
    #: ``--pass train``: the loss (output path, expression, value in the fp32 run).
    loss: dict[str, Any] | None = None
    #: ``--pass train``: each parameter's ``.grad`` in the fp32 run.
    parameter_gradients: dict[str, ValueRange] = field(default_factory=dict)
    #: ``--pass train``: the loss scale that would keep every gradient finite were all fp16.
    loss_scale: LossScale | None = None

    @property
    def ok(self) -> bool:
        """No error anywhere: in no setting, and not in the fp32 run itself (as ``ampgraph
        audit --ranges`` judges the same file)."""
        return all(s.ok for s in self.settings) and not self.reference_errors

    @property
    def reference_errors(self) -> list[RangeFinding]:
        return [f for f in self.reference_findings if f.severity == "error"]

    def failure(self) -> str | None:
        """Why the result is not ok, in one line (``--fail-on error``'s message), or None."""
        if self.reference_errors:
            first = self.reference_errors[0]
            return f"the fp32 run itself is not finite: {first.message}"
        bad = [s.name for s in self.settings if not s.ok]
        return f"values do not fit their dtype in {', '.join(bad)}" if bad else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "model": self.model,
            "weights": self.weights,
            "seed": self.seed,
            "versions": self.versions,
            "reference": self.reference,
            "reference_findings": [f.to_dict() for f in self.reference_findings],
            "settings": [s.to_dict() for s in self.settings],
            "nodes": [n.to_dict() for n in self.nodes],
            "seconds": self.seconds,
            **(self._train_dict() if self.pass_ == "train" else {"pass": self.pass_}),
        }

    def _train_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_,
            "loss": self.loss,
            "parameter_gradients": {k: v.to_dict() for k, v in self.parameter_gradients.items()},
            "loss_scale": self.loss_scale.to_dict() if self.loss_scale is not None else None,
        }


__all__ = [
    "GRADSCALER_INIT_LOG2",
    "KINDS",
    "LIMITS",
    "LossScale",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SEVERITIES",
    "Limits",
    "NodeRange",
    "RangeFinding",
    "RangesError",
    "RangesResult",
    "SettingRanges",
    "ValueRange",
]
