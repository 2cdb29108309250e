"""Where in the model's code a graph node was made: the file and line of audit's findings.

A capture records each node's Python stack (``node.meta["stack_trace"]``) only when an analysis
asks for source lines (``analyze(..., sources=True)``, which ``ampgraph audit`` does; see
:class:`ampgraph.capture.environment.AnalysisEnvironment`): symbolising stacks costs a sixth of the trace
time, which the other commands do not pay. The line is the innermost frame outside torch and
ampgraph: the model's code that calls the op, or the torch module (``self.fc1(x)`` for the
``linear`` of an ``nn.Linear``).

>>> trace = '''File "/src/model.py", line 12, in forward
...     return self.fc(x)
...   File "/site-packages/torch/nn/modules/linear.py", line 134, in forward
...     return F.linear(input, self.weight, self.bias)'''
>>> source_of(trace, skip=("/site-packages/torch/",))
{'file': '/src/model.py', 'line': 12}
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ')


@functools.cache
def library_dirs() -> tuple[str, ...]:
    """The folders whose frames are never the model's code: torch's and ampgraph's own."""
    import torch

    # ampgraph's own folder from this file's place in it: importing the package root here would
    # point an import up from the capture stage to the public surface.
    here = Path(__file__).resolve().parent.parent
    return (str(Path(torch.__file__).resolve().parent) + os.sep, str(here) + os.sep)


def _shown(path: str) -> str:
    """``path`` relative to the working directory where it lies under it (a repository's own
    model code, as SARIF wants it), else as it is: also an installed package's code in a virtual
    environment inside the working directory, which is no file of the repository's.

    >>> _shown(str(Path.cwd() / "models" / "net.py"))
    'models/net.py'
    >>> _shown(str(Path.cwd() / ".venv/lib/python3.11/site-packages/transformers/x.py")).startswith("/")
    True
    """
    resolved = Path(path).resolve()
    if "site-packages" in resolved.parts or "dist-packages" in resolved.parts:
        return path
    try:
        return resolved.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path


def source_of(stack_trace: str | None, skip: Sequence[str] | None = None) -> dict[str, Any] | None:
    """``{"file", "line"}`` of the innermost frame of ``stack_trace`` in the model's code: not
    in the folders ``skip`` (default :func:`library_dirs`) nor generated (``<eval_with_key>``);
    None without a stack or such a frame."""
    if not stack_trace:
        return None
    skip = library_dirs() if skip is None else tuple(skip)
    for file, line in reversed(_FRAME.findall(stack_trace)):
        if file.startswith("<") or any(file.startswith(d) for d in skip):
            continue
        if not any(os.path.realpath(file).startswith(d) for d in skip):
            return {"file": _shown(file), "line": int(line)}
    return None


__all__ = ["library_dirs", "source_of"]
