"""The analysis result as plain records: what every stage after the annotator reads.

This module is torch-free. A :class:`Report` is what ``ampgraph table --format json`` prints and
what the renderer draws; it round-trips through JSON (:meth:`Report.to_json`,
:meth:`Report.from_json`), so diagrams and later commands (diff, audit) can work from a saved file.

JSON schema ``ampgraph.report`` version 2 (fields are added, never renamed, within a version):

* ``schema``, ``version``: ``"ampgraph.report"``, ``2`` (``1`` is still read).
* ``model``: the spec analysed; ``setting``: ``{name, device_type, autocast, amp_dtype,
  param_dtype}``; ``versions``: ``{ampgraph, torch, transformers, policy_tables}``.
* ``capture``: ``{method, trace_time_dtype_nodes, dtype_branches}``: how the graph was captured
  (the tracer, then how ``torch.export`` ran: ``export``, ``export-meta-replay`` on a torch that
  cannot trace fake CUDA tensors, ``export-retyped`` for a model that raises in its setting;
  joined by ``+`` for a tracer other than export, ``hf-fx+export``), nodes whose dtypes were fixed at trace time (the CPU-only
  replay path), and module paths where the tracer decided a Python branch on a dtype once, in
  fp32 (``hf-fx``; empty for ``export``, which traces every setting); ``check_unavailable``, only
  where a check was asked for and this torch cannot run it (a CPU-only build and ``cuda``);
  ``data_dependent`` and ``unbacked_values``, only for methods ``export-data-path`` and
  ``draft-export`` (a forward that branches on data values, traced along the path seeded random
  values take): each branch taken on data, whose other side is not analysed, and the value each
  data-dependent size (``u0``, ``u1``, ...) took on that path;
  ``graph_of``, where the graph was captured in another setting and proven to be the one this
  setting's capture would give (:mod:`ampgraph.capture.reads`); ``not_shared``, where a graph of the same
  parameter dtype was not, and why.
* ``nodes``: one record per graph node in execution order (:class:`NodeRecord`), with ``policy``
  (``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype``, ``fp32_append_dtype``, ``promote``,
  ``banned`` or null), ``inputs`` (producer node and dtype), ``casts`` (``{node, from, to}`` for each
  tensor autocast casts), ``outputs`` (dtypes), ``promotion`` (``{inputs, to}`` where ordinary type
  promotion widened mixed inputs), ``reason``, ``error``, ``skipped`` and ``check``; ``shapes``
  (each output's shape, or null for a non-tensor output), absent from reports written before
  ampgraph kept them.
* ``modules``: one record per leaf-module call in execution order (:class:`ModuleCall`): the hook
  view of the seed notebook, ``in`` and ``out`` dtypes.
* ``check``: ``{oracle, nodes, compared, disagreements}`` once the dispatcher check ran, else null.

Version 2 adds the training step (``ampgraph table --pass train``); a version 1 report reads as a
forward-only one:

* ``pass``: ``forward``, ``backward`` or ``train``, what was asked for.
* ``backward``: null for a forward pass, else (:class:`Backward`) ``loss`` (which output, its
  dtype, the expression), ``autocast`` (whether backward ran inside the autocast context),
  ``nodes`` (the loss and backward ops, as node records with ``forward``: the forward node each
  belongs to), ``gradients`` (every parameter's gradient dtype), ``saved`` (every tensor autograd
  saves for backward: dtype, shape, bytes, storage, kind) and ``check``.
"""

from __future__ import annotations

import copy
import json
import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

SCHEMA = "ampgraph.report"
SCHEMA_VERSION = 2
#: Versions this ampgraph reads: a version 1 report is a forward pass without ``backward``.
READABLE_VERSIONS = (1, 2)
PASSES = ("forward", "backward", "train")

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
_Check = tuple[type, ...] | Callable[[Any], bool]

_NONE = type(None)
_STR: tuple[type, ...] = (str,)
_OPT_STR: tuple[type, ...] = (str, _NONE)
_BOOL: tuple[type, ...] = (bool,)
_OPT_DICT: tuple[type, ...] = (dict, _NONE)
#: What a list of dtypes may hold: names, or None (the set's test needs hashable items, so the
#: items' types are tested first).
_DTYPE_ITEM_TYPES = frozenset({str, _NONE})
_DTYPES_OR_NONE = DTYPE_NAMES | {None}


def _is_dtype(value: Any) -> bool:
    return type(value) is str and value in DTYPE_NAMES


def _is_opt_dtype(value: Any) -> bool:
    return value is None or (type(value) is str and value in DTYPE_NAMES)


def _is_size(value: Any) -> bool:
    """A dimension or a byte count: an int, not below 0."""
    return type(value) is int and value >= 0


def _is_strs(value: Any) -> bool:
    return type(value) is list and {*map(type, value)} <= {str}


def _is_dtypes(value: Any) -> bool:
    """Output dtypes: each a dtype name, or None for a value that is not a tensor."""
    return (
        type(value) is list
        and {*map(type, value)} <= _DTYPE_ITEM_TYPES
        and _DTYPES_OR_NONE.issuperset(value)
    )


def _is_shape(value: Any) -> bool:
    return type(value) is list and {*map(type, value)} <= {int} and min(value, default=0) >= 0


def _is_shapes(value: Any) -> bool:
    """Each output's shape, or None (not a tensor, or a symbolic size); None for old reports."""
    return value is None or (type(value) is list and all(v is None or _is_shape(v) for v in value))


def _is_input(value: Any) -> bool:
    """``{"node", "dtype"}`` (and ``from``, where a view's producer is another node)."""
    return (
        type(value) is dict
        and type(value.get("node")) is str
        and _is_opt_dtype(value.get("dtype"))
        and type(value.get("from")) in _OPT_STR
    )


def _is_inputs(value: Any) -> bool:
    return type(value) is list and all(map(_is_input, value))


def _is_cast(cast: Any) -> bool:
    return (
        type(cast) is Cast
        and type(cast.node) is str
        and _is_dtype(cast.from_dtype)
        and _is_dtype(cast.to_dtype)
    )


def _is_casts(value: Any) -> bool:
    return type(value) is list and all(map(_is_cast, value))


def _is_promotion(value: Any) -> bool:
    """``{"inputs", "to"}``: the input dtypes ordinary type promotion widened, and to what."""
    return value is None or (
        type(value) is dict
        and _is_dtypes(value.get("inputs", []))
        and _is_opt_dtype(value.get("to"))
    )


def _is_source(value: Any) -> bool:
    """``{"file", "line"}``: what ``ampgraph audit`` prints as ``file:line``."""
    return value is None or (
        type(value) is dict and type(value.get("file")) is str and type(value.get("line")) is int
    )


def _label(value: Any) -> str:
    """A value as an error message names it: quoted, on one line, not too long."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class _Checks:
    """Each field's check (:data:`_Check`), by field name, and the quick test of them all.

    The quick test runs for every record read (a cached report is read on every warm run), so
    it compares the fields' types with their tuples in C (``map``) and calls functions only for
    the fields with contents; the fields that failed are looked for only when it fails.
    """

    def __init__(self, checks: dict[str, _Check]) -> None:
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


def _refuse_malformed(record: Any, checks: _Checks, what: str, name: str | None = None) -> None:
    """``ValueError`` naming every field of ``record`` that fails its check: ``{what}'x' has a
    malformed ...``, ``'x'`` being the value of the field ``name`` that names the record (quoted
    only on failure, for the same reason the checks are quick)."""
    values = vars(record)
    bad = checks.malformed(values)
    if bad:
        label = _label(values[name]) if name is not None else ""
        raise ValueError(f"{what}{label} has a malformed {', '.join(bad)}")


_ATOMS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """A copy of ``value`` as :func:`dataclasses.asdict` makes it, without its deep copy of
    every string: a train report's tens of thousands of strings made ``to_dict`` cost a fifth
    of a second, paid by every worker sending a report and again by the cache writing it."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if kind is tuple:
        return tuple(_plain(v) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return copy.deepcopy(value)


def _as_dict(record: Any, **given: Any) -> dict[str, Any]:
    """``asdict(record)`` for a record whose fields hold plain data (see :func:`_plain`), with
    the fields in ``given`` taken as given, in their places."""
    return {
        f.name: given[f.name] if f.name in given else _plain(getattr(record, f.name))
        for f in fields(record)
    }


#: Node kinds (:attr:`NodeRecord.kind`) whose value is the model's own state, not a computation:
#: hooks and diagrams look past them to the activations.
SOURCE_KINDS: frozenset[str] = frozenset({"parameter", "buffer", "constant"})
#: Node kinds that are graph inputs (the placeholders): the model's state and the user's inputs.
PLACEHOLDER_KINDS: frozenset[str] = SOURCE_KINDS | {"input"}


@dataclass
class Cast:
    """One tensor autocast casts before an op runs: which value, from which dtype to which."""

    node: str
    from_dtype: str
    to_dtype: str

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "from": self.from_dtype, "to": self.to_dtype}


@dataclass
class NodeRecord:
    """What happens at one graph node."""

    name: str
    op: str
    kind: str  # input | parameter | buffer | constant | op | region | output
    target: str | None = None
    module: str | None = None
    module_call: str | None = None
    stack: list[str] = field(default_factory=list)
    region: str | None = None
    autocast: bool = False
    inputs: list[dict[str, Any]] = field(default_factory=list)
    policy: str | None = None
    casts: list[Cast] = field(default_factory=list)
    outputs: list[str | None] = field(default_factory=list)
    promotion: dict[str, Any] | None = None
    reason: str = ""
    error: str | None = None
    skipped: str | None = None
    trace_time_dtype: bool = False
    check: dict[str, Any] | None = None
    #: Why ampgraph could not analyse this node here (a kernel that needs a GPU driver even on
    #: fake tensors), or None. Such a node is neither a prediction nor a disagreement.
    not_analysed: str | None = None
    #: For a backward node, the forward node it is the backward of (None in the forward pass).
    forward: str | None = None
    #: Each output's shape (None for a non-tensor output), where the annotator recorded them;
    #: None in reports written before shapes were kept. ``ampgraph audit`` reads bytes from them.
    shapes: list[list[int] | None] | None = None
    #: ``{"file", "line"}`` in the model's code where the node was made, in analyses that asked
    #: for source lines (``analyze(..., sources=True)``, :mod:`ampgraph.review.sources`); else None.
    source: dict[str, Any] | None = None

    @property
    def out_dtype(self) -> str | None:
        """The first output's dtype (what a single-output op returns)."""
        return self.outputs[0] if self.outputs else None

    @property
    def is_source(self) -> bool:
        """Whether the node is the model's own state (a parameter, buffer or constant)."""
        return self.kind in SOURCE_KINDS

    @property
    def is_placeholder(self) -> bool:
        """Whether the node is a graph input: the model's state or one of the user's inputs."""
        return self.kind in PLACEHOLDER_KINDS

    def to_dict(self) -> dict[str, Any]:
        data = _as_dict(self, casts=[c.to_dict() for c in self.casts])
        for key in ("not_analysed", "forward", "shapes", "source"):
            if data[key] is None:
                del data[key]  # reports of fully analysed forward graphs read as before
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeRecord:
        """A node record from its JSON form; ``ValueError`` (one line) for a field of the wrong
        type or a dtype torch does not have, so no later stage meets a damaged record."""
        if not isinstance(data, dict):
            raise ValueError(f"a node is a {type(data).__name__}, not an object")  # noqa: TRY004
        data = dict(data)
        casts = data.get("casts", [])
        if not isinstance(casts, list):
            raise ValueError(f"node {_label(data.get('name'))} has a malformed casts")  # noqa: TRY004
        data["casts"] = [Cast(c["node"], c["from"], c["to"]) for c in casts]
        rec = cls(**data)
        rec.refuse_malformed()
        return rec

    def refuse_malformed(self) -> None:
        """``ValueError`` naming the fields that have the wrong type or hold an unknown dtype.

        >>> NodeRecord("relu", "aten.relu", "op", outputs=["nan"]).refuse_malformed()
        Traceback (most recent call last):
        ...
        ValueError: node 'relu' has a malformed outputs
        """
        _refuse_malformed(self, _NODE_CHECKS, "node ", "name")


@dataclass
class ModuleCall:
    """One call of a leaf module, as a forward hook on it would see it."""

    path: str
    type: str
    bases: list[str]
    call: str
    in_dtype: str | None
    out_dtype: str | None
    nodes: list[str]
    #: False for a call that returns no tensor at all (``nn.Identity()(3)``): its ``out`` is
    #: None because the hook prints None, not because the forward stopped before it.
    returns_tensor: bool = True

    def hook_line(self) -> str:
        """The seed notebook's hook line: ``[path] in=torch.float32 -> out=torch.bfloat16``."""

        def torch_name(d: str | None) -> str:
            return f"torch.{d}" if d else "None"

        return f"[{self.path}] in={torch_name(self.in_dtype)} -> out={torch_name(self.out_dtype)}"

    def to_dict(self) -> dict[str, Any]:
        data = _as_dict(self)
        data["in"] = data.pop("in_dtype")
        data["out"] = data.pop("out_dtype")
        if data["returns_tensor"]:
            del data["returns_tensor"]  # the usual case; reports stay as they were
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModuleCall:
        """A module call from its JSON form; ``ValueError`` (one line) for wrong types."""
        if not isinstance(data, dict):
            raise ValueError(f"a module call is a {type(data).__name__}, not an object")  # noqa: TRY004
        data = dict(data)
        data["in_dtype"] = data.pop("in")
        data["out_dtype"] = data.pop("out")
        call = cls(**data)
        _refuse_malformed(call, _MODULE_CHECKS, "module call ", "path")
        return call


@dataclass
class SavedTensor:
    """One tensor autograd saves for backward, and the forward node that saved it.

    ``storage`` numbers the memory the tensor lives in: tensors with the same number share it
    (a view, or the same tensor saved by several ops), so memory is summed once per storage.
    ``kind`` says whose memory it is: ``activation`` (made by the forward, alive until backward
    because it is saved), ``parameter``, ``buffer`` or ``input`` (alive anyway).
    """

    node: str
    module: str | None
    dtype: str
    shape: list[int]
    bytes: int
    storage: int
    storage_bytes: int
    kind: str
    producer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SavedTensor:
        """A saved tensor from its JSON form; ``ValueError`` (one line) for wrong types."""
        if not isinstance(data, dict):
            raise ValueError(f"a saved tensor is a {type(data).__name__}, not an object")  # noqa: TRY004
        saved = cls(**data)
        _refuse_malformed(saved, _SAVED_CHECKS, "saved tensor of ", "node")
        return saved


@dataclass
class Gradient:
    """A parameter's gradient: its dtype, or None where the loss does not depend on it."""

    parameter: str
    param_dtype: str
    dtype: str | None
    shape: list[int]
    node: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gradient:
        """A gradient from its JSON form; ``ValueError`` (one line) for wrong types."""
        if not isinstance(data, dict):
            raise ValueError(f"a gradient is a {type(data).__name__}, not an object")  # noqa: TRY004
        grad = cls(**data)
        _refuse_malformed(grad, _GRADIENT_CHECKS, "gradient of ", "parameter")
        return grad


@dataclass
class Backward:
    """The loss and backward pass of a training step (see the module docstring)."""

    loss: dict[str, Any]
    autocast: bool
    nodes: list[NodeRecord]
    gradients: list[Gradient]
    saved: list[SavedTensor]
    method: str = ""
    check: dict[str, Any] | None = None
    #: Why there is no backward (the forward raised, so a real run stops there), or None.
    skipped: str | None = None

    def node(self, name: str) -> NodeRecord:
        for rec in self.nodes:
            if rec.name == name:
                return rec
        raise KeyError(name)

    @property
    def casts(self) -> list[NodeRecord]:
        """The backward's dtype-changing ``_to_copy`` nodes (autocast's, where backward runs
        inside the context, are the ``casts`` of the ops they feed instead)."""
        return [
            r for r in self.nodes
            if r.kind == "op" and r.op == "aten._to_copy.default"
            and r.inputs and r.inputs[0]["dtype"] != r.out_dtype
        ]  # fmt: skip

    @property
    def disagreements(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.check is not None and not n.check.get("agree", True)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "autocast": self.autocast,
            "method": self.method,
            "skipped": self.skipped,
            "check": self.check,
            "gradients": [g.to_dict() for g in self.gradients],
            "saved": [t.to_dict() for t in self.saved],
            "nodes": [n.to_dict() for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Backward:
        """The backward pass from its JSON form; ``ValueError`` (one line) for wrong types."""
        if not isinstance(data, dict):
            raise ValueError(f"the backward is a {type(data).__name__}, not an object")  # noqa: TRY004
        backward = cls(
            loss=_typed(data, "loss", dict),
            autocast=bool(data["autocast"]),
            method=data.get("method", ""),
            check=data.get("check"),
            skipped=data.get("skipped"),
            gradients=[Gradient.from_dict(g) for g in _typed(data, "gradients", list)],
            saved=[SavedTensor.from_dict(t) for t in _typed(data, "saved", list)],
            nodes=[NodeRecord.from_dict(n) for n in _typed(data, "nodes", list)],
        )
        _refuse_malformed(backward, _BACKWARD_CHECKS, "the backward")
        return backward


_SETTING_FIELDS = ("name", "device_type", "autocast", "amp_dtype", "param_dtype")


#: Each record's fields and the check a value read from a file must pass: what the renderers,
#: the audit, the diff and the text formats assume of them (a string where they join or print,
#: a known dtype where they name one, sizes where they multiply).
_NODE_CHECKS = _Checks({
    "name": _STR, "op": _STR, "kind": _STR, "target": _OPT_STR, "module": _OPT_STR,
    "module_call": _OPT_STR, "stack": _is_strs, "region": _OPT_STR, "autocast": _BOOL,
    "inputs": _is_inputs, "policy": _OPT_STR, "casts": _is_casts, "outputs": _is_dtypes,
    "promotion": _is_promotion, "reason": _STR, "error": _OPT_STR, "skipped": _OPT_STR,
    "trace_time_dtype": _BOOL, "check": _OPT_DICT, "not_analysed": _OPT_STR,
    "forward": _OPT_STR, "shapes": _is_shapes, "source": _is_source,
})  # fmt: skip
_MODULE_CHECKS = _Checks({
    "path": _STR, "type": _STR, "bases": _is_strs, "call": _STR, "in_dtype": _is_opt_dtype,
    "out_dtype": _is_opt_dtype, "nodes": _is_strs, "returns_tensor": _BOOL,
})  # fmt: skip
_SAVED_CHECKS = _Checks({
    "node": _STR, "module": _OPT_STR, "dtype": _is_dtype, "shape": _is_shape, "bytes": _is_size,
    "storage": _is_size, "storage_bytes": _is_size, "kind": _STR, "producer": _OPT_STR,
})  # fmt: skip
_GRADIENT_CHECKS = _Checks({
    "parameter": _STR, "param_dtype": _is_dtype, "dtype": _is_opt_dtype, "shape": _is_shape,
    "node": _OPT_STR,
})  # fmt: skip
_BACKWARD_CHECKS = _Checks({
    "loss": lambda loss: _is_opt_dtype(loss.get("dtype"))
    and all(type(loss.get(k)) in _OPT_STR for k in ("output", "expression")),
    "method": _STR, "check": _OPT_DICT, "skipped": _OPT_STR,
})  # fmt: skip
#: The capture fields that are joined or printed, where a report has them.
_CAPTURE_CHECKS: dict[str, _Check] = {
    "method": _OPT_STR, "trace_time_dtype_nodes": _is_strs, "dtype_branches": _is_strs,
    "data_dependent": _is_strs, "check_unavailable": _OPT_STR, "graph_of": _OPT_STR,
    "unbacked_values": (dict,),
}  # fmt: skip
_SETTING_CHECKS = _Checks({
    "name": _STR, "device_type": _STR, "autocast": _BOOL, "amp_dtype": _is_dtype,
    "param_dtype": _is_dtype,
})  # fmt: skip


def check_setting(setting: Any) -> dict[str, Any]:
    """``setting`` when it is a setting as reports hold it, else ``ValueError`` in one line.

    >>> check_setting({"name": "fp32", "device_type": "cuda", "autocast": "no",
    ...                "amp_dtype": "bf16", "param_dtype": "float32"})
    Traceback (most recent call last):
    ...
    ValueError: its setting has a malformed autocast, amp_dtype
    """
    missing = [k for k in _SETTING_FIELDS if not isinstance(setting, dict) or k not in setting]
    if missing:
        raise ValueError(f"its setting lacks {', '.join(missing)}")
    bad = _SETTING_CHECKS.malformed(setting)
    if bad:
        raise ValueError(f"its setting has a malformed {', '.join(bad)}")
    return dict(setting)


def _typed(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key!r} should be a {kind.__name__}, not {type(value).__name__}")
    return value


@dataclass
class Report:
    """The whole analysis of one model in one setting."""

    model: str
    setting: dict[str, Any]
    versions: dict[str, str]
    capture: dict[str, Any]
    nodes: list[NodeRecord]
    modules: list[ModuleCall]
    check: dict[str, Any] | None = None
    #: ``forward``, ``backward`` or ``train``: which pass was asked for.
    pass_: str = "forward"
    #: The loss and backward pass, for ``backward`` and ``train``.
    backward: Backward | None = None

    def node(self, name: str) -> NodeRecord:
        for rec in self.nodes:
            if rec.name == name:
                return rec
        raise KeyError(name)

    @property
    def errors(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.error]

    @property
    def disagreements(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.check is not None and not n.check.get("agree", True)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "model": self.model,
            "setting": self.setting,
            "versions": self.versions,
            "capture": self.capture,
            "check": self.check,
            "pass": self.pass_,
            "modules": [m.to_dict() for m in self.modules],
            "nodes": [n.to_dict() for n in self.nodes],
            "backward": self.backward.to_dict() if self.backward is not None else None,
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """A report from its JSON form; ``ValueError`` with one line saying what is wrong.

        >>> Report.from_dict([])
        Traceback (most recent call last):
        ...
        ValueError: not an ampgraph.report: a JSON object is expected, not list
        """
        if not isinstance(data, dict):
            raise ValueError(  # noqa: TRY004 - Report.from_dict raises ValueError for bad data
                f"not an {SCHEMA}: a JSON object is expected, not {type(data).__name__}"
            )
        if data.get("schema") != SCHEMA or data.get("version") not in READABLE_VERSIONS:
            raise ValueError(
                f"not an {SCHEMA} v{SCHEMA_VERSION} report "
                f"(found {data.get('schema')!r} v{data.get('version')!r}): write it again with "
                "this ampgraph's 'table --format json'"
            )
        try:
            setting = check_setting(data.get("setting"))
        except ValueError as exc:
            raise ValueError(f"damaged {SCHEMA}: {exc}") from None
        try:
            report = cls(
                model=_typed(data, "model", str),
                setting=setting,
                versions=_typed(data, "versions", dict),
                capture=_typed(data, "capture", dict),
                nodes=[NodeRecord.from_dict(n) for n in _typed(data, "nodes", list)],
                modules=[ModuleCall.from_dict(m) for m in _typed(data, "modules", list)],
                check=data.get("check"),
                pass_=data.get("pass", "forward"),
                backward=(Backward.from_dict(data["backward"]) if data.get("backward") else None),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"damaged {SCHEMA}: {type(exc).__name__} {exc}") from None
        except ValueError as exc:  # a record's own check: its message names the field
            raise ValueError(f"damaged {SCHEMA}: {exc}") from None
        if report.pass_ not in PASSES:
            raise ValueError(
                f"damaged {SCHEMA}: pass {_label(report.pass_)} is not one of {PASSES}"
            )
        present = {k: ok for k, ok in _CAPTURE_CHECKS.items() if k in report.capture}
        bad = _Checks(present).malformed(report.capture)
        if bad:
            raise ValueError(f"damaged {SCHEMA}: its capture has a malformed {', '.join(bad)}")
        if type(report.check) not in _OPT_DICT:
            raise ValueError(f"damaged {SCHEMA}: its check is a {type(report.check).__name__}")
        return report

    @classmethod
    def from_json(cls, text: str) -> Report:
        """A report from its JSON text (:func:`load_json`: no NaN); ``ValueError`` in one line."""
        return cls.from_dict(load_json(text))

    def __repr__(self) -> str:
        """One line: the model, setting and counts (the records are in ``nodes``, ``modules``).

        >>> Report("m", {"name": "fp32"}, {}, {}, [], [])
        <Report m fp32: 0 graph nodes, 0 module calls, 0 casts, 0 promotions, not checked>
        """
        from ampgraph.report.summary import one_line

        return one_line(self)

    def summary(self) -> Any:
        """A torchinfo-style table of the leaf-module calls and the totals; a ``str`` that a
        notebook shows as the table (:func:`ampgraph.report.summary.table`).

        >>> print(Report("m", {"name": "fp32"}, {}, {}, [], []).summary().splitlines()[-1])
        check: not checked
        """
        from ampgraph.report.summary import table

        return table(self)

    def _repr_svg_(self) -> str | None:
        """Jupyter shows a report as its module-view diagram (needs Graphviz's ``dot``)."""
        from ampgraph.render import render_svg

        try:
            return render_svg(self)
        except Exception:  # noqa: BLE001 - no dot: let Jupyter fall back to the text repr
            return None
