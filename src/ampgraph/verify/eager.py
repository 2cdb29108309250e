"""The eager model on real tensors, with the seed notebook's forward hook on every leaf module.

The module (built on meta) gets the very tensors the captured graph ran with, so the hook lines
(``[path] in=torch.float32 -> out=torch.bfloat16``) can be compared call by call with the
annotation's module view: that catches a capture that drifted from the eager model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampgraph.capture.trace import Capture
from ampgraph.errors import first_line
from ampgraph.verify.hooks import first_dtype
from ampgraph.model.build import ModelInputs
from ampgraph.torchutil import swapped_tensors, torch_dtype
from ampgraph.verify.execution import real_autocast
from ampgraph.verify.tensors import module_tensors, random_like


@dataclass
class HookCall:
    """One leaf-module call as the seed notebook's forward hook saw it."""

    path: str
    type: str
    in_dtype: str | None
    out_dtype: str | None = None
    error: str | None = None

    def hook_line(self) -> str:
        def name(d: str | None) -> str:
            return f"torch.{d}" if d else "None"

        tail = f"error: {self.error}" if self.error else f"out={name(self.out_dtype)}"
        return f"[{self.path}] in={name(self.in_dtype)} -> {tail}"


def run_eager(
    model: ModelInputs,
    cap: Capture,
    values: Sequence[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    gen: torch.Generator,
) -> list[HookCall]:
    """Run the eager model on the graph's real tensors with the seed's hooks on leaf modules.

    The module (built on meta) gets the very tensors the graph ran with, in the setting's
    parameter dtype as ``model.to(dtype)`` leaves them; tied weights stay tied. A leaf call
    that raises is recorded with its error, and the run stops there, as the notebook's would.
    """
    by_name = module_tensors(cap, values)
    names: dict[int, list[str]] = {}
    for name, t in [
        *model.module.named_parameters(remove_duplicate=False),
        *model.module.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(id(t), []).append(name)
    param_dtype = torch_dtype(cap.setting.param_dtype)

    def make(t: torch.Tensor) -> torch.Tensor:
        for name in names.get(id(t), []):
            if name in by_name:
                return by_name[name]
        dtype = param_dtype if t.is_floating_point() else t.dtype  # what Module.to(dtype) does
        return random_like(t.shape, dtype, device, gen)  # not used by the traced forward

    calls: list[HookCall] = []
    running: list[HookCall] = []
    handles = []

    def pre_hook(path: str, type_: str) -> Callable[..., None]:
        def hook(m: nn.Module, inp: Any, kw: dict[str, Any]) -> None:
            first = inp if inp else list(kw.values())
            running.append(HookCall(path, type_, first_dtype(first)))

        return hook

    def post_hook(m: nn.Module, inp: Any, kw: dict[str, Any], out: Any) -> None:
        call = running.pop()
        call.out_dtype = first_dtype(out)
        calls.append(call)

    for path, mod in model.module.named_modules():
        if next(iter(mod.children()), None) is not None:
            continue
        type_ = type(mod).__name__
        handles.append(mod.register_forward_pre_hook(pre_hook(path, type_), with_kwargs=True))
        handles.append(mod.register_forward_hook(post_hook, with_kwargs=True))
    try:
        with (
            swapped_tensors(model.module, make),
            torch.inference_mode(),
            real_autocast(cap.setting),
        ):
            try:
                model.module(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the model's own error, maybe predicted
                failing = running[-1] if running else HookCall("(top level)", "", None)
                failing.error = first_line(exc)
                calls.append(failing)
    finally:
        for handle in handles:
            handle.remove()
    return calls


__all__ = ["HookCall", "run_eager"]
