"""``ranges`` and ``verify`` run the model's code confined as ``table`` does (issue 43).

Each model is hostile on purpose, written by the test: a forward that replaces ``json.dumps``,
prints from a daemon thread and an ``atexit`` handler, forks, kills its own process, or ignores
SIGTERM and swallows the alarm. The command runs it in a process group it kills
(:func:`ampgraph.pipeline.confine.confine`): stdout is ampgraph's single document, a failure is
one ``Error:`` line with status 1, on time, and no process outlives the command. Also here: the
output paths and ``--seed`` checked before the work, and a forward that raises on its second call
reported as not deterministic.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ampgraph.cli import main
from ampgraph.errors import NotDeterministicError
from ampgraph.model.build import ModelInputs
from ampgraph.verify import verify
from tests.terminal import gone
from tests.test_confined import ampgraph, needs_proc

#: One model, whose forward does what HOSTILE says on every call (capture and real runs alike).
HOSTILE = """
    import atexit, json, os, signal, sys, threading, time
    import torch

    MODE = os.environ["HOSTILE"]


    class Hostile(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            if MODE == "dumps":
                json.dumps = lambda *args, **kwargs: '{"hijacked": true}'
            if MODE == "prints":
                atexit.register(lambda: print("printed at exit"))
                def late():
                    time.sleep(0.5)
                    print("printed by a daemon thread")
                    os.write(1, b"written on fd 1 by a daemon thread\\n")
                threading.Thread(target=late, daemon=True).start()
            if MODE == "fork" and os.fork() == 0:
                print("a second report?")
            if MODE == "killself":
                os.kill(os.getpid(), signal.SIGKILL)
            if MODE == "stubborn":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGALRM, lambda *args: None)
                while True:
                    try:
                        time.sleep(0.1)
                    except BaseException:
                        pass
            return self.linear(x)


    def build():
        return Hostile(), torch.randn(2, 4)
"""

COMMANDS = {
    "ranges": ["ranges", "--module", "hostile.py:build", "-s", "fp32", "--device", "cpu"],
    "verify": ["verify", "--module", "hostile.py:build", "-s", "fp32", "--device", "cpu"],
}


def run(
    tmp_path: Path, mode: str, command: str, *extra: str
) -> tuple[subprocess.Popen[str], str, str]:
    """``python -m ampgraph COMMAND ... --format json`` in a session of its own (test_confined's
    runner, on this file's hostile model); its output."""
    proc = ampgraph(tmp_path, mode, *COMMANDS[command], "--format", "json", *extra, popen=True,
                    source=HOSTILE)  # fmt: skip
    assert isinstance(proc, subprocess.Popen)
    out, err = proc.communicate(timeout=300)
    return proc, out, err


@needs_proc
@pytest.mark.parametrize("command", ["ranges", "verify"])
@pytest.mark.parametrize("mode", ["dumps", "prints"])
def test_stdout_is_one_json_document_whatever_the_model_prints(
    tmp_path: Path, command: str, mode: str
) -> None:
    proc, out, err = run(tmp_path, mode, command, "--timeout", "240")
    assert proc.returncode == 0, err
    document = json.loads(out)  # one document, and nothing after it
    assert document["schema"] == f"ampgraph.{command}"
    assert "hijacked" not in out and "printed" not in out and "written" not in out
    assert gone(proc.pid)


@needs_proc
@pytest.mark.parametrize("command", ["ranges", "verify"])
@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("fork", "Error: the model's code forked the process that analyses it (os.fork at "),
        ("killself", "process ended without a result (killed by SIGKILL: out of memory, or the "
                     "model's code killed its process)"),  # fmt: skip
    ],
)
def test_a_fork_or_a_killed_process_is_one_error_line(
    tmp_path: Path, command: str, mode: str, says: str
) -> None:
    proc, out, err = run(tmp_path, mode, command, "--timeout", "240")
    assert (proc.returncode, out) == (1, ""), err
    last = err.strip().splitlines()[-1]
    assert last.startswith("Error: ") and says in last and "Traceback" not in err, err
    assert "a second report?" not in err  # the copy ran nothing
    assert gone(proc.pid)


@needs_proc
@pytest.mark.parametrize("command", ["ranges", "verify"])
def test_the_timeout_holds_against_a_forward_that_ignores_sigterm(
    tmp_path: Path, command: str
) -> None:
    start = time.monotonic()
    proc, out, err = run(tmp_path, "stubborn", command, "--timeout", "30")
    assert (proc.returncode, out) == (1, ""), err
    assert err.strip().splitlines()[-1].startswith("Error: the analysis did not finish within 30 s")
    assert time.monotonic() - start < 30 + 60  # the bound, and the imports before it
    assert gone(proc.pid)  # nothing spins on after the command


# -- checked before the work ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ranges", "verify"])
@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**70)])
def test_a_seed_beyond_64_bits_or_negative_is_a_usage_error(command: str, seed: str) -> None:
    done = CliRunner().invoke(main, [command, "llama-tiny", "-s", "fp32", "--seed", seed])
    assert done.exit_code == 2, done.output
    assert "--seed" in done.output and "Traceback" not in done.output


def overlay_dirs(tmp_path: Path) -> dict[str, Path]:
    """Folders no overlay can be written into: a FIFO, a link to a device, a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    device = tmp_path / "device"
    device.symlink_to("/dev/null")
    regular = tmp_path / "file"
    regular.write_text("x")
    return {"FIFO": fifo, "device": device, "file": regular / "below"}


@pytest.mark.parametrize("kind", ["FIFO", "device", "file"])
def test_an_overlay_folder_that_cannot_be_written_is_refused_before_the_work(
    tmp_path: Path, kind: str
) -> None:
    folder = overlay_dirs(tmp_path)[kind]
    start = time.monotonic()
    done = CliRunner().invoke(main, ["ranges", "llama-tiny", "-s", "fp32", "--overlay",
                                     str(folder)])  # fmt: skip
    assert done.exit_code == 1, done.output
    assert done.output.startswith(f"Error: cannot write the overlays to {folder}: "), done.output
    assert time.monotonic() - start < 5  # before the model is built
    if kind == "FIFO":
        assert stat.S_ISFIFO(os.stat(folder).st_mode)  # left as it was


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_overlay_folder_under_a_read_only_parent_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    done = CliRunner().invoke(main, ["ranges", "llama-tiny", "-s", "fp32", "--overlay",
                                     str(parent / "figures")])  # fmt: skip
    assert done.exit_code == 1 and "is not writable" in done.output, done.output


# -- a forward that changes from call to call -------------------------------------------------


#: Calls of :class:`SecondCallRaises`, counted outside the module.
_CALLS = [0]


class SecondCallRaises(torch.nn.Module):
    """Runs once (ampgraph's capture), then raises: not deterministic. It counts its calls
    outside itself, state the capture cannot put back (it restores a module's attributes and
    what their containers hold, not the rest of the process)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        _CALLS[0] = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CALLS[0] += 1
        if _CALLS[0] >= 2:
            raise RuntimeError("raised on the second call")
        return self.linear(x)


def test_a_forward_that_raises_on_its_second_call_is_not_deterministic() -> None:
    model = ModelInputs("second", SecondCallRaises(), (torch.randn(2, 4),))
    with pytest.raises(NotDeterministicError, match="not deterministic.*second call"):
        verify(model, "fp32,device=cpu")


class CountsInAnAttribute(SecondCallRaises):
    """The same forward counting in a plain attribute, which the capture puts back: the real run
    is the model's first call, as it is in the user's process."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = getattr(self, "count", 0) + 1
        if self.count >= 2:
            raise RuntimeError("raised on the second call")
        return self.linear(x)


def test_the_capture_leaves_a_forwards_own_attributes_as_they_were() -> None:
    module = CountsInAnAttribute()
    result = verify(ModelInputs("count", module, (torch.randn(2, 4),)), "fp32,device=cpu")
    assert result.ok and module.count == 1  # the real run's call only


class CountsInAList(SecondCallRaises):
    """The same forward counting in a list among its fields, changed in place: the capture puts
    the list's content back too, and the real run is again the model's first call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = [0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[0] += 1
        if self.calls[0] >= 2:
            raise RuntimeError("raised on the second call")
        return self.linear(x)


def test_the_capture_leaves_what_a_forwards_containers_hold_as_it_was() -> None:
    module = CountsInAList()
    result = verify(ModelInputs("list", module, (torch.randn(2, 4),)), "fp32,device=cpu")
    assert result.ok and module.calls == [1]  # the real run's call only


# -- progress, as the other commands show it -------------------------------------------------


@needs_proc
def test_ranges_and_verify_name_their_stages_on_a_terminal() -> None:
    """The stages come from the confined process to the command's stage line (stderr), and the
    answer is left alone on the screen."""
    from tests.test_progress import _cli_on_a_terminal

    shown = _cli_on_a_terminal("ranges", "llama-tiny", "-s", "fp32", "--device", "cpu",
                               "--seq-len", "4")  # fmt: skip
    assert "running the model in fp32 on the CPU" in shown, shown
    shown = _cli_on_a_terminal("verify", "llama-tiny", "-s", "fp32", "--device", "cpu",
                               "--seq-len", "4")  # fmt: skip
    assert "verifying fp32 on real tensors (1 of 1)" in shown, shown
    assert "0 disagreements" in shown


@pytest.mark.parametrize("kind", ["FIFO", "device", "file"])
def test_a_render_folder_that_cannot_be_written_is_refused_before_the_work(
    tmp_path: Path, kind: str
) -> None:
    folder = overlay_dirs(tmp_path)[kind]
    done = CliRunner().invoke(main, ["render", "llama-tiny", "-s", "fp32", "--out", str(folder)])
    assert done.exit_code == 1, done.output
    assert done.output.startswith(f"Error: cannot write the diagrams to {folder}: "), done.output


ESCAPES = """
    import os, subprocess, torch

    class Escapes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            # A process of a session of its own: killing the analysis's group does not reach it.
            child = subprocess.Popen(["sleep", "300"], start_new_session=True)
            with open("escaped.pids", "a") as pids:
                pids.write(f"{child.pid}\\n")
            return self.linear(x)

    def build():
        return Escapes(), torch.randn(2, 4)
"""


@needs_proc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper is Linux's")
def test_processes_that_leave_the_group_are_killed_too(tmp_path: Path) -> None:
    from tests.test_confined import alive

    (tmp_path / "escapes.py").write_text(textwrap.dedent(ESCAPES))
    env = {**os.environ, "AMPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "ampgraph", "ranges", "--module", "escapes.py:build", "-s", "fp32",
         "--device", "cpu", "--format", "json"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pids = [int(line) for line in (tmp_path / "escaped.pids").read_text().split()]
    assert pids and alive(pids) == []
