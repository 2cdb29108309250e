"""Tests on data-dependent sizes that torch guesses, decided as the real values decide them
wherever the analysis knows those values.

A trace cannot decide a test on a data-dependent (unbacked) size that it cannot prove
statically: ``if n == 0`` on the count of a boolean-mask index. Where the analysis knows the real
value of every such size in the test (draft export's real tensors, the values a data-path trace
or a replay is given: ``capture/data_path.py``, :func:`ampgraph.torchutil.unbacked_values`,
``capture/known_values.py``, ``annotate/replay.py``), torch decides an ordinary guard on those
values and records a runtime assertion that it holds. But the tests torch itself makes with
``guard_or_false`` and ``guard_or_true`` are not decided that way: they guess (False, True),
with no assertion, before the real values are asked. A guess is right for most sizes and wrong
for the one a real run meets: the broadcast of a padded length ``Max(u0, u1)`` against a slice
of it (``x[:, 0:1]``, length ``Min(1, Max(u0, u1))``) guesses that neither side is 1, then asserts
that the two are equal, which a real run (where the slice is 1 long and broadcasts) breaks.
Draft export checks that assertion on its real values and fails: LightGlue's attention mask,
built from the per-image keypoint counts SuperPoint finds, lost the whole model ("Runtime
assertion failed for expression Eq(Max(u10, ...), Min(1, Max(u10, ...)))"), though a real run
does not raise.

:func:`install` (entered by :mod:`ampgraph.capture.environment` for the analysis) decides such
a test as an ordinary guard where the real values decide it against the guess: the graph takes
the path a real run takes, the decision is a runtime assertion in it, and draft export reports
it with the branches it decided on data (:attr:`ampgraph.capture.trace.Capture.data_dependent`),
at the model's line. A guess the real values agree with is left as torch makes it, and nothing
changes where no real value is known (a trace on fake tensors alone, which keeps torch's
general graph).

>>> undo = install(); undo()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from ampgraph.capture.data_reads import at_the_models_line
from ampgraph.compat import real_symbol_values


def decided_by_real_values(shape_env: Any, expr: Any, guess: bool) -> bool:
    """Whether ``shape_env``'s real values decide ``expr`` (a test torch would guess ``guess``
    for) the other way from the guess.

    >>> from torch.fx.experimental.symbolic_shapes import ShapeEnv
    >>> from ampgraph.compat import unbacked_value_setter
    >>> env = ShapeEnv()
    >>> n = env.create_unbacked_symint()
    >>> getattr(env, unbacked_value_setter())(n.node.expr, 1)
    >>> decided_by_real_values(env, sympy.Eq(n.node.expr, 1), False)
    True
    >>> decided_by_real_values(env, sympy.Eq(n.node.expr, 2), False)
    False
    """
    values = real_symbol_values(shape_env)
    if not values:
        return False
    real = sympy.sympify(expr).xreplace(values)
    return real in (sympy.true, sympy.false) and bool(real) != guess


def install() -> Callable[[], None]:
    """Decide torch's guesses on data-dependent sizes on the real values where those are known
    and say otherwise (the module's docstring), until the returned function runs.

    The guesses are all made in one function, ``symbolic_shapes._guard_or`` (which
    ``guard_or_false`` and ``guard_or_true`` call by name, from Python and from C++ alike): that
    one is wrapped, so no other guard's stack has a frame of ampgraph's in it."""
    from torch.fx.experimental import symbolic_shapes

    original = getattr(symbolic_shapes, "_guard_or", None)
    if original is None:  # no guesses made in one place in this torch: nothing to decide
        return lambda: None

    def guard_or(a: Any, default: bool) -> bool:
        node = getattr(a, "node", None)
        env = getattr(node, "shape_env", None)
        if env is None or not decided_by_real_values(env, node.expr, default):
            return bool(original(a, default))
        # No guess: the real values decide it, as any guard on data they decide, with a runtime
        # assertion that it holds and draft export's report of it at the model's line.
        with at_the_models_line():
            return bool(env.evaluate_sym_node(node))

    symbolic_shapes._guard_or = guard_or

    def undo() -> None:
        symbolic_shapes._guard_or = original

    return undo


__all__ = ["decided_by_real_values", "install"]
