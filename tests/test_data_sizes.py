"""Issue 42: sizes a real run computes from values, followed as a real run follows them.

Two ways a size comes from data. A vision embedding computes its attention windows from its
input grid (qwen2_5_vl: ``cu_seqlens`` from ``repeat_interleave`` by the grid's counts, then
``torch.split`` by ``lengths.tolist()``): the grid is an integer input, so the capture follows it
on its real values and every size past it is a number, as in a real run (before, ``tolist()`` of a
size that depends on the values stopped the trace). A speech model expands its frames by
durations it predicts from float activations (FastSpeech2's length regulator): no capture can know
them, the data path's run on real values finds them, and each replay of the graph (annotation,
dispatcher check) now gives the size it makes at a node the value the capture had there (before,
a norm's guard ``Eq(Max(1, u1), 1)`` on it was not analysed, nor anything after it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines


class GridWindows(nn.Module):
    """Attention over windows whose lengths come from the grid, as qwen2_5_vl's vision blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, patches: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        seqlens = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])
        cu = F.pad(seqlens.cumsum(0), (1, 0))
        lengths = (cu[1:] - cu[:-1]).tolist()
        q, k, v = self.qkv(patches).chunk(3, dim=-1)
        outs = [
            F.scaled_dot_product_attention(a[None], b[None], c[None])[0]
            for a, b, c in zip(q.split(lengths), k.split(lengths), v.split(lengths))
        ]
        return self.out(torch.cat(outs))


class Durations(nn.Module):
    """Frames expanded by durations predicted from the activations, as FastSpeech2's."""

    def __init__(self) -> None:
        super().__init__()
        self.pred, self.out = nn.Linear(8, 1), nn.Linear(8, 8)
        self.conv, self.norm = nn.Conv1d(8, 8, 3, padding=1), nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = torch.clamp(torch.round(self.pred(x).squeeze(-1).float().exp()), min=1).long()
        if d.sum() == 0:  # FastSpeech2's length regulator branches on the durations
            d = d + 1
        h = torch.repeat_interleave(x[0], d[0], dim=0).unsqueeze(0).transpose(1, 2)
        return self.out(self.norm(self.conv(h)).transpose(1, 2))


def _grid() -> ModelInputs:
    torch.manual_seed(0)
    grid = torch.tensor([[1, 2, 2], [2, 1, 3]])  # 4 + 3 + 3 patches in three windows
    return ModelInputs("grid-windows", GridWindows().eval(), (torch.randn(10, 8), grid))


def _durations() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("durations", Durations().eval(), (torch.randn(1, 5, 8),))


def _agrees(model: ModelInputs) -> list[str]:
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    assert not report.check.get("not_analysed")
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    result = verify(model, Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements
    return lines


def test_window_lengths_from_the_grid_are_followed() -> None:
    lines = _agrees(_grid())
    assert lines == ["[qkv] in=torch.float32 -> out=torch.bfloat16",
                     "[out] in=torch.bfloat16 -> out=torch.bfloat16"]  # fmt: skip


def test_predicted_durations_are_sizes_every_replay_knows() -> None:
    lines = _agrees(_durations())
    assert lines == [
        "[pred] in=torch.float32 -> out=torch.bfloat16",
        "[conv] in=torch.float32 -> out=torch.bfloat16",
        "[norm] in=torch.bfloat16 -> out=torch.bfloat16",
        "[out] in=torch.bfloat16 -> out=torch.bfloat16",
    ]


def test_sizes_given_their_values_leave_torchs_warnings_out_of_the_output(capfd) -> None:  # type: ignore[no-untyped-def]
    """torch logs ``propagate_real_tensors evaluate_expr(u2) -> 5`` for each guard decided on a
    size the analysis gave its value: its internals, not the model's. None reaches stderr, and
    the logger is left as it was found."""
    import logging

    log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    filters = list(log.filters)
    analyze(ModelInputs("durations-quiet", Durations().eval(), (torch.randn(1, 5, 8),)),
            Setting.parse("amp-fp32"))  # fmt: skip
    assert "propagate_real_tensors" not in capfd.readouterr().err
    assert log.filters == filters
