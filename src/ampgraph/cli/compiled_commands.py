"""``ampgraph compiled``: the dtype flow torch.compile (Inductor) really runs, against eager."""

from __future__ import annotations

from typing import Any

import click

from ampgraph.cli.console import write_output
from ampgraph.errors import AmpgraphError
from ampgraph.formats.registry import names

VIEWS = names("compiled")


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
def compiled(model: str, setting_name: str, amp_dtype: str, emulate_precision_casts: bool,
             view: str, seq_len: int) -> None:  # fmt: skip
    """Inductor's plan for MODEL in one setting (its C++ backend, on fake tensors, nothing
    compiled): which 16-bit values are stored as eager stores them, which stay in fp32 inside a
    fused kernel, and so which eager roundings the compiled program drops."""
    try:
        flow = _plan(model, setting_name, amp_dtype, emulate_precision_casts, seq_len)
    except AmpgraphError as exc:  # one line, exit 1 (click's own)
        raise click.ClickException(str(exc)) from None
    write_output("compiled", view, flow)


def _plan(model: str, setting_name: str, amp_dtype: str, emulate: bool, seq_len: int) -> Any:
    from ampgraph.capture.trace import capture
    from ampgraph.compiled.inductor import plan
    from ampgraph.model.build import load_model
    from ampgraph.settings import Setting

    setting = Setting.parse(setting_name, device_type="cpu", amp_dtype=amp_dtype)
    return plan(capture(load_model(model, seq_len=seq_len), setting),
                emulate_precision_casts=emulate)  # fmt: skip
