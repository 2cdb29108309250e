"""The commands that analyse one model: ``table``, ``check``, ``render`` and ``verify``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from ampgraph.cli.compiled_commands import compile_options, compiled_analysis
from ampgraph.cli.console import progress, progress_done, write_output
from ampgraph.cli.options import (
    format_option,
    model_argument,
    no_check_option,
    pass_options,
    report_option,
    setting_options,
    train_options,
)
from ampgraph.cli.reports import (
    AnalysisOptions,
    analysed,
    gathers_analysis_options,
    load_reports,
    refuse_model_with_reports,
)
from ampgraph.report.records import Report


@click.command()
@model_argument
@setting_options
@click.option(
    "--only",
    metavar="CLASSES",
    help="Comma-separated module classes to show (isinstance-style), e.g. the seed notebook's "
    "'Linear,LayerNorm,Embedding'. Default: every leaf module.",
)
@format_option(
    "table",
    "text: the seed's hook lines; json: the full versioned report; markdown: a table.",
)
@no_check_option
@pass_options
@compile_options()
@gathers_analysis_options
def table(analysis: AnalysisOptions, only: str | None, fmt: str, compile_: str,
          emulate: bool) -> None:  # fmt: skip
    """Print the dtype of every leaf-module call, as forward hooks would.

    Each line is the seed notebook's hook line, e.g.
    '[model.decoder.layers.0.fc1] in=torch.float32 -> out=torch.bfloat16'.
    With several settings each block starts with a '# setting' line.

    With --pass backward, one line per module in the order the backward runs: the ops that run
    in 16 bits, the casts, what is saved for backward and the parameters' gradient dtypes;
    --pass train prints the forward's lines, then the backward's.

    \b
    Examples:
      ampgraph table -s amp-fp32
      ampgraph table -s half --amp-dtype fp16 --only Linear
      ampgraph table --format markdown -s amp-half
      ampgraph table --pass train -s amp-fp32 --format markdown
      ampgraph table --pass backward --only Linear --backward-in-autocast
      ampgraph table opt-125m -s half --compile inductor   # each node's fate under compile
    """
    pass_ = analysis.pass_
    train_options(pass_, analysis.loss, analysis.backward_autocast)  # a usage error first
    if compiled_analysis(analysis, compile_, emulate):
        if only:
            raise click.UsageError("--only selects module lines: --compile inductor lists nodes")
        from ampgraph.cli.compiled_commands import compiled_table

        return compiled_table(analysis, fmt, emulate)
    classes = [c.strip() for c in only.split(",") if c.strip()] if only else None
    if classes and fmt == "json":
        raise click.UsageError("--only selects lines of text or markdown: --format json prints "
                               "the whole report")  # fmt: skip
    reports = analysed(analysis.request())
    if classes:
        refuse_unknown_classes(classes, reports[0])
    write_output("table", fmt, reports, classes=classes, pass_=pass_)


def refuse_unknown_classes(classes: Sequence[str], report: Report) -> None:
    """One ``Error:`` line (exit 1) when a class ``--only`` names matches no module call of the
    report's model, listing the classes it has: a misspelt name printed nothing, with status 0.

    Matched as the selection does (any class of a module's hierarchy, ``isinstance``-style).
    """
    present = {base for call in report.modules for base in call.bases}
    unknown = [c for c in dict.fromkeys(classes) if c not in present]
    if not unknown:
        return
    have = sorted({call.type.rpartition(".")[2] for call in report.modules})
    raise click.ClickException(
        f"--only {', '.join(unknown)} match{'es' if len(unknown) == 1 else ''} no module; "
        + (f"this model has: {', '.join(have)}" if have else "this model has no module calls")
    )


@click.command(name="check")
@model_argument
@setting_options
@format_option(
    "check",
    "text: a summary line per setting and a line per disagreement; json: each setting's check "
    "and disagreements; markdown: a table for a pull request.",
)
@pass_options
@compile_options()
@gathers_analysis_options
def check_command(analysis: AnalysisOptions, fmt: str, compile_: str, emulate: bool) -> None:
    """Check every annotation against the PyTorch dispatcher; exit 1 on any disagreement.

    The dispatcher check replays the graph with the real autocast kernels on fake tensors (no GPU
    needed, even for cuda) and compares each node's dtypes with ampgraph's prediction. Each
    disagreement is listed with its node, op, module and both answers.

    With --pass backward or train, the joint graph of the training step (forward, loss and
    backward) is replayed on fake tensors too: every backward node's dtypes against the
    dispatcher's, with the real autocast kernels where backward runs inside the context.

    \b
    Examples:
      ampgraph check
      ampgraph check -s amp-fp32 --device cpu
      ampgraph check gpt2 --amp-dtype fp16
      ampgraph check --pass train --backward-in-autocast
      ampgraph check -s amp-fp32 --compile inductor   # the plan against Inductor's C++

    With --compile inductor, Inductor's plan is held against the C++ code Inductor really
    generates for the same graph (every kernel compiled: as long as torch.compile takes).
    """
    if compiled_analysis(analysis, compile_, emulate):
        if fmt == "markdown":
            raise click.UsageError("--compile inductor checks as text or json")
        from ampgraph.cli.compiled_commands import compiled_check_command

        return compiled_check_command(analysis, fmt, emulate)
    pass_ = analysis.pass_
    reports = analysed(analysis.request(), warn_unchecked=False)
    for report in reports:
        if report.check is None:
            raise click.ClickException(
                (report.capture or {}).get("check_unavailable") or "the check did not run"
            )
    write_output("check", fmt, reports, pass_=pass_)
    failed = sum(
        (len(r.disagreements) if pass_ != "backward" else 0)
        + (len(r.backward.disagreements) if r.backward is not None else 0)
        for r in reports
    )
    if failed:
        raise click.ClickException(
            f"{failed} {'node disagrees' if failed == 1 else 'nodes disagree'} with the dispatcher"
        )


@click.command()
@model_argument
@setting_options
@click.option(
    "--out",
    "-o",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default="ampgraph-out",
    show_default=True,
    help="Folder for the diagrams (created if missing; files in it are replaced atomically).",
)
@format_option(
    "diagram",
    "File format; repeat for several. Default: svg. 'dot' (Graphviz source) needs no Graphviz "
    "installed; 'html' is one interactive page for all the settings (offline, pan, zoom, "
    "unfold, search, a node's annotation on a click) and needs no Graphviz either; 'explorer' is "
    "Google Model Explorer's graph JSON with overlays (model-explorer FILE "
    "--node_data_paths=...); the others need Graphviz's 'dot' program.",
    several=True,
)
@click.option(
    "--view",
    type=click.Choice(["modules", "ops"]),
    default="modules",
    show_default=True,
    help="modules: one box per leaf-module call and per free op that matters (adds, attention, "
    "casts, regions); ops: every ATen node.",
)
@click.option(
    "--unfold",
    is_flag=True,
    help="Draw every repeated layer. By default identical layers (OPT's 12 decoder layers) are "
    "drawn once and marked x12; layers that differ are always drawn.",
)
@click.option(
    "--theme",
    type=click.Choice(["light", "dark"]),
    default="light",
    show_default=True,
    help="Colours for light or dark documentation pages.",
)
@report_option(
    "Draw a saved report (ampgraph table --format json) instead of analysing MODEL; repeat for "
    "several. Needs no torch."
)
@no_check_option
@pass_options
@compile_options()
@gathers_analysis_options
def render(
    analysis: AnalysisOptions, out_dir: Path, formats: tuple[str, ...], view: str, unfold: bool,
    theme: str, report_paths: tuple[Path, ...], compile_: str, emulate: bool,
) -> None:  # fmt: skip
    """Draw the dtype flow as Graphviz diagrams, one file per setting plus an overview.

    With no arguments: OPT-125M in the seed notebook's four settings, as SVG files in
    ./ampgraph-out, plus an overview figure with the four side by side (the 2x2 matrix of
    autocast off/on x parameters fp32/16-bit). Prints the path of each file written.

    Edges are coloured and labelled by dtype (fp32 blue, bf16 orange, fp16 purple, integer/bool
    grey dashed); boxes are filled by autocast policy (lower precision, fp32, promote, none); each
    box lists the casts autocast inserts (e.g. 'casts x, weight, bias: fp32->bf16'); promotions
    (bf16 + fp32 -> fp32) have a thick vermillion border; autocast-disabled regions are framed.
    Files are deterministic: the same report gives byte-identical files.

    With --pass backward, the gradients from the loss to the parameters instead (files
    MODEL-SLUG-backward.FORMAT): each box is the backward of a forward module, the casts
    autograd makes and the 16-bit matmuls are written in it, each parameter's gradient ends in
    a box with its dtype, and a panel gives the memory saved for backward per layer and dtype.
    --pass train writes both diagrams.

    \b
    Examples:
      ampgraph render                              # four SVGs + overview in ampgraph-out/
      ampgraph render -s amp-fp32 --out docs/figures --format svg --format png
      ampgraph render llama-tiny --view ops --unfold
      ampgraph render --theme dark --amp-dtype fp16
      ampgraph render --format dot                 # Graphviz source, no Graphviz needed
      ampgraph render llama-3-70b -s amp-fp32 --format html   # one interactive page
      ampgraph render -s amp-fp32 --format explorer # Model Explorer's graph and overlays
      ampgraph table -s amp-fp32 --format json > r.json && ampgraph render --report r.json
      ampgraph render --pass backward -s amp-fp32 --format png
      ampgraph render -s half --compile inductor   # each fused kernel a frame

    With --compile inductor, one figure per setting (MODEL-SETTING-ops-inductor.FORMAT): every
    op, each kernel Inductor's plan runs a frame, the eager roundings it drops marked.
    """
    from ampgraph.report.writing import check_folder_writable

    formats = formats or ("svg",)
    check_folder_writable(out_dir, "diagrams")  # before the work, not after it
    if compiled_analysis(analysis, compile_, emulate):
        if report_paths:
            raise click.UsageError("--compile inductor needs MODEL, not --report")
        from ampgraph.cli.compiled_commands import compiled_render

        return compiled_render(analysis, out_dir, formats, theme, emulate)

    def load_renderer() -> None:
        # Beside a cold analysis, on the core its imports leave idle (networkx alone is 0.2 s).
        from ampgraph.render.files import check_formats

        check_formats(formats)  # a missing dot fails now, not after the analysis

    if report_paths:
        refuse_model_with_reports()
        if analysis.settings:
            raise click.UsageError("--setting and --report exclude each other: a report has one")
        if analysis.loss is not None or analysis.backward_autocast:
            raise click.UsageError("--loss and --backward-in-autocast need MODEL, not --report")
        load_renderer()
        reports = load_reports(report_paths)
    else:
        reports = analysed(analysis.request(), meanwhile=load_renderer)
    from ampgraph.formats.diagrams import render_files

    progress(f"laying out {len(reports)} diagram{'s' if len(reports) != 1 else ''} with dot")
    paths = render_files(reports, out_dir, formats=formats, view=view, fold=not unfold,
                         theme=theme, pass_=analysis.pass_)  # fmt: skip
    progress_done()
    write_output("paths", "text", paths)


def _verification(request: Any, send: Callable[[tuple[str, Any]], None]) -> None:
    """``verify``'s work, in the confined process: ampgraph.verify is imported there, as it
    imports torch, and a process that has imported torch cannot fork one that runs it
    (:mod:`ampgraph.pipeline.confine`)."""
    from ampgraph.verify.spec_run import produce

    produce(request, send)


@click.command()
@model_argument
@setting_options
@click.option(
    "--record",
    "record_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Also write a JSON record (device name, torch version, date, agreement, disagreements) "
    "to FILE, atomically.",
)
@click.option(
    "--random-seed",
    "--seed",
    "random_seed",
    type=click.IntRange(0, 2**64 - 1),
    default=0,
    show_default=True,
    help="Random seed for the weights (values never change a dtype; the same random seed makes "
    "runs repeat).",
)
@format_option(
    "verify",
    "text: a line per setting and per disagreement; json: the record --record writes.",
)
@pass_options
@gathers_analysis_options
def verify(
    analysis: AnalysisOptions, record_path: Path | None, random_seed: int, fmt: str
) -> None:
    """Prove the annotations against real execution; exit 1 on any disagreement.

    Builds MODEL on --device with random weights and runs it for real under torch.autocast, in
    each setting, then makes three cross-checks against ampgraph's prediction:

    \b
      nodes    the captured graph, run node by node with real kernels: every
               node's output dtypes (or its error) against its annotation;
      modules  the eager model with the seed notebook's forward hooks on its
               leaf modules: every hook line against the annotated one;
      casts    the aten._to_copy calls autocast really makes at each node
               (seed 001's log) against the predicted casts.

    Prints one line per setting with the agreement counts (agree/total), then one line per
    disagreement: its kind, node (or module), op, predicted and observed. --device cpu uses the
    CPU autocast policy and runs anywhere; --device cuda needs a GPU (without one,
    'ampgraph check --device cuda' checks against the dispatcher instead).

    With --pass backward, a real training step instead: the eager model in training mode,
    forward under torch.autocast, loss = output.float().sum(), loss.backward(); compared are
    every parameter's .grad dtype, every tensor autograd saved (dtype, shape, bytes, via
    saved_tensors_hooks) and the activation memory per dtype, and every op the backward runs
    with its dtypes. --pass train does the forward's checks and then these.

    \b
    Examples:
      ampgraph verify --device cpu                  # OPT-125M, the four settings
      ampgraph verify --device cpu -s amp-fp32 --amp-dtype fp16
      ampgraph verify --device cuda --record docs/verification/cuda.json
      ampgraph verify llama-tiny --device cpu
      ampgraph verify --device cpu --pass train
      ampgraph verify t5-small --device cpu --pass backward --backward-in-autocast
    """
    from ampgraph.pipeline.confine import confine
    from ampgraph.report.writing import check_writable

    request = analysis.request(seed=random_seed)
    if record_path is not None:
        check_writable(Path(record_path), "record")  # before the work, not after it
    results: list[Any] = []

    def take(item: tuple[str, Any]) -> None:
        kind, value = item
        if kind == "progress":
            progress(value)
            return
        progress_done()  # the setting's lines come next
        write_output("verify-setting", fmt, value)
        results.extend(value)

    confine(lambda send: _verification(request, send), take, name="verification",
            timeout=request.timeout, counted=lambda item: item[0] == "step",
            expected=len(request.settings))  # fmt: skip
    written = None
    if record_path is not None:
        from ampgraph.formats.outputs import write_verify_record

        written = write_verify_record(results, record_path)
    write_output("verify", fmt, results, record=written)
    failed = sum(len(r.disagreements) for r in results)
    if failed:
        raise click.ClickException(
            f"{failed} disagreement{'s' if failed != 1 else ''} between the annotations and "
            "real execution"
        )
