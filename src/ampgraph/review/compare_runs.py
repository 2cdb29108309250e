"""What ``ampgraph diff`` computes: each side's report (a saved one, or an analysis), their
diff, and what a reader must know of it; or one model with a what-if change.

The command line parses the options into sides (a model spec or saved report, a setting, a
release's tables) and an :class:`~ampgraph.pipeline.request.AnalysisRequest` for what the
analyses share; :func:`compare_sides` and :func:`compare_change` do the rest. Torch is
imported only where a side is analysed.

>>> from ampgraph.pipeline.request import AnalysisRequest
>>> from ampgraph.settings import Setting
>>> sides = [Side("llama-tiny", Setting.parse(n)) for n in ("amp-fp32", "amp-half")]
>>> result = compare_sides(sides, AnalysisRequest(seq_len=4, check=False))
>>> result.equal
False
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ampgraph.errors import FileReadError
from ampgraph.pipeline.request import AnalysisRequest
from ampgraph.report.records import Report
from ampgraph.review.diff import ReportDiff, diff_reports
from ampgraph.settings import Setting

#: How a side's model is analysed: the request in, its reports out (the command line's adds
#: progress and warnings to :func:`ampgraph.pipeline.run.analyze_request`).
Analyse = Callable[[AnalysisRequest], list[Report]]


@dataclass(frozen=True)
class Side:
    """One side of a diff: a model spec analysed in ``setting`` with the policy tables of
    ``tables`` (None: the installed torch's), or a ``saved`` report as it is."""

    source: str
    setting: Setting | None = None
    tables: str | None = None
    saved: Report | None = None


def saved_report(source: str) -> Report | None:
    """The report a source names when it is a saved ``ampgraph.report`` or baseline, else None
    (a model spec; a config.json is one). One ``Error:`` line for a report that cannot be read.

    >>> saved_report("llama-tiny") is None
    True
    """
    from ampgraph.report.reading import read_text
    from ampgraph.report.records import load_json
    from ampgraph.review.baseline import SCHEMA as BASELINE
    from ampgraph.review.baseline import read_baseline

    path = Path(source)
    if path.suffix != ".json" or not path.exists() or path.is_dir():
        return None  # a model spec (a folder is a model's)
    # A .json that is not a regular file (a FIFO, a folder): one line, exit 1, never a hang.
    text = read_text(path, "report")
    try:
        try:
            data, refused = load_json(text), None
        except ValueError as exc:  # NaN: refused in an ampgraph file, but a config is a model
            data, refused = json.loads(text), exc
    except (OSError, ValueError, RecursionError) as exc:
        reason = "it nests too deeply" if isinstance(exc, RecursionError) else exc
        raise FileReadError(f"{source}: cannot be read as JSON ({reason})") from None
    if isinstance(data, dict) and data.get("schema") == BASELINE:
        return read_baseline(text, source).report
    if isinstance(data, list):
        if len(data) != 1:
            raise FileReadError(f"{source} holds {len(data)} reports: diff one setting "
                                "('ampgraph table -s NAME --format json')")  # fmt: skip
        data = data[0]
    if not (isinstance(data, dict) and str(data.get("schema", "")).startswith("ampgraph.")):
        return None  # a Hugging Face config.json: a model to analyse
    if refused is not None:
        raise FileReadError(f"{source}: {refused}")
    try:
        return Report.from_dict(data)
    except ValueError as exc:
        raise FileReadError(f"{source}: {exc}") from None


def _analyse(request: AnalysisRequest) -> list[Report]:
    from ampgraph.pipeline.run import analyze_request

    return analyze_request(request)


def side_reports(
    sides: Sequence[Side], request: AnalysisRequest, analyse: Analyse = _analyse
) -> list[Report]:
    """Each side's report: its saved one, or its model analysed as ``request`` says (its
    sequence length, bound, ``force``) in the side's setting and tables. Two sides of one
    model with the same tables are one analysis, so the model is built once."""
    a, b = sides
    if a.saved is None and b.saved is None and a.source == b.source and a.tables == b.tables:
        assert a.setting is not None and b.setting is not None
        both = replace(request, model=a.source, settings=(a.setting, b.setting), tables=a.tables)
        return analyse(both)
    reports = []
    for side in sides:
        if side.saved is not None:
            reports.append(side.saved)
            continue
        assert side.setting is not None
        one = replace(request, model=side.source, settings=(side.setting,), tables=side.tables)
        reports.append(analyse(one)[0])
    return reports


def compare_sides(
    sides: Sequence[Side], request: AnalysisRequest, analyse: Analyse = _analyse
) -> ReportDiff:
    """The diff of A and B (:func:`side_reports`), with a note for each side that is a
    prediction for another torch release's tables."""
    a, b = side_reports(sides, request, analyse)
    result = diff_reports(a, b)
    for label, side in zip("AB", sides, strict=True):
        if side.tables and side.saved is None:
            import torch

            result.notes.append(
                f"{label} is a prediction for torch {side.tables}: annotated with its autocast "
                f"lists on a graph traced by this torch {torch.__version__}, and not checked "
                "against a dispatcher"
            )
    return result


def compare_change(
    request: AnalysisRequest, *, keep: Sequence[str] = (), moves: Sequence[str] = ()
) -> tuple[ReportDiff, Report]:
    """``diff --keep-fp32`` / ``--move-op``: the request's model in its one setting as it is (A)
    and with the change (B, :func:`ampgraph.review.whatif.preview`), their diff with the notes of
    what B's findings and check say, and B. The model's code runs in a process group that is
    killed after ``request.timeout``; never cached: the preview is the point, and a change is no
    model identity."""
    from ampgraph.errors import ArgumentError
    from ampgraph.model.usercode import model_code, overdue_message
    from ampgraph.pipeline.workers import isolated
    from ampgraph.review.whatif import checked_note, findings_note, preview

    if request.model is None or len(request.settings) != 1:
        raise ArgumentError("a what-if previews one model spec in one setting")
    spec, setting = request.model, request.settings[0]

    def both() -> tuple[Report, Report]:
        with model_code():  # the model's code is built and traced here
            return preview(spec, setting, keep=keep, moves=moves, seq_len=request.seq_len,
                           force=request.force)  # fmt: skip

    timeout = request.timeout
    a, b = isolated(
        both, name="analysis", timeout=timeout, overdue=overdue_message(timeout) if timeout else ""
    )
    result = diff_reports(a, b)
    result.notes += [n for n in (findings_note(a, b), checked_note(b, bool(moves))) if n]
    return result, b


__all__ = ["Analyse", "Side", "compare_change", "compare_sides", "saved_report", "side_reports"]
