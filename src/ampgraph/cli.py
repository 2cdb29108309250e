"""The ``ampgraph`` command line: thin commands over the library API.

Each command parses its options, calls :mod:`ampgraph`'s functions and formats the result. Errors a
user can fix (:class:`~ampgraph.errors.AmpgraphError`) become one ``Error: ...`` line and exit
status 1; option mistakes are click's usage errors, exit status 2.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from ampgraph import __version__
from ampgraph.errors import AmpgraphError, SettingError
from ampgraph.settings import PRESETS, Setting, seed_matrix

F = TypeVar("F", bound=Callable[..., Any])

EPILOG_SETTINGS = (
    "Settings are the seed notebook's four: fp32 (no autocast, fp32 parameters), half (no "
    "autocast, 16-bit parameters), amp-half (autocast, 16-bit parameters) and amp-fp32 "
    "(autocast, fp32 parameters); or key=value pairs such as 'autocast=on,params=fp16'."
)


class AmpgraphGroup(click.Group):
    """Turn AmpgraphError into a one-line ``Error:`` message with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AmpgraphError as exc:
            raise click.ClickException(str(exc)) from None


def model_argument(f: F) -> F:
    return click.argument("model", default="opt-125m", metavar="[MODEL]")(f)


def setting_options(f: F) -> F:
    options = [
        click.option(
            "--setting",
            "-s",
            "settings",
            multiple=True,
            metavar="NAME",
            help=f"Setting to analyse; repeat for several. Presets: {', '.join(PRESETS)}. "
            "Default: all four.",
        ),
        click.option(
            "--device",
            type=click.Choice(["cuda", "cpu"]),
            default="cuda",
            show_default=True,
            help="Device type whose autocast policy applies. No GPU is needed for either.",
        ),
        click.option(
            "--amp-dtype",
            type=click.Choice(["bf16", "fp16"]),
            default="bf16",
            show_default=True,
            help="The 16-bit dtype autocast (and the 'half' presets) use.",
        ),
        click.option(
            "--seq-len",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Length of the synthesised token ids for language models.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def resolve_settings(names: Sequence[str], device: str, amp_dtype: str) -> list[Setting]:
    """Setting names from the command line, or the seed's four when none are given."""
    if not names:
        return seed_matrix(device, amp_dtype)
    try:
        return [Setting.parse(n, device_type=device, amp_dtype=amp_dtype) for n in names]
    except SettingError as exc:
        raise click.BadParameter(str(exc), param_hint="'--setting'") from None


def progress(message: str) -> None:
    """A progress note on stderr, only when a person is watching it."""
    if sys.stderr.isatty():
        click.echo(message, err=True)


def iter_reports(
    model_spec: str, settings: Sequence[str], device: str, amp_dtype: str, seq_len: int,
    *, check: bool = True,
) -> Iterator[Any]:  # fmt: skip
    """Load the model once, then capture, annotate and check it in each setting."""
    from ampgraph.analysis import analyze
    from ampgraph.models import load_model

    resolved = resolve_settings(settings, device, amp_dtype)
    start = time.perf_counter()
    progress(f"building {model_spec} on the meta device...")
    model = load_model(model_spec, seq_len=seq_len)
    progress(f"  built in {time.perf_counter() - start:.1f}s")
    for i, setting in enumerate(resolved, 1):
        t0 = time.perf_counter()
        report = analyze(model, setting, check=check)
        progress(f"[{i}/{len(resolved)}] {setting.name}: {time.perf_counter() - t0:.1f}s")
        yield report


@click.group(cls=AmpgraphGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ampgraph")
def main() -> None:
    """What torch.autocast really does inside a PyTorch model, node by node.

    ampgraph traces MODEL (OPT-125M by default, built from a bundled config on the meta device:
    no GPU, no weights, no downloads) with torch.export, annotates every op with the autocast
    policy that applies and the dtypes that flow in and out, and checks each annotation against
    PyTorch's own dispatcher.

    \b
    Examples:
      ampgraph table -s amp-fp32 --only Linear,LayerNorm,Embedding
      ampgraph check                       # all four settings, exit 1 on any disagreement
      ampgraph render --out docs/figures   # SVG diagrams of the dtype flow
      ampgraph table --format json > report.json
    """


@main.command()
@model_argument
@setting_options
@click.option(
    "--only",
    metavar="CLASSES",
    help="Comma-separated module classes to show (isinstance-style), e.g. the seed notebook's "
    "'Linear,LayerNorm,Embedding'. Default: every leaf module.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    show_default=True,
    help="text: the seed's hook lines; json: the full versioned report; markdown: a table.",
)
@click.option("--no-check", is_flag=True, help="Skip the dispatcher check (faster).")
def table(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    only: str | None, fmt: str, no_check: bool,
) -> None:  # fmt: skip
    """Print the dtype of every leaf-module call, as forward hooks would.

    Each line is the seed notebook's hook line, e.g.
    '[model.decoder.layers.0.fc1] in=torch.float32 -> out=torch.bfloat16'.
    With several settings each block starts with a '# setting' line.

    \b
    Examples:
      ampgraph table -s amp-fp32
      ampgraph table -s half --amp-dtype fp16 --only Linear
      ampgraph table --format markdown -s amp-half
    """
    import json

    from ampgraph.formats import hook_lines, markdown_table

    classes = [c.strip() for c in only.split(",") if c.strip()] if only else None
    reports = list(iter_reports(model, settings, device, amp_dtype, seq_len, check=not no_check))
    if fmt == "json":
        payload: Any = reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports]
        click.echo(json.dumps(payload, indent=1))
        return
    for i, report in enumerate(reports):
        if fmt == "markdown":
            click.echo(("\n" if i else "") + markdown_table(report, classes))
            continue
        if len(reports) > 1:
            click.echo(f"{'' if i == 0 else chr(10)}# {report.model} {report.setting['name']}: "
                       f"{Setting.from_dict(report.setting).title}")  # fmt: skip
        for line in hook_lines(report, classes):
            click.echo(line)


@main.command(name="check")
@model_argument
@setting_options
def check_command(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int
) -> None:
    """Check every annotation against the PyTorch dispatcher; exit 1 on any disagreement.

    The dispatcher check replays the graph with the real autocast kernels on fake tensors (no GPU
    needed, even for cuda) and compares each node's dtypes with ampgraph's prediction. Each
    disagreement is listed with its node, op, module and both answers.

    \b
    Examples:
      ampgraph check
      ampgraph check -s amp-fp32 --device cpu
      ampgraph check gpt2 --amp-dtype fp16
    """
    from ampgraph.formats import check_summary, disagreement_lines

    failed = 0
    for report in iter_reports(model, settings, device, amp_dtype, seq_len):
        click.echo(check_summary(report))
        for line in disagreement_lines(report):
            click.echo(line)
        failed += len(report.disagreements)
    if failed:
        raise click.ClickException(
            f"{failed} node{'s' if failed != 1 else ''} disagree with the dispatcher"
        )


@main.command()
def models() -> None:
    """List the bundled model configs (build any of them by name, no download needed)."""
    from ampgraph.models import DEFAULT_MODEL, bundled_models

    for name, origin in bundled_models().items():
        mark = " (default)" if name == DEFAULT_MODEL else ""
        click.echo(f"{name:<14} {origin}{mark}")


def run() -> None:  # pragma: no cover - console entry point for `python -m ampgraph`
    main(prog_name="ampgraph")


if __name__ == "__main__":  # pragma: no cover
    run()

__all__ = ["main", "Path"]
