"""Models that compile themselves: a submodule wrapped in ``torch.compile``, ``flex_attention``
(which compiles its own higher-order op), a ``torch.compiler.disable`` region. Each is captured
as it runs and its annotation held against a real CPU run under autocast (``verify``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampgraph.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _verify(factory: str) -> str:
    got = CliRunner().invoke(main, ["-q", "verify", "--device", "cpu", "-s", "amp-fp32",
                                    f"tests.self_compiled_models:{factory}"])  # fmt: skip
    assert got.exit_code == 0, got.output
    return got.output


def _nodes(factory: str) -> dict[str, dict]:  # type: ignore[type-arg]
    got = CliRunner().invoke(main, ["-q", "table", "-s", "amp-fp32,device=cpu", "--format", "json",
                                    f"tests.self_compiled_models:{factory}"])  # fmt: skip
    assert got.exit_code == 0, got.output
    return {n["name"]: n for n in json.loads(got.output)["nodes"]}


@pytest.mark.parametrize("factory", ["inner_compiled", "disabled_region"])
def test_compiled_and_disabled_regions_are_captured_as_the_eager_ops_they_run(factory: str) -> None:
    out = _verify(factory)
    assert " 0 disagreements" in out
    nodes = _nodes(factory)
    # the compiled submodule's own Linear is there, under its module path, checked
    modules = {n["module"] for n in nodes.values()}
    assert factory != "inner_compiled" or "block._orig_mod.0" in modules
    assert all(n["check"]["agree"] for n in nodes.values() if n.get("check"))


def test_flex_attention_is_one_node_with_autocasts_casts_checked_on_the_real_cpu() -> None:
    out = _verify("flex_fp32")  # q, k, v made fp32: autocast's kernel for the op casts them
    assert " 0 disagreements" in out and "casts 0/" not in out
    flex = next(n for n in _nodes("flex_fp32").values() if n["op"] == "higher_order.flex_attention")
    assert flex["check"]["agree"] and len(flex["casts"]) == 3


def test_a_model_importing_flex_attention_inside_its_forward_is_captured() -> None:
    """In a fresh process nothing has imported flex's module when the capture starts: the model's
    own import runs under the trace, and the capture sets flex's switch as the module is executed
    (before, Dynamo refused to compile inside the trace). Checked against a real CPU run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    spec = "tests.late_flex_models:late_flex"
    code = ("import sys, ampgraph.cli, tests.late_flex_models; "
            "print('torch.nn.attention.flex_attention' in sys.modules)")
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           cwd=ROOT, check=True)  # fmt: skip
    assert probe.stdout.strip() == "False"  # the import the capture meets is the model's own
    run = subprocess.run([sys.executable, "-m", "ampgraph", "-q", "verify", "--device", "cpu",
                          "-s", "amp-fp32", spec], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0 and " 0 disagreements" in run.stdout, run.stdout + run.stderr
    table = subprocess.run([sys.executable, "-m", "ampgraph", "-q", "table", "-s",
                            "amp-fp32,device=cpu", "--format", "json", spec], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=600, check=True)  # fmt: skip
    ops = [n["op"] for n in json.loads(table.stdout)["nodes"]]
    assert ops.count("higher_order.flex_attention") == 1


def test_a_disabled_region_is_a_graph_break_in_the_compiled_plan_as_in_dynamo() -> None:
    import torch

    from ampgraph.capture.trace import capture
    from ampgraph.compiled.inductor import plan
    from ampgraph.model.build import ModelInputs
    from ampgraph.settings import Setting
    from tests import self_compiled_models

    module, x = self_compiled_models.disabled_region()
    flow = plan(capture(ModelInputs("d", module, (x,)), Setting.parse("amp-fp32", device_type="cpu")))
    with torch.autocast("cpu", torch.bfloat16):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(module)(x)
        eager = module(x).float()
        outs = []
        for emulate in (False, True):
            torch._dynamo.reset()
            with torch._inductor.config.patch(emulate_precision_casts=emulate):
                outs.append(torch.compile(module)(x).float())
    assert flow.graphs == explained.graph_count and len(flow.eager_regions) == 1
    region = {n.name for n in flow.nodes if n.fate == "eager"}
    assert region and all(n.kernel is None for n in flow.nodes if n.name in region)
    # the region's gelu chain is eager's (no fusion across the break): nothing dropped, and the
    # compiled output is eager's up to one bf16 step of a fused softmax's final rounding, the
    # same with emulate_precision_casts (nothing to emulate)
    assert flow.dropped() == []
    assert torch.equal(outs[0], outs[1])
    assert ((outs[0] - eager).abs() <= 2.0**-7 * eager.abs() + 1e-6).all()
