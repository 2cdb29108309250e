"""An adapter extension for Google's Model Explorer: it analyses a model and opens ampgraph's
annotated graph directly.

    pip install 'ampgraph[explorer]'
    model-explorer --extensions=ampgraph.explorer opt-125m.ampgraph
    model-explorer --extensions=ampgraph.explorer 'llama-3-70b@amp-fp32+amp-half.ampgraph'
    model-explorer --extensions=ampgraph.explorer path/to/config.json.ampgraph
    model-explorer --extensions=ampgraph.explorer 'tests/factories.py:tower.ampgraph'

Model Explorer picks an adapter by a file's extension, so a model spec ends in ``.ampgraph``:
a bundled name, a ``config.json`` (or a model folder), or ``module:factory``, then optionally
``@`` and settings joined by ``+`` (default: the seed notebook's four), then ``.ampgraph``.
Each setting is one graph of the collection (the graph selector switches them); the graph is
:func:`ampgraph.render.explorer.explorer_graphs`'s, the same as ``render --format explorer``.

Model Explorer loads an extension package's ``main`` module: :mod:`ampgraph.explorer.main`
holds the adapter and needs ``ai-edge-model-explorer`` (the ``explorer`` extra; without it,
one ImportError line says what to install). This module is only the spec's grammar.

>>> parse_spec("/home/me/opt-125m@amp-fp32+fp32.ampgraph", exists=lambda p: False)
('opt-125m', ['amp-fp32', 'fp32'])
>>> parse_spec("/home/me/cfg/config.json.ampgraph", exists=lambda p: True)
('/home/me/cfg/config.json', None)
>>> parse_spec("/home/me/my.models:tower.ampgraph", exists=lambda p: False)
('my.models:tower', None)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from ampgraph.errors import AmpgraphError

SUFFIX: Final = ".ampgraph"


def parse_spec(
    path: str, exists: Callable[[str], bool] = os.path.exists
) -> tuple[str, list[str] | None]:
    """The model spec and the settings in the path Model Explorer gives (which it made absolute
    from what was typed): a path that exists is a config (or a ``file.py:factory``); anything
    else was typed as a name, which is the path's last part."""
    if not path.endswith(SUFFIX):
        raise AmpgraphError(f"{path}: not an ampgraph model spec (it must end in {SUFFIX})")
    path = path[: -len(SUFFIX)]
    head, base = os.path.split(path)
    settings = None
    if "@" in base:
        base, _, names = base.rpartition("@")
        settings = [s for s in names.split("+") if s]
    full = os.path.join(head, base)
    if exists(full) or exists(full.rsplit(":", 1)[0]):
        return full, settings
    return base, settings
