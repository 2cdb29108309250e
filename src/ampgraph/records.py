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
  setting's capture would give (:mod:`ampgraph.reads`); ``not_shared``, where a graph of the same
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
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

SCHEMA = "ampgraph.report"
SCHEMA_VERSION = 2
#: Versions this ampgraph reads: a version 1 report is a forward pass without ``backward``.
READABLE_VERSIONS = (1, 2)
PASSES = ("forward", "backward", "train")

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
    #: for source lines (``analyze(..., sources=True)``, :mod:`ampgraph.sources`); else None.
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
        data = dict(data)
        data["casts"] = [Cast(c["node"], c["from"], c["to"]) for c in data.get("casts", [])]
        return cls(**data)


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
        data = dict(data)
        data["in_dtype"] = data.pop("in")
        data["out_dtype"] = data.pop("out")
        return cls(**data)


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
        return cls(**data)


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
        return cls(**data)


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
        return cls(
            loss=_typed(data, "loss", dict),
            autocast=bool(data["autocast"]),
            method=data.get("method", ""),
            check=data.get("check"),
            skipped=data.get("skipped"),
            gradients=[Gradient.from_dict(g) for g in _typed(data, "gradients", list)],
            saved=[SavedTensor.from_dict(t) for t in _typed(data, "saved", list)],
            nodes=[NodeRecord.from_dict(n) for n in _typed(data, "nodes", list)],
        )


_SETTING_FIELDS = ("name", "device_type", "autocast", "amp_dtype", "param_dtype")


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
        setting = data.get("setting")
        missing = [k for k in _SETTING_FIELDS if not isinstance(setting, dict) or k not in setting]
        if missing:
            raise ValueError(f"damaged {SCHEMA}: its setting lacks {', '.join(missing)}")
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
        if report.pass_ not in PASSES:
            raise ValueError(f"damaged {SCHEMA}: pass {report.pass_!r} is not one of {PASSES}")
        for rec in report.nodes:
            if not isinstance(rec.name, str) or not isinstance(rec.outputs, list):
                raise ValueError(f"damaged {SCHEMA}: node {rec.name!r} has the wrong types")  # noqa: TRY004
        return report

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))

    def _repr_svg_(self) -> str | None:
        """Jupyter shows a report as its module-view diagram (needs Graphviz's ``dot``)."""
        from ampgraph.render import render_svg

        try:
            return render_svg(self)
        except Exception:  # noqa: BLE001 - no dot: let Jupyter fall back to the text repr
            return None
