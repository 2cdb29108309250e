"""The training step: the backward's dtypes, gradients and saved tensors, against real CPU runs.

Each prediction here is proved two ways: by the dispatcher replay of the joint graph
(``report.backward.check``) and by a real eager training step on the CPU
(:func:`ampgraph.verify.training.verify_train`: ``.grad`` dtypes, what ``saved_tensors_hooks`` sees,
every backward op). The small modules are made for one behaviour each.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ampgraph.formats.verify import disagreement_lines
from ampgraph import analyze
from ampgraph.cli import main
from ampgraph.formats.markdown import markdown_train
from ampgraph.formats.text import backward_lines
from ampgraph.model.build import ModelInputs
from ampgraph.report.records import Report
from ampgraph.settings import Setting
from ampgraph.train.backward import LossError
from ampgraph.report.backward_ops import cast_pairs, gradient_origin
from ampgraph.report.memory import activation_bytes_by_dtype
from ampgraph.verify.training import verify_train
from tests.conftest import model

CPU_AMP = "autocast=on,device=cpu"


def cpu(name: str) -> Setting:
    return Setting.parse(name, device_type="cpu")


def proved(m: ModelInputs, setting: str | Setting, **options) -> Report:
    """The training-step analysis, after the dispatcher and a real CPU step agree with it."""
    report = analyze(m, setting, pass_="train", **options)
    assert report.backward is not None and report.backward.check is not None
    assert report.backward.check["disagreements"] == 0, report.backward.disagreements[:3]
    real = verify_train(m, setting, **options)
    assert real.ok, disagreement_lines(real)[:5]
    return report


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def two_linears() -> ModelInputs:
    return ModelInputs("two-linears", TwoLinears(), (torch.randn(4, 8),))


def test_fp32_parameters_get_fp32_gradients_cast_back_from_bf16() -> None:
    report = proved(two_linears(), CPU_AMP)
    bw = report.backward
    assert [(g.parameter, g.param_dtype, g.dtype) for g in bw.gradients] == [
        ("fc1.weight", "float32", "float32"), ("fc1.bias", "float32", "float32"),
        ("fc2.weight", "float32", "float32"), ("fc2.bias", "float32", "float32"),
    ]  # fmt: skip
    # autocast ran the Linears in bf16: their gradients are computed in bf16 and cast back
    assert {gradient_origin(bw, g) for g in bw.gradients} == {"cast from bf16"}
    mms = [n for n in bw.nodes if n.op == "aten.mm.default"]
    assert mms and all(n.outputs == ["bfloat16"] for n in mms)
    assert {n.forward for n in mms} == {"linear", "linear_1"}  # "the backward of fc1 / fc2"
    assert {n.module for n in mms} == {"fc1", "fc2"}


def test_saved_tensors_with_dtype_shape_bytes_and_kind() -> None:
    bw = proved(two_linears(), CPU_AMP).backward
    saved = [(t.module, t.kind, t.dtype, t.shape, t.bytes) for t in bw.saved]
    assert saved == [
        ("fc1", "activation", "bfloat16", [4, 8], 64),  # fc1's input, cast by autocast
        ("", "activation", "bfloat16", [4, 8], 64),  # relu's result
        ("fc2", "activation", "bfloat16", [4, 8], 64),  # fc2's input: relu's result again
        ("fc2", "parameter copy", "bfloat16", [8, 8], 128),  # fc2's weight, cast by autocast
    ]  # fc1's weight copy is not saved: fc1's input needs no gradient
    # relu's result is fc2's (cast-free) input: one storage, counted once
    assert activation_bytes_by_dtype(bw.saved) == {"bfloat16": 64 + 64 + 128}


def test_without_autocast_nothing_is_cast_and_16_bit_parameters_get_16_bit_gradients() -> None:
    for setting, dtype in (("fp32", "float32"), ("half", "bfloat16")):
        m = ModelInputs("two-linears", TwoLinears(), (torch.randn(4, 8, dtype=torch.bfloat16),))
        if setting == "fp32":
            m = two_linears()
        bw = proved(m, cpu(setting)).backward
        assert {g.dtype for g in bw.gradients} == {dtype}
        # the one cast: the loss's gradient, cast back to the dtype of the output it reduced
        loss_casts = {} if dtype == "float32" else {("float32", "bfloat16"): 1}
        assert cast_pairs(bw) == loss_casts
        casts = [n for n in bw.nodes if n.kind == "op" and n.op == "aten._to_copy.default"]
        assert [n.forward for n in casts] == [None] * len(loss_casts)
        assert {t.dtype for t in bw.saved} == {dtype}


class SharedWeight(nn.Module):
    """One Linear called twice: autocast casts its weight once and reuses the copy."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


def test_autocasts_weight_cache_saves_one_copy_of_a_weight_used_twice() -> None:
    bw = proved(ModelInputs("shared", SharedWeight(), (torch.randn(4, 8),)), CPU_AMP).backward
    copies = [t for t in bw.saved if t.kind == "parameter copy"]
    assert len(copies) == 1  # the first call's input needs no gradient: its weight is not saved
    casts = [n for n in bw.nodes if n.op == "aten._to_copy.default" and n.outputs == ["float32"]]
    assert len({n.forward for n in casts}) >= 1


class MixedLayerNorm(nn.Module):
    """A bf16 activation into an fp32 LayerNorm: CPU autocast has no entry for layer_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.fc(x))


def test_cpu_mixed_layer_norm_saves_fp32_statistics_as_the_real_kernel_does() -> None:
    """The fake kernel says bf16 mean and rstd; the CPU kernel returns fp32 (read off it here)."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], torch.ones(8), torch.zeros(8), 1e-5)
    assert (mean.dtype, rstd.dtype) == (torch.float32, torch.float32)
    bw = proved(ModelInputs("mixed-ln", MixedLayerNorm(), (torch.randn(4, 8),)), CPU_AMP).backward
    stats = [t for t in bw.saved if t.module == "ln" and t.shape == [4, 1]]
    assert [t.dtype for t in stats] == ["float32", "float32"]


class Fp32Island(nn.Module):
    """Seed 002's fp32 wrapper: a matmul with autocast disabled around it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        with torch.autocast("cpu", enabled=False):
            return y.float() @ self.w


def island() -> ModelInputs:
    return ModelInputs("island", Fp32Island(), (torch.randn(4, 8),))


def test_backward_inside_autocast_runs_an_fp32_islands_backward_in_bf16() -> None:
    """The region disables autocast for the forward only: a backward called inside the outer
    context runs the island's matmuls in bf16 (a real CPU step shows the same)."""

    def island_mms(report: Report) -> list[tuple[str, list[str | None], int]]:
        return [
            (n.policy, n.outputs, len(n.casts))
            for n in report.backward.nodes
            if n.op == "aten.mm.default" and n.module == ""
        ]

    outside = proved(island(), CPU_AMP)
    inside = proved(island(), CPU_AMP, backward_autocast=True)
    assert island_mms(outside) == [(None, ["float32"], 0)] * 2
    assert island_mms(inside) == [("lower_precision_fp", ["bfloat16"], 2)] * 2
    assert inside.backward.autocast and not outside.backward.autocast


class Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def test_a_training_step_runs_in_training_mode_and_saves_dropouts_mask() -> None:
    m = ModelInputs("dropout", Dropout().eval(), (torch.randn(4, 8),))
    bw = proved(m, CPU_AMP).backward
    # the CPU's dropout multiplies by a random mask of the input's dtype, and saves it
    assert [(t.module, t.dtype, t.shape) for t in bw.saved if t.module == "drop"] == [
        ("drop", "bfloat16", [4, 8]),
    ]
    assert not m.module.training  # the user's module is left in its mode


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_a_tied_parameter_has_one_gradient_under_its_first_name() -> None:
    m = ModelInputs("tied", Tied(), (torch.zeros(2, 3, dtype=torch.long),))
    bw = proved(m, CPU_AMP).backward
    assert [(g.parameter, g.dtype) for g in bw.gradients] == [("embed.weight", "float32")]


# -- which output the loss reduces ----------------------------------------------------------------
class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"ids": x.argmax(-1), "a": self.a(x), "b": self.b(x)}


def test_loss_picks_an_output_by_key_or_index_default_the_first_floating() -> None:
    m = ModelInputs("two", TwoOutputs(), (torch.randn(2, 4),))

    def grads(**options) -> list[str]:
        bw = analyze(m, CPU_AMP, pass_="backward", check=False, **options).backward
        return [g.parameter for g in bw.gradients if g.dtype is not None]

    assert grads() == ["a.weight", "a.bias"]
    assert grads(loss="b") == ["b.weight", "b.bias"]
    assert grads(loss=2) == ["b.weight", "b.bias"]
    with pytest.raises(LossError, match="--loss 'ids' is not a floating-point tensor"):
        grads(loss="ids")
    with pytest.raises(LossError, match="give one of ids, a, b"):
        grads(loss="c")


class KeyedOutput(dict):
    """A return type registered without key paths, as transformers < 4.50 registers
    ``ModelOutput``: its keys are in the pytree spec's context only."""


torch.utils._pytree.register_pytree_node(
    KeyedOutput,
    lambda o: (list(o.values()), list(o.keys())),
    lambda values, keys: KeyedOutput(zip(keys, values)),
)


class KeyedOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> KeyedOutput:
        return KeyedOutput(first=self.a(x), second=self.b(x))


def test_loss_names_outputs_of_a_type_registered_without_key_paths() -> None:
    m = ModelInputs("keyed", KeyedOutputs(), (torch.randn(2, 4),))
    bw = analyze(m, CPU_AMP, pass_="backward", check=False, loss="second").backward
    assert [g.parameter for g in bw.gradients if g.dtype is not None] == ["b.weight", "b.bias"]


class NoFloat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)


def no_float() -> tuple[nn.Module, torch.Tensor]:
    return NoFloat(), torch.randn(2, 4)


def test_a_model_without_a_floating_output_is_one_line_naming_loss() -> None:
    result = CliRunner().invoke(
        main, ["table", "--module", "tests.test_backward:no_float", "--pass", "train",
               "--device", "cpu", "-s", "amp-fp32"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.output.startswith("Error: the output of ")
    assert "give --loss KEY|INDEX naming one" in result.output
    assert len(result.output.splitlines()) == 1


def test_loss_without_a_backward_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["table", "--loss", "logits"])
    assert result.exit_code == 2
    assert "--loss needs --pass backward or --pass train" in result.output


# -- the report ----------------------------------------------------------------------------------
def test_the_report_round_trips_and_version_1_reports_still_read() -> None:
    report = analyze(two_linears(), CPU_AMP, pass_="train")
    data = json.loads(report.to_json())
    assert (data["version"], data["pass"]) == (2, "train")
    again = Report.from_dict(data)
    assert again.backward.to_dict() == report.backward.to_dict()
    old = {k: v for k, v in data.items() if k not in ("pass", "backward")}
    old["version"] = 1
    old["nodes"] = [{k: v for k, v in n.items() if k != "forward"} for n in old["nodes"]]
    legacy = Report.from_dict(old)
    assert legacy.pass_ == "forward" and legacy.backward is None
    assert [n.outputs for n in legacy.nodes] == [n.outputs for n in report.nodes]


def test_a_wrong_backward_prediction_is_caught_by_the_dispatcher() -> None:
    """Tamper with the joint graph's prediction: the replay with real kernels disagrees."""
    from ampgraph.capture.trace import capture
    from ampgraph.train.backward import backward_section, trace_joint
    from ampgraph.train.joint_check import check_backward

    trace = trace_joint(capture(island(), cpu("amp-fp32"), training=True), backward_autocast=True)
    bw = backward_section(trace)
    mm = next(n for n in bw.nodes if n.op == "aten.mm.default" and n.policy)
    mm.outputs = ["float32"]  # as if the tables had no CPU entry for mm
    summary = check_backward(trace, bw)
    assert summary["disagreements"] == 1
    assert bw.disagreements == [mm] and mm.check["dispatcher"] == {"outputs": ["bfloat16"]}


# -- bundled models --------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["fp32", "half", "amp-half", "amp-fp32"])
def test_llama_tiny_training_step_on_cpu_backward_inside_autocast(setting: str) -> None:
    result = verify_train(model("llama-tiny"), cpu(setting), backward_autocast=True)
    assert result.ok, disagreement_lines(result)[:5]
    assert result.gradients.total == 21 and result.saved.total > 80


def test_the_training_oracle_saves_what_a_plain_eager_step_saves() -> None:
    """verify's real step takes the branch a plain eager step takes (no ampgraph around it):
    transformers drops llama-tiny's all-ones mask, so SDPA saves its 2 key/value heads, not the
    8 a mask makes it repeat, and no [1, 1, 8, 8] mask is saved; the prediction agrees."""
    from torch.utils import _pytree as pytree

    from ampgraph.model.build import load_model
    from ampgraph.verify.training import run_step

    fresh = load_model("llama-tiny")  # its own copy: the module is made real below
    mask = fresh.kwargs["attention_mask"]
    assert not mask.is_meta and bool((mask == 1).all())
    module = fresh.module.to_empty(device="cpu").train()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen) * 0.02)
    saved: list[tuple[str, list[int]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((str(t.dtype).removeprefix("torch."), list(t.shape)))
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # fmt: skip
        out = module(*fresh.args, **fresh.kwargs)
        logits = next(v for v in pytree.tree_leaves(out) if isinstance(v, torch.Tensor))
        logits.float().sum().backward()
    setting = cpu("amp-fp32")
    oracle = run_step(fresh, setting, "logits", torch.device("cpu"))
    assert [(t.dtype, t.shape) for t in oracle.saved] == saved
    assert ("bfloat16", [1, 2, 8, 32]) in saved and [1, 1, 8, 8] not in [s for _, s in saved]
    result = verify_train(model("llama-tiny"), setting)
    assert result.ok and result.saved.total == len(saved), disagreement_lines(result)[:5]


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["fp32", "half", "amp-half", "amp-fp32"])
def test_opt_125m_training_step_on_cpu(setting: str) -> None:
    """OPT-125M's real training step agrees with the prediction in the seed's four settings."""
    result = verify_train(model("opt-125m"), cpu(setting))
    assert result.ok, disagreement_lines(result)[:5]
    assert result.gradients == result.gradients.__class__(196, 196)
    assert result.saved.agree == result.saved.total > 350
    assert result.backward_ops.agree == result.backward_ops.total > 300


def test_cli_table_markdown_for_the_training_step() -> None:
    result = CliRunner().invoke(main, [
        "table", "llama-tiny", "--pass", "train", "--device", "cpu", "-s", "amp-fp32",
        "--format", "markdown", "--no-check",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "| module | activations fp32 | activations bf16 | parameter copies | total |" in out
    assert "| `model.layers.0` |" in out and "| `model.layers.1` |" in out
    assert "| fp32 | fp32 | cast from bf16 |" in out
    assert "Backward ops in 16 bits: " in out


def test_cli_check_and_table_for_the_backward() -> None:
    result = CliRunner().invoke(main, [
        "check", "tests.test_backward:two_linears_factory", "--pass", "backward", "--device",
        "cpu", "-s", "amp-fp32", "--backward-in-autocast",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("two-linears amp-fp32 backward (cpu bf16, inside autocast): ")
    assert result.output.rstrip().endswith("nodes compared with the dispatcher, 0 disagreements")
    result = CliRunner().invoke(main, [
        "table", "tests.test_backward:two_linears_factory", "--pass", "backward", "--device",
        "cpu", "-s", "amp-fp32",
    ])  # fmt: skip
    lines = result.output.splitlines()
    assert lines[1] == "# gradients: 4 parameters, fp32 -> fp32 x4"
    assert lines[3].startswith("[fc2] backward: 16-bit ops mm x2, sum; casts bf16->fp32 x2")


def test_cli_verify_train_on_cpu(tmp_path) -> None:
    path = tmp_path / "record.json"
    result = CliRunner().invoke(main, [
        "verify", "tests.test_backward:two_linears_factory", "--pass", "train", "--device",
        "cpu", "-s", "amp-fp32", "--record", str(path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    forward, train = result.output.splitlines()[:2]
    assert forward.endswith("0 disagreements") and " train on " in train
    assert train.endswith("gradients 4/4, saved 4/4, memory 1/1, backward ops 12/12 agree; "
                          "0 disagreements")  # fmt: skip
    assert [r.get("pass", "forward") for r in json.loads(path.read_text())["results"]] == [
        "forward",
        "train",
    ]


def two_linears_factory() -> ModelInputs:
    return two_linears()


def test_backward_lines_name_the_forward_module_of_each_backward() -> None:
    report = analyze(two_linears(), CPU_AMP, pass_="backward", check=False)
    lines = backward_lines(report)
    assert [line.split("]")[0] + "]" for line in lines[3:]] == ["[fc2]", "[(root)]", "[fc1]"]
    assert "Saved for backward: activations" in markdown_train(report)
