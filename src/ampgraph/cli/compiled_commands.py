"""``ampgraph compiled``: the dtype flow torch.compile (Inductor) really runs, against eager."""

from __future__ import annotations

import json
from typing import Any

import click

from ampgraph.errors import AmpgraphError

VIEWS = ("table", "diff", "audit", "json")


@click.command("compiled")
@click.argument("model", default="opt-125m")
@click.option("-s", "--setting", "setting_name", default="amp-fp32", show_default=True,
              help="One setting (its device is cpu unless it names another).")  # fmt: skip
@click.option("--amp-dtype", default="bfloat16", show_default=True, help="Autocast's dtype.")
@click.option("--emulate-precision-casts", is_flag=True,
              help="Plan with torch._inductor.config.emulate_precision_casts = True.")  # fmt: skip
@click.option("--view", type=click.Choice(VIEWS), default="table", show_default=True,
              help="table: per node; diff: eager rounding points dropped; audit: findings.")  # fmt: skip
@click.option("--seq-len", default=8, show_default=True, type=click.IntRange(1, 1 << 16))
@click.option("--pass", "pass_", type=click.Choice(("forward", "train")), default="forward",
              show_default=True, help="train: the forward and the compiled backward, with the "
              "autocast state the backward is traced in and the gradient dtypes.")  # fmt: skip
@click.option("--backward-pass-autocast", type=click.Choice(("same_as_forward", "off")),
              default=None, help="With --pass train: torch._functorch.config."
              "backward_pass_autocast (default: the installed torch's value).")  # fmt: skip
def compiled(model: str, setting_name: str, amp_dtype: str, emulate_precision_casts: bool,
             view: str, seq_len: int, pass_: str, backward_pass_autocast: str | None) -> None:  # fmt: skip
    """Inductor's plan for MODEL in one setting (its C++ backend, on fake tensors, nothing
    compiled): which 16-bit values are stored as eager stores them, which stay in fp32 inside a
    fused kernel, and so which eager roundings the compiled program drops."""
    from ampgraph.formats import compiled as text

    if pass_ == "train":
        _train(model, setting_name, amp_dtype, emulate_precision_casts, view, seq_len,
               backward_pass_autocast)  # fmt: skip
        return
    if backward_pass_autocast is not None:
        raise click.UsageError("--backward-pass-autocast needs --pass train")
    try:
        flow = _plan(model, setting_name, amp_dtype, emulate_precision_casts, seq_len)
    except AmpgraphError as exc:  # one line, exit 1 (click's own)
        raise click.ClickException(str(exc)) from None
    if view == "json":
        click.echo(json.dumps(flow.to_dict(), indent=1))
        return
    lines = {"table": text.table_lines, "diff": text.diff_lines, "audit": text.audit_lines}[view]
    click.echo("\n".join(lines(flow)))


def _plan(model: str, setting_name: str, amp_dtype: str, emulate: bool, seq_len: int) -> Any:
    from ampgraph.compiled.inductor import plan

    return plan(_capture(model, setting_name, amp_dtype, seq_len),
                emulate_precision_casts=emulate)  # fmt: skip


def _train(model: str, setting_name: str, amp_dtype: str, emulate: bool, view: str, seq_len: int,
           state: str | None) -> None:  # fmt: skip
    """``--pass train``: the plan of the step, and (for diff and audit, where the backward is
    traced under autocast) the backward ops whose dtype differs from eager's AMP recipe's."""
    from ampgraph.formats import compiled_train as text

    try:
        cap = _capture(model, setting_name, amp_dtype, seq_len)
        from ampgraph.compiled.flow import autocast_changes
        from ampgraph.compiled.train import plan_train

        step = plan_train(cap, emulate_precision_casts=emulate, backward_pass_autocast=state)
        other = "off" if step.backward_pass_autocast != "off" else "same_as_forward"
        changes = None
        if view in ("diff", "audit") and cap.setting.autocast:
            against = plan_train(cap, emulate_precision_casts=emulate, backward_pass_autocast=other)
            changes = autocast_changes(step, against)
    except AmpgraphError as exc:
        raise click.ClickException(str(exc)) from None
    if view == "json":
        click.echo(json.dumps(step.to_dict(), indent=1))
        return
    if view == "table":
        click.echo("\n".join(text.table_lines(step)))
        return
    lines = text.diff_lines if view == "diff" else text.audit_lines
    click.echo("\n".join(lines(step, changes, other)))


def _capture(model: str, setting_name: str, amp_dtype: str, seq_len: int) -> Any:
    from ampgraph.capture.trace import capture
    from ampgraph.model.build import load_model
    from ampgraph.settings import Setting

    setting = Setting.parse(setting_name, device_type="cpu", amp_dtype=amp_dtype)
    return capture(load_model(model, seq_len=seq_len), setting)
