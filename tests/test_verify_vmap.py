"""A forward that builds its attention mask with ``torch.vmap`` is captured and verified like any
other (issue 42).

transformers builds masks by vmapping an index function over the batch, head, query and key
indices (``masking_utils._vmap_expansion_sdpa``), so each call sees 0-d batched index tensors. The
capture's dtype-read log once looked up such a tensor, before the trace tracked it, through the
error torch raises for an untracked tensor; the message formatted it, ``Tensor.__format__`` of a
0-d tensor calls ``item()``, and the trace recorded ``detach``/``item`` nodes on the batched tensor
lifted as a constant. verify then read that constant's value, a batched tensor of a vmap level
long gone: ``RuntimeError: Either your tensor may have escaped from inside a function being
vmapped`` (t5gemma2, unlimited_ocr and three Nemotron ASR types in the zoo). Here the same
mechanism in a few lines, without transformers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

from ampgraph.capture.trace import capture
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify import verify


class VmapMasked(nn.Module):
    """Scores masked by a causal, padded mask built as transformers builds it: one vmap per index
    (batch, query, key), the padding mask indexed by 0-d index tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, length = attention_mask.shape

        def allowed(b: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return (k <= q) & attention_mask[b, k].bool()

        expand = torch.vmap(allowed, in_dims=(None, None, 0))
        expand = torch.vmap(expand, in_dims=(None, 0, None))
        expand = torch.vmap(expand, in_dims=(0, None, None))
        with TransformGetItemToIndex():
            mask = expand(torch.arange(batch), torch.arange(length), torch.arange(length))
        h = self.fc(x)
        scores = h @ x.transpose(1, 2)
        return torch.where(mask, scores, torch.zeros_like(scores)).softmax(-1) @ h


def _model() -> ModelInputs:
    mask = torch.ones(2, 5, dtype=torch.int64)
    mask[1, 3:] = 0  # one padded sequence: the mask is built, not dropped
    return ModelInputs("vmap-masked", VmapMasked(), (torch.randn(2, 5, 8), mask))


@pytest.mark.parametrize("setting", ["amp-fp32", "half"])
def test_a_mask_built_with_vmap_verifies_on_the_cpu(setting: str) -> None:
    result = verify(_model(), Setting.parse(setting, device_type="cpu"))
    counts = result.agreement()
    assert result.ok and not result.disagreements
    assert counts["nodes"].agree == counts["nodes"].total > 10
    assert counts["modules"].agree == counts["modules"].total == 1
    # amp-fp32: the Linear's input, weight and bias, and the fp32 x of ``h @ x.T`` beside the
    # bf16 h; the mask's integer ops and the rest, already bf16, cast nothing. half: nothing.
    assert counts["casts"].agree == counts["casts"].total == (4 if setting == "amp-fp32" else 0)


def test_vmap_leaves_no_value_read_and_no_constant_in_the_graph() -> None:
    cap = capture(_model(), Setting.parse("amp-fp32", device_type="cpu"))
    targets = {n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.item.default not in targets
    assert "constant" not in {kind for kind, _ in cap.input_kinds.values()}
    # The vmaps themselves are in the graph, as export records them.
    assert any("_add_batch_dim" in str(t) for t in targets)
