"""The seed notebook's forward hooks on the eager model (one hook loop), on fake tensors here.

:class:`LeafHooks` is the hook loop both eager oracles share: :func:`eager_hook_lines` runs it on
fake tensors, :func:`ampgraph.verify.eager.run_eager` on real ones.

The dispatcher check (:mod:`ampgraph.annotate.check`) replays the *captured graph*; this runs the user's
*eager module* itself, as the seed notebook did, with the real autocast kernels (CUDA's included,
without a GPU, DESIGN.md fact 3) on fake tensors, and prints one hook line per leaf-module call.
It shares nothing with the annotator, so comparing its lines with ``Report.modules`` catches a
capture that drifted from the eager model, a leaf the graph does not show (``nn.Identity``), and
any annotation the graph replay and the annotator agree on wrongly.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> from ampgraph.settings import Setting
>>> lin = ModelInputs("linear", torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity()),
...                   (torch.randn(2, 4),))
>>> for line in eager_hook_lines(lin, Setting.parse("amp-fp32")):
...     print(line)
[0] in=torch.float32 -> out=torch.bfloat16
[1] in=torch.bfloat16 -> out=torch.bfloat16
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._dispatch.python import enable_python_dispatcher
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.annotate.replay import not_analysable, python_kernels_follow
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.capture.casts import cast_outputs
from ampgraph.capture.data_reads import DataReads
from ampgraph.capture.driverless import cudnn_rnn_stand_ins
from ampgraph.capture.known_values import (
    INPUT_LIMIT,
    KnownValues,
    real_run_answers,
    remembering,
)
from ampgraph.errors import first_line
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import (
    autocast_state,
    dtype_name,
    fake_mode,
    quiet_logging,
    silenced,
    simulated_cuda_amp,
    swapped_tensors,
    torch_dtype,
    traced_grad_mode,
    unbacked_values,
)


def first_dtype(value: Any) -> str | None:
    """The dtype name the seed's hook prints for a call's input or output (None: no tensor).

    >>> first_dtype((torch.ones(1, dtype=torch.bfloat16), 3)), first_dtype([3])
    ('bfloat16', None)
    """
    # The seed's hook: ``inp[0].dtype if isinstance(inp, (tuple, list)) else inp.dtype``.
    item = value[0] if isinstance(value, (tuple, list)) and value else value
    return dtype_name(item.dtype) if isinstance(item, torch.Tensor) else None


@dataclass
class HookCall:
    """One leaf-module call as the seed notebook's forward hook saw it."""

    path: str
    type: str
    in_dtype: str | None
    out_dtype: str | None = None
    error: str | None = None
    #: The error is one fake tensors cannot follow (:func:`~ampgraph.annotate.replay.not_analysable`),
    #: not the model's own: the line says ``not analysed``.
    not_analysed: bool = False

    def hook_line(self) -> str:
        """``[path] in=torch.float32 -> out=torch.bfloat16`` (or ``-> error: ...``).

        >>> HookCall("fc", "Linear", "float32", error="boom").hook_line()
        '[fc] in=torch.float32 -> error: boom'
        """

        def name(d: str | None) -> str:
            return f"torch.{d}" if d else "None"

        if self.error:
            tail = f"{'not analysed' if self.not_analysed else 'error'}: {self.error}"
        else:
            tail = f"out={name(self.out_dtype)}"
        return f"[{self.path}] in={name(self.in_dtype)} -> {tail}"


class LeafHooks:
    """The seed notebook's forward hooks on every leaf module of ``module`` while it lasts: the
    one hook loop of both eager oracles, on fake tensors (:func:`eager_hook_lines`) and on real
    ones (:func:`ampgraph.verify.eager.run_eager`).

    ``calls`` lists each leaf call as it returns; a call that raises is added by :meth:`failed`,
    and ends the list, as the notebook's run would end.

    >>> lin = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> with LeafHooks(lin) as hooks:
    ...     _ = lin(torch.ones(1, 2))
    >>> [c.hook_line() for c in hooks.calls]
    ['[0] in=torch.float32 -> out=torch.float32']
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.calls: list[HookCall] = []
        self._running: list[HookCall] = []
        self._handles: list[Any] = []

    def __enter__(self) -> LeafHooks:  # noqa: PYI034 - a final class of its own
        for path, mod in self.module.named_modules():
            if next(iter(mod.children()), None) is not None:
                continue
            pre = self._pre_hook(path, type(mod).__name__)
            self._handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._post_hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, path: str, type_: str) -> Callable[..., None]:
        def hook(_m: nn.Module, inp: Any, kw: dict[str, Any]) -> None:
            self._running.append(
                HookCall(path, type_, first_dtype(inp if inp else list(kw.values())))
            )

        return hook

    def _post_hook(self, _m: nn.Module, _inp: Any, _kw: dict[str, Any], out: Any) -> None:
        call = self._running.pop()
        call.out_dtype = first_dtype(out)
        self.calls.append(call)

    def failed(self, exc: BaseException) -> HookCall:
        """Record that the run raised ``exc`` in the innermost running call (or at top level)."""
        failing = self._running[-1] if self._running else HookCall("(top level)", "", None)
        failing.error = first_line(exc)
        self.calls.append(failing)
        return failing


@in_analysis_environment
def eager_hook_lines(
    model: ModelInputs, setting: Setting, unbacked: dict[str, int] | None = None
) -> list[str]:
    """:func:`_eager_hook_lines`; where a data-dependent size, or one computed from it, reached a
    C++ kernel that takes only numbers (GLM-5-Next's indexer pads to a fixed width, VITS pads a
    boolean-mask selection), the run again through torch's Python kernels, which compute the
    output's size from the expression, as the capture's trace does
    (:data:`ampgraph.annotate.replay.PYTHON_KERNELS_FOLLOW`)."""
    lines = _eager_hook_lines(model, setting, unbacked)
    if not lines or not python_kernels_follow(lines[-1]):
        return lines
    return _eager_hook_lines(model, setting, unbacked, python_kernels=True)


def _eager_hook_lines(
    model: ModelInputs,
    setting: Setting,
    unbacked: dict[str, int] | None = None,
    python_kernels: bool = False,
) -> list[str]:
    """Run ``model`` eagerly in ``setting`` on fake tensors; the hook line of every leaf call.

    Parameters and buffers are fake tensors in the setting's parameter dtype (what
    ``Module.to(dtype)`` does: floating tensors only; a recipe's setting may keep the buffers in
    their own), inputs keep their dtypes unless the setting casts them, outputs are cast where it
    says, and autocast is enabled for the setting's device type when the setting says so. A call that raises ends the
    run, as it would the notebook's: its line is ``[path] in=... -> error: <first line>``. Fake
    kernels skip some dtype checks of the real ones; those are raised as the real kernels do
    (:data:`ampgraph.annotate.strict.STRICT_CHECKS`, proven on the CPU against real runs).

    Fake tensors have no values, so a branch on a data-dependent size (``if boxes.numel() ==
    0`` after NMS) ends the run as ``not analysed``, unless ``unbacked`` gives each such size a
    value (a report's ``capture["unbacked_values"]``): the run then takes the path the capture
    took. Only sizes come from there; every dtype is still the eager kernels' own.
    """
    fake = fake_mode()
    device = setting.device_type

    def dtype_for(t: torch.Tensor, kind: str) -> torch.dtype:
        # The setting's dtype for a floating parameter, buffer or input (a recipe's casts).
        name = setting.floating_dtype(kind) if t.is_floating_point() else None
        return t.dtype if name is None else torch_dtype(name)

    def make_param(t: torch.Tensor) -> torch.Tensor:
        dtype = dtype_for(t, "parameter" if isinstance(t, nn.Parameter) else "buffer")
        with fake:
            return torch.empty(t.shape, dtype=dtype, device=device)

    def make_input(t: torch.Tensor) -> torch.Tensor:
        with fake:
            return torch.zeros(t.shape, dtype=dtype_for(t, "input"), device=device)

    module = model.module
    known: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    # The integer inputs' real values, as the capture follows them (an all-ones mask dropped).
    follow = remembering(make_input, known, INPUT_LIMIT)
    args, kwargs = pytree.tree_map_only(torch.Tensor, follow, (model.args, model.kwargs))
    autocast = (
        autocast_state(device, True, torch_dtype(setting.amp_dtype))
        if setting.autocast
        else contextlib.nullcontext()
    )
    values = KnownValues(known)
    with (
        LeafHooks(module) as hooks,
        cast_outputs(module, setting),  # a recipe's output cast, as the capture traces it
        swapped_tensors(module, remembering(make_param, known)),
        DataReads(),  # Python's reads of data no op records, as the capture makes them
        values,  # sizes kept in integer buffers, integer inputs: as the capture follows them
        real_run_answers(values),
        silenced("torch._subclasses.fake_tensor"),
        fake,
        # The dtype errors real kernels raise and fake ones skip (strict.STRICT_CHECKS).
        StrictDtypeMode(device),
        # cuDNN RNNs ask the GPU driver first; stand-ins follow the GPU's path without one.
        cudnn_rnn_stand_ins(device),
        traced_grad_mode(False),  # inference, as the capture traces the forward
        autocast,
        simulated_cuda_amp(device),
        unbacked_values(unbacked or {}),
        enable_python_dispatcher() if python_kernels else contextlib.nullcontext(),
        warnings.catch_warnings(),
        quiet_logging(),
    ):
        warnings.simplefilter("ignore")
        try:
            module(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the model's own error: the hook line says it
            failing = hooks.failed(exc)
            failing.not_analysed = not_analysable(failing.error or "") is not None
    return [call.hook_line() for call in hooks.calls]


__all__ = ["HookCall", "LeafHooks", "eager_hook_lines", "first_dtype"]
