"""Where each of a traced graph's outputs sits in what the model returns.

>>> output_paths(None)
[]
"""

from __future__ import annotations

from typing import Any

from torch.utils import _pytree as pytree


def output_paths(spec: pytree.TreeSpec | None) -> list[str]:
    """Each flat output's place in the model's return value (``spec``, the tree of its
    outputs), keys and indices joined by dots.

    >>> import torch
    >>> class Two(torch.nn.Module):
    ...     def forward(self, x):
    ...         return {"out": x + 1, "aux": (x * 2, x - 1)}
    >>> output_paths(torch.export.export(Two(), (torch.ones(2),)).call_spec.out_spec)
    ['out', 'aux.0', 'aux.1']
    """
    if spec is None:
        return []
    structure = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    try:
        flat = pytree.tree_flatten_with_path(structure)[0]
    except ValueError:
        # A type registered without key paths (transformers < 4.50's ModelOutput): read the
        # keys from the spec itself, where such types keep them as their context.
        return _spec_paths(spec, [])
    paths = []
    for path, _leaf in flat:
        parts = []
        for key in path:
            part = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
            parts.append(str(part))
        paths.append(".".join(parts))
    return paths


def _spec_paths(spec: pytree.TreeSpec, prefix: list[str]) -> list[str]:
    """The leaves' paths of ``spec``: a context that lists one key per child names them (a dict,
    a ModelOutput), a namedtuple its fields; anything else is numbered."""
    if spec.is_leaf():
        return [".".join(prefix)]
    # torch 2.14 deprecates the attribute for a method; 2.13 has only the attribute.
    children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
    context = spec.context
    keys: list[Any] = list(range(len(children)))
    if isinstance(context, (list, tuple)) and len(context) == len(children):
        keys = list(context)
    elif isinstance(context, type) and len(getattr(context, "_fields", ())) == len(children):
        keys = list(context._fields)
    return [
        p for key, child in zip(keys, children) for p in _spec_paths(child, [*prefix, str(key)])
    ]


__all__ = ["output_paths"]
