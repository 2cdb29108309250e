"""Real tensors for a captured graph: random weights, the example inputs on a device.

Values never change a dtype; the random seed of the generator makes runs repeat. Sizes are
another matter: a graph traced along a data path (``export-data-path``, ``draft-export``) is the
path the capture's draft run took on its seeded values, so with seed 0 verify runs on those very
values (:func:`draft_tensors`), and its data-dependent sizes are the capture's.

>>> g = torch.Generator().manual_seed(0)
>>> random_like((2, 3), torch.float32, torch.device("cpu"), g).dtype
torch.float32
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from ampgraph.capture.draft_export import draft_values
from ampgraph.capture.grad_params import requires_grad
from ampgraph.capture.known_values import follows
from ampgraph.capture.trace import DATA_PATH_METHODS, Capture
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


@dataclass
class DraftTensors:
    """The values the capture's draft run used, on the real device (:func:`draft_tensors`)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: qualified parameter/buffer name -> its value in the graph's dtype (``graph_inputs(known=)``)
    tensors: dict[str, torch.Tensor]


def draft_tensors(
    cap: Capture, model: ModelInputs, device: torch.device, random_seed: int = 0
) -> DraftTensors | None:
    """The inputs, parameters and buffers the capture's draft run ran ``model`` on
    (:func:`ampgraph.capture.draft_export.draft_values`), for a graph traced along its data path and
    the seed it used (0); None otherwise. Parameters and buffers come in the graph's dtypes (the
    setting's), parameters requiring grad as in the model.

    >>> from ampgraph.capture.trace import capture
    >>> from ampgraph.settings import Setting
    >>> lin = ModelInputs("lin", nn.Linear(2, 2), (torch.ones(1, 2),))
    >>> cap = capture(lin, Setting.parse("fp32", device_type="cpu"))
    >>> draft_tensors(cap, lin, torch.device("cpu")) is None     # no branch on data: no draft
    True
    """
    if random_seed != 0 or not cap.method.endswith(DATA_PATH_METHODS):
        return None
    args, kwargs, made = draft_values(model)
    by_name = {
        name: made[id(t)]
        for name, t in [
            *model.module.named_parameters(remove_duplicate=False),
            *model.module.named_buffers(remove_duplicate=False),
        ]
        if id(t) in made
    }
    tensors: dict[str, torch.Tensor] = {}
    for p in cap.graph_module.graph.nodes:
        kind, target = cap.input_kinds.get(p.name, ("input", p.name))
        val = p.meta.get("val") if p.op == "placeholder" else None
        if kind not in ("parameter", "buffer") or target not in by_name or val is None:
            continue
        made_here = by_name[target].to(device=device, dtype=val.dtype)
        grad = kind == "parameter" and requires_grad(p) and made_here.is_floating_point()
        tensors[target] = made_here.requires_grad_() if grad else made_here
    args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().to(device), (args, kwargs)
    )
    return DraftTensors(tuple(args), dict(kwargs), tensors)


def real_inputs(
    model: ModelInputs,
    device: torch.device,
    gen: torch.Generator,
    draft: DraftTensors | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's example inputs as real tensors on ``device``.

    Real example inputs keep their values (OPT's synthesised token ids are in range); meta or
    fake ones are made up with :func:`random_like`, or are the ``draft`` run's.
    """
    if draft is not None:
        return draft.args, draft.kwargs

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
    # Sizes kept in integer buffers, which the capture followed on their values: the same here.
    own = {n: t for n, t in model.module.named_buffers(remove_duplicate=False) if follows(t)}
    values: list[Any] = []
    for p in placeholders:
        if p.name in by_user:
            values.append(by_user[p.name])
            continue
        kind, target = cap.input_kinds.get(p.name, ("parameter", p.name))
        if known is not None and target in known:
            values.append(known[target])
            continue
        if kind == "buffer" and target in own:
            values.append(own[target].detach().to(device))
            continue
        val = p.meta.get("val")
        if not isinstance(val, torch.Tensor):
            values.append(val)
            continue
        held = _constant(cap, target, val) if kind == "constant" else None
        if held is not None:
            values.append(held.detach().to(device))  # a lifted constant's real value
        else:
            made = random_like(val.shape, val.dtype, device, gen)
            # A parameter that requires grad makes matmul fold (capture/grad_params).
            grad = kind == "parameter" and requires_grad(p) and made.is_floating_point()
            values.append(made.requires_grad_() if grad else made)
    return values


def _constant(cap: Capture, target: str, val: torch.Tensor) -> torch.Tensor | None:
    """A lifted constant's real value: held by the graph module, or, for one the forward made
    from Python data under fake tensors (``torch.as_tensor(self.image_mean)``, anchors), the
    real tensor its fake value keeps (``FakeTensor.constant``); None where neither has one."""
    held = getattr(cap.graph_module, target, None)
    for candidate in (held, getattr(val, "constant", None)):
        if isinstance(candidate, torch.Tensor) and _is_real(candidate):
            return candidate
    return None


def module_tensors(cap: Capture, values: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Qualified parameter/buffer name -> the real tensor the graph ran with."""
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    out: dict[str, torch.Tensor] = {}
    for p, value in zip(placeholders, values):
        kind, target = cap.input_kinds.get(p.name, ("input", p.name))
        if kind in ("parameter", "buffer") and isinstance(value, torch.Tensor):
            out[target] = value
    return out


__all__ = [
    "RANDOM_POOL",
    "DraftTensors",
    "draft_tensors",
    "graph_inputs",
    "module_tensors",
    "random_like",
    "real_inputs",
]
