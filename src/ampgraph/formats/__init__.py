"""The output formats, one module per format: every command that writes a format writes it
through that format's module.

* :mod:`~ampgraph.formats.text` and :mod:`~ampgraph.formats.diff_text`: what a person reads in
  a terminal (the diffs' text in a module of its own, for size);
* :mod:`~ampgraph.formats.markdown`: pull requests and docs pages;
* :mod:`~ampgraph.formats.json`: programs, each output a versioned schema (docs/schema.md);
* :mod:`~ampgraph.formats.sarif`: GitHub code scanning.

What is shown comes from the stages below (report records, :mod:`ampgraph.review`,
:mod:`ampgraph.ranges`, :mod:`ampgraph.train`); the formats only lay it out, and import none of
the commands, the renderer or torch. Diagrams (SVG, PNG, PDF, Graphviz source) are the
renderer's (:data:`ampgraph.render.FORMATS`).

>>> sorted(DIFF_FORMATS)
['json', 'markdown', 'text']
"""

from __future__ import annotations

# The modules, not their functions: ``ampgraph.formats.diff_text`` stays the module.
from ampgraph.formats import diff_text, json, markdown

#: ``ampgraph diff``'s and ``baseline check``'s ``--format`` choices.
DIFF_FORMATS = {
    "text": diff_text.diff_text,
    "markdown": markdown.diff_markdown,
    "json": json.diff_json,
}

__all__ = ["DIFF_FORMATS"]
