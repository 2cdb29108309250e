"""ampgraph diff and ampgraph baseline: pairing, counts on real models, the CLI and its errors."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampgraph.cli import main
from ampgraph.formats.diff_text import diff_text
from ampgraph.formats.json import diff_json
from ampgraph.formats.markdown import diff_markdown
from ampgraph.report.records import Cast, NodeRecord, Report
from ampgraph.review.baseline import baseline_record, check_report, read_baseline
from ampgraph.formats.json import baseline_file
from ampgraph.review.diff import diff_reports

from .conftest import report as analysed_report

SETTING = {
    "name": "amp-fp32",
    "device_type": "cuda",
    "autocast": True,
    "amp_dtype": "bfloat16",
    "param_dtype": "float32",
}


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def node(name: str, op: str, module: str | None = "fc", **kw: object) -> NodeRecord:
    kw.setdefault("outputs", ["float32"])
    return NodeRecord(name, op, kw.pop("kind", "op"), module=module, **kw)  # type: ignore[arg-type]


def rep(*nodes: NodeRecord, model: str = "m") -> Report:
    return Report(model, dict(SETTING), {"policy_tables": "2.14"}, {"method": "export"},
                  list(nodes), [])  # fmt: skip


def save(tmp_path: Path, name: str, report: Report | dict | list) -> Path:
    path = tmp_path / name
    data = report.to_dict() if isinstance(report, Report) else report
    path.write_text(json.dumps(data))
    return path


# -- pairing on hand-made reports ------------------------------------------------------------


def test_an_inserted_op_is_one_change_though_later_nodes_are_renamed() -> None:
    a = rep(
        node("linear", "aten.linear"), node("relu", "aten.relu"), node("linear_1", "aten.linear")
    )
    b = rep(
        node("linear", "aten.linear"),
        node("gelu", "aten.gelu", outputs=["bfloat16"]),
        node("relu", "aten.relu"),
        node("linear_1", "aten.linear"),
    )
    d = diff_reports(a, b)
    assert [(c.change, c.b, c.op) for c in d.changes] == [("added", "gelu", "aten.gelu")]
    assert d.counts()["added"] == 1 and d.counts()["changed"] == 0
    # The graph-position names shift, which is no change: linear_1 is paired with linear_1 above,
    # and with a renamed twin here.
    renamed = rep(node("linear_7", "aten.linear"), node("relu_3", "aten.relu"),
                  node("linear_8", "aten.linear"))  # fmt: skip
    assert diff_reports(a, renamed).equal


def test_modules_in_another_order_pair_by_name() -> None:
    a = rep(node("x", "aten.relu", "layers.0"), node("y", "aten.gelu", "layers.1"),
            node("w", "placeholder", None, kind="parameter", target="layers.0.weight"),
            node("v", "placeholder", None, kind="parameter", target="layers.1.weight"))  # fmt: skip
    b = rep(*reversed(a.nodes))
    assert diff_reports(a, b).equal
    assert "no changes in the dtype flow (4 graph nodes)" in diff_text(diff_reports(a, b))


def test_every_compared_field() -> None:
    x = {"node": "x", "dtype": "float32"}
    w = {"node": "w", "dtype": "float32"}
    a = rep(
        node("lin", "aten.linear", inputs=[x, w], policy="lower_precision_fp",
             casts=[Cast("x", "float32", "bfloat16"), Cast("w", "float32", "bfloat16")],
             outputs=["bfloat16"]),
        node("add", "aten.add", "block", inputs=[x, x], promotion={"inputs": ["float32", "bfloat16"],
             "to": "float32"}),
        node("sm", "aten.softmax", "block", error="boom"),
        node("gone", "aten.exp", "old"),
    )  # fmt: skip
    b = rep(
        # Renamed producers, same positions: only the cast of input 0 is gone.
        node("lin", "aten.linear", inputs=[{"node": "x2", "dtype": "bfloat16"}, {"node": "w2",
             "dtype": "float32"}], policy="lower_precision_fp",
             casts=[Cast("w2", "float32", "bfloat16")], outputs=["bfloat16"]),
        node("add", "aten.add", "block", inputs=[x, x], outputs=["bfloat16"]),
        node("sm", "aten.softmax", "block", policy="fp32"),
    )  # fmt: skip
    d = diff_reports(a, b)
    fields = {c.name: [f.field for f in c.fields] for c in d.changes if c.change == "changed"}
    assert fields == {
        "lin": ["inputs", "casts"],
        "add": ["outputs", "promotion"],
        "sm": ["policy", "error"],
    }
    lin = next(c for c in d.changes if c.name == "lin")
    assert lin.casts_removed == ("x fp32→bf16",) and lin.casts_added == ()
    assert [(c.change, c.a, c.module) for c in d.changes if c.change != "changed"] == [
        ("removed", "gone", "old")
    ]
    counts = d.counts()
    assert (counts["changed"], counts["removed"], counts["casts_removed"]) == (3, 1, 1)
    text = diff_text(d)
    assert "  ~ lin aten.linear: inputs fp32, fp32 → bf16, fp32; casts removed x fp32→bf16" in text
    assert "  ~ sm aten.softmax: policy none → fp32; error boom → none" in text
    assert "  - gone aten.exp: out fp32" in text


def test_markdown_is_a_summary_with_collapsed_details() -> None:
    a = rep(node("r", "aten.relu"))
    b = rep(node("r", "aten.relu", outputs=["bfloat16"]), node("g", "aten.gelu", error="a | b"))
    md = diff_markdown(diff_reports(a, b))
    lines = md.splitlines()
    assert lines[0] == "### ampgraph diff: the dtype flow changes"
    assert "| 1 | 1 | 0 | 0 | 0 | 1 | 0 | 0 | 0 | 0 |" in lines
    assert "<details><summary>2 changes in 1 module</summary>" in lines
    assert "| `fc` | `g` | `aten.gelu` | added: error a \\| b |" in lines  # pipes escaped
    assert lines[-1] == "</details>"
    short = diff_markdown(diff_reports(a, b), limit=1)
    assert "… and 1 more: `ampgraph diff` (text or JSON) lists all." in short


def test_other_policy_tables_point_to_policy_since() -> None:
    a, b = rep(node("r", "aten.relu")), rep(node("r", "aten.relu"))
    a.versions["policy_tables"] = "2.13"
    d = diff_reports(a, b)
    assert d.equal and d.notes == [
        (
            "the policy tables differ (torch 2.13 → 2.14): 'ampgraph policy --since 2.13' lists "
            "what changed in autocast's lists"
        )
    ]


# -- real models: counts derived independently, position by position -------------------------


def _position_counts(a: Report, b: Report) -> Counter[str]:
    """What changes between two captures of one graph, read position by position (the two
    settings trace the same ops in the same order, so position pairs the nodes here)."""
    assert [(n.module, n.op) for n in a.nodes] == [(n.module, n.op) for n in b.nodes]
    out: Counter[str] = Counter()
    for x, y in zip(a.nodes, b.nodes, strict=True):
        casts_x = Counter((x.inputs[[i["node"] for i in x.inputs].index(c.node)]["dtype"],
                           [i["node"] for i in x.inputs].index(c.node), c.to_dtype)
                          for c in x.casts)  # fmt: skip
        casts_y = Counter((y.inputs[[i["node"] for i in y.inputs].index(c.node)]["dtype"],
                           [i["node"] for i in y.inputs].index(c.node), c.to_dtype)
                          for c in y.casts)  # fmt: skip
        diffs = {
            "policy": x.policy != y.policy,
            "inputs": [i["dtype"] for i in x.inputs] != [i["dtype"] for i in y.inputs],
            "outputs": x.outputs != y.outputs,
            "promotion": x.promotion != y.promotion,
            "error": x.error != y.error,
            "casts": casts_x != casts_y,
        }
        out.update(k for k, v in diffs.items() if v)
        out["changed"] += any(diffs.values())
        out["casts_added"] += sum((casts_y - casts_x).values())
        out["casts_removed"] += sum((casts_x - casts_y).values())
    return out


@pytest.fixture(scope="module")
def opt_pair() -> tuple[Report, Report]:
    return analysed_report("opt-125m", "amp-fp32"), analysed_report("opt-125m", "amp-half")


def test_opt_amp_fp32_against_amp_half(opt_pair: tuple[Report, Report]) -> None:
    a, b = opt_pair
    counts = diff_reports(a, b).counts()
    expected = _position_counts(a, b)
    assert counts == {
        "added": 0,
        "removed": 0,
        **{k: expected[k] for k in ("changed", "policy", "inputs", "casts", "outputs",
                                    "promotion", "error", "casts_added", "casts_removed")},
    }  # fmt: skip
    # The totals agree with the reports' own cast counts, and the figures are OPT's: every one
    # of the 197 parameters turns bf16, and 24 residual-add promotions (12 layers x 2) go away.
    total = sum(len(n.casts) for n in a.nodes) - sum(len(n.casts) for n in b.nodes)
    assert counts["casts_removed"] - counts["casts_added"] == total
    params = sum(n.kind == "parameter" for n in a.nodes)
    assert params == 197
    assert counts["promotion"] == sum(n.promotion is not None for n in a.nodes) == 24
    assert counts["policy"] == 0 and counts["error"] == 0


def test_parameters_that_change_alike_are_one_line(opt_pair: tuple[Report, Report]) -> None:
    d = diff_reports(*opt_pair)
    text = diff_text(d).splitlines()
    head = text.index("graph inputs")
    first = next(n.name for n in opt_pair[0].nodes if n.kind == "parameter")
    assert text[head + 1] == (
        f"  ~ 197 graph inputs ({first} … p_lm_head_weight) placeholder: outputs fp32 → bf16"
    )
    assert not text[head + 2].startswith("  ~ p_")  # the next line is a module's, not an input's
    markdown = diff_markdown(d)
    assert markdown.count("| `graph inputs` |") == 1
    # The JSON keeps every change, one per node.
    assert sum(c["op"] == "placeholder" for c in json.loads(diff_json(d))["changes"]) == 197


def test_opt_one_op_removed_from_one_module(opt_pair: tuple[Report, Report]) -> None:
    a = opt_pair[0]
    data = a.to_dict()
    i = next(i for i, n in enumerate(data["nodes"]) if n["op"] == "aten.relu.default")
    gone = data["nodes"].pop(i)
    d = diff_reports(a, Report.from_dict(data))
    assert [(c.change, c.a, c.module) for c in d.changes] == [
        ("removed", gone["name"], gone["module"])
    ]


def test_llama_tiny_amp_fp32_against_amp_half() -> None:
    a = analysed_report("llama-tiny", "amp-fp32")
    b = analysed_report("llama-tiny", "amp-half")
    counts = diff_reports(a, b).counts()
    expected = _position_counts(a, b)
    assert {k: counts[k] for k in expected} == dict(expected)
    assert counts["added"] == counts["removed"] == 0 and counts["changed"] > 0
    assert diff_reports(a, a).equal


def test_llama_tiny_cuda_against_cpu_pairs_past_a_missing_op() -> None:
    """CPU's capture has no contiguous() in the attention (two fewer nodes): two removed nodes,
    not every later node shifted; the rest is CPU's other lists (pow, rsqrt, cat, and the sum
    by which transformers decides that the all-ones mask can be dropped, as a real run does:
    on CUDA's fp32 list, not on CPU's)."""
    a = analysed_report("llama-tiny", "amp-fp32")
    b = analysed_report("llama-tiny", "amp-fp32", device="cpu")
    counts = diff_reports(a, b).counts()
    ka, kb = Counter((n.module, n.op) for n in a.nodes), Counter((n.module, n.op) for n in b.nodes)
    assert counts["removed"] == sum((ka - kb).values()) == len(a.nodes) - len(b.nodes) == 2
    assert counts["added"] == sum((kb - ka).values()) == 0
    pa = Counter((n.module, n.op, n.policy) for n in a.nodes)
    pb = Counter((n.module, n.op, n.policy) for n in b.nodes)
    assert counts["policy"] == sum((pa - pb).values()) - counts["removed"] == 16
    assert counts["changed"] == counts["policy"]


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_diff_of_saved_reports(tmp_path: Path, opt_pair: tuple[Report, Report]) -> None:
    fa, fb = save(tmp_path, "a.json", opt_pair[0]), save(tmp_path, "b.json", opt_pair[1])
    same = invoke("diff", fa, fa)
    assert same.exit_code == 0, same.output
    assert same.stdout.splitlines()[2] == "no changes in the dtype flow (542 graph nodes)"
    differ = invoke("diff", fa, fb, "--format", "json")
    assert differ.exit_code == 1 and "Error" not in differ.output
    data = json.loads(differ.stdout)
    assert data["schema"] == "ampgraph.diff" and data["equal"] is False
    assert data["counts"] == diff_reports(*opt_pair).counts()
    md = invoke("diff", fa, fb, "--format", "markdown")
    assert md.exit_code == 1 and md.stdout.startswith("### ampgraph diff: the dtype flow changes")


def test_cli_diff_of_two_settings_of_one_model() -> None:
    result = invoke("diff", "llama-tiny", "-s", "amp-fp32", "-s", "amp-half")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "A: llama-tiny amp-fp32 (autocast cuda bf16, parameters fp32)"
    assert lines[1] == "B: llama-tiny amp-half (autocast cuda bf16, parameters bf16)"
    a = analysed_report("llama-tiny", "amp-fp32")
    b = analysed_report("llama-tiny", "amp-half")
    assert lines[2] == diff_text(diff_reports(a, b)).splitlines()[2]


def test_v1_and_v2_reports_compare(tmp_path: Path) -> None:
    b = rep(node("r", "aten.relu"))
    old = b.to_dict()
    old["version"] = 1
    del old["pass"], old["backward"]
    result = invoke("diff", save(tmp_path, "v1.json", old), save(tmp_path, "v2.json", b))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["a", "b", "c"], 2, "give at most two models or reports: A and B"),
        (["-s", "fp32", "-s", "half", "-s", "amp-half"], 2, "give --setting at most twice"),
        ([], 2, "nothing to compare: give two models or reports (A B), or an option twice"),
        (["REPORT", "REPORT", "-s", "fp32"], 2, "A and B are saved reports: --setting cannot"),
        (["REPORT", "V3"], 1, "v3.json: not an ampgraph.report v2 report (found "),
        (["REPORT", "TWO"], 1, "two.json holds 2 reports: diff one setting"),
        (["REPORT", "BROKEN"], 1, "broken.json: cannot be read as JSON"),
        (["REPORT", "TRAIN"], 1, "A is a forward pass and B a train pass: analyse both with"),
        (["-s", "nonsense", "-s", "fp32"], 2, "Invalid value for '--setting': malformed setting"),
    ],
)
def test_cli_diff_errors_are_one_line(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    r = rep(node("r", "aten.relu"))
    train = r.to_dict() | {"pass": "train"}
    files = {
        "REPORT": save(tmp_path, "r.json", r),
        "V3": save(tmp_path, "v3.json", r.to_dict() | {"version": 3}),
        "TWO": save(tmp_path, "two.json", [r.to_dict(), r.to_dict()]),
        "TRAIN": save(tmp_path, "train.json", train),
        "BROKEN": tmp_path / "broken.json",
    }
    files["BROKEN"].write_text("{not json")
    result = invoke("diff", *[files.get(a, a) for a in args])
    assert result.exit_code == code, result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1 and message in error_lines[0], result.output
    assert "Traceback" not in result.output


# -- the baseline ------------------------------------------------------------------------------


def test_baseline_round_trip_is_lossless_for_the_diff(opt_pair: tuple[Report, Report]) -> None:
    a, b = opt_pair
    text = baseline_file(baseline_record(a))
    # One line per node, with no graph-position names in them.
    lines = text.splitlines()
    assert len(lines[lines.index(' "nodes": [') + 1 : lines.index(" ]")]) == len(a.nodes)
    assert '"linear_3"' not in text
    base = read_baseline(text)
    assert check_report(base, a).equal
    assert check_report(base, b).counts() == diff_reports(a, b).counts()


def test_baseline_write_check_accept(tmp_path: Path) -> None:
    path = tmp_path / "gate" / "llama.json"
    written = invoke("baseline", "write", path, "llama-tiny", "-s", "amp-fp32")
    assert written.exit_code == 0, written.output
    assert written.stdout.startswith(f"{path}: ")
    ok = invoke("baseline", "check", path)
    assert ok.exit_code == 0, ok.output
    assert "the dtype flow of llama-tiny amp-fp32 (cuda bf16) matches" in ok.stdout
    # Someone's change turns one op's output bf16: the gate fails with the diff, in one line.
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if '"op": "aten.linear.default"' in line)
    lines[i] = lines[i].replace('"out": ["bfloat16"]', '"out": ["float32"]')
    path.write_text("\n".join(lines) + "\n")
    failed = invoke("baseline", "check", path, "--format", "markdown")
    assert failed.exit_code == 1
    assert "| 1 | 0 | 0 | 0 | 0 | 1 | 0 | 0 | 0 | 0 |" in failed.stdout
    errors = [line for line in failed.output.splitlines() if line.startswith("Error")]
    assert errors == [
        (
            f"Error: the dtype flow of llama-tiny amp-fp32 (cuda bf16) no longer matches {path}: "
            f"1 change; accept it with 'ampgraph baseline check {path} --update'"
        )
    ]
    accepted = invoke("baseline", "check", path, "--update")
    assert accepted.exit_code == 0, accepted.output
    assert invoke("baseline", "check", path).exit_code == 0
    # A saved baseline is a side of 'ampgraph diff' too.
    assert invoke("diff", path, "llama-tiny").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["MISSING"], "no baseline at "),
        (["BASE", "opt-125m"], "is the baseline of llama-tiny amp-fp32, not of opt-125m amp-fp32"),
        (["BASE", "-s", "amp-half"], "is the baseline of llama-tiny amp-fp32, not of llama-tiny "),
        (["REPORT"], "r.json is an ampgraph.report, not a baseline: write one with"),
        (["V9"], "v9.json is a baseline of version 9; this ampgraph reads version 1"),
        (["DAMAGED"], "damaged.json is a damaged baseline (KeyError 'nodes')"),
        (["BROKEN"], "broken.json is not JSON"),
    ],
)
def test_baseline_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    base = baseline_file(baseline_record(rep(node("r", "aten.relu"), model="llama-tiny")))
    files = {
        "MISSING": tmp_path / "missing.json",
        "BASE": tmp_path / "base.json",
        "REPORT": save(tmp_path, "r.json", rep(node("r", "aten.relu"))),
        "V9": tmp_path / "v9.json",
        "DAMAGED": tmp_path / "damaged.json",
        "BROKEN": tmp_path / "broken.json",
    }
    files["BASE"].write_text(base)
    files["V9"].write_text(base.replace('"version": 1', '"version": 9'))
    data = json.loads(base)
    del data["nodes"]
    files["DAMAGED"].write_text(json.dumps(data))
    files["BROKEN"].write_text("nodes:")
    result = invoke("baseline", "check", *[files.get(a, a) for a in args])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and message in errors[0], result.output


def test_baseline_of_a_config_is_checked_against_its_next_revision(tmp_path: Path) -> None:
    """The spec as given (a config path) is what the check analyses again, not the report's
    display name; a revision that drops OPT's final layer norm (post-LN) is three removed nodes."""
    config = tmp_path / "config.json"
    source = (
        Path(__file__).parent.parent / "src" / "ampgraph" / "model" / "configs" / "opt-125m.json"
    )
    data = json.loads(source.read_text())
    config.write_text(json.dumps(data))
    path = tmp_path / "opt.json"
    assert invoke("baseline", "write", path, config, "-s", "amp-fp32").exit_code == 0
    assert json.loads(path.read_text())["spec"] == str(config)
    assert invoke("baseline", "check", path).exit_code == 0
    config.write_text(json.dumps(data | {"do_layer_norm_before": False}))
    failed = invoke("baseline", "check", path)
    assert failed.exit_code == 1
    assert "542 → 539 graph nodes: 0 changed, 0 added, 3 removed; casts +0 −0" in failed.stdout
    assert "  - model.decoder.final_layer_norm.weight placeholder: out fp32" in failed.stdout


def test_unwritable_baseline_and_one_saved_report_are_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("baseline", "write", blocker / "sub" / "b.json", "llama-tiny")
    assert result.exit_code == 1 and "Error: cannot write the baseline to " in result.output
    saved = save(tmp_path, "r.json", rep(node("r", "aten.relu")))
    result = invoke("diff", saved, "--device", "cuda", "--device", "cpu")
    assert result.exit_code == 2
    assert (
        f"Error: {saved} is a saved report: --device cannot change what it holds" in result.output
    )


def test_diff_and_baseline_import_no_torch() -> None:
    """Both work on saved reports where torch is not installed (a CI job that only compares)."""
    import subprocess
    import sys

    code = (
        "import sys, ampgraph.review.diff, ampgraph.review.baseline; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- hostile files: one line, never a traceback (as tests/test_fuzz_cli.py does for the others) --

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 64) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip
NODE = st.fixed_dictionaries(
    {"op": JSON | st.just("aten.relu"), "module": JSON | st.just("fc")},
    optional={"in": JSON, "casts": JSON, "out": JSON, "kind": JSON, "target": JSON,
              "policy": JSON, "promotion": JSON, "error": JSON},
)  # fmt: skip


@settings(max_examples=int(os.environ.get("AMPGRAPH_FUZZ_EXAMPLES", "25")), deadline=None,
          derandomize="AMPGRAPH_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    kind=st.sampled_from(["ampgraph.report", "ampgraph.baseline"]),
    nodes=st.lists(NODE, max_size=3) | JSON,
    extra=st.dictionaries(st.sampled_from(["version", "setting", "model", "nodes"]), JSON),
)
def test_hostile_saved_files(tmp_path: Path, kind: str, nodes: object, extra: dict) -> None:
    good = json.loads(baseline_file(baseline_record(rep(node("r", "aten.relu")))))
    data = (good if kind == "ampgraph.baseline" else rep(node("r", "aten.relu")).to_dict()) | {
        "nodes": nodes,
        **extra,
    }
    path = save(tmp_path, "hostile.json", data)
    result = invoke("diff", path, path)
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if result.exit_code == 1 and result.stdout == "":
        assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output


# -- what if: --keep-fp32 --------------------------------------------------------------------


#: The preview of a cuda setting needs a torch that traces fake CUDA tensors (DESIGN.md fact 4).
needs_cuda_build = pytest.mark.skipif(
    not __import__("torch").backends.cuda.is_built(), reason="a CPU-only build of torch"
)


@pytest.fixture(scope="module")
def fc2_in_fp32() -> tuple[Report, Report]:
    from ampgraph.review.whatif import preview_keep_fp32

    return preview_keep_fp32("opt-125m", "amp-fp32", ["model.decoder.layers.*.fc2"])


@needs_cuda_build
def test_keep_fp32_preview_of_opt_fc2(fc2_in_fp32: tuple[Report, Report]) -> None:
    a, b = fc2_in_fp32
    assert b.check is not None and b.check["disagreements"] == 0  # the dispatcher agrees
    d = diff_reports(a, b)
    counts = d.counts()
    fc2 = [n for n in a.nodes if n.module and n.module.endswith(".fc2")]
    assert len(fc2) == 12 and all(n.policy == "lower_precision_fp" for n in fc2)
    # Each fc2 linear loses its policy and autocast's casts of its weight and bias (its input
    # arrives in bf16 from fc1 and the relu; the region's own .float() is a node of its own).
    assert counts["policy"] == len(fc2)
    assert counts["casts_removed"] == sum(len(n.casts) for n in fc2) == 24
    # Added: per region the wrap_with_autocast node, the .float() and the getitem of its result.
    added = Counter(c.op for c in d.changes if c.change == "added")
    assert added == {"higher_order.wrap_with_autocast": 12, "aten.to.dtype": 12, "getitem": 12}
    assert counts["added"] == len(b.nodes) - len(a.nodes) and counts["removed"] == 0
    # The residual add after fc2 no longer promotes: both of its inputs are fp32 now.
    assert counts["promotion"] == sum(n.promotion is not None for n in a.nodes) // 2 == 12


@needs_cuda_build
def test_cli_keep_fp32() -> None:
    result = invoke("diff", "llama-tiny", "-s", "amp-half", "--keep-fp32", "model.norm")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert (
        lines[1]
        == "B: llama-tiny [model.norm in fp32] amp-half (autocast cuda bf16, parameters bf16)"
    )
    assert "  + mul_22 higher_order.wrap_with_autocast: in bf16, bf16; out fp32" in lines
    for args, message in [
        (["--keep-fp32", "nothing", "llama-tiny"], "Error: no module matches 'nothing'"),
        (["-s", "fp32", "--keep-fp32", "x"], "fp32 has no autocast to disable"),
        (["-s", "amp-fp32", "-s", "amp-half", "--keep-fp32", "x"], "compares one model in one"),
    ]:
        failed = invoke("diff", *args)
        assert failed.exit_code in (1, 2) and message in failed.output, failed.output


# -- policy drift: --tables RELEASE ------------------------------------------------------------


def norm_after_linear():  # type: ignore[no-untyped-def]
    """A Linear's bf16 output into torch's own RMSNorm: what torch 2.12's fp32 entry changes."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))


@needs_cuda_build
def test_rms_norm_under_the_tables_of_torch_2_11_and_2_14() -> None:
    import torch

    from ampgraph.pipeline.stages import analyze

    old, new = (
        analyze(norm_after_linear(), "amp-fp32", args=(torch.randn(2, 8),), tables=t)
        for t in ("2.11", "2.14")
    )
    a, b = old.node("rms_norm"), new.node("rms_norm")
    # 2.11 has no entry for rms_norm: it runs in its bf16 input's dtype; 2.14 casts the input
    # to fp32 (the weight is fp32 already).
    assert (a.outputs, [c.node for c in a.casts]) == (["bfloat16"], [])
    assert (b.outputs, [c.node for c in b.casts]) == (["float32"], ["linear"])
    assert (old.versions["policy_tables"], new.versions["policy_tables"]) == ("2.11", "2.14")
    # The older side is a prediction for 2.11: this dispatcher is 2.14's, so it is not checked.
    assert old.check is None and "policy tables of torch 2.11" in old.capture["check_unavailable"]
    assert new.check is not None and new.check["disagreements"] == 0
    d = diff_reports(old, new)
    assert [c.op for c in d.changes] == ["aten.rms_norm.default", "output"]
    assert d.a["tables"] == "2.11" and "torch 2.11's lists" in diff_text(d).splitlines()[0]


def test_tables_of_a_release_the_history_does_not_reach() -> None:
    import torch

    from ampgraph.errors import SettingError
    from ampgraph.pipeline.stages import analyze

    with pytest.raises(SettingError, match="reach back to torch 2.6 and up to 2.14, not 2.5"):
        analyze(torch.nn.Linear(2, 2), "amp-fp32", args=(torch.randn(1, 2),), tables="2.5")
    result = invoke("diff", "--tables", "2.5", "--tables", "2.14")
    assert result.exit_code == 2 and "not 2.5" in result.output
    result = invoke("diff", "--tables", "2.11", "--move-op", "gelu=fp32")
    assert result.exit_code == 2 and "--tables compares two releases' lists" in result.output


@needs_cuda_build
@pytest.mark.parametrize("setting", ["amp-fp32", "amp-half"])
def test_hugging_face_llama_is_immune_to_the_rms_norm_drift(setting: str) -> None:
    # transformers' LlamaRMSNorm computes in fp32 by hand (pow, mean, rsqrt): no aten.rms_norm.
    result = invoke("--no-cache", "diff", "llama-tiny", "-s", setting, "--tables", "2.11",
                    "--tables", "2.14")  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # The graph's size is transformers' (5.24 dropped the rotary embedding's no_grad region).
    nodes = len(analysed_report("llama-tiny", setting).nodes)
    assert lines[2] == f"no changes in the dtype flow ({nodes} graph nodes)"
    assert lines[0].endswith("torch 2.11's lists)") and lines[1].endswith("torch 2.14's lists)")
    assert "note: A is a prediction for torch 2.11" in result.stdout


@needs_cuda_build
def test_llama_with_torch_rms_norm_moves_to_fp32_between_2_11_and_2_14() -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "llama_torch_rmsnorm.py"
    result = invoke("diff", f"{example}:build", "-s", "amp-half", "--tables", "2.11",
                    "--tables", "2.14", "--format", "json")  # fmt: skip
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    counts = data["counts"]
    assert (counts["changed"], counts["added"], counts["removed"]) == (17, 0, 0)
    norms = [c for c in data["changes"] if c["op"] == "aten.rms_norm.default"]
    # The five RMSNorms: bf16 under 2.11's lists, fp32 under 2.14's (input and weight cast).
    assert len(norms) == 5
    assert all({"field": "outputs", "before": "bf16", "after": "fp32"} in c["fields"]
               for c in norms)  # fmt: skip
    # 21 casts: each norm's input and weight (10), and the fp32 result back to bf16 at the ten
    # projections after a norm (q, k, v, gate, up in two layers) and lm_head.
    assert (counts["casts_added"], counts["casts_removed"]) == (21, 0)
    assert sum(len(c["casts_added"]) for c in norms) == 10


BLOCKS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, x):
        return x + self.norm(self.fc(x))


def build():
    return nn.Sequential(Block(), Block()), torch.randn(2, 16)
"""


def test_diff_takes_the_model_options_every_command_takes(tmp_path: Path) -> None:
    """--module (and --config, --model-dir, --tracer, --timeout: one option group) name the
    model both sides analyse; with A B too it is a usage error."""
    factory = tmp_path / "blocks.py"
    factory.write_text(BLOCKS)
    spec = f"{factory}:build"
    result = CliRunner().invoke(main, ["diff", "--module", spec, "-s", "fp32", "-s", "amp-fp32"])
    assert result.exit_code == 1, result.output  # they differ
    lines = result.output.splitlines()
    assert lines[0] == f"A: {spec} fp32 (no autocast, parameters fp32)"
    assert "0.fc" in lines and "casts +8 −0" in lines[2]
    both = CliRunner().invoke(main, ["diff", "gpt2", "--module", spec, "-s", "fp32"])
    assert both.exit_code == 2 and "not both" in both.output
    helps = [CliRunner().invoke(main, [c, "--help"]).output for c in ("diff", "table")]
    for option in ("--config", "--model-dir", "--module", "--tracer", "--timeout"):
        assert all(option in h for h in helps), option
