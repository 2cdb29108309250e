"""The ``ampgraph`` command line: the ``main`` group, its commands, and the console entry point.

Each command parses its options, calls :mod:`ampgraph`'s functions and formats the result. Errors a
user can fix (:class:`~ampgraph.errors.AmpgraphError`) become one ``Error: ...`` line and exit
status 1; option mistakes are click's usage errors, exit status 2.

The commands live in modules by group, each named for its commands
(:mod:`~ampgraph.cli.analyze_commands`, :mod:`~ampgraph.cli.review_commands`,
:mod:`~ampgraph.cli.baseline_commands`, :mod:`~ampgraph.cli.reference_commands`,
:mod:`~ampgraph.cli.cache_commands`, :mod:`~ampgraph.cli.ranges_commands`), their shared options
in :mod:`~ampgraph.cli.options`; this module registers them. They import stages
inside the commands, so that starting the command line costs no torch.
"""

from __future__ import annotations

import contextlib
import sys

import click

from ampgraph.version import __version__
from ampgraph.cli import (
    analyze_commands,
    baseline_commands,
    cache_commands,
    compiled_commands,
    fp8_commands,
    fp8_settings,  # noqa: F401  (registers --recipe torchao: on the setting commands)
    ranges_commands,
    reference_commands,
    review_commands,
)
from ampgraph.cli.console import AmpgraphGroup, exit_now, stdout_closed
from ampgraph.compat import unsupported


@click.group(cls=AmpgraphGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ampgraph")
@click.option(
    "--no-cache",
    is_flag=True,
    envvar="AMPGRAPH_NO_CACHE",
    help="Recompute every analysis instead of reading the cache (see 'ampgraph cache').",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for analysing several settings. Default: one per CPU core.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    envvar="AMPGRAPH_QUIET",
    help="No progress line on stderr (on a terminal, slow commands name their stage and the "
    "time so far).",
)
@click.pass_context
def main(ctx: click.Context, no_cache: bool, jobs: int | None, quiet: bool) -> None:
    """What torch.autocast really does inside a PyTorch model, node by node.

    ampgraph traces MODEL (OPT-125M by default, built from a bundled config on the meta device:
    no GPU, no weights, no downloads) with torch.export, annotates every op with the autocast
    policy that applies and the dtypes that flow in and out, and checks each annotation against
    PyTorch's own dispatcher.

    \b
    MODEL is a bundled name ('ampgraph models'), a Hugging Face config.json or
    model folder (offline, no weights), or pkg.module:factory for any nn.Module.

    \b
    Examples:
      ampgraph table -s amp-fp32 --only Linear,LayerNorm,Embedding
      ampgraph check                       # all four settings, exit 1 on any disagreement
      ampgraph render --out docs/figures   # SVG diagrams of the dtype flow
      ampgraph table --format json > report.json
      ampgraph check llama-3-8b --device cpu
      ampgraph table --config path/to/config.json -s amp-fp32
      ampgraph audit -s amp-fp32 --fail-on warning   # findings for a reviewer or CI
      ampgraph diff -s amp-fp32 -s amp-half          # what changes between two settings
      ampgraph render --pass backward -s amp-fp32    # the gradients' dtypes, saved memory
      ampgraph ranges --amp-dtype fp16               # will it overflow? one real CPU run
    """
    ctx.obj = {"no_cache": no_cache, "jobs": jobs, "quiet": quiet}


# In the order they were written; ``ampgraph --help`` lists them by name.
for _command in (
    analyze_commands.table, analyze_commands.check_command, cache_commands.cache_group,
    reference_commands.models, reference_commands.policy_command, analyze_commands.render,
    review_commands.audit, analyze_commands.verify, review_commands.diff_command,
    baseline_commands.baseline_group, ranges_commands.ranges_command,
    compiled_commands.compiled,
    fp8_commands.fp8_command, fp8_commands.fp8_ranges_command,
):  # fmt: skip
    main.add_command(_command)
del _command


def run() -> None:
    """The console entry point: ``main`` with output errors said in one line, then a quick exit.

    A full disk (``table > /dev/full``) is an ``Error:`` line and exit status 1; a closed pipe
    (``ampgraph table | head``) ends quietly, as other Unix tools do. A command that loaded torch
    ends with :func:`exit_now`: everything it wrote is flushed, then the process ends without the
    interpreter's teardown. A bug's traceback still ends the ordinary way.

    Started with standard output closed (``ampgraph models >&-``), any command is one ``Error:``
    line and exit status 1 before it does anything: Python has no ``sys.stdout`` then (the
    command crashed on it), and the first file the command opened would take fd 1's place.
    """
    if stdout_closed():
        click.echo("Error: cannot write to standard output (closed)", err=True)
        sys.exit(1)
    for refuse, line in unsupported():  # torch below the floor: refuse; newer than tried: warn
        click.echo(f"{'Error' if refuse else 'Warning'}: {line}", err=True)
        if refuse:
            sys.exit(1)
    try:
        _run()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if "torch" in sys.modules:
        exit_now(code)
    sys.exit(code)


def _run() -> None:
    import errno
    import os

    try:
        # Without standalone mode click returns a command's ctx.exit(code) instead of exiting.
        code = main(prog_name="ampgraph", standalone_mode=False)
        sys.stdout.flush()
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except BrokenPipeError:
        # Point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            raise
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        click.echo(f"Error: cannot write the output: {exc.strerror}", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    run()

__all__ = ["exit_now", "main", "run", "stdout_closed"]
