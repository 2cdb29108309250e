"""The ``baseline`` commands: a committed snapshot of a model's dtype flow, and the check (a CI
gate) that it still holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ampgraph.cli.console import write_output
from ampgraph.cli.options import (
    device_option,
    format_option,
    model_argument,
    recipe_option,
    recipes_given,
    resolve_settings,
    seq_len_option,
)
from ampgraph.cli.reports import analysed, analysis_request
from ampgraph.report.records import Report
from ampgraph.settings import PRESETS

if TYPE_CHECKING:
    from ampgraph.model.specs import ModelSpec
    from ampgraph.review.baseline import Baseline


@click.group(name="baseline")
def baseline_group() -> None:
    """A committed snapshot of a model's dtype flow, and the check that it still holds.

    'baseline write FILE MODEL -s SETTING' writes the snapshot (JSON, one line per node, made
    to be read in a git diff); 'baseline check FILE' analyses the same model in the same setting
    again and fails, printing the diff, when the flow no longer matches. Accept a change with
    'baseline check FILE --update', as snapshot-testing tools do.

    \b
    Examples:
      ampgraph baseline write ampgraph/opt-125m.json opt-125m -s amp-fp32
      ampgraph baseline check ampgraph/opt-125m.json
      ampgraph baseline check ampgraph/opt-125m.json --format markdown > comment.md
      ampgraph baseline check ampgraph/opt-125m.json --update
    """


def _write_baseline(path: Path, report: Report, **header: Any) -> None:
    """Write the baseline of ``report`` atomically: its record
    (:func:`ampgraph.review.baseline.baseline_record`, ``header`` its options) in
    :func:`ampgraph.formats.json.baseline_file`'s text; a folder that takes no files is one
    ``Error:`` line."""
    from ampgraph.formats.registry import write_file
    from ampgraph.review.baseline import baseline_record

    try:
        write_file("baseline", "json", baseline_record(report, **header), path)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the baseline to {path}: {exc.strerror or exc}; choose another path"
        ) from None


def _baseline_report(
    model: str, settings: list[str], device: str, amp_dtype: str, seq_len: int,
    recipes: tuple[str, ...],
) -> Report:  # fmt: skip
    """The report a baseline snapshots: of ``settings``' one, or (none) the ``recipes``' one."""
    request = analysis_request(model, settings, device, amp_dtype, seq_len, check=False,
                               recipes=recipes)  # fmt: skip
    return analysed(request)[0]


@baseline_group.command(name="write")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@model_argument
@click.option("--setting", "-s", "setting", default="amp-fp32", show_default=True,
              metavar="NAME", help=f"The setting to snapshot. Presets: {', '.join(PRESETS)}.")  # fmt: skip
@recipe_option()
@device_option()
@click.option("--amp-dtype", type=click.Choice(["bf16", "fp16"]), default="bf16",
              show_default=True, help="The 16-bit dtype autocast uses.")  # fmt: skip
@seq_len_option
@click.pass_context
def baseline_write(
    ctx: click.Context, file: Path, model: str, setting: str, device: str, amp_dtype: str,
    seq_len: int,
) -> None:  # fmt: skip
    """Write the dtype flow of MODEL (default OPT-125M) in one setting (or --recipe) to FILE."""
    from ampgraph.model.specs import ModelSpec
    from ampgraph.report.writing import check_writable
    check_writable(file, "baseline")
    # A --recipe names the setting: the default --setting gives way, a typed one is refused.
    recipes = recipes_given()
    recipe = bool(recipes) and not _given(ctx, "setting")
    report = _baseline_report(model, [] if recipe else [setting], device, amp_dtype, seq_len,
                              recipes)  # fmt: skip
    spec = ModelSpec(model) if not isinstance(model, ModelSpec) else model
    _write_baseline(file, report, seq_len=seq_len, spec=str(spec), spec_kind=spec.kind,
                    tracer=spec.tracer)  # fmt: skip
    write_output("baseline-written", "text", report, file=file)


def _given(ctx: click.Context, name: str) -> bool:
    """Whether parameter ``name`` was given (on the command line), not left at its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def _spec_to_check(
    ctx: click.Context, base: Baseline, model: str, setting: str | None, file: Path
) -> ModelSpec:
    """The model ``baseline check`` analyses again: the command line's, which must be the
    baseline's own (as must a --setting or --recipe given), else the one the baseline names,
    which is never code; with the baseline's tracer unless --tracer says otherwise."""
    from ampgraph.model.specs import ModelSpec, spec_kind, spec_tracer
    from ampgraph.review.baseline import refuse_other, spec_to_check

    s = base.report.setting
    # MODEL's default (opt-125m) is no model named: only what the command line gives counts.
    named = any(_given(ctx, p) for p in ("model", "config_path", "model_dir", "module_factory"))
    recipes = recipes_given()
    if named or setting is not None or recipes:
        # What the command line names (a recipe's setting on the baseline's device) must be
        # the baseline's own; never the baseline's own name blamed on --setting.
        names = [setting] if setting is not None else ([] if recipes else [s["name"]])
        wanted = resolve_settings(names, s["device_type"], s["amp_dtype"], recipes)[0]
        refuse_other(base, model if named else base.report.model, wanted.to_dict(), str(file))
    # The command line's model, else the one the baseline names, which is never code; the
    # baseline's tracer unless --tracer says otherwise.
    named_spec = model if named else spec_to_check(base, str(file))
    tracer = spec_tracer(model) if _given(ctx, "tracer") else base.tracer
    return ModelSpec(str(named_spec), spec_kind(named_spec), tracer=tracer)


@baseline_group.command(name="check")
@click.argument("file", type=click.Path(path_type=Path))  # a folder: the reader's one line
@model_argument
@click.option("--setting", "-s", "setting", metavar="NAME",
              help="The setting the baseline should be of (default: the baseline's own).")  # fmt: skip
@recipe_option()
@format_option("baseline-check", "How to print the diff: as 'ampgraph diff' does.")
@click.option("--update", is_flag=True,
              help="Accept the new flow: rewrite FILE with it (exit 0).")  # fmt: skip
@click.pass_context
def baseline_check(
    ctx: click.Context, file: Path, model: str, setting: str | None, fmt: str, update: bool
) -> None:
    """Analyse the baseline's model again; exit 1 with the diff when its flow changed.

    The model (MODEL, --config, --model-dir or --module), --setting and --tracer are read from
    FILE; a model or setting given must be the baseline's own. FILE is data and never decides
    what code runs: a baseline of a --module factory is checked only with that --module given.
    """
    from ampgraph.review.baseline import check_report, read_baseline

    if not file.exists():
        raise click.ClickException(
            f"no baseline at {file}: write one with 'ampgraph baseline write {file} MODEL -s "
            "SETTING'"
        )
    from ampgraph.report.reading import read_text

    text = read_text(file, "baseline")  # a FIFO or /dev/zero: one line, never a hang
    base = read_baseline(text, str(file))
    s = base.report.setting
    spec = _spec_to_check(ctx, base, model, setting, file)
    # Of the baseline's setting, whatever the command line named (checked to be the same).
    report = _baseline_report(spec, [s["name"]], s["device_type"], s["amp_dtype"], base.seq_len,
                              recipes=())  # fmt: skip
    result = check_report(base, report)
    write_output("baseline-check", fmt, result, file=str(file), baseline=base, report=report,
                 update=update)  # fmt: skip
    if result.equal:
        return
    if update:
        _write_baseline(file, report, seq_len=base.seq_len, spec=base.spec,
                        spec_kind=base.spec_kind, tracer=spec.tracer)  # fmt: skip
        click.echo(f"{file}: updated to the new flow", err=True)
        return
    raise click.ClickException(
        f"the dtype flow of {base.title} no longer matches {file}: "
        f"{len(result.changes)} change{'s' if len(result.changes) != 1 else ''}; accept it with "
        f"'ampgraph baseline check {file} --update'"
    )
