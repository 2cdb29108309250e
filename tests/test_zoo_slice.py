"""A slice of the transformers zoo (scripts/zoo.py, docs/zoo.md) in the suite (issue 42).

Each model type's tiny config and inputs come from transformers' own tests (its ``*ModelTester``,
or the generic ``CausalLMModelTester``) or, for a type without one, the zoo's generic tester
(``scripts/zoo_generic.py``: the config's defaults shrunk, inputs from the forward signature),
exported by ``scripts/zoo.py --export-slice`` into ``tests/data/zoo_slice.json`` so that the
suite needs no transformers checkout. Each is analysed and must be exact: every node as the
dispatcher says, every hook line as the eager model's own forward hooks on fake CUDA tensors
running the real autocast kernels, and (one setting) every node, module and cast as a real CPU
autocast run. Expectations are those oracles' output, never ampgraph's own. One setting per type
runs in the quick suite; the rest are marked slow.
"""

from __future__ import annotations

import pytest

from ampgraph.formats.verify import disagreement_lines
from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify.hooks import eager_hook_lines

from .conftest import ROOT, load_file

pytest.importorskip("transformers", reason="needs transformers")

ZOO_SLICE = load_file(ROOT / "scripts" / "zoo_slice.py")
SLICE = ZOO_SLICE.load_slice()
#: The combination the zoo's full run covers (docs/zoo.md): autocast over fp32 parameters, bf16.
QUICK = ("amp-fp32", "bf16")


def build(name: str) -> ModelInputs:
    """``name``'s base model from its exported tiny config, with its exported inputs."""
    return ZOO_SLICE.build(name, SLICE[name])


def _cases() -> list[object]:
    return [
        pytest.param(name, setting, amp, id=f"{name}-{setting}-{amp}",
                     marks=[] if (setting, amp) == QUICK else [pytest.mark.slow])
        for name in SLICE
        for amp in ("bf16", "fp16")
        for setting in ("fp32", "half", "amp-half", "amp-fp32")
    ]  # fmt: skip


def test_the_slice_is_transformers_own_testers() -> None:
    """Every entry names the tester it came from (its own, transformers' causal LM one, or the
    zoo's generic tester: both kinds are in the slice), and the config is a real tiny one."""
    assert len(SLICE) >= 4
    sources = {entry["tester"].split(" ")[0] for entry in SLICE.values()}
    assert "generic" in sources and any(s.startswith("tests/") for s in sources), sources
    for name, entry in SLICE.items():
        assert entry["tester"].startswith(("tests/", "generic tester")), name
        assert entry["config"]["model_type"] == name
        assert build(name).module.num_parameters() < 200_000, name


@pytest.mark.parametrize(("name", "setting_name", "amp"), _cases())
def test_zoo_type_agrees_with_the_dispatcher_and_the_eager_hooks(
    name: str, setting_name: str, amp: str
) -> None:
    model, setting = build(name), Setting.parse(setting_name, amp_dtype=amp)
    report = analyze(model, setting)
    assert report.check is not None and report.check["compared"] > 0, report.check
    assert report.check["disagreements"] == 0, report.check
    lines = hook_lines(report)
    eager = eager_hook_lines(build(name), setting, report.capture.get("unbacked_values"))
    assert lines == eager
    assert lines


@pytest.mark.parametrize("name", sorted(SLICE))
def test_zoo_type_verifies_on_the_cpu(name: str) -> None:
    """``verify --device cpu`` in the zoo's combination: real CPU kernels agree everywhere."""
    from ampgraph.verify import verify

    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bf16")
    result = verify(build(name), setting, device="cpu")
    counts = result.agreement()
    assert counts["nodes"].total > 0
    assert not result.disagreements, disagreement_lines(result)[:3]


def test_a_type_beyond_the_slice_comes_from_the_generic_tester() -> None:
    """The GPU survey's ``--zoo`` takes any model type: one not in the slice is built by the zoo's
    generic tester (no transformers checkout), tiny, and verifies on the CPU's real kernels."""
    from ampgraph.verify import verify

    assert "beit" not in SLICE
    model = ZOO_SLICE.model("beit")
    assert model.module.config.hidden_size == 32 and model.module.num_parameters() < 200_000
    assert sorted(model.kwargs) == ["pixel_values"]
    setting = Setting.parse("amp-fp32", device_type="cpu", amp_dtype="bf16")
    result = verify(model, setting, device="cpu")
    assert result.agreement()["nodes"].total > 0
    assert not result.disagreements, disagreement_lines(result)[:3]
