"""The options the commands share, declared once: the model, the settings, the pass, --format.

Each helper is a decorator (or makes one) that adds its options to a click command. The options
every analysis shares (:data:`SHARED`: the model's options, --tracer, --timeout, --quiet, --force,
--recipe) are not handed to the command's function: click keeps their parsed values in the
context's ``params``, where the one builder of the request
(:func:`ampgraph.cli.reports.command_request`) reads them, through :func:`forced`,
:func:`timeout_seconds` and :func:`recipes_given`; no callback leaves values in ``ctx.meta``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from ampgraph.errors import SettingError, clip
from ampgraph.settings import (
    DEVICE_TYPES,
    PLUGIN_DEVICE_TYPES,
    PRESETS,
    Setting,
    check_device_type,
    seed_matrix,
)

F = TypeVar("F", bound=Callable[..., Any])


#: The options the commands share whose values are the analysis's (or the stage line's), not the
#: command function's: its wrapper (:func:`_shared`) drops them from its arguments, and they are
#: read from ``ctx.params``, where click keeps every parsed value.
SHARED = ("config_path", "model_dir", "module_factory", "tracer", "timeout", "quiet", "force",
          "recipes")  # fmt: skip
#: The options that name a model instead of MODEL: label, parameter name, spec kind.
_MODEL_OPTIONS = (
    ("--config", "config_path", "config"),
    ("--model-dir", "model_dir", "dir"),
    ("--module", "module_factory", "module"),
)


def _shared(f: F) -> F:
    """``f`` called without the :data:`SHARED` options' values (which stay in ``ctx.params``)."""
    if getattr(f, "_ampgraph_shared", False):
        return f

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        for name in SHARED:
            kwargs.pop(name, None)
        return f(*args, **kwargs)

    command._ampgraph_shared = True  # type: ignore[attr-defined]
    return command  # type: ignore[return-value]


def _parsed(name: str, default: Any = None) -> Any:
    """The parsed value of the current command's option ``name`` (``default`` outside a
    command, or for a command without the option)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return default
    value = ctx.params.get(name, default)
    return default if value is None else value


def _models_given(ctx: click.Context, value: str | None) -> dict[str, tuple[str, str]]:
    """Label -> (spec kind, spec) of each model the command line names: MODEL's ``value`` and
    the options that name one instead."""
    given = {label: (kind, ctx.params.get(key)) for label, key, kind in _MODEL_OPTIONS}
    given = {label: kv for label, kv in given.items() if kv[1]}
    if value is not None:
        given = {"MODEL": ("auto", value), **given}
    return given  # type: ignore[return-value]


def models_given() -> list[str]:
    """What the command line names as its model (``MODEL``, ``--config``...), for commands where
    a model excludes another input (--report): the spec a command receives is opt-125m when
    nothing is."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    named = ctx.get_parameter_source("model") == ParameterSource.COMMANDLINE
    return list(_models_given(ctx, ctx.params.get("model") if named else None))


def _resolve_model(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """One :class:`~ampgraph.model.specs.ModelSpec` (a str) from MODEL or the option that names it."""
    from ampgraph.model.specs import DEFAULT_TRACER, ModelSpec

    given = _models_given(ctx, value)
    if len(given) > 1:
        raise click.UsageError(f"give one model, not {' and '.join(given)}", ctx)
    kind, spec = next(iter(given.values()), ("auto", "opt-125m"))
    return ModelSpec(spec, kind, tracer=ctx.params.get("tracer") or DEFAULT_TRACER)


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
    return spec if _models_given(ctx, None) else None


def model_options(f: F) -> F:
    """The options every command that analyses a model takes, beside its model argument(s):
    --config, --model-dir, --module, --tracer and --timeout (one group, not copies)."""
    from ampgraph.model.specs import DEFAULT_TRACER, TRACERS

    # Eager, so that they are known when MODEL's callback combines them whatever their order.
    f = _shared(f)
    params = [
        click.option(
            "--config", "config_path", metavar="PATH", is_eager=True,
            help="A Hugging Face config.json to build, instead of MODEL.",
        ),
        click.option(
            "--model-dir", metavar="DIR", is_eager=True,
            help="A local Hugging Face model folder: its config.json is read, weights never.",
        ),
        click.option(
            "--module", "module_factory", metavar="PKG.MOD:FACTORY", is_eager=True,
            help="Any nn.Module: a factory (no arguments; also path/to/file.py:factory) returning "
            "(module, example_inputs) -- a tensor, a tuple of positional inputs or a dict of "
            "keyword inputs; shapes and dtypes are what matter -- or (module, args, kwargs).",
        ),
        click.option(
            "--tracer", type=click.Choice(TRACERS), default=DEFAULT_TRACER, show_default=True,
            is_eager=True,
            help="Tracer: make-fx, torch.export's graph traced by make_fx and export's own "
            "passes (twice as fast); export, torch.export.export itself (the same graph); "
            "hf-fx, Hugging Face's FX tracer (transformers < 4.50); fx, torch.fx.symbolic_trace "
            "for simple modules. Both FX graphs are lowered by torch.export.",
        ),
    ]  # fmt: skip
    f = quiet_option(f)
    f = timeout_option(f)  # it and --quiet are listed after the options that name the model
    for param in reversed(params):
        f = param(f)
    return f


def quiet_option(f: F) -> F:
    """--quiet: no progress line (also ``ampgraph --quiet COMMAND``, or AMPGRAPH_QUIET=1)."""
    f = _shared(f)
    return click.option(
        "--quiet", "-q", is_flag=True,
        help="No progress line on stderr. It shows only on a terminal, after a second's work, "
        "and goes when the answer comes.",
    )(f)  # fmt: skip


class Seconds(click.ParamType):
    """--timeout's value, read by :func:`ampgraph.model.usercode.parse_timeout`: 0 (no bound)
    or 1 s to a week; ``inf``, ``nan``, ``1e308``, ``1e-6`` and negatives are usage errors."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ampgraph.model.usercode import parse_timeout

        try:
            return parse_timeout(value) or 0.0
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def timeout_option(f: F) -> F:
    """--timeout: the bound on the analysis (and verify's real run) of a model, which the
    command reads with :func:`timeout_seconds`."""
    from ampgraph.model.usercode import DEFAULT_TIMEOUT

    f = _shared(f)
    return click.option(
        "--timeout", type=Seconds(), default=DEFAULT_TIMEOUT, show_default=True,
        metavar="SECONDS",
        help="Stop with an error when analysing the model takes longer (a forward that never "
        "returns, whatever it catches: the analysis runs in a process group that is killed); "
        "0: no bound; else 1 to 604800 (a week).",
    )(f)  # fmt: skip


def timeout_seconds() -> float | None:
    """The command's --timeout in seconds; None for no bound. A command without the option
    (``baseline check``) has the default bound."""
    from ampgraph.model.usercode import DEFAULT_TIMEOUT

    ctx = click.get_current_context(silent=True)
    value = _parsed("timeout", DEFAULT_TIMEOUT) if ctx is not None else None
    return float(value) if value else None


def seq_len_option(f: F) -> F:
    """--seq-len: the length of the token ids synthesised for a language model."""
    return click.option(
        "--seq-len", type=click.IntRange(min=1), default=8, show_default=True,
        help="Length of the synthesised token ids for language models.",
    )(f)  # fmt: skip


def _device_type(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """--device checked in one line: an unknown name is a usage error (exit 2) that lists the
    device types; one whose autocast kernels come from a plugin cannot be analysed (exit 1)."""
    for device in value if isinstance(value, tuple) else (value,):
        try:
            check_device_type(device)
        except SettingError as exc:
            if device in PLUGIN_DEVICE_TYPES:
                raise click.ClickException(str(exc)) from None
            raise click.BadParameter(str(exc), ctx, param) from None
    return value


def device_option(*, several: bool = False) -> Callable[[F], F]:
    """--device, the device type whose autocast applies: ``device`` (default cuda), or with
    ``several`` one per side of a diff, ``devices``.

    >>> @click.command()
    ... @device_option()
    ... def show(device: str) -> None:
    ...     click.echo(device)
    >>> from click.testing import CliRunner
    >>> CliRunner().invoke(show, ["--device", "mps"]).output
    'mps\\n'
    """
    names = ", ".join(DEVICE_TYPES)
    if several:
        return click.option(
            "--device", "devices", multiple=True, metavar="TYPE", callback=_device_type,
            help=f"Device type of A, then of B (twice to compare them): {names}. Default: cuda.",
        )  # fmt: skip
    return click.option(
        "--device", metavar="TYPE", default="cuda", show_default=True, callback=_device_type,
        help=f"Device type whose autocast policy applies: {names}. None needs the device: fake "
        "tensors on it run its real autocast kernels (xpu and mps on a torch built without them: "
        "a prediction from their lists, traced on cuda).",
    )  # fmt: skip


def recipe_option(*, sides: bool = False) -> Callable[[F], F]:
    """--recipe (repeatable): settings named by a framework's precision flag, left for
    :func:`resolve_settings`; with ``sides``, one for A and one for B of a diff."""
    what = (
        "Instead of --setting, the framework precision flag A runs with, then B's (twice to "
        "compare them)"
        if sides
        else "Instead of --setting, your framework's precision flag"
    )
    option = click.option(
        "--recipe", "recipes", multiple=True, metavar="FAMILY:VALUE",
        help=f"{what}, spelled as it spells it: hf:bf16 (Trainer(bf16=True)), accelerate:fp16, "
        "lightning:bf16-mixed, fabric:bf16-true, fsdp2:param_dtype=bf16,reduce_dtype=fp32, "
        "fsdp1:param_dtype=bf16, deepspeed:ds_config.json; torchao:rowwise (FP8, on table, check, "
        "render, audit and diff: the graph of ampgraph fp8). Analyses the setting it runs on "
        "--device (cuda or cpu) and prints, on stderr, what else it does (input casts, buffers, "
        "gradient and optimizer dtypes). Table: docs/recipes.md.",
    )  # fmt: skip
    return lambda f: option(_shared(f))


def setting_options(f: F) -> F:
    """--setting (repeatable), --device, --amp-dtype, --force and --seq-len: which settings of
    the model to analyse; the command receives them but --force (read with :func:`forced`)."""
    options: list[Callable[[F], F]] = [
        click.option(
            "--setting",
            "-s",
            "settings",
            multiple=True,
            metavar="NAME",
            help=f"Setting to analyse; repeat for several. Presets: {', '.join(PRESETS)}. "
            "Default: all four.",
        ),
        recipe_option(),
        device_option(),
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
            help="Analyse a model beyond what ampgraph refuses: more layers than any published "
            "model, or (verify) more real weights than this machine's free memory.",
        ),
        seq_len_option,
    ]
    f = _shared(f)
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


#: Recipe families (``"torchao:"``) that no setting expresses, by prefix -> what runs the
#: command on them instead: it exits, or returns where the command has no such meaning (the
#: recipe's parser then says where it does). :mod:`ampgraph.cli.fp8_settings` registers FP8's.
RECIPE_COMMANDS: dict[str, Callable[[click.Context, tuple[str, ...]], None]] = {}


def resolve_settings(
    names: Sequence[str], device: str, amp_dtype: str, recipes: Sequence[str] | None = None
) -> list[Setting]:
    """Setting names from the command line, the settings of ``recipes`` (None: the command's
    --recipe flags), or the seed's four when neither is given."""
    ctx = click.get_current_context(silent=True)
    recipes = recipes_given() if recipes is None else tuple(recipes)
    if recipes:
        if names:
            raise click.UsageError("give --setting or --recipe, not both (a recipe is a setting)")
        if _typed(ctx, "amp_dtype"):
            raise click.UsageError(
                "give --amp-dtype or --recipe, not both: a recipe names its own dtype "
                "(hf:fp16, lightning:16-mixed, fsdp2:param_dtype=fp16)"
            )
        from ampgraph.recipes import parse_recipe

        for family, run in RECIPE_COMMANDS.items():
            if ctx is not None and any(r.strip().lower().startswith(family) for r in recipes):
                run(ctx, tuple(recipes))  # exits, where the command takes such a recipe
        try:
            parsed = [parse_recipe(r, device_type=device) for r in recipes]
        except SettingError as exc:
            raise click.BadParameter(str(exc), param_hint="'--recipe'") from None
        for recipe in parsed:
            click.echo(recipe.describe(), err=True)
        return [r.setting for r in parsed]
    if not names:
        return seed_matrix(device, amp_dtype)
    try:
        settings = [Setting.parse(n, device_type=device, amp_dtype=amp_dtype) for n in names]
    except SettingError as exc:
        raise click.BadParameter(str(exc), param_hint="'--setting'") from None
    for name, setting in zip(names, settings):
        # 'amp-fp32,device=cpu' with --device cuda: the two disagree; neither silently wins.
        if setting.device_type != device and _typed(ctx, "device"):
            raise click.UsageError(
                f"--setting {clip(name, 80)} names device {setting.device_type} and --device "
                f"says {device}: give the device once"
            )
    return settings


def _typed(ctx: click.Context | None, name: str) -> bool:
    """Whether the option ``name`` was given (on the command line or by its variable)."""
    from click.core import ParameterSource

    if ctx is None or name not in {p.name for p in ctx.command.params}:
        return False
    typed = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return ctx.get_parameter_source(name) in typed


def forced() -> bool:
    """Whether the command was given --force."""
    return bool(_parsed("force", False))


def recipes_given() -> tuple[str, ...]:
    """The command's --recipe flags, as typed (none: an empty tuple)."""
    return tuple(_parsed("recipes", ()))


def root_options() -> dict[str, Any]:
    """The group-level options (``ampgraph --no-cache --jobs 2 COMMAND``)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return obj if isinstance(obj, dict) else {"no_cache": False, "jobs": None}


def format_option(kind: str, help: str, *, several: bool = False) -> Callable[[F], F]:
    """--format with the formats :mod:`ampgraph.formats.registry` has for ``kind``: one of them,
    ``fmt`` (default the first), or with ``several`` any number, ``formats`` (also ``-f``;
    render's files, none given: the command's default).

    >>> @click.command()
    ... @format_option("verify", "text: lines; json: a record.")
    ... def show(fmt: str) -> None:
    ...     click.echo(fmt)
    >>> from click.testing import CliRunner
    >>> CliRunner().invoke(show, ["--format", "json"]).output
    'json\\n'
    """
    from ampgraph.formats.registry import names

    choices = list(names(kind))
    if several:
        return click.option(
            "--format", "-f", "formats", type=click.Choice(choices), multiple=True, help=help,
        )  # fmt: skip
    return click.option(
        "--format", "fmt", type=click.Choice(choices), default=choices[0], show_default=True,
        help=help,
    )  # fmt: skip


def no_check_option(f: F) -> F:
    """--no-check: skip the dispatcher check."""
    return click.option("--no-check", is_flag=True, help="Skip the dispatcher check (faster).")(f)


def report_option(help: str) -> Callable[[F], F]:
    """--report JSON (repeatable): saved reports to read instead of analysing a model, as
    ``report_paths``; see :func:`ampgraph.cli.reports.load_reports`."""
    return click.option(
        # Not dir_okay=False: a folder, a FIFO, /dev/zero get the one reader's line (exit 1).
        "--report", "report_paths", type=click.Path(exists=True, path_type=Path),
        multiple=True, metavar="JSON", help=help,
    )  # fmt: skip
