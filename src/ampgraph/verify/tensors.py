"""Real tensors for a captured graph: random weights, the example inputs on a device.

Values never change a dtype; the random seed of the generator makes runs repeat.

>>> g = torch.Generator().manual_seed(0)
>>> random_like((2, 3), torch.float32, torch.device("cpu"), g).dtype
torch.float32
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from ampgraph.capture.grad_params import requires_grad
from ampgraph.capture.trace import Capture
from ampgraph.errors import VerifyError
from ampgraph.model.build import ModelInputs


def _is_real(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not (t.is_meta or isinstance(t, FakeTensor))


#: Random values are drawn for at most this many elements per tensor and tiled over the rest:
#: drawing 125M normal values takes ~1 s on a CPU core, tiling them ~0.1 s.
RANDOM_POOL = 1 << 16


def random_like(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """A real tensor for a parameter, buffer or input whose values are not known.

    Floating tensors get small normal values (finite, like an initialised model), drawn from
    ``gen`` for the first :data:`RANDOM_POOL` elements and repeated over the rest. Integer
    tensors get zeros and bool tensors ones: an integer buffer is most often an index (position
    ids, an embedding's row), and 0 is in range for any non-empty table; an all-true mask keeps
    every row attended.

    >>> g = torch.Generator().manual_seed(0)
    >>> random_like((2, 3), torch.int64, torch.device("cpu"), g).tolist()
    [[0, 0, 0], [0, 0, 0]]
    """
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    if not (dtype.is_floating_point or dtype.is_complex):
        return t.fill_(True) if dtype == torch.bool else t.zero_()
    flat = t.view(-1)
    pool = torch.empty(min(flat.numel(), RANDOM_POOL), dtype=dtype, device=device)
    pool.normal_(0.0, 0.02, generator=gen)
    whole = flat.numel() // max(pool.numel(), 1) * pool.numel()
    if whole:
        flat[:whole].view(-1, pool.numel()).copy_(pool.expand(whole // pool.numel(), -1))
    flat[whole:].copy_(pool[: flat.numel() - whole])
    return t


def _signature_order(module: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs in the order of ``forward``'s parameters (how torch.export flattens them)."""
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return dict(kwargs)
    ordered = {k: kwargs[k] for k in names if k in kwargs}
    ordered.update({k: v for k, v in kwargs.items() if k not in ordered})
    return ordered


def _matches(value: Any, placeholder: fx.Node) -> bool:
    val = placeholder.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (
            isinstance(value, torch.Tensor)
            and tuple(value.shape) == tuple(val.shape)
            and value.dtype == val.dtype
        )
    return not isinstance(value, torch.Tensor)


def real_inputs(
    model: ModelInputs, device: torch.device, gen: torch.Generator
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's example inputs as real tensors on ``device``.

    Real example inputs keep their values (OPT's synthesised token ids are in range); meta or
    fake ones are made up with :func:`random_like`.
    """

    def make(t: torch.Tensor) -> torch.Tensor:
        if _is_real(t):
            return t.detach().to(device)
        return random_like(t.shape, t.dtype, device, gen)

    args, kwargs = pytree.tree_map_only(torch.Tensor, make, (model.args, model.kwargs))
    return tuple(args), dict(kwargs)


def graph_inputs(
    cap: Capture,
    model: ModelInputs,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    gen: torch.Generator,
    known: Mapping[str, torch.Tensor] | None = None,
) -> list[Any]:
    """A real value for every placeholder of the captured graph, in placeholder order.

    Parameters, buffers and constants are made from the placeholder's recorded shape and dtype
    (already the setting's parameter dtype), or taken from ``known`` (qualified name -> tensor:
    real weights, as ``ampgraph ranges`` uses); user inputs are ``args``/``kwargs`` flattened as
    torch.export flattens them.
    """
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    user = [p for p in placeholders if cap.input_kinds.get(p.name, ("input",))[0] == "input"]
    leaves = None
    for candidate in (_signature_order(model.module, kwargs), kwargs):
        flat = pytree.tree_leaves((args, candidate))
        if len(flat) == len(user) and all(_matches(v, p) for v, p in zip(flat, user)):
            leaves = flat
            break
    if leaves is None:
        raise VerifyError(
            f"the example inputs of {model.name!r} do not match the captured graph's inputs: "
            "pass the same args/kwargs that were traced"
        )
    by_user = dict(zip((p.name for p in user), leaves))
    values: list[Any] = []
    for p in placeholders:
        if p.name in by_user:
            values.append(by_user[p.name])
            continue
        kind, target = cap.input_kinds.get(p.name, ("parameter", p.name))
        if known is not None and target in known:
            values.append(known[target])
            continue
        val = p.meta.get("val")
        if not isinstance(val, torch.Tensor):
            values.append(val)
            continue
        held = getattr(cap.graph_module, target, None) if kind == "constant" else None
        if isinstance(held, torch.Tensor) and _is_real(held):
            values.append(held.detach().to(device))  # a lifted constant's real value
        else:
            made = random_like(val.shape, val.dtype, device, gen)
            # A parameter that requires grad makes matmul fold (capture/grad_params).
            grad = kind == "parameter" and requires_grad(p) and made.is_floating_point()
            values.append(made.requires_grad_() if grad else made)
    return values


def module_tensors(cap: Capture, values: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Qualified parameter/buffer name -> the real tensor the graph ran with."""
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    out: dict[str, torch.Tensor] = {}
    for p, value in zip(placeholders, values):
        kind, target = cap.input_kinds.get(p.name, ("input", p.name))
        if kind in ("parameter", "buffer") and isinstance(value, torch.Tensor):
            out[target] = value
    return out


__all__ = ["RANDOM_POOL", "graph_inputs", "module_tensors", "random_like", "real_inputs"]
