"""The reference commands: ``models`` (the bundled models) and ``policy`` (the autocast op
reference of the installed torch, against ampgraph's tables).
"""

from __future__ import annotations

import click

from ampgraph.cli.console import write_output
from ampgraph.cli.options import format_option
from ampgraph.errors import AmpgraphError


@click.command()
def models() -> None:
    """List the bundled models: name, class, layers, parameters, and the model each is shaped
    like. Build any of them by name: no download, no weights (parameters are counted on meta).

    Any other model: --config PATH/config.json, --model-dir DIR (a local Hugging Face folder) or
    --module pkg.mod:factory (any nn.Module).
    """
    from ampgraph.model.build import DEFAULT_MODEL, catalogue

    write_output("models", "text", catalogue(), default=DEFAULT_MODEL)


@click.command(name="policy")
@click.option(
    "--device", "devices", multiple=True, metavar="TYPE",
    help="Device type to list (repeatable): cuda, cpu, xpu, mps, ... Default: every device type "
    "with an autocast dispatch key in this torch.",
)  # fmt: skip
@click.option(
    "--since", metavar="VERSION",
    help="Instead, list what changed in the autocast lists after this torch release (2.13).",
)  # fmt: skip
@format_option(
    "policy", "Plain text, a Markdown page, or JSON (schema ampgraph.policy)."
)
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
            changes, complete = reference.table_changes(since)
        except AmpgraphError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
        write_output("policy-changes", fmt, changes, since=since, complete=complete)
        return
    from ampgraph.policy import autocast_device_types

    available = autocast_device_types()
    for device in devices:
        if device not in available:
            raise click.BadParameter(
                f"{device!r} has no autocast dispatch key in this torch: choose from "
                f"{', '.join(available)}", param_hint="--device",
            )  # fmt: skip
    wanted = list(dict.fromkeys(devices)) or None
    libraries = (*reference.KNOWN_LIBRARIES, *imports)
    if imports:
        # A library named on the command line is code of its own, as a model is: imported in a
        # process group ampgraph can kill, its prints, sys.exit and threads kept from the output.
        from ampgraph.model.usercode import DEFAULT_TIMEOUT
        from ampgraph.pipeline.workers import isolated

        ref = isolated(
            lambda: _imported_reference(wanted, libraries), name="policy", timeout=DEFAULT_TIMEOUT
        )
    else:
        ref = reference.op_reference(wanted, libraries=libraries)
    write_output("policy", fmt, ref)
    if ref.differences:
        raise click.ClickException(
            f"{ref.differences} difference{'s' if ref.differences != 1 else ''} between "
            "ampgraph's tables and this torch's dispatcher"
        )


def _imported_reference(devices: list[str] | None, libraries: tuple[str, ...]) -> object:
    """The op reference, importing ``libraries`` as the model's code is run
    (:func:`ampgraph.model.usercode.model_code`): ``sys.exit`` or ``os._exit`` on import is one
    error line."""
    from ampgraph.docs import reference
    from ampgraph.model.usercode import ModelExited, model_code

    try:
        with model_code():
            return reference.op_reference(devices, libraries=libraries)
    except ModelExited as exc:  # said for a model: say it for the library
        what = str(exc).split(", which would", 1)[0].replace("the model's code", "its code")
        raise AmpgraphError(
            f"importing {', '.join(n for n in libraries if n not in reference.KNOWN_LIBRARIES)}: "
            f"{what}, which would end ampgraph without a result"
        ) from None
