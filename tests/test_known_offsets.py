"""Issue 42: ranges between offsets a forward computes from an integer grid, followed as a real
run follows them (``capture/known_values.py``).

ERNIE-VL's resampler (``Ernie4_5_VLMoeVariableResolutionResamplerModel``) writes the offsets of
each image's tokens into ``torch.empty`` (``offsets[0] = 0``, ``offsets[1:] =
counts.cumsum(0)[:-1]``) and gathers each image's rows with ``torch.arange(offset, offset +
count)``. The capture followed the grid's values but not the tensor ``torch.empty`` made, and
gave ``torch.arange`` its 0-d bounds as tensors, whose values torch reads in C++ past every
mode: each read a new unknown, each range's length a difference of unknowns no value was ever
given for. Everything after the gather was "not analysed" (``Could not guard on data-dependent
expression Eq(u0 - u1 + u2 - u3, 0)``): half of the zoo's ernie4_5_vl_moe, 214 nodes, with
``check`` showing 25 of 26 hook lines (the eager hooks' symbols numbered otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ampgraph import analyze
from ampgraph.capture.known_values import KnownValues
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = ["fp32", "half", "amp-half", "amp-fp32"]


class GatherByGrid(nn.Module):
    """Rows gathered per image between offsets computed from its grid (ERNIE-VL's resampler)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        counts = grid_thw.prod(-1).flatten()
        offsets = torch.empty(counts.size(), dtype=counts.dtype)
        offsets[0] = 0
        offsets[1:] = counts.cumsum(dim=0)[:-1]
        rows = [torch.arange(o, o + t) for t, o in zip(grid_thw[:, 0], offsets)]
        return self.ln(self.fc(x[torch.cat(rows)]))


def _model() -> ModelInputs:
    torch.manual_seed(0)
    grid = torch.tensor([[2, 1, 1], [3, 1, 1]])
    return ModelInputs("gather", GatherByGrid().eval(), (torch.randn(10, 8), grid))


@pytest.mark.parametrize("name", SETTINGS)
def test_rows_between_offsets_from_a_grid_are_analysed(name: str) -> None:
    model = _model()
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    assert not report.check.get("not_analysed"), report.check  # before: the norm and after
    assert hook_lines(report) == eager_hook_lines(model, setting)
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def _followed(*reals: torch.Tensor) -> tuple[KnownValues, FakeTensorMode, list[torch.Tensor]]:
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = [mode.from_tensor(t, static_shapes=True) for t in reals]  # as the capture's
    return KnownValues({id(f): (f, r) for f, r in zip(fakes, reals)}), mode, fakes


def test_a_tensor_torch_empty_makes_is_followed_as_it_is_written() -> None:
    """``torch.empty`` from sizes alone, then written from followed values: its values are the
    writes', read as a real run reads them (before: not followed, a guard on data)."""
    values, mode, (counts,) = _followed(torch.tensor([2, 3, 4]))
    with values, mode:
        offsets = torch.empty(counts.size(), dtype=counts.dtype)
        offsets[0] = 0
        offsets[1:] = counts.cumsum(0)[:-1]
        assert [int(o) for o in offsets] == [0, 2, 5]


def test_a_range_between_followed_bounds_has_its_real_length() -> None:
    """``torch.arange`` takes its bounds as numbers; given followed 0-d tensors, the trace gives
    it their values, as a real run's C++ reads them (before: a length ``u1 - u0``)."""
    values, mode, (start, end) = _followed(torch.tensor(2), torch.tensor(5))
    with values, mode:
        assert torch.arange(start, end).shape == (3,)
        assert torch.arange(start, end, 2).shape == (2,)


@pytest.mark.parametrize("make", [torch.empty, torch.zeros])
def test_a_followed_tensor_written_from_unknown_values_is_no_longer_followed(
    make: Callable[..., torch.Tensor],
) -> None:
    """A write of values the capture does not know (a fake tensor's, unfollowed) into a
    followed tensor leaves its real copy stale: the tensor is no longer followed, and a read of
    it is a guard on data (the capture then follows the data's path), never the stale zero."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    values, mode, (counts,) = _followed(torch.tensor([2, 3]))
    unknown = mode.from_tensor(torch.tensor([7, 9]), static_shapes=True)
    with values, mode:
        written = make(counts.size(), dtype=counts.dtype)
        written[0] = unknown[1]
        with pytest.raises(GuardOnDataDependentSymNode):
            int(written[0])
        kept = make(counts.size(), dtype=counts.dtype)
        kept[1:] = counts[:1]
        assert int(kept[1]) == 2  # a write of known values is followed
