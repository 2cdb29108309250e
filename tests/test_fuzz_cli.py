"""Hostile but realistic input to the command line (issue 11): whatever a user gives, the answer is
output and exit 0, or one ``Error:`` line (or click's usage message) with exit 1 or 2, never a
traceback. Hypothesis makes the inputs; the files are written by the tests themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampgraph.cli import main

# AMPGRAPH_FUZZ_EXAMPLES=500 for a longer hunt; the suite runs 25 of each, the same every time.
FUZZ = settings(
    max_examples=int(os.environ.get("AMPGRAPH_FUZZ_EXAMPLES", "25")),
    deadline=None,  # a loaded 2-core machine must not make it flaky
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize="AMPGRAPH_FUZZ_EXAMPLES" not in os.environ,  # a failure in CI reproduces
)


def _invoke(args: list[str], tmp: Path) -> Result:
    env = {"AMPGRAPH_CACHE_DIR": str(tmp / "cache")}
    return CliRunner().invoke(main, args, env=env, catch_exceptions=True)


def _one_line_or_success(result: Result) -> None:
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output
    if result.exit_code:
        # click's usage errors print the usage first; the last line is always the Error line.
        last = result.output.strip().splitlines()[-1]
        assert last.startswith("Error: "), result.output
        assert isinstance(result.exception, SystemExit), repr(result.exception)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 64) | st.floats(-2, 2) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
CONFIG_KEYS = st.sampled_from([
    "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
    "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "architectures",
])  # fmt: skip
LLAMA_TINY = {
    "model_type": "llama", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
    "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 32,
}  # fmt: skip


@FUZZ
@given(changes=st.dictionaries(CONFIG_KEYS, JSON_VALUES, min_size=1, max_size=3))
def test_configs(tmp_path: Path, changes: dict) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_TINY, **changes}))
    _one_line_or_success(
        _invoke(["table", "--config", str(path), "-s", "fp32", "--no-check"], tmp_path)
    )


@FUZZ
@given(raw=st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_config_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    _one_line_or_success(_invoke(["check", "--config", str(path), "-s", "fp32"], tmp_path))


SETTING_TEXT = st.lists(
    st.sampled_from(["autocast", "params", "dtype", "device", "x", ""])
    .flatmap(lambda k: st.sampled_from(["on", "off", "fp16", "bf16", "fp32", "cpu", "tpu", "", "=", "1.5"]).map(lambda v: f"{k}={v}"))
    | st.sampled_from(["fp32", "half", "amp-fp32", "amp-half", "amp", ",", " "]),
    max_size=4,
).map(",".join)  # fmt: skip


@FUZZ
@given(text=SETTING_TEXT)
def test_settings(tmp_path: Path, text: str) -> None:
    args = ["table", "llama-tiny", "--device", "cpu", "--no-check", "-s", text]
    _one_line_or_success(_invoke(args, tmp_path))


REPORT_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "schema": st.sampled_from(["ampgraph.report", "x"]) | JSON_VALUES,
        "version": st.sampled_from([1, 2]) | JSON_VALUES,
        "model": JSON_VALUES,
        "setting": JSON_VALUES | st.just({"name": "fp32", "device_type": "cuda"}),
        "versions": JSON_VALUES,
        "capture": JSON_VALUES,
        "nodes": JSON_VALUES | st.lists(JSON_VALUES, max_size=2),
        "modules": JSON_VALUES,
    },
)


@FUZZ
@given(report=REPORT_FIELDS | JSON_VALUES)
def test_report_files(tmp_path: Path, report: object) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    args = ["render", "--report", str(path), "--format", "dot", "--out", str(tmp_path / "out")]
    _one_line_or_success(_invoke(args, tmp_path))


@FUZZ
@given(entry=JSON_VALUES.map(json.dumps) | st.text(max_size=20))
def test_cache_entries(tmp_path: Path, entry: str) -> None:
    args = ["table", "llama-tiny", "--device", "cpu", "-s", "fp32"]
    first = _invoke(args, tmp_path)
    for path in (tmp_path / "cache" / "reports").glob("*.json"):
        path.write_text(entry)
    again = _invoke(args, tmp_path)
    assert again.exit_code == 0 and again.output == first.output


#: A factory that leaves MARKER beside it when imported: the proof that a baseline ran code.
HOSTILE_FACTORY = """\
import pathlib

pathlib.Path(__file__).with_name("MARKER").write_text("a data file ran this")


def build():
    raise SystemExit("never")
"""
NOT_JSON = st.sampled_from([float("nan"), float("inf"), float("-inf")])
BASELINE_HEADERS = st.fixed_dictionaries(
    {},
    optional={
        # Code in every form a spec can name it, and what a baseline may name instead.
        "spec": st.sampled_from([
            "hostile_model.py:build", "hostile_model:build", "hostile_model.py",
            "./hostile_model.py:build", "llama-tiny", "LLAMA-TINY", "config.json", ".", "",
        ]) | JSON_VALUES,
        "spec_kind": st.sampled_from(["module", "auto", "bundled", "config", "dir", "plugin"])
        | JSON_VALUES,
        # Only the default of the valid tracers: each other one would be an analysis of its own.
        "tracer": st.sampled_from(["make-fx", "jit"]) | JSON_VALUES,
        "model": st.sampled_from(["llama-tiny", "hostile_model.py:build"]) | JSON_VALUES,
        "setting": JSON_VALUES,
        "seq_len": st.sampled_from([8, 0, -1, "8", 8.5, True]) | NOT_JSON,
        "version": st.sampled_from([1, 2]) | JSON_VALUES,
        "nodes": JSON_VALUES
        | st.lists(
            st.fixed_dictionaries(
                {"op": st.just("aten.relu") | JSON_VALUES},
                optional={"out": st.lists(st.just("float32") | NOT_JSON | JSON_VALUES, max_size=2),
                          "in": JSON_VALUES, "casts": JSON_VALUES, "kind": JSON_VALUES},
            ),
            max_size=2,
        ),
        "versions": JSON_VALUES,
        "method": JSON_VALUES,
    },
)  # fmt: skip


@FUZZ
@given(header=BASELINE_HEADERS)
def test_baseline_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: dict[str, object]
) -> None:
    """A baseline is data: whatever its header says, checking it is output or one Error line,
    and the code it names never runs (the spec, under every kind, names a file that would leave
    MARKER)."""
    from ampgraph.report.records import NodeRecord, Report
    from ampgraph.formats.json import baseline_file
    from ampgraph.review.baseline import baseline_record

    monkeypatch.chdir(tmp_path)  # relative specs find the hostile file, and nothing else
    (tmp_path / "hostile_model.py").write_text(HOSTILE_FACTORY)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_TINY))
    setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
               "amp_dtype": "bfloat16", "param_dtype": "float32"}  # fmt: skip
    good = json.loads(baseline_file(baseline_record(Report(
        "llama-tiny", setting, {}, {}, [NodeRecord("r", "aten.relu", "op", outputs=["float32"])], []
    ))))  # fmt: skip
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(good | header))  # NaN and Infinity as Python writes them
    for args in (["baseline", "check", str(path)], ["diff", str(path), str(path)]):
        _one_line_or_success(_invoke(args, tmp_path))
        assert not (tmp_path / "MARKER").exists(), f"{args} ran code a baseline named: {header}"


@FUZZ
@given(spec=st.text(max_size=30))
def test_model_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.chdir(tmp_path)  # relative specs must not find anything of the repository's
    _one_line_or_success(
        _invoke(["table", "--", spec] if spec.startswith("-") else ["table", spec], tmp_path)
    )


def test_workers_end_with_their_parent(tmp_path: Path) -> None:
    """Killing ampgraph (SIGKILL: no handler runs) must not leave its workers computing."""
    code = (
        "import multiprocessing as mp, os, time\n"
        "from ampgraph.pipeline.stages import die_with_parent\n"
        "def work(parent):\n"
        "    die_with_parent(parent)\n"
        "    time.sleep(60)\n"
        "p = mp.get_context('fork').Process(target=work, args=(os.getpid(),))\n"
        "p.start()\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    end = time.monotonic() + 30  # a moment, or longer on a loaded machine
    while time.monotonic() < end:
        status = Path(f"/proc/{worker}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"worker {worker} outlived its parent")
