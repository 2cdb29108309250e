"""Safe in a pull request: standard output carries only what the command prints, and nothing a
model does or a user mistypes ends a command silently, with status 0, or never.

The model's own code is hostile here: modules written by the tests print at import, in their
factory and in ``forward``, end the process with ``os._exit(0)`` or never return. The commands
run in fresh interpreters (as a user's shell starts them: buffered stdout, torch not imported,
so ``render``'s analysis runs in a process of its own), except for the usage errors, which need
no process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampgraph.cli import main
from tests.terminal import gone

FIXTURE = Path(__file__).parent / "data" / "opt-125m-amp-fp32.json"

NOISY = """
    import os, warnings
    import torch

    print("printed at import")
    os.write(1, b"written on fd 1 at import\\n")  # below Python, as a C extension would


    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x):
            print("printed in forward")
            warnings.warn("warned in forward")
            return self.norm(self.linear(x))


    def build():
        print("printed in the factory")
        return Noisy(), torch.randn(2, 4)
"""

EXITING = """
    import os


    def build():
        os._exit(0)
"""

NEVER_RETURNS = """
    import pathlib, time
    import torch


    class Stuck(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            pathlib.Path(__file__).with_suffix(".reached").touch()
            {wait}
            return self.linear(x)


    def build():
        return Stuck(), torch.randn(2, 4)
"""


def module(tmp_path: Path, name: str, source: str) -> str:
    """Write ``source`` to ``tmp_path/name.py``; the ``--module`` spec of its factory."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:build"


def ampgraph(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m ampgraph ARGS`` in a fresh interpreter, with a cache of its own.

    Without PYTHONUNBUFFERED (which a test runner may set): a user's shell leaves stdout
    block-buffered, where output that is written late lands after what was flushed first.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["AMPGRAPH_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-m", "ampgraph", *args], capture_output=True, text=True, timeout=120,
        env=env, cwd=tmp_path, check=False,
    )  # fmt: skip


# -- stdout carries only what the command prints ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "parse"),
    [
        # Two settings: the forward is traced in the forked workers too.
        (["table", "-s", "fp32", "-s", "amp-fp32", "--format", "json"], json.loads),
        (["audit", "-s", "amp-fp32", "--format", "sarif"], json.loads),
        (["verify", "--device", "cpu", "-s", "amp-fp32", "--format", "json"], json.loads),
        # The analysis in a process of its own, where the machine has two cores.
        (["render", "-s", "fp32", "--format", "dot", "--out", "out"], str.splitlines),
    ],
    ids=["table-json", "audit-sarif", "verify-json", "render"],
)
def test_what_a_model_prints_goes_to_stderr(
    tmp_path: Path, args: list[str], parse: Callable[[str], object]
) -> None:
    spec = module(tmp_path, "noisy", NOISY)
    done = ampgraph(tmp_path, *args, "--module", spec)
    assert done.returncode == 0, done.stderr
    parsed = parse(done.stdout)  # valid JSON, or the paths written and nothing else
    if args[0] == "render":
        assert isinstance(parsed, list) and parsed, done.stdout
        assert all((tmp_path / line).is_file() for line in parsed), done.stdout
    for said in ("printed at import", "written on fd 1 at import", "printed in the factory",
                 "printed in forward"):  # fmt: skip
        assert said in done.stderr and said not in done.stdout


# -- a closed stdout, a closed pipe -----------------------------------------------------------


@pytest.mark.parametrize("args", [["models"], ["table", "-s", "fp32"]], ids=["models", "table"])
def test_a_closed_stdout_is_one_error_line(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -m ampgraph "$@" >&-', sys.executable, *args],
        stderr=subprocess.PIPE, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == "Error: cannot write to standard output (closed)\n"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``ampgraph ... | head -1``: the reader goes away while the command still writes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampgraph", "audit", "--report", str(FIXTURE), "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert os.read(proc.stdout.fileno(), 10)  # far less than the 80 kB it writes
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and err == b""


# -- nothing silently ignored -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "given"),
    [
        (["render", "gpt2", "--format", "dot"], "MODEL"),
        (["render", "--config", "config.json", "--format", "dot"], "--config"),
        (["audit", "--module", "model.py:build"], "--module"),
        (["audit", "--model-dir", "."], "--model-dir"),
    ],
)
def test_a_model_and_a_report_exclude_each_other(
    args: list[str], given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where render would draw
    result = CliRunner().invoke(main, [*args, "--report", str(FIXTURE)])
    assert result.exit_code == 2, result.output
    assert f"Error: {given} and --report exclude each other" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing drawn


def test_an_analysis_option_does_not_apply_to_a_report() -> None:
    result = CliRunner().invoke(main, ["audit", "--report", str(FIXTURE), "--device", "cpu",
                                       "--seq-len", "4"])  # fmt: skip
    assert result.exit_code == 2
    assert "--device and --seq-len do not apply to --report" in result.stderr


def test_only_that_matches_no_module_is_an_error_that_lists_the_classes() -> None:
    runner = CliRunner()
    base = ["table", "llama-tiny", "-s", "fp32", "--no-check"]
    result = runner.invoke(main, [*base, "--only", "NoSuchClass"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (
        "Error: --only NoSuchClass matches no module; this model has: Embedding, Linear, "
        "LlamaRMSNorm, LlamaRotaryEmbedding, SiLUActivation\n"
    )
    one_of_two = runner.invoke(main, [*base, "--only", "Linear,Lineer"])
    assert one_of_two.exit_code == 1
    assert one_of_two.stderr.startswith("Error: --only Lineer matches no module; ")
    # A base class matches, as isinstance does; and --only selects lines, which JSON has not.
    assert runner.invoke(main, [*base, "--only", "Module"]).exit_code == 0
    as_json = runner.invoke(main, [*base, "--only", "Linear", "--format", "json"])
    assert as_json.exit_code == 2 and "--format json prints the whole report" in as_json.stderr


# -- a model that ends the process, or never returns ------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["table", "-s", "fp32"], ["render", "-s", "fp32", "--format", "dot", "--out", "out"]],
    ids=["in-the-command", "analysis-process"],
)
def test_a_factory_that_calls_os_exit_is_an_error(tmp_path: Path, command: list[str]) -> None:
    spec = module(tmp_path, "exiting", EXITING)
    done = ampgraph(tmp_path, *command, "--module", spec)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Error: the model's code called os._exit(0) at "), done.stderr
    assert "exiting.py:6" in done.stderr and "Traceback" not in done.stderr


def test_a_process_beside_that_ends_with_status_0_and_no_result_is_an_error() -> None:
    """What exit_refused does not catch (C's exit, a kept reference to os._exit) still is."""
    code = """
        import os
        from ampgraph.errors import AnalysisError
        from ampgraph.pipeline.workers import run_in_fork as beside
        try:
            beside(lambda send: os._exit(0), print, 1, name="analysis")
        except AnalysisError as exc:
            print(exc)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the analysis process ended without a result (exit code 0)\n"


def test_exit_refused_spares_the_processes_own_ends() -> None:
    """A process forked in the block (a pool's worker) still ends; the model's os._exit is an
    error, and os._exit is itself again after the block. In a fresh interpreter: a failure here
    would end the test runner's process."""
    code = """
        import multiprocessing, os
        from ampgraph.model.usercode import ModelExited, exit_refused
        real = os._exit
        with exit_refused():
            child = multiprocessing.get_context("fork").Process(target=print, args=("child",))
            child.start()
            child.join()
            try:
                os._exit(3)
            except ModelExited as exc:
                print(exc)
        print(child.exitcode, os._exit is real)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "child" and lines[-1] == "0 True"
    assert lines[1].startswith("the model's code called os._exit(3) at <string>:")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the processes in /proc")
@pytest.mark.parametrize(
    ("command", "wait"),
    [
        (["table", "-s", "fp32", "-s", "amp-fp32"], "time.sleep(3600)"),  # the workers
        (["render", "-s", "fp32", "--format", "dot", "--out", "out"], "while True: pass"),
    ],
    ids=["in-the-command", "analysis-process"],
)
def test_a_forward_that_never_returns_is_stopped_at_the_timeout(
    tmp_path: Path, command: list[str], wait: str
) -> None:
    spec = module(tmp_path, "stuck", NEVER_RETURNS.replace("{wait}", wait))
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["AMPGRAPH_CACHE_DIR"] = str(tmp_path / "cache")
    # The bound leaves the forward time to start on a loaded 2-core machine (torch imported and
    # the model traced in about 10 s under a load of 6; 20 s was too close).
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampgraph", *command, "--module", spec, "--timeout", "40"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=40 + 120)
    assert proc.returncode == 1 and out == "", err
    assert err == (
        "Error: the analysis did not finish within 40 s (a forward that never returns?); raise "
        "--timeout or check the model\n"
    )
    assert (tmp_path / "stuck.reached").exists()  # the forward was running when it was stopped
    assert time.monotonic() - start < 40 + 60

    assert gone(proc.pid)  # workers end on their parent's SIGTERM, a moment after it


def test_timeout_is_an_option_of_every_command_that_analyses_a_model() -> None:
    runner = CliRunner()
    for command in ("table", "check", "render", "audit", "verify", "diff"):
        help_text = runner.invoke(main, [command, "--help"]).output
        assert "--timeout SECONDS" in help_text, command
    bad = runner.invoke(main, ["table", "--timeout", "-1"])
    assert bad.exit_code == 2
