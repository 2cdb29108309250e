"""The backward under torch.compile: the plan of the compiled backward (Inductor's own, on fake
tensors) against the C++ code Inductor really generates for it and the real gradients, and the
autocast state the backward is traced in against eager's backward inside and outside autocast."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from ampgraph import compat
from ampgraph.capture.trace import capture
from ampgraph.cli import main
from ampgraph.compiled import generated
from ampgraph.compiled.flow import CompiledTrain, autocast_changes
from ampgraph.compiled.train import plan_train
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from tests import compiled_models

AMP = Setting.parse("amp-fp32", device_type="cpu")
#: fp32 reassociation (a bias gradient's sum, in another order) moves fp32 results by a few ulps.
FP32_BOUND = 1e-5

needs_eager_lowering = pytest.mark.skipif(
    not compat.compiled_backward_lowering(),
    reason="torch 2.9 lowers a compiled backward only when it first runs",
)


def _case(factory: str) -> tuple[torch.nn.Module, torch.Tensor, Any]:
    module, x = getattr(compiled_models, factory)()
    module.train()
    return module, x, capture(ModelInputs(factory, module, (x,)), AMP)


def _grad_out() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(32, 64)


def _eager_grads(module: torch.nn.Module, x: torch.Tensor, inside: bool) -> dict[str, torch.Tensor]:
    """Eager's gradients, ``backward()`` called inside the autocast context or after it."""
    module.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        y = module(x)
        if inside:
            y.backward(_grad_out())
    if not inside:
        y.backward(_grad_out())
    return {k: p.grad.clone() for k, p in module.named_parameters()}


def _compiled_grads(
    c: Any, module: torch.nn.Module, x: torch.Tensor, state: str, emulate: bool
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The captured graph compiled by Inductor for real (C++), run forward and backward: the
    gradients and the generated modules' sources (forward's, then backward's)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import compile_fx
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    params = {k: p.detach().clone().requires_grad_(True) for k, p in module.named_parameters()}
    kinds = [c.input_kinds[n.name] for n in c.graph_module.graph.nodes if n.op == "placeholder"]
    inputs = [params[t] if k == "parameter" else v
              for (k, t), v in zip(kinds, generated.real_inputs(c, module, (x,)))]  # fmt: skip

    def step() -> None:
        with torch.autocast("cpu", torch.bfloat16):
            out = compile_fx.compile_fx(c.graph_module, inputs)(*inputs)
        out[0].backward(_grad_out())

    with inductor_config.patch(emulate_precision_casts=emulate, fx_graph_cache=False), \
            functorch_config.patch(backward_pass_autocast=state):  # fmt: skip
        _, codes = run_and_get_code(step)
    return {k: p.grad for k, p in params.items()}, codes


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_the_default_is_read_from_each_release_and_is_the_installed_torchs() -> None:
    from torch._functorch import config as functorch_config

    assert functorch_config._config["backward_pass_autocast"].default == (
        compat.backward_pass_autocast_default())  # fmt: skip


@needs_eager_lowering
def test_the_backward_plan_matches_generated_cpp_and_real_gradients() -> None:
    module, x, c = _case("gelu_chain")
    eager = _eager_grads(module, x, inside=True)  # "same_as_forward": eager's backward in autocast
    gaps = []
    for emulate in (False, True):
        step = plan_train(c, emulate_precision_casts=emulate)
        assert step.backward_pass_autocast == "same_as_forward" and step.backward_autocast
        grads, codes = _compiled_grads(c, module, x, "same_as_forward", emulate)
        assert len(codes) == 2, "a forward and a backward module"
        for flow, code in ((step.forward, codes[0]), (step.backward, codes[1])):
            read = generated.read_code(code)
            assert read.kernels and generated.disagreements(flow, read) == []
        # the gradient dtypes the plan gives are the real ones
        assert {g.input: g.dtype for g in step.gradients} == {
            k: str(v.dtype).removeprefix("torch.") for k, v in grads.items()}  # fmt: skip
        gaps.append((_gap(grads, eager), bool(step.backward.dropped())))
    # dropped roundings predicted in the backward: the gradients differ from eager's by 16-bit
    # roundings, and equal them exactly with emulate_precision_casts, as planned (none dropped)
    assert gaps[0][1] and gaps[0][0] > FP32_BOUND
    assert not gaps[1][1] and gaps[1][0] == 0.0


@needs_eager_lowering
def test_the_autocast_state_of_the_compiled_backward_is_the_planned_one() -> None:
    module, x, c = _case("fp32_region")
    same, off = (plan_train(c, backward_pass_autocast=s) for s in ("same_as_forward", "off"))
    changed = autocast_changes(same, off)
    # the fp32 region's backward matmuls: 16-bit when traced in the forward's autocast
    assert {(a.op, a.dtype, b.dtype) for a, b in changed if a.op == "aten::mm"} == {
        ("aten::mm", "bfloat16", "float32")}  # fmt: skip
    inside, outside = _eager_grads(module, x, True), _eager_grads(module, x, False)
    assert _gap(inside, outside) > FP32_BOUND  # the state matters for this model
    for state, eager in (("same_as_forward", inside), ("off", outside)):
        grads, _ = _compiled_grads(c, module, x, state, emulate=True)
        assert _gap(grads, eager) <= FP32_BOUND
    step = CompiledTrain.from_dict(json.loads(json.dumps(same.to_dict())))
    assert step == same


@needs_eager_lowering
def test_cli_pass_train_audits_the_backward_autocast() -> None:
    got = CliRunner().invoke(main, ["compiled", "tests.compiled_models:fp32_region",
                                    "--pass", "train", "--view", "audit"])  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "backward_pass_autocast = 'off'" in got.output and "mm (top)" in got.output
    bad = CliRunner().invoke(main, ["compiled", "tests.compiled_models:gelu_chain",
                                    "--backward-pass-autocast", "off"])  # fmt: skip
    assert bad.exit_code == 2
