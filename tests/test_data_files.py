"""Data files are data ("safe in a pull request"): a saved report or a baseline is read, never
run, and whatever one holds the answer is output or one ``Error:`` line, never a traceback.

A baseline names the model it was made from; ``baseline check`` analyses it again only where that
runs no one's code (a bundled model, a config, a model folder). A baseline of a ``--module``
factory is checked with the factory given on the command line. The hostile files here are made
by the tests themselves; tests/test_fuzz_cli.py throws random ones at the same commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ampgraph.cli import main
from ampgraph.report.records import DTYPE_NAMES, Cast, ModuleCall, NodeRecord, Report, load_json
from ampgraph.review.baseline import BaselineError, baseline_record, read_baseline, spec_to_check
from ampgraph.formats.json import baseline_file

from .test_diff import SETTING  # the amp-fp32 setting the diff's hand-made reports use

#: A factory whose import leaves a file named MARKER beside it: the proof that code ran.
FACTORY = """\
import pathlib

import torch
from torch import nn

pathlib.Path(__file__).with_name("MARKER").write_text("this code ran")


def build():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.empty(2, 4)
"""


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result: Result, *codes: int) -> str:
    """The ``Error:`` line of a command that failed as a user's mistake should: its exit
    status among ``codes``, no traceback, and the error as the last line."""
    assert result.exit_code in codes, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert result.output.strip().splitlines()[-1] == errors[0], result.output
    return errors[0]


def report() -> Report:
    """A small report with every kind of field the readers use: shapes, casts, a module call."""
    nodes = [
        NodeRecord("x", "placeholder", "input", target="x", outputs=["float32"], shapes=[[2, 4]]),
        NodeRecord(
            "w",
            "placeholder",
            "parameter",
            target="fc.weight",
            outputs=["float32"],
            shapes=[[4, 4]],
        ),
        NodeRecord(
            "linear",
            "aten.linear.default",
            "op",
            module="fc",
            module_call="fc",
            inputs=[{"node": "x", "dtype": "float32"}, {"node": "w", "dtype": "float32"}],
            policy="lower_precision_fp",
            casts=[Cast("x", "float32", "bfloat16"), Cast("w", "float32", "bfloat16")],
            outputs=["bfloat16"],
            shapes=[[2, 4]],
            autocast=True,
        ),
        NodeRecord(
            "relu",
            "aten.relu.default",
            "op",
            module="act",
            module_call="act",
            inputs=[{"node": "linear", "dtype": "bfloat16"}],
            outputs=["bfloat16"],
            shapes=[[2, 4]],
        ),
        NodeRecord("output", "output", "output", inputs=[{"node": "relu", "dtype": "bfloat16"}]),
    ]
    modules = [
        ModuleCall(
            "fc", "torch.nn.Linear", ["Linear", "Module"], "fc", "float32", "bfloat16", ["linear"]
        ),
        ModuleCall(
            "act", "torch.nn.ReLU", ["ReLU", "Module"], "act", "bfloat16", "bfloat16", ["relu"]
        ),
    ]
    return Report(
        "m", dict(SETTING), {"policy_tables": "2.14"}, {"method": "export"}, nodes, modules
    )


# -- dtype names ---------------------------------------------------------------------------------


def test_the_dtype_names_are_every_dtype_the_installed_torch_has() -> None:
    """DTYPE_NAMES is kept without torch; a torch with a dtype it lacks would have reports
    refused as damaged, so this fails first."""
    import torch

    names = {
        str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)
    }
    assert names - DTYPE_NAMES == set()


def test_json_reader_refuses_nan_and_infinity() -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(ValueError, match=f"{constant} is not a JSON value"):
            load_json(f'{{"out": [{constant}]}}')
    with pytest.raises(ValueError, match="nests too deeply"):
        load_json("[" * 100_000 + "]" * 100_000)
    assert load_json('{"out": [1.5]}') == {"out": [1.5]}


# -- saved reports: render --report, audit --report, diff ------------------------------------------


def _set_ops(field: str, value: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        for n in data["nodes"]:
            if n["kind"] == "op":
                n[field] = value

    return change


def _set_in(key: str, field: str, value: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        for item in data[key]:
            item[field] = value

    return change


def _set_inner(field: str, key: str, value: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        for n in data["nodes"]:
            for item in n.get(field) or []:
                item[key] = value

    return change


#: What a damaged or hand-edited report may hold where the readers expect something else; each
#: made a traceback in one of the commands below before reports were checked when read.
DAMAGE = {
    "NaN output dtypes": _set_ops("outputs", [float("nan")]),
    "Infinity output dtypes": _set_ops("outputs", [float("inf")]),
    "a number as output dtype": _set_ops("outputs", [1.5]),
    "an unknown output dtype": _set_ops("outputs", ["nan"]),
    "a string as shapes": _set_ops("shapes", "abc"),
    "a string as a shape": _set_ops("shapes", ["x"]),
    "a string as a dimension": _set_ops("shapes", [["x"]]),
    "a negative dimension": _set_ops("shapes", [[-2, 4]]),
    "NaN input dtypes": _set_inner("inputs", "dtype", float("nan")),
    "NaN cast dtypes": _set_inner("casts", "to", float("nan")),
    "a number as a cast dtype": _set_inner("casts", "from", 3),
    "NaN module dtypes": _set_in("modules", "out", float("nan")),
    "a list as a module's dtype": _set_in("modules", "in", ["float32"]),
    "a number as a stack": _set_ops("stack", 7),
    "a number as a policy": _set_ops("policy", 7),
    "a string as a source line": _set_ops("source", {"file": "m.py", "line": "7"}),
    # A recipe's casts (issue 26): diff read them unchecked and compared the rest.
    "a number as the input cast": lambda data: data["setting"].update(input_dtype=5),
    "fp64 as the output cast": lambda data: data["setting"].update(output_dtype="float64"),
    # Issue 35: audit printed a 2e60-byte cast from a huge shape, crashed on a list as the
    # policy tables, and diagrams printed "lots disagree" from an unchecked count.
    "a shape no int64 holds": _set_ops("shapes", [[10**30, 10**30]]),
    "shapes whose product no int64 holds": _set_ops("shapes", [[2**40, 2**40]]),
    "a list as the policy tables": lambda data: data["versions"].update(policy_tables=[1, 2]),
    "a word as a check count": lambda data: data.update(
        check={"oracle": "dispatcher", "nodes": 5, "compared": 5, "disagreements": "lots"}
    ),
    "a number as the check's oracle": lambda data: data.update(check={"oracle": 5}),
    "a word as a node's agreement": _set_ops("check", {"agree": "lots"}),
    "a device ampgraph does not know": lambda data: data["setting"].update(device_type="banana"),
}
COMMANDS = {
    "render modules": ["render", "--report", "FILE", "--format", "dot", "--out", "OUT"],
    "render ops": [
        "render",
        "--report",
        "FILE",
        "--format",
        "dot",
        "--out",
        "OUT",
        "--view",
        "ops",
    ],
    "audit": ["audit", "--report", "FILE"],
    "diff": ["diff", "GOOD", "FILE"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_report_is_one_error_line(tmp_path: Path, damage: str, command: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(report().to_json())
    data = report().to_dict()
    DAMAGE[damage](data)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python writes them
    files = {"FILE": path, "GOOD": good, "OUT": tmp_path / "out"}
    result = invoke(*[files.get(a, a) for a in COMMANDS[command]])
    line = one_error_line(result, 1, 2)
    assert "damaged.json" in line
    assert not (tmp_path / "out").exists()


def test_the_good_report_passes_every_command(tmp_path: Path) -> None:
    """The damage above is what fails, not the report it was done to."""
    path = tmp_path / "good.json"
    path.write_text(report().to_json())
    files = {"FILE": path, "GOOD": path, "OUT": tmp_path / "out"}
    for args in COMMANDS.values():
        result = invoke(*[files.get(a, a) for a in args])
        assert result.exit_code == 0, result.output


def test_the_damage_is_named_in_the_error() -> None:
    data = report().to_dict()
    _set_ops("shapes", ["x"])(data)
    with pytest.raises(
        ValueError, match=r"^damaged ampgraph.report: node 'linear' has a malformed shapes$"
    ):
        Report.from_dict(data)
    data = report().to_dict()
    data["setting"]["amp_dtype"] = "nan"
    with pytest.raises(ValueError, match="its setting has a malformed amp_dtype"):
        Report.from_dict(data)
    data = report().to_dict()
    data["capture"]["dtype_branches"] = [3]
    with pytest.raises(ValueError, match="its capture has a malformed dtype_branches"):
        Report.from_dict(data)
    # Names are any strings (a module may be called anything; the formats escape them).
    data = report().to_dict()
    data["model"] = data["nodes"][2]["module"] = "two\nlines|`x`"
    assert Report.from_dict(data).model == "two\nlines|`x`"


@pytest.mark.parametrize("command", ["audit", "render", "table", "check"])
@pytest.mark.parametrize("many", [False, True])
def test_a_report_given_as_the_model_says_how_to_read_it(
    tmp_path: Path, command: str, many: bool
) -> None:
    """``ampgraph audit r.json`` read the report as a Hugging Face config ("has no
    'model_type'"); a list of reports (table's JSON of several settings) too."""
    path = tmp_path / "r.json"
    data = report().to_dict()
    path.write_text(json.dumps([data, data] if many else data))
    line = one_error_line(invoke(command, path), 1)
    assert "r.json is a saved ampgraph.report, not a model config: give it with --report" in line


def test_a_config_holding_nan_is_still_a_model_to_diff(tmp_path: Path) -> None:
    """Only ampgraph's own files refuse NaN: a Hugging Face config may hold one (Python's json
    writes it), and diff takes a config.json as a model, as before."""
    config = json.loads(
        (Path(__file__).parent.parent / "src/ampgraph/model/configs/llama-tiny.json").read_text()
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config | {"some_threshold": float("nan")}))
    from ampgraph.cli.review_commands import _report_file

    assert _report_file(str(path)) is None


# -- baselines: a data file never decides what code runs -------------------------------------------


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A factory file in a working folder of its own (relative specs, as a user writes them)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "marked_model.py"
    path.write_text(FACTORY)
    return path


def baseline(tmp_path: Path, **header: Any) -> Path:
    """A baseline of llama-tiny's header with a relu node, and ``header`` over its fields."""
    report = Report(
        "llama-tiny", dict(SETTING), {}, {}, [NodeRecord("r", "aten.relu", "op",
                                                         outputs=["float32"])], []
    )
    data = json.loads(baseline_file(baseline_record(report)))
    path = tmp_path / "base.json"
    path.write_text(json.dumps(data | header))
    return path


def test_a_module_baseline_is_checked_only_with_its_module_given(factory: Path) -> None:
    tmp = factory.parent
    written = invoke("baseline", "write", "b.json", "--module", "marked_model.py:build")
    assert written.exit_code == 0, written.output
    (tmp / "MARKER").unlink()  # writing it ran the factory, as asked
    assert json.loads((tmp / "b.json").read_text())["spec_kind"] == "module"

    refused = invoke("baseline", "check", "b.json")
    assert one_error_line(refused, 1) == (
        "Error: b.json was made from --module marked_model.py:build; ampgraph never runs code "
        "named in a data file: give it on the command line: ampgraph baseline check b.json "
        "--module marked_model.py:build"
    )
    assert not (tmp / "MARKER").exists()

    checked = invoke("baseline", "check", "b.json", "--module", "marked_model.py:build")
    assert checked.exit_code == 0, checked.output
    assert "matches (6 graph nodes)" in checked.output
    assert (tmp / "MARKER").exists()


@pytest.mark.parametrize("kind", ["module", "auto", "bundled"])
@pytest.mark.parametrize("spec", ["marked_model.py:build", "marked_model:build", "marked_model.py"])
def test_a_baseline_naming_code_never_runs_it(factory: Path, kind: str, spec: str) -> None:
    """Whatever the header says the spec is, a spec that names code (a file, or a module to
    import, with its factory) is refused in one line, and the file's code never runs. The
    header also says llama-tiny: the model the check would otherwise have run."""
    path = baseline(factory.parent, spec=spec, spec_kind=kind)
    line = one_error_line(invoke("baseline", "check", path), 1)
    assert f"was made from {'--module ' if kind == 'module' else ''}{spec};" in line
    assert "ampgraph never runs code named in a data file" in line
    assert not (factory.parent / "MARKER").exists()


@pytest.mark.parametrize("kind", ["config", "dir"])
def test_a_config_spec_naming_code_reads_no_code(factory: Path, kind: str) -> None:
    path = baseline(factory.parent, spec="marked_model.py:build", spec_kind=kind)
    one_error_line(invoke("baseline", "check", path), 1)
    assert not (factory.parent / "MARKER").exists()


@pytest.mark.parametrize(
    ("spec", "kind", "resolved"),
    [
        ("llama-tiny", "auto", "bundled"),
        ("LLAMA-TINY", "bundled", "bundled"),
        ("resnet18", "auto", "bundled"),  # ampgraph's own factory: no one's code
        ("cfg/config.json", "config", "config"),
        ("cfg", "dir", "dir"),
        ("cfg", "auto", "dir"),
        ("cfg/config.json", "auto", "config"),
    ],
)
def test_what_a_baseline_may_name_never_resolves_to_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, kind: str, resolved: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text('{"model_type": "llama"}')
    base = read_baseline(baseline(tmp_path, spec=spec, spec_kind=kind).read_text())
    checked = spec_to_check(base, "b.json")
    assert (str(checked), checked.kind) == (spec, resolved)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"spec_kind": "plugin"}, 'its spec_kind "plugin" is not one this ampgraph knows'),
        ({"spec_kind": ["module"]}, 'its spec_kind ["module"] is not one this ampgraph knows'),
        ({"tracer": "jit"}, 'its tracer "jit" is not one this ampgraph knows'),
        ({"tracer": None}, "its tracer null is not one this ampgraph knows"),
        ({"spec": 7}, "its spec 7 is not a name on one line"),
        ({"spec": "llama-tiny\nrm -rf"}, "is not a name on one line"),
        ({"model": ["m"]}, 'its model ["m"] is not a name on one line'),
        ({"seq_len": 0}, "its seq_len 0 is not a length"),
        ({"seq_len": "8"}, 'its seq_len "8" is not a length'),
        ({"setting": {"name": "amp-fp32"}}, "its setting lacks device_type, autocast"),
        ({"setting": SETTING | {"amp_dtype": 16}}, "its setting has a malformed amp_dtype"),
        ({"setting": SETTING | {"name": "a\nb"}}, 'its setting\'s name "a\\nb" is not a name'),
        ({"nodes": {"op": "aten.relu"}}, "its nodes are a dict, not a list"),
        ({"nodes": [{"op": "aten.relu", "out": ["nan"]}]}, "node '#0' has a malformed outputs"),
        ({"nodes": [{"op": 3}]}, "node '#0' has a malformed op"),
        ({"versions": "2.14"}, "its versions or method have the wrong type"),
    ],
)
def test_a_damaged_baseline_is_one_error_line(
    tmp_path: Path, header: dict[str, Any], message: str
) -> None:
    path = baseline(tmp_path, **header)
    line = one_error_line(invoke("baseline", "check", path), 1)
    assert line.startswith(f"Error: {path} is a damaged baseline: "), line
    assert message in line
    with pytest.raises(BaselineError, match="damaged baseline"):
        read_baseline(path.read_text(), str(path))
    # The same file as a side of a diff: the same line.
    assert one_error_line(invoke("diff", path, path), 1) == line


def test_nan_in_a_baseline_is_one_error_line(tmp_path: Path) -> None:
    path = baseline(tmp_path, nodes=[{"module": "fc", "op": "aten.relu", "out": [float("nan")]}])
    assert '"out": [NaN]' in path.read_text()
    line = one_error_line(invoke("baseline", "check", path), 1)
    assert "is not JSON (NaN is not a JSON value" in line


def test_an_unreadable_baseline_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(b'{"schema": "ampgraph.baseline", "model": "\xff"}')
    line = one_error_line(invoke("baseline", "check", path), 1)
    assert line == f"Error: cannot read the baseline {path}: it is not UTF-8 text; save it as UTF-8"


def test_the_command_line_model_must_still_be_the_baselines_own(factory: Path) -> None:
    """A model on the command line is the one analysed, so it must be the baseline's: a
    baseline of llama-tiny is not checked against a factory, nor a module baseline against
    another module."""
    path = baseline(factory.parent)
    line = one_error_line(invoke("baseline", "check", path, "--module", "marked_model.py:build"), 1)
    assert "is the baseline of llama-tiny amp-fp32, not of marked_model.py:build" in line
    assert not (factory.parent / "MARKER").exists()


# -- a module nested too deep ----------------------------------------------------------------------

DEEP = """\
import torch
from torch import nn


def build():
    module = nn.Linear(4, 4)
    for _ in range(2000):
        module = nn.Sequential(module)
    return module, torch.empty(2, 4)
"""


def test_a_module_nested_too_deep_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deep_model.py").write_text(DEEP)
    result = invoke("table", "--module", "deep_model.py:build", "-s", "fp32", "--no-check")
    line = one_error_line(result, 1)
    assert line.startswith("Error: factory 'deep_model.py:build' returned a module nested too deep")
