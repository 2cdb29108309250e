"""A cold ``ampgraph`` process: imports without garbage collection, and a quick exit.

Both are process-level (issue 13): they run in fresh interpreters here, where torch is not
imported yet, as in a user's shell.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from ampgraph.pipeline import frozen_imports


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_cold_prepare_pauses_collection_then_freezes_the_imports() -> None:
    done = python("""
        import gc, json, sys
        from ampgraph import pipeline
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
