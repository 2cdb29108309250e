"""verify's cast log: what counts as a cast at the dispatcher (``ampgraph.verify.cast_log``)."""

from __future__ import annotations

import torch
from torch import nn

from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.cast_log import CastLog


def test_a_copy_into_another_dtype_is_a_cast_of_its_source() -> None:
    """cuDNN RNNs' autocast kernel casts the weights by copying them into an fp16 buffer (an
    H100 showed those casts missing from the log when only ``_to_copy`` counted)."""
    x = torch.randn(4)
    buf = torch.empty(4, dtype=torch.float16)
    with CastLog() as log:
        buf.copy_(x)
        torch.empty(4).copy_(x)  # same dtype: no cast
    assert [(c.source is x, c.from_dtype, c.to_dtype) for c in log.casts] == [
        (True, torch.float32, torch.float16)
    ]


class CopyInto(nn.Module):
    """A forward that writes an fp32 activation into a bf16 buffer: the op's own conversion."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x).float()
        return torch.empty(h.shape, dtype=torch.bfloat16).copy_(h) * 2


def test_an_ops_own_copy_into_another_dtype_is_not_autocasts() -> None:
    """The same copy made with autocast off cancels it: verify still agrees everywhere."""
    for name in ("amp-half", "amp-fp32", "half"):
        model = ModelInputs("copy-into", CopyInto().eval(), (torch.randn(2, 8),))
        result = verify(model, Setting.parse(name, device_type="cpu"), device="cpu")
        assert result.ok, result.disagreement_lines()
