"""The findings of ``ampgraph audit``: where dtypes meet, read from a report's records.

Torch-free: :func:`audit` takes a :class:`~ampgraph.report.records.Report` (fresh, or saved by
``ampgraph table --format json``) and returns :class:`Finding` objects; nothing here is hard-coded
per model, every number is counted from the records. The kinds (:data:`KINDS`):

* ``promotion``: an op with no autocast policy whose mixed inputs ordinary type promotion widens
  (the residual add ``bf16 + fp32 -> fp32``), with the bytes of the widened output;
* ``autocast-cast``: the tensors autocast casts before an op, with the bytes cast, split into the
  model's weights and activations, and which casts pre-casting the parameters or inputs removes;
* ``mixed-dtypes``: an op with no autocast policy (a custom op, say) that receives mixed floating
  dtypes and does not promote them;
* ``no-autocast-rule``: a custom op (any non-ATen op) with no autocast kernel on the device that,
  inside an enabled autocast region, receives fp32 mixed with 16-bit inputs or only fp32: it runs
  in its inputs' dtype, where an ATen op of the same work would be cast;
* ``dtype-error``: an op that raises on its dtypes, with torch's message;
* ``fp32-into-16bit-only``: a kernel that only runs in 16 bits, fed fp32;
* ``sensitive-16bit``: an op on autocast's fp32 list (LayerNorm, softmax, sum, exp, ...) that runs
  in 16 bits anyway (no autocast, 16-bit parameters; or the CPU lists, which protect fewer ops);
* ``fp16-range``: an op whose result overflows fp16 easily (exp, pow, sums) running in fp16;
* ``fp32-island``: an autocast-disabled region and the casts at its borders.

>>> from ampgraph.report.records import Cast, NodeRecord, Report
>>> nodes = [
...     NodeRecord("x", "placeholder", "input", outputs=["float32"], shapes=[[4, 8]]),
...     NodeRecord("w", "placeholder", "parameter", outputs=["float32"], shapes=[[8, 8]]),
...     NodeRecord("linear", "aten.linear.default", "op", module="fc", policy="lower_precision_fp",
...                casts=[Cast("x", "float32", "bfloat16"), Cast("w", "float32", "bfloat16")],
...                outputs=["bfloat16"], shapes=[[4, 8]]),
... ]
>>> setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
>>> report = Report("demo", setting, {}, {}, nodes, [])
>>> [(f.kind, f.bytes) for f in audit(report)]
[('autocast-cast', 192)]
>>> summary(report)["casts"]
{'count': 2, 'bytes': 192, 'weights': 1, 'weights_bytes': 128, 'activations': 1, 'activations_bytes': 64, 'from_inputs': 1}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ampgraph import policy as P
from ampgraph.report.records import SOURCE_KINDS, NodeRecord, Report
from ampgraph.settings import short_dtype

#: Severities, least first: ``--fail-on`` counts a finding at or above the one it names.
SEVERITIES = ("note", "warning", "error")

#: Every kind, with its severity and a one-line title (SARIF's rule description).
KINDS: dict[str, tuple[str, str]] = {
    "dtype-error": ("error", "An op raises on the dtypes it receives"),
    "fp32-into-16bit-only": ("error", "A kernel that only runs in 16 bits is fed fp32"),
    "mixed-dtypes": ("warning", "An op without an autocast policy receives mixed floating dtypes"),
    "no-autocast-rule": ("warning", "A custom op with no autocast rule runs in its inputs' dtype"),
    "fp16-range": ("warning", "An op whose result overflows fp16 easily runs in fp16"),
    "sensitive-16bit": ("warning", "A numerically sensitive op runs in 16 bits"),
    "promotion": ("note", "Mixed inputs are widened by type promotion"),
    "autocast-cast": ("note", "autocast casts tensors before an op"),
    "fp32-island": ("note", "An autocast-disabled region, and the casts at its borders"),
}

#: Bytes per element of the dtypes records name.
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "complex128": 16, "complex64": 8,
    "complex32": 4, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip
FLOATING = frozenset({"float64", "float32", "bfloat16", "float16"})
SIXTEEN_BIT = frozenset({"bfloat16", "float16"})
#: autocast's categories that keep an op in fp32: the ops it protects from 16 bits.
_FP32_CATEGORIES = frozenset({P.FP32, P.FP32_SET_OPT_DTYPE, P.FP32_APPEND_DTYPE})
#: Ops whose results leave fp16's range (max 65504) for ordinary inputs: exp(11.1) already does.
FP16_RANGE_OPS = frozenset({
    "exp", "expm1", "pow", "sinh", "cosh", "reciprocal", "rsqrt", "sum", "prod", "cumsum",
    "cumprod", "logsumexp", "mse_loss",
})  # fmt: skip
#: Kernels with no fp32 implementation (FlashAttention's): fp32 inputs make them raise.
SIXTEEN_BIT_ONLY = frozenset({
    "_scaled_dot_product_flash_attention", "_flash_attention_forward",
    "_scaled_dot_product_cudnn_attention",
})  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One finding: what happens at one node, why it matters, and what to do about it."""

    kind: str
    severity: str
    node: str
    op: str
    module: str | None
    message: str
    suggestion: str
    #: Bytes per forward the finding is about (cast, widened); None where shapes are unknown.
    bytes: int | None = None
    #: Kind-specific numbers (the casts and their split, a region's border casts, ...).
    details: dict[str, Any] = field(default_factory=dict)
    #: ``{"file", "line"}`` in the model's code, where the records know it (an analysis with
    #: ``sources=True``, as ``ampgraph audit`` makes; not a report saved by ``ampgraph table``).
    source: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _op_parts(op: str) -> tuple[str, str] | None:
    """``aten.softmax.int`` -> ``("softmax", "int")``; None for a non-ATen op."""
    parts = op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    return parts[1], parts[2]


def _custom_op(op: str) -> bool:
    """Whether ``op`` names an operator of a library other than ATen's (``mylib.mm.default``):
    one anybody can register an autocast rule for. Python-level calls (``getitem``) and
    higher-order ops (``higher_order.wrap_with_autocast``) have two parts or fewer.

    >>> _custom_op("mylib.mm.default"), _custom_op("aten.mm.default"), _custom_op("getitem")
    (True, False, False)
    """
    parts = op.split(".")
    return len(parts) == 3 and parts[0] not in ("aten", "prims", "higher_order")


def _fp32_listed(op: str) -> bool:
    """Whether CUDA autocast's fp32 lists name the op (what autocast would protect)."""
    parts = _op_parts(op)
    return parts is not None and P.lookup("cuda", f"aten::{parts[0]}", parts[1]) in _FP32_CATEGORIES


def _numel(shape: Sequence[int] | None) -> int | None:
    if shape is None:
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _bytes(rec: NodeRecord | None, dtype: str | None, index: int = 0) -> int | None:
    """Bytes of ``rec``'s output ``index`` held in ``dtype``; None where the shape is unknown."""
    if rec is None or not rec.shapes or index >= len(rec.shapes) or dtype not in ITEMSIZE:
        return None
    numel = _numel(rec.shapes[index])
    return None if numel is None else numel * ITEMSIZE[dtype]


def _sum(values: Sequence[int | None]) -> int | None:
    """The sum, or None if any part is unknown (an exact figure or none)."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def fmt_bytes(n: int | None) -> str:
    """``1179648`` -> ``'1,179,648 B (1.2 MB)'``; ``'? B'`` where the shapes are unknown.

    >>> fmt_bytes(1179648), fmt_bytes(96), fmt_bytes(None)
    ('1,179,648 B (1.2 MB)', '96 B', '? B')
    """
    if n is None:
        return "? B"
    if n < 1000:
        return f"{n} B"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n:,} B ({n / size:.1f} {unit})"
    raise AssertionError  # pragma: no cover


def _n(count: int, word: str) -> str:
    """``_n(1, "cast")`` -> ``'1 cast'``, ``_n(2, "cast")`` -> ``'2 casts'``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def where(op: str, module: str | None) -> str:
    """How a finding's message names its node: ``'add.Tensor in model.layers.0'``.

    >>> where("aten.linear.default", None)
    'linear in the top level'
    """
    return f"{op.removeprefix('aten.').removesuffix('.default')} in {module or 'the top level'}"


def _where(rec: NodeRecord) -> str:
    return where(rec.op, rec.module)


class _Auditor:
    """One pass over a report's records; each ``_kind`` method adds its findings."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.by_name = {r.name: r for r in report.nodes}
        # How often each (tensor, target dtype) is cast: autocast caches only leaf weights.
        self.cast_uses = Counter((c.node, c.to_dtype) for r in report.nodes for c in r.casts)
        self.findings: list[Finding] = []

    def add(self, kind: str, rec: NodeRecord, message: str, suggestion: str, **extra: Any) -> None:
        self.findings.append(Finding(kind, KINDS[kind][0], rec.name, rec.op, rec.module, message,
                                     suggestion, source=rec.source, **extra))  # fmt: skip

    def run(self) -> list[Finding]:
        for rec in self.report.nodes:
            if rec.kind not in ("op", "region") or rec.skipped:
                continue
            if rec.kind == "region":
                self.island(rec)
                continue
            if rec.error:
                self.dtype_error(rec)
                continue
            self.promotion(rec)
            self.casts(rec)
            if not self.no_rule(rec):  # says what mixed-dtypes would, and why
                self.mixed(rec)
            self.sixteen_only(rec)
            self.sensitive(rec)
        order = {r.name: i for i, r in enumerate(self.report.nodes)}
        rank = {k: i for i, k in enumerate(KINDS)}
        return sorted(self.findings, key=lambda f: (order.get(f.node, 0), rank[f.kind]))

    def _floating_inputs(self, rec: NodeRecord) -> list[str]:
        return [i["dtype"] for i in rec.inputs if i.get("dtype") in FLOATING]

    def promotion(self, rec: NodeRecord) -> None:
        if rec.promotion is None or _op_parts(rec.op) is None:
            return  # a custom op's dtypes are its own doing, not type promotion: mixed-dtypes
        to = rec.promotion["to"]
        widened = _bytes(rec, to)
        narrow = min((ITEMSIZE.get(d, 0) for d in rec.promotion["inputs"]), default=0)
        extra = None if widened is None else widened - widened // ITEMSIZE[to] * narrow
        ins = " + ".join(short_dtype(d) for d in rec.promotion["inputs"])
        self.add(
            "promotion", rec,
            f"{_where(rec)} widens {ins} -> {short_dtype(to)}: {fmt_bytes(widened)} out",
            "intended for an fp32 residual stream; otherwise cast the wider operand to the "
            "narrower dtype explicitly, so the result stays 16-bit",
            bytes=widened, details={"inputs": rec.promotion["inputs"], "to": to,
                                    "extra_bytes": extra},
        )  # fmt: skip

    def casts(self, rec: NodeRecord) -> None:
        if not rec.casts:
            return
        weights, activations, from_inputs, repeated = [], [], 0, []
        for cast in rec.casts:
            src = self.by_name.get(cast.node)
            size = _bytes(src, cast.to_dtype)
            if src is not None and src.kind in SOURCE_KINDS:
                weights.append(size)
            else:
                activations.append(size)
                from_inputs += src is not None and src.kind == "input"
                if self.cast_uses[(cast.node, cast.to_dtype)] > 1:
                    repeated.append(cast.node)
        to = sorted({short_dtype(c.to_dtype) for c in rec.casts})
        total = _sum(weights + activations)
        tips = []
        if weights:
            tips.append(f"parameters kept in {'/'.join(to)} remove the "
                        f"{_n(len(weights), 'weight cast')}")  # fmt: skip
        if from_inputs:
            tips.append(f"an input passed in {'/'.join(to)} removes {_n(from_inputs, 'cast')}")
        if repeated:
            tips.append(f"{', '.join(sorted(set(repeated)))} is cast again for each op that "
                        "uses it (autocast caches only weight casts)")  # fmt: skip
        self.add(
            "autocast-cast", rec,
            f"autocast casts {_n(len(rec.casts), 'tensor')} to {'/'.join(to)} before "
            f"{_where(rec)}: {_n(len(weights), 'weight')} {fmt_bytes(_sum(weights))}, "
            f"{_n(len(activations), 'activation')} {fmt_bytes(_sum(activations))}",
            "; ".join(tips) or "expected under autocast",
            bytes=total,
            details={"casts": [c.to_dict() for c in rec.casts], "weights": len(weights),
                     "weights_bytes": _sum(weights), "activations": len(activations),
                     "activations_bytes": _sum(activations), "from_inputs": from_inputs},
        )  # fmt: skip

    def mixed(self, rec: NodeRecord) -> None:
        floats = set(self._floating_inputs(rec))
        custom = _op_parts(rec.op) is None and "." in rec.op  # "getitem" is Python, not an op
        if rec.policy is not None or len(floats) < 2 or (rec.promotion is not None and not custom):
            return
        if rec.op in ("placeholder", "output") or rec.not_analysed:
            return
        got = ", ".join(short_dtype(d) for d in sorted(floats))
        self.add(
            "mixed-dtypes", rec,
            f"{_where(rec)} has no autocast policy and receives {got}; it returns "
            f"{', '.join(short_dtype(d) for d in rec.outputs if d) or 'nothing'}"
            + ("" if custom else " without promoting"),
            "cast its inputs to one dtype before the call, or register an autocast rule for it "
            "(torch.library.register_autocast)",
        )  # fmt: skip

    def no_rule(self, rec: NodeRecord) -> bool:
        """A custom op autocast leaves alone, inside autocast: whether it was found.

        The records are torch-free, so "no autocast kernel on the device" is read from them: the
        annotator gives a non-ATen op a policy exactly where the dispatcher has an autocast
        kernel for it on the device autocast is enabled on (``register_autocast``'s, a known
        library wrapper's, or an opaque one), or where autocast applies inside its decomposition.
        """
        if not rec.autocast or rec.policy is not None or rec.not_analysed:
            return False
        if not _custom_op(rec.op):
            return False
        floats = self._floating_inputs(rec)
        kinds = set(floats)
        if "float32" not in kinds or not kinds <= SIXTEEN_BIT | {"float32"}:
            return False  # 16-bit only: already low precision; fp64: autocast never casts it
        device = self.report.setting.get("device_type", "the device")
        outs = ", ".join(short_dtype(d) for d in rec.outputs if d) or "nothing"
        low = sorted(short_dtype(d) for d in kinds - {"float32"})
        ran = f"{' and '.join(low)} mixed with fp32 here" if low else "fp32 here"
        self.add(
            "no-autocast-rule", rec,
            f"{_where(rec)} has no autocast rule on {device}: inside autocast it runs in its "
            f"inputs' dtype ({ran}) and returns {outs}",
            f"register one with torch.library.register_autocast(op, {device!r}, cast_inputs=...) "
            "or cast its inputs before the call",
            details={"inputs": floats, "outputs": list(rec.outputs), "device_type": device},
        )  # fmt: skip
        return True

    def dtype_error(self, rec: NodeRecord) -> None:
        got = ", ".join(short_dtype(i.get("dtype")) for i in rec.inputs if i.get("dtype"))
        if rec.policy == "banned":
            # It raises because it runs under autocast: autocast is no fix for it (issue 25).
            fix = (
                "use binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss) on the logits, "
                "which autocast runs in fp32, or run this op with autocast disabled "
                "(torch.autocast(device_type, enabled=False)) on fp32 inputs"
            )
        else:
            fix = (
                "cast the inputs to one dtype before this op (x.to(w.dtype)), or run it inside "
                "torch.autocast, which casts them for it"
            )
        self.add("dtype-error", rec, f"{_where(rec)} raises on inputs {got}: {rec.error}", fix)

    def sixteen_only(self, rec: NodeRecord) -> None:
        parts = _op_parts(rec.op)
        if parts is None or parts[0] not in SIXTEEN_BIT_ONLY:
            return
        if "float32" in self._floating_inputs(rec) and not rec.casts:
            self.add(
                "fp32-into-16bit-only", rec,
                f"{_where(rec)} only runs in 16 bits and receives fp32",
                "cast q, k and v to bf16/fp16 first, or call scaled_dot_product_attention, which "
                "picks a kernel that accepts fp32",
            )  # fmt: skip

    def sensitive(self, rec: NodeRecord) -> None:
        out = rec.out_dtype
        if out not in SIXTEEN_BIT or not _fp32_listed(rec.op):
            return
        name = _op_parts(rec.op)[0]  # type: ignore[index]  # _fp32_listed: an ATen op
        size = _bytes(rec, out)
        if out == "float16" and name in FP16_RANGE_OPS:
            self.add(
                "fp16-range", rec,
                f"{_where(rec)} runs in fp16, whose largest value is 65504: exp(11.1), a sum "
                "of a few thousand large values or x**2 of 256 already overflows to inf",
                "run it in fp32 (x.float()), under CUDA autocast (which does), or use bf16",
                bytes=size,
            )  # fmt: skip
            return
        self.add(
            "sensitive-16bit", rec,
            f"{_where(rec)} runs in {short_dtype(out)}; CUDA autocast's fp32 list would run it "
            "in fp32",
            "keep the parameters in fp32 and use autocast, or call it on x.float() and cast the "
            "result back",
            bytes=size,
        )  # fmt: skip

    def island(self, rec: NodeRecord) -> None:
        inside = [r for r in self.report.nodes if r.region == rec.name]
        if not inside or inside[0].autocast:
            return  # an autocast-enabled region (another dtype): no island
        names = {r.name for r in inside}
        # Entering: values made outside, converted inside (the body's own .float()).
        entry = [
            r for r in inside
            if r.op.startswith(("aten._to_copy.", "aten.to.")) and r.inputs
            and r.inputs[0]["node"] not in names and r.inputs[0]["dtype"] != r.out_dtype
        ]  # fmt: skip
        produced = names | {rec.name}
        # Leaving: autocast casts, after the region, of what the region produced.
        exit_casts = [
            (r, c) for r in self.report.nodes if r.region != rec.name for c in r.casts
            if c.node in produced or (self.by_name.get(c.node) is not None
                                      and self.by_name[c.node].inputs
                                      and self.by_name[c.node].op == "getitem"
                                      and self.by_name[c.node].inputs[0]["node"] in produced)
        ]  # fmt: skip
        ops = sum(r.kind == "op" for r in inside)
        size = _sum(
            [_bytes(r, r.out_dtype) for r in entry]
            + [_bytes(self.by_name.get(c.node), c.to_dtype) for _r, c in exit_casts]
        )
        self.add(
            "fp32-island", rec,
            f"autocast is disabled in {rec.name} ({rec.module or 'top level'}): "
            f"{_n(ops, 'op')} run as written; {_n(len(entry), 'conversion')} on entry, "
            f"{_n(len(exit_casts), 'autocast cast')} of its results after it, {fmt_bytes(size)}",
            "keep the region as small as the precision it protects needs; its inputs are 16-bit "
            "where autocast made them so",
            bytes=size,
            details={"ops": ops, "entry": [r.name for r in entry],
                     "exit": [{"op": r.name, **c.to_dict()} for r, c in exit_casts]},
        )  # fmt: skip


def audit(report: Report) -> list[Finding]:
    """Every finding in ``report``, in execution order (errors first at a node).

    >>> from ampgraph.report.records import NodeRecord, Report
    >>> setting = {"name": "half", "device_type": "cuda", "autocast": False,
    ...            "amp_dtype": "bfloat16", "param_dtype": "bfloat16"}
    >>> ln = NodeRecord("layer_norm", "aten.layer_norm.default", "op", module="ln",
    ...                 inputs=[{"node": "x", "dtype": "bfloat16"}], outputs=["bfloat16"],
    ...                 shapes=[[2, 4]])
    >>> [(f.kind, f.severity, f.bytes) for f in audit(Report("m", setting, {}, {}, [ln], []))]
    [('sensitive-16bit', 'warning', 16)]
    """
    return _Auditor(report).run()


def summary(report: Report, findings: Sequence[Finding] | None = None) -> dict[str, Any]:
    """Totals per forward: promotions and their widened bytes, casts split into weights and
    activations, the casts pre-cast parameters or inputs remove, and a count per kind."""
    findings = audit(report) if findings is None else findings
    proms = [f for f in findings if f.kind == "promotion"]
    casts = [f for f in findings if f.kind == "autocast-cast"]

    def total(items: list[Finding], key: str) -> int | None:
        return _sum([f.details[key] for f in items])

    return {
        "findings": dict(Counter(f.kind for f in findings)),
        "severities": dict(Counter(f.severity for f in findings)),
        "promotions": {"count": len(proms), "bytes": _sum([f.bytes for f in proms])},
        "casts": {
            "count": sum(len(f.details["casts"]) for f in casts),
            "bytes": _sum([f.bytes for f in casts]),
            "weights": sum(f.details["weights"] for f in casts),
            "weights_bytes": total(casts, "weights_bytes"),
            "activations": sum(f.details["activations"] for f in casts),
            "activations_bytes": total(casts, "activations_bytes"),
            "from_inputs": sum(f.details["from_inputs"] for f in casts),
        },
    }


def at_or_above(findings: Sequence[Finding], severity: str) -> list[Finding]:
    """The findings whose severity is ``severity`` or worse (what ``--fail-on`` counts).

    >>> at_or_above([Finding("promotion", "note", "add", "aten.add.Tensor", None, "", "")],
    ...             "warning")
    []
    """
    floor = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= floor]


__all__ = [
    "FLOATING", "ITEMSIZE", "KINDS", "SEVERITIES", "Finding", "at_or_above", "audit", "fmt_bytes",
    "summary", "where",
]  # fmt: skip
