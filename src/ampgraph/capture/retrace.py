"""Tracing again where the trace in a setting raised in the model's Python code.

Two cases, told apart by tracing again (:func:`past_python_raise`): the forward raised on export's
path only (model code that asks ``torch.compiler.is_exporting()``, as transformers' mask builders
do), and is traced on the path a real run takes (:func:`ampgraph.capture.raises.as_a_real_run`);
or the model raises in this setting, as a real run does (``nn.GRU``'s dtype check in ``half``),
and the raise is a node of the graph (:func:`ampgraph.capture.raises.stopping_at_raise`). A forward
that autograd refuses (:func:`autograd_refused`) is traced without gradients.

>>> real_run_why(ValueError("mask of the wrong size"))[-41:]
'raised ValueError: mask of the wrong size'
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ampgraph.capture.draft_export import _draft_export
from ampgraph.capture.engines import ENGINES, Traced
from ampgraph.capture.module_io import ModuleIORecorder, error_line
from ampgraph.capture.raises import (
    as_a_real_run,
    module_site,
    on_a_real_run,
    python_raise_site,
    stopping_at_raise,
)
from ampgraph.capture.reads import TraceReads
from ampgraph.errors import exception_chain, first_line
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import torch_dtype


class OnARealRunPath(Exception):  # noqa: N818 - a signal, not an error
    """The forward raised on export's path and elsewhere on a real run's: capture again on the
    real run's path (:func:`ampgraph.capture.raises.as_a_real_run`); ``why`` says so."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def autograd_refused(exc: BaseException) -> bool:
    """Whether autograd refused an op because an input requires grad (``out=`` into a tensor, an
    in-place write into a parameter): what only a forward with gradients raises.

    >>> autograd_refused(RuntimeError("mul(): functions with out=... arguments don't support "
    ...                               "automatic differentiation"))
    True
    """
    return any(
        "automatic differentiation" in str(e) or "that requires grad" in str(e)
        for e in exception_chain(exc)
    )


def draft_to_the_guard(
    model: ModelInputs, recorder: ModuleIORecorder
) -> tuple[Traced, list[str], dict[str, int | float]]:
    """:func:`ampgraph.capture.draft_export._draft_export` of ``model``; where even a trace on real
    values cannot decide a size (torch's own check of a data-dependent size against its real
    value, in a roll by a delay read from the data), the graph up to there, ended by a node
    that is not analysable and says why (:func:`~ampgraph.capture.raises.stopping_at_raise`):
    the model is analysed up to that module, never lost whole."""
    try:
        return _draft_export(model)
    except Exception as exc:
        site = module_site(exc, model.module) if _data_dependent(exc) else None
        if site is None:
            raise
        recorder.reset()
        with stopping_at_raise(model.module, site, exc, same_message=False):
            traced, branches, values = _draft_export(model)
        where = f"{site or '(top level)'}: {first_line(exc)}"
        cut = f"{where}: not followed, the forward is analysed up to here"
        return traced, [*branches, cut], values


def _data_dependent(exc: BaseException) -> bool:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return isinstance(exc, GuardOnDataDependentSymNode)


def real_run_why(exc: BaseException) -> str:
    """What a report says of a graph traced on a real run's path because export's raised ``exc``."""
    return (
        "traced on the path a real run takes (torch.compiler.is_exporting() false): on "
        f"export's path the forward raised {error_line(exc)}"
    )


def past_python_raise(
    model: ModelInputs,
    setting: Setting,
    recorder: ModuleIORecorder,
    exc: Exception,
    reads: TraceReads | None,
    engine_name: str,
) -> tuple[Traced, str | None] | None:
    """Where the trace in ``setting`` stopped at a Python ``raise`` in the model's code: the
    graph a real run's path gives (with why it is that path), or the graph up to the raise
    (:mod:`ampgraph.capture.raises`) where the model raises it in ``setting`` and not with fp32
    parameters and no autocast; None where neither holds (a model that raises in every
    setting has inputs it does not accept: the capture fails as before).
    """
    site = python_raise_site(exc, model.module)
    if site is None:
        return None
    engine = ENGINES[engine_name]
    dtype = torch_dtype(setting.param_dtype)

    def again(*contexts: Any, neutral: bool = False) -> Traced:
        recorder.reset()
        if reads is not None:
            reads.clear()
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            if neutral:
                return engine(model, setting.device_type, torch.float32, None, None)
            return engine(model, setting.device_type, dtype, setting, reads)

    why = real_run_why(exc)
    if not on_a_real_run():
        try:
            return again(as_a_real_run()), why
        except Exception as other:  # noqa: BLE001 - a real run raises too, maybe elsewhere
            if type(other) is not type(exc) or first_line(other) != first_line(exc):
                # It raises elsewhere on a real run's path (a kernel's dtype error in half):
                # the whole capture follows that path, fallbacks included.
                raise OnARealRunPath(why) from None
    if setting.param_dtype == "float32" and not setting.autocast:
        return None
    try:
        again(neutral=True)
    except Exception:  # noqa: BLE001 - it raises without the setting too: not the setting's
        return None
    try:
        return again(stopping_at_raise(model.module, site, exc)), None
    except Exception:  # noqa: BLE001 - cut there, it still fails: the capture goes on as before
        recorder.reset()
        return None


__all__ = [
    "OnARealRunPath",
    "autograd_refused",
    "draft_to_the_guard",
    "past_python_raise",
    "real_run_why",
]
