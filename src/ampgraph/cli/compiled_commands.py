"""``ampgraph compiled``: the dtype flow torch.compile (Inductor) really runs, against eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ampgraph.cli.console import write_output
from ampgraph.cli.reports import AnalysisOptions
from ampgraph.errors import AmpgraphError
from ampgraph.formats.registry import names

if TYPE_CHECKING:
    from ampgraph.compiled.flow import CompiledFlow

F = TypeVar("F", bound=Callable[..., Any])

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
    write_output("compiled", view, flow)


def _plan(model: str, setting_name: str, amp_dtype: str, emulate: bool, seq_len: int) -> Any:
    """The plan, cached, as ``table --compile inductor`` makes it."""
    from ampgraph.cli.options import root_options
    from ampgraph.pipeline.compiled import compiled_flows
    from ampgraph.pipeline.request import AnalysisRequest
    from ampgraph.settings import Setting

    setting = Setting.parse(setting_name, device_type="cpu", amp_dtype=amp_dtype)
    request = AnalysisRequest(model, (setting,), seq_len=seq_len, check=False)
    return compiled_flows(request, emulate, use_cache=not root_options()["no_cache"])[0]


# -- the compile axis of the commands that take a setting ---------------------------------------

COMPILERS = ("eager", "inductor")


def compile_options(*, several: bool = False) -> Callable[[F], F]:
    """--compile (eager or inductor; with ``several``, once per side of a diff) and
    --emulate-precision-casts."""
    help_ = ("eager: autocast as eager runs it; inductor: as torch.compile runs it (Inductor's "
             "C++ backend planned on fake tensors; the device defaults to cpu).")  # fmt: skip
    opts = [
        click.option("--compile", "compile_", multiple=several, type=click.Choice(COMPILERS),
                     default=() if several else "eager", show_default=not several,
                     help=help_ + (" Twice: A, then B." if several else "")),
        click.option("--emulate-precision-casts", "emulate", is_flag=True,
                     help="With --compile inductor: plan with torch._inductor.config."
                     "emulate_precision_casts = True."),
    ]  # fmt: skip

    def decorate(f: F) -> F:
        for option in reversed(opts):
            f = option(f)
        return f

    return decorate


def compiled_analysis(analysis: AnalysisOptions, compile_: str, emulate: bool) -> bool:
    """Whether the command runs the compiled analysis; a usage error where its options say
    what it cannot do."""
    if compile_ == "eager":
        if emulate:
            raise click.UsageError("--emulate-precision-casts needs --compile inductor")
        return False
    if analysis.pass_ != "forward":
        raise click.UsageError("--compile inductor analyses the forward here: for the "
                               "backward under compile, 'ampgraph compiled MODEL --pass "
                               "train'")  # fmt: skip
    return True


def on_cpu(analysis: AnalysisOptions) -> AnalysisOptions:
    """The analysis on the CPU where --device was not given: Inductor's C++ backend is the one
    planned without a GPU."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    typed = ctx.get_parameter_source("device") in (ParameterSource.COMMANDLINE,
                                                   ParameterSource.ENVIRONMENT)  # fmt: skip
    return analysis if typed else replace(analysis, device="cpu")


def flows_of(analysis: AnalysisOptions, emulate: bool) -> list[CompiledFlow]:
    """Each setting's plan (cached), one ``Error:`` line where it cannot be made."""
    from ampgraph.cli.console import progress, progress_done
    from ampgraph.cli.options import root_options
    from ampgraph.pipeline.compiled import compiled_flows

    try:
        flows = compiled_flows(analysis.request(), emulate,
                               use_cache=not root_options()["no_cache"], progress=progress)  # fmt: skip
    except AmpgraphError as exc:
        raise click.ClickException(str(exc)) from None
    progress_done()
    return flows


def compiled_table(analysis: AnalysisOptions, fmt: str, emulate: bool) -> None:
    """``table --compile inductor``: each node's compiled fate and kernel, per setting."""
    write_output("compiled-table", fmt, flows_of(on_cpu(analysis), emulate))


def compiled_audit(analysis: AnalysisOptions, fmt: str, fail_on: str, emulate: bool) -> None:
    """``audit --compile inductor``: a finding per kernel whose numerics differ from eager,
    with both remedies' cost (the plan made with emulation; the bytes of the report's shapes)."""
    from ampgraph.cli.reports import analysed
    from ampgraph.formats import compiled as text

    if fmt not in names("compiled-audit"):
        raise click.UsageError("--compile inductor audits as "
                               + " or ".join(names("compiled-audit")))  # fmt: skip
    analysis = on_cpu(analysis)
    flows = flows_of(analysis, emulate)
    emulated = flows if emulate else flows_of(analysis, True)
    reports = analysed(replace(analysis, no_check=True).request())
    found = []
    for flow, em, report in zip(flows, emulated, reports, strict=True):
        shapes = {n.name: n.shapes[0] for n in report.nodes if n.shapes and n.shapes[0]}
        found.append(text.audit_lines(flow, None if emulate else em, shapes))
    warnings = sum(1 for lines in found for ln in lines if ln.startswith("warning:"))
    write_output("compiled-audit", fmt, list(zip(flows, found)))
    if fail_on in ("note", "warning") and warnings:
        raise click.ClickException(f"{warnings} finding{'s' if warnings != 1 else ''} at or "
                                   f"above {fail_on}")  # fmt: skip


def compiled_check_command(analysis: AnalysisOptions, fmt: str, emulate: bool) -> None:
    """``check --compile inductor``: the plan against the C++ code Inductor really generates;
    exit 1 on a disagreement."""
    from ampgraph.cli.console import progress, progress_done
    from ampgraph.pipeline.compiled import compiled_check

    try:
        results = compiled_check(on_cpu(analysis).request(), emulate, progress=progress)
    except AmpgraphError as exc:
        raise click.ClickException(str(exc)) from None
    progress_done()
    write_output("compiled-check", fmt, results)
    failed = sum(len(found) for _, found in results)
    if failed:
        raise click.ClickException(f"{failed} disagreement{'s' if failed != 1 else ''} between "
                                   "Inductor's plan and the code it generated")  # fmt: skip


def compiled_render(
    analysis: AnalysisOptions, out_dir: Path, formats: tuple[str, ...], theme: str,
    emulate: bool,
) -> None:  # fmt: skip
    """``render --compile inductor``: one overlay figure per setting, each kernel a frame."""
    from ampgraph.cli.reports import analysed
    from ampgraph.render.compiled_overlay import compiled_dot
    from ampgraph.formats.diagrams import write_sources
    from ampgraph.render.files import check_formats, diagram_stem

    wrong = [f for f in formats if f not in ("svg", "png", "pdf", "dot")]
    if wrong:
        raise click.UsageError(f"--compile inductor draws svg, png, pdf or dot, not {wrong[0]}")
    check_formats(formats)
    analysis = on_cpu(analysis)
    flows = flows_of(analysis, emulate)
    reports = analysed(replace(analysis, no_check=True).request())
    out_dir.mkdir(parents=True, exist_ok=True)
    for report, flow in zip(reports, flows, strict=True):
        source = compiled_dot(report, flow, theme)
        stem = diagram_stem(report, view="ops", fold=True, theme=theme) + "-inductor"
        stem += "-emulated" if emulate else ""
        for path in write_sources(source, out_dir / stem, formats):
            write_output("paths", "text", [path])


def compiled_diff(
    sources: Sequence[str], settings: Sequence[str], devices: Sequence[str],
    amp_dtypes: Sequence[str], seq_len: int, compiles: Sequence[str], emulate: bool, fmt: str,
) -> bool:  # fmt: skip
    """``diff --compile A --compile B``: the rounding points that differ between the two sides
    (eager drops none), by node and module name; whether they are equal."""
    from ampgraph.cli.options import forced, resolve_settings, timeout_seconds
    from ampgraph.compiled.flow import differing_roundings
    from ampgraph.pipeline.request import AnalysisRequest

    if len(sources) > 1 or max(map(len, (compiles, settings, devices, amp_dtypes))) > 2:
        raise click.UsageError("--compile compares one model: give one MODEL and each option "
                               "at most twice (A, then B)")  # fmt: skip
    pick = [(v[0], v[-1]) if v else (None, None) for v in (compiles, settings, devices, amp_dtypes)]
    if all(a == b for a, b in pick) and not emulate:
        raise click.UsageError("nothing to compare: e.g. 'ampgraph diff -s half --compile eager "
                               "--compile inductor'")  # fmt: skip
    model = sources[0] if sources else "opt-125m"
    labels, flows = [], []
    for side in (0, 1):
        compiler = pick[0][side] or "eager"
        setting = resolve_settings([pick[1][side] or "amp-fp32"], pick[2][side] or "cpu",
                                   pick[3][side] or "bf16")[0]  # fmt: skip
        label = f"{'AB'[side]} ({setting.name}, {compiler})"
        if compiler == "inductor" and emulate and side == 1:
            label = f"B ({setting.name}, inductor, emulate_precision_casts)"
        labels.append(label)
        if compiler == "eager":
            flows.append(None)
            continue
        request = AnalysisRequest(model, (setting,), seq_len=seq_len, check=False,
                                  force=forced(), timeout=timeout_seconds())  # fmt: skip
        try:
            from ampgraph.pipeline.compiled import compiled_flows

            flows.append(compiled_flows(request, emulate and side == 1)[0])
        except AmpgraphError as exc:
            raise click.ClickException(str(exc)) from None
    write_output("compiled-diff", fmt, flows, labels=labels)
    return not differing_roundings(flows[0], flows[1])


def _train(model: str, setting_name: str, amp_dtype: str, emulate: bool, view: str, seq_len: int,
           state: str | None) -> None:  # fmt: skip
    """``--pass train``: the plan of the step, and (for diff and audit, where the backward is
    traced under autocast) the backward ops whose dtype differs from eager's AMP recipe's."""
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
    write_output("compiled-train", view, step, changes=changes, other=other)


def _capture(model: str, setting_name: str, amp_dtype: str, seq_len: int) -> Any:
    from ampgraph.capture.trace import capture
    from ampgraph.model.build import load_model
    from ampgraph.settings import Setting

    setting = Setting.parse(setting_name, device_type="cpu", amp_dtype=amp_dtype)
    return capture(load_model(model, seq_len=seq_len), setting)
