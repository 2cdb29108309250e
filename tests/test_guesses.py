"""Tests torch guesses on data-dependent sizes, decided as the real values decide them where the
capture knows them (``capture/guesses.py``; issue 42's LightGlue).

A broadcast of a padded length ``Max(u1, u2)`` against a slice of it (``x[:, 0:1]``, whose length
is ``Min(1, Max(u1, u2))``) is guessed not to broadcast, and the guess asserted at run time; a
real run broadcasts. Draft export checked that assertion on its real values and failed: the whole
model was lost ("Runtime assertion failed for expression Eq(Max(u1, u2), Min(1, Max(u1, u2)))"),
though the model runs.
"""

from __future__ import annotations

import inspect

import pytest
import sympy
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from ampgraph import analyze
from ampgraph.capture.guesses import decided_by_real_values
from ampgraph.compat import unbacked_value_setter
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting


class PaddedScores(nn.Module):
    """LightGlue's attention in small: each row keeps the points its scores pick (a count from
    data), the rows are padded to the longest, and every point's scores get a bias computed
    from the first point only (``descriptors[:, 0:1]``, LightGlue's ``q_len == 1`` mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.out = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        keep = h[..., 0] > -1.0  # every point, on these values: still a count read from data
        n = int(keep.sum())  # a size decided on data: the capture follows the data's path
        padded = pad_sequence([row[k] for row, k in zip(h, keep)], batch_first=True)
        scores = padded @ padded.transpose(1, 2)  # (2, M, M), M = Max(u1, u2)
        bias = padded[:, 0:1] @ padded.transpose(1, 2)  # (2, Min(1, M), M)
        return self.out((scores + bias) / n)  # the broadcast: M against Min(1, M)


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("padded", PaddedScores().eval(), (torch.randn(2, 6, 4),))


def test_the_model_runs_and_broadcasts() -> None:
    """What a real run does, which the capture must follow: no error, the bias broadcast."""
    model = _model()
    assert model.module(*model.args).shape == (2, 6, 6)


@pytest.mark.parametrize("name", ["amp-fp32", "amp-half"])
def test_a_broadcast_against_a_slice_of_a_data_dependent_length_is_captured(name: str) -> None:
    """Before: ``make_fx could not trace 'padded': RuntimeError: Runtime assertion failed for
    expression Eq(Max(u1, u2), Min(1, Max(u1, u2)))``. Now traced along the data's path, every
    node as the dispatcher says, the decision listed at the model's line."""
    source, first = inspect.getsourcelines(PaddedScores.forward)
    line = next(first + i for i, text in enumerate(source) if "bias = padded[:, 0:1]" in text)
    report = analyze(_model(), Setting.parse(name))
    assert report.capture["method"] == "export-data-path"
    assert report.check is not None and report.check["disagreements"] == 0
    assert report.check["compared"] > 0 and not report.check.get("not_analysed")
    decided = report.capture["data_dependent"]
    assert any(entry.startswith(f"forward line {line}: ") for entry in decided), decided


def test_the_captured_path_agrees_with_a_real_cpu_run() -> None:
    from ampgraph.verify import verify

    result = verify(_model(), Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


def test_only_a_guess_the_real_values_contradict_is_decided() -> None:
    """A size whose real value is 1 decides ``n == 1`` against torch's guess (False); one whose
    value is 2 agrees with the guess, and a shape environment without real values decides
    nothing (a trace on fake tensors alone keeps torch's general graph)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    one, two = env.create_unbacked_symint().node.expr, env.create_unbacked_symint().node.expr
    assert not decided_by_real_values(env, sympy.Eq(one, 1), False)  # no real values yet
    getattr(env, unbacked_value_setter())(one, 1)
    getattr(env, unbacked_value_setter())(two, 2)
    assert decided_by_real_values(env, sympy.Eq(one, 1), False)
    assert not decided_by_real_values(env, sympy.Eq(two, 1), False)
    assert not decided_by_real_values(env, sympy.Eq(one, 1), True)  # the guess was right


def test_the_analysis_leaves_torch_as_it_found_it() -> None:
    from torch.fx.experimental import symbolic_shapes

    from ampgraph.capture.environment import analysis_environment

    before = getattr(symbolic_shapes, "_guard_or", None)
    if before is None:
        pytest.skip("this torch makes its guesses elsewhere: nothing is installed")
    with analysis_environment():
        assert symbolic_shapes._guard_or is not before
    assert symbolic_shapes._guard_or is before
