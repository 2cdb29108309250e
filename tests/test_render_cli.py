"""``ampgraph render`` as a user meets it: files written, paths printed, exit codes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampgraph.cli import main

FIXTURE = Path(__file__).parent / "data" / "opt-125m-amp-fp32.json"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_render_a_saved_report_as_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Graphviz: --format dot still works
    code, out = run("render", "--report", str(FIXTURE), "--format", "dot", "--out", str(tmp_path))
    assert code == 0, out
    assert out.splitlines() == [str(tmp_path / "opt-125m-cuda-bf16-amp-fp32.dot")]
    assert (tmp_path / "opt-125m-cuda-bf16-amp-fp32.dot").read_text().startswith("digraph")


def test_a_saved_report_is_drawn_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from click.testing import CliRunner; from ampgraph.cli import main; "
        f"r = CliRunner().invoke(main, ['render', '--report', {str(FIXTURE)!r}, '-f', 'dot', "
        f"'--out', {str(tmp_path)!r}]); "
        "print(r.exit_code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_missing_dot_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out = run("render", "--report", str(FIXTURE), "--out", str(tmp_path / "out"))
    assert code == 1
    assert out.startswith("Error: Graphviz's dot was not found on PATH: install Graphviz")
    assert "--format dot" in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--view", "graph"),
        ("--format", "gif"),
        ("--theme", "sepia"),
        ("--report", "no-such-file.json"),
        ("--report", str(FIXTURE), "-s", "amp-fp32"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], tmp_path: Path) -> None:
    code, _ = run("render", "--out", str(tmp_path), *args)
    assert code == 2


def test_a_file_that_is_no_report_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    code, out = run("render", "--report", str(bad), "--format", "dot", "--out", str(tmp_path))
    assert code == 2 and "not an ampgraph.report v2 report" in out


def test_help_teaches_with_examples() -> None:
    code, out = run("render", "--help")
    assert code == 0
    assert "Examples:" in out and "ampgraph render --format dot" in out
    for option in ("--out", "--format", "--view", "--unfold", "--theme", "--no-check"):
        assert option in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_no_arguments_draws_the_seed_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = run("render", "--no-check")
    assert code == 0, out
    assert out.splitlines() == [
        f"ampgraph-out/opt-125m-cuda-bf16-{name}.svg"
        for name in ("fp32", "half", "amp-half", "amp-fp32", "overview")
    ]
    for line in out.splitlines():
        assert (tmp_path / line).read_text().lstrip().startswith("<?xml")
