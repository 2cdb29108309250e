"""The Sphinx extension's name in ``conf.py``: ``extensions = ["ampgraph.sphinx"]``.

The directive lives in :mod:`ampgraph.docs.directive`; this name stays so that every docs
project that loads it keeps working.
"""

from ampgraph.docs.directive import setup

__all__ = ["setup"]
