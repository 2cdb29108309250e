"""Issue 42: a decision a real run makes from its inputs' values, taken the same way by the capture.

transformers drops an all-ones ``attention_mask`` before the attention (``masking_utils``:
``not (is_torchdynamo_exporting() or is_tracing(padding_mask)) and padding_mask.all()``), so in a
real run the scores stay bf16 under autocast; on fake tensors, which have no values, the mask
was always built (fp32) and promoted the scores: ampgraph predicted fp32 where the run has bf16,
and ``check`` agreed, since its eager oracle ran on fake tensors too (convbert, blip, flava, ibert
in the zoo). The capture and the oracle now follow the example inputs' integer and bool tensors on
their real values (:mod:`ampgraph.capture.known_values`), and transformers' "is this traced?"
gets a real run's answer where those values are known. With one padded token the mask is kept,
as a real run keeps it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.capture.known_values import real_run_answers
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

# transformers 5's masks; the hf-fx side environment (transformers 4.45) collects this file too.
eager_mask = pytest.importorskip("transformers.masking_utils").eager_mask


class DropsMask(nn.Module):
    """Attention scores plus a padding mask, the mask dropped when no token is padded: read with
    ``mask.all()`` directly, or through transformers' own mask builder (its tracing guard)."""

    def __init__(self, through_transformers: bool) -> None:
        super().__init__()
        self.through_transformers = through_transformers
        self.q, self.k, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(7, 7)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        if self.through_transformers:
            bias = eager_mask(
                batch_size=x.shape[0], q_length=7, kv_length=7, attention_mask=mask.bool(),
                dtype=torch.float32, allow_is_bidirectional_skip=True, device=x.device,
                mask_function=lambda b, h, q, kv: q >= 0,  # bidirectional
            )
            if bias is not None:
                scores = scores + bias[:, 0]
        elif not mask.bool().all():
            scores = scores + torch.where(mask.bool()[:, None, :], 0.0, -1e4)
        return self.out(scores)


def _model(through_transformers: bool, padded: bool) -> ModelInputs:
    torch.manual_seed(0)
    mask = torch.ones(2, 7, dtype=torch.int64)
    if padded:
        mask[1, 6] = 0
    module = DropsMask(through_transformers).eval()
    return ModelInputs("drops-mask", module, (torch.randn(2, 7, 8), mask))


@pytest.mark.parametrize("through_transformers", [False, True], ids=["mask.all", "transformers"])
@pytest.mark.parametrize("padded", [False, True], ids=["all-ones", "one-padded"])
def test_the_mask_is_dropped_as_a_real_run_drops_it(
    through_transformers: bool, padded: bool
) -> None:
    model = _model(through_transformers, padded)
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    # The mask (fp32) promotes the bf16 scores only where a token is padded.
    scores = "torch.float32" if padded else "torch.bfloat16"
    assert lines[-1] == f"[out] in={scores} -> out=torch.bfloat16"
    result = verify(model, Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


def test_nothing_is_left_in_transformers() -> None:
    from transformers import masking_utils
    from transformers.utils import import_utils

    before = import_utils.is_fake_tensor, masking_utils.is_torchdynamo_exporting
    from ampgraph.capture.known_values import KnownValues

    with real_run_answers(KnownValues({})):
        assert masking_utils.is_torchdynamo_exporting is not before[1]
    assert (import_utils.is_fake_tensor, masking_utils.is_torchdynamo_exporting) == before
    analyze(_model(True, False), Setting.parse("amp-fp32"))  # a whole analysis leaves none
    assert (import_utils.is_fake_tensor, masking_utils.is_torchdynamo_exporting) == before
