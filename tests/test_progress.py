"""Progress on a terminal: a stage line with elapsed time on stderr, nowhere else (issue 24)."""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import time
from pathlib import Path

from ampgraph.pipeline.progress import StageLine

SRC = str(Path(__file__).resolve().parent.parent / "src")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(child: str) -> str:
    """Run ``child`` (Python source) with stdout and stderr on a pseudo-terminal; its output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        try:
            # pytest replaced sys.stdout and sys.stderr: the child writes to the terminal's fds.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            sys.path.insert(0, SRC)
            exec(child, {})  # noqa: S102 (the test's own code)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return ANSI.sub(b"", out).decode()


def test_a_slow_stage_is_named_with_its_elapsed_time_and_then_cleared() -> None:
    shown = _on_a_terminal(
        "import time\n"
        # Imported first, as a warm process has it: its import, seconds on a loaded machine,
        # would come out of the 1.3 s the first stage has to be shown.
        "import rich.progress\n"
        "from ampgraph.pipeline.progress import StageLine\n"
        "with StageLine(delay=0.2) as line:\n"
        "    line('building opt-125m on the meta device...')\n"
        "    time.sleep(1.3)\n"
        "    line('analysing 4 settings')\n"
        "    time.sleep(0.5)\n"
        "print('ANSWER')\n"
    )
    assert "building opt-125m on the meta device 0:00:0" in shown
    assert "analysing 4 settings 0:00:01" in shown  # the time counts from the start
    # Transient: the last thing on the screen is the command's answer, on a cleared line.
    assert shown.rstrip().rsplit("\r", 1)[-1].strip() == "ANSWER"


def test_a_quick_command_shows_nothing() -> None:
    shown = _on_a_terminal(
        "from ampgraph.pipeline.progress import StageLine\n"
        "with StageLine(delay=1.0) as line:\n"
        "    line('reading the cache')\n"
        "print('ANSWER')\n"
    )
    assert shown.strip() == "ANSWER"


def test_nothing_off_a_terminal_or_when_disabled() -> None:
    stream = io.StringIO()  # not a terminal: a CI log, a pipe
    with StageLine(stream, delay=0.0) as line:
        line("building")
        time.sleep(0.2)
    assert stream.getvalue() == ""
    assert not StageLine(stream).enabled
    with StageLine(sys.stderr, enabled=False, delay=0.0) as line:  # --quiet
        line("building")
        assert line._timer is None


def _cli_on_a_terminal(*args: str) -> str:
    """``ampgraph ARGS`` in a fresh interpreter, as a person runs it, on a pseudo-terminal."""
    return _on_a_terminal(
        "import os, sys\n"
        f"os.execv(sys.executable, [sys.executable, '-m', 'ampgraph', *{list(args)!r}])\n"
    )


def test_a_cold_command_names_its_stages_on_a_terminal() -> None:
    shown = _cli_on_a_terminal("--no-cache", "table", "llama-tiny", "-s", "amp-fp32", "--no-check")
    assert "building llama-tiny on the meta device" in shown
    assert "[model.embed_tokens] in=torch.int64" in shown  # the answer, after the line is gone


def test_quiet_silences_it_before_or_after_the_command() -> None:
    for args in (
        ("--quiet", "--no-cache", "table", "llama-tiny", "-s", "amp-fp32", "--no-check"),
        ("--no-cache", "table", "llama-tiny", "-s", "amp-fp32", "--no-check", "-q"),
    ):
        shown = _cli_on_a_terminal(*args)
        assert "building" not in shown and "[model.embed_tokens]" in shown
