"""The seed notebook's forward hooks on the eager model, on fake tensors: a second oracle.

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
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ampgraph.capture.driverless import cudnn_rnn_stand_ins
from ampgraph.errors import first_line
from ampgraph.model.build import ModelInputs
from ampgraph.annotate.replay import not_analysable
from ampgraph.settings import Setting
from ampgraph.annotate.strict import StrictDtypeMode
from ampgraph.torchutil import (
    autocast_state,
    dtype_name,
    fake_mode,
    quiet_logging,
    silenced,
    simulated_cuda_amp,
    swapped_tensors,
    torch_dtype,
    unbacked_values,
)


def first_dtype(value: Any) -> str | None:
    """The dtype name the seed's hook prints for a call's input or output (None: no tensor)."""
    # The seed's hook: ``inp[0].dtype if isinstance(inp, (tuple, list)) else inp.dtype``.
    item = value[0] if isinstance(value, (tuple, list)) and value else value
    return dtype_name(item.dtype) if isinstance(item, torch.Tensor) else None


def _line(path: str, in_dtype: str | None, tail: str) -> str:
    return f"[{path}] in={'torch.' + in_dtype if in_dtype else 'None'} -> {tail}"


def eager_hook_lines(
    model: ModelInputs, setting: Setting, unbacked: dict[str, int] | None = None
) -> list[str]:
    """Run ``model`` eagerly in ``setting`` on fake tensors; the hook line of every leaf call.

    Parameters and buffers are fake tensors in the setting's parameter dtype (what
    ``Module.to(dtype)`` does: floating tensors only), inputs keep their dtypes, and autocast is
    enabled for the setting's device type when the setting says so. A call that raises ends the
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
    param_dtype = torch_dtype(setting.param_dtype)

    def make_param(t: torch.Tensor) -> torch.Tensor:
        dtype = param_dtype if t.is_floating_point() else t.dtype
        with fake:
            return torch.empty(t.shape, dtype=dtype, device=device)

    def make_input(t: torch.Tensor) -> torch.Tensor:
        with fake:
            return torch.zeros(t.shape, dtype=t.dtype, device=device)

    lines: list[str] = []
    running: list[tuple[str, str | None]] = []
    handles = []

    def pre(path: str) -> Any:
        def hook(_m: nn.Module, inp: Any, kw: dict[str, Any]) -> None:
            running.append((path, first_dtype(inp if inp else list(kw.values()))))

        return hook

    def post(_m: nn.Module, _inp: Any, _kw: dict[str, Any], out: Any) -> None:
        path, in_dtype = running.pop()
        out_dtype = first_dtype(out)
        lines.append(_line(path, in_dtype, f"out={'torch.' + out_dtype if out_dtype else 'None'}"))

    module = model.module
    for path, mod in module.named_modules():
        if next(iter(mod.children()), None) is None:
            handles.append(mod.register_forward_pre_hook(pre(path), with_kwargs=True))
            handles.append(mod.register_forward_hook(post, with_kwargs=True))
    args, kwargs = pytree.tree_map_only(torch.Tensor, make_input, (model.args, model.kwargs))
    autocast = (
        autocast_state(device, True, torch_dtype(setting.amp_dtype))
        if setting.autocast
        else contextlib.nullcontext()
    )
    try:
        with (
            swapped_tensors(module, make_param),
            silenced("torch._subclasses.fake_tensor"),
            fake,
            # The dtype errors real kernels raise and fake ones skip (strict.STRICT_CHECKS).
            StrictDtypeMode(device),
            # cuDNN RNNs ask the GPU driver first; stand-ins follow the GPU's path without one.
            cudnn_rnn_stand_ins(device),
            torch.no_grad(),
            autocast,
            simulated_cuda_amp(device),
            unbacked_values(unbacked or {}),
            warnings.catch_warnings(),
            quiet_logging(),
        ):
            warnings.simplefilter("ignore")
            try:
                module(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the model's own error: the hook line says it
                path, in_dtype = running[-1] if running else ("(top level)", None)
                message = first_line(exc)
                tail = "error: " if not_analysable(message) is None else "not analysed: "
                lines.append(_line(path, in_dtype, tail + message))
    finally:
        for handle in handles:
            handle.remove()
    return lines


__all__ = ["eager_hook_lines", "first_dtype"]
