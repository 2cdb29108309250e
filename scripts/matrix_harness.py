"""The harness the matrix scripts share: one cell, one agreement measure, one pool, one page frame.

``scripts/families_matrix.py``, ``scripts/families_further.py`` and ``scripts/vision_matrix.py``
each compare ampgraph's analysis of models nobody here tuned for with two oracles, in many
settings. They differ in which models they build and what their pages say about them; what a cell
is, how hook lines are counted as agreeing and how models are run side by side is here, once, so
the three pages measure the same thing:

* **the dispatcher**: ``ampgraph check``, node by node (the real CUDA autocast kernels on fake
  tensors): ``compared`` node checks, ``disagreements`` among them;
* **the eager model**: its own forward hooks on every leaf module, on fake tensors running the
  real autocast kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`), against
  ``ampgraph table``'s hook lines. Lines agree as :class:`difflib.SequenceMatcher` matches them
  (the longest common subsequence, so one missing line costs one line, not every line after it);
  ``hooks`` is the longer of the two lists. A setting that raises is a cell like any other: the
  line of the call that raises is compared too.

A cell *agrees* when it was checked, no node disagrees and every hook line agrees. Every matrix
runs the same settings: :data:`SETTINGS` (the seed's four) with each of :data:`AMP_DTYPES`.
"""

from __future__ import annotations

import difflib
import multiprocessing as mp
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampgraph.model.build import ModelInputs

#: The seed's four settings, in the order every matrix's columns follow.
SETTINGS = ("fp32", "half", "amp-half", "amp-fp32")
#: The 16-bit dtypes each setting autocasts to (and ``half`` casts to): a column group each.
AMP_DTYPES = ("bf16", "fp16")

#: What every page says its hook-line figures count (one measure for all of them).
AGREEMENT = (
    "*hook lines* compares `ampgraph table`'s lines with the eager model's own forward hooks on "
    "fake CUDA tensors running the real autocast kernels "
    "(`ampgraph.verify.hooks.eager_hook_lines`): agreeing lines / lines, summed, where lines "
    "agree as a longest common subsequence matches them (`difflib.SequenceMatcher`, "
    "`scripts/matrix_harness.py`) and *lines* is the longer of the two lists. A cell agrees when "
    "it was checked, no node disagrees with the dispatcher and every hook line agrees."
)


@dataclass
class Cell:
    """One model in one setting and dtype, against both oracles."""

    nodes: int = 0
    compared: int = 0
    disagreements: int = 0
    not_analysed: int = 0
    hooks: int = 0
    hooks_agree: int = 0
    #: The eager run's last line when it raised there (``[path] in=... -> error: ...``).
    raises: str | None = None
    failure: str | None = None
    first_difference: str | None = None

    @property
    def agrees(self) -> bool:
        """Checked, every node as the dispatcher says, every hook line as the eager run's."""
        return (
            self.failure is None
            and self.disagreements == 0
            and self.compared > 0
            and self.hooks_agree == self.hooks > 0
        )


@dataclass
class Verified:
    """One model in one setting verified against real execution on the CPU (``ampgraph verify
    --device cpu``): the three cross-checks' counts, and the first disagreement."""

    setting: str
    nodes: tuple[int, int] = (0, 0)
    modules: tuple[int, int] = (0, 0)
    casts: tuple[int, int] = (0, 0)
    disagreements: int = 0
    first: str | None = None
    #: Why it could not be verified at all (the capture or the real run could not be set up).
    failure: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Verified, with something compared and nothing disagreeing."""
        return self.failure is None and self.disagreements == 0 and self.nodes[1] > 0


@dataclass
class Row:
    """One model: its cells keyed by (16-bit dtype, setting name), and what the page says of it."""

    name: str
    family: str = ""
    library: str = ""
    params: str = "-"
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""
    #: Its real-execution verification on the CPU, keyed by setting name (``verify_matrix.py``).
    verified: dict[str, Verified] = field(default_factory=dict)

    def count(self, attr: str) -> int:
        """``attr`` summed over the cells (``compared``, ``hooks_agree``, ...)."""
        return sum(getattr(c, attr) for c in self.cells.values())

    @property
    def agreeing(self) -> int:
        """How many of the row's cells agree."""
        return sum(c.agrees for c in self.cells.values())


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as the one line a page shows: its message's first line, else its type.

    >>> one_line(ValueError("bad\\nmore")), one_line(KeyError())
    ('bad', 'KeyError')
    """
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:limit]


def agreement(ours: Sequence[str], eager: Sequence[str]) -> tuple[int, int, str | None]:
    """(agreeing lines, lines, the first difference) of two hook-line lists: the one measure.

    >>> agreement(["a", "b", "c"], ["a", "c"])
    (2, 3, 'line 2: ampgraph `b`, eager `c`')
    """
    matcher = difflib.SequenceMatcher(a=list(ours), b=list(eager), autojunk=False)
    agree = sum(block.size for block in matcher.get_matching_blocks())
    first = None
    if list(ours) != list(eager):
        i = next(i for i, (a, b) in enumerate(zip([*ours, ""], [*eager, ""])) if a != b)
        mine = ours[i] if i < len(ours) else "(no line)"
        theirs = eager[i] if i < len(eager) else "(no line)"
        first = f"line {i + 1}: ampgraph `{mine}`, eager `{theirs}`"
    return agree, max(len(ours), len(eager)), first


def compare(
    model: ModelInputs, setting_name: str, amp: str, eager_model: ModelInputs | None = None
) -> Cell:
    """One cell: ampgraph's analysis of ``model`` against the dispatcher and the eager hooks.

    ``eager_model`` is a fresh copy of the module for the eager run, for models whose forward
    changes them; the eager run takes the inputs the capture ran with, whatever ``eager_model``
    holds: a size a real run computes from their values (a padding mask's lengths) is the
    capture's only on the same values, and a fresh copy from a tester that draws random inputs
    has others (pe_audio_video's alignment then expanded 16 frames to the capture's 5).
    """
    import torch
    from torch.utils import _pytree as pytree

    from ampgraph import analyze
    from ampgraph.errors import AmpgraphError
    from ampgraph.model.build import ModelInputs
    from ampgraph.report.printed import hook_lines
    from ampgraph.settings import Setting
    from ampgraph.verify.hooks import eager_hook_lines

    setting = Setting.parse(setting_name, amp_dtype=amp)
    if eager_model is not None:
        # Copied before the capture, which may run a forward that changes its inputs in place.
        args, kwargs = pytree.tree_map_only(torch.Tensor, _copy, (model.args, model.kwargs))
        eager_model = ModelInputs(eager_model.name, eager_model.module, args, kwargs)
    cell = Cell()
    try:
        report = analyze(model, setting)
    except AmpgraphError as exc:
        cell.failure = one_line(exc)
        return cell
    check = report.check or {}
    cell.nodes = len(report.nodes)
    cell.compared = check.get("compared", 0)
    cell.disagreements = check.get("disagreements", 0)
    cell.not_analysed = check.get("not_analysed", 0)
    ours = hook_lines(report)
    # A model whose sizes depend on data is run eagerly along the path its capture took.
    unbacked = (report.capture or {}).get("unbacked_values")
    eager = eager_hook_lines(eager_model or model, setting, unbacked)
    if eager and "-> error: " in eager[-1]:
        cell.raises = eager[-1]
    cell.hooks_agree, cell.hooks, cell.first_difference = agreement(ours, eager)
    return cell


def _copy(t: Any) -> Any:
    """A tensor's copy, a leaf that requires grad where ``t`` does (deepcopy refuses a non-leaf)."""
    out = t.detach().clone()
    return out.requires_grad_() if t.requires_grad else out


def verify_cpu(model: ModelInputs, setting_name: str, amp: str = "bf16") -> Verified:
    """``model`` in ``setting_name`` verified on the CPU with ``amp`` CPU autocast: the library
    call behind ``ampgraph verify --device cpu`` (random weights from seed 0, real kernels).

    >>> import torch
    >>> from ampgraph.model.build import ModelInputs
    >>> lin = ModelInputs("linear", torch.nn.Linear(4, 4), (torch.randn(1, 4),))
    >>> v = verify_cpu(lin, "amp-fp32")
    >>> v.ok, v.casts
    (True, (3, 3))
    """
    import time

    from ampgraph.errors import AmpgraphError
    from ampgraph.settings import Setting
    from ampgraph.formats.verify import disagreement_lines
    from ampgraph.verify import verify

    start = time.perf_counter()
    setting = Setting.parse(setting_name, device_type="cpu", amp_dtype=amp)
    out = Verified(setting_name)
    try:
        result = verify(model, setting, device="cpu")
    except AmpgraphError as exc:
        out.failure = one_line(exc)
    else:
        counts = result.agreement()
        out.nodes, out.modules, out.casts = (
            (counts[k].agree, counts[k].total) for k in ("nodes", "modules", "casts")
        )
        out.disagreements = len(result.disagreements)
        lines = disagreement_lines(result)
        out.first = lines[0].strip() if lines else None
    out.seconds = time.perf_counter() - start
    return out


def run_all(
    names: Iterable[str], run_one: Callable[[str], Row], jobs: int, label: str
) -> list[Row]:
    """``run_one`` over ``names``, ``jobs`` forked processes at once, a progress line per model on
    stderr; a model whose run raises is a row with that one line as its note."""
    safely = _Safely(run_one, label)
    names = list(names)
    if jobs > 1:
        with mp.get_context("fork").Pool(jobs) as pool:
            return pool.map(safely, names, chunksize=1)
    return [safely(n) for n in names]


class _Safely:
    """``run_one`` with its failure caught and its progress said (a class, so a pool pickles it)."""

    def __init__(self, run_one: Callable[[str], Row], label: str) -> None:
        self.run_one, self.label = run_one, label

    def __call__(self, name: str) -> Row:
        try:
            row = self.run_one(name)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a line in the table
            row = Row(name, note=f"{type(exc).__name__}: {one_line(exc)}")
        done = (
            f"{sum(v.ok for v in row.verified.values())}/{len(row.verified)} settings verified"
            if row.verified
            else f"{row.agreeing}/{len(row.cells)} cells agree"
        )
        print(
            f"{self.label}: {name}: {done} "
            f"({row.seconds:.0f} s){' ' + row.note if row.note else ''}",
            file=sys.stderr,
            flush=True,
        )
        return row


def produced_by(script: str, versions: dict[str, str], seconds: float) -> str:
    """The page's "how it was made" sentence."""
    libs = ", ".join(f"{name} {version}" for name, version in versions.items())
    return (
        f"Produced by `{script}` with {libs}, Python {platform.python_version()}, on 2 CPU cores "
        f"and no GPU; total {seconds:.0f} s wall."
    )


def totals_line(rows: Sequence[Row]) -> str:
    """``N of M cells agree.`` over every row."""
    cells = sum(len(r.cells) for r in rows)
    return f"{sum(r.agreeing for r in rows)} of {cells} cells agree."


def cell_notes(rows: Sequence[Row]) -> list[str]:
    """A bullet per model that failed whole and per cell that differs, with its first difference."""
    notes = []
    for row in rows:
        if not row.cells and row.note:
            notes.append(f"* `{row.name}`: {row.note}")
        for (amp, setting), cell in row.cells.items():
            where = f"`{row.name}` {setting} {amp}"
            if cell.failure:
                notes.append(f"* {where}: {cell.failure}")
            elif cell.first_difference:
                notes.append(f"* {where}: {cell.first_difference}")
            elif cell.disagreements:
                notes.append(f"* {where}: {cell.disagreements} nodes disagree with the dispatcher")
    return notes


def all_agree(rows: Sequence[Row]) -> bool:
    """Every model ran and every cell agrees: the scripts' exit status 0."""
    return all(r.cells and r.agreeing == len(r.cells) for r in rows)


def escape_cell(text: str) -> str:
    """Text safe in a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


__all__ = [
    "AGREEMENT",
    "AMP_DTYPES",
    "SETTINGS",
    "Cell",
    "Row",
    "Verified",
    "agreement",
    "all_agree",
    "cell_notes",
    "compare",
    "escape_cell",
    "one_line",
    "produced_by",
    "run_all",
    "totals_line",
    "verify_cpu",
]
