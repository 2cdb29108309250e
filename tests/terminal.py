"""Commands started as a terminal starts them, whatever signals the test process inherited.

Unix keeps an ignored signal ignored, and a blocked one blocked, across ``exec``: a suite run
under ``nohup`` starts every command with SIGHUP ignored, and one started in the background by a
shell without job control (``make test &`` in a script) with SIGINT ignored. A test that sends a
command Ctrl-C or a hangup would then wait for an end that, rightly, never comes (two full CI runs
timed out so on SIGHUP). :func:`as_from_a_terminal` sets the stop signals explicitly instead.

    subprocess.run(as_from_a_terminal("-m", "ampgraph", "--help"))
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path

#: ``python -c _LAUNCH IGNORED ARGS``: ``python ARGS`` in the same process (its pid is the
#: command's), with SIGHUP, SIGINT and SIGTERM unblocked and at their default, but for those
#: named in IGNORED (comma-separated), which are ignored, as ``nohup`` ignores SIGHUP.
_LAUNCH = """
import os, signal, sys
stops = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
ignored = {getattr(signal, name) for name in sys.argv[1].split(",") if name}
for signum in stops:
    signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def as_from_a_terminal(*args: str, ignoring: Iterable[str] = ()) -> list[str]:
    """The command line that runs ``python ARGS`` as a terminal would start it (SIGHUP, SIGINT
    and SIGTERM at their default, none blocked), but with the signals named in ``ignoring``
    ignored (``("SIGHUP",)``: as ``nohup`` starts it)."""
    return [sys.executable, "-c", _LAUNCH, ",".join(ignoring), *args]


def session(leader: int) -> list[int]:
    """The live processes of the session ``leader`` started (field 6 of /proc/PID/stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) == leader and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def gone(leader: int) -> bool:
    """Whether the session ``leader`` started has no live process left, or none within 30 s: a
    process killed a moment ago (a worker ending on its parent's SIGTERM) takes a while to go on
    a loaded machine."""
    end = time.monotonic() + 30
    while session(leader):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True
