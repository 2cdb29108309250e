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
  ``stand_in``, only for a device this torch cannot trace on (``xpu`` or ``mps`` in a build
  without them): the graph was traced on CUDA and annotated with that device's lists, and why;
  ``cpu_kernels``, only for a CPU setting with a 16-bit convolution: the backend this machine's
  CPU takes for it (oneDNN or the slow kernels, :mod:`ampgraph.annotate.cpu_backend`);
  ``data_dependent`` and ``unbacked_values``, only for methods ``export-data-path`` and
  ``draft-export`` (a forward that branches on data values, traced along the path seeded random
  values take): each branch taken on data, whose other side is not analysed, and the value each
  data-dependent size (``u0``, ``u1``, ...) took on that path;
  ``graph_of``, where the graph was captured in another setting and proven to be the one this
  setting's capture would give (:mod:`ampgraph.capture.reads`); ``not_shared``, where a graph of the same
  parameter dtype was not, and why; ``real_run``, where the forward raised on export's path
  (``torch.compiler.is_exporting()`` true: transformers' masks) and was traced on the path a real
  run takes, and why.
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
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from ampgraph.report.validate import (
    BOOL,
    DTYPE_NAMES,  # noqa: F401 - read from here too, with check_setting and load_json
    OPT_STR,
    STR,
    Check,
    Checks,
    check_setting,
    is_dtype,
    is_dtypes,
    is_inputs,
    is_node_check,
    is_opt_dtype,
    is_promotion,
    is_report_check,
    is_shape,
    is_shapes,
    is_size,
    is_source,
    is_strs,
    is_versions,
    label,
    load_json,
    refuse_malformed,
    typed,
)

SCHEMA = "ampgraph.report"
SCHEMA_VERSION = 2
#: Versions this ampgraph reads: a version 1 report is a forward pass without ``backward``.
READABLE_VERSIONS = (1, 2)
PASSES = ("forward", "backward", "train")


def _is_cast(cast: Any) -> bool:
    return (
        type(cast) is Cast
        and type(cast.node) is str
        and is_dtype(cast.from_dtype)
        and is_dtype(cast.to_dtype)
    )


def _is_casts(value: Any) -> bool:
    return type(value) is list and all(map(_is_cast, value))


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


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the fields ``cls`` does not have: a reader ignores fields it does not
    know (docs/schema.md), so a report from a newer ampgraph still reads."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


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
    #: for source lines (``analyze(..., sources=True)``, :mod:`ampgraph.capture.sources`); else None.
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
            raise ValueError(f"node {label(data.get('name'))} has a malformed casts")  # noqa: TRY004
        data["casts"] = [Cast(c["node"], c["from"], c["to"]) for c in casts]
        rec = cls(**_known(cls, data))
        rec.refuse_malformed()
        return rec

    def refuse_malformed(self) -> None:
        """``ValueError`` naming the fields that have the wrong type or hold an unknown dtype.

        >>> NodeRecord("relu", "aten.relu", "op", outputs=["nan"]).refuse_malformed()
        Traceback (most recent call last):
        ...
        ValueError: node 'relu' has a malformed outputs
        """
        refuse_malformed(self, _NODE_CHECKS, "node ", "name")


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
        call = cls(**_known(cls, data))
        refuse_malformed(call, _MODULE_CHECKS, "module call ", "path")
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
        saved = cls(**_known(cls, data))
        refuse_malformed(saved, _SAVED_CHECKS, "saved tensor of ", "node")
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
        grad = cls(**_known(cls, data))
        refuse_malformed(grad, _GRADIENT_CHECKS, "gradient of ", "parameter")
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
            loss=typed(data, "loss", dict),
            autocast=bool(data["autocast"]),
            method=data.get("method", ""),
            check=data.get("check"),
            skipped=data.get("skipped"),
            gradients=[Gradient.from_dict(g) for g in typed(data, "gradients", list)],
            saved=[SavedTensor.from_dict(t) for t in typed(data, "saved", list)],
            nodes=[NodeRecord.from_dict(n) for n in typed(data, "nodes", list)],
        )
        refuse_malformed(backward, _BACKWARD_CHECKS, "the backward")
        return backward


#: Each record's fields and the check a value read from a file must pass: what the renderers,
#: the audit, the diff and the text formats assume of them (a string where they join or print,
#: a known dtype where they name one, sizes where they multiply).
_NODE_CHECKS = Checks({
    "name": STR, "op": STR, "kind": STR, "target": OPT_STR, "module": OPT_STR,
    "module_call": OPT_STR, "stack": is_strs, "region": OPT_STR, "autocast": BOOL,
    "inputs": is_inputs, "policy": OPT_STR, "casts": _is_casts, "outputs": is_dtypes,
    "promotion": is_promotion, "reason": STR, "error": OPT_STR, "skipped": OPT_STR,
    "trace_time_dtype": BOOL, "check": is_node_check, "not_analysed": OPT_STR,
    "forward": OPT_STR, "shapes": is_shapes, "source": is_source,
})  # fmt: skip
_MODULE_CHECKS = Checks({
    "path": STR, "type": STR, "bases": is_strs, "call": STR, "in_dtype": is_opt_dtype,
    "out_dtype": is_opt_dtype, "nodes": is_strs, "returns_tensor": BOOL,
})  # fmt: skip
_SAVED_CHECKS = Checks({
    "node": STR, "module": OPT_STR, "dtype": is_dtype, "shape": is_shape, "bytes": is_size,
    "storage": is_size, "storage_bytes": is_size, "kind": STR, "producer": OPT_STR,
})  # fmt: skip
_GRADIENT_CHECKS = Checks({
    "parameter": STR, "param_dtype": is_dtype, "dtype": is_opt_dtype, "shape": is_shape,
    "node": OPT_STR,
})  # fmt: skip
_BACKWARD_CHECKS = Checks({
    "loss": lambda loss: is_opt_dtype(loss.get("dtype"))
    and all(type(loss.get(k)) in OPT_STR for k in ("output", "expression")),
    "method": STR, "check": is_report_check, "skipped": OPT_STR,
})  # fmt: skip
#: The capture fields that are joined or printed, where a report has them.
_CAPTURE_CHECKS: dict[str, Check] = {
    "method": OPT_STR, "trace_time_dtype_nodes": is_strs, "dtype_branches": is_strs,
    "data_dependent": is_strs, "check_unavailable": OPT_STR, "graph_of": OPT_STR,
    "stand_in": OPT_STR, "cpu_kernels": OPT_STR, "real_run": OPT_STR,
    "unbacked_values": (dict,), "grad_mode": OPT_STR,
}  # fmt: skip


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
                model=typed(data, "model", str),
                setting=setting,
                versions=typed(data, "versions", dict),
                capture=typed(data, "capture", dict),
                nodes=[NodeRecord.from_dict(n) for n in typed(data, "nodes", list)],
                modules=[ModuleCall.from_dict(m) for m in typed(data, "modules", list)],
                check=data.get("check"),
                pass_=data.get("pass", "forward"),
                backward=(Backward.from_dict(data["backward"]) if data.get("backward") else None),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"damaged {SCHEMA}: {type(exc).__name__} {exc}") from None
        except ValueError as exc:  # a record's own check: its message names the field
            raise ValueError(f"damaged {SCHEMA}: {exc}") from None
        if report.pass_ not in PASSES:
            raise ValueError(f"damaged {SCHEMA}: pass {label(report.pass_)} is not one of {PASSES}")
        present = {k: ok for k, ok in _CAPTURE_CHECKS.items() if k in report.capture}
        bad = Checks(present).malformed(report.capture)
        if bad:
            raise ValueError(f"damaged {SCHEMA}: its capture has a malformed {', '.join(bad)}")
        if not is_report_check(report.check):
            raise ValueError(f"damaged {SCHEMA}: its check has a malformed count or oracle")
        if not is_versions(report.versions):
            raise ValueError(f"damaged {SCHEMA}: its versions are not all text")
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
