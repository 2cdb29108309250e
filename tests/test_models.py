"""The model catalogue and model specs: bundled configs, config files, model folders, factories."""

from __future__ import annotations

import importlib.util
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ampgraph import Setting, analyze
from ampgraph.cli import main
from ampgraph.errors import ModelSpecError
from ampgraph.model.build import bundled_models, catalogue, load_model
from ampgraph.model.specs import ALIASES, ModelSpec

#: Each bundled config against the published size of the model it is shaped like.
PUBLISHED = {
    "bert-base-uncased": ("BertForMaskedLM", "12", "109.5M"),
    "gpt2": ("GPT2LMHeadModel", "12", "124.4M"),
    "llama-3-70b": ("LlamaForCausalLM", "80", "70.6B"),
    "llama-3-8b": ("LlamaForCausalLM", "32", "8.0B"),
    "llama-tiny": ("LlamaForCausalLM", "2", "1.9M"),
    "mistral-7b": ("MistralForCausalLM", "32", "7.2B"),
    "opt-1.3b": ("OPTForCausalLM", "24", "1.3B"),
    "opt-125m": ("OPTForCausalLM", "12", "125.2M"),
    "opt-350m": ("OPTForCausalLM", "24", "331.2M"),
    "phi-2": ("PhiForCausalLM", "32", "2.8B"),
    "pythia-160m": ("GPTNeoXForCausalLM", "12", "162.3M"),
    "qwen2-0.5b": ("Qwen2ForCausalLM", "24", "494.0M"),
    "t5-small": ("T5ForConditionalGeneration", "6+6", "60.5M"),
}
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
LINEAR = "def make():\n    return nn.Linear(4, 2), torch.randn(3, 4)\n"


def factory_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "made.py"
    path.write_text("import torch\nfrom torch import nn\nfrom ampgraph import ModelInputs\n" + body)
    return str(path)


def test_catalogue_matches_the_published_models() -> None:
    """Every bundled config builds on meta, with the class, depth and size of its namesake."""
    found = {e.name: (e.architecture, e.layers, e.params_text) for e in catalogue()}
    expected = dict(PUBLISHED)
    if HAS_TORCHVISION:
        expected["resnet18"] = ("ResNet", "-", "11.7M")
    assert found == expected
    assert all(origin for origin in bundled_models().values())


def test_configs_name_the_model_they_are_shaped_like() -> None:
    for entry in resources.files("ampgraph.model.configs").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            assert {"_name_or_path", "model_type", "architectures"} <= set(data), entry.name


def test_opt_350m_is_post_layer_norm_with_projections() -> None:
    model = load_model("opt-350m").module
    decoder = model.model.decoder
    assert model.config.do_layer_norm_before is False
    assert (decoder.project_in.in_features, decoder.project_in.out_features) == (512, 1024)
    assert decoder.final_layer_norm is None


@pytest.mark.parametrize(
    ("spec", "inputs"),
    [
        ("opt-125m", {"input_ids", "attention_mask", "use_cache"}),
        ("bert", {"input_ids", "attention_mask", "token_type_ids"}),
        ("t5", {"input_ids", "attention_mask", "decoder_input_ids", "use_cache"}),
    ],
)
def test_inputs_follow_the_architecture(spec: str, inputs: set[str]) -> None:
    model = load_model(spec, seq_len=5)
    assert set(model.kwargs) == inputs
    tensors = [v for v in model.kwargs.values() if isinstance(v, torch.Tensor)]
    assert {(t.dtype, tuple(t.shape)) for t in tensors} == {(torch.int64, (1, 5))}


def test_aliases_name_bundled_models() -> None:
    assert set(ALIASES.values()) - {"resnet18"} <= set(bundled_models())
    assert load_model("T5").name == "t5-small"


def test_model_dir_reads_only_the_config(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    shutil.copy(resources.files("ampgraph.model.configs") / "llama-tiny.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"not weights")  # never opened
    model = load_model(ModelSpec(str(folder), "dir"))
    assert model.name == "my-llama" and type(model.module).__name__ == "LlamaForCausalLM"
    assert load_model(str(folder)).name == "my-llama"  # the positional MODEL recognises a folder


@pytest.mark.parametrize(
    ("kind", "make", "message"),
    [
        ("config", lambda p: p, "is a folder: use --model-dir"),
        ("config", lambda p: p / "nope.json", "config file"),
        ("dir", lambda p: p / "nope", "model folder"),
        ("dir", lambda p: p, "has no config.json: point --model-dir at a Hugging Face model"),
        ("module", lambda p: "no_such_package_xyz.mod:make", "cannot import"),
        ("module", lambda p: "just-a-name", "malformed factory"),
    ],
)
def test_bad_specs_are_one_line(tmp_path: Path, kind: str, make, message: str) -> None:
    with pytest.raises(ModelSpecError) as err:
        load_model(ModelSpec(str(make(tmp_path)), kind))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_architectures_pick_the_class(tmp_path: Path) -> None:
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "architectures": ["GPT2Model"]}))
    assert type(load_model(str(path)).module).__name__ == "GPT2Model"
    # A class transformers does not export (remote code) falls back to the Auto class.
    path.write_text(json.dumps({**config, "architectures": ["MyGPT2"], "auto_map": {"x": "y"}}))
    assert type(load_model(str(path)).module).__name__ == "GPT2LMHeadModel"


@pytest.mark.parametrize(
    ("body", "args", "kwargs"),
    [
        (LINEAR, 1, set()),
        (
            "def make():\n    return nn.Bilinear(4, 4, 2), (torch.randn(3, 4), torch.randn(3, 4))\n",
            2,
            set(),
        ),
        ("def make():\n    return nn.Linear(4, 2), {'input': torch.randn(3, 4)}\n", 0, {"input"}),
        (
            "def make():\n    return nn.Linear(4, 2), (), {'input': torch.randn(3, 4)}\n",
            0,
            {"input"},
        ),
        (
            "def make():\n    return ModelInputs('lin', nn.Linear(4, 2), (torch.randn(3, 4),))\n",
            1,
            set(),
        ),
    ],
)
def test_factory_forms(tmp_path: Path, body: str, args: int, kwargs: set[str]) -> None:
    spec = f"{factory_file(tmp_path, body)}:make"
    model = load_model(ModelSpec(spec, "module"))
    assert len(model.args) == args and set(model.kwargs) == kwargs
    report = analyze(model, Setting.parse("amp-fp32"))
    assert report.check is not None and report.check["disagreements"] == 0


def test_factory_with_a_bad_return_says_what_to_return(tmp_path: Path) -> None:
    spec = factory_file(tmp_path, "def make():\n    return 42\n") + ":make"
    with pytest.raises(ModelSpecError, match=r"must return \(module, example_inputs\)"):
        load_model(spec)


@pytest.mark.parametrize("spec", ["bert", "t5"])
def test_non_causal_models_agree_with_the_dispatcher(spec: str) -> None:
    report = analyze(load_model(spec), Setting.parse("amp-half", amp_dtype="fp16"))
    assert report.check is not None and report.check["compared"] > 300
    assert report.check["disagreements"] == 0 and report.errors == []


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision is not installed")
def test_resnet18_where_torchvision_is_installed() -> None:
    model = load_model("resnet18")
    report = analyze(model, Setting.parse("amp-fp32"))
    assert report.check is not None and report.check["disagreements"] == 0
    conv = next(c for c in report.modules if c.path == "conv1")
    assert (conv.in_dtype, conv.out_dtype) == ("float32", "bfloat16")


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision is installed")
def test_resnet18_without_torchvision_is_not_listed() -> None:
    assert "resnet18" not in bundled_models()
    with pytest.raises(ModelSpecError, match="needs torchvision: pip install torchvision"):
        load_model("resnet18")


@pytest.mark.slow
def test_llama_3_70b_captures_on_meta() -> None:
    from ampgraph.capture.trace import capture

    cap = capture(load_model("llama-3-70b"), Setting.parse("amp-fp32"))
    assert len(cap.graph_module.graph.nodes) > 5000


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_models_command_lists_class_layers_and_size() -> None:
    code, out = run("models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "architecture", "layers", "params", "origin"]
    assert any(
        line.split()[:4] == ["llama-3-70b", "LlamaForCausalLM", "80", "70.6B"] for line in lines
    )


@pytest.mark.parametrize(
    "args",
    [
        ["gpt2", "--config", "x.json"],
        ["--config", "x.json", "--model-dir", "d"],
        ["--module", "a.b:c", "gpt2"],
    ],
)
def test_two_models_are_a_usage_error(args: list[str]) -> None:
    code, out = run("table", *args)
    assert code == 2 and "give one model, not" in out


def test_explicit_model_options(tmp_path: Path) -> None:
    config = resources.files("ampgraph.model.configs") / "llama-tiny.json"
    code, out = run("table", "--config", str(config), "-s", "amp-fp32", "--only", "Embedding")
    assert code == 0 and out.strip() == "[model.embed_tokens] in=torch.int64 -> out=torch.float32"
    code, out = run("table", "--model-dir", str(tmp_path), "-s", "fp32")
    assert code == 1 and "has no config.json" in out
    spec = factory_file(tmp_path, LINEAR) + ":make"
    code, out = run("table", "--module", spec, "-s", "amp-fp32")
    assert code == 0 and out.strip().endswith("in=torch.float32 -> out=torch.bfloat16")


def test_module_help_says_how_to_give_inputs() -> None:
    code, out = run("table", "--help")
    assert code == 0
    assert "(module, example_inputs)" in " ".join(out.split()) and "--tracer" in out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hidden_size": -4}, "invalid llama config: ValueError: The hidden size (-4)"),
        ({"num_attention_heads": 3}, "is not a multiple of the number of attention heads (3)"),
        ({"hidden_size": "64"}, "Field 'hidden_size' expected int, got str"),
        ({"hidden_size": 64.5}, "Field 'hidden_size' expected int, got float"),
        ({"vocab_size": 0}, "the config's vocab_size is 0: a model needs at least 1"),
        ({"num_hidden_layers": 0}, "the config's num_hidden_layers is 0"),
        ({"num_hidden_layers": 100_000}, "has 100000 layers, more than any published model"),
    ],
)
def test_configs_beyond_reason_are_one_line(tmp_path: Path, config: dict, message: str) -> None:
    base = json.loads((resources.files("ampgraph.model.configs") / "llama-tiny.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **config}))
    with pytest.raises(ModelSpecError) as err:
        load_model(ModelSpec(str(path), "config"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_force_lets_a_huge_config_through_the_estimate() -> None:
    from ampgraph.model.build import check_work

    check_work({"num_hidden_layers": 100_000}, force=True)  # no refusal


def test_seq_len_beyond_the_models_positions_is_refused() -> None:
    with pytest.raises(ModelSpecError, match="longer than opt-125m's 2048 positions"):
        load_model("opt-125m", seq_len=4096)


def test_a_factory_that_exits_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "exits.py").write_text("import sys\ndef build():\n    sys.exit(3)\n")
    with pytest.raises(ModelSpecError, match=r"called sys.exit\(3\)"):
        load_model(ModelSpec(f"{tmp_path / 'exits.py'}:build", "module"))


def test_analyze_says_what_it_takes() -> None:
    from ampgraph.errors import SettingError

    module, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    for bad in (None, 42, {}, torch.bfloat16, ["amp-fp32"]):
        with pytest.raises(SettingError, match="a setting is a name such as"):
            analyze(module, bad, args=(x,))
    with pytest.raises(TypeError, match="analyze\\(\\) takes a model spec"):
        analyze(None)
    with pytest.raises(SettingError, match="gives autocast twice"):
        Setting.parse("autocast=on,autocast=off")
    # a bare tensor is one input, not a tuple of its rows
    assert analyze(module, "amp-fp32", args=x).modules[0].in_dtype == "float32"
    assert analyze("llama-tiny", "fp32", check=False).model == "llama-tiny"
