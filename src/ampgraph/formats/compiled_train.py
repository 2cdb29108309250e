"""The compiled training step as text: the backward's autocast state, gradients, and what differs.

>>> from ampgraph.compiled.flow import CompiledFlow
>>> from ampgraph.compiled.flow import BackwardOp, CompiledTrain, Gradient
>>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {"emulate_precision_casts": False})
>>> t = CompiledTrain(f, f, "same_as_forward", "same_as_forward", True, [Gradient("w", "float32", "float32")])
>>> print(autocast_line(t))
the compiled backward is traced under autocast (backward_pass_autocast=same_as_forward; torch 2.14.1's default: same_as_forward)
"""

from __future__ import annotations

import json

from ampgraph.compiled.flow import BackwardOp, CompiledTrain
from ampgraph.formats import compiled as text

Changes = list[tuple[BackwardOp, BackwardOp]]


def autocast_line(t: CompiledTrain) -> str:
    """Which autocast state the compiled backward is traced in, and why."""
    state = "under autocast" if t.backward_autocast else "with autocast off"
    default = t.release_default or "unknown (outside the supported releases)"
    return (f"the compiled backward is traced {state} (backward_pass_autocast="
            f"{t.backward_pass_autocast}; torch {t.forward.torch_version}'s default: {default})")  # fmt: skip


def gradient_lines(t: CompiledTrain) -> list[str]:
    """Each trainable parameter's gradient dtype."""
    return [f"  grad {g.input}: {g.dtype}" + ("" if g.dtype == g.param_dtype else
                                               f" (parameter {g.param_dtype})")
            for g in t.gradients]  # fmt: skip


def change_lines(changes: Changes, other: str) -> list[str]:
    """The backward ops whose dtype the autocast state changes, against ``other``'s."""
    lines = [f"{len(changes)} backward op(s) in another dtype than under "
             f"backward_pass_autocast={other}"]  # fmt: skip
    lines += [f"  {a.name}  {a.op}  ({a.module or 'top'})  {a.dtype}, {other}: {b.dtype}"
              for a, b in changes]  # fmt: skip
    return lines


def table_lines(t: CompiledTrain) -> list[str]:
    """The step: autocast state, gradients, then the backward's per-node table."""
    return [autocast_line(t), "gradients:", *gradient_lines(t),
            f"forward: {len(t.forward.dropped())} eager rounding(s) dropped "
            f"in {len(t.forward.kernels)} kernels",
            "backward:", *text.table_lines(t.backward)]  # fmt: skip


def diff_lines(t: CompiledTrain, changes: Changes | None, other: str) -> list[str]:
    """What the compiled step rounds differently from eager, forward and backward."""
    lines = [autocast_line(t), "forward: " + text.diff_lines(t.forward)[0]]
    lines += text.diff_lines(t.forward)[1:]
    lines += ["backward: " + text.diff_lines(t.backward)[0], *text.diff_lines(t.backward)[1:]]
    if changes is not None:
        lines += change_lines(changes, other)
    return lines


def audit_lines(t: CompiledTrain, changes: Changes | None, other: str) -> list[str]:
    """Findings: the fused kernels of both passes, and a backward whose autocast is not eager's."""
    lines = [x for x in text.audit_lines(t.forward) + text.audit_lines(t.backward)
             if x.startswith("warning")]  # fmt: skip
    if changes and t.backward_autocast:
        names = ", ".join(f"{a.name} ({a.module or 'top'})" for a, _ in changes)
        lines.append(
            f"warning: the compiled backward runs {len(changes)} op(s) in another dtype than "
            f"eager's AMP recipe (backward() outside autocast): {names}. torch.compile traces the "
            f"backward under the forward's autocast (backward_pass_autocast="
            f"{t.backward_pass_autocast}). For eager's gradients: "
            "torch._functorch.config.backward_pass_autocast = 'off'"
        )
    return lines or [f"no finding ({autocast_line(t)})"]


def step_table(t: CompiledTrain, *, changes: Changes | None, other: str) -> str:
    """``ampgraph compiled --pass train``: :func:`table_lines`."""
    return "\n".join(table_lines(t))


def step_diff(t: CompiledTrain, *, changes: Changes | None, other: str) -> str:
    """``--view diff``: :func:`diff_lines`."""
    return "\n".join(diff_lines(t, changes, other))


def step_audit(t: CompiledTrain, *, changes: Changes | None, other: str) -> str:
    """``--view audit``: :func:`audit_lines`."""
    return "\n".join(audit_lines(t, changes, other))


def step_json(t: CompiledTrain, *, changes: Changes | None, other: str) -> str:
    """``--view json``: the step's record."""
    return json.dumps(t.to_dict(), indent=1)
