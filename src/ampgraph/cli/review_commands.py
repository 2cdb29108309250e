"""The commands for a reviewer: ``audit`` (findings where dtypes meet) and ``diff`` (what changes
between two analyses, or with a what-if change).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import click

from ampgraph.cli.compiled_commands import compile_options, compiled_analysis
from ampgraph.cli.console import write_output
from ampgraph.cli.options import (
    device_option,
    format_option,
    model_argument,
    model_options,
    models_given,
    no_check_option,
    option_model,
    recipe_option,
    recipes_given,
    report_option,
    resolve_settings,
    seq_len_option,
    setting_options,
)
from ampgraph.cli.reports import (
    AnalysisOptions,
    analysed,
    command_request,
    gathers_analysis_options,
    load_reports,
    refuse_model_with_reports,
)
from ampgraph.review.compare_runs import Side, saved_report
from ampgraph.settings import PRESETS, Setting


@click.command()
@model_argument
@setting_options
@format_option(
    "audit",
    "text: a line per finding and the totals; json: schema ampgraph.review.audit; markdown: a "
    "table for a pull request; sarif: SARIF 2.1.0 for GitHub code scanning.",
)
@click.option(
    "--fail-on", type=click.Choice(["note", "warning", "error", "never"]), default="never",
    show_default=True, help="Exit 1 when a finding of this severity or worse exists.",
)  # fmt: skip
@report_option(
    "Audit a saved report (ampgraph table --format json) instead of analysing MODEL; repeat for "
    "several. Needs no torch."
)
@no_check_option
@click.option(
    "--ranges", "ranges_paths", multiple=True, type=click.Path(path_type=Path), metavar="FILE",
    help="Add the findings of a saved ranges run (ampgraph ranges --format json) to the audit of "
    "the same model and setting: values that overflow (error), flush to zero (warning) or lose "
    "bits as subnormals (note). Repeat for several; needs no torch.",
)  # fmt: skip
@compile_options()
@gathers_analysis_options
def audit(
    analysis: AnalysisOptions, fmt: str, fail_on: str, report_paths: tuple[Path, ...],
    ranges_paths: tuple[Path, ...], compile_: str, emulate: bool,
) -> None:  # fmt: skip
    """Findings where dtypes meet: promotions, autocast casts, hazards, 16-bit risks.

    For each setting (all four by default), one finding per node that matters: mixed inputs
    widened by type promotion (with the bytes widened), the tensors autocast casts (bytes of
    weights and of activations, and what pre-cast parameters or inputs save), ops without an
    autocast policy fed mixed dtypes, dtype errors (torch's message), numerically sensitive ops
    running in 16 bits, fp16 range risks, and autocast-disabled regions with their border casts.
    Each finding has a severity (note, warning, error) and a suggestion. See docs/audit.md.

    \b
    Examples:
      ampgraph audit -s amp-fp32
      ampgraph audit -s half --fail-on warning
      ampgraph audit --module model.py:build -s amp-half --format sarif > audit.sarif
      ampgraph table -s amp-fp32 --format json > r.json && ampgraph audit --report r.json
      ampgraph ranges -s amp-fp32 --amp-dtype fp16 --format json > ranges.json
      ampgraph audit -s amp-fp32 --amp-dtype fp16 --ranges ranges.json
      ampgraph audit -s half --compile inductor   # where torch.compile's numbers differ

    With --compile inductor, one finding per kernel whose compiled numerics differ from eager's
    (eager roundings it drops), with the two ways to get eager's numbers and their cost.
    """
    if compiled_analysis(analysis, compile_, emulate):
        if report_paths or ranges_paths:
            raise click.UsageError("--compile inductor needs MODEL, not --report or --ranges")
        from ampgraph.cli.compiled_commands import compiled_audit

        return compiled_audit(analysis, fmt, fail_on, emulate)
    from ampgraph.review import audit as audit_lib

    if report_paths:
        refuse_model_with_reports()
        if analysis.settings:
            raise click.UsageError("--setting and --report exclude each other: a report has one")
        reports = load_reports(report_paths)
    else:
        # Source lines for the findings: the capture keeps stack traces, for audit alone.
        reports = analysed(analysis.request(sources=True))
    findings = [audit_lib.audit(r) for r in reports]
    if ranges_paths:
        from ampgraph.review.audit_ranges import attach, load_ranges

        extra = attach(reports, [load_ranges(p) for p in ranges_paths])
        findings = [f + e for f, e in zip(findings, extra, strict=True)]
    write_output("audit", fmt, reports, findings=findings, ranges=bool(ranges_paths))
    if fail_on != "never":
        failing = sum(len(audit_lib.at_or_above(f, fail_on)) for f in findings)
        if failing:
            raise click.ClickException(
                f"{failing} finding{'s' if failing != 1 else ''} at or above {fail_on}"
            )


# -- diff: what changes between two analyses -----------------------------------------------------

#: A saved report's reader, by the name it had when it lived here.
_report_file = saved_report


def _pick(values: Sequence[str], label: str) -> tuple[str | None, str | None]:
    """Side A's and side B's value of an option given once (both) or twice (one each)."""
    if len(values) > 2:
        raise click.UsageError(f"give {label} at most twice: once for A, once for B")
    if not values:
        return None, None
    return values[0], values[-1]


def _release(value: str | None) -> str | None:
    """``--tables``'s value as the release whose lists it means; None for the installed torch's
    (so that its analyses share the cache with the default's)."""
    from ampgraph.policy import ACTIVE_RELEASE, release_name

    if value is None:
        return None
    try:
        release = release_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tables'") from None
    return None if release == ACTIVE_RELEASE else release


@click.command(name="diff")
@click.argument("sources", nargs=-1, metavar="[A] [B]")
@click.option(
    "--setting", "-s", "settings", multiple=True, metavar="NAME",
    help="Setting of A, then of B (give it twice to compare two settings, once for both). "
    f"Presets: {', '.join(PRESETS)}. Default: amp-fp32, or a saved report's setting.",
)  # fmt: skip
@recipe_option(sides=True)
@device_option(several=True)
@click.option(
    "--amp-dtype", "amp_dtypes", type=click.Choice(["bf16", "fp16"]), multiple=True,
    help="Autocast dtype of A, then of B (twice to compare them). Default: bf16.",
)  # fmt: skip
@seq_len_option
@format_option(
    "diff",
    "text: a summary and a line per changed node; markdown: a pull-request comment (a summary "
    "table, details collapsed); json: schema ampgraph.review.diff.",
)
@click.option(
    "--keep-fp32", "keep_fp32", multiple=True, metavar="PATTERN",
    help="What if: B is A with the modules matching PATTERN (module paths, * and ? as "
    "wildcards, e.g. 'model.decoder.layers.*.fc2'; repeatable) run in autocast-disabled "
    "regions with fp32 inputs, as an fp32 wrapper would; B's region is checked against the "
    "dispatcher.",
)  # fmt: skip
@click.option(
    "--tables", "tables", multiple=True, metavar="RELEASE",
    help="Annotate with the policy tables of torch RELEASE (2.6 to 2.14; default: the installed "
    "torch's), for A, then for B: twice to see how a model fares under two releases' autocast "
    "lists. Another release's side is a prediction for it, not checked against this dispatcher.",
)  # fmt: skip
@click.option(
    "--move-op", "move_ops", multiple=True, metavar="OP=LIST",
    help="What if: B is A with the op OP (an ATen op such as softmax or softmax.int, or "
    "ns::op) on another of autocast's lists of the setting's device: lower_precision_fp, fp32, "
    "fp32_set_opt_dtype, promote or none (repeatable). For B's check the dispatcher runs, for "
    "the preview only, an autocast kernel for OP that does what LIST does.",
)  # fmt: skip
@compile_options(several=True)
@model_options
@click.pass_context
def diff_command(
    ctx: click.Context, sources: tuple[str, ...], settings: tuple[str, ...],
    devices: tuple[str, ...], amp_dtypes: tuple[str, ...], seq_len: int, fmt: str,
    tables: tuple[str, ...], keep_fp32: tuple[str, ...], move_ops: tuple[str, ...],
    compile_: tuple[str, ...], emulate: bool,
) -> None:  # fmt: skip
    """What changes in the dtype flow from A to B; exit 1 when they differ, 0 when equal.

    A and B are models (as for 'ampgraph table', default OPT-125M) or saved reports
    ('ampgraph table --format json > a.json', or a baseline file); --config, --model-dir or
    --module name one model for both sides instead. Compare two settings, two
    devices or two autocast dtypes of one model by giving the option twice, or two models,
    two revisions of one model or two saved reports by giving A and B; a model compared with a
    report is analysed in the report's setting.

    Nodes are paired by module path and op, not by position in the graph: an op inserted in one
    module is one added node. For each pair it reports the autocast policy, input and output
    dtypes, the casts autocast adds or no longer adds, promotions and errors. Where the two
    were analysed with different policy tables (two torch releases), it says so and points to
    'ampgraph policy --since', which lists the table changes themselves.

    Policy drift between torch releases: '--tables 2.11 --tables 2.14' analyses the model with
    the autocast lists of torch 2.11 (A) and 2.14 (B), both traced by the installed torch; the
    side whose release is not the installed one is a prediction for that release, not checked.

    \b
    Examples:
      ampgraph diff -s amp-fp32 -s amp-half          # OPT-125M, two settings
      ampgraph diff llama-tiny --device cuda --device cpu
      ampgraph diff -s amp-half --amp-dtype bf16 --amp-dtype fp16
      ampgraph diff opt-125m gpt2 -s amp-fp32
      ampgraph diff --module models/mine.py:build -s fp32 -s amp-fp32
      ampgraph diff before.json after.json --format markdown > comment.md
      ampgraph diff --keep-fp32 'model.decoder.layers.*.fc2'   # what if fc2 ran in fp32?
      ampgraph diff -s amp-half --move-op layer_norm=none --move-op native_layer_norm=none
      ampgraph diff llama-tiny -s amp-half --tables 2.11 --tables 2.14   # policy drift
      ampgraph diff opt-125m -s half --compile eager --compile inductor

    With --compile (eager or inductor, twice: A then B), the eager rounding points that differ
    between the two (eager drops none; inductor those its fused kernels keep in fp32), by node
    and module name; the device defaults to cpu, whose Inductor backend plans without a GPU.
    """
    if "inductor" in compile_ or emulate:
        if keep_fp32 or move_ops or tables or recipes_given():
            raise click.UsageError("--compile compares eager and compiled: without --keep-fp32, "
                                   "--move-op, --tables or --recipe")  # fmt: skip
        if fmt == "markdown":
            raise click.UsageError("--compile diffs as text or json")
        from ampgraph.cli.compiled_commands import compiled_diff

        given = option_model()
        if compiled_diff((given,) if given else sources, settings, devices, amp_dtypes, seq_len,
                         compile_, emulate, fmt):  # fmt: skip
            return
        ctx.exit(1)
    from ampgraph.model.specs import DEFAULT_TRACER, ModelSpec
    from ampgraph.review.compare_runs import compare_change, compare_sides

    given = option_model()
    if given is not None:
        if sources:
            raise click.UsageError(
                f"give the model as A B or with {models_given()[0]}, not both"
            )
        sources = (given,)
    # Each side's recipe is read here, not by resolve_settings (which would give both to each).
    recipes = recipes_given()
    if recipes and settings:
        raise click.UsageError("give --setting or --recipe, not both (a recipe is a setting)")
    from ampgraph.cli.fp8_settings import fp8_diff, is_fp8_recipe

    if any(is_fp8_recipe(r) for r in recipes):  # two FP8 graphs, not two settings' reports
        fp8_diff(ctx, sources, recipes, seq_len, fmt)
    tracer = ctx.params.get("tracer") or DEFAULT_TRACER
    sources = tuple(s if isinstance(s, ModelSpec) else ModelSpec(s, tracer=tracer) for s in sources)
    request = command_request(seq_len=seq_len, check=False)  # each side's model and setting below
    if keep_fp32 or move_ops:
        spec, setting = _whatif_side(sources, settings, devices, amp_dtypes, tables, recipes,
                                     keep_fp32)  # fmt: skip
        one = replace(request, model=spec, settings=(setting,))
        result, b = compare_change(one, keep=keep_fp32, moves=move_ops)
        write_output("diff", fmt, result)
        if b.check is not None and b.disagreements:
            n = len(b.disagreements)
            raise click.ClickException(
                f"{n} node{'' if n == 1 else 's'} of the preview "
                f"{'disagrees' if n == 1 else 'disagree'} with the dispatcher"
            )
    else:
        sides = _sides(sources, settings, devices, amp_dtypes, tables, recipes, tracer)
        result = compare_sides(sides, request, analysed)
        write_output("diff", fmt, result)
    if not result.equal:
        ctx.exit(1)


def _sides(
    sources: Sequence[str], settings: Sequence[str], devices: Sequence[str],
    amp_dtypes: Sequence[str], tables: Sequence[str], recipes: Sequence[str], tracer: str,
) -> list[Side]:  # fmt: skip
    """A and B of a diff from the command line: a saved report as it is, else a model in the
    setting its options (or the other side's report) give, with its release's tables."""
    from ampgraph.model.specs import ModelSpec

    if len(sources) > 2:
        raise click.UsageError("give at most two models or reports: A and B")
    pairs = {
        "--setting": _pick(settings, "--setting"),
        "--device": _pick(devices, "--device"),
        "--amp-dtype": _pick(amp_dtypes, "--amp-dtype"),
        "--tables": _pick(tables, "--tables"),
        "--recipe": _pick(recipes, "--recipe"),
    }
    releases = [_release(t) for t in pairs["--tables"]]
    named = [sources[0], sources[-1]] if sources else [ModelSpec("opt-125m", tracer=tracer)] * 2
    files = [saved_report(s) for s in dict.fromkeys(named)]
    files = [files[0], files[-1]]
    if len(sources) < 2 and max(map(len, (settings, devices, amp_dtypes, tables, recipes))) < 2:
        raise click.UsageError(
            "nothing to compare: give two models or reports (A B), or an option twice, e.g. "
            "'ampgraph diff -s amp-fp32 -s amp-half'"
        )
    given = [label for label, (a, _) in pairs.items() if a is not None]
    if all(r is not None for r in files) and given:
        saved = (
            "A and B are saved reports" if len(sources) == 2 else f"{sources[0]} is a saved report"
        )
        raise click.UsageError(f"{saved}: {', '.join(given)} cannot change what it holds")
    sides = []
    for side, report in enumerate(files):
        other = files[1 - side]
        base = other.setting if other is not None and report is None else {}
        setting = _side_setting(pairs, side, base) if report is None else None
        sides.append(Side(named[side], setting, releases[side], report))
    return sides


def _side_setting(
    pairs: dict[str, tuple[str | None, str | None]], side: int, base: dict[str, object]
) -> Setting:
    """Side ``side``'s setting of a diff: its --recipe's, else its --setting in its --device and
    --amp-dtype; what a side leaves out comes from ``base`` (the other side's saved report), then
    from the defaults (amp-fp32, cuda, bf16)."""
    device = str(pairs["--device"][side] or base.get("device_type") or "cuda")
    recipe = pairs["--recipe"][side]
    if recipe is not None:
        from ampgraph.errors import SettingError
        from ampgraph.recipes import parse_recipe

        try:
            parsed = parse_recipe(recipe, device_type=device)
        except SettingError as exc:
            raise click.BadParameter(str(exc), param_hint="'--recipe'") from None
        click.echo(f"{'AB'[side]}: {parsed.describe()}", err=True)
        return parsed.setting
    name = str(pairs["--setting"][side] or base.get("name") or "amp-fp32")
    amp = str(pairs["--amp-dtype"][side] or base.get("amp_dtype") or "bf16")
    return resolve_settings([name], device, amp, recipes=())[0]


def _whatif_side(
    sources: Sequence[str], settings: Sequence[str], devices: Sequence[str],
    amp_dtypes: Sequence[str], tables: Sequence[str], recipes: Sequence[str],
    patterns: Sequence[str],
) -> tuple[str, Setting]:  # fmt: skip
    """``diff --keep-fp32`` / ``--move-op``: the one model and the one setting it previews a
    change of, or a usage error."""
    from ampgraph.model.specs import ModelSpec

    if tables:
        raise click.UsageError("--tables compares two releases' lists: preview a change "
                               "with the installed torch's, without --tables")  # fmt: skip
    if recipes:
        raise click.UsageError("--recipe names the two sides of a diff: preview a change "
                               "in one setting, with --setting")  # fmt: skip
    what = "--keep-fp32" if patterns else "--move-op"
    if len(sources) > 1 or max(len(settings), len(devices), len(amp_dtypes)) > 1:
        raise click.UsageError(f"{what} compares one model in one setting with itself: give "
                               "one MODEL and each option once")  # fmt: skip
    if sources and saved_report(sources[0]) is not None:
        raise click.UsageError(f"{what} needs a model to analyse, not a saved report")
    setting = resolve_settings(
        [settings[0] if settings else "amp-fp32"],
        devices[0] if devices else "cuda",
        amp_dtypes[0] if amp_dtypes else "bf16",
        recipes=(),
    )[0]
    if not setting.autocast:
        change = "to disable" if patterns else "whose lists to change"
        raise click.BadParameter(f"{setting.name} has no autocast {change}: use amp-fp32 or "
                                 "amp-half", param_hint="'--setting'")  # fmt: skip
    return (sources[0] if sources else ModelSpec("opt-125m")), setting
