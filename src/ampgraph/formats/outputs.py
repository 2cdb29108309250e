"""Each command's whole output in one format, built from the format modules' pieces: the writers
:mod:`ampgraph.formats.registry` names where a command prints more than one piece (a header per
setting, a line after the table, the verify record).

Each writer returns the text as printed, its line ends included.

>>> from ampgraph.report.records import Report
>>> r = Report("m", {"name": "fp32"}, {}, {}, [], [])
>>> check_text([r, r])
'm fp32: not checked\\nm fp32: not checked\\n'
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampgraph.formats.markdown import audit_markdown as _audit_markdown
from ampgraph.formats.markdown import check_markdown as _check_markdown
from ampgraph.formats.markdown import diff_markdown, markdown_table, markdown_train
from ampgraph.formats.text import audit_text as _audit_text
from ampgraph.formats.text import (
    backward_check_lines,
    backward_lines,
    check_summary,
    disagreement_lines,
    grad_mode_words,
)
from ampgraph.formats.json import audit_json as _audit_json
from ampgraph.formats.json import check_record
from ampgraph.formats.sarif import audit_sarif as _audit_sarif
from ampgraph.formats.sarif import unplaced_warning
from ampgraph.errors import AmpgraphError
from ampgraph.report.escape import terminal
from ampgraph.report.printed import hook_lines
from ampgraph.report.records import Report
from ampgraph.report.writing import atomic_write
from ampgraph.review.audit import Finding
from ampgraph.settings import Setting

if TYPE_CHECKING:  # annotations only: the verify and review packages' results
    from ampgraph.review.baseline import Baseline
    from ampgraph.review.diff import ReportDiff
    from ampgraph.verify.results import Verification


def nothing(result: object, **options: object) -> str:
    """No output: a format that writes its result whole at the end, not piece by piece."""
    return ""


def _lines(lines: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


# -- table ----------------------------------------------------------------------------------------


def table_text(
    reports: Sequence[Report], *, classes: Sequence[str] | None = None, pass_: str = "forward"
) -> str:
    """``ampgraph table``: the seed's hook lines (the backward's after them, per ``pass_``), under
    a ``# model setting`` header per report where there are several."""
    out = []
    for i, report in enumerate(reports):
        if len(reports) > 1:
            mode = grad_mode_words(report)  # the grad mode traced in, where the report says it
            out.append(terminal(f"{'' if i == 0 else chr(10)}# {report.model} "
                                f"{report.setting['name']}: "
                                f"{Setting.from_dict(report.setting).title}"
                                f"{'; ' + mode if mode else ''}"))  # fmt: skip
        lines = [] if pass_ == "backward" else hook_lines(report, classes)
        if pass_ != "forward":
            lines += backward_lines(report, classes)
        out += [terminal(line) for line in lines]  # an escape sequence in a name shown, not run
    return _lines(out)


def table_json(
    reports: Sequence[Report], *, classes: Sequence[str] | None = None, pass_: str = "forward"
) -> str:
    """``ampgraph table --format json``: the whole report (a list of them for several)."""
    payload: Any = reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports]
    return json.dumps(payload, indent=1)


def table_markdown(
    reports: Sequence[Report], *, classes: Sequence[str] | None = None, pass_: str = "forward"
) -> str:
    """``ampgraph table --format markdown``: a table per report, the training step's after it."""
    out = []
    for i, report in enumerate(reports):
        parts = [] if pass_ == "backward" else [markdown_table(report, classes)]
        if pass_ != "forward":
            parts.append(markdown_train(report))
        out.append(("\n" if i else "") + "\n\n".join(parts))
    return _lines(out)


# -- check ----------------------------------------------------------------------------------------


def check_text(reports: Sequence[Report], *, pass_: str = "forward") -> str:
    """``ampgraph check``: a summary line per report and a line per disagreement; the backward's
    check after them where the report has one."""
    out: list[str] = []
    for report in reports:
        if pass_ != "backward":
            out += [check_summary(report), *disagreement_lines(report)]
        if report.backward is not None:
            out += backward_check_lines(report)
    return _lines(out)


def check_json(reports: Sequence[Report], *, pass_: str = "forward") -> str:
    """``ampgraph check --format json``: each report's check and disagreements."""
    return json.dumps([check_record(r) for r in reports], indent=1)


def check_markdown(reports: Sequence[Report], *, pass_: str = "forward") -> str:
    """``ampgraph check --format markdown``: one table for a pull request, a row per report."""
    return _check_markdown(reports)


# -- verify ---------------------------------------------------------------------------------------


def verify_setting_text(results: Sequence[Verification]) -> str:
    """``ampgraph verify``'s lines of the results of one setting, printed as they come."""
    from ampgraph.formats.verify import result_lines

    return _lines([line for result in results for line in result_lines(result)])


def verify_text(results: Sequence[Verification], *, record: Path | None = None) -> str:
    """What ``ampgraph verify`` prints after the settings' lines: where the record went."""
    return "" if record is None else f"record: {record}\n"


def verify_json(results: Sequence[Verification], *, record: Path | None = None) -> str:
    """``ampgraph verify --format json``: the record ``--record`` writes."""
    from ampgraph.verify.results import verify_record

    return json.dumps(verify_record(results), indent=1)  # type: ignore[arg-type]


def write_verify_record(
    results: Sequence[Verification], path: str | os.PathLike[str], **extra: Any
) -> Path:
    """Write the file ``ampgraph verify --record`` writes to ``path``:
    :func:`~ampgraph.verify.results.verify_record` as JSON, ``extra`` fields (a command line,
    timings) at its top level, with :func:`~ampgraph.report.writing.atomic_write` (a reader never
    sees half; a device such as ``/dev/null`` is written through, never replaced)."""
    from ampgraph.verify.results import verify_record

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(verify_record(results, **extra), indent=1) + "\n"  # type: ignore[arg-type]
    try:
        atomic_write(target, text.encode())
    except OSError as exc:
        raise AmpgraphError(
            f"cannot write the record to {target}: {exc.strerror or exc}; choose another path"
        ) from None
    return target


# -- audit ----------------------------------------------------------------------------------------


def audit_text(
    reports: Sequence[Report], *, findings: Sequence[Sequence[Finding]], ranges: bool = False
) -> str:
    """``ampgraph audit``: each report's ``findings`` and totals, a blank line between reports;
    ``ranges``: some come from a ranges run (``--ranges``)."""
    return "\n\n".join(_audit_text(r, f) for r, f in zip(reports, findings, strict=True))


def audit_markdown(
    reports: Sequence[Report], *, findings: Sequence[Sequence[Finding]], ranges: bool = False
) -> str:
    """``ampgraph audit --format markdown``: a table per report."""
    return "\n\n".join(_audit_markdown(r, f) for r, f in zip(reports, findings, strict=True))


def audit_json(
    reports: Sequence[Report], *, findings: Sequence[Sequence[Finding]], ranges: bool = False
) -> str:
    """``ampgraph audit --format json``: :func:`ampgraph.formats.json.audit_json`."""
    return _audit_json(reports, findings if ranges else None)


def audit_sarif(
    reports: Sequence[Report], *, findings: Sequence[Sequence[Finding]], ranges: bool = False
) -> str:
    """``ampgraph audit --format sarif``: :func:`ampgraph.formats.sarif.audit_sarif`, whose rules
    name the ranges run's kinds only where ``ranges`` added findings of them."""
    return _audit_sarif(reports, findings=findings if ranges else None)


def audit_sarif_warning(
    reports: Sequence[Report], *, findings: Sequence[Sequence[Finding]], ranges: bool = False
) -> str | None:
    """The line beside the SARIF where a result points into no file
    (:func:`ampgraph.formats.sarif.unplaced_warning`)."""
    return unplaced_warning(reports, findings)


# -- baseline check -------------------------------------------------------------------------------


def baseline_text(
    result: ReportDiff, *, file: str, baseline: Baseline, report: Report, update: bool = False
) -> str:
    """``ampgraph baseline check``: where ``report``'s flow is the ``baseline``'s (read from
    ``file``), one line that says so; else the diff."""
    from ampgraph.formats.diff_text import diff_text

    if not result.equal:
        return terminal(diff_text(result)) + "\n"
    stand_in = report.capture.get("stand_in")
    return (f"{file}: the dtype flow of {baseline.title} matches ({len(report.nodes)} graph "
            f"nodes){f'; {stand_in}' if stand_in else ''}\n")  # fmt: skip


def baseline_markdown(
    result: ReportDiff, *, file: str, baseline: Baseline, report: Report, update: bool = False
) -> str:
    """``ampgraph baseline check --format markdown``: the diff as a pull-request comment (one that
    says "no changes" too), with how to accept the new flow unless ``update`` does."""
    if result.equal:
        return diff_markdown(result) + "\n"
    accept = "" if update else (f"\nAccept the new flow with `ampgraph baseline check {file} "
                                "--update` and commit the file.\n")  # fmt: skip
    return terminal(diff_markdown(result)) + "\n" + accept


def baseline_json(
    result: ReportDiff, *, file: str, baseline: Baseline, report: Report, update: bool = False
) -> str:
    """``ampgraph baseline check --format json``: the diff's JSON (schema ``ampgraph.diff``)."""
    from ampgraph.formats.json import diff_json

    return diff_json(result) + "\n"


__all__ = [
    "audit_json",
    "audit_markdown",
    "audit_sarif",
    "audit_sarif_warning",
    "audit_text",
    "baseline_json",
    "baseline_markdown",
    "baseline_text",
    "check_json",
    "check_markdown",
    "check_text",
    "nothing",
    "table_json",
    "table_markdown",
    "table_text",
    "verify_json",
    "verify_setting_text",
    "verify_text",
    "write_verify_record",
]
