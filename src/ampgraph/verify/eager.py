"""The eager model on real tensors, with the seed notebook's forward hook on every leaf module.

The module (built on meta) gets the very tensors the captured graph ran with, so the hook lines
(``[path] in=torch.float32 -> out=torch.bfloat16``) can be compared call by call with the
annotation's module view: that catches a capture that drifted from the eager model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ampgraph.capture.trace import Capture
from ampgraph.model.build import ModelInputs
from ampgraph.torchutil import forward_grad_mode, swapped_tensors, torch_dtype
from ampgraph.verify.execution import real_autocast
from ampgraph.verify.hooks import HookCall, LeafHooks
from ampgraph.verify.tensors import module_tensors, random_like


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

    with (
        LeafHooks(model.module) as hooks,
        swapped_tensors(model.module, make),
        forward_grad_mode(cap.training),  # the pass's own, as the capture traced it
        real_autocast(cap.setting),
    ):
        try:
            model.module(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the model's own error, maybe predicted
            hooks.failed(exc)
    return hooks.calls


def refuse_changing_forward(hooks: Sequence[HookCall], observed: dict[str, Any]) -> None:
    """Raise :class:`~ampgraph.errors.NotDeterministicError` where the eager run raised in the
    forward's own code (outside its leaf modules) although
    the same forward ran when it was captured and its graph ran node by node without an error:
    the model behaves differently from call to call (a forward that raises on its second call),
    which is no disagreement between the annotations and real execution.

    >>> refuse_changing_forward([HookCall("(top level)", "", None, error="RuntimeError: 2nd")], {})
    Traceback (most recent call last):
    ...
    ampgraph.errors.NotDeterministicError: the model's forward is not deterministic: it ran when ...
    """
    from ampgraph.errors import NotDeterministicError

    # Only an error in the forward's own code, outside every leaf module: a leaf's error may be
    # a real kernel's, which the fake kernels the graph was captured with did not raise.
    failed = [h for h in hooks if h.error is not None and h.path == "(top level)"]
    if not failed or any(getattr(o, "error", None) for o in observed.values()):
        return  # the graph's real run raised too: an error the annotations may predict
    if any(getattr(o, "not_comparable", None) for o in observed.values()):
        # The graph's real run left the captured path (a top-k its real dtypes decide otherwise
        # than the capture's fp32 draft run): it never reached the node the error is at, and
        # the eager run took the other path; the nodes past the branch are not comparable.
        return
    raise NotDeterministicError(
        "the model's forward is not deterministic: it ran when ampgraph captured it and its graph "
        f"ran node by node, then raised when called again for real ({failed[-1].error}); "
        "verify needs a forward that does the same on every call"
    )


__all__ = ["HookCall", "refuse_changing_forward", "run_eager"]
