"""``ampgraph ranges``: value ranges of one fp32 run, judged against each setting's dtypes.

Every prediction is checked against the real thing: the dtype limits against ``torch.finfo`` and
real conversions; each overflow against the model run for real in that setting on the CPU (inf
exactly at the predicted node and only downstream of it, none where ranges says it fits); each
constant that "raises" against the real kernel's error.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph.capture.trace import capture
from ampgraph.cli import main
from ampgraph.model.build import ModelInputs
from ampgraph.ranges import LIMITS, RangesError, value_ranges
from ampgraph.ranges.collect import RangeRun, reduce_tensor
from ampgraph.ranges.weights import real_state
from ampgraph.settings import Setting
from ampgraph.verify.execution import real_autocast
from ampgraph.verify.tensors import graph_inputs, real_inputs

CPU = torch.device("cpu")


class Blowup(nn.Module):
    """fc2's output is 32 * 80 * 300 = 768,000: over fp16's 65,504, far inside bf16's range."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.fc1.weight.dtype)  # the 'half' settings feed it their parameters' dtype
        return self.norm(self.fc2(torch.relu(self.fc1(x))))


def blowup() -> tuple[nn.Module, torch.Tensor]:
    """The factory ``--module tests/test_ranges.py:blowup`` names."""
    m = Blowup()
    with torch.no_grad():
        m.fc1.weight.fill_(10.0)
        m.fc1.bias.zero_()
        m.fc2.weight.fill_(300.0)
        m.fc2.bias.zero_()
    return m.eval(), torch.ones(2, 8)


class Block(nn.Module):
    """A pre-norm residual MLP block, as in a transformer."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Tower(nn.Module):
    """docs/ranges.md's worked example: a residual stream that grows layer by layer."""

    def __init__(self, d: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.to(self.embed.weight.dtype))
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tower() -> tuple[nn.Module, torch.Tensor]:
    """Each layer's fc2 writes 20 times more than the one before: layer 3's reaches ~1e5."""
    torch.manual_seed(0)
    m = Tower()
    with torch.no_grad():
        for i, layer in enumerate(m.layers):
            layer.fc2.weight.mul_(20.0 ** (i + 1))
    return m.eval(), torch.randn(4, 64)


class MaskFill(nn.Module):
    """Masks with fp32's minimum whatever the dtype (the bug fact 18 saw on a GPU), or with the
    minimum of the activations' own dtype (what Hugging Face models do: no finding)."""

    def __init__(self, own_dtype: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.own_dtype = own_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.to(self.fc.weight.dtype))
        low = torch.finfo(h.dtype if self.own_dtype else torch.float32).min
        return h.masked_fill(h > 0, low).softmax(-1)


@functools.cache
def _result(factory: str, names: tuple[str, ...], amp_dtype: str) -> Any:
    module, x = globals()[factory]()
    return value_ranges(
        ModelInputs(factory, module, (x,)), list(names), device_type="cpu", amp_dtype=amp_dtype
    )


def real_run(model: ModelInputs, setting: Setting) -> tuple[list[str], dict[str, Any], Any]:
    """Run ``model`` for real in ``setting`` on the CPU (its weights in the setting's dtype, real
    autocast): node names in order, each node's measured range or error, and the graph."""
    cap = capture(model, setting)
    state, _ = real_state(model.module, seed=0)
    dtype = getattr(torch, setting.param_dtype)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    gen = torch.Generator().manual_seed(0)
    args, kwargs = real_inputs(model, CPU, gen)
    values = graph_inputs(cap, model, args, kwargs, CPU, gen, known=state)
    interp = RangeRun(cap.graph_module, setting, {}, {})
    with torch.no_grad(), real_autocast(setting):
        interp.run(*values)
    order = [n.name for n in cap.graph_module.graph.nodes if n.name in interp.ranges]
    return order, interp.ranges, cap.graph_module.graph


def _downstream(graph: Any, names: set[str]) -> set[str]:
    """``names`` and every node that depends on one of them."""
    reached = set(names)
    for node in graph.nodes:  # topological order
        if any(a.name in reached for a in node.all_input_nodes):
            reached.add(node.name)
    return reached


# -- the limits, proved against torch ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_limits_are_torch_finfo_and_real_rounding(name: str) -> None:
    dtype = getattr(torch, name)
    fi = torch.finfo(dtype)
    lim = LIMITS[name]
    assert (lim.max, lim.tiny, lim.eps) == (fi.max, fi.tiny, fi.eps)
    assert lim.subnormal == fi.smallest_normal * 2.0 ** (1 - lim.bits)
    if name == "float64":
        return  # no wider type here to round from
    # The values judged are the fp32 run's: round from fp32 (fp64 -> bf16 rounds twice, via fp32).
    wide = torch.float64 if name == "float32" else torch.float32
    at = torch.tensor(lim.overflow_at, dtype=wide)
    below = torch.nextafter(at, torch.tensor(0.0, dtype=wide))
    assert at.to(dtype).isinf() and below.to(dtype).isfinite()
    assert lim.overflows(float(at)) and not lim.overflows(float(below))
    half_sub = torch.tensor(lim.subnormal / 2, dtype=wide)
    above = torch.nextafter(half_sub, torch.tensor(1.0, dtype=wide))
    assert half_sub.to(dtype) == 0 and above.to(dtype) != 0
    assert lim.flushes(float(half_sub)) and not lim.flushes(float(above))


def test_reduce_tensor_counts_what_is_there() -> None:
    t = torch.tensor([0.0, -2.5, 3e-3, float("nan"), float("-inf"), 0.0, -3.4e38])
    r = reduce_tensor(t)
    assert (r.zeros, r.nans, r.infs, r.extremes) == (2, 1, 1, 1)
    assert r.max_abs == 2.5 and r.min_nonzero == pytest.approx(3e-3)
    big = torch.randn(3, 1 << 19)  # several chunks
    big[1, 7] = 0.0
    r = reduce_tensor(big)
    nonzero = big.abs()[big != 0]
    assert r.max_abs == float(big.abs().max()) and r.min_nonzero == float(nonzero.min())
    assert r.zeros == int((big == 0).sum())


# -- overflow: predicted, then confirmed by running each setting for real -----------------------


FIRST = {"blowup": ("linear_1", "fc2"), "tower": ("linear_8", "layers.3.fc2")}


@pytest.mark.parametrize(
    ("factory", "amp_dtype", "expect_overflow"),
    [("blowup", "fp16", True), ("blowup", "bf16", False), ("tower", "fp16", True),
     ("tower", "bf16", False)],
)  # fmt: skip
def test_predicted_overflow_is_where_the_real_run_makes_inf(
    factory: str, amp_dtype: str, expect_overflow: bool
) -> None:
    names = ("fp32", "half", "amp-fp32", "amp-half")
    result = _result(factory, names, amp_dtype)
    module, x = globals()[factory]()
    model = ModelInputs(factory, module, (x,))
    for verdict in result.settings:
        setting = Setting.parse(verdict.name, device_type="cpu", amp_dtype=amp_dtype)
        order, real, graph = real_run(model, setting)
        bad = [n for n in order if any(o is not None and (o.infs or o.nans)
                                       for o in real[n].outputs)]  # fmt: skip
        predicted = {f.node for f in verdict.findings if f.kind == "overflow"}
        if verdict.name == "fp32" or not expect_overflow:
            assert verdict.ok and not predicted and not bad, (verdict.name, bad)
            continue
        node, module_path = FIRST[factory]
        assert verdict.first is not None and verdict.first.node == bad[0] == node
        assert f"in {module_path} " in verdict.first.message and "65,504" in verdict.first.message
        assert predicted <= set(bad)  # every predicted overflow is an inf in the real run
        assert set(bad) <= _downstream(graph, predicted)  # and every inf comes from one


def test_bf16_fits_and_is_told_its_precision() -> None:
    result = _result("blowup", ("amp-fp32",), "bf16")
    assert result.ok
    from ampgraph.formats.text import ranges_text as text

    out = text(result)
    assert "fits" in out and "bf16 keeps 8 significant bits" in out


# -- constants ----------------------------------------------------------------------------------


@pytest.mark.parametrize("amp_dtype", ["fp16", "bf16"])
def test_fp32_minimum_mask_raises_in_16_bits_as_predicted(amp_dtype: str) -> None:
    model = ModelInputs("mask", MaskFill(own_dtype=False).eval(), (torch.randn(2, 8),))
    result = value_ranges(model, ["amp-fp32"], device_type="cpu", amp_dtype=amp_dtype)
    first = result.settings[0].first
    assert first is not None and first.kind == "constant-raises", result.settings[0].findings
    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype=amp_dtype)
    _, real, _ = real_run(model, setting)
    assert "without overflow" in (real[first.node].error or "")
    # The fp32 run's own mask values (-3.4e38) are sentinels, not an overflow of the node.
    assert not [f for f in result.settings[0].findings if f.kind == "overflow"]


def test_a_mask_in_the_activations_own_dtype_is_fine() -> None:
    model = ModelInputs("mask", MaskFill(own_dtype=True).eval(), (torch.randn(2, 8),))
    result = value_ranges(model, ["amp-fp32", "half"], device_type="cpu", amp_dtype="fp16")
    assert result.ok, [f.message for s in result.settings for f in s.findings]
    for name in ("amp-fp32", "half"):
        setting = Setting.parse(name, device_type="cpu", amp_dtype="fp16")
        _, real, _ = real_run(model, setting)
        assert not [n for n, r in real.items() if r.error], name


# -- seed 000: x16 = torch.randn(2, 20000) under autocast ---------------------------------------


class SeedOps(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.max(), x.min(), x.sum(), x.mean(), x.prod(), x.exp(), x.log()


def test_seed_sum_in_fp32_and_prod_underflows() -> None:
    torch.manual_seed(0)
    x16 = torch.randn(2, 20000).to(torch.bfloat16)
    model = ModelInputs("seed", SeedOps(), (x16,))
    result = value_ranges(model, ["amp-fp32"], device_type="cuda", amp_dtype="bf16")
    from ampgraph.pipeline.stages import analyze

    report = analyze(model, Setting.parse("amp-fp32"), check=False)
    outs = {r.op: r.out_dtype for r in report.nodes if r.kind == "op"}
    assert outs["aten.sum.default"] == "float32" and outs["aten.prod.default"] == "float32"
    by_op = {n.op: n for n in result.nodes}
    real_sum = float(x16.float().sum())
    assert by_op["aten.sum.default"].outputs[0].max_abs == pytest.approx(abs(real_sum), rel=1e-5)
    # prod: 0 in fp32 for real, and ranges says it underflowed with its true magnitude.
    assert float(x16.float().prod()) == 0.0
    under = [f for f in result.reference_findings if f.kind == "reference-underflow"]
    assert [f.op for f in under] == ["aten.prod.default"]
    true = float(torch.log10(x16.double().abs()).sum())
    assert under[0].value == pytest.approx(true, rel=1e-6)
    nan = [f for f in result.reference_findings if f.kind == "reference-nonfinite"]
    assert [f.op for f in nan] == ["aten.log.default"]  # log of negative values: NaN in any dtype


# -- weights ------------------------------------------------------------------------------------


def test_safetensors_folder_weights_are_read_and_judged(tmp_path: Any) -> None:
    from safetensors.torch import save_file

    from ampgraph.model.build import load_model

    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "max_position_embeddings": 32,
              "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path), seq_len=4)
    state, _ = real_state(model.module, seed=1)
    big = {"lm_head.weight": torch.full((64, 16), 3e4), "model.norm.weight": torch.ones(16)}
    save_file(big, str(tmp_path / "model.safetensors"))
    (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
    result = value_ranges(model, ["amp-fp32"], device_type="cpu", amp_dtype="fp16",
                          weights_dir=tmp_path)  # fmt: skip
    # The weights line: what the files held, what was seeded, what the model's code computed.
    files, seeded_part, computed = result.weights.split("; ")
    assert files == "2 tensors from 1 safetensors file"
    params = [n for n, _ in model.module.named_parameters() if n not in big]
    assert seeded_part == f"seeded (seed 0): {', '.join(params[:3])} and {len(params) - 3} more"
    buffers = [n for n, _ in model.module.named_buffers()]
    assert any("rotary" in b for b in buffers)
    assert computed == f"computed by the model's code: {', '.join(buffers)}"
    first = result.settings[0].first
    assert first is not None and "lm_head" in first.message
    seeded = value_ranges(model, ["amp-fp32"], device_type="cpu", amp_dtype="fp16")
    assert seeded.ok and seeded.weights == f"seeded random weights (seed 0); {computed}"


def test_too_large_for_memory_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import ampgraph.ranges.weights as W

    monkeypatch.setattr(W, "available_memory", lambda device: 1000)
    module, x = blowup()
    with pytest.raises(RangesError, match=r"^ranges runs blowup in fp32 on the CPU: about .* GB"):
        value_ranges(ModelInputs("blowup", module, (x,)), ["fp32"], device_type="cpu")


# -- the command --------------------------------------------------------------------------------


def test_cli_text_json_and_fail_on() -> None:
    args = ["ranges", "--module", "tests/test_ranges.py:blowup", "--device", "cpu",
            "--amp-dtype", "fp16", "-s", "amp-fp32", "-s", "fp32"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "amp-fp32 OVERFLOWS" in out.output and "first: linear in fc2" in out.output
    data = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    assert (data["schema"], data["version"]) == ("ampgraph.ranges", 1)
    amp = data["settings"][0]
    assert amp["first"]["node"] == "linear_1" and amp["first"]["severity"] == "error"
    assert math.isclose(amp["first"]["value"], 768000.0)
    failed = CliRunner().invoke(main, [*args, "--fail-on", "error"])
    assert failed.exit_code == 1 and "Error: values do not fit their dtype in amp-fp32" in (
        failed.output
    )
    md = CliRunner().invoke(main, [*args, "--format", "markdown"]).output
    assert md.startswith("### Value ranges") and "| `amp-fp32`" in md
    sarif = json.loads(CliRunner().invoke(main, [*args, "--format", "sarif"]).output)
    (run,) = sarif["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["overflow"]
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "tests/test_ranges.py"
    }


class TiedView(nn.Module):
    """A weight read as it is and through views: each view's range is its own values'."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.arange(-6.0, 6.0).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.t() + self.w.t()[:2].sum()


def test_views_of_a_weight_have_their_own_values_ranges() -> None:
    module = TiedView()
    result = value_ranges(ModelInputs("tied", module, (torch.ones(2, 4),)), ["fp32"],
                          device_type="cpu")  # fmt: skip
    w = module.w.detach()
    for node in result.nodes:
        out = node.outputs[0] if node.outputs else None
        if node.op.startswith(("aten.t.", "aten.permute")) and out is not None:
            assert out.max_abs == 6.0 and out.zeros == 1
        if node.op.startswith("aten.slice") and out is not None:
            assert out.max_abs == float(w.t()[:2].abs().max())


def test_overlay_colours_each_box_by_its_headroom(tmp_path: Any) -> None:
    from ampgraph.render.range_overlay import BANDS, overlay_sources

    args = ["ranges", "--module", "tests/test_ranges.py:tower", "--device", "cpu",
            "--amp-dtype", "fp16", "-s", "amp-fp32", "--overlay", str(tmp_path)]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    svg = (tmp_path / "tests-test_ranges.py-tower-amp-fp32-ranges.svg").read_text()
    assert svg.startswith("<?xml") and "headroom" in svg
    source = overlay_sources(_result("tower", ("amp-fp32",), "fp16"))["amp-fp32"]
    red, green = BANDS[0][3], BANDS[-1][3]
    fc2 = source[source.index('"module/layers.3.fc2"') :].split("\n", 1)[0]
    assert f'fillcolor="{red}"' in fc2 and 'xlabel="-0.2"' in fc2
    fc1 = source[source.index('"module/layers.3.fc1"') :].split("\n", 1)[0]
    assert f'fillcolor="{green}"' in fc1


def test_an_overlay_is_titled_as_asked(tmp_path: Any) -> None:
    """A figure for a reader says what it shows (docs/ranges.md's: "Tower ..."), not the spec's
    path: the title changes, the file's name (by the model) and every box stay as they were."""
    from ampgraph.render.range_overlay import overlay_sources, write_overlays

    result = _result("tower", ("amp-fp32",), "fp16")
    plain = overlay_sources(result)["amp-fp32"]
    titled = overlay_sources(result, title="Tower of residual blocks")["amp-fp32"]
    assert "tower — amp-fp32" in plain and "Tower of residual blocks — amp-fp32" in titled
    assert "tower" not in titled
    lines, titled_lines = plain.splitlines(), titled.splitlines()
    assert len(lines) == len(titled_lines)
    differ = [(a, b) for a, b in zip(lines, titled_lines) if a != b]
    assert differ and all("tower" in a and "Tower of residual blocks" in b for a, b in differ)
    (path,) = write_overlays(result, tmp_path, title="Tower of residual blocks")
    assert path.name == "tower-amp-fp32-ranges.svg"
    assert "<title>Tower of residual blocks</title>" in path.read_text()
