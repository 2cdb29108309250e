"""Higher-order ops the capture records whole, and what autocast does at them: ``flex_attention``.

A model that calls ``torch.nn.attention.flex_attention.flex_attention`` is captured with the
op as one node (``higher_order.flex_attention``, its score and mask functions as subgraphs; the
capture calls the op directly instead of through flex's own ``torch.compile``). Autocast has a
kernel for it from torch 2.11 (:func:`ampgraph.compat.flex_attention_autocast_casts_qkv`) that
casts query, key and value to autocast's dtype, and nothing else: no table entry says so, since
the op is not an ATen op, so the rule is here.

>>> is_flex_attention(torch.ops.aten.mm.default)
False
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ampgraph import compat
from ampgraph import policy as P
from ampgraph.settings import short_dtype
from ampgraph.torchutil import device_type_of, dtype_name


def is_flex_attention(target: Any) -> bool:
    """Whether ``target`` is the ``flex_attention`` higher-order op."""
    if not isinstance(target, torch._ops.HigherOrderOperator) or target.name() != "flex_attention":
        return False
    from torch._higher_order_ops.flex_attention import flex_attention

    return target is flex_attention


def flex_attention(
    annotator: Any, n: fx.Node, args: tuple[Any, ...], run: Callable[[tuple[Any, ...]], Any]
) -> tuple[Any, dict[str, Any]]:
    """Run the op as autocast would (``run`` calls it with the given arguments): its value and
    the record's fields (policy, casts, reason)."""
    device_type = device_type_of(args[0])
    enabled, lower = annotator.state.states.get(device_type, (False, torch.bfloat16))
    casts: list[Any] = []
    policy, why = None, "no autocast kernel for flex_attention on this torch: runs as called"
    if not enabled:
        why = "autocast is off here: flex_attention runs as called"
    elif compat.flex_attention_autocast_casts_qkv():
        qkv, _, casts = annotator._cast_all(args[:3], {}, lower, device_type, n, "(flex input)")
        args = (*qkv, *args[3:])
        policy = P.LOWER_PRECISION_FP
        said = ", ".join(f"{c.node} {short_dtype(c.from_dtype)}->{short_dtype(c.to_dtype)}"
                         for c in casts) or "nothing to cast"  # fmt: skip
        why = (f"autocast's flex_attention kernel casts query, key and value to "
               f"{short_dtype(dtype_name(lower))}: {said}")  # fmt: skip
    return run(args), {"policy": policy, "casts": casts, "reason": why}
