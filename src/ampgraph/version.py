"""ampgraph's version, in a module of its own: the stages that stamp it on reports and cache keys
read it here, below everything, rather than from the package root, which imports them."""

from __future__ import annotations

__version__ = "0.1.0"
