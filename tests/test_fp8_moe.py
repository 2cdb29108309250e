"""torchao's MXFP8 MoE training recipe (MXFP8TrainingOpConfig on grouped experts): the traced
forward and backward against a real CPU run of the converted MoE (torchao's emulated kernel),
and the fixed-seed loss of --pass train."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("torchao")

from ampgraph.errors import SettingError  # noqa: E402
from ampgraph.fp8.graph import train_loss, trace_fp8  # noqa: E402
from ampgraph.fp8.proof import real_gemms, prove_gemms  # noqa: E402
from ampgraph.fp8.recipes import parse_fp8_recipe, plan_model  # noqa: E402
from ampgraph.model.build import ModelInputs  # noqa: E402

from .conftest import ROOT, load_file  # noqa: E402


def _example(name: str) -> ModelInputs:
    model, x = load_file(ROOT / f"examples/{name}.py").build()
    return ModelInputs(name, model, (x,))


def mx_survival_proved(model: ModelInputs, name: str, count: int) -> tuple[Any, Any]:
    """The MX recipe ``name``'s training operands of ``model`` and their survival, after each of
    the ``count`` predicted counts equals torchao's real ``to_mx`` on the same tensors."""
    from ampgraph.ranges import fp8 as fp8_ranges

    state = dict(model.module.state_dict())
    recipe = parse_fp8_recipe(f"torchao:{name},kernel=emulated")
    operands = fp8_ranges.linear_operands(model, recipe, state, train=True)
    pairs = fp8_ranges.prove(model, recipe, state, train=True, operands=operands)
    assert len(pairs) == count
    assert all(row.survival == real for row, real in pairs)
    assert {row.scaling for row, _ in pairs} == {"mx-rceil"}
    return operands, pairs


def test_moe_train_graph_equals_a_real_emulated_cpu_run() -> None:
    model = _example("fp8_moe")
    state = dict(model.module.state_dict())
    graph = trace_fp8(model, parse_fp8_recipe("torchao:mxfp8_rceil,kernel=emulated"), train=True)
    proof = prove_gemms(graph, model, state, train=True)
    assert proof.ok, proof.first_difference()
    # The router stays a bf16 mm; the experts' two grouped GEMMs, and the backward's four
    # (grad_input and grad_weight of each), run on MXFP8 operands dequantized to bf16.
    forward, backward = graph.gemms("forward"), graph.gemms("backward")
    assert [(g.op, g.role) for g in forward] == [
        ("mm", "gemm-bf16"), ("_grouped_mm", "gemm-mx-emulated"),
        ("_grouped_mm", "gemm-mx-emulated")]
    grouped = [g for g in backward if g.op == "_grouped_mm"]
    assert len(grouped) == 4 and {g.role for g in grouped} == {"gemm-mx-emulated"}
    assert {g.scaling for g in forward[1:] + grouped} == {("e4m3 mx-1x32", "e4m3 mx-1x32")}
    assert {g.dtype_in[:2] for g in forward[1:] + grouped} == {("bf16", "bf16")}
    # torchao's to_mx is in the graph: block amax, E8M0 scale, e4m3 cast, dequantization.
    roles = {n.role for n in graph.nodes}
    assert {"scale", "scaling", "cast-fp8", "dequant"} <= roles
    assert any(n.dtype_out == "e8m0" and n.role == "scale" for n in graph.nodes)
    from ampgraph.formats.fp8 import gemm_lines

    assert ("[experts] forward _grouped_mm(bf16 from e4m3 mx-1x32, bf16 from e4m3 mx-1x32) -> "
            "bf16") in gemm_lines(graph)
    plans = {p.fqn: p.converted for p in graph.plans}
    assert plans == {"router": False, "experts": True}


def test_moe_auto_kernel_and_wgrad_with_hp_fail_as_torchao_does() -> None:
    model = _example("fp8_moe")
    with pytest.raises(SettingError, match="_SM100_KERNELS_AVAILABLE"):
        trace_fp8(model, parse_fp8_recipe("torchao:mxfp8_rceil"), train=True)
    # wgrad_with_hp's bf16 grad_output x fp32 saved input: the trace's fake kernel (ampgraph's,
    # inside the trace's analysis, whatever ran before it in this process) refuses it in the CPU
    # kernel's words, and the real CPU run raises at that GEMM too.
    hp = parse_fp8_recipe("torchao:mxfp8_rceil_wgrad_with_hp,kernel=emulated")
    with pytest.raises(SettingError, match="bf16 and an fp32 operand.*expected m1 and m2 to have "
                                           "the same dtype, but got: c10::BFloat16 != float"):
        trace_fp8(model, hp, train=True)
    real = real_gemms(model, hp, dict(model.module.state_dict()), train=True)
    assert real[-1] == ("raised", ("mixed operand dtypes",), "-")
    # In the forward nothing mixes: both forward GEMMs run on MXFP8 operands.
    fwd = trace_fp8(model, hp)
    assert [g.role for g in fwd.gemms()][1:] == ["gemm-mx-emulated"] * 2


def test_moe_experts_left_in_fp32_trace_as_a_real_cpu_run_types_them() -> None:
    """Experts filtered out of the recipe run ``torch._grouped_mm`` on fp32 operands (CPU
    autocast has no rule for it), which the CPU kernel runs and torch 2.14's meta kernel refuses:
    the trace runs ampgraph's kernel, and its GEMMs, forward and backward, are a real run's."""
    model = _example("fp8_moe")
    state = dict(model.module.state_dict())
    r = parse_fp8_recipe("torchao:mxfp8_rceil,filter_fqns=experts,kernel=emulated")
    for train in (False, True):
        graph = trace_fp8(model, r, train=train)
        proof = prove_gemms(graph, model, state, train=train)
        assert proof.ok, proof.first_difference()
        grouped = [g for g in graph.gemms() if g.op == "_grouped_mm"]
        # Two forward; backward: each expert weight's gradient, and the input gradient of the
        # second GEMM only (the MoE's input needs none).
        assert len(grouped) == (5 if train else 2)
        assert {(g.dtype_in[:2], g.dtype_out, g.role) for g in grouped} == {
            (("fp32", "fp32"), "fp32", "gemm-fp32")}


def test_moe_recipe_plan_and_spelling() -> None:
    model = _example("fp8_moe")
    r = parse_fp8_recipe("torchao:mxfp8_rceil,filter_fqns=experts,kernel=emulated")
    assert parse_fp8_recipe(r.spelling) == r
    plans = {p.fqn: (p.converted, p.reason) for p in plan_model(model.module, r)}
    assert plans["experts"] == (False, "filtered by name (matches 'experts')")
    with pytest.raises(SettingError, match="no nn.Linear and no grouped experts"):
        plan_model(torch.nn.Sequential(torch.nn.ReLU()), r)


def test_train_loss_gradient_is_spread_and_deterministic() -> None:
    """The last Linear's grad_output under --pass train: a sum made it all ones; the fixed-seed
    projection gives every element its own value, the same in every run."""
    from ampgraph.ranges.fp8 import linear_operands

    model = _example("fp8_outlier")
    state = dict(model.module.state_dict())
    r = parse_fp8_recipe("torchao:tensorwise")
    first = linear_operands(model, r, state, train=True)["head"]["grad_output"]
    again = linear_operands(model, r, state, train=True)["head"]["grad_output"]
    assert torch.equal(first, again)
    assert first.unique().numel() == first.numel()
    assert abs(float(first.mean())) < float(first.abs().mean())  # zero-mean-ish, not ones
    out = {"loss": torch.tensor(2.5, requires_grad=True), "logits": torch.ones(2)}
    assert float(train_loss(out).detach()) == 2.5  # the model's own loss


def test_cli_moe_train_check() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ampgraph", "fp8", "--module",
         str(ROOT / "examples/fp8_moe.py") + ":build", "--recipe",
         "torchao:mxfp8_rceil,kernel=emulated", "--pass", "train", "--check"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "on MXFP8 dequantized to bf16 (e4m3 mx-1x32/e4m3 mx-1x32, emulated)" in run.stdout
    assert "check: all 8 GEMMs agree with a real CPU run" in run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ampgraph", "fp8", "--module",
         str(ROOT / "examples/fp8_moe.py") + ":build", "--recipe", "torchao:mxfp8_rceil",
         "--pass", "train"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert bad.stderr.startswith("Error: ") and "SM100" in bad.stderr


@pytest.mark.parametrize("name,count", [("mxfp8_rceil", 12), ("mxfp8_rceil_wgrad_with_hp", 8)])
def test_moe_survival_equals_torchaos_real_mx_conversion(name: str, count: int) -> None:
    """Each grouped GEMM operand, forward and backward, per 32 values along its reduction:
    the prediction's counts equal torchao's to_mx on the same tensors."""
    model = _example("fp8_moe")
    operands, _ = mx_survival_proved(model, name, count)
    # The recorded operands are the real run's: the tokens sorted by expert, the stacked
    # weight with K last, and grad_output for both GEMMs.
    record = operands["experts"]
    net, x = model.module, model.args[0]
    order = net.router(x).softmax(-1).argmax(-1).argsort(stable=True)
    assert torch.equal(record["w1.input"], x[order])
    assert torch.equal(record["w1.weight"], net.experts.w1.detach().reshape(-1, 64))
    assert record["w2.grad_output"].shape == (64, 64)
