"""The analysis result as plain records: what every stage after the annotator reads.

This module is torch-free. A :class:`Report` is what ``ampgraph table --format json`` prints and
what the renderer draws; it round-trips through JSON (:meth:`Report.to_json`,
:meth:`Report.from_json`), so diagrams and later commands (diff, audit) can work from a saved file.

JSON schema ``ampgraph.report`` version 1 (fields are added, never renamed, within a version):

* ``schema``, ``version``: ``"ampgraph.report"``, ``1``.
* ``model``: the spec analysed; ``setting``: ``{name, device_type, autocast, amp_dtype,
  param_dtype}``; ``versions``: ``{ampgraph, torch, transformers, policy_tables}``.
* ``capture``: ``{method, trace_time_dtype_nodes, dtype_branches}``: how the graph was traced
  (``export``, ``hf-fx+export``, ...), nodes whose dtypes were fixed at trace time (the CPU-only
  replay path), and module paths where the frontend decided a Python branch on a dtype once, in
  fp32 (``hf-fx``; empty for ``export``, which traces every setting); ``check_unavailable``, only
  where a check was asked for and this torch cannot run it (a CPU-only build and ``cuda``);
  ``graph_of``, where the graph was captured in another setting and proven to be the one this
  setting's capture would give (:mod:`ampgraph.reads`); ``not_shared``, where a graph of the same
  parameter dtype was not, and why.
* ``nodes``: one record per graph node in execution order (:class:`NodeRecord`), with ``policy``
  (``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype``, ``fp32_append_dtype``, ``promote``,
  ``banned`` or null), ``inputs`` (producer node and dtype), ``casts`` (``{node, from, to}`` for each
  tensor autocast casts), ``outputs`` (dtypes), ``promotion`` (``{inputs, to}`` where ordinary type
  promotion widened mixed inputs), ``reason``, ``error``, ``skipped`` and ``check``.
* ``modules``: one record per leaf-module call in execution order (:class:`ModuleCall`): the hook
  view of the seed notebook, ``in`` and ``out`` dtypes.
* ``check``: ``{oracle, nodes, compared, disagreements}`` once the dispatcher check ran, else null.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "ampgraph.report"
SCHEMA_VERSION = 1


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

    @property
    def out_dtype(self) -> str | None:
        """The first output's dtype (what a single-output op returns)."""
        return self.outputs[0] if self.outputs else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["casts"] = [c.to_dict() for c in self.casts]
        if data["not_analysed"] is None:
            del data["not_analysed"]  # reports of fully analysed graphs read as before
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

    def hook_line(self) -> str:
        """The seed notebook's hook line: ``[path] in=torch.float32 -> out=torch.bfloat16``."""

        def torch_name(d: str | None) -> str:
            return f"torch.{d}" if d else "None"

        return f"[{self.path}] in={torch_name(self.in_dtype)} -> out={torch_name(self.out_dtype)}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["in"] = data.pop("in_dtype")
        data["out"] = data.pop("out_dtype")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModuleCall:
        data = dict(data)
        data["in_dtype"] = data.pop("in")
        data["out_dtype"] = data.pop("out")
        return cls(**data)


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
            "modules": [m.to_dict() for m in self.modules],
            "nodes": [n.to_dict() for n in self.nodes],
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
        if data.get("schema") != SCHEMA or data.get("version") != SCHEMA_VERSION:
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
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"damaged {SCHEMA}: {type(exc).__name__} {exc}") from None
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
