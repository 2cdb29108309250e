"""verify's cast log: what counts as a cast at the dispatcher (``ampgraph.verify.cast_log``)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from ampgraph.formats.verify import disagreement_lines
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.cast_log import CastLog, weights_as_one
from ampgraph.verify.compare import cast_key


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
        assert result.ok, disagreement_lines(result)


def _casts(text: str) -> list[tuple[str, str, str]]:
    """``x fp32->fp16, ...`` as verify prints a node's casts, back to cast keys."""
    names = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
    out = []
    for item in text.split(", "):
        source, _, pair = item.rpartition(" ")
        a, b = pair.split("->")
        out.append((source, names[a], names[b]))
    return out


@pytest.mark.parametrize(("op", "inputs", "predicted", "observed"), [
    # docs/verification/cuda-survey.json (H100, torch 2.11), cases gru-fp32-input and lstm in
    # amp-fp32 with bf16: the lines verify printed before the weights were compared as one.
    ("aten.gru.input", ["x", "zeros", "p_rnn_weight_ih_l0", "p_rnn_weight_hh_l0",
                        "p_rnn_bias_ih_l0", "p_rnn_bias_hh_l0"],
     "x fp32->fp16, p_rnn_weight_ih_l0 fp32->fp16, p_rnn_weight_hh_l0 fp32->fp16, "
     "p_rnn_bias_ih_l0 fp32->fp16, p_rnn_bias_hh_l0 fp32->fp16, zeros fp32->fp16",
     "x fp32->fp16, zeros fp32->fp16, (internal) fp32->fp16, (internal) fp32->fp16, "
     "(internal) fp32->fp16, (internal) fp32->fp16"),
    ("aten.lstm.input", ["to", "zeros", "zeros_1", "p_rnn_weight_ih_l0", "p_rnn_weight_hh_l0",
                         "p_rnn_bias_ih_l0", "p_rnn_bias_hh_l0"],
     "to fp32->fp16, p_rnn_weight_ih_l0 fp32->fp16, p_rnn_weight_hh_l0 fp32->fp16, "
     "p_rnn_bias_ih_l0 fp32->fp16, p_rnn_bias_hh_l0 fp32->fp16, zeros fp32->fp16, "
     "zeros_1 fp32->fp16",
     "to fp32->fp16, zeros fp32->fp16, zeros_1 fp32->fp16, (internal) fp32->fp16, "
     "(internal) fp32->fp16, (internal) fp32->fp16, (internal) fp32->fp16"),
])  # fmt: skip
def test_a_cudnn_rnns_weights_cast_into_its_buffer_agree_as_one(
    op: str, inputs: list[str], predicted: str, observed: str
) -> None:
    """cuDNN's autocast kernel copies the weights into its fp16 buffer from views of them (a
    real run logs them ``(internal)``); the annotation names each weight: the same casts."""
    names = set(inputs)

    def counted(observed_casts: list[tuple[str, str, str]]) -> tuple[Counter, Counter]:
        said, seen = weights_as_one(op, inputs, _casts(predicted), observed_casts)
        return Counter(cast_key(c, names) for c in said), Counter(cast_key(c, names) for c in seen)

    want, got = counted(_casts(observed))
    assert want == got
    # The input's and hx's casts still count one by one: one missing is a disagreement.
    want, got = counted(_casts(observed)[1:])
    assert want != got


def test_other_ops_internal_casts_are_not_merged() -> None:
    casts = [("(internal)", "float32", "float16")] * 2
    assert weights_as_one("aten.linear.default", ["x", "w"], casts, casts) == (casts, casts)


def test_a_cpu_rnn_that_casts_its_weights_by_name_is_compared_one_by_one() -> None:
    """The CPU's GRU is a composite that casts each weight at each step, by name, beside casts
    of its own intermediates (internal): nothing is merged there."""
    inputs = ["x", "h", "w"]
    predicted = [("x", "float32", "bfloat16"), ("w", "float32", "bfloat16"),
                 ("gru.add_", "float32", "bfloat16")]  # fmt: skip
    observed = [("w", "float32", "bfloat16"), ("(internal)", "float32", "bfloat16")]
    assert weights_as_one("aten.gru.input", inputs, predicted, observed) == (predicted, observed)
