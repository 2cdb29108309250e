"""A forward that raises in its own code stops there, also before calls that do not depend on
the op that raised (found by the zoo's dbrx, issue 42).

transformers' DBRX experts loop over the experts and ``index_add_`` each one's output into an
fp32 buffer: under CPU autocast the expert's Linear gives bf16, and the real ``index_add_``
raises at the first expert. ampgraph predicted that error, and then listed the next expert's
Linear, which does not read the buffer (so nothing marked it skipped), as a call the real run
makes: ``verify --device cpu`` found "no such call in the eager run". And where the real run left
the captured path before that node (its bf16 router picked another set of experts than the
capture's fp32 draft run), verify called the forward "not deterministic".
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.errors import NotDeterministicError
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.eager import refuse_changing_forward
from ampgraph.verify.execution import Observed
from ampgraph.verify.hooks import HookCall, eager_hook_lines

MIXED = "index_add_(): self (Float) and source (BFloat16) must have the same scalar type"


class ExpertLoop(nn.Module):
    """DBRX's experts' shape: each expert's tokens through its own Linear, added into an fp32
    buffer made like the input."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            tokens = torch.arange(i, x.shape[0], 2, device=x.device)
            out.index_add_(0, tokens, expert(x[tokens]))
        return out


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("expert-loop", ExpertLoop().eval(), (torch.randn(4, 8),))


CPU = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bfloat16")


def test_the_real_cpu_run_raises_at_the_first_expert() -> None:
    with torch.autocast("cpu", torch.bfloat16), pytest.raises(RuntimeError, match="index_add_"):
        _model().module(*_model().args)


def test_the_lines_stop_at_the_raise_as_the_real_run_does() -> None:
    report = analyze(_model(), CPU)
    lines = hook_lines(report)
    assert lines == [
        "[experts.0] in=torch.float32 -> out=torch.bfloat16",
        f"[(top level)] in=None -> error: {MIXED}",
    ]
    assert lines == eager_hook_lines(_model(), CPU)


def test_verify_on_the_cpu_agrees() -> None:
    result = verify(_model(), CPU, device="cpu")
    assert result.ok, result.disagreements
    # experts.0, the raise at the top level, and experts.1 not run on either side
    modules = result.agreement()["modules"]
    assert (modules.agree, modules.total) == (3, 3)


def test_the_cuda_policy_stops_at_the_same_raise() -> None:
    """CUDA's policy gives the same bf16 Linear, and the real ``index_add_`` refuses the mix
    there too: the check's hook lines end at the first expert as well."""
    report = analyze(_model(), Setting.parse("amp-fp32", amp_dtype="bfloat16"))
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(
        _model(), Setting.parse("amp-fp32", amp_dtype="bfloat16"))  # fmt: skip


def test_a_raise_past_the_path_the_graph_left_is_no_changing_forward() -> None:
    """The eager run raised in the forward's own code where the graph's real run left the
    captured path before the op (nodes not comparable): the eager run took the other path."""
    raised = [HookCall("(top level)", "", None, error=MIXED)]
    left = {"le_1": Observed(not_comparable="the real run leaves the captured path at ...")}
    refuse_changing_forward(raised, left)
    with pytest.raises(NotDeterministicError):  # on the graph's path and no error there: it is
        refuse_changing_forward(raised, {"le_1": Observed(outputs=["bool"])})
