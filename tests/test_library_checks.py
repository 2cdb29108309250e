"""torchvision's roi ops refuse an ``input`` and ``rois`` of different dtypes in their kernels'
own words, on each device (``ampgraph.annotate.library_checks``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.settings import Setting

pytest.importorskip("torchvision.ops")

ROI_OPS = ["roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool"]
ROIS = [[0, 0.0, 0.0, 4.0, 4.0], [0, 1.0, 1.0, 6.0, 6.0]]


class Roi(nn.Module):
    """A convolution (16 bits in ``half``), then the roi op with fp32 boxes, as a detector's
    head receives them from its box coder."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.op = op

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.to(self.conv.weight.dtype))
        extra = {"roi_align": (-1, False), "ps_roi_align": (-1,)}.get(self.op, ())
        out = getattr(torch.ops.torchvision, self.op)(h, rois, 1.0, 2, 2, *extra)
        return out[0] if isinstance(out, tuple) else out


def _predicted_error(op: str, device_type: str) -> str | None:
    x, rois = torch.randn(1, 3, 8, 8), torch.tensor(ROIS)
    report = analyze(Roi(op), Setting.parse("half", device_type=device_type), args=(x, rois))
    node = next(r for r in report.nodes if r.op.startswith(f"torchvision.{op}"))
    return node.error


@pytest.mark.parametrize("op", ROI_OPS)
def test_cpu_prediction_is_the_real_kernels_message(op: str) -> None:
    """The real CPU kernel, run here on the model's own bf16 activation and fp32 boxes, and
    ampgraph's prediction say the same words (roi_align's names its source file: a
    ``TORCH_CHECK``; the ps_ ops' are ``checkAllSameType``'s)."""
    module = Roi(op).to(torch.bfloat16)
    with pytest.raises(RuntimeError) as real:
        module(torch.randn(1, 3, 8, 8), torch.tensor(ROIS))
    assert _predicted_error(op, "cpu") == str(real.value).split("\n")[0]


def test_cuda_prediction_is_what_the_h100_raised() -> None:
    """``docs/verification/cuda-survey.json``, case roi-align in ``half`` with bf16, observed on
    an H100 (torch 2.11.0+cu130, torchvision 0.26)."""
    assert _predicted_error("roi_align", "cuda") == (
        "Expected tensor for argument #1 'input' to have the same type as tensor for argument "
        "#2 'rois'; but type CUDABFloat16Type does not equal torch.cuda.FloatTensor (while "
        "checking arguments for roi_align_forward_kernel)"
    )


@pytest.mark.parametrize("op", ROI_OPS[1:])
def test_cuda_prediction_names_each_kernel(op: str) -> None:
    """The CUDA kernels of the other three make the same ``checkAllSameType`` call, each with
    its own name (``torchvision/csrc/ops/cuda/*_kernel.cu``)."""
    error = _predicted_error(op, "cuda")
    assert error is not None and error.endswith(f"(while checking arguments for {op}_forward_kernel)")


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_autocast_casts_the_boxes_first_so_nothing_is_refused(device_type: str) -> None:
    """Under autocast the library's wrapper runs the kernel in fp32 (both inputs cast): the
    check never fires, and the output comes back in the input's dtype."""
    x, rois = torch.randn(1, 3, 8, 8), torch.tensor(ROIS)
    setting = Setting.parse("amp-half", device_type=device_type)
    report = analyze(Roi("roi_align"), setting, args=(x, rois))
    node = next(r for r in report.nodes if r.op.startswith("torchvision.roi_align"))
    assert node.error is None
