"""``--recipe torchao:...`` on the setting commands (``table``, ``check``, ``render``,
``audit``) and on ``diff``: the FP8 graph and survival of ``ampgraph fp8`` / ``fp8-ranges``,
through the same library (:mod:`ampgraph.fp8`, :mod:`ampgraph.ranges.fp8`).

An FP8 recipe converts Linears, which no autocast setting expresses, so these commands hand it
here from :func:`ampgraph.cli.options.resolve_settings` (registered in its
``RECIPE_COMMANDS`` below; ``diff`` calls :func:`fp8_diff` from its own reading of each side's
recipe); each prints what it prints for a setting, of the FP8 graph instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click

from ampgraph.cli.console import progress, progress_done, write_output
from ampgraph.cli.fp8_commands import _build, _recipe, _state
from ampgraph.cli.options import RECIPE_COMMANDS

#: The setting commands that take a torchao recipe; the others point to ``ampgraph fp8``.
COMMANDS = ("table", "check", "render", "audit")
SEVERITY = {"note": 0, "warning": 1, "error": 2}


def is_fp8_recipe(text: str) -> bool:
    """A torchao recipe (``torchao:rowwise``), which these commands take apart from settings.

    >>> is_fp8_recipe(" TorchAO:rowwise"), is_fp8_recipe("hf:bf16")
    (True, False)
    """
    return text.strip().lower().startswith("torchao:")


def _refuse(params: dict[str, Any], names: dict[str, str], why: str) -> None:
    """A usage error for an option of the autocast analysis that an FP8 recipe has no use for."""
    for name, flag in names.items():
        if params.get(name):
            raise click.UsageError(f"{flag} {why}")


def run_setting_command(ctx: click.Context, recipes: tuple[str, ...]) -> None:
    """Run ``ctx``'s command on the FP8 graph of the one torchao recipe given, then exit.

    Returns (doing nothing) for a command that has no FP8 meaning: its recipe parser points to
    ``ampgraph fp8``.
    """
    name = ctx.command.name
    if name not in COMMANDS:
        return
    if len(recipes) != 1:
        raise click.UsageError("give one torchao recipe (ampgraph diff compares two)")
    params = ctx.params
    recipe = _recipe(recipes[0])
    _refuse(params, {"only": "--only", "report_paths": "--report", "ranges_paths": "--ranges",
                     "loss": "--loss", "backward_autocast": "--backward-in-autocast"},
            f"is not for an FP8 recipe ({recipe.spelling})")
    from click.core import ParameterSource

    if ctx.get_parameter_source("device") is ParameterSource.COMMANDLINE and \
            params.get("device") != "cpu":
        click.echo(f"note: {recipe.spelling} is traced under CPU bf16 autocast, as ampgraph fp8 "
                   "traces it: torchao's FP8 code is the device's; the rest follows CPU "
                   "autocast's lists", err=True)
    if name == "audit":
        _audit(ctx, recipe, params)
    built = _build(str(params["model"]), params["seq_len"])
    pass_ = params.get("pass_", "forward")
    from ampgraph.fp8.graph import trace_fp8

    progress(f"tracing {recipe.spelling} on fake tensors")
    graph = trace_fp8(built, recipe, train=pass_ != "forward")
    phases = {"forward": ("forward",), "backward": ("backward",)}.get(
        pass_, ("forward", "backward"))
    if name == "table":
        _table(graph, phases, params["fmt"])
    elif name == "check":
        _check(ctx, graph, built, pass_ != "forward", params["fmt"])
    else:
        _render(built.name, graph, params)
    ctx.exit(0)


def _table(graph: Any, phases: tuple[str, ...], fmt: str) -> None:
    progress_done()
    write_output("fp8-table", fmt, graph, phases=phases)


def _check(ctx: click.Context, graph: Any, built: Any, train: bool, fmt: str) -> NoReturn:
    from ampgraph.fp8.proof import prove_gemms

    progress("running the converted model for real on the CPU")
    proof = prove_gemms(graph, built, _state(built, 0), train=train)
    progress_done()
    write_output("fp8-check", fmt, proof, recipe=graph.recipe.spelling)
    if not proof.ok:
        raise click.ClickException("the FP8 graph disagrees with a real CPU run")
    ctx.exit(0)


def _render(model: str, graph: Any, params: dict[str, Any]) -> None:
    """One flow diagram per FP8 Linear (``ampgraph fp8 --dot``'s), in each format asked."""
    from ampgraph.errors import RenderError
    from ampgraph.formats.diagrams import write_sources
    from ampgraph.formats.registry import text
    from ampgraph.fp8.graph import module_flow
    from ampgraph.render.files import safe_name

    formats = params.get("formats") or ("svg",)
    if {"html", "explorer"} & set(formats):
        raise click.UsageError("--format html and explorer draw autocast's report: an FP8 "
                               "recipe renders svg, png, pdf or dot")
    out: Path = params["out_dir"]
    out.mkdir(parents=True, exist_ok=True)
    done = {n.module for n in graph.nodes if n.phase == "forward"}
    progress("laying out the FP8 Linears' diagrams with dot")
    try:
        for plan in graph.plans:
            if not plan.converted or plan.fqn not in done:
                continue
            source = text("fp8-dot", "dot", module_flow(graph, plan.fqn))
            stem = out / f"{safe_name(model)}-fp8-{safe_name(plan.fqn)}"
            for path in write_sources(source, stem, formats):
                write_output("paths", "text", [path])
    except RenderError as exc:
        raise click.ClickException(str(exc)) from None
    progress_done()


def _audit(ctx: click.Context, recipe: Any, params: dict[str, Any]) -> NoReturn:
    """Findings for the FP8 GEMMs whose operands will not survive, from one real fp32 run."""
    from ampgraph.ranges import fp8 as fp8_ranges

    if params["fmt"] == "sarif":
        raise click.UsageError("--format sarif places findings in model code: an FP8 recipe's "
                               "are per Linear (text, json or markdown)")
    built = _build(str(params["model"]), params["seq_len"])
    rows = fp8_ranges.survival_table(built, recipe, _state(built, 0))
    found = fp8_ranges.findings(rows)
    progress_done()
    write_output("fp8-audit", params["fmt"], found, recipe=recipe.spelling, operands=len(rows))
    fail_on = params.get("fail_on", "never")
    failing = [f for f in found if fail_on != "never" and SEVERITY[f[0]] >= SEVERITY[fail_on]]
    if failing:
        raise click.ClickException(f"{len(failing)} finding{'s' if len(failing) != 1 else ''} "
                                   f"at or above {fail_on}")
    ctx.exit(0)


def fp8_diff(ctx: click.Context, sources: tuple[Any, ...], recipes: tuple[str, ...],
             seq_len: int, fmt: str) -> NoReturn:
    """``ampgraph diff MODEL --recipe torchao:A --recipe torchao:B``: the two FP8 graphs
    (forward and backward; MX's forward) and the forward operands' survival, A against B; exit 1 when they
    differ."""
    from ampgraph.fp8.compare import compare
    from ampgraph.fp8.graph import trace_fp8
    from ampgraph.ranges import fp8 as fp8_ranges

    if len(recipes) != 2 or not all(is_fp8_recipe(r) for r in recipes):
        raise click.UsageError("an FP8 diff compares two torchao recipes of one model: give "
                               "--recipe twice, both torchao:")
    if len(sources) > 1:
        raise click.UsageError("an FP8 diff compares two recipes of one model: give one MODEL")
    a, b = (_recipe(r) for r in recipes)
    built = _build(str(sources[0]) if sources else "opt-125m", seq_len)
    progress("tracing both recipes on fake tensors")
    from ampgraph.fp8.recipes import MX_NAMES

    train = not {a.name, b.name} & set(MX_NAMES)  # MX's graph is a forward (ampgraph.fp8.mx)
    graphs = [trace_fp8(built, r, train=train) for r in (a, b)]
    changes = compare(*graphs)
    state = _state(built, 0)
    rows = [fp8_ranges.survival_table(built, r, state) for r in (a, b)]
    differ = not changes.equal or [r.survival for r in rows[0]] != [r.survival for r in rows[1]]
    progress_done()
    write_output("fp8-diff", fmt, changes, a=a.spelling, b=b.spelling, survival=(rows[0], rows[1]),
                 equal=not differ)  # fmt: skip
    ctx.exit(1 if differ else 0)


RECIPE_COMMANDS["torchao:"] = run_setting_command
