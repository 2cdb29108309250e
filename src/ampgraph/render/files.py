"""Running Graphviz's ``dot`` and writing diagram files.

Files are written atomically (a temporary file in the target folder, then :func:`os.replace`), so
a documentation build never picks up half a diagram, and an interrupted run leaves the previous
file in place. ``dot`` itself is only needed for SVG, PNG and PDF; DOT source is written as is.

This module is torch-free.

>>> import pathlib, tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> atomic_write(folder / "a.txt", b"hello")
>>> (folder / "a.txt").read_bytes()
b'hello'
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ampgraph.errors import RenderError
from ampgraph.pipeline.workers import default_workers
from ampgraph.render.dot import Diagram, diagram
from ampgraph.render.overview import overview_diagram
from ampgraph.render.style import DOT_TIMEOUT_S
from ampgraph.render.svg import accessible_bytes
from ampgraph.report.writing import atomic_write
from ampgraph.settings import Setting

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import Report

#: Formats ``dot`` renders, the one ampgraph writes itself, the interactive page
#: (:mod:`ampgraph.render.html`: one page for all the reports, settings switchable in it) and
#: Model Explorer's graph with its overlays (:mod:`ampgraph.render.explorer`).
FORMATS: Final = ("svg", "png", "pdf", "dot", "html", "explorer")
#: Formats written once for all the reports, not a file per report.
ONE_FOR_ALL: Final = frozenset({"html", "explorer"})
#: Formats that need the ``dot`` program.
LAYOUT_FORMATS: Final = frozenset({"svg", "png", "pdf"})
#: ``dot`` flags per format: PNG and PDF go through cairo for anti-aliased text.
DOT_FLAGS: Final[dict[str, tuple[str, ...]]] = {
    "svg": ("-Tsvg",),
    "png": ("-Tpng:cairo",),
    "pdf": ("-Tpdf",),
}
#: How many layouts run at once (``dot`` processes); None: one per core.
LAYOUT_WORKERS: int | None = None

MISSING_DOT: Final = (
    "Graphviz's dot was not found on PATH: install Graphviz (apt-get install graphviz, "
    "brew install graphviz, conda install graphviz) or use --format dot"
)


def find_dot() -> str:
    """The path of Graphviz's ``dot``, or :class:`RenderError` saying how to install it."""
    path = shutil.which("dot")
    if path is None:
        raise RenderError(MISSING_DOT)
    return path


def check_formats(formats: tuple[str, ...] | list[str]) -> None:
    """Fail early, before any analysis, on an unknown format or a missing ``dot``."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise RenderError(f"unknown format {unknown[0]!r}: use one of {', '.join(FORMATS)}")
    if LAYOUT_FORMATS & set(formats):
        find_dot()


def run_dot(source: str, fmt: str = "svg") -> bytes:
    """Lay ``source`` out with ``dot`` and return the rendered file's bytes.

    >>> run_dot("digraph { a -> b }", "svg")[:5]
    b'<?xml'
    """
    if fmt not in DOT_FLAGS:
        raise RenderError(f"dot cannot render {fmt!r}: use one of {', '.join(DOT_FLAGS)}")
    dot = find_dot()
    try:
        proc = subprocess.run(
            [dot, *DOT_FLAGS[fmt]],
            input=source.encode("utf-8"),
            capture_output=True,
            timeout=DOT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderError(
            f"Graphviz's dot took over {DOT_TIMEOUT_S}s to lay the diagram out: "
            "use the module view or leave layers folded"
        ) from None
    except OSError as exc:
        raise RenderError(f"could not run Graphviz's dot ({dot}): {exc.strerror}") from None
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        detail = next(
            (ln for ln in lines if ln.lower().startswith("error")), lines[0] if lines else ""
        )
        raise RenderError(
            f"Graphviz's dot failed to render {fmt} (exit {proc.returncode}): {detail or 'no message'}"
        )
    if fmt == "pdf":
        return _fixed_pdf_dates(proc.stdout)
    return proc.stdout


_PDF_DATE = re.compile(rb"(/(?:CreationDate|ModDate) \(D:)(\d+)")


def _fixed_pdf_dates(pdf: bytes) -> bytes:
    """Cairo stamps PDFs with the time of rendering; pin it so the same input gives the same bytes.

    The replacement has the same length, so the PDF's cross-reference offsets stay valid.
    """

    def pin(match: re.Match[bytes]) -> bytes:
        digits = match.group(2)
        return match.group(1) + b"19700101000000"[: len(digits)].ljust(len(digits), b"0")

    return _PDF_DATE.sub(pin, pdf)


def safe_name(text: str) -> str:
    """A file-name-safe version of a model spec: ``"facebook/opt-125m"`` -> ``"facebook-opt-125m"``.

    Letters of any script are kept (``"ünï cødé"`` -> ``"ünï-cødé"``), so names that differ
    only outside ASCII do not collide.

    >>> safe_name("configs/My Model.json"), safe_name("ünï cødé")
    ('configs-My-Model.json', 'ünï-cødé')
    """
    return re.sub(r"[^\w.-]+", "-", text).strip("-.") or "model"


def render_svg(
    report: Report,
    *,
    view: str = "modules",
    fold: bool = True,
    theme: str = "light",
    pass_: str = "forward",
) -> str:
    """The report's diagram as SVG text (needs Graphviz's ``dot``), with a title and description
    for screen readers (:func:`ampgraph.render.svg.accessible`).

    >>> import torch
    >>> from ampgraph import analyze
    >>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
    >>> render_svg(report).startswith("<?xml")
    True
    """
    figure = diagram(report, view=view, fold=fold, theme=theme, pass_=pass_)
    return lay_out(figure, "svg").decode("utf-8")


def lay_out(figure: Diagram, fmt: str) -> bytes:
    """A diagram in one format: DOT source as is, anything else laid out by ``dot``; SVG gets
    the diagram's title and description for screen readers."""
    if fmt == "dot":
        return figure.source.encode("utf-8")
    data = run_dot(figure.source, fmt)
    return accessible_bytes(data, figure.title, figure.description) if fmt == "svg" else data


def diagram_stem(
    report: Report, *, view: str, fold: bool, theme: str, pass_: str = "forward"
) -> str:
    """File name (without extension): model, setting slug, and what differs from the default.

    >>> from ampgraph.report.records import Report
    >>> r = Report("opt-125m", {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
    ...     "amp_dtype": "bfloat16", "param_dtype": "float32"}, {}, {}, [], [])
    >>> diagram_stem(r, view="modules", fold=True, theme="light")
    'opt-125m-cuda-bf16-amp-fp32'
    >>> diagram_stem(r, view="ops", fold=False, theme="dark")
    'opt-125m-cuda-bf16-amp-fp32-ops-unfolded-dark'
    """
    slug = Setting.from_dict(report.setting).slug
    # The backward's files sit beside the forward's: same stem, "-backward" added.
    suffix = "-backward" if pass_ == "backward" else ""
    return safe_name(f"{report.model}-{slug}") + suffix + _variant(view, fold, theme)


def _variant(view: str, fold: bool, theme: str) -> str:
    return (
        ("-ops" if view == "ops" else "")
        + ("" if fold else "-unfolded")
        + ("-dark" if theme == "dark" else "")
    )


def render_files(
    reports: Sequence[Report],
    out_dir: str | os.PathLike[str],
    *,
    formats: Sequence[str] = ("svg",),
    view: str = "modules",
    fold: bool = True,
    theme: str = "light",
    pass_: str = "forward",
) -> list[Path]:
    """Write each report's diagram in each format, plus an overview of several; return the paths.

    Files are named ``MODEL-SLUG[-ops][-unfolded][-dark].FORMAT`` from the model and
    :attr:`Setting.slug <ampgraph.settings.Setting.slug>`; with more than one report an overview
    (``MODEL-DEVICE-DTYPE-overview...``) shows them side by side, as a 2x2 matrix for the seed's
    four settings. Formats are ``svg``, ``png``, ``pdf`` (need Graphviz's ``dot``) and ``dot``.

    ``pass_`` is ``forward``, ``backward`` (the gradients from the loss to the parameters, with
    the saved-activation memory per layer; files ``MODEL-SLUG-backward...``; the reports must
    come from a backward or train analysis) or ``train`` (both diagrams of each report).

    >>> import tempfile
    >>> import torch
    >>> from ampgraph import analyze
    >>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
    >>> [path.name for path in render_files([report], tempfile.mkdtemp(), formats=("dot",))]
    ['Linear-cuda-bf16-amp-fp32.dot']
    """
    formats = tuple(dict.fromkeys(formats))
    check_formats(formats)
    if not reports:
        raise RenderError("nothing to render: no reports were given")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RenderError(f"cannot create the output folder {out}: {exc.strerror}") from None
    if pass_ not in ("forward", "backward", "train"):
        raise RenderError(f"unknown pass {pass_!r}: use forward, backward or train")
    passes = ("forward", "backward") if pass_ == "train" else (pass_,)
    stems = [
        diagram_stem(r, view=view, fold=fold, theme=theme, pass_=p) for p in passes for r in reports
    ]
    duplicates = sorted({s for s in stems if stems.count(s) > 1})
    if duplicates:
        raise RenderError(
            f"two reports would both be written to {duplicates[0]}: give each model and setting once"
        )
    drawn = [f for f in formats if f not in ONE_FOR_ALL]  # the page draws itself, in the browser
    jobs: list[tuple[str, Diagram]] = [
        (
            diagram_stem(r, view=view, fold=fold, theme=theme, pass_=p),
            diagram(r, view=view, fold=fold, theme=theme, pass_=p),
        )
        for r in (reports if drawn else ())
        for p in passes
    ]
    # The overview compares forward diagrams; a backward's settings are compared file by file.
    if drawn and len(reports) > 1 and "forward" in passes:
        jobs.append(
            (overview_stem(reports, view=view, fold=fold, theme=theme),
             overview_diagram(reports, view=view, fold=fold, theme=theme))
        )  # fmt: skip
    # Lay everything out first (the slow part), then write: an interrupted or failed layout
    # leaves every old file as it was, rather than a mix of new and old diagrams. Each layout is
    # a dot process of its own, so threads run one per core (the first failure is raised).
    targets = [(out / f"{stem}.{fmt}", figure, fmt) for stem, figure in jobs for fmt in drawn]
    workers = max(1, min(len(targets), LAYOUT_WORKERS or default_workers()))
    with ThreadPoolExecutor(workers) as pool:
        blobs = list(pool.map(lambda target: lay_out(target[1], target[2]), targets))
    laid_out = [(path, blob) for (path, _figure, _fmt), blob in zip(targets, blobs, strict=True)]
    if "html" in formats:
        laid_out.append(_page(reports, out, view=view, fold=fold, theme=theme))
    if "explorer" in formats:
        laid_out.extend(_explorer(reports, out, view=view, fold=fold, theme=theme))
    for path, data in laid_out:
        try:
            atomic_write(path, data)
        except OSError as exc:
            raise RenderError(f"cannot write {path}: {exc.strerror or exc}") from None
    return [path for path, _data in laid_out]


def _page(
    reports: Sequence[Report], out: Path, *, view: str, fold: bool, theme: str
) -> tuple[Path, bytes]:
    """The interactive page: one for all the reports (its settings are switchable), named as
    the report's SVG, or as the overview for several."""
    from ampgraph.render.html import html_page  # only when asked for: it reads page.js

    stem = (
        diagram_stem(reports[0], view=view, fold=fold, theme=theme)
        if len(reports) == 1
        else overview_stem(reports, view=view, fold=fold, theme=theme)
    )
    return out / f"{stem}.html", html_page(reports, theme=theme, fold=fold).encode("utf-8")


def _explorer(
    reports: Sequence[Report], out: Path, *, view: str, fold: bool, theme: str
) -> list[tuple[Path, bytes]]:
    """Model Explorer's graph of all the reports, ``STEM-explorer.json``, and an overlay per
    what it can colour by, ``STEM-explorer-OVERLAY.json`` (the gradient's for a training step)."""
    import json

    from ampgraph.render.explorer import explorer_graphs, node_data

    stem = (
        diagram_stem(reports[0], view=view, fold=fold, theme=theme)
        if len(reports) == 1
        else overview_stem(reports, view=view, fold=fold, theme=theme)
    )
    files = [(out / f"{stem}-explorer.json", explorer_graphs(reports))]
    overlays = ["dtype", "policy", "casts"]
    if any(r.backward is not None for r in reports):
        overlays.append("gradient")
    files += [(out / f"{stem}-explorer-{o}.json", node_data(reports, o)) for o in overlays]
    return [(path, json.dumps(data, indent=None).encode("utf-8")) for path, data in files]


def overview_stem(reports: Sequence[Report], *, view: str, fold: bool, theme: str) -> str:
    """File name of the overview: model, device and 16-bit dtype, ``overview``."""
    first = Setting.from_dict(reports[0].setting)
    models = list(dict.fromkeys(r.model for r in reports))
    model = models[0] if len(models) == 1 else "models"
    from ampgraph.settings import short_dtype

    return safe_name(
        f"{model}-{first.device_type}-{short_dtype(first.amp_dtype)}-overview"
    ) + _variant(view, fold, theme)
