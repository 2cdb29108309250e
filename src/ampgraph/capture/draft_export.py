"""Draft export: a trace that runs the model on real values, for a forward that decides on data.

A forward that branches on values (``if boxes.numel() == 0``, a top-k on scores) cannot be traced
on fake tensors alone: :func:`_draft_export` runs it once on seeded real values
(:func:`draft_values`) while export records the sizes and values those runs decide, so the
graph follows the path a real run takes. ``verify`` runs on the same values, so that its sizes
are the capture's (:mod:`ampgraph.verify.tensors`).

>>> from ampgraph.model.build import ModelInputs
>>> len(draft_values(ModelInputs("lin", nn.Linear(2, 2), (torch.ones(1, 2),)))[2])
2
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ampgraph.capture.data_reads import DataReads, at_the_models_line
from ampgraph.capture.engines import (
    Traced,
    _lift_scalar_constants,
    _no_stack_traces,
    _plain_forward,
)
from ampgraph.capture.known_values import follows
from ampgraph.compat import (
    soft_pending_unbacked,
    unbacked_value_setter,
)
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import (
    autocast_state,
    quiet_logging,
    swapped_tensors,
    torch_dtype,
)


def _real_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A real CPU tensor for a (meta) parameter, buffer or input: small normal floats, zero
    integers (an index in range for any table), true bools, as verify materialises them."""
    if t.is_floating_point():
        out = torch.randn(t.shape, generator=generator, dtype=torch.float32) * 0.02
        return out if t.dtype == torch.float64 else out.to(t.dtype)
    if t.dtype == torch.bool:
        return torch.ones(t.shape, dtype=torch.bool)
    return torch.zeros(t.shape, dtype=t.dtype)


def _describe(failure: Any) -> str:
    """One line for a draft-export failure: where the forward decided what, on data values.

    ``forward line 103: `if boxes.numel() == 0:`: Eq(4*u1, 0) decided False``.
    """
    data = getattr(failure, "data", None) or {}
    what = str(data.get("expr") or getattr(failure.failure_type, "name", "data-dependent"))
    if data.get("result") is not None:
        what += f" decided {data['result']}"
    stack = data.get("user_stack") or []
    frame = stack[-1] if stack and isinstance(stack[-1], dict) else None
    if frame is None:
        return what
    return (
        f"{frame.get('name', '?')} line {frame.get('line', '?')}: `{frame.get('loc', '')}`: {what}"
    )


def _draft_export(
    model: ModelInputs, setting: Setting | None = None
) -> tuple[Traced, list[str], dict[str, int | float]]:
    """Trace along the path seeded random values take (see
    :data:`ampgraph.capture.trace.DRAFT_EXPORT`); also the value each data-dependent size or
    truth value took there, by symbol name (``{"u1": 1000}``).

    Without ``setting`` the run is neutral: fp32 parameters, autocast off. With it, the run is
    the setting's on the CPU: parameters in its dtype and, where it autocasts, the CPU's autocast
    to its dtype. A branch on data inside a branch on a dtype (BART's ``if hidden_states.dtype
    == torch.float16 and not torch.isfinite(hidden_states).all()``) exists in that setting only,
    and only a run in its dtypes meets it and decides it on values.
    """
    dtype = torch.float32 if setting is None else torch_dtype(setting.param_dtype)
    args, kwargs, made = draft_values(model)
    converted: list[torch.Tensor] = []

    def make_param(t: torch.Tensor) -> torch.Tensor:
        real = made[id(t)]
        if real.is_floating_point() and real.dtype != dtype:
            converted.append(real.to(dtype))
            return converted[-1]
        return real

    # The run's real weights, inputs and activations are ampgraph's, not the model's: freed as
    # the run ends, as a real run's are. Left to the collector they outlive the capture: torch's
    # fake tensors keep theirs (a copy of each weight, each activation's value) in reference
    # cycles and on the graph, a failed run's traceback frames keep ours, and only a full
    # collection frees a cycle. blt's generic config (a 384 MB hash n-gram table) held four
    # copies per failed capture and ran out of the zoo's 6 GB heap.
    given = _callers_storages(model)
    modes: list[weakref.ref[Any]] = []
    try:
        traced, branches, values = _draft_run(model, setting, args, kwargs, make_param, modes)
    finally:
        release([*made.values(), *converted, *_made_inputs(model, args, kwargs)])
        release(_copies_of_inputs(modes, given))
    release(_real_values(traced.graph_module, given))
    return traced, branches, values


def _draft_run(
    model: ModelInputs, setting: Setting | None, args: tuple[Any, ...], kwargs: dict[str, Any],
    make_param: Callable[[torch.Tensor], torch.Tensor], modes: list[weakref.ref[Any]],
) -> tuple[Traced, list[str], dict[str, int | float]]:  # fmt: skip
    """The draft export itself, on ``args``/``kwargs`` with each parameter ``make_param``'s;
    ``modes`` gets the fake tensor modes it ran the forward under (:func:`_noting_fake_mode`).

    Python's reads of data no op records (:class:`~ampgraph.capture.data_reads.DataReads`) are
    made as a real run makes them only in a second run, where the first fails without: the
    report of where the forward decided on data keeps the last three frames up to the innermost
    one outside torch, which under that mode is the mode's own, not the model's line.
    """
    try:
        return _draft_run_once(model, setting, args, kwargs, make_param, modes, data_reads=False)
    except Exception:  # noqa: BLE001 - a 0-d tensor formatted, an index of 0-d tensors...
        return _draft_run_once(model, setting, args, kwargs, make_param, modes, data_reads=True)


def _draft_run_once(
    model: ModelInputs, setting: Setting | None, args: tuple[Any, ...], kwargs: dict[str, Any],
    make_param: Callable[[torch.Tensor], torch.Tensor], modes: list[weakref.ref[Any]], *,
    data_reads: bool,
) -> tuple[Traced, list[str], dict[str, int | float]]:  # fmt: skip
    values: dict[str, int | float] = {}
    autocast = (
        autocast_state("cpu", True, torch_dtype(setting.amp_dtype))
        if setting is not None and setting.autocast
        else contextlib.nullcontext()
    )
    with (
        _recording_unbacked_values(values),
        autocast,
        swapped_tensors(model.module, make_param),
        warnings.catch_warnings(),
        quiet_logging(),
        _no_stack_traces(),
        _lift_scalar_constants(),
        # Real-value propagation fixes a boolean-mask index's size to its real value, so the
        # unbacked size it made is not in the output: expected here, not a tracing bug.
        soft_pending_unbacked(),  # an option from torch 2.11 on (ampgraph.compat)
        _real_checks_without_guards(),
        # A 0-d tensor formatted, an index of 0-d tensors: read as the real values give them.
        DataReads() if data_reads else contextlib.nullcontext(),
    ):
        warnings.simplefilter("ignore")
        # Dropout in training mode and torch.randint draw from the global generator: seeded,
        # so that a second run takes the first's path, and the caller's state is left alone.
        noting = _plain_forward(model.module, _noting_fake_mode(modes))
        with noting, torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            program = torch.export.draft_export(model.module, tuple(args), kwargs, strict=False)
    report = getattr(program, "_report", None)
    failures = list(getattr(report, "failures", []) or [])
    traced = Traced(program.graph_module, program.graph_signature, program.call_spec.out_spec)
    return traced, list(dict.fromkeys(_describe(f) for f in failures)), values


def release(tensors: Iterable[torch.Tensor]) -> None:
    """Free the memory of ``tensors`` (real ones a run made for itself), whoever still refers to
    them: each one's storage is emptied, so a reference left in a cycle holds no bytes.

    >>> t = torch.ones(1000)
    >>> release([t]); t.untyped_storage().nbytes()
    0
    """
    for tensor in tensors:
        if tensor.device.type != "meta":
            tensor.untyped_storage().resize_(0)


def _callers_storages(model: ModelInputs) -> set[int]:
    """The storages of the caller's own tensors (its inputs, the model's weights and the tensors
    its modules keep as plain attributes, which a graph may hold as constants): never freed."""
    attributes = [v for mod in model.module.modules() for v in vars(mod).values()]
    leaves = pytree.tree_leaves((model.args, model.kwargs, attributes))
    tensors = [*leaves, *model.module.parameters(), *model.module.buffers()]
    return {
        t.untyped_storage().data_ptr() for t in tensors
        if isinstance(t, torch.Tensor) and t.device.type != "meta"
    }  # fmt: skip


def _noting_fake_mode(modes: list[weakref.ref[Any]]) -> Callable[[Any, Any], None]:
    """A forward's note (:func:`~ampgraph.capture.engines._plain_forward`) that keeps, weakly,
    the fake tensor mode draft export runs the forward under: export makes it inside, out of its
    caller's reach, and its memo holds a real copy of each weight and input. Read from the
    forward's own fake inputs, so nothing in torch is patched and another thread's modes are
    never taken for ours."""
    from torch._guards import detect_fake_mode

    def note(args: Any, kwargs: Any) -> None:
        mode = detect_fake_mode(pytree.tree_leaves((args, kwargs)))
        if mode is not None and all(ref() is not mode for ref in modes):
            modes.append(weakref.ref(mode))

    return note


def _copies_of_inputs(modes: list[weakref.ref[Any]], given: set[int]) -> list[torch.Tensor]:
    """The real copies ``modes`` made of the tensors they took in (each weight and input's value,
    on its fake tensor), except the caller's own: a failed run leaves them in cycles."""
    found = []
    for ref in modes:
        mode = ref()
        converter = getattr(mode, "fake_tensor_converter", None)
        memo = getattr(converter, "tensor_memo", None) or {}
        for fake in list(memo.values()):
            real = getattr(fake, "real_tensor", None)
            if isinstance(real, torch.Tensor) and real.untyped_storage().data_ptr() not in given:
                found.append(real)
    return found


def _real_values(gm: torch.fx.GraphModule, given: set[int]) -> list[torch.Tensor]:
    """The real values a draft run left on its graph's fake tensors (``real_tensor``), except
    the caller's own."""
    found = []
    for node in gm.graph.nodes:
        for leaf in pytree.tree_leaves(node.meta.get("val")):
            real = getattr(leaf, "real_tensor", None)
            if isinstance(real, torch.Tensor) and real.untyped_storage().data_ptr() not in given:
                found.append(real)
    return found


def _made_inputs(
    model: ModelInputs, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The inputs :func:`draft_values` made up (for meta ones), not the caller's own."""
    given = {id(t) for t in pytree.tree_leaves((model.args, model.kwargs))}
    return [
        t for t in pytree.tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and id(t) not in given
    ]  # fmt: skip


def draft_values(
    model: ModelInputs,
) -> tuple[tuple[Any, ...], dict[str, Any], dict[int, torch.Tensor]]:
    """The values a draft run (:func:`_draft_export`) runs ``model`` on: its inputs (meta ones
    made up), and by ``id`` each parameter and buffer's fp32 value (buffers' absolute), seeded,
    in the run's order, except the small integer buffers a capture follows on their own values
    (:func:`ampgraph.capture.known_values.follows`); verify runs on them too, so that its sizes
    are the capture's.

    >>> len(draft_values(ModelInputs("lin", nn.Linear(2, 2), (torch.ones(1, 2),)))[2])
    2"""
    generator = torch.Generator().manual_seed(0)
    args, kwargs = pytree.tree_map_only(
        torch.Tensor,
        lambda t: t if t.device.type == "cpu" else _real_like(t, generator),
        (model.args, model.kwargs),
    )
    made: dict[int, torch.Tensor] = {}
    for mod in model.module.modules():  # swapped_tensors' order
        for tensor in (*mod._parameters.values(), *mod._buffers.values()):
            if tensor is None or id(tensor) in made:
                continue
            if follows(tensor):  # a size a real run computes from (EnCodec's kernel size)
                made[id(tensor)] = tensor.detach().clone()
                continue
            real = _real_like(tensor, generator)
            if real.is_floating_point() and not isinstance(tensor, nn.Parameter):
                real = real.abs()  # buffers: a negative running variance makes all values NaN
            made[id(tensor)] = real
    return tuple(args), dict(kwargs), made


@contextlib.contextmanager
def _real_checks_without_guards() -> Iterator[None]:
    """Draft export's check of each fake output against the real one, minus the checks it
    cannot make without guarding on data: a view at an offset the data picks
    (``x[:, index[i]]``, Autoformer's delays) has a data-dependent storage offset, and comparing
    it with the real offset guards on data and fails the whole trace (``Could not guard on
    data-dependent expression Ne(u1, 3)``), though the real value is right there."""
    from torch._subclasses import fake_utils
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    check = getattr(fake_utils, "_check_fake_real_tensors", None)
    if check is None:  # a torch without the check: nothing to make lenient
        yield
        return

    def lenient(*args: Any, **kwargs: Any) -> None:
        try:
            with at_the_models_line():  # a guard decided in the check: the model's line
                check(*args, **kwargs)
        except GuardOnDataDependentSymNode:
            pass  # a data-dependent size or offset: its real value is the one propagated

    fake_utils._check_fake_real_tensors = lenient  # type: ignore[assignment]
    try:
        yield
    finally:
        fake_utils._check_fake_real_tensors = check


@contextlib.contextmanager
def _recording_unbacked_values(values: dict[str, int | float]) -> Iterator[None]:
    """Note in ``values`` the real value of each data-dependent size as a tracer learns it
    (some are then replaced by constants, so the finished program no longer lists them)."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    setter = unbacked_value_setter()  # renamed in torch 2.11 (ampgraph.compat)
    original = getattr(ShapeEnv, setter)

    def record(self: ShapeEnv, k: Any, v: Any) -> None:
        original(self, k, v)
        # A truth value from data (``bool(x.all())``) is the expression ``Eq(u0, 1)`` on a
        # symbol of its own: the value that symbol took is what a tracer is given back.
        if isinstance(k, sympy.Eq) and k.args[1] == 1 and isinstance(k.args[0], sympy.Symbol):
            k, v = k.args[0], int(bool(v))
        if isinstance(v, float) or getattr(v, "is_Float", False):
            values.setdefault(str(k), float(v))  # ``x.max().item()``: a float, kept as one
        elif getattr(v, "is_integer", False) or isinstance(v, int):
            values.setdefault(str(k), int(v))

    setattr(ShapeEnv, setter, record)
    try:
        yield
    finally:
        setattr(ShapeEnv, setter, original)


__all__ = ["draft_values"]
