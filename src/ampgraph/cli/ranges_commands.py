"""The ``ranges`` command: will this model overflow in fp16? A layer over :mod:`ampgraph.ranges`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ampgraph.cli.console import progress, progress_done, write_output
from ampgraph.cli.options import format_option, model_argument, setting_options
from ampgraph.cli.reports import analysis_request
from ampgraph.formats.registry import names

if TYPE_CHECKING:
    from ampgraph.pipeline.request import AnalysisRequest


def _weights_dir(model: str, random_weights: bool) -> Path | None:
    """A model folder's weights are read unless --random-weights (a config.json never has any)."""
    path = Path(model)
    return path if not random_weights and path.is_dir() else None


def _confined_ranges(request: AnalysisRequest) -> Any:
    """:func:`ampgraph.ranges.spec_run.ranges_of_spec` of ``request`` confined
    (:mod:`ampgraph.pipeline.confine`, bounded by ``request.timeout``): its notes on the stage
    line, its result returned."""
    from ampgraph.pipeline.confine import confine

    found: list[Any] = []

    def work(send: Callable[[tuple[str, Any]], None]) -> None:
        # Imported here, in the confined process: ampgraph.ranges imports torch, and a process
        # that has imported it cannot fork one that runs it.
        from ampgraph.ranges.spec_run import ranges_of_spec

        ranges_of_spec(request, send)

    def take(item: tuple[str, Any]) -> None:
        kind, value = item
        if kind == "progress":
            progress(value)
        else:
            found.append(value)

    confine(work, take, name="ranges", timeout=request.timeout,
            counted=lambda item: item[0] == "result")  # fmt: skip
    progress_done()
    return found[0]


@click.command("ranges")
@model_argument
@setting_options
@click.option(
    "--seed", "--random-seed", "random_seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True,
    help="Random seed of the weights where the model has none of its own (a bundled model, a "
    "config, a folder without .safetensors files).",
)
@click.option(
    "--random-weights", is_flag=True,
    help="Seeded random weights even where a model folder has .safetensors shards.",
)
@format_option(
    "ranges",
    "text: a line per setting and its findings (one screen); json: schema ampgraph.ranges "
    "(docs/schema.md); markdown: tables for a pull request; sarif: SARIF 2.1.0 for code "
    "scanning.",
)
@click.option(
    "--fail-on", type=click.Choice(["error", "never"]), default="never", show_default=True,
    help="error: exit 1 when a setting has a value that does not fit its dtype.",
)  # fmt: skip
@click.option(
    "--overlay", "overlay_dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
    help="Also write each setting's diagram (unfolded) with every box coloured by its headroom, "
    "as MODEL-SETTING-ranges.svg in DIR (needs Graphviz's dot), and MODEL-ranges.html, the "
    "interactive page of every setting with each node's headroom in its annotation.",
)  # fmt: skip
@click.option(
    "--pass", "pass_", type=click.Choice(["forward", "train"]), default="forward",
    show_default=True,
    help="train: trace the model in training mode and also run the train pass's loss "
    "(output.float().sum()) backward for real: every gradient judged in its dtype there, and "
    "the loss scale that keeps the fp16 ones finite.",
)
@click.option(
    "--loss", metavar="KEY|INDEX", default=None,
    help="Which output the loss reduces, for --pass train: an output key ('logits') or index "
    "('0'). Default: the first floating-point output.",
)
@click.option(
    "--diff", "show_diff", is_flag=True,
    help="Compare two settings (give exactly two -s): the values judged differently in each, "
    "one screen (text), or a 'diff' object added to the JSON.",
)  # fmt: skip
def ranges_command(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    random_seed: int, random_weights: bool, fmt: str, fail_on: str, overlay_dir: Path | None,
    pass_: str, loss: str | None, show_diff: bool,
) -> None:  # fmt: skip
    """Will it overflow? Value ranges of one real fp32 run, judged in each setting.

    Runs MODEL once for real on the CPU in fp32 (its own weights: a --module's, or a model
    folder's .safetensors shards read lazily, never pickle files; seeded random ones otherwise) on
    its example inputs, and records for every node of the captured graph the largest and the
    smallest non-zero magnitude and how many values are zero, inf or NaN. Then, in each
    setting, node by node, against the dtype ampgraph predicts there: values that overflow to
    inf, that flush to zero or lose bits as subnormals, casts that overflow, and constants
    (mask and fill values) that do not fit. Each setting's first failing node is named with
    why it runs in that dtype and what to do.

    \b
    Examples:
      ampgraph ranges llama-tiny -s amp-fp32 --amp-dtype fp16
      ampgraph ranges --module my_model.py:make -s amp-fp32 -s amp-half --amp-dtype fp16
      ampgraph ranges --model-dir ./opt-125m -s half --amp-dtype fp16 --format json
      ampgraph ranges --fail-on error -s amp-fp32 --amp-dtype fp16   # for CI
      ampgraph ranges llama-tiny --amp-dtype fp16 --overlay figures/  # coloured diagrams
      ampgraph ranges llama-tiny -s half --amp-dtype fp16 --pass train  # gradients, loss scale
      ampgraph ranges llama-tiny -s amp-fp32 -s half --amp-dtype fp16 --diff
    """
    if loss is not None and pass_ != "train":
        raise click.UsageError("--loss needs --pass train")
    request = analysis_request(model, settings, device, amp_dtype, seq_len, check=False,
                               pass_=pass_, loss=loss, seed=random_seed,
                               weights_dir=_weights_dir(model, random_weights))  # fmt: skip
    if show_diff and (len(request.settings) != 2 or fmt not in names("ranges-diff")):
        raise click.UsageError("--diff compares two settings (give two -s) in "
                               f"{' or '.join(names('ranges-diff'))}")  # fmt: skip
    if overlay_dir is not None:
        from ampgraph.report.writing import check_folder_writable

        check_folder_writable(overlay_dir, "overlays")  # before the work, not after it
    result = _confined_ranges(request)
    # After the work: the formats read ampgraph.ranges' records, whose package imports torch.
    write_output("ranges-diff" if show_diff else "ranges", fmt, result)
    if overlay_dir is not None:
        from ampgraph.render.range_overlay import write_overlays, write_page

        # On stdout after the text; on stderr beside JSON, which stays alone on stdout.
        write_output("overlays", fmt,
                     [*write_overlays(result, overlay_dir), write_page(result, overlay_dir)])
    if fail_on == "error" and not result.ok:
        raise click.ClickException(str(result.failure()))


__all__ = ["ranges_command"]
