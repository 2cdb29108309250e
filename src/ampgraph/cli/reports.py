"""Where a command's reports come from: the model analysed with the command's options, or saved
report files (--report), never both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ampgraph.cli.console import progress, progress_done
from ampgraph.cli.options import (
    forced,
    models_given,
    resolve_settings,
    root_options,
    timeout_seconds,
    train_options,
)
from ampgraph.report.records import Report

if TYPE_CHECKING:
    from ampgraph.pipeline.request import AnalysisRequest

F = TypeVar("F", bound=Callable[..., Any])


def command_request(**fields: Any) -> AnalysisRequest:
    """The one place the command line makes an
    :class:`~ampgraph.pipeline.request.AnalysisRequest`: ``fields`` as the command gives them,
    and what every analysing command shares, from its parsed options: --force and --timeout
    (the model's --tracer is in its spec, :func:`~ampgraph.cli.options.model_argument`; the
    --recipe flags are settings, :func:`analysis_request`)."""
    from ampgraph.pipeline.request import AnalysisRequest

    return AnalysisRequest(force=forced(), timeout=timeout_seconds(), **fields)


def analysis_request(
    model_spec: str, settings: Sequence[str], device: str, amp_dtype: str, seq_len: int,
    *, check: bool = True, pass_: str = "forward", loss: str | None = None,
    backward_autocast: bool = False, sources: bool = False,
    recipes: Sequence[str] | None = None, **real_run: Any,
) -> AnalysisRequest:  # fmt: skip
    """The request of the command's options (:func:`command_request`): its settings (``settings``
    or the ``recipes``, None: the command's --recipe flags; :func:`~ampgraph.cli.options.
    resolve_settings`) and pass (a usage error where --loss or --backward-in-autocast come
    without a backward); ``real_run``: what a real run chooses (``seed``, ``weights_dir``:
    :class:`~ampgraph.capture.environment.RealRun`)."""
    train = train_options(pass_, loss, backward_autocast)
    resolved = tuple(resolve_settings(settings, device, amp_dtype, recipes))
    return command_request(model=model_spec, settings=resolved, seq_len=seq_len, check=check,
                           sources=sources, **train, **real_run)  # fmt: skip


#: The parameters of a command's analysis, which the command receives as one
#: :class:`AnalysisOptions` (:func:`gathers_analysis_options`).
ANALYSIS_PARAMETERS = (
    "model", "settings", "device", "amp_dtype", "seq_len", "no_check", "pass_", "loss",
    "backward_autocast",
)  # fmt: skip


@dataclass(frozen=True)
class AnalysisOptions:
    """What the command line says of the analysis a command runs, as it was typed; its
    :meth:`request` is the :class:`~ampgraph.pipeline.request.AnalysisRequest`."""

    model: str
    settings: tuple[str, ...]
    device: str
    amp_dtype: str
    seq_len: int
    no_check: bool = False
    pass_: str = "forward"
    loss: str | None = None
    backward_autocast: bool = False

    def request(self, *, sources: bool = False, seed: int = 0) -> AnalysisRequest:
        """The request these options make (:func:`analysis_request`); ``seed``: its real run's."""
        return analysis_request(
            self.model, self.settings, self.device, self.amp_dtype, self.seq_len,
            check=not self.no_check, pass_=self.pass_, loss=self.loss,
            backward_autocast=self.backward_autocast, sources=sources, seed=seed,
        )  # fmt: skip


def gathers_analysis_options(f: F) -> F:
    """The innermost decorator of a command that analyses a model: the command receives its
    :data:`ANALYSIS_PARAMETERS` as one :class:`AnalysisOptions` (its first argument), the
    rest as they are."""

    @functools.wraps(f)
    def command(**params: Any) -> Any:
        given = {name: params.pop(name) for name in ANALYSIS_PARAMETERS if name in params}
        return f(AnalysisOptions(**given), **params)

    return command  # type: ignore[return-value]


def analysed(
    request: AnalysisRequest, *, warn_unchecked: bool = True,
    meanwhile: Callable[[], None] | None = None,
) -> list[Report]:  # fmt: skip
    """:func:`ampgraph.pipeline.run.analyze_request` with the command's root options
    (--no-cache, --jobs) and progress line, and its warnings.

    ``meanwhile`` is the command's own work that can run beside the analysis.
    """
    from ampgraph.pipeline.run import analyze_request
    from ampgraph.formats.text import data_dependent_warning, dtype_branches_warning

    root = root_options()
    reports = analyze_request(
        request, use_cache=not root["no_cache"], workers=root["jobs"], progress=progress,
        meanwhile=meanwhile,
        process=True,  # a process group the command can kill: the model's code is confined
    )  # fmt: skip
    progress_done()  # the command's answer comes next
    for warning in (dtype_branches_warning(reports[0]), data_dependent_warning(reports[0])):
        if warning:
            click.echo(f"warning: {warning}", err=True)
    unavailable = (reports[0].capture or {}).get("check_unavailable")
    if request.check and warn_unchecked and unavailable:
        click.echo(f"warning: not checked: {unavailable}", err=True)
    return reports


#: The options of a model's analysis, by parameter name: a saved report was analysed already.
ANALYSIS_OPTIONS = {
    "device": "--device", "amp_dtype": "--amp-dtype", "seq_len": "--seq-len",
    "no_check": "--no-check", "force": "--force", "tracer": "--tracer", "timeout": "--timeout",
    "recipes": "--recipe",
}  # fmt: skip


def refuse_model_with_reports() -> None:
    """A usage error (exit 2) when the command was given saved reports (--report) and also a
    model, or an option of a model's analysis, which would be ignored: ``render gpt2 --report
    opt.json`` drew OPT without a word. The Sphinx directive refuses the pair too."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    models = models_given()
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
    from ampgraph.report.reading import read_text
    from ampgraph.report.records import Report, load_json

    reports: list[Report] = []
    for path in paths:
        # A FIFO, /dev/zero or a folder: one Error line, exit 1 (FileReadError), never a hang.
        text = read_text(path, "report")
        try:
            data = load_json(text)  # NaN and Infinity are refused
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
