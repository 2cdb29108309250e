"""The real-GPU survey's CPU path, as CI runs it: a small slice, from the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_survey_runs_a_slice_on_the_cpu_and_writes_its_record_and_page(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_survey.py"), "--device", "cpu",
         "--cases", "pad-finfo-min,cross-entropy", "--settings", "half,amp-fp32",
         "--amp-dtypes", "bf16", "--ops", "addmm", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "cpu-survey.json").read_text())
    assert record["schema"] == "ampgraph.gpu_survey" and record["ok"]
    runs = {(r["case"], r["setting"]): r for r in record["cases"]}
    assert sorted(runs) == [("cross-entropy", "amp-fp32"), ("cross-entropy", "half"),
                            ("pad-finfo-min", "amp-fp32"), ("pad-finfo-min", "half")]  # fmt: skip
    # The real kernel raises on the scalar beyond bf16's range; ampgraph says so too.
    line = runs[("pad-finfo-min", "half")]["eager_hooks"][-1]
    assert "value cannot be converted to type c10::BFloat16 without overflow" in line
    assert record["ops"]["variants"] > 0 and record["ops"]["parting"] == []
    page = (tmp_path / "cpu-survey.md").read_text()
    assert "**Cases**: 4 of 4 runs agree" in page
    assert "| pad-finfo-min | scalar range | bf16 | half |" in page


def test_an_op_that_kills_its_process_is_a_finding_and_the_ops_pass_goes_on(
    tmp_path: Path,
) -> None:
    """A CUDA kernel that faults poisons its process (every later call fails): the ops run in a
    worker the survey restarts after the op it died on (the H100 run of 2026-11-26 lost its
    record so)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "AMPGRAPH_SURVEY_DIE_AT": "addmm"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_survey.py"), "--device", "cpu",
         "--cases", "pdist", "--settings", "half", "--amp-dtypes", "bf16",
         "--ops", "addmm,addmv", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    ops = json.loads((tmp_path / "cpu-survey.json").read_text())["ops"]
    assert [(p["op"], p["kind"]) for p in ops["parting"]] == [("addmm", "crash")]
    # addmm.decomposed and addmv come after the op that died: the restarted worker surveys them.
    assert ops["visited"] == ops["of"] == 3 and ops["variants"] > 0
    assert "addmm: its process died" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the survey would run")
def test_gpu_survey_without_a_gpu_says_so() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_survey.py")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "no CUDA device here" in proc.stderr


def test_gpu_survey_verifies_the_zoo_slice_it_is_given(tmp_path: Path) -> None:
    """The zoo slice (tests/data/zoo_slice.json, issue 42) runs as cases against the real kernels;
    a slice of the cases runs no zoo unless ``--zoo`` names types."""
    pytest.importorskip("transformers", reason="needs transformers")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_survey.py"), "--device", "cpu",
         "--cases", "pdist", "--settings", "amp-fp32", "--amp-dtypes", "bf16",
         "--zoo", "llama", "--ops", "none", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "cpu-survey.json").read_text())
    runs = {(r["case"], r["setting"]): r for r in record["cases"]}
    assert sorted(runs) == [("pdist", "amp-fp32"), ("zoo/llama", "amp-fp32")]
    zoo = runs[("zoo/llama", "amp-fp32")]
    assert zoo["ok"] and zoo["klass"] == "transformers zoo" and "agree" in zoo["summary"]


def test_gpu_survey_proves_the_compiled_plan_on_the_devices_generated_code(tmp_path: Path) -> None:
    """The compiled slice, on the CPU's C++ backend here (the Triton one where a GPU is at hand):
    the gelu chain's plan held against the code Inductor generated and the outputs it gave."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_survey.py"), "--device", "cpu",
         "--cases", "pad-finfo-min", "--settings", "amp-fp32", "--amp-dtypes", "bf16",
         "--ops", "none", "--compiled", "gelu_chain", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "cpu-survey.json").read_text())
    [row] = record["compiled"]
    assert row["backend"] == "cpp" and row["disagreements"] == [] and row["ok"]
    assert row["dropped"] == ["gelu", "mul"] and row["emulation_changes_output"]
    assert row["gap"] > 1e-6 >= row["gap_emulate"]  # the dropped roundings, and their cure
    page = (tmp_path / "cpu-survey.md").read_text()
    assert "| gelu_chain | amp-fp32 | bfloat16 | cpp | gelu, mul |" in page
