"""Issue 25, mechanisms 1, 5 and 6: tensors a forward makes on the CUDA device, a dtype check only
the real EmbeddingBag kernels make, and cuDNN ops called directly, each on a module made for it.

Every expectation is the eager model's own forward hooks on fake tensors
(:func:`ampgraph.verify.hooks.eager_hook_lines`) or the real CPU kernel, never ampgraph's output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = [
    (n, d) for n in ("fp32", "half", "amp-half", "amp-fp32") for d in ("bfloat16", "float16")
]


class MakesCudaTensors(nn.Module):
    """Hugging Face's cache setup (``torch.tensor([], device=...)``) and factories on ``cuda``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        empty = torch.tensor([], device=x.device)
        made = [torch.zeros(2, 4, device="cuda"), torch.tensor([1.0, 2.0], device=x.device),
                torch.arange(4, device=x.device), torch.full((2,), 1.5, device=x.device)]  # fmt: skip
        y = self.fc(x) + torch.cat([empty, empty]).sum()
        return self.head(y + sum(m.to(y.dtype).sum() for m in made))


@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_tensors_made_on_cuda_while_tracing_are_fake(name: str, dtype: str) -> None:
    model = ModelInputs("makes", MakesCudaTensors().eval(), (torch.randn(2, 4),))
    setting = Setting.parse(name, amp_dtype=dtype)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    assert hook_lines(report) == eager_hook_lines(model, setting)


def _t5() -> ModelInputs:
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
        num_heads=2, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    module = transformers.T5ForConditionalGeneration(config).eval()
    ids, labels = torch.ones(1, 5, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)
    return ModelInputs("t5", module, (), {"input_ids": ids, "labels": labels, "use_cache": True})


@pytest.mark.parametrize("name", ["amp-fp32", "half"])
def test_t5_with_labels_and_the_cache_on(name: str) -> None:
    model, setting = _t5(), Setting.parse(name)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting) and len(lines) > 10


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 4, mode="sum")
        self.head = nn.Linear(4, 2)

    def forward(self, idx: torch.Tensor, off: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(idx, off, per_sample_weights=w))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_embedding_bag_per_sample_weights_raise_at_the_bag(
    device: str, name: str, dtype: str
) -> None:
    inputs = (torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]), torch.rand(4))
    model = ModelInputs("bag", Bag().eval(), inputs)
    setting = Setting.parse(name, device_type=device, amp_dtype=dtype)
    report = analyze(model, setting)
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    if name in ("half", "amp-half"):  # a 16-bit table, fp32 per-sample weights
        assert len(lines) == 1 and lines[0].startswith("[bag] in=torch.int64 -> error: ")
        if device == "cpu":  # the real CPU kernel's own message
            table = torch.randn(10, 4, dtype=getattr(torch, dtype))
            with pytest.raises(RuntimeError) as real:
                torch.nn.functional.embedding_bag(
                    inputs[0], table, inputs[1], mode="sum", per_sample_weights=inputs[2]
                )
            assert lines[0].endswith(str(real.value).splitlines()[0])
    else:
        assert not any("error" in line for line in lines)


class DirectCudnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.wt = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.head = nn.Linear(9, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cudnn_convolution(x, self.w, [1, 1], [1, 1], [1, 1], 1, False, True, True)
        z = torch.cudnn_convolution_transpose(
            y, self.wt, [0, 0], [1, 1], [1, 1], [1, 1], 1, False, True, True
        )
        return self.head(z)


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
def test_direct_cudnn_convolution_is_analysed_or_marked_per_node(name: str) -> None:
    model = ModelInputs("cudnn", DirectCudnn().eval(), (torch.randn(1, 3, 6, 6),))
    setting = Setting.parse(name)
    report = analyze(model, setting)  # never a stopped capture
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    nodes = {n.name: n for n in report.nodes}
    if name == "half":  # fp32 input, bf16 weight: cuDNN's own check, which needs a GPU
        failed = nodes["cudnn_convolution_1"]
        assert failed.not_analysed and "cuDNN" in failed.not_analysed
        assert eager_hook_lines(model, setting)[0].startswith(
            "[(top level)] in=None -> not analysed"
        )
    else:
        expected = "float32" if name == "fp32" else "bfloat16"
        assert nodes["cudnn_convolution"].outputs == [expected]
        assert nodes["cudnn_convolution_transpose"].outputs == [expected]
        assert hook_lines(report) == eager_hook_lines(model, setting)
