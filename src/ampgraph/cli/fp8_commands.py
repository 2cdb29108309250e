"""The ``fp8`` and ``fp8-ranges`` commands: torchao's FP8 recipes, a layer over
:mod:`ampgraph.fp8` and :mod:`ampgraph.ranges.fp8`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ampgraph.cli.console import progress, progress_done, write_output
from ampgraph.formats.registry import names
from ampgraph.cli.options import forced, model_argument, timeout_seconds

RECIPE_HELP = (
    "torchao:NAME[,filter_fqns=A+B][,filter_file=PATH][,auto_filter=true]; NAME: tensorwise, "
    "rowwise, rowwise_with_gw_hp; MX: mxfp8, mxfp8_floor (dense Linears), mxfp8_rceil, "
    "mxfp8_rceil_wgrad_with_hp (MXFP8 training of a MoE's grouped GEMMs, or of a dense model's "
    "Linears, forward and backward; kernel=emulated on a CPU) (fp8-ranges also TransformerEngine's "
    "te:delayed, te:current, te:mxfp8, te:block[,format=e4m3|hybrid], from its source's rules). filter_fqns keeps the "
    "Linears whose name holds a fragment in bf16 (torchtitan's filter_fqns); filter_file reads "
    "them from the advisor's file (--write-filter); auto_filter adds torchao's size rule."
)


def _recipe(text: str) -> Any:
    from ampgraph.errors import SettingError
    from ampgraph.fp8.recipes import parse_fp8_recipe
    from ampgraph.fp8.te import parse_te_recipe

    try:
        if text.strip().lower().startswith("te:"):
            return parse_te_recipe(text)
        return parse_fp8_recipe(text)
    except SettingError as exc:
        raise click.BadParameter(str(exc), param_hint="'--recipe'") from None


def _build(model: str, seq_len: int) -> Any:
    from ampgraph.model.usercode import deadline, model_code
    from ampgraph.pipeline.run import prepare

    with deadline(timeout_seconds()), model_code():
        return prepare(model, seq_len=seq_len, force=forced(), progress=progress)


def _state(built: Any, seed: int) -> dict[str, Any]:
    from ampgraph.ranges.weights import real_state

    return real_state(built.module, seed)[0]


@click.command("fp8")
@model_argument
@click.option("--recipe", "recipe_text", required=True, metavar="torchao:NAME", help=RECIPE_HELP)
@click.option("--pass", "pass_", type=click.Choice(["forward", "train"]), default="forward",
              show_default=True, help="train: forward + loss + backward (autograd.grad); the "
              "loss is the model's own, else its first floating output's mean against a "
              "fixed-seed normal projection.")
@click.option("--check", is_flag=True, help="Also run the converted model for real on the CPU "
              "(seeded weights) and compare every GEMM's dtypes: exit 1 on a difference.")
@click.option("--seq-len", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--format", "fmt", type=click.Choice(names("fp8")), default="text",
              show_default=True)
@click.option("--dot", "dot_module", metavar="MODULE", default=None,
              help="Print Graphviz source of MODULE's forward nodes instead (torchao's amax, "
              "scales, FP8 casts and _scaled_mm).")
def fp8_command(model: str, recipe_text: str, pass_: str, check: bool, seq_len: int,
                seed: int, fmt: str, dot_module: str | None) -> None:
    """Which GEMMs torchao's FP8 recipe runs in which format, traced from torchao's own code.

    \b
    Examples:
      ampgraph fp8 opt-125m --recipe torchao:rowwise
      ampgraph fp8 opt-125m --recipe torchao:tensorwise,filter_fqns=lm_head --pass train
      ampgraph fp8 llama-tiny --recipe torchao:tensorwise,auto_filter=true --check
    """
    from ampgraph.fp8.graph import trace_fp8

    recipe = _recipe(recipe_text)
    if recipe.spelling.startswith("te:"):
        from ampgraph.fp8.te import NOT_IMPORTED

        raise click.BadParameter(f"{NOT_IMPORTED}: no graph is claimed; ampgraph fp8-ranges "
                                 "predicts its survival", param_hint="'--recipe'")
    built = _build(model, seq_len)
    graph = trace_fp8(built, recipe, train=pass_ == "train")
    if dot_module is not None:
        from ampgraph.fp8.graph import module_flow

        if not any(n.module == dot_module for n in graph.nodes):
            raise click.BadParameter(f"no forward node of module {dot_module!r}",
                                     param_hint="'--dot'")
        progress_done()
        write_output("fp8-dot", "dot", module_flow(graph, dot_module))
        return
    proof = None
    if check:
        from ampgraph.fp8.proof import prove_gemms

        proof = prove_gemms(graph, built, _state(built, seed), train=pass_ == "train")
    progress_done()
    write_output("fp8", fmt, graph, proof=proof)
    if proof is not None and not proof.ok:
        raise click.ClickException(f"the real CPU run differs: {proof.first_difference()}")


@click.command("fp8-ranges")
@model_argument
@click.option("--recipe", "recipe_text", required=True, metavar="torchao:NAME", help=RECIPE_HELP)
@click.option("--pass", "pass_", type=click.Choice(["forward", "train"]), default="forward",
              show_default=True, help="train: the backward's operands too (grad_output, and "
              "each recast of input and weight), from a real fp32 backward of the loss "
              "ampgraph fp8 --pass train traces (the model's own loss, else its first floating "
              "output's mean against a fixed-seed normal projection).")
@click.option("--seq-len", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the weights where the model has none of its own.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Operands listed in text (the worst first).")
@click.option("--prove", is_flag=True, help="Also count on torchao's real conversion of the "
              "same tensors: exit 1 unless every count equals the prediction.")
@click.option("--advise", is_flag=True, help="Write the filter keeping the worst Linears in "
              "bf16, and the survival before against after it.")
@click.option("--write-filter", "filter_path", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="With --advise: write the filter (torchao's module_filter_fn, "
              "torchtitan's filter_fqns) to FILE, which --recipe ...,filter_file=FILE reads.")
@click.option("--max-zero-share", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="--advise keeps a Linear in bf16 when an operand flushes more than this.")
@click.option("--format", "fmt", type=click.Choice(names("fp8-ranges")), default="text",
              show_default=True)
def fp8_ranges_command(model: str, recipe_text: str, pass_: str, seq_len: int, seed: int,
                       top: int, prove: bool, advise: bool, filter_path: Path | None,
                       max_zero_share: float, fmt: str) -> None:
    """Will it survive FP8? Each FP8 GEMM operand's flush-to-zero, saturation and error.

    \b
    Examples:
      ampgraph fp8-ranges opt-125m --recipe torchao:tensorwise --advise
      ampgraph fp8-ranges --module my.py:make --recipe torchao:mxfp8 --prove
      ampgraph fp8-ranges opt-125m --recipe torchao:tensorwise --pass train --prove
      ampgraph fp8-ranges opt-125m --recipe torchao:tensorwise --advise --write-filter keep.py
      ampgraph diff opt-125m --recipe torchao:tensorwise \\
          --recipe torchao:tensorwise,filter_file=keep.py
    """
    from ampgraph.errors import SettingError
    from ampgraph.ranges import fp8 as fp8_ranges

    recipe = _recipe(recipe_text)
    train = pass_ == "train"
    te = recipe.spelling.startswith("te:")
    if te and prove:
        raise click.BadParameter("TransformerEngine cannot be imported here: no kernel of its "
                                 "to prove against (torchao's recipes are proved)",
                                 param_hint="'--prove'")
    if filter_path is not None:
        from ampgraph.report.writing import check_writable

        if not advise:
            raise click.UsageError("--write-filter writes the advisor's filter: add --advise")
        check_writable(filter_path, "filter")
    try:
        fp8_ranges.recipe_operands(recipe, train=train)
    except SettingError as exc:
        raise click.BadParameter(str(exc), param_hint="'--pass'") from None
    built = _build(model, seq_len)
    state = _state(built, seed)
    operands = fp8_ranges.linear_operands(built, recipe, state, train=train)
    rows = fp8_ranges.survival_table(built, recipe, state, train=train, operands=operands)
    mismatches = []
    if prove:
        for row, real in fp8_ranges.prove(built, recipe, state, train=train, operands=operands):
            if row.survival != real:
                mismatches.append(f"{row.module} {row.operand}: predicted {row.survival}, "
                                  f"torchao {real}")
    keep = fp8_ranges.advise(rows, max_zero_share=max_zero_share) if advise else ()
    if filter_path is not None:
        from ampgraph.formats.registry import write_file

        write_file("fp8-filter", "python", keep, filter_path)
    after = (fp8_ranges.survival_table(built, recipe.with_filter(keep), state, train=train,
                                       operands=operands) if keep else rows)
    progress_done()
    write_output("fp8-ranges", fmt, rows, recipe=recipe, top=top,
                 proved=not mismatches if prove else None, keep=keep if advise else None,
                 after=after, max_zero_share=max_zero_share, pass_=pass_, te=te)  # fmt: skip
    if mismatches:
        raise click.ClickException("prediction differs from torchao: " + mismatches[0])


__all__ = ["fp8_command", "fp8_ranges_command"]
