"""The words of a node record's ``reason`` that do not depend on the replay: why an op without
an autocast policy runs as called, why one with an autocast kernel of unknown rule is not
analysed, and the list of casts autocast made. :mod:`ampgraph.annotate.annotator` decides which
applies; the text is here, one place for the wording the reports, diffs and audits show.

>>> from ampgraph.report.records import Cast
>>> casts_said([Cast("linear", "bfloat16", "float32")])
'casts linear bf16->fp32'
"""

from __future__ import annotations

import torch

from ampgraph import policy as P
from ampgraph.report.records import Cast
from ampgraph.settings import short_dtype


def no_policy_reason(op: torch._ops.OpOverload, enabled: bool, device_type: str) -> str:
    """Why an op without a policy runs as it does: autocast is off (``enabled`` False on the
    setting's device), or has no entry for it.

    >>> no_policy_reason(torch.ops.aten.relu.default, True, "cpu")
    "no autocast policy: runs in its inputs' dtype"
    """
    if not enabled:
        return "autocast off here: runs as called"
    if op.namespace != "aten":
        # Not ATen's lists' silence: nobody registered a kernel (register_autocast).
        return (
            f"no autocast rule for {op.name()} on {device_type}: runs in "
            "its inputs' dtype and returns what its kernel returns"
        )
    return "no autocast policy: runs in its inputs' dtype"


def opaque_reason(op: torch._ops.OpOverload, device_type: str) -> str:
    """Why a node whose op has an autocast kernel of unknown rule is not analysed.

    >>> opaque_reason(torch.ops.aten.relu.default, "cpu").split(":")[0]
    'opaque autocast kernel'
    """
    if op.namespace == "aten":
        return (
            f"opaque autocast kernel: ATen registers an autocast kernel for {op.name()} on "
            f"{device_type} that ampgraph's tables (torch {P.release_in_use()}) lack; its dtypes "
            "are what that kernel returned, not a prediction"
        )
    rule = P.library_rule(device_type, op.name())
    where = f": {rule.source}" if rule is not None else ""
    return (
        f"opaque autocast kernel: {op.name()} has an autocast kernel on {device_type} whose rule "
        f"ampgraph does not know{where}; its dtypes are what that kernel returned, not a "
        "prediction"
    )


def casts_said(casts: list[Cast]) -> str:
    """``casts a bf16->fp32, b bf16->fp32``, or ``no cast needed``: a reason's list of casts.

    >>> casts_said([])
    'no cast needed'
    """
    if not casts:
        return "no cast needed"
    return "casts " + ", ".join(
        f"{c.node} {short_dtype(c.from_dtype)}->{short_dtype(c.to_dtype)}" for c in casts
    )
