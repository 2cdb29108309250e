"""The compiled dtype flow: Inductor's plan on fake tensors, held against the C++ code Inductor
really generates on this CPU and against the compiled program's real outputs."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from ampgraph.capture.trace import capture
from ampgraph.cli import main
from ampgraph.compiled import generated
from ampgraph.compiled.flow import CompiledFlow
from ampgraph.compiled.inductor import CompiledPlanError, plan
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from tests import compiled_models

AMP = Setting.parse("amp-fp32", device_type="cpu")
#: Where no eager rounding is dropped, compiled and eager differ only by fp32 reassociation
#: inside fused math (a reduction's order), which can move the one final 16-bit rounding both
#: perform by one step: at most one bf16 ulp of the output, ULP * |x| (measured: softmax's
#: output, 6.1e-5 at values near 2**-7). Values equal to FP32_BOUND count as equal.
FP32_BOUND = 1e-6
ULP = 2.0**-7


def _capture(factory: str):  # type: ignore[no-untyped-def]
    module, x = getattr(compiled_models, factory)()
    return module, x, capture(ModelInputs(factory, module, (x,)), AMP)


@pytest.fixture(scope="module", params=["gelu_chain", "matmul_softmax", "moe_shaped"])
def case(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return _capture(request.param)


def test_plan_names_the_dropped_roundings_of_the_gelu_chain() -> None:
    _, _, c = _capture("gelu_chain")
    flow = plan(c)
    assert [n.name for n in flow.dropped()] == ["gelu", "mul"]
    assert {n.name: n.fate for n in flow.nodes} == {
        "linear": "extern", "gelu": "in-register", "mul": "in-register", "add": "stored"}  # fmt: skip
    emulated = plan(c, emulate_precision_casts=True)
    assert emulated.dropped() == [] and emulated.node("gelu").fate == "emulated"
    assert emulated.options["emulate_precision_casts"] is True
    assert CompiledFlow.from_dict(json.loads(json.dumps(flow.to_dict()))) == flow


def test_plan_matches_the_generated_cpp_and_the_real_outputs(case) -> None:  # type: ignore[no-untyped-def]
    module, x, c = case
    outs, flows = [], []
    for emulate in (False, True):
        flow = plan(c, emulate_precision_casts=emulate)
        out, code = generated.compile_for_real(
            c, generated.real_inputs(c, module, (x,)), emulate_precision_casts=emulate
        )
        read = generated.read_code(code)
        assert read.kernels, "no C++ kernel read: the parser no longer fits Inductor's code"
        assert generated.disagreements(flow, read) == []
        outs.append(out[0])
        flows.append(flow)
    with torch.autocast("cpu", torch.bfloat16):
        eager = module(x)
    plain, emulated = ((o.float() - eager.float()).abs() for o in outs)
    if flows[0].dropped():  # the dropped roundings show, and emulating them gives eager back
        assert plain.max() > FP32_BOUND and emulated.max() <= FP32_BOUND
    else:  # nothing to emulate: the same program, and eager's up to fp32 reassociation
        assert torch.equal(outs[0], outs[1])
        assert (plain <= ULP * eager.float().abs() + FP32_BOUND).all()


def test_torch_compile_itself_differs_as_planned_and_emulation_restores_eager() -> None:
    module, x = compiled_models.gelu_chain()
    with torch.autocast("cpu", torch.bfloat16):
        eager = module(x)
        gaps = []
        for emulate in (False, True):
            torch._dynamo.reset()
            with torch._inductor.config.patch(emulate_precision_casts=emulate):
                got = torch.compile(module, backend="inductor")(x)
            gaps.append((got.float() - eager.float()).abs().max().item())
    assert gaps[0] > FP32_BOUND and gaps[1] <= FP32_BOUND


def test_cli_diff_and_audit_name_nodes_and_remedies() -> None:
    diff = CliRunner().invoke(main, ["compiled", "tests.compiled_models:gelu_chain", "--view", "diff"])
    assert diff.exit_code == 0, diff.output
    assert "2 eager rounding point(s)" in diff.output and "  gelu  " in diff.output
    audit = CliRunner().invoke(main, ["compiled", "tests.compiled_models:gelu_chain", "--view", "audit"])
    assert "emulate_precision_casts" in audit.output and "autocast barrier" in audit.output


def test_a_cuda_setting_is_one_line_error() -> None:
    _, _, c = _capture("gelu_chain")
    c.setting = Setting.parse("amp-fp32", device_type="cuda")
    with pytest.raises(CompiledPlanError, match="C\\+\\+ backend"):
        plan(c)
    bad = CliRunner().invoke(main, ["compiled", "tests.compiled_models:gelu_chain", "-s", "amp-fp32,device=cuda"])
    assert bad.exit_code == 1 and bad.output.startswith("Error: ") and len(bad.output.splitlines()) == 1


#: The shape of a module Inductor's Triton backend writes (its wrapper's allocation and launch,
#: one kernel with its ``triton_meta`` signature), cut to the lines the reader looks at.
TRITON_MODULE = """
buf1 = empty_strided_cuda((8, 64), (64, 1), torch.bfloat16)
triton_poi_fused_add_gelu_mul_0 = async_compile.triton('triton_poi_fused_add_gelu_mul_0', '''
@triton_heuristics.pointwise(
    size_hints={'x': 512}, filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0), 'constants': {}},
)
@triton.jit
def triton_poi_fused_add_gelu_mul_0(in_out_ptr0, in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_out_ptr0 + (x0), xmask).to(tl.float32)
    tmp1 = tl.load(in_ptr0 + (x0), xmask)
    tmp2 = tmp1.to(tl.bfloat16)
    tmp3 = tmp0 * tmp0
    tmp4 = tmp3.to(tl.bfloat16)
    tmp5 = tmp4.to(tl.float32)
    tmp6 = tmp5 + tmp0
    tmp7 = tmp6.to(tl.bfloat16)
    tl.store(in_out_ptr0 + (x0), tmp7, xmask)
    tl.store(out_ptr0 + (x0), tmp6, xmask)
''', device_str='cuda')
        triton_poi_fused_add_gelu_mul_0.run(buf1, arg2_1, buf2, 512, stream=stream0)
"""


def test_the_reader_reads_triton_kernels_as_it_reads_cpp_ones() -> None:
    code = generated.read_code(TRITON_MODULE)
    [k] = code.kernels
    assert code.buffers16 == {"buf1"} and k.writes16 == ["buf1"] and k.writes == ["buf1", "buf2"]
    # tmp2 re-rounds a value loaded from a bf16 pointer (a no-op); tmp7 is only stored; tmp4
    # is rounded and computed on: one rounding in registers
    assert (k.conversions, k.read_inside) == (2, 1)


def test_a_node_a_pattern_replacement_folds_away_is_placed_and_its_dropped_rounding_shown() -> None:
    """``softmax(y * 1.5)``: Inductor's ``mul_softmax_pattern`` rewrites it as
    ``(y - max(y)) * 1.5`` in fp32 inside the softmax kernel, so the multiply has no lowered value
    of its own; the plan still places it in that kernel, and its bf16 rounding is dropped."""
    module, x, c = _capture("scaled_softmax")
    outs = []
    for emulate in (False, True):
        flow = plan(c, emulate_precision_casts=emulate)
        assert flow.unmapped == [] and [n.name for n in flow.dropped()] == ["mul"]
        assert flow.node("mul").kernel == flow.node("softmax").kernel
        out, code = generated.compile_for_real(
            c, generated.real_inputs(c, module, (x,)), emulate_precision_casts=emulate
        )
        assert generated.disagreements(flow, generated.read_code(code)) == []
        outs.append(out[0].float())
    with torch.autocast("cpu", torch.bfloat16):
        eager = module(x).float()
        unrounded = torch.softmax(module.f(x).float() * 1.5, dim=-1)  # the scale kept in fp32
    # the rewritten math is no node emulate_precision_casts could round: the same program
    assert torch.equal(outs[0], outs[1])
    assert ((outs[0] - eager).abs() > ULP * eager.abs() + FP32_BOUND).any()
    assert ((outs[0] - unrounded).abs() <= ULP * unrounded.abs() + FP32_BOUND).all()
