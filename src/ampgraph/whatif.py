"""What if some modules ran in fp32? (``ampgraph diff --keep-fp32 PATTERN``.)

The usual fix for a module that misbehaves in 16 bits is an autocast-disabled region (seed 002's
"fp32 wrapper"): ``with torch.autocast(device, enabled=False):`` around the module's forward, its
floating inputs cast to fp32 first. :func:`keep_fp32` does exactly that to the matching modules
of a built model, for as long as the ``with`` lasts, so the ordinary capture traces the region
(``wrap_with_autocast``) and the ordinary annotator and dispatcher check see it as they see any
region written in a model's code. :func:`preview_keep_fp32` analyses a model with and without.

>>> import torch
>>> from ampgraph.analysis import analyze
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
>>> with keep_fp32(net, ["1"]) as kept:
...     r = analyze(net, "autocast=on,device=cpu", args=(torch.randn(2, 4),), check=False)
>>> kept, [n.policy for n in r.nodes if n.op == "aten.linear.default"]
(['1'], ['lower_precision_fp', None])
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ampgraph.errors import AmpgraphError
from ampgraph.records import Report
from ampgraph.settings import Setting

#: Device types whose autocast a region turns off: whichever is enabled when the module runs.
_DEVICE_TYPES = ("cuda", "cpu", "xpu", "mps")


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value


def _fp32_forward(forward: Any) -> Any:
    """``forward`` in an autocast-disabled region with its floating inputs cast to fp32."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        enabled = [d for d in _DEVICE_TYPES if torch.is_autocast_enabled(d)]
        if not enabled:
            return forward(*args, **kwargs)  # nothing to disable: the model as it is
        with torch.autocast(enabled[0], enabled=False):
            args, kwargs = torch.utils._pytree.tree_map(_to_fp32, (args, kwargs))
            return forward(*args, **kwargs)

    return wrapped


def matching_modules(module: nn.Module, patterns: Sequence[str]) -> list[str]:
    """Paths of the submodules that match a pattern (``fnmatch``: ``model.*.fc2``), outermost
    only: a match inside a module already kept in fp32 adds nothing.

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> matching_modules(net, ["*"])
    ['0', '1']
    """
    out: list[str] = []
    for name, _ in module.named_modules():
        if not name or any(name.startswith(p + ".") for p in out):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            out.append(name)
    return out


@contextlib.contextmanager
def keep_fp32(module: nn.Module, patterns: Sequence[str]) -> Iterator[list[str]]:
    """Run the submodules matching ``patterns`` in autocast-disabled regions while it lasts;
    yields their paths. :class:`~ampgraph.errors.AmpgraphError` when none match."""
    names = matching_modules(module, patterns)
    if not names:
        some = ", ".join(n for n, _ in list(module.named_modules())[1:4])
        raise AmpgraphError(
            f"no module matches {', '.join(map(repr, patterns))}: patterns match module paths "
            f"such as {some} ('ampgraph table' lists them), with * and ? as wildcards"
        )
    subs = [module.get_submodule(n) for n in names]
    for sub in subs:
        sub.forward = _fp32_forward(sub.forward)  # an instance attribute shadows the class's
    try:
        yield names
    finally:
        for sub in subs:
            del sub.forward


def preview_keep_fp32(
    spec: str,
    setting: Setting | str,
    patterns: Sequence[str],
    *,
    seq_len: int = 8,
    force: bool = False,
    check: bool = True,
) -> tuple[Report, Report]:
    """``spec`` analysed in ``setting`` as it is and with the matching modules kept in fp32.

    The second report's model reads ``MODEL [PATTERN in fp32]``; its dispatcher check (``check``,
    on the second report only) says whether the region behaves as predicted.
    """
    from ampgraph.analysis import analyze
    from ampgraph.pipeline import prepare

    model = prepare(spec, seq_len=seq_len, force=force)
    before = analyze(model, setting, check=False)  # the model as it is needs no new proof
    with keep_fp32(model.module, patterns) as names:
        after = analyze(model, setting, check=check)
    if not any(n.op == "higher_order.wrap_with_autocast" for n in after.nodes):
        # A torch that cannot trace fake CUDA tensors traces on meta, without autocast: the
        # wrapper then has nothing to disable, and B would silently equal A.
        raise AmpgraphError(
            f"{', '.join(names)} traced without an autocast region here "
            f"({(after.capture or {}).get('method')}): preview with --device cpu, or on a CUDA "
            "build of torch"
        )
    after.model = f"{before.model} [{' '.join(patterns)} in fp32]"
    return before, after


__all__ = ["keep_fp32", "matching_modules", "preview_keep_fp32"]
