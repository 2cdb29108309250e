"""A committed snapshot of a model's dtype flow, and the check that it still holds (a CI gate).

Torch-free. A baseline (schema ``ampgraph.review.baseline``) is a JSON file written for git: a header
(model, setting, sequence length, the versions that wrote it), then one line per node of the
forward graph with what :mod:`ampgraph.review.diff` compares -- module path, op, policy, input dtypes,
casts (by input position), output dtypes, promotion, error. Node names are left out on purpose:
they are positions in one graph (``linear_3``), and one inserted op would rename every later node
of its kind, so a one-op change would touch dozens of lines in review.

The file's text is :func:`ampgraph.formats.json.baseline_file`'s, of :func:`baseline_record`.
``ampgraph baseline check FILE`` analyses the model again and diffs the baseline against it
(:func:`check_report`); ``--update`` accepts the new flow, as snapshot-testing tools do.

A baseline is data, committed and changed in pull requests like any file: what it says never
decides what code runs. Without a model on the command line the check analyses the bundled model
or the config the baseline names (:func:`spec_to_check`), which builds a model from a config and
runs no one's code; a baseline of a ``--module`` factory is checked only with that factory given
on the command line.

>>> from ampgraph.report.records import NodeRecord, Report
>>> setting = {"name": "fp32", "device_type": "cuda", "autocast": False,
...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
>>> r = Report("m", setting, {}, {}, [NodeRecord("r", "aten.relu", "op", module="act",
...            outputs=["float32"])], [])
>>> record = baseline_record(r)
>>> record["nodes"]
[{'module': 'act', 'op': 'aten.relu', 'out': ['float32']}]
>>> check_report(read_baseline(json.dumps(record)), r).equal
True
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from ampgraph.errors import AmpgraphError
from ampgraph.model.specs import (
    DEFAULT_TRACER,
    SPEC_KINDS,
    TRACERS,
    ModelSpec,
    bundled_key,
    resolve_config,
)
from ampgraph.report.records import (
    PLACEHOLDER_KINDS,
    Cast,
    NodeRecord,
    Report,
    check_setting,
    load_json,
)
from ampgraph.review.diff import ReportDiff, diff_reports

SCHEMA = "ampgraph.baseline"
SCHEMA_VERSION = 1


class BaselineError(AmpgraphError, ValueError):
    """A baseline file that cannot be read, or that belongs to another model or setting."""


@dataclass
class Baseline:
    """A baseline read back: its header and its nodes as a report :mod:`ampgraph.review.diff` reads."""

    report: Report
    seq_len: int
    #: What to analyse again: the spec as given (a config path, where ``report.model`` is only
    #: its display name), how it was given (:data:`ampgraph.model.specs.SPEC_KINDS`) and the tracer.
    spec: str = ""
    spec_kind: str = "auto"
    tracer: str = DEFAULT_TRACER

    @property
    def title(self) -> str:
        """``opt-125m amp-fp32 (cuda bf16)``: whose flow the baseline holds."""
        s = self.report.setting
        amp = s.get("amp_dtype", "").replace("bfloat16", "bf16").replace("float16", "fp16")
        return f"{self.report.model} {s.get('name')} ({s.get('device_type')} {amp})"


def _node_line(rec: NodeRecord) -> dict[str, Any]:
    """What the diff compares of a node; empty fields are left out so lines stay short."""
    producers = [i.get("node") for i in rec.inputs]
    line: dict[str, Any] = {"module": rec.module, "op": rec.op}
    if rec.kind != "op":
        line["kind"] = rec.kind
    if rec.kind in PLACEHOLDER_KINDS:
        line["target"] = rec.target
    if rec.inputs:
        line["in"] = [i.get("dtype") for i in rec.inputs]
    if rec.policy:
        line["policy"] = rec.policy
    if rec.casts:
        line["casts"] = [
            [producers.index(c.node) if c.node in producers else c.node, c.from_dtype, c.to_dtype]
            for c in rec.casts
        ]
    line["out"] = rec.outputs
    if rec.promotion:
        line["promotion"] = rec.promotion
    if rec.error:
        line["error"] = rec.error
    return line


def baseline_record(
    report: Report,
    *,
    seq_len: int = 8,
    spec: str | None = None,
    spec_kind: str = "auto",
    tracer: str = DEFAULT_TRACER,
) -> dict[str, Any]:
    """The baseline of ``report``'s forward pass as data: the header, then ``nodes``, one record
    per node (:func:`ampgraph.formats.json.baseline_file` writes it, a line per node).

    ``spec`` (its ``spec_kind`` and ``tracer``) is what ``baseline check`` analyses again; by
    default the report's model name, which is the spec of a bundled model.

    >>> from ampgraph.report.records import Report
    >>> baseline_record(Report("m", {"name": "fp32"}, {}, {}, [], []))["schema"]
    'ampgraph.baseline'
    """
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "model": report.model,
        "spec": spec if spec is not None else report.model,
        "spec_kind": spec_kind,
        "tracer": tracer,
        "setting": report.setting,
        "seq_len": seq_len,
        "versions": report.versions,
        "method": (report.capture or {}).get("method"),
    }
    if (report.capture or {}).get("stand_in"):  # xpu/mps predicted: the file says so
        record["stand_in"] = report.capture["stand_in"]
    record["nodes"] = [_node_line(rec) for rec in report.nodes]
    return record


def _record(i: int, data: dict[str, Any]) -> NodeRecord:
    """A node record from line ``i`` of a baseline; inputs are named by position, as its casts
    refer to them."""
    if not isinstance(data, dict):
        raise TypeError(f"node line {i} is a {type(data).__name__}, not an object")
    # Graph inputs by their target, the rest by their place in the file (names are not kept).
    name = str(data["target"]) if data.get("target") else f"#{i}"
    inputs = [{"node": f"input {j}", "dtype": d} for j, d in enumerate(data.get("in", []))]
    casts = [
        Cast(f"input {where}" if isinstance(where, int) else str(where), src, dst)
        for where, src, dst in data.get("casts", [])
    ]
    rec = NodeRecord(
        name=name,
        op=data["op"],
        kind=data.get("kind", "op"),
        target=data.get("target"),
        module=data.get("module"),
        inputs=inputs,
        policy=data.get("policy"),
        casts=casts,
        outputs=list(data.get("out", [])),
        promotion=data.get("promotion"),
        error=data.get("error"),
    )
    # The same checks as a report's nodes: a dtype torch has, strings where strings are printed.
    rec.refuse_malformed()
    return rec


def _shown(value: Any) -> str:
    """A value from the file as an error message quotes it: JSON (escaped, so on one line), cut
    to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _header_text(data: dict[str, Any], key: str, default: str, known: tuple[str, ...]) -> str:
    """The header's ``key`` (``default`` where absent); one line naming it unless in ``known``."""
    value = data.get(key, default)
    if value not in known:
        raise ValueError(
            f"its {key} {_shown(value)} is not one this ampgraph knows ({', '.join(known)})"
        )
    return str(value)


def _name(value: Any, key: str) -> str:
    """A header field that error messages and commands quote: a string on one line."""
    if not (isinstance(value, str) and value and value.isprintable()):
        raise ValueError(f"its {key} {_shown(value)} is not a name on one line")
    return value


def _setting_named(setting: dict[str, Any]) -> None:
    """``ValueError`` unless the setting's name is one ampgraph parses into the very setting
    the baseline holds: a damaged name is the file's fault, never blamed on ``--setting``."""
    from ampgraph.errors import SettingError
    from ampgraph.settings import Setting

    try:
        parsed = Setting.parse(
            setting["name"], device_type=setting["device_type"], amp_dtype=setting["amp_dtype"]
        ).to_dict()
    except SettingError:
        raise ValueError(f"its setting's name {_shown(setting['name'])} is not a setting") from None
    if any(parsed.get(k) != v for k, v in setting.items() if k in parsed):
        raise ValueError(f"its setting's name {_shown(setting['name'])} disagrees with its fields")


def read_baseline(text: str, where: str = "the baseline") -> Baseline:
    """A baseline from its text; :class:`BaselineError` in one line for anything else.

    >>> read_baseline('{"schema": "ampgraph.report", "version": 2}', "b.json")
    Traceback (most recent call last):
    ...
    ampgraph.review.baseline.BaselineError: b.json is an ampgraph.report, not a baseline: write one with 'ampgraph baseline write b.json MODEL -s SETTING'
    """
    try:
        data = load_json(text)  # NaN and Infinity are refused: no baseline holds them
    except ValueError as exc:
        raise BaselineError(f"{where} is not JSON ({exc})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        what = f"an {schema}" if isinstance(schema, str) else "not an ampgraph file"
        raise BaselineError(
            f"{where} is {what}, not a baseline: write one with "
            f"'ampgraph baseline write {where} MODEL -s SETTING'"
        )
    if data.get("version") != SCHEMA_VERSION:
        raise BaselineError(
            f"{where} is a baseline of version {_shown(data.get('version'))}; this ampgraph reads "
            f"version {SCHEMA_VERSION}: write it again with 'ampgraph baseline check {where} "
            "--update'"
        )
    try:
        if not isinstance(data["nodes"], list):
            raise ValueError(f"its nodes are a {type(data['nodes']).__name__}, not a list")  # noqa: TRY004
        nodes = [_record(i, n) for i, n in enumerate(data["nodes"])]
        versions, method = data.get("versions") or {}, data.get("method")
        if not isinstance(versions, dict) or not (method is None or isinstance(method, str)):
            raise ValueError("its versions or method have the wrong type")
        report = Report(
            model=_name(data["model"], "model"),
            setting=check_setting(data["setting"]),
            versions=versions,
            capture={"method": method},
            nodes=nodes,
            modules=[],
        )
        _name(report.setting["name"], "setting's name")  # quoted in errors, as the model is
        _setting_named(report.setting)
        seq_len = data.get("seq_len", 8)
        if type(seq_len) is not int or seq_len < 1:
            raise ValueError(f"its seq_len {_shown(seq_len)} is not a length")
        spec = _name(data.get("spec") or report.model, "spec")
        spec_kind = _header_text(data, "spec_kind", "auto", SPEC_KINDS)
        tracer = _header_text(data, "tracer", DEFAULT_TRACER, TRACERS)
    except ValueError as exc:  # the checks above, and a node's: their messages say what is wrong
        raise BaselineError(f"{where} is a damaged baseline: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise BaselineError(f"{where} is a damaged baseline ({type(exc).__name__} {exc})") from None
    return Baseline(report, seq_len, spec, spec_kind, tracer)


def spec_to_check(baseline: Baseline, where: str) -> ModelSpec:
    """What ``baseline check`` analyses when no model is named on the command line: the bundled
    model, config file or model folder the baseline names, which builds a model from a config
    and runs no one's code. A baseline that names code (a ``--module`` factory, or a spec of the
    form ``path/file.py:factory`` or ``package.module:factory`` under any kind) is refused in one
    line that says to give the factory on the command line: the file is data, changed in pull
    requests like any other, and must never decide what code runs.

    >>> setting = {"name": "fp32", "device_type": "cuda", "autocast": False,
    ...            "amp_dtype": "bfloat16", "param_dtype": "float32"}
    >>> record = baseline_record(Report("llama-tiny", setting, {}, {}, [], []))
    >>> base = read_baseline(json.dumps(record))
    >>> spec = spec_to_check(base, "b.json")
    >>> spec, spec.kind
    ('llama-tiny', 'bundled')
    >>> base.spec, base.spec_kind = "models/mine.py:build", "module"
    >>> spec_to_check(base, "b.json")
    Traceback (most recent call last):
    ...
    ampgraph.review.baseline.BaselineError: b.json was made from --module models/mine.py:build; ampgraph never runs code named in a data file: give it on the command line: ampgraph baseline check b.json --module models/mine.py:build
    """
    spec, kind = baseline.spec, baseline.spec_kind
    if kind in ("config", "dir"):
        # Resolved by resolve_config alone: a config file or a folder's config.json, or an error.
        return ModelSpec(spec, kind, tracer=baseline.tracer)
    if kind == "auto":
        # What the positional MODEL would have meant, decided here so that it can never reach
        # the factory loader: a bundled config, a config file or a model folder...
        source = resolve_config(ModelSpec(spec, "auto"))
        if source is not None:
            return ModelSpec(spec, source.kind, tracer=baseline.tracer)
    # ... else a bundled name (a config, or a factory of ampgraph's own, such as resnet18). The
    # loader treats a spec with ':' as a factory to import, even of kind bundled: refused here.
    if kind in ("auto", "bundled") and ":" not in spec and not spec.endswith(".py"):
        return ModelSpec(spec, "bundled", tracer=baseline.tracer)
    made_from = "--module " if kind == "module" else ""
    option = "--module " if ":" in spec else ""
    raise BaselineError(
        f"{where} was made from {made_from}{spec}; ampgraph never runs code named in a data "
        f"file: give it on the command line: ampgraph baseline check {shlex.quote(where)} "
        f"{option}{shlex.quote(spec)}"
    )


def refuse_other(baseline: Baseline, model: str, setting: dict[str, Any], where: str) -> None:
    """:class:`BaselineError` unless the baseline is of ``model`` in ``setting``.

    >>> s = {"name": "fp32", "device_type": "cuda", "autocast": False,
    ...      "amp_dtype": "bfloat16", "param_dtype": "float32"}
    >>> b = read_baseline(json.dumps(baseline_record(Report("m", s, {}, {}, [], []))))
    >>> refuse_other(b, "m", s, "b.json")
    >>> opt = read_baseline(json.dumps(baseline_record(Report("opt-125m", s, {}, {}, [], []))))
    >>> refuse_other(opt, "OPT", s, "b.json")  # an alias names the same model
    >>> refuse_other(b, "gpt2", s, "b.json")
    Traceback (most recent call last):
    ...
    ampgraph.review.baseline.BaselineError: b.json is the baseline of m fp32, not of gpt2 fp32: check it without MODEL and --setting, or write another baseline
    """
    mine = baseline.report
    # An alias (``opt``) or another spelling (``OPT-125M``) of a bundled name is the same model.
    known = {mine.model, baseline.spec} | {bundled_key(n) for n in (mine.model, baseline.spec)}
    same_model = str(model) in known or bundled_key(str(model)) in known
    if not same_model or dict(setting) != mine.setting:
        raise BaselineError(
            f"{where} is the baseline of {mine.model} {mine.setting.get('name')}, not of "
            f"{model} {setting.get('name')}: check it without MODEL and --setting, or write "
            "another baseline"
        )


def check_report(baseline: Baseline, report: Report) -> ReportDiff:
    """The diff from the baseline's flow to ``report``'s (equal when the baseline holds)."""
    if report.pass_ != "forward":
        raise BaselineError(f"a baseline holds the forward pass, not a {report.pass_} pass")
    return diff_reports(baseline.report, report)


__all__ = [
    "Baseline",
    "BaselineError",
    "baseline_record",
    "check_report",
    "read_baseline",
    "refuse_other",
    "spec_to_check",
]
