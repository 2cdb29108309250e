"""Issue 42: Python's reads of a tensor's data that no op records, made on the capture's fake
tensors as a real run makes them on real ones (``capture/data_reads.py``).

* A 0-d tensor formatted into a module's name (SwitchTransformers' sparse MLP calls
  ``self.experts[f"expert_{idx}"]`` for each expert its router picked): ``Tensor.__format__``
  formats the value only for ``type(self) is Tensor``, so a fake tensor gave its repr and the
  capture failed with ``KeyError: 'expert_FakeTensor(..., size=(), dtype=torch.int64)'``.
* A sequence of 0-d tensors made into a tensor: an index ``x[rows, cols]`` of tuples of 0-d
  tensors (UDOP's ``rows, cols = zip(*ind)``) or ``torch.tensor([t0, t1])``; torch's conversion
  reads each element's data and the capture failed with ``The tensor has a non-zero number of
  elements, but its data is not allocated yet``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph import analyze
from ampgraph.capture.data_reads import DataReads
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.torchutil import fake_mode, unbacked_values
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines

SETTINGS = ["fp32", "half", "amp-half", "amp-fp32"]


class ExpertsByName(nn.Module):
    """A router picks experts by its scores; each picked expert is looked up by a name formatted
    from a 0-d index tensor (SwitchTransformers' ``self[f"expert_{expert_idx[0]}"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 3)
        self.experts = nn.ModuleDict({f"expert_{i}": nn.Linear(4, 4) for i in range(3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.router.weight.dtype)
        choice = self.router(x).argmax(-1)  # from float scores: no input value says it
        out = torch.zeros_like(x)
        for idx in torch.unique(choice):
            rows = choice == idx
            out = out + self.experts[f"expert_{idx}"](x) * rows[:, None].to(x.dtype)
        return out


def _experts() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("experts", ExpertsByName().eval(), (torch.randn(6, 4),))


@pytest.mark.parametrize("name", SETTINGS)
def test_a_module_named_by_a_formatted_0d_tensor_is_followed(name: str) -> None:
    model = _experts()
    setting = Setting.parse(name)
    report = analyze(model, setting)  # before: KeyError: 'expert_FakeTensor(...)'
    assert report.check is not None and report.check["disagreements"] == 0
    assert not [n.error for n in report.nodes if n.error]
    lines = hook_lines(report)
    assert any(line.startswith("[experts.expert_") for line in lines)
    # The eager hooks given the sizes the capture's run on values found, as the zoo runs them.
    assert lines == eager_hook_lines(model, setting, report.capture.get("unbacked_values"))
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_where_the_forward_decided_on_data_is_its_own_line_under_the_mode() -> None:
    """The capture's report of where the forward decided on data names the model's lines, as
    without the mode: torch keeps the innermost frames outside torch, which were the mode's own
    (``__torch_function__ line ...: return func(*args, **kwargs)``)."""
    import inspect

    source, first = inspect.getsourcelines(ExpertsByName.forward)
    where = {line.strip(): first + i for i, line in enumerate(source)}
    loop, lookup = "for idx in torch.unique(choice):", next(k for k in where if "expert_" in k)
    report = analyze(_experts(), "amp-half")
    lines = report.capture["data_dependent"]
    assert report.capture["method"] == "export-data-path" and len(lines) == 2
    assert lines[0].startswith(f"forward line {where[loop]}: `{loop}`: ")
    assert lines[1].startswith(f"forward line {where[lookup]}: `{lookup}`: ")


def test_a_formatted_0d_fake_tensor_gives_its_value() -> None:
    """Its value as a real run formats it: a data-dependent size's value where one is given,
    and a guard on data (what sends a capture along the data's path) where none is."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    real = torch.tensor([0.1, 0.9, 0.3, 0.2])
    assert f"expert_{real.argmax()}" == "expert_1"
    with fake_mode() as mode, unbacked_values({"u0": 1, "u1": 1}), DataReads():
        assert f"expert_{mode.from_tensor(real).argmax()}" == "expert_1"
        assert f"{mode.from_tensor(real).argmax():>3}" == "  1"
    with fake_mode() as mode, DataReads(), pytest.raises(GuardOnDataDependentSymNode):
        f"expert_{mode.from_tensor(real).argmax()}"
    with fake_mode() as mode:  # torch's own: the repr, the key that was not found
        assert "FakeTensor" in f"expert_{mode.from_tensor(real).argmax()}"


class PatchesByPoints(nn.Module):
    """Points computed from float boxes pick the patches to drop (UDOP's
    ``rows, cols = zip(*ind); patch_inds[rows, cols] = False``) and the rows to read
    (``torch.tensor(rows)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.to(self.embed.weight.dtype))  # [2, 5, 4]
        points = (boxes * 5).long().clamp(0, 4)  # [3, 2]: batch row, patch
        rows, cols = zip(*points)
        keep = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device)
        keep[rows, cols] = False
        picked = h[torch.tensor(rows, device=h.device)]  # [3, 5, 4]
        return self.out(h * keep[..., None].to(h.dtype)).sum(0) + picked.sum(0)


def _patches() -> ModelInputs:
    torch.manual_seed(0)
    boxes = torch.tensor([[0.1, 0.5], [0.3, 0.9], [0.05, 0.2]])
    return ModelInputs("patches", PatchesByPoints().eval(), (torch.randn(2, 5, 4), boxes))


@pytest.mark.parametrize("name", SETTINGS)
def test_an_index_made_of_0d_tensors_is_computed_from_them(name: str) -> None:
    model = _patches()
    setting = Setting.parse(name)
    report = analyze(model, setting)  # before: "its data is not allocated yet"
    assert report.check is not None and report.check["disagreements"] == 0
    assert not [n.error for n in report.nodes if n.error]
    ops = {n.op for n in report.nodes}
    assert "aten.stack.default" in ops  # the index computed from the points, for any values
    assert hook_lines(report) == eager_hook_lines(
        model, setting, report.capture.get("unbacked_values")
    )
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


ELEMENTS = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float64,
            torch.bfloat16, torch.float16]  # fmt: skip


@pytest.mark.parametrize("second", ELEMENTS)
@pytest.mark.parametrize("first", ELEMENTS)
@pytest.mark.parametrize("number", [(), (1,)])
def test_a_tensor_of_0d_fake_tensors_has_the_real_conversions_dtype(
    first: torch.dtype, second: torch.dtype, number: tuple[int, ...]
) -> None:
    """``torch.tensor`` of 0-d tensors (and a Python number beside them): the dtype, shape and
    device the real conversion gives the same elements; real elements are torch's own."""
    reals = [torch.tensor(1, dtype=first), torch.tensor(0, dtype=second), *number]
    expected = torch.tensor(reals)
    with FakeTensorMode() as mode, DataReads():
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in reals]
        made = torch.tensor(fakes)
        nested = torch.tensor([fakes[:2], fakes[:2]], dtype=torch.float32)
        as_tensor = torch.as_tensor(fakes, dtype=torch.float64)
    assert (made.dtype, made.shape, made.device) == (expected.dtype, expected.shape, expected.device)
    assert (nested.dtype, nested.shape) == (torch.float32, torch.Size([2, 2]))
    assert as_tensor.dtype == torch.float64
    with DataReads():  # real elements: torch's own conversion, untouched
        assert torch.equal(torch.tensor(reals), expected)


class TwoLinear(nn.Module):
    """The two layers the modules below compute with, before and after what they read."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)


class SampleByCount(TwoLinear):
    """Draws as many rows as an integer mask counts (ViLT's patch sampling:
    ``torch.multinomial(weights, max_image_length)`` with a count computed from the pixel
    mask), from weights the graph computes."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        count = mask.sum()  # a 0-d tensor whose value the capture follows from the input
        weights = h[:, 0].float().softmax(0)  # values only a run has
        picked = h[torch.multinomial(weights, count, replacement=True)]
        return self.out(picked.contiguous().view(count, 2, 2).flatten(1))


@pytest.mark.parametrize("name", SETTINGS)
def test_a_known_count_given_as_an_integer_is_its_value(name: str) -> None:
    """torch reads a 0-d tensor given where an op takes an integer in C++, past every mode:
    the count was a size without a value, the trace stopped at the first read of it and the
    data path's run numbered its sizes otherwise (ViLT: ``select(): index 0 out of range for
    tensor of size [u2]``). The capture now gives the op the number a real run reads."""
    torch.manual_seed(0)
    mask = torch.tensor([1, 1, 0, 1, 0, 1, 1, 0])
    model = ModelInputs("count", SampleByCount().eval(), (torch.randn(8, 4), mask))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.capture["method"] == "make-fx"  # no branch left to decide on data
    assert report.check is not None and report.check["disagreements"] == 0
    assert not [n.error for n in report.nodes if n.error]
    drawn = next(n for n in report.nodes if n.op.startswith("aten.multinomial"))
    assert drawn.shapes == [[5]]  # the count the mask holds
    assert hook_lines(report) == eager_hook_lines(model, setting)
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


class MaskOfSampledRows(TwoLinear):
    """Samples rows among those an integer mask keeps, from weights as many as the kept rows
    (``torch.ones(v)`` of a size read from a boolean-mask index), and adds the fp32 mask to the
    scores only where a sampled row is padding: ViLT's image mask, made of sampled patches,
    which transformers drops when it is all ones (the scores then stay bf16 under autocast)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        kept = mask.nonzero()[:, 0]
        weights = torch.ones(kept.shape[0])  # a size the mask's values give
        sampled = mask[kept[torch.multinomial(weights, 3)]]
        scores = h @ h.T
        if not bool(sampled.all()):
            scores = scores + (1.0 - mask.float())[None, :] * -1e4
        return self.out(scores.softmax(-1) @ h)


@pytest.mark.parametrize("name", SETTINGS)
def test_a_tensor_sized_by_known_values_is_followed(name: str) -> None:
    """The weights' size is known from the mask, so are the weights, the sample and the branch
    on it: decided as a real run decides it, in the trace (before: the weights were unknown,
    the branch a guard on data, decided on the data path's seeded run)."""
    torch.manual_seed(0)
    mask = torch.tensor([1, 1, 0, 1, 0, 1])
    model = ModelInputs("sampled", MaskOfSampledRows().eval(), (torch.randn(6, 4), mask))
    setting = Setting.parse(name)
    state = torch.get_rng_state()
    report = analyze(model, setting)
    assert torch.equal(torch.get_rng_state(), state)  # the capture's draws are its own
    assert report.capture["method"] == "make-fx" and not report.capture.get("data_dependent")
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements
    if setting.autocast:  # no fp32 mask added: the scores' softmax input stays bf16/fp16
        softmax = next(n for n in report.nodes if n.op.startswith("aten.softmax"))
        assert softmax.inputs[0]["dtype"] == setting.amp_dtype


class CountedThenBranching(TwoLinear):
    """Reads a count from an integer mask into Python, keeps the rows it marks, then branches on
    float data (so the capture follows the data path)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = int(mask.sum() * 2)  # the run on values: a size of its own; the trace: a number
        rows = mask.nonzero()[:, 0]
        h = self.fc(x.to(self.fc.weight.dtype))
        kept = h[rows]
        if (h[:, 0] > 0).any():
            kept = kept * 2
        return self.out(kept[:n])


def test_the_data_paths_sizes_are_its_own_traces() -> None:
    """The data path's trace in the setting takes each size computed from followed values at
    its real value; the replays took the run on values' value for the same name, another
    size's where that run numbered them otherwise (ViLT's ``select(): index 0 out of range for
    tensor of size [u2]``, u2 given 0): here the kept rows were replayed 8 where they are 4."""
    torch.manual_seed(0)
    mask = torch.tensor([1, 1, 0, 1, 0, 1])
    model = ModelInputs("counted", CountedThenBranching().eval(), (torch.randn(6, 4), mask))
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.capture["method"] == "export-data-path"
    shapes = {n.op: n.shapes for n in report.nodes}
    assert shapes["aten.nonzero.default"] == [[4, 1]]
    assert shapes["aten.index.Tensor"] == [[4, 4]]
    assert report.check is not None and report.check["disagreements"] == 0
    result = verify(model, Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements


def test_a_tensor_sized_by_known_values_is_followed_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torch.ones(v)`` of a known size ``v`` is made for real beside the fake one, unless its
    count at ``v``'s value passes the bound on followed tensors: then nothing is made."""
    from ampgraph.capture import known_values
    from ampgraph.capture.known_values import INPUT_LIMIT, KnownValues

    made: list[tuple[int, ...]] = []
    real_call = known_values._real

    def spy(call, args, kwargs):  # type: ignore[no-untyped-def]
        out = real_call(call, args, kwargs)
        made.append(tuple(out.shape) if isinstance(out, torch.Tensor) else ())
        return out

    monkeypatch.setattr(known_values, "_real", spy)
    real = torch.tensor([1, 0, 1])
    with fake_mode() as mode:
        fake = mode.from_tensor(real)
    values = KnownValues({id(fake): (fake, real)})
    with values, mode:
        count = fake.nonzero().shape[0]
        small, big = torch.ones(count), torch.ones(count, INPUT_LIMIT)
    assert isinstance(count, torch.SymInt)
    assert torch.equal(values.value(small), torch.ones(2))
    assert values.value(big) is None
    assert (2, INPUT_LIMIT) not in made and (2,) in made


class DeltasFromIds(nn.Module):
    """Per-row counts read from integer ids, made into one tensor on the activations' device
    and read back as a length (ERNIE-VL's ``get_rope_index``: ``torch.tensor(
    mrope_position_deltas, device=input_ids.device)`` of 0-d tensors it computed per row)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        deltas = [(row > 0).sum() for row in ids]
        made = torch.tensor(deltas, device=h.device) + h.new_tensor(deltas).long()
        return self.out(h[:, : int(made.max()) // 2])


@pytest.mark.parametrize("name", SETTINGS)
def test_a_tensor_of_followed_0d_tensors_on_the_settings_device(name: str) -> None:
    """The elements are followed (computed from the ids), so the capture reads their values;
    torch's conversion read each fake element's data first: on a fake CUDA tensor by a copy to
    the host ("Found no NVIDIA driver on your system", ``check``), on a fake CPU one "its data
    is not allocated yet" (``verify --device cpu``). The zoo's ernie4_5_vl_moe lost its whole
    capture to both."""
    torch.manual_seed(0)
    ids = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    model = ModelInputs("deltas", DeltasFromIds().eval(), (torch.randn(2, 6, 4), ids))
    setting = Setting.parse(name)
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    assert not report.check.get("not_analysed") and not [n.error for n in report.nodes if n.error]
    assert hook_lines(report) == eager_hook_lines(model, setting)
    assert hook_lines(report)[-1].startswith("[out]")
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_new_tensor_and_a_list_index_of_0d_fake_tensors(device: str) -> None:
    """The same conversion by ``x.new_tensor(data)`` (``x``'s dtype and device unless given)
    and by an index list that torch takes as a tuple (``x[[rows, cols]]``, NumPy's rule):
    made as the real conversion makes them, for fake elements on either device."""
    x, rows = torch.zeros(4, 3), [torch.tensor(1), torch.tensor(2)]
    with pytest.warns(UserWarning, match="non-tuple sequence"):  # torch's rule, deprecated
        listed = x[[rows, [0, 2]]]
    expected = (x.new_tensor(rows), x.new_tensor(rows, dtype=torch.int32), listed)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, DataReads():
        fx = mode.from_tensor(x.to(device))
        frows = [mode.from_tensor(r.to(device)) for r in rows]
        made = (fx.new_tensor(frows), fx.new_tensor(frows, dtype=torch.int32), fx[[frows, [0, 2]]])
    for ours, real in zip(made, expected):
        assert (ours.dtype, ours.shape, ours.device.type) == (real.dtype, real.shape, device)
