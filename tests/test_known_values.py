"""Issue 42: shapes a real run computes from values a model keeps in integer buffers.

EnCodec's convolutions keep ``kernel_size`` and ``stride`` as 0-d int64 buffers and pad their
input by amounts computed from them. The capture made every buffer a fake tensor without values,
so each amount was an unknown (``Could not guard on data-dependent expression Eq(u0, 1)``), and
the data path's run on made-up values (integer buffers as zeros) met a zero-length convolution
input that no real run has: the whole model was lost. Such buffers are now followed on their own
values (:mod:`ampgraph.capture.known_values`) by the capture, the eager oracle and verify.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = [
    (n, d) for n in ("fp32", "half", "amp-half", "amp-fp32") for d in ("bfloat16", "float16")
]


class PaddedConv(nn.Module):
    """EnCodec's padding, as its ``EncodecConv1d`` computes it from its buffers."""

    def __init__(self, channels: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, stride)
        self.register_buffer("stride", torch.tensor(stride), persistent=False)
        self.register_buffer("kernel_size", torch.tensor(kernel), persistent=False)
        self.register_buffer("padding_total", torch.tensor(kernel - stride), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = (length - self.kernel_size + self.padding_total) / self.stride + 1
        frames = torch.ceil(frames).to(torch.int64) - 1
        extra = frames * self.stride + self.kernel_size - self.padding_total - length
        right = self.padding_total // 2
        left = self.padding_total - right
        if max(left, right) >= length:  # a branch on the values, as EnCodec's reflect padding
            x = F.pad(x, (0, 1))
        return self.conv(F.pad(x, (left, right + extra)))


class Codec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = PaddedConv(2, 7, 3)
        self.mid = PaddedConv(2, 4, 2)
        self.out = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.down(x.to(self.down.conv.weight.dtype)))
        return self.out(h[..., :3])


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("codec", Codec().eval(), (torch.randn(1, 2, 17),))


@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_sizes_from_integer_buffers_are_followed(name: str, dtype: str) -> None:
    setting = Setting.parse(name, amp_dtype=dtype)
    model = _model()
    report = analyze(model, setting)
    assert report.capture["method"] == "make-fx"  # traced in its setting, no data path
    assert not report.capture.get("unbacked_values")
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    # The user's buffers are as they were.
    assert model.module.down.kernel_size.item() == 7 and not model.module.down.stride.is_meta


@pytest.mark.parametrize("name", ["amp-fp32", "half"])
def test_the_real_cpu_run_agrees(name: str) -> None:
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_encodec_from_a_tiny_config() -> None:
    """The transformers model that does it: every hook line as the eager run's, and the real
    CPU run agrees (before: 'input (W: 64) is too small', no graph at all)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.EncodecConfig(
        hidden_size=8, num_filters=4, num_residual_layers=1, upsampling_ratios=[2, 2],
        codebook_size=16, codebook_dim=8, num_lstm_layers=1, target_bandwidths=[1.5],
        sampling_rate=100, audio_channels=1,
    )  # fmt: skip
    torch.manual_seed(0)
    module = transformers.EncodecModel(config).eval()
    model = ModelInputs("encodec", module, (), {"input_values": torch.randn(1, 1, 64)})
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    assert len(lines) > 30 and lines == eager_hook_lines(model, setting)
    result = verify(model, Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


class TwoPads(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(self.fc(x), (2, 2), mode=self.mode)


def test_a_composite_op_is_remembered_with_its_arguments() -> None:
    """``aten.pad`` decomposes by its mode: "constant" has no autocast policy inside, "reflect"
    is ``reflection_pad1d``, fp32 in the CPU's autocast. What the annotation remembered of the
    first (no policy inside) was used for the second: a cast the real run makes went missing
    (EnCodec's reflect padding, after another model's constant one)."""
    torch.manual_seed(0)
    setting = Setting.parse("amp-fp32", device_type="cpu")
    for mode in ("constant", "reflect"):
        model = ModelInputs(f"pad-{mode}", TwoPads(mode).eval(), (torch.randn(2, 3, 6),))
        result = verify(model, setting)
        assert result.ok, result.disagreements
