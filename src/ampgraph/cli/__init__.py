"""The ``ampgraph`` command line: thin commands over the library API.

Each command parses its options, calls :mod:`ampgraph`'s functions and formats the result. Errors a
user can fix (:class:`~ampgraph.errors.AmpgraphError`) become one ``Error: ...`` line and exit
status 1; option mistakes are click's usage errors, exit status 2.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ampgraph import __version__
from ampgraph.errors import AmpgraphError, SettingError
from ampgraph.report.records import Report
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


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"ampgraph.{param.name}"] = value
    return value


def _resolve_model(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """One :class:`~ampgraph.model.specs.ModelSpec` (a str) from MODEL or the option that names it."""
    from ampgraph.model.specs import DEFAULT_TRACER, ModelSpec

    given = {
        label: (kind, ctx.meta.get(f"ampgraph.{key}"))
        for label, key, kind in (
            ("--config", "config_path", "config"),
            ("--model-dir", "model_dir", "dir"),
            ("--module", "module_factory", "module"),
        )
    }
    given = {label: kv for label, kv in given.items() if kv[1]}
    if value is not None:
        given = {"MODEL": ("auto", value), **given}
    if len(given) > 1:
        raise click.UsageError(f"give one model, not {' and '.join(given)}", ctx)
    # What the user named, for commands where a model excludes another input (--report): the
    # spec returned below is opt-125m when nothing is.
    ctx.meta["ampgraph.model_given"] = list(given)
    kind, spec = next(iter(given.values()), ("auto", "opt-125m"))
    return ModelSpec(spec, kind, tracer=ctx.meta.get("ampgraph.tracer") or DEFAULT_TRACER)


def model_argument(f: F) -> F:
    """MODEL, or one of --config/--model-dir/--module, and --tracer: the command receives them as
    one ``model`` value, a :class:`~ampgraph.model.specs.ModelSpec` (a str)."""
    f = model_options(f)
    return click.argument("model", required=False, metavar="[MODEL]", callback=_resolve_model)(f)


def option_model() -> Any:
    """The model --config/--model-dir/--module named, as a :class:`~ampgraph.model.specs.ModelSpec`,
    or None: for commands whose models are arguments of their own (``diff A B``)."""
    ctx = click.get_current_context()
    spec = _resolve_model(ctx, None, None)  # type: ignore[arg-type]
    return spec if ctx.meta["ampgraph.model_given"] else None


def model_options(f: F) -> F:
    """The options every command that analyses a model takes, beside its model argument(s):
    --config, --model-dir, --module, --tracer and --timeout (one group, not copies)."""
    from ampgraph.model.specs import DEFAULT_TRACER, TRACERS

    # Eager, so that they are known when MODEL's callback combines them whatever their order.
    params = [
        click.option(
            "--config", "config_path", metavar="PATH", is_eager=True, expose_value=False,
            callback=_remember, help="A Hugging Face config.json to build, instead of MODEL.",
        ),
        click.option(
            "--model-dir", metavar="DIR", is_eager=True, expose_value=False, callback=_remember,
            help="A local Hugging Face model folder: its config.json is read, weights never.",
        ),
        click.option(
            "--module", "module_factory", metavar="PKG.MOD:FACTORY", is_eager=True,
            expose_value=False, callback=_remember,
            help="Any nn.Module: a factory (no arguments; also path/to/file.py:factory) returning "
            "(module, example_inputs) -- a tensor, a tuple of positional inputs or a dict of "
            "keyword inputs; shapes and dtypes are what matter -- or (module, args, kwargs).",
        ),
        click.option(
            "--tracer", type=click.Choice(TRACERS), default=DEFAULT_TRACER, show_default=True,
            is_eager=True, expose_value=False, callback=_remember,
            help="Tracer: make-fx, torch.export's graph traced by make_fx and export's own "
            "passes (twice as fast); export, torch.export.export itself (the same graph); "
            "hf-fx, Hugging Face's FX tracer (transformers < 4.50); fx, torch.fx.symbolic_trace "
            "for simple modules. Both FX graphs are lowered by torch.export.",
        ),
    ]  # fmt: skip
    f = timeout_option(f)  # first: it is listed after the options that name the model
    for param in reversed(params):
        f = param(f)
    return f


def timeout_option(f: F) -> F:
    """--timeout: the bound on the analysis (and verify's real run) of a model, which the
    command reads with :func:`timeout_seconds`."""
    from ampgraph.model.usercode import DEFAULT_TIMEOUT

    return click.option(
        "--timeout", type=click.FloatRange(min=0), default=DEFAULT_TIMEOUT, show_default=True,
        metavar="SECONDS", expose_value=False, callback=_remember,
        help="Stop with an error when analysing the model takes longer (a forward that never "
        "returns); 0: no bound.",
    )(f)  # fmt: skip


def timeout_seconds() -> float | None:
    """The command's --timeout in seconds; None for no bound. A command without the option
    (``baseline check``) has the default bound."""
    from ampgraph.model.usercode import DEFAULT_TIMEOUT

    ctx = click.get_current_context(silent=True)
    value = ctx.meta.get("ampgraph.timeout", DEFAULT_TIMEOUT) if ctx is not None else None
    return float(value) if value else None


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
            "--force",
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help="Analyse a model beyond what ampgraph refuses: more layers than any published "
            "model, or (verify) more real weights than this machine's free memory.",
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


def pass_options(f: F) -> F:
    """--pass, --loss and --backward-in-autocast: which pass of a training step to analyse."""
    options = [
        click.option(
            "--pass", "pass_", type=click.Choice(["forward", "backward", "train"]),
            default="forward", show_default=True,
            help="forward: the model's forward as given (eval mode); backward: the backward of a "
            "training step (model.train(), loss = output.float().sum(), loss.backward()); train: "
            "both.",
        ),
        click.option(
            "--loss", metavar="KEY|INDEX", default=None,
            help="Which output the loss reduces, for --pass backward/train: an output key "
            "('logits') or index ('0'). Default: the first floating-point output.",
        ),
        click.option(
            "--backward-in-autocast", "backward_autocast", is_flag=True,
            help="Call loss.backward() inside the autocast context, so autocast applies to the "
            "backward's ops too. Default: outside, as PyTorch's AMP recipe does.",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def train_options(pass_: str, loss: str | None, backward_autocast: bool) -> dict[str, Any]:
    """The analysis options of a --pass (empty for the forward: its cache keys stay as they were).

    A usage error (exit 2) where --loss or --backward-in-autocast come without a backward.
    """
    if pass_ == "forward":
        if loss is not None or backward_autocast:
            given = "--loss" if loss is not None else "--backward-in-autocast"
            raise click.UsageError(f"{given} needs --pass backward or --pass train")
        return {}
    return {"pass_": pass_, "loss": loss, "backward_autocast": backward_autocast}


def resolve_settings(names: Sequence[str], device: str, amp_dtype: str) -> list[Setting]:
    """Setting names from the command line, or the seed's four when none are given."""
    if not names:
        return seed_matrix(device, amp_dtype)
    try:
        return [Setting.parse(n, device_type=device, amp_dtype=amp_dtype) for n in names]
    except SettingError as exc:
        raise click.BadParameter(str(exc), param_hint="'--setting'") from None


def forced() -> bool:
    """Whether the command was given --force."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get("ampgraph.force"))


def progress(message: str) -> None:
    """A progress note on stderr, only when a person is watching it."""
    if sys.stderr.isatty():
        click.echo(message, err=True)


def root_options() -> dict[str, Any]:
    """The group-level options (``ampgraph --no-cache --jobs 2 COMMAND``)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return obj if isinstance(obj, dict) else {"no_cache": False, "jobs": None}


def analysed(
    model_spec: str, settings: Sequence[str], device: str, amp_dtype: str, seq_len: int,
    *, check: bool = True, warn_unchecked: bool = True, options: dict[str, Any] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> list[Report]:  # fmt: skip
    """:func:`ampgraph.pipeline.run.analyze_spec` with the command's options, and its warnings.

    ``options`` are :func:`train_options` (the pass, its loss and where backward runs);
    ``meanwhile`` is the command's own work that can run beside the analysis.
    """
    from ampgraph.pipeline.run import analyze_spec
    from ampgraph.report.text import data_dependent_warning, dtype_branches_warning

    root = root_options()
    reports = analyze_spec(
        model_spec, resolve_settings(settings, device, amp_dtype), seq_len=seq_len, check=check,
        use_cache=not root["no_cache"], workers=root["jobs"], force=forced(),
        progress=progress, options=options, meanwhile=meanwhile, timeout=timeout_seconds(),
    )  # fmt: skip
    for warning in (dtype_branches_warning(reports[0]), data_dependent_warning(reports[0])):
        if warning:
            click.echo(f"warning: {warning}", err=True)
    unavailable = (reports[0].capture or {}).get("check_unavailable")
    if check and warn_unchecked and unavailable:
        click.echo(f"warning: not checked: {unavailable}", err=True)
    return reports


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
@click.pass_context
def main(ctx: click.Context, no_cache: bool, jobs: int | None) -> None:
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
    """
    ctx.obj = {"no_cache": no_cache, "jobs": jobs}


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
@pass_options
def table(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    only: str | None, fmt: str, no_check: bool, pass_: str, loss: str | None,
    backward_autocast: bool,
) -> None:  # fmt: skip
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
    """
    import json

    from ampgraph.report.text import hook_lines, markdown_table
    from ampgraph.train.formats import backward_lines, markdown_train

    options = train_options(pass_, loss, backward_autocast)
    classes = [c.strip() for c in only.split(",") if c.strip()] if only else None
    if classes and fmt == "json":
        raise click.UsageError("--only selects lines of text or markdown: --format json prints "
                               "the whole report")  # fmt: skip
    reports = analysed(model, settings, device, amp_dtype, seq_len, check=not no_check,
                       options=options)  # fmt: skip
    if classes:
        refuse_unknown_classes(classes, reports[0])
    if fmt == "json":
        payload: Any = reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports]
        click.echo(json.dumps(payload, indent=1))
        return
    for i, report in enumerate(reports):
        if fmt == "markdown":
            parts = [] if pass_ == "backward" else [markdown_table(report, classes)]
            if pass_ != "forward":
                parts.append(markdown_train(report))
            click.echo(("\n" if i else "") + "\n\n".join(parts))
            continue
        if len(reports) > 1:
            click.echo(f"{'' if i == 0 else chr(10)}# {report.model} {report.setting['name']}: "
                       f"{Setting.from_dict(report.setting).title}")  # fmt: skip
        lines = [] if pass_ == "backward" else hook_lines(report, classes)
        if pass_ != "forward":
            lines += backward_lines(report, classes)
        for line in lines:
            click.echo(line)


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


@main.command(name="check")
@model_argument
@setting_options
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
    show_default=True,
    help="text: a summary line per setting and a line per disagreement; json: each setting's "
    "check and disagreements; markdown: a table for a pull request.",
)  # fmt: skip
@pass_options
def check_command(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    fmt: str, pass_: str, loss: str | None, backward_autocast: bool,
) -> None:  # fmt: skip
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
    """
    from ampgraph.report.text import check_markdown, check_record, check_summary, disagreement_lines
    from ampgraph.train.formats import backward_check_lines

    options = train_options(pass_, loss, backward_autocast)
    failed = 0
    reports = analysed(model, settings, device, amp_dtype, seq_len, warn_unchecked=False,
                       options=options)  # fmt: skip
    for report in reports:
        if report.check is None:
            raise click.ClickException(
                (report.capture or {}).get("check_unavailable") or "the check did not run"
            )
        if pass_ != "backward":
            failed += len(report.disagreements)
        if report.backward is not None:
            failed += len(report.backward.disagreements)
        if fmt != "text":
            continue
        if pass_ != "backward":
            click.echo(check_summary(report))
            for line in disagreement_lines(report):
                click.echo(line)
        if report.backward is not None:
            for line in backward_check_lines(report):
                click.echo(line)
    if fmt == "json":
        import json

        click.echo(json.dumps([check_record(r) for r in reports], indent=1))
    elif fmt == "markdown":
        click.echo(check_markdown(reports))
    if failed:
        raise click.ClickException(
            f"{failed} {'node disagrees' if failed == 1 else 'nodes disagree'} with the dispatcher"
        )


@main.group(name="cache")
def cache_group() -> None:
    """Inspect or clear the cache of finished analyses.

    Analyses are cached by model config, sequence length, setting and options, and the
    environment (the versions of ampgraph, torch and transformers, where they are installed, the
    Python and the platform), so a second run reads them without importing torch. An entry is
    served only for the request it was stored for; anything else is analysed again. The cache
    lives in $AMPGRAPH_CACHE_DIR, else $XDG_CACHE_HOME/ampgraph, else ~/.cache/ampgraph, and
    takes at most $AMPGRAPH_CACHE_MAX_BYTES (default 512M; 0 caches nothing): the least recently
    used entries go first.
    """


@cache_group.command(name="info")
def cache_info() -> None:
    """Show where the cache is, how big it is, and how big it may grow."""
    from ampgraph.pipeline import cache

    root, entries, size = cache.info()
    limit, source = cache.bound()
    click.echo(f"{root}: {entries} entr{'y' if entries == 1 else 'ies'}, {size / 1e6:.1f} MB "
               f"of at most {limit / 1e6:.1f} MB ({source})")  # fmt: skip


@cache_group.command(name="clear")
def cache_clear() -> None:
    """Remove every cached analysis, and nothing else.

    Only ampgraph's own entries go: the files named by a hash in the cache's 'reports' folder,
    which carries ampgraph's CACHEDIR.TAG. Anything else in the cache folder is left alone.
    """
    from ampgraph.pipeline import cache

    removed, freed = cache.clear()
    click.echo(f"removed {removed} file{'s' if removed != 1 else ''} ({freed / 1e6:.1f} MB) "
               f"from {cache.cache_dir()}")  # fmt: skip


@main.command()
def models() -> None:
    """List the bundled models: name, class, layers, parameters, and the model each is shaped
    like. Build any of them by name: no download, no weights (parameters are counted on meta).

    Any other model: --config PATH/config.json, --model-dir DIR (a local Hugging Face folder) or
    --module pkg.mod:factory (any nn.Module).
    """
    from ampgraph.model.build import DEFAULT_MODEL, catalogue

    click.echo(f"{'name':<18} {'architecture':<28} {'layers':>6} {'params':>7}  origin")
    for entry in catalogue():
        mark = " (default)" if entry.name == DEFAULT_MODEL else ""
        click.echo(f"{entry.name:<18} {entry.architecture:<28} {entry.layers:>6} "
                   f"{entry.params_text:>7}  {entry.origin}{mark}")  # fmt: skip


@main.command(name="policy")
@click.option(
    "--device", "devices", multiple=True, metavar="TYPE",
    help="Device type to list (repeatable): cuda, cpu, xpu, mps, ... Default: every device type "
    "with an autocast dispatch key in this torch.",
)  # fmt: skip
@click.option(
    "--since", metavar="VERSION",
    help="Instead, list what changed in the autocast lists after this torch release (2.13).",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text",
    show_default=True, help="Plain text, a Markdown page, or JSON (schema ampgraph.policy).",
)  # fmt: skip
@click.option(
    "--import", "imports", multiple=True, metavar="MODULE",
    help="Import a library first so the autocast kernels it registers are listed (repeatable); "
    "torchvision is imported where installed.",
)  # fmt: skip
def policy_command(
    devices: tuple[str, ...], since: str | None, fmt: str, imports: tuple[str, ...]
) -> None:
    """The autocast op reference of the installed torch; exit 1 if ampgraph's tables differ.

    Every op with an autocast kernel in this torch's dispatcher, per device type, with its
    category (lower precision, fp32, fp32 (output dtype), promote, ...) and where the rule comes
    from: ATen's lists, a library's wrapper ampgraph knows (torchvision's roi_align, nms, ...),
    torch.library.register_autocast, or "opaque" for a kernel whose rule ampgraph cannot know.
    Compared with ampgraph's bundled tables: an op the tables lack or a table entry with no kernel
    is printed as a difference.

    \b
    Examples:
      ampgraph policy --device cuda
      ampgraph policy --format markdown > docs/autocast-ops.md
      ampgraph policy --since 2.13
      ampgraph policy --import mylib.ops --device cuda
    """
    from ampgraph.docs import reference

    if since is not None:
        if devices or imports:
            raise click.UsageError("--since lists table changes: give it without --device/--import")
        try:
            click.echo(reference.changes_text(since, fmt))
        except AmpgraphError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
        return
    from ampgraph.policy import autocast_device_types

    available = autocast_device_types()
    for device in devices:
        if device not in available:
            raise click.BadParameter(
                f"{device!r} has no autocast dispatch key in this torch: choose from "
                f"{', '.join(available)}", param_hint="--device",
            )  # fmt: skip
    ref = reference.op_reference(
        list(dict.fromkeys(devices)) or None,
        libraries=(*reference.KNOWN_LIBRARIES, *imports),
    )
    click.echo(reference.FORMATS[fmt](ref))
    if ref.differences:
        raise click.ClickException(
            f"{ref.differences} difference{'s' if ref.differences != 1 else ''} between "
            "ampgraph's tables and this torch's dispatcher"
        )


#: The options of a model's analysis, by parameter name: a saved report was analysed already.
ANALYSIS_OPTIONS = {
    "device": "--device", "amp_dtype": "--amp-dtype", "seq_len": "--seq-len",
    "no_check": "--no-check", "force": "--force", "tracer": "--tracer", "timeout": "--timeout",
}  # fmt: skip


def refuse_model_with_reports() -> None:
    """A usage error (exit 2) when the command was given saved reports (--report) and also a
    model, or an option of a model's analysis, which would be ignored: ``render gpt2 --report
    opt.json`` drew OPT without a word. The Sphinx directive refuses the pair too."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    models = ctx.meta.get("ampgraph.model_given") or []
    if models:
        raise click.UsageError(
            f"{' and '.join(models)} and --report exclude each other: give a model to analyse, "
            "or saved reports", ctx,
        )  # fmt: skip
    typed = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    given = [f for n, f in ANALYSIS_OPTIONS.items() if ctx.get_parameter_source(n) in typed]
    if given:
        raise click.UsageError(
            f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --report: "
            "a saved report was analysed already", ctx,
        )  # fmt: skip


def load_reports(paths: Sequence[Path]) -> list[Any]:
    """Reports saved by ``ampgraph table --format json`` (one report, or a list of them)."""
    from ampgraph.report.records import Report, load_json

    reports: list[Report] = []
    for path in paths:
        try:
            data = load_json(path.read_text(encoding="utf-8"))  # NaN and Infinity are refused
            items = data if isinstance(data, list) else [data]
            if not items:
                raise ValueError("holds an empty list, not a report")
            reports.extend(Report.from_dict(item) for item in items)
        except RecursionError:
            raise click.BadParameter(
                f"{path}: nests too deeply to be a report", param_hint="'--report'"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="'--report'") from None
    return reports


@main.command()
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
@click.option(
    "--format",
    "-f",
    "formats",
    type=click.Choice(["svg", "png", "pdf", "dot"]),
    multiple=True,
    help="File format; repeat for several. Default: svg. 'dot' (Graphviz source) needs no "
    "Graphviz installed; the others need its 'dot' program.",
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
@click.option(
    "--report",
    "report_paths",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    metavar="JSON",
    help="Draw a saved report (ampgraph table --format json) instead of analysing MODEL; "
    "repeat for several. Needs no torch.",
)
@click.option("--no-check", is_flag=True, help="Skip the dispatcher check (faster).")
@pass_options
def render(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    out_dir: Path, formats: tuple[str, ...], view: str, unfold: bool, theme: str,
    report_paths: tuple[Path, ...], no_check: bool, pass_: str, loss: str | None,
    backward_autocast: bool,
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
      ampgraph table -s amp-fp32 --format json > r.json && ampgraph render --report r.json
      ampgraph render --pass backward -s amp-fp32 --format png
    """
    formats = formats or ("svg",)

    def load_renderer() -> None:
        # Beside a cold analysis, on the core its imports leave idle (networkx alone is 0.2 s).
        from ampgraph.render.files import check_formats

        check_formats(formats)  # a missing dot fails now, not after the analysis

    if report_paths:
        refuse_model_with_reports()
        if settings:
            raise click.UsageError("--setting and --report exclude each other: a report has one")
        if loss is not None or backward_autocast:
            raise click.UsageError("--loss and --backward-in-autocast need MODEL, not --report")
        load_renderer()
        reports = load_reports(report_paths)
    else:
        options = train_options(pass_, loss, backward_autocast)
        reports = analysed(
            model, settings, device, amp_dtype, seq_len, check=not no_check, options=options,
            meanwhile=load_renderer,
        )  # fmt: skip
    from ampgraph.render import render_files

    paths = render_files(
        reports, out_dir, formats=formats, view=view, fold=not unfold, theme=theme, pass_=pass_
    )
    for path in paths:
        click.echo(str(path))


@main.command()
@model_argument
@setting_options
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "markdown", "sarif"]), default="text",
    show_default=True,
    help="text: a line per finding and the totals; json: schema ampgraph.review.audit; markdown: a "
    "table for a pull request; sarif: SARIF 2.1.0 for GitHub code scanning.",
)  # fmt: skip
@click.option(
    "--fail-on", type=click.Choice(["note", "warning", "error", "never"]), default="never",
    show_default=True, help="Exit 1 when a finding of this severity or worse exists.",
)  # fmt: skip
@click.option(
    "--report", "report_paths", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True, metavar="JSON",
    help="Audit a saved report (ampgraph table --format json) instead of analysing MODEL; "
    "repeat for several. Needs no torch.",
)  # fmt: skip
@click.option("--no-check", is_flag=True, help="Skip the dispatcher check (faster).")
def audit(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int, fmt: str,
    fail_on: str, report_paths: tuple[Path, ...], no_check: bool,
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
    """
    from ampgraph.review import audit as audit_lib

    if report_paths:
        refuse_model_with_reports()
        if settings:
            raise click.UsageError("--setting and --report exclude each other: a report has one")
        reports = load_reports(report_paths)
    else:
        # Source lines for the findings: the capture keeps stack traces, for audit alone.
        reports = analysed(model, settings, device, amp_dtype, seq_len, check=not no_check,
                           options={"sources": True})  # fmt: skip
    findings = [audit_lib.audit(r) for r in reports]
    if fmt == "json":
        click.echo(audit_lib.to_json(reports))
    elif fmt == "sarif":
        click.echo(audit_lib.sarif(reports))
        unplaced = sorted({
            r.model for r, found in zip(reports, findings, strict=True)
            if audit_lib.model_file(r.model) is None and any(f.source is None for f in found)
        })  # fmt: skip
        if unplaced:  # valid SARIF, but GitHub shows only results that point into a file
            click.echo(f"warning: {', '.join(unplaced)}: some results have no source line and "
                       "the model names no file of model code, so they have logical locations "
                       "only (see docs/audit.md)", err=True)  # fmt: skip
    else:
        show = audit_lib.markdown if fmt == "markdown" else audit_lib.text
        click.echo("\n\n".join(show(r, f) for r, f in zip(reports, findings, strict=True)))
    if fail_on != "never":
        failing = sum(len(audit_lib.at_or_above(f, fail_on)) for f in findings)
        if failing:
            raise click.ClickException(
                f"{failing} finding{'s' if failing != 1 else ''} at or above {fail_on}"
            )


@main.command()
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
    type=int,
    default=0,
    show_default=True,
    help="Random seed for the weights (values never change a dtype; the same random seed makes "
    "runs repeat).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text: a line per setting and per disagreement; json: the record --record writes.",
)  # fmt: skip
@pass_options
def verify(
    model: str, settings: tuple[str, ...], device: str, amp_dtype: str, seq_len: int,
    record_path: Path | None, random_seed: int, fmt: str, pass_: str, loss: str | None,
    backward_autocast: bool,
) -> None:  # fmt: skip
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
    from ampgraph.report.files import check_writable
    from ampgraph.pipeline.run import prepare
    from ampgraph.model.usercode import deadline, model_code
    from ampgraph.verify import resolve_device, write_record
    from ampgraph.verify import verify as verify_model
    from ampgraph.train.verify import verify_train

    options = train_options(pass_, loss, backward_autocast)

    resolved = resolve_settings(settings, device, amp_dtype)
    for setting in resolved:
        resolve_device(setting)  # no GPU: one line now, before the model is built
    if record_path is not None:
        check_writable(Path(record_path), "record")  # before the work, not after it
    start = time.perf_counter()
    results = []
    # The model's code (its build, the eager runs) prints to stderr; the lines between are ours.
    with deadline(timeout_seconds()):
        with model_code():
            built = prepare(model, seq_len=seq_len, force=forced(), progress=progress)
        for i, setting in enumerate(resolved, 1):
            step: list[Any] = []
            with model_code():
                if pass_ != "backward":
                    step.append(
                        verify_model(built, setting, random_seed=random_seed, force=forced())
                    )
                if options:
                    step.append(verify_train(
                        built, setting, random_seed=random_seed, force=forced(), loss=loss,
                        backward_autocast=backward_autocast,
                    ))  # fmt: skip
            progress(f"[{i}/{len(resolved)}] {setting.name}: done at "
                     f"{time.perf_counter() - start:.1f}s")  # fmt: skip
            for result in step if fmt == "text" else ():
                click.echo(result.summary_line())
                for line in result.disagreement_lines():
                    click.echo(line)
            results += step
    if record_path is not None:
        written = write_record(results, record_path)
        if fmt == "text":
            click.echo(f"record: {written}")
    if fmt == "json":
        import json

        from ampgraph.verify import verify_record

        click.echo(json.dumps(verify_record(results), indent=1))
    failed = sum(len(r.disagreements) for r in results)
    if failed:
        raise click.ClickException(
            f"{failed} disagreement{'s' if failed != 1 else ''} between the annotations and "
            "real execution"
        )


# -- diff and baseline: what changes between two analyses, and a committed snapshot as a gate --


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


def _report_file(source: str) -> Report | None:
    """The report a source names when it is a saved ``ampgraph.report`` or baseline, else None
    (a model spec; a config.json is one). One ``Error:`` line for a report that cannot be read."""
    import json

    from ampgraph.review.baseline import SCHEMA as BASELINE
    from ampgraph.review.baseline import read_baseline
    from ampgraph.report.records import load_json

    path = Path(source)
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        text = path.read_text(encoding="utf-8")
        try:
            data, refused = load_json(text), None
        except ValueError as exc:  # NaN: refused in an ampgraph file, but a config is a model
            data, refused = json.loads(text), exc
    except (OSError, ValueError, RecursionError) as exc:
        reason = "it nests too deeply" if isinstance(exc, RecursionError) else exc
        raise click.ClickException(f"{source}: cannot be read as JSON ({reason})") from None
    if isinstance(data, dict) and data.get("schema") == BASELINE:
        return read_baseline(text, source).report
    if isinstance(data, list):
        if len(data) != 1:
            raise click.ClickException(f"{source} holds {len(data)} reports: diff one setting "
                                       "('ampgraph table -s NAME --format json')")  # fmt: skip
        data = data[0]
    if not (isinstance(data, dict) and str(data.get("schema", "")).startswith("ampgraph.")):
        return None  # a Hugging Face config.json: a model to analyse
    if refused is not None:
        raise click.ClickException(f"{source}: {refused}")
    try:
        return Report.from_dict(data)
    except ValueError as exc:
        raise click.ClickException(f"{source}: {exc}") from None


@main.command(name="diff")
@click.argument("sources", nargs=-1, metavar="[A] [B]")
@click.option(
    "--setting", "-s", "settings", multiple=True, metavar="NAME",
    help="Setting of A, then of B (give it twice to compare two settings, once for both). "
    f"Presets: {', '.join(PRESETS)}. Default: amp-fp32, or a saved report's setting.",
)  # fmt: skip
@click.option(
    "--device", "devices", type=click.Choice(["cuda", "cpu"]), multiple=True,
    help="Device type of A, then of B (twice to compare them). Default: cuda.",
)  # fmt: skip
@click.option(
    "--amp-dtype", "amp_dtypes", type=click.Choice(["bf16", "fp16"]), multiple=True,
    help="Autocast dtype of A, then of B (twice to compare them). Default: bf16.",
)  # fmt: skip
@click.option("--seq-len", type=click.IntRange(min=1), default=8, show_default=True,
              help="Length of the synthesised token ids for language models.")  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text",
    show_default=True,
    help="text: a summary and a line per changed node; markdown: a pull-request comment (a "
    "summary table, details collapsed); json: schema ampgraph.review.diff.",
)  # fmt: skip
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
@model_options
@click.pass_context
def diff_command(
    ctx: click.Context, sources: tuple[str, ...], settings: tuple[str, ...],
    devices: tuple[str, ...], amp_dtypes: tuple[str, ...], seq_len: int, fmt: str,
    tables: tuple[str, ...], keep_fp32: tuple[str, ...], move_ops: tuple[str, ...],
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
    """
    from ampgraph.review.diff import FORMATS, diff_reports
    from ampgraph.model.specs import DEFAULT_TRACER, ModelSpec

    given = option_model()
    if given is not None:
        if sources:
            raise click.UsageError(
                f"give the model as A B or with {ctx.meta['ampgraph.model_given'][0]}, not both"
            )
        sources = (given,)
    tracer = ctx.meta.get("ampgraph.tracer") or DEFAULT_TRACER
    sources = tuple(s if isinstance(s, ModelSpec) else ModelSpec(s, tracer=tracer) for s in sources)

    if keep_fp32 or move_ops:
        from ampgraph.review.whatif import checked_note, findings_note

        if tables:
            raise click.UsageError("--tables compares two releases' lists: preview a change "
                                   "with the installed torch's, without --tables")  # fmt: skip

        a, b = _whatif_pair(sources, settings, devices, amp_dtypes, seq_len, keep_fp32, move_ops)
        result = diff_reports(a, b)
        result.notes += [n for n in (findings_note(a, b), checked_note(b, bool(move_ops))) if n]
        click.echo(FORMATS[fmt](result))
        if b.check is not None and b.disagreements:
            n = len(b.disagreements)
            raise click.ClickException(
                f"{n} node{'' if n == 1 else 's'} of the preview "
                f"{'disagrees' if n == 1 else 'disagree'} with the dispatcher"
            )
        if not result.equal:
            ctx.exit(1)
        return

    if len(sources) > 2:
        raise click.UsageError("give at most two models or reports: A and B")
    pairs = {
        "--setting": _pick(settings, "--setting"),
        "--device": _pick(devices, "--device"),
        "--amp-dtype": _pick(amp_dtypes, "--amp-dtype"),
        "--tables": _pick(tables, "--tables"),
    }
    releases = [_release(t) for t in pairs["--tables"]]
    named = [sources[0], sources[-1]] if sources else [ModelSpec("opt-125m", tracer=tracer)] * 2
    files = [_report_file(s) for s in dict.fromkeys(named)]
    files = [files[0], files[-1]]
    if len(sources) < 2 and max(len(settings), len(devices), len(amp_dtypes), len(tables)) < 2:
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
    reports: list[Report | None] = list(files)
    for side, report in enumerate(files):
        if report is not None:
            continue
        other = files[1 - side]
        base = other.setting if other is not None else {}
        name = pairs["--setting"][side] or base.get("name") or "amp-fp32"
        device = pairs["--device"][side] or base.get("device_type") or "cuda"
        amp = pairs["--amp-dtype"][side] or base.get("amp_dtype") or "bf16"
        setting = resolve_settings([name], device, amp)[0]
        options = {"tables": releases[side]} if releases[side] else None
        # One analysis call for both sides of one model, so the model is built once.
        if side == 0 and files[1] is None and named[0] == named[1] and len(set(releases)) == 1:
            name_b = pairs["--setting"][1] or "amp-fp32"
            setting_b = resolve_settings(
                [name_b], pairs["--device"][1] or "cuda", pairs["--amp-dtype"][1] or "bf16"
            )[0]
            reports = analysed(named[0], [setting, setting_b], device, amp, seq_len,
                               check=False, options=options)  # fmt: skip
            break
        reports[side] = analysed(named[side], [setting], device, amp, seq_len,
                                 check=False, options=options)[0]  # fmt: skip
    a, b = reports
    assert a is not None and b is not None
    result = diff_reports(a, b)
    for label, release in zip("AB", releases, strict=True):
        if release and files["AB".index(label)] is None:
            import torch

            result.notes.append(
                f"{label} is a prediction for torch {release}: annotated with its autocast lists "
                f"on a graph traced by this torch {torch.__version__}, and not checked against "
                "a dispatcher"
            )
    click.echo(FORMATS[fmt](result))
    if not result.equal:
        ctx.exit(1)


def _whatif_pair(
    sources: Sequence[str], settings: Sequence[str], devices: Sequence[str],
    amp_dtypes: Sequence[str], seq_len: int, patterns: Sequence[str], moves: Sequence[str],
) -> tuple[Report, Report]:  # fmt: skip
    """``diff --keep-fp32`` / ``--move-op``: one model in one setting, as it is (A) and with the
    change (B). Never cached: the preview is the point, and a change is no model identity."""
    from ampgraph.model.specs import ModelSpec
    from ampgraph.model.usercode import confined
    from ampgraph.review.whatif import preview

    what = "--keep-fp32" if patterns else "--move-op"
    if len(sources) > 1 or max(len(settings), len(devices), len(amp_dtypes)) > 1:
        raise click.UsageError(f"{what} compares one model in one setting with itself: give "
                               "one MODEL and each option once")  # fmt: skip
    if sources and _report_file(sources[0]) is not None:
        raise click.UsageError(f"{what} needs a model to analyse, not a saved report")
    setting = resolve_settings(
        [settings[0] if settings else "amp-fp32"],
        devices[0] if devices else "cuda",
        amp_dtypes[0] if amp_dtypes else "bf16",
    )[0]
    if not setting.autocast:
        change = "to disable" if patterns else "whose lists to change"
        raise click.BadParameter(f"{setting.name} has no autocast {change}: use amp-fp32 or "
                                 "amp-half", param_hint="'--setting'")  # fmt: skip
    spec = sources[0] if sources else ModelSpec("opt-125m")  # diff made each source a spec
    with confined(timeout_seconds()):  # the model's code is built and traced here
        return preview(spec, setting, keep=patterns, moves=moves, seq_len=seq_len, force=forced())


@main.group(name="baseline")
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


def _write_baseline(path: Path, text: str) -> None:
    """Write a baseline atomically; a folder that takes no files is one ``Error:`` line."""
    from ampgraph.report.files import atomic_write

    try:
        atomic_write(path, text.encode())
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the baseline to {path}: {exc.strerror or exc}; choose another path"
        ) from None


def _baseline_report(model: str, setting: str, device: str, amp_dtype: str, seq_len: int) -> Report:
    return analysed(model, [setting], device, amp_dtype, seq_len, check=False)[0]


@baseline_group.command(name="write")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@model_argument
@click.option("--setting", "-s", "setting", default="amp-fp32", show_default=True,
              metavar="NAME", help=f"The setting to snapshot. Presets: {', '.join(PRESETS)}.")  # fmt: skip
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Device type whose autocast policy applies.")  # fmt: skip
@click.option("--amp-dtype", type=click.Choice(["bf16", "fp16"]), default="bf16",
              show_default=True, help="The 16-bit dtype autocast uses.")  # fmt: skip
@click.option("--seq-len", type=click.IntRange(min=1), default=8, show_default=True,
              help="Length of the synthesised token ids for language models.")  # fmt: skip
def baseline_write(
    file: Path, model: str, setting: str, device: str, amp_dtype: str, seq_len: int
) -> None:
    """Write the dtype flow of MODEL (default OPT-125M) in one setting to FILE."""
    from ampgraph.review.baseline import baseline_text
    from ampgraph.report.files import check_writable
    from ampgraph.model.specs import ModelSpec

    check_writable(file, "baseline")
    report = _baseline_report(model, setting, device, amp_dtype, seq_len)
    spec = ModelSpec(model) if not isinstance(model, ModelSpec) else model
    text = baseline_text(report, seq_len=seq_len, spec=str(spec), spec_kind=spec.kind,
                         tracer=spec.tracer)  # fmt: skip
    _write_baseline(file, text)
    click.echo(f"{file}: {len(report.nodes)} nodes of {report.model} {report.setting['name']}")


def _given(ctx: click.Context, name: str) -> bool:
    """Whether parameter ``name`` was given (on the command line), not left at its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


@baseline_group.command(name="check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@model_argument
@click.option("--setting", "-s", "setting", metavar="NAME",
              help="The setting the baseline should be of (default: the baseline's own).")  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text",
    show_default=True, help="How to print the diff: as 'ampgraph diff' does.",
)  # fmt: skip
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
    from ampgraph.review.baseline import (
        baseline_text,
        check_report,
        read_baseline,
        refuse_other,
        spec_to_check,
    )
    from ampgraph.review.diff import FORMATS
    from ampgraph.model.specs import ModelSpec, spec_kind, spec_tracer

    if not file.is_file():
        raise click.ClickException(
            f"no baseline at {file}: write one with 'ampgraph baseline write {file} MODEL -s "
            "SETTING'"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "it is not UTF-8 text"
        raise click.ClickException(f"cannot read the baseline {file}: {reason}") from None
    base = read_baseline(text, str(file))
    s = base.report.setting
    # MODEL's default (opt-125m) is no model named: only what the command line gives counts.
    named = any(_given(ctx, p) for p in ("model", "config_path", "model_dir", "module_factory"))
    if named or setting is not None:
        wanted = resolve_settings([setting or s["name"]], s["device_type"], s["amp_dtype"])[0]
        refuse_other(base, model if named else base.report.model, wanted.to_dict(), str(file))
    # The command line's model, else the one the baseline names, which is never code; the
    # baseline's tracer unless --tracer says otherwise.
    named_spec = model if named else spec_to_check(base, str(file))
    tracer = spec_tracer(model) if _given(ctx, "tracer") else base.tracer
    spec = ModelSpec(str(named_spec), spec_kind(named_spec), tracer=tracer)
    report = _baseline_report(spec, s["name"], s["device_type"], s["amp_dtype"], base.seq_len)
    result = check_report(base, report)
    if result.equal:
        click.echo(
            FORMATS[fmt](result)
            if fmt != "text"  # a pull-request comment says "no changes" too
            else f"{file}: the dtype flow of {base.title} matches ({len(report.nodes)} nodes)"
        )
        return
    click.echo(FORMATS[fmt](result))
    if fmt == "markdown" and not update:
        click.echo(f"\nAccept the new flow with `ampgraph baseline check {file} --update` and "
                   "commit the file.")  # fmt: skip
    if update:
        text = baseline_text(report, seq_len=base.seq_len, spec=base.spec,
                             spec_kind=base.spec_kind, tracer=spec.tracer)  # fmt: skip
        _write_baseline(file, text)
        click.echo(f"{file}: updated to the new flow", err=True)
        return
    raise click.ClickException(
        f"the dtype flow of {base.title} no longer matches {file}: "
        f"{len(result.changes)} change{'s' if len(result.changes) != 1 else ''}; accept it with "
        f"'ampgraph baseline check {file} --update'"
    )


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
    try:
        _run()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if "torch" in sys.modules:
        exit_now(code)
    sys.exit(code)


def stdout_closed() -> bool:
    """Whether this process has no standard output to write to: fd 1 closed when it started.

    >>> stdout_closed()
    False
    """
    import os

    if sys.stdout is None:  # what Python makes of a closed fd 1 at startup
        return True
    try:
        os.fstat(1)
    except OSError:
        return True
    return False


def exit_now(code: int | str | None = 0) -> NoReturn:
    """End the process with ``code`` (as :func:`sys.exit` reads it) once its work is done.

    After torch and transformers are loaded, the interpreter's teardown frees every module and
    object they made, one by one: 1.3 s of a 7.7 s cold ``ampgraph render -s amp-fp32`` on the
    2-core machine, for nothing the command needs. What a normal exit does that matters still
    happens here: the exit handlers run (logging's flush, temporary folders' removal, anything
    registered with :mod:`atexit`) and both output streams are flushed; then ``os._exit`` skips
    the rest. Every file ampgraph writes is closed when its ``with`` block ends, and the worker
    pool has ended before a command returns.
    """
    import atexit
    import os

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            # What CPython's own exit gives when the last flush fails.
            status = status or 120
    os._exit(status)


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

__all__ = ["Path", "main"]
