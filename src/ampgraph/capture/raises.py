"""A Python-level raise in one setting: the setting's finding at the module that raises.

Model code checks dtypes in Python as well as in kernels: ``nn.GRU`` raises ``ValueError: RNN
input dtype (torch.float32) does not match weight dtype (torch.bfloat16)`` in the ``half`` setting
of a model fed fp32, before any op runs. That raise is what a real run does in that setting, and
says nothing about the others. The capture traces such a setting again up to the raise
(:func:`stopping_at_raise`): the module's forward is cut where it raised, with one
``ampgraph::raises`` node in it that takes the call's tensors and raises the model's own error
whenever the graph is replayed (annotation, dispatcher check, real execution). The annotation then
reports it where a kernel error is reported, at that node and that module call; what the forward
computes past it depends on that node, so it is reported not run, as the real run never runs it.

Where the forward raises only on export's path (model code that asks
``torch.compiler.is_exporting()``), the capture traces it as a real run runs it instead
(:func:`as_a_real_run`); :mod:`ampgraph.capture.retrace` tells the two apart.

>>> import torch
>>> gru = torch.nn.GRU(2, 2).to(torch.bfloat16)
>>> try:
...     gru(torch.ones(1, 1, 2))
... except ValueError as exc:
...     print(python_raise_site(exc, gru))
<BLANKLINE>
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import os
from collections.abc import Iterator
from typing import Any, NoReturn

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ampgraph.errors import first_line

#: Where a raise is the tracing machinery's, never the model's (torch's own Python-level
#: failures of tracing: data-dependent guards, unsupported operations, export's checks).
_MACHINERY = tuple(
    os.path.join(os.path.dirname(torch.__file__), part)
    for part in ("_", "fx", "export", "utils", "overrides.py", "library.py")
) + (os.path.dirname(os.path.dirname(__file__)),)


class Stopped(Exception):  # noqa: N818 - a signal, not an error
    """Raised through the traced forward from the module that raised: ``value`` is what the
    traced forward returns instead (the ``ampgraph::raises`` node's output)."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__("the forward raised in its own Python code")
        self.value = value


def _raise_statement(exc: BaseException) -> Any:
    """The frame of the ``raise`` statement that raised ``exc``, or None where a C++ kernel (or
    anything but a Python ``raise``) did."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    op = next((i.opname for i in dis.get_instructions(code) if i.offset == tb.tb_lasti), None)
    return tb.tb_frame if op == "RAISE_VARARGS" else None


def python_raise_site(exc: BaseException, module: nn.Module) -> str | None:
    """The path of the module of ``module`` whose code raised ``exc`` in a Python ``raise``
    statement of its own (``""`` for ``module`` itself); None where ``exc`` came from a kernel or
    from the tracing machinery, or was raised outside every module's forward.
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if isinstance(exc, (Stopped, GuardOnDataDependentSymNode)):
        return None
    frame = _raise_statement(exc)
    if frame is None or frame.f_code.co_filename.startswith(_MACHINERY):
        return None
    return module_site(exc, module)


def module_site(exc: BaseException, module: nn.Module) -> str | None:
    """The path of the innermost module of ``module`` whose code was running when ``exc`` was
    raised (``""`` for ``module`` itself); None where none was."""
    paths = {id(mod): path for path, mod in module.named_modules()}
    tb = exc.__traceback__
    site = None
    while tb is not None:  # outermost first: the innermost module frame wins
        owner = tb.tb_frame.f_locals.get("self")
        if id(owner) in paths and isinstance(owner, nn.Module):
            site = paths[id(owner)]
        tb = tb.tb_next
    return site


_RAISES: list[Any] = []
#: While true, ``ampgraph::raises`` returns a placeholder instead of raising: the trace records it.
#: Context variables, not module flags: an analysis in another thread is not in this one's step.
_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ampgraph_recording", default=False
)


def raises_op() -> Any:
    """``ampgraph::raises(tensors, type, message)``: raise the model's error (``type`` a builtin
    exception's name) whenever it runs, on fake tensors or real ones; defined once.

    Defined for the process, not for one analysis, and inert: an op of ampgraph's own namespace
    changes no kernel of torch's and is called only by the graphs ampgraph captured. Those
    graphs outlive the analysis that made them (the API returns captures that another call
    annotates, replays and verifies), so an op destroyed with the analysis would leave them
    naming an op the dispatcher no longer has (``tests/test_environment.py`` observes that no
    other op of the dispatcher changes)."""
    if not _RAISES:

        # It returns a marker and a copy of each tensor it takes: what the forward computes
        # past the raise, it computes from those, so a replay reports it not run.
        @torch.library.custom_op("ampgraph::raises", mutates_args=())
        def raises(tensors: list[torch.Tensor], kind: str, message: str) -> list[torch.Tensor]:
            if _RECORDING.get():  # a trace on real values (draft export) runs it too
                return [torch.empty(0), *(t.clone() for t in tensors)]
            _raise(kind, message)

        @raises.register_fake
        def _(tensors: list[torch.Tensor], kind: str, message: str) -> list[torch.Tensor]:
            if _RECORDING.get():
                return [torch.empty(0), *(torch.empty_like(t) for t in tensors)]
            _raise(kind, message)

        _RAISES.append(torch.ops.ampgraph.raises.default)
    return _RAISES[0]


def ends_at_a_raise(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` was cut at a raise (:func:`stopping_at_raise`): it has a raises node.

    >>> ends_at_a_raise(torch.fx.symbolic_trace(torch.nn.ReLU()))
    False
    """
    return bool(_RAISES) and any(n.target is _RAISES[0] for n in gm.graph.nodes)


def _raise(kind: str, message: str) -> NoReturn:
    """Raise ``message`` as the builtin exception ``kind`` (RuntimeError if it is none)."""
    import builtins

    error = getattr(builtins, kind, None)
    if not (isinstance(error, type) and issubclass(error, Exception)):
        error = RuntimeError
    raise error(message)


def _builtin_name(exc: BaseException) -> str:
    import builtins

    name = type(exc).__name__
    return name if getattr(builtins, name, None) is type(exc) else "RuntimeError"


@contextlib.contextmanager
def stopping_at_raise(
    root: nn.Module, path: str, exc: BaseException, *, same_message: bool = True
) -> Iterator[None]:
    """While it lasts, the module at ``path`` ends the traced forward where it raises ``exc``
    again (the same type and first line): an ``ampgraph::raises`` node in its call, on the
    tensors it was called with, whose output :class:`Stopped` carries to the traced forward
    (:func:`returning_at_stop`). The forward is swapped on the instance, so hooks still fire.
    Without ``same_message``, any exception of ``exc``'s type stops it (a data-dependent guard
    names values that a run with dropout draws anew)."""
    module = root.get_submodule(path)
    forward = module.forward
    had = "forward" in vars(module)
    kind, message = _builtin_name(exc), first_line(exc)

    def cut(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except Exception as again:
            if type(again) is not type(exc) or (same_message and first_line(again) != message):
                raise
            # The call's tensors and the module's own, whose dtypes the raise compared.
            leaves, spec = pytree.tree_flatten((args, kwargs))
            own = list(module.parameters())
            at = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
            recording = _RECORDING.set(True)
            try:
                marker, *copies = raises_op()([*(leaves[i] for i in at), *own], kind, message)
            finally:
                _RECORDING.reset(recording)
            # Past the raise, as a run that had not raised would go on: the call again, on the
            # copies in its parameters' dtype (what a dtype check asks for), so that the modules
            # after it are in the graph, not run (they depend on the raise); else the graph ends.
            dtype = next((p.dtype for p in own if p.is_floating_point()), None)
            for i, copy in zip(at, copies):
                floating = copy.is_floating_point() and dtype is not None
                leaves[i] = copy.to(dtype) if floating else copy
            try:
                if dtype is not None and same_message:
                    past_args, past_kwargs = pytree.tree_unflatten(leaves, spec)
                    return forward(*past_args, **past_kwargs)
            except Exception:  # noqa: BLE001 - it raises past there too: the graph ends there
                pass
            raise Stopped(marker) from None

    module.forward = cut  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            module.forward = forward  # type: ignore[method-assign]
        else:
            vars(module).pop("forward", None)


def returning_at_stop(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, or the value a :class:`Stopped` carries where the forward
    stopped at a raise (:func:`stopping_at_raise`)."""
    from torch.fx.experimental import proxy_tensor

    # The tracer's stack of module calls is pushed and popped around each call, not unwound by
    # an exception: what the calls cut short left on it goes, or export's next pop fails.
    tracer = getattr(proxy_tensor.get_proxy_mode(), "tracer", None)
    stack = getattr(tracer, "module_stack", None)
    depth = len(stack) if stack is not None else 0
    try:
        return call(*args, **kwargs)
    except Stopped as stop:
        while stack is not None and len(stack) > depth:
            stack.popitem(last=True)
        return stop.value


#: While true (:func:`as_a_real_run`), the traced forward sees ``torch.compiler.is_exporting()``
#: and ``is_compiling()`` false, as a real run does.
_REAL_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("ampgraph_real_run", default=False)


@contextlib.contextmanager
def as_a_real_run() -> Iterator[None]:
    """Captures made while it lasts run the model's code as a real run runs it, not on export's
    path. Model code asks ``torch.compiler.is_exporting()`` to avoid reading data while exported:
    transformers then builds every attention mask it skips in a real run, and Informer's or
    Autoformer's attention raises on a mask of its input's length after its layers changed the
    length (``Attention mask should be of size (2, 1, 4, 4), but is torch.Size([2, 1, 8, 8])``),
    where a real run has no mask. The capture falls back to this where the export path raises."""
    token = _REAL_RUN.set(True)
    try:
        yield
    finally:
        _REAL_RUN.reset(token)


def on_a_real_run() -> bool:
    """Whether captures now follow a real run's path (:func:`as_a_real_run`)."""
    return _REAL_RUN.get()


def model_call(call: Any, *args: Any, **kwargs: Any) -> Any:
    """The traced forward's call of the model, with ``torch.compiler``'s answers as a real run
    gives them (:func:`as_eager_runs`), and returning where the forward stopped at a
    Python-level raise (:func:`stopping_at_raise`)."""
    with as_eager_runs():
        return returning_at_stop(call, *args, **kwargs)


@contextlib.contextmanager
def as_eager_runs() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` false while the model's own code runs, as in an eager
    run; ``is_exporting()`` as the capture's engine set it, except under :func:`as_a_real_run`.

    Model code asks ``is_compiling()`` (transformers' ``is_torchdynamo_compiling()``,
    ``torch._dynamo.external_utils.is_compiling()`` and ``torch._utils.is_compiling()`` all read
    the same flag) to take paths meant for ``torch.compile`` only: transformers' MoE experts call
    a loop of ``mm`` instead of ``F.grouped_mm`` for non-bf16 weights, BART leaves an absent
    attention mask absent instead of building one. export and make-fx set the flag, so a capture
    took those paths and the real run did not: a silent wrong answer (issue 42). The line is
    here: torch's tracing machinery reads ``is_exporting()`` (fake tensors, functionalization,
    symbolic shapes, ``cond``), never ``is_compiling()`` on the way of a traced forward, so
    export's own flag stays; model code that asks ``is_exporting()`` to avoid reading data keeps
    export's path, as :mod:`ampgraph.verify.training` runs it (where that path raises, the capture
    follows a real run's, :func:`as_a_real_run`). A forward that then branches on data is
    followed on real values (:mod:`ampgraph.capture.data_path`), as a real run follows it.

    >>> from torch._export.utils import _compiling_state_context  # what export enters
    >>> with _compiling_state_context(), as_eager_runs():
    ...     torch.compiler.is_compiling(), torch.compiler.is_exporting()
    (False, True)
    """
    compiler = torch.compiler
    if not hasattr(compiler, "_is_exporting_flag"):  # torch without the flags: nothing to set
        yield
        return
    flags = compiler._is_compiling_flag, compiler._is_exporting_flag
    compiler._is_compiling_flag = False
    if _REAL_RUN.get():
        compiler._is_exporting_flag = False
    try:
        yield
    finally:
        compiler._is_compiling_flag, compiler._is_exporting_flag = flags


__all__ = [
    "Stopped",
    "as_a_real_run",
    "as_eager_runs",
    "ends_at_a_raise",
    "model_call",
    "module_site",
    "on_a_real_run",
    "python_raise_site",
    "raises_op",
    "returning_at_stop",
    "stopping_at_raise",
]
