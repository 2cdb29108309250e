"""What changes between two analyses (``ampgraph diff``): node by node, matched by module and op.

Torch-free: it reads two :class:`~ampgraph.report.records.Report` records, fresh or saved with
``ampgraph table --format json``. Node names (``linear_3``) are positions in one graph, so they
cannot pair nodes of two graphs: one op inserted early renames every later op of its kind.
Instead, graph inputs (parameters, buffers, the model's inputs) are paired by what they are
(kind and target), and every other node by its module path and op: within each module the two
sequences of ops are aligned with :class:`difflib.SequenceMatcher`, so an inserted op is one
added node, and modules that run in another order pair up by name.

For each pair, what autocast cares about is compared: the policy, the input and output dtypes,
the casts (by input position, since the producers' names differ too), the promotion and the
error. Unpaired nodes are added or removed. :func:`folded` makes the changes of identical layers
one entry each, as the formats show them (:mod:`ampgraph.formats`: ``diff_text``,
``diff_markdown``, ``diff_json``).

>>> from ampgraph.report.records import NodeRecord, Report
>>> def rep(*ops):
...     nodes = [NodeRecord(f"n{i}", op, "op", module="fc", outputs=["float32"])
...              for i, op in enumerate(ops)]
...     return Report("m", {"name": "fp32"}, {}, {}, nodes, [])
>>> d = diff_reports(rep("aten.linear", "aten.relu"), rep("aten.linear", "aten.gelu", "aten.relu"))
>>> d.counts()["added"], d.counts()["changed"], d.equal
(1, 0, False)
>>> [(c.change, c.op) for c in d.changes]
[('added', 'aten.gelu')]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from difflib import SequenceMatcher
from typing import Any

from ampgraph.errors import AmpgraphError
from ampgraph.report.records import PLACEHOLDER_KINDS, NodeRecord, Report
from ampgraph.review.findings import summary
from ampgraph.review.fold import Fold, Names, fold
from ampgraph.settings import short_dtype

SCHEMA = "ampgraph.diff"
SCHEMA_VERSION = 1

#: The node fields a diff compares, in the order they are printed.
FIELDS = ("policy", "inputs", "casts", "outputs", "promotion", "error")


class DiffError(AmpgraphError, ValueError):
    """Two reports that cannot be compared (a forward pass and a training step, ...)."""


@dataclass(frozen=True)
class FieldChange:
    """One compared field of a node pair that differs, each side as the text a person reads."""

    field: str
    before: str
    after: str


@dataclass(frozen=True)
class NodeChange:
    """A node added (only in B), removed (only in A) or changed (paired, some field differs)."""

    change: str  # added | removed | changed
    section: str  # forward | backward
    module: str | None
    op: str
    a: str | None  # the node's name in A (None when added)
    b: str | None  # the node's name in B (None when removed)
    fields: tuple[FieldChange, ...] = ()
    #: Casts only in B / only in A, as ``producer from->to`` (for added/removed nodes: all).
    casts_added: tuple[str, ...] = ()
    casts_removed: tuple[str, ...] = ()
    #: The node's dtypes where it has no pair, e.g. ``in fp32, bf16; out fp32``.
    detail: str = ""

    @property
    def name(self) -> str:
        """The name in B, else in A: what the text and Markdown print."""
        return self.b or self.a or "?"


@dataclass
class ReportDiff:
    """The difference between report A and report B (:func:`diff_reports`)."""

    a: dict[str, Any]  # model, setting, versions, capture method, pass, node count of A
    b: dict[str, Any]
    changes: list[NodeChange] = field(default_factory=list)
    #: Context worth saying though it is no change of the flow, e.g. other policy tables.
    notes: list[str] = field(default_factory=list)
    #: Each side's node names per layer, by ``(side, section)``: what folding identical layers
    #: takes out (:mod:`ampgraph.review.fold`); not part of the diff's data.
    names: dict[tuple[str, str], Names] = field(default_factory=dict, repr=False, compare=False)

    @property
    def equal(self) -> bool:
        """Whether the dtype flows are the same (what ``ampgraph diff``'s exit status says)."""
        return not self.changes

    def counts(self) -> dict[str, int]:
        """How many nodes were added, removed or changed, and how many of each kind of change.

        >>> ReportDiff({}, {}).counts()["changed"]
        0
        """
        kinds = Counter(c.change for c in self.changes)
        fields = Counter(f.field for c in self.changes for f in c.fields)
        out = {k: kinds.get(k, 0) for k in ("added", "removed", "changed")}
        out.update({f: fields.get(f, 0) for f in FIELDS})
        out["casts_added"] = sum(len(c.casts_added) for c in self.changes)
        out["casts_removed"] = sum(len(c.casts_removed) for c in self.changes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "equal": self.equal,
            "a": self.a,
            "b": self.b,
            "counts": self.counts(),
            "notes": self.notes,
            "changes": [asdict(c) for c in self.changes],
        }


# -- pairing -----------------------------------------------------------------------------------


def _dtypes(values: Iterable[str | None]) -> str:
    return ", ".join(short_dtype(v) for v in values) or "-"


def _cast_keys(rec: NodeRecord) -> Counter[tuple[Any, str, str]]:
    """The node's casts keyed by input position (names differ between graphs), as a multiset."""
    out: Counter[tuple[Any, str, str]] = Counter()
    producers = [i.get("node") for i in rec.inputs]
    for c in rec.casts:
        where: Any = producers.index(c.node) if c.node in producers else c.node
        out[(where, c.from_dtype, c.to_dtype)] += 1
    return out


def _cast_text(rec: NodeRecord, key: tuple[Any, str, str]) -> str:
    where, src, dst = key
    producer = rec.inputs[where].get("node") if isinstance(where, int) else where
    return f"{producer} {short_dtype(src)}→{short_dtype(dst)}"


def _promotion_text(promotion: dict[str, Any] | None) -> str:
    if not promotion:
        return "none"
    return f"{' + '.join(short_dtype(d) for d in promotion.get('inputs', []))} → " + short_dtype(
        promotion.get("to")
    )


def _field_texts(rec: NodeRecord) -> dict[str, str]:
    """Each compared field of a node as text: equal texts are equal fields."""
    return {
        "policy": rec.policy or "none",
        "inputs": _dtypes(i.get("dtype") for i in rec.inputs),
        "outputs": _dtypes(rec.outputs),
        "promotion": _promotion_text(rec.promotion),
        "error": rec.error or "none",
    }


def _detail(rec: NodeRecord) -> str:
    parts = []
    if rec.inputs:
        parts.append(f"in {_dtypes(i.get('dtype') for i in rec.inputs)}")
    if rec.policy:
        parts.append(f"policy {rec.policy}")
    if rec.casts:
        parts.append("casts " + ", ".join(_cast_text(rec, k) for k in _cast_keys(rec).elements()))
    parts.append(f"error {rec.error}" if rec.error else f"out {_dtypes(rec.outputs)}")
    return "; ".join(parts)


def _compare(a: NodeRecord, b: NodeRecord, section: str) -> NodeChange | None:
    ta, tb = _field_texts(a), _field_texts(b)
    ca, cb = _cast_keys(a), _cast_keys(b)
    added = tuple(_cast_text(b, k) for k in (cb - ca).elements())
    removed = tuple(_cast_text(a, k) for k in (ca - cb).elements())
    fields = []
    for name in FIELDS:
        if name == "casts":
            if added or removed:
                fields.append(FieldChange("casts", _casts_of(a), _casts_of(b)))
        elif ta[name] != tb[name]:
            fields.append(FieldChange(name, ta[name], tb[name]))
    if not fields:
        return None
    return NodeChange(
        "changed", section, b.module, b.op, a.name, b.name, tuple(fields), added, removed
    )


def _casts_of(rec: NodeRecord) -> str:
    return ", ".join(_cast_text(rec, k) for k in _cast_keys(rec).elements()) or "none"


def _unpaired(rec: NodeRecord, change: str, section: str) -> NodeChange:
    casts = tuple(_cast_text(rec, k) for k in _cast_keys(rec).elements())
    return NodeChange(
        change,
        section,
        rec.module,
        rec.op,
        rec.name if change == "removed" else None,
        rec.name if change == "added" else None,
        casts_added=casts if change == "added" else (),
        casts_removed=casts if change == "removed" else (),
        detail=_detail(rec),
    )


def _placeholder_key(rec: NodeRecord) -> tuple[str, str]:
    return (rec.kind, rec.target or rec.name)


def _by_module(nodes: Sequence[NodeRecord]) -> dict[str | None, list[NodeRecord]]:
    """The nodes that compute, grouped by module path, each group in execution order."""
    groups: dict[str | None, list[NodeRecord]] = {}
    for rec in nodes:
        if rec.kind not in PLACEHOLDER_KINDS:
            groups.setdefault(rec.module, []).append(rec)
    return groups


def diff_nodes(
    a: Sequence[NodeRecord], b: Sequence[NodeRecord], section: str = "forward"
) -> list[NodeChange]:
    """The changes from nodes ``a`` to nodes ``b``, in B's execution order (A's removed modules
    after): graph inputs paired by kind and target, the rest by module path and op.

    >>> from ampgraph.report.records import NodeRecord as N
    >>> a = [N("x", "relu", "op", module="m.0"), N("y", "relu", "op", module="m.1")]
    >>> b = [N("y", "relu", "op", module="m.1"), N("x", "relu", "op", module="m.0")]
    >>> diff_nodes(a, b)  # the modules ran in another order: nothing changed
    []
    """
    changes: list[NodeChange] = []
    # Graph inputs: paired by what they are; their order is the modules' registration order.
    pa = {_placeholder_key(r): r for r in a if r.kind in PLACEHOLDER_KINDS}
    pb = {_placeholder_key(r): r for r in b if r.kind in PLACEHOLDER_KINDS}
    for key, rb in pb.items():
        ra = pa.get(key)
        change = _unpaired(rb, "added", section) if ra is None else _compare(ra, rb, section)
        if change is not None:
            changes.append(change)
    changes += [_unpaired(ra, "removed", section) for key, ra in pa.items() if key not in pb]
    # Everything else: aligned op by op within each module.
    ga, gb = _by_module(a), _by_module(b)
    for module in [*gb, *(m for m in ga if m not in gb)]:
        sa, sb = ga.get(module, []), gb.get(module, [])
        matcher = SequenceMatcher(None, [r.op for r in sa], [r.op for r in sb], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for ra, rb in zip(sa[i1:i2], sb[j1:j2], strict=True):
                    change = _compare(ra, rb, section)
                    if change is not None:
                        changes.append(change)
                continue
            changes += [_unpaired(r, "removed", section) for r in sa[i1:i2]]
            changes += [_unpaired(r, "added", section) for r in sb[j1:j2]]
    return changes


def _opt_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _malformed(rec: NodeRecord) -> str | None:
    """What makes a node unreadable for the diff (a hand-edited or damaged file), or None."""
    checks = {
        "op": isinstance(rec.op, str),
        "kind": isinstance(rec.kind, str),
        "module": _opt_str(rec.module),
        "target": _opt_str(rec.target),
        "policy": _opt_str(rec.policy),
        "error": _opt_str(rec.error),
        "inputs": isinstance(rec.inputs, list)
        and all(isinstance(i, dict) and _opt_str(i.get("dtype")) for i in rec.inputs),
        "outputs": isinstance(rec.outputs, list) and all(_opt_str(o) for o in rec.outputs),
        "casts": isinstance(rec.casts, list)
        and all(
            isinstance(c.node, str)
            and isinstance(c.from_dtype, str)
            and isinstance(c.to_dtype, str)
            for c in rec.casts
        ),
        "promotion": rec.promotion is None
        or (
            isinstance(rec.promotion, dict)
            and isinstance(rec.promotion.get("inputs", []), list)
            and all(_opt_str(d) for d in rec.promotion.get("inputs", []))
            and _opt_str(rec.promotion.get("to"))
        ),
    }
    bad = [name for name, ok in checks.items() if not ok]
    return f"node {rec.name!r} has a malformed {', '.join(bad)}" if bad else None


def _side(report: Report) -> dict[str, Any]:
    return {
        "model": report.model,
        "setting": report.setting,
        "versions": report.versions,
        "method": (report.capture or {}).get("method"),
        "pass": report.pass_,
        "nodes": len(report.nodes),
        # Autocast's casts and the promotions per forward, with their bytes: the summary's.
        "totals": {k: v for k, v in summary(report).items() if k in ("casts", "promotions")},
    }


def diff_reports(a: Report, b: Report) -> ReportDiff:
    """What changes from report ``a`` to report ``b`` (see the module docstring).

    Raises :class:`DiffError` for reports of different passes (a forward pass and a training
    step) and for a node whose fields have the wrong types (a damaged or hand-edited file);
    reports of schema versions 1 and 2 compare, both being forward passes.

    >>> from ampgraph.report.records import NodeRecord, Report
    >>> r = Report("m", {"name": "fp32"}, {}, {}, [NodeRecord("n", "aten.relu", "op")], [])
    >>> diff_reports(r, r).equal
    True
    """
    for label, report in (("A", a), ("B", b)):
        nodes = [*report.nodes, *(report.backward.nodes if report.backward else [])]
        problem = next((p for p in map(_malformed, nodes) if p), None)
        if problem:
            raise DiffError(f"{label} ({report.model}) is damaged: {problem}")
    if a.pass_ != b.pass_:
        raise DiffError(
            f"A is a {a.pass_} pass and B a {b.pass_} pass: analyse both with the same --pass"
        )
    result = ReportDiff(_side(a), _side(b), diff_nodes(a.nodes, b.nodes))
    result.names = {("a", "forward"): Names(a.nodes), ("b", "forward"): Names(b.nodes)}
    if a.backward is not None and b.backward is not None:
        result.changes += diff_nodes(a.backward.nodes, b.backward.nodes, "backward")
        result.names[("a", "backward")] = Names(a.backward.nodes)
        result.names[("b", "backward")] = Names(b.backward.nodes)
    ta, tb = a.versions.get("policy_tables"), b.versions.get("policy_tables")
    if ta and tb and ta != tb:
        result.a["tables"], result.b["tables"] = ta, tb
        older = min(ta, tb, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
        result.notes.append(
            f"the policy tables differ (torch {ta} → {tb}): 'ampgraph policy --since {older}' "
            "lists what changed in autocast's lists"
        )
    for label, report in (("A", a), ("B", b)):
        if report.capture.get("stand_in"):  # xpu or mps on a torch without them
            result.notes.append(f"{label} is {report.capture['stand_in']}")
    if a.versions.get("torch") != b.versions.get("torch") and a.versions and b.versions:
        result.notes.append(f"torch {a.versions.get('torch')} → {b.versions.get('torch')}")
    return result


def folded(d: ReportDiff) -> list[Fold[NodeChange]]:
    """The changes, those of identical layers as one entry each (:func:`ampgraph.review.fold.fold`):
    two layers' changes are the same when all but the layer is (kind, op, module below the layer,
    each field's text), each side's node names taken out with that side's :class:`Names`."""
    empty = Names([])

    def key(c: NodeChange, layer: str) -> Hashable:
        na, nb = (d.names.get((side, c.section), empty) for side in ("a", "b"))
        detail = (nb if c.change == "added" else na).key(c.detail, layer)
        fields = tuple((f.field, na.key(f.before, layer), nb.key(f.after, layer)) for f in c.fields)
        return (
            c.change, c.section, c.op, na.key(c.module, layer), na.node(c.a, layer),
            nb.node(c.b, layer), fields, nb.key(c.casts_added, layer),
            na.key(c.casts_removed, layer), detail,
        )  # fmt: skip

    return fold(d.changes, lambda c: c.module, key)


__all__ = [
    "DiffError",
    "FieldChange",
    "NodeChange",
    "ReportDiff",
    "diff_nodes",
    "diff_reports",
    "folded",
]
