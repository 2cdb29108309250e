"""A cold ``ampgraph`` process: imports without garbage collection, the analysis in a process
beside the caller, and a quick exit.

All are process-level (issue 13): they run in fresh interpreters here, where torch is not
imported yet, as in a user's shell.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ampgraph.pipeline.run import analyze_spec, frozen_imports
from ampgraph.pipeline.workers import default_workers
from tests.terminal import as_from_a_terminal, gone, session

beside_only = pytest.mark.skipif(
    default_workers() < 2, reason="the analysis runs beside the caller on two cores or more"
)


def python(code: str, *args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(cache)} if cache is not None else None
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip


def test_a_cold_prepare_pauses_collection_then_freezes_the_imports() -> None:
    done = python("""
        import gc, json, sys
        from ampgraph.pipeline import run as pipeline
        assert "torch" not in sys.modules and gc.get_freeze_count() == 0 and gc.isenabled()
        inside = []
        real = pipeline.spec_tracer
        def spy(spec):  # called inside prepare's frozen block, after the model is built
            inside.append(gc.isenabled())
            return real(spec)
        pipeline.spec_tracer = spy
        model = pipeline.prepare("llama-tiny", seq_len=4)
        assert gc.get_threshold() == pipeline.ANALYSIS_GC_THRESHOLDS, gc.get_threshold()
        print(json.dumps([inside, gc.isenabled(), gc.get_freeze_count()]))
    """)
    assert done.returncode == 0, done.stderr
    inside, enabled, frozen = json.loads(done.stdout)
    assert inside == [False] and enabled is True
    # torch and transformers alone make a few hundred thousand objects.
    assert frozen > 100_000


def test_frozen_imports_change_nothing_where_torch_is_loaded_already() -> None:
    import torch  # noqa: F401 - as in a notebook

    before = gc.get_freeze_count(), gc.get_threshold()
    with frozen_imports():
        assert gc.isenabled()
    assert (gc.get_freeze_count(), gc.get_threshold()) == before and gc.isenabled()


def test_the_quick_exit_runs_exit_handlers_flushes_and_keeps_the_status(tmp_path: Path) -> None:
    marker = tmp_path / "atexit-ran"
    script = """
        import atexit, sys
        import torch  # loaded: the command ends with exit_now
        marker = sys.argv[1]
        atexit.register(lambda: open(marker, "w").write("yes"))
        from ampgraph.cli import run
        sys.argv = ["ampgraph", *sys.argv[2:]]
        run()
    """
    # Piped stdout is block-buffered: all of it arrives only if the exit flushes it.
    ok = python(script, str(marker), "models")
    assert ok.returncode == 0, ok.stderr
    assert marker.read_text() == "yes"
    plain = subprocess.run(
        [sys.executable, "-m", "ampgraph", "models"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert ok.stdout == plain.stdout and len(ok.stdout.splitlines()) > 10
    marker.unlink()
    bad = python(script, str(marker), "table", "no-such-model")
    assert bad.returncode == 1 and bad.stderr.startswith("Error: ")
    assert marker.read_text() == "yes"
    usage = python(script, str(marker), "table", "--no-such-option")
    assert usage.returncode == 2 and "No such option" in usage.stderr


def test_exit_now_reads_its_code_as_sys_exit_does() -> None:
    code = """
        import sys
        from ampgraph.cli import exit_now
        print("written", end="")
        exit_now({"none": None, "three": 3}.get(sys.argv[1], sys.argv[1]))
    """
    done = python(code, "stopped here")
    assert (done.returncode, done.stdout, done.stderr) == (1, "written", "stopped here\n")
    assert python(code, "none").returncode == 0
    assert python(code, "three").returncode == 3


@beside_only
def test_a_cold_analysis_runs_beside_a_caller_that_never_imports_torch(tmp_path: Path) -> None:
    code = """
        import json, multiprocessing, os, sys
        from ampgraph.pipeline.run import analysis_beside, analyze_spec
        beside = analysis_beside()
        seen = []
        def meanwhile():  # runs here while the analysis process works
            seen.append([p.name for p in multiprocessing.active_children()])
        reports = analyze_spec("llama-tiny", ["fp32", "amp-fp32"], seq_len=4,
                               meanwhile=meanwhile)
        torch_then = "torch" in sys.modules
        # With nothing to do meanwhile, the analysis runs here: torch stays for the next call.
        analyze_spec("llama-tiny", ["half"], seq_len=4, check=False)
        print(json.dumps({"beside": beside, "seen": seen, "torch": torch_then,
                          "torch_after": "torch" in sys.modules,
                          "reports": [r.to_dict() for r in reports]}))
    """
    done = python(code, cache=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # The reports (plain data: no TorchVersion in them) arrived without importing torch here.
    assert out["beside"] is True and out["torch"] is False and out["torch_after"] is True
    assert out["seen"] == [["ampgraph-analysis"]]
    # They are the reports the analysis gives in one process (torch is loaded in this one).
    here = analyze_spec("llama-tiny", ["fp32", "amp-fp32"], seq_len=4, use_cache=False)
    assert out["reports"] == [json.loads(json.dumps(r.to_dict())) for r in here]
    assert here[1].check is not None and here[1].check["disagreements"] == 0


@beside_only
def test_an_error_in_the_analysis_process_is_raised_in_the_caller(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "opt", "hidden_size": 10,
                                  "num_attention_heads": 3}))  # fmt: skip
    code = """
        import sys
        from ampgraph.errors import ModelSpecError
        from ampgraph.pipeline.run import analyze_spec
        try:
            analyze_spec(sys.argv[1], ["fp32"], meanwhile=lambda: None)
        except ModelSpecError as exc:  # raised there, when transformers refused to build it
            print(exc)
        assert "torch" not in sys.modules
    """
    done = python(code, str(config), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cannot build a 'opt' model from this config")


@beside_only
def test_the_analysis_process_stops_when_the_callers_work_fails(tmp_path: Path) -> None:
    code = """
        import multiprocessing
        from ampgraph.pipeline.run import analyze_spec
        def meanwhile():
            raise LookupError("the caller's own work failed")
        try:
            analyze_spec("llama-tiny", ["fp32"], seq_len=4, meanwhile=meanwhile)
        except LookupError as exc:
            print(exc, multiprocessing.active_children())
    """
    done = python(code, cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the caller's own work failed []"
    assert not list(tmp_path.rglob("*.json"))  # nothing was cached


@beside_only
def test_an_analysis_process_that_dies_is_a_one_line_error(tmp_path: Path) -> None:
    code = """
        import multiprocessing, os, signal
        from ampgraph.errors import AnalysisError
        from ampgraph.pipeline.run import analyze_spec
        def meanwhile():  # as the kernel's out-of-memory killer would
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
        try:
            analyze_spec("llama-tiny", ["fp32"], seq_len=4, meanwhile=meanwhile)
        except AnalysisError as exc:
            print(exc)
    """
    done = python(code, cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "the analysis process ended without a result (killed by SIGKILL: out of memory"
    )


def test_a_worker_leaves_ctrl_c_to_its_parent() -> None:
    """A terminal's Ctrl-C reaches every process of the command; only the parent answers it."""
    code = """
        import multiprocessing as mp, os, signal, time
        from ampgraph.pipeline.workers import die_with_parent
        def work(parent, ready):
            die_with_parent(parent)
            ready.set()  # Ctrl-C is the parent's from here on, however slow the machine
            time.sleep(2)
        ready = mp.get_context("fork").Event()
        p = mp.get_context("fork").Process(target=work, args=(os.getpid(), ready))
        p.start()
        assert ready.wait(120)
        os.kill(p.pid, signal.SIGINT)
        p.join()
        print(p.exitcode)
    """
    done = python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0" and "KeyboardInterrupt" not in done.stderr


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the processes in /proc")
@pytest.mark.parametrize(
    "command",
    [
        ["render", "--out", "figures"],  # Ctrl-C while the analysis process imports torch
        ["table", "--pass", "train"],  # while the workers of an analysis in the command work
    ],
    ids=["analysis-process", "workers"],
)
def test_the_cli_stops_its_workers_on_ctrl_c(tmp_path: Path, command: list[str]) -> None:
    env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    # SIGINT at its default however the suite was started: a shell without job control starts a
    # background job with it ignored, and Python then leaves it so (no KeyboardInterrupt).
    proc = subprocess.Popen(
        as_from_a_terminal("-m", "ampgraph", *command),
        env=env, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip

    def waiting() -> bool:
        """Whether the command has a second process and waits for it (sleeps: state S). Past
        the fork itself: a SIGINT that lands in Python's after-fork callbacks, which never
        sleep, is printed as "Exception ignored" and lost, in any program that forks."""
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state == "S" and len(session(proc.pid)) > 1

    end = time.monotonic() + 120  # however long a loaded machine takes to get there
    while not waiting():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate(timeout=60)
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip() == "Aborted!", err
    assert gone(proc.pid)  # a worker ends on its parent's SIGTERM, a moment after it
    assert not (tmp_path / "figures").exists()


def test_reports_cross_to_a_process_without_torch(tmp_path: Path) -> None:
    """What the analysis process sends: a report unpickles without importing torch, a data-
    dependent capture's and a training step's too (a TorchVersion in it cost 1.5 s)."""
    import pickle

    import torch

    from ampgraph import analyze

    class Branches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            if (y > 0).sum() > 3:  # decided on data: draft-export, unbacked values
                return y.relu()
            return y[y > 0]

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    reports = [
        analyze(Branches(), "amp-fp32", args=(torch.randn(3, 4),)),
        analyze(net, "amp-fp32", args=(torch.randn(3, 4),), pass_="train"),
    ]
    assert reports[0].capture.get("unbacked_values") and reports[1].backward is not None
    path = tmp_path / "reports.pickle"
    path.write_bytes(pickle.dumps(reports))
    done = python("""
        import pickle, sys
        reports = pickle.load(open(sys.argv[1], "rb"))
        print(len(reports), type(reports[0].versions["torch"]).__name__, "torch" in sys.modules)
    """, str(path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "str", "False"]


def test_an_error_that_does_not_pickle_still_crosses_from_the_process_beside() -> None:
    """What the dispatcher check's process and the analysis process share (workers.beside)."""
    from ampgraph.pipeline.workers import run_in_fork as beside

    class Local(Exception):  # a class pickle cannot find by name
        pass

    def produce(send: object) -> None:
        raise Local("boom")

    with pytest.raises(RuntimeError, match=r"^Local: boom$"):
        beside(produce, print, 1, name="dispatcher check")
    with pytest.raises(LookupError) as raised:
        beside(lambda send: {}["missing"], print, 1, name="dispatcher check")
    if sys.version_info >= (3, 11):  # add_note
        assert "in the dispatcher check process:" in "".join(raised.value.__notes__)
