"""Recipes analysed as they really run: input casts, buffers, output casts and what training keeps.

``tests/test_recipes.py`` proves each recipe's setting; here the analysis is given the model's
own fp32 inputs, as a user gives them, and must find by itself what each framework does around
the parameters: the inputs it casts before the forward (what the first leaf sees), the buffers
it leaves in their dtype while it casts the parameters (a model whose buffer meets a 16-bit
activation), the outputs it casts after the forward. Each framework runs its own code path on
the CPU with forward hooks on the leaves; every hook line and the output dtype must be
ampgraph's. After one optimizer step, the ``.grad`` dtypes, the dtype the gradients were
reduced in (read at the framework's own reduction), and the weights and gradients the optimizer
holds must be the recipe's.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.recipes import Recipe, parse_recipe
from tests.test_recipes import cpu_trainer, gloo, needs, record  # noqa: F401 - gloo: fixture


class Scale(nn.Module):
    """A leaf holding a floating buffer, as a rotary embedding's ``inv_freq`` is one."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("s", torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


class BufferBlock(nn.Module):
    """Linear, a buffer that promotes what it meets, a cast back to the input's dtype (Llama's
    norms do that), LayerNorm, a residual add, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.scale = Scale()
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.scale(self.fc1(x))
        return self.fc2(self.norm(h.to(x.dtype)) + x)


def example() -> torch.Tensor:
    return torch.randn(2, 3, 8)


def predict(recipe: Recipe) -> tuple[list[str], str]:
    """ampgraph's hook lines and output dtype for the recipe on the CPU, from fp32 inputs."""
    report = analyze(BufferBlock(), recipe.setting, args=(example(),), check=False)
    output = next(n for n in report.nodes if n.kind == "output").outputs[0]
    assert output is not None and not any(n.error for n in report.nodes)
    return [m.hook_line() for m in report.modules], output


def dtype(t: torch.Tensor | torch.dtype) -> str:
    return str(t.dtype if isinstance(t, torch.Tensor) else t).removeprefix("torch.")


def assert_forward(recipe: Recipe, lines: list[str], out: torch.Tensor) -> None:
    expected_lines, expected_out = predict(recipe)
    assert lines == expected_lines
    assert dtype(out) == expected_out


def assert_training(
    recipe: Recipe, grads: list[torch.Tensor], opt: torch.optim.Optimizer, reduced: set[str]
) -> None:
    """After one step: ``.grad`` as the user reads it, the weights and gradients the optimizer
    steps, and (where a reduction ran) the dtype the gradients were reduced in."""
    assert {dtype(g) for g in grads} == {recipe.grad_dtype}
    held = [p for group in opt.param_groups for p in group["params"]]
    assert {dtype(p) for p in held} == {recipe.master_dtype}
    assert {dtype(p.grad) for p in held if p.grad is not None} == {recipe.optimizer_grad_dtype}
    if reduced:
        assert reduced == {recipe.reduce_dtype}


# --- FSDP2 and FSDP1: input casts, buffers kept, output_dtype, reductions ---------------------


@contextlib.contextmanager
def reductions() -> Iterator[set[str]]:
    """The dtypes gradients are reduced in, read where each FSDP reduces them: FSDP2 copies
    them into its reduce-scatter buffer (also on one rank, where it skips the collective), FSDP1
    all-reduces them."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    seen: set[str] = set()
    copy_in, all_reduce = collectives.foreach_reduce_scatter_copy_in, dist.all_reduce

    def recording_copy_in(grads: Any, into: torch.Tensor, *args: Any) -> Any:
        seen.add(dtype(into))
        return copy_in(grads, into, *args)

    def recording_all_reduce(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.add(dtype(t))
        return all_reduce(t, *args, **kwargs)

    collectives.foreach_reduce_scatter_copy_in = recording_copy_in
    dist.all_reduce = recording_all_reduce
    try:
        yield seen
    finally:
        collectives.foreach_reduce_scatter_copy_in = copy_in
        dist.all_reduce = all_reduce


FSDP2 = {
    "param_dtype=bf16,reduce_dtype=fp32": {
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
    },
    "param_dtype=bf16,reduce_dtype=fp16,output_dtype=fp32": {
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float16,
        "output_dtype": torch.float32,
    },
    "param_dtype=fp16": {"param_dtype": torch.float16},
}


@pytest.mark.parametrize("spelling", list(FSDP2))
def test_fsdp2_runs_as_analysed(spelling: str, gloo: None) -> None:  # noqa: F811
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    recipe = parse_recipe(f"fsdp2:{spelling}", device_type="cpu")
    model, lines = BufferBlock(), []
    record(model, lines)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(**FSDP2[spelling]))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with reductions() as reduced, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the output is a view (FSDP2 warns about in-place ops)
        out = model(example())
        out.float().sum().backward()
    assert_forward(recipe, lines, out)
    grads = [p.grad for p in model.parameters()]
    opt.step()
    assert reduced, "FSDP2 reduced no gradient"
    assert_training(recipe, grads, opt, reduced)


@pytest.mark.parametrize("buffer", [None, torch.bfloat16])
def test_fsdp1_runs_as_analysed(buffer: torch.dtype | None, gloo: None) -> None:  # noqa: F811
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

    spelling = "param_dtype=bf16,reduce_dtype=fp16" + (",buffer_dtype=bf16" if buffer else "")
    recipe = parse_recipe(f"fsdp1:{spelling}", device_type="cpu")
    model, lines = BufferBlock(), []
    record(model, lines)
    policy = MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float16, buffer_dtype=buffer
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one rank: FSDP says it uses NO_SHARD
        wrapped = FullyShardedDataParallel(
            model, mixed_precision=policy, device_id=torch.device("cpu")
        )
    opt = torch.optim.AdamW(wrapped.parameters(), lr=0.1)
    with reductions() as reduced:
        out = wrapped(example())
        out.float().sum().backward()
    assert_forward(recipe, lines, out)
    grads = [p.grad for p in wrapped.parameters()]
    opt.step()
    assert reduced, "FSDP1 reduced no gradient"
    assert_training(recipe, grads, opt, reduced)


# --- Accelerate, Lightning, Fabric: output casts, buffers converted, optimizers ---------------


@needs["accelerate"]
@pytest.mark.parametrize("mode", ["bf16", "no"])
def test_accelerate_runs_as_analysed(mode: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    recipe = parse_recipe(f"accelerate:{mode}", device_type="cpu")
    model, lines = BufferBlock(), []
    record(model, lines)
    acc = Accelerator(cpu=True, mixed_precision=mode)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    out = model(example())
    acc.backward(out.float().sum())
    assert_forward(recipe, lines, out)
    grads = [p.grad for p in model.parameters()]
    opt.step()
    assert_training(recipe, grads, opt.optimizer, set())
    AcceleratorState._reset_state(True)


@needs["lightning"]
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-true"])
def test_lightning_trainer_runs_as_analysed(precision: str) -> None:
    import lightning as L

    recipe = parse_recipe(f"lightning:{precision}", device_type="cpu")
    lines: list[str] = []
    seen: dict[str, Any] = {}

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = BufferBlock()

        def training_step(self, batch: torch.Tensor, _i: int) -> torch.Tensor:
            seen["out"] = out = self.net(batch)
            return out.float().sum()

        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            seen["grads"] = [p.grad for p in self.parameters()]
            seen["opt"] = optimizer

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=0.1)

    module = Module()
    record(module, lines, prefix="net.")
    trainer = cpu_trainer(precision)
    # The batch is fp32, as a DataLoader gives it: the precision plugin converts it (true).
    loader = torch.utils.data.DataLoader([example()[0] for _ in range(2)], batch_size=2)
    trainer.fit(module, loader)
    assert_forward(recipe, lines, seen["out"])
    assert_training(recipe, seen["grads"], seen["opt"], set())


@needs["lightning"]
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_fabric_runs_as_analysed(precision: str) -> None:
    from lightning.fabric import Fabric

    recipe = parse_recipe(f"fabric:{precision}", device_type="cpu")
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    model, lines = BufferBlock(), []
    record(model, lines)
    wrapped, opt = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    out = wrapped(example())
    fabric.backward(out.float().sum())
    assert_forward(recipe, lines, out)
    grads = [p.grad for p in model.parameters()]
    opt.step()
    assert_training(recipe, grads, opt.optimizer, set())


def test_without_the_recipes_own_steps_the_analysis_would_be_wrong() -> None:
    """The steps matter on this model: with buffers cast along with the parameters, or without
    the output cast, the analysis gives other hook lines or another output than the recipe's,
    which the tests above prove are the framework's."""
    recipe = parse_recipe("fsdp2:param_dtype=bf16,output_dtype=fp32", device_type="cpu")
    lines, out = predict(recipe)
    cast_buffers = replace(recipe, setting=replace(recipe.setting, buffer_dtype=None))
    assert predict(cast_buffers)[0] != lines
    no_output_cast = replace(recipe, setting=replace(recipe.setting, output_dtype=None))
    assert predict(no_output_cast) == (lines, "bfloat16") and out == "float32"


# --- ampgraph's own oracles run the recipe's setting as the capture does ----------------------

ORACLE_RECIPES = [
    "fsdp2:param_dtype=bf16,output_dtype=fp32",
    "fsdp1:param_dtype=bf16",
    "accelerate:bf16",
    "fabric:bf16-mixed",
    "lightning:bf16-true",
]


@pytest.mark.parametrize("text", ORACLE_RECIPES)
def test_eager_oracles_and_real_runs_take_the_recipes_casts(text: str) -> None:
    """``verify`` and ``verify --pass train`` (real CPU runs) and the fake eager hooks make the
    model's inputs, buffers and outputs as the recipe does, so they agree with the analysis."""
    from ampgraph.model.build import ModelInputs
    from ampgraph.verify import verify
    from ampgraph.verify.hooks import eager_hook_lines
    from ampgraph.verify.training import verify_train

    setting = parse_recipe(text, device_type="cpu").setting
    model = ModelInputs("buffer-block", BufferBlock(), (example(),))
    lines, _ = predict(parse_recipe(text, device_type="cpu"))
    assert eager_hook_lines(model, setting) == lines
    result = verify(model, setting, device="cpu")
    assert result.ok, result.disagreements
    assert result.eager_hooks == lines
    trained = verify_train(model, setting, device="cpu")
    assert trained.ok, trained.disagreements


@pytest.mark.parametrize("text", ORACLE_RECIPES)
def test_cpu_only_torch_analyses_the_recipe_alike(text: str, monkeypatch: Any) -> None:
    """On a CPU-only build of torch ampgraph traces on meta and gives the placeholders the
    setting's dtypes afterwards: the recipe's inputs, buffers and output cast included, node for
    node as the CUDA build's fake CUDA trace gives them."""
    setting = parse_recipe(text, device_type="cuda").setting

    def view(report: Any) -> tuple[list[str], list[tuple[str, str, Any]]]:
        nodes = [(n.op, n.outputs) for n in report.nodes if n.kind != "output"]
        return [m.hook_line() for m in report.modules], nodes

    full = analyze(BufferBlock(), setting, args=(example(),), check=False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    meta = analyze(BufferBlock(), setting, args=(example(),), check=False)
    assert meta.capture["method"] == "export-meta-replay"
    lines, nodes = view(full)
    meta_lines, meta_nodes = view(meta)
    assert meta_lines == lines
    # The meta trace records the output cast whatever the traced dtype (fp32 there): a node the
    # CUDA trace has only where the output is not yet in the output dtype.
    assert [n for n in meta_nodes if n[0] != "aten.to.dtype"] == [
        n for n in nodes if n[0] != "aten.to.dtype"
    ]
    output = [next(n.outputs for n in r.nodes if n.kind == "output") for r in (full, meta)]
    assert output[0] == output[1]


def test_reports_keep_the_recipes_setting_and_old_ones_still_load() -> None:
    """A report of a recipe's setting holds its input, buffer and output dtypes and reads back
    as that setting; a report written before they existed reads as the setting without them."""
    from ampgraph.report.records import Report
    from ampgraph.settings import Setting

    setting = parse_recipe("fsdp2:param_dtype=bf16,output_dtype=fp32", device_type="cpu").setting
    report = analyze(BufferBlock(), setting, args=(example(),), check=False)
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert Setting.from_dict(again.setting) == setting
    old = {k: v for k, v in report.to_dict()["setting"].items() if not k.endswith("_dtype")}
    old.update(amp_dtype="bfloat16", param_dtype="bfloat16", name="half")
    assert Setting.from_dict(old) == Setting.parse("half", device_type="cpu")


@needs["lightning"]
def test_lightning_true_default_dtype_is_the_gap_gaps_names() -> None:
    """What ``gaps()`` says is not analysed is real: under Fabric's bf16-true a tensor the
    forward makes with the default dtype is bf16, where the analysis makes it fp32."""
    from lightning.fabric import Fabric

    class Makes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            made = torch.zeros(8)
            self.made = made.dtype
            return self.fc(x) + made

    recipe = parse_recipe("fabric:bf16-true", device_type="cpu")
    assert recipe.gaps() and "default dtype" in recipe.gaps()[0]
    model = Makes()
    Fabric(accelerator="cpu", devices=1, precision="bf16-true").setup_module(model)(example())
    assert dtype(model.made) == recipe.default_dtype == "bfloat16"
    report = analyze(Makes(), recipe.setting, args=(example(),), check=False)
    (zeros,) = [n for n in report.nodes if n.op.startswith("aten.zeros")]
    assert zeros.outputs == ["float32"]  # the gap: not the framework's bf16
