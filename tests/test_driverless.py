"""CUDA kernels that need a GPU driver even on fake tensors (issue 10, class 4): cuDNN RNNs.

Each expectation comes from the dispatcher (the real autocast kernels on fake tensors) and the
eager model's own forward hooks, never from ampgraph's output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze, policy
from ampgraph.capture.driverless import cudnn_rnn_stand_ins
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

pytestmark = pytest.mark.usefixtures("in_analysis")  # kernels as an analysis runs them


class Recurrent(nn.Module):
    """An RNN layer and a Linear head, as a sequence model uses them."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn
        width = (rnn.proj_size or rnn.hidden_size) * (2 if rnn.bidirectional else 1)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


RNNS = {
    "lstm": lambda: nn.LSTM(8, 16, batch_first=True),
    "lstm_proj_2layers": lambda: nn.LSTM(8, 16, num_layers=2, proj_size=4),
    "gru_bidirectional": lambda: nn.GRU(8, 16, batch_first=True, bidirectional=True),
    "rnn_tanh": lambda: nn.RNN(8, 16, batch_first=True),
    "rnn_relu_no_bias": lambda: nn.RNN(8, 16, nonlinearity="relu", bias=False),
}
SETTINGS = ("fp32", "amp-fp32", "amp-half", "autocast=on,params=fp32,dtype=fp16")


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("case", sorted(RNNS))
def test_cudnn_rnns_are_analysed_and_agree_with_both_oracles(case: str, name: str) -> None:
    model = ModelInputs(case, Recurrent(RNNS[case]()).eval(), (torch.randn(2, 5, 8),))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0, report.check
    assert "not_analysed" not in report.check
    assert hook_lines(report) == eager_hook_lines(model, setting)
    kinds = ("aten.lstm.", "aten.gru.", "aten.rnn_tanh.", "aten.rnn_relu.")
    rnn = next(r for r in report.nodes if r.op.startswith(kinds))
    assert rnn.not_analysed is None and rnn.error is None
    if setting.autocast:
        # cuDNN's autocast wrapper runs in fp16 whatever autocast's dtype (AutocastRNN.cpp).
        assert rnn.policy == policy.FP16 and set(rnn.outputs) == {"float16"}
    else:
        assert rnn.policy is None and set(rnn.outputs) == {"float32"}


def test_the_fp16_rule_is_the_real_autocast_kernels() -> None:
    """``_cudnn_rnn``'s real autocast kernel, under bf16 autocast, casts its input to fp16.

    Weights already in fp16 skip the wrapper's cuDNN weight copy (the one step that needs a
    driver), so the real kernel runs here unaided.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ampgraph.torchutil import autocast_state

    with FakeTensorMode(allow_non_fake_inputs=True), autocast_state("cuda", True, torch.bfloat16):
        x, h = torch.empty(5, 2, 8, device="cuda"), torch.empty(1, 2, 16, device="cuda")
        shapes = ((64, 8), (64, 16), (64,), (64,))
        weights = [torch.empty(s, device="cuda", dtype=torch.float16) for s in shapes]
        out = torch.ops.aten._cudnn_rnn.default(
            x, weights, 4, None, h, h, 2, 16, 0, 1, False, 0.0, False, False, [], None
        )
    assert [t.dtype for t in out[:3]] == [torch.float16] * 3
    assert policy.lookup("cuda", "aten::_cudnn_rnn", "default") == policy.FP16


def test_the_stand_ins_exist_only_while_fake_tensors_run() -> None:
    """A real GPU run outside an analysis takes PyTorch's own kernels."""

    def registered() -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::lstm.input", "AutogradCUDA")

    assert not registered()
    with cudnn_rnn_stand_ins("cuda"):
        assert registered()
    assert not registered()
    with cudnn_rnn_stand_ins("cpu"):
        assert not registered()


def test_a_cpu_rnn_agrees_with_a_real_cpu_run() -> None:
    """The stand-ins are CUDA's alone: a CPU LSTM's dtypes are those of a real CPU run."""
    from ampgraph.verify import verify

    model = ModelInputs("lstm", Recurrent(nn.LSTM(8, 16, batch_first=True)).eval(),
                        (torch.randn(2, 5, 8),))  # fmt: skip
    for name in ("fp32", "amp-fp32", "amp-half"):
        result = verify(model, Setting.parse(name, device_type="cpu"))
        # Casts inside the LSTM's decomposition are named by its inner nodes on paper and
        # "(internal)" in the real log: a naming difference verify's cast check still reports.
        assert [d for d in result.disagreements if d.kind != "cast"] == []
