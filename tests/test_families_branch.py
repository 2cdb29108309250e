"""Issue 25, mechanism 4: a branch on data that exists in one dtype only.

BART clamps ``if hidden_states.dtype == torch.float16 and not
torch.isfinite(hidden_states).all()``: the fp32 run never meets that guard, so the path the
graph takes there must come from a run in the setting's own dtypes. Every expectation is the
eager model's forward hooks on fake tensors (:func:`ampgraph.verify.hooks.eager_hook_lines`)
given the branch's value as a real CPU run in the setting decides it, never ampgraph's output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ampgraph.capture.data_path as trace_module  # the data path moved out of trace.py
from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

#: A guard on data of each kind a forward makes: a truth value (``.all()``, ``.any()``), an
#: integer and a float read with ``.item()``.
GUARDS: dict[str, Callable[[torch.Tensor], bool]] = {
    "all": lambda h: bool(torch.isfinite(h).all()),
    "any": lambda h: not bool((h.abs() > 60000).any()),
    "int": lambda h: (h.abs() > 60000).sum().item() == 0,
    "float": lambda h: h.abs().max().item() < 60000.0,
}


class HalfOnlyGuard(nn.Module):
    """Keeps fp16 only while it is finite, as BART's clamp decides: the guard is met in fp16 only,
    and the path it does not take feeds fp32 to a half ``fc2``, which raises."""

    def __init__(self, guard: str) -> None:
        super().__init__()
        self.guard = guard
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x.to(self.fc1.weight.dtype))
        if h.dtype == torch.float16 and GUARDS[self.guard](h):
            return self.fc2(h)
        return self.fc2(h.float())


def _real_decision(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether a real fp16 CPU run of ``module`` (its ``fc1``) passes its guard."""
    fc1 = nn.Linear(4, 4).half()
    fc1.load_state_dict(module.fc1.state_dict())
    return GUARDS[module.guard](fc1(x.half()))


@pytest.mark.parametrize("guard", sorted(GUARDS))
@pytest.mark.parametrize("name", ["half", "amp-half", "fp32"])
def test_a_guard_met_in_fp16_only_is_followed_as_a_run_in_fp16(guard: str, name: str) -> None:
    torch.manual_seed(0)
    module, x = HalfOnlyGuard(guard).eval(), torch.randn(2, 4)
    model = ModelInputs("guard", module, (x,))
    setting = Setting.parse(name, amp_dtype="float16")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    if name == "fp32":  # the guard is never met: nothing decided on data
        assert not report.capture.get("data_dependent")
        return
    # A real fp16 run keeps its finite fp16 values: fc2 is given them, and nothing raises
    # (the other path gives a half fc2 fp32 input in ``half``, and fp32 input in ``amp-half``).
    assert _real_decision(module, x)
    assert len(lines) == 2 and lines[1].startswith("[fc2] in=torch.float16 -> out="), lines
    assert not any("error" in line for line in lines), lines
    assert any(" decided True" in line for line in report.capture["data_dependent"]) == (
        guard in ("all", "int", "float")  # the report says how the branch was decided
    ), report.capture["data_dependent"]


def test_a_guard_no_run_in_the_setting_decides_is_said_not_analysed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the CPU cannot run the setting's dtypes, the report says the graph past the branch
    is the fp32 run's path, rather than presenting it as the setting's."""
    draft = trace_module._draft_export

    def neutral_only(model: ModelInputs, setting: Setting | None = None) -> Any:
        if setting is not None:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return draft(model)

    monkeypatch.setattr(trace_module, "_draft_export", neutral_only)
    model = ModelInputs("guard", HalfOnlyGuard("all").eval(), (torch.randn(2, 4),))
    report = analyze(model, Setting.parse("half", amp_dtype="float16"))
    notes = report.capture.get("data_dependent") or []
    assert any("no run in its dtypes decided it" in note for note in notes), notes


def test_bart_fp16_clamp_guard_follows_the_fp16_run() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BartConfig(
        vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64,
    )  # fmt: skip
    module = transformers.BartModel(config).eval()
    ids = torch.ones(1, 5, dtype=torch.long)
    model = ModelInputs("bart", module, (), {"input_ids": ids, "use_cache": False})
    setting = Setting.parse("half", amp_dtype="float16")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    assert not any("error" in line or "not analysed" in line for line in lines), lines
    # Every leaf call has its line, the decoder's too: as many as bf16 makes, where no guard is.
    in_bf16 = eager_hook_lines(model, Setting.parse("half", amp_dtype="bfloat16"))
    assert len(lines) == len(in_bf16) and not any("not analysed" in line for line in in_bf16)
    assert any("isfinite" in branch for branch in report.capture["data_dependent"])
