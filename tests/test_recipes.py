"""Recipes against the frameworks themselves: each one's own mixed-precision code path, on the CPU.

Every test runs a framework (Accelerate, the HF Trainer, Lightning's Trainer and Fabric, FSDP2's
``fully_shard`` and FSDP1 on a one-process gloo group) on a small module with forward hooks on
its leaves, and compares the hook lines, the output dtype and the ``.grad`` dtypes with what
ampgraph predicts for the recipe's CPU setting. A missing framework skips its tests with the
reason; the CI installs the ``test`` extra, so they run there. DeepSpeed does not run on this
CPU (it needs its compiled ops and an accelerator); its mapping is tested against its config
semantics read from the 0.19.8 source, see docs/recipes.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ampgraph import Setting, SettingError, analyze
from ampgraph.recipes import Recipe, parse_recipe
from ampgraph.settings import short_dtype


class Block(nn.Module):
    """Linear, residual add, LayerNorm, matmul, softmax, Linear: the ops autocast treats apart."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc1(x) + x)
        attn = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        return self.fc2(attn @ h)


def example() -> torch.Tensor:
    return torch.randn(2, 3, 8)


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs = {
    name: pytest.mark.skipif(not has(name), reason=f"{name} is not installed (pip install {name})")
    for name in ("accelerate", "transformers", "lightning")
}


def record(model: nn.Module, lines: list[str], prefix: str = "") -> None:
    """The seed notebook's hook on every leaf, its path relative to ``prefix``."""
    for path, module in model.named_modules():
        if path.startswith(prefix) and path != prefix.rstrip(".") and not list(module.children()):

            def hook(_m: nn.Module, inp: Any, out: Any, path: str = path) -> None:
                lines.append(f"[{path.removeprefix(prefix)}] in={inp[0].dtype} -> out={out.dtype}")

            module.register_forward_hook(hook)


def predict(recipe: Recipe) -> tuple[list[str], str, list[str]]:
    """ampgraph's hook lines, output dtype and gradient dtypes for the recipe on the CPU, from
    the fp32 inputs the user gives: the recipe's setting casts them, and the output, itself."""
    report = analyze(Block(), recipe.setting, args=(example(),), pass_="train", check=False)
    output = next(n for n in report.nodes if n.kind == "output").outputs[0]
    assert output is not None and report.backward is not None
    return (
        [m.hook_line() for m in report.modules],
        output,
        sorted({g.dtype or "-" for g in report.backward.gradients}),
    )


def check(recipe: Recipe, lines: list[str], out: torch.Tensor, grads: list[torch.dtype]) -> None:
    expected_lines, expected_out, backward = predict(recipe)
    assert lines == expected_lines
    assert str(out.dtype).removeprefix("torch.") == expected_out
    # What the backward makes is the setting's parameter dtype; .grad is the recipe's.
    assert backward == [recipe.setting.param_dtype]
    assert {str(g).removeprefix("torch.") for g in grads} == {recipe.grad_dtype}


# --- Hugging Face Accelerate and Trainer -------------------------------------------------------


@needs["accelerate"]
@pytest.mark.parametrize("mode", ["bf16", "fp16", "no"])
def test_accelerate(mode: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    recipe = parse_recipe(f"accelerate:{mode}", device_type="cpu")
    model, lines = Block(), []
    record(model, lines)
    acc = Accelerator(cpu=True, mixed_precision=mode)
    model, _opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out = model(example())
    acc.backward(out.float().sum())
    check(recipe, lines, out, [p.grad.dtype for p in model.parameters()])
    assert recipe.setting.autocast == (mode == "bf16")  # fp16 on the CPU: plain fp32
    AcceleratorState._reset_state(True)


class HFBlock(nn.Module):
    """Block with the Trainer's calling convention: keyword inputs, a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Block()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        out = self.net(x)
        self.seen.append(out)
        return {"loss": out.float().sum(), "logits": out}


@needs["transformers"]
@needs["accelerate"]
@pytest.mark.parametrize("flag", ["bf16", "fp16"])
def test_hf_trainer(flag: str, tmp_path: Path) -> None:
    from accelerate.state import AcceleratorState
    from transformers import Trainer, TrainingArguments

    AcceleratorState._reset_state(True)
    recipe = parse_recipe(f"hf:{flag}", device_type="cpu")
    model, lines, grads = HFBlock(), [], []
    record(model, lines, prefix="net.")
    for p in model.parameters():
        p.register_hook(lambda g: grads.append(g.dtype))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        **{flag: True},
    )
    data = [{"x": torch.randn(3, 8), "labels": torch.zeros(())} for _ in range(2)]
    Trainer(model=model, args=args, train_dataset=data).train()
    # The Trainer's wrapped forward returns the outputs converted to fp32 (dicts included).
    expected_lines, _, backward = predict(recipe)
    assert lines == expected_lines
    assert backward == [recipe.setting.param_dtype] and set(grads) == {torch.float32}
    AcceleratorState._reset_state(True)


# --- Lightning: Trainer and Fabric -------------------------------------------------------------


def cpu_trainer(precision: str) -> Any:
    """A Lightning Trainer for one step on the CPU in ``precision``, with nothing written."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def lightning_run(precision: str) -> tuple[list[str], torch.Tensor, list[torch.dtype]]:
    import lightning as L

    lines: list[str] = []
    seen: dict[str, Any] = {}

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Block()

        def training_step(self, batch: torch.Tensor, _i: int) -> torch.Tensor:
            seen["out"] = out = self.net(batch)
            return out.float().sum()

        def on_after_backward(self) -> None:
            seen["grads"] = [p.grad.dtype for p in self.parameters()]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    record(module, lines, prefix="net.")
    trainer = cpu_trainer(precision)
    loader = torch.utils.data.DataLoader([example()[0] for _ in range(2)], batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 16-mixed on the CPU warns; the test checks the effect
        trainer.fit(module, loader)
    return lines, seen["out"], seen["grads"]


@needs["lightning"]
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_lightning_trainer(precision: str) -> None:
    recipe = parse_recipe(f"lightning:{precision}", device_type="cpu")
    check(recipe, *lightning_run(precision))


@needs["lightning"]
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_lightning_fabric(precision: str) -> None:
    from lightning.fabric import Fabric

    recipe = parse_recipe(f"fabric:{precision}", device_type="cpu")
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    model, lines = Block(), []
    record(model, lines)
    wrapped = fabric.setup_module(model)
    out = wrapped(example())
    fabric.backward(out.float().sum())
    check(recipe, lines, out, [p.grad.dtype for p in model.parameters()])


def test_lightning_64_true_is_refused_with_what_to_write() -> None:
    with pytest.raises(SettingError, match="float64.*lightning:32-true"):
        parse_recipe("lightning:64-true")


# --- FSDP2 and FSDP1 on a one-process gloo group -----------------------------------------------


@pytest.fixture(scope="module")
def gloo() -> Iterator[None]:
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


FSDP_POLICIES = {
    "param_dtype=bf16,reduce_dtype=fp32": {
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
    },
    "param_dtype=bf16,output_dtype=fp32": {
        "param_dtype": torch.bfloat16,
        "output_dtype": torch.float32,
    },
    "param_dtype=fp16,cast_forward_inputs=false": {
        "param_dtype": torch.float16,
        "cast_forward_inputs": False,
    },
}


@pytest.mark.parametrize("spelling", list(FSDP_POLICIES))
def test_fsdp2(spelling: str, gloo: None) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    recipe = parse_recipe(f"fsdp2:{spelling}", device_type="cpu")
    model, lines = Block(), []
    record(model, lines)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(**FSDP_POLICIES[spelling]))
    if recipe.input_cast is None:
        # FSDP2 leaves fp32 inputs alone, and they meet fp16 weights: the run raises, with the
        # message ampgraph predicts at the node that raises.
        report = analyze(Block(), recipe.setting, args=(example(),), check=False)
        (error,) = [n.error for n in report.nodes if n.error]
        with pytest.raises(RuntimeError, match=error):
            model(example())
        return
    out = model(example())
    out.float().sum().backward()
    check(recipe, lines, out, [p.grad.dtype for p in model.parameters()])


def test_fsdp1(gloo: None) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

    recipe = parse_recipe("fsdp1:param_dtype=bf16,reduce_dtype=fp32", device_type="cpu")
    model, lines = Block(), []
    record(model, lines)
    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one rank: FSDP says it uses NO_SHARD
        wrapped = FullyShardedDataParallel(
            model, mixed_precision=policy, device_id=torch.device("cpu")
        )
    out = wrapped(example())
    out.float().sum().backward()
    check(recipe, lines, out, [p.grad.dtype for p in wrapped.parameters()])


# --- Where the recipes differ: FSDP2's bf16 parameters against Accelerate's autocast -----------


def test_fsdp2_and_accelerate_bf16_differ_where_ampgraph_says() -> None:
    """The two bf16 recipes users mix up: the hook lines of each are proved above against the
    framework; here is where they differ, module by module and op by op."""
    fsdp2 = parse_recipe("fsdp2:param_dtype=bf16,reduce_dtype=fp32", device_type="cpu")
    acc = parse_recipe("accelerate:bf16", device_type="cpu")
    a, out_a, grads_a = predict(fsdp2)
    b, out_b, grads_b = predict(acc)
    differ = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    # Under autocast fc1 takes the fp32 input, and the residual add of its bf16 output and that
    # fp32 input promotes to fp32, so LayerNorm (no CPU autocast rule) runs in fp32.
    assert differ == [
        (
            "[fc1] in=torch.bfloat16 -> out=torch.bfloat16",
            "[fc1] in=torch.float32 -> out=torch.bfloat16",
        ),
        (
            "[norm] in=torch.bfloat16 -> out=torch.bfloat16",
            "[norm] in=torch.float32 -> out=torch.float32",
        ),
    ]
    ops = {}
    for recipe in (fsdp2, acc):
        report = analyze(Block(), recipe.setting, args=(example(),), check=False)
        ops[recipe.family] = {n.name: n.out_dtype for n in report.nodes if n.kind == "op"}
    changed = {k for k in ops["fsdp2"].keys() & ops["accelerate"].keys()}
    assert {k for k in changed if ops["fsdp2"][k] != ops["accelerate"][k]} == {
        "add",
        "layer_norm",
        "transpose",
    }
    # Accelerate's convert_outputs_to_fp32 is a node of its graph: the cast of the bf16 logits.
    assert ops["accelerate"].keys() - ops["fsdp2"].keys() == {"to"}
    assert ops["accelerate"]["to"] == "float32"
    # Outputs: FSDP2 returns bf16, Accelerate converts to fp32. Gradients: the backward makes
    # bf16 ones under FSDP2 (cast to fp32 for the reduce and .grad), fp32 ones under autocast.
    assert (out_a, out_b, grads_a, grads_b) == ("bfloat16", "float32", ["bfloat16"], ["float32"])
    assert fsdp2.grad_dtype == acc.grad_dtype == "float32"


BLOCK_FACTORY = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = self.norm(self.fc1(x) + x)
        attn = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        return self.fc2(attn @ h)


def build():
    return Block(), torch.randn(2, 3, 8)
"""


def test_cli_diff_of_two_recipes_names_the_ops_and_the_gradients(tmp_path: Path) -> None:
    """``ampgraph diff --recipe A --recipe B``: each side's recipe, its gradient and optimizer
    dtypes on stderr, and on stdout every op whose dtypes differ between the two analyses
    (each proved against its framework above), the output cast included."""
    from click.testing import CliRunner

    from ampgraph.cli import main

    (tmp_path / "blk.py").write_text(BLOCK_FACTORY)
    fsdp2, acc = "fsdp2:param_dtype=bf16,reduce_dtype=fp32", "accelerate:bf16"
    result = CliRunner().invoke(
        main,
        ["--no-cache", "diff", "--module", f"{tmp_path / 'blk.py'}:build", "--device", "cpu"]
        + ["--recipe", fsdp2, "--recipe", acc],
    )
    assert result.exit_code == 1, result.output  # they differ
    out, err = result.stdout, result.stderr
    for side, text in (("A", fsdp2), ("B", acc)):
        recipe = parse_recipe(text, device_type="cpu")
        assert f"{side}: recipe {text} on cpu -> setting {recipe.setting.name}" in err
        assert f"backward: {short_dtype(recipe.setting.param_dtype)} gradients, reduced in " in err
        assert f".grad {short_dtype(recipe.grad_dtype)}" in err
    reports = [
        analyze(Block(), parse_recipe(t, device_type="cpu").setting, args=(example(),), check=False)
        for t in (fsdp2, acc)
    ]
    a, b = ({(n.name, n.op): n.out_dtype for n in r.nodes if n.kind == "op"} for r in reports)
    for name, op in a.keys() & b.keys():
        if a[name, op] != b[name, op]:
            assert f"~ {name} {op}:" in out
    for name, op in b.keys() - a.keys():
        assert f"+ {name} {op}:" in out


# --- Parsing: spellings, errors, DeepSpeed configs ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "device", "name"),
    [
        ("hf:bf16", "cuda", "amp-fp32,outputs=fp32"),
        ("trainer:fp16", "cuda", "amp-fp32,outputs=fp32"),
        ("hf:fp16", "cpu", "fp32"),
        ("accelerate:no", "cuda", "fp32"),
        ("lightning:16-mixed", "cuda", "amp-fp32"),
        ("lightning:bf16", "cpu", "amp-fp32"),
        ("lightning:16-true", "cuda", "half,inputs=fp16"),
        ("fabric:bf16-mixed", "cuda", "amp-fp32,inputs=bf16,outputs=fp32"),
        ("fsdp2:param=bf16", "cuda", "half,inputs=bf16,buffers=fp32"),
        (
            "fsdp2:param=bf16,cast_forward_inputs=false,output=fp32",
            "cuda",
            "half,buffers=fp32,outputs=fp32",
        ),
        ("fsdp2:reduce_dtype=fp32", "cuda", "fp32"),
        ("fsdp1:param_dtype=fp16", "cuda", "half,inputs=fp16,buffers=fp32"),
        ("fsdp1:param_dtype=fp16,buffer_dtype=fp16", "cuda", "half,inputs=fp16"),
        ("deepspeed:bf16", "cuda", "half,buffers=fp32"),
    ],
)
def test_spellings(text: str, device: str, name: str) -> None:
    setting = parse_recipe(text, device_type=device).setting
    assert setting.name == name
    # The name is the setting: --setting takes it back, and the report's dict reads it back.
    assert Setting.parse(name, device_type=device, amp_dtype=setting.amp_dtype) == setting
    assert Setting.from_dict(setting.to_dict()) == setting


def test_fp16_dtypes_follow_the_device() -> None:
    assert parse_recipe("lightning:16-mixed").setting.amp_dtype == "float16"
    assert parse_recipe("lightning:16-mixed", device_type="cpu").setting.amp_dtype == "bfloat16"
    assert parse_recipe("hf:fp16").loss_scaling and not parse_recipe("hf:bf16").loss_scaling


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("bf16", "FAMILY:VALUE"),
        ("keras:mixed_bfloat16", "FAMILY:VALUE"),
        ("hf:bf17", "hf:bf16"),
        ("accelerate:fp8", "fp8"),
        ("lightning:mixed", "bf16-mixed"),
        ("fsdp2:param_dtype", "key=value"),
        ("fsdp2:mixed=1", "param_dtype"),
        ("fsdp2:param_dtype=int8", "fp32, bf16, fp16"),
        ("fsdp1:keep_low_precision_grads=maybe", "true or false"),
    ],
)
def test_bad_spellings_say_what_to_write(text: str, says: str) -> None:
    with pytest.raises(SettingError, match=says) as info:
        parse_recipe(text)
    assert "\n" not in str(info.value)


def write(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return f"deepspeed:{path}"


def test_deepspeed_configs(tmp_path: Path) -> None:
    bf16 = parse_recipe(write(tmp_path, {"bf16": {"enabled": True}, "zero_optimization": {}}))
    assert (bf16.setting.name, bf16.setting.amp_dtype, bf16.input_cast) == (
        "half,buffers=fp32",
        "bfloat16",
        None,
    )
    assert (bf16.grad_dtype, bf16.reduce_dtype, bf16.master_dtype) == ("bfloat16",) * 2 + (
        "float32",
    )
    assert bf16.buffers_kept and bf16.setting.buffers == "float32" and not bf16.gaps()
    fp16 = parse_recipe(
        write(
            tmp_path,
            {
                "fp16": {"enabled": True, "auto_cast": True},
                "communication_data_type": "fp32",
                "data_types": {"grad_accum_dtype": "fp32", "buffer_dtype": "fp16"},
            },
        )
    )
    assert (fp16.setting.param_dtype, fp16.input_cast, fp16.reduce_dtype) == (
        "float16",
        "float16",
        "float32",
    )
    assert fp16.optimizer_grad_dtype == "float32" and not fp16.buffers_kept and fp16.loss_scaling
    assert parse_recipe(write(tmp_path, {"train_batch_size": 8})).setting.name == "fp32"
    for bad, says in [
        ({"bf16": {"enabled": "auto"}}, "hf:bf16"),
        ({"torch_autocast": {"enabled": True}}, "lower_precision_safe_modules"),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "both"),
    ]:
        with pytest.raises(SettingError, match=says):
            parse_recipe(write(tmp_path, bad))


def test_recipe_costs_no_more_than_its_setting() -> None:
    """A recipe is parsed in microseconds into the very setting it maps to, and the pipeline sees
    only that setting: its analysis is the setting's (same cache key, same work)."""
    recipe = parse_recipe("lightning:bf16-mixed", device_type="cpu")
    assert recipe.setting == Setting.parse("amp-fp32", device_type="cpu")


def test_cli_recipe_option() -> None:
    from click.testing import CliRunner

    from ampgraph.cli import main

    runner = CliRunner()
    bad = runner.invoke(main, ["table", "--recipe", "lightning:mixed"])
    assert bad.exit_code == 2 and "bf16-mixed" in bad.output
    both = runner.invoke(main, ["table", "--recipe", "hf:bf16", "-s", "fp32"])
    assert both.exit_code == 2 and "not both" in both.output
    assert "lightning:bf16-mixed" in runner.invoke(main, ["table", "--help"]).output
