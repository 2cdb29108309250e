"""A slice of scripts/families_matrix.py (docs/families.md) in the suite: one small model per
family nobody here tuned for (issue 25), in the four settings x both 16-bit dtypes, against the
dispatcher and the eager model's own forward hooks on fake tensors.

Expectations are the eager run's hook lines (:func:`ampgraph.verify.hooks.eager_hook_lines`) and
the dispatcher check, never ampgraph's own output. One setting per family runs in the quick suite;
the other seven are marked slow.
"""

from __future__ import annotations

import functools
from types import ModuleType

import pytest

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

from .conftest import ROOT, load_file

pytest.importorskip("transformers", reason="needs transformers")

#: family -> the script's model for it: T5 is called with labels and its cache on (T5 keeps the
#: cache given labels; BART and Marian turn it off), Whisper too, and its half setting raises.
SLICE = {
    "encoder": "electra",
    "encoder-decoder": "t5",
    "speech": "whisper",
    "MoE": "mixtral",
    "state-space": "mamba",
}
#: The setting each family runs in the quick suite: autocast over fp32 parameters, the recipe
#: Trainer(bf16=True) and Lightning's bf16-mixed mean.
QUICK = ("amp-fp32", "bf16")


def _matrix() -> ModuleType:
    return load_file(ROOT / "scripts" / "families_matrix.py")


@functools.cache
def _model(name: str) -> ModelInputs:
    return _matrix().build(name)


def _cases() -> list[object]:
    cases = []
    for family, name in SLICE.items():
        for amp in ("bf16", "fp16"):
            for setting in ("fp32", "half", "amp-half", "amp-fp32"):
                marks = [] if (setting, amp) == QUICK else [pytest.mark.slow]
                cases.append(
                    pytest.param(
                        name, setting, amp, marks=marks, id=f"{family}-{name}-{setting}-{amp}"
                    )
                )
    return cases


@pytest.mark.parametrize(("name", "setting_name", "amp"), _cases())
def test_family_agrees_with_the_dispatcher_and_the_eager_hooks(
    name: str, setting_name: str, amp: str
) -> None:
    model, setting = _model(name), Setting.parse(setting_name, amp_dtype=amp)
    report = analyze(model, setting)
    assert report.check is not None and report.check["compared"] > 0, report.check
    assert report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    assert lines  # the eager run printed at least one leaf call


@pytest.mark.slow
def test_bart_with_its_cache_on_in_half_fp16() -> None:
    """Mechanism 4 with the cache on: BART's fp16-only isfinite clamp is decided by a run in the
    setting's dtypes (torch.export's draft export), which must return the EncoderDecoderCache."""
    model, setting = _model("bart"), Setting.parse("half", amp_dtype="fp16")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    assert hook_lines(report) == eager_hook_lines(
        model, setting, report.capture.get("unbacked_values")
    )


def test_the_script_counts_a_differing_cell_and_names_its_first_line() -> None:
    """The page's figures: a cell whose hook lines differ is counted and shown, not agreed.

    Whisper's ``half`` fp16 raises in the eager run (fp32 features into a 16-bit convolution):
    the script's cell says where, as the eager run does; a cell with a differing line is counted.
    """
    matrix = _matrix()
    cell = matrix.compare(_model("whisper"), "half", "fp16")
    eager = eager_hook_lines(_model("whisper"), Setting.parse("half", amp_dtype="fp16"))
    assert cell.agrees and cell.raises == eager[-1] and "-> error: " in eager[-1]
    row = matrix.Row("whisper", "speech", cells={("fp16", "half"): cell})
    broken = matrix.Cell(hooks=3, hooks_agree=2, compared=5, first_difference="line 3: x")
    row.cells[("bf16", "half")] = broken
    page = matrix.markdown([row], 1.0, {"torch": "t", "transformers": "t"})
    assert "1 of 2 cells agree" in page and "`whisper` half bf16: line 3: x" in page
