"""The output formats: every command writes its output through them, looked up in one registry
(:mod:`~ampgraph.formats.registry`: for each kind of result, its format names and their writers,
from which the commands' ``--format`` choices come).

* :mod:`~ampgraph.formats.text` and :mod:`~ampgraph.formats.diff_text`: what a person reads in
  a terminal (the diffs' text in a module of its own, for size);
* :mod:`~ampgraph.formats.markdown`: pull requests and docs pages;
* :mod:`~ampgraph.formats.json`: programs, each output a versioned schema (docs/schema.md);
* :mod:`~ampgraph.formats.sarif`: GitHub code scanning;
* :mod:`~ampgraph.formats.outputs`: a command's whole output where it prints several pieces;
* :mod:`~ampgraph.formats.compiled`, :mod:`~ampgraph.formats.fp8`,
  :mod:`~ampgraph.formats.policy`: ``ampgraph compiled``, ``fp8``, ``fp8-ranges`` and
  ``policy``;
* :mod:`~ampgraph.formats.diagrams`: the renderer's files (:mod:`ampgraph.render`).

What is shown comes from the stages below (report records, :mod:`ampgraph.review`,
:mod:`ampgraph.ranges`, :mod:`ampgraph.verify`, the op reference of :mod:`ampgraph.docs`); the
formats only lay it out, and import none of the commands, nor torch: a writer is imported when
it is used.

>>> from ampgraph.formats.registry import names
>>> names("diff")
('text', 'markdown', 'json')
"""

from __future__ import annotations

# The registry's functions, as ``formats.write(kind, fmt, result, out)``; documented there, once.
from ampgraph.formats.registry import names as names
from ampgraph.formats.registry import text as text
from ampgraph.formats.registry import write as write

__all__: list[str] = []
